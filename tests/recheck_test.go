package tests

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// TestWritersDuringCopies: a process writes a TCP copy's source, or its
// in-place destination, through its mapping while the copy runs, push and
// pull: every copy succeeds, and no pin is left. Chunks are summed where
// their bytes lie, so such a write can make a chunk fail its sum; the copy
// then runs again from buffers (README "Each chunk of a TCP copy carries a
// checksum"), which the writer cannot disturb. A multi-stream push whose
// destination failed a sum once ended in EIO (its broken streams stood in
// for the destination's reason; a breaker's finding). The copies that ran
// again are logged (stats copies.rechecked): how many depends on timing.
func TestWritersDuringCopies(t *testing.T) {
	const n = 8 << 20 // several streams
	for _, tc := range []struct {
		name   string
		mapped func(a, b *daemon) string // the tensor the writer maps
		copy   func(a, b *daemon) error
	}{
		{"source,push", func(a, b *daemon) string { return a.path("src") }, func(a, b *daemon) error {
			return unix.Setxattr(a.path("src"), xattrs.CopyTo, []byte("b:/dst"), 0)
		}},
		{"source,pull", func(a, b *daemon) string { return a.path("src") }, func(a, b *daemon) error {
			return unix.Setxattr(b.path("d"), xattrs.CopyFrom, []byte("a:/src @0"), 0)
		}},
		{"destination,push", func(a, b *daemon) string { return b.path("d") }, func(a, b *daemon) error {
			return unix.Setxattr(a.path("src"), xattrs.CopyTo, []byte("b:/d@0"), 0)
		}},
		{"destination,pull", func(a, b *daemon) string { return b.path("d") }, func(a, b *daemon) error {
			return unix.Setxattr(b.path("d"), xattrs.CopyFrom, []byte("a:/src @0"), 0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := cluster(t, []string{"a", "b"})
			a, b := ds["a"], ds["b"]
			writeTensor(t, a.path("src"), fill(n, 7))
			zeros(t, b.path("d"), n)
			m := mapTensorRW(t, tc.mapped(a, b))
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var writes atomic.Int64
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					m.mem[(i*4099)%len(m.mem)] ^= 0x5a
					if writes.Add(1)%64 == 0 {
						time.Sleep(20 * time.Microsecond)
					}
				}
			})
			for i := range 5 {
				if err := tc.copy(a, b); err != nil {
					t.Errorf("copy %d: %v", i, err)
				}
			}
			close(stop)
			wg.Wait()
			t.Logf("%d writes; copies run again: a %d, b %d", writes.Load(), a.stats().Copies.Rechecked, b.stats().Copies.Rechecked)
			for _, d := range []*daemon{a, b} {
				require.Zero(t, d.stats().Live.Pins)
			}
		})
	}
}
