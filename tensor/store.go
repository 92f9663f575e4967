// Package tensor is tensorfs's model of a tensor file, free of FUSE: a Store of
// Tensors, each with a dtype, a shape, a size in bytes and, once sized, a device
// allocation that is registered as a memory region (package mr) and exported for
// IPC (package ipc) at the same moment, and deregistered, revoked and freed
// together when the tensor is released (unlinked and its last handle closed).
// The fs package is a thin FUSE adapter over it.
package tensor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/ipc"
	"github.com/tensorfs/tensorfs/mr"
)

// MaxSize is the largest tensor size in bytes, dtype.MaxSize (2^53); larger
// sizes fail with ErrTooLarge (EFBIG).
const MaxSize = dtype.MaxSize

// Sentinel errors; match with errors.Is. The fs package maps each to one errno.
var (
	// ErrInvalid: a malformed value or one that contradicts the tensor (EINVAL).
	// It is dtype.ErrInvalid, so that a bad dtype or shape matches it too.
	ErrInvalid = dtype.ErrInvalid
	// ErrTooLarge: a size past MaxSize (EFBIG).
	// It is dtype.ErrTooLarge.
	ErrTooLarge = dtype.ErrTooLarge
	// ErrBusy: the change needs an unallocated tensor (EBUSY).
	ErrBusy = errors.New("tensor is allocated")
	// ErrNoData: the attribute does not exist yet, e.g. mr_id before allocation (ENODATA).
	ErrNoData = errors.New("no such attribute yet")
	// ErrReleased: the tensor was already released (ESTALE).
	ErrReleased = errors.New("tensor released")
	// ErrForeign: a size change of a tensor backed by registered memory
	// (Tensor.Register), whose size is its owner's (EPERM).
	ErrForeign = errors.New("tensor is registered memory of fixed size")
)

// Config configures a Store.
type Config struct {
	// Devices are the devices tensors may be placed on; the first one is the
	// default device. At least one is needed.
	Devices []gpu.Device
	// RevokeTimeout bounds how long releasing a tensor waits for importers to
	// drop their leases (default 10 s).
	RevokeTimeout time.Duration
	// OnRevoke, when set, is told how long each revocation of an export
	// waited for its importers (ipc.NewRegistry): the daemon's metrics.
	OnRevoke func(wait time.Duration)
}

// Store owns every tensor of one daemon and the registries they are recorded in.
type Store struct {
	devs          map[string]gpu.Device
	def           gpu.Device
	revokeTimeout time.Duration

	// MRs is the memory-region registry of every allocated tensor.
	MRs *mr.Registry
	// IPC is the export and lease registry of every allocated tensor.
	IPC *ipc.Registry

	mu   sync.Mutex
	live map[*Tensor]struct{}

	// scratch is the device staging of range lists (Tensor.Scratch).
	scratch scratchPool

	// allocs and frees count device allocations made for tensors
	// (newAllocation) and freed (retire), since start; memory registered
	// by its owner (Tensor.Register) is neither.
	allocs, frees atomic.Int64
	// bound counts the live bindings of its tensors (BindExport).
	bound atomic.Int64
}

// NewStore returns an empty store over cfg's devices. Errors: ErrInvalid when
// cfg has no device.
func NewStore(cfg Config) (*Store, error) {
	if len(cfg.Devices) == 0 {
		return nil, fmt.Errorf("no device: %w", ErrInvalid)
	}
	s := &Store{
		devs:          map[string]gpu.Device{},
		def:           cfg.Devices[0],
		revokeTimeout: cfg.RevokeTimeout,
		MRs:           mr.NewRegistry(),
		IPC:           ipc.NewRegistry(cfg.OnRevoke),
		live:          map[*Tensor]struct{}{},
	}
	if s.revokeTimeout <= 0 {
		s.revokeTimeout = 10 * time.Second
	}
	for _, d := range cfg.Devices {
		s.devs[d.Name()] = d
	}
	return s, nil
}

// DefaultDevice is the device of tensors with no device set.
func (s *Store) DefaultDevice() gpu.Device { return s.def }

// Device resolves a device name ("host", "cuda:0", " CUDA:0 ") to a device of
// this store. Errors: ErrInvalid (wrapping gpu.ErrNoDevice) for a malformed name
// or a device this daemon does not serve.
func (s *Store) Device(name string) (gpu.Device, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if rest, ok := strings.CutPrefix(n, "cuda:"); ok {
		i, err := strconv.ParseUint(rest, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("device %q: %w: %w", name, ErrInvalid, gpu.ErrNoDevice)
		}
		n = "cuda:" + strconv.FormatUint(i, 10)
	}
	d, ok := s.devs[n]
	if !ok {
		return nil, fmt.Errorf("device %q (this daemon serves %s): %w: %w", name, strings.Join(s.DeviceNames(), ", "), ErrInvalid, gpu.ErrNoDevice)
	}
	return d, nil
}

// DeviceNames lists the devices of the store, default first.
func (s *Store) DeviceNames() []string {
	names := []string{s.def.Name()}
	for n := range s.devs {
		if n != s.def.Name() {
			names = append(names, n)
		}
	}
	return names
}

// Import opens memory another process exported, for Tensor.Register: [off,
// off+n) of the allocation behind handle (n == 0: to its end). The device is
// chosen by the handle's kind: "memfd:" goes to the host device, "cuda:" to a
// CUDA device (the default device when it is one, else the first by
// ordinal), which must implement gpu.Importer. The caller checks that the
// requester may use what handle names (a CUDA handle is a capability and
// cannot be checked). Errors: ErrInvalid wrapping gpu.ErrHandle when no
// device of this store imports that kind; the device's Import errors
// (gpu.ErrHandle, gpu.ErrInvalidSize, gpu.ErrNoDriver, an open's errno).
func (s *Store) Import(handle string, off, n int64) (gpu.Buffer, error) {
	kind, _, _ := strings.Cut(handle, ":")
	var prefix string
	switch kind {
	case "memfd":
		prefix = gpu.HostName
	case "cuda":
		prefix = "cuda:"
	default:
		return nil, fmt.Errorf("handle %q: want memfd: or cuda:: %w: %w", handle, ErrInvalid, gpu.ErrHandle)
	}
	names := s.DeviceNames() // default first
	sort.Slice(names[1:], func(i, j int) bool { return deviceLess(names[1+i], names[1+j]) })
	for _, name := range names {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		if imp, ok := s.devs[name].(gpu.Importer); ok {
			return imp.Import(handle, off, n)
		}
	}
	return nil, fmt.Errorf("handle %q: no device of this daemon (%s) imports %s handles: %w: %w", handle, strings.Join(names, ", "), kind, ErrInvalid, gpu.ErrHandle)
}

// ImportFile is Import for a memfd the caller has opened and checked itself
// (the fs register handler opens it through the requester's /proc entry, so
// that the process it checked is the one whose fd it opens). The buffer keeps
// its own descriptor; the caller still closes f. Errors: as Import.
func (s *Store) ImportFile(f *os.File, off, n int64) (gpu.Buffer, error) {
	type fileImporter interface {
		ImportFile(f *os.File, off, n int64) (gpu.Buffer, error)
	}
	if imp, ok := s.devs[gpu.HostName].(fileImporter); ok {
		return imp.ImportFile(f, off, n)
	}
	return nil, fmt.Errorf("import %s: this daemon has no host device: %w: %w", f.Name(), ErrInvalid, gpu.ErrHandle)
}

// deviceLess orders device names by kind, then ordinal ("cuda:2" < "cuda:10").
func deviceLess(a, b string) bool {
	ka, na, _ := strings.Cut(a, ":")
	kb, nb, _ := strings.Cut(b, ":")
	if ka != kb {
		return ka < kb
	}
	ia, _ := strconv.Atoi(na)
	ib, _ := strconv.Atoi(nb)
	return ia < ib
}

// Template is what a directory's template xattrs say about the tensors created
// in it. A zero Template creates empty, unallocated tensors.
type Template struct {
	// DType is the dtype; "" means unset (U8 when a shape allocates).
	DType dtype.DType
	// Shape is the shape; nil means unset (the tensor starts unallocated).
	Shape dtype.Shape
	// Device is the device name; "" means the store's default.
	Device string
	// Owner is the uid of the tensor's creator: tensors of different owners
	// never share an exported allocation.
	Owner uint32
	// Uninit lets the allocation New makes (for a Shape of nonzero size)
	// keep the bytes an earlier tensor of the same owner left in recycled
	// memory (gpu.UninitAllocator), for a creator that overwrites all of
	// them before anyone can read the tensor: a copy's temporary. Any
	// later allocation (growth) is cleared. Otherwise a new tensor reads
	// as zeros.
	Uninit bool
}

// New creates a tensor from a template, allocated and registered at once when
// the template has a shape. The tensor starts linked (it has a name) with no
// open handle. Errors: those of SetShape.
func (s *Store) New(tmpl Template) (*Tensor, error) {
	t := &Tensor{s: s, owner: tmpl.Owner, dtype: tmpl.DType, device: tmpl.Device, linked: true, handles: map[*Handle]struct{}{}, uninit: tmpl.Uninit}
	if t.device == "" {
		t.device = s.def.Name()
	}
	if tmpl.Shape != nil {
		if _, err := t.setShapeLocked(tmpl.Shape); err != nil {
			return nil, err
		}
	}
	// Uninit covers only the allocation made here, which its creator
	// overwrites whole: a tensor created empty (a copy of a 0-byte one)
	// grown later by truncate or a write must read zeros like any other.
	t.uninit = false
	s.mu.Lock()
	s.live[t] = struct{}{}
	s.mu.Unlock()
	return t, nil
}

// Stats counts what the store holds now.
type Stats struct {
	Tensors int   `json:"tensors"` // tensors not yet released
	Regions int   `json:"regions"` // memory regions not yet released
	Exports int   `json:"exports"` // IPC exports not yet revoked
	Imports int   `json:"imports"` // IPC imports of other daemons' exports
	Leases  int   `json:"leases"`  // leases held on this daemon's exports
	Pins    int   `json:"pins"`    // pins held on memory regions
	Bytes   int64 `json:"bytes"`   // bytes of device memory held, all devices
	// Bound counts the bindings peers hold on this daemon's tensors
	// (BindExport: one-sided in-place writers), Bindings those this
	// daemon holds on peers' tensors (the peer service's).
	Bound    int64 `json:"bound"`
	Bindings int   `json:"bindings"`
}

// Stats returns the live counts; all are 0 when nothing is allocated, open,
// imported or in flight.
func (s *Store) Stats() Stats {
	var st Stats
	s.mu.Lock()
	st.Tensors = len(s.live)
	s.mu.Unlock()
	st.Regions, st.Pins = s.MRs.Stats()
	st.Exports, st.Leases = s.IPC.Stats()
	st.Bound = s.bound.Load()
	for _, d := range s.devs {
		st.Bytes += d.MemInfo().Used
	}
	return st
}

// Totals are a store's counts since it was made: they only grow.
type Totals struct {
	Allocs int64 // device allocations made for tensors
	Frees  int64 // of them, freed (retired: deregistered, revoked, freed)
	// Registrations counts the memory regions registered (mr), Exports,
	// Leases and Revokes the IPC exports made, the leases given on them
	// and their revocations (ipc.Totals).
	Registrations uint64
	ipc.Totals
}

// Totals returns the counts since the store was made.
func (s *Store) Totals() Totals {
	return Totals{Allocs: s.allocs.Load(), Frees: s.frees.Load(), Registrations: s.MRs.Registered(), Totals: s.IPC.Totals()}
}

// DeviceStats is what one device holds now, as stats lists it under
// devices and the metrics export it: its name ("host", "cuda:0"), the
// tensors placed on it (allocated or not), the bytes of its memory that
// tensorfs holds (gpu.MemInfo.Used) and may hold (gpu.MemInfo.Total: its
// memory, or --max-memory when smaller), and whether it is the default.
type DeviceStats struct {
	Name    string `json:"name"`
	Tensors int    `json:"tensors"`
	Used    int64  `json:"used"`
	Total   int64  `json:"total"`
	Default bool   `json:"default,omitempty"`
}

// DeviceStats returns what each device holds now, the default device
// first, the others by name. It takes each live tensor's lock in turn
// (never two at once, nor the store's with one): a stats read or a
// scrape, not a hot path.
func (s *Store) DeviceStats() []DeviceStats {
	s.mu.Lock()
	all := make([]*Tensor, 0, len(s.live))
	for t := range s.live {
		all = append(all, t)
	}
	s.mu.Unlock()
	names := s.DeviceNames()
	slices.Sort(names[1:])
	st := make([]DeviceStats, len(names))
	at := make(map[string]int, len(names))
	for i, n := range names {
		mi := s.devs[n].MemInfo()
		st[i] = DeviceStats{Name: n, Used: mi.Used, Total: mi.Total, Default: i == 0}
		at[n] = i
	}
	for _, t := range all {
		t.mu.RLock()
		n := t.device
		t.mu.RUnlock()
		if i, ok := at[n]; ok {
			st[i].Tensors++
		}
	}
	return st
}

// Close releases every tensor still alive, whatever its links and handles (at
// unmount), so that all device memory is freed.
func (s *Store) Close() {
	s.mu.Lock()
	all := make([]*Tensor, 0, len(s.live))
	for t := range s.live {
		all = append(all, t)
	}
	s.mu.Unlock()
	for _, t := range all {
		t.mu.Lock()
		t.linked = false
		for h := range t.handles {
			h.dropLease()
			delete(t.handles, h)
		}
		t.mu.Unlock()
		t.maybeRelease()
	}
	s.scratch.close()
}

// retire ends an allocation's registration: the IPC export is revoked (waiting,
// bounded, for importers to let go), the MR deregistered, and the memory freed
// once no pin holds the region.
func (s *Store) retire(a *allocation) {
	if a == nil {
		return
	}
	if err := s.IPC.Revoke(a.export.ID, s.revokeTimeout); err != nil {
		slog.Warn("retire failed", "mr", a.region.ID, "err", err)
	}
	if !a.foreign {
		s.frees.Add(1)
	}
	buf := a.buf
	if err := s.MRs.Deregister(a.region.ID, func() {
		if a.mixed.Load() {
			if err := buf.Zero(0, buf.Size()); err != nil {
				slog.Error("clear allocation failed", "alloc", buf.ID(), "device", buf.Device().Name(), "err", err)
			}
		}
		if err := buf.Free(); err != nil {
			slog.Error("free allocation failed", "alloc", buf.ID(), "device", buf.Device().Name(), "err", err)
		}
	}); err != nil {
		slog.Warn("retire failed", "mr", a.region.ID, "err", err)
	}
}
