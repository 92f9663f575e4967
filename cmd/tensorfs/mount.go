package main

import (
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"syscall"
	"time"

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
	)
	cmd := &cobra.Command{
		Use:   "mount MOUNTPOINT",
		Short: "Mount a tensor filesystem and serve it in the foreground until SIGINT/SIGTERM",
		Long: `Mount a tensor filesystem at MOUNTPOINT and serve it in the foreground.
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
--host-id overrides the host identity (default: the kernel's boot id).
--timeout bounds how long a copy waits on a silent peer. --idle-timeout
(default 30s) is how long a connection to a peer stays open after a copy, for
the next one (kept alive by keepalives, at most 16 per peer): a copy then pays
no dial or handshake.

--streams N spreads each large copy over N parallel TCP connections to the
peer (1 to 8; default 2): chunks of at least 4 per stream, each checked by
CRC32C and counted exactly once; a stream that dies fails the whole copy. The
receiving side of a copy decides, up to what the asking side offers.

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
latency histogram, FUSE requests and errnos by operation, peer
connections; README "Metrics" lists them). The listener is up before the
mount appears; an address that cannot be listened on is refused at start.
The metrics carry counts, never names or secrets, and need no
--secret-file; bind them to loopback or a monitoring network.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
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
				cc = &c
			} else if cmd.Flags().Changed("advertise") {
				return fmt.Errorf("--advertise needs --etcd")
			}
			return runMount(args[0], device, int64(limit), revoke, fs.Options{AllowOther: allowOther, Debug: debug}, cfg, cc, ec.advertise, metricsAt)
		},
	}
	f := cmd.Flags()
	f.StringVar(&device, "device", "auto", "default device: auto, host or cuda:N")
	f.StringVar(&maxMemory, "max-memory", "", "cap on allocated bytes (default: available memory)")
	f.BoolVar(&allowOther, "allow-other", false, "let other users access the mount (FUSE allow_other)")
	f.BoolVar(&debug, "debug", false, "log every FUSE request")
	f.DurationVar(&revoke, "revoke-timeout", 10*time.Second, "how long freeing a tensor waits for peers holding an import of it")
	f.StringVar(&metricsAt, "metrics", "", "serve Prometheus metrics at http://HOST:PORT/metrics (default: none)")
	pc.register(f)
	ec.register(f, true)
	return cmd
}

// runMount serves a mount until a signal; with cc (--etcd) the node joins
// the cluster, registered at advertise (or its listener's address), before
// the mount appears; with metricsAt (--metrics HOST:PORT) its metrics are
// served there, from before the mount appears.
func runMount(mountpoint, device string, limit int64, revoke time.Duration, o fs.Options, peerCfg transfer.Config, cc *cluster.Config, advertise, metricsAt string) error {
	// Catch signals before mounting: go-fuse's mount makes a request on the
	// new mount from this process (its poll check), and a process killed by a
	// default-action SIGINT while waiting for its own reply hangs in exit and
	// leaves a mount that hangs everyone who touches it (seen in the tests).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
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
		if advertise, err = register(member, peers, devs, advertise); err != nil {
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
		log.Print(n)
	}
	if member != nil {
		log.Printf("cluster %s: registered %s at %s (etcd lease TTL %v; %d nodes in view)", member.Cluster(), peerCfg.Name, advertise, member.TTL(), len(member.Nodes()))
	}
	logMounted(mountpoint, devs[0], limit)

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

// logMounted logs the ready line the tests and scripts wait for ("mounted
// "), after a note when --max-memory was capped.
func logMounted(mountpoint string, def gpu.Device, limit int64) {
	mi := def.MemInfo()
	if limit > mi.Total {
		log.Printf("--max-memory %s is more than %s can give; capped at %s", humanize.IBytes(uint64(limit)), def.Name(), humanize.IBytes(uint64(mi.Total)))
	}
	log.Printf("mounted %s: default device %s, capacity %s", mountpoint, def.Name(), humanize.IBytes(uint64(mi.Total)))
}

// serveUntilSignal serves the mount until it is unmounted from outside, or
// a SIGINT/SIGTERM on sig unmounts it (lazily when busy; a second signal, or
// 5 s, stops waiting for its users).
func serveUntilSignal(srv *fuse.Server, mountpoint string, sig <-chan os.Signal) {
	done := make(chan struct{})
	go func() { srv.Wait(); close(done) }()
	select {
	case s := <-sig:
		log.Printf("%v: unmounting %s", s, mountpoint)
		if err := srv.Unmount(); err != nil {
			// Busy (a process has its cwd or a file there): detach lazily; the
			// kernel ends the connection when the last user leaves, or when
			// this process exits below.
			log.Printf("unmount: %v; detaching", err)
			syscall.Unmount(mountpoint, syscall.MNT_DETACH)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			log.Printf("%s still in use after 5s; exiting anyway (its users get ENOTCONN)", mountpoint)
		case s := <-sig:
			log.Printf("%v again: exiting now", s)
		}
	case <-done:
		log.Printf("%s was unmounted", mountpoint)
	}
}

func newUnmountCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "unmount MOUNTPOINT",
		Short: "Unmount a tensor filesystem (the daemon then frees everything and exits 0)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !mountpoint.IsMounted(args[0]) {
				return fmt.Errorf("unmount %s: not a tensorfs mount", args[0])
			}
			err := syscall.Unmount(args[0], 0)
			if err == syscall.EBUSY {
				return fmt.Errorf("unmount %s: busy (a process has files open there)", args[0])
			}
			if err != nil {
				// Not root: fusermount3 unmounts our own FUSE mounts.
				if out, ferr := runFusermount(args[0]); ferr != nil {
					return fmt.Errorf("unmount %s: %v; fusermount3: %s", args[0], err, out)
				}
			}
			return nil
		},
	}
}

// profiles writes the daemon's CPU profile (runtime/pprof) from now until
// stop to cpu, its allocation profile (every allocation since start, by
// bytes and count) to allocs at stop, and its execution trace
// (runtime/trace: where a copy's goroutines waited) to tr, for each that
// is set ($TENSORFS_CPUPROFILE, $TENSORFS_ALLOCPROFILE, $TENSORFS_TRACE:
// how the benchmarks' per-copy costs were found; docs/performance.md).
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
				log.Printf("TENSORFS_ALLOCPROFILE: %v", err)
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
// address, host, instance, protocol, transports, devices and start time.
// It returns the address registered.
func register(m *cluster.Member, peers *transfer.Service, devs []gpu.Device, advertise string) (string, error) {
	addr, err := advertised(advertise, peers.Addr())
	if err != nil {
		return "", err
	}
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.Name()
	}
	return addr, m.Register(cluster.Record{Name: peers.Name(), Addr: addr, HostID: peers.HostID(), Instance: peers.Instance(),
		Protocol: transfer.ProtocolVersion, Transports: []string{"tcp"}, Devices: names, Started: time.Now().UTC()})
}
