package tensor

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/gpu"
)

func newStore(t *testing.T, limit int64) *Store {
	t.Helper()
	h, err := gpu.NewHost(limit)
	require.NoError(t, err)
	s, err := NewStore(Config{Devices: []gpu.Device{h}})
	require.NoError(t, err)
	t.Cleanup(func() {
		s.Close()
		require.Equal(t, Stats{}, s.Stats(), "Close must free everything")
	})
	return s
}

func TestTemplateAllocatesAndReleaseFrees(t *testing.T) {
	s := newStore(t, 64<<20)
	tn, err := s.New(Template{DType: "BF16", Shape: dtype.Shape{16, 8, 128}})
	require.NoError(t, err)
	in := tn.Info()
	require.True(t, in.Allocated)
	require.EqualValues(t, 32768, in.Size)
	require.EqualValues(t, 32768, in.Capacity)
	require.NotZero(t, in.MRID)
	require.Contains(t, in.IPCHandle, "memfd:/proc/")
	st := s.Stats()
	require.Equal(t, Stats{Tensors: 1, Regions: 1, Exports: 1, Bytes: 32768}, st)

	h, err := tn.Open("fh test")
	require.NoError(t, err)
	require.Equal(t, 1, s.Stats().Leases)
	tn.Unlink()
	require.Equal(t, 1, s.Stats().Tensors, "an open handle keeps an unlinked tensor")
	buf := make([]byte, 4)
	_, err = tn.WriteAt([]byte{1, 2, 3, 4}, 10)
	require.NoError(t, err)
	_, err = tn.ReadAt(buf, 10)
	require.NoError(t, err)
	require.Equal(t, []byte{1, 2, 3, 4}, buf)
	h.Close()
	require.Equal(t, Stats{}, s.Stats())
}

func TestEmptyUntilSized(t *testing.T) {
	s := newStore(t, 64<<20)
	tn, err := s.New(Template{})
	require.NoError(t, err)
	require.False(t, tn.Info().Allocated)
	require.Zero(t, s.Stats().Regions)
	require.NoError(t, tn.Truncate(0))
	require.False(t, tn.Info().Allocated, "truncate to 0 allocates nothing")
	require.NoError(t, tn.SetDType("float32"))
	require.NoError(t, tn.SetShape("2,3"))
	in := tn.Info()
	require.True(t, in.Allocated)
	require.EqualValues(t, 24, in.Size)
	require.Equal(t, dtype.DType("F32"), in.DType)
	tn.Unlink()
}

func TestAppendGrowsGeometricallyAndKeepsIDs(t *testing.T) {
	s := newStore(t, 256<<20)
	tn, err := s.New(Template{})
	require.NoError(t, err)
	chunk := bytes.Repeat([]byte{7}, 4096)
	reallocs := 0
	last := uint64(0)
	var want []byte
	for i := 0; i < 1024; i++ {
		_, err := tn.WriteAt(chunk, int64(i*len(chunk)))
		require.NoError(t, err)
		want = append(want, chunk...)
		if id := tn.Info().MRID; id != last {
			reallocs++
			last = id
		}
	}
	// 4 MiB in 4 KiB appends: doubling needs about log2(1024)+1 allocations.
	require.LessOrEqual(t, reallocs, 12)
	in := tn.Info()
	require.EqualValues(t, 4<<20, in.Size)
	require.EqualValues(t, reallocs-1, in.Generation)
	got := make([]byte, len(want))
	n, err := tn.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	require.Equal(t, want, got)
	require.Equal(t, 1, s.Stats().Regions, "old allocations are retired")
	tn.Unlink()
}

func TestResizeSemantics(t *testing.T) {
	s := newStore(t, 64<<20)
	tn, err := s.New(Template{DType: "F32", Shape: dtype.Shape{4, 4}})
	require.NoError(t, err)
	_, err = tn.WriteAt(bytes.Repeat([]byte{9}, 64), 0)
	require.NoError(t, err)
	id := tn.Info().MRID

	// Shrink within the allocation: same ids, tail zeroed for a later growth.
	require.NoError(t, tn.Truncate(32))
	require.Equal(t, id, tn.Info().MRID)
	require.Equal(t, "2,4", tn.Info().Shape.String(), "rows are dropped")
	require.NoError(t, tn.Truncate(64))
	require.Equal(t, id, tn.Info().MRID)
	buf := make([]byte, 64)
	_, err = tn.ReadAt(buf, 0)
	require.NoError(t, err)
	require.Equal(t, append(bytes.Repeat([]byte{9}, 32), make([]byte, 32)...), buf)

	// Growing past the allocation reallocates exactly, keeps bytes, new ids.
	require.NoError(t, tn.Truncate(100))
	in := tn.Info()
	require.NotEqual(t, id, in.MRID)
	require.EqualValues(t, 1, in.Generation)
	require.EqualValues(t, 100, in.Capacity)
	require.Equal(t, "25", in.Shape.String())
	_, err = tn.ReadAt(buf[:4], 0)
	require.NoError(t, err)
	require.Equal(t, []byte{9, 9, 9, 9}, buf[:4])
	tn.Unlink()
}

func TestDTypeAndShapeKeepNBytes(t *testing.T) {
	s := newStore(t, 64<<20)
	tn, err := s.New(Template{DType: "F32", Shape: dtype.Shape{4, 4}})
	require.NoError(t, err)
	require.NoError(t, tn.SetShape("2,8"))
	require.ErrorIs(t, tn.SetShape("3,3"), ErrInvalid)
	require.Equal(t, "2,8", tn.Info().Shape.String(), "a failed reshape changes nothing")
	require.NoError(t, tn.SetDType("BF16"))
	require.Equal(t, "2,16", tn.Info().Shape.String(), "last dim scales like torch view(dtype)")
	require.NoError(t, tn.SetDType("F64"))
	require.Equal(t, "2,4", tn.Info().Shape.String())
	require.ErrorIs(t, tn.SetDType("nope"), ErrInvalid)
	require.ErrorIs(t, tn.SetDevice("host"), nil)
	require.ErrorIs(t, tn.SetDevice("cuda:0"), ErrBusy, "allocated: busy, whatever the device")
	tn.Unlink()

	e, err := s.New(Template{})
	require.NoError(t, err)
	_, err = e.WriteAt([]byte{1, 2, 3}, 0)
	require.NoError(t, err)
	require.ErrorIs(t, e.SetDevice("host"), nil, "same device is not a change")
	e.Unlink()
}

func TestOutOfMemoryChangesNothing(t *testing.T) {
	s := newStore(t, 1<<20)
	tn, err := s.New(Template{})
	require.NoError(t, err)
	_, err = tn.WriteAt(bytes.Repeat([]byte{1}, 400<<10), 0)
	require.NoError(t, err)
	id := tn.Info().MRID
	require.ErrorIs(t, tn.Truncate(2<<20), gpu.ErrOutOfMemory)
	_, err = tn.WriteAt([]byte{1}, 2<<20)
	require.ErrorIs(t, err, gpu.ErrOutOfMemory)
	require.ErrorIs(t, tn.SetShape("3000000"), ErrInvalid, "allocated: reshape must keep nbytes")
	in := tn.Info()
	require.Equal(t, id, in.MRID)
	require.EqualValues(t, 400<<10, in.Size)
	require.ErrorIs(t, tn.Truncate(MaxSize+1), ErrTooLarge)
	// A growth whose doubling does not fit (400 KiB held + 800 KiB) still fits
	// exactly (400 KiB + 500 KiB).
	_, err = tn.WriteAt(bytes.Repeat([]byte{2}, 100<<10), 400<<10)
	require.NoError(t, err)
	require.EqualValues(t, 500<<10, tn.Info().Capacity)
	tn.Unlink()

	big, err := s.New(Template{DType: "U8", Shape: dtype.Shape{2 << 20}})
	require.ErrorIs(t, err, gpu.ErrOutOfMemory)
	require.Nil(t, big)
}

func TestDTypeViewLikeTorch(t *testing.T) {
	s := newStore(t, 64<<20)
	tn, err := s.New(Template{DType: "F32", Shape: dtype.Shape{4, 1}})
	require.NoError(t, err)
	require.ErrorIs(t, tn.SetDType("F64"), ErrInvalid, "torch refuses: the last dim (1 x 4 bytes) is not whole F64s")
	require.Equal(t, "4,1", tn.Info().Shape.String())
	require.NoError(t, tn.SetDType("U8"))
	require.Equal(t, "4,4", tn.Info().Shape.String())
	tn.Unlink()
	sc, err := s.New(Template{DType: "F64", Shape: dtype.Shape{}})
	require.NoError(t, err)
	require.NoError(t, sc.SetDType("F32"), "a scalar views as 1-D")
	require.Equal(t, "2", sc.Info().Shape.String())
	sc.Unlink()
}

// TestFreeze: while a copy reads a tensor (Freeze), writes, truncates,
// fallocates and adoptions into it wait, and go ahead once every freeze is
// thawed; a new freeze does not wait behind a waiting writer (copies of
// overlapping trees must not deadlock).
func TestFreeze(t *testing.T) {
	s := newStore(t, 64<<20)
	x, err := s.New(Template{DType: "U8", Shape: dtype.Shape{4096}})
	require.NoError(t, err)
	src, err := s.New(Template{DType: "U8", Shape: dtype.Shape{4096}})
	require.NoError(t, err)
	thaw1 := x.Freeze()
	thaw2 := x.Freeze()
	changes := map[string]func() error{
		"write":    func() error { _, err := x.WriteAt([]byte("new"), 0); return err },
		"truncate": func() error { return x.Truncate(100) },
		"allocate": func() error { return x.Allocate(0, 8192, false) },
		"adopt":    func() error { return x.Adopt(src) },
	}
	done := make(chan string, len(changes))
	for name, change := range changes {
		go func() {
			if err := change(); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			done <- name
		}()
	}
	time.Sleep(50 * time.Millisecond)
	require.Empty(t, done, "nothing changes a frozen tensor")
	thaw3 := x.Freeze() // not held up by the writers waiting
	got := make([]byte, 4)
	n, err := x.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, []byte{0, 0, 0, 0}, got[:n], "reads go on")
	thaw1()
	thaw1() // idempotent: thaw2 and thaw3 still hold
	thaw3()
	time.Sleep(20 * time.Millisecond)
	require.Empty(t, done, "one freeze still holds")
	thaw2()
	for range changes {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("a change still waits after the last thaw")
		}
	}
}

// TestScratchPool: a tensor in host memory has no scratch (its pieces are
// memmoves); the pool hands out buffers of at least the size asked for,
// keeps at most scratchKeep of them per device, reuses a kept one, and
// frees what it keeps at Close.
func TestScratchPool(t *testing.T) {
	s := newStore(t, 1<<30)
	ten, err := s.New(Template{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ten.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	b, release, err := ten.Scratch(1 << 20)
	if b != nil || err != nil {
		t.Fatalf("host tensor: scratch %v, %v", b, err)
	}
	release()

	dev := s.DefaultDevice()
	var p scratchPool
	var bufs []gpu.Buffer
	var rels []func()
	for range scratchKeep + 2 {
		b, rel, err := p.take(dev, 100)
		if err != nil {
			t.Fatal(err)
		}
		if b.Size() < scratchMin {
			t.Fatalf("scratch of %d bytes, want at least %d", b.Size(), scratchMin)
		}
		bufs, rels = append(bufs, b), append(rels, rel)
	}
	for _, rel := range rels {
		rel()
	}
	if n := len(p.free[dev.Name()]); n != scratchKeep {
		t.Fatalf("%d kept, want %d", n, scratchKeep)
	}
	for _, b := range bufs[scratchKeep:] {
		if err := b.Free(); err == nil {
			t.Fatal("a scratch buffer past the kept ones was not freed")
		}
	}
	again, rel, _ := p.take(dev, 100)
	if !slices.Contains(bufs[:scratchKeep], again) {
		t.Fatal("a kept buffer was not reused")
	}
	rel()
	big, rel, err := p.take(dev, 2<<20)
	if err != nil || big.Size() < 2<<20 {
		t.Fatalf("2 MiB scratch: %v, %v", big, err)
	}
	rel()
	p.close()
	for _, b := range bufs[:scratchKeep] {
		if err := b.Free(); err == nil {
			t.Fatal("a kept scratch buffer was not freed at close")
		}
	}
	// Idle, the pool lets go of what it keeps: the device holds only the
	// tensor again.
	base := dev.MemInfo().Used
	_, rel, err = p.take(dev, 100)
	if err != nil {
		t.Fatal(err)
	}
	rel()
	if used := dev.MemInfo().Used; used <= base {
		t.Fatalf("the kept buffer is not counted by its device: %d, %d before", used, base)
	}
	require.Eventually(t, func() bool { return dev.MemInfo().Used == base }, 5*time.Second, 10*time.Millisecond, "kept scratch freed after scratchIdle")
}
