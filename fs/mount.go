package fs

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/tensorfs/tensorfs/mountpoint"
	"github.com/tensorfs/tensorfs/namespace"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// MaxWrite is the largest FUSE read/write request, in bytes: just under 1 MiB,
// because a request of exactly 1 MiB (plus its header) no longer fits go-fuse's
// splice pipe and logs a warning on every request.
const MaxWrite = 1<<20 - 4096

// Options configures a mount.
type Options struct {
	// AllowOther lets users other than the mounter use the mount (FUSE
	// allow_other); off by default.
	AllowOther bool
	// Debug logs every FUSE request.
	Debug bool
	// FSName is the source shown in /proc/mounts (default "tensorfs").
	FSName string
	// Counts, when set, counts every FUSE request of the mount and every
	// errno answered (OpCounts; the daemon's metrics read it). Nil: no
	// counting, at no cost.
	Counts *OpCounts
}

// Config is what NewRoot builds a tensor tree from.
type Config struct {
	// Store holds the tree's tensors and their devices (required); the
	// caller closes it after the mount has ended.
	Store *tensor.Store
	// Peers, when set, builds the peer service over the tree's namespace
	// (the transfer.Local a peer's copies read and write; the service
	// cannot exist before it, hence a constructor): copies to and from
	// other nodes go through it and its counters fill the stats document.
	// NewRoot returns its error. Nil: a node without peers (a copy naming
	// a peer fails with ENOENT).
	Peers func(transfer.Local) (*transfer.Service, error)
}

// NewRoot returns the root directory of a new, empty tensor tree (mode
// 0755, owned by root) over c.Store, with the peer service c.Peers builds;
// Mount it next. The service, if any, is the caller's to Start and Close:
// Peers returns it too. Errors: those of c.Peers.
func NewRoot(c Config) (*Dir, *transfer.Service, error) {
	tree, peers, err := namespace.New(c.Store, c.Peers)
	if err != nil {
		return nil, nil, err
	}
	f := &FS{tree: tree}
	f.root = f.dirNode(f.tree.Root())
	f.tree.Root().Front(func() namespace.Frontend { return f.root })
	return f.root, peers, nil
}

// Mount mounts the tensor tree of root (see NewRoot) at dir and returns the server once the
// kernel has answered INIT. As root it mounts with mount(2) directly, else
// through fusermount3. A stale mount left at dir (a killed daemon's: "transport
// endpoint is not connected") is lazily unmounted first; a live tensorfs mount
// there is ErrMounted. Entry and negative
// timeouts are 0; nodes give their attributes a timeout of attrTimeout and
// invalidate them at every change the kernel does not make (see the
// package doc), so stat always shows the current size.
func Mount(dir string, root *Dir, o Options) (*fuse.Server, error) {
	if err := CleanStale(dir); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	root.fsys.tree.SetMount(abs, placer{mnt: abs})
	zero := time.Duration(0)
	name := o.FSName
	if name == "" {
		name = "tensorfs"
	}
	opts := &gofs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			AllowOther:        o.AllowOther,
			Debug:             o.Debug,
			FsName:            name,
			Name:              "tensorfs",
			MaxWrite:          MaxWrite,
			DirectMount:       os.Geteuid() == 0,
			Options:           []string{"default_permissions"},
			ExtraCapabilities: fuse.CAP_DIRECT_IO_ALLOW_MMAP,
			MaxBackground:     64,
			// Read replies are bytes in memory: splicing them only adds a
			// copy into a pipe, and go-fuse's pipe cannot hold a 1 MiB
			// reply (it logged a warning per read and fell back).
			DisableSplice: true,
		},
	}
	// gofs.Mount, with the raw file system wrapped when counting.
	var raw fuse.RawFileSystem = gofs.NewNodeFS(root, opts)
	if o.Counts != nil {
		raw = &countingFS{RawFileSystem: raw, c: o.Counts}
	}
	srv, err := newServer(raw, dir, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		// As gofs.Mount: the serve loop ends by itself when the mount
		// failed.
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	return srv, nil
}

// newServer is fuse.NewServer with at most fuseIdleReaders + 1 of go-fuse's
// readers left waiting in read(/dev/fuse) between requests.
//
// Why: the kernel hands each request to the reader that has waited longest
// (an exclusive wait queue wakes its oldest entry), and go-fuse keeps up to
// one more than GOMAXPROCS (clamped to 2..16) waiting once a burst of
// concurrent requests has started them. With 17, each request of a
// caller's sequence (a copy_to's LOOKUP and SETXATTR, call after call)
// woke a thread that had slept through several calls, on a vCPU that had
// halted meanwhile: 13–34 µs p50 and 140–175 µs p90 on the H100 hosts of
// 2026-12-07, against 5–7 µs after a sleep under 150 µs (results in
// bench/results/2026-12-07T1027Z-h100-wakeups-a67f248; with the cap, 4 KiB
// in place over TCP on cuda:0 went from a median of 203.5 to 125.4 µs:
// bench/results/2026-12-07T1058Z-h100-fuse-readers-a67f248-new). With few
// readers waiting, the one that served the previous request is soon next
// in line again. Concurrency is not capped: a reader that takes a request
// with none left waiting starts another (go-fuse's readRequest), so
// requests that block (a copy) never wait for a reader.
//
// go-fuse 2.12 takes the cap from runtime.GOMAXPROCS when the server is
// made and offers no option for it, so GOMAXPROCS is lowered around
// fuse.NewServer (serialized: mounts made concurrently in one process
// would restore each other's values) and set back: to the runtime's
// default when the GOMAXPROCS environment variable is not set, so that
// the runtime keeps updating it (cgroup CPU limits), else to what it was.
// TestFUSEReadersFew checks both in a daemon.
//
// Below SmallHostCPUs the default goes up by fuseIdleReaders: the readers
// waiting in read(/dev/fuse) each hold a P in a system call, and with as
// many Ps as CPUs every request's other goroutines (the copy's wait on its
// peer, the peer connection's reader) took one back through the runtime's
// sysmon, which parked whenever every P was idle and which each reader
// returning with a request then had to wake. On the 2-CPU VM (2026-12-07,
// daemons alternating, three rounds) GOMAXPROCS 4 cut a 4 KiB in-place
// copy_to's context switches by a fifth and its p50 by 9 % (IPC 241–246 →
// 214–225 µs, TCP 269–277 → 244–250 µs); 8 did no better, and the 256 MiB
// and 1000-descriptor rows did not move. The runtime then stops following
// a cgroup CPU limit that changes later.
func newServer(raw fuse.RawFileSystem, dir string, opts *fuse.MountOptions) (*fuse.Server, error) {
	serverMu.Lock()
	defer serverMu.Unlock()
	prev := runtime.GOMAXPROCS(fuseIdleReaders)
	defer func() {
		if os.Getenv("GOMAXPROCS") != "" {
			runtime.GOMAXPROCS(prev)
			return
		}
		runtime.SetDefaultGOMAXPROCS()
		if n := runtime.GOMAXPROCS(0); n < SmallHostCPUs {
			runtime.GOMAXPROCS(n + fuseIdleReaders)
		}
	}()
	return fuse.NewServer(raw, dir, opts)
}

// SmallHostCPUs: a host of fewer CPUs than this is small. There a default
// GOMAXPROCS gets fuseIdleReaders more (newServer), and the peer
// connections do not spin by default (cmd/tensorfs, --spin): a spinning
// reader would take the core the peer or the caller needs.
const SmallHostCPUs = 4

// fuseIdleReaders is the go-fuse reader cap newServer sets: go-fuse's
// least (it raises anything lower to 2). A reader leaves once it finds
// more than this many others waiting.
const fuseIdleReaders = 2

// serverMu serializes newServer's change of GOMAXPROCS.
var serverMu sync.Mutex

// ErrMounted: the mountpoint is already served by a live tensorfs daemon
// (mountpoint.ErrMounted).
var ErrMounted = mountpoint.ErrMounted

// CleanStale is mountpoint.CleanStale: it lazily unmounts a dead daemon's
// mount at dir and refuses (ErrMounted) a live one.
func CleanStale(dir string) error { return mountpoint.CleanStale(dir) }
