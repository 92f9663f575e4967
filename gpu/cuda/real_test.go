package cuda

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/gpu"
)

// realEnv gates the tests and benchmarks that need a GPU and libcuda.so.1:
// they run only when it is "1" (scripts/gpu-check.sh sets it), so that a
// machine with a driver but a busy or absent GPU never fails the ordinary run.
const realEnv = "TENSORFS_CUDA_REAL"

// openReal opens the real driver's GPUs, or skips saying why.
func openReal(tb testing.TB) []*Device {
	tb.Helper()
	if os.Getenv(realEnv) != "1" {
		tb.Skipf("real-driver test: set %s=1 on a host with a GPU", realEnv)
	}
	gdevs, err := Open(0)
	require.NoError(tb, err, "%s=1 but the driver does not open", realEnv)
	var devs []*Device
	for _, d := range gdevs {
		devs = append(devs, d.(*Device))
	}
	tb.Cleanup(func() {
		for _, d := range devs {
			require.NoError(tb, d.Close())
		}
	})
	return devs
}

func TestRealDriver(t *testing.T) {
	devs := openReal(t)
	d := devs[0]
	mi := d.MemInfo()
	t.Logf("%d GPU(s); %s: %d bytes", len(devs), d.Name(), mi.Total)
	require.Positive(t, mi.Total)
	require.Zero(t, mi.Used)

	small := make([]gpu.Buffer, 3)
	for i := range small {
		b, err := d.Alloc(1000, 0)
		require.NoError(t, err)
		small[i] = b
		require.Equal(t, small[0].ID(), b.ID())
		require.EqualValues(t, i*1024, b.Offset())
		require.Equal(t, small[0].Addr()+uintptr(b.Offset()), b.Addr())
	}
	h := small[0].Handle()
	require.True(t, strings.HasPrefix(h, "cuda:") && len(h) == 133, h)
	require.Zero(t, small[0].Addr()%ArenaSize, "cuMemAlloc'd arenas are 2 MiB aligned")

	for _, size := range []int{1, 1000, 64<<10 + 1, 1 << 20, 3<<20 + 7, 9 << 20} {
		b, err := d.Alloc(int64(size), 0)
		require.NoError(t, err)
		zeros := make([]byte, size)
		got := make([]byte, size)
		_, err = b.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(zeros, got), "size %d: a new buffer reads as zeros", size)
		p := pattern(size, byte(size))
		_, err = b.WriteAt(p[1:], 1)
		require.NoError(t, err)
		_, err = b.ReadAt(got, 0)
		require.NoError(t, err)
		require.Zero(t, got[0])
		require.True(t, bytes.Equal(p[1:], got[1:]), "size %d: round trip", size)

		// Device to device, on the same GPU.
		c, err := d.Alloc(int64(size), 0)
		require.NoError(t, err)
		require.NoError(t, gpu.Copy(c, 0, b, 0, int64(size)))
		done, err := c.(*buffer).CopyFrom(0, b, 0, int64(size))
		require.True(t, done)
		require.NoError(t, err)
		_, err = c.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(p[1:], got[1:]), "size %d: dtod", size)
		require.NoError(t, c.Zero(0, int64(size)))
		_, err = c.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(zeros, got), "size %d: zeroed", size)

		// Across GPUs, when there are two.
		if len(devs) > 1 {
			e, err := devs[1].Alloc(int64(size), 0)
			require.NoError(t, err)
			done, err := e.(*buffer).CopyFrom(0, b, 0, int64(size))
			require.True(t, done)
			require.NoError(t, err)
			_, err = e.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(p[1:], got[1:]), "size %d: peer copy", size)
			require.NoError(t, e.Free())
		}
		require.NoError(t, c.Free())
		require.NoError(t, b.Free())
	}
	for _, b := range small {
		require.NoError(t, b.Free())
	}
	require.Eventually(t, func() bool { return d.MemInfo().Used == 0 }, 2*time.Second, 10*time.Millisecond,
		"the lingering arena is freed")

	handle, free, err := d.RawAllocExport(64 << 10)
	require.NoError(t, err)
	require.Len(t, handle, 133)
	require.NoError(t, free())

	// The driver's own out-of-memory, past the whole GPU.
	_, err = d.Alloc(mi.Total+ArenaSize, 0)
	require.ErrorIs(t, err, gpu.ErrOutOfMemory)
	require.Zero(t, d.MemInfo().Used)
}

func TestRealConcurrent(t *testing.T) {
	devs := openReal(t)
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 16 {
		wg.Go(func() {
			d := devs[g%len(devs)]
			for i := range 50 {
				size := 1 + (g*7919+i*104729)%(4<<20)
				b, err := d.Alloc(int64(size), uint32(g%2))
				if err != nil {
					errs <- err
					return
				}
				p := pattern(size, byte(g+i))
				got := make([]byte, size)
				if _, err := b.WriteAt(p, 0); err != nil {
					errs <- err
				} else if _, err := b.ReadAt(got, 0); err != nil {
					errs <- err
				} else if !bytes.Equal(p, got) {
					errs <- fmt.Errorf("%s: %d bytes differ", d.Name(), size)
				}
				if err := b.Free(); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, d := range devs {
		require.Eventually(t, func() bool { return d.MemInfo().Used == 0 }, 2*time.Second, 10*time.Millisecond)
	}
}

// BenchmarkRealAlloc64K measures Alloc+Free of a 64 KiB buffer: "carve"
// with another buffer keeping the arena alive (a busy daemon), "linger" with
// nothing else held (the lingering arena is reused), and "churn" with the
// linger off (an arena made, exported and freed every time).
func BenchmarkRealAlloc64K(b *testing.B) {
	d := openReal(b)[0]
	loop := func(b *testing.B) {
		for b.Loop() {
			x, err := d.Alloc(64<<10, 0)
			if err != nil {
				b.Fatal(err)
			}
			x.Free()
		}
	}
	b.Run("carve", func(b *testing.B) {
		keep, err := d.Alloc(64<<10, 0)
		require.NoError(b, err)
		defer keep.Free()
		loop(b)
	})
	b.Run("linger", loop)
	b.Run("churn", func(b *testing.B) {
		d.flushIdle()
		d.linger = 0
		defer func() { d.linger = arenaLinger }()
		loop(b)
	})
}

// BenchmarkRealIO measures the backend's ReadAt and WriteAt alone (no FUSE),
// in MB/s, for a 4 KiB copy's chunk, a FUSE-sized 1 MiB request and a
// 64 MiB one. The 4 KiB ones also run as bare driver calls on a stager
// ("raw-"): the stream copy and its synchronize alone, without the Go
// around them, so that the difference is what ReadAt adds.
func BenchmarkRealIO(b *testing.B) {
	d := openReal(b)[0]
	for _, size := range []int{4 << 10, 1 << 20, 64 << 20} {
		buf, err := d.Alloc(int64(size), 0)
		require.NoError(b, err)
		p := pattern(size, 1)
		name := fmt.Sprintf("%dM", size>>20)
		if size < 1<<20 {
			name = fmt.Sprintf("%dK", size>>10)
		}
		b.Run("write-"+name, func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := buf.WriteAt(p, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("read-"+name, func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := buf.ReadAt(p, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
		if size < 1<<20 {
			src := buf.(*buffer).ptr(0)
			b.Run("raw-read-"+name, func(b *testing.B) {
				b.SetBytes(int64(size))
				require.NoError(b, d.withStager(func(s *stager) error {
					for b.Loop() {
						if err := check(d.drv, "cuMemcpyDtoHAsync_v2", d.drv.memcpyDtoHAsync(s.ptr[0], src, uint64(size), s.stream)); err != nil {
							return err
						}
						if err := d.sync(s); err != nil {
							return err
						}
					}
					return nil
				}))
			})
			b.Run("raw-write-"+name, func(b *testing.B) {
				b.SetBytes(int64(size))
				require.NoError(b, d.withStager(func(s *stager) error {
					for b.Loop() {
						if err := check(d.drv, "cuMemcpyHtoDAsync_v2", d.drv.memcpyHtoDAsync(src, s.ptr[0], uint64(size), s.stream)); err != nil {
							return err
						}
						if err := d.sync(s); err != nil {
							return err
						}
					}
					return nil
				}))
			})
		}
		buf.Free()
	}
}
