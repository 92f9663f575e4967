package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// Two "hosts" on one kernel: a network namespace each, joined by a veth pair
// with link-local addresses only (169.254.0.0/16 is never routed off the
// machine, and neither namespace has any other interface than lo and its veth
// end, nor a default route). Each daemon runs inside its namespace through
// `nsenter --net=...`, which enters the network namespace only: `ip netns exec`
// would also unshare the mount namespace, and the daemon's FUSE mount would be
// invisible here. So the test process, in the root namespaces, sees both
// mounts, while the daemons reach each other only through the veth, over TCP,
// with distinct --host-id values (the different-host path).
//
// Needs iproute2 (`ip`), util-linux (`nsenter`) and root. Where these are
// missing the tests skip, except under CI=true, where they fail.

const (
	netnsAddrA = "169.254.77.1"
	netnsAddrB = "169.254.77.2"
	netnsPort  = 7470 // a fresh namespace has nothing listening
)

// netnsPair is the two namespaces and their veth ends.
type netnsPair struct {
	nsA, nsB     string // names under /run/netns
	vethA, vethB string
}

// netnsUnavailable skips (or, under CI=true, fails) with a clear reason.
func netnsUnavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("network namespace test cannot run under CI: %s (CI must install iproute2 and util-linux and run as root)", msg)
	}
	t.Skipf("skipping the network namespace test: %s (needs iproute2's ip, util-linux's nsenter, and root)", msg)
}

// ipCmd runs `ip ARGS...` with a bound on its time.
func ipCmd(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// newNetnsPair makes two namespaces named after this process, a veth pair
// between them with a link-local /30, and brings lo and the veth ends up.
// Everything is removed in t.Cleanup, which (registered first) runs after
// the cleanups of the daemons started later.
func newNetnsPair(t *testing.T) *netnsPair {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		netnsUnavailable(t, "`ip` (package iproute2) is not installed")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		netnsUnavailable(t, "`nsenter` (package util-linux) is not installed")
	}
	pid := os.Getpid()
	// Interface names are at most 15 bytes: "tfv" + pid (<= 7 digits) + 1.
	p := &netnsPair{
		nsA: fmt.Sprintf("tensorfs-test-%d-a", pid), nsB: fmt.Sprintf("tensorfs-test-%d-b", pid),
		vethA: fmt.Sprintf("tfv%da", pid), vethB: fmt.Sprintf("tfv%db", pid),
	}
	if out, err := ipCmd("netns", "add", p.nsA); err != nil {
		netnsUnavailable(t, "`ip netns add %s` failed (not root?): %v: %s", p.nsA, err, out)
	}
	t.Cleanup(func() { p.remove(t) })
	steps := [][]string{
		{"netns", "add", p.nsB},
		{"link", "add", "name", p.vethA, "netns", p.nsA, "type", "veth", "peer", "name", p.vethB, "netns", p.nsB},
		{"-n", p.nsA, "addr", "add", netnsAddrA + "/30", "dev", p.vethA},
		{"-n", p.nsB, "addr", "add", netnsAddrB + "/30", "dev", p.vethB},
		{"-n", p.nsA, "link", "set", "lo", "up"},
		{"-n", p.nsB, "link", "set", "lo", "up"},
		{"-n", p.nsA, "link", "set", p.vethA, "up"},
		{"-n", p.nsB, "link", "set", p.vethB, "up"},
	}
	for _, s := range steps {
		if out, err := ipCmd(s...); err != nil {
			netnsUnavailable(t, "`ip %s` failed: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	// A veth end is operationally up once both ends are.
	for _, e := range [][2]string{{p.nsA, p.vethA}, {p.nsB, p.vethB}} {
		require.Eventually(t, func() bool {
			out, err := ipCmd("-n", e[0], "-br", "link", "show", "dev", e[1])
			f := strings.Fields(out)
			return err == nil && len(f) >= 2 && f[1] == "UP"
		}, 10*time.Second, 20*time.Millisecond, "veth %s in %s did not come up", e[1], e[0])
	}
	// Neither namespace may reach anything but the other: no default route.
	for _, ns := range []string{p.nsA, p.nsB} {
		out, err := ipCmd("-n", ns, "route", "show", "default")
		require.NoError(t, err, out)
		require.Empty(t, out, "namespace %s has a default route", ns)
	}
	return p
}

// remove deletes the namespaces (which destroys the veth pair with them) and,
// should either end have stayed in the root namespace, the veth itself.
func (p *netnsPair) remove(t *testing.T) {
	for _, ns := range []string{p.nsA, p.nsB} {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
			if out, err := ipCmd("netns", "del", ns); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		}
	}
	for _, v := range []string{p.vethA, p.vethB} {
		if out, _ := ipCmd("-br", "link", "show", "dev", v); strings.HasPrefix(out, v) {
			if out, err := ipCmd("link", "del", v); err != nil {
				t.Errorf("ip link del %s: %v: %s", v, err, out)
			}
		}
	}
}

// nsenterArgs is the command line that runs the tensorfs binary in ns's
// network namespace and nothing else's: nsenter setns()es and execs, so the
// process it starts is the daemon itself (signals reach it directly).
func nsenterArgs(ns string, args ...string) []string {
	return append([]string{"--net=" + filepath.Join("/run/netns", ns), bin}, args...)
}

// startNetnsDaemon is startDaemon with the daemon in namespace ns, through
// nsenter, which execs the daemon itself: signals and /proc/PID/fd apply to it.
func startNetnsDaemon(t *testing.T, ns string, flags ...string) *daemon {
	t.Helper()
	return launch(t, append([]string{"nsenter"}, nsenterArgs(ns)...), flags...)
}

// netnsPeers starts daemon a in namespace A and b in namespace B, each
// listening on its link-local address with the other as its peer.
func netnsPeers(t *testing.T, p *netnsPair, secret string) (a, b *daemon) {
	t.Helper()
	flags := func(name, addr, peer, peerAddr string) []string {
		return []string{"--name", name, "--listen", fmt.Sprintf("%s:%d", addr, netnsPort), "--secret-file", secret,
			"--peer", fmt.Sprintf("%s=%s:%d", peer, peerAddr, netnsPort), "--host-id", "netns-host-" + name, "--timeout", "5s"}
	}
	a = startNetnsDaemon(t, p.nsA, flags("a", netnsAddrA, "b", netnsAddrB)...)
	b = startNetnsDaemon(t, p.nsB, flags("b", netnsAddrB, "a", netnsAddrA)...)
	return a, b
}

// TestNetnsPeers: two daemons on two "hosts" (network namespaces joined by a
// veth) copy over TCP: a file and a tree pushed, a file and a tree pulled;
// both count the copies under tcp and list them with path "tcp"; a third
// daemon with a wrong secret is refused with EACCES; listening on the
// link-local (non-loopback) address without a secret is refused at start.
func TestNetnsPeers(t *testing.T) {
	p := newNetnsPair(t)

	// Without --secret-file, listening on a non-loopback address is refused
	// with one clear line, and nothing is mounted.
	mnt := t.TempDir()
	ours.Store(mnt, true)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", nsenterArgs(p.nsA, "mount", mnt, "--name", "r",
		"--listen", fmt.Sprintf("%s:%d", netnsAddrA, netnsPort+1), "--host-id", "netns-host-r")...).CombinedOutput()
	if mounted(mnt) {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		t.Fatalf("mounted although listening on %s without a secret:\n%s", netnsAddrA, out)
	}
	require.Error(t, err, "listening on %s without --secret-file must be refused:\n%s", netnsAddrA, out)
	require.NotErrorIs(t, ctx.Err(), context.DeadlineExceeded, "the refused start did not exit")
	// One line says why (other lines are the log's, e.g. the device choice).
	var why []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "tensorfs: ") {
			why = append(why, l)
		}
	}
	require.Len(t, why, 1, "one line saying why, in:\n%s", out)
	require.Contains(t, why[0], "not a loopback address")
	require.Contains(t, why[0], "no --secret-file")

	secret := secretFile(t, "the netns pair's shared secret")
	a, b := netnsPeers(t, p, secret)

	// Push a file.
	mkTemplateDir(t, a.path("kv"), "BF16", "64,32")
	data := fill(64*32*2, 11)
	require.NoError(t, os.WriteFile(a.path("kv/blk"), data, 0o644))
	require.NoError(t, os.Mkdir(b.path("kv"), 0o755))
	setx(t, a.path("kv/blk"), xattrs.CopyTo, "b:/kv/blk")
	got, err := os.ReadFile(b.path("kv/blk"))
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.Equal(t, "BF16", getx(t, b.path("kv/blk"), xattrs.DType))
	require.Equal(t, "64,32", getx(t, b.path("kv/blk"), xattrs.Shape))

	// Push a tree of 60 tensors of several sizes in nested directories.
	require.NoError(t, os.Mkdir(a.path("tree"), 0o755))
	treeFile := func(i int) (string, []byte) {
		return filepath.Join(fmt.Sprintf("d%d", i%4), fmt.Sprintf("e%d", i%3), fmt.Sprintf("t%02d", i)), fill(1+i*997, byte(i))
	}
	for i := 0; i < 60; i++ {
		rel, content := treeFile(i)
		require.NoError(t, os.MkdirAll(filepath.Dir(a.path("tree", rel)), 0o755))
		require.NoError(t, os.WriteFile(a.path("tree", rel), content, 0o644))
	}
	setx(t, a.path("tree"), xattrs.CopyTo, "b:/tree")
	n := 0
	require.NoError(t, filepath.Walk(b.path("tree"), func(path string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n++
		}
		return err
	}))
	require.Equal(t, 60, n)
	for i := 0; i < 60; i++ {
		rel, content := treeFile(i)
		got, err := os.ReadFile(b.path("tree", rel))
		require.NoError(t, err, rel)
		require.Equal(t, content, got, rel)
	}

	// Pull a file (into an existing one) and a tree from b into a.
	pulled := fill(300000, 77)
	require.NoError(t, os.WriteFile(b.path("kv/from-b"), pulled, 0o644))
	require.NoError(t, os.WriteFile(a.path("pulled"), []byte("old bytes"), 0o644))
	setx(t, a.path("pulled"), xattrs.CopyFrom, "b:/kv/from-b")
	got, err = os.ReadFile(a.path("pulled"))
	require.NoError(t, err)
	require.Equal(t, pulled, got)
	require.NoError(t, os.Mkdir(a.path("back"), 0o755))
	setx(t, a.path("back"), xattrs.CopyFrom, "b:/tree")
	for _, i := range []int{0, 7, 31, 59} {
		rel, content := treeFile(i)
		got, err := os.ReadFile(a.path("back", rel))
		require.NoError(t, err, rel)
		require.Equal(t, content, got, rel)
	}

	// Both count four copies over TCP (different host ids: never IPC), and
	// every transfer they list went over TCP and succeeded.
	for _, d := range []*daemon{a, b} {
		s := d.stats()
		require.EqualValues(t, 4, s.Copies.TCP, "%s: %v", d.mnt, s.Copies)
		require.Zero(t, s.Copies.IPC, "%v", s.Copies)
		require.Zero(t, s.Copies.Local, "%v", s.Copies)
		require.Zero(t, s.Transfers.Active)
		rs := s.Transfers.Recent
		require.Len(t, rs, 4, "%+v", rs)
		for _, r := range rs {
			require.Equal(t, "tcp", r.Path, "%+v", r)
			require.Empty(t, r.Error, "%+v", r)
			require.EqualValues(t, r.BytesTotal, r.BytesDone, "%+v", r)
		}
	}

	// A third daemon, on host A, with a wrong secret: EACCES, nothing arrives.
	c := startNetnsDaemon(t, p.nsA, "--name", "c", "--secret-file", secretFile(t, "a wrong secret, long enough too"),
		"--peer", fmt.Sprintf("b=%s:%d", netnsAddrB, netnsPort), "--host-id", "netns-host-c", "--timeout", "5s")
	require.NoError(t, os.WriteFile(c.path("t"), fill(100, 1), 0o644))
	err = unix.Setxattr(c.path("t"), xattrs.CopyTo, []byte("b:/intruder"), 0)
	require.ErrorIs(t, err, syscall.EACCES)
	_, err = os.Stat(b.path("intruder"))
	require.ErrorIs(t, err, syscall.ENOENT, "nothing arrived")
	require.Eventually(t, func() bool { return strings.Contains(c.log.String(), "hold different shared secrets") },
		5*time.Second, 10*time.Millisecond, "c's log says why:\n%s", c.log.String())
	require.EqualValues(t, 4, b.stats().Copies.TCP)
	require.NoError(t, os.Remove(c.path("t")))
	c.requireClean()

	for _, d := range []*daemon{a, b} {
		for _, name := range []string{"kv", "tree", "back", "pulled"} {
			require.NoError(t, os.RemoveAll(d.path(name)))
		}
		d.requireClean()
	}
}

// TestNetnsPeerKilledMidPush: b, on the other "host", is killed (SIGKILL)
// while a 256 MiB push to it is moving bytes: a's setfattr fails within
// about 10 s and a's live stats return to where they were before the push.
func TestNetnsPeerKilledMidPush(t *testing.T) {
	p := newNetnsPair(t)
	a, b := netnsPeers(t, p, secretFile(t, "the netns pair's shared secret"))
	const size = 256 << 20
	require.NoError(t, os.WriteFile(a.path("big"), nil, 0o644))
	require.NoError(t, os.Truncate(a.path("big"), size))
	base := a.settledLive()
	require.EqualValues(t, size, base.Bytes)

	done := make(chan error, 1)
	go func() { done <- unix.Setxattr(a.path("big"), xattrs.CopyTo, []byte("b:/big"), 0) }()
	// Kill b once bytes are moving (and before they are all through).
	moving := false
	for deadline := time.Now().Add(10 * time.Second); !moving && time.Now().Before(deadline); {
		select {
		case err := <-done:
			t.Fatalf("the 256 MiB push ended (%v) before it could be interrupted: %+v", err, a.stats().Transfers.Recent)
		default:
		}
		for _, r := range a.stats().Transfers.Recent {
			if r.Dst == "b:/big" && r.BytesTotal == size && r.BytesDone > 0 && r.BytesDone < size {
				require.Equal(t, "tcp", r.Path)
				moving = true
				t.Logf("killing b at %d of %d bytes", r.BytesDone, r.BytesTotal)
			}
		}
	}
	require.True(t, moving, "the push never started moving bytes: %+v", a.stats().Transfers.Recent)
	b.kill()
	killed := time.Now()
	select {
	case err := <-done:
		require.Error(t, err, "a push to a peer killed mid-way must fail")
		t.Logf("setfattr failed %v after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatalf("setfattr did not fail within 10 s of the peer's death\n%s", a.log.String())
	}
	require.Eventually(t, func() bool { return a.stats().Live == base && a.stats().Transfers.Active == 0 },
		5*time.Second, 20*time.Millisecond, "a's stats back to its baseline %+v: %+v", base, a.stats().Live)
	var failed []xattrs.Record
	for _, r := range a.stats().Transfers.Recent {
		if r.Dst == "b:/big" {
			failed = append(failed, r)
		}
	}
	require.Len(t, failed, 1)
	require.NotEmpty(t, failed[0].Error, "the failed push's record says why: %+v", failed[0])
	require.Zero(t, a.stats().Copies.TCP)

	require.NoError(t, os.Remove(a.path("big")))
	a.requireClean()
}
