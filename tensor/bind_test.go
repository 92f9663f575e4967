package tensor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waitsFor runs change and checks that it returns only after release is
// called (a binding's holder letting go), once it has seen the revocation.
func waitsFor(t *testing.T, b *Binding, change func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- change() }()
	select {
	case <-b.Revoked():
	case <-time.After(5 * time.Second):
		t.Fatal("the change did not revoke the binding")
	}
	select {
	case err := <-done:
		t.Fatalf("the change returned (%v) before the binding was released", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.Release()
	b.Release() // idempotent
	require.NoError(t, <-done)
}

// TestBindExport: a binding gives the export and the size; a truncate
// (shrinking within the allocation, or growing past it), a write past the
// end, an unlink and RevokeBindings each revoke it first and wait for its
// release; an empty, unlinked or refused tensor is not bound; stats count
// the live bindings.
func TestBindExport(t *testing.T) {
	s := newStore(t, 64<<20)
	tt, err := s.New(Template{})
	require.NoError(t, err)
	all := func(string) bool { return true }
	_, ok := tt.BindExport("peer", all)
	require.False(t, ok, "an empty tensor")
	require.NoError(t, tt.Truncate(8192))
	_, ok = tt.BindExport("peer", func(string) bool { return false })
	require.False(t, ok, "a handle the peer cannot open")

	for _, c := range []struct {
		name   string
		change func() error
	}{
		{"shrink", func() error { return tt.Truncate(4096) }},
		{"grow", func() error { return tt.Truncate(1 << 20) }},
		{"write past the end", func() error { _, err := tt.WriteAt([]byte("x"), tt.Size()); return err }},
		{"rename", func() error { tt.RevokeBindings(); return nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			info := tt.Info()
			be, ok := tt.BindExport("peer", all)
			require.True(t, ok)
			require.Equal(t, info.Size, be.Size)
			require.Equal(t, info.IPCID, be.ExportID)
			require.Equal(t, info.IPCHandle, be.Handle)
			require.EqualValues(t, 1, s.Stats().Bound)
			// The export's lease goes as a peer's would: when revoked.
			go func() { <-be.Lease.Revoked(); be.Lease.Release() }()
			waitsFor(t, be.Binding, c.change)
			require.Zero(t, s.Stats().Bound)
		})
	}
	be, ok := tt.BindExport("peer", all)
	require.True(t, ok)
	go func() { <-be.Lease.Revoked(); be.Lease.Release() }()
	waitsFor(t, be.Binding, func() error { tt.Unlink(); return nil })
	_, ok = tt.BindExport("peer", all)
	require.False(t, ok, "an unlinked tensor")
	require.Zero(t, s.Stats().Bound)
}
