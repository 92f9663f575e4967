package namespace

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/bits"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"unsafe"

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
	// inPlace: the item is bytes [off, off+n) of the existing tensor
	// target, written where they are (no temporary; see pinned).
	inPlace bool
	off, n  int64
	spans   []transfer.Span // a range list's, in place: where its bytes go (off 0)
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
	tree   *Tree
	items  []destItem
	staged []*stagedDir
	dirs   map[string]dirLoc // by final mount-relative path
	rename bool              // put in place by renames through the mount
	placed int
	// pins hold the in-place destinations, one per tensor however many
	// ranges of it the copy writes, until Commit or Abort; inPlaceAt is
	// their files by path.
	pins      map[*File]*pinned
	inPlaceAt map[string]*File
	// caller is the FUSE caller whose copy this is (nil: a peer's), who
	// must be allowed to search the paths and write what the copy
	// writes (mayReach, mayWrite, mayEnter).
	caller *Caller
	// shared marks the in-place items whose tensor has bytes that two of
	// the copy's ranges write (findShared), once a stream asks to write in
	// place.
	sharedOnce sync.Once
	shared     []bool
}

// pinned is an in-place destination held for a copy: open (alive after an
// unlink) and pinned (its size and allocation stay: tensor.PinRange).
type pinned struct {
	h     *tensor.Handle
	unpin func()
	size  int64 // its size, fixed while pinned
}

// prepOpts are how a copy's destination is made (see prepare).
type prepOpts struct {
	// adopt is the node whose xattr is being set (copy_from), or nil.
	adopt Node
	// viaMount: the final renames may go through the mount.
	viaMount bool
	// caller, for a copy asked for through this mount, must be allowed to
	// write each in-place destination (as open(O_WRONLY) would); nil for
	// a peer's copy, which the cluster secret authorizes.
	caller *Caller
}

// prepare builds a destination at p for the descriptors metas: whole
// tensors get temporaries, in-place ranges are checked and pinned (all of
// them before any byte moves). o.adopt, when set, is the node whose
// xattr is being set (copy_from): its lock is held by the kernel, so nothing
// may be renamed over it or created in it through the mount: files there are
// replaced by adoption and new names inserted internally. o.viaMount says the
// final renames may go through the mount (so inotify sees them); it is false
// when the kernel may hold the lock of a destination directory (batch holds
// the root's).
func (f *Tree) prepare(p string, isDir bool, metas []transfer.Meta, o prepOpts) (_ *dest, err error) {
	defer func() { err = copyErr(err) }()
	adoptTarget := o.adopt
	d := &dest{tree: f, rename: adoptTarget == nil && o.viaMount && f.placer != nil, dirs: map[string]dirLoc{}, caller: o.caller}
	ok := false
	defer func() {
		if !ok {
			d.Abort()
		}
	}()
	d.items = make([]destItem, 0, len(metas))
	// An empty tree is a whole copy (of its directories) too.
	whole := len(metas) == 0
	var lastRel, lastAt string // a thousand ranges of one tensor join once
	for _, m := range metas {
		if m.InPlace {
			if m.Rel != lastRel || lastAt == "" {
				lastRel, lastAt = m.Rel, path.Join(p, m.Rel)
			}
			if err := d.addInPlace(lastAt, m, o.caller); err != nil {
				return nil, err
			}
		} else {
			whole = true
		}
	}
	if !whole {
		ok = true
		return d, nil
	}
	if err := f.mayReach(o.caller, p); err != nil {
		return nil, err
	}
	if !isDir {
		parentPath, name := path.Split(p)
		if name == "" {
			return nil, errf(syscall.EISDIR, "%s is a directory", p)
		}
		parentPath = path.Clean(parentPath)
		parent, err := f.Resolve(parentPath)
		if err != nil {
			return nil, err
		}
		pd, isD := parent.(*Dir)
		if !isD {
			return nil, errf(syscall.ENOTDIR, "%s: parent is not a directory", p)
		}
		if adoptTarget == nil { // an adoption changes no entry of pd
			if err := mayEnter(o.caller, pd, name); err != nil {
				return nil, err
			}
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
		n, err := f.Resolve(parent)
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
		if m.InPlace {
			continue
		}
		dirRel, name := path.Split(m.Rel)
		final := path.Join(p, dirRel)
		if m.Line {
			// A line's destination is named exactly: its parent exists.
			n, err := f.Resolve(final)
			if err != nil {
				return nil, errf(syscall.ENOENT, "%s: the destination's parent %s does not exist", path.Join(p, m.Rel), final)
			}
			if _, ok := n.(*Dir); !ok {
				return nil, errf(syscall.ENOTDIR, "%s: the destination's parent %s is a file", path.Join(p, m.Rel), final)
			}
		}
		loc, err := d.dirFor(final)
		if err != nil {
			return nil, err
		}
		if loc.staged == nil { // an existing directory: its entry changes
			if err := mayEnter(o.caller, loc.dir, name); err != nil {
				return nil, err
			}
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
		loc := dirLoc{dir: d.tree.root, rel: "/"}
		d.dirs[p] = loc
		return loc, nil
	}
	parentPath, name := path.Split(p)
	parent, err := d.dirFor(parentPath)
	if err != nil {
		return dirLoc{}, err
	}
	if errno := CheckName(name); errno != 0 {
		return dirLoc{}, errf(errno, "%s: name too long", p)
	}
	pd := parent.dir
	if c := d.caller; c != nil && c.UID != 0 && parent.staged == nil {
		// An existing directory: searched on the way, and given a new
		// entry when the next is made. (Not for a peer's copy or root's:
		// this runs for every directory of a tree copy.)
		bits, what := uint32(0o1), "search a directory on the path to "+p
		if pd.Child(name) == nil {
			bits, what = 0o3, "create or replace entries in the destination directory"
		}
		if err := mayAccess(d.caller, &pd.meta, bits, what); err != nil {
			return dirLoc{}, err
		}
	}
	pd.mu.Lock()
	in := pd.entries[name]
	if in != nil {
		pd.mu.Unlock()
		sub, ok := in.(*Dir)
		if !ok {
			return dirLoc{}, errf(syscall.ENOTDIR, "%s is a file", p)
		}
		loc := dirLoc{dir: sub, rel: path.Join(parent.rel, name), staged: parent.staged}
		d.dirs[p] = loc
		return loc, nil
	}
	nd := pd.newSubdir()
	in = nd
	loc := dirLoc{dir: nd, staged: parent.staged}
	if parent.staged != nil {
		// Inside a staged directory: made under its final name.
		pd.setEntry(name, in)
		loc.rel = path.Join(parent.rel, name)
	} else {
		s := &stagedDir{parent: pd, parentRel: parent.rel, tmp: d.tree.tmpNameIn(pd), final: name, dir: nd}
		pd.setEntry(s.tmp, in)
		d.staged = append(d.staged, s)
		loc.staged, loc.rel = s, path.Join(parent.rel, s.tmp)
	}
	pd.mu.Unlock()
	pd.invalidate() // its nlink counts the new subdirectory
	d.dirs[p] = loc
	return loc, nil
}

// tmpNameIn is a fresh temporary name for a copy's tensor or directory in
// d, one no entry of d has (users may name files .tensorfs-tmp-N too);
// d.mu is held.
func (f *Tree) tmpNameIn(d *Dir) string {
	for {
		n := fmt.Sprintf("%s%d", tmpPrefix, f.tmpSeq.Add(1))
		if d.entries[n] == nil {
			return n
		}
	}
}

// add prepares one tensor named name in the directory at loc, whose final
// mount-relative path is toRel.
func (d *dest) add(loc dirLoc, toRel, name string, m transfer.Meta, adoptTarget Node) error {
	if errno := CheckName(name); errno != 0 {
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
	existing := dir.Child(name)
	if existing != nil {
		if _, isDir := existing.(*Dir); isDir {
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
		item.target = existing.(*File)
		// The target keeps the memory it adopts: that memory must be keyed
		// by the target's owner, not the directory's. Recycled (uncleared)
		// for the directory owner's next copy, it would show them what the
		// target's owner wrote into a file they could not read.
		tmpl.Owner = item.target.t.Owner()
		t, err := d.tree.store.New(tmpl)
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
	t, err := d.tree.store.New(tmpl)
	if err != nil {
		return err
	}
	// Owner-only until Commit: the temporary's name can be looked up, and
	// until the copy has written it, its memory may hold what an earlier
	// tensor of the same owner left there (Template.Uninit).
	nf := NewFile(t, tmpMode, uid, gid)
	nf.meta.Xattrs = xattrs
	dir.mu.Lock()
	if loc.staged == nil {
		item.tmp = d.tree.tmpNameIn(dir)
	}
	dir.setEntry(item.tmp, nf)
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
func landing(dir *Dir, existing Node) (uid, gid, mode uint32, xattrs map[string][]byte) {
	if f, ok := existing.(*File); ok {
		f.meta.Lock()
		defer f.meta.Unlock()
		return f.meta.UID, f.meta.GID, f.meta.Mode, maps.Clone(f.meta.Xattrs)
	}
	uid, gid = dir.meta.Owner()
	return uid, gid, copyMode, nil
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
	tmpl := dir.Template()
	owner, _ := dir.meta.Owner()
	return tensor.Template{DType: dt, Shape: sh, Device: tmpl.Device, Owner: owner}, nil
}

// WriteAt implements transfer.Dest. A range list's bytes go to its spans:
// on a GPU as one scatter from device scratch when they are several
// (scatter), else one write each.
func (d *dest) WriteAt(i int, p []byte, off int64) error {
	it := &d.items[i]
	if !it.inPlace {
		_, err := it.temp.WriteAt(p, off)
		return copyErr(err)
	}
	if it.spans == nil {
		return copyErr(it.target.t.WriteRange(p, it.off+off))
	}
	t := it.target.t
	var exts []tensor.Extent
	err := transfer.Pieces(it.spans, off, int64(len(p)), func(pos, _, dst, n int64) error {
		exts = append(exts, tensor.Extent{Dst: t, DstOff: dst, SrcOff: pos - off, N: n})
		return nil
	})
	if err != nil {
		return err
	}
	if len(exts) > 1 {
		if done, err := d.scatter(t.Device(), p, exts); done {
			return err
		}
	}
	for _, e := range exts {
		if err := t.WriteRange(p[e.SrcOff:e.SrcOff+e.N], e.DstOff); err != nil {
			return copyErr(err)
		}
	}
	return nil
}

// WriteBatch implements transfer.BatchWriter for chunks that all go to
// GPU memory of one device: see scatter. done=false for host memory (it
// takes bytes in place), chunks on several devices, or no scratch to be
// had.
func (d *dest) WriteBatch(data []byte, chunks []transfer.BatchChunk) (bool, error) {
	dev := ""
	exts := make([]tensor.Extent, 0, len(chunks))
	for _, c := range chunks {
		t, _ := d.at(c.I)
		dn := t.Device()
		if !strings.HasPrefix(dn, "cuda:") || dev != "" && dn != dev {
			return false, nil
		}
		dev = dn
		err := d.pieces(c.I, c.Off, int64(c.N), func(t *tensor.Tensor, dst, pos, n int64) error {
			exts = append(exts, tensor.Extent{Dst: t, DstOff: dst, SrcOff: int64(c.Pos) + pos - c.Off, N: n})
			return nil
		})
		if err != nil {
			return true, err
		}
	}
	return d.scatter(dev, data, exts)
}

// scatter writes exts, each N bytes of data at its SrcOff into its tensor,
// all in GPU memory of device dev: data in one host-to-device copy into
// device scratch (tensor.Scratch), then one scatter kernel launch from
// there (tensor.CopyExtents), where a write each cost a staged copy and a
// stream synchronize (15 µs an 8 KiB chunk on an H200). done=false,
// nothing written, for host memory or no scratch to be had.
func (d *dest) scatter(dev string, data []byte, exts []tensor.Extent) (bool, error) {
	if !strings.HasPrefix(dev, "cuda:") || len(exts) == 0 {
		return false, nil
	}
	scratch, release, err := exts[0].Dst.Scratch(int64(len(data)))
	defer release()
	if err != nil || scratch == nil {
		return false, nil
	}
	if _, err := scratch.WriteAt(data, 0); err != nil {
		return true, copyErr(err)
	}
	for k := range exts {
		exts[k].SrcBuf = scratch
	}
	return true, copyErr(tensor.CopyExtents(exts))
}

// pieces calls fn for each contiguous piece of item i's bytes [off,
// off+n): where in which tensor it goes (dst), and its position in the
// item's bytes (pos). One piece, but for a range list's spans.
func (d *dest) pieces(i int, off, n int64, fn func(t *tensor.Tensor, dst, pos, n int64) error) error {
	it := &d.items[i]
	t, at := d.at(i)
	if it.spans == nil {
		return fn(t, at+off, off, n)
	}
	return transfer.Pieces(it.spans, off, n, func(pos, _, dst, k int64) error {
		return fn(t, dst, pos, k)
	})
}

// at is where item i's bytes go: its temporary from byte 0, or its
// in-place tensor from its offset.
func (d *dest) at(i int) (*tensor.Tensor, int64) {
	it := &d.items[i]
	if it.inPlace {
		return it.target.t, it.off
	}
	return it.temp, 0
}

// addInPlace adds the in-place descriptor m, whose tensor is at p: it must
// exist, hold the range (exactly m.NBytes bytes when m.Exact) and, for a
// caller of this mount, be writable by it. Errors: ENOENT, ENOTDIR (a
// component of p is a file), EISDIR, EINVAL, EACCES.
func (d *dest) addInPlace(p string, m transfer.Meta, c *Caller) error {
	file := d.inPlaceAt[p] // a thousand ranges of one tensor resolve it once
	if file == nil {
		if err := d.tree.mayReach(c, p); err != nil {
			return err
		}
		n, err := d.tree.Resolve(p)
		if err != nil {
			// Resolve's errno: ENOTDIR under a file, as a whole copy's
			// destination parent is (and a tree's "@0" onto a file).
			return errf(Errno(err), "in-place destination %s: %v", p, err)
		}
		f, ok := n.(*File)
		if !ok {
			return errf(syscall.EISDIR, "in-place destination %s is a directory", p)
		}
		file = f
		if d.inPlaceAt == nil {
			d.inPlaceAt = map[string]*File{}
		}
		d.inPlaceAt[p] = file
	}
	pin := d.pins[file]
	if pin == nil {
		if err := mayWrite(c, file); err != nil {
			return err
		}
		h, err := file.t.Open("in-place copy")
		if err != nil {
			return errf(syscall.ENOENT, "in-place destination %s: %v", p, err)
		}
		unpin, err := file.t.PinRange(0, 0)
		if err != nil {
			h.Close()
			return errf(syscall.ENOENT, "in-place destination %s: %v", p, err)
		}
		pin = &pinned{h: h, unpin: unpin, size: file.t.Size()}
		if d.pins == nil {
			d.pins = map[*File]*pinned{}
		}
		d.pins[file] = pin
	}
	if m.Exact && m.NBytes != pin.size {
		return errf(syscall.EINVAL, "in-place destination %s holds %d bytes, the source %d", p, pin.size, m.NBytes)
	}
	// A range list's bytes are its spans' (m.NBytes is their sum, which
	// passes the destination's size when blocks are written twice): each
	// span must fit, not their sum.
	if m.Spans == nil && (m.Off < 0 || m.NBytes < 0 || m.Off > pin.size-m.NBytes) {
		return errf(syscall.EINVAL, "in-place range [%d, +%d) outside %s (%d bytes)", m.Off, m.NBytes, p, pin.size)
	}
	for _, sp := range m.Spans {
		if sp.Dst < 0 || sp.N < 0 || sp.Dst > pin.size-sp.N {
			return errf(syscall.EINVAL, "in-place range [%d, +%d) outside %s (%d bytes)", sp.Dst, sp.N, p, pin.size)
		}
	}
	d.items = append(d.items, destItem{inPlace: true, target: file, off: m.Off, n: m.NBytes, spans: m.Spans, toRel: p})
	return nil
}

// findShared sets d.shared: the in-place items of every tensor that two
// ranges of the copy overlap in (the spans of one range list, or of
// several descriptors). A chunk received straight into such memory could be
// overwritten by another chunk before its checksum is checked there (a
// spurious EIO), so those items take their chunks through a buffer
// (WriteInPlace declines). All of a tensor's items, not only the
// overlapping ones: overlaps are rare, and one pass finds them.
func (d *dest) findShared() {
	d.shared = make([]bool, len(d.items))
	// The ranges of the in-place items, with sp.N > 0.
	ranges := func(yield func(t *tensor.Tensor, start, end int64) bool) {
		for i := range d.items {
			it := &d.items[i]
			if !it.inPlace {
				continue
			}
			t := it.target.t
			if it.spans == nil {
				if !yield(t, it.off, it.off+it.n) {
					return
				}
				continue
			}
			for _, sp := range it.spans {
				if sp.N > 0 && !yield(t, sp.Dst, sp.Dst+sp.N) {
					return
				}
			}
		}
	}
	overlap, ok := blockOverlaps(ranges)
	if !ok {
		overlap = sortOverlaps(ranges)
	}
	if len(overlap) == 0 {
		return
	}
	for i := range d.items {
		if it := &d.items[i]; it.inPlace && overlap[it.target.t] {
			d.shared[i] = true
		}
	}
}

// sortOverlaps is findShared's general answer: the tensors two of whose
// ranges overlap, found by sorting every range by tensor and start.
func sortOverlaps(ranges func(yield func(t *tensor.Tensor, start, end int64) bool)) map[*tensor.Tensor]bool {
	type iv struct {
		t          *tensor.Tensor
		start, end int64
	}
	var ivs []iv
	ranges(func(t *tensor.Tensor, start, end int64) bool {
		ivs = append(ivs, iv{t, start, end})
		return true
	})
	slices.SortFunc(ivs, func(a, b iv) int {
		if a.t != b.t {
			return cmp.Compare(uintptr(unsafe.Pointer(a.t)), uintptr(unsafe.Pointer(b.t)))
		}
		return cmp.Compare(a.start, b.start)
	})
	overlap := map[*tensor.Tensor]bool{}
	for k := 1; k < len(ivs); k++ {
		if ivs[k].t == ivs[k-1].t && ivs[k].start < ivs[k-1].end {
			overlap[ivs[k].t] = true
		}
		// Carry the furthest end of the tensor so far.
		if ivs[k].t == ivs[k-1].t && ivs[k].end < ivs[k-1].end {
			ivs[k].end = ivs[k-1].end
		}
	}
	return overlap
}

// blockOverlaps is findShared's answer without a sort, for the usual
// KV-cache copy: every range of a tensor one block long and at a multiple
// of it (a block list). Then two ranges overlap exactly when they name
// the same block, which a bitmap of the tensor's blocks finds in one pass.
// Sorting a 1000-range list with a comparison closure cost about 100 µs of
// the receiving daemon's CPU on the 2-core VM, at its first chunk
// (2026-12-06). ok is false (the caller sorts) when some tensor's ranges
// are not such a list, or its bitmap would pass maxBlockBits. ranges
// yields each range: its tensor and [start, end), start < end.
func blockOverlaps(ranges func(yield func(t *tensor.Tensor, start, end int64) bool)) (overlap map[*tensor.Tensor]bool, ok bool) {
	type blocks struct {
		size  int64
		shift int // log2(size) when size is a power of two (the usual block), else -1
		bits  []uint64
	}
	var last *tensor.Tensor
	var cur *blocks
	var byTensor map[*tensor.Tensor]*blocks
	ok = true
	ranges(func(t *tensor.Tensor, start, end int64) bool {
		if t != last {
			last = t
			if cur = byTensor[t]; cur == nil {
				cur = &blocks{size: end - start, shift: -1}
				if cur.size&(cur.size-1) == 0 {
					cur.shift = bits.TrailingZeros64(uint64(cur.size))
				}
				if byTensor == nil {
					byTensor = map[*tensor.Tensor]*blocks{}
				}
				byTensor[t] = cur
			}
		}
		var b int64
		switch {
		case end-start != cur.size:
			ok = false
		case cur.shift >= 0: // a shift and a mask, not two 64-bit divisions
			ok, b = start&(cur.size-1) == 0, start>>cur.shift
		default:
			ok, b = start%cur.size == 0, start/cur.size
		}
		if !ok || b >= maxBlockBits {
			ok = false
			return false
		}
		if w := int(b / 64); w >= len(cur.bits) {
			cur.bits = append(cur.bits, make([]uint64, w+1-len(cur.bits))...)
		}
		word, bit := &cur.bits[b/64], uint64(1)<<(b%64)
		if *word&bit != 0 {
			if overlap == nil {
				overlap = map[*tensor.Tensor]bool{}
			}
			overlap[t] = true
		}
		*word |= bit
		return true
	})
	if !ok {
		return nil, false
	}
	return overlap, true
}

// maxBlockBits bounds blockOverlaps' bitmap of one tensor (2 MiB).
const maxBlockBits = 1 << 24

// unpinAll ends the in-place destinations' pins: their bytes have landed
// (Commit) or will not (Abort).
func (d *dest) unpinAll() {
	for f, p := range d.pins {
		p.unpin()
		p.h.Close()
		delete(d.pins, f)
	}
}

// Placer puts a copy's tensors in place through the mount, so that inotify
// watchers see each arrival (IN_MOVED_TO). The FUSE frontend implements it
// (Tree.SetMount); a tree without one renames inside the daemon.
type Placer interface {
	// Begin starts the renames of one commit; the commit calls End on
	// what it returns when it is done.
	Begin() Placement
}

// Placement is one commit's renames through the mount (it may keep the
// directories open between them).
type Placement interface {
	// Rename renames fromRel/from to toRel/to (fromRel and toRel are
	// tree-relative directory paths) through the mount, failing with
	// EEXIST when noReplace is set and the target exists. Where that
	// cannot be done, or does not finish in time (the kernel holds a lock
	// for someone who waits on this copy), it calls internal, which moves
	// the entry inside the daemon, and returns internal's result.
	Rename(fromRel, from, toRel, to string, noReplace bool, internal func() error) error
	// End releases what the renames held.
	End()
}

// internalRename is the Placement of a copy that does not rename
// through the mount: every tensor is moved inside the daemon.
type internalRename struct{}

// Rename implements Placement: internal does it.
func (internalRename) Rename(_, _, _, _ string, _ bool, internal func() error) error {
	return internal()
}

// End implements Placement: nothing is held.
func (internalRename) End() {}

// Commit implements transfer.Dest: each tensor is put in place atomically;
// a staged directory (a new one) with all its tensors at once.
func (d *dest) Commit() (int, error) {
	// Every in-place byte has landed: those descriptors are done, before
	// any whole tensor appears (a batch's notification comes last).
	for i := range d.items {
		if it := &d.items[i]; it.inPlace && !it.placed {
			it.placed = true
			d.placed++
		}
	}
	d.unpinAll()
	var pl Placement = internalRename{}
	if d.rename {
		pl = d.tree.placer.Begin()
	}
	defer pl.End()
	for _, s := range d.staged {
		for _, i := range s.items {
			d.items[i].f.meta.SetMode(d.items[i].mode)
		}
		err := pl.Rename(s.parentRel, s.tmp, s.parentRel, s.final, true, func() error {
			return moveEntry(s.parent, s.tmp, s.parent, s.final, true)
		})
		if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
			// Someone made the name meanwhile: the tensors go into it one
			// by one, like into any existing directory.
			slog.Info("put in place: it was made meanwhile; putting its tensors in one by one", "path", path.Join(s.parentRel, s.final))
			continue
		}
		if err != nil {
			return d.fail(path.Join(s.parentRel, s.final), err)
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
		if err := d.place(pl, it); err != nil {
			return d.fail(path.Join(it.toRel, it.final), err)
		}
		it.placed = true
		d.placed++
	}
	d.dropStaged()
	return d.placed, nil
}

// fail aborts the rest of a commit that failed to put where in place, and
// returns how many tensors it had put in place and the error for the copy
// engine.
func (d *dest) fail(where string, err error) (int, error) {
	n := d.placed
	d.Abort()
	return n, &transfer.Error{Errno: transfer.Errno(copyErr(err)), Msg: fmt.Sprintf("put %s in place: %v", where, err), Copied: n}
}

// place puts one tensor in place: by adoption into its target, or by a
// rename of its temporary (through pl).
func (d *dest) place(pl Placement, it *destItem) error {
	if it.to == nil { // below a staged directory that was made meanwhile
		to, err := d.tree.mkdirAll(it.toRel)
		if err != nil {
			return err
		}
		it.to = to
		// It lands like any tensor copied into that directory.
		uid, gid, mode, xattrs := landing(to, to.Child(it.final))
		it.f.meta.Lock()
		it.f.meta.UID, it.f.meta.GID, it.f.meta.Xattrs = uid, gid, xattrs
		it.f.meta.Unlock()
		it.mode = mode
		it.temp.SetOwner(uid)
	}
	if it.target != nil {
		if err := it.target.t.Adopt(it.temp); err != nil {
			return err
		}
		it.target.Touched()
		it.h.Close()
		it.h = nil
		return nil
	}
	it.f.meta.SetMode(it.mode)
	return pl.Rename(it.fromRel, it.tmp, it.toRel, it.final, false, func() error {
		return moveEntry(it.from, it.tmp, it.to, it.final, false)
	})
}

// Abort implements transfer.Dest: the temporaries not yet in place go away,
// and the staged directories with them.
func (d *dest) Abort() {
	d.unpinAll()
	for i := range d.items {
		it := &d.items[i]
		if it.placed || it.inPlace {
			it.placed = true
			continue
		}
		if it.h != nil {
			it.h.Close()
			it.h = nil
		}
		if it.f != nil {
			it.from.mu.Lock()
			if n := it.from.entries[it.tmp]; n == Node(it.f) {
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
			slog.Warn("left in place, it holds entries this copy did not make", "path", path.Join(s.parentRel, s.tmp))
			continue
		}
		s.parent.mu.Lock()
		if n := s.parent.entries[s.tmp]; n == Node(s.dir) && s.dir.Empty() {
			s.parent.delEntry(s.tmp)
		}
		s.parent.mu.Unlock()
		s.parent.invalidate()
	}
}
