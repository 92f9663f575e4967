package transfer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Path kinds, the index into copies.
const (
	PathLocal = iota
	PathIPC
	PathTCP
	// PathUCX: the bytes moved one-sided on the UCX endpoint to a peer of
	// another host (issue 17); the record's Transports say on what.
	PathUCX
	numPaths
)

// Record is one transfer, for stats: progress while it runs, the outcome
// after.
type Record struct {
	// ID numbers the records of a service from 1 (never reused).
	ID             uint64
	Src, Dst, Path string
	// pid is the process that asked for the copy, 0 when unknown or not
	// yet known (WithCallerLookup).
	pid atomic.Int64
	// Streams is how many TCP streams carry the data.
	Streams atomic.Int64
	// sum is 1 + the Checksum of the TCP chunks this node sent or
	// received (the receiver's from the chunk headers); 0 before any.
	sum atomic.Uint32
	// via, on a "ucx" record, is what UCX's lanes to the peer run on
	// ("tcp/lo", "rc_mlx5/mlx5_0:1"): the path's own transports.
	via        atomic.Pointer[[]string]
	BytesDone  atomic.Int64
	BytesTotal atomic.Int64
	Tensors    atomic.Int64
	// Mode is "whole" (every descriptor replaces its tensor), "in_place"
	// (every one writes into an existing tensor) or "mixed"; "" until the
	// descriptors are known (a pull, before the peer's reply).
	mode atomic.Value // string
	err  atomic.Value // string
	// phases: on the receiving side, the microseconds spent preparing the
	// destination, moving the bytes and committing (RecordReport.PhaseUS).
	phases   [3]atomic.Int64
	received atomic.Bool // a phase was timed: this node received
	start    time.Time
	took     atomic.Int64 // µs from Track to end; 0 while it runs
}

// phase indexes Record's phase times (RecordReport.PhaseUS).
type phase int

const (
	phasePrepare phase = iota // the destination's temporaries allocated and registered
	phaseData                 // the bytes moved (received, or copied from an import)
	phaseCommit               // the temporaries renamed into place
)

// transports is rec.via's transports, nil for a transfer of another path.
func (rec *Record) transports() []string {
	if p := rec.via.Load(); p != nil {
		return *p
	}
	return nil
}

// timed runs fn and adds its duration to phase p of rec (nil: just runs).
func (rec *Record) timed(p phase, fn func() error) error {
	t := time.Now()
	err := fn()
	if rec != nil {
		rec.phases[p].Add(time.Since(t).Microseconds())
		rec.received.Store(true)
	}
	return err
}

// recentMax is how many finished transfers stats keeps.
const recentMax = 16

type callerKey struct{}

// WithCallerLookup returns ctx carrying the process id of the program that
// asked for a copy (the FUSE caller of the setxattr), so that the copy's
// records name it in stats ("pid") and that program can tell its own
// transfer from concurrent ones with the same src and dst (tensorfs cp
// does). The id takes a while to find (reading /proc/TID/status costs
// 10-50 µs, a few percent of a small copy): lookup runs once, on its own
// goroutine, beside the copy; its records show pid 0 until it returns, and
// each record's end waits for it, so a finished record always names its
// process.
func WithCallerLookup(ctx context.Context, lookup func() int) context.Context {
	return context.WithValue(ctx, callerKey{}, sync.OnceValue(lookup))
}

type callerPIDKey struct{}

// WithCallerPID is WithCallerLookup for a process id already known (a
// thread whose process was looked up a moment ago): its records name it at
// once, with no lookup beside the copy.
func WithCallerPID(ctx context.Context, pid int) context.Context {
	return context.WithValue(ctx, callerPIDKey{}, pid)
}

// setCaller fills rec's pid from ctx's caller once it is known; wait
// returns when it is.
func setCaller(ctx context.Context, rec *Record) (wait func()) {
	if pid, ok := ctx.Value(callerPIDKey{}).(int); ok {
		rec.pid.Store(int64(pid))
		return func() {}
	}
	lookup, ok := ctx.Value(callerKey{}).(func() int)
	if !ok {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		rec.pid.Store(int64(lookup()))
		close(done)
	}()
	return func() { <-done }
}

// Track records a transfer (for stats and logs) of the descriptors descs
// along path ("local", "ipc", "tcp" or "ucx"); call end with its outcome.
// Completed ones count in the copies of their path (and mode), with their
// bytes and descriptors.
func (s *Service) Track(src, dst, path string, descs []Meta) (rec *Record, end func(error)) {
	return s.TrackCtx(context.Background(), src, dst, path, descs)
}

// TrackCtx is Track for a copy asked for with ctx: its record carries the
// caller's process id (WithCallerLookup).
func (s *Service) TrackCtx(ctx context.Context, src, dst, path string, descs []Meta) (rec *Record, end func(error)) {
	rec = &Record{ID: s.nextID.Add(1), Src: src, Dst: dst, Path: path, start: time.Now()}
	known := setCaller(ctx, rec)
	rec.Streams.Store(1)
	rec.err.Store("")
	rec.mode.Store("")
	rec.setDescs(descs)
	s.active.Add(1)
	s.recentMu.Lock()
	s.recent = append(s.recent, rec)
	if len(s.recent) > recentMax {
		s.recent = s.recent[len(s.recent)-recentMax:]
	}
	s.recentMu.Unlock()
	return rec, func(err error) {
		d := time.Since(rec.start)
		took := max(d.Microseconds(), 1)
		known()
		if err != nil {
			rec.err.Store(err.Error())
		} else if p, ok := pathIndex[path]; ok {
			mode := rec.mode.Load().(string)
			m := modeIndex(mode)
			n := rec.BytesTotal.Load()
			s.copies[p][m].Add(1)
			s.bytes[p][m].Add(n)
			s.descriptors.Add(rec.Tensors.Load())
			if s.cfg.CopyDone != nil {
				s.cfg.CopyDone(path, ModeNames[m], n, time.Duration(took)*time.Microsecond)
			}
		}
		s.active.Add(-1)
		s.logEnd(rec, d, err)
		// Last: took_us says the record is finished, so its pid and
		// error must be there before it.
		rec.took.Store(took)
	}
}

// pathIndex maps a record's path to its index in the counters.
var pathIndex = map[string]int{"local": PathLocal, "ipc": PathIPC, "tcp": PathTCP, "ucx": PathUCX}

// Modes of a record (Record.mode).
const (
	modeWhole   = "whole"
	modeInPlace = "in_place"
	modeMixed   = "mixed"
)

// Mode kinds, the second index into CopyCounts' arrays.
const (
	ModeWhole = iota
	ModeInPlace
	ModeMixed
)

// PathNames and ModeNames name the indexes of CopyCounts' arrays, as the
// stats document and the metrics' labels spell them.
var (
	PathNames = [numPaths]string{PathLocal: "local", PathIPC: "ipc", PathTCP: "tcp", PathUCX: "ucx"}
	ModeNames = [3]string{ModeWhole: modeWhole, ModeInPlace: modeInPlace, ModeMixed: modeMixed}
)

// modeIndex is the index of a record's mode; "" (descriptors never known,
// which a finished copy does not have) counts as whole.
func modeIndex(mode string) int {
	switch mode {
	case modeInPlace:
		return ModeInPlace
	case modeMixed:
		return ModeMixed
	}
	return ModeWhole
}

// CopyCounts are the completed copies since start, by path and mode
// (Copies[PathTCP][ModeInPlace]: in-place copies over TCP), and their
// bytes; the counters behind the stats document's "copies".
type CopyCounts struct {
	Copies, Bytes [numPaths][3]int64
}

// CopyCounts returns the completed copies' counters now; zeros for a nil
// service.
func (s *Service) CopyCounts() CopyCounts {
	var c CopyCounts
	if s == nil {
		return c
	}
	for p := range s.copies {
		for m := range s.copies[p] {
			c.Copies[p][m] = s.copies[p][m].Load()
			c.Bytes[p][m] = s.bytes[p][m].Load()
		}
	}
	return c
}

// byPath sums a [path][mode] table over modes (indexes of ModeNames),
// per path.
func byPath(t *[numPaths][3]int64, modes ...int) PathCounts {
	var sum [numPaths]int64
	for p := range t {
		for _, m := range modes {
			sum[p] += t[p][m]
		}
	}
	return PathCounts{Local: sum[PathLocal], IPC: sum[PathIPC], TCP: sum[PathTCP], UCX: sum[PathUCX]}
}

// setDescs records a transfer's descriptors: their bytes, count and mode.
func (rec *Record) setDescs(descs []Meta) {
	if descs == nil {
		return
	}
	var total, n int64
	whole, inPlace := false, false
	for _, m := range descs {
		total += m.NBytes
		n += m.Descriptors()
		if m.InPlace {
			inPlace = true
		} else {
			whole = true
		}
	}
	rec.BytesTotal.Store(total)
	rec.Tensors.Store(n)
	rec.mode.Store(modeOf(whole, inPlace))
}

// ModeOf is the mode of a copy of descs, as its record says it: "whole",
// "in_place" (every descriptor writes into an existing tensor) or "mixed".
func ModeOf(descs []Meta) string {
	whole, inPlace := false, false
	for _, m := range descs {
		inPlace = inPlace || m.InPlace
		whole = whole || !m.InPlace
	}
	return modeOf(whole, inPlace)
}

// modeOf is the mode of a copy that has whole-tensor descriptors (whole)
// and in-place ones (inPlace).
func modeOf(whole, inPlace bool) string {
	switch {
	case whole && inPlace:
		return modeMixed
	case inPlace:
		return modeInPlace
	}
	return modeWhole
}

// PathCounts counts by path: local (inside one daemon), ipc (another
// daemon of this host), tcp (tensorfs's streams) and ucx (one-sided on a
// UCX endpoint; absent from a build without UCX, where it stays 0).
type PathCounts struct {
	Local int64 `json:"local"`
	IPC   int64 `json:"ipc"`
	TCP   int64 `json:"tcp"`
	UCX   int64 `json:"ucx"`
}

// Stats is the peer part of the stats document.
type Stats struct {
	// Copies counts the completed copies by path (the fields of
	// PathCounts, inline); InPlace those of them whose every descriptor
	// was written in place; Bytes their bytes, by path; Descriptors their
	// descriptors (a whole tensor, or one in-place range, each);
	// Rechecked the copies this node ran again from buffers after a
	// chunk failed its sum where its bytes lie, on either node
	// (request.Recheck: a process writing the source or destination
	// through its mapping, another copy into the same bytes, or
	// corruption), counted once each on the node that asked for the copy
	// (a push's sender, a pull's receiver).
	Copies struct {
		PathCounts
		InPlace     PathCounts `json:"in_place"`
		Bytes       PathCounts `json:"bytes"`
		Descriptors int64      `json:"descriptors"`
		Rechecked   int64      `json:"rechecked"`
	} `json:"copies"`
	Transfers struct {
		Active int64          `json:"active"`
		Recent []RecordReport `json:"recent"`
	} `json:"transfers"`
	// Peers are the nodes this one can reach by name: Config.Peers and
	// the Resolver's view.
	Peers map[string]PeerReport `json:"peers"`
	// Connections counts the authenticated peer connections open between
	// copies: Idle, kept by this node for its next copies (Config.
	// IdleTimeout); Waiting, peers' idle connections to this node, served
	// and waiting for their next request.
	Connections struct {
		Idle    int64 `json:"idle"`
		Waiting int64 `json:"waiting"`
	} `json:"connections"`
	// Cluster is the Resolver's state (an etcd view's); nil without one.
	Cluster *ClusterReport `json:"cluster,omitempty"`
	// Imports counts lookups in the import cache (allocations of daemons of
	// this host, opened for IPC copies): a hit reuses an open import, a miss
	// opens one (a CUDA IPC open costs about 9.4 ms on an H200).
	Imports struct {
		Hits   int64 `json:"hits"`
		Misses int64 `json:"misses"`
	} `json:"imports"`
}

// RecordReport is one transfer in stats.
type RecordReport struct {
	// ID is the record's number in this daemon, from 1, never reused: a
	// program follows a transfer by it.
	ID uint64 `json:"id"`
	// PID is the process that asked for the copy (through the mount), 0
	// for a transfer a peer asked for.
	PID  int    `json:"pid,omitempty"`
	Src  string `json:"src"`
	Dst  string `json:"dst"`
	Path string `json:"path"`
	// Transports, on a "ucx" transfer, are what UCX's lanes to the peer
	// run on ("tcp/lo", "posix/memory", "rc_mlx5/mlx5_0:1").
	Transports []string `json:"transports,omitempty"`
	BytesDone  int64    `json:"bytes_done"`
	BytesTotal int64    `json:"bytes_total"`
	// Tensors is the transfer's descriptors (tensors, or in-place ranges).
	Tensors int64 `json:"tensors"`
	// Mode is "whole", "in_place" or "mixed" (see Record).
	Mode  string `json:"mode,omitempty"`
	Error string `json:"error"`
	// Streams is how many TCP streams carry the data (1 for local and IPC
	// copies).
	Streams int64 `json:"streams"`
	// Checksum, on a TCP transfer, is the check its chunks carried
	// ("xxh3", "crc32c", "none"): as this node sent them, or as the
	// first chunk of each stream it received said (a receiver checks
	// whichever sum a chunk carries); absent before the first chunk and
	// on other paths.
	Checksum string `json:"checksum,omitempty"`
	// PhaseUS, on the node that received the tensors, is how long the
	// copy spent preparing the destination (allocating and registering its
	// temporaries), moving the bytes, and committing (renaming them into
	// place), in microseconds; absent on the sending side.
	PhaseUS *PhaseReport `json:"phase_us,omitempty"`
	// TookUS is how long the transfer took on this node, from its start
	// to its end (success or failure), in microseconds; absent while it
	// runs.
	TookUS int64 `json:"took_us,omitempty"`
}

// PhaseReport is a received transfer's time by phase, in microseconds.
type PhaseReport struct {
	Prepare int64 `json:"prepare"`
	Data    int64 `json:"data"`
	Commit  int64 `json:"commit"`
}

// PeerReport is one peer in stats: a --peer (Config.Peers) gives only
// Addr (and Source "peer" beside a Resolver); a Resolver's node says more.
type PeerReport struct {
	// Addr is the peer's HOST:PORT.
	Addr string `json:"addr"`
	// Source is where the address comes from: "peer" (Config.Peers, which
	// wins) or the Resolver's kind ("etcd"); absent without a Resolver.
	Source string `json:"source,omitempty"`
	// Self marks this node's own record in the Resolver's view.
	Self bool `json:"self,omitempty"`
	// HostID is the node's host identity, as it registered it.
	HostID string `json:"host_id,omitempty"`
	// SameHost: HostID is this node's (copies to it take the IPC path).
	SameHost bool `json:"same_host,omitempty"`
	// Instance is the id of the node's current run (a restart changes it).
	Instance string `json:"instance,omitempty"`
	// Transports are the ways the node moves bytes ("tcp").
	Transports []string `json:"transports,omitempty"`
	// UCX are the transports of this node's UCX endpoint to the peer
	// ("tcp/lo", "rc_mlx5/mlx5_0:1"), once a handshake with the peer has
	// made one; absent without.
	UCX []string `json:"ucx,omitempty"`
	// UCXOneSided says that endpoint reaches the peer's registered
	// memory by itself (an RMA lane on RDMA verbs, say); false where UCX
	// emulates puts and gets (its tcp, and its shared memory in UCX 1.13).
	UCXOneSided bool `json:"ucx_one_sided,omitempty"`
	// UCXPeerFailure says that endpoint detects a dead peer (UCX's peer
	// error handling: RDMA verbs, tcp; not shared memory).
	UCXPeerFailure bool `json:"ucx_peer_failure,omitempty"`
	// UCXCarries says copies with the peer move their bytes on that
	// endpoint: one-sided and detecting a dead peer, or any endpoint
	// with --ucx-any-endpoint; false: they stay on TCP.
	UCXCarries bool `json:"ucx_carries,omitempty"`
	// Since is when the node's current run started (RFC 3339, UTC).
	Since string `json:"since,omitempty"`
	// Stale: the directory is unreachable and this entry is from the last
	// view seen.
	Stale bool `json:"stale,omitempty"`
	// Reached, for a peer of Config.Peers, is when this node last
	// completed an authenticated handshake with it (RFC 3339, UTC; either
	// side dialling); HostID, SameHost and Instance are then from it.
	// Absent until one has.
	Reached string `json:"reached,omitempty"`
	// Checksum, for a peer reached so, is the check every chunk of a
	// TCP copy with it carries, both ways: "xxh3", "crc32c" (a peer that
	// runs --checksum crc32c, or a release before XXH3) or "none" (both
	// nodes run --checksum none).
	Checksum string `json:"checksum,omitempty"`
	// Local, for a peer of this host reached so, is its abstract unix
	// socket ("@tensorfs-" and its instance), which connections to it
	// use instead of TCP; absent: they use TCP.
	Local string `json:"local,omitempty"`
}

// Stats returns the copies, transfers and peers now. A nil service (no peer
// configuration) reports zeros.
func (s *Service) Stats() Stats {
	var st Stats
	st.Transfers.Recent = []RecordReport{}
	st.Peers = map[string]PeerReport{}
	if s == nil {
		return st
	}
	c := s.CopyCounts()
	st.Copies.PathCounts = byPath(&c.Copies, ModeWhole, ModeInPlace, ModeMixed)
	st.Copies.InPlace = byPath(&c.Copies, ModeInPlace)
	st.Copies.Bytes = byPath(&c.Bytes, ModeWhole, ModeInPlace, ModeMixed)
	st.Copies.Descriptors = s.descriptors.Load()
	st.Copies.Rechecked = s.rechecks.Load()
	st.Transfers.Active = s.active.Load()
	s.recentMu.Lock()
	for _, r := range s.recent {
		st.Transfers.Recent = append(st.Transfers.Recent, RecordReport{
			ID: r.ID, PID: int(r.pid.Load()), Src: r.Src, Dst: r.Dst, Path: r.Path, BytesDone: r.BytesDone.Load(),
			BytesTotal: r.BytesTotal.Load(), Tensors: r.Tensors.Load(), Mode: r.mode.Load().(string), Error: r.err.Load().(string),
			Streams: r.Streams.Load(), PhaseUS: r.phaseReport(), TookUS: r.took.Load(), Transports: r.transports(), Checksum: r.checksum(),
		})
	}
	s.recentMu.Unlock()
	st.Connections.Idle = int64(s.IdleConns())
	st.Connections.Waiting = s.waiting.Load()
	st.Peers, st.Cluster = s.peerReports()
	st.Imports.Hits = s.imports.hits.Load()
	st.Imports.Misses = s.imports.misses.Load()
	return st
}

// Imports is the number of other daemons' allocations this node holds open
// now (the stats' live "imports"); 0 for a nil service.
func (s *Service) Imports() int {
	if s == nil {
		return 0
	}
	return s.imports.len()
}

// Bindings is the number of peers' tensors this node is bound to write
// one-sided now (the stats' live "bindings"); 0 for a nil service.
func (s *Service) Bindings() int {
	if s == nil {
		return 0
	}
	return s.binds.len()
}

// noteSum records k as the checksum of the record's TCP chunks.
func (r *Record) noteSum(k Checksum) { r.sum.Store(uint32(k) + 1) }

// checksum is RecordReport.Checksum.
func (r *Record) checksum() string {
	if v := r.sum.Load(); v > 0 {
		return Checksum(v - 1).String()
	}
	return ""
}

// phaseReport is nil until a phase has been timed (a sending side's record).
func (r *Record) phaseReport() *PhaseReport {
	if !r.received.Load() {
		return nil
	}
	return &PhaseReport{Prepare: r.phases[phasePrepare].Load(), Data: r.phases[phaseData].Load(), Commit: r.phases[phaseCommit].Load()}
}
