package tensor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOnAttrChange: the hook runs after every change of size, capacity or
// link, with the change already visible to Info (the frontend invalidates
// the kernel's cache from it, and the kernel may ask again at once), and
// not after a change of bytes alone or a reshape that keeps nbytes.
func TestOnAttrChange(t *testing.T) {
	s := newStore(t, 64<<20)
	tn, err := s.New(Template{})
	require.NoError(t, err)
	var seen []Info
	tn.OnAttrChange(func() { seen = append(seen, tn.Info()) })
	told := func(what string, check func(Info) bool) {
		t.Helper()
		require.Len(t, seen, 1, what)
		require.True(t, check(seen[0]), "%s: the hook saw %+v", what, seen[0])
		seen = seen[:0]
	}
	quiet := func(what string) {
		t.Helper()
		require.Empty(t, seen, what)
	}

	require.NoError(t, tn.SetDType("F32"))
	quiet("a dtype on an empty tensor")
	require.NoError(t, tn.SetShape("4,4"))
	told("a shape that allocates", func(in Info) bool { return in.Size == 64 && in.Capacity == 64 })
	require.NoError(t, tn.SetShape("16"))
	quiet("a reshape")
	_, err = tn.WriteAt(make([]byte, 8), 8)
	require.NoError(t, err)
	quiet("a write inside the size")
	_, err = tn.WriteAt(make([]byte, 8), 64)
	require.NoError(t, err)
	told("a write past the end", func(in Info) bool { return in.Size == 72 && in.Capacity >= 72 })
	require.NoError(t, tn.Truncate(16))
	told("a truncate", func(in Info) bool { return in.Size == 16 })
	require.NoError(t, tn.Allocate(0, 4096, true))
	told("fallocate keeping the size", func(in Info) bool { return in.Size == 16 && in.Capacity == 4096 })

	src, err := s.New(Template{})
	require.NoError(t, err)
	require.NoError(t, src.Truncate(1000))
	require.NoError(t, tn.Adopt(src))
	told("an adoption", func(in Info) bool { return in.Size == 1000 })
	src.Unlink()

	h, err := tn.Open("test")
	require.NoError(t, err)
	tn.Unlink()
	told("an unlink", func(in Info) bool { return !in.Linked })
	tn.Unlink()
	quiet("a second unlink")
	h.Close()
}

// TestOnAttrChangeNotLostToAnotherMethod: a method tells of the changes
// made since it began, whoever made them, so none is lost to a concurrent
// method that changed nothing (with one flag for both, the other method
// could clear it first and send its notice only after this one returned).
func TestOnAttrChangeNotLostToAnotherMethod(t *testing.T) {
	s := newStore(t, 64<<20)
	tn, err := s.New(Template{})
	require.NoError(t, err)
	require.NoError(t, tn.Truncate(64))
	calls := 0
	tn.OnAttrChange(func() { calls++ })
	// A write that began before the truncate and ends after it tells of
	// it too; the truncate tells of its own change whatever the write did.
	gen := tn.attrGen.Load()
	require.NoError(t, tn.Truncate(128))
	require.Equal(t, 1, calls)
	tn.flushAttrs(gen) // the write's deferred flush
	require.Equal(t, 2, calls, "a method that saw a change since it began tells of it")
	tn.flushAttrs(tn.attrGen.Load())
	require.Equal(t, 2, calls, "no change since: no notice")
}
