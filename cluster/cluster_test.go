package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tensorfs/tensorfs/cluster"
	"github.com/tensorfs/tensorfs/cluster/etcdtest"
)

// logs collects a member's log lines.
type logs struct {
	mu    sync.Mutex
	lines []string
}

func (l *logs) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *logs) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, substr) {
			n++
		}
	}
	return n
}

func open(t *testing.T, srv *etcdtest.Server, name string, l *logs) *cluster.Member {
	t.Helper()
	cfg := cluster.Config{Endpoints: []string{srv.Endpoint}, Cluster: "t", Name: name, HostID: "host-" + name, TTL: 2 * time.Second, Timeout: 2 * time.Second}
	if l != nil {
		cfg.Logf = l.logf
	}
	m, err := cluster.Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

// listen returns a listening loopback address (a live node's) and closes it
// at cleanup.
func listen(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

func record(name, addr, instance string) cluster.Record {
	return cluster.Record{Name: name, Addr: addr, HostID: "host-" + name, Instance: instance, Protocol: 1,
		Transports: []string{"tcp"}, Devices: []string{"host"}, Started: time.Now().UTC().Truncate(time.Second)}
}

// waitFor waits (10 s at most) until cond holds, woken by the view's
// changes (and every 50 ms, for conditions on time).
func waitFor(t *testing.T, m *cluster.Member, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-m.Changed():
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func rawClient(t *testing.T, srv *etcdtest.Server) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRegisterResolve: two members see each other's records (every field)
// through their watches; the record sits under a lease of the TTL; a clean
// Close deletes it and the other's Resolve says the node shut down.
func TestRegisterResolve(t *testing.T) {
	srv := etcdtest.Start(t)
	a, b := open(t, srv, "a", nil), open(t, srv, "b", nil)
	ra, rb := record("a", listen(t), "ia"), record("b", listen(t), "ib")
	require.NoError(t, a.Register(ra))
	require.NoError(t, b.Register(rb))
	waitFor(t, a, "a sees b", func() bool { _, err := a.Resolve("b"); return err == nil })
	waitFor(t, b, "b sees a", func() bool { _, err := b.Resolve("a"); return err == nil })
	addr, err := a.Resolve("b")
	require.NoError(t, err)
	require.Equal(t, rb.Addr, addr)
	require.Equal(t, rb, a.Nodes()["b"])

	c := rawClient(t, srv)
	resp, err := c.Get(context.Background(), cluster.Key("t", "b"))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	var got map[string]any
	require.NoError(t, json.Unmarshal(resp.Kvs[0].Value, &got))
	for _, f := range []string{"name", "addr", "host_id", "instance", "protocol", "transports", "devices", "started"} {
		require.Contains(t, got, f)
	}
	ttl, err := c.TimeToLive(context.Background(), clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	require.GreaterOrEqual(t, ttl.TTL, int64(0), "a live lease (-1: expired)")
	require.Equal(t, int64(2), ttl.GrantedTTL)

	rep := a.Report()
	require.Equal(t, "connected", rep.State.State)
	require.True(t, rep.State.Registered)
	require.Equal(t, 2, rep.State.Nodes)
	require.True(t, rep.Nodes["a"].Self)
	require.Equal(t, "etcd", rep.Nodes["b"].Source)
	require.False(t, rep.Nodes["b"].SameHost)

	_, err = a.Resolve("nobody")
	require.ErrorIs(t, err, syscall.ENOENT)

	b.Close()
	waitFor(t, a, "b gone", func() bool { _, err := a.Resolve("b"); return err != nil })
	_, err = a.Resolve("b")
	require.ErrorIs(t, err, syscall.EHOSTUNREACH)
	require.Contains(t, err.Error(), "shut down")
	resp, err = c.Get(context.Background(), cluster.Key("t", "b"))
	require.NoError(t, err)
	require.Empty(t, resp.Kvs, "Close deletes the record")
}

// TestExpiry: a record whose lease is not kept alive disappears from the
// view after the TTL, and Resolve says so with EHOSTUNREACH; a new
// instance under the same name is picked up.
func TestExpiry(t *testing.T) {
	srv := etcdtest.Start(t)
	l := &logs{}
	a := open(t, srv, "a", l)
	c := rawClient(t, srv)
	g, err := c.Grant(context.Background(), 1)
	require.NoError(t, err)
	v, _ := json.Marshal(record("z", "127.0.0.1:1", "i1"))
	_, err = c.Put(context.Background(), cluster.Key("t", "z"), string(v), clientv3.WithLease(g.ID))
	require.NoError(t, err)
	waitFor(t, a, "z seen", func() bool { _, err := a.Resolve("z"); return err == nil })
	start := time.Now()
	waitFor(t, a, "z expired", func() bool { _, err := a.Resolve("z"); return err != nil })
	t.Logf("gone %v after it was seen (TTL 1 s; etcd may round it up to its minimum)", time.Since(start))
	_, err = a.Resolve("z")
	require.ErrorIs(t, err, syscall.EHOSTUNREACH)
	require.Contains(t, err.Error(), "lease expired")
	require.Equal(t, 1, l.count("node z (127.0.0.1:1, instance i1) gone"))

	v, _ = json.Marshal(record("z", "127.0.0.1:2", "i2"))
	_, err = c.Put(context.Background(), cluster.Key("t", "z"), string(v))
	require.NoError(t, err)
	waitFor(t, a, "z back", func() bool { addr, _ := a.Resolve("z"); return addr == "127.0.0.1:2" })
	require.Equal(t, "i2", a.Nodes()["z"].Instance)
}

// TestDuplicate: a name held by a live daemon is refused; one held by a
// dead daemon whose lease still runs (its address refuses connections) is
// taken over.
func TestDuplicate(t *testing.T) {
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	require.NoError(t, a.Register(record("a", listen(t), "i1")))
	a2 := open(t, srv, "a", nil)
	err := a2.Register(record("a", listen(t), "i2"))
	require.ErrorIs(t, err, cluster.ErrNameTaken)
	require.Contains(t, err.Error(), "already registered by a live daemon")
	require.False(t, a2.Report().State.Registered)

	// A dead holder: a record under a live lease at an address nobody
	// listens on.
	c := rawClient(t, srv)
	g, err := c.Grant(context.Background(), 30)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	v, _ := json.Marshal(record("d", dead, "old"))
	_, err = c.Put(context.Background(), cluster.Key("t", "d"), string(v), clientv3.WithLease(g.ID))
	require.NoError(t, err)
	l := &logs{}
	d := open(t, srv, "d", l)
	require.NoError(t, d.Register(record("d", listen(t), "new")))
	require.Equal(t, 1, l.count("took over name d from instance old"))
	waitFor(t, a, "a sees d's new instance", func() bool { return a.Nodes()["d"].Instance == "new" })

	// Restarted on the same host and port at once: the old record (live
	// lease) names the address the new daemon listens on.
	addr := listen(t)
	g, err = c.Grant(context.Background(), 30)
	require.NoError(t, err)
	v, _ = json.Marshal(record("e", addr, "old"))
	_, err = c.Put(context.Background(), cluster.Key("t", "e"), string(v), clientv3.WithLease(g.ID))
	require.NoError(t, err)
	e := open(t, srv, "e", l)
	require.NoError(t, e.Register(record("e", addr, "new")))
	require.Equal(t, 1, l.count("took over name e from instance old"))
	// On another host, the same address is someone else's: refused.
	other := record("e", addr, "newer")
	other.HostID = "elsewhere"
	e2 := open(t, srv, "e", nil)
	require.ErrorIs(t, e2.Register(other), cluster.ErrNameTaken)
}

// TestUnreachable: Open fails with ErrUnreachable within its timeout when
// nothing answers.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	start := time.Now()
	_, err = cluster.Open(cluster.Config{Endpoints: []string{"http://" + addr}, Name: "a", Timeout: 500 * time.Millisecond})
	require.True(t, errors.Is(err, cluster.ErrUnreachable), "%v", err)
	require.Less(t, time.Since(start), 3*time.Second)
}

// TestLost: etcd stopped: the member keeps resolving from its last view,
// marked stale, logs the loss once; etcd back: it logs that once, its
// record is there (written again if its lease had expired) and its view
// converges on changes made meanwhile by others.
func TestLost(t *testing.T) {
	srv := etcdtest.Start(t)
	l := &logs{}
	a := open(t, srv, "a", l)
	b := open(t, srv, "b", nil)
	require.NoError(t, a.Register(record("a", listen(t), "ia")))
	require.NoError(t, b.Register(record("b", listen(t), "ib")))
	waitFor(t, a, "a sees b", func() bool { _, err := a.Resolve("b"); return err == nil })

	srv.Stop()
	waitFor(t, a, "lost", func() bool { return a.State() == "lost" })
	_, err := a.Resolve("b")
	require.NoError(t, err, "the last view still resolves")
	rep := a.Report()
	require.True(t, rep.Nodes["b"].Stale)
	require.NotEmpty(t, rep.State.Error)
	// Past the TTL with etcd down: still one line about the loss.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		<-time.After(100 * time.Millisecond)
	}
	require.Equal(t, 1, l.count("serving peers from the last view"), "%v", l.lines)
	b.Close() // cannot deregister: its lease expires after etcd is back

	srv.Restart()
	waitFor(t, a, "connected", func() bool { return a.State() == "connected" })
	require.Equal(t, 1, l.count("reachable again"))
	waitFor(t, a, "a registered", func() bool { return a.Report().State.Registered })
	waitFor(t, a, "b's record expired", func() bool { _, err := a.Resolve("b"); return err != nil })
	c := rawClient(t, srv)
	resp, err := c.Get(context.Background(), cluster.Key("t", "a"))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "a's record is in etcd")
}

// TestTLS: a member reaches an etcd that requires TLS client certificates
// with --etcd-cert/--etcd-key/--etcd-ca's files; without them it is
// refused.
func TestTLS(t *testing.T) {
	ca, cert, key := etcdtest.Certs(t)
	srv := etcdtest.StartWith(t, etcdtest.Options{CertFile: cert, KeyFile: key, CAFile: ca})
	require.True(t, strings.HasPrefix(srv.Endpoint, "https://"))
	m, err := cluster.Open(cluster.Config{Endpoints: []string{srv.Endpoint}, Name: "a", CertFile: cert, KeyFile: key, CAFile: ca, Timeout: 2 * time.Second, TTL: 2 * time.Second})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Register(record("a", listen(t), "ia")))
	waitFor(t, m, "a's own record in its view", func() bool { _, ok := m.Nodes()["a"]; return ok })
	_, err = cluster.Open(cluster.Config{Endpoints: []string{srv.Endpoint}, Name: "b", CAFile: ca, Timeout: time.Second})
	require.Error(t, err, "no client certificate")
}

// TestAuth: with etcd's auth on, the right user and password work; a
// wrong password is refused at Open with etcd's reason, at once.
func TestAuth(t *testing.T) {
	srv := etcdtest.Start(t)
	c := rawClient(t, srv)
	ctx := context.Background()
	_, err := c.UserAdd(ctx, "root", "rootpw")
	require.NoError(t, err)
	_, err = c.UserGrantRole(ctx, "root", "root")
	require.NoError(t, err)
	_, err = c.AuthEnable(ctx)
	require.NoError(t, err)
	m, err := cluster.Open(cluster.Config{Endpoints: []string{srv.Endpoint}, Name: "a", Username: "root", Password: "rootpw", Timeout: 2 * time.Second, TTL: 2 * time.Second})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Register(record("a", listen(t), "ia")))
	start := time.Now()
	_, err = cluster.Open(cluster.Config{Endpoints: []string{srv.Endpoint}, Name: "b", Username: "root", Password: "wrong", Timeout: 2 * time.Second})
	require.Error(t, err)
	require.NotErrorIs(t, err, cluster.ErrUnreachable)
	require.Contains(t, err.Error(), "authentication failed")
	require.Less(t, time.Since(start), time.Second)
}
