package tensor

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/ipc"
	"github.com/tensorfs/tensorfs/mr"
)

// allocation is one device buffer with its registration: they are created and
// retired together.
type allocation struct {
	buf    gpu.Buffer
	region *mr.Region
	export *ipc.Export
	// foreign: buf is memory another process owns, registered through
	// Register. Its size is fixed (ErrForeign on a resize) and Free only
	// unmaps it.
	foreign bool
	// key is the owner buf was allocated for, which keys its recycling;
	// mixed is set once the tensor holding it belongs to someone else
	// (a chown, an adoption), whose bytes the memory may then hold: it is
	// cleared before it is freed, never recycled to key's next copy as is.
	key   uint32
	mixed atomic.Bool
}

// Tensor is one tensor file's data and metadata. Its methods are safe for
// concurrent use.
type Tensor struct {
	s     *Store
	owner uint32 // uid whose tensors may share an exported allocation

	mu     sync.RWMutex
	dtype  dtype.DType // "" until set; U8 once allocated without one
	shape  dtype.Shape // nil until set or allocated
	device string
	size   int64       // nbytes, <= alloc.buf.Size()
	alloc  *allocation // nil until the first sizing
	gen    uint64      // bumped at every reallocation

	linked   bool
	handles  map[*Handle]struct{}
	released bool
	// frozen counts the copies reading the tensor now (Freeze); changes
	// of its bytes or size wait on thawed until it is 0.
	frozen int
	// pinned counts the in-place copies writing into the tensor now
	// (PinRange); changes of its size or allocation wait on thawed until
	// it is 0, so those copies' bytes land in the memory their peers mapped.
	pinned int
	thawed *sync.Cond // on &mu, made by the first Freeze or PinRange
	// binds are the peers' bindings for one-sided writes (BindExport):
	// changes of its size or allocation revoke them first, and wait.
	binds map[*Binding]struct{}
	// uninit: the allocation Store.New makes may keep recycled bytes
	// (Template.Uninit); cleared by then, so no later growth keeps any.
	uninit bool

	// onAttr is called after a change of what a file's attributes show of
	// the tensor (Info's Size, Capacity, Linked), once t.mu is released
	// (OnAttrChange); attrGen counts such changes.
	onAttr  func()
	attrGen atomic.Uint64
}

// OnAttrChange sets fn, called after every change of the tensor's size,
// allocated capacity or link (Info's Size, Capacity and Linked: a file's
// st_size, st_blocks and st_nlink), whoever made it, once the tensor's lock
// is released. The FUSE frontend caches a file's attributes in the kernel
// and tells the kernel to drop them from fn, so that stat right after any
// change shows it (a copy_from that adopts new memory, a batch that
// replaces a file internally, a shape that allocates). Set it once, before
// the tensor is shared; fn must not call back into the tensor's mutators.
func (t *Tensor) OnAttrChange(fn func()) { t.onAttr = fn }

// attrsChanged counts a change that OnAttrChange's fn must hear of; t.mu
// is held.
func (t *Tensor) attrsChanged() { t.attrGen.Add(1) }

// flushAttrs calls OnAttrChange's fn when a change was counted since gen
// (attrGen when the method began): deferred first, as
// defer t.flushAttrs(t.attrGen.Load()), by every method that may make
// one, so that it runs once the lock is released, after the change is
// visible to Info. A method tells of every change since it began, its own
// and any other's (an extra notice costs one write to /dev/fuse); a flag
// that any method cleared could lose one: a write that changed nothing
// cleared a batch's replace, whose setxattr then returned before the
// writer's notice went out.
func (t *Tensor) flushAttrs(gen uint64) {
	if t.onAttr != nil && t.attrGen.Load() != gen {
		t.onAttr()
	}
}

// Info is a snapshot of a tensor's metadata, for attributes and xattrs.
type Info struct {
	DType      dtype.DType // "" when unset
	Shape      dtype.Shape // nil when unset
	Device     string      // canonical device name
	Size       int64       // nbytes
	Capacity   int64       // bytes allocated (>= Size), 0 when unallocated
	Allocated  bool
	MRID       uint64 // memory region id, when allocated
	IPCID      uint64 // IPC export id, when allocated
	IPCHandle  string // IPC handle of the whole allocation, when allocated
	IPCOffset  int64  // offset of the tensor inside the exported allocation
	Rkey       []byte // packed remote key of the memory region (mr.Region.Rkey); nil when no transport maps it
	Generation uint64 // number of reallocations so far
	Linked     bool   // the tensor still has a name
}

// Info returns a consistent snapshot.
func (t *Tensor) Info() Info {
	t.mu.RLock()
	defer t.mu.RUnlock()
	in := Info{DType: t.dtype, Shape: t.shape, Device: t.device, Size: t.size, Generation: t.gen, Linked: t.linked}
	if a := t.alloc; a != nil {
		in.Allocated = true
		in.Capacity = a.buf.Size()
		in.MRID = a.region.ID
		in.IPCID = a.export.ID
		in.IPCHandle = a.export.Handle
		in.IPCOffset = a.export.Offset
		in.Rkey = a.region.Rkey
	}
	return in
}

// Owner is the uid that keys the tensor's allocations (Template.Owner,
// SetOwner).
func (t *Tensor) Owner() uint32 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.owner
}

// SetOwner gives the tensor to uid (a chown): its next allocations are
// uid's, and its current one, allocated for another owner, is cleared
// when freed, so that what uid writes into it never reaches that owner's
// next copy through recycled memory.
func (t *Tensor) SetOwner(uid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.owner = uid
	t.noteOwner()
}

// noteOwner marks the allocation mixed when it is not t.owner's; t.mu is
// held.
func (t *Tensor) noteOwner() {
	if a := t.alloc; a != nil && !a.foreign && a.key != t.owner {
		a.mixed.Store(true)
	}
}

// Freeze holds off changes of the tensor's bytes and size (WriteAt,
// Truncate, Allocate, Adopt) until thaw is called, so that a copy reading it
// sees one snapshot: a pull a peer asked for and every tensor of a directory
// copy, not only the file of a copy_to (whose inode lock the kernel holds).
// Freezes nest and never wait, even behind a waiting writer, so copies of
// overlapping trees cannot deadlock; a writer waits as long as the copies
// reading the tensor (bounded by the peers' timeout). thaw is idempotent.
func (t *Tensor) Freeze() (thaw func()) {
	t.mu.Lock()
	if t.thawed == nil {
		t.thawed = sync.NewCond(&t.mu)
	}
	t.frozen++
	t.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			if t.frozen--; t.frozen == 0 {
				t.thawed.Broadcast()
			}
			t.mu.Unlock()
		})
	}
}

// lockToChange takes t.mu for a change of bytes once no copy reads the
// tensor (Freeze).
func (t *Tensor) lockToChange() {
	t.mu.Lock()
	for t.frozen > 0 {
		t.thawed.Wait()
	}
}

// resizable reports whether nothing holds the tensor's size and allocation
// still: no copy reads it (Freeze), no in-place copy writes it (PinRange),
// no peer is bound to write it (BindExport). t.mu is held.
func (t *Tensor) resizable() bool { return t.frozen == 0 && t.pinned == 0 && len(t.binds) == 0 }

// lockToResize takes t.mu for a change of size or allocation once no copy
// reads the tensor (Freeze), no in-place copy writes it (PinRange) and no
// peer is bound to write it one-sided (BindExport: revoked here, and
// waited for).
func (t *Tensor) lockToResize() {
	t.mu.Lock()
	for {
		switch {
		case len(t.binds) > 0:
			t.revokeBindsLocked()
		case t.frozen > 0 || t.pinned > 0:
			t.thawed.Wait()
		default:
			return
		}
	}
}

// Device is the canonical name of the tensor's device ("host", "cuda:0"):
// Info's Device without the rest of the snapshot.
func (t *Tensor) Device() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.device
}

// Size is the tensor's size in bytes.
func (t *Tensor) Size() int64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.size
}

// newAllocation allocates exactly n bytes on the tensor's device and registers
// and exports them. t.mu is held.
func (t *Tensor) newAllocation(n int64) (*allocation, error) {
	dev, err := t.s.Device(t.device)
	if err != nil {
		return nil, err
	}
	var buf gpu.Buffer
	if t.uninit {
		t.uninit = false
		buf, err = gpu.AllocUninit(dev, n, t.owner)
	} else {
		buf, err = dev.Alloc(n, t.owner)
	}
	if err != nil {
		return nil, err
	}
	region, err := t.s.MRs.Register(dev.Name(), buf.Addr(), uint64(n))
	if err != nil {
		buf.Free()
		return nil, fmt.Errorf("register %d bytes on %s: %w", n, dev.Name(), err)
	}
	exp := t.s.IPC.Export(buf.Handle(), buf.ID(), buf.Offset(), n)
	t.s.allocs.Add(1)
	return &allocation{buf: buf, region: region, export: exp, key: t.owner}, nil
}

// resize makes the allocation hold at least need bytes, allocating want (>=
// need) when it must reallocate and falling back to need when want does not
// fit. The kept bytes are copied, open handles move their leases to the new
// export, the generation is bumped, and the old allocation is returned for
// retirement after t.mu is dropped. t.mu is held.
func (t *Tensor) resize(need, want int64) (old *allocation, err error) {
	if need > MaxSize {
		return nil, fmt.Errorf("%d bytes: %w", need, ErrTooLarge)
	}
	if t.alloc != nil && t.alloc.buf.Size() >= need {
		return nil, nil
	}
	if t.alloc != nil && t.alloc.foreign {
		return nil, fmt.Errorf("grow registered memory of %d bytes to %d: %w", t.alloc.buf.Size(), need, ErrForeign)
	}
	a, err := t.newAllocation(want)
	if err != nil && want > need {
		a, err = t.newAllocation(need)
	}
	if err != nil {
		return nil, err
	}
	old = t.alloc
	if old != nil {
		if err := gpu.Copy(a.buf, 0, old.buf, 0, t.size); err != nil {
			t.s.retire(a)
			return nil, err
		}
		t.gen++
	}
	t.alloc = a
	t.attrsChanged()
	if t.dtype == "" {
		t.dtype = "U8"
	}
	for h := range t.handles {
		h.relase(t)
	}
	return old, nil
}

// setSize changes the size within the current allocation: bytes past the new
// size are zeroed (so a later growth reads zeros), and the shape is refitted.
// t.mu is held and the allocation holds n bytes.
func (t *Tensor) setSize(n int64) error {
	if t.alloc.foreign && n != t.size {
		// Shrinking would zero the owner's bytes past n; growing within the
		// registration would change what it exported: neither is ours.
		return fmt.Errorf("resize registered memory of %d bytes to %d: %w", t.size, n, ErrForeign)
	}
	if n < t.size {
		if err := t.alloc.buf.Zero(n, t.size-n); err != nil {
			return err
		}
	}
	if n != t.size {
		t.size = n
		t.attrsChanged()
	}
	t.dtype, t.shape = fitShape(t.dtype, t.shape, n)
	return nil
}

// fitShape keeps the inner dims of shape and adjusts the outermost one so that
// the tensor holds n bytes (appending rows); when that is impossible it becomes
// 1-D of the dtype, or 1-D U8 when n is not whole elements.
func fitShape(d dtype.DType, s dtype.Shape, n int64) (dtype.DType, dtype.Shape) {
	if d == "" {
		d = "U8"
	}
	if nb, err := dtype.NBytes(d, s); err == nil && nb == n && s != nil {
		return d, s
	}
	if len(s) > 0 {
		if row, err := dtype.NBytes(d, s[1:]); err == nil && row > 0 && n%row == 0 {
			return d, append(dtype.Shape{n / row}, s[1:]...)
		}
	}
	if b := int64(d.Bits()); (n*8)%b == 0 {
		return d, dtype.Shape{n * 8 / b}
	}
	return "U8", dtype.Shape{n}
}

// Truncate sets the size to n bytes: an unallocated tensor (or one whose
// allocation is too small) gets an allocation of exactly n bytes. Errors:
// ErrInvalid (n < 0), ErrTooLarge, gpu.ErrOutOfMemory; on error nothing changed.
func (t *Tensor) Truncate(n int64) error {
	defer t.flushAttrs(t.attrGen.Load())
	if n < 0 {
		return fmt.Errorf("size %d: %w", n, ErrInvalid)
	}
	t.lockToResize()
	if t.released {
		t.mu.Unlock()
		return ErrReleased
	}
	if t.alloc == nil && n == 0 {
		t.mu.Unlock()
		return nil
	}
	old, err := t.resize(n, n)
	if err == nil {
		err = t.setSize(n)
	}
	t.mu.Unlock()
	t.s.retire(old)
	return err
}

// Allocate makes [off, off+n) allocated (fallocate): the allocation grows to
// exactly off+n when it is smaller, and, unless keepSize, the size grows to
// off+n. Errors: as Truncate.
func (t *Tensor) Allocate(off, n int64, keepSize bool) error {
	defer t.flushAttrs(t.attrGen.Load())
	if off < 0 || n <= 0 {
		return fmt.Errorf("fallocate [%d, +%d): %w", off, n, ErrInvalid)
	}
	end := off + n
	if end < off || end > MaxSize {
		return fmt.Errorf("fallocate to %d: %w", uint64(off)+uint64(n), ErrTooLarge)
	}
	t.lockToResize()
	if t.released {
		t.mu.Unlock()
		return ErrReleased
	}
	old, err := t.resize(end, end)
	if err == nil && !keepSize && end > t.size {
		err = t.setSize(end)
	}
	if err == nil && t.shape == nil {
		t.dtype, t.shape = fitShape(t.dtype, t.shape, t.size)
	}
	t.mu.Unlock()
	t.s.retire(old)
	return err
}

// ReadAt reads up to len(p) bytes at off; past the end it reads 0 bytes.
func (t *Tensor) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("offset %d: %w", off, ErrInvalid)
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.alloc == nil || off >= t.size {
		// A released tensor has no memory left (unmount racing a read).
		return 0, nil
	}
	n := min(int64(len(p)), t.size-off)
	return t.alloc.buf.ReadAt(p[:n], off)
}

// WriteAt writes p at off, growing the tensor when it ends past the size. A
// growth that needs a larger allocation over-allocates geometrically (at least
// double), so appends cost amortized O(bytes). Errors: as Truncate.
func (t *Tensor) WriteAt(p []byte, off int64) (int, error) {
	defer t.flushAttrs(t.attrGen.Load())
	end := off + int64(len(p))
	if off < 0 || end < off {
		return 0, fmt.Errorf("write at %d: %w", off, ErrInvalid)
	}
	if len(p) == 0 {
		return 0, nil
	}
	t.lockToChange()
	// A write past the size grows the tensor (maybe into a new
	// allocation): it waits for the in-place copies writing it.
	for end > t.size && (t.pinned > 0 || len(t.binds) > 0) {
		if len(t.binds) > 0 {
			t.revokeBindsLocked()
		} else {
			t.thawed.Wait()
		}
		for t.frozen > 0 {
			t.thawed.Wait()
		}
	}
	if t.released {
		t.mu.Unlock()
		return 0, ErrReleased
	}
	var old *allocation
	var err error
	if t.alloc == nil || end > t.alloc.buf.Size() {
		want := end
		if t.alloc != nil {
			want = max(end, min(2*t.alloc.buf.Size(), MaxSize))
		}
		old, err = t.resize(end, want)
	}
	n := 0
	if err == nil {
		n, err = t.alloc.buf.WriteAt(p, off)
	}
	if err == nil && end > t.size {
		err = t.setSize(end)
	}
	t.mu.Unlock()
	t.s.retire(old)
	return n, err
}

// SetDType sets the dtype. On an unallocated tensor it is recorded for the
// allocation to come. On an allocated one it is a reinterpretation that keeps
// nbytes, as torch's view(dtype): the shape is kept when it still fits, else
// its last dim is scaled by the ratio of element sizes (a scalar becomes 1-D).
// Errors: ErrInvalid for an unknown dtype or one that cannot keep nbytes that
// way; on error nothing changed.
func (t *Tensor) SetDType(s string) error {
	d, err := dtype.Parse(s)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.alloc == nil && t.shape == nil {
		t.dtype = d
		return nil
	}
	if nb, err := dtype.NBytes(d, t.shape); err == nil && nb == t.size {
		t.dtype = d
		return nil
	}
	sh := append(dtype.Shape{}, t.shape...)
	if len(sh) == 0 {
		sh = dtype.Shape{1}
	}
	k := len(sh) - 1
	if bits := sh[k] * int64(t.dtype.Bits()); bits%int64(d.Bits()) == 0 {
		sh[k] = bits / int64(d.Bits())
		if nb, err := dtype.NBytes(d, sh); err == nil && nb == t.size {
			t.dtype, t.shape = d, sh
			return nil
		}
	}
	return fmt.Errorf("dtype %s cannot view %s %s (%d bytes) by scaling its last dim: %w", d, t.dtype, t.shape, t.size, ErrInvalid)
}

// SetShape sets the shape. On an unallocated tensor it allocates exactly
// prod(shape) * itemsize(dtype) bytes (U8 when no dtype is set; nothing for a
// zero-element shape). On an allocated one it is a reshape that must keep
// nbytes. Errors: ErrInvalid, ErrTooLarge, gpu.ErrOutOfMemory; on error nothing
// changed.
func (t *Tensor) SetShape(s string) error {
	defer t.flushAttrs(t.attrGen.Load())
	sh, err := dtype.ParseShape(s)
	if err != nil {
		return err
	}
	t.mu.Lock()
	old, err := t.setShapeLocked(sh)
	t.mu.Unlock()
	t.s.retire(old)
	return err
}

// setShapeLocked sets the shape (see SetShape); t.mu is held. It returns the
// allocation it replaced, for retirement once t.mu is dropped.
func (t *Tensor) setShapeLocked(sh dtype.Shape) (old *allocation, err error) {
	if t.released {
		return nil, ErrReleased
	}
	d := t.dtype
	if d == "" {
		d = "U8"
	}
	nb, err := dtype.NBytes(d, sh)
	if err != nil {
		return nil, err
	}
	if t.size > 0 {
		if nb != t.size {
			return nil, fmt.Errorf("shape %s of %s is %d bytes, the tensor holds %d: %w", sh, d, nb, t.size, ErrInvalid)
		}
		t.dtype, t.shape = d, sh
		return nil, nil
	}
	// An empty tensor (never sized, or preallocated with KEEP_SIZE, or
	// truncated to 0) takes the shape's size, in its allocation when it fits.
	if nb > 0 {
		if old, err = t.resize(nb, nb); err != nil {
			return nil, err
		}
	}
	if nb != t.size {
		t.attrsChanged()
	}
	t.dtype, t.shape, t.size = d, sh, nb
	return old, nil
}

// SetDevice places an unallocated tensor on a device. Errors: ErrBusy when the
// tensor is allocated, ErrInvalid for a device this daemon does not serve.
func (t *Tensor) SetDevice(name string) error {
	dev, err := t.s.Device(name)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.alloc != nil {
		if err == nil && t.device == dev.Name() {
			return nil
		}
		return fmt.Errorf("device of an allocated tensor (on %s): %w", t.device, ErrBusy)
	}
	if err != nil {
		return err
	}
	t.device = dev.Name()
	return nil
}
