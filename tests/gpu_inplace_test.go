package tests

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// cudaMapperScript maps a GPU tensor as a local importer does, with the
// Python client (python/tensorfs.py: Mount.open_cupy holds the file open,
// its lease, and opens the CUDA IPC handle once). Args: the client's
// directory, the mountpoint, the tensor's path. It prints "ready", then
// answers "read OFF N" with the hex of those bytes, read through that one
// mapping, and "exit".
const cudaMapperScript = `
import sys
sys.path.insert(0, sys.argv[1])
import cupy, tensorfs
m = tensorfs.Mount(sys.argv[2]).open_cupy(sys.argv[3])
flat = m.array.reshape(-1).view(cupy.uint8)
print("ready", flush=True)
for line in sys.stdin:
    c = line.split()
    if c[0] == "read":
        cupy.cuda.runtime.deviceSynchronize()
        o, k = int(c[1]), int(c[2])
        print(cupy.asnumpy(flat[o:o + k]).tobytes().hex(), flush=True)
    elif c[0] == "exit":
        break
del flat
m.close()
`

// TestGPUInPlace: on cuda:0, between two daemons on the IPC path and on the
// TCP path, in-place copies (one range, and a 1000-line scatter: one
// range-list descriptor, one gather/scatter kernel launch on the IPC path,
// gathered and scattered through device scratch on TCP) land in the destination's
// GPU memory where a CuPy process that mapped it by its IPC handle before
// the copies sees them; mr_id, ipc_id and generation stay; bytes outside
// the ranges are untouched.
func TestGPUInPlace(t *testing.T) {
	py := requireCuPy(t)
	for _, path := range []string{"ipc", "tcp"} {
		t.Run(path, func(t *testing.T) {
			var a, b *daemon
			if path == "tcp" {
				ds := cluster(t, []string{"a", "b"}, "--device", "cuda:0")
				a, b = ds["a"], ds["b"]
			} else {
				a, b = inPlacePairOn(t, "cuda:0")
			}
			const size, blk = 16 << 20, 8 << 10
			src := fill(1000*blk, 7)
			writeTensor(t, a.path("src"), src)
			zeros(t, b.path("cache"), size)
			before := ids(t, b.path("cache"))
			client, err := filepath.Abs("../python")
			require.NoError(t, err)
			m := startScript(t, py, cudaMapperScript, []string{client, b.mnt, b.path("cache")}, nil)
			require.Equal(t, "ready", m.first)
			read := func(off, n int) []byte {
				got, err := hex.DecodeString(m.do(fmt.Sprintf("read %d %d", off, n)))
				require.NoError(t, err)
				return got
			}
			want := make([]byte, size)
			setx(t, a.path("src"), xattrs.CopyTo, "@0+65536 b:/cache@1048576")
			copy(want[1<<20:], src[:65536])
			var lines []string
			for i, so := 0, 0; i < 1000; i++ {
				j := (i*389 + 17) % 1500 // scattered, distinct blocks
				// Lengths that are not all 8 KiB, so that the chunks of
				// the range list (one descriptor) cut spans in two.
				n := blk - (i%5)*7
				lines = append(lines, fmt.Sprintf("@%d+%d b:/cache@%d", so, n, 2<<20+j*blk))
				copy(want[2<<20+j*blk:], src[so:so+n])
				so += n
			}
			setx(t, a.path("src"), xattrs.CopyTo, strings.Join(lines, "\n"))
			require.True(t, bytes.Equal(want, read(0, size)), "the mapping made before the copies sees their bytes, and only theirs")
			require.Equal(t, before, ids(t, b.path("cache")))
			st := a.stats()
			require.EqualValues(t, 2, st.Copies.InPlace.IPC+st.Copies.InPlace.TCP, "%+v", st.Copies)
			if path == "ipc" {
				require.EqualValues(t, 2, st.Copies.InPlace.IPC, "%+v", st.Copies)
				// Bound now: the same copies again go one-sided (a's
				// kernel writes through its import of b's allocation),
				// which b takes no part in.
				require.Eventually(t, func() bool { return a.stats().Live.Bindings == 1 }, 5*time.Second, 5*time.Millisecond)
				got := receivedInPlace(b)
				src = fill(1000*blk, 11)
				writeTensor(t, a.path("src"), src)
				setx(t, a.path("src"), xattrs.CopyTo, "@0+65536 b:/cache@1048576")
				copy(want[1<<20:], src[:65536])
				for i, so := 0, 0; i < 1000; i++ {
					j := (i*389 + 17) % 1500
					n := blk - (i%5)*7
					copy(want[2<<20+j*blk:], src[so:so+n])
					so += n
				}
				setx(t, a.path("src"), xattrs.CopyTo, strings.Join(lines, "\n"))
				require.True(t, bytes.Equal(want, read(0, size)), "one-sided: the mapping sees the bytes, and only them")
				require.Equal(t, before, ids(t, b.path("cache")))
				require.Equal(t, got, receivedInPlace(b), "b took no part in the one-sided copies")
				require.EqualValues(t, 4, a.stats().Copies.InPlace.IPC)
			}
		})
	}
}

// inPlacePairOn is inPlacePair's IPC pair (one host id) on device dev.
func inPlacePairOn(t *testing.T, dev string) (a, b *daemon) {
	t.Helper()
	pa, pb := testutil.FreePort(t), testutil.FreePort(t)
	secret := secretFile(t, "a shared secret of enough bytes")
	common := []string{"--secret-file", secret, "--host-id", "one-host", "--timeout", "10s", "--device", dev}
	a = startDaemon(t, append([]string{"--name", "a", "--listen", fmt.Sprintf("127.0.0.1:%d", pa), "--peer", fmt.Sprintf("b=127.0.0.1:%d", pb)}, common...)...)
	b = startDaemon(t, append([]string{"--name", "b", "--listen", fmt.Sprintf("127.0.0.1:%d", pb), "--peer", fmt.Sprintf("a=127.0.0.1:%d", pa)}, common...)...)
	return a, b
}
