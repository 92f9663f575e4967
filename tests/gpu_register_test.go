package tests

import (
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/xattrs"
)

// cudaOwnerScript owns GPU memory the way a framework's allocator does: a
// cudaMalloc of argv[1] bytes on GPU 0 (CuPy's Memory, not its pool, so the
// IPC handle's allocation starts at the buffer) holding (i*7+3) % 251 at i;
// it prints "cuda:" + the hex of its IPC handle and answers "read OFF N" (hex
// of the bytes, copied off the GPU) and "exit" (frees, synchronizes, exits).
const cudaOwnerScript = `
import sys, cupy
n = int(sys.argv[1])
cupy.cuda.Device(0).use()
mem = cupy.cuda.memory.Memory(n)
arr = cupy.ndarray((n,), cupy.uint8, cupy.cuda.MemoryPointer(mem, 0))
arr[...] = ((cupy.arange(n, dtype=cupy.int64) * 7 + 3) % 251).astype(cupy.uint8)
cupy.cuda.runtime.deviceSynchronize()
print("cuda:" + bytes(cupy.cuda.runtime.ipcGetMemHandle(mem.ptr)).hex(), flush=True)
for line in sys.stdin:
    c = line.split()
    if c[0] == "read":
        off, k = int(c[1]), int(c[2])
        print(cupy.asnumpy(arr[off:off + k]).tobytes().hex(), flush=True)
    elif c[0] == "exit":
        break
del arr
mem = None
cupy.cuda.runtime.deviceSynchronize()
`

// requireCuPy is the python3 where CuPy works with a GPU (the one on PATH:
// no other uid runs it), after requireGPU; without CuPy the test skips,
// or fails under TENSORFS_REQUIRE_GPU=1.
func requireCuPy(t *testing.T) string {
	t.Helper()
	requireGPU(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		py = python3(t)
	}
	if out, err := exec.Command(py, "-c", "import cupy; cupy.cuda.runtime.getDeviceCount()").CombinedOutput(); err != nil {
		if os.Getenv("TENSORFS_REQUIRE_GPU") == "1" {
			t.Fatalf("TENSORFS_REQUIRE_GPU=1 but CuPy does not work in %s: %s", py, out)
		}
		t.Skipf("CuPy does not work in %s (pip install cupy-cuda12x): %s", py, strings.TrimSpace(string(out)))
	}
	return py
}

// TestGPURegisterCUDA: a CuPy process registers its own GPU memory into a
// daemon on cuda:0 by its CUDA IPC handle (a capability: not checked
// further), reads it back through the mount, writes it, copies it to a peer
// daemon; unlink closes the daemon's IPC mapping, and the owner then frees
// its memory and exits cleanly. It needs the CUDA backend's gpu.Importer.
func TestGPURegisterCUDA(t *testing.T) {
	py := requireCuPy(t)
	ds := cluster(t, []string{"a", "b"}, "--device", "cuda:0")
	d, b := ds["a"], ds["b"]
	const size = 4 << 20
	o := startScript(t, py, cudaOwnerScript, []string{strconv.Itoa(size)}, nil)
	handle := o.first
	require.True(t, strings.HasPrefix(handle, "cuda:") && len(handle) == 5+128, handle)
	base := d.settledLive()

	whole, part := d.path("whole"), d.path("part")
	mkEmpty(t, whole)
	mkEmpty(t, part)
	require.NoError(t, setErr(whole, xattrs.Register, handle)(), "daemon log:\n%s", d.log.String())
	setx(t, part, xattrs.Register, handle+"@4096+8192")
	require.Equal(t, strconv.Itoa(size), getx(t, whole, xattrs.NBytes))
	require.Equal(t, "cuda:0", getx(t, whole, xattrs.Device))
	require.Equal(t, "8192", getx(t, part, xattrs.NBytes))
	require.Equal(t, "4096", getx(t, part, xattrs.IPCOffset))
	require.True(t, strings.HasPrefix(getx(t, whole, xattrs.IPCHandle), "cuda:"))
	require.EqualValues(t, base.Bytes, d.stats().Live.Bytes, "registered memory is not tensorfs's")

	got, err := os.ReadFile(whole)
	require.NoError(t, err)
	require.Equal(t, ownerBytes(0, size), got)
	got, err = os.ReadFile(part)
	require.NoError(t, err)
	require.Equal(t, ownerBytes(4096, 8192), got)

	f, err := os.OpenFile(part, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("hello"), 10)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	seen, err := hex.DecodeString(o.do(fmt.Sprintf("read %d %d", 4106, 5)))
	require.NoError(t, err)
	require.Equal(t, "hello", string(seen), "the owner sees the write on its GPU")
	want := ownerBytes(0, size)
	copy(want[4106:], "hello")

	setx(t, whole, xattrs.CopyTo, "b:/copy")
	got, err = os.ReadFile(b.path("copy"))
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.NoError(t, os.Remove(b.path("copy")))

	require.NoError(t, os.Remove(whole))
	require.NoError(t, os.Remove(part))
	d.requireClean()
	b.requireClean()
	seen, err = hex.DecodeString(o.do(fmt.Sprintf("read %d %d", 0, 8192)))
	require.NoError(t, err)
	require.Equal(t, want[:8192], seen, "unlink never frees or changes the owner's memory")
	o.close() // frees, synchronizes and must exit 0
}
