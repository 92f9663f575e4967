package namespace

import (
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/tensor"
)

// Dir is a directory. It may carry a template (dtype, shape, device) that
// every tensor created in it gets; a subdirectory made in it gets a copy.
//
// Its entries are the names: the FUSE frontend's own child tree (go-fuse's)
// is only a cache of them. go-fuse re-inserts whatever a LOOKUP returned
// after the handler has returned, and the kernel's revalidating lookups run
// without the directory lock, so a lookup racing a rename over the same name
// would put the replaced tensor back under the name and orphan the new one.
type Dir struct {
	base
	tree *Tree

	mu      sync.Mutex
	entries map[string]Node
	subdirs int // entries that are directories, for nlink without a scan

	tmplMu sync.Mutex
	tmpl   tensor.Template
}

// newDir makes a directory of the tree with template tmpl, not yet named.
func (t *Tree) newDir(tmpl tensor.Template) *Dir {
	d := &Dir{tree: t, tmpl: tmpl}
	d.id = nodeIDs.Add(1)
	return d
}

// IsRoot reports whether d is its tree's root.
func (d *Dir) IsRoot() bool { return d == d.tree.root }

// Child returns the entry for name, or nil.
func (d *Dir) Child(name string) Node {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.entries[name]
}

// Empty reports whether the directory has no entries.
func (d *Dir) Empty() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.entries) == 0
}

// Subdirs is the number of entries that are directories.
func (d *Dir) Subdirs() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.subdirs
}

// Entry is one name of a directory listing.
type Entry struct {
	Name string
	Node Node
}

// Entries lists the directory's entries, sorted by name (a listing must be
// deterministic).
func (d *Dir) Entries() []Entry {
	d.mu.Lock()
	list := make([]Entry, 0, len(d.entries))
	for name, n := range d.entries {
		list = append(list, Entry{name, n})
	}
	d.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	return list
}

// lockPair locks two directories in a fixed order (by node id) so that
// concurrent renames between them cannot deadlock; it returns the unlock.
func lockPair(a, b *Dir) func() {
	if a == b {
		a.mu.Lock()
		return a.mu.Unlock
	}
	if a.id > b.id {
		a, b = b, a
	}
	a.mu.Lock()
	b.mu.Lock()
	return func() { b.mu.Unlock(); a.mu.Unlock() }
}

// Template returns a copy of the directory's template.
func (d *Dir) Template() tensor.Template {
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	t := d.tmpl
	t.Shape = append(dtype.Shape(nil), d.tmpl.Shape...)
	if d.tmpl.Shape != nil && t.Shape == nil {
		t.Shape = dtype.Shape{}
	}
	return t
}

// SetTemplateAttr sets one template attribute, "dtype", "shape" or
// "device", from its text. The template is validated as a whole (a shape
// must give a size with the dtype, U8 by default), so a bad value changes
// nothing. Errors: tensor.ErrInvalid and the store's for an unknown device;
// syscall.EINVAL for another name.
func (d *Dir) SetTemplateAttr(name, val string) error {
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	t := d.tmpl
	var err error
	switch name {
	case "dtype":
		t.DType, err = dtype.Parse(val)
	case "shape":
		t.Shape, err = dtype.ParseShape(val)
	case "device":
		var dev interface{ Name() string }
		if dev, err = d.tree.store.Device(val); err == nil {
			t.Device = dev.Name()
		}
	default:
		return syscall.EINVAL
	}
	if err == nil && t.Shape != nil {
		dt := t.DType
		if dt == "" {
			dt = "U8"
		}
		_, err = dtype.NBytes(dt, t.Shape)
	}
	if err != nil {
		return err
	}
	d.tmpl = t
	return nil
}

// RemoveTemplateAttr removes one template attribute ("dtype", "shape" or
// "device"). Errors: syscall.ENODATA when it is not set, syscall.EPERM for
// another name.
func (d *Dir) RemoveTemplateAttr(name string) error {
	d.tmplMu.Lock()
	defer d.tmplMu.Unlock()
	switch {
	case name == "dtype" && d.tmpl.DType != "":
		d.tmpl.DType = ""
	case name == "shape" && d.tmpl.Shape != nil:
		d.tmpl.Shape = nil
	case name == "device" && d.tmpl.Device != "":
		d.tmpl.Device = ""
	case name == "dtype" || name == "shape" || name == "device":
		return syscall.ENODATA
	default:
		return syscall.EPERM
	}
	return nil
}

// setEntry adds or replaces an entry; d.mu is held.
func (d *Dir) setEntry(name string, n Node) {
	if d.entries == nil {
		d.entries = map[string]Node{}
	}
	d.delEntry(name)
	d.entries[name] = n
	n.node().at.Store(&loc{parent: d, name: name})
	if _, ok := n.(*Dir); ok {
		d.subdirs++
	}
}

// delEntry removes an entry if present; d.mu is held.
func (d *Dir) delEntry(name string) {
	old, ok := d.entries[name]
	if !ok {
		return
	}
	if _, ok := old.(*Dir); ok {
		d.subdirs--
	}
	delete(d.entries, name)
	if l := old.node().at.Load(); l != nil && l.parent == d && l.name == name {
		old.node().at.CompareAndSwap(l, nil)
	}
}

// Mkdir makes subdirectory name with mode (permission bits) and owner; it
// gets d's template. Errors: syscall.EEXIST, syscall.ENAMETOOLONG.
func (d *Dir) Mkdir(name string, mode, uid, gid uint32) (*Dir, error) {
	if errno := CheckName(name); errno != 0 {
		return nil, errno
	}
	child := d.tree.newDir(d.Template())
	child.meta.Init(mode, uid, gid)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.entries[name] != nil {
		return nil, syscall.EEXIST
	}
	d.setEntry(name, child)
	return child, nil
}

// Add names file f name in d, unless the name exists (syscall.EEXIST).
func (d *Dir) Add(name string, f *File) error {
	if errno := CheckName(name); errno != 0 {
		return errno
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.entries[name] != nil {
		return syscall.EEXIST
	}
	d.setEntry(name, f)
	return nil
}

// Rmdir removes the empty subdirectory name. Errors: syscall.ENOENT,
// syscall.ENOTDIR, syscall.ENOTEMPTY.
func (d *Dir) Rmdir(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.entries[name]
	if c == nil {
		return syscall.ENOENT
	}
	sub, ok := c.(*Dir)
	if !ok {
		return syscall.ENOTDIR
	}
	if !sub.Empty() {
		return syscall.ENOTEMPTY
	}
	d.delEntry(name)
	return nil
}

// Unlink removes file name: its tensor is released now, or at its last
// close. Errors: syscall.ENOENT, syscall.EISDIR.
func (d *Dir) Unlink(name string) error {
	d.mu.Lock()
	c := d.entries[name]
	if c == nil {
		d.mu.Unlock()
		return syscall.ENOENT
	}
	f, ok := c.(*File)
	if !ok {
		d.mu.Unlock()
		return syscall.EISDIR
	}
	d.delEntry(name)
	d.mu.Unlock()
	f.t.Unlink()
	return nil
}

// Rename moves entry name to newName in np with POSIX semantics: a file
// renamed over another one unlinks it (released at its last close); a
// directory replaces only an empty directory. exchange swaps the two
// (RENAME_EXCHANGE); noReplace fails when newName exists
// (RENAME_NOREPLACE). Errors: syscall.ENOENT, EEXIST, EISDIR, ENOTDIR,
// ENOTEMPTY, ENAMETOOLONG.
func (d *Dir) Rename(name string, np *Dir, newName string, exchange, noReplace bool) error {
	if errno := CheckName(newName); errno != 0 {
		return errno
	}
	unlock := lockPair(d, np)
	src := d.entries[name]
	if src == nil {
		unlock()
		return syscall.ENOENT
	}
	dst := np.entries[newName]
	if exchange {
		if dst == nil {
			unlock()
			return syscall.ENOENT
		}
		d.delEntry(name)
		np.delEntry(newName)
		d.setEntry(name, dst)
		np.setEntry(newName, src)
		unlock()
		// Both names lead elsewhere now: peers bound by them let go.
		d.tree.revokeBound(src)
		d.tree.revokeBound(dst)
		return nil
	}
	if dst == src {
		unlock()
		return nil
	}
	replaced, err := replaceable(src, dst, noReplace)
	if err != nil {
		unlock()
		return err
	}
	d.delEntry(name)
	np.setEntry(newName, src)
	unlock()
	if replaced != nil {
		replaced.t.Unlink()
	}
	// src's old name (and its tree's) leads nowhere now: peers bound by
	// it let go (the rename returns after their writes have landed).
	d.tree.revokeBound(src)
	return nil
}

// replaceable checks that src may be renamed over dst (nil: nothing
// there) and returns the file that it replaces, if any.
func replaceable(src, dst Node, noReplace bool) (*File, error) {
	if dst == nil {
		return nil, nil
	}
	if noReplace {
		return nil, syscall.EEXIST
	}
	_, srcDir := src.(*Dir)
	switch dd, isDir := dst.(*Dir); {
	case isDir && !srcDir:
		return nil, syscall.EISDIR
	case !isDir && srcDir:
		return nil, syscall.ENOTDIR
	case isDir && !dd.Empty():
		return nil, syscall.ENOTEMPTY
	case !isDir:
		return dst.(*File), nil
	}
	return nil, nil
}

// fileRef is one tensor file found under a directory.
type fileRef struct {
	rel string
	f   *File
}

// walk lists the tensor files under d (sorted, temporaries skipped).
func (d *Dir) walk(prefix string, out []fileRef) []fileRef {
	for _, e := range d.Entries() {
		if strings.HasPrefix(e.Name, tmpPrefix) {
			continue
		}
		switch c := e.Node.(type) {
		case *File:
			out = append(out, fileRef{rel: prefix + e.Name, f: c})
		case *Dir:
			out = c.walk(prefix+e.Name+"/", out)
		}
	}
	return out
}

// newSubdir makes a directory node for a copy to put in d: d's template,
// mode 0755, and d's owner (like the tensors a copy puts there).
func (d *Dir) newSubdir() *Dir {
	nd := d.tree.newDir(d.Template())
	uid, gid := d.meta.Owner()
	nd.meta.Init(0o755, uid, gid)
	return nd
}

// mkdirAll returns the directory at p, creating it and missing parents
// internally (no syscall on the mount), owned like their parents. Errors:
// ENOTDIR when a component is a file, ENAMETOOLONG for a long component.
func (t *Tree) mkdirAll(p string) (*Dir, error) {
	cur := t.root
	if p == "/" {
		return cur, nil
	}
	for _, c := range strings.Split(strings.Trim(p, "/"), "/") {
		if errno := CheckName(c); errno != 0 {
			return nil, errf(errno, "%s: name too long", p)
		}
		cur.mu.Lock()
		n := cur.entries[c]
		made := n == nil
		if made {
			n = cur.newSubdir()
			cur.setEntry(c, n)
		}
		cur.mu.Unlock()
		if made {
			cur.invalidate() // its nlink counts the new subdirectory
		}
		next, ok := n.(*Dir)
		if !ok {
			return nil, errf(syscall.ENOTDIR, "%s: %s is a file", p, c)
		}
		cur = next
	}
	return cur, nil
}

// moveEntry moves entry name of from to newName in to without a syscall on
// the mount, replacing a file there, or with noReplace failing with EEXIST
// when newName exists. Errors: ENOENT when name is gone, EISDIR when a file
// would replace a directory.
func moveEntry(from *Dir, name string, to *Dir, newName string, noReplace bool) error {
	unlock := lockPair(from, to)
	n := from.entries[name]
	if n == nil {
		unlock()
		return errf(syscall.ENOENT, "temporary %s vanished", name)
	}
	var replaced *File
	if old := to.entries[newName]; old != nil {
		if noReplace {
			unlock()
			return errf(syscall.EEXIST, "%s exists", newName)
		}
		f, ok := old.(*File)
		if !ok {
			unlock()
			return errf(syscall.EISDIR, "%s is a directory", newName)
		}
		replaced = f
	}
	from.delEntry(name)
	to.setEntry(newName, n)
	unlock()
	if _, isDir := n.(*Dir); from != to && isDir {
		from.invalidate() // nlinks changed
		to.invalidate()
	}
	if replaced != nil {
		replaced.t.Unlink()
	}
	return nil
}

// pruneEmpty removes the empty directories below d and reports whether d
// is empty then.
func pruneEmpty(d *Dir) bool {
	for _, e := range d.Entries() {
		sub, ok := e.Node.(*Dir)
		if !ok || !pruneEmpty(sub) {
			continue
		}
		d.mu.Lock()
		if n := d.entries[e.Name]; n == Node(sub) && sub.Empty() {
			d.delEntry(e.Name)
		}
		d.mu.Unlock()
		d.invalidate()
	}
	return d.Empty()
}
