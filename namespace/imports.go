package namespace

import (
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// bufferMapping is an imported allocation (a gpu.Buffer from an Importer)
// as the peer service's import cache holds it.
//
// A CUDA IPC mapping belongs to the context it was opened in, and a copy
// out of it into another GPU's memory is staged through the host (35 GB/s
// on the H200 pair, against 395 GB/s over NVLink from a mapping opened in
// the destination's own context). So a copy into a tensor on another GPU
// opens the handle once more on that GPU; those imports live and die with
// this one.
type bufferMapping struct {
	gpu.Buffer
	store *tensor.Store
	mu    sync.Mutex
	on    map[string]gpu.Buffer // the allocation imported on other devices, by name
}

// Close frees the import and the ones made for other devices.
func (m *bufferMapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, b := range m.on {
		if err := b.Free(); err != nil {
			slog.Warn("close import failed", "handle", m.Handle(), "device", name, "err", err)
		}
	}
	m.on = nil
	return m.Free()
}

// onDevice is the allocation as a buffer in device's context: the import
// itself when it is there (or is not CUDA memory), else one more import of
// the handle on device, made once; the import itself when that fails.
func (m *bufferMapping) onDevice(device string) gpu.Buffer {
	if device == m.Device().Name() || !strings.HasPrefix(m.Handle(), "cuda:") || !strings.HasPrefix(device, "cuda:") {
		return m.Buffer
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if b := m.on[device]; b != nil {
		return b
	}
	dev, err := m.store.Device(device)
	if err != nil {
		return m.Buffer
	}
	imp, ok := dev.(gpu.Importer)
	if !ok {
		return m.Buffer
	}
	b, err := imp.Import(m.Handle(), 0, 0)
	if err != nil {
		slog.Info("import failed; copying from the exporter's mapping", "handle", m.Handle(), "device", device, "from", m.Device().Name(), "err", err)
		return m.Buffer
	}
	if m.on == nil {
		m.on = map[string]gpu.Buffer{}
	}
	m.on[device] = b
	return b
}

// Importers returns the handle openers the peer service needs beyond memfd
// (transfer.Config.Importers): "cuda" when the store has a CUDA device that
// imports, opening on the device Store.Import picks (a copy into a tensor on
// another GPU imports once more there: bufferMapping.onDevice). Empty
// otherwise.
func Importers(store *tensor.Store) map[string]func(handle string) (transfer.Mapping, error) {
	m := map[string]func(string) (transfer.Mapping, error){}
	for _, name := range store.DeviceNames() {
		dev, err := store.Device(name)
		if _, ok := dev.(gpu.Importer); err != nil || !ok || !strings.HasPrefix(name, "cuda:") {
			continue
		}
		m["cuda"] = func(handle string) (transfer.Mapping, error) {
			b, err := store.Import(handle, 0, 0)
			if err != nil {
				return nil, err
			}
			return &bufferMapping{Buffer: b, store: store}, nil
		}
		break
	}
	return m
}

// ImportFile is the peer service's memfd importer
// (transfer.Config.ImportFile): the host backend maps an exporter's memfd
// when it is sealed against shrinking (tensorfs's are), so an IPC copy is
// one memmove into the destination.
func ImportFile(store *tensor.Store) func(f *os.File) (transfer.Mapping, error) {
	return func(f *os.File) (transfer.Mapping, error) {
		b, err := store.ImportFile(f, 0, 0)
		if err != nil {
			return nil, err
		}
		return &bufferMapping{Buffer: b, store: store}, nil
	}
}

// CopyFromMapping implements transfer.MappingDest: an imported allocation
// is copied by the device (e.g. GPU to GPU over NVLink); a plain memfd
// mapping goes through the caller's buffer.
func (d *dest) CopyFromMapping(i int, m transfer.Mapping, srcOff, dstOff, n int64) (bool, error) {
	bm, ok := m.(*bufferMapping)
	if !ok {
		return false, nil
	}
	t, _ := d.at(i)
	src := bm.onDevice(t.Device())
	var exts []tensor.Extent
	err := d.pieces(i, dstOff, n, func(t *tensor.Tensor, dst, pos, k int64) error {
		exts = append(exts, tensor.Extent{Dst: t, DstOff: dst, SrcBuf: src, SrcOff: srcOff + pos - dstOff, N: k})
		return nil
	})
	if err != nil {
		return true, err
	}
	return true, tensor.CopyExtents(exts)
}

// CopySpansFromMappings implements transfer.SpanMappingDest: every
// descriptor, range lists as they are, as one batch (tensor.CopySpans: on
// CUDA one gather/scatter kernel launch). done=false when one of the
// mappings is a plain memfd (read through the caller's buffer).
func (d *dest) CopySpansFromMappings(copies []transfer.SpanCopy) (bool, error) {
	lists := make([]tensor.SpanList, len(copies))
	for i, c := range copies {
		bm, ok := c.M.(*bufferMapping)
		if !ok {
			return false, nil
		}
		t, at := d.at(c.I)
		l := &lists[i]
		l.Dst, l.Src = t, bm.onDevice(t.Device())
		if c.Spans == nil {
			base, n := c.Base, c.N
			l.N, l.At = 1, func(int) (int64, int64, int64) { return base, at, n }
			continue
		}
		spans, base := c.Spans, c.Base
		l.N, l.At = len(spans), func(k int) (int64, int64, int64) {
			sp := &spans[k]
			return base + sp.Src, sp.Dst, sp.N
		}
	}
	return true, copyErr(tensor.CopySpans(lists))
}

// Piece implements transfer.PieceSizer: a copy into GPU memory goes in one
// call (a GiB takes half a millisecond on an H200: progress has nothing to
// show), into host memory in the engine's pieces (a GiB takes a tenth of a
// second or more).
func (d *dest) Piece(i int) int64 {
	t, _ := d.at(i)
	if strings.HasPrefix(t.Device(), "cuda:") {
		return 0
	}
	return -1 // the engine's default
}
