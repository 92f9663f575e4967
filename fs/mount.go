package fs

import (
	"fmt"
	"os"
	"path/filepath"
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
	srv, err := fuse.NewServer(raw, dir, &opts.MountOptions)
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

// ErrMounted: the mountpoint is already served by a live tensorfs daemon
// (mountpoint.ErrMounted).
var ErrMounted = mountpoint.ErrMounted

// CleanStale is mountpoint.CleanStale: it lazily unmounts a dead daemon's
// mount at dir and refuses (ErrMounted) a live one.
func CleanStale(dir string) error { return mountpoint.CleanStale(dir) }
