package fs

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/tensorfs/tensorfs/tensor"
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
}

// NewRoot returns the root directory of a tensor tree over store. Give it a
// peer service with SetPeers, then Mount it.
func NewRoot(store *tensor.Store) *Dir {
	f := &FS{store: store}
	f.root = &Dir{fsys: f}
	f.root.meta.init(context.Background(), 0o755)
	return f.root
}

// Mount mounts the tensor tree of root (see NewRoot) at dir and returns the server once the
// kernel has answered INIT. As root it mounts with mount(2) directly, else
// through fusermount3. A stale mount left at dir (a killed daemon's: "transport
// endpoint is not connected") is lazily unmounted first; a live tensorfs mount
// there is ErrMounted. Attribute and entry
// timeouts are 0, so stat always shows the current size.
func Mount(dir string, root *Dir, o Options) (*fuse.Server, error) {
	if err := CleanStale(dir); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	root.fsys.mnt = abs
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
	srv, err := gofs.Mount(dir, root, opts)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	return srv, nil
}

// ErrMounted: the mountpoint is already served by a live tensorfs daemon.
var ErrMounted = errors.New("already mounted by a live tensorfs daemon")

// CleanStale lazily unmounts dir when it is a dead FUSE mount (a killed
// daemon's: stat fails with ENOTCONN) and returns nil; it leaves an ordinary
// directory alone, and refuses (ErrMounted) a live tensorfs mount, whose
// daemon still holds tensors that taking over the mountpoint would strand.
func CleanStale(dir string) error {
	err := statTimeout(dir, 3*time.Second)
	if err == errHung {
		log.Printf("%s: a mount that does not answer; aborting its FUSE connection", dir)
		abortConnection(dir)
		err = syscall.ENOTCONN
	}
	if err == syscall.ENOTCONN || err == syscall.ECONNABORTED {
		log.Printf("%s: cleaning up a stale mount left by a dead daemon", dir)
		if syscall.Unmount(dir, syscall.MNT_DETACH) != nil {
			// Not root: ask fusermount3, which may unmount our own mounts.
			_ = runQuiet("fusermount3", "-u", "-z", dir)
		}
		return nil
	}
	if err == nil && isMountpoint(dir) {
		return fmt.Errorf("%s: %w (unmount it first: tensorfs unmount %s)", dir, ErrMounted, dir)
	}
	return nil
}
