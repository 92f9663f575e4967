package tensor

import (
	"strings"
	"sync"
	"time"

	"github.com/tensorfs/tensorfs/gpu"
)

// Device scratch: the staging in GPU memory that a range list's chunks are
// gathered into (Gather) or scattered from (the TCP receiver's batches)
// around one host<->device copy. Allocating and freeing it per copy cost a
// 4 KiB TCP copy into GPU memory more than its data (cuMemAlloc and cuMemFree
// of 1 MiB, tens of µs each on an H200), so freed scratch is kept, a few
// buffers per device, for the next copy, until scratchIdle passes without
// one: an idle daemon holds no memory (stats' live bytes are 0), as with
// the host backend's recycled memfds.

// scratchMin is the least bytes a scratch buffer holds: a TCP chunk's
// (transfer's default chunk size), so that one buffer serves any chunk.
const scratchMin = 1 << 20

// scratchKeep is how many free scratch buffers a device keeps: one per
// stream of a copy, a few copies at once.
const scratchKeep = 4

// scratchIdle is how long kept scratch outlives the last copy that used
// it: a serving loop copies far more often.
const scratchIdle = 500 * time.Millisecond

type scratchPool struct {
	mu    sync.Mutex
	free  map[string][]gpu.Buffer // by device name
	timer *time.Timer             // frees what is kept after scratchIdle
}

// Scratch returns staging of at least n bytes in the GPU memory of the
// tensor's device, outside any tensor (no memory region, no export), and
// the function that gives it back; nil for a tensor in host memory (its
// pieces are memmoves: staging would add one) or one with no memory.
// Errors: the device's allocation error.
func (t *Tensor) Scratch(n int64) (gpu.Buffer, func(), error) {
	t.mu.RLock()
	if t.alloc == nil || t.released || !strings.HasPrefix(t.device, "cuda:") {
		t.mu.RUnlock()
		return nil, func() {}, nil
	}
	dev := t.alloc.buf.Device()
	t.mu.RUnlock()
	return t.s.scratch.take(dev, n)
}

func (p *scratchPool) take(dev gpu.Device, n int64) (gpu.Buffer, func(), error) {
	name := dev.Name()
	p.mu.Lock()
	free := p.free[name]
	for i, b := range free {
		if b.Size() >= n {
			p.free[name] = append(free[:i], free[i+1:]...)
			p.mu.Unlock()
			return b, func() { p.give(name, b) }, nil
		}
	}
	p.mu.Unlock()
	b, err := dev.Alloc(max(n, scratchMin), 0)
	if err != nil {
		return nil, func() {}, err
	}
	return b, func() { p.give(name, b) }, nil
}

func (p *scratchPool) give(dev string, b gpu.Buffer) {
	p.mu.Lock()
	if p.free == nil {
		p.free = map[string][]gpu.Buffer{}
	}
	if len(p.free[dev]) < scratchKeep {
		p.free[dev] = append(p.free[dev], b)
		b = nil
		if p.timer == nil {
			p.timer = time.AfterFunc(scratchIdle, p.close)
		} else {
			p.timer.Reset(scratchIdle)
		}
	}
	p.mu.Unlock()
	if b != nil {
		b.Free()
	}
}

// close frees the kept scratch (Store.Close, and scratchIdle after the
// last give).
func (p *scratchPool) close() {
	p.mu.Lock()
	all := p.free
	p.free = nil
	p.mu.Unlock()
	for _, bs := range all {
		for _, b := range bs {
			b.Free()
		}
	}
}
