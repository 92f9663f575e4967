package tests

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// The IPC lifecycle between daemons of one host (DESIGN.md "Registration
// model"): importers cache per allocation under their exporter's lease; the
// exporter revokes before it frees; dead or silent peers cannot keep memory
// alive or leave stale mappings behind.

// sameHost starts daemons that share one host id, so copies between them
// take the IPC path.
func sameHost(t testing.TB, names []string, extra ...string) map[string]*daemon {
	t.Helper()
	return cluster(t, names, append([]string{"--host-id", "one-host"}, extra...)...)
}

func writeTensor(t *testing.T, path string, data []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, data, 0o644))
}

func requireContent(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "%s: %d bytes, want %d (first differing bytes differ)", path, len(got), len(want))
}

// TestImportNeverStale: a tensor recreated (at the same memfd, which the host
// backend recycles) or resized while a peer holds a cached import of it is
// never served from the stale import: the next copy sees the new bytes.
func TestImportNeverStale(t *testing.T) {
	ds := sameHost(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	one, two := fill(64<<10, 1), fill(64<<10, 2)
	writeTensor(t, a.path("t"), one)
	h1 := getx(t, a.path("t"), xattrs.IPCHandle)
	setx(t, a.path("t"), xattrs.CopyTo, "b:/x")
	requireContent(t, b.path("x"), one)
	require.EqualValues(t, 1, b.stats().Live.Imports)

	// Unlink revokes: when unlink returns, b has dropped its import.
	require.NoError(t, os.Remove(a.path("t")))
	require.Zero(t, b.stats().Live.Imports, "revoked before the unlink returned")
	a.requireLeases(0)

	// Recreated with the same size: the host backend hands back the same
	// memfd, so the handle (the "address") is the same; the allocation id
	// is not.
	writeTensor(t, a.path("t"), two)
	h2 := getx(t, a.path("t"), xattrs.IPCHandle)
	t.Logf("handle before %s, after %s (same: %v)", h1, h2, h1 == h2)
	setx(t, a.path("t"), xattrs.CopyTo, "b:/x")
	requireContent(t, b.path("x"), two)
	sb := b.stats()
	require.EqualValues(t, 2, sb.Imports.Misses, "%+v", sb.Imports)
	require.Zero(t, sb.Imports.Hits, "%+v", sb.Imports)

	// Resized past its allocation: a new allocation, the old one revoked
	// (b drops it before the truncate returns); the next copy sees the new
	// size and bytes.
	gen := getx(t, a.path("t"), xattrs.Generation)
	require.NoError(t, os.Truncate(a.path("t"), 3<<20))
	require.NotEqual(t, gen, getx(t, a.path("t"), xattrs.Generation))
	require.Zero(t, b.stats().Live.Imports, "the old allocation's import was revoked")
	f, err := os.OpenFile(a.path("t"), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("tail"), 3<<20-4)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	want := append(append(append([]byte{}, two...), make([]byte, 3<<20-len(two)-4)...), "tail"...)
	setx(t, a.path("t"), xattrs.CopyTo, "b:/x")
	requireContent(t, b.path("x"), want)
	require.EqualValues(t, 3, b.stats().Imports.Misses)

	require.NoError(t, os.Remove(a.path("t")))
	require.NoError(t, os.Remove(b.path("x")))
	a.requireClean()
	b.requireClean()
}

// TestRevocationReachesEveryImporter: a tensor imported by two peers is
// revoked at both before its unlink returns; pulls (copy_from) lease the
// same way as pushes.
func TestRevocationReachesEveryImporter(t *testing.T) {
	ds := sameHost(t, []string{"a", "b", "c"})
	a, b, c := ds["a"], ds["b"], ds["c"]
	data := fill(1<<20, 3)
	writeTensor(t, a.path("t"), data)
	setx(t, a.path("t"), xattrs.CopyTo, "b:/t")
	writeTensor(t, c.path("t"), nil)
	setx(t, c.path("t"), xattrs.CopyFrom, "a:/t")
	requireContent(t, b.path("t"), data)
	requireContent(t, c.path("t"), data)
	a.requireLeases(2, "one lease per importer")
	require.EqualValues(t, 1, b.stats().Live.Imports)
	require.EqualValues(t, 1, c.stats().Live.Imports)

	require.NoError(t, os.Remove(a.path("t")))
	require.Zero(t, b.stats().Live.Imports)
	require.Zero(t, c.stats().Live.Imports)
	a.requireClean()
	for _, d := range []*daemon{b, c} {
		require.NoError(t, os.Remove(d.path("t")))
		d.requireClean()
	}
}

// TestKilledImporterLeasesEnd: an importer killed while it holds imports
// takes its leases with it; the exporter frees without waiting, and comes
// back to baseline.
func TestKilledImporterLeasesEnd(t *testing.T) {
	ds := sameHost(t, []string{"a", "b"}, "--revoke-timeout", "20s")
	a, b := ds["a"], ds["b"]
	writeTensor(t, a.path("t"), fill(256<<10, 5))
	setx(t, a.path("t"), xattrs.CopyTo, "b:/t")
	a.requireLeases(1, "b's import")
	b.kill()
	require.Eventually(t, func() bool { return a.stats().Live.Leases == 0 }, 5*time.Second, 10*time.Millisecond,
		"the dead importer's lease ends with its connection")
	start := time.Now()
	require.NoError(t, os.Remove(a.path("t")))
	require.Less(t, time.Since(start), 2*time.Second, "no wait for a dead importer")
	a.requireClean()
}

// TestKilledExporterImportsDropped: an exporter killed while a peer holds
// imports of its memory: the peer drops them, and the exporter restarted on
// the same mountpoint comes up cleanly and serves new copies, which the
// peer imports afresh (a new instance: its allocation ids cannot alias the
// old ones).
func TestKilledExporterImportsDropped(t *testing.T) {
	ds := sameHost(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	writeTensor(t, a.path("t"), fill(256<<10, 6))
	setx(t, a.path("t"), xattrs.CopyTo, "b:/t")
	require.EqualValues(t, 1, b.stats().Live.Imports)
	a.kill()
	require.Eventually(t, func() bool { return b.stats().Live.Imports == 0 }, 5*time.Second, 10*time.Millisecond,
		"imports of a dead exporter are dropped")

	a2 := a.relaunch()
	writeTensor(t, a2.path("t"), fill(256<<10, 7))
	setx(t, a2.path("t"), xattrs.CopyTo, "b:/t")
	requireContent(t, b.path("t"), fill(256<<10, 7))
	sb := b.stats()
	require.EqualValues(t, 2, sb.Imports.Misses, "%+v", sb.Imports)
	require.NoError(t, os.Remove(a2.path("t")))
	require.NoError(t, os.Remove(b.path("t")))
	a2.requireClean()
	b.requireClean()
}

// TestSilentImporterBoundedRevoke: an importer that does not answer (stopped
// with SIGSTOP) delays a free by at most --revoke-timeout; once it runs
// again it drops what it held.
func TestSilentImporterBoundedRevoke(t *testing.T) {
	ds := sameHost(t, []string{"a", "b"}, "--revoke-timeout", "1s")
	a, b := ds["a"], ds["b"]
	writeTensor(t, a.path("t"), fill(64<<10, 8))
	setx(t, a.path("t"), xattrs.CopyTo, "b:/t")
	a.requireLeases(1, "b's import, which the free must revoke")
	b.pause()
	start := time.Now()
	require.NoError(t, os.Remove(a.path("t")))
	took := time.Since(start)
	b.resume()
	require.GreaterOrEqual(t, took, 900*time.Millisecond, "the revocation waited for the importer")
	require.Less(t, took, 2500*time.Millisecond, "bounded by --revoke-timeout")
	a.requireClean()
	a.requireLog("not released within")
	require.Eventually(t, func() bool { return b.stats().Live.Imports == 0 }, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, os.Remove(b.path("t")))
	b.requireClean()
}

// TestRevokeDuringIPCCopy: the source of an IPC pull is unlinked while the
// importer reads it: the copy completes from the pinned memory (or fails
// cleanly), and both sides end clean.
func TestRevokeDuringIPCCopy(t *testing.T) {
	ds := sameHost(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	const n = 256 << 20
	bigTensor(t, a.path("big"), n)
	writeTensor(t, b.path("big"), []byte("old"))
	done := pullWhilePinned(t, a, b.path("big"), "a:/big")
	require.NoError(t, os.Remove(a.path("big")))
	if err := <-done; err == nil {
		requireTail(t, b.path("big"), n)
	} else {
		t.Logf("copy failed cleanly: %v", err)
		requireContent(t, b.path("big"), []byte("old"))
	}
	a.requireClean()
	require.NoError(t, os.Remove(b.path("big")))
	b.requireClean()
}

// TestResizeDuringImport: the source of an IPC pull is resized (reallocated)
// while the importer reads it: the copy is the old tensor or fails cleanly,
// never a mix, and the new allocation is what the next copy sees.
func TestResizeDuringImport(t *testing.T) {
	ds := sameHost(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	const n = 128 << 20
	bigTensor(t, a.path("big"), n)
	writeTensor(t, b.path("big"), []byte("old"))
	done := pullWhilePinned(t, a, b.path("big"), "a:/big")
	require.NoError(t, os.Truncate(a.path("big"), 2*n))
	if err := <-done; err == nil {
		st, err := os.Stat(b.path("big"))
		require.NoError(t, err)
		require.Contains(t, []int64{n, 2 * n}, st.Size())
	} else {
		requireContent(t, b.path("big"), []byte("old"))
	}
	setx(t, b.path("big"), xattrs.CopyFrom, "a:/big")
	st, err := os.Stat(b.path("big"))
	require.NoError(t, err)
	require.Equal(t, int64(2*n), st.Size())
	require.NoError(t, os.Remove(a.path("big")))
	a.requireClean()
	require.NoError(t, os.Remove(b.path("big")))
	b.requireClean()
}

// TestUnlinkWhileMapped: a local process that holds a tensor open and maps
// its exported memfd keeps the memory alive past unlink (its open file is
// its lease); the memory is freed at its close.
func TestUnlinkWhileMapped(t *testing.T) {
	d := startDaemon(t, "--device", "host") // a memfd handle to map
	writeTensor(t, d.path("t"), fill(1<<20, 9))
	f, err := os.Open(d.path("t"))
	require.NoError(t, err)
	h := getx(t, d.path("t"), xattrs.IPCHandle)
	path, ok := strings.CutPrefix(h, "memfd:")
	require.True(t, ok, h)
	mf, err := os.Open(path)
	require.NoError(t, err)
	mem, err := unix.Mmap(int(mf.Fd()), 0, 1<<20, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	require.NoError(t, mf.Close())
	d.requireLeases(1, "the open file holds a lease")

	require.NoError(t, os.Remove(d.path("t")))
	s := d.stats().Live
	require.EqualValues(t, 1, s.Tensors, "alive while open")
	require.Equal(t, 1, s.Exports)
	require.True(t, bytes.Equal(fill(1<<20, 9), mem), "the mapping reads the tensor")
	require.NoError(t, f.Close())
	d.requireClean()
	require.NoError(t, unix.Munmap(mem))
}

// pullWhilePinned starts copy_from of src into dst and returns once the
// exporter a pins the source for it (the importer is reading) or the copy
// has already ended (its result, buffered, is in the channel: a GPU copies
// a few hundred MiB in well under a millisecond, so the race is then lost
// and the test checks the sequential case).
func pullWhilePinned(t *testing.T, a *daemon, dst, src string) chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- unix.Setxattr(dst, xattrs.CopyFrom, []byte(src), 0) }()
	require.Eventually(t, func() bool { return a.stats().Live.Pins > 0 || len(done) > 0 }, 10*time.Second, time.Millisecond)
	if len(done) > 0 {
		t.Log("the copy ended before its pin was seen")
	}
	return done
}

// bigTensor makes a tensor of n zero bytes ending in "tail".
func bigTensor(t *testing.T, path string, n int64) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, nil, 0o644))
	require.NoError(t, os.Truncate(path, n))
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("tail"), n-4)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// requireTail checks that the n-byte tensor at path ends in "tail".
func requireTail(t *testing.T, path string, n int64) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 4)
	_, err = f.ReadAt(buf, n-4)
	require.NoError(t, err)
	require.Equal(t, "tail", string(buf))
}

// TestCopyCommitNotStuckBehindSourceLock: `rm` of a copy's source, in the
// directory the copy commits into, takes that directory's lock and then
// waits for the source's, which the kernel holds for the copy_to setxattr;
// the copy's rename into place through the mount needs the directory's
// lock. Neither may wait forever: past a bound the copy puts its tensor in
// place inside the daemon (logged), and both calls return.
func TestCopyCommitNotStuckBehindSourceLock(t *testing.T) {
	// Host memory: rm must come while the copy runs, and a GPU copies 1 GiB
	// in well under the time rm takes to start.
	d := startDaemon(t, "--device", "host")
	dir := d.path("dir")
	require.NoError(t, os.Mkdir(dir, 0o755))
	src := dir + "/src"
	const n = 1 << 30
	bigTensor(t, src, n)

	copied := make(chan error, 1)
	start := time.Now()
	go func() {
		err := unix.Setxattr(src, xattrs.CopyTo, []byte("/dir/dst"), 0)
		t.Logf("copy_to returned after %v", time.Since(start))
		copied <- err
	}()
	require.Eventually(t, func() bool { return d.stats().Transfers.Active > 0 || len(copied) > 0 }, 10*time.Second, time.Millisecond)
	removed := make(chan error, 1)
	t.Logf("rm at %v", time.Since(start))
	go func() {
		err := os.Remove(src)
		t.Logf("rm returned after %v", time.Since(start))
		removed <- err
	}()
	for name, ch := range map[string]chan error{"copy_to": copied, "rm": removed} {
		select {
		case err := <-ch:
			require.NoError(t, err, name)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s still blocked after 20 s: the copy's commit and rm wait on each other\n%s", name, d.log.String())
		}
	}
	requireTail(t, dir+"/dst", n)
	_, err := os.Stat(src)
	require.True(t, os.IsNotExist(err), "%v", err)
	// rm began once the copy ran (the kernel held the source's lock), so it
	// held the directory when the copy committed: the fallback must have run.
	d.requireLog("stayed locked")
	require.NoError(t, os.Remove(dir+"/dst"))
	d.requireClean()
}
