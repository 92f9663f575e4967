package tests

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// BenchmarkRevocation measures a revocation round: the unlink of a 64 KiB
// tensor that N peer daemons of this host hold cached imports of (N = 1, 4,
// 16) returns once every importer has closed its import and answered; the
// baseline, N = 0 in the same run, is the same unlink with no importer.
// Each iteration re-creates the tensor and pushes it to the N importers
// (untimed). Reported as ns/op per unlink; the ratio to N = 0 is the cost
// of the round.
func BenchmarkRevocation(b *testing.B) {
	names := []string{"a"}
	for i := 0; i < 16; i++ {
		names = append(names, fmt.Sprintf("i%d", i))
	}
	ds := sameHost(b, names, "--revoke-timeout", "10s")
	a := ds["a"]
	data := fill(64<<10, 1)
	src := a.path("t")
	for _, n := range []int{0, 1, 4, 16} {
		b.Run(fmt.Sprintf("importers=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				mustNo(b, os.WriteFile(src, data, 0o644))
				for j := 0; j < n; j++ {
					mustNo(b, unix.Setxattr(src, xattrs.CopyTo, []byte(fmt.Sprintf("i%d:/t", j)), 0))
				}
				waitLeases(b, a.mnt, n)
				b.StartTimer()
				mustNo(b, unix.Unlink(src))
			}
			b.StopTimer()
			for j := 0; j < n; j++ {
				if got := benchStats(b, ds[fmt.Sprintf("i%d", j)].mnt).Live.Imports; got != 0 {
					b.Fatalf("importer %d still holds %d imports after the unlink", j, got)
				}
			}
		})
	}
	for j := 0; j < 16; j++ {
		os.Remove(ds[fmt.Sprintf("i%d", j)].path("t"))
	}
}

// waitLeases waits until the daemon at mnt holds exactly n leases, and
// fails the benchmark when it does not within 5 s. It waits because the
// writer's own handle holds a lease until its FUSE RELEASE, which the
// kernel sends after close(2) has returned (an extra lease for a moment);
// a lease short of n is a lost one and never comes.
func waitLeases(b *testing.B, mnt string, n int) {
	b.Helper()
	got := -1
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(50 * time.Microsecond) {
		if got = benchStats(b, mnt).Live.Leases; got == n {
			return
		}
	}
	b.Fatalf("%d leases on the source, want %d", got, n)
}

// BenchmarkImportCache measures a 64 KiB copy_to between two daemons of one
// host on the IPC path when the destination daemon already holds the
// source's allocation open (hit) and when it must open it (miss: a fresh
// tensor every iteration). Both variants create and unlink a tensor per
// iteration, untimed, so only the copy is timed; the hit variant copies it
// once first, untimed.
func BenchmarkImportCache(b *testing.B) {
	ds := sameHost(b, []string{"a", "b"})
	a, d := ds["a"], ds["b"]
	data := fill(64<<10, 2)
	src := a.path("t")
	for _, hit := range []bool{true, false} {
		name := "miss"
		if hit {
			name = "hit"
		}
		b.Run(name, func(b *testing.B) {
			before := benchStats(b, d.mnt).Imports
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				mustNo(b, os.WriteFile(src, data, 0o644))
				if hit {
					mustNo(b, unix.Setxattr(src, xattrs.CopyTo, []byte("b:/t"), 0))
				}
				b.StartTimer()
				mustNo(b, unix.Setxattr(src, xattrs.CopyTo, []byte("b:/t"), 0))
				b.StopTimer()
				mustNo(b, unix.Unlink(src))
				b.StartTimer()
			}
			b.StopTimer()
			after := benchStats(b, d.mnt).Imports
			hits, misses := after.Hits-before.Hits, after.Misses-before.Misses
			if hit && hits != int64(b.N) || !hit && misses != int64(b.N) {
				b.Fatalf("%s: %d hits, %d misses in %d copies", name, hits, misses, b.N)
			}
		})
	}
	os.Remove(d.path("t"))
}
