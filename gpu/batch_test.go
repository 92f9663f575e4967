package gpu

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func hostPattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*31) ^ seed ^ byte(i>>8)
	}
	return p
}

func hostFilled(t testing.TB, h *Host, n int, seed byte) (Buffer, []byte) {
	t.Helper()
	b, err := h.Alloc(int64(n), 0)
	require.NoError(t, err)
	t.Cleanup(func() { b.Free() })
	p := hostPattern(n, seed)
	_, err = b.WriteAt(p, 0)
	require.NoError(t, err)
	return b, p
}

func readAllHost(t testing.TB, b Buffer) []byte {
	t.Helper()
	p := make([]byte, b.Size())
	_, err := b.ReadAt(p, 0)
	require.NoError(t, err)
	return p
}

// scatter makes count extents of sizes 1..maxN, laid end to end in dst in a
// shuffled order, from random offsets of the sources, and the bytes dst
// should hold after them.
func scatter(rng *rand.Rand, dst Buffer, dstB []byte, srcs []Buffer, srcB [][]byte, count, maxN int) ([]Extent, []byte) {
	want := bytes.Clone(dstB)
	exts := make([]Extent, count)
	off := int64(0)
	for _, i := range rng.Perm(count) {
		s := i % len(srcs)
		n := 1 + rng.Int64N(int64(maxN))
		so := rng.Int64N(srcs[s].Size() - n + 1)
		exts[i] = Extent{Dst: dst, DstOff: off, Src: srcs[s], SrcOff: so, N: n}
		copy(want[off:off+n], srcB[s][so:so+n])
		off += n
	}
	return exts, want
}

func TestCopyBatchHost(t *testing.T) {
	h, err := NewHost(64 << 20)
	require.NoError(t, err)
	defer h.Close()
	a, aB := hostFilled(t, h, 1<<20, 1)
	b, bB := hostFilled(t, h, 300<<10, 2)
	dst, dstB := hostFilled(t, h, 4<<20, 3)
	rng := rand.New(rand.NewPCG(1, 1))
	exts, want := scatter(rng, dst, dstB, []Buffer{a, b, dst}, [][]byte{aB, bB, dstB}, 300, 8192)
	// Sources inside dst are read from the part past the scattered bytes,
	// which the batch does not write, so the expectation holds in any order.
	for i := range exts {
		if exts[i].Src == dst {
			exts[i].SrcOff = 3<<20 + exts[i].SrcOff%(1<<20-8192)
			copy(want[exts[i].DstOff:], dstB[exts[i].SrcOff:exts[i].SrcOff+exts[i].N])
		}
	}
	exts = append(exts, Extent{Dst: dst, DstOff: 17, Src: a, SrcOff: 5}) // empty
	require.NoError(t, CopyBatch(exts))
	require.True(t, bytes.Equal(want, readAllHost(t, dst)), "every byte")
	require.NoError(t, CopyBatch(nil))

	// Host batches go extent by extent without allocating per extent (nor
	// at all).
	allocs := testing.AllocsPerRun(20, func() {
		if err := CopyBatch(exts); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}

func TestCopyBatchHostBadRangeCopiesNothing(t *testing.T) {
	h, err := NewHost(64 << 20)
	require.NoError(t, err)
	defer h.Close()
	src, _ := hostFilled(t, h, 4096, 1)
	dst, err := h.Alloc(4096, 0)
	require.NoError(t, err)
	defer dst.Free()
	good := Extent{Dst: dst, Src: src, N: 100}
	for i, bad := range []Extent{
		{Dst: dst, DstOff: 4000, Src: src, N: 97},
		{Dst: dst, Src: src, SrcOff: 4097, N: 0},
		{Dst: dst, Src: src, SrcOff: -1, N: 1},
		{Dst: dst, Src: src, N: -5},
		{Dst: dst, DstOff: 1 << 62, Src: src, N: 1 << 62},
		{Dst: nil, Src: src, N: 1},
		{Dst: dst, Src: nil, N: 1},
	} {
		err := CopyBatch([]Extent{good, good, bad, good})
		require.ErrorIs(t, err, ErrInvalidSize, "bad extent %d", i)
		require.Contains(t, err.Error(), "extent 2")
	}
	require.True(t, bytes.Equal(make([]byte, 4096), readAllHost(t, dst)), "not one byte written")
}

// batchBuf is a host buffer whose "device" runs batches itself.
type batchBuf struct {
	Buffer
	dev   Device
	done  bool
	calls *int
}

func (b *batchBuf) Device() Device { return b.dev }

// CopyBatch declines batches with a destination on another device, as the
// BatchCopier contract asks, and otherwise says b.done, copying nothing.
func (b *batchBuf) CopyBatch(exts []Extent) (bool, error) {
	*b.calls++
	for _, e := range exts {
		if e.Dst.Device() != b.dev {
			return false, nil
		}
	}
	return b.done, nil
}

type otherDev struct{ Device }

// TestCopyBatchOffersTheBatch: the BatchCopier of the first Dst gets the
// batch; when it declines (done=false; here for destinations on two
// devices) the batch goes extent by extent.
func TestCopyBatchOffersTheBatch(t *testing.T) {
	h, err := NewHost(64 << 20)
	require.NoError(t, err)
	defer h.Close()
	src, srcB := hostFilled(t, h, 4096, 1)
	raw, err := h.Alloc(4096, 0)
	require.NoError(t, err)
	defer raw.Free()
	calls := 0
	dst := &batchBuf{Buffer: raw, dev: h, done: true, calls: &calls}
	exts := []Extent{{Dst: dst, Src: src, N: 10}, {Dst: dst, DstOff: 10, Src: src, SrcOff: 20, N: 10}}

	require.NoError(t, CopyBatch(exts))
	require.Equal(t, 1, calls)
	require.True(t, bytes.Equal(make([]byte, 20), readAllHost(t, raw)[:20]), "the copier did it (here: nothing)")

	dst.done = false
	require.NoError(t, CopyBatch(exts))
	require.Equal(t, 2, calls)
	got := readAllHost(t, raw)
	require.Equal(t, srcB[:10], got[:10])
	require.Equal(t, srcB[20:30], got[10:20])

	dst.done = true
	_, err = raw.WriteAt(make([]byte, 4096), 0)
	require.NoError(t, err)
	other := &batchBuf{Buffer: raw, dev: otherDev{h}, done: true, calls: &calls}
	exts[1].Dst = other
	require.NoError(t, CopyBatch(exts))
	require.Equal(t, 3, calls, "offered, and declined")
	got = readAllHost(t, raw)
	require.Equal(t, srcB[:10], got[:10], "destinations on two devices: extent by extent")
	require.Equal(t, srcB[20:30], got[10:20])
}

// BenchmarkCopyBatchHost: 1000 scattered 8 KiB host copies as one batch.
func BenchmarkCopyBatchHost(b *testing.B) {
	h, err := NewHost(64 << 20)
	require.NoError(b, err)
	defer h.Close()
	src, _ := hostFilled(b, h, 8<<20, 1)
	dst, _ := hostFilled(b, h, 8<<20, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	exts := make([]Extent, 1000)
	for i, j := range rng.Perm(1000) {
		exts[i] = Extent{Dst: dst, DstOff: int64(j) * 8192, Src: src, SrcOff: int64(i) * 8192, N: 8192}
	}
	b.SetBytes(1000 * 8192)
	b.ReportAllocs()
	for b.Loop() {
		if err := CopyBatch(exts); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCopyBatchHostParallel: a large host batch is shared by several
// goroutines (copyHost), runs of extents and pieces of one extent larger
// than a share, and lands every byte as the sequential copy would; a
// buffer freed before the batch fails it with nothing copied.
func TestCopyBatchHostParallel(t *testing.T) {
	h, err := NewHost(64 << 20)
	require.NoError(t, err)
	defer h.Close()
	a, aB := hostFilled(t, h, 4<<20, 1)
	dst, dstB := hostFilled(t, h, 16<<20, 3)
	rng := rand.New(rand.NewPCG(2, 2))
	exts, want := scatter(rng, dst, dstB, []Buffer{a}, [][]byte{aB}, 700, 16<<10)
	// One extent larger than any share, at the end of dst.
	big := Extent{Dst: dst, DstOff: 12 << 20, Src: a, SrcOff: 1, N: 4<<20 - 1}
	copy(want[big.DstOff:], aB[1:])
	exts = append(exts[:350], append([]Extent{big, {Dst: dst, Src: a}}, exts[350:]...)...)
	var total int64
	for _, e := range exts {
		total += e.N
	}
	for _, w := range []int{1, 2, 3, 7} {
		parts := splitExtents(exts, total, w)
		require.Len(t, parts, w, "one extent is larger than a share: cut exactly")
		// The pieces, in order, are the extents, in order.
		var flat []Extent
		for _, p := range parts {
			for _, e := range p {
				if n := len(flat); n > 0 && flat[n-1].DstOff+flat[n-1].N == e.DstOff && flat[n-1].SrcOff+flat[n-1].N == e.SrcOff && e.Src == flat[n-1].Src {
					flat[n-1].N += e.N
					continue
				}
				flat = append(flat, e)
			}
		}
		var nonEmpty []Extent
		for _, e := range exts {
			if e.N > 0 {
				nonEmpty = append(nonEmpty, e)
			}
		}
		require.Equal(t, len(nonEmpty), len(flat), "%d workers", w)
		for i := range flat {
			require.Equal(t, nonEmpty[i], flat[i], "%d workers, extent %d", w, i)
		}
	}
	require.NoError(t, CopyBatch(exts))
	require.True(t, bytes.Equal(want, readAllHost(t, dst)), "every byte")
	// Without the large extent: cut at extent boundaries, sub-slices of
	// the batch, each about a share.
	small := slices.Delete(slices.Clone(exts), 350, 351)
	parts := splitExtents(small, total-big.N, 3)
	require.LessOrEqual(t, len(parts), 4)
	require.Equal(t, small, slices.Concat(parts...))
	for _, p := range parts[:len(parts)-1] {
		var n int64
		for _, e := range p {
			n += e.N
		}
		require.InDelta(t, float64(total-big.N)/3, float64(n), 16<<10)
	}

	gone, err := h.Alloc(1<<20, 0)
	require.NoError(t, err)
	_, err = dst.WriteAt(dstB, 0)
	require.NoError(t, err)
	bad := append(slices.Clone(exts), Extent{Dst: gone, Src: a, N: 1})
	require.NoError(t, gone.Free())
	require.ErrorIs(t, CopyBatch(bad), ErrInvalidSize, "a freed buffer has no bytes")
	// Freed between the range checks and the copy: ErrFreed, nothing
	// locked (a Free after it would block).
	_, err = gone.(hostMemory).rlockMem(true)
	require.ErrorIs(t, err, ErrFreed)
	require.True(t, bytes.Equal(dstB, readAllHost(t, dst)), "nothing copied")
}
