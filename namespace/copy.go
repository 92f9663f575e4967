package namespace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// parseTarget parses a copy's peer path: peer "" (or this node's own name)
// means this mount; a path under this mount's own mountpoint is taken as
// mount-relative.
func (f *Tree) parseTarget(v string) (peer, p string, err error) {
	v = strings.TrimSpace(v)
	if f.mnt != "" && strings.HasPrefix(v, f.mnt+"/") {
		v = v[len(f.mnt):]
	}
	peer, p, err = transfer.ParsePeerPath(v)
	if err == nil && f.peers != nil && peer == f.peers.Name() {
		peer = ""
	}
	return peer, p, err
}

// CopyContext is the context of a copy asked for by caller c (nil:
// unknown): not the request's own (a copy runs to completion or failure,
// whatever happens to the request), but carrying the caller, whose write
// permission an in-place destination in this mount needs, and its process
// id, looked up when the copy's record wants it.
func CopyContext(c *Caller) context.Context {
	if c == nil {
		return context.Background()
	}
	ctx := context.WithValue(context.Background(), copyCallerKey{}, c)
	if c.PID == 0 {
		return ctx
	}
	if pid, ok := tgidCached(int(c.PID)); ok {
		return transfer.WithCallerPID(ctx, pid)
	}
	return transfer.WithCallerLookup(ctx, func() int { return tgid(int(c.PID)) })
}

// tgid is the process of thread tid: FUSE names the calling thread, and a
// program knows itself by its process id. It asks the kernel through a
// pidfd of the thread (PIDFD_THREAD, Linux 6.9; PIDFD_GET_INFO, 6.13: a few
// µs) and falls back to /proc/TID/status (whose text costs the kernel 10-80
// µs to generate, 8% of a small copy's CPU). tid itself when neither says
// (the thread is gone).
func tgid(tid int) int {
	if pid, ok := tgidCached(tid); ok {
		return pid
	}
	pid := tgidLookup(tid)
	tgidCache.Lock()
	if tgidCache.m == nil || len(tgidCache.m) >= 4096 {
		tgidCache.m = map[int]tgidEntry{}
	}
	tgidCache.m[tid] = tgidEntry{pid: pid, at: time.Now()}
	tgidCache.Unlock()
	return pid
}

// tgidCached is tgid from the cache, when thread tid was looked up less
// than tgidFor ago.
func tgidCached(tid int) (int, bool) {
	tgidCache.Lock()
	defer tgidCache.Unlock()
	e, ok := tgidCache.m[tid]
	if ok && time.Since(e.at) < tgidFor {
		return e.pid, true
	}
	return 0, false
}

// tgidFor is how long a thread's process is remembered: a thread that
// copies once tends to copy again (a serving loop), and its three syscalls
// were a tenth of a small copy's CPU; a thread id is reused only after its
// thread exits, which a second does not make likely.
const tgidFor = time.Second

type tgidEntry struct {
	pid int
	at  time.Time
}

var tgidCache struct {
	sync.Mutex
	m map[int]tgidEntry
}

// tgidLookup asks the kernel (see tgid).
func tgidLookup(tid int) int {
	if fd, err := unix.PidfdOpen(tid, pidfdThread); err == nil {
		info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_PID}
		err := unix.IoctlPidfdInfo(fd, &info)
		unix.Close(fd)
		if err == nil && info.Mask&unix.PIDFD_INFO_PID != 0 && info.Tgid != 0 {
			return int(info.Tgid)
		}
	}
	return tgidProc(tid)
}

// pidfdThread is PIDFD_THREAD (include/uapi/linux/pidfd.h: O_EXCL), which
// x/sys does not name: a pidfd of the thread itself, not only of a
// thread-group leader.
const pidfdThread = unix.O_EXCL

// tgidProc is tgid read from /proc/TID/status.
func tgidProc(tid int) int {
	if n, _, err := procStatus(unix.AT_FDCWD, fmt.Sprintf("/proc/%d/status", tid)); err == nil {
		return n
	}
	return tid
}

// ref is one end of a copy line: [PEER:]PATH[@RANGE]; peer "" is this
// mount.
type ref struct {
	peer, path string
	r          transfer.Range
}

// String is the end as a line names it, for records and logs.
func (r ref) String() string {
	if r.peer == "" {
		return r.path + r.r.String()
	}
	return r.peer + ":" + r.path + r.r.String()
}

// refParser parses the ends of one call's lines: the lines of a KV-cache
// batch name one tensor with a thousand ranges, so the path before the
// range is parsed once per distinct path.
type refParser struct {
	f    *Tree
	seen map[string]ref
}

// parseRef parses one end of a copy line (see parseTarget and
// transfer.SplitRange). Errors: EINVAL.
func (rp *refParser) parseRef(v string) (ref, error) {
	rest, r, err := transfer.SplitRange(strings.TrimSpace(v))
	if err != nil {
		return ref{}, err
	}
	if x, ok := rp.seen[rest]; ok {
		x.r = r
		return x, nil
	}
	peer, p, err := rp.f.parseTarget(rest)
	if err != nil {
		return ref{}, err
	}
	if rp.seen == nil {
		rp.seen = map[string]ref{}
	}
	x := ref{peer: peer, path: p}
	rp.seen[rest] = x
	x.r = r
	return x, nil
}

// bareRange parses "@RANGE", a line's range of the node whose xattr is
// set. Errors: EINVAL for anything else.
func bareRange(v string) (transfer.Range, error) {
	rest, r, err := transfer.SplitRange(v)
	if err == nil && (rest != "" || !r.Set) {
		err = errf(syscall.EINVAL, "%q: want @OFFSET or @OFFSET+LENGTH", v)
	}
	return r, err
}

// copyLine is one line of a copy action: its source (node, when it is the
// node whose xattr is set) and destination.
type copyLine struct {
	src, dst ref
	node     Node
}

// actionLine is one line of an action's value: its first field, and its
// second ("" when it has one).
type actionLine struct{ a, b string }

// String is the line as its fields, for errors.
func (l actionLine) String() string { return strings.TrimSpace(l.a + " " + l.b) }

// actionLines splits an action's value into its lines' fields, skipping
// blank lines and # comments; each line has one or two fields. A thousand
// lines cost one allocation. skipped is how many lines of the action came
// before value (planRangeLines took them), for the line numbers of errors;
// a value with none is EINVAL only when skipped is 0. Errors: EINVAL.
func actionLines(value string, skipped int, want string) ([]actionLine, error) {
	out := make([]actionLine, 0, strings.Count(value, "\n")+1)
	for i, rest := skipped, value; rest != ""; i++ {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		// One or two fields: split at the first run of spaces (cheaper than
		// strings.Fields on a thousand lines).
		l := actionLine{a: line}
		if j := strings.IndexAny(line, " \t"); j >= 0 {
			l.a, l.b = line[:j], strings.TrimSpace(line[j:])
		}
		if strings.ContainsAny(l.b, " \t") {
			return nil, errf(syscall.EINVAL, "line %d: want %s, got %q", i+1, want, line)
		}
		out = append(out, l)
	}
	if len(out) == 0 && skipped == 0 {
		return nil, errf(syscall.EINVAL, "no copy in %q (want %s)", value, want)
	}
	return out, nil
}

// CopyTo pushes node src (a file, or a directory tree) to the lines of
// value, each "[@SRCRANGE ]DST" with DST "[PEER:]PATH[@RANGE]" (DESIGN.md
// "In-place copies"), or the binary range list that stands for them
// (xattrs.RangeListMagic): a destination with a range is written in place; a
// directory's only with "@0". Several lines are one call (see runLines).
// It ignores the request's cancellation (FUSE interrupts): a copy runs to
// completion or failure. value is borrowed (valueOf): CopyTo keeps none of
// it once it returns.
//
// viaMount lets the final renames go through the mount (so inotify watchers
// see arrivals); batch turns it off, since the kernel holds the root's lock.
// Errors: *transfer.Error with the errno of the failure (EINVAL for a copy
// onto itself or into its own subtree, or a bad range; ENOENT for an
// unknown peer or a missing in-place destination; EISDIR, ...; a domain
// error gets its errno), never ESTALE (see copyErr), or an error of no
// known errno.
func (f *Tree) CopyTo(ctx context.Context, src Node, v []byte, viaMount bool) (err error) {
	value := valueOf(v)
	defer func() {
		err = copyErr(logRefusal("copy_to", f.Path(src), value, err))
	}()
	p, rest, fast, err := f.planCall(ctx, src, value)
	defer func() { closeAll(p.opened) }()
	if err != nil {
		return err
	}
	if rest == "" && fast > 0 {
		return f.runPlan(ctx, p, f.Path(src))
	}
	fields, err := actionLines(rest, fast, "[@SRCRANGE ]DST")
	if err != nil {
		return err
	}
	lines := make([]copyLine, len(fields))
	rp := refParser{f: f}
	for i, fl := range fields {
		l := &lines[i]
		l.node = src
		dst := fl.a
		if fl.b != "" {
			if l.src.r, err = bareRange(fl.a); err != nil {
				return err
			}
			dst = fl.b
		}
		if l.dst, err = rp.parseRef(dst); err != nil {
			return err
		}
	}
	if len(lines) == 1 && fast == 0 {
		return f.copyNode(ctx, src, lines[0], viaMount, false)
	}
	return f.runLines(ctx, p, lines, viaMount, f.Path(src))
}

// planCall plans what a call's fast parsers take of value, a call on src
// (a copy_to; nil for a batch): the range lines at its start
// (planRangeLines), or a binary range list's records (planBinary). It
// returns the plan, which carries the caller, the rest of the value for
// the general parser, and how many lines the plan took. A copy_to of one
// line is all rest (copyNode's). The caller closes p's sources
// (closeAll(p.opened)), whatever the error.
func (f *Tree) planCall(ctx context.Context, src Node, value string) (p *linePlan, rest string, fast int, err error) {
	if isBinary(value) {
		recs, err := decodeBinary(value)
		if err != nil {
			return newLinePlan(1), "", 0, err
		}
		p = newLinePlan(binaryLines(recs))
		p.caller = callerOf(ctx)
		rest, err = f.planBinary(p, src, recs)
		return p, rest, descriptors(recs), err
	}
	p = newLinePlan(strings.Count(value, "\n") + 1)
	p.caller = callerOf(ctx)
	if src != nil && p.hint == 1 {
		return p, value, 0, nil
	}
	rest, fast, err = f.planRangeLines(p, src, value)
	return p, rest, fast, err
}

// copyNode pushes node src (or its range l.src.r) to l.dst, one line of a
// copy_to. check: only check it, moving nothing (transfer.Service.Check
// on a peer; here, the destination prepared and let go).
func (f *Tree) copyNode(ctx context.Context, src Node, l copyLine, viaMount, check bool) error {
	srcs, isDir, err := sources(src, l.src.r, callerOf(ctx))
	if err != nil {
		return err
	}
	defer closeAll(srcs)
	if err := applyRange(srcs, l.dst.r, isDir); err != nil {
		return err
	}
	label := f.Path(src) + l.src.r.String()
	peer, dst := l.dst.peer, l.dst.path
	if isDir && l.dst.r.Set && len(srcs) == 0 {
		return f.emptyTreeInPlace(ctx, src, l.dst)
	}
	if peer != "" {
		if f.peers == nil {
			return noPeers(peer)
		}
		if check {
			return f.peers.Check(ctx, peer, dst, srcs, isDir)
		}
		n, err := f.peers.Send(ctx, peer, dst, srcs, isDir, label)
		return logCopy(label, l.dst.String(), n, err, lineMode(l))
	}
	inPlace := l.dst.r.Set
	target, terr := f.Resolve(dst)
	// Inside this mount: refuse a whole copy onto itself or a directory
	// into its own subtree (the kernel holds src's lock for this call; a
	// rename over it would hang). In place, a file may write its own
	// bytes elsewhere in itself (nothing is renamed).
	if terr == nil && target == src && (!inPlace || isDir) {
		return errf(syscall.EINVAL, "copy of %s onto itself", dst)
	}
	if d, ok := src.(*Dir); ok && f.within(dst, d) && !inPlace {
		return errf(syscall.EINVAL, "copy of directory %s into its own subtree %s", label, dst)
	}
	if !isDir && terr == nil {
		if _, isD := target.(*Dir); isD {
			return errf(syscall.EISDIR, "%s is a directory (name the target file)", dst)
		}
	}
	prepare := func(isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
		return f.prepare(dst, isDir, metas, prepOpts{viaMount: viaMount, caller: callerOf(ctx)})
	}
	if check {
		return checkLocal(srcs, isDir, prepare)
	}
	n, err := f.localCopy(ctx, label, l.dst.String(), srcs, isDir, prepare, nil)
	return logCopy(label, l.dst.String(), n, err, lineMode(l))
}

// emptyTreeInPlace is the in-place copy ("@0") of a tree with no tensors
// into dst: nothing to write, but dst must be a directory there, as each
// tensor's destination must exist (ENOENT, ENOTDIR; on a peer, asked by a
// check of a get of dst). Sent as a transfer, an empty tree was a whole
// copy, and made the missing directory.
func (f *Tree) emptyTreeInPlace(ctx context.Context, src Node, dst ref) error {
	isDirAt := func(isDir bool) error {
		if !isDir {
			return errf(syscall.ENOTDIR, "%s is a file: the in-place copy of directory %s needs a directory", dst, f.Path(src))
		}
		return nil
	}
	if dst.peer == "" {
		n, err := f.Resolve(dst.path)
		if err != nil {
			return err
		}
		_, isDir := n.(*Dir)
		return isDirAt(isDir)
	}
	if f.peers == nil {
		return noPeers(dst.peer)
	}
	return f.peers.CheckPull(ctx, transfer.Pull{Peer: dst.peer, Path: dst.path, Dst: "/"}, func(isDir bool, _ []transfer.Meta) (transfer.Dest, error) {
		return nopDest{}, isDirAt(isDir)
	})
}

// nopDest is the Dest of a check that prepares nothing.
type nopDest struct{}

func (nopDest) WriteAt(int, []byte, int64) error { return nil }
func (nopDest) Commit() (int, error)             { return 0, nil }
func (nopDest) Abort()                           {}

// applyRange makes the sources' descriptors those of a copy whose
// destination has range r (transfer.Range.Apply).
func applyRange(srcs []transfer.Source, r transfer.Range, isDir bool) error {
	if !r.Set {
		return nil
	}
	metas, err := r.Apply(metasOf(srcs), isDir)
	if err != nil {
		return err
	}
	for i, s := range srcs {
		s.(*fileSource).meta = metas[i]
	}
	return nil
}

// CopyFrom pulls the lines of value, each "SRC[ @DSTRANGE]" with SRC
// "[PEER:]PATH[@RANGE]" (or a binary range list: xattrs.RangeListMagic), into node dst (a file, or a directory tree): a
// line with a destination range writes dst's bytes in place; without one
// the data of files is replaced by adoption (the kernel holds dst's lock
// for this call). The in-place lines run first. value is borrowed, as
// CopyTo's. Errors as for CopyTo; ENOENT when dst has no name any more.
func (f *Tree) CopyFrom(ctx context.Context, dst Node, v []byte) (err error) {
	value := valueOf(v)
	defer func() {
		err = copyErr(logRefusal("copy_from", f.Path(dst), value, err))
	}()
	var inPlace, whole []copyLine
	rp := refParser{f: f}
	add := func(text string, skipped int) error {
		fields, err := actionLines(text, skipped, "SRC[ @DSTRANGE]")
		if err != nil {
			return err
		}
		for _, fl := range fields {
			var l copyLine
			if l.src, err = rp.parseRef(fl.a); err != nil {
				return err
			}
			if fl.b != "" {
				if l.dst.r, err = bareRange(fl.b); err != nil {
					return err
				}
				inPlace = append(inPlace, l)
			} else {
				whole = append(whole, l)
			}
		}
		return nil
	}
	if isBinary(value) {
		// The records in order, as their lines would be read.
		recs, err := decodeBinary(value)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r.count() == 0 {
				err = add(r.line, 1)
			} else {
				var lines []copyLine
				lines, err = f.pullRecord(r)
				inPlace = append(inPlace, lines...)
			}
			if err != nil {
				return err
			}
		}
		if len(inPlace)+len(whole) == 0 {
			return errf(syscall.EINVAL, "no copy in the binary range list (want SRC[ @DSTRANGE])")
		}
	} else if err := add(value, 0); err != nil {
		return err
	}
	if len(whole) > 1 {
		// Each would replace dst whole: the last won (planLine refuses
		// the same of a batch or a copy_to).
		return errf(syscall.EINVAL, "%d whole-tensor lines into %s in one copy_from", len(whole), f.Path(dst))
	}
	// A whole line onto dst itself is refused before the in-place lines
	// run (it was, after they had landed).
	for _, l := range whole {
		if l.src.peer == "" {
			if n, err := f.Resolve(l.src.path); err == nil {
				if err := f.refuseSelf(l, n, dst, f.Path(dst)); err != nil {
					return err
				}
			}
		}
	}
	// Every peer the lines name is known before any line runs, as in
	// runPlan.
	for _, l := range slices.Concat(inPlace, whole) {
		if l.src.peer != "" {
			if err := f.knownPeer(l.src.peer); err != nil {
				return err
			}
		}
	}
	// The in-place lines that pull ranges of known length from a peer's
	// tensors go as one range-list get (one transfer) per peer, in the
	// order of their first line; the rest one by one.
	type pullRun struct {
		peer string
		pp   *peerPull
		line *copyLine // a line of its own, pulled as it is
	}
	var runs []*pullRun
	byPeer := map[string]*pullRun{}
	_, toFile := dst.(*File)
	for i := range inPlace {
		l := &inPlace[i]
		sp, ok := pullSpanOf(l)
		if !ok || !toFile {
			runs = append(runs, &pullRun{line: l})
			continue
		}
		run := byPeer[l.src.peer]
		if run == nil {
			run = &pullRun{peer: l.src.peer, pp: newPeerPull()}
			byPeer[l.src.peer] = run
			runs = append(runs, run)
		}
		// The lists' destination is dst, named when the get runs.
		run.pp.add(pullKey{l.src.peer, l.src.path, ""}, sp)
	}
	pull := func(run *pullRun, check bool) error {
		if run.line != nil {
			return f.pullInto(ctx, dst, *run.line, check)
		} else if one, ok := run.pp.single(run.peer); ok {
			return f.pullInto(ctx, dst, one, check)
		}
		at := f.Path(dst)
		if at == "" {
			return errf(syscall.ENOENT, "copy_from into an unlinked file")
		}
		for i := range run.pp.lists {
			run.pp.lists[i].Dst = at
		}
		return f.pullLists(ctx, run.peer, run.pp.lists, prepOpts{adopt: dst, caller: callerOf(ctx)}, check)
	}
	if len(runs) > 1 {
		// Several transfers: each is checked before any runs, so that a
		// refused line writes nothing (runPlan's checks).
		checks := make([]func() error, len(runs))
		for i, run := range runs {
			checks[i] = func() error { return pull(run, true) }
		}
		if err := checkAll(checks); err != nil {
			return err
		}
	}
	for _, run := range runs {
		if err := pull(run, false); err != nil {
			return err
		}
	}
	for _, l := range whole {
		if err := f.pullInto(ctx, dst, l, false); err != nil {
			return err
		}
	}
	return nil
}

// pullInto runs one line of a copy_from into dst. check: only check it,
// moving nothing (transfer.Service.CheckPull from a peer; here, the
// destination prepared and let go).
func (f *Tree) pullInto(ctx context.Context, dst Node, l copyLine, check bool) error {
	dstPath := f.Path(dst)
	if dstPath == "" {
		return errf(syscall.ENOENT, "copy_from into an unlinked file")
	}
	_, dstIsDir := dst.(*Dir)
	dstLabel := dstPath + l.dst.r.String()
	prepare := func(isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
		if isDir != dstIsDir {
			if dstIsDir {
				return nil, errf(syscall.EISDIR, "%s is a directory; the source %s is a file", dstPath, l.src)
			}
			return nil, errf(syscall.ENOTDIR, "%s is a file; the source %s is a directory", dstPath, l.src)
		}
		return f.prepare(dstPath, isDir, metas, prepOpts{adopt: dst, caller: callerOf(ctx)})
	}
	if peer := l.src.peer; peer != "" {
		if f.peers == nil {
			return noPeers(peer)
		}
		pull := transfer.Pull{Peer: peer, Path: l.src.path, Range: l.src.r, Dst: dstPath, DstRange: l.dst.r}
		if check {
			return f.peers.CheckPull(ctx, pull, prepare)
		}
		n, err := f.peers.Receive(ctx, pull, prepare)
		return logCopy(l.src.String(), dstLabel, n, err, lineMode(l))
	}
	if err := f.mayReach(callerOf(ctx), l.src.path); err != nil {
		return err
	}
	srcNode, err := f.Resolve(l.src.path)
	if err != nil {
		return err
	}
	if err := f.refuseSelf(l, srcNode, dst, dstPath); err != nil {
		return err
	}
	srcs, isDir, err := sources(srcNode, l.src.r, callerOf(ctx))
	if err != nil {
		return err
	}
	defer closeAll(srcs)
	if err := applyRange(srcs, l.dst.r, isDir); err != nil {
		return err
	}
	if check {
		return checkLocal(srcs, isDir, prepare)
	}
	n, err := f.localCopy(ctx, l.src.String(), dstLabel, srcs, isDir, prepare, nil)
	return logCopy(l.src.String(), dstLabel, n, err, lineMode(l))
}

// refuseSelf refuses line l of a copy_from into dst (at dstPath), whose
// source in this mount is srcNode, when it would copy a node onto itself
// or a tree into its own subtree, or into a directory that contains it:
// the kernel holds dst's lock for the call, and a whole copy of dst onto
// itself is no copy. In place, a file may write its own bytes elsewhere in
// itself. Errors: EINVAL.
func (f *Tree) refuseSelf(l copyLine, srcNode, dst Node, dstPath string) error {
	inPlace := l.dst.r.Set
	_, dstIsDir := dst.(*Dir)
	if srcNode == dst && (!inPlace || dstIsDir) {
		return errf(syscall.EINVAL, "copy of %s onto itself", l.src.path)
	}
	if d, ok := srcNode.(*Dir); ok && f.within(dstPath, d) && !inPlace {
		return errf(syscall.EINVAL, "copy of directory %s into its own subtree %s", l.src.path, dstPath)
	}
	if d, ok := dst.(*Dir); ok && f.within(l.src.path, d) && !inPlace {
		return errf(syscall.EINVAL, "copy of %s into a directory that contains it", l.src.path)
	}
	return nil
}

// metasOf is the descriptors of srcs.
func metasOf(srcs []transfer.Source) []transfer.Meta {
	metas := make([]transfer.Meta, len(srcs))
	for i, s := range srcs {
		metas[i] = s.Meta()
	}
	return metas
}

// checkLocal checks a copy of srcs inside this mount, moving nothing: its
// destination prepared (every range checked) and let go.
func checkLocal(srcs []transfer.Source, isDir bool, prepare func(bool, []transfer.Meta) (transfer.Dest, error)) error {
	d, err := prepare(isDir, metasOf(srcs))
	if err == nil {
		d.Abort()
	}
	return err
}

// localCopy copies descriptors of this daemon device to device into dst:
// all of them as one batch (tensor.CopyExtents: on CUDA one gather/scatter
// kernel launch for the small ones). between, if not nil, runs after the
// destination is prepared and before a byte moves; its error aborts the
// copy.
func (f *Tree) localCopy(ctx context.Context, label, dst string, srcs []transfer.Source, isDir bool, prepare func(bool, []transfer.Meta) (transfer.Dest, error), between func() error) (int, error) {
	metas := metasOf(srcs)
	var rec *transfer.Record
	end := func(error) {}
	if f.peers != nil {
		rec, end = f.peers.TrackCtx(ctx, label, dst, "local", metas)
	}
	// Local records have no phases: the engine gets no record.
	n, err := transfer.Deliver(nil, metas, func(metas []transfer.Meta) (transfer.Dest, error) {
		return prepare(isDir, metas)
	}, func(d transfer.Dest, _ func()) error {
		if between != nil {
			if err := between(); err != nil {
				return err
			}
		}
		dd := d.(*dest)
		exts := make([]tensor.Extent, 0, len(srcs))
		var total int64
		for i, s := range srcs {
			fs := s.(*fileSource)
			t, at := dd.at(i)
			total += metas[i].NBytes
			if metas[i].Spans == nil {
				exts = append(exts, tensor.Extent{Dst: t, DstOff: at, Src: fs.t, SrcOff: fs.off, N: metas[i].NBytes})
				continue
			}
			for _, sp := range metas[i].Spans {
				exts = append(exts, tensor.Extent{Dst: t, DstOff: sp.Dst, Src: fs.t, SrcOff: sp.Src, N: sp.N})
			}
		}
		if err := tensor.CopyExtents(exts); err != nil {
			return copyErr(err)
		}
		if rec != nil {
			rec.BytesDone.Add(total)
		}
		return nil
	}, nil)
	end(err)
	return n, err
}

// Batch runs the copies of a batch xattr: one "SRC DST" per line, each
// side "[PEER:]PATH[@RANGE]", or a binary range list (xattrs.RangeListMagic), as one
// call (runLines). value is borrowed, as CopyTo's. Errors as CopyTo's.
func (f *Tree) Batch(ctx context.Context, v []byte) (err error) {
	value := valueOf(v)
	defer func() {
		err = copyErr(logRefusal("batch", "/", value, err))
	}()
	p, rest, fast, err := f.planCall(ctx, nil, value)
	defer func() { closeAll(p.opened) }()
	if err != nil {
		return err
	}
	fields, err := actionLines(rest, fast, "SRC DST")
	if err != nil {
		return err
	}
	lines := make([]copyLine, len(fields))
	rp := refParser{f: f}
	for i, fl := range fields {
		if fl.b == "" {
			return errf(syscall.EINVAL, "batch line %d: want SRC DST, got %q", fast+i+1, fl)
		}
		if lines[i].src, err = rp.parseRef(fl.a); err != nil {
			return err
		}
		if lines[i].dst, err = rp.parseRef(fl.b); err != nil {
			return err
		}
	}
	// The kernel holds the root's lock: nothing is renamed through the
	// mount.
	return f.runLines(ctx, p, lines, false, "batch")
}

// logCopy logs a copy's failure, with its errno and mode ("whole",
// "in_place" or "mixed", as its record says: transfer.ModeOf), and marks
// the error as logged (logRefusal then says nothing more). A success is
// logged by the transfer's record as it ends (transfer.Service.TrackCtx:
// path, mode, bytes, seconds), so it is not logged again here.
func logCopy(src, dst string, n int, err error, mode string) error {
	if err == nil {
		return nil
	}
	slog.Warn("copy failed", "src", src, "dst", dst, "mode", mode, "copied", n, "errno", errnoName(err), "err", err)
	return loggedError{err}
}

// lineMode is the mode of a copy of one line: in place when its
// destination has a range.
func lineMode(l copyLine) string {
	if l.dst.r.Set {
		return transfer.ModeNames[transfer.ModeInPlace]
	}
	return transfer.ModeNames[transfer.ModeWhole]
}

// errnoName is the errno a failure surfaces as, by its C name (ENOENT),
// for a log line's errno attribute.
func errnoName(err error) string {
	return unix.ErrnoName(Errno(copyErr(err)))
}

// loggedError is a copy's error that logCopy has logged (refused checks
// before any transfer are logged by logRefusal instead).
type loggedError struct{ error }

// Unwrap gives the error's errno and message to errors.As (copyErr).
func (e loggedError) Unwrap() error { return e.error }

// logRefusal logs a copy action's error that no transfer logged (a bad
// line, a range that does not fit, a copy onto itself: refused before
// anything moved), with the action's value, so that every refusal has its
// reason in the log; it returns err marked as logged (Tree.Refuse records
// it without logging it again).
func logRefusal(action, on, value string, err error) error {
	var le loggedError
	if err == nil || errors.As(err, &le) {
		return err
	}
	if value = describeValue(value); len(value) > 200 {
		value = value[:200] + "..."
	}
	slog.Warn("refused", "attr", "user.tensorfs."+action, "on", on, "value", value, "errno", errnoName(err), "err", err)
	return loggedError{err}
}
