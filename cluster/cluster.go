// Package cluster is a tensorfs node's membership of a cluster kept in etcd
// (DESIGN.md, "Between hosts: UCX for the bytes, etcd for the membership").
//
// Each daemon registers its Record at Key(cluster, name) under an etcd lease
// that it keeps alive (TTL Config.TTL); a daemon that dies stops renewing
// the lease and etcd deletes the record when it expires. A second live
// daemon claiming a name is refused (a transaction on the key's absence, or
// on a stale holder: no lease, a goodbye record, or an address that refuses
// connections).
//
// Every member watches the prefix Prefix(cluster) and keeps a local view of
// the live records, so resolving a peer's name (Member.Resolve, the
// transfer.Resolver the peer service asks on every dial) costs no etcd round
// trip. A name whose record went away stays known as gone, with the reason,
// so that a copy to it fails at once with EHOSTUNREACH and says why.
//
// etcd unreachable at Open is an error (the daemon refuses to start); lost
// later, the member keeps resolving from the last view (reported stale),
// retries, logs once per change of state, re-registers when its lease
// expired meanwhile, and reloads the whole view when etcd answers again, so
// views converge. etcd says where a node is, never who may talk to it: the
// peer service's shared secret still authenticates every connection.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tensorfs/tensorfs/transfer"
)

// Defaults of Config.
const (
	// DefaultCluster is the cluster's name when Config.Cluster is "".
	DefaultCluster = "default"
	// DefaultTTL is the lease's time to live when Config.TTL is 0.
	DefaultTTL = 10 * time.Second
	// DefaultTimeout bounds each etcd request when Config.Timeout is 0.
	DefaultTimeout = 5 * time.Second
)

// statsMax is how many nodes Report lists at most (this node always among
// them): the stats document is an xattr value, which Linux caps at 64 KiB.
const statsMax = 64

// goneMax is how many departed names the view remembers (for EHOSTUNREACH
// and its reason); the oldest are forgotten first.
const goneMax = 4096

// Config configures a Member.
type Config struct {
	// Endpoints are etcd's client URLs (http://HOST:PORT, https:// with TLS).
	Endpoints []string
	// Cluster names the cluster: records live under Prefix(Cluster).
	// Default DefaultCluster. No '/'.
	Cluster string
	// Name and HostID are this node's (for Report's Self and SameHost; the
	// record Register writes carries its own).
	Name, HostID string
	// CertFile and KeyFile are a client certificate for etcd's TLS, CAFile
	// the CA that signed etcd's server certificate; all "" for plain http.
	CertFile, KeyFile, CAFile string
	// Username and Password authenticate to etcd (its auth); "" for none.
	Username, Password string
	// TTL is the lease's time to live (whole seconds, at least 1 s; etcd may
	// raise it to its minimum). Default DefaultTTL.
	TTL time.Duration
	// Timeout bounds each etcd request (at Open, Register and Close, and
	// each health probe). Default DefaultTimeout.
	Timeout time.Duration
	// Logf logs state changes, departures and arrivals, printf-style;
	// default: slog's default logger at info, the line formatted as its
	// message.
	Logf func(format string, args ...any)
}

// Record is a node's registration: the JSON value at Key(cluster, name).
type Record struct {
	// Name is the node's name (--name), the last element of its key.
	Name string `json:"name"`
	// Addr is HOST:PORT where its peer service listens.
	Addr string `json:"addr"`
	// HostID is its host identity: same HostID, same host (IPC path).
	HostID string `json:"host_id"`
	// Instance is the id of this run of the node (transfer.Service.Instance).
	Instance string `json:"instance"`
	// Protocol is its peer protocol version (transfer.ProtocolVersion).
	Protocol int `json:"protocol"`
	// Transports are the ways it moves bytes: "tcp" (later "ucx").
	Transports []string `json:"transports"`
	// Devices are its devices by name ("host", "cuda:0", ...).
	Devices []string `json:"devices"`
	// Started is when the run started.
	Started time.Time `json:"started"`
	// Leaving is set on the record's last version, written just before a
	// clean shutdown deletes it, so that peers can say why it went.
	Leaving bool `json:"leaving,omitempty"`
}

// Prefix is the key prefix of a cluster's records: /tensorfs/CLUSTER/nodes/.
func Prefix(cluster string) string { return "/tensorfs/" + cluster + "/nodes/" }

// Key is the key of a node's record: /tensorfs/CLUSTER/nodes/NAME.
func Key(cluster, name string) string { return Prefix(cluster) + name }

// Errors of Open and Register.
var (
	// ErrUnreachable: etcd did not answer within Config.Timeout.
	ErrUnreachable = errors.New("etcd unreachable")
	// ErrNameTaken: a live node holds the name in the cluster.
	ErrNameTaken = errors.New("name taken")
)

// gone is a departed node's name's memory: when and why it left.
type gone struct {
	at     time.Time
	reason string
}

// Member is a node's membership: a view of the cluster kept by a watch, and
// after Register its own record kept alive. It is a transfer.Resolver.
type Member struct {
	cfg    Config
	cli    *clientv3.Client
	prefix string
	logf   func(string, ...any)

	ctx       context.Context // ends at Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	resync    chan struct{} // asks the watch loop to reload the view
	closeOnce sync.Once

	mu      sync.RWMutex
	nodes   map[string]Record
	gone    map[string]gone
	rev     int64
	state   string // "connected" or "lost"
	since   time.Time
	lastErr string
	changed chan struct{} // closed and replaced at every change of the view

	// Own registration (Register).
	regMu      sync.Mutex
	rec        *Record
	lease      clientv3.LeaseID
	registered bool
	lastAlive  time.Time // the last keep-alive answer
}

// Open connects to etcd, loads the cluster's view and starts watching it.
// Errors: a bad Config (no endpoints, a '/' in Cluster, a TTL under 1 s,
// unreadable TLS files), ErrUnreachable (wrapped with the endpoints and the
// cause) when etcd does not answer within Config.Timeout, and etcd's own
// (e.g. authentication failed).
func Open(cfg Config) (*Member, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("no etcd endpoints")
	}
	if cfg.Cluster == "" {
		cfg.Cluster = DefaultCluster
	}
	if strings.ContainsAny(cfg.Cluster, "/ ") {
		return nil, fmt.Errorf("cluster name %q: no '/' or spaces", cfg.Cluster)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("etcd lease TTL %v: at least 1s", cfg.TTL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(format string, args ...any) { slog.Info(fmt.Sprintf(format, args...)) }
	}
	ccfg := clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.Timeout,
		Username:    cfg.Username,
		Password:    cfg.Password,
		// The client's own retries would log every failed attempt: the
		// member logs once per change of state instead.
		Logger: zap.NewNop(),
		// Keep the gRPC connection's health checked while idle (the view's
		// watch is its only traffic between copies).
		DialKeepAliveTime:    cfg.Timeout,
		DialKeepAliveTimeout: cfg.Timeout,
		PermitWithoutStream:  true,
	}
	if cfg.CertFile != "" || cfg.KeyFile != "" || cfg.CAFile != "" {
		tc, err := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %v", err)
		}
		ccfg.TLS = tc
	}
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return nil, unreachable(cfg.Endpoints, err)
	}
	m := &Member{cfg: cfg, cli: cli, prefix: Prefix(cfg.Cluster), logf: logf, resync: make(chan struct{}, 1),
		nodes: map[string]Record{}, gone: map[string]gone{}, state: "connected", since: time.Now(), changed: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	ctx, cancel := context.WithTimeout(m.ctx, cfg.Timeout)
	rev, err := m.load(ctx, false)
	cancel()
	if err != nil {
		m.cancel()
		cli.Close()
		return nil, unreachable(cfg.Endpoints, err)
	}
	m.wg.Add(2)
	go m.watchLoop(rev)
	go m.healthLoop()
	return m, nil
}

// unreachable wraps a failure to reach etcd: ErrUnreachable for a timeout,
// etcd's own error (auth, TLS) otherwise.
func unreachable(endpoints []string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w at %s: no answer (%v)", ErrUnreachable, strings.Join(endpoints, ","), err)
	}
	return fmt.Errorf("etcd at %s: %v", strings.Join(endpoints, ","), err)
}

// Cluster is the cluster's name.
func (m *Member) Cluster() string { return m.cfg.Cluster }

// TTL is the lease's time to live as configured.
func (m *Member) TTL() time.Duration { return m.cfg.TTL }

// Close ends the membership: a registered node's record is marked leaving
// and deleted (its lease revoked), within Config.Timeout at most, so that
// peers see it go at once and why; then the watch stops and the client
// closes. An unreachable etcd only costs the timeout (the lease then
// expires on its own). A nil Member, or a second Close, does nothing.
// Always returns nil.
func (m *Member) Close() error {
	if m == nil {
		return nil
	}
	m.closeOnce.Do(func() {
		m.cancel()
		m.wg.Wait()
		m.deregister()
		m.cli.Close()
	})
	return nil
}

// Resolve returns the address of the named node in the view: the transfer
// service's Resolver. It never touches the network: a view kept by the
// watch answers, and the last view while etcd is lost. Errors: a
// *transfer.Error with EHOSTUNREACH for a node that left (the reason and
// time in its message), ENOENT for a name never seen.
func (m *Member) Resolve(name string) (string, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if r, ok := m.nodes[name]; ok {
		return r.Addr, nil
	}
	if g, ok := m.gone[name]; ok {
		return "", &transfer.Error{Errno: syscall.EHOSTUNREACH, Msg: fmt.Sprintf("peer %s left cluster %s at %s (%s ago): %s",
			name, m.cfg.Cluster, g.at.UTC().Format(time.RFC3339), time.Since(g.at).Round(time.Millisecond), g.reason)}
	}
	return "", &transfer.Error{Errno: syscall.ENOENT, Msg: fmt.Sprintf("unknown peer %q: not in cluster %s (%d nodes in etcd) and not given with --peer", name, m.cfg.Cluster, len(m.nodes))}
}

// Nodes returns the view's live records, by name (a copy).
func (m *Member) Nodes() map[string]Record {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make(map[string]Record, len(m.nodes))
	for n, r := range m.nodes {
		out[n] = r
	}
	return out
}

// Changed returns a channel closed at the view's next change (a record
// added, replaced or gone, or the state changed): wait on it, then look
// again.
func (m *Member) Changed() <-chan struct{} {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.changed
}

// notify wakes Changed's waiters; m.mu held.
func (m *Member) notify() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// Report is the view for stats (transfer.Resolver): at most statsMax
// nodes, this one first, then by name (the count of all is in the state's
// Nodes), and the state.
func (m *Member) Report() transfer.ResolverReport {
	m.mu.RLock()
	names := make([]string, 0, len(m.nodes))
	for n := range m.nodes {
		if n != m.cfg.Name {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if _, ok := m.nodes[m.cfg.Name]; ok {
		names = append([]string{m.cfg.Name}, names...)
	}
	if len(names) > statsMax {
		names = names[:statsMax]
	}
	stale := m.state != "connected"
	out := transfer.ResolverReport{Nodes: make(map[string]transfer.PeerReport, len(names))}
	for _, n := range names {
		r := m.nodes[n]
		out.Nodes[n] = transfer.PeerReport{Addr: r.Addr, Source: "etcd", Self: n == m.cfg.Name, HostID: r.HostID,
			SameHost: r.HostID == m.cfg.HostID && m.cfg.HostID != "", Instance: r.Instance, Transports: r.Transports,
			Since: r.Started.UTC().Format(time.RFC3339), Stale: stale}
	}
	st := &transfer.ClusterReport{Backend: "etcd", Endpoints: m.cfg.Endpoints, Cluster: m.cfg.Cluster, State: m.state,
		Since: m.since.UTC().Format(time.RFC3339), Nodes: len(m.nodes), Revision: m.rev}
	if stale {
		st.Error = m.lastErr
	}
	m.mu.RUnlock()
	m.regMu.Lock()
	st.Registered = m.registered
	m.regMu.Unlock()
	out.State = st
	return out
}

// List reads a cluster's records straight from etcd (for tensorfs nodes):
// one request, no watch. Errors: as Open's.
func List(cfg Config) ([]Record, error) {
	cfg.Logf = func(string, ...any) {}
	m, err := Open(cfg)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	nodes := m.Nodes()
	out := make([]Record, 0, len(nodes))
	for _, r := range nodes {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// decode parses a record's value; the name comes from the key.
func decode(name string, v []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(v, &r); err != nil {
		return r, err
	}
	if r.Addr == "" {
		return r, errors.New("no addr")
	}
	r.Name = name
	return r, nil
}
