package gpu

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHostCopyLetsTheWorldStop: a large copy between host buffers does not
// hold up a stop-the-world (a garbage collection) until it ends: a
// goroutine inside one memmove of hundreds of MiB cannot be preempted, and
// the whole daemon (its FUSE server, its keepalives to peers) waited.
func TestHostCopyLetsTheWorldStop(t *testing.T) {
	h, err := NewHost(2 << 30)
	require.NoError(t, err)
	const n = 512 << 20
	src, err := h.Alloc(n, 1)
	require.NoError(t, err)
	defer src.Free()
	dst, err := h.Alloc(n, 1)
	require.NoError(t, err)
	defer dst.Free()
	took := make(chan time.Duration, 1)
	started := make(chan struct{})
	go func() {
		start := time.Now()
		close(started)
		require.NoError(t, Copy(dst, 0, src, 0, n))
		took <- time.Since(start)
	}()
	<-started
	time.Sleep(time.Millisecond)
	gcStart := time.Now()
	runtime.GC()
	gc := time.Since(gcStart)
	copied := <-took
	t.Logf("copy of %d MiB: %v; a GC during it: %v", n>>20, copied, gc)
	// Without a stopping point the GC waits out the whole copy (all but
	// the first millisecond); loaded machines make a GC slow, not that slow.
	require.Less(t, gc, copied*3/4, "the GC waited for the copy")
}
