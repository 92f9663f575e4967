package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// labelRE is what a transfer record's src or dst may be: a path in the
// mount or on a peer, with a range or a range list's count. A string that
// kept a slice of a FUSE buffer reused by a later call would show that
// call's binary bytes.
var labelRE = regexp.MustCompile(`^[a-z0-9:/@+\[\] ]+$`)

// TestBinaryRangeListsConcurrent: goroutines, each on its own tensors, run
// binary range-list copy_to (to the peer and into this mount), batch,
// copy_from (a range-list get from the peer) and copy_to puts the peer
// refuses, over one daemon pair, checking every destination byte for byte
// after each call, and the stats' transfer records' names. It guards what
// a binary range list's call keeps no copy of: its value, read from the
// FUSE request's buffer (namespace.valueOf), and its spans, pooled on the
// sender and kept per connection on the receiver (transfer.decodeMsgIn):
// with decodeBinary's copy of the lines removed, a refusal's reason showed
// the next request's bytes.
func TestBinaryRangeListsConcurrent(t *testing.T) {
	concurrentBinary(t, 40, 128, 160, 4)
}

// TestBinaryRangeListsConcurrentStreams: the same with blocks of 32 KiB, so that
// puts and gets of a range list run on several TCP streams.
func TestBinaryRangeListsConcurrentStreams(t *testing.T) {
	concurrentBinary(t, 12, 32<<10, 80, 3)
}

func concurrentBinary(t *testing.T, iters, blk, nblk, G int) {
	for _, p := range copyPaths(true)[:2] {
		t.Run(p.name, func(t *testing.T) {
			a, b := pairOn(t, p)
			size := int64(blk * nblk)
			srcs := make([][]byte, G)
			for g := range G {
				r := rand.New(rand.NewPCG(uint64(g), 77))
				srcs[g] = make([]byte, size)
				for i := range srcs[g] {
					srcs[g][i] = byte(r.Uint32())
				}
				writeTensor(t, a.path(fmt.Sprintf("src%d", g)), srcs[g])
				zeros(t, b.path(fmt.Sprintf("d%d", g)), size)
				zeros(t, a.path(fmt.Sprintf("loc%d", g)), size)
				zeros(t, a.path(fmt.Sprintf("back%d", g)), size)
			}
			var wg sync.WaitGroup
			errs := make(chan error, G+1)
			for g := range G {
				wg.Go(func() {
					errs <- binaryWorker(a, b, g, srcs[g], iters, blk, nblk)
				})
			}
			stop := make(chan struct{})
			var sg sync.WaitGroup
			sg.Go(func() { // the stats read while calls run
				for {
					select {
					case <-stop:
						return
					default:
					}
					for _, d := range []*daemon{a, b} {
						if err := checkRecords(d); err != nil {
							errs <- err
							return
						}
					}
				}
			})
			wg.Wait()
			close(stop)
			sg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			for _, d := range []*daemon{a, b} {
				require.NoError(t, checkRecords(d))
				most := int64(0)
				for _, r := range d.stats().Transfers.Recent {
					most = max(most, r.Streams)
				}
				t.Logf("%s: the recent records' most streams: %d", d.mnt, most)
			}
		})
	}
}

func checkRecords(d *daemon) error {
	v, err := getxErr(d.mnt, xattrs.StatsName)
	if err != nil {
		return err
	}
	if bytes.IndexByte([]byte(v), 0) >= 0 {
		return fmt.Errorf("stats hold a NUL: %q", v)
	}
	var s xattrs.Stats
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return err
	}
	for _, r := range s.Transfers.Recent {
		for _, l := range []string{r.Src, r.Dst} {
			if !labelRE.MatchString(l) {
				return fmt.Errorf("record %d: src %q dst %q", r.ID, r.Src, r.Dst)
			}
		}
	}
	for _, r := range s.Errors.Recent {
		if bytes.IndexByte([]byte(r.Reason), 0) >= 0 || bytes.IndexByte([]byte(r.Path), 0) >= 0 {
			return fmt.Errorf("refusal %d: %q %q", r.ID, r.Path, r.Reason)
		}
	}
	return nil
}

// binaryWorker is one goroutine of TestBinaryRangeListsConcurrent.
func binaryWorker(a, b *daemon, g int, src []byte, iters, blk, nblk int) error {
	r := rand.New(rand.NewPCG(uint64(g), 5))
	size := blk * nblk
	dPeer, dLoc, dBack := make([]byte, size), make([]byte, size), make([]byte, size)
	srcP := a.path(fmt.Sprintf("src%d", g))
	peerName := fmt.Sprintf("b:/d%d", g)
	locName := fmt.Sprintf("/loc%d", g)
	// descs is n descriptors: distinct destination blocks, random
	// source blocks, random lengths up to blk.
	descs := func(n int) []xattrs.RangeDesc {
		slots := r.Perm(nblk)[:n]
		ds := make([]xattrs.RangeDesc, n)
		for i, s := range slots {
			l := 1 + r.IntN(blk)
			if blk > 4096 { // large enough for several streams
				l = blk - r.IntN(64)
			}
			ds[i] = xattrs.RangeDesc{Src: int64(r.IntN(nblk) * blk), Dst: int64(s * blk), Len: int64(l)}
		}
		return ds
	}
	apply := func(model, from []byte, ds []xattrs.RangeDesc) {
		for _, d := range ds {
			copy(model[d.Dst:d.Dst+d.Len], from[d.Src:d.Src+d.Len])
		}
	}
	for it := range iters {
		n := 64 + r.IntN(nblk-64) // a pooled span slice (minPooledSpans)
		var v []byte
		on, attr := srcP, xattrs.CopyTo
		var wantErr syscall.Errno
		switch it % 4 {
		case 0:
			ds, dl := descs(n), descs(64+r.IntN(nblk-64))
			v = xattrs.AppendRangeRecord(nil, peerName, ds)
			v = xattrs.AppendRangeRecord(v, locName, dl)
			apply(dPeer, src, ds)
			apply(dLoc, src, dl)
		case 1:
			ds, dl := descs(n), descs(64+r.IntN(nblk-64))
			v = xattrs.AppendRangeRecord(nil, fmt.Sprintf("/src%d %s", g, peerName), ds)
			v = xattrs.AppendRangeRecord(v, fmt.Sprintf("/src%d %s", g, locName), dl)
			on, attr = a.mnt, xattrs.Batch
			apply(dPeer, src, ds)
			apply(dLoc, src, dl)
		case 2:
			ds := descs(n)
			v = xattrs.AppendRangeRecord(nil, peerName, ds)
			on, attr = a.path(fmt.Sprintf("back%d", g)), xattrs.CopyFrom
			apply(dBack, dPeer, ds)
		case 3:
			// Refused by the peer (past its tensor's end): nothing lands.
			ds := descs(n)
			ds[n-1].Dst = int64(size) - 1
			ds[n-1].Len = 2
			v = xattrs.AppendRangeRecord(nil, peerName, ds)
			wantErr = syscall.EINVAL
		}
		err := unix.Setxattr(on, attr, v, 0)
		if wantErr != 0 {
			if !errors.Is(err, wantErr) {
				return fmt.Errorf("g%d it%d: %s: %v, want %v", g, it, attr, err, wantErr)
			}
		} else if err != nil {
			return fmt.Errorf("g%d it%d: %s: %v", g, it, attr, err)
		}
		for _, c := range []struct {
			p    string
			want []byte
		}{{b.path(fmt.Sprintf("d%d", g)), dPeer}, {a.path(locName), dLoc}, {a.path(fmt.Sprintf("back%d", g)), dBack}} {
			got, err := os.ReadFile(c.p)
			if err != nil {
				return err
			}
			if !bytes.Equal(got, c.want) {
				k := 0
				for k < len(got) && k < len(c.want) && got[k] == c.want[k] {
					k++
				}
				return fmt.Errorf("g%d it%d (%s): %s differs from byte %d", g, it, attr, c.p, k)
			}
		}
	}
	return nil
}

// TestBinaryRangeListsConcurrentGoAhead: blocks of 16 KiB, puts of 1 to 1.3 MiB:
// one stream, past eagerMax (the go-ahead's put, whose refusal keeps the
// connection).
func TestBinaryRangeListsConcurrentGoAhead(t *testing.T) {
	concurrentBinary(t, 16, 16<<10, 80, 3)
}
