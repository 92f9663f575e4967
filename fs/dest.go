package fs

import (
	"context"
	"errors"
	"fmt"
	"log"
	"maps"
	"path"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// destItem is one tensor of a copy's destination. Until Commit it lives as
// from/tmp (a temporary name, or its final name inside a staged directory);
// Commit puts it at to/final.
type destItem struct {
	from    *Dir   // the directory its node is in now
	fromRel string // mount-relative path of from, through a staged directory's temporary name
	tmp     string // its name in from; "" when adopting into target
	to      *Dir   // its final directory (nil until resolved, for a staged item)
	toRel   string // mount-relative path of its final directory ("/" for the root)
	final   string
	staged  *stagedDir // the staged directory it is below, or nil
	f       *File      // the temporary's node
	target  *File      // adopt mode: the file whose data is replaced in place
	temp    *tensor.Tensor
	h       *tensor.Handle
	mode    uint32 // the mode Commit gives the temporary
	placed  bool
}

// stagedDir is a directory a copy creates: it is built under a temporary
// name in its (existing) parent, its tensors under their final names, and
// renamed into place once at Commit. Nobody can be watching a directory
// that does not exist yet, so that one rename (one IN_MOVED_TO, for the
// directory) tells everything that can be told, and it makes the whole
// new tree appear at once instead of costing a rename per tensor.
type stagedDir struct {
	parent    *Dir
	parentRel string
	tmp       string // its temporary name in parent
	final     string
	dir       *Dir
	items     []int // the dest items below it
	placed    bool
}

// dirLoc is where a destination directory is while the copy runs.
type dirLoc struct {
	dir    *Dir
	rel    string     // its mount-relative path now (through a staged temporary name)
	staged *stagedDir // the staged directory it is (or is below), or nil
}

// dest is a copy's destination: temporaries filled by WriteAt, put in place
// by Commit (a rename through the mount, an internal rename, or an adoption),
// removed by Abort.
type dest struct {
	fsys   *FS
	items  []destItem
	staged []*stagedDir
	dirs   map[string]dirLoc // by final mount-relative path
	rename bool              // put in place by renames through the mount
	placed int
}

// prepare builds a destination at p. adoptTarget, when set, is the node whose
// xattr is being set (copy_from): its lock is held by the kernel, so nothing
// may be renamed over it or created in it through the mount: files there are
// replaced by adoption and new names inserted internally. viaMount says the
// final renames may go through the mount (so inotify sees them); it is false
// when the kernel may hold the lock of a destination directory (batch holds
// the root's).
func (f *FS) prepare(p string, isDir bool, metas []transfer.Meta, adoptTarget gofs.InodeEmbedder, viaMount bool) (_ *dest, err error) {
	defer func() { err = copyErr(err) }()
	d := &dest{fsys: f, rename: adoptTarget == nil && viaMount && f.mnt != "", dirs: map[string]dirLoc{}}
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
		parentPath = path.Clean(parentPath)
		parent, err := f.resolve(parentPath)
		if err != nil {
			return nil, err
		}
		pd, isD := parent.(*Dir)
		if !isD {
			return nil, errf(syscall.ENOTDIR, "%s: parent is not a directory", p)
		}
		if err := d.add(dirLoc{dir: pd, rel: parentPath}, parentPath, name, metas[0], adoptTarget); err != nil {
			return nil, err
		}
		ok = true
		return d, nil
	}
	// Like a file's, a directory's destination needs its parent: only the
	// destination itself and the tree below it are made.
	if parent := path.Dir(p); parent != p {
		n, err := f.resolve(parent)
		if err != nil {
			return nil, errf(syscall.ENOENT, "%s: the destination's parent %s does not exist", p, parent)
		}
		if _, ok := n.(*Dir); !ok {
			return nil, errf(syscall.ENOTDIR, "%s: the destination's parent %s is a file", p, parent)
		}
	}
	if _, err := d.dirFor(p); err != nil { // made even when no tensor lands in it
		return nil, err
	}
	for _, m := range metas {
		dirRel, name := path.Split(m.Rel)
		final := path.Join(p, dirRel)
		loc, err := d.dirFor(final)
		if err != nil {
			return nil, err
		}
		if err := d.add(loc, final, name, m, adoptTarget); err != nil {
			return nil, err
		}
	}
	ok = true
	return d, nil
}

// dirFor returns the directory that will be at mount-relative path p. An
// existing one is used as it is; the first missing component of p is
// staged (made under a temporary name, renamed into place at Commit) and
// the rest made inside it, all without a syscall on the mount. Errors:
// ENOTDIR when a component is a file, ENAMETOOLONG for a long component.
func (d *dest) dirFor(p string) (dirLoc, error) {
	p = path.Clean("/" + p)
	if loc, ok := d.dirs[p]; ok {
		return loc, nil
	}
	if p == "/" {
		loc := dirLoc{dir: d.fsys.root, rel: "/"}
		d.dirs[p] = loc
		return loc, nil
	}
	parentPath, name := path.Split(p)
	parent, err := d.dirFor(parentPath)
	if err != nil {
		return dirLoc{}, err
	}
	if errno := checkName(name); errno != 0 {
		return dirLoc{}, errf(errno, "%s: name too long", p)
	}
	pd := parent.dir
	pd.mu.Lock()
	in := pd.entries[name]
	if in != nil {
		pd.mu.Unlock()
		sub, ok := in.Operations().(*Dir)
		if !ok {
			return dirLoc{}, errf(syscall.ENOTDIR, "%s is a file", p)
		}
		loc := dirLoc{dir: sub, rel: path.Join(parent.rel, name), staged: parent.staged}
		d.dirs[p] = loc
		return loc, nil
	}
	nd := pd.newSubdir()
	in = pd.NewPersistentInode(context.Background(), nd, gofs.StableAttr{Mode: syscall.S_IFDIR})
	loc := dirLoc{dir: nd, staged: parent.staged}
	if parent.staged != nil {
		// Inside a staged directory: made under its final name.
		pd.setEntry(name, in)
		loc.rel = path.Join(parent.rel, name)
	} else {
		s := &stagedDir{parent: pd, parentRel: parent.rel, tmp: d.fsys.tmpNameIn(pd), final: name, dir: nd}
		pd.setEntry(s.tmp, in)
		d.staged = append(d.staged, s)
		loc.staged, loc.rel = s, path.Join(parent.rel, s.tmp)
	}
	pd.mu.Unlock()
	pd.invalidateAttr() // its nlink counts the new subdirectory
	d.dirs[p] = loc
	return loc, nil
}

// tmpNameIn is a fresh temporary name for a copy's tensor or directory in
// d, one no entry of d has (users may name files .tensorfs-tmp-N too);
// d.mu is held.
func (f *FS) tmpNameIn(d *Dir) string {
	for {
		n := fmt.Sprintf("%s%d", tmpPrefix, f.tmpSeq.Add(1))
		if d.entries[n] == nil {
			return n
		}
	}
}

// newSubdir makes a directory node for a copy to put in d: d's template,
// mode 0755, and d's owner (like the tensors a copy puts there).
func (d *Dir) newSubdir() *Dir {
	nd := &Dir{fsys: d.fsys, tmpl: d.template()}
	nd.meta.init(context.Background(), 0o755)
	d.meta.mu.Lock()
	nd.meta.uid, nd.meta.gid = d.meta.uid, d.meta.gid
	d.meta.mu.Unlock()
	return nd
}

// add prepares one tensor named name in the directory at loc, whose final
// mount-relative path is toRel.
func (d *dest) add(loc dirLoc, toRel, name string, m transfer.Meta, adoptTarget gofs.InodeEmbedder) error {
	if errno := checkName(name); errno != 0 {
		return errf(errno, "%s/%s: name too long", toRel, name)
	}
	dir := loc.dir
	tmpl, err := templateFor(dir, m)
	if err != nil {
		return err
	}
	// The copy writes every byte before the tensor is in place (a failed
	// one is dropped unseen), so its memory need not be cleared first.
	tmpl.Uninit = true
	item := destItem{from: dir, fromRel: loc.rel, final: name, toRel: toRel, staged: loc.staged}
	if loc.staged == nil {
		item.to = dir
	}
	existing := dir.child(name)
	if existing != nil {
		if _, isDir := existing.Operations().(*Dir); isDir {
			return errf(syscall.EISDIR, "%s is a directory", path.Join(toRel, name))
		}
		if loc.staged != nil {
			// Only this copy puts tensors in a staged directory, and the
			// transfer refuses a tensor named twice.
			return errf(syscall.EPROTO, "%s: tensor named twice", path.Join(toRel, name))
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
	item.tmp = name // in a staged directory; else a temporary name, below
	uid, gid, mode, xattrs := landing(dir, existing)
	item.mode = mode
	tmpl.Owner = uid
	t, err := d.fsys.store.New(tmpl)
	if err != nil {
		return err
	}
	nf := &File{fsys: d.fsys, t: t}
	// Owner-only until Commit: the temporary's name can be looked up, and
	// until the copy has written it, its memory may hold what an earlier
	// tensor of the same owner left there (Template.Uninit).
	nf.meta.init(context.Background(), tmpMode)
	nf.meta.uid, nf.meta.gid, nf.meta.xattrs = uid, gid, xattrs
	in := dir.NewPersistentInode(context.Background(), nf, gofs.StableAttr{Mode: syscall.S_IFREG})
	dir.mu.Lock()
	if loc.staged == nil {
		item.tmp = d.fsys.tmpNameIn(dir)
	}
	dir.setEntry(item.tmp, in)
	dir.mu.Unlock()
	item.f, item.temp = nf, t
	if loc.staged != nil {
		loc.staged.items = append(loc.staged.items, len(d.items))
	}
	d.items = append(d.items, item)
	return nil
}

// landing is what a copied tensor gets where it lands in dir: a new one
// is dir's owner's, mode copyMode; one that replaces the tensor existing
// keeps that tensor's owner, mode and user.* attributes (as a pull into
// it does): only the bytes, dtype, shape and registration change. Its
// memory is keyed by that owner.
func landing(dir *Dir, existing *gofs.Inode) (uid, gid, mode uint32, xattrs map[string][]byte) {
	if existing != nil {
		if f, ok := existing.Operations().(*File); ok {
			f.meta.mu.Lock()
			defer f.meta.mu.Unlock()
			return f.meta.uid, f.meta.gid, f.meta.mode, maps.Clone(f.meta.xattrs)
		}
	}
	dir.meta.mu.Lock()
	defer dir.meta.mu.Unlock()
	return dir.meta.uid, dir.meta.gid, copyMode, nil
}

// templateFor is the tensor template of a copied tensor landing in dir: the
// source's dtype and shape on dir's template device. Errors: EPROTO when the
// metadata is inconsistent.
func templateFor(dir *Dir, m transfer.Meta) (tensor.Template, error) {
	dt, err := dtype.Parse(m.DType)
	if err != nil {
		return tensor.Template{}, errf(syscall.EPROTO, "tensor %q: %v", m.Rel, err)
	}
	sh, err := dtype.ParseShape(m.Shape)
	if err != nil {
		return tensor.Template{}, errf(syscall.EPROTO, "tensor %q: %v", m.Rel, err)
	}
	if nb, err := dtype.NBytes(dt, sh); err != nil || nb != m.NBytes {
		return tensor.Template{}, errf(syscall.EPROTO, "tensor %q: %s %s is not %d bytes", m.Rel, dt, sh, m.NBytes)
	}
	tmpl := dir.template()
	dir.meta.mu.Lock()
	owner := dir.meta.uid
	dir.meta.mu.Unlock()
	return tensor.Template{DType: dt, Shape: sh, Device: tmpl.Device, Owner: owner}, nil
}

// mkdirAll returns the directory at p, creating it and missing parents
// internally (no syscall on the mount), owned like their parents. Errors:
// ENOTDIR when a component is a file, ENAMETOOLONG for a long component.
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
			in = cur.NewPersistentInode(context.Background(), cur.newSubdir(), gofs.StableAttr{Mode: syscall.S_IFDIR})
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
	return copyErr(err)
}

// tensorAt is item i's temporary tensor, for device-to-device local copies.
func (d *dest) tensorAt(i int) *tensor.Tensor { return d.items[i].temp }

// committer puts a copy's tensors in place. Renames through the mount go
// relative to an fd of each directory, opened once: a full path would make
// the kernel look up every directory of it again for each tensor (entry
// timeouts are 0).
type committer struct {
	d     *dest
	fds   map[string]int
	stuck bool // the mount stayed locked: the rest goes in place inside the daemon
}

func (c *committer) close() {
	for _, fd := range c.fds {
		unix.Close(fd)
	}
}

// fd opens (once) the directory at mount-relative path rel.
func (c *committer) fd(rel string) (int, error) {
	if fd, ok := c.fds[rel]; ok {
		return fd, nil
	}
	fd, err := openDirWithin(c.d.fsys.mnt + rel)
	if err != nil {
		return -1, err
	}
	c.fds[rel] = fd
	return fd, nil
}

// rename moves fromRel/from to toRel/to through the mount, or inside the
// daemon (internal) once the mount is stuck or when the copy does not
// rename through the mount.
func (c *committer) rename(fromRel, from, toRel, to string, flags uint, internal func() error) error {
	if !c.d.rename || c.stuck {
		return internal()
	}
	fromFd, err := c.fd(fromRel)
	if err == nil {
		var toFd int
		if toFd, err = c.fd(toRel); err == nil {
			c.stuck, err = renameViaMount(fromFd, from, toFd, to, flags, internal)
		}
	}
	if errors.Is(err, syscall.ENAMETOOLONG) {
		// A directory deeper than PATH_MAX cannot be opened through the
		// mount by its path: this tensor goes in place inside the daemon.
		log.Printf("put %s/%s in place: its path is too long to rename through the mount; renamed inside the daemon (no IN_MOVED_TO)", toRel, to)
		return internal()
	}
	if errors.Is(err, errStuck) {
		c.stuck = true
		err = internal()
	}
	if c.stuck {
		// The kernel holds the directory's lock for someone who waits on
		// us (see renameViaMount): this and the rest go in place inside
		// the daemon, without inotify events.
		log.Printf("put %s/%s in place: the directory stayed locked for %v; renamed inside the daemon (no IN_MOVED_TO for what is left of this copy)", toRel, to, renameStuckAfter)
	}
	return err
}

// Commit implements transfer.Dest: each tensor is put in place atomically;
// a staged directory (a new one) with all its tensors at once.
func (d *dest) Commit() (int, error) {
	c := &committer{d: d, fds: map[string]int{}}
	defer c.close()
	fail := func(where string, err error) (int, error) {
		n := d.placed
		d.Abort()
		return n, &transfer.Error{Errno: transfer.Errno(copyErr(err)), Msg: fmt.Sprintf("put %s in place: %v", where, err), Copied: n}
	}
	for _, s := range d.staged {
		for _, i := range s.items {
			d.items[i].f.setMode(d.items[i].mode)
		}
		err := c.rename(s.parentRel, s.tmp, s.parentRel, s.final, unix.RENAME_NOREPLACE, func() error {
			return moveEntry(s.parent, s.tmp, s.parent, s.final, true)
		})
		if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
			// Someone made the name meanwhile: the tensors go into it one
			// by one, like into any existing directory.
			log.Printf("put %s in place: it was made meanwhile; putting its tensors in one by one", path.Join(s.parentRel, s.final))
			continue
		}
		if err != nil {
			return fail(path.Join(s.parentRel, s.final), err)
		}
		s.placed = true
		for _, i := range s.items {
			d.items[i].placed = true
		}
		d.placed += len(s.items)
	}
	for i := range d.items {
		it := &d.items[i]
		if it.placed {
			continue
		}
		if it.to == nil { // below a staged directory that was made meanwhile
			to, err := d.fsys.mkdirAll(it.toRel)
			if err != nil {
				return fail(path.Join(it.toRel, it.final), err)
			}
			it.to = to
			// It lands like any tensor copied into that directory.
			uid, gid, mode, xattrs := landing(to, to.child(it.final))
			it.f.meta.mu.Lock()
			it.f.meta.uid, it.f.meta.gid, it.f.meta.xattrs = uid, gid, xattrs
			it.f.meta.mu.Unlock()
			it.mode = mode
			it.temp.SetOwner(uid)
		}
		var err error
		if it.target != nil {
			err = it.target.t.Adopt(it.temp)
			if err == nil {
				it.target.meta.touch()
				it.h.Close()
				it.h = nil
			}
		} else {
			it.f.setMode(it.mode)
			err = c.rename(it.fromRel, it.tmp, it.toRel, it.final, 0, func() error {
				return moveEntry(it.from, it.tmp, it.to, it.final, false)
			})
		}
		if err != nil {
			return fail(path.Join(it.toRel, it.final), err)
		}
		it.placed = true
		d.placed++
	}
	d.dropStaged()
	return d.placed, nil
}

// setMode sets a file's mode bits (a copy's temporary at Commit).
func (f *File) setMode(mode uint32) {
	f.meta.mu.Lock()
	f.meta.mode = mode
	f.meta.mu.Unlock()
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

// renameViaMount renames from (in directory fd fromFd) to to (in toFd)
// through the mount, with renameat2's flags, so that watchers see
// IN_MOVED_TO. When that does not finish within renameStuckAfter (stuck),
// internal puts it in place inside the daemon instead: the kernel's rename
// may still be waiting for the lock, and when the lock comes free its
// lookup of the temporary finds nothing and it fails harmlessly; if the
// kernel's rename wins that race instead, the internal one finds no
// temporary (ENOENT), and the kernel's result is the outcome.
func renameViaMount(fromFd int, from string, toFd int, to string, flags uint, internal func() error) (stuck bool, err error) {
	late, err := bounded(func() error { return unix.Renameat2(fromFd, from, toFd, to, flags) })
	if late == nil {
		return false, err
	}
	if err := internal(); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			// Either the kernel's rename got the temporary (it is
			// finishing: its result comes at once) or someone else moved
			// or removed it, and the kernel's rename still waits for the
			// lock of a process that may wait on us: do not wait for it.
			select {
			case err := <-late:
				return true, err
			case <-time.After(lateRenameGrace):
				return true, err
			}
		}
		return true, err
	}
	return true, nil
}

// lateRenameGrace is how long renameViaMount waits for the result of a
// late rename that may have taken the temporary (its FUSE request has
// been answered: the syscall is returning).
const lateRenameGrace = time.Second

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

// Abort implements transfer.Dest: the temporaries not yet in place go away,
// and the staged directories with them.
func (d *dest) Abort() {
	for i := range d.items {
		it := &d.items[i]
		if it.placed {
			continue
		}
		if it.h != nil {
			it.h.Close()
			it.h = nil
		}
		if it.f != nil {
			it.from.mu.Lock()
			if in := it.from.entries[it.tmp]; in != nil && in.Operations() == it.f {
				it.from.delEntry(it.tmp)
			}
			it.from.mu.Unlock()
			it.temp.Unlink()
		}
		it.placed = true
	}
	d.dropStaged()
}

// dropStaged removes the staged directories that were not put in place
// (their tensors are gone or were put in place one by one). One that holds
// something this copy did not put there (a user may write into it: it is
// visible) stays, with that, under its temporary name: dropping it would
// lose those entries and leak their memory.
func (d *dest) dropStaged() {
	for _, s := range d.staged {
		if s.placed {
			continue
		}
		s.placed = true
		if !pruneEmpty(s.dir) {
			log.Printf("%s: left in place, it holds entries this copy did not make", path.Join(s.parentRel, s.tmp))
			continue
		}
		s.parent.mu.Lock()
		if in := s.parent.entries[s.tmp]; in != nil && in.Operations() == s.dir && s.dir.empty() {
			s.parent.delEntry(s.tmp)
		}
		s.parent.mu.Unlock()
		s.parent.invalidateAttr()
	}
}

// pruneEmpty removes the empty directories below d and reports whether d
// is empty then.
func pruneEmpty(d *Dir) bool {
	d.mu.Lock()
	subs := map[string]*Dir{}
	for n, in := range d.entries {
		if sub, ok := in.Operations().(*Dir); ok {
			subs[n] = sub
		}
	}
	d.mu.Unlock()
	for n, sub := range subs {
		if !pruneEmpty(sub) {
			continue
		}
		d.mu.Lock()
		if in := d.entries[n]; in != nil && in.Operations() == sub && sub.empty() {
			d.delEntry(n)
		}
		d.mu.Unlock()
		d.invalidateAttr()
	}
	return d.empty()
}

// moveEntry moves entry name of from to newName in to without a syscall on
// the mount, replacing a file there, or with noReplace failing with EEXIST
// when newName exists. Errors: ENOENT when name is gone, EISDIR when a file
// would replace a directory.
func moveEntry(from *Dir, name string, to *Dir, newName string, noReplace bool) error {
	unlock := lockPair(from, to)
	in := from.entries[name]
	if in == nil {
		unlock()
		return errf(syscall.ENOENT, "temporary %s vanished", name)
	}
	var replaced *File
	if old := to.entries[newName]; old != nil {
		if noReplace {
			unlock()
			return errf(syscall.EEXIST, "%s exists", newName)
		}
		f, ok := old.Operations().(*File)
		if !ok {
			unlock()
			return errf(syscall.EISDIR, "%s is a directory", newName)
		}
		replaced = f
	}
	from.delEntry(name)
	to.setEntry(newName, in)
	unlock()
	if from != to && in.IsDir() {
		from.invalidateAttr() // nlinks changed
		to.invalidateAttr()
	}
	if replaced != nil {
		replaced.t.Unlink()
	}
	return nil
}
