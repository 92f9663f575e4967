package cuda

// Staged host<->device copies, device-to-device and peer copies of a Device.

import (
	"fmt"
	"unsafe"

	"github.com/tensorfs/tensorfs/gpu"
)

// stager is a stream with two page-locked buffers: one is filled or drained
// by the CPU while the other's DMA runs.
type stager struct {
	stream cuStrm
	ptr    [2]unsafe.Pointer
	buf    [2][]byte
}

// getStager takes an idle stager, making one while fewer than maxStagers
// exist, else waiting for one. Call putStager when done.
func (d *Device) getStager() (*stager, error) {
	select {
	case s := <-d.stagers:
		return s, nil
	default:
	}
	d.smu.Lock()
	if d.nstagers < maxStagers {
		d.nstagers++
		d.smu.Unlock()
		s, err := d.newStager()
		if err != nil {
			d.smu.Lock()
			d.nstagers--
			d.smu.Unlock()
			return nil, err
		}
		return s, nil
	}
	d.smu.Unlock()
	return <-d.stagers, nil
}

func (d *Device) putStager(s *stager) { d.stagers <- s }

// newStager makes a stream and two staging buffers; they are kept until
// Close, because cuMemHostAlloc costs milliseconds (the kernel pins pages).
func (d *Device) newStager() (*stager, error) {
	s := &stager{}
	err := d.withCtx(func() error {
		st, r := d.drv.streamCreate()
		if err := check(d.drv, "cuStreamCreate", r); err != nil {
			return err
		}
		s.stream = st
		for i := range s.ptr {
			p, r := d.drv.memHostAlloc(stageSize)
			if err := check(d.drv, "cuMemHostAlloc", r); err != nil {
				s.destroy(d.drv)
				return err
			}
			s.ptr[i], s.buf[i] = p, unsafe.Slice((*byte)(p), stageSize)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: staging buffers: %w", d.name, err)
	}
	return s, nil
}

// destroy frees what the stager holds; the device's context is current.
func (s *stager) destroy(drv driver) error {
	var first error
	for i, p := range s.ptr {
		if p != nil {
			if err := check(drv, "cuMemFreeHost", drv.memFreeHost(p)); err != nil && first == nil {
				first = err
			}
			s.ptr[i], s.buf[i] = nil, nil
		}
	}
	if s.stream != 0 {
		if err := check(drv, "cuStreamDestroy_v2", drv.streamDestroy(s.stream)); err != nil && first == nil {
			first = err
		}
		s.stream = 0
	}
	return first
}

// withStager runs fn with a stager, in the device's context.
func (d *Device) withStager(fn func(s *stager) error) error {
	s, err := d.getStager()
	if err != nil {
		return err
	}
	defer d.putStager(s)
	return d.withCtx(func() error { return fn(s) })
}

// sync waits for the stager's stream; enqueue errors call it too, so that no
// DMA into a staging buffer outlives the call that started it.
func (d *Device) sync(s *stager) error {
	return check(d.drv, "cuStreamSynchronize", d.drv.streamSynchronize(s.stream))
}

// chunkSize splits a transfer of n bytes so that the CPU copy of one chunk
// overlaps the DMA of the next: four chunks for a FUSE-sized request, whole
// staging buffers for large ones, one chunk for small ones.
func chunkSize(n int64) int64 {
	return min(stageSize, max(64<<10, roundUp((n+3)/4, 4096)))
}

// htod copies p to device address dst through the staging buffers.
func (d *Device) htod(dst devptr, p []byte) error {
	return d.htodFunc(dst, int64(len(p)), func(stage []byte, off int64) error {
		copy(stage, p[off:])
		return nil
	})
}

// htodFrom copies n bytes of another backend's buffer to device address dst,
// reading them straight into the staging buffers.
func (d *Device) htodFrom(dst devptr, src gpu.Buffer, srcOff, n int64) error {
	return d.htodFunc(dst, n, func(stage []byte, off int64) error {
		_, err := src.ReadAt(stage, srcOff+off)
		return err
	})
}

// htodFunc copies n bytes to device address dst, chunk by chunk: fill puts
// the bytes at offset off of the transfer into a staging buffer, and its DMA
// is issued. Before a staging buffer is refilled the stream is synchronized,
// which waits for the DMA issued from it two chunks ago; the DMA of the other
// buffer (just issued) runs while the CPU fills this one.
func (d *Device) htodFunc(dst devptr, n int64, fill func(stage []byte, off int64) error) error {
	return d.withStager(func(s *stager) error {
		c, i, pending := chunkSize(n), 0, false
		for off := int64(0); off < n; off += c {
			m := min(c, n-off)
			if err := fill(s.buf[i][:m], off); err != nil {
				d.sync(s)
				return err
			}
			if pending {
				if err := d.sync(s); err != nil {
					return err
				}
			}
			if r := d.drv.memcpyHtoDAsync(dst+devptr(off), s.ptr[i], uint64(m), s.stream); r != success {
				d.sync(s)
				return check(d.drv, "cuMemcpyHtoDAsync_v2", r)
			}
			pending, i = true, i^1
		}
		return d.sync(s)
	})
}

// dtoh copies from device address src into p through the staging buffers.
func (d *Device) dtoh(p []byte, src devptr) error {
	return d.dtohFunc(src, int64(len(p)), func(stage []byte, off int64) error {
		copy(p[off:], stage)
		return nil
	})
}

// dtohTo copies n bytes at device address src into another backend's buffer,
// writing them straight from the staging buffers.
func (d *Device) dtohTo(dst gpu.Buffer, dstOff int64, src devptr, n int64) error {
	return d.dtohFunc(src, n, func(stage []byte, off int64) error {
		_, err := dst.WriteAt(stage, dstOff+off)
		return err
	})
}

// dtohFunc copies n bytes at device address src out chunk by chunk: the DMA
// of chunk k+1 is issued before drain takes chunk k out of its staging
// buffer, which the DMA of chunk k-1 used and nothing in flight does.
func (d *Device) dtohFunc(src devptr, n int64, drain func(stage []byte, off int64) error) error {
	return d.withStager(func(s *stager) error {
		c := chunkSize(n)
		issue := func(off int64, i int) error {
			m := min(c, n-off)
			if r := d.drv.memcpyDtoHAsync(s.ptr[i], src+devptr(off), uint64(m), s.stream); r != success {
				d.sync(s)
				return check(d.drv, "cuMemcpyDtoHAsync_v2", r)
			}
			return nil
		}
		if err := issue(0, 0); err != nil {
			return err
		}
		for off, i := int64(0), 0; off < n; off, i = off+c, i^1 {
			if err := d.sync(s); err != nil {
				return err
			}
			if off+c < n {
				if err := issue(off+c, i^1); err != nil {
					return err
				}
			}
			if err := drain(s.buf[i][:min(c, n-off)], off); err != nil {
				d.sync(s)
				return err
			}
		}
		return nil
	})
}

// zero sets n bytes at dst to 0 and waits: cuMemsetD8 on device memory is
// asynchronous to the host, and a write right after (or an importer) must
// not see it land late.
func (d *Device) zero(dst devptr, n int64) error {
	return d.withStager(func(s *stager) error {
		if r := d.drv.memsetD8Async(dst, 0, uint64(n), s.stream); r != success {
			d.sync(s)
			return check(d.drv, "cuMemsetD8Async", r)
		}
		return d.sync(s)
	})
}

// dtod copies n bytes within the device and waits (a device-to-device copy
// is asynchronous to the host too).
func (d *Device) dtod(dst, src devptr, n int64) error {
	return d.withStager(func(s *stager) error {
		if r := d.drv.memcpyDtoDAsync(dst, src, uint64(n), s.stream); r != success {
			d.sync(s)
			return check(d.drv, "cuMemcpyDtoDAsync_v2", r)
		}
		return d.sync(s)
	})
}

// peer copies n bytes from another GPU's memory into this one's and waits.
// Peer access is enabled the first time, when the hardware allows it (NVLink
// or PCIe P2P); without it cuMemcpyPeer still works, staged by the driver.
func (d *Device) peer(dst devptr, from *Device, src devptr, n int64) error {
	if err := d.enablePeer(from); err != nil {
		return err
	}
	return d.withStager(func(s *stager) error {
		if r := d.drv.memcpyPeerAsync(dst, d.ctx, src, from.ctx, uint64(n), s.stream); r != success {
			d.sync(s)
			return check(d.drv, "cuMemcpyPeerAsync", r)
		}
		return d.sync(s)
	})
}

// enablePeer lets this device's context access from's memory, once per pair;
// a refusal is remembered and returned to every later copy on that pair.
func (d *Device) enablePeer(from *Device) error {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	if err, done := d.peers[from]; done {
		return err
	}
	can, r := d.drv.deviceCanAccessPeer(d.dev, from.dev)
	err := check(d.drv, "cuDeviceCanAccessPeer", r)
	if err == nil && can {
		err = d.withCtx(func() error {
			r := d.drv.ctxEnablePeerAccess(from.ctx)
			if r == errPeerAccessEnabled {
				r = success // another user of the primary context enabled it
			}
			return check(d.drv, "cuCtxEnablePeerAccess", r)
		})
	}
	if err != nil {
		err = fmt.Errorf("%s: peer access to %s: %w", d.name, from.name, err)
	}
	d.peers[from] = err
	if err == nil && can {
		d.peerOn[from] = true
	}
	return err
}

// peerReadable reports whether this device's context can address from's
// memory directly (a kernel here may load from it): peer access is enabled,
// enabling it the first time.
func (d *Device) peerReadable(from *Device) bool {
	if d.enablePeer(from) != nil {
		return false
	}
	d.pmu.Lock()
	defer d.pmu.Unlock()
	return d.peerOn[from]
}
