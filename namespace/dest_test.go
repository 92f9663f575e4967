package namespace

import (
	"bytes"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// unmountedFS is a tensor tree on host memory with no mount: copies into it
// put tensors in place inside the daemon (there is no mount to rename
// through).
func unmountedFS(t testing.TB) *Tree {
	t.Helper()
	h, err := gpu.NewHost(256 << 20)
	require.NoError(t, err)
	store, err := tensor.NewStore(tensor.Config{Devices: []gpu.Device{h}})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	tree, _, err := New(store, nil)
	require.NoError(t, err)
	return tree
}

func u8(rel string, n int) transfer.Meta {
	return transfer.Meta{Rel: rel, DType: "U8", Shape: strconv.Itoa(n), NBytes: int64(n)}
}

// names lists d's entries.
func names(d *Dir) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for n := range d.entries {
		out = append(out, n)
	}
	return out
}

// fill writes item i of d with bytes seed, seed+1, ...
func fillItems(t *testing.T, d *dest, seed byte) {
	t.Helper()
	for i := range d.items {
		p := make([]byte, d.items[i].temp.Info().Size)
		for j := range p {
			p[j] = seed + byte(i) + byte(j)
		}
		require.NoError(t, d.WriteAt(i, p, 0))
	}
}

func readAll(t *testing.T, f *Tree, p string) []byte {
	t.Helper()
	n, err := f.Resolve(p)
	require.NoError(t, err)
	file, ok := n.(*File)
	require.True(t, ok, "%s is not a file", p)
	b := make([]byte, file.t.Info().Size)
	_, err = file.t.ReadAt(b, 0)
	require.NoError(t, err)
	return b
}

// TestStagedDirectory: a directory copy into a directory that does not
// exist builds it under a temporary name (nothing at the final name until
// Commit), then puts the whole tree in place at once, owned like its
// parent; Abort leaves nothing behind.
func TestStagedDirectory(t *testing.T) {
	f := unmountedFS(t)
	home, err := f.mkdirAll("/home")
	require.NoError(t, err)
	home.meta.UID, home.meta.GID = 1000, 1001
	metas := []transfer.Meta{u8("a", 16), u8("sub/deep/b", 32)}
	_, err = f.prepare("/home/missing/new", true, metas, prepOpts{})
	require.ErrorIs(t, err, syscall.ENOENT, "the destination's parent must exist")
	d, err := f.prepare("/home/new", true, metas, prepOpts{})
	require.NoError(t, err)
	got := names(home)
	require.Len(t, got, 1)
	require.True(t, strings.HasPrefix(got[0], tmpPrefix), "staged under a temporary name, got %v", got)
	fillItems(t, d, 7)
	n, err := d.Commit()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, []string{"new"}, names(home))
	for _, p := range []string{"/home/new", "/home/new/sub", "/home/new/sub/deep"} {
		node, err := f.Resolve(p)
		require.NoError(t, err)
		m := node.(*Dir).Meta()
		require.Equal(t, [3]uint32{1000, 1001, 0o755}, [3]uint32{m.UID, m.GID, m.Mode}, p)
	}
	for i, p := range []string{"/home/new/a", "/home/new/sub/deep/b"} {
		node, err := f.Resolve(p)
		require.NoError(t, err)
		m := node.(*File).Meta()
		require.Equal(t, [3]uint32{1000, 1001, copyMode}, [3]uint32{m.UID, m.GID, m.Mode}, p)
		b := readAll(t, f, p)
		require.Equal(t, 7+byte(i), b[0])
	}

	// A failed copy leaves no trace.
	d, err = f.prepare("/home/other", true, metas, prepOpts{})
	require.NoError(t, err)
	d.Abort()
	require.Equal(t, []string{"new"}, names(home))
	require.Equal(t, 2, f.store.Stats().Tensors, "the aborted copy's tensors are released")
}

// TestStagedDirectoryMadeMeanwhile: when the destination directory appears
// between prepare and Commit (another copy, a mkdir), the staged tensors
// go into it one by one, replacing files of the same name; nothing
// staged is left behind.
func TestStagedDirectoryMadeMeanwhile(t *testing.T) {
	f := unmountedFS(t)
	metas := []transfer.Meta{u8("a", 16), u8("sub/b", 32), u8("c", 8)}
	d, err := f.prepare("/new", true, metas, prepOpts{})
	require.NoError(t, err)
	fillItems(t, d, 40)

	// Meanwhile: /new is made, with an old "a".
	other, err := f.prepare("/new", true, []transfer.Meta{u8("a", 4)}, prepOpts{})
	require.NoError(t, err)
	fillItems(t, other, 1)
	_, err = other.Commit()
	require.NoError(t, err)
	require.Equal(t, []byte{1, 2, 3, 4}, readAll(t, f, "/new/a"))
	require.Equal(t, 4, f.store.Stats().Tensors)

	n, err := d.Commit()
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, []string{"new"}, names(f.root), "the staged directory is gone")
	for i, p := range []string{"/new/a", "/new/sub/b", "/new/c"} {
		b := readAll(t, f, p)
		require.Equal(t, int(metas[i].NBytes), len(b), p)
		require.True(t, bytes.Equal(b[:2], []byte{40 + byte(i), 41 + byte(i)}), "%s: %v", p, b[:2])
	}
	require.Equal(t, 3, f.store.Stats().Tensors, "the replaced a is released")
}
