package transfer

import (
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestKeepaliveLoop: calls under whileCopying on three connections at once
// (a long timeout, a short one that joins while the loop sleeps its usual
// tick, and one with progress) each get keepalives often enough for their
// peer's timeout, the progress ones carrying the bytes done; none comes
// after a call returns; and the loop ends once no call has run for
// beatIdle, to start again with the next call.
func TestKeepaliveLoop(t *testing.T) {
	type seen struct {
		mu    sync.Mutex // the reader appends while a call may count
		at    []time.Duration
		bytes []int64
	}
	count := func(s *seen) int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.at)
	}
	start := time.Now()
	open := func(timeout time.Duration) (*conn, *seen, *sync.WaitGroup) {
		near, far := net.Pipe()
		t.Cleanup(func() { near.Close(); far.Close() })
		c := newConn(near, timeout, "far")
		s := &seen{}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				typ, p, err := readFrame(far, nil, 1<<20)
				if err != nil {
					return
				}
				if typ != frameKeepalive {
					t.Errorf("frame %d, want keepalives only", typ)
					return
				}
				s.mu.Lock()
				s.at = append(s.at, time.Since(start))
				if len(p) > 0 {
					var m progressMsg
					if err := json.Unmarshal(p, &m); err != nil {
						t.Error(err)
					}
					s.bytes = append(s.bytes, m.BytesDone)
				}
				s.mu.Unlock()
			}
		}()
		return c, s, &wg
	}
	long, longSeen, longDone := open(time.Hour)
	short, shortSeen, shortDone := open(600 * time.Millisecond)
	prog, progSeen, progDone := open(time.Hour)

	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		long.whileSilent(func() error { time.Sleep(2000 * time.Millisecond); return nil })
	}()
	time.Sleep(20 * time.Millisecond) // the loop runs, asleep for its usual tick
	// after counts the keepalives that come after a call returns: at most
	// one in flight (written before, its reader not yet done).
	var shortEnd time.Duration
	var shortAfter, progAfter int
	after := func(s *seen) int {
		n := count(s)
		time.Sleep(3 * progressEvery)
		return count(s) - n
	}
	go func() {
		defer wg.Done()
		short.whileSilent(func() error { time.Sleep(1800 * time.Millisecond); return nil })
		shortEnd = time.Since(start)
		shortAfter = after(shortSeen)
	}()
	rec := &Record{}
	go func() {
		defer wg.Done()
		prog.whileCopying(rec, func() error {
			for i := range 10 {
				rec.BytesDone.Store(int64(i+1) << 20)
				time.Sleep(60 * time.Millisecond)
			}
			return nil
		})
		progAfter = after(progSeen)
	}()
	wg.Wait()
	long.c.Close()
	short.c.Close()
	prog.c.Close()
	longDone.Wait()
	shortDone.Wait()
	progDone.Wait()

	require.Empty(t, longSeen.at, "a call shorter than a third of its timeout needs no keepalive")
	// The short call's peer must hear from it within its timeout, from
	// its start (20 ms) to its end; a third of the timeout is the aim.
	last := 20 * time.Millisecond
	for _, at := range shortSeen.at {
		require.Less(t, at-last, 600*time.Millisecond, "keepalives at %v", shortSeen.at)
		last = at
	}
	require.Less(t, shortEnd-last, 600*time.Millisecond, "keepalives at %v, end %v", shortSeen.at, shortEnd)
	require.GreaterOrEqual(t, len(shortSeen.at), 3, "about one every 200 ms: %v", shortSeen.at)
	require.LessOrEqual(t, shortAfter, 1, "none after the call")

	require.GreaterOrEqual(t, len(progSeen.bytes), 3, "progress every progressEvery: %v", progSeen.at)
	require.Len(t, progSeen.bytes, len(progSeen.at))
	for i, b := range progSeen.bytes {
		require.Positive(t, b)
		if i > 0 {
			require.GreaterOrEqual(t, b, progSeen.bytes[i-1])
		}
	}
	require.LessOrEqual(t, progAfter, 1, "none after the call")

	// Idle: the loop ends, and the next call starts it again.
	require.Eventually(t, func() bool {
		beats.mu.Lock()
		defer beats.mu.Unlock()
		return !beats.running && len(beats.calls) == 0
	}, 3*beatIdle, 10*time.Millisecond, "the loop ends when idle")
	again, againSeen, againDone := open(150 * time.Millisecond)
	again.whileSilent(func() error { time.Sleep(400 * time.Millisecond); return nil })
	again.c.Close()
	againDone.Wait()
	require.NotEmpty(t, againSeen.at, "keepalives after the loop restarted")
}

// TestKeepaliveLoopWakesEarly: a call whose first keepalive is due before
// the loop would wake (a timeout below 3*beatTick) moves the loop's wake-up
// to it, whether it starts the loop or joins it asleep; a 40 ms timeout's
// first keepalive came after beatTick (50 ms), and its copy timed out.
func TestKeepaliveLoopWakesEarly(t *testing.T) {
	require.Eventually(t, func() bool {
		beats.mu.Lock()
		defer beats.mu.Unlock()
		return !beats.running
	}, 3*beatIdle, 10*time.Millisecond, "the loop idle first")
	open := func(timeout time.Duration) *conn {
		near, far := net.Pipe()
		t.Cleanup(func() { near.Close(); far.Close() })
		go func() { // the peer reads whatever comes
			for {
				if _, _, err := readFrame(far, nil, 1<<20); err != nil {
					return
				}
			}
		}()
		return newConn(near, timeout, "far")
	}
	// woken reports whether the loop wakes no later than every call's next
	// keepalive.
	woken := func() bool {
		beats.mu.Lock()
		defer beats.mu.Unlock()
		if !beats.running || len(beats.calls) == 0 {
			return false
		}
		for b := range beats.calls {
			if beats.until.After(b.next) {
				return false
			}
		}
		return true
	}
	done := make(chan struct{})
	go open(30 * time.Millisecond).whileSilent(func() error { <-done; return nil }) // starts the loop: due in 10 ms
	require.Eventually(t, woken, time.Second, time.Millisecond, "the first wake-up at the first call's due time")
	close(done)
	require.Eventually(t, func() bool {
		beats.mu.Lock()
		defer beats.mu.Unlock()
		return len(beats.calls) == 0
	}, time.Second, time.Millisecond)

	// A long call keeps the loop asleep for beatTick; a short one joins.
	long := make(chan struct{})
	go open(time.Hour).whileSilent(func() error { <-long; return nil })
	defer close(long)
	time.Sleep(2 * beatTick) // the loop settles into beatTick sleeps
	done = make(chan struct{})
	defer close(done)
	go open(30 * time.Millisecond).whileSilent(func() error { <-done; return nil })
	require.Eventually(t, func() bool {
		beats.mu.Lock()
		n := len(beats.calls)
		beats.mu.Unlock()
		return n == 2 && woken()
	}, time.Second, time.Millisecond, "the loop woken for the short call")
}
