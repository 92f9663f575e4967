package tests

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// secretFile writes a 0600 secret file and returns its path.
func secretFile(t testing.TB, secret string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(p, []byte(secret+"\n"), 0o600))
	return p
}

// cluster starts named daemons that know each other, all with the same
// secret, each with extra flags.
func cluster(t testing.TB, names []string, extra ...string) map[string]*daemon {
	t.Helper()
	return clusterOf(t, names, nil, extra...)
}

// clusterOf is cluster with the flags of own added to each named daemon's.
func clusterOf(t testing.TB, names []string, own map[string][]string, extra ...string) map[string]*daemon {
	t.Helper()
	ports := map[string]int{}
	for _, n := range names {
		ports[n] = testutil.FreePort(t)
	}
	secret := secretFile(t, "a shared secret of enough bytes")
	ds := map[string]*daemon{}
	for _, n := range names {
		flags := []string{"--name", n, "--listen", fmt.Sprintf("127.0.0.1:%d", ports[n]), "--secret-file", secret, "--host-id", "host-" + n, "--timeout", "3s"}
		for _, o := range names {
			if o != n {
				flags = append(flags, "--peer", fmt.Sprintf("%s=127.0.0.1:%d", o, ports[o]))
			}
		}
		ds[n] = startDaemon(t, append(append(flags, extra...), own[n]...)...)
	}
	return ds
}

// kill ends a daemon with SIGKILL and lazily unmounts its dead mount.
func (d *daemon) kill() {
	d.cmd.Process.Kill()
	select {
	case <-d.exit:
	case <-time.After(10 * time.Second):
		// A thread of the killed daemon waits in the kernel for a FUSE
		// answer only the daemon could give (a request it had read on its
		// own mount): the process is never reaped until the connection is
		// aborted.
		d.t.Logf("killed daemon not reaped after 10 s; aborting its FUSE connection %d", d.conn)
		d.abortFUSE()
		<-d.exit
	}
	d.state = "stopped"
	syscall.Unmount(d.mnt, syscall.MNT_DETACH)
}

// abortFUSE aborts d's FUSE connection through fusectl, mounting fusectl
// at /sys/fs/fuse/connections first where it is not (it was not on the
// repository's VM, and the abort then did nothing: a daemon stuck on its
// own mount stayed stuck, and so did the test).
func (d *daemon) abortFUSE() {
	abort := fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", d.conn)
	if _, err := os.Stat(abort); err != nil {
		if err := unix.Mount("none", "/sys/fs/fuse/connections", "fusectl", 0, ""); err != nil {
			d.t.Logf("mount fusectl: %v", err)
		}
	}
	if err := os.WriteFile(abort, []byte("1"), 0); err != nil {
		d.t.Logf("abort FUSE connection %d: %v", d.conn, err)
	}
}

// pause stops a daemon with SIGSTOP and returns once every one of its
// threads is stopped. kill(2) only queues a group stop: each thread stops
// when it next runs, so on a busy machine a thread woken by a socket could
// still answer a request sent right after the signal (a revocation took 2 ms
// against a "stopped" importer in CI).
func (d *daemon) pause() {
	d.t.Helper()
	pid := d.cmd.Process.Pid
	require.NoError(d.t, d.cmd.Process.Signal(syscall.SIGSTOP))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		running, err := runningThreads(pid)
		require.NoError(d.t, err)
		if len(running) == 0 {
			return
		}
		require.True(d.t, time.Now().Before(deadline), "threads of daemon %d not stopped after SIGSTOP: %v", pid, running)
	}
}

// resume continues a daemon stopped by pause.
func (d *daemon) resume() {
	d.cmd.Process.Signal(syscall.SIGCONT)
}

// runningThreads lists the threads of pid not in a stopped state ('T'),
// as "tid:state" from /proc/PID/task/TID/stat (proc(5): the state is the
// field after the parenthesised command name).
func runningThreads(pid int) ([]string, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var running []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue // the thread exited
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return nil, fmt.Errorf("%s/%s/stat: no state in %q", dir, e.Name(), b)
		}
		if st := b[i+2]; st != 'T' {
			running = append(running, e.Name()+":"+string(st))
		}
	}
	return running, nil
}

func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestPeerCopies: push and pull of files and directory trees between two
// daemons; the destination gets the source's dtype and shape; an existing
// destination is replaced whatever its size; copies are counted.
func TestPeerCopies(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	mkTemplateDir(t, a.path("kv"), "BF16", "16,8")
	data := fill(256, 3)
	require.NoError(t, os.WriteFile(a.path("kv/blk"), data, 0o644))
	require.NoError(t, os.Mkdir(b.path("kv"), 0o755))

	// Push a file, then again over an existing destination of another size.
	setx(t, a.path("kv/blk"), xattrs.CopyTo, "b:/kv/blk")
	got, err := os.ReadFile(b.path("kv/blk"))
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.Equal(t, "BF16", getx(t, b.path("kv/blk"), xattrs.DType))
	require.Equal(t, "16,8", getx(t, b.path("kv/blk"), xattrs.Shape))
	require.NoError(t, os.WriteFile(b.path("kv/other"), make([]byte, 1000), 0o644))
	setx(t, a.path("kv/blk"), xattrs.CopyTo, "b:/kv/other")
	got, err = os.ReadFile(b.path("kv/other"))
	require.NoError(t, err)
	require.Equal(t, data, got, "replaced whatever its size")

	// Pull into an existing file (copy_from: the target adopts the new data).
	require.NoError(t, os.WriteFile(b.path("kv/new"), fill(64, 9), 0o644))
	require.NoError(t, os.WriteFile(a.path("pulled"), []byte("old"), 0o644))
	f, err := os.Open(a.path("pulled")) // an open reader keeps working
	require.NoError(t, err)
	setx(t, a.path("pulled"), xattrs.CopyFrom, "b:/kv/new")
	got, err = os.ReadFile(a.path("pulled"))
	require.NoError(t, err)
	require.Equal(t, fill(64, 9), got)
	require.NoError(t, f.Close())

	// A tree of 1000 small tensors in one directory copy, there and back.
	mkTemplateDir(t, a.path("tree"), "F32", "16")
	for i := 0; i < 1000; i++ {
		sub := a.path("tree", fmt.Sprintf("l%d", i%10))
		os.Mkdir(sub, 0o755)
		require.NoError(t, os.WriteFile(filepath.Join(sub, fmt.Sprintf("t%03d", i)), fill(64, byte(i)), 0o644))
	}
	setx(t, a.path("tree"), xattrs.CopyTo, "b:/tree")
	for _, i := range []int{0, 1, 517, 999} {
		got, err := os.ReadFile(b.path("tree", fmt.Sprintf("l%d", i%10), fmt.Sprintf("t%03d", i)))
		require.NoError(t, err)
		require.Equal(t, fill(64, byte(i)), got, "tensor %d", i)
	}
	n := 0
	filepath.Walk(b.path("tree"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n++
		}
		return nil
	})
	require.Equal(t, 1000, n)
	require.NoError(t, os.Mkdir(a.path("back"), 0o755))
	setx(t, a.path("back"), xattrs.CopyFrom, "b:/tree")
	got, err = os.ReadFile(a.path("back/l7/t517"))
	require.NoError(t, err)
	require.Equal(t, fill(64, byte(517%256)), got)

	sa, sb := a.stats(), b.stats()
	// a: two file pushes, a file pull, a tree push, a tree pull; b served them.
	require.EqualValues(t, 5, sa.Copies.TCP, "%v", sa.Copies)
	require.EqualValues(t, 5, sb.Copies.TCP, "%v", sb.Copies)
	require.Zero(t, sa.Transfers.Active)

	for _, d := range []*daemon{a, b} {
		for _, p := range []string{"kv", "tree", "back", "pulled"} {
			os.RemoveAll(d.path(p))
		}
		d.requireClean()
	}
}

// TestPeerArrivalNotifies: the final rename on the destination is a real
// rename on that mount, so an inotify watcher sees IN_MOVED_TO.
func TestPeerArrivalNotifies(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	require.NoError(t, os.WriteFile(a.path("t"), fill(4096, 1), 0o644))
	require.NoError(t, os.Mkdir(b.path("in"), 0o755))
	events := watchDir(t, b.path("in"), unix.IN_MOVED_TO)
	setx(t, a.path("t"), xattrs.CopyTo, "b:/in/arrived")
	names := movedTo(events(5 * time.Second))
	require.Equal(t, []string{"arrived"}, names)
	require.NoError(t, os.Remove(a.path("t")))
	require.NoError(t, os.RemoveAll(b.path("in")))
	a.requireClean()
	b.requireClean()
}

// TestLocalCopies: a path with no NAME: copies inside this mount, device to
// device; onto itself or into its own subtree is EINVAL (a rename over the
// file whose xattr is being set would hang); a file onto a directory EISDIR.
func TestLocalCopies(t *testing.T) {
	d := startDaemon(t)
	mkTemplateDir(t, d.path("w"), "I32", "8")
	require.NoError(t, os.WriteFile(d.path("w/x"), fill(32, 5), 0o644))
	setx(t, d.path("w/x"), xattrs.CopyTo, "/w/y")
	got, err := os.ReadFile(d.path("w/y"))
	require.NoError(t, err)
	require.Equal(t, fill(32, 5), got)
	require.NoError(t, os.WriteFile(d.path("z"), nil, 0o644))
	setx(t, d.path("z"), xattrs.CopyFrom, "/w/x")
	got, err = os.ReadFile(d.path("z"))
	require.NoError(t, err)
	require.Equal(t, fill(32, 5), got)
	require.Equal(t, "I32", getx(t, d.path("z"), xattrs.DType))
	setx(t, d.path("w"), xattrs.CopyTo, "/w2")
	got, err = os.ReadFile(d.path("w2/y"))
	require.NoError(t, err)
	require.Equal(t, fill(32, 5), got)

	set := func(p, name, v string) error { return unix.Setxattr(p, name, []byte(v), 0) }
	require.ErrorIs(t, set(d.path("w/x"), xattrs.CopyTo, "/w/x"), syscall.EINVAL)
	require.ErrorIs(t, set(d.path("w/x"), xattrs.CopyFrom, "/w/x"), syscall.EINVAL)
	require.ErrorIs(t, set(d.path("w"), xattrs.CopyTo, "/w/sub"), syscall.EINVAL)
	require.ErrorIs(t, set(d.path("w/x"), xattrs.CopyTo, "/w2"), syscall.EISDIR)
	require.ErrorIs(t, set(d.path("w/x"), xattrs.CopyTo, "/missing/x"), syscall.ENOENT)
	require.ErrorIs(t, set(d.path("z"), xattrs.CopyFrom, "/missing"), syscall.ENOENT)
	require.EqualValues(t, 3, d.stats().Copies.Local)
	for _, p := range []string{"w", "w2", "z"} {
		require.NoError(t, os.RemoveAll(d.path(p)))
	}
	d.requireClean()
}

// TestPeerRefusals: wrong secret, unknown peer, a peer that is down, bad
// start-up configurations.
func TestPeerRefusals(t *testing.T) {
	pb := testutil.FreePort(t)
	b := startDaemon(t, "--name", "b", "--listen", fmt.Sprintf("127.0.0.1:%d", pb), "--secret-file", secretFile(t, "the right secret, long enough"))
	a := startDaemon(t, "--name", "a", "--secret-file", secretFile(t, "a wrong secret, also long enough"),
		"--peer", fmt.Sprintf("b=127.0.0.1:%d", pb), "--peer", fmt.Sprintf("down=127.0.0.1:%d", testutil.FreePort(t)), "--timeout", "2s")
	require.NoError(t, os.WriteFile(a.path("t"), fill(100, 1), 0o644))
	set := func(v string) error { return unix.Setxattr(a.path("t"), xattrs.CopyTo, []byte(v), 0) }
	require.ErrorIs(t, set("b:/t"), syscall.EACCES)
	require.ErrorIs(t, set("nobody:/t"), syscall.ENOENT)
	require.ErrorIs(t, set("down:/t"), syscall.ECONNREFUSED)
	_, err := os.Stat(b.path("t"))
	require.ErrorIs(t, err, syscall.ENOENT, "nothing arrived")
	// Both sides say what is wrong, naming both nodes (a's log blamed b
	// alone, and b's showed only an EOF).
	a.requireLog("node a and peer b at 127.0.0.1:")
	a.requireLog("hold different shared secrets")
	b.requireLog("node b and peer a at ")
	b.requireLog("(refused by a)")
	// A node with no secret at all (allowed on loopback): both sides say
	// which one has none.
	c := startDaemon(t, "--name", "c", "--peer", fmt.Sprintf("b=127.0.0.1:%d", pb), "--timeout", "2s")
	require.NoError(t, os.WriteFile(c.path("t"), fill(100, 1), 0o644))
	require.ErrorIs(t, unix.Setxattr(c.path("t"), xattrs.CopyTo, []byte("b:/t"), 0), syscall.EACCES)
	c.requireLog("node c has no shared secret (--secret-file) and peer b at 127.0.0.1:")
	b.requireLog("peer c at ")
	b.requireLog("has no shared secret (--secret-file) and node b has one")
	require.NoError(t, os.Remove(c.path("t")))
	c.requireClean()
	require.NoError(t, os.Remove(a.path("t")))
	a.requireClean()
	b.requireClean()

	mnt := t.TempDir()
	loose := filepath.Join(t.TempDir(), "loose")
	require.NoError(t, os.WriteFile(loose, []byte("a secret of enough bytes\n"), 0o644))
	short := secretFile(t, "short")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:0"}, "no --secret-file"},
		{[]string{"--secret-file", loose}, "readable by group or others"},
		{[]string{"--secret-file", short}, "at least 16"},
		{[]string{"--peer", "nonsense"}, "NAME=HOST:PORT"},
		{[]string{"--peer", "b=nohost"}, `"nohost" is not HOST:PORT`},
	} {
		out, err := runCmd(bin, append([]string{"mount", mnt}, tc.args...)...)
		require.Error(t, err, "%v", tc.args)
		require.Contains(t, out, tc.want)
		require.False(t, mounted(mnt))
	}
}

// TestPeerKilledMidCopy: a destination killed in the middle of a 1 GiB push,
// and a source killed in the middle of a 1 GiB pull, fail the setfattr within
// the timeout, leave the surviving side's destination as it was (no
// temporary visible), and leak nothing there.
func TestPeerKilledMidCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 1 GiB twice; not in -short")
	}
	for _, victim := range []string{"destination", "source"} {
		t.Run(victim, func(t *testing.T) {
			ds := cluster(t, []string{"a", "b"})
			a, b := ds["a"], ds["b"]
			big := b.path("big")
			if victim == "destination" {
				big = a.path("big")
			}
			require.NoError(t, os.WriteFile(big, nil, 0o644))
			require.NoError(t, os.Truncate(big, 1<<30))
			require.NoError(t, os.WriteFile(a.path("keep"), []byte("unchanged"), 0o644))
			base := a.settledLive()
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				if victim == "destination" {
					done <- unix.Setxattr(a.path("big"), xattrs.CopyTo, []byte("b:/big"), 0)
				} else {
					done <- unix.Setxattr(a.path("keep"), xattrs.CopyFrom, []byte("b:/big"), 0)
				}
			}()
			// Kill b once bytes are moving.
			require.Eventually(t, func() bool {
				s := a.stats()
				for _, r := range s.Transfers.Recent {
					if r.BytesDone == 0 {
						return false
					}
				}
				return len(s.Transfers.Recent) > 0
			}, 10*time.Second, time.Millisecond)
			b.kill()
			select {
			case err := <-done:
				require.Error(t, err)
			case <-time.After(15 * time.Second):
				t.Fatal("setfattr did not fail within 15 s of the peer's death")
			}
			require.Less(t, time.Since(start), 20*time.Second)
			data, err := os.ReadFile(a.path("keep"))
			require.NoError(t, err)
			require.Equal(t, "unchanged", string(data))
			ents, err := os.ReadDir(a.mnt)
			require.NoError(t, err)
			for _, e := range ents {
				require.False(t, strings.HasPrefix(e.Name(), ".tensorfs-tmp"), "temporary %s left", e.Name())
			}
			require.Eventually(t, func() bool { return a.stats().Live == base }, 5*time.Second, 20*time.Millisecond,
				"a's stats back to its baseline %+v: %+v", base, a.stats().Live)
			os.Remove(a.path("keep"))
			os.Remove(a.path("big"))
			a.requireClean()
		})
	}
}

// TestBatch: one batch xattr on the root pushes many tensors to two peers
// (one pipelined transfer per peer) and copies locally.
func TestBatch(t *testing.T) {
	ds := cluster(t, []string{"a", "b", "c"})
	a := ds["a"]
	mkTemplateDir(t, a.path("kv"), "U8", "100")
	for _, n := range []string{"b", "c"} {
		// A line's parent must exist, as a copy_to's does
		// (TestInPlaceRefusalsSeveralPeers).
		require.NoError(t, os.Mkdir(ds[n].path("batch"), 0o755))
	}
	var lines []string
	for i := 0; i < 20; i++ {
		require.NoError(t, os.WriteFile(a.path("kv", fmt.Sprint(i)), fill(100, byte(i)), 0o644))
		peer := "b"
		if i%2 == 1 {
			peer = "c"
		}
		lines = append(lines, fmt.Sprintf("/kv/%d %s:/batch/%d", i, peer, i))
	}
	lines = append(lines, "/kv/0 /local0")
	setx(t, a.mnt, xattrs.Batch, strings.Join(lines, "\n"))
	for i := 0; i < 20; i++ {
		peer := ds["b"]
		if i%2 == 1 {
			peer = ds["c"]
		}
		got, err := os.ReadFile(peer.path("batch", fmt.Sprint(i)))
		require.NoError(t, err)
		require.True(t, bytes.Equal(fill(100, byte(i)), got), "tensor %d", i)
	}
	got, err := os.ReadFile(a.path("local0"))
	require.NoError(t, err)
	require.Equal(t, fill(100, 0), got)
	require.EqualValues(t, 2, a.stats().Copies.TCP, "one transfer per peer")
	os.RemoveAll(a.path("kv"))
	os.Remove(a.path("local0"))
	for _, n := range []string{"b", "c"} {
		os.RemoveAll(ds[n].path("batch"))
		ds[n].requireClean()
	}
	a.requireClean()
}

// TestPeerIPCSameHost: two daemons with the same host id copy host tensors
// through the exporter's memfd (path "ipc"): no tensor bytes on the socket.
// Push, pull and a tree; the exporter's pins and leases end with the copy.
func TestPeerIPCSameHost(t *testing.T) {
	pa, pb := testutil.FreePort(t), testutil.FreePort(t)
	secret := secretFile(t, "a shared secret of enough bytes")
	common := []string{"--secret-file", secret, "--host-id", "one-host", "--timeout", "3s"}
	a := startDaemon(t, append([]string{"--name", "a", "--listen", fmt.Sprintf("127.0.0.1:%d", pa), "--peer", fmt.Sprintf("b=127.0.0.1:%d", pb)}, common...)...)
	b := startDaemon(t, append([]string{"--name", "b", "--listen", fmt.Sprintf("127.0.0.1:%d", pb), "--peer", fmt.Sprintf("a=127.0.0.1:%d", pa)}, common...)...)
	data := fill(3<<20+17, 4)
	require.NoError(t, os.WriteFile(a.path("t"), data, 0o644))
	setx(t, a.path("t"), xattrs.CopyTo, "b:/t")
	got, err := os.ReadFile(b.path("t"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))

	require.NoError(t, os.WriteFile(b.path("u"), fill(5000, 8), 0o644))
	require.NoError(t, os.WriteFile(a.path("u"), nil, 0o644))
	setx(t, a.path("u"), xattrs.CopyFrom, "b:/u")
	got, err = os.ReadFile(a.path("u"))
	require.NoError(t, err)
	require.Equal(t, fill(5000, 8), got)

	mkTemplateDir(t, a.path("tree"), "F16", "64")
	for i := 0; i < 50; i++ {
		require.NoError(t, os.WriteFile(a.path("tree", fmt.Sprint(i)), fill(128, byte(i)), 0o644))
	}
	setx(t, a.path("tree"), xattrs.CopyTo, "b:/tree")
	got, err = os.ReadFile(b.path("tree/42"))
	require.NoError(t, err)
	require.Equal(t, fill(128, 42), got)

	// Leases are exact once the writers' handles are released (after close).
	sa, sb := a.requireLeases(51, "b's imports of t and the 50 tree tensors"), b.requireLeases(1, "a's import of u")
	require.EqualValues(t, 3, sa.Copies.IPC, "%v", sa.Copies)
	require.Zero(t, sa.Copies.TCP, "%v", sa.Copies)
	require.EqualValues(t, 3, sb.Copies.IPC, "%v", sb.Copies)
	require.Zero(t, sa.Live.Pins, "pins end with the copy")
	for _, st := range []xattrs.Stats{sa, sb} {
		require.Zero(t, st.Transfers.Active, "every transfer record ended")
		for _, r := range st.Transfers.Recent {
			require.Equal(t, "ipc", r.Path, "no record of another path: %+v", r)
		}
	}
	// Imports stay cached, leased by their exporter, one import per
	// allocation (on host memory one per tensor; a GPU backend carves small
	// tensors from shared arenas): b holds those of t and the 50 tree
	// tensors of a, a holds u's of b. Leases are per export (tensor).
	allocs := map[string]bool{getx(t, a.path("t"), xattrs.IPCHandle): true}
	for i := 0; i < 50; i++ {
		allocs[getx(t, a.path("tree", fmt.Sprint(i)), xattrs.IPCHandle)] = true
	}
	require.EqualValues(t, len(allocs), sb.Live.Imports, "%+v", sb.Live)
	require.EqualValues(t, 1, sa.Live.Imports, "%+v", sa.Live)
	require.EqualValues(t, 51, sa.Live.Leases, "%+v", sa.Live)
	require.EqualValues(t, 1, sb.Live.Leases, "%+v", sb.Live)
	require.EqualValues(t, len(allocs), sb.Imports.Misses)

	// Copying t again reuses b's import (a hit), and sees new bytes.
	f, err := os.OpenFile(a.path("t"), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("fresh"), 100)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	copy(data[100:], "fresh")
	setx(t, a.path("t"), xattrs.CopyTo, "b:/t2")
	got, err = os.ReadFile(b.path("t2"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	sb = b.stats()
	require.EqualValues(t, 51-len(allocs)+1, sb.Imports.Hits, "%+v", sb.Imports)
	require.EqualValues(t, len(allocs), sb.Imports.Misses, "%+v", sb.Imports)

	for _, d := range []*daemon{a, b} {
		os.Remove(d.path("t"))
		os.Remove(d.path("t2"))
		os.Remove(d.path("u"))
		os.RemoveAll(d.path("tree"))
	}
	// Unlinking the sources revoked the imports: both sides are clean.
	a.requireClean()
	b.requireClean()
}

// TestPeerSourceUnlinkedDuringCopy: a source unlinked while its push runs is
// copied from the still-open data, and its memory is freed after.
func TestPeerSourceUnlinkedDuringCopy(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	src := a.path("big")
	require.NoError(t, os.WriteFile(src, nil, 0o644))
	require.NoError(t, os.Truncate(src, 512<<20))
	f, err := os.OpenFile(src, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("head"), 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("tail"), 512<<20-4)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	done := make(chan error, 1)
	go func() { done <- unix.Setxattr(src, xattrs.CopyTo, []byte("b:/big"), 0) }()
	require.Eventually(t, func() bool {
		for _, r := range a.stats().Transfers.Recent {
			if r.Dst == "b:/big" && r.BytesDone != 0 {
				return true
			}
		}
		return false
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, os.Remove(src))
	require.NoError(t, <-done, "the copy completes from the still-open data")
	g, err := os.Open(b.path("big"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = g.ReadAt(buf, 0)
	require.NoError(t, err)
	require.Equal(t, "head", string(buf))
	_, err = g.ReadAt(buf, 512<<20-4)
	require.NoError(t, err)
	require.Equal(t, "tail", string(buf))
	require.NoError(t, g.Close())
	require.NoError(t, os.Remove(b.path("big")))
	a.requireClean()
	b.requireClean()
}

// TestAbortFUSE: the harness's way out of a daemon stuck on its own mount
// works where fusectl is not mounted: abortFUSE mounts it and aborts the
// connection (the mount then answers ENOTCONN), and the daemon can be
// killed and reaped.
func TestAbortFUSE(t *testing.T) {
	d := startDaemon(t)
	unix.Unmount("/sys/fs/fuse/connections", 0) // as on a machine without it
	d.abortFUSE()
	_, err := os.Stat(fmt.Sprintf("/sys/fs/fuse/connections/%d", d.conn))
	require.NoError(t, err, "fusectl mounted again")
	_, err = os.Stat(d.path("x"))
	require.ErrorIs(t, err, syscall.ENOTCONN, "the aborted mount answers ENOTCONN")
	d.kill()
}
