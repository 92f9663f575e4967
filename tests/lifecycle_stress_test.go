package tests

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// TestIPCChurnThreeDaemons: three daemons of one host push and pull the
// same tensors among themselves (both sides dialing lease channels at once)
// while the sources are unlinked, resized (reallocated) and recreated.
// Every copy either succeeds with one whole version of the source or fails
// with an errno; afterwards every daemon is back to baseline (no import,
// lease, pin or fd left).
func TestIPCChurnThreeDaemons(t *testing.T) {
	names := []string{"a", "b", "c"}
	ds := sameHost(t, names)
	const tensors = 6
	// Every version of a tensor is one repeated byte, written whole beside
	// it and renamed over it (which frees, so revokes, the old one); a
	// resize in place extends it with zeros. So a copy that mixed two
	// versions (or read freed memory) shows as two different non-zero
	// bytes, or non-zero bytes after zeros.
	var tmp atomic.Int64
	//
	// Sources live in /src, copies land in /in (pushes) and /pull: a rename
	// or unlink in the directory where a peer's copy commits can deadlock
	// with a copy_to (see the report of this test's commit).
	write := func(d *daemon, i int, v byte, n int) error {
		p := d.path("src", fmt.Sprintf(".w%d", tmp.Add(1)))
		if err := os.WriteFile(p, fill1(n, v), 0o644); err != nil {
			return err
		}
		return os.Rename(p, d.path("src", fmt.Sprintf("t%d", i)))
	}
	for _, n := range names {
		for _, dir := range []string{"src", "in", "pull"} {
			require.NoError(t, os.Mkdir(ds[n].path(dir), 0o755))
		}
	}
	for _, n := range names {
		for i := range tensors {
			require.NoError(t, write(ds[n], i, byte(i+1), 64<<10))
		}
	}
	okErr := func(err error) bool {
		// What a copy may say when its source vanished or changed under
		// it, or its destination is being replaced.
		return err == nil || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EIO) ||
			errors.Is(err, syscall.EBUSY) || errors.Is(err, syscall.ENODATA) || errors.Is(err, syscall.ESTALE)
	}
	deadline := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for time.Now().Before(deadline) {
				from, to := names[r.IntN(3)], names[r.IntN(3)]
				if from == to {
					continue
				}
				i := r.IntN(tensors)
				var err error
				if r.IntN(2) == 0 {
					err = unix.Setxattr(ds[from].path("src", fmt.Sprintf("t%d", i)), xattrs.CopyTo, fmt.Appendf(nil, "%s:/in/c%d_%d", to, w, i), 0)
				} else {
					p := ds[to].path("pull", fmt.Sprintf("p%d_%d", w, i))
					if _, serr := os.Stat(p); serr != nil {
						os.WriteFile(p, nil, 0o644)
					}
					err = unix.Setxattr(p, xattrs.CopyFrom, fmt.Appendf(nil, "%s:/src/t%d", from, i), 0)
				}
				if !okErr(err) {
					errs <- fmt.Errorf("copy %s->%s t%d: %w", from, to, i, err)
					return
				}
			}
		})
	}
	for w := range 2 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for time.Now().Before(deadline) {
				d := ds[names[r.IntN(3)]]
				i := r.IntN(tensors)
				p := d.path("src", fmt.Sprintf("t%d", i))
				switch r.IntN(3) {
				case 0:
					os.Remove(p)
					write(d, i, byte(r.IntN(200)+1), 64<<10)
				case 1:
					// Resize past the allocation: a new allocation, the
					// old one revoked. Rewritten whole after.
					n := []int{64 << 10, 3 << 20}[r.IntN(2)]
					write(d, i, byte(r.IntN(200)+1), n)
				case 2:
					os.Truncate(p, int64([]int{4 << 10, 64 << 10, 3 << 20}[r.IntN(3)]))
					write(d, i, byte(r.IntN(200)+1), 64<<10)
				}
				time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, n := range names {
		st := ds[n].stats()
		t.Logf("%s: copies %v, imports %+v", n, st.Copies, st.Imports)
	}
	// Every copy that landed is one whole version of its source.
	for _, n := range names {
		for _, dir := range []string{"src", "in", "pull"} {
			checkVersions(t, ds[n], dir)
			require.NoError(t, os.Remove(ds[n].path(dir)))
		}
	}
	for _, n := range names {
		ds[n].requireClean()
	}
}

// checkVersions checks that every tensor in dir of d is one whole version
// of a churned source (see TestIPCChurnThreeDaemons), and removes it.
func checkVersions(t *testing.T, d *daemon, dir string) {
	t.Helper()
	{
		ents, err := os.ReadDir(d.path(dir))
		require.NoError(t, err)
		for _, e := range ents {
			b, err := os.ReadFile(d.path(dir, e.Name()))
			require.NoError(t, err)
			for j := 1; j < len(b); j++ {
				if b[j] != 0 && (b[j] != b[0] || b[j-1] == 0) {
					t.Errorf("%s/%s mixes versions: byte %d is %d, byte 0 is %d", d.mnt, e.Name(), j, b[j], b[0])
					break
				}
			}
			require.NoError(t, os.Remove(d.path(dir, e.Name())))
		}
	}
}

// fill1 is n bytes of v.
func fill1(n int, v byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = v
	}
	return b
}

// TestRevokeTreeOf1000: rm -r of a 1000-tensor tree that a peer imported
// revokes every export (one round trip each) and leaves both daemons clean;
// the time is logged against the same rm -r with no importer.
func TestRevokeTreeOf1000(t *testing.T) {
	ds := sameHost(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	mk := func(dir string) {
		require.NoError(t, os.Mkdir(a.path(dir), 0o755))
		for i := range 1000 {
			require.NoError(t, os.WriteFile(a.path(dir, fmt.Sprintf("t%04d", i)), fill1(4096, byte(i)), 0o644))
		}
	}
	mk("plain")
	start := time.Now()
	require.NoError(t, os.RemoveAll(a.path("plain")))
	plain := time.Since(start)

	mk("tree")
	setx(t, a.path("tree"), xattrs.CopyTo, "b:/tree")
	// One import per allocation: per tensor on host memory; a GPU backend
	// carves these from shared arenas.
	allocs := map[string]bool{}
	for i := range 1000 {
		allocs[getx(t, a.path("tree", fmt.Sprintf("t%04d", i)), xattrs.IPCHandle)] = true
	}
	require.EqualValues(t, len(allocs), b.stats().Live.Imports)
	a.requireLeases(1000)
	start = time.Now()
	require.NoError(t, os.RemoveAll(a.path("tree")))
	leased := time.Since(start)
	t.Logf("rm -r of 1000 tensors: %v with a peer's imports, %v without (%.1fx)", leased, plain, float64(leased)/float64(plain))
	require.Zero(t, b.stats().Live.Imports, "every import revoked before rm -r returned")
	a.requireClean()
	b1, err := os.ReadFile(b.path("tree", "t0999"))
	require.NoError(t, err)
	require.Equal(t, fill1(4096, byte(999%256)), b1)
	require.NoError(t, os.RemoveAll(b.path("tree")))
	b.requireClean()
}

// TestKillDuringIPCCopy: either side of an IPC copy killed (SIGKILL) while
// the importer reads: the survivor's copy completes whole or fails with an
// errno and leaves its destination as it was, it ends clean (no pin, lease or import left),
// and the dead daemon restarted on its mountpoint copies again.
func TestKillDuringIPCCopy(t *testing.T) {
	const n = 256 << 20
	for _, victim := range []string{"exporter", "importer"} {
		t.Run(victim, func(t *testing.T) {
			// Host memory: the kill must land while the importer reads, and a
			// GPU copies 256 MiB device to device in well under a millisecond
			// (the GPU IPC path's lifecycle is TestGPUIPCBetweenDaemons').
			ds := sameHost(t, []string{"a", "b"}, "--device", "host")
			a, b := ds["a"], ds["b"]
			require.NoError(t, os.WriteFile(a.path("big"), nil, 0o644))
			require.NoError(t, os.Truncate(a.path("big"), n))
			writeTensor(t, a.path("small"), fill(4096, 1))
			writeTensor(t, b.path("big"), []byte("old"))
			// A cached import and a lease channel, so the kill also ends
			// those.
			setx(t, a.path("small"), xattrs.CopyTo, "b:/small")
			done := make(chan error, 1)
			go func() { done <- unix.Setxattr(b.path("big"), xattrs.CopyFrom, []byte("a:/big"), 0) }()
			require.Eventually(t, func() bool { return a.stats().Live.Pins > 0 }, 10*time.Second, time.Millisecond)
			if victim == "exporter" {
				a.kill()
				// The importer's open memfd keeps the dead exporter's pinned
				// memory, so the copy may still complete, whole.
				if err := <-done; err != nil {
					t.Logf("copy failed: %v", err)
					requireContent(t, b.path("big"), []byte("old"))
				} else {
					st, err := os.Stat(b.path("big"))
					require.NoError(t, err)
					require.EqualValues(t, n, st.Size())
				}
				require.Eventually(t, func() bool { return b.stats().Live.Imports == 0 }, 5*time.Second, 10*time.Millisecond)
				a = a.relaunch()
				writeTensor(t, a.path("small"), fill(4096, 2))
				setx(t, b.path("big"), xattrs.CopyFrom, "a:/small")
				requireContent(t, b.path("big"), fill(4096, 2))
			} else {
				b.kill()
				<-done
				require.Eventually(t, func() bool {
					s := a.stats().Live
					return s.Pins == 0 && s.Leases == 0
				}, 5*time.Second, 10*time.Millisecond, "the dead importer's pin and leases end")
				b = b.relaunch()
				writeTensor(t, b.path("x"), nil)
				setx(t, b.path("x"), xattrs.CopyFrom, "a:/small")
				requireContent(t, b.path("x"), fill(4096, 1))
			}
			for _, d := range []*daemon{a, b} {
				ents, err := os.ReadDir(d.path())
				require.NoError(t, err)
				for _, e := range ents {
					require.NoError(t, os.Remove(d.path(e.Name())))
				}
			}
			a.requireClean()
			b.requireClean()
		})
	}
}
