package namespace

import (
	"bytes"
	"math/rand/v2"
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

// TestBlockOverlaps: blockOverlaps finds the tensors whose ranges overlap
// exactly as a comparison of every pair does, for block lists on one and
// two tensors (shuffled, with and without a repeated block), and declines
// lists it cannot decide by blocks (two lengths, a range off the block
// grid, a block past its bitmap).
func TestBlockOverlaps(t *testing.T) {
	type rg struct {
		t          *tensor.Tensor
		start, end int64
	}
	brute := func(rs []rg) map[*tensor.Tensor]bool {
		m := map[*tensor.Tensor]bool{}
		for i := range rs {
			for j := range i {
				if rs[i].t == rs[j].t && rs[i].start < rs[j].end && rs[j].start < rs[i].end {
					m[rs[i].t] = true
				}
			}
		}
		return m
	}
	each := func(rs []rg) func(yield func(*tensor.Tensor, int64, int64) bool) {
		return func(yield func(*tensor.Tensor, int64, int64) bool) {
			for _, r := range rs {
				if !yield(r.t, r.start, r.end) {
					return
				}
			}
		}
	}
	run := func(rs []rg) (map[*tensor.Tensor]bool, bool) {
		got, ok := blockOverlaps(each(rs))
		if ok { // the sort's answer too
			require.Equal(t, len(got), len(sortOverlaps(each(rs))))
		}
		return got, ok
	}
	a, b := new(tensor.Tensor), new(tensor.Tensor)
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 200 {
		n := 1 + rng.IntN(300)
		blk := int64(1) << (4 + rng.IntN(10))
		blkB := blk * int64(1+rng.IntN(3))
		perm := rng.Perm(4 * n)
		var rs []rg
		for i := range n {
			tt, bs := a, blk
			if trial%2 == 1 && i%3 == 0 {
				tt, bs = b, blkB
			}
			rs = append(rs, rg{tt, int64(perm[i]) * bs, int64(perm[i]+1) * bs})
		}
		if trial%3 == 0 { // a block named twice
			k := rng.IntN(n)
			rs = append(rs, rs[k])
			rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
		}
		got, ok := run(rs)
		require.True(t, ok, "trial %d: a block list", trial)
		want := brute(rs)
		require.Equal(t, len(want), len(got), "trial %d", trial)
		for tt := range want {
			require.True(t, got[tt], "trial %d", trial)
		}
	}
	for name, rs := range map[string][]rg{
		"two lengths":       {{a, 0, 8192}, {a, 8192, 12288}},
		"off the grid":      {{a, 0, 8192}, {a, 4096, 12288}},
		"past the bitmap":   {{a, 0, 16}, {a, 16 * maxBlockBits, 16*maxBlockBits + 16}},
		"grid of the first": {{a, 4096, 8192}, {a, 12288, 16384}, {a, 0, 4096}},
	} {
		_, ok := run(rs)
		if name == "grid of the first" {
			require.True(t, ok, name)
			continue
		}
		require.False(t, ok, name)
	}
}

// TestWriteInPlaceJoinsAdjacentPieces: a range list whose pieces lie back
// to back in the destination (blocks gathered from scattered sources into
// one run) is filled through one iovec, and each byte lands where its span
// says.
func TestWriteInPlaceJoinsAdjacentPieces(t *testing.T) {
	f := unmountedFS(t)
	const blk = 4096
	d, err := f.prepare("/cache", false, []transfer.Meta{u8("", 16*blk)}, prepOpts{})
	require.NoError(t, err)
	fillItems(t, d, 0)
	_, err = d.Commit()
	require.NoError(t, err)

	// Three pieces back to back at the destination, then one apart.
	spans := []transfer.Span{
		{Pos: 0, Src: 5 * blk, Dst: 2 * blk, N: blk},
		{Pos: blk, Src: 0, Dst: 3 * blk, N: 2 * blk},
		{Pos: 3 * blk, Src: 9 * blk, Dst: 5 * blk, N: blk},
		{Pos: 4 * blk, Src: blk, Dst: 10 * blk, N: blk},
	}
	m := u8("", 5*blk)
	m.InPlace, m.Spans = true, spans
	d, err = f.prepare("/cache", false, []transfer.Meta{m}, prepOpts{})
	require.NoError(t, err)
	src := make([]byte, 5*blk)
	rand.NewChaCha8([32]byte{4}).Read(src)
	var lens []int
	ok, err := d.WriteInPlace(0, 0, 5*blk, func(iov [][]byte) (int64, error) {
		var n int64
		for _, p := range iov {
			lens = append(lens, len(p))
			n += int64(copy(p, src[n:]))
		}
		return n, nil
	})
	require.NoError(t, err)
	require.True(t, ok, "host memory is written in place")
	require.Equal(t, []int{4 * blk, blk}, lens, "one iovec for the three adjacent pieces")
	_, err = d.Commit()
	require.NoError(t, err)
	got := readAll(t, f, "/cache")
	for _, s := range spans {
		require.Equal(t, src[s.Pos:s.Pos+s.N], got[s.Dst:s.Dst+s.N], "span at %d", s.Pos)
	}
}
