package main

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"log"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/dustin/go-humanize"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spf13/cobra"

	"github.com/tensorfs/tensorfs/cluster"
	"github.com/tensorfs/tensorfs/fs"
	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/metrics"
	"github.com/tensorfs/tensorfs/mountpoint"
	"github.com/tensorfs/tensorfs/namespace"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// newMountCmd is the mount command: its flags, their checks, and its --help,
// which is most of its length (the help is the flags' manual, kept beside
// them so that it stays true to them).
func newMountCmd() *cobra.Command {
	var (
		device     string
		maxMemory  string
		allowOther bool
		debug      bool
		revoke     time.Duration
		metricsAt  string
		pc         peerFlags
		ec         etcdFlags
		lf         logFlags
		configFile string
	)
	cmd := &cobra.Command{
		Use:   "mount [MOUNTPOINT]",
		Short: "Mount a tensor filesystem and serve it in the foreground until SIGINT/SIGTERM",
		Long: `Mount a tensor filesystem at MOUNTPOINT (or the --config file's
mountpoint) and serve it in the foreground.
SIGINT or SIGTERM unmounts, frees every tensor and exits 0. A stale mount left
at MOUNTPOINT by a killed daemon is cleaned up first.

--device picks the default device of tensors: auto (cuda:0 when a CUDA driver
and GPU are present, else host), host, or cuda:N.
--max-memory caps the bytes tensorfs may allocate on the default device
(e.g. 8GiB, 512MB, 1073741824); default: the device's available memory.

Peers: --name names this node (default: the hostname); --listen HOST:PORT
accepts peers (the mount appears once the listener is up); --peer NAME=HOST:PORT
(repeatable) names the nodes that peer paths NAME:/path reach; --secret-file
holds the shared secret (at least 16 bytes, one trailing newline stripped, not
readable by group or others); listening on a non-loopback address needs one.
--host-id overrides the host identity (default: the kernel's boot id); peers
of one host id copy by IPC, and, in one network and PID namespace, after a
TCP handshake to the peer's address connect over its listener's abstract unix
socket (@tensorfs-INSTANCE; Linux 6.5 and later), checking that the peer's
process listens there.
--timeout bounds how long a copy waits on a silent peer. --idle-timeout
(default 30s) is how long a connection to a peer stays open after a copy, for
the next one (kept alive by keepalives, at most 16 per peer): a copy then pays
no dial or handshake. --spin (default 1ms; 0 on a host of fewer than 4 CPUs)
is how long a peer connection polls its socket for the next frame (a copy's
reply, the next request of a burst, a stream's next chunk) before the thread
sleeps: a sleeping thread's wake-up costs a small copy 8-16 µs each way; the
poll costs a core for at most that long per wait. Without GOMAXPROCS in the
environment, a host of fewer than 4 CPUs runs the daemon with two more than
the Go runtime's default (its FUSE readers wait holding them).

--streams N spreads each large copy over N parallel TCP connections to the
peer (1 to 8; default 2): chunks of at least 4 per stream, each counted
exactly once; a stream that dies fails the whole copy. The receiving side of a
copy decides, up to what the asking side offers.

--checksum xxh3 (the default) sends each chunk of a TCP copy with the low 32
bits of its XXH3, which the receiver checks; a peer that runs crc32c, or a
release that predates xxh3, gets and sends CRC32C instead (a third of XXH3's
speed on the AMD hosts measured). A chunk of host memory is summed where it
lies: written from the source's memory (writev), read straight into the
destination's and summed there. A process writing either through its
mapping, or another copy into the same bytes, can make a sum disagree; a
mismatch there runs the copy once more from buffers (logged; stats
copies.rechecked on the node that asked for the copy), where a mismatch
fails it (EIO). none leaves the check to TCP's own checksum, as raw TCP and
UCX's TCP transport do. A copy goes without only when both nodes say none
(stats: each peer's and each TCP transfer's checksum).

--transport (a build with UCX, -tags ucx): auto moves a copy's bytes with a
peer of another host on UCX where the endpoint to it is one-sided and detects
a dead peer (RDMA verbs), else on TCP; ucx refuses such a copy otherwise
(EPROTONOSUPPORT); tcp opens no UCX. --ucx-any-endpoint uses any UCX endpoint
(UCX's tcp and shared memory, whose puts and gets UCX emulates or whose peer's
death aborts this daemon): for testing the UCX path without RDMA
(docs/ucx.md).

Cluster through etcd: --etcd ENDPOINTS (comma-separated) registers this node
at /tensorfs/CLUSTER/nodes/NAME (--cluster, default "default") under a lease
of --etcd-ttl that it keeps alive, and finds peers by name through a watch of
the cluster (no --peer lists; --peer still wins for the names it gives). It
needs --listen; --advertise HOST:PORT is the address registered (default: the
listener's). The mount appears once the record is written; SIGTERM deletes it.
A name held by another live node, or etcd not answering within --timeout at
start, is refused. etcd lost later: peers are resolved from the last view
while the daemon retries (stats "cluster" says so). --etcd-cert, --etcd-key,
--etcd-ca: etcd's TLS; --etcd-user USER[:PASSWORD] (USER alone: the password
from $ETCD_PASSWORD). The shared secret still authenticates every peer.

--revoke-timeout bounds how long freeing a tensor waits for the peer daemons
that cached an import of it (a dead peer's leases end with its connection; a
silent one's after this time, logged).

--metrics HOST:PORT serves Prometheus metrics over HTTP at /metrics
(tensorfs_*: tensors and bytes per device, allocations, registrations,
exports, leases, revocations, copies and bytes by path and mode with a
latency histogram, copies run again after a checksum mismatch, FUSE
requests and errnos by operation, peer connections; README "Metrics" lists
them). The listener is up before the
mount appears; an address that cannot be listened on is refused at start.
The metrics carry counts, never names or secrets, and need no
--secret-file; bind them to loopback or a monitoring network.

Logs go to stderr through log/slog: --log-format text (key=value, the
default) or json (one object a line); --log-level debug, info (default), warn
or error. Every copy logs one line at its end (path local/ipc/tcp/ucx, mode,
bytes, seconds); successful in-place copies at most one a second at info,
each one at debug.

--config FILE reads the mount's settings from a YAML file: "mountpoint" (in
place of the argument) and any flag of this command by its name without the
dashes (device, name, listen, peer: a list, secret-file, etcd: a list or a
comma-separated string, cluster, log-level, ...); "metrics" sets --metrics. A flag given on the command line wins over the file; an unknown
key is an error that names it.

Under systemd (Type=notify, $NOTIFY_SOCKET set) the daemon sends READY=1 once
it is mounted and listening, and STOPPING=1 when it starts shutting down
(scripts/tensorfs.service).`,
		Args: positional(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt, err := applyConfig(cmd.Flags(), configFile, args)
			if err != nil {
				return err
			}
			if err := lf.setup(os.Stderr); err != nil {
				return err
			}
			var limit uint64
			if maxMemory != "" {
				var err error
				if limit, err = humanize.ParseBytes(maxMemory); err != nil || limit > 1<<62 {
					return fmt.Errorf("--max-memory %q: not a byte size (e.g. 8GiB, 512MB, 1073741824)", maxMemory)
				}
			}
			cfg, err := pc.config()
			if err != nil {
				return err
			}
			if revoke <= 0 {
				return fmt.Errorf("--revoke-timeout %v: must be positive", revoke)
			}
			var cc *cluster.Config
			if ec.enabled() {
				if cfg.Listen == "" {
					return fmt.Errorf("--etcd needs --listen HOST:PORT: the address this node registers for its peers")
				}
				c, err := ec.config(cfg.Name, cfg.HostID, cfg.Timeout)
				if err != nil {
					return err
				}
				// The cluster's lines are printf-formatted; they carry its
				// name as an attribute for a filter.
				c.Logf = func(format string, args ...any) {
					slog.Info(fmt.Sprintf(format, args...), "cluster", c.Cluster)
				}
				cc = &c
			} else if cmd.Flags().Changed("advertise") {
				return fmt.Errorf("--advertise needs --etcd")
			}
			o := fs.Options{AllowOther: allowOther, Debug: debug, FSName: mountSource(cfg.Name)}
			return runMount(mnt, device, int64(limit), revoke, o, cfg, pc.transport, cc, ec.advertise, metricsAt)
		},
	}
	f := cmd.Flags()
	f.StringVar(&device, "device", "auto", "default device: auto, host or cuda:N")
	f.StringVar(&maxMemory, "max-memory", "", "cap on allocated bytes (default: available memory)")
	f.BoolVar(&allowOther, "allow-other", false, "let other users access the mount (FUSE allow_other)")
	f.BoolVar(&debug, "debug", false, "log every FUSE request")
	f.DurationVar(&revoke, "revoke-timeout", 10*time.Second, "how long freeing a tensor waits for peers holding an import of it")
	f.StringVar(&configFile, "config", "", "YAML file of mount settings (flags by name, and mountpoint); the command line wins")
	f.StringVar(&metricsAt, "metrics", "", "serve Prometheus metrics at http://HOST:PORT/metrics (default: none)")
	pc.register(f)
	ec.register(f, true)
	lf.register(f)
	return cmd
}

// mountSourcePrefix starts the source of a tensorfs mount in
// /proc/self/mounts; the node's name follows it.
const mountSourcePrefix = "tensorfs:"

// mountSource is the source a mount shows in /proc/self/mounts (and df):
// "tensorfs:NAME", so that status, and anyone reading the mount table,
// knows which node serves it without asking the daemon. A name the mount
// options cannot carry (a ',' separates them) leaves it "tensorfs".
func mountSource(name string) string {
	if name == "" || strings.ContainsAny(name, ",\\ \t\n") {
		return "tensorfs"
	}
	return mountSourcePrefix + name
}

// runMount serves a mount until a signal; with cc (--etcd) the node joins
// the cluster, registered at advertise (or its listener's address), before
// the mount appears; with metricsAt (--metrics HOST:PORT) its metrics are
// served there, from before the mount appears.
func runMount(mountpoint, device string, limit int64, revoke time.Duration, o fs.Options, peerCfg transfer.Config, transport string, cc *cluster.Config, advertise, metricsAt string) error {
	// Catch signals before mounting: go-fuse's mount makes a request on the
	// new mount from this process (its poll check), and a process killed by a
	// default-action SIGINT while waiting for its own reply hangs in exit and
	// leaves a mount that hangs everyone who touches it (seen in the tests).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	// A log written to a pipe whose reader is gone (a log collector that
	// died, the test process that started us) must cost the log line, not
	// the daemon: Go's default for a broken stdout or stderr is death by
	// SIGPIPE at the next line, which left a dead mount behind ("stopping"
	// is logged on the way out). Ignored, the write fails with EPIPE.
	signal.Ignore(syscall.SIGPIPE)
	if stop, err := profiles(os.Getenv("TENSORFS_CPUPROFILE"), os.Getenv("TENSORFS_ALLOCPROFILE"), os.Getenv("TENSORFS_TRACE")); err != nil {
		return err
	} else {
		defer stop()
	}
	// Before opening devices, so that a refusal is the only line printed.
	if err := checkMountpoint(mountpoint); err != nil {
		return err
	}
	// The metrics' address next, for the same reason; the hooks go into
	// the store and the peer service, the collector once they exist.
	var (
		met   *metrics.Metrics
		metLn net.Listener
	)
	if metricsAt != "" {
		ln, err := metrics.Listen(metricsAt)
		if err != nil {
			return err
		}
		metLn = ln
		defer metLn.Close() // a failure before Serve; Serve's stop closes it too
		met = metrics.New()
		peerCfg.CopyDone = met.ObserveCopy
		o.Counts = &fs.OpCounts{}
	}
	// etcd before the devices too: unreachable is a one-line refusal.
	var member *cluster.Member
	if cc != nil {
		m, err := cluster.Open(*cc)
		if err != nil {
			return err
		}
		member = m
		peerCfg.Resolver = m
		defer member.Close()
	}
	devs, notes, err := openDevices(device, limit)
	if err != nil {
		return err
	}
	storeCfg := tensor.Config{Devices: devs, RevokeTimeout: revoke}
	if met != nil {
		storeCfg.OnRevoke = met.ObserveRevoke
	}
	store, err := tensor.NewStore(storeCfg)
	if err != nil {
		return err
	}
	// Deferred: it runs after every path's store.Close, once the last
	// region is unmapped (a region still pinned then is unmapped by UCX's
	// cleanup).
	rma, closeUCX, err := openUCX(transport, store.MRs, peerCfg.Spin)
	if err != nil {
		store.Close()
		return err
	}
	defer closeUCX()
	if rma == nil && peerCfg.RMAAnyEndpoint {
		store.Close()
		return fmt.Errorf("--ucx-any-endpoint: no UCX here (--transport tcp, a build without UCX, or no UCX context: the log says which)")
	}
	peerCfg.RMA = rma
	peerCfg.RMARequired = rma != nil && transport == "ucx"
	peerCfg.Importers = namespace.Importers(store)
	peerCfg.ImportFile = namespace.ImportFile(store)
	root, peers, err := fs.NewRoot(fs.Config{
		Store: store,
		Peers: func(local transfer.Local) (*transfer.Service, error) { return transfer.New(peerCfg, local) },
	})
	if err != nil {
		store.Close()
		return err
	}
	// The listener is up before the mount appears: a mounted node is ready.
	if err := peers.Start(); err != nil {
		store.Close()
		return err
	}
	// Registered before the mount appears: a mounted node is findable.
	if member != nil {
		if advertise, err = register(member, peers, devs, advertise, rma != nil); err != nil {
			peers.Close()
			store.Close()
			return err
		}
	}
	// Served before the mount appears: a mounted node is observable.
	stopMetrics := func() {}
	if met != nil {
		if err := met.Watch(metrics.Sources{Store: store, Peers: peers, Ops: o.Counts}); err != nil {
			member.Close()
			peers.Close()
			store.Close()
			return err
		}
		stopMetrics = met.Serve(metLn)
		log.Printf("metrics: serving http://%s/metrics", metLn.Addr())
	}
	srv, err := fs.Mount(mountpoint, root, o)
	if err != nil {
		stopMetrics()
		member.Close()
		peers.Close()
		store.Close()
		return err
	}
	for _, n := range notes {
		slog.Info(n, "device", device)
	}
	if member != nil {
		slog.Info("registered in the cluster", "cluster", member.Cluster(), "name", peerCfg.Name, "addr", advertise,
			"ttl", member.TTL(), "nodes", len(member.Nodes()))
	}
	listen := ""
	if a := peers.Addr(); a != nil {
		listen = a.String() // the port bound, when --listen asked for :0
	}
	logMounted(mountpoint, device, devs[0], limit, peerCfg, listen)
	// Mounted, listening (peers.Start) and registered: ready for systemd.
	notify(daemon.SdNotifyReady)

	serveUntilSignal(srv, mountpoint, sig)
	// Out of the cluster first: peers see this node go at once.
	member.Close()
	stopMetrics()
	peers.Close()
	store.Close()
	for _, d := range devs {
		d.Close()
	}
	return nil
}

// checkMountpoint refuses a mountpoint that is not a directory, and cleans
// up a stale mount left there (fs.CleanStale).
func checkMountpoint(mountpoint string) error {
	st, err := os.Stat(mountpoint)
	if err != nil && !errors.Is(err, syscall.ENOTCONN) {
		return fmt.Errorf("mountpoint: %w", err)
	}
	if err == nil && !st.IsDir() {
		return fmt.Errorf("mountpoint %s is not a directory", mountpoint)
	}
	return fs.CleanStale(mountpoint)
}

// logMounted logs the ready line the tests and scripts wait for (message
// "mounted"), after a note when --max-memory was capped. It says what an
// operator checks first: the device asked for and the one chosen, the
// memory cap, where peers connect, which peers are named and by which
// transports copies can go.
func logMounted(mountpoint, asked string, def gpu.Device, limit int64, pc transfer.Config, listen string) {
	mi := def.MemInfo()
	if limit > mi.Total {
		slog.Warn("--max-memory is more than the device can give; capped", "max_memory", humanize.IBytes(uint64(limit)),
			"device", def.Name(), "capacity", humanize.IBytes(uint64(mi.Total)))
	}
	maxMem := "available"
	if limit > 0 {
		maxMem = humanize.IBytes(uint64(min(limit, mi.Total)))
	}
	peers := make([]string, 0, len(pc.Peers))
	for name, addr := range pc.Peers {
		peers = append(peers, name+"="+addr)
	}
	sort.Strings(peers)
	// local always; tcp to any peer; ipc to a peer on this host whose
	// memory it can map (chosen per copy, falling back to tcp); ucx with
	// a UCX context.
	transports := []string{"local"}
	if listen != "" || len(pc.Peers) > 0 || pc.Resolver != nil {
		transports = append(transports, "tcp", "ipc")
		if pc.RMA != nil {
			// ucx to a peer of another host whose endpoint carries
			// copies.
			transports = append(transports, "ucx")
		}
	}
	if listen == "" {
		listen = "none"
	}
	slog.Info("mounted", "mountpoint", mountpoint, "device_flag", asked, "device", def.Name(),
		"capacity", humanize.IBytes(uint64(mi.Total)), "max_memory", maxMem, "name", pc.Name, "listen", listen,
		"peers", peers, "cluster", pc.Resolver != nil, "transports", transports)
}

// notify sends state to systemd when it started the daemon as
// Type=notify ($NOTIFY_SOCKET); elsewhere it does nothing. A failure to
// send is logged, not fatal: the mount serves either way, and systemd
// then says the start timed out.
func notify(state string) {
	if ok, err := daemon.SdNotify(false, state); err != nil {
		slog.Warn("systemd notify failed", "state", state, "err", err)
	} else if ok {
		slog.Debug("systemd notified", "state", state)
	}
}

// serveUntilSignal serves the mount until it is unmounted from outside, or
// a SIGINT/SIGTERM on sig unmounts it (lazily when busy; a second signal, or
// 5 s, stops waiting for its users).
func serveUntilSignal(srv *fuse.Server, mountpoint string, sig <-chan os.Signal) {
	done := make(chan struct{})
	go func() { srv.Wait(); close(done) }()
	select {
	case s := <-sig:
		notify(daemon.SdNotifyStopping)
		slog.Info("unmounting", "signal", s.String(), "mountpoint", mountpoint)
		if err := srv.Unmount(); err != nil {
			// Busy (a process has its cwd or a file there): detach lazily; the
			// kernel ends the connection when the last user leaves, or when
			// this process exits below.
			slog.Warn("unmount failed; detaching", "mountpoint", mountpoint, "err", err)
			syscall.Unmount(mountpoint, syscall.MNT_DETACH)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			slog.Warn("still in use after 5s; exiting anyway (its users get ENOTCONN)", "mountpoint", mountpoint)
		case s := <-sig:
			slog.Warn("signalled again: exiting now", "signal", s.String())
		}
	case <-done:
		// Unmounted from outside (tensorfs unmount, systemd's ExecStop):
		// the daemon stops all the same.
		notify(daemon.SdNotifyStopping)
		slog.Info("unmounted from outside; stopping", "mountpoint", mountpoint)
	}
}

// newUnmountCmd is the unmount command; --config takes the mountpoint
// from a mount's config file (the service's ExecStop).
func newUnmountCmd() *cobra.Command {
	var configFile string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "unmount [MOUNTPOINT]",
		Short: "Unmount a tensor filesystem (the daemon then frees everything and exits 0)",
		Long: `Unmount the tensor filesystem at MOUNTPOINT; its daemon then frees every
tensor and exits 0, and unmount returns once it has (--wait, default 30s; an
error if it is still running then). MOUNTPOINT must be the directory a tensorfs is mounted on:
a path that does not exist, is not a directory, or has no tensorfs mounted on
it is refused with a line saying which. --config FILE unmounts the mountpoint
that FILE (a tensorfs mount --config file) names, in place of the argument.`,
		Args: positional(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var dir string
			switch {
			case len(args) == 1:
				dir = args[0]
			case configFile != "":
				m, err := configMountpointOf(configFile)
				if err != nil {
					return err
				}
				dir = m
			default:
				return &usageError{"unmount: missing MOUNTPOINT"}
			}
			if err := checkUnmountable(dir); err != nil {
				return err
			}
			// The daemon frees everything after the mount is gone: wait
			// for it, so that what runs next (a new mount, a job that
			// needs the GPU memory) finds it done.
			daemon := daemonOf(dir)
			err := syscall.Unmount(dir, 0)
			if err == syscall.EBUSY {
				return fmt.Errorf("unmount %s: busy (a process has files open there)", dir)
			}
			if err != nil {
				// Not root: fusermount3 unmounts our own FUSE mounts.
				if out, ferr := runFusermount(dir); ferr != nil {
					return fmt.Errorf("unmount %s: %v; fusermount3: %s", dir, err, out)
				}
			}
			if daemon.pid > 0 && wait > 0 && !daemon.exited(wait) {
				return fmt.Errorf("unmount %s: unmounted, but its daemon (pid %d) has not exited after %s", dir, daemon.pid, wait)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&configFile, "config", "", "take MOUNTPOINT from this tensorfs mount --config file")
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the daemon to free everything and exit once unmounted (0: do not wait)")
	return cmd
}

// daemonProc is the daemon process of a mount, as found before unmounting
// it: its pid (0: not found) and its start time (/proc/PID/stat's 22nd
// field), so that a reused pid is not taken for it.
type daemonProc struct {
	pid   int
	start string
}

// daemonOf finds the daemon serving the tensorfs mounted at dir: the pid
// its stats report, when that process holds /dev/fuse open (a pid of
// another PID namespace names some other process, or none). Zero when it
// cannot tell (a dead daemon's mount, whose stats cannot be read).
func daemonOf(dir string) daemonProc {
	st, err := readStats(dir)
	if err != nil || st.PID <= 0 {
		return daemonProc{}
	}
	start, _ := procState(st.PID)
	if start == "" || !holdsFUSE(st.PID) {
		return daemonProc{}
	}
	return daemonProc{pid: st.PID, start: start}
}

// exited waits up to wait for the daemon to exit: its /proc entry gone, a
// zombie (its parent has not reaped it yet), or another process with its
// pid. False when it is still running then.
func (d daemonProc) exited(wait time.Duration) bool {
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		start, state := procState(d.pid)
		if start != d.start || state == "Z" || state == "X" {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// procState is the start time and the state letter of process pid, from
// /proc/PID/stat; "" when there is no such process.
func procState(pid int) (start, state string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", ""
	}
	// The command, field 2, is in parentheses and may hold spaces: the
	// fields after its last ')' are state (3) onwards.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", ""
	}
	return f[19], f[0] // starttime is field 22, state field 3
}

// holdsFUSE reports whether process pid has /dev/fuse open (a FUSE daemon
// serving a mount does).
func holdsFUSE(pid int) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if t, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && t == "/dev/fuse" {
			return true
		}
	}
	return false
}

// checkUnmountable says why dir cannot be unmounted as a tensorfs, nil when
// it can: no such directory, not a directory, or not a tensorfs mount (with
// what is mounted there, if anything). A dead daemon's mount (stat fails
// with ENOTCONN) is still a tensorfs mount, and unmounting it is the cure.
func checkUnmountable(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED):
	case errors.Is(err, iofs.ErrNotExist):
		return fmt.Errorf("unmount %s: no such directory", dir)
	case err != nil:
		return fmt.Errorf("unmount %s: %v", dir, err)
	case !st.IsDir():
		return fmt.Errorf("unmount %s: not a directory (not a tensorfs mount)", dir)
	}
	if mountpoint.IsMounted(dir) {
		return nil
	}
	if abs, err := filepath.Abs(dir); err == nil {
		if ms, err := readMounts(); err == nil {
			if mp, fstype := mountOf(ms, abs); mp == abs {
				return fmt.Errorf("unmount %s: not a tensorfs mount (a %s filesystem is mounted there)", dir, fstype)
			}
			if mp, fstype := mountOf(ms, abs); fstype == cpFSType {
				return fmt.Errorf("unmount %s: not a tensorfs mount (a directory inside the tensorfs mounted at %s)", dir, mp)
			}
		}
	}
	return fmt.Errorf("unmount %s: not a tensorfs mount (nothing is mounted there)", dir)
}

// profiles writes the daemon's CPU profile (runtime/pprof) from now until
// stop to cpu, its allocation profile (every allocation since start, by
// bytes and count) to allocs at stop, and its execution trace
// (runtime/trace: where a copy's goroutines waited) to tr, for each that
// is set ($TENSORFS_CPUPROFILE, $TENSORFS_ALLOCPROFILE, $TENSORFS_TRACE:
// how the benchmarks' per-copy costs were found; bench/history.md).
// "%p" in each is replaced by the process id, so that several daemons
// can profile.
func profiles(cpu, allocs, tr string) (stop func(), err error) {
	pid := strconv.Itoa(os.Getpid())
	cpu, allocs, tr = strings.ReplaceAll(cpu, "%p", pid), strings.ReplaceAll(allocs, "%p", pid), strings.ReplaceAll(tr, "%p", pid)
	var tf *os.File
	if tr != "" {
		if tf, err = os.Create(tr); err != nil {
			return nil, fmt.Errorf("TENSORFS_TRACE: %w", err)
		}
		if err := trace.Start(tf); err != nil {
			tf.Close()
			return nil, fmt.Errorf("TENSORFS_TRACE: %w", err)
		}
	}
	var f *os.File
	if cpu != "" {
		if f, err = os.Create(cpu); err != nil {
			return nil, fmt.Errorf("TENSORFS_CPUPROFILE: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("TENSORFS_CPUPROFILE: %w", err)
		}
	}
	if allocs != "" {
		// Sampling every allocation's 64 KiB, not the default 512 KiB:
		// a copy's small per-descriptor allocations are what is looked for.
		runtime.MemProfileRate = 64 << 10
	}
	return func() {
		if tf != nil {
			trace.Stop()
			tf.Close()
		}
		if f != nil {
			pprof.StopCPUProfile()
			f.Close()
		}
		if allocs != "" {
			if err := writeProfile("allocs", allocs); err != nil {
				slog.Error("cannot write the allocation profile", "env", "TENSORFS_ALLOCPROFILE", "path", allocs, "err", err)
			}
		}
	}, nil
}

// writeProfile writes the named runtime/pprof profile to path.
func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// register writes this node's record in the cluster: its advertised
// address, host, instance, protocol, transports ("tcp", and "ucx" with a
// UCX context), devices and start time. It returns the address
// registered.
func register(m *cluster.Member, peers *transfer.Service, devs []gpu.Device, advertise string, withUCX bool) (string, error) {
	addr, err := advertised(advertise, peers.Addr())
	if err != nil {
		return "", err
	}
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.Name()
	}
	transports := []string{"tcp"}
	if withUCX {
		transports = append(transports, "ucx")
	}
	return addr, m.Register(cluster.Record{Name: peers.Name(), Addr: addr, HostID: peers.HostID(), Instance: peers.Instance(),
		Protocol: transfer.ProtocolVersion, Transports: transports, Devices: names, Started: time.Now().UTC()})
}
