package namespace

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
	"github.com/tensorfs/tensorfs/xattrs"
)

// BenchmarkCopyToLines1000: one copy_to of 1000 in-place lines (8 KiB
// blocks of one tensor into scattered blocks of another, inside this tree):
// the per-line cost of parsing, planning and the local batch, without FUSE
// or a peer (ns/op per call; "ns/line").
//
// Sub-benchmarks: 8 KiB blocks, and 64-byte ones, whose copy is next to
// nothing, so that what is left is the per-line cost.
func BenchmarkCopyToLines1000(b *testing.B) {
	for _, blk := range []int{8 << 10, 64} {
		b.Run(fmt.Sprint(blk), func(b *testing.B) { benchCopyToLines(b, 1000, blk) })
	}
}

func benchCopyToLines(b *testing.B, n, blk int) {
	tr := unmountedFS(b)
	src := addTensor(b, tr, "blocks", n*blk, 1)
	addTensor(b, tr, "cache", 2*n*blk, 2)
	var lines []string
	for i := range n {
		lines = append(lines, fmt.Sprintf("@%d+%d /cache@%d", i*blk, blk, ((i*389+17)%(2*n))*blk))
	}
	value := strings.Join(lines, "\n")
	b.ResetTimer()
	for b.Loop() {
		if err := tr.CopyTo(context.Background(), src, []byte(value), false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/line")
}

// BenchmarkNextRangeLine: the fast parser alone over the 1000 lines of the
// KV-cache call (8 KiB blocks into scattered blocks of a peer's tensor), in
// ns per line: the part of a 1000-descriptor call that grows with its text.
func BenchmarkNextRangeLine(b *testing.B) {
	const n, blk = 1000, 8 << 10
	var lines []string
	for i := range n {
		lines = append(lines, fmt.Sprintf("@%d+%d b:/cache@%d", i*blk, blk, ((i*389+17)%(2*n))*blk))
	}
	value := strings.Join(lines, "\n")
	for b.Loop() {
		k := 0
		var last rangeLine
		var prev *rangeLine
		for rest := value; rest != ""; k++ {
			l, after, ok := nextRangeLine(rest, false, prev)
			if !ok {
				b.Fatalf("line %d not taken", k)
			}
			last, prev = l, &last
			rest = after
		}
		if k != n {
			b.Fatalf("%d lines, want %d", k, n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/line")
}

// BenchmarkPlanRangeLines1000: the sender's part of the KV-cache call
// before any byte moves: newLinePlan and planRangeLines over 1000 lines of
// 8 KiB blocks of one tensor into scattered blocks of a peer's tensor (one
// range-list descriptor of 1000 spans), in ns per line. On an H100 host
// this part of a 1000-line copy_to took about 100 µs (2026-12-06).
//
// Sub-benchmarks: the text lines, and the same descriptors as a binary
// range list (planBinary).
func BenchmarkPlanRangeLines1000(b *testing.B) {
	const n, blk = 1000, 8 << 10
	tr := unmountedFS(b)
	ten, err := tr.store.New(u8tmpl())
	if err != nil {
		b.Fatal(err)
	}
	if err := ten.Truncate(n * blk); err != nil {
		b.Fatal(err)
	}
	src := NewFile(ten, 0o644, 0, 0)
	if err := tr.Root().Add("blocks", src); err != nil {
		b.Fatal(err)
	}
	var lines []string
	var descs []xattrs.RangeDesc
	for i := range n {
		dst := ((i*389 + 17) % (2 * n)) * blk
		lines = append(lines, fmt.Sprintf("@%d+%d b:/cache@%d", i*blk, blk, dst))
		descs = append(descs, xattrs.RangeDesc{Src: int64(i * blk), Dst: int64(dst), Len: blk})
	}
	bin := xattrs.AppendRangeRecord(nil, "b:/cache", descs)
	for _, c := range []struct{ name, value string }{{"text", strings.Join(lines, "\n")}, {"binary", string(bin)}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				var p *linePlan
				var rest string
				var k int
				var err error
				if isBinary(c.value) {
					recs, derr := decodeBinary(c.value)
					if derr != nil {
						b.Fatal(derr)
					}
					p = newLinePlan(binaryLines(recs))
					rest, err = tr.planBinary(p, src, recs)
					k = descriptors(recs)
				} else {
					p = newLinePlan(strings.Count(c.value, "\n") + 1)
					rest, k, err = tr.planRangeLines(p, src, c.value)
				}
				if err != nil || rest != "" || k != n || len(p.lists) != 1 {
					b.Fatalf("planned %d lines, rest %q, %d lists: %v", k, rest, len(p.lists), err)
				}
				closeAll(p.opened)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/line")
		})
	}
}

// BenchmarkFindShared1000: findShared over one in-place range list of 1000
// scattered 8 KiB blocks (blockOverlaps' bitmap), and over the same list
// one byte off the block grid (the sort it falls back to).
func BenchmarkFindShared1000(b *testing.B) {
	perm := rand.New(rand.NewPCG(1, 2)).Perm(2000)[:1000]
	for _, c := range []struct {
		name string
		skew int64
	}{{"blocks", 0}, {"sorted", 1}} {
		b.Run(c.name, func(b *testing.B) {
			spans := make([]transfer.Span, len(perm))
			for i, j := range perm {
				spans[i] = transfer.Span{Pos: int64(i) * 8192, Src: int64(i) * 8192, Dst: int64(j)*8192 + c.skew, N: 8192}
			}
			d := &dest{items: []destItem{{inPlace: true, target: &File{t: new(tensor.Tensor)}, spans: spans}}}
			for b.Loop() {
				d.findShared()
				if d.shared[0] {
					b.Fatal("no overlap here")
				}
			}
		})
	}
}
