package main

// The bench's run: its directories, the tensors of each phase (one size and
// mode at a time, so the memory it holds is that of the largest phase, which
// is what the free-space check before it counts), the timed calls, the
// checks and the cleanup.

import (
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// bench is one run of tensorfs bench.
type bench struct {
	opt    benchOptions
	mnt    string // the local mountpoint
	node   string // its node name, "" when its source does not say
	stderr io.Writer
	sigs   <-chan os.Signal
	pid    int // this process, as the daemon's records name it
	tid    int // the thread that makes every call, as its refusals name it

	// name is the temporary directory's name, the same in both mounts;
	// local is its path here, rel its path in either mount ("/" + name).
	name, local, rel string
	// peerMade: the peer's directory exists (it was copied there);
	// peerMnt is the peer's mount on this host, "" for none (another
	// host: --leave-peer-dir).
	peerMade bool
	peerMnt  string
	// remoteLeft are the peer's tensors bench made and has not removed or
	// emptied yet.
	remoteLeft []string

	seed uint64 // the next check's pattern
	bar  *progressbar.ProgressBar
}

// benchPhase is the tensors of one size in one mode, alive while its
// points run.
type benchPhase struct {
	mode string
	size int64 // bytes per descriptor
	n    int   // descriptors per call
}

func (p benchPhase) total() int64 { return p.size * int64(p.n) }

// run checks what it can before creating anything, makes the directories,
// runs every phase and returns the report. The caller cleans up, whatever
// run returns.
func (b *bench) run() (*benchReport, error) {
	if err := b.preflight(); err != nil {
		return nil, err
	}
	rep := &benchReport{Mount: b.mnt, Node: b.node, Peer: b.opt.peer, Batch: b.opt.batch, Iters: b.opt.iters, Results: []benchResult{}}
	if b.opt.iters == 0 {
		rep.TimeS = b.opt.dur.Seconds()
	}
	if err := b.makeDirs(); err != nil {
		return nil, err
	}
	points := len(b.opt.sizes) * len(b.opt.modes) * len(b.opt.dirs)
	if isTerminal(b.stderr) {
		b.bar = progressbar.NewOptions(points,
			progressbar.OptionSetWriter(b.stderr),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(cpPoll),
			progressbar.OptionClearOnFinish(),
		)
		defer func() {
			b.bar.Exit()
			b.bar.Clear()
		}()
	}
	for _, mode := range b.opt.modes {
		for _, size := range b.opt.sizes {
			ph := benchPhase{mode: mode, size: size, n: b.opt.batch}
			res, err := b.runPhase(ph)
			rep.Results = append(rep.Results, res...)
			if err != nil {
				return nil, err
			}
		}
	}
	return rep, nil
}

// fail is bench's one-line error: "bench MOUNT: what".
func (b *bench) fail(format string, a ...any) error {
	return fmt.Errorf("bench %s: %s", b.mnt, fmt.Sprintf(format, a...))
}

// stopped returns the interruption when a signal has come.
func (b *bench) stopped() error {
	select {
	case sig := <-b.sigs:
		s, _ := sig.(syscall.Signal)
		return &benchInterrupted{mnt: b.mnt, sig: s}
	default:
		return nil
	}
}

// makeDirs makes the temporary directory at the mount's root (without the
// root's dtype and shape template, so bench's tensors take the sizes it
// gives them; the device stays: the mount's choice) and, with a peer, the
// same-named one at the peer's root, by copying the new, empty directory
// there: a peer's files can only be made by copies. It then finds the
// peer's mount on this host (where the new directory appeared), and checks
// its space if preflight could not tell it from other mounts of the name.
func (b *bench) makeDirs() error {
	dir, err := os.MkdirTemp(b.mnt, benchDirPrefix)
	if err != nil {
		return b.fail("creating its directory: %s", errText(unwrapPath(err)))
	}
	b.local, b.name = dir, filepath.Base(dir)
	b.rel = "/" + b.name
	for _, a := range []string{xattrs.DType, xattrs.Shape} {
		if err := unix.Removexattr(dir, a); err != nil && !errors.Is(err, unix.ENODATA) {
			return b.fail("removing the template's %s from %s: %s", a, dir, errText(err))
		}
	}
	if b.opt.peer == "" {
		return nil
	}
	if err := b.call(benchCall{target: dir, attr: xattrs.CopyTo, values: []string{b.remote("")}}, "creating its directory on "+b.opt.peer); err != nil {
		return err
	}
	b.peerMade = true
	cands := b.peerCandidates()
	for _, m := range cands {
		if fi, err := os.Stat(filepath.Join(m, b.name)); err == nil && fi.IsDir() {
			b.peerMnt = m
			break
		}
	}
	if b.peerMnt == "" {
		if !b.opt.leavePeerDir {
			return b.fail("the tensorfs:%s mount on this host is not the peer %s that %s reaches (%s did not appear in it): pass --leave-peer-dir to run anyway",
				b.opt.peer, b.opt.peer, b.mnt, b.name)
		}
		return nil
	}
	if len(cands) == 1 {
		return nil // preflight checked it
	}
	remote, err := b.space(b.peerMnt)
	if err != nil {
		return err
	}
	local, err := b.space(b.mnt)
	if err != nil {
		return err
	}
	avail, _ := memAvailable()
	return b.checkSpace(local, &remote, avail)
}

// remote is the reference to name in the peer's directory as the daemons
// read it: "PEER:/tensorfs-bench-X/name", or "/tensorfs-bench-X/name"
// inside this mount (name "" is the directory itself).
func (b *bench) remote(name string) string {
	p := b.rel
	if name != "" {
		p += "/" + name
	}
	if b.opt.peer == "" {
		return p
	}
	return b.opt.peer + ":" + p
}

// path is name's path in the local directory.
func (b *bench) path(name string) string { return filepath.Join(b.local, name) }

// benchCall is one call: an attribute set on target, as one or more
// setxattrs (a value over the kernel's limit is split, in order).
type benchCall struct {
	target string // a file in the local directory, or the mount's root
	attr   string
	values []string
}

// do makes the call.
func (c benchCall) do() error {
	for _, v := range c.values {
		if err := unix.Setxattr(c.target, c.attr, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// call makes c, and on failure returns the errno with the daemon's reason
// (its refusal of this thread's set, or the error of this process's last
// transfer), saying what it was doing.
func (b *bench) call(c benchCall, doing string) error {
	err := c.do()
	if err == nil {
		return nil
	}
	return b.callError(c, doing, err)
}

func (b *bench) callError(c benchCall, doing string, err error) error {
	rel := "/" + strings.TrimPrefix(strings.TrimPrefix(c.target, b.mnt), "/")
	detail := refusalReason(b.mnt, b.tid, rel, c.attr)
	if detail == "" {
		if rec := b.lastRecord(); rec != nil {
			detail = rec.Error
		}
	}
	short := strings.TrimPrefix(c.attr, xattrs.Prefix)
	s := fmt.Sprintf("%s: %s on %s: %s", doing, short, rel, errText(err))
	if detail != "" {
		s += " (" + oneLine(detail) + ")"
	}
	return b.fail("%s", s)
}

// lastRecord is the newest transfer record of this process in the local
// daemon's stats, nil when there is none.
func (b *bench) lastRecord() *xattrs.Record {
	st, err := readStats(b.mnt)
	if err != nil {
		return nil
	}
	var last *xattrs.Record
	for i := range st.Transfers.Recent {
		r := &st.Transfers.Recent[i]
		if r.PID == b.pid && (last == nil || r.ID > last.ID) {
			last = r
		}
	}
	return last
}

// makeTensor creates name in the local directory with size bytes (U8),
// allocated and registered; size 0 leaves it empty (a copy_from target, or
// the empty tensor that frees a peer's).
func (b *bench) makeTensor(name string, size int64) error {
	f, err := os.OpenFile(b.path(name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil && size > 0 {
		err = f.Truncate(size)
	}
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return b.fail("creating %s (%s): %s", b.path(name), humanize.IBytes(uint64(size)), errText(unwrapPath(err)))
	}
	return nil
}

// runPhase makes ph's tensors, runs its points (one per direction) and
// removes the tensors, whatever happened.
func (b *bench) runPhase(ph benchPhase) (res []benchResult, err error) {
	var made []string
	defer func() {
		if cerr := b.dropPhase(made); err == nil {
			err = cerr
		}
	}()
	mk := func(name string, size int64) error {
		made = append(made, name)
		return b.makeTensor(name, size)
	}
	s, n := ph.size, ph.n
	label := fmt.Sprintf("%s %s", ph.mode, humanize.IBytes(uint64(s)))
	peerCheck := b.opt.peer != "" && b.opt.check > 0
	if peerCheck {
		if err := mk("v", scratchSize(s)); err != nil {
			return nil, err
		}
	}
	if ph.mode == modeInPlace {
		// a here, b there: b is made by a whole copy of a, the only way to
		// make a peer's tensor; then the in-place copies go into it.
		if err := mk("a", ph.total()); err != nil {
			return nil, err
		}
		b.remoteLeft = append(b.remoteLeft, "b")
		if err := b.call(benchCall{target: b.path("a"), attr: xattrs.CopyTo, values: []string{b.remote("b")}}, label+": creating the destination"); err != nil {
			return nil, err
		}
	} else {
		if err := mk("w", s); err != nil {
			return nil, err
		}
		for i := range n {
			b.remoteLeft = append(b.remoteLeft, fmt.Sprintf("w.%d", i))
			if slices.Contains(b.opt.dirs, dirPull) {
				if err := mk(fmt.Sprintf("p.%d", i), 0); err != nil {
					return nil, err
				}
			}
		}
		// The pull's sources, and the push's first destinations.
		if err := b.call(b.wholePush(ph), label+": creating the copies"); err != nil {
			return nil, err
		}
	}
	for _, dir := range b.opt.dirs {
		r, err := b.runPoint(ph, dir)
		if err != nil {
			return res, err
		}
		res = append(res, r)
		if b.bar != nil {
			b.bar.Add(1)
		}
	}
	return res, nil
}

// dropPhase removes a phase's local tensors and its peer's (through the
// peer's mount; on another host by emptying them, which frees their
// memory: their names stay until the directory is removed there).
func (b *bench) dropPhase(made []string) error {
	var errs []string
	for _, name := range made {
		if err := os.Remove(b.path(name)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			errs = append(errs, errText(err))
		}
	}
	if err := b.dropRemote(); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return b.fail("removing its tensors: %s", strings.Join(errs, "; "))
	}
	return nil
}

// dropRemote removes (or empties) the peer's tensors of b.remoteLeft.
func (b *bench) dropRemote() error {
	left := b.remoteLeft
	b.remoteLeft = nil
	if len(left) == 0 {
		return nil
	}
	switch {
	case b.opt.peer == "":
		for _, name := range left {
			if err := os.Remove(b.path(name)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
				return err
			}
		}
	case b.peerMnt != "":
		for _, name := range left {
			if err := os.Remove(filepath.Join(b.peerMnt, b.name, name)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
				return err
			}
		}
	default:
		// Another host: copy an empty tensor over each one that exists
		// (the copy of a missing one just makes an empty one).
		os.Remove(b.path("empty"))
		if err := b.makeTensor("empty", 0); err != nil {
			return err
		}
		defer os.Remove(b.path("empty"))
		var lines []string
		for _, name := range left {
			lines = append(lines, b.remote(name))
		}
		for _, v := range splitValue(lines) {
			if err := unix.Setxattr(b.path("empty"), xattrs.CopyTo, []byte(v), 0); err != nil {
				return fmt.Errorf("emptying %s's tensors: %s", b.opt.peer, errText(err))
			}
		}
	}
	return nil
}

// cleanup removes both directories (the peer's through its mount here; on
// another host only its tensors' memory could be freed, and the directory
// is named on stderr). It runs after every run, finished or not.
func (b *bench) cleanup() error {
	var errs []string
	if b.peerMade {
		if err := b.dropRemote(); err != nil {
			errs = append(errs, err.Error())
		}
		if b.peerMnt != "" {
			if err := os.RemoveAll(filepath.Join(b.peerMnt, b.name)); err != nil {
				errs = append(errs, errText(unwrapPath(err)))
			}
		} else {
			fmt.Fprintf(b.stderr, "tensorfs: bench %s: left %s:%s on %s, an empty directory (tensorfs cannot remove a peer's files): remove it on that host\n",
				b.mnt, b.opt.peer, b.rel, b.opt.peer)
		}
	}
	if b.local != "" {
		if err := os.RemoveAll(b.local); err != nil {
			errs = append(errs, errText(unwrapPath(err)))
		}
	}
	if len(errs) > 0 {
		return b.fail("removing its directories: %s", strings.Join(errs, "; "))
	}
	return nil
}

// splitValue joins lines into xattr values of at most xattrValueMax bytes,
// in order, each line whole: one descriptor list split the way
// python/tensorfs.py splits a batch (so its last line comes last).
func splitValue(lines []string) []string {
	var vals []string
	var cur strings.Builder
	for _, l := range lines {
		if cur.Len() > 0 && cur.Len()+1+len(l) > xattrValueMax {
			vals = append(vals, cur.String())
			cur.Reset()
		}
		if cur.Len() > 0 {
			cur.WriteByte('\n')
		}
		cur.WriteString(l)
	}
	if cur.Len() > 0 {
		vals = append(vals, cur.String())
	}
	return vals
}

// The calls of each point (DESIGN.md "In-place copies" for the lines).

// inPlacePush: copy_to on a, line i "@i*S+S PEER:/X/b@i*S".
func (b *bench) inPlacePush(ph benchPhase) benchCall {
	lines := make([]string, ph.n)
	for i := range lines {
		off := int64(i) * ph.size
		lines[i] = fmt.Sprintf("@%d+%d %s@%d", off, ph.size, b.remote("b"), off)
	}
	return benchCall{target: b.path("a"), attr: xattrs.CopyTo, values: splitValue(lines)}
}

// inPlacePull: copy_from on a, line i "PEER:/X/b@i*S+S @i*S".
func (b *bench) inPlacePull(ph benchPhase) benchCall {
	lines := make([]string, ph.n)
	for i := range lines {
		off := int64(i) * ph.size
		lines[i] = fmt.Sprintf("%s@%d+%d @%d", b.remote("b"), off, ph.size, off)
	}
	return benchCall{target: b.path("a"), attr: xattrs.CopyFrom, values: splitValue(lines)}
}

// wholePush: copy_to on w, line i "PEER:/X/w.i".
func (b *bench) wholePush(ph benchPhase) benchCall {
	lines := make([]string, ph.n)
	for i := range lines {
		lines[i] = b.remote(fmt.Sprintf("w.%d", i))
	}
	return benchCall{target: b.path("w"), attr: xattrs.CopyTo, values: splitValue(lines)}
}

// wholePull: copy_from on p.0 from "PEER:/X/w.0"; for several
// descriptors a batch on the root, line i "PEER:/X/w.i /X/p.i" (copy_from
// on one file takes one whole tensor).
func (b *bench) wholePull(ph benchPhase) benchCall {
	if ph.n == 1 {
		return benchCall{target: b.path("p.0"), attr: xattrs.CopyFrom, values: []string{b.remote("w.0")}}
	}
	lines := make([]string, ph.n)
	for i := range lines {
		lines[i] = fmt.Sprintf("%s %s/p.%d", b.remote(fmt.Sprintf("w.%d", i)), b.rel, i)
	}
	return benchCall{target: b.mnt, attr: xattrs.Batch, values: splitValue(lines)}
}

// runPoint runs one point: a warm-up call, the timed calls, then the
// checked ones.
func (b *bench) runPoint(ph benchPhase, dir string) (benchResult, error) {
	var c benchCall
	switch {
	case ph.mode == modeInPlace && dir == dirPush:
		c = b.inPlacePush(ph)
	case ph.mode == modeInPlace:
		c = b.inPlacePull(ph)
	case dir == dirPush:
		c = b.wholePush(ph)
	default:
		c = b.wholePull(ph)
	}
	label := fmt.Sprintf("%s %s %s", ph.mode, dir, humanize.IBytes(uint64(ph.size)))
	if b.bar != nil {
		b.bar.Describe(label)
	}
	if err := b.stopped(); err != nil {
		return benchResult{}, err
	}
	if err := b.call(c, label); err != nil {
		return benchResult{}, err
	}
	var lat []time.Duration
	start := time.Now()
	for len(lat) == 0 || b.opt.iters > 0 && len(lat) < b.opt.iters || b.opt.iters == 0 && time.Since(start) < b.opt.dur {
		if err := b.stopped(); err != nil {
			return benchResult{}, err
		}
		t0 := time.Now()
		err := c.do()
		d := time.Since(t0)
		if err != nil {
			return benchResult{}, b.callError(c, label, err)
		}
		lat = append(lat, d)
	}
	res := summarize(ph, dir, lat, len(c.values))
	if rec := b.lastRecord(); rec != nil {
		res.Path = rec.Path
	}
	for range b.opt.check {
		if err := b.stopped(); err != nil {
			return res, err
		}
		if err := b.checkedCall(ph, dir, c, label); err != nil {
			return res, err
		}
		res.Checked++
	}
	return res, nil
}
