package tests

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/internal/testutil"
)

// TestMountFlagsEitherSide: flags may come before or after the mountpoint.
func TestMountFlagsEitherSide(t *testing.T) {
	d := startDaemon(t) // flags after: see startDaemon
	d.stop()
	mnt := t.TempDir()
	ours.Store(mnt, true)
	cmd := daemonCommand(bin, "mount", "--max-memory", "32MiB", "--device", "host", mnt)
	log := &testutil.SyncBuffer{}
	cmd.Stderr = log
	require.NoError(t, cmd.Start())
	waitReady(t, mnt, log)
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(mnt, &st))
	require.EqualValues(t, 32<<20, st.Blocks*uint64(st.Bsize))
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait(), "SIGINT exits 0")
	require.False(t, mounted(mnt))
}

// TestStartFailuresOneLine: a failure to start exits non-zero with one clear
// line and leaves no mount. (A missing argument prints its usage too:
// TestCLIMissingArgumentUsage.)
func TestStartFailuresOneLine(t *testing.T) {
	mnt := t.TempDir()
	file := mnt + "/plain"
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	busy, err := net.Listen("tcp", "127.0.0.1:0") // a port in use
	require.NoError(t, err)
	defer busy.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mount", mnt, "--max-memory", "banana"}, "--max-memory"},
		{[]string{"mount", mnt, "--device", "cuda:99"}, "cuda:99"},
		{[]string{"mount", mnt, "--device", "tpu"}, "tpu"},
		{[]string{"mount", mnt + "/missing"}, "missing"},
		{[]string{"mount", file}, "not a directory"},
		{[]string{"mount", mnt, "--no-such-flag"}, "no-such-flag"},
		// Past the devices' opening (whose choice is logged only once the
		// daemon has started).
		{[]string{"mount", mnt, "--device", "auto", "--listen", busy.Addr().String()}, busy.Addr().String()},
	} {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		require.Error(t, err, "%v", tc.args)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		require.Len(t, lines, 1, "%v: %s", tc.args, out)
		require.Contains(t, lines[0], tc.want, "%v", tc.args)
		require.True(t, strings.HasPrefix(lines[0], "tensorfs: "), "%q", lines[0])
		require.False(t, mounted(mnt))
	}
}

// TestStaleMountCleanedUp: a daemon killed with SIGKILL leaves a dead mount;
// the next mount on the same directory cleans it up and serves.
func TestStaleMountCleanedUp(t *testing.T) {
	mnt := t.TempDir()
	ours.Store(mnt, true)
	cmd := daemonCommand(bin, "mount", mnt)
	log := &testutil.SyncBuffer{}
	cmd.Stderr = log
	require.NoError(t, cmd.Start())
	// Killed before it is ready (while go-fuse's poll probe of its own
	// mount is in flight), a daemon can be left a zombie the kernel never
	// reaps: a thread waits for an answer only the dead daemon could give.
	waitReady(t, mnt, log)
	require.NoError(t, os.WriteFile(mnt+"/x", []byte("data"), 0o644))
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait()
	_, err := os.Stat(mnt)
	require.ErrorIs(t, err, syscall.ENOTCONN, "a killed daemon leaves a dead mount")

	again := daemonCommand(bin, "mount", mnt)
	log2 := &testutil.SyncBuffer{}
	again.Stderr = log2
	require.NoError(t, again.Start())
	defer func() {
		again.Process.Signal(syscall.SIGTERM)
		again.Wait()
	}()
	// Ready when it says so: a stat that finds no file is no sign, since
	// the plain directory answers ENOENT too between the stale mount's
	// detach and the new mount (a write there then failed in CI).
	waitReady(t, mnt, log2)
	_, err = os.Stat(mnt + "/.probe")
	require.ErrorIs(t, err, os.ErrNotExist, "the restarted daemon serves")
	require.NoError(t, os.WriteFile(mnt+"/y", []byte("fresh"), 0o644))
	data, err := os.ReadFile(mnt + "/y")
	require.NoError(t, err)
	require.Equal(t, "fresh", string(data))
	require.NoError(t, os.Remove(mnt+"/y"))
}

// TestUnmountCommand: `tensorfs unmount` ends the daemon with exit 0, and
// returns only once the daemon has exited (freed everything): the daemon's
// process is a zombie, or gone, when it returns.
func TestUnmountCommand(t *testing.T) {
	d := startDaemon(t)
	require.NoError(t, os.WriteFile(d.path("t"), []byte("x"), 0o644))
	require.Equal(t, d.cmd.Process.Pid, d.stats().PID, "stats' pid is the daemon's")
	out, err := exec.Command(bin, "unmount", d.mnt).CombinedOutput()
	require.NoError(t, err, "%s", out)
	if f := d.procStat(); f != nil {
		// Its parent (this test) has not reaped it yet, or it runs on.
		require.Equal(t, "Z", f[0], "the daemon still runs after unmount returned: %v", f)
	}
	select {
	case err := <-d.exit:
		require.NoError(t, err, d.log.String())
		d.state = "stopped"
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not exit after unmount")
	}
	require.False(t, mounted(d.mnt))
	out, err = exec.Command(bin, "unmount", d.mnt).CombinedOutput()
	require.Error(t, err, "unmounting what is not mounted fails")
	require.Contains(t, string(out), "tensorfs: unmount")
}

// TestHelpAndVersion: --help documents the mount flags; version prints.
func TestHelpAndVersion(t *testing.T) {
	out, err := exec.Command(bin, "mount", "--help").CombinedOutput()
	require.NoError(t, err)
	for _, f := range []string{"--device", "--max-memory", "--allow-other", "--log-format", "--log-level", "--config"} {
		require.Contains(t, string(out), f)
	}
	out, err = exec.Command(bin, "version").CombinedOutput()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(out), "tensorfs "), "%s", out)
}

// waitReady waits until the daemon whose stderr is log has mounted mnt and
// says it is ready ("mounted ..."): the mount appears in /proc/mounts
// before the daemon has finished starting (go-fuse then probes the mount
// with a poll of its own; the spec's ready daemon is the one that logged).
func waitReady(t *testing.T, mnt string, log *testutil.SyncBuffer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !mounted(mnt) || !strings.Contains(log.String(), "mounted ") {
		require.True(t, time.Now().Before(deadline), "mount %s did not appear; log:\n%s", mnt, log.String())
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTermWhileBusy: SIGTERM while a process has its cwd in the mount still
// ends the daemon with exit 0 (lazy detach, bounded wait) and no mount left.
func TestTermWhileBusy(t *testing.T) {
	d := startDaemon(t)
	require.NoError(t, os.WriteFile(d.path("t"), []byte("x"), 0o644))
	busy := exec.Command("sleep", "30")
	busy.Dir = d.mnt
	require.NoError(t, busy.Start())
	defer func() { busy.Process.Kill(); busy.Wait() }()
	start := time.Now()
	d.stop()
	require.Less(t, time.Since(start), 10*time.Second)
	require.False(t, mounted(d.mnt))
}

// TestMountOverLiveMountRefused: a second daemon on a live mountpoint is
// refused and the first keeps serving its tensors.
func TestMountOverLiveMountRefused(t *testing.T) {
	d := startDaemon(t)
	require.NoError(t, os.WriteFile(d.path("keep"), []byte("mine"), 0o644))
	out, err := exec.Command(bin, "mount", d.mnt).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "already mounted by a live tensorfs daemon")
	require.Len(t, strings.Split(strings.TrimSpace(string(out)), "\n"), 1, "%s", out)
	data, err := os.ReadFile(d.path("keep"))
	require.NoError(t, err)
	require.Equal(t, "mine", string(data))
	require.NoError(t, os.Remove(d.path("keep")))
	d.requireClean()
}

// TestLogPipeClosed: a daemon whose log reader has gone (its stderr a pipe
// with no reader: a log collector that died) goes on serving through lines
// it cannot write, and still unmounts and exits 0 on SIGTERM. Before, the
// first line after the reader went (here "stopping") killed it with
// SIGPIPE and left a dead mount.
func TestLogPipeClosed(t *testing.T) {
	mnt := t.TempDir()
	ours.Store(mnt, true)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd := daemonCommand(bin, "mount", "--device", "host", mnt)
	cmd.Stdout, cmd.Stderr = w, w
	require.NoError(t, cmd.Start())
	w.Close()
	log := &testutil.SyncBuffer{}
	copied := make(chan struct{})
	go func() { io.Copy(log, r); close(copied) }()
	waitReady(t, mnt, log)
	r.Close() // the reader goes: every later line meets a broken pipe
	<-copied
	f := filepath.Join(mnt, "t")
	require.NoError(t, os.WriteFile(f, []byte("x"), 0o644))
	// A refusal is logged (at info): the daemon lives through it.
	require.Error(t, unix.Setxattr(f, "user.tensorfs.dtype", []byte("nosuch"), 0))
	got, err := os.ReadFile(f)
	require.NoError(t, err)
	require.Equal(t, "x", string(got))
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit after SIGTERM with its log gone")
	require.False(t, mounted(mnt), "the mount is gone")
}
