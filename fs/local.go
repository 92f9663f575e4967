package fs

import (
	"context"
	"errors"
	"fmt"
	"log"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// tmpPrefix names the temporaries a copy writes before renaming them into
// place; directory copies skip them.
const tmpPrefix = ".tensorfs-tmp-"

// tmpMode is a copy's temporary's mode until Commit gives it copyMode, the
// mode of a tensor a copy creates.
const (
	tmpMode  = 0o600
	copyMode = 0o644
)

// errf returns a transfer.Error with an errno, for copies.
func errf(errno syscall.Errno, format string, args ...any) error {
	return &transfer.Error{Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// resolve finds the node at a cleaned mount-relative path.
func (f *FS) resolve(p string) (gofs.InodeEmbedder, error) {
	var cur gofs.InodeEmbedder = f.root
	if p == "/" {
		return cur, nil
	}
	for _, c := range strings.Split(p[1:], "/") {
		d, ok := cur.(*Dir)
		if !ok {
			return nil, errf(syscall.ENOTDIR, "%s: a component is not a directory", p)
		}
		in := d.child(c)
		if in == nil {
			return nil, errf(syscall.ENOENT, "%s: no such file or directory", p)
		}
		cur = in.Operations()
	}
	return cur, nil
}

// fileRef is one tensor file found under a directory.
type fileRef struct {
	rel string
	f   *File
}

// walk lists the tensor files under d (sorted, temporaries skipped).
func (d *Dir) walk(prefix string, out []fileRef) []fileRef {
	d.mu.Lock()
	names := make([]string, 0, len(d.entries))
	for n := range d.entries {
		if !strings.HasPrefix(n, tmpPrefix) {
			names = append(names, n)
		}
	}
	kids := make(map[string]gofs.InodeEmbedder, len(names))
	for _, n := range names {
		kids[n] = d.entries[n].Operations()
	}
	d.mu.Unlock()
	sort.Strings(names)
	for _, n := range names {
		switch c := kids[n].(type) {
		case *File:
			out = append(out, fileRef{rel: prefix + n, f: c})
		case *Dir:
			out = c.walk(prefix+n+"/", out)
		}
	}
	return out
}

// metaOf describes a tensor for a copy.
func metaOf(t *tensor.Tensor, rel string) transfer.Meta {
	in := t.Info()
	d, sh := in.DType, in.Shape
	if d == "" {
		d = "U8"
	}
	if sh == nil {
		sh = tensor.Shape{in.Size * 8 / int64(d.Bits())}
	}
	return transfer.Meta{Rel: rel, DType: string(d), Shape: sh.String(), NBytes: in.Size}
}

// fileSource reads one tensor for a copy, holding it open (alive) until Close.
type fileSource struct {
	t    *tensor.Tensor
	h    *tensor.Handle
	thaw func() // the tensor is frozen (tensor.Freeze) while the copy reads it
	meta transfer.Meta
}

func (s *fileSource) Meta() transfer.Meta                     { return s.meta }
func (s *fileSource) ReadAt(p []byte, off int64) (int, error) { return s.t.ReadAt(p, off) }
func (s *fileSource) Close() {
	s.thaw()
	s.h.Close()
}

// Export implements transfer.Exporter: a peer of this host opens the
// tensor's allocation in place while the pin and lease are held.
func (s *fileSource) Export(holder string, accept func(string) bool, keep bool) (transfer.IPCDesc, func(), transfer.PeerLease, bool) {
	p, ok := s.t.PinExport(holder, accept, keep)
	if !ok {
		return transfer.IPCDesc{}, nil, nil, false
	}
	d := transfer.IPCDesc{Handle: p.Handle, Offset: p.Offset, Alloc: p.AllocID, Export: p.ExportID, Generation: p.Generation}
	if p.Lease == nil {
		return d, p.Release, nil, true
	}
	return d, p.Release, p.Lease, true
}

func openSource(f *File, rel string) (*fileSource, error) {
	h, err := f.t.Open("copy")
	if err != nil {
		return nil, err
	}
	// Frozen before its metadata is read: the copy sends this size and
	// these bytes, whoever writes the tensor meanwhile (the write waits).
	thaw := f.t.Freeze()
	return &fileSource{t: f.t, h: h, thaw: thaw, meta: metaOf(f.t, rel)}, nil
}

// sources opens the tensors of a node: one for a file, all below a directory.
func sources(n gofs.InodeEmbedder) ([]transfer.Source, bool, error) {
	var refs []fileRef
	isDir := false
	switch x := n.(type) {
	case *File:
		refs = []fileRef{{f: x}}
	case *Dir:
		isDir = true
		refs = x.walk("", nil)
	}
	srcs := make([]transfer.Source, 0, len(refs))
	for _, r := range refs {
		s, err := openSource(r.f, r.rel)
		if err != nil {
			for _, o := range srcs {
				o.Close()
			}
			return nil, false, err
		}
		srcs = append(srcs, s)
	}
	return srcs, isDir, nil
}

// Get implements transfer.Local.
func (f *FS) Get(p string) ([]transfer.Source, bool, error) {
	n, err := f.resolve(p)
	if err != nil {
		return nil, false, err
	}
	return sources(n)
}

// Put implements transfer.Local: temporaries in the destination directories,
// renamed into place through the mount at Commit (so inotify watchers see
// IN_MOVED_TO).
func (f *FS) Put(p string, isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
	return f.prepare(p, isDir, metas, nil, true)
}

// destItem is one tensor of a copy's destination.
type destItem struct {
	dir    *Dir
	dirRel string // mount-relative path of dir ("/" for the root)
	tmp    string // temporary name in dir, or "" when adopting into target
	final  string
	f      *File // the temporary's node
	target *File // adopt mode: the file whose data is replaced in place
	temp   *tensor.Tensor
	h      *tensor.Handle
}

// dest is a copy's destination: temporaries filled by WriteAt, put in place
// by Commit (a rename through the mount, an internal rename, or an adoption),
// removed by Abort.
type dest struct {
	fsys   *FS
	items  []destItem
	rename bool // put in place by renames through the mount
	done   int
}

// prepare builds a destination at p. adoptTarget, when set, is the node whose
// xattr is being set (copy_from): its lock is held by the kernel, so nothing
// may be renamed over it or created in it through the mount: files there are
// replaced by adoption and new names inserted internally. viaMount says the
// final renames may go through the mount (so inotify sees them); it is false
// when the kernel may hold the lock of a destination directory (batch holds
// the root's).
func (f *FS) prepare(p string, isDir bool, metas []transfer.Meta, adoptTarget gofs.InodeEmbedder, viaMount bool) (*dest, error) {
	d := &dest{fsys: f, rename: adoptTarget == nil && viaMount && f.mnt != ""}
	ok := false
	defer func() {
		if !ok {
			d.Abort()
		}
	}()
	if !isDir {
		parentPath, name := path.Split(p)
		if name == "" {
			return nil, errf(syscall.EISDIR, "%s is a directory", p)
		}
		parent, err := f.resolve(path.Clean(parentPath))
		if err != nil {
			return nil, err
		}
		pd, isD := parent.(*Dir)
		if !isD {
			return nil, errf(syscall.ENOTDIR, "%s: parent is not a directory", p)
		}
		if err := d.add(pd, path.Clean(parentPath), name, metas[0], adoptTarget); err != nil {
			return nil, err
		}
		ok = true
		return d, nil
	}
	root, err := f.mkdirAll(p)
	if err != nil {
		return nil, err
	}
	for _, m := range metas {
		dirRel, name := path.Split(m.Rel)
		sub := root
		if dirRel != "" {
			if sub, err = f.mkdirAll(path.Join(p, dirRel)); err != nil {
				return nil, err
			}
		}
		if err := d.add(sub, path.Join(p, dirRel), name, m, adoptTarget); err != nil {
			return nil, err
		}
	}
	ok = true
	return d, nil
}

// add prepares one tensor named name in dir.
func (d *dest) add(dir *Dir, dirRel, name string, m transfer.Meta, adoptTarget gofs.InodeEmbedder) error {
	if errno := checkName(name); errno != 0 {
		return errf(errno, "%s/%s: name too long", dirRel, name)
	}
	tmpl, err := templateFor(dir, m)
	if err != nil {
		return err
	}
	// The copy writes every byte before the tensor is in place (a failed
	// one is dropped unseen), so its memory need not be cleared first.
	tmpl.Uninit = true
	item := destItem{dir: dir, dirRel: dirRel, final: name}
	existing := dir.child(name)
	if existing != nil {
		if _, isDir := existing.Operations().(*Dir); isDir {
			return errf(syscall.EISDIR, "%s is a directory", path.Join(dirRel, name))
		}
	}
	if adoptTarget != nil && existing != nil {
		// Replace in place: a rename over this file could need the lock the
		// kernel holds for the xattr call.
		item.target = existing.Operations().(*File)
		// The target keeps the memory it adopts: that memory must be keyed
		// by the target's owner, not the directory's. Recycled (uncleared)
		// for the directory owner's next copy, it would show them what the
		// target's owner wrote into a file they could not read.
		tmpl.Owner = item.target.t.Owner()
		t, err := d.fsys.store.New(tmpl)
		if err != nil {
			return err
		}
		if item.h, err = t.Open("copy"); err != nil {
			t.Unlink()
			return err
		}
		t.Unlink()
		item.temp = t
		d.items = append(d.items, item)
		return nil
	}
	item.tmp = fmt.Sprintf("%s%d", tmpPrefix, d.fsys.tmpSeq.Add(1))
	t, err := d.fsys.store.New(tmpl)
	if err != nil {
		return err
	}
	nf := &File{fsys: d.fsys, t: t}
	// Owner-only until Commit: the temporary's name can be looked up, and
	// until the copy has written it, its memory may hold what an earlier
	// tensor of the same owner left there (Template.Uninit).
	nf.meta.init(context.Background(), tmpMode)
	dir.meta.mu.Lock()
	nf.meta.uid, nf.meta.gid = dir.meta.uid, dir.meta.gid
	dir.meta.mu.Unlock()
	in := dir.NewPersistentInode(context.Background(), nf, gofs.StableAttr{Mode: syscall.S_IFREG})
	dir.mu.Lock()
	dir.setEntry(item.tmp, in)
	dir.mu.Unlock()
	item.f, item.temp = nf, t
	d.items = append(d.items, item)
	return nil
}

// templateFor is the tensor template of a copied tensor landing in dir: the
// source's dtype and shape on dir's template device. Errors: EPROTO when the
// metadata is inconsistent.
func templateFor(dir *Dir, m transfer.Meta) (tensor.Template, error) {
	dt, err := tensor.ParseDType(m.DType)
	if err != nil {
		return tensor.Template{}, errf(syscall.EPROTO, "tensor %q: %v", m.Rel, err)
	}
	sh, err := tensor.ParseShape(m.Shape)
	if err != nil {
		return tensor.Template{}, errf(syscall.EPROTO, "tensor %q: %v", m.Rel, err)
	}
	if nb, err := tensor.NBytes(dt, sh); err != nil || nb != m.NBytes {
		return tensor.Template{}, errf(syscall.EPROTO, "tensor %q: %s %s is not %d bytes", m.Rel, dt, sh, m.NBytes)
	}
	tmpl := dir.template()
	dir.meta.mu.Lock()
	owner := dir.meta.uid
	dir.meta.mu.Unlock()
	return tensor.Template{DType: dt, Shape: sh, Device: tmpl.Device, Owner: owner}, nil
}

// mkdirAll returns the directory at p, creating it and missing parents
// internally (no syscall on the mount). Errors: ENOTDIR when a component is a
// file, ENAMETOOLONG for a long component.
func (f *FS) mkdirAll(p string) (*Dir, error) {
	cur := f.root
	if p == "/" {
		return cur, nil
	}
	for _, c := range strings.Split(strings.Trim(p, "/"), "/") {
		if errno := checkName(c); errno != 0 {
			return nil, errf(errno, "%s: name too long", p)
		}
		cur.mu.Lock()
		in := cur.entries[c]
		made := in == nil
		if made {
			nd := &Dir{fsys: f, tmpl: cur.template()}
			nd.meta.init(context.Background(), 0o755)
			in = cur.NewPersistentInode(context.Background(), nd, gofs.StableAttr{Mode: syscall.S_IFDIR})
			cur.setEntry(c, in)
		}
		cur.mu.Unlock()
		if made {
			cur.invalidateAttr() // its nlink counts the new subdirectory
		}
		next, ok := in.Operations().(*Dir)
		if !ok {
			return nil, errf(syscall.ENOTDIR, "%s: %s is a file", p, c)
		}
		cur = next
	}
	return cur, nil
}

// WriteAt implements transfer.Dest.
func (d *dest) WriteAt(i int, p []byte, off int64) error {
	_, err := d.items[i].temp.WriteAt(p, off)
	return err
}

// tensorAt is item i's temporary tensor, for device-to-device local copies.
func (d *dest) tensorAt(i int) *tensor.Tensor { return d.items[i].temp }

// Commit implements transfer.Dest: each tensor is put in place atomically.
func (d *dest) Commit() (int, error) {
	// Renames through the mount go relative to an fd of each directory,
	// opened once: a full path would make the kernel look up every
	// directory of it again for each tensor (entry timeouts are 0).
	dirs := map[string]int{}
	defer func() {
		for _, fd := range dirs {
			unix.Close(fd)
		}
	}()
	stuck := false
	for d.done < len(d.items) {
		it := &d.items[d.done]
		if it.f != nil {
			it.f.meta.mu.Lock()
			it.f.meta.mode = copyMode
			it.f.meta.mu.Unlock()
		}
		var err error
		switch {
		case it.target != nil:
			err = it.target.t.Adopt(it.temp)
			if err == nil {
				it.target.meta.touch()
				it.h.Close()
				it.h = nil
			}
		case d.rename && !stuck:
			fd, ok := dirs[it.dirRel]
			if !ok {
				if fd, err = openDirWithin(d.fsys.mnt + it.dirRel); err == nil {
					dirs[it.dirRel] = fd
				}
			}
			if err == nil {
				stuck, err = renameViaMount(fd, it)
			} else if errors.Is(err, errStuck) {
				stuck = true
				err = it.dir.renameInternal(it.tmp, it.final)
			}
			if stuck {
				// The kernel holds the directory's lock for someone who
				// waits on us (see renameViaMount): this tensor and the rest
				// go in place inside the daemon, without inotify events.
				log.Printf("put %s/%s in place: the directory stayed locked for %v; renamed inside the daemon (no IN_MOVED_TO for the %d tensors left)", it.dirRel, it.final, renameStuckAfter, len(d.items)-d.done)
			}
		default: // no renames through the mount, or they got stuck
			err = it.dir.renameInternal(it.tmp, it.final)
		}
		if err != nil {
			n := d.done
			d.Abort()
			return n, &transfer.Error{Errno: transfer.Errno(err), Msg: fmt.Sprintf("put %s/%s in place: %v", it.dirRel, it.final, err), Copied: n}
		}
		d.done++
	}
	return d.done, nil
}

// renameStuckAfter bounds a rename through the mount. A copy runs inside
// a FUSE request (the setxattr of copy_to, whose source's inode lock the
// kernel holds; or a peer's put while that peer's own setxattr waits on
// us): a process that takes the destination directory's lock and then
// waits for the source's (rm or mv of the source, in the same directory;
// or the same across two daemons copying to each other) would wait on us
// while our rename waits on it. Past this bound the tensor goes in place
// inside the daemon: still atomic, without the inotify event. A rename
// takes about 100 µs; a directory busy for 2 s is such a cycle, or a
// machine too loaded to matter.
const renameStuckAfter = 2 * time.Second

// errStuck: a rename through the mount did not finish within
// renameStuckAfter.
var errStuck = errors.New("rename through the mount is stuck")

// renameViaMount renames it.tmp to it.final in the directory fd through
// the mount, so that watchers see IN_MOVED_TO. When that does not finish
// within renameStuckAfter (stuck), the tensor is put in place inside the
// daemon instead: the kernel's rename may still be waiting for the lock,
// and when the lock comes free its lookup of the temporary finds nothing
// and it fails harmlessly; if the kernel's rename wins that race instead,
// the internal one finds no temporary (ENOENT), and the kernel's result is
// the outcome.
func renameViaMount(fd int, it *destItem) (stuck bool, err error) {
	late, err := bounded(func() error { return unix.Renameat(fd, it.tmp, fd, it.final) })
	if late == nil {
		return false, err
	}
	if err := it.dir.renameInternal(it.tmp, it.final); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return true, <-late // the kernel's rename got the temporary
		}
		return true, err
	}
	return true, nil
}

// openDirWithin opens a destination directory (O_PATH) through the mount;
// errStuck when the lookup does not finish in time (the same lock cycle
// as renameViaMount's: a path walk waits on a locked directory).
func openDirWithin(p string) (int, error) {
	fd := -1
	late, err := bounded(func() (err error) {
		fd, err = unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if late != nil {
		go func() {
			if <-late == nil {
				unix.Close(fd) // opened after we gave up on it
			}
		}()
		return -1, errStuck
	}
	return fd, err
}

// bounded runs call, a syscall on the mount, on its own goroutine and waits
// at most renameStuckAfter for it. When it is late, late is non-nil and
// delivers its result once it comes (and call's own variables may be read
// only after that); else err is its result.
func bounded(call func() error) (late <-chan error, err error) {
	done := make(chan error, 1)
	go func() { done <- call() }()
	t := time.NewTimer(renameStuckAfter)
	defer t.Stop()
	select {
	case err := <-done:
		return nil, err
	case <-t.C:
		return done, nil
	}
}

// Abort implements transfer.Dest: the temporaries not yet in place go away.
func (d *dest) Abort() {
	for i := d.done; i < len(d.items); i++ {
		it := &d.items[i]
		if it.h != nil {
			it.h.Close()
			it.h = nil
		}
		if it.tmp != "" {
			it.dir.mu.Lock()
			if in := it.dir.entries[it.tmp]; in != nil && in.Operations() == it.f {
				it.dir.delEntry(it.tmp)
			}
			it.dir.mu.Unlock()
			it.temp.Unlink()
			it.tmp = ""
		}
	}
	d.done = len(d.items)
}

// renameInternal moves entry tmp to name within d (replacing a file there),
// without a syscall on the mount.
func (d *Dir) renameInternal(tmp, name string) error {
	d.mu.Lock()
	in := d.entries[tmp]
	if in == nil {
		d.mu.Unlock()
		return errf(syscall.ENOENT, "temporary %s vanished", tmp)
	}
	var replaced *File
	if old := d.entries[name]; old != nil {
		f, ok := old.Operations().(*File)
		if !ok {
			d.mu.Unlock()
			return errf(syscall.EISDIR, "%s is a directory", name)
		}
		replaced = f
	}
	d.delEntry(tmp)
	d.setEntry(name, in)
	d.mu.Unlock()
	if replaced != nil {
		replaced.t.Unlink()
	}
	return nil
}

// WriteInPlace lets a peer copy receive tensor i's bytes from its socket
// straight into the temporary's memory when that is host memory
// (tensor.WriteInPlace); ok is false for GPU memory (the copy then stages
// through WriteAt).
func (d *dest) WriteInPlace(i int, off, n int64, fill func(p []byte) error) (bool, error) {
	return d.items[i].temp.WriteInPlace(off, n, fill)
}
