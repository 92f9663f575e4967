package tests

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/gpu/cuda"
	"github.com/tensorfs/tensorfs/xattrs"
)

// gpuIPCDevices are the devices of the exporter and the importer of the
// GPU IPC tests: cuda:0 and cuda:1 when there are two GPUs (NVLink on the
// H200 pair), else cuda:0 for both (two daemons, one GPU).
func gpuIPCDevices(tb testing.TB) (string, string) {
	if requireGPU(tb) >= 2 {
		return "cuda:0", "cuda:1"
	}
	return "cuda:0", "cuda:0"
}

// TestGPUIPCBetweenDaemons: GPU tensors between two daemons of one host go
// by CUDA IPC (the importer opens the exporter's handle and copies device
// to device; no bytes on the socket), pushed and pulled, for a tensor in an
// allocation of its own and one carved from a shared arena (non-zero
// ipc_offset); the import is cached (a hit on the next copy) and revoked
// when the source is freed.
func TestGPUIPCBetweenDaemons(t *testing.T) {
	devA, devB := gpuIPCDevices(t)
	ds := sameHost(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	for d, dev := range map[*daemon]string{a: devA, b: devB} {
		setx(t, d.mnt, xattrs.Device, dev)
	}
	big, small := gpuPattern(6<<20+123, 3), gpuPattern(64<<10, 4)
	require.NoError(t, os.WriteFile(a.path("big"), big, 0o644))
	require.NoError(t, os.WriteFile(a.path("pad"), gpuPattern(4096, 1), 0o644))
	require.NoError(t, os.WriteFile(a.path("small"), small, 0o644))
	require.Equal(t, devA, getx(t, a.path("small"), xattrs.Device))
	require.NotEqual(t, "0", getx(t, a.path("small"), xattrs.IPCOffset), "carved from an arena")
	require.True(t, strings.HasPrefix(getx(t, a.path("big"), xattrs.IPCHandle), "cuda:"))

	setx(t, a.path("big"), xattrs.CopyTo, "b:/big")
	setx(t, a.path("small"), xattrs.CopyTo, "b:/small")
	require.NoError(t, os.WriteFile(b.path("pulled"), nil, 0o644))
	setx(t, b.path("pulled"), xattrs.CopyFrom, "a:/small")
	for p, want := range map[string][]byte{b.path("big"): big, b.path("small"): small, b.path("pulled"): small} {
		require.Equal(t, devB, getx(t, p, xattrs.Device), p)
		got, err := os.ReadFile(p)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "%s: bytes differ", p)
	}
	sa, sb := a.stats(), b.stats()
	require.EqualValues(t, 3, sa.Copies.IPC, "%v", sa.Copies)
	require.EqualValues(t, 3, sb.Copies.IPC, "%v", sb.Copies)
	require.Zero(t, sa.Copies.TCP+sb.Copies.TCP)
	require.EqualValues(t, 2, sb.Live.Imports, "one import per allocation: the big one's and the arena's")
	require.EqualValues(t, 1, sb.Imports.Hits, "the pull of small reused the arena's import: %+v", sb.Imports)

	// The source changes; the next copy is a cache hit and sees new bytes.
	small2 := gpuPattern(64<<10, 5)
	require.NoError(t, os.WriteFile(a.path("small"), small2, 0o644))
	setx(t, a.path("small"), xattrs.CopyTo, "b:/small")
	got, err := os.ReadFile(b.path("small"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(small2, got))

	// Freeing the sources revokes: b closes its imports before unlink returns.
	for _, n := range []string{"big", "small", "pad"} {
		require.NoError(t, os.Remove(a.path(n)))
	}
	require.Zero(t, b.stats().Live.Imports)
	a.requireClean()
	for _, n := range []string{"big", "small", "pulled"} {
		require.NoError(t, os.Remove(b.path(n)))
	}
	b.requireClean()
}

// BenchmarkGPUIPCCopy1G: a 1 GiB GPU tensor copied between two daemons of
// one host (copy_to over an existing destination: path ipc, cached import)
// against the baseline of a raw device-to-device copy through an
// IPC-opened pointer of the same tensor, in this process, between the same
// GPUs. Reported as GB/s.
func BenchmarkGPUIPCCopy1G(b *testing.B) {
	devA, devB := gpuIPCDevices(b)
	const size = 1 << 30
	ds := sameHost(b, []string{"a", "b"})
	a, d := ds["a"], ds["b"]
	setx(b, a.mnt, xattrs.Device, devA)
	setx(b, d.mnt, xattrs.Device, devB)
	src := a.path("t")
	fd, err := unix.Open(src, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	mustNo(b, err)
	unix.Close(fd)
	mustNo(b, unix.Setxattr(src, xattrs.Shape, []byte(strconv.Itoa(size)), 0))
	// Marks at both ends, checked in the destination after the timed copies.
	fd, err = unix.Open(src, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	mustNo(b, err)
	_, err = unix.Pwrite(fd, []byte("head"), 0)
	mustNo(b, err)
	_, err = unix.Pwrite(fd, []byte("tail"), size-4)
	mustNo(b, err)
	unix.Close(fd)
	mustNo(b, unix.Setxattr(src, xattrs.CopyTo, []byte("b:/t"), 0)) // warm: the import and the destination's memory

	b.Run("tensorfs", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			mustNo(b, unix.Setxattr(src, xattrs.CopyTo, []byte("b:/t"), 0))
		}
		b.StopTimer()
		reportPhases(b, d.mnt, b.N)
		reportTook(b, a.mnt, b.N, "src-us")
		s := benchStats(b, d.mnt)
		if s.Copies.IPC < int64(b.N) || s.Copies.TCP != 0 {
			b.Fatalf("copies %v: want every copy on the ipc path", s.Copies)
		}
		g, err := os.Open(d.path("t"))
		mustNo(b, err)
		defer g.Close()
		p := make([]byte, 4)
		for off, want := range map[int64]string{0: "head", size - 4: "tail"} {
			_, err := g.ReadAt(p, off)
			mustNo(b, err)
			if string(p) != want {
				b.Fatalf("destination at %d: %q, want %q", off, p, want)
			}
		}
	})
	// The baselines run in this process, on the destination's device.
	devs, err := cuda.Open(0)
	mustNo(b, err)
	defer func() {
		for _, dv := range devs {
			dv.Close()
		}
	}()
	var dev gpu.Device
	for _, dv := range devs {
		if dv.Name() == devB {
			dev = dv
		}
	}
	b.Run("raw-ipc-dtod", func(b *testing.B) {
		off, err := strconv.ParseInt(getx(b, src, xattrs.IPCOffset), 10, 64)
		mustNo(b, err)
		imp, err := dev.(gpu.Importer).Import(getx(b, src, xattrs.IPCHandle), off, size)
		mustNo(b, err)
		defer imp.Free()
		dst, err := dev.Alloc(size, 0)
		mustNo(b, err)
		defer dst.Free()
		mustNo(b, gpu.Copy(dst, 0, imp, 0, size)) // warm
		b.SetBytes(size)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			mustNo(b, gpu.Copy(dst, 0, imp, 0, size))
		}
		b.StopTimer()
		p := make([]byte, 4)
		_, err = dst.ReadAt(p, size-4)
		mustNo(b, err)
		if string(p) != "tail" {
			b.Fatalf("raw copy: %q at the end", p)
		}
	})
	// For reading the two above: the GPU's own copy rate now, between two
	// buffers of this process on the destination's device.
	b.Run("local-dtod", func(b *testing.B) {
		x, err := dev.Alloc(size, 0)
		mustNo(b, err)
		defer x.Free()
		y, err := dev.Alloc(size, 0)
		mustNo(b, err)
		defer y.Free()
		mustNo(b, gpu.Copy(y, 0, x, 0, size))
		b.SetBytes(size)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			mustNo(b, gpu.Copy(y, 0, x, 0, size))
		}
	})
	mustNo(b, os.Remove(src))
	mustNo(b, os.Remove(filepath.Join(d.mnt, "t")))
	time.Sleep(100 * time.Millisecond)
}
