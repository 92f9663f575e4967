package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"

	tfcluster "github.com/tensorfs/tensorfs/cluster"
	"github.com/tensorfs/tensorfs/cluster/etcdtest"
	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/transfer"
	"github.com/tensorfs/tensorfs/xattrs"
)

// etcdNode is a daemon of an etcd cluster, with the flags to start it again.
type etcdNode struct {
	*daemon
	name, addr string
}

// etcdFlags are the flags of a node of cluster cl on srv, listening at port.
func etcdFlags(srv *etcdtest.Server, cl, name, secret string, port int, extra ...string) []string {
	return append([]string{"--name", name, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--secret-file", secret, "--host-id", "host-" + name,
		"--timeout", "3s", "--etcd", srv.Endpoint, "--cluster", cl, "--etcd-ttl", "2s"}, extra...)
}

// startEtcdNode starts a daemon of cluster cl with no --peer.
func startEtcdNode(t *testing.T, srv *etcdtest.Server, cl, name, secret, mnt string, extra ...string) *etcdNode {
	t.Helper()
	port := testutil.FreePort(t)
	if mnt == "" {
		mnt = t.TempDir()
	}
	d := launchAt(t, mnt, nil, etcdFlags(srv, cl, name, secret, port, extra...)...)
	return &etcdNode{daemon: d, name: name, addr: fmt.Sprintf("127.0.0.1:%d", port)}
}

// waitView waits (10 s at most) until d's stats satisfy cond, polling.
func (d *daemon) waitView(what string, cond func(xattrs.Stats) bool) xattrs.Stats {
	d.t.Helper()
	var st xattrs.Stats
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(20 * time.Millisecond) {
		if st = d.stats(); cond(st) {
			return st
		}
	}
	js, _ := json.Marshal(st)
	d.t.Fatalf("%s: not within 10s: %s\n%s", d.mnt, what, js)
	return st
}

// etcdNames are the etcd nodes in a daemon's stats peers, sorted.
func etcdNames(st xattrs.Stats) []string {
	var n []string
	for name, p := range st.Peers {
		if p.Source == "etcd" {
			n = append(n, name)
		}
	}
	sort.Strings(n)
	return n
}

// push writes data to src on from and copies it to to:/dst, then checks it.
func push(t *testing.T, from, to *etcdNode, dst string, data []byte) {
	t.Helper()
	src := from.path("x-" + to.name)
	require.NoError(t, os.WriteFile(src, data, 0o644))
	setx(t, src, xattrs.CopyTo, to.name+":/"+dst)
	got, err := os.ReadFile(to.path(dst))
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.NoError(t, os.Remove(src))
	require.NoError(t, os.Remove(to.path(dst)))
}

// TestEtcdCluster: three daemons with --etcd and no --peer copy to each
// other by name; their records carry the spec's fields under a lease;
// tensorfs nodes lists them; a duplicate name is refused with one line; a
// SIGKILLed node is gone from the views after the TTL and a copy to it
// fails at once with EHOSTUNREACH (the log says why); restarted on another
// port, it is reached without restarting the others; etcd stopped mid-run:
// copies between live nodes go on, stats say "lost"; etcd back: the views
// converge on etcd's records.
func TestEtcdCluster(t *testing.T) {
	srv := etcdtest.Start(t)
	secret := secretFile(t, "a shared secret of enough bytes")
	ns := map[string]*etcdNode{}
	for _, n := range []string{"a", "b", "c"} {
		ns[n] = startEtcdNode(t, srv, "t1", n, secret, "")
	}
	a, b, c := ns["a"], ns["b"], ns["c"]
	for _, n := range ns {
		st := n.waitView("all three in the view", func(st xattrs.Stats) bool { return len(etcdNames(st)) == 3 })
		require.NotNil(t, st.Cluster)
		require.Equal(t, "connected", st.Cluster.State)
		require.True(t, st.Cluster.Registered)
		require.True(t, st.Peers[n.name].Self)
	}
	data := fill(1<<16, 5)
	push(t, a, b, "ab", data)
	push(t, b, c, "bc", data)
	push(t, c, a, "ca", data)

	// The records: every field, under a lease of the TTL.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 3 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	resp, err := cli.Get(context.Background(), tfcluster.Key("t1", "b"))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	var rec tfcluster.Record
	require.NoError(t, json.Unmarshal(resp.Kvs[0].Value, &rec))
	require.Equal(t, "b", rec.Name)
	require.Equal(t, b.addr, rec.Addr)
	require.Equal(t, "host-b", rec.HostID)
	require.Len(t, rec.Instance, 32)
	require.Equal(t, transfer.ProtocolVersion, rec.Protocol)
	wantTransports := []string{"tcp"}
	if ucxBuild { // a daemon with a UCX context (--transport auto) says so
		wantTransports = append(wantTransports, "ucx")
	}
	require.Equal(t, wantTransports, rec.Transports)
	require.NotEmpty(t, rec.Devices)
	require.WithinDuration(t, time.Now(), rec.Started, time.Minute)
	ttl, err := cli.TimeToLive(context.Background(), clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	require.EqualValues(t, 2, ttl.GrantedTTL)

	// tensorfs nodes, through a mount and from etcd.
	for _, args := range [][]string{{"nodes", a.mnt, "--json"}, {"nodes", "--etcd", srv.Endpoint, "--cluster", "t1", "--json", "--host-id", "host-b"}} {
		out, err := exec.Command(bin, args...).Output()
		require.NoError(t, err, "%v", args)
		var rows []map[string]any
		require.NoError(t, json.Unmarshal(out, &rows), "%s", out)
		require.Len(t, rows, 3, "%s", out)
		for _, r := range rows {
			for _, f := range []string{"name", "addr", "host_id", "same_host", "since", "transports"} {
				require.Contains(t, r, f)
			}
			if r["name"] == "b" {
				require.Equal(t, b.addr, r["addr"])
				require.Equal(t, args[1] != a.mnt, r["same_host"], "same host as --host-id host-b")
			}
		}
	}
	out, err := exec.Command(bin, "nodes", a.mnt).CombinedOutput()
	require.NoError(t, err)
	require.Contains(t, string(out), "a (this node)")
	require.Contains(t, string(out), b.addr)

	// A duplicate name: refused at start with one line, nothing mounted.
	mnt := t.TempDir()
	out, err = exec.Command(bin, append(testDeviceFlags([]string{"mount", mnt}), etcdFlags(srv, "t1", "b", secret, testutil.FreePort(t))...)...).CombinedOutput()
	require.Error(t, err)
	require.Equal(t, 1, strings.Count(strings.TrimSpace(string(out)), "\n")+1, "one line: %s", out)
	require.Contains(t, string(out), "already registered by a live daemon")
	require.False(t, mounted(mnt))

	// SIGKILL c: gone from a's and b's views after the TTL; a copy to it
	// fails at once with EHOSTUNREACH, well under --timeout.
	c.kill()
	killed := time.Now()
	for _, n := range []*etcdNode{a, b} {
		n.waitView("c gone", func(st xattrs.Stats) bool { _, ok := st.Peers["c"]; return !ok })
	}
	t.Logf("c gone from both views %v after SIGKILL (TTL 2 s)", time.Since(killed).Round(time.Millisecond))
	require.NoError(t, os.WriteFile(a.path("toc"), data, 0o644))
	start := time.Now()
	err = unix.Setxattr(a.path("toc"), xattrs.CopyTo, []byte("c:/x"), 0)
	took := time.Since(start)
	require.ErrorIs(t, err, unix.EHOSTUNREACH)
	require.Less(t, took, 500*time.Millisecond, "fails at once (--timeout is 3 s)")
	a.requireLog("node c (" + c.addr)
	a.requireLog("lease expired")

	// Restart c on another port: the next copy reaches it, no one else
	// restarted; its new instance replaced the record.
	old := a.stats().Cluster.Revision
	c2 := startEtcdNode(t, srv, "t1", "c", secret, c.mnt)
	require.NotEqual(t, c.addr, c2.addr)
	a.waitView("c back at its new address", func(st xattrs.Stats) bool { return st.Peers["c"].Addr == c2.addr && st.Cluster.Revision > old })
	setx(t, a.path("toc"), xattrs.CopyTo, "c:/x")
	got, err := os.ReadFile(c2.path("x"))
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.NoError(t, os.Remove(c2.path("x")))
	a.requireLog("node c joined at " + c2.addr)

	// etcd stopped mid-run: copies between live nodes go on from the last
	// view; stats say lost (entries stale).
	srv.Stop()
	for _, n := range []*etcdNode{a, b, c2} {
		n.waitView("etcd lost", func(st xattrs.Stats) bool { return st.Cluster.State == "lost" })
	}
	st := a.stats()
	require.True(t, st.Peers["b"].Stale)
	require.NotEmpty(t, st.Cluster.Error)
	push(t, a, b, "ab2", data)
	push(t, b, c2, "bc2", data)
	a.requireLog("etcd " + srv.Endpoint + " unreachable")

	// etcd back: every view converges on etcd's records (each node
	// registered, the same three nodes and instances everywhere).
	srv.Restart()
	want := map[string]string{}
	for _, n := range []*etcdNode{a, b, c2} {
		st := n.waitView("etcd back and registered", func(st xattrs.Stats) bool {
			return st.Cluster.State == "connected" && st.Cluster.Registered && len(etcdNames(st)) == 3 && !st.Peers["a"].Stale
		})
		for name, p := range st.Peers {
			if w, ok := want[name]; ok {
				require.Equal(t, w, p.Instance, "node %s in %s's view", name, n.name)
			}
			want[name] = p.Instance
		}
	}
	resp, err = cli.Get(context.Background(), tfcluster.Prefix("t1"), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 3)
	for _, kv := range resp.Kvs {
		var r tfcluster.Record
		require.NoError(t, json.Unmarshal(kv.Value, &r))
		require.Equal(t, want[r.Name], r.Instance, "etcd's %s", r.Name)
	}
	a.requireLog("reachable again")
	push(t, c2, a, "ca2", data)
	require.NoError(t, os.Remove(a.path("toc")))
	for _, n := range []*etcdNode{a, b, c2} {
		n.requireClean()
	}

	// SIGTERM deletes the record before exit; the others see why.
	b.stop()
	resp, err = cli.Get(context.Background(), tfcluster.Key("t1", "b"))
	require.NoError(t, err)
	require.Empty(t, resp.Kvs, "b's record deleted at SIGTERM")
	a.waitView("b gone", func(st xattrs.Stats) bool { _, ok := st.Peers["b"]; return !ok })
	require.NoError(t, os.WriteFile(a.path("tob"), data, 0o644))
	err = unix.Setxattr(a.path("tob"), xattrs.CopyTo, []byte("b:/y"), 0)
	require.ErrorIs(t, err, unix.EHOSTUNREACH)
	require.NoError(t, os.Remove(a.path("tob")))
	a.requireLog("node b (" + b.addr + ", instance " + want["b"] + ") gone: its daemon shut down")
}

// TestEtcdStart: etcd unreachable at start is refused with one line and no
// mount; --etcd without --listen is refused; --peer wins over etcd for the
// names it gives.
func TestEtcdStart(t *testing.T) {
	secret := secretFile(t, "a shared secret of enough bytes")
	mnt := t.TempDir()
	dead := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	start := time.Now()
	out, err := exec.Command(bin, append(testDeviceFlags([]string{"mount", mnt}), "--name", "a", "--listen", fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)),
		"--secret-file", secret, "--etcd", dead, "--timeout", "1s")...).CombinedOutput()
	require.Error(t, err)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, 1, len(strings.Split(strings.TrimSpace(string(out)), "\n")), "one line: %s", out)
	require.Contains(t, string(out), "etcd unreachable at http://"+dead)
	require.False(t, mounted(mnt))

	out, err = exec.Command(bin, "mount", mnt, "--etcd", dead).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "--etcd needs --listen")

	srv := etcdtest.Start(t)
	a := startEtcdNode(t, srv, "t2", "a", secret, "")
	b := startEtcdNode(t, srv, "t2", "b", secret, "", "--peer", "a="+"127.0.0.1:1")
	st := b.waitView("a in b's view", func(st xattrs.Stats) bool { return st.Cluster != nil && st.Cluster.Nodes == 2 })
	require.Equal(t, "127.0.0.1:1", st.Peers["a"].Addr, "--peer wins")
	require.Equal(t, "peer", st.Peers["a"].Source)
	require.NoError(t, os.WriteFile(b.path("t"), fill(64, 1), 0o644))
	err = unix.Setxattr(b.path("t"), xattrs.CopyTo, []byte("a:/t"), 0)
	require.ErrorIs(t, err, unix.ECONNREFUSED, "the --peer address, not etcd's, was dialed")
	a.waitView("b in a's view", func(st xattrs.Stats) bool { return st.Peers["b"].Addr == b.addr })
	push(t, a, b, "ab", fill(64, 2))
	require.NoError(t, os.Remove(b.path("t")))
}

// TestEtcdNone: without --etcd the stats document is as before (no
// "cluster", peers with only their address) and tensorfs nodes lists the
// --peer entries.
func TestEtcdNone(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	v := getx(t, ds["a"].mnt, xattrs.StatsName)
	require.NotContains(t, v, `"cluster"`)
	require.Contains(t, v, `"peers":{"b":{"addr":"127.0.0.1:`)
	out, err := exec.Command(bin, "nodes", ds["a"].mnt, "--json").Output()
	require.NoError(t, err)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal(out, &rows))
	require.Len(t, rows, 1)
	require.Equal(t, "peer", rows[0]["source"])
}

// TestEtcdRestartAtOnce: a node SIGKILLed and started again at once on the
// same port (its old record's lease still running) takes its name over; its
// peers pick up the new instance and the next copy reaches it.
func TestEtcdRestartAtOnce(t *testing.T) {
	srv := etcdtest.Start(t)
	secret := secretFile(t, "a shared secret of enough bytes")
	a := startEtcdNode(t, srv, "t3", "a", secret, "", "--etcd-ttl", "30s")
	b := startEtcdNode(t, srv, "t3", "b", secret, "", "--etcd-ttl", "30s")
	st := a.waitView("b in a's view", func(st xattrs.Stats) bool { return st.Peers["b"].Addr == b.addr })
	old := st.Peers["b"].Instance
	push(t, a, &etcdNode{daemon: b.daemon, name: "b"}, "x", fill(4096, 1))
	b.kill()
	b2 := &etcdNode{daemon: b.relaunch(), name: "b", addr: b.addr}
	b2.requireLog("took over name b from instance " + old)
	a.waitView("b's new instance", func(st xattrs.Stats) bool { return st.Peers["b"].Instance != old && st.Peers["b"].Instance != "" })
	push(t, a, b2, "x", fill(4096, 2))
	a.requireClean()
	b2.requireClean()
}
