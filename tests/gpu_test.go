package tests

// GPU tests and benchmarks: tensorfs mounted with --device cuda:0. They skip,
// saying why, where there is no GPU (nvidia-smi -L fails, or libcuda.so.1
// does not load or sees no GPU), and fail instead when TENSORFS_REQUIRE_GPU=1,
// so that a run on a GPU host cannot pass by skipping. scripts/gpu-check.sh
// runs them on such a host.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/gpu/cuda"
	"github.com/tensorfs/tensorfs/xattrs"
)

var gpuProbe struct {
	once sync.Once
	n    int    // GPUs found
	why  string // why none, when n is 0
}

// requireGPU returns the number of GPUs, or skips the test (fails it when
// TENSORFS_REQUIRE_GPU=1) with the reason there is none.
func requireGPU(tb testing.TB) int {
	tb.Helper()
	gpuProbe.once.Do(func() {
		if out, err := exec.Command("nvidia-smi", "-L").CombinedOutput(); err != nil {
			gpuProbe.why = fmt.Sprintf("nvidia-smi -L failed (%v): %s", err, bytes.TrimSpace(out))
			return
		}
		devs, err := cuda.Open(0)
		for _, d := range devs {
			d.Close()
		}
		switch {
		case err != nil:
			gpuProbe.why = err.Error()
		case len(devs) == 0:
			gpuProbe.why = cuda.LibraryName + " loaded but sees no GPU"
		}
		gpuProbe.n = len(devs)
	})
	if gpuProbe.n == 0 {
		if os.Getenv("TENSORFS_REQUIRE_GPU") == "1" {
			tb.Fatalf("TENSORFS_REQUIRE_GPU=1 but no GPU is usable: %s", gpuProbe.why)
		}
		tb.Skipf("no GPU: %s (TENSORFS_REQUIRE_GPU=1 makes this a failure)", gpuProbe.why)
	}
	return gpuProbe.n
}

// TestGPUTemplatesAndXattrs: templated tensors on cuda:0 are allocated at
// create, small ones carved from one exported arena at distinct aligned
// offsets, large ones in allocations of their own.
func TestGPUTemplatesAndXattrs(t *testing.T) {
	requireGPU(t)
	d := startDaemon(t, "--device", "cuda:0")
	kv := d.path("kv")
	mkTemplateDir(t, kv, "F16", "64,64") // 8 KiB each
	mrs, ipcs, offs := map[string]bool{}, map[string]bool{}, map[int64]bool{}
	var handle string
	for i := range 8 {
		p := filepath.Join(kv, fmt.Sprint(i))
		require.NoError(t, os.WriteFile(p, nil, 0o644))
		require.Equal(t, "cuda:0", getx(t, p, xattrs.Device))
		require.Equal(t, "8192", getx(t, p, xattrs.NBytes))
		h := getx(t, p, xattrs.IPCHandle)
		require.True(t, strings.HasPrefix(h, "cuda:"), h)
		require.Len(t, h, len("cuda:")+128, h)
		if handle == "" {
			handle = h
		}
		require.Equal(t, handle, h, "small tensors of one owner share an arena")
		off, err := strconv.ParseInt(getx(t, p, xattrs.IPCOffset), 10, 64)
		require.NoError(t, err)
		require.Zero(t, off%cuda.Align, "ipc_offset %d is aligned", off)
		require.Less(t, off+8192, int64(cuda.ArenaSize+1), "inside the arena")
		require.False(t, offs[off], "offset %d used twice", off)
		offs[off] = true
		mr := getx(t, p, xattrs.MRID)
		ipc := getx(t, p, xattrs.IPCID)
		require.False(t, mrs[mr] || ipcs[ipc], "mr_id %s / ipc_id %s reused", mr, ipc)
		mrs[mr], ipcs[ipc] = true, true
	}

	big := d.path("big")
	require.NoError(t, os.WriteFile(big, nil, 0o644))
	setx(t, big, xattrs.Shape, strconv.Itoa(4<<20+1))
	require.Equal(t, "0", getx(t, big, xattrs.IPCOffset))
	require.NotEqual(t, handle, getx(t, big, xattrs.IPCHandle))
	st, err := os.Stat(big)
	require.NoError(t, err)
	require.EqualValues(t, 4<<20+1, st.Size(), "the size is exact, the allocation rounded")

	// Held on the GPU: one arena and the large tensor rounded up to 2 MiB.
	const held = cuda.ArenaSize + 6<<20
	require.EqualValues(t, held, d.stats().Live.Bytes)
	var sfs unix.Statfs_t
	require.NoError(t, unix.Statfs(d.mnt, &sfs))
	require.EqualValues(t, held, (sfs.Blocks-sfs.Bfree)*uint64(sfs.Bsize))

	// Host memory is served beside the GPUs.
	hd := d.path("onhost")
	require.NoError(t, os.Mkdir(hd, 0o755))
	setx(t, hd, xattrs.Device, "host")
	setx(t, hd, xattrs.Shape, "16")
	require.NoError(t, os.WriteFile(hd+"/t", nil, 0o644))
	require.Equal(t, "host", getx(t, hd+"/t", xattrs.Device))
	require.True(t, strings.HasPrefix(getx(t, hd+"/t", xattrs.IPCHandle), "memfd:"))

	require.NoError(t, os.RemoveAll(kv))
	require.NoError(t, os.RemoveAll(hd))
	require.NoError(t, os.Remove(big))
	d.requireClean()
}

// TestGPURoundTrips writes and reads back sizes from 1 byte to 64 MiB at odd
// offsets: through FUSE, the pinned staging buffers and the DMA both ways.
func TestGPURoundTrips(t *testing.T) {
	requireGPU(t)
	d := startDaemon(t, "--device", "cuda:0")
	for _, size := range []int{1, 255, 4097, 64<<10 + 1, 1<<20 + 13, 3<<20 + 5, 64 << 20} {
		for _, off := range []int64{0, 1, 1<<20 + 17} {
			name := d.path(fmt.Sprintf("rt-%d-%d", size, off))
			p := gpuPattern(size, byte(size)^byte(off))
			f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o644)
			require.NoError(t, err)
			n, err := f.WriteAt(p, off)
			require.NoError(t, err)
			require.Equal(t, size, n)
			require.Equal(t, "cuda:0", getx(t, name, xattrs.Device))

			got := make([]byte, off+int64(size))
			n, err = f.ReadAt(got, 0)
			require.NoError(t, err)
			require.Equal(t, len(got), n)
			require.Equal(t, make([]byte, off), got[:off], "size %d off %d: the hole reads as zeros", size, off)
			require.True(t, bytes.Equal(p, got[off:]), "size %d off %d: bytes read back differ", size, off)

			// An odd window, not aligned to anything.
			if size > 7 {
				w := make([]byte, size/2)
				_, err = f.ReadAt(w, off+3)
				require.NoError(t, err)
				require.True(t, bytes.Equal(p[3:3+len(w)], w), "size %d off %d: window differs", size, off)
			}
			require.NoError(t, f.Close())
			require.NoError(t, os.Remove(name))
		}
	}
	d.requireClean()
}

// TestGPUTruncateKeepsBytes: growing past the allocation reallocates on the
// GPU (new ids, generation bumped) and keeps the bytes; shrinking zeroes the
// cut tail, which reads as zeros when the file grows again.
func TestGPUTruncateKeepsBytes(t *testing.T) {
	requireGPU(t)
	d := startDaemon(t, "--device", "cuda:0")
	p := d.path("t")
	data := gpuPattern(100<<10+3, 9)
	require.NoError(t, os.WriteFile(p, data, 0o644))
	mr1 := getx(t, p, xattrs.MRID)
	h1 := getx(t, p, xattrs.IPCHandle)

	require.NoError(t, os.Truncate(p, 5<<20))
	require.NotEqual(t, mr1, getx(t, p, xattrs.MRID))
	require.NotEqual(t, h1, getx(t, p, xattrs.IPCHandle), "5 MiB has an allocation of its own")
	require.Equal(t, "1", getx(t, p, xattrs.Generation))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Len(t, got, 5<<20)
	require.True(t, bytes.Equal(data, got[:len(data)]), "bytes kept across the reallocation")
	require.Equal(t, make([]byte, 5<<20-len(data)), got[len(data):])

	require.NoError(t, os.Truncate(p, 10))
	require.NoError(t, os.Truncate(p, 1000))
	got, err = os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, data[:10], got[:10])
	require.Equal(t, make([]byte, 990), got[10:])
	require.Equal(t, "1", getx(t, p, xattrs.Generation), "shrinking keeps the allocation")

	require.NoError(t, os.Remove(p))
	d.requireClean()
}

// TestGPUUnlinkFrees: once the names are gone and no handle is open, every
// arena and allocation goes back to the driver: stats and statfs show 0.
func TestGPUUnlinkFrees(t *testing.T) {
	requireGPU(t)
	d := startDaemon(t, "--device", "cuda:0")
	dir := d.path("many")
	mkTemplateDir(t, dir, "U8", "65536")
	for i := range 100 {
		require.NoError(t, os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), nil, 0o644))
	}
	open, err := os.Open(filepath.Join(dir, "7"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(d.path("big"), nil, 0o644))
	require.NoError(t, os.Truncate(d.path("big"), 3<<20))
	s := d.stats()
	require.EqualValues(t, 101, s.Live.Tensors)
	require.EqualValues(t, 4*cuda.ArenaSize+2*cuda.ArenaSize, s.Live.Bytes, "100 x 64 KiB in 4 arenas, 3 MiB in 4 MiB")

	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.Remove(d.path("big")))
	// The open tensor keeps its arena alive; reading it still works.
	b := make([]byte, 10)
	_, err = open.ReadAt(b, 100)
	require.NoError(t, err)
	waitLiveBytes(t, d, cuda.ArenaSize)
	require.NoError(t, open.Close())
	d.requireClean()
}

// TestGPUOutOfMemory: --max-memory caps cuda:0; an allocation past it is
// ENOSPC and changes nothing.
func TestGPUOutOfMemory(t *testing.T) {
	requireGPU(t)
	d := startDaemon(t, "--device", "cuda:0", "--max-memory", "8MiB")
	var sfs unix.Statfs_t
	require.NoError(t, unix.Statfs(d.mnt, &sfs))
	require.EqualValues(t, 8<<20, sfs.Blocks*uint64(sfs.Bsize))

	require.NoError(t, os.WriteFile(d.path("a"), nil, 0o644))
	require.NoError(t, os.Truncate(d.path("a"), 5<<20)) // holds 6 MiB
	require.NoError(t, os.WriteFile(d.path("b"), nil, 0o644))
	require.ErrorIs(t, os.Truncate(d.path("b"), 4<<20), syscall.ENOSPC)
	_, err := getxErr(d.path("b"), xattrs.MRID)
	require.ErrorIs(t, err, syscall.ENODATA, "the failed sizing left b unallocated")
	require.NoError(t, os.Truncate(d.path("b"), 1000)) // an arena: 8 MiB held
	require.NoError(t, os.WriteFile(d.path("c"), nil, 0o644))
	require.ErrorIs(t, unix.Setxattr(d.path("c"), xattrs.Shape, []byte("2097152"), 0), syscall.ENOSPC)
	require.EqualValues(t, 8<<20, d.stats().Live.Bytes)
	for _, n := range []string{"a", "b", "c"} {
		require.NoError(t, os.Remove(d.path(n)))
	}
	d.requireClean()
}

// TestGPUSecondDevice: a directory whose device template is cuda:1 places
// its tensors there. It needs two GPUs.
func TestGPUSecondDevice(t *testing.T) {
	if n := requireGPU(t); n < 2 {
		t.Skipf("only %d GPU: cuda:1 placement needs two", n)
	}
	d := startDaemon(t, "--device", "cuda:0")
	dir := d.path("g1")
	require.NoError(t, os.Mkdir(dir, 0o755))
	setx(t, dir, xattrs.Device, "cuda:1")
	setx(t, dir, xattrs.DType, "F32")
	setx(t, dir, xattrs.Shape, "1024,1024")
	p := filepath.Join(dir, "w")
	require.NoError(t, os.WriteFile(p, nil, 0o644))
	require.Equal(t, "cuda:1", getx(t, p, xattrs.Device))
	data := gpuPattern(4<<20, 5)
	require.NoError(t, os.WriteFile(p, data, 0o644))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	require.NoError(t, os.RemoveAll(dir))
	d.requireClean()
}

// TestGPUCopiesAcrossDevices: copy_to and copy_from inside one daemon between
// cuda:0, cuda:1 and host go device to device (peer access between GPUs), and
// a push between two daemons on GPUs goes over TCP through pinned staging.
func TestGPUCopiesAcrossDevices(t *testing.T) {
	if n := requireGPU(t); n < 2 {
		t.Skipf("only %d GPU: copies across GPUs need two", n)
	}
	ds := cluster(t, []string{"a", "b"}, "--device", "cuda:0")
	a, b := ds["a"], ds["b"]
	for _, dev := range []string{"cuda:1", "host"} {
		dir := a.path("on-" + strings.ReplaceAll(dev, ":", ""))
		require.NoError(t, os.Mkdir(dir, 0o755))
		setx(t, dir, xattrs.Device, dev)
	}
	src := a.path("src")
	data := gpuPattern(6<<20+123, 9) // spans several arenas' worth, odd size
	require.NoError(t, os.WriteFile(src, data, 0o644))
	require.Equal(t, "cuda:0", getx(t, src, xattrs.Device))
	setx(t, src, xattrs.CopyTo, "/on-cuda1/x")
	setx(t, src, xattrs.CopyTo, "/on-host/x")
	require.NoError(t, os.WriteFile(a.path("back"), nil, 0o644))
	setx(t, a.path("back"), xattrs.CopyFrom, "/on-cuda1/x")
	setx(t, src, xattrs.CopyTo, "b:/x")
	for p, dev := range map[string]string{
		a.path("on-cuda1/x"): "cuda:1", a.path("on-host/x"): "host", a.path("back"): "cuda:0", b.path("x"): "cuda:0",
	} {
		require.Equal(t, dev, getx(t, p, xattrs.Device), p)
		got, err := os.ReadFile(p)
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, got), "%s: bytes differ", p)
	}
	require.EqualValues(t, 3, a.stats().Copies.Local)
	require.EqualValues(t, 1, a.stats().Copies.TCP)
	for _, p := range []string{"src", "back", "on-cuda1", "on-host"} {
		require.NoError(t, os.RemoveAll(a.path(p)))
	}
	require.NoError(t, os.Remove(b.path("x")))
	a.requireClean()
	b.requireClean()
}

// pyClient is the Python client; $TENSORFS_PY_CLIENT overrides it for runs
// of a prebuilt test binary outside the source tree.
func pyClient() string {
	if p := os.Getenv("TENSORFS_PY_CLIENT"); p != "" {
		return p
	}
	return "../examples/python/open_tensor.py"
}

// TestGPUPythonClient: another process opens a tensor's CUDA IPC handle at
// its ipc_offset (CuPy, or PyTorch) and sees the bytes written through the
// file; what it writes on the GPU reads back through the file.
func TestGPUPythonClient(t *testing.T) {
	requireGPU(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	if exec.Command(py, "-c", "import cupy").Run() != nil && exec.Command(py, "-c", "import torch").Run() != nil {
		t.Skip("neither cupy nor torch imports in python3")
	}
	d := startDaemon(t, "--device", "cuda:0")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(py, append([]string{pyClient()}, args...)...).CombinedOutput()
		require.NoError(t, err, "%s %v:\n%s\ndaemon log:\n%s", pyClient(), args, out, d.log.String())
		return string(out)
	}

	dir := d.path("w")
	require.NoError(t, os.Mkdir(dir, 0o755))
	cases := []struct{ name, dtype, shape, device string }{
		{"f32", "F32", "4,1024", ""},   // an arena, offset 0
		{"bf16", "BF16", "3,5,7", ""},  // the same arena, offset > 0
		{"i64", "I64", "300000", ""},   // 2.3 MiB: an allocation of its own
		{"host", "F16", "2,8", "host"}, // memfd handle
	}
	for _, c := range cases {
		p := filepath.Join(dir, c.name)
		require.NoError(t, os.WriteFile(p, nil, 0o644))
		if c.device != "" {
			setx(t, p, xattrs.Device, c.device)
		}
		setx(t, p, xattrs.DType, c.dtype)
		setx(t, p, xattrs.Shape, c.shape)
		n, _ := strconv.Atoi(getx(t, p, xattrs.NBytes))
		require.NoError(t, os.WriteFile(p, gpuPattern(n, 11), 0o644))
		out := run(p, "--check-file")
		t.Logf("%s: %s", c.name, strings.TrimSpace(out))

		// The client writes (i*7+3) % 251 into each byte on the device.
		run(p, "--write-pattern")
		got, err := os.ReadFile(p)
		require.NoError(t, err)
		want := make([]byte, n)
		for i := range want {
			want[i] = byte((i*7 + 3) % 251)
		}
		require.True(t, bytes.Equal(want, got), "%s: the client's GPU write reads back through the file", c.name)
	}
	require.NoError(t, os.RemoveAll(dir))
	d.requireClean()
}

// waitLiveBytes waits (RELEASE is asynchronous to close) until the daemon
// holds want bytes of device memory.
func waitLiveBytes(t *testing.T, d *daemon, want int64) {
	t.Helper()
	var got int64
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(20 * time.Millisecond) {
		if got = d.stats().Live.Bytes; got == want {
			return
		}
	}
	t.Fatalf("live bytes %d, want %d", got, want)
}

// gpuPattern returns n bytes that differ with seed and from the zeros of a
// fresh tensor.
func gpuPattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*131+i>>9) ^ seed | 1
	}
	return p
}

// BenchmarkGPUCreateUnlink64K measures create (allocate, register, export)
// + close + unlink of a 64 KiB tensor of a template, as ops/s, on cuda:0 and,
// for comparison, on host memory.
func BenchmarkGPUCreateUnlink64K(b *testing.B) {
	requireGPU(b)
	for _, dev := range []string{"cuda:0", "host"} {
		b.Run(dev, func(b *testing.B) {
			mnt := startDaemon(b, "--device", dev).mnt
			dir := filepath.Join(mnt, "tmpl")
			mustNo(b, os.Mkdir(dir, 0o755))
			mustNo(b, unix.Setxattr(dir, xattrs.Shape, []byte("65536"), 0))
			name := filepath.Join(dir, "t")
			for b.Loop() {
				fd, err := unix.Open(name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
				if err != nil {
					b.Fatalf("create %s: %v", name, err)
				}
				unix.Close(fd)
				if err := unix.Unlink(name); err != nil {
					b.Fatalf("unlink %s: %v", name, err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			waitTensorfsIdle(b, mnt)
		})
	}
}

// BenchmarkGPUOverhead64K creates 4096 tensors of 64 KiB on cuda:0 and
// reports the bytes held on the GPU (stats live.bytes) over the bytes of the
// tensors (goal <= 1.1), and the time to create them all.
func BenchmarkGPUOverhead64K(b *testing.B) {
	requireGPU(b)
	mnt := startDaemon(b, "--device", "cuda:0").mnt
	dir := filepath.Join(mnt, "tmpl")
	mustNo(b, os.Mkdir(dir, 0o755))
	mustNo(b, unix.Setxattr(dir, xattrs.Shape, []byte("65536"), 0))
	const count = 4096
	var ratio float64
	for b.Loop() {
		for i := range count {
			fd, err := unix.Open(filepath.Join(dir, strconv.Itoa(i)), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				b.Fatalf("create %d: %v", i, err)
			}
			unix.Close(fd)
		}
		b.StopTimer()
		st := benchStats(b, mnt)
		if st.Live.Tensors != count {
			b.Fatalf("%d tensors live, want %d", st.Live.Tensors, count)
		}
		ratio = float64(st.Live.Bytes) / float64(count*65536)
		for i := range count {
			mustNo(b, unix.Unlink(filepath.Join(dir, strconv.Itoa(i))))
		}
		b.StartTimer()
	}
	b.ReportMetric(ratio, "held/bytes")
	if ratio > 1.1 {
		b.Errorf("4096 x 64 KiB hold %.3fx their bytes on the GPU; the goal is <= 1.1", ratio)
	}
	waitTensorfsIdle(b, mnt)
}

// BenchmarkGPURegister1G compares tensorfs's registration of a 1 GiB tensor
// (setxattr shape on an empty file: allocate, zero, register, export, then
// read the IPC handle through the mount) with the floor: a bare
// cuMemAlloc + cuIpcGetMemHandle in this process. Freeing is not timed.
func BenchmarkGPURegister1G(b *testing.B) {
	requireGPU(b)
	const size = 1 << 30
	b.Run("tensorfs", func(b *testing.B) {
		mnt := startDaemon(b, "--device", "cuda:0").mnt
		name := filepath.Join(mnt, "t")
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			fd, err := unix.Open(name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			mustNo(b, err)
			unix.Close(fd)
			b.StartTimer()
			mustNo(b, unix.Setxattr(name, xattrs.Shape, []byte(strconv.Itoa(size)), 0))
			if h, err := getxErr(name, xattrs.IPCHandle); err != nil || !strings.HasPrefix(h, "cuda:") {
				b.Fatalf("ipc_handle %q: %v", h, err)
			}
			b.StopTimer()
			mustNo(b, unix.Unlink(name))
			b.StartTimer()
		}
		waitTensorfsIdle(b, mnt)
	})
	b.Run("cuMemAlloc+cuIpcGetMemHandle", func(b *testing.B) {
		devs, err := cuda.Open(0)
		mustNo(b, err)
		defer func() {
			for _, d := range devs {
				d.Close()
			}
		}()
		d := devs[0].(*cuda.Device)
		for i := 0; i < b.N; i++ {
			_, free, err := d.RawAllocExport(size)
			mustNo(b, err)
			b.StopTimer()
			mustNo(b, free())
			b.StartTimer()
		}
	})
}

// gpuSeqSize is the tensor size of the GPU sequential I/O benchmarks.
const gpuSeqSize = 1 << 30

// BenchmarkGPUSeqWrite1G measures sequential 1 MiB pwrites over a 1 GiB
// tensor on cuda:0 and, for comparison, on host memory (a second daemon,
// --device host). Reported as MB/s.
func BenchmarkGPUSeqWrite1G(b *testing.B) {
	requireGPU(b)
	for _, dev := range []string{"cuda:0", "host"} {
		b.Run(dev, func(b *testing.B) {
			fd, buf := openGPUSeqFile(b, startDaemon(b, "--device", dev).mnt)
			b.SetBytes(gpuSeqSize)
			for b.Loop() {
				gpuWriteAll(b, fd, buf)
			}
		})
	}
}

// BenchmarkGPUSeqRead1G is BenchmarkGPUSeqWrite1G with 1 MiB preads.
func BenchmarkGPUSeqRead1G(b *testing.B) {
	requireGPU(b)
	for _, dev := range []string{"cuda:0", "host"} {
		b.Run(dev, func(b *testing.B) {
			fd, buf := openGPUSeqFile(b, startDaemon(b, "--device", dev).mnt)
			b.SetBytes(gpuSeqSize)
			for b.Loop() {
				for off := int64(0); off < gpuSeqSize; off += ioSize {
					if n, err := unix.Pread(fd, buf, off); err != nil || n != ioSize {
						b.Fatalf("pread at %d: %d bytes, %v", off, n, err)
					}
				}
			}
		})
	}
}

// openGPUSeqFile creates a 1 GiB tensor in mnt, writes it once and returns
// the open fd and a 1 MiB buffer; a cleanup closes and unlinks it.
func openGPUSeqFile(b *testing.B, mnt string) (int, []byte) {
	b.Helper()
	name := filepath.Join(mnt, "seq")
	fd, err := unix.Open(name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	mustNo(b, err)
	b.Cleanup(func() {
		unix.Close(fd)
		unix.Unlink(name)
		waitTensorfsIdle(b, mnt)
	})
	mustNo(b, unix.Ftruncate(fd, gpuSeqSize))
	buf := pattern(ioSize)
	gpuWriteAll(b, fd, buf)
	return fd, buf
}

func gpuWriteAll(b *testing.B, fd int, buf []byte) {
	for off := int64(0); off < gpuSeqSize; off += ioSize {
		if n, err := unix.Pwrite(fd, buf, off); err != nil || n != len(buf) {
			b.Fatalf("pwrite at %d: %d bytes, %v", off, n, err)
		}
	}
}

// reportPhases reports the mean time by phase (xattrs.Phases: the
// destination's prepare, data and commit, in µs) of the last n transfers
// that the daemon mounted at mnt received (at most the 16 stats keeps), as
// the metrics prepare-us, data-us and commit-us, and their mean took_us as
// dst-us: where a copy's time goes.
func reportPhases(b *testing.B, mnt string, n int) {
	b.Helper()
	var recs []xattrs.Record
	for _, r := range benchStats(b, mnt).Transfers.Recent {
		if r.PhaseUS != nil {
			recs = append(recs, r)
		}
	}
	recs = recs[max(0, len(recs)-n):]
	if len(recs) == 0 {
		b.Fatalf("%s: no received transfer with phase times in stats", mnt)
	}
	var sum xattrs.Phases
	var took int64
	for _, r := range recs {
		sum.Prepare += r.PhaseUS.Prepare
		sum.Data += r.PhaseUS.Data
		sum.Commit += r.PhaseUS.Commit
		took += r.TookUS
	}
	k := float64(len(recs))
	b.ReportMetric(float64(took)/k, "dst-us")
	b.ReportMetric(float64(sum.Prepare)/k, "prepare-us")
	b.ReportMetric(float64(sum.Data)/k, "data-us")
	b.ReportMetric(float64(sum.Commit)/k, "commit-us")
}

// reportTook reports the mean took_us of the last n transfers the daemon
// at mnt sent or received, as metric unit (e.g. "src-us").
func reportTook(b *testing.B, mnt string, n int, unit string) {
	b.Helper()
	var took []int64
	for _, r := range benchStats(b, mnt).Transfers.Recent {
		took = append(took, r.TookUS)
	}
	took = took[max(0, len(took)-n):]
	if len(took) == 0 {
		b.Fatalf("%s: no transfer in stats", mnt)
	}
	var sum int64
	for _, t := range took {
		sum += t
	}
	b.ReportMetric(float64(sum)/float64(len(took)), unit)
}

// benchStats reads the mount's stats document.
func benchStats(b *testing.B, mnt string) xattrs.Stats {
	b.Helper()
	v, err := getxErr(mnt, xattrs.StatsName)
	mustNo(b, err)
	var s xattrs.Stats
	mustNo(b, json.Unmarshal([]byte(v), &s))
	return s
}
