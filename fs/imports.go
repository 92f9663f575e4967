package fs

import (
	"os"
	"slices"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// bufferMapping is an imported allocation (a gpu.Buffer from an Importer)
// as the peer service's import cache holds it.
type bufferMapping struct{ gpu.Buffer }

func (m bufferMapping) Close() error { return m.Free() }

// Importers returns the handle openers the peer service needs beyond memfd
// (transfer.Config.Importers): "cuda" when the store has a CUDA device, which
// imports on the first such device (the driver maps the allocation for every
// device of the process, with peer access enabled lazily). Empty otherwise.
func Importers(store *tensor.Store) map[string]func(handle string) (transfer.Mapping, error) {
	m := map[string]func(string) (transfer.Mapping, error){}
	names := store.DeviceNames()
	slices.Sort(names)
	for _, name := range names {
		dev, err := store.Device(name)
		if err != nil {
			continue
		}
		imp, ok := dev.(gpu.Importer)
		if !ok || name == gpu.HostName {
			continue
		}
		if _, done := m["cuda"]; done {
			continue
		}
		m["cuda"] = func(handle string) (transfer.Mapping, error) {
			b, err := imp.Import(handle, 0, 0)
			if err != nil {
				return nil, err
			}
			return bufferMapping{b}, nil
		}
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
		return bufferMapping{b}, nil
	}
}

// CopyFromMapping implements transfer.MappingDest: an imported allocation
// is copied by the device (e.g. GPU to GPU over NVLink); a plain memfd
// mapping goes through the caller's buffer.
func (d *dest) CopyFromMapping(i int, m transfer.Mapping, srcOff, n int64) (bool, error) {
	bm, ok := m.(bufferMapping)
	if !ok {
		return false, nil
	}
	return true, d.tensorAt(i).CopyFromBuffer(0, bm.Buffer, srcOff, n)
}
