// Command tracespans reads a daemon's execution trace (TENSORFS_TRACE, one
// file per daemon) and times what a copy's goroutines did between
// syscalls: how docs/performance.md's per-step figures for the in-place
// misses were found (2026-12-03). Usage:
//
//	tracespans fuse TRACE
//	    the FUSE requests the daemon served, each from the return of the
//	    read(/dev/fuse) that got it to its reply's writev, by kind (the
//	    bridge method its stacks show; "?" when it made no syscall to
//	    name it), and the gaps between consecutive ones (the caller's and
//	    the readers' wake-ups): p50, p10 and p90 in µs.
//	tracespans span [-sample N] [-min µs] TRACE START END
//	    per goroutine, from the return of a syscall whose stack names
//	    START (a substring of a function name) to the entry of the next one
//	    whose stack names END: p50, p10, p90 in µs, and the transitions of
//	    the N-th span (default 150), each with its time from the start and
//	    the innermost tensorfs or go-fuse frames; -min counts only the
//	    spans of at least that many µs (a SETXATTR among the LOOKUPs that
//	    also end in a FUSE writev).
//
// For example, a sender's copy_to: `span TRACE readRequest fuse.writev`; a
// receiver's request: `span TRACE readFrameHeader sendJSON`.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"golang.org/x/exp/trace"
)

func main() {
	if len(os.Args) < 3 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "fuse":
		err = fuseMode(os.Args[2], os.Stdout)
	case "span":
		fs := flag.NewFlagSet("span", flag.ExitOnError)
		sample := fs.Int("sample", 150, "the span whose transitions are printed")
		min := fs.Float64("min", 0, "count only spans of at least this many µs (a SETXATTR among its LOOKUPs)")
		fs.Parse(os.Args[2:])
		if fs.NArg() != 3 {
			usage()
		}
		err = spanMode(fs.Arg(0), fs.Arg(1), fs.Arg(2), *sample, *min, os.Stdout)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tracespans:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: tracespans fuse TRACE | tracespans span [-sample N] [-min µs] TRACE START END")
	os.Exit(2)
}

// transition is one goroutine state change of the trace, with the stack
// of its event joined as "f1;f2;..." (innermost first).
type transition struct {
	t        trace.Time
	g        trace.GoID
	from, to trace.GoState
	stack    string
}

// each calls f for every goroutine state transition of the trace at path,
// in order.
func each(path string, f func(transition)) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	r, err := trace.NewReader(file)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		from, to := st.Goroutine()
		var b strings.Builder
		for fr := range ev.Stack().Frames() {
			b.WriteString(fr.Func)
			b.WriteByte(';')
		}
		f(transition{t: ev.Time(), g: st.Resource.Goroutine(), from: from, to: to, stack: b.String()})
	}
}

// frames is a stack's innermost tensorfs and go-fuse frames (three at
// most), package-qualified, for a transition's line.
func frames(stack string) string {
	var keep []string
	for _, fn := range strings.Split(stack, ";") {
		if strings.Contains(fn, "tensorfs/") || strings.Contains(fn, "go-fuse") {
			keep = append(keep, fn[strings.LastIndex(fn, "/")+1:])
			if len(keep) == 3 {
				break
			}
		}
	}
	return strings.Join(keep, " < ")
}

// quantiles writes name's p50, p10 and p90 of v (µs) and its count.
func quantiles(w io.Writer, name string, v []float64) {
	if len(v) == 0 {
		return
	}
	sort.Float64s(v)
	fmt.Fprintf(w, "%-34s n %5d  p50 %8.1f  p10 %8.1f  p90 %8.1f µs\n", name, len(v), v[len(v)/2], v[len(v)/10], v[len(v)*9/10])
}

func us(a, b trace.Time) float64 { return float64(b-a) / 1e3 }

// fuseKinds are the go-fuse bridge methods a FUSE request is named by.
var fuseKinds = []string{"SetXAttr", "GetXAttr", "Lookup", "GetAttr", "Open", "Release", "Forget", "Flush", "Create", "Unlink", "Rename"}

// fuseMode: see the command's doc.
func fuseMode(path string, w io.Writer) error {
	type request struct {
		start, end trace.Time
		kind       string
	}
	reading := map[trace.GoID]bool{}
	open := map[trace.GoID]*request{}
	var done []request
	err := each(path, func(tr transition) {
		if tr.from == trace.GoSyscall && reading[tr.g] {
			delete(reading, tr.g)
			open[tr.g] = &request{start: tr.t}
		}
		if q := open[tr.g]; q != nil && q.kind == "" {
			for _, k := range fuseKinds {
				if strings.Contains(tr.stack, "rawBridge)."+k) {
					q.kind = k
					break
				}
			}
		}
		if tr.to != trace.GoSyscall {
			return
		}
		if strings.Contains(tr.stack, "readRequest") {
			reading[tr.g] = true
			delete(open, tr.g)
			return
		}
		if q := open[tr.g]; q != nil && strings.Contains(tr.stack, "fuse.writev") {
			q.end = tr.t
			if q.kind == "" {
				q.kind = "?"
			}
			done = append(done, *q)
			delete(open, tr.g)
		}
	})
	if err != nil {
		return err
	}
	sort.Slice(done, func(i, j int) bool { return done[i].start < done[j].start })
	serve, gaps := map[string][]float64{}, map[string][]float64{}
	for i, q := range done {
		serve[q.kind] = append(serve[q.kind], us(q.start, q.end))
		if i > 0 {
			k := done[i-1].kind + " -> " + q.kind
			gaps[k] = append(gaps[k], us(done[i-1].end, q.start))
		}
	}
	for _, m := range []struct {
		label string
		v     map[string][]float64
		min   int
	}{{"serve ", serve, 1}, {"gap ", gaps, 20}} {
		keys := make([]string, 0, len(m.v))
		for k := range m.v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if len(m.v[k]) >= m.min {
				quantiles(w, m.label+k, m.v[k])
			}
		}
	}
	return nil
}

// spanMode: see the command's doc.
func spanMode(path, startPat, endPat string, sample int, min float64, w io.Writer) error {
	type span struct {
		start trace.Time
		log   []string
	}
	pending := map[trace.GoID]bool{}
	open := map[trace.GoID]*span{}
	var lat []float64
	err := each(path, func(tr transition) {
		if tr.from == trace.GoSyscall && pending[tr.g] {
			delete(pending, tr.g)
			open[tr.g] = &span{start: tr.t}
			return
		}
		if sp := open[tr.g]; sp != nil {
			sp.log = append(sp.log, fmt.Sprintf("  +%8.1f µs %v -> %v %s", us(sp.start, tr.t), tr.from, tr.to, frames(tr.stack)))
			if tr.to == trace.GoSyscall && strings.Contains(tr.stack, endPat) {
				if d := us(sp.start, tr.t); d >= min {
					if len(lat) == sample {
						fmt.Fprintf(w, "span %d:\n%s\n", sample, strings.Join(sp.log, "\n"))
					}
					lat = append(lat, d)
				}
				delete(open, tr.g)
			}
		}
		if tr.to == trace.GoSyscall && strings.Contains(tr.stack, startPat) {
			pending[tr.g] = true
			delete(open, tr.g)
		}
	})
	if err != nil {
		return err
	}
	quantiles(w, startPat+" -> "+endPat, lat)
	return nil
}
