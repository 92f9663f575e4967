// Package tests mounts the real tensorfs binary and drives it the way users do:
// syscalls, xattrs, shell tools and the CLI. Every test ends with the daemon's
// live stats at zero, its fd count back at its baseline, and no mount left.
package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/fs"
	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// bin is the tensorfs binary under test: $TENSORFS_BIN, or built once here
// (with UCX when this test binary has it: ucxBuild).
var bin string

func TestMain(m *testing.M) {
	if os.Getenv(echoPeerEnv) != "" {
		os.Exit(echoPeer())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	cleanStaleMounts(true)
	bin = os.Getenv("TENSORFS_BIN")
	if bin == "" {
		dir, err := os.MkdirTemp("", "tensorfs-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "tensorfs")
		args := []string{"build", "-o", bin}
		env := append(os.Environ(), "CGO_ENABLED=0")
		if raceEnabled {
			args = append(args, "-race")
			env = append(os.Environ(), "CGO_ENABLED=1")
		}
		if ucxBuild {
			args = append(args, "-tags", "ucx")
			env = append(os.Environ(), "CGO_ENABLED=1")
		}
		build := exec.Command("go", append(args, "../cmd/tensorfs")...)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		build.Env = env
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building tensorfs:", err)
			return 1
		}
	}
	code := m.Run()
	if left := cleanStaleMounts(false); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: tests left mounts behind: %v\n", left)
		return 1
	}
	return code
}

// ours records the mountpoints this test process made, so that the check at
// the end looks only at those (other test runs may be mounting beside us).
var ours sync.Map

// cleanStaleMounts lazily unmounts FUSE mounts of tensorfs and returns them:
// dead ones (a killed daemon's: stat fails with ENOTCONN) when stale is true,
// else those this process made and left behind.
func cleanStaleMounts(stale bool) []string {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	var left []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && strings.HasPrefix(f[2], "fuse") && strings.HasPrefix(f[0], "tensorfs") {
			if stale {
				// Dead or hung mounts are cleaned (a hung one is aborted:
				// a plain stat of it would hang this test run too).
				if fs.CleanStale(f[1]) == nil && !mounted(f[1]) {
					left = append(left, f[1])
				}
				continue
			}
			if _, mine := ours.Load(f[1]); !mine {
				continue
			}
			left = append(left, f[1])
			if syscall.Unmount(f[1], syscall.MNT_DETACH) != nil {
				exec.Command("fusermount3", "-u", "-z", f[1]).Run()
			}
		}
	}
	return left
}

// daemon is one running `tensorfs mount`, of a test or a benchmark.
type daemon struct {
	t     testing.TB
	mnt   string
	cmd   *exec.Cmd
	log   *testutil.SyncBuffer
	exit  chan error
	fds   int // open fds after mounting, before any test activity
	state string
	conn  uint32 // the FUSE connection's number (the mount's device minor)
	// wrapper and flags it was started with, for relaunch.
	wrapper, flags []string
	opts           launchOpts
}

// launchOpts are the less common ways to start a daemon (launchOpt).
type launchOpts struct {
	// wrapper runs the command (e.g. nsenter and its arguments, ending
	// with the program to run: bin).
	wrapper []string
	// env is added to the test's environment (NOTIFY_SOCKET=...).
	env []string
	// noMountArg leaves the mountpoint off the command line (a --config
	// file names it); the daemon is still expected at mnt.
	noMountArg bool
	// ready replaces the default readiness check (the mount in
	// /proc/mounts and its "mounted " line in the log), polled every 10 ms.
	ready func(d *daemon) bool
}

// startDaemon mounts tensorfs on a fresh directory with extra flags and
// registers a cleanup that stops it (failing the test on leaks or a bad exit).
func startDaemon(t testing.TB, flags ...string) *daemon {
	t.Helper()
	return launch(t, nil, flags...)
}

// launch is startDaemon with the command run under wrapper (e.g. nsenter and
// its arguments, ending with the program to run: bin).
func launch(t testing.TB, wrapper []string, flags ...string) *daemon {
	t.Helper()
	return launchAt(t, t.TempDir(), wrapper, flags...)
}

// relaunch starts a new daemon with d's flags on d's mountpoint (d stopped
// or killed first).
func (d *daemon) relaunch() *daemon {
	d.t.Helper()
	return launchOpt(d.t, d.mnt, d.opts, d.flags...)
}

func launchAt(t testing.TB, mnt string, wrapper []string, flags ...string) *daemon {
	t.Helper()
	return launchOpt(t, mnt, launchOpts{wrapper: wrapper}, flags...)
}

// launchOpt is launchAt with the options of o.
func launchOpt(t testing.TB, mnt string, o launchOpts, flags ...string) *daemon {
	t.Helper()
	ours.Store(mnt, true)
	wrapper := o.wrapper
	d := &daemon{t: t, mnt: mnt, log: &testutil.SyncBuffer{}, exit: make(chan error, 1), wrapper: wrapper, flags: flags, opts: o}
	args := []string{"mount"}
	if !o.noMountArg {
		args = append(args, mnt)
	}
	args = append(testDeviceFlags(args), flags...)
	if wrapper == nil {
		d.cmd = daemonCommand(bin, args...)
	} else {
		d.cmd = daemonCommand(wrapper[0], append(wrapper[1:], args...)...)
	}
	// No NOTIFY_SOCKET of the test's own service manager: only a test
	// that sets one (o.env) gets the daemon's notifications.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
			d.cmd.Env = append(d.cmd.Env, kv)
		}
	}
	d.cmd.Env = append(d.cmd.Env, o.env...)
	ready := o.ready
	if ready == nil {
		ready = func(d *daemon) bool { return mounted(mnt) && strings.Contains(d.log.String(), "mounted ") }
	}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	require.NoError(t, d.cmd.Start())
	go func() { d.exit <- d.cmd.Wait() }()
	// 30 s: creating CUDA contexts on a GPU host takes a while.
	deadline := time.Now().Add(30 * time.Second)
	// Ready once it says so: the mount is in /proc/mounts before the
	// daemon has finished starting (waitReady).
	for !ready(d) {
		select {
		case err := <-d.exit:
			t.Fatalf("tensorfs mount exited before mounting: %v\n%s", err, d.log.String())
		default:
		}
		if time.Now().After(deadline) {
			d.cmd.Process.Kill()
			t.Fatalf("mount did not appear within 30s\n%s", d.log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.fds = d.countFDs()
	var st syscall.Stat_t
	if syscall.Stat(mnt, &st) == nil {
		d.conn = unix.Minor(st.Dev) // its /sys/fs/fuse/connections entry
	}
	t.Cleanup(func() {
		d.stop()
		// A failed test shows what its daemons logged: on a device
		// machine, the run's output is all there is to read.
		if t.Failed() {
			log := d.log.String()
			t.Logf("the log of the daemon on %s (its last 6000 bytes):\n%s", mnt, log[max(0, len(log)-6000):])
		}
	})
	return d
}

// daemonCommand is exec.Command for a process that mounts tensorfs: it
// gets SIGTERM (and unmounts, as on any SIGTERM) when the test process
// dies without its clean-ups, as a test binary killed by -timeout does; a
// daemon left running kept its mount after such a run. A wrapper that
// execs the daemon (nsenter, unshare) passes the signal on: it survives
// execve.
func daemonCommand(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	return cmd
}

// testDeviceFlags adds --device $TENSORFS_TEST_DEVICE (e.g. cuda:0, to run
// the whole suite on GPU memory) before a test's own flags, so a test that
// names a device keeps it (the last flag wins).
func testDeviceFlags(args []string) []string {
	if dev := os.Getenv("TENSORFS_TEST_DEVICE"); dev != "" {
		return append(args, "--device", dev)
	}
	return args
}

// mounted reports whether mnt is a FUSE mount in /proc/self/mounts.
func mounted(mnt string) bool {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[1] == mnt && strings.HasPrefix(fields[2], "fuse") {
			return true
		}
	}
	return false
}

// countFDs counts the daemon's open fds that could be leaks (memfds, sockets,
// files), not pipes, /dev/null or /sys files: go-fuse keeps a pool of splice
// pipes that grows with concurrent requests and opens /dev/null lazily, and
// the Go runtime opens and closes cgroup files under /sys on its own schedule,
// and go-fuse briefly holds .go-fuse-epoll-hack in the new mount right after
// mounting (its poll check).
func (d *daemon) countFDs() int {
	dir := fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid)
	ents, err := os.ReadDir(dir)
	require.NoError(d.t, err)
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && !strings.HasPrefix(target, "pipe:") && target != "/dev/null" && !strings.HasPrefix(target, "/sys/") && !strings.HasSuffix(target, "/.go-fuse-epoll-hack") {
			n++
		}
	}
	return n
}

// path joins elements under the mountpoint.
func (d *daemon) path(elem ...string) string {
	return filepath.Join(append([]string{d.mnt}, elem...)...)
}

// stats reads and decodes user.tensorfs.stats from the root, strictly: a
// field the daemon writes that xattrs.Stats does not know fails the test, so
// the shared types stay complete.
func (d *daemon) stats() xattrs.Stats {
	d.t.Helper()
	v := getx(d.t, d.mnt, xattrs.StatsName)
	var s xattrs.Stats
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	require.NoError(d.t, dec.Decode(&s), v)
	return s
}

// settledLive returns the live stats once no file handle is open any more:
// FUSE RELEASE is asynchronous to close, so a baseline read right after a
// write could still count the writer's lease.
func (d *daemon) settledLive() xattrs.Live {
	d.t.Helper()
	var s xattrs.Stats
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(10 * time.Millisecond) {
		if s = d.stats(); s.Live.Leases == 0 {
			break
		}
	}
	return s.Live
}

// requireLog waits up to 5 s for the daemon's log to contain substr: the
// log reaches the test through a pipe, copied by another goroutine, so a
// line the daemon wrote just before answering a call may not be there yet
// when the call returns (a check right after it failed once in CI).
func (d *daemon) requireLog(substr string, msgAndArgs ...any) {
	d.t.Helper()
	for start := time.Now(); !strings.Contains(d.log.String(), substr); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			require.Contains(d.t, d.log.String(), substr, msgAndArgs...)
			return
		}
	}
}

// requireLeases waits until the daemon counts exactly n leases and returns
// its stats then: a file handle's lease ends at FUSE RELEASE, which the
// kernel sends after close(2) has returned, so a count read right after a
// write and close may still include the writer's. Fails after 5 s with the
// last count.
func (d *daemon) requireLeases(n int, msgAndArgs ...any) xattrs.Stats {
	d.t.Helper()
	var s xattrs.Stats
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(5 * time.Millisecond) {
		if s = d.stats(); s.Live.Leases == n {
			return s
		}
	}
	require.EqualValues(d.t, n, s.Live.Leases, msgAndArgs...)
	return s
}

// ucxEndpointFDs is the most fds UCX holds for an endpoint to one peer
// (over tcp: the socket it connected, the one it accepted, an eventfd).
const ucxEndpointFDs = 3

// procStat is the fields of /proc/PID/stat for d's process after its
// command (f[0] is the state, field 3); nil when there is no such process
// (reaped).
func (d *daemon) procStat() []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
}

// removeAll removes every entry of d's mount (then requireClean can check
// that nothing is left allocated).
func (d *daemon) removeAll() {
	d.t.Helper()
	ents, err := os.ReadDir(d.mnt)
	require.NoError(d.t, err)
	for _, e := range ents {
		require.NoError(d.t, os.RemoveAll(d.path(e.Name())))
	}
}

// cpu is the CPU time d's process uses over the next dur (user and
// system, from /proc/PID/stat).
func (d *daemon) cpu(dur time.Duration) time.Duration {
	d.t.Helper()
	ticks := func() int64 {
		f := d.procStat()
		require.NotNil(d.t, f, "no process %d", d.cmd.Process.Pid)
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		return u + s
	}
	t0 := ticks()
	time.Sleep(dur)
	return time.Duration(ticks()-t0) * 10 * time.Millisecond // USER_HZ 100
}

// hasUCX reports whether d runs with UCX (--transport ucx).
func (d *daemon) hasUCX() bool {
	return ucxBuild && slices.Contains(d.flags, "ucx")
}

// requireClean waits (FUSE RELEASE is asynchronous to close) until everything
// under live is zero, statfs shows 0 bytes used, and the daemon's fd count is
// back at its baseline.
func (d *daemon) requireClean() {
	d.t.Helper()
	var s xattrs.Stats
	var used uint64
	fds := 0
	ok := false
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(20 * time.Millisecond) {
		s = d.stats()
		var st unix.Statfs_t
		require.NoError(d.t, unix.Statfs(d.mnt, &st))
		used = (st.Blocks - st.Bfree) * uint64(st.Bsize)
		fds = d.countFDs()
		// Fewer fds than at the start is no leak (the CUDA driver closes
		// some of its own). The peer connections kept open between copies
		// (this daemon's idle ones, and its peers' it serves) are no leak
		// either: stats counts them.
		conns := int(s.Connections.Idle + s.Connections.Waiting)
		// So are the UCX endpoints kept to each peer (over UCX_TLS=tcp
		// a socket each way and their events), shown under the peer; and
		// the socket UCX's worker accepted from a peer that died, which
		// it closes when it next hears of it.
		for _, p := range s.Peers {
			if len(p.UCX) > 0 || d.hasUCX() {
				conns += ucxEndpointFDs
			}
		}
		if s.Live == (xattrs.Live{}) && used == 0 && fds <= d.fds+conns {
			ok = true
			break
		}
	}
	if !ok {
		out, _ := exec.Command("ls", "-l", fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid)).CombinedOutput()
		d.t.Fatalf("not clean: live=%+v statfs used=%d fds=%d (baseline %d)\n%s\n%s", s.Live, used, fds, d.fds, out, d.log.String())
	}
}

// stop sends SIGTERM and requires exit 0 with the mount gone.
func (d *daemon) stop() {
	if d.state == "stopped" {
		return
	}
	d.state = "stopped"
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.exit:
		if err != nil {
			d.t.Errorf("tensorfs exited with %v\n%s", err, d.log.String())
		}
	case <-time.After(15 * time.Second):
		d.cmd.Process.Kill()
		syscall.Unmount(d.mnt, syscall.MNT_DETACH)
		d.t.Errorf("tensorfs did not exit within 15s of SIGTERM\n%s", d.log.String())
	}
	if mounted(d.mnt) {
		syscall.Unmount(d.mnt, syscall.MNT_DETACH)
		d.t.Errorf("mount %s still present after the daemon exited", d.mnt)
	}
	if strings.Contains(d.log.String(), "WARNING: DATA RACE") {
		d.t.Errorf("the daemon reported a data race:\n%s", d.log.String())
	}
}

// getx reads an xattr as a string, failing the test on error.
func getx(t testing.TB, path, name string) string {
	t.Helper()
	v, err := getxErr(path, name)
	require.NoError(t, err, "getxattr %s %s", path, name)
	return v
}

// getxErr reads an xattr with a size probe first, as getfattr does, and
// probes again when the value grew in between (ERANGE), as robust clients do:
// stats changes while copies run.
func getxErr(path, name string) (string, error) {
	for {
		n, err := unix.Getxattr(path, name, nil)
		if err != nil {
			return "", err
		}
		buf := make([]byte, n)
		n, err = unix.Getxattr(path, name, buf)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// setx sets an xattr, failing the test on error.
func setx(t testing.TB, path, name, value string) {
	t.Helper()
	require.NoError(t, unix.Setxattr(path, name, []byte(value), 0), "setxattr %s %s=%q", path, name, value)
}

// mkTemplateDir makes a directory with a dtype/shape template.
func mkTemplateDir(t testing.TB, dir, dtype, shape string) {
	t.Helper()
	require.NoError(t, os.Mkdir(dir, 0o755))
	setx(t, dir, xattrs.DType, dtype)
	setx(t, dir, xattrs.Shape, shape)
}

// runCmd runs a command and returns its combined output.
func runCmd(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// orphanEnv, set, makes TestOrphanedDaemonUnmounts the child that starts a
// daemon and is killed.
const orphanEnv = "TENSORFS_TEST_ORPHAN_CHILD"

// TestOrphanedDaemonUnmounts: a test process killed without running its
// clean-ups (SIGKILL here; -timeout's panic does the same) takes its
// daemons with it, and their mounts go (daemonCommand). Before, a run that
// timed out left its daemons serving their mounts.
func TestOrphanedDaemonUnmounts(t *testing.T) {
	if os.Getenv(orphanEnv) != "" {
		d := startDaemon(t, "--device", "host")
		fmt.Printf("MNT %s\n", d.mnt)
		select {} // until killed
	}
	self, err := os.Executable()
	require.NoError(t, err)
	child := exec.Command(self, "-test.run=^TestOrphanedDaemonUnmounts$")
	// The killed child runs none of its clean-ups: its temporary
	// directories go inside ours, which ours remove (one per run was left
	// in /tmp).
	child.Env = append(os.Environ(), orphanEnv+"=1", "TENSORFS_BIN="+bin, "TMPDIR="+t.TempDir())
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	defer child.Process.Kill()
	sc := bufio.NewScanner(out)
	var mnt string
	for sc.Scan() {
		if m, ok := strings.CutPrefix(sc.Text(), "MNT "); ok {
			mnt = m
			break
		}
	}
	require.NotEmpty(t, mnt, "the child did not mount")
	t.Cleanup(func() {
		if mounted(mnt) {
			exec.Command("umount", "-l", mnt).Run()
		}
	})
	require.True(t, mounted(mnt))
	require.NoError(t, child.Process.Kill())
	child.Wait()
	require.Eventually(t, func() bool { return !mounted(mnt) }, 10*time.Second, 20*time.Millisecond,
		"the killed test's daemon still serves %s", mnt)
}
