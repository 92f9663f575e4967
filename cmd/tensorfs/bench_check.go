package main

// bench's checks: a sample of calls move fresh bytes, which are read back
// from their destinations and compared.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// checkedCall makes c once with fresh bytes in its sources (a new pattern
// for every descriptor, never written before, so a copy that moved nothing
// cannot pass) and compares its destinations with them after.
func (b *bench) checkedCall(ph benchPhase, dir string, c benchCall, label string) error {
	type desc struct {
		src, dst benchEnd
		seed     uint64
	}
	s := ph.size
	var ds []desc
	for i := range ph.n {
		off := int64(i) * s
		b.seed++
		var local, remote benchEnd
		if ph.mode == modeInPlace {
			local, remote = benchEnd{name: "a", off: off}, benchEnd{name: "b", off: off, remote: true}
		} else {
			local, remote = benchEnd{name: "w"}, benchEnd{name: fmt.Sprintf("w.%d", i), remote: true}
			if dir == dirPull {
				local.name = fmt.Sprintf("p.%d", i)
			}
		}
		if dir == dirPush {
			ds = append(ds, desc{src: local, dst: remote, seed: b.seed})
		} else {
			ds = append(ds, desc{src: remote, dst: local, seed: b.seed})
		}
		if ph.mode == modeWhole && dir == dirPush {
			break // one source, copied to every destination
		}
	}
	// Each file is opened once for all its descriptors, and closed before
	// the call: the call may replace it.
	w := benchFiles{flag: os.O_RDWR}
	for _, d := range ds {
		if err := b.writePattern(&w, d.src, s, d.seed); err != nil {
			w.close()
			return b.fail("%s: check: writing %s: %v", label, b.endName(d.src, s), err)
		}
	}
	if err := w.close(); err != nil {
		return b.fail("%s: check: %v", label, err)
	}
	if err := b.call(c, label+": check"); err != nil {
		return err
	}
	if ph.mode == modeWhole && dir == dirPush {
		for i := 1; i < ph.n; i++ {
			ds = append(ds, desc{src: ds[0].src, dst: benchEnd{name: fmt.Sprintf("w.%d", i), remote: true}, seed: ds[0].seed})
		}
	}
	r := benchFiles{flag: os.O_RDONLY}
	defer r.close()
	for _, d := range ds {
		if err := b.comparePattern(&r, d.dst, s, d.seed); err != nil {
			return b.fail("%s: check: %s after its copy from %s: %v", label, b.endName(d.dst, s), b.endName(d.src, s), err)
		}
	}
	return nil
}

// benchFiles are the files of a check's local tensors, each opened once
// (with flag) for all its descriptors: an open through FUSE costs a round
// trip, which a check of a batch of 1000 descriptors would pay 1000 times.
type benchFiles struct {
	flag int
	open map[string]*os.File
}

// get is the open file at path.
func (fs *benchFiles) get(path string) (*os.File, error) {
	if f := fs.open[path]; f != nil {
		return f, nil
	}
	f, err := os.OpenFile(path, fs.flag, 0)
	if err != nil {
		return nil, errors.New(errText(unwrapPath(err)))
	}
	if fs.open == nil {
		fs.open = map[string]*os.File{}
	}
	fs.open[path] = f
	return f, nil
}

// close closes them all, returning the first error.
func (fs *benchFiles) close() error {
	var first error
	for p, f := range fs.open {
		if err := f.Close(); err != nil && first == nil {
			first = fmt.Errorf("closing %s: %s", p, errText(unwrapPath(err)))
		}
	}
	fs.open = nil
	return first
}

// benchEnd is one descriptor's side in a check: a tensor of the local
// directory, or of the peer's (remote), and the range's offset.
type benchEnd struct {
	name   string
	off    int64
	remote bool
}

// endName is e as the user would name it: the local path, or the peer
// path, with its range.
func (b *bench) endName(e benchEnd, n int64) string {
	if e.remote {
		return fmt.Sprintf("%s@%d+%d", b.remote(e.name), e.off, n)
	}
	return fmt.Sprintf("%s@%d+%d", b.path(e.name), e.off, n)
}

// writePattern fills n bytes of e at its offset with seed's pattern: a
// local tensor by pwrite through the mount; the peer's by in-place copies
// from the scratch tensor v, which gets each piece of the pattern first.
func (b *bench) writePattern(fs *benchFiles, e benchEnd, n int64, seed uint64) error {
	if !e.remote || b.opt.peer == "" {
		f, err := fs.get(b.path(e.name))
		if err != nil {
			return err
		}
		return writePatternAt(f, e.off, n, seed, 0)
	}
	v, err := fs.get(b.path("v"))
	if err != nil {
		return err
	}
	piece := scratchSize(n)
	for pos := int64(0); pos < n; pos += piece {
		k := min(piece, n-pos)
		if err := writePatternAt(v, 0, k, seed, pos); err != nil {
			return err
		}
		line := fmt.Sprintf("@0+%d %s@%d", k, b.remote(e.name), e.off+pos)
		if err := unix.Setxattr(b.path("v"), xattrs.CopyTo, []byte(line), 0); err != nil {
			return fmt.Errorf("copy_to %q: %s", line, errText(err))
		}
	}
	return nil
}

// comparePattern checks that n bytes of e at its offset are seed's
// pattern: read through the mount; the peer's pulled into v first, a piece
// at a time (the peer's bytes are read through its peer path, as any
// client must).
func (b *bench) comparePattern(fs *benchFiles, e benchEnd, n int64, seed uint64) error {
	if !e.remote || b.opt.peer == "" {
		f, err := fs.get(b.path(e.name))
		if err != nil {
			return err
		}
		return comparePatternAt(f, e.off, n, seed, 0)
	}
	v, err := fs.get(b.path("v"))
	if err != nil {
		return err
	}
	piece := scratchSize(n)
	for pos := int64(0); pos < n; pos += piece {
		k := min(piece, n-pos)
		line := fmt.Sprintf("%s@%d+%d @0", b.remote(e.name), e.off+pos, k)
		if err := unix.Setxattr(b.path("v"), xattrs.CopyFrom, []byte(line), 0); err != nil {
			return fmt.Errorf("reading it back: copy_from %q: %s", line, errText(err))
		}
		if err := comparePatternAt(v, 0, k, seed, pos); err != nil {
			return err
		}
	}
	return nil
}

// scratchMax bounds the scratch tensor v, through which checks move a
// peer's bytes: a check of a 1 GiB copy goes through it in pieces rather
// than cost another 1 GiB.
const scratchMax = 16 << 20

// scratchSize is the size of v for descriptors of n bytes.
func scratchSize(n int64) int64 { return min(n, scratchMax) }

// patternChunk is how much of a pattern is made and moved at a time, so a
// check of a 1 GiB copy does not hold 1 GiB in this process.
const patternChunk = 4 << 20

// fillPattern fills buf with seed's pattern from byte pos of the range
// (pos a multiple of 8): 8 bytes of a SplitMix64 hash of (seed, word
// index) per word, so any part of it can be made on its own and patterns of
// two seeds differ in every word.
func fillPattern(buf []byte, seed uint64, pos int64) {
	var w [8]byte
	for i := 0; i < len(buf); i += 8 {
		binary.LittleEndian.PutUint64(w[:], splitMix64(seed<<32^uint64(pos+int64(i))/8))
		copy(buf[i:], w[:])
	}
}

// splitMix64 is SplitMix64's finalizer: a bijection, cheap, well mixed.
func splitMix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// writePatternAt writes n bytes of seed's pattern into f at off, starting
// at byte pos of the pattern (a multiple of 8).
func writePatternAt(f *os.File, off, n int64, seed uint64, pos int64) error {
	buf := make([]byte, min(n, patternChunk))
	for done := int64(0); done < n; done += int64(len(buf)) {
		buf = buf[:min(int64(cap(buf)), n-done)]
		fillPattern(buf, seed, pos+done)
		if _, err := f.WriteAt(buf, off+done); err != nil {
			return errors.New(errText(unwrapPath(err)))
		}
	}
	return nil
}

// comparePatternAt reads n bytes of f from off and compares them with
// seed's pattern from its byte pos (a multiple of 8); the error names the
// first byte that differs, counted from the pattern's start.
func comparePatternAt(f *os.File, off, n int64, seed uint64, pos int64) error {
	want := make([]byte, min(n, patternChunk))
	got := make([]byte, len(want))
	for done := int64(0); done < n; done += int64(len(want)) {
		k := min(int64(cap(want)), n-done)
		want, got = want[:k], got[:k]
		fillPattern(want, seed, pos+done)
		if _, err := f.ReadAt(got, off+done); err != nil {
			return fmt.Errorf("reading %d bytes at %d: %s", k, off+done, errText(unwrapPath(err)))
		}
		if !bytes.Equal(got, want) {
			i := 0
			for got[i] == want[i] {
				i++
			}
			return fmt.Errorf("byte %d of the range differs (0x%02x, not 0x%02x)", pos+done+int64(i), got[i], want[i])
		}
	}
	return nil
}
