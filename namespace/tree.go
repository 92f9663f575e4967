package namespace

import (
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// NameMax is the longest entry name in bytes; longer ones are ENAMETOOLONG.
const NameMax = 255

// CheckName enforces NameMax: syscall.ENAMETOOLONG for a longer name, else 0.
func CheckName(name string) syscall.Errno {
	if len(name) > NameMax {
		return syscall.ENAMETOOLONG
	}
	return 0
}

// Tree is one mount's namespace: the tensor store its files live in, the
// root directory, the peer service copies to other nodes go through, and
// where the tree is mounted.
type Tree struct {
	store *tensor.Store
	root  *Dir
	// peers is the peer service (copies to other nodes, stats of copies);
	// nil for a node without peers.
	peers *transfer.Service
	// mnt is the mountpoint, for paths under it and for placer; "" until
	// SetMount.
	mnt    string
	placer Placer
	tmpSeq atomic.Uint64
	// refusals are the recent refused attribute sets (Refuse), for stats.
	refusals refusals
}

// New returns an empty tree over store whose root is mode 0755, owned by
// root, with the peer service that peers builds over it (nil: a node
// without peers, where a copy naming a peer fails with ENOENT). The service
// reads and writes the tree (it is the service's transfer.Local) and the
// tree sends its copies through the service, so the tree hands itself to
// peers here rather than being given the service later. The service, if
// any, is the caller's to Start and Close. Errors: those of peers.
func New(store *tensor.Store, peers func(transfer.Local) (*transfer.Service, error)) (*Tree, *transfer.Service, error) {
	t := &Tree{store: store}
	t.root = t.newDir(tensor.Template{})
	t.root.meta.Init(0o755, 0, 0)
	if peers != nil {
		s, err := peers(t)
		if err != nil {
			return nil, nil, err
		}
		t.peers = s
	}
	return t, t.peers, nil
}

// SetMount records that the tree is mounted at the absolute path mnt: copy
// targets under mnt are taken as paths of this tree, and commits put
// tensors in place through p (a rename through the mount that watchers
// see). Call it before the mount serves requests.
func (t *Tree) SetMount(mnt string, p Placer) { t.mnt, t.placer = mnt, p }

// Store is the tensor store the tree's files live in.
func (t *Tree) Store() *tensor.Store { return t.store }

// Root is the tree's root directory.
func (t *Tree) Root() *Dir { return t.root }

// Frontend is what the FUSE frontend attaches to a node (see Node.Front).
type Frontend interface {
	// Invalidate tells the kernel to drop the attributes it caches for
	// the node, after a change the daemon made itself (not through the
	// mount). It must not block on the kernel's inode locks.
	Invalidate()
}

// Node is an entry of the tree: a *Dir or a *File.
type Node interface {
	// Meta is the node's metadata.
	Meta() *Meta
	// Front is the node's frontend, made by mk on first use (under the
	// node's frontend lock, so exactly once); mk nil only reads it.
	Front(mk func() Frontend) Frontend
	node() *base
}

// loc is where a node is: its directory and its name there.
type loc struct {
	parent *Dir
	name   string
}

// base is what both node kinds share.
type base struct {
	id      uint64 // for lockPair's order
	meta    Meta
	at      atomic.Pointer[loc] // nil when the node has no name
	frontMu sync.Mutex
	front   Frontend
}

var nodeIDs atomic.Uint64

func (b *base) node() *base { return b }

// Meta implements Node.
func (b *base) Meta() *Meta { return &b.meta }

// Front implements Node.
func (b *base) Front(mk func() Frontend) Frontend {
	b.frontMu.Lock()
	defer b.frontMu.Unlock()
	if b.front == nil && mk != nil {
		b.front = mk()
	}
	return b.front
}

// invalidate tells the node's frontend, if it has one, that its attributes
// changed.
func (b *base) invalidate() {
	if f := b.Front(nil); f != nil {
		f.Invalidate()
	}
}

// Meta is what every node carries besides its content: permissions, owner,
// times and ordinary user xattrs. Its fields are guarded by its lock (Lock,
// Unlock).
type Meta struct {
	sync.Mutex
	// Mode is the permission bits only (07777).
	Mode uint32
	// UID and GID own the node.
	UID, GID uint32
	// Atime, Mtime and Ctime are its times.
	Atime, Mtime, Ctime time.Time
	// Xattrs are its ordinary "user." attributes (not user.tensorfs.), by
	// full name; nil when there are none.
	Xattrs map[string][]byte
}

// Init sets a new node's metadata: mode (its permission bits), owner, and
// times of now. The node is not shared yet: no lock is taken.
func (m *Meta) Init(mode, uid, gid uint32) {
	now := time.Now()
	m.Mode, m.Atime, m.Mtime, m.Ctime = mode&07777, now, now, now
	m.UID, m.GID = uid, gid
}

// Touch marks a content change (write, truncate, adoption).
func (m *Meta) Touch() {
	now := time.Now()
	m.Lock()
	m.Mtime, m.Ctime = now, now
	m.Unlock()
}

// Touched marks a content change the daemon made itself (an action's
// effect, an adoption by a copy) and tells the kernel, which caches the
// file's attributes (see Frontend): a change through the kernel (a write,
// a truncate) takes Meta.Touch alone.
func (f *File) Touched() {
	f.meta.Touch()
	f.invalidate()
}

// Owner returns the node's uid and gid.
func (m *Meta) Owner() (uid, gid uint32) {
	m.Lock()
	defer m.Unlock()
	return m.UID, m.GID
}

// SetMode sets the permission bits.
func (m *Meta) SetMode(mode uint32) {
	m.Lock()
	m.Mode = mode & 07777
	m.Unlock()
}

// File is a tensor file: its content is a tensor's device memory.
type File struct {
	base
	t *tensor.Tensor
}

// Tensor is the file's tensor.
func (f *File) Tensor() *tensor.Tensor { return f.t }

// NewFile returns a file of tensor t with mode (permission bits) and owner,
// not yet in any directory (Dir.Add names it).
func NewFile(t *tensor.Tensor, mode, uid, gid uint32) *File {
	f := &File{t: t}
	f.id = nodeIDs.Add(1)
	f.meta.Init(mode, uid, gid)
	// The kernel caches a file's attributes (see Frontend): any change of
	// the tensor's size, capacity or link is told to it, whoever made it.
	t.OnAttrChange(f.invalidate)
	return f
}

// Path is the tree-relative path of n ("/" for the root, "/a/b" below it),
// found by walking up the parents; "" when n, or a directory above it, has
// no name any more. It is for log lines and copy labels: a concurrent
// rename may make it stale as soon as it returns.
func (t *Tree) Path(n Node) string {
	if n == Node(t.root) {
		return "/"
	}
	var parts []string
	for cur := n.node(); ; {
		l := cur.at.Load()
		if l == nil {
			return ""
		}
		parts = append(parts, l.name)
		if l.parent == t.root {
			break
		}
		cur = &l.parent.base
		if len(parts) > 4096 { // a cycle would be a broken invariant; do not spin
			return ""
		}
	}
	var b strings.Builder
	for i := len(parts) - 1; i >= 0; i-- {
		b.WriteByte('/')
		b.WriteString(parts[i])
	}
	return b.String()
}

// Resolve finds the node at a cleaned tree-relative path. Errors: a
// *transfer.Error with ENOTDIR when a component is a file, ENOENT when one
// is missing.
func (t *Tree) Resolve(p string) (Node, error) {
	var cur Node = t.root
	if p == "/" {
		return cur, nil
	}
	for _, c := range strings.Split(p[1:], "/") {
		d, ok := cur.(*Dir)
		if !ok {
			return nil, errf(syscall.ENOTDIR, "%s: a component is not a directory", p)
		}
		n := d.Child(c)
		if n == nil {
			return nil, errf(syscall.ENOENT, "%s: no such file or directory", p)
		}
		cur = n
	}
	return cur, nil
}

// within reports whether the node at path p is dir or lies below it.
func (t *Tree) within(p string, dir *Dir) bool {
	var cur Node = t.root
	if cur == Node(dir) {
		return true
	}
	if p == "/" {
		return false
	}
	for _, c := range strings.Split(p[1:], "/") {
		d, ok := cur.(*Dir)
		if !ok {
			return false
		}
		n := d.Child(c)
		if n == nil {
			return false
		}
		cur = n
		if cur == Node(dir) {
			return true
		}
	}
	return false
}
