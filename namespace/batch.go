package namespace

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// runLines runs the lines of one call (a batch, or a copy_to of several
// lines) as one descriptor list (DESIGN.md "In-place copies"):
//
//   - the pushes of this mount's tensors (or their ranges) to one peer are
//     one transfer; the in-place lines into this mount are one local batch
//     (one gather/scatter kernel launch on CUDA); a pull is one get per
//     line; a directory line is a copy of its tree;
//   - every in-place line is moved before any whole-tensor line is
//     committed, so that a final small whole-tensor line is the call's
//     arrival notification: the in-place work runs first, then the
//     whole-tensor work. When the whole-tensor work is one peer's push
//     only, that peer's in-place descriptors travel in the same transfer
//     (its commit follows its own bytes), saving a round trip.
//
// It stops at the first failure and returns it. label names the call's
// source in records and logs.
//
// p holds what planRangeLines made of the call's first lines (the caller
// closes its sources once the call is done).
func (f *Tree) runLines(ctx context.Context, p *linePlan, lines []copyLine, viaMount bool, label string) error {
	for i := range lines {
		if err := f.planLine(ctx, p, &lines[i], viaMount); err != nil {
			return err
		}
	}
	return f.runPlan(ctx, p, label)
}

// wholeCheckMax is the most bytes of whole tensors that a call's checks
// ask a destination to prepare (allocating their temporaries) before its
// in-place bytes move: a notification's few, never a model's weights.
const wholeCheckMax = 1 << 20

// metaBytes is the bytes of srcs' descriptors.
func metaBytes(srcs []transfer.Source) int64 {
	var n int64
	for _, s := range srcs {
		n += s.Meta().NBytes
	}
	return n
}

// spanRoom is the spans a range list of p makes room for at its first
// span: the call's lines for its first list, a few for the others. Sized
// by the call for every list, a 64 KiB value of 2000 lines between 1000
// pairs of tensors took 64 MB of spans (a breaker's finding, 2026-12-06);
// the others grow as they need.
func (p *linePlan) spanRoom() int {
	if len(p.lists) > 1 {
		return 8
	}
	return p.hint
}

// newLinePlan is an empty plan for a call of about hint lines.
func newLinePlan(hint int) *linePlan {
	return &linePlan{set: sourceSet{}, pushes: map[string]*push{}, lists: map[listKey]*fileSource{}, pulls: map[string]*peerPull{}, hint: hint}
}

// runPlan runs the work of a call's planned lines: the in-place work, then
// the whole-tensor work (schedule). It stops at the first failure and
// returns it.
//
// No byte moves before every peer the lines name is known, and the lines
// into this mount are checked (and their destinations pinned) before the
// rest of the in-place work runs, their bytes moving after it: a call whose
// lines are refused here, or by one peer, writes nothing anywhere (a peer
// checks all its lines before it writes one). A call whose in-place work
// is more than one transfer besides those lines (lines to two peers, a
// pull and a push, a tree and a peer's lines) first has each checked
// (p.checks: transfer.Service.Check, CheckPull, or a local prepare let go;
// all at once: one more round trip), so that its refusal too writes
// nothing.
func (f *Tree) runPlan(ctx context.Context, p *linePlan, label string) error {
	for _, s := range p.lists {
		if s.meta.Spans != nil {
			s.meta.Shape = strconv.FormatInt(s.meta.NBytes, 10)
		}
	}
	for _, peer := range p.named {
		if err := f.knownPeer(peer); err != nil {
			return err
		}
	}
	f.schedule(ctx, p, label)
	checks, run := p.checks, len(p.checks) > 1
	if len(p.checks)+len(p.local) > 0 && (p.checkedWhole || len(p.wholeChecks) > 0) {
		// The whole-tensor lines that follow in-place bytes (a batch's
		// notification): a missing parent or a directory in the way
		// of one refused it after those bytes had landed.
		checks, run = append(slices.Clip(checks), p.wholeChecks...), true
	}
	if run {
		if err := checkAll(checks); err != nil {
			return err
		}
	}
	if len(p.local) > 0 {
		others := p.first
		p.first = []func() error{func() error {
			return f.localLines(ctx, label, p.local, func() error {
				for _, fn := range others {
					if err := fn(); err != nil {
						return err
					}
				}
				return nil
			})
		}}
	}
	for _, fn := range append(p.first, p.then...) {
		if err := fn(); err != nil {
			return err
		}
	}
	return nil
}

// checkAll runs a call's checks (linePlan.checks) at once, each peer's
// round trip beside the others', and returns the error of the first in
// their order that failed, or nil.
func checkAll(checks []func() error) error {
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, check := range checks {
		wg.Go(func() { errs[i] = check() })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// linePlan is a call's lines sorted into work: pushes by peer (in the order
// the peers first appear), in-place lines into this mount, and the rest, as
// the in-place work (first) and the whole-tensor work (then).
type linePlan struct {
	set         sourceSet
	opened      []transfer.Source
	pushes      map[string]*push
	peers       []string
	local       []transfer.Source
	first, then []func() error
	// lists are the in-place descriptors by source tensor and
	// destination: the call's later lines between the same two tensors
	// join them as spans (fileSource.addSpan).
	lists map[listKey]*fileSource
	// pulls are the in-place lines that pull ranges from a peer's
	// tensors into tensors here, by peer: one range-list get each
	// (pullLists).
	pulls map[string]*peerPull
	hint  int // the call's lines: room for a range list's spans
	// named is every peer the lines name, once (name).
	named []string
	// wholeChecks check the call's small whole-tensor transfers (pushes
	// of their own, copies inside this mount), which run after its
	// in-place bytes; checkedWhole: a check of p.checks carries some too.
	// runPlan runs them with the others when the call has in-place work.
	wholeChecks  []func() error
	checkedWhole bool
	// wholeTo is the destinations of the call's whole-tensor lines, as
	// "PEER:PATH" (planLine refuses a second line to one).
	wholeTo map[string]bool
	// caller is the FUSE caller of the call (nil: unknown), who must be
	// allowed to read each source in this mount (mayRead).
	caller *Caller
	// checks check the in-place transfers of first (and of a push in then
	// that carries in-place descriptors), but for the local lines, which
	// are checked first anyway: with more than one, runPlan runs them all
	// before any transfer.
	checks []func() error
}

// name notes that the call's lines name peer (runPlan checks each is
// known before any byte moves).
func (p *linePlan) name(peer string) {
	if peer != "" && !slices.Contains(p.named, peer) {
		p.named = append(p.named, peer)
	}
}

// knownPeer is ENOENT for a peer this node cannot resolve.
func (f *Tree) knownPeer(peer string) error {
	if f.peers == nil {
		return noPeers(peer)
	}
	return f.peers.Known(peer)
}

// noPeers is the error of a line naming peer on a node with no peers.
func noPeers(peer string) error {
	return errf(syscall.ENOENT, "unknown peer %q: no peers configured", peer)
}

// pullKey names a range list of a call's pull: the peer, its tensor, and
// the tensor here.
type pullKey struct{ peer, src, dst string }

// peerPull is a call's range-list pull from one peer: a list per pair of
// tensors (its tensor, one here), in the order of their first lines; all
// of them go as one get (one transfer a peer, as DESIGN.md asks of a
// call's lines).
type peerPull struct {
	lists []transfer.SpanPull
	index map[pullKey]int
}

func newPeerPull() *peerPull { return &peerPull{index: map[pullKey]int{}} }

// add appends span sp (its Pos set here) to the list of k.
func (pp *peerPull) add(k pullKey, sp transfer.Span) {
	i, ok := pp.index[k]
	if !ok {
		i = len(pp.lists)
		pp.index[k] = i
		pp.lists = append(pp.lists, transfer.SpanPull{Path: k.src, Dst: k.dst})
	}
	l := &pp.lists[i]
	sp.Pos = transfer.SpanEnd(l.Spans)
	l.Spans = append(l.Spans, sp)
}

// single is the one line the pull stands for when it has one span in all
// (then pulled as a plain get, as a line of its own is), or false.
func (pp *peerPull) single(peer string) (copyLine, bool) {
	if len(pp.lists) != 1 || len(pp.lists[0].Spans) != 1 {
		return copyLine{}, false
	}
	l := pp.lists[0]
	return pullKey{peer, l.Path, l.Dst}.line(l.Spans[0]), true
}

// pullSpanOf is line l as a span of a range-list pull (its Pos is the
// caller's): a pull from a peer of a source range of known length into a
// range here. false: l is pulled as a line of its own (a whole tensor, a
// source range to its end, lengths that disagree: its get says why).
func pullSpanOf(l *copyLine) (transfer.Span, bool) {
	sr, dr := l.src.r, l.dst.r
	if l.src.peer == "" || !dr.Set || !sr.Set || !sr.HasLen || sr.Off < 0 || sr.Len < 0 || dr.Off < 0 || dr.HasLen && dr.Len != sr.Len {
		return transfer.Span{}, false
	}
	return transfer.Span{Src: sr.Off, Dst: dr.Off, N: sr.Len}, true
}

// line is the one line a range-list pull of one span stands for.
func (k pullKey) line(sp transfer.Span) copyLine {
	return copyLine{
		src: ref{peer: k.peer, path: k.src, r: transfer.Range{Set: true, Off: sp.Src, Len: sp.N, HasLen: true}},
		dst: ref{path: k.dst, r: transfer.Range{Set: true, Off: sp.Dst}},
	}
}

// listKey names a range-list descriptor of a call: its source tensor and
// its destination (peer "" for this mount, and path).
type listKey struct {
	t          *tensor.Tensor
	peer, path string
}

// push is one peer's share of a call: its in-place and whole descriptors.
type push struct {
	inPlace, whole []transfer.Source
}

func (p *linePlan) later(inPlace bool, fn func() error) {
	if inPlace {
		p.first = append(p.first, fn)
	} else {
		p.then = append(p.then, fn)
	}
}

// step adds a line's transfer to p's work (later): run(false) runs it,
// and, in place, run(true) is its check (checks).
func (p *linePlan) step(inPlace bool, run func(check bool) error) {
	p.later(inPlace, func() error { return run(false) })
	if inPlace {
		p.checks = append(p.checks, func() error { return run(true) })
	}
}

// planLine sorts line l into p, opening its source when this mount's
// tensor goes out as a descriptor. Errors: EINVAL for a line between two
// peers or a range that does not fit; the source's lookup's.
func (f *Tree) planLine(ctx context.Context, p *linePlan, l *copyLine, viaMount bool) error {
	inPlace := l.dst.r.Set
	if !inPlace {
		// Two whole tensors for one name: to a peer, two descriptors of
		// one transfer, which it refused (EPROTO); here, the second
		// replaced the first. Neither is what the call meant.
		key := l.dst.peer + ":" + l.dst.path
		if p.wholeTo == nil {
			p.wholeTo = map[string]bool{}
		}
		if p.wholeTo[key] {
			return errf(syscall.EINVAL, "%s is the destination of two whole-tensor lines of one call", l.dst)
		}
		p.wholeTo[key] = true
	}
	if l.src.peer != "" {
		if l.dst.peer != "" {
			return errf(syscall.EINVAL, "%s -> %s: one side of a line must be this mount", l.src, l.dst)
		}
		p.name(l.src.peer)
		if sp, ok := pullSpanOf(l); ok {
			// One span of the peer's pull (one get for all of them).
			peer := l.src.peer
			pp := p.pulls[peer]
			if pp == nil {
				pp = newPeerPull()
				p.pulls[peer] = pp
				p.step(true, func(check bool) error {
					if one, ok := pp.single(peer); ok {
						return f.pullLine(ctx, one, check)
					}
					return f.pullLists(ctx, peer, pp.lists, prepOpts{caller: callerOf(ctx)}, check)
				})
			}
			pp.add(pullKey{peer, l.src.path, l.dst.path}, sp)
			return nil
		}
		p.step(inPlace, func(check bool) error { return f.pullLine(ctx, *l, check) })
		return nil
	}
	node := l.node
	if node == nil {
		if err := f.mayReach(p.caller, l.src.path); err != nil {
			return err
		}
		n, err := f.Resolve(l.src.path)
		if err != nil {
			return err
		}
		node = n
	}
	file, ok := node.(*File)
	if ok {
		if err := mayRead(p.caller, file); err != nil {
			return err
		}
	}
	if !ok || l.dst.peer == "" && !inPlace {
		// A tree, or a whole tensor inside this mount: a copy of its own.
		run := func(check bool) error { return f.copyNode(ctx, node, *l, viaMount, check) }
		p.step(inPlace, run)
		if !inPlace && ok && file.t.Size() <= wholeCheckMax {
			p.wholeChecks = append(p.wholeChecks, func() error { return run(true) })
		}
		return nil
	}
	key := listKey{file.t, l.dst.peer, l.dst.path}
	if inPlace {
		if s := p.lists[key]; s != nil {
			// One more span of a range list: no source, row or item of
			// its own.
			off, n, err := rangeIn(s.ref.meta.NBytes, l.src.r)
			if err != nil {
				return err
			}
			m, err := l.dst.r.Dest(transfer.Meta{NBytes: n})
			if err != nil {
				return err
			}
			s.addSpan(off, m.Off, n, p.spanRoom())
			return nil
		}
	}
	rel := strings.TrimPrefix(l.dst.path, "/")
	if rel == "" {
		return errf(syscall.EISDIR, "%s:/ is a directory (name the target file)", l.dst.peer)
	}
	s, err := p.set.open(file, rel, l.src.r)
	if err != nil {
		return err
	}
	// Sent with the call's other lines, rooted at the peer's "/": a
	// line's parent must exist there, as a copy of its own's must.
	s.meta.Line = !inPlace
	p.opened = append(p.opened, s)
	if inPlace {
		if s.meta, err = l.dst.r.Dest(s.meta); err != nil {
			return err
		}
		p.lists[key] = s
	}
	p.add(l.dst.peer, s)
	return nil
}

// add puts source s of a line to peer ("": this mount) into the plan's
// work: the local batch, or that peer's push.
func (p *linePlan) add(peer string, s *fileSource) {
	p.name(peer)
	if peer == "" {
		p.local = append(p.local, s)
		return
	}
	ps := p.pushes[peer]
	if ps == nil {
		ps = &push{}
		p.pushes[peer] = ps
		p.peers = append(p.peers, peer)
	}
	if s.meta.InPlace {
		ps.inPlace = append(ps.inPlace, s)
	} else {
		ps.whole = append(ps.whole, s)
	}
}

// schedule adds the local batch and the pushes to p's work. When one
// peer's push is all the whole-tensor work, and no line writes into this
// mount in place, its in-place descriptors go with it (one round trip).
func (f *Tree) schedule(ctx context.Context, p *linePlan, label string) {
	merge := ""
	// Not with lines into this mount: they move after the in-place work of
	// first, and a merged push is then's, after them; its refusal came
	// after their bytes had landed (a batch of local blocks, a peer's
	// blocks and its notification).
	if len(p.then) == 0 && len(p.local) == 0 {
		for _, peer := range p.peers {
			if len(p.pushes[peer].whole) == 0 {
				continue
			}
			if merge != "" {
				merge = ""
				break
			}
			merge = peer
		}
	}
	for _, peer := range p.peers {
		ps := p.pushes[peer]
		// The in-place descriptors, and the whole tensors when they are
		// small and go in a transfer of their own (a whole tensor's check
		// allocates its temporary there).
		checked := ps.inPlace
		small := peer != merge && len(ps.whole) > 0 && metaBytes(ps.whole) <= wholeCheckMax
		if small {
			checked = slices.Concat(ps.inPlace, ps.whole)
		}
		switch {
		case len(ps.inPlace) > 0:
			p.checks = append(p.checks, func() error { return f.pushLines(ctx, peer, label, checked, true) })
			p.checkedWhole = p.checkedWhole || small
		case small:
			p.wholeChecks = append(p.wholeChecks, func() error { return f.pushLines(ctx, peer, label, checked, true) })
		}
		if peer == merge {
			ps.whole, ps.inPlace = append(ps.inPlace, ps.whole...), nil
		}
		if len(ps.inPlace) > 0 {
			p.first = append(p.first, func() error { return f.pushLines(ctx, peer, label, ps.inPlace, false) })
		}
		if len(ps.whole) > 0 {
			p.then = append(p.then, func() error { return f.pushLines(ctx, peer, label, ps.whole, false) })
		}
	}
}

// pushLines sends a call's descriptors to peer as one transfer, rooted at
// its mount's root. check: only check them (transfer.Service.Check),
// moving nothing.
func (f *Tree) pushLines(ctx context.Context, peer, label string, srcs []transfer.Source, check bool) error {
	if f.peers == nil {
		return noPeers(peer)
	}
	if check {
		return f.peers.Check(ctx, peer, "/", srcs, true)
	}
	n, err := f.peers.Send(ctx, peer, "/", srcs, true, label)
	return logCopy(label, peer+":/", n, err, transfer.ModeOf(metasOf(srcs)))
}

// localLines writes a call's in-place descriptors into this mount, as one
// batch: they are checked and their destinations pinned, then between runs
// (the call's other in-place work; its error aborts them, nothing written
// here), then their bytes move.
func (f *Tree) localLines(ctx context.Context, label string, srcs []transfer.Source, between func() error) error {
	n, err := f.localCopy(ctx, label, "/", srcs, true, func(isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
		return f.prepare("/", isDir, metas, prepOpts{caller: callerOf(ctx)})
	}, between)
	return logCopy(label, "/", n, err, transfer.ModeOf(metasOf(srcs)))
}

// pullLine copies one line's peer source into this mount. It renames into
// place inside the daemon: the kernel holds the root's lock for a batch.
// check: only check the line (transfer.Service.CheckPull), moving nothing.
func (f *Tree) pullLine(ctx context.Context, l copyLine, check bool) error {
	if f.peers == nil {
		return noPeers(l.src.peer)
	}
	dst := l.dst.path
	pull := transfer.Pull{Peer: l.src.peer, Path: l.src.path, Range: l.src.r, Dst: dst, DstRange: l.dst.r}
	prepare := func(isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
		if !isDir && !l.dst.r.Set {
			if t, err := f.Resolve(dst); err == nil {
				if _, isD := t.(*Dir); isD {
					return nil, errf(syscall.EISDIR, "%s is a directory", dst)
				}
			}
		}
		return f.prepare(dst, isDir, metas, prepOpts{caller: callerOf(ctx)})
	}
	if check {
		return f.peers.CheckPull(ctx, pull, prepare)
	}
	n, err := f.peers.Receive(ctx, pull, prepare)
	return logCopy(l.src.String(), l.dst.String(), n, err, lineMode(l))
}

// pullLists copies a call's in-place lines from peer's tensors into
// tensors here as one transfer: a range-list get of every list. The spans
// are checked here (inside the tensors here, prepare) and there (inside
// the peer's) before a byte moves. check: only check them
// (transfer.Service.CheckPull), moving nothing.
func (f *Tree) pullLists(ctx context.Context, peer string, lists []transfer.SpanPull, opts prepOpts, check bool) error {
	if f.peers == nil {
		return noPeers(peer)
	}
	pull := transfer.Pull{Peer: peer, Lists: lists}
	prepare := func(_ bool, metas []transfer.Meta) (transfer.Dest, error) {
		// Every descriptor is in place, named by its path below the
		// root (Receive takes no directory for an answer).
		return f.prepare("/", true, metas, opts)
	}
	if check {
		return f.peers.CheckPull(ctx, pull, prepare)
	}
	n, err := f.peers.Receive(ctx, pull, prepare)
	return logCopy(pull.SrcText(), pull.DstText(), n, err, transfer.ModeNames[transfer.ModeInPlace])
}
