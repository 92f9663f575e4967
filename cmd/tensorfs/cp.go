package main

// cp is a client of the copy_to / copy_from xattrs, like setfattr: it names
// the copy with one setxattr on the mount (which returns when the copy is
// done) and, meanwhile, reads progress from the root's stats document, the
// only channel through which a daemon reports bytes and error text (an xattr
// write returns nothing but an errno).

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dustin/go-humanize"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/transfer"
	"github.com/tensorfs/tensorfs/xattrs"
)

const (
	// cpFSType is the filesystem type /proc/self/mounts shows for tensorfs.
	cpFSType = "fuse.tensorfs"
	// cpPoll is how often progress is read from stats while a copy runs.
	cpPoll = 100 * time.Millisecond
)

func newCpCmd() *cobra.Command {
	var quiet, progress bool
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a tensor or a directory tree between tensorfs nodes, with a progress bar",
		Long: `Copy a tensor (or a directory tree of tensors) to or from a peer, or inside
one mount. SRC and DST are each a path in a mounted tensorfs (an ordinary path,
like /mnt/tfs/kv/layer0) or a peer path NAME:/path (relative to that peer's
mount). Exactly one side must be a local path in a tensorfs mount, or both in
the same mount (a local copy). A path whose first ':' comes before any '/' is
a peer path; write ./a:b for a local file named a:b.

  tensorfs cp /mnt/tfs/kv/layer0 nodeB:/kv/layer0   push: copy_to on SRC
  tensorfs cp nodeB:/kv/layer0 /mnt/tfs/kv/layer0   pull: copy_from on DST
  tensorfs cp /mnt/tfs/kv /mnt/tfs/kv-old           local: copy_to on SRC
  tensorfs cp /mnt/tfs/blk@0+8192 b:/kv/cache@65536  in place: 8 KiB into b's cache

A range suffix @OFFSET or @OFFSET+LENGTH (bytes, decimal or 0x hex) names
bytes inside a tensor; on DST it writes them in place into the existing
tensor (same memory and ids: a process that mapped it sees the new bytes),
as the xattrs' ranges do; a DST range without a length takes SRC's. A name
that ends in @DIGITS is written with a trailing @ (x@12@).

The destination names the target exactly, as for the xattrs: a file onto an
existing directory is an error, not a copy into it. A pull into a missing DST
creates it as an empty file first (its directory must exist) and removes it
again if the copy fails; so a directory pull needs DST to be an existing
directory. The copy itself runs in the daemons: interrupting cp does not stop
it (the destination ends up as the old tensor or the new one; a DST that cp
created stays, empty if the copy then fails).

While the copy runs, cp reads user.tensorfs.stats on the mount's root every
100 ms and draws a progress bar on stderr when stderr is a terminal (always
with --progress), then prints one summary line: tensors, bytes, seconds and
throughput. It follows its own transfer record: one with an id newer than
those in stats before the copy and cp's own pid (the daemon records which
process asked), so concurrent copies of the same SRC and DST do not mix. --quiet prints nothing on success. A failure exits non-zero with
one line: the errno's text and, in parentheses, the daemon's error text from
stats when it has one.`,
		Args: positional(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCp(args[0], args[1], cpOptions{quiet: quiet, progress: progress}, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print nothing on success")
	cmd.Flags().BoolVar(&progress, "progress", false, "draw the progress bar even when stderr is not a terminal")
	return cmd
}

type cpOptions struct {
	quiet    bool
	progress bool
}

// cpEnd is SRC or DST, parsed.
type cpEnd struct {
	arg  string
	peer string // the peer's name, for a peer path
	rel  string // path relative to the mount (the peer's, or the local one), cleaned
	// For a local path:
	local  string // the path with symlinks resolved
	mnt    string // its tensorfs mountpoint
	exists bool
	// r is the side's range ("@OFF[+LEN]"): on DST, an in-place copy.
	r transfer.Range
}

// cpError is cp's one-line failure: "cp SRC DST: <errno text> (<detail>)".
type cpError struct {
	src, dst string
	err      error // an errno where there is one
	detail   string
}

func (e *cpError) Error() string {
	s := fmt.Sprintf("cp %s %s: %s", e.src, e.dst, errText(e.err))
	if e.detail != "" {
		s += " (" + oneLine(e.detail) + ")"
	}
	return s
}

func (e *cpError) Unwrap() error { return e.err }

// errText is an error's text, an errno's as strerror spells it ("No such
// file or directory": Go's table has it in lower case), which is what users
// see from setfattr and cp for the same failure.
func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		s := errno.Error()
		r, n := utf8.DecodeRuneInString(s)
		return string(unicode.ToUpper(r)) + s[n:]
	}
	return err.Error()
}

// oneLine keeps a daemon's error text on the one line cp promises.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// runCp copies src to dst (see newCpCmd), writing progress and the summary
// to w.
func runCp(src, dst string, opt cpOptions, w io.Writer) error {
	fail := func(err error, detail string, a ...any) error {
		return &cpError{src: src, dst: dst, err: err, detail: fmt.Sprintf(detail, a...)}
	}
	parse := func(name, arg string) (*cpEnd, error) {
		e, err := parseCpEnd(arg)
		if err != nil {
			detail := name
			if d := cpDetail(err); d != "" {
				detail += ": " + d
			}
			return nil, fail(err, "%s", detail)
		}
		return e, nil
	}
	srcPath, sr, err := transfer.SplitRange(src)
	if err != nil {
		return fail(err, "SRC: %s", cpDetail(err))
	}
	dstPath, dr, err := transfer.SplitRange(dst)
	if err != nil {
		return fail(err, "DST: %s", cpDetail(err))
	}
	s, err := parse("SRC", srcPath)
	if err != nil {
		return err
	}
	d, err := parse("DST", dstPath)
	if err != nil {
		return err
	}
	s.r, d.r = sr, dr
	for _, e := range []struct {
		name string
		end  *cpEnd
	}{{"SRC", s}, {"DST", d}} {
		if e.end.peer == "" && e.end.mnt == "" {
			return fail(syscall.EINVAL, "%s %s is not in a mounted tensorfs; a local side must be a path in one", e.name, e.end.arg)
		}
	}

	job, err := planCp(src, dst, s, d, fail)
	if err != nil {
		return err
	}
	rec, elapsed, tid, err := watchCp(src, dst, job, opt, w)
	if err != nil {
		detail := ""
		if rec != nil {
			detail = rec.Error
		}
		if detail == "" {
			// Refused before any transfer began: the daemon kept why, by
			// the calling thread.
			detail = refusalReason(job.mnt, tid, job.targetRel, job.attr)
		}
		if job.createdDst {
			os.Remove(d.local)
			if errors.Is(err, syscall.ENOTDIR) {
				// The daemon's reason names the empty file cp made for
				// copy_from ("DST is a file"), which is gone again.
				detail = fmt.Sprintf("SRC %s is a directory and DST %s did not exist: for a directory pull, DST must be an existing directory (mkdir it first)", src, dst)
			}
		}
		return fail(err, "%s", detail)
	}
	if !opt.quiet {
		fmt.Fprintln(w, cpSummary(src, dst, rec, s, d, elapsed))
	}
	return nil
}

// cpJob is the one setxattr that does the copy, and how its transfer shows
// in stats: the daemon records a push as (SRC's mount path, peer:path) and
// a pull as (peer:path, DST's mount path); a peer named by this node's own
// name is this mount, recorded without the "NAME:".
type cpJob struct {
	mnt, target, attr, value string
	targetRel                string // target's path in its mount, as stats names it
	srcs, dsts               []string
	// createdDst: cp made DST (an empty file for copy_from to be set on)
	// and removes it if the copy fails.
	createdDst bool
}

// planCp decides the setxattr that copies s to d: copy_to on SRC for a push
// (or a copy inside one mount), copy_from on DST for a pull, creating DST
// when it is missing. Errors: fail's, with the errno of what is wrong.
func planCp(src, dst string, s, d *cpEnd, fail func(error, string, ...any) error) (cpJob, error) {
	var job cpJob
	switch {
	case s.peer != "" && d.peer != "":
		return job, fail(syscall.EINVAL, "both are peer paths; one side must be a path in a mounted tensorfs")
	case s.peer == "" && d.peer == "" && s.mnt != d.mnt:
		return job, fail(syscall.EXDEV, "SRC and DST are in different tensorfs mounts, %s and %s; name one side as a peer path NAME:/path", s.mnt, d.mnt)
	case s.peer == "":
		if !s.exists {
			return job, fail(syscall.ENOENT, "SRC %s does not exist", src)
		}
		job.mnt, job.target, job.targetRel, job.attr = s.mnt, s.local, s.rel, xattrs.CopyTo
		job.srcs = []string{s.rel + s.r.String()}
		if d.peer == "" {
			job.value = d.rel + d.r.String()
			job.dsts = []string{job.value}
		} else {
			job.value = d.peer + ":" + d.rel + d.r.String()
			job.dsts = []string{job.value, d.rel + d.r.String()}
		}
		if s.r.Set {
			// copy_to's line: "@SRCRANGE DST".
			job.value = s.r.String() + " " + job.value
		}
	default:
		job.mnt, job.target, job.targetRel, job.attr = d.mnt, d.local, d.rel, xattrs.CopyFrom
		job.value = s.peer + ":" + s.rel + s.r.String()
		job.srcs = []string{job.value, s.rel + s.r.String()}
		job.dsts = []string{d.rel + d.r.String()}
		if d.r.Set {
			// copy_from's line: "SRC @DSTRANGE" (into DST's own bytes).
			job.value += " " + d.r.String()
			if !d.exists {
				return job, fail(syscall.ENOENT, "DST %s does not exist (an in-place copy writes into an existing tensor)", dst)
			}
		}
		if !d.exists {
			// copy_from needs a node to set it on. A file is the guess: a
			// directory source then fails with ENOTDIR, and the file goes.
			f, err := os.OpenFile(d.local, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
			if errors.Is(err, iofs.ErrNotExist) {
				return job, fail(err, "the directory of DST, %s, does not exist", filepath.Dir(dst))
			}
			if err != nil {
				return job, fail(err, "creating DST %s", dst)
			}
			if err := f.Close(); err != nil {
				os.Remove(d.local)
				return job, fail(err, "creating DST %s", dst)
			}
			job.createdDst = true
		}
	}

	// The record names a range as its daemon saw it: a pushed one on the
	// peer's side is not in the sender's record; match either form.
	job.srcs = append(job.srcs, s.rel, s.peer+":"+s.rel)
	job.dsts = append(job.dsts, d.rel, d.peer+":"+d.rel)
	return job, nil
}

// watchCp runs job's setxattr, drawing progress on w while it runs (a
// terminal, or --progress), and returns the transfer's record, how long it
// took, the thread that made the call (the daemon's refusals name it) and
// the setxattr's error. SIGINT and SIGTERM exit, saying the copy goes on.
func watchCp(src, dst string, job cpJob, opt cpOptions, w io.Writer) (*xattrs.Record, time.Duration, int, error) {
	show := !opt.quiet && (opt.progress || isTerminal(w))
	mon := &cpMonitor{mnt: job.mnt, srcs: job.srcs, dsts: job.dsts}
	mon.baseline()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	start := time.Now()
	var tid int // written before done is sent
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid = unix.Gettid()
		done <- unix.Setxattr(job.target, job.attr, []byte(job.value), 0)
	}()
	tick := time.NewTicker(cpPoll)
	defer tick.Stop()
	var bar *progressbar.ProgressBar
	var err error
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-tick.C:
			if show {
				bar = drawProgress(bar, mon.latest(true), w)
			}
		case sig := <-sigs:
			// The daemon ignores FUSE interrupts and finishes the copy; say
			// so rather than let the user think it was cancelled.
			if bar != nil {
				bar.Exit()
				bar.Clear()
			}
			fmt.Fprintf(w, "tensorfs: cp %s %s: %v: cp stops watching, but the copy goes on in the daemon, which completes or fails it on its own (see %s on %s)\n",
				src, dst, sig, xattrs.StatsName, job.mnt)
			os.Exit(128 + int(sig.(syscall.Signal)))
		}
	}
	elapsed := time.Since(start)
	rec := mon.latest(false)
	if bar != nil {
		bar.Exit()
		bar.Clear()
	}
	return rec, elapsed, tid, err
}

// refusalReason is the reason the daemon of mnt kept for refusing attr on
// rel (mount-relative) to thread tid (stats' errors.recent), or "".
func refusalReason(mnt string, tid int, rel, attr string) string {
	v, ok, err := getxattrString(func(b []byte) (int, error) { return unix.Getxattr(mnt, xattrs.StatsName, b) })
	if err != nil || !ok {
		return ""
	}
	var st xattrs.Stats
	if json.Unmarshal([]byte(v), &st) != nil {
		return ""
	}
	r, ok := st.Refusal(uint32(tid), rel, attr)
	if !ok {
		return ""
	}
	return r.Reason
}

// cpDetail is the part of an error worth a parenthesis beside its errno's
// text: a transfer.Error's message, or nothing for a bare errno.
func cpDetail(err error) string {
	var te *transfer.Error
	if errors.As(err, &te) {
		return te.Msg
	}
	var pe *iofs.PathError
	if errors.As(err, &pe) {
		return pe.Op + " " + pe.Path
	}
	return ""
}

// parseCpEnd parses one side: a peer path as the daemons parse it (a ':'
// before any '/'), else a local path, which is resolved and located in its
// tensorfs mount (mnt stays "" when it is in none).
func parseCpEnd(arg string) (*cpEnd, error) {
	e := &cpEnd{arg: arg}
	if i := strings.IndexByte(arg, ':'); i >= 0 && !strings.Contains(arg[:i], "/") {
		peer, p, err := transfer.ParsePeerPath(arg)
		if err != nil {
			return nil, err
		}
		e.peer, e.rel = peer, p
		return e, nil
	}
	abs, err := filepath.Abs(arg)
	if err != nil {
		return nil, err
	}
	if e.local, err = resolveMissing(abs); err != nil {
		return nil, err
	}
	_, err = os.Stat(e.local)
	switch {
	case err == nil:
		e.exists = true
	case !errors.Is(err, iofs.ErrNotExist):
		return nil, err
	}
	mounts, err := readMounts()
	if err != nil {
		return nil, err
	}
	if mp, fstype := mountOf(mounts, e.local); fstype == cpFSType {
		e.mnt = mp
		e.rel = "/" + strings.TrimPrefix(strings.TrimPrefix(e.local, mp), "/")
	}
	return e, nil
}

// resolveMissing resolves symlinks in abs, which need not exist: its deepest
// existing ancestor is resolved and the rest appended, so a destination yet
// to be created still maps onto its mount.
func resolveMissing(abs string) (string, error) {
	var rest []string
	for p := abs; ; p = filepath.Dir(p) {
		r, err := filepath.EvalSymlinks(p)
		if err == nil {
			for i := len(rest) - 1; i >= 0; i-- {
				r = filepath.Join(r, rest[i])
			}
			return r, nil
		}
		if !errors.Is(err, iofs.ErrNotExist) || p == "/" {
			return "", err
		}
		rest = append(rest, filepath.Base(p))
	}
}

// cpMount is one line of /proc/self/mounts: its source (tensorfs's is
// "tensorfs:NODE"), mountpoint and filesystem type.
type cpMount struct{ source, dir, fstype string }

func readMounts() ([]cpMount, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ms []cpMount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 {
			ms = append(ms, cpMount{source: unescapeMountField(fields[0]), dir: unescapeMountField(fields[1]), fstype: fields[2]})
		}
	}
	return ms, sc.Err()
}

// unescapeMountField undoes /proc/mounts' octal escapes (\040 for a space).
func unescapeMountField(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// mountOf finds the mount that serves path p: the nearest mountpoint
// walking up from p, and of several on one directory the last mounted
// (which hides the others). A path under a directory that another
// filesystem is mounted over is not in the tensorfs below it.
func mountOf(ms []cpMount, p string) (dir, fstype string) {
	for q := p; ; q = filepath.Dir(q) {
		for i := len(ms) - 1; i >= 0; i-- {
			if ms[i].dir == q {
				return ms[i].dir, ms[i].fstype
			}
		}
		if q == "/" {
			return "", ""
		}
	}
}

// isTerminal reports whether w is a terminal: a progress bar redraws its
// line with carriage returns, which only clutter a log or a pipe.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// cpMonitor finds this copy's transfer in the stats document of the mount
// at mnt. Every record has an id, never reused, and the pid of the process
// whose setxattr asked for the copy: this copy's record is one with an id
// above every id of the baseline (read before the setxattr), this process's
// pid, and a src and dst among the strings the daemon would record for it.
// Of those the newest is followed (a pull over IPC that falls back to TCP
// makes a second record). Concurrent copies of the same src and dst by
// other processes carry their own pids, so they never match.
type cpMonitor struct {
	mnt        string
	srcs, dsts []string
	pid        int
	maxID      uint64 // the highest id of the baseline
	ok         bool   // the baseline was read
}

func (m *cpMonitor) baseline() {
	m.pid = os.Getpid()
	before, ok := m.recent()
	for _, r := range before {
		m.maxID = max(m.maxID, r.ID)
	}
	m.ok = ok
}

// recent reads transfers.recent, robustly: stats changes while copies run,
// so its length may change between the size probe and the read.
func (m *cpMonitor) recent() ([]xattrs.Record, bool) {
	v, ok, err := getxattrString(func(b []byte) (int, error) { return unix.Getxattr(m.mnt, xattrs.StatsName, b) })
	if err != nil || !ok {
		return nil, false
	}
	var st xattrs.Stats
	if json.Unmarshal([]byte(v), &st) != nil {
		return nil, false
	}
	return st.Transfers.Recent, true
}

// latest returns this copy's record, nil when there is none (yet); with
// sized, only one whose bytes_total is known (a pull learns it from the
// peer).
func (m *cpMonitor) latest(sized bool) *xattrs.Record {
	if !m.ok {
		return nil
	}
	after, ok := m.recent()
	if !ok {
		return nil
	}
	return m.pick(after, sized)
}

// pick is latest's choice among the records recs.
func (m *cpMonitor) pick(recs []xattrs.Record, sized bool) *xattrs.Record {
	var best *xattrs.Record
	for i := range recs {
		r := &recs[i]
		if r.ID > m.maxID && r.PID == m.pid && contains(m.srcs, r.Src) && contains(m.dsts, r.Dst) &&
			(!sized || r.BytesTotal > 0) && (best == nil || r.ID > best.ID) {
			best = r
		}
	}
	return best
}

// contains reports whether s, a record's end, is one of list, as it is or
// without its range (a daemon writes a range in its own form: "@0" may be
// recorded as "@0+8192").
func contains(list []string, s string) bool {
	bare, _, _ := transfer.SplitRange(s)
	for _, x := range list {
		if x == s || x == bare {
			return true
		}
	}
	return false
}

// drawProgress shows rec on bar, creating the bar at the first record with a
// known size (until then there is nothing to draw a fraction of).
func drawProgress(bar *progressbar.ProgressBar, rec *xattrs.Record, w io.Writer) *progressbar.ProgressBar {
	if rec == nil {
		return bar
	}
	if bar == nil {
		bar = progressbar.NewOptions64(rec.BytesTotal,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription(fmt.Sprintf("%d %s", rec.Tensors, plural(rec.Tensors, "tensor"))),
			progressbar.OptionShowBytes(true),
			// IEC like the summary line (humanize.IBytes): one unit system.
			progressbar.OptionUseIECUnits(true),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(cpPoll),
			progressbar.OptionClearOnFinish(),
		)
	} else if bar.GetMax64() != rec.BytesTotal {
		bar.ChangeMax64(rec.BytesTotal)
	}
	bar.Set64(rec.BytesDone)
	return bar
}

func plural(n int64, noun string) string {
	if n == 1 {
		return noun
	}
	return noun + "s"
}

// cpSummary is the line printed after a copy (sizes and rate in IEC units,
// KiB, MiB, GiB, as the progress bar draws them): its record's counts, or, when
// stats had no record of it (pushed out of the list by many concurrent
// copies), the local side's file size for a single tensor.
func cpSummary(src, dst string, rec *xattrs.Record, s, d *cpEnd, elapsed time.Duration) string {
	var tensors, nbytes int64 = -1, -1
	if rec != nil {
		tensors, nbytes = rec.Tensors, rec.BytesDone
	} else {
		local := s
		if s.peer != "" {
			local = d
		}
		if fi, err := os.Stat(local.local); err == nil && !fi.IsDir() {
			tensors, nbytes = 1, fi.Size()
		}
	}
	secs := elapsed.Seconds()
	if nbytes < 0 {
		return fmt.Sprintf("copied %s to %s in %.2f s (no record of it in %s to count bytes)", src, dst, secs, xattrs.StatsName)
	}
	rate := ""
	if nbytes > 0 && secs > 0 {
		rate = ", " + humanize.IBytes(uint64(float64(nbytes)/secs)) + "/s"
	}
	return fmt.Sprintf("copied %d %s, %s bytes (%s), from %s to %s in %.2f s%s",
		tensors, plural(tensors, "tensor"), humanize.Comma(nbytes), humanize.IBytes(uint64(nbytes)), src, dst, secs, rate)
}
