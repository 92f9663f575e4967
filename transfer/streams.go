package transfer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// MaxStreams bounds the parallel TCP streams of one transfer.
	MaxStreams = 8
	// DefaultStreams is the streams a transfer asks for when Config.Streams
	// is 0: measured on loopback (bench/history.md, "Peer copies").
	DefaultStreams = 2
	// minGridChunk is the smallest chunk size accepted with several streams,
	// in bytes: it bounds the receiver's bitmap of arrived chunks to one bit
	// per KiB of the tensors (whose memory it has already allocated).
	minGridChunk = 1 << 10
	// streamChunks: a transfer takes one stream per streamChunks chunks at
	// most, so a small copy pays no join round trips.
	streamChunks = 4
)

// streamsFor is how many streams a transfer of total bytes in chunks of
// chunk bytes takes when the client asks for want.
func streamsFor(total int64, want, chunk int) int {
	if want <= 1 || chunk < minGridChunk || chunk > MaxFrame-dataHeaderLen-1 {
		return 1
	}
	k := min(int64(want), MaxStreams, total/(streamChunks*int64(chunk)))
	return int(max(k, 1))
}

// chunkFor is the chunk size of a transfer of total bytes, in bytes: the
// configured one, or, when that would give each stream fewer than
// chunksPerStream chunks, smaller, down to minChunk (in steps of 64 KiB).
// A transfer's first chunk is read and its last one checked with no other
// chunk of its stream in flight: with 1 MiB chunks an 8 MiB copy over two
// streams spent a fifth of its time on the last chunks' CRC32C alone (an
// execution trace on an H200's host).
func (s *Service) chunkFor(total int64) int {
	c := int64(s.cfg.ChunkSize)
	per := total / int64(max(1, s.cfg.Streams)*chunksPerStream)
	if per < c {
		c = max(minChunk, (per+64<<10-1)&^(64<<10-1))
	}
	return int(min(c, int64(s.cfg.ChunkSize)))
}

// chunksPerStream and minChunk bound chunkFor: at least this many chunks
// a stream where the transfer is large enough, and no chunk smaller than
// minChunk bytes (whose frame header and syscalls would start to show).
const (
	chunksPerStream = 16
	minChunk        = 256 << 10
)

// eagerMax is the largest put whose data follows its request at once,
// without waiting for the receiver's go-ahead (eagerPut), in bytes: small
// enough for the sockets' buffers to take while the receiver prepares.
const eagerMax = 1 << 20

// eagerPut reports whether a put of total bytes, asking for streams streams
// of chunk-byte chunks, sends its data right behind its request: it takes
// one stream (streamsFor) and is at most eagerMax. Both sides compute it
// from the request, so the receiver sends no go-ahead for it: a small copy
// costs one round trip, not two.
func eagerPut(total int64, streams, chunk int) bool {
	return total <= eagerMax && streamsFor(total, streams, chunk) == 1
}

// stream is one connection carrying part of a transfer's data.
type stream struct {
	c *conn
	// inStep: the stream ended at a frame boundary, after its done (or
	// error) frame, so the connection can serve the next request.
	inStep bool
	// ended, for a connection that joined on this (the server's) side, is
	// told inStep when the transfer is done with it: serveJoin waits on it.
	ended chan bool
}

// joined is an extra stream as it arrives, or the reason it will not.
type joined struct {
	st  *stream
	err error
}

// pending is a transfer that waits for its extra streams to join.
type pending struct {
	s     *Service
	token string
	peer  string
	joins chan joined

	mu     sync.Mutex
	closed bool
	joined int // streams that joined so far
}

// expect registers a transfer with peer that n extra streams will join, and
// returns its token for the reply.
func (s *Service) expect(peer string, n int) *pending {
	p, _ := s.expectToken(peer, nonce(), n)
	return p
}

// expectToken is expect with the token given: an early put's, which its
// sender chose (request.Early). Errors: EPROTO for a token of another
// length than nonce's, or one already registered.
func (s *Service) expectToken(peer string, token []byte, n int) (*pending, error) {
	if len(token) != nonceLen {
		return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: a transfer token of %d bytes", peer, len(token))}
	}
	p := &pending{s: s, token: string(token), peer: peer, joins: make(chan joined, n)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		s.pending = map[string]*pending{}
	}
	if s.pending[p.token] != nil {
		return nil, &Error{Errno: syscall.EPROTO, Msg: fmt.Sprintf("%s: a transfer token already in use", peer)}
	}
	s.pending[p.token] = p
	s.wakeJoinsLocked()
	return p, nil
}

// wakeJoinsLocked wakes the early joins waiting for their put
// (findPending) to look again. Called with s.mu held.
func (s *Service) wakeJoinsLocked() {
	if s.pendingAdded != nil {
		close(s.pendingAdded)
		s.pendingAdded = nil
	}
}

// endedToken is a transfer's token and when it ended (Service.ended).
type endedToken struct {
	token string
	at    time.Time
}

// endToken notes that the early put of token ended (Service.ended), and
// wakes its joins still waiting for it; it forgets the puts that ended
// more than a timeout ago.
func (s *Service) endToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	k := 0
	for k < len(s.endedOrder) && now.Sub(s.endedOrder[k].at) > s.cfg.Timeout {
		delete(s.ended, s.endedOrder[k].token)
		k++
	}
	// Amortized: the array is let go when append grows it.
	s.endedOrder = s.endedOrder[k:]
	if s.ended == nil {
		s.ended = map[string]struct{}{}
	}
	s.ended[token] = struct{}{}
	s.endedOrder = append(s.endedOrder, endedToken{token, now})
	s.wakeJoinsLocked()
}

// findPending is the transfer of token, registered or, for an early join
// (wait), registered within the timeout: its put may come on its own
// connection after the join. nil when none.
func (s *Service) findPending(token string, wait bool, timeout time.Duration) *pending {
	var deadline *time.Timer
	for {
		s.mu.Lock()
		p := s.pending[token]
		_, ended := s.ended[token]
		if p != nil || !wait || ended {
			s.mu.Unlock()
			return p
		}
		if s.pendingAdded == nil {
			s.pendingAdded = make(chan struct{})
		}
		added := s.pendingAdded
		s.mu.Unlock()
		if deadline == nil {
			deadline = time.NewTimer(timeout)
			defer deadline.Stop()
		}
		select {
		case <-added:
		case <-deadline.C:
			return nil
		}
	}
}

// close ends the registration: joins that come later are refused, and
// streams that joined are told whether they are still in step.
func (p *pending) close(extras []*stream) {
	if p == nil {
		return
	}
	p.s.mu.Lock()
	delete(p.s.pending, p.token)
	p.s.mu.Unlock()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	for _, st := range extras {
		st.ended <- st.inStep
	}
	for {
		select {
		case j := <-p.joins: // joined but never taken up
			j.st.ended <- false
		default:
			return
		}
	}
}

// serveJoin adds connection c to the transfer its token names, and waits
// until the transfer is done with it; false means c is out of step (or
// failed) and must be dropped.
//
// An early join (request.Early) waits up to the timeout for its put to
// register, and is answered only with a refusal, after which c is dropped
// (the joiner's data follows the request).
func (s *Service) serveJoin(c *conn, req request) bool {
	p := s.findPending(string(req.Token), req.Early, c.timeout)
	if p == nil || p.peer != c.peer {
		c.sendError(&Error{Errno: syscall.ENOENT, Msg: "no transfer to join with that token"})
		return !req.Early
	}
	p.mu.Lock()
	if p.closed || p.joined == cap(p.joins) {
		p.mu.Unlock()
		c.sendError(&Error{Errno: syscall.EBUSY, Msg: "the transfer takes no more streams"})
		return !req.Early
	}
	if !req.Early {
		if err := c.sendJSON(frameOK, reply{}); err != nil {
			p.mu.Unlock()
			return false
		}
	}
	st := &stream{c: c, ended: make(chan bool, 1)}
	p.joined++
	p.joins <- joined{st: st}
	p.mu.Unlock()
	return <-st.ended
}

// joinStreams opens n extra streams of a transfer to peer (idle connections
// or new ones) and joins them to it with token; each arrives on the channel
// as soon as it is ready (or its error does): early, as soon as its join
// request is written (request.Early: the data follows it at once).
func (s *Service) joinStreams(ctx context.Context, peer string, token []byte, n int, early bool) <-chan joined {
	out := make(chan joined, n)
	for range n {
		go func() {
			c, err := s.conn(ctx, peer)
			if err != nil {
				out <- joined{err: err}
				return
			}
			if err := c.sendJSON(frameRequest, request{Op: "join", Path: "/", Token: token, Early: early}); err != nil {
				c.c.Close()
				out <- joined{err: netErr(err)}
				return
			}
			if early {
				out <- joined{st: &stream{c: c}}
				return
			}
			if err := c.recvJSON(frameOK, nil); err != nil {
				c.c.Close()
				out <- joined{err: err}
				return
			}
			out <- joined{st: &stream{c: c}}
		}()
	}
	return out
}

// releaseStreams gives the client's extra streams back: to the idle pool
// when the transfer succeeded and they ended in step, else closed.
func (s *Service) releaseStreams(peer string, extras []*stream, err error) {
	for _, st := range extras {
		s.done(peer, st.c, st.inStep, err)
	}
}

// streamSet tracks a transfer's streams: the first, and the extras as they
// join; fail closes them all (the extras at once, the first through onFail)
// so that every goroutine of the transfer stops.
type streamSet struct {
	dead   chan struct{} // closed at the failure
	mu     sync.Mutex
	extras []*stream
	err    error
	failed atomic.Bool
	onFail func(error)
	// abort, when set, aborts the destination at the failure, before
	// onFail: once every write in flight (wmu, read-held by each) is over.
	abort func()
	wmu   sync.RWMutex
}

// extendWrites moves the write deadline of first and of every joined
// stream to a timeout from now (net.Conn deadlines apply to writes already
// blocked).
func (ss *streamSet) extendWrites(first *conn) {
	dl := time.Now().Add(first.timeout)
	first.c.SetWriteDeadline(dl)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, st := range ss.extras {
		st.c.c.SetWriteDeadline(dl)
	}
}

// guard runs fn, a write into the destination, unless the transfer has
// failed; the abort waits for it. False: fn did not run.
func (ss *streamSet) guard(fn func()) bool {
	ss.wmu.RLock()
	defer ss.wmu.RUnlock()
	if ss.failed.Load() {
		return false
	}
	fn()
	return true
}

func (ss *streamSet) add(st *stream) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.err != nil {
		st.c.c.Close()
		ss.extras = append(ss.extras, st)
		return false
	}
	ss.extras = append(ss.extras, st)
	return true
}

// fail records the transfer's first error and stops it.
func (ss *streamSet) fail(err error) {
	ss.mu.Lock()
	if ss.err != nil {
		ss.mu.Unlock()
		return
	}
	ss.err = err
	ss.failed.Store(true)
	close(ss.dead)
	for _, st := range ss.extras {
		st.c.c.Close()
	}
	ss.mu.Unlock()
	if ss.abort != nil {
		ss.wmu.Lock()
		ss.abort()
		ss.wmu.Unlock()
	}
	if ss.onFail != nil {
		ss.onFail(err)
	}
}

func (ss *streamSet) result() ([]*stream, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.extras, ss.err
}

// awaitJoins starts run for each of the want extra streams as it arrives on
// joins, and fails the transfer if one cannot come or they do not all come
// within the timeout. It returns once every arrival has been handled, or at
// the transfer's failure; with all set (the client's joins, which always
// come, connection or error), the ones still to come are then closed as
// they arrive.
//
// watch, when set, gives a connection nobody reads meanwhile, or nil (the
// first stream of a get on the sending side; on the receiving side of a
// put, the first stream once it has ended): if its peer hangs up (or says
// anything: nothing is due on it), the streams will not come, and the
// transfer fails rather than wait out the timeout.
func (ss *streamSet) awaitJoins(joins <-chan joined, want int, all bool, watch func() *conn, timeout time.Duration, wg *sync.WaitGroup, run func(st *stream)) {
	if want == 0 {
		return
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var tick <-chan time.Time
	if watch != nil {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	for got := 0; got < want; got++ {
		select {
		case <-tick:
			if w := watch(); w != nil && !alive(w) {
				ss.fail(&Error{Errno: syscall.EIO, Msg: fmt.Sprintf("%s hung up before its streams joined", w.peer), broken: true})
			}
			got--
		case <-ss.dead:
			if all {
				go func() {
					for range want - got {
						if j := <-joins; j.st != nil {
							j.st.c.c.Close()
						}
					}
				}()
			}
			return
		case j := <-joins:
			if j.err != nil {
				ss.fail(j.err)
				continue
			}
			if !ss.add(j.st) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				run(j.st)
			}()
		case <-deadline.C:
			ss.fail(&Error{Errno: syscall.ETIMEDOUT, Msg: fmt.Sprintf("%d parallel streams did not join within %v", want, timeout), broken: true})
			return
		}
	}
}
