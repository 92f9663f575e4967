//go:build ucx

package ucx

import (
	"log/slog"
	"sync"

	"github.com/tensorfs/tensorfs/mr"
)

// Mapper is the context as an mr.Mapper: every memory region of host
// memory is mapped (ucp_mem_map) for its registered lifetime and carries
// its packed rkey; device memory is not, since Debian's UCX has no CUDA
// support (copies of it stage through host memory: issue 17, item 5), which
// the log says once.
func (c *Context) Mapper() mr.Mapper { return &mapper{c: c} }

type mapper struct {
	c    *Context
	once sync.Once
}

func (m *mapper) Map(device string, addr uintptr, length uint64) ([]byte, func(), error) {
	if device != "host" {
		m.once.Do(func() {
			slog.Info("ucx: device memory is not mapped (this UCX maps host memory only); its copies stage through host memory", "device", device)
		})
		return nil, nil, nil
	}
	r, err := m.c.Map(addr, int(length))
	if err != nil {
		return nil, nil, err
	}
	return r.Rkey(), func() {
		if err := r.Unmap(); err != nil {
			slog.Error("ucx: unmap failed", "addr", addr, "len", length, "err", err)
		}
	}, nil
}
