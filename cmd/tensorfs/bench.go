package main

// bench is a client of a mounted tensorfs, like cp: it measures the copies
// users make (copy_to, copy_from and batch xattr writes, in place and whole)
// the way nixlbench and Mooncake's transfer_engine_bench measure theirs, but
// through the filesystem interface, so what it reports is what a caller of
// the mount sees: the FUSE request, the daemon's work and the peer's. It
// owns everything it creates (one temporary directory in each mount) and
// removes it on success, failure and SIGINT alike.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

// Bench's choices, as --modes and --dirs spell them.
const (
	modeInPlace = "inplace"
	modeWhole   = "whole"
	dirPush     = "push"
	dirPull     = "pull"
)

const (
	// benchDirPrefix starts the name of bench's temporary directory in each
	// mount (a random suffix follows), so a user who finds one left by a
	// killed bench knows whose it is.
	benchDirPrefix = "tensorfs-bench-"
	// xattrValueMax is the kernel's XATTR_SIZE_MAX: a value over it is
	// split into several setxattr calls, as python/tensorfs.py's batch does.
	xattrValueMax = 64 << 10
	// maxBenchSize is the largest tensor tensorfs makes (2^53 bytes, EFBIG
	// past it): a size or size x batch over it could never run.
	maxBenchSize = 1 << 53
)

// benchOptions are bench's flags, parsed and checked.
type benchOptions struct {
	peer  string
	sizes []int64 // bytes per descriptor, ascending, no duplicates
	batch int     // descriptors per call
	modes []string
	dirs  []string
	// iters is the number of timed calls per point; 0: run each point for
	// dur instead.
	iters        int
	dur          time.Duration
	json         bool
	plot         string
	check        int // calls verified per point
	leavePeerDir bool
}

func newBenchCmd() *cobra.Command {
	var (
		opt          benchOptions
		sizes        []string
		modes, dirs  []string
		batch, iters int
		dur          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "bench MOUNT",
		Short: "Measure copies (in place and whole, push and pull) inside a mount or to a peer",
		Long: `Measure the copies of the mount MOUNT (any path on it names it): inside that
mount, or with --peer NAME between it and the peer NAME (a --peer of its
daemon, or a node of its etcd view), the way nixlbench or Mooncake's
transfer_engine_bench measure theirs, but through the xattrs a user of the
mount writes:

  inplace push  copy_to on a local tensor, lines "@SRCOFF+LEN NAME:/dst@DSTOFF"
  inplace pull  copy_from on a local tensor, lines "NAME:/src@SRCOFF+LEN @DSTOFF"
  whole push    copy_to on a local tensor, one line "NAME:/dst.I" per descriptor
                (each call replaces the destinations)
  whole pull    copy_from on a local tensor from NAME:/src.0; with --batch N > 1,
                one batch (on the mount's root) of N lines "NAME:/src.I /dst.I"

Each call carries --batch descriptors of one size (in place: N ranges of
tensors of N x SIZE bytes; whole: N tensors of SIZE bytes); a value over
64 KiB (the kernel's xattr limit) is split into several setxattr calls,
which together count as one call. Every point (mode x direction x size) runs
one untimed call first, then --iters calls, or calls for --time; for each it
reports the latency of a call at the 50th and 99th percentile (the mean too,
in --json), and
the bandwidth (bytes moved / time in calls, in GB/s: 10^9 bytes a second),
the path the daemon took (local, ipc or tcp) and how many calls were
checked. --check N more calls a point (default 2) move fresh bytes, which
are then read back (through the mount, or from the peer by a copy_from) and
compared; a difference is an error. A check moves its bytes through the
mount several times, so at large sizes it takes longer than the calls it
checks (--check 0 or 1 for a quicker run).

--sizes takes byte sizes, comma-separated or repeated (go-humanize's parser,
as --max-memory): a bare K, M, G or T is binary as for truncate and dd
(4K = 4096 = 4KiB; 4KB = 4000).
--modes is inplace, whole or both; --dirs push, pull or both.

The table goes to stdout (--json: a JSON document instead, {mount, node,
peer, batch, iters, time_s, results: [{mode, dir, size, batch, bytes_per_call,
calls, writes_per_call, p50_us, p99_us, mean_us, gb_per_s, path, checked}]});
a progress bar goes to stderr when it is a terminal. --plot FILE.png draws
GB/s and p50 latency against size, one line per mode and direction.

Everything is created in a new directory tensorfs-bench-NNNN (random
digits) at the mount's root (and, with --peer, one of the same name at the
peer's root, made by copies) and removed at the end, after a failure too,
and on SIGINT, SIGTERM or SIGHUP, which stop bench after the call in flight
(exit 128 + the signal). A peer's directory is removed through the peer's
mount, which must be on this host (its source in /proc/mounts is
tensorfs:NAME): tensorfs has no way to remove a peer's files. For a peer on
another host, --leave-peer-dir runs anyway: the peer's tensors are emptied
(their memory freed) as bench goes, and the empty directory is left there,
named on stderr, to remove on that host.

Before anything is created bench refuses, with one line: an unknown peer
(or the mount's own node), a MOUNT not on tensorfs, a peer whose mount is
not on this host (without --leave-peer-dir), sizes that do not parse, a
--plot file that cannot be created, and sizes (x batch) that do not fit in
the mount's free space (statfs), the peer's when its mount is on this host,
or, on host memory, the host's MemAvailable (the needs of both mounts
together: host-memory daemons of one host each count all its memory as
free).`,
		Args: positional(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			if f.Changed("iters") && f.Changed("time") {
				return fmt.Errorf("bench: --iters and --time both given: each point runs a number of calls or for a time, not both")
			}
			if !f.Changed("iters") {
				iters = 0
			}
			var err error
			if opt, err = opt.with(sizes, modes, dirs, batch, iters, dur); err != nil {
				return fmt.Errorf("bench: %v", err)
			}
			return runBench(args[0], opt, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opt.peer, "peer", "", "the peer NAME to copy to and from (default: copies inside MOUNT)")
	f.StringSliceVar(&sizes, "sizes", []string{"4K", "64K", "1M", "16M", "256M", "1G"}, "bytes per descriptor, comma-separated (4K = 4096)")
	f.IntVar(&batch, "batch", 1, "descriptors per call (lines of one xattr value)")
	f.StringSliceVar(&modes, "modes", []string{modeInPlace, modeWhole}, "inplace (ranges into existing tensors), whole (replacing tensors), or both")
	f.StringSliceVar(&dirs, "dirs", []string{dirPush, dirPull}, "push (copy_to), pull (copy_from), or both")
	f.IntVar(&iters, "iters", 0, "timed calls per point (instead of --time)")
	f.DurationVar(&dur, "time", time.Second, "how long each point runs its timed calls (at least one)")
	f.BoolVar(&opt.json, "json", false, "print JSON instead of the table")
	f.StringVar(&opt.plot, "plot", "", "draw GB/s and p50 latency against size into this PNG file")
	f.IntVar(&opt.check, "check", 2, "calls per point whose bytes are read back and compared (0: none)")
	f.BoolVar(&opt.leavePeerDir, "leave-peer-dir", false, "run with a peer whose mount is not on this host, leaving an empty directory there")
	return cmd
}

// with is o with the flags' values parsed and checked; errors name the
// flag and say what it takes.
func (o benchOptions) with(sizes, modes, dirs []string, batch, iters int, dur time.Duration) (benchOptions, error) {
	var err error
	if o.sizes, err = parseBenchSizes(sizes); err != nil {
		return o, err
	}
	if batch < 1 {
		return o, fmt.Errorf("--batch %d: at least 1 descriptor per call", batch)
	}
	o.batch = batch
	if last := o.sizes[len(o.sizes)-1]; last > maxBenchSize/int64(batch) {
		return o, fmt.Errorf("--sizes %s x --batch %d: past the largest tensor (2^53 bytes)", humanize.IBytes(uint64(last)), batch)
	}
	if o.modes, err = parseChoices("--modes", modes, modeInPlace, modeWhole); err != nil {
		return o, err
	}
	if o.dirs, err = parseChoices("--dirs", dirs, dirPush, dirPull); err != nil {
		return o, err
	}
	switch {
	case iters < 0:
		return o, fmt.Errorf("--iters %d: want at least 1 call per point", iters)
	case iters == 0 && dur <= 0:
		return o, fmt.Errorf("--time %v: must be positive", dur)
	}
	o.iters, o.dur = iters, dur
	if o.check < 0 {
		return o, fmt.Errorf("--check %d: want 0 (no check) or more calls per point", o.check)
	}
	if o.plot != "" && !strings.EqualFold(fileExt(o.plot), ".png") {
		return o, fmt.Errorf("--plot %s: want a .png file", o.plot)
	}
	if o.peer != "" {
		if err := checkNodeName(o.peer); err != nil {
			return o, fmt.Errorf("--peer %q: not a node name: %v", o.peer, err)
		}
	}
	return o, nil
}

// fileExt is p's extension ("" for none), without filepath's idea that a
// directory's dot counts.
func fileExt(p string) string {
	base := p[strings.LastIndexByte(p, '/')+1:]
	if i := strings.LastIndexByte(base, '.'); i > 0 {
		return base[i:]
	}
	return ""
}

// parseBenchSizes parses --sizes: byte sizes by go-humanize (the parser of
// mount's --max-memory), where a bare K, M, G, T, P or E suffix is binary,
// as truncate and dd read it (4K = 4096), since 4000-byte KV blocks are
// nobody's benchmark; an explicit KB is 1000 and KiB 1024, as humanize has
// them. Sizes come back ascending without duplicates (a plot's x axis).
// Errors: one that does not parse, is 0, or is past 2^53 bytes.
func parseBenchSizes(vals []string) ([]int64, error) {
	if len(vals) == 0 {
		return nil, fmt.Errorf("--sizes: no sizes given")
	}
	var out []int64
	for _, v := range vals {
		s := strings.TrimSpace(v)
		if n := len(s); n > 0 && strings.ContainsRune("KMGTPEkmgtpe", rune(s[n-1])) && n > 1 && (s[n-2] == ' ' || s[n-2] == '.' || '0' <= s[n-2] && s[n-2] <= '9') {
			s += "iB"
		}
		n, err := humanize.ParseBytes(s)
		switch {
		case s == "" || err != nil:
			return nil, fmt.Errorf("--sizes %q: not a byte size (e.g. 4K, 64KiB, 1M, 1G, 1000)", v)
		case n == 0:
			return nil, fmt.Errorf("--sizes %q: a copy needs at least 1 byte", v)
		case n > maxBenchSize:
			return nil, fmt.Errorf("--sizes %q: past the largest tensor (2^53 bytes)", v)
		}
		out = append(out, int64(n))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// parseChoices parses a list flag whose values are among allowed: each
// once, in the order given.
func parseChoices(flag string, vals []string, allowed ...string) ([]string, error) {
	var out []string
	for _, v := range vals {
		v = strings.ToLower(strings.TrimSpace(v))
		if !slices.Contains(allowed, v) {
			return nil, fmt.Errorf("%s %q: want %s", flag, v, strings.Join(allowed, ", "))
		}
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: none given; want %s", flag, strings.Join(allowed, ", "))
	}
	return out, nil
}

// benchInterrupted is the error of a bench stopped by a signal, after its
// cleanup: the command exits 128 + the signal's number, as a shell reports
// a command killed by it.
type benchInterrupted struct {
	mnt string
	sig syscall.Signal
}

// Error is the line the command prints: that it stopped, by which
// signal, and that it cleaned up.
func (e *benchInterrupted) Error() string {
	return fmt.Sprintf("bench %s: interrupted by %s; its files are removed", e.mnt, unix.SignalName(e.sig))
}

// runBench runs the bench of the mount that arg is on (see newBenchCmd):
// the table or JSON on stdout, progress and notes on stderr. SIGINT,
// SIGTERM and SIGHUP stop it after the call in flight (the daemon finishes
// a copy it has started), remove what it made and exit 128 + the signal.
func runBench(arg string, opt benchOptions, stdout, stderr io.Writer) error {
	loc, err := locate("bench", arg)
	if err != nil {
		return err
	}
	b := &bench{opt: opt, mnt: loc.mnt, node: nodeOfMount(loc.mnt), stderr: stderr, pid: os.Getpid()}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	b.sigs = sigs
	// One thread makes every call, so the daemon's refusals (which name
	// the calling thread) can be told apart from other processes'.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.tid = unix.Gettid()

	rep, err := b.run()
	cerr := b.cleanup()
	var ie *benchInterrupted
	if errors.As(err, &ie) {
		if cerr != nil {
			fmt.Fprintf(stderr, "tensorfs: bench %s: interrupted by %s, and then %s\n", b.mnt, unix.SignalName(ie.sig), strings.TrimPrefix(cerr.Error(), "bench "+b.mnt+": "))
		} else {
			fmt.Fprintln(stderr, "tensorfs:", err)
		}
		os.Exit(128 + int(ie.sig))
	}
	switch {
	case err != nil && cerr != nil:
		return fmt.Errorf("%v; and then %v", err, strings.TrimPrefix(cerr.Error(), "bench "+b.mnt+": "))
	case err != nil:
		return err
	case cerr != nil:
		return cerr
	}
	if opt.json {
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		writeBenchTable(stdout, rep)
	}
	if opt.plot != "" {
		if err := writeBenchPlot(opt.plot, rep); err != nil {
			return fmt.Errorf("bench %s: --plot %s: %v", b.mnt, opt.plot, err)
		}
	}
	return nil
}
