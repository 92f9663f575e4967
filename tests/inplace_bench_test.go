package tests

// Benchmarks of in-place copies (DESIGN.md "In-place copies"), each next to
// its floor measured in the same benchmark, reported as a ratio:
//
//   - BenchmarkInPlace4K: the p50 of a 4 KiB copy_to into a range of an
//     existing tensor on a peer, on the IPC path (one host id) and the TCP
//     path (two), against the floor: a setxattr round trip on the mount
//     (an ordinary user.* attribute), plus a small request and reply on an
//     open loopback TCP connection, plus the 4 KiB copy (memmove here; on a
//     GPU the device copy, measured by the caller: scripts/gpu-inplace.sh);
//     and the same 1000 copies by fsetxattr on the source's open fd, as a
//     client holding it open makes them, against the floor with its
//     setxattr on that fd ("fd-p50-us", "fd-x-floor": one FUSE request
//     each, where a path costs a LOOKUP too).
//   - BenchmarkInPlaceScatter1000x8K: one copy_to of 1000 lines, each 8 KiB
//     of one tensor into a scattered block of a tensor on the peer: µs per
//     descriptor, and on TCP the ratio to raw TCP moving the same 8 MiB
//     with the same streams into a reused buffer.
//   - BenchmarkInPlaceBig: 512 MiB ($INPLACE_BIG_MB, at most 1024) in place
//     over TCP against raw TCP into a reused buffer with the same streams;
//     and on the IPC path (on a GPU against a raw device-to-device copy
//     from an IPC-opened pointer, measured by scripts/gpu_floor.py).
//
// The daemons run on host memory unless $TENSORFS_TEST_DEVICE names a GPU
// (the device's run: scripts/gpu-check.sh).

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorfs/tensorfs/xattrs"
	"golang.org/x/sys/unix"
)

// inPlaceBenchPair starts daemons a and b that know each other, on one
// host id (the IPC path) or two (TCP).
func inPlaceBenchPair(b *testing.B, sameHost bool) (a, d *daemon) {
	b.Helper()
	if sameHost {
		return inPlaceBenchPairOn(b, copyPath{name: "ipc", path: "ipc"})
	}
	return inPlaceBenchPairOn(b, copyPath{name: "tcp", path: "tcp"})
}

// benchPaths are the paths the in-place benchmarks run on: copyPaths
// (ucx-tcp, ucx-sm and ucx-tcp-emulated in a build with UCX), and
// "tcp-crc32c", "tcp" with --checksum crc32c on both daemons: the check
// of releases before XXH3, measured beside it in the same run.
func benchPaths() []copyPath {
	return append(copyPaths(true), copyPath{name: "tcp-crc32c", path: "tcp", sum: "crc32c"})
}

// inPlaceBenchPairOn is inPlaceBenchPair on path p (copyPath: its UCX_TLS
// and --transport).
func inPlaceBenchPairOn(b *testing.B, p copyPath) (a, d *daemon) {
	b.Helper()
	sameHost := p.path == "ipc"
	extra := p.flags(b)
	secret := filepath.Join(b.TempDir(), "secret")
	mustNo(b, os.WriteFile(secret, []byte("a shared secret of enough bytes\n"), 0o600))
	ports := map[string]int{}
	for _, n := range []string{"a", "b"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		mustNo(b, err)
		ports[n] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	// Host memory unless the run names a device (--device auto would take
	// a GPU where there is one).
	var dev []string
	if os.Getenv("TENSORFS_TEST_DEVICE") == "" {
		dev = []string{"--device", "host"}
	}
	// $INPLACE_SPIN sets both daemons' --spin (default: theirs), so that
	// one run can measure the copies with and without spinning reads.
	if v := os.Getenv("INPLACE_SPIN"); v != "" {
		dev = append(dev, "--spin", v)
	}
	ds := map[string]*daemon{}
	for _, n := range []string{"a", "b"} {
		host := "bench-host"
		if !sameHost {
			host += "-" + n
		}
		o := map[string]string{"a": "b", "b": "a"}[n]
		ds[n] = peerBenchStart(b, append(append(dev, "--name", n, "--listen", fmt.Sprintf("127.0.0.1:%d", ports[n]), "--secret-file", secret,
			"--host-id", host, "--timeout", "30s", "--streams", strconv.Itoa(peerBenchStreams(b)),
			"--peer", fmt.Sprintf("%s=127.0.0.1:%d", o, ports[o])), extra...)...)
	}
	// Before the daemons' clean-ups (clean-ups run last in, first out):
	// both daemons' tensors go first, so that each drops its imports of
	// the other's (b's of a's sources, a's of the destinations b bound to
	// it: the IPC path) before it is checked idle.
	b.Cleanup(func() {
		for _, n := range []string{"b", "a"} {
			ents, _ := os.ReadDir(ds[n].mnt)
			for _, e := range ents {
				os.RemoveAll(filepath.Join(ds[n].mnt, e.Name()))
			}
		}
		waitTensorfsIdle(b, ds["a"].mnt)
	})
	return ds["a"], ds["b"]
}

// p50 is the median of lat, in µs.
func p50(lat []time.Duration) float64 {
	slices.Sort(lat)
	return float64(lat[len(lat)/2]) / 1e3
}

// rawP50 is the p50, in µs, of rounds raw TCP transfers of data into the
// reused buffer buf with the daemons' streams (peerBenchRawStreams): the
// floor of a large or many-descriptor copy over TCP.
func rawP50(b *testing.B, data, buf []byte, rounds int) float64 {
	send, got := peerBenchRawStreams(b, peerBenchStreams(b), func(int) []byte { return buf })
	raw := make([]time.Duration, 0, rounds)
	for range rounds {
		t := time.Now()
		send(data)
		<-got
		raw = append(raw, time.Since(t))
	}
	return p50(raw)
}

// smallFloor measures the parts of the small-copy floor, in µs (p50 of n
// each): a setxattr round trip on mount mnt, a 64-byte request and 16-byte
// reply on an open loopback connection, a 4 KiB memmove.
func smallFloor(b *testing.B, mnt string, n int) (setxattr, reqReply, move float64) {
	f := filepath.Join(mnt, "floor")
	mustNo(b, os.WriteFile(f, nil, 0o644))
	defer os.Remove(f)
	setxattr = setxattrP50(b, f, n, 0)
	lat := make([]time.Duration, 0, n)
	c := peerBenchRawPeer(b, func(c net.Conn) error {
		req, reply := make([]byte, 64), make([]byte, 16)
		for {
			if _, err := io.ReadFull(c, req); err != nil {
				return err
			}
			if _, err := c.Write(reply); err != nil {
				return err
			}
		}
	})
	req, reply := make([]byte, 64), make([]byte, 16)
	lat = lat[:0]
	for range n {
		t := time.Now()
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	reqReply = p50(lat)
	src, dst := make([]byte, 4096), make([]byte, 1<<20)
	lat = lat[:0]
	for i := range n {
		t := time.Now()
		copy(dst[(i%256)*4096:], src)
		lat = append(lat, time.Since(t))
	}
	return setxattr, reqReply, p50(lat)
}

// idleSetxattr is the p50 of n setxattr round trips on mount mnt, in µs,
// back to back (hot) and each after the caller and the mount have been
// idle for idle (cold): what the FUSE part of a copy that keeps them
// waiting that long costs. The difference is what waking sleeping
// processes adds (on the H200 host, a KVM guest, its vCPUs halt).
func idleSetxattr(b *testing.B, mnt string, n int, idle time.Duration) (hot, cold float64) {
	f := filepath.Join(mnt, "idle-floor")
	mustNo(b, os.WriteFile(f, nil, 0o644))
	defer os.Remove(f)
	return setxattrP50(b, f, n, 0), setxattrP50(b, f, n, idle)
}

// setxattrP50 is the p50 of n setxattr round trips of an ordinary user.*
// attribute on file f, in µs, each after a sleep of idle (none for 0).
func setxattrP50(b *testing.B, f string, n int, idle time.Duration) float64 {
	lat := make([]time.Duration, 0, n)
	for range n {
		if idle > 0 {
			time.Sleep(idle)
		}
		t := time.Now()
		mustNo(b, unix.Setxattr(f, "user.bench", []byte("0123"), 0))
		lat = append(lat, time.Since(t))
	}
	return p50(lat)
}

// echoPeerEnv, set, makes the test binary an echo peer (echoPeer) instead
// of running tests: the other process of crossProcessFloor.
const echoPeerEnv = "TENSORFS_TEST_ECHO_PEER"

// echoPeer listens on a loopback port, prints its address, and answers
// every 64-byte request with 16 bytes until the connection ends.
func echoPeer() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		return 1
	}
	req, reply := make([]byte, 64), make([]byte, 16)
	for {
		if _, err := io.ReadFull(c, req); err != nil {
			return 0
		}
		if _, err := c.Write(reply); err != nil {
			return 0
		}
	}
}

// crossProcessFloor is the small-copy floor with its request and reply
// going to another process, as a copy's do (the floor of the issue keeps
// both ends in this process): the p50, in µs, of n rounds of a setxattr on
// mnt then a 64-byte request and 16-byte reply with an echo process. Each
// round wakes a sleeping process four times, as a copy does (the client,
// the daemon, the peer, the daemon); on a VM whose idle vCPUs are slow to
// wake this is far above the sum of the parts measured hot (2026-12-02:
// a cross-process request/reply took 7 µs back to back and 122 µs with
// 200 µs of idle between rounds).
func crossProcessFloor(b *testing.B, mnt string, n int) float64 {
	f := filepath.Join(mnt, "xfloor")
	mustNo(b, os.WriteFile(f, nil, 0o644))
	defer os.Remove(f)
	self, err := os.Executable()
	mustNo(b, err)
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), echoPeerEnv+"=1")
	out, err := cmd.StdoutPipe()
	mustNo(b, err)
	mustNo(b, cmd.Start())
	defer cmd.Wait()
	var addr string
	if _, err := fmt.Fscan(out, &addr); err != nil {
		cmd.Process.Kill()
		b.Fatalf("echo peer: %v", err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		cmd.Process.Kill()
		b.Fatal(err)
	}
	defer c.Close()
	req, reply := make([]byte, 64), make([]byte, 16)
	lat := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		mustNo(b, unix.Setxattr(f, "user.bench", []byte("0123"), 0))
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	return p50(lat)
}

// BenchmarkInPlace4K: per op, 1000 copy_to of a 4 KiB tensor into a range
// of a 1 MiB tensor on the peer, each timed; reported as the p50 ("p50-us"),
// the floor measured right after ("floor-us", and its parts), and their
// ratio ("x-floor"; goal: at most 2 on the IPC path, 2.5 on TCP); and the
// same floor with its request/reply to another process (crossProcessFloor:
// "xfloor-us", "x-xfloor"), which shows what waking the processes costs on
// the machine of the run.
func BenchmarkInPlace4K(b *testing.B) {
	for _, cp := range benchPaths() {
		path := cp.path
		b.Run(cp.name, func(b *testing.B) {
			a, d := inPlaceBenchPairOn(b, cp)
			data := make([]byte, 4096)
			rand.NewChaCha8([32]byte{4}).Read(data)
			mustNo(b, os.WriteFile(a.path("small"), data, 0o644))
			mustNo(b, os.WriteFile(d.path("cache"), nil, 0o644))
			mustNo(b, os.Truncate(d.path("cache"), 1<<20))
			peerBenchCopyTo(b, a.path("small"), "b:/cache@0")
			var lat []time.Duration
			for b.Loop() {
				for i := range 1000 {
					t := time.Now()
					peerBenchCopyTo(b, a.path("small"), fmt.Sprintf("b:/cache@%d", (i%256)*4096))
					lat = append(lat, time.Since(t))
				}
			}
			got := make([]byte, 4096)
			f, err := os.Open(d.path("cache"))
			mustNo(b, err)
			_, err = f.ReadAt(got, 4096)
			f.Close()
			mustNo(b, err)
			if !bytes.Equal(got, data) {
				b.Fatal("the destination range differs from the source")
			}
			st := a.stats()
			if ofPath(st.Copies.InPlace, path) != int64(len(lat)+1) {
				b.Fatalf("copies %+v, want %d in place", st.Copies, len(lat)+1)
			}
			reportPhases(b, d.mnt, 16)
			reportTook(b, a.mnt, 16, "src-us")
			tf := p50(lat)
			sx, rr, mv := smallFloor(b, a.mnt, 1000)
			floor := sx + rr + mv
			b.ReportMetric(tf, "p50-us")
			b.ReportMetric(sx, "setxattr-us")
			b.ReportMetric(rr, "reqreply-us")
			b.ReportMetric(mv, "copy-us")
			b.ReportMetric(floor, "floor-us")
			b.ReportMetric(tf/floor, "x-floor")
			xf := crossProcessFloor(b, a.mnt, 1000)
			b.ReportMetric(xf, "xfloor-us")
			b.ReportMetric(tf/xf, "x-xfloor")
			// A client that holds the source open (a KV engine pushing
			// from its staging tensor) sets the xattr on its fd: no
			// LOOKUP, so one FUSE request where a path costs two. The
			// same copies and the floor's setxattr, that way.
			src, err := os.Open(a.path("small"))
			mustNo(b, err)
			defer src.Close()
			fd := int(src.Fd())
			var fdLat []time.Duration
			for i := range 1000 {
				t := time.Now()
				if err := unix.Fsetxattr(fd, xattrs.CopyTo, fmt.Appendf(nil, "b:/cache@%d", (i%256)*4096), 0); err != nil {
					b.Fatalf("fsetxattr copy_to: %v", err)
				}
				fdLat = append(fdLat, time.Since(t))
			}
			fdSx := make([]time.Duration, 0, 1000)
			for range 1000 {
				t := time.Now()
				mustNo(b, unix.Fsetxattr(fd, "user.bench", []byte("0123"), 0))
				fdSx = append(fdSx, time.Since(t))
			}
			fdFloor := p50(fdSx) + rr + mv
			b.ReportMetric(p50(fdLat), "fd-p50-us")
			b.ReportMetric(p50(fdSx), "fd-setxattr-us")
			b.ReportMetric(p50(fdLat)/fdFloor, "fd-x-floor")
		})
	}
}

// BenchmarkInPlaceScatter1000x8K: per op, one copy_to of 1000 lines moving
// 8 KiB blocks of an 8 MiB tensor into a shuffled set of blocks of a 16 MiB
// tensor on the peer; reported as µs per call and per descriptor, and on
// TCP the MB/s against raw TCP moving the same 8 MiB with the same streams
// into a reused buffer ("x-raw"; goal at least 0.8).
//
// $INPLACE_BLOCK sets another block size (bytes, at most 1 MiB): with a
// few bytes the copy is next to nothing, and a profile shows the
// per-descriptor costs alone. Each path runs twice: the text lines, and
// ("-binary") the same descriptors as a binary range list.
func BenchmarkInPlaceScatter1000x8K(b *testing.B) {
	const n = 1000
	blk := 8 << 10
	if v := os.Getenv("INPLACE_BLOCK"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 1 || k > 1<<20 {
			b.Fatalf("INPLACE_BLOCK=%q: want 1 to 1048576", v)
		}
		blk = k
	}
	for _, cp := range benchPaths() {
		for _, binary := range []bool{false, true} {
			name := cp.name
			if binary {
				name += "-binary"
			}
			benchScatter(b, name, cp, n, blk, binary)
		}
	}
}

// benchScatter is BenchmarkInPlaceScatter1000x8K on path cp, its value the
// text lines or (binary) the binary range list of the same descriptors.
func benchScatter(b *testing.B, name string, cp copyPath, n, blk int, binary bool) {
	path := cp.path
	b.Run(name, func(b *testing.B) {
		a, d := inPlaceBenchPairOn(b, cp)
		data := make([]byte, n*blk)
		rand.NewChaCha8([32]byte{5}).Read(data)
		mustNo(b, os.WriteFile(a.path("blocks"), data, 0o644))
		mustNo(b, os.WriteFile(d.path("cache"), nil, 0o644))
		mustNo(b, os.Truncate(d.path("cache"), int64(2*n*blk)))
		perm := rand.New(rand.NewPCG(1, 2)).Perm(2 * n)[:n]
		var lines []string
		rec := binRec{line: "b:/cache"}
		for i, j := range perm {
			lines = append(lines, fmt.Sprintf("@%d+%d b:/cache@%d", i*blk, blk, j*blk))
			rec.descs = append(rec.descs, [3]int64{int64(i * blk), int64(j * blk), int64(blk)})
		}
		value := strings.Join(lines, "\n")
		if binary {
			value = binValue(rec)
		}
		peerBenchCopyTo(b, a.path("blocks"), value)
		// The value as the bytes a client keeps (a 25 KB conversion
		// per call was the benchmark's, not the copy's).
		src, v := a.path("blocks"), []byte(value)
		var lat []time.Duration
		for b.Loop() {
			t := time.Now()
			if err := unix.Setxattr(src, xattrs.CopyTo, v, 0); err != nil {
				b.Fatalf("setxattr %s: %v", src, err)
			}
			lat = append(lat, time.Since(t))
		}
		f, err := os.Open(d.path("cache"))
		mustNo(b, err)
		got := make([]byte, blk)
		for _, i := range []int{0, n / 2, n - 1} {
			_, err := f.ReadAt(got, int64(perm[i]*blk))
			mustNo(b, err)
			if !bytes.Equal(got, data[i*blk:(i+1)*blk]) {
				b.Fatalf("block %d differs", i)
			}
		}
		f.Close()
		reportPhases(b, d.mnt, 16)
		reportTook(b, a.mnt, 16, "src-us")
		tf := p50(lat)
		b.ReportMetric(tf, "p50-us")
		b.ReportMetric(tf/float64(n), "us/desc")
		if path != "ipc" {
			r := rawP50(b, data, make([]byte, n*blk), max(len(lat), 20))
			b.ReportMetric(r, "raw-p50-us")
			b.ReportMetric(r/tf, "x-raw")
		}
	})
}

// BenchmarkInPlaceBig: per op, one copy_to of $INPLACE_BIG_MB MiB (default
// 512) in place into an existing tensor on the peer; on TCP against raw TCP
// into a reused buffer with the same streams ("x-raw"; goal at least 0.9);
// on the IPC path with the setxattr round trip back to back and after an
// idle of three quarters of the copy ("setxattr-us", "idle-setxattr-us"),
// and on host memory against a memmove of the size, split as the daemons
// split it ("x-raw", memmoveP50).
func BenchmarkInPlaceBig(b *testing.B) {
	size := 512 << 20
	if v := os.Getenv("INPLACE_BIG_MB"); v != "" {
		mb, err := strconv.Atoi(v)
		if err != nil || mb < 1 || mb > 1024 {
			b.Fatalf("INPLACE_BIG_MB=%q: want 1 to 1024", v)
		}
		size = mb << 20
	}
	for _, cp := range benchPaths() {
		path := cp.path
		b.Run(cp.name, func(b *testing.B) {
			a, d := inPlaceBenchPairOn(b, cp)
			data := peerBenchBigData()[:size]
			peerBenchWriteFile(b, a.path("big"), data)
			mustNo(b, os.WriteFile(d.path("dst"), nil, 0o644))
			mustNo(b, os.Truncate(d.path("dst"), int64(size)))
			peerBenchCopyTo(b, a.path("big"), "b:/dst@0")
			var lat []time.Duration
			for b.Loop() {
				t := time.Now()
				peerBenchCopyTo(b, a.path("big"), "b:/dst@0")
				lat = append(lat, time.Since(t))
			}
			peerBenchCheckFile(b, d.path("dst"), data, false)
			reportPhases(b, d.mnt, 16)
			reportTook(b, a.mnt, 16, "src-us")
			tf := p50(lat)
			b.ReportMetric(float64(size)/tf, "MB/s")
			b.ReportMetric(tf, "p50-us")
			if path == "ipc" {
				// The copy keeps the caller and both daemons waiting
				// for most of its p50: the setxattr part of its floor
				// after as long an idle, next to the back-to-back one.
				hot, cold := idleSetxattr(b, a.mnt, 200, time.Duration(tf*750)*time.Nanosecond)
				b.ReportMetric(hot, "setxattr-us")
				b.ReportMetric(cold, "idle-setxattr-us")
				if os.Getenv("TENSORFS_TEST_DEVICE") == "" {
					// Host memory: the floor is a memmove of the
					// size in this process (on a GPU,
					// scripts/gpu_floor.py's copy from an
					// IPC-opened pointer).
					r := memmoveP50(size, max(len(lat), 3))
					b.ReportMetric(float64(size)/r, "raw-MB/s")
					b.ReportMetric(r/tf, "x-raw")
				}
			}
			if path != "ipc" {
				buf := make([]byte, size)
				for i := 0; i < size; i += 4096 {
					buf[i] = 1
				}
				r := rawP50(b, data, buf, max(len(lat), 3))
				b.ReportMetric(float64(size)/r, "raw-MB/s")
				b.ReportMetric(r/tf, "x-raw")
			}
		})
	}
}

// sweepSizes are BenchmarkInPlaceSweep's sizes: $INPLACE_SWEEP (sizes in
// bytes with an optional K, M or G suffix, binary, comma-separated; at
// most 1 GiB each), else 4K to 256M by factors of 16.
func sweepSizes(b *testing.B) []int {
	v := os.Getenv("INPLACE_SWEEP")
	if v == "" {
		v = "4K,64K,1M,16M,256M"
	}
	var sizes []int
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		mul := 1
		if k := strings.IndexAny(f, "KMG"); k == len(f)-1 && k > 0 {
			mul = map[byte]int{'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}[f[k]]
			f = f[:k]
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n*mul > peerBigSize {
			b.Fatalf("INPLACE_SWEEP=%q: %q is not a size from 1 byte to 1G", v, f)
		}
		sizes = append(sizes, n*mul)
	}
	return sizes
}

// sizeName is a sweep point's sub-benchmark name: 4K, 64K, 1M, 256M.
func sizeName(n int) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.Itoa(n)
}

// BenchmarkInPlaceSweep: in-place copy_to of one range of each size of
// sweepSizes into an existing tensor on the peer, on the IPC path and the
// TCP path, each point next to its floor measured right after it in the
// same process: on IPC a setxattr round trip plus a request/reply on an
// open loopback connection plus a memmove of the size between two buffers
// of this process; on TCP a setxattr round trip plus raw TCP moving the
// size with the daemons' streams into a reused buffer. Reported per point:
// "p50-us" and "floor-us", "MB/s" and "floor-MB/s" (size / p50), and
// "x-floor" (floor-us / p50-us: a throughput ratio, 1 at the floor). The
// curve scripts/bench.sh plots. Per op, as many timed copies as make about
// 256 MiB (at least 3, at most 200).
func BenchmarkInPlaceSweep(b *testing.B) {
	sizes := sweepSizes(b)
	for _, path := range []string{"ipc", "tcp"} {
		b.Run(path, func(b *testing.B) {
			a, d := inPlaceBenchPair(b, path == "ipc")
			for _, size := range sizes {
				b.Run(sizeName(size), func(b *testing.B) {
					data := peerBenchBigData()[:size]
					src, dst := fmt.Sprintf("src-%d", size), fmt.Sprintf("dst-%d", size)
					peerBenchWriteFile(b, a.path(src), data)
					mustNo(b, os.WriteFile(d.path(dst), nil, 0o644))
					mustNo(b, os.Truncate(d.path(dst), int64(size)))
					defer os.Remove(a.path(src))
					defer os.Remove(d.path(dst))
					target := "b:/" + dst + "@0"
					peerBenchCopyTo(b, a.path(src), target)
					k := min(200, max(3, (256<<20)/size))
					var lat []time.Duration
					for b.Loop() {
						for range k {
							t := time.Now()
							peerBenchCopyTo(b, a.path(src), target)
							lat = append(lat, time.Since(t))
						}
					}
					peerBenchCheckFile(b, d.path(dst), data, size <= 16<<20)
					tf := p50(lat)
					sx := setxattrP50(b, a.path(src), 200, 0)
					var floor float64
					if path == "ipc" {
						_, rr, _ := smallFloor(b, a.mnt, 200)
						floor = sx + rr + memmoveP50(size, len(lat))
					} else {
						buf := make([]byte, size)
						floor = sx + rawP50(b, data, buf, len(lat))
					}
					b.ReportMetric(tf, "p50-us")
					b.ReportMetric(floor, "floor-us")
					b.ReportMetric(float64(size)/tf, "MB/s")
					b.ReportMetric(float64(size)/floor, "floor-MB/s")
					b.ReportMetric(floor/tf, "x-floor")
				})
			}
		})
	}
}

// memmoveP50 is the p50, in µs, of n copies of size bytes between two
// buffers of this process, both touched first (no page faults timed),
// split the way the daemons' host batches split a copy (gpu/batch.go: up
// to 8 goroutines, each at least 1 MiB, at most GOMAXPROCS): the floor is
// what this machine's memory moves with the parallelism tensorfs uses, not
// one core's memmove, which the daemons beat by 3x on the H200 host.
func memmoveP50(size, n int) float64 {
	src, dst := peerBenchBigData()[:size], make([]byte, size)
	copy(dst, src)
	w := max(1, min(size/(1<<20), runtime.GOMAXPROCS(0), 8))
	part := (size + w - 1) / w
	lat := make([]time.Duration, 0, n)
	var wg sync.WaitGroup
	for range n {
		t := time.Now()
		if w == 1 {
			copy(dst, src) // as the daemons do: no goroutine below 2 MiB
		} else {
			for i := 0; i < size; i += part {
				wg.Go(func() { copy(dst[i:min(i+part, size)], src[i:]) })
			}
			wg.Wait()
		}
		lat = append(lat, time.Since(t))
	}
	return p50(lat)
}

// BenchmarkInPlacePullLayers: per op, one batch on the root pulling the 16
// blocks of 8 KiB of one request from each of 32 layer tensors on the peer
// into shuffled blocks of 32 cache tensors here (512 lines, the decode
// side of disaggregated serving reading a prefill's KV cache), p50 per
// call ("p50-us"), against the same blocks pulled by 32 copy_from calls of
// one layer each ("layer-calls-us", measured right after), reported as
// their ratio ("x-layer-calls": what one call for every layer saves).
func BenchmarkInPlacePullLayers(b *testing.B) {
	const layers, n, blk = 32, 16, 8 << 10
	for _, path := range []string{"ipc", "tcp"} {
		b.Run(path, func(b *testing.B) {
			a, d := inPlaceBenchPair(b, path == "ipc")
			// The peer's tensors go before the pair's clean-up checks a
			// idle: a imports them (the IPC path) until they are freed.
			b.Cleanup(func() { os.RemoveAll(d.path("kv")) })
			mustNo(b, os.Mkdir(d.path("kv"), 0o755))
			mustNo(b, os.Mkdir(a.path("cache"), 0o755))
			data := make([]byte, 4*n*blk)
			rand.NewChaCha8([32]byte{6}).Read(data)
			for l := range layers {
				mustNo(b, os.WriteFile(d.path(fmt.Sprintf("kv/l%d", l)), data, 0o644))
				mustNo(b, os.WriteFile(a.path(fmt.Sprintf("cache/l%d", l)), nil, 0o644))
				mustNo(b, os.Truncate(a.path(fmt.Sprintf("cache/l%d", l)), int64(8*n*blk)))
			}
			perm := rand.New(rand.NewPCG(3, 4)).Perm(8 * n)[:n]
			var lines []string
			perLayer := make([]string, layers)
			for l := range layers {
				var ll []string
				for i, j := range perm {
					lines = append(lines, fmt.Sprintf("b:/kv/l%d@%d+%d /cache/l%d@%d", l, i*blk, blk, l, j*blk))
					ll = append(ll, fmt.Sprintf("b:/kv/l%d@%d+%d @%d", l, i*blk, blk, j*blk))
				}
				perLayer[l] = strings.Join(ll, "\n")
			}
			value := []byte(strings.Join(lines, "\n"))
			batch := func() {
				if err := unix.Setxattr(a.mnt, xattrs.Batch, value, 0); err != nil {
					b.Fatalf("batch of %d lines: %v", len(lines), err)
				}
			}
			batch()
			var lat []time.Duration
			for b.Loop() {
				t := time.Now()
				batch()
				lat = append(lat, time.Since(t))
			}
			got := make([]byte, blk)
			for _, l := range []int{0, layers - 1} {
				f, err := os.Open(a.path(fmt.Sprintf("cache/l%d", l)))
				mustNo(b, err)
				_, err = f.ReadAt(got, int64(perm[n-1]*blk))
				f.Close()
				mustNo(b, err)
				if !bytes.Equal(got, data[(n-1)*blk:n*blk]) {
					b.Fatalf("layer %d: block %d differs", l, n-1)
				}
			}
			calls := make([]time.Duration, 0, len(lat))
			for range len(lat) {
				t := time.Now()
				for l := range layers {
					if err := unix.Setxattr(a.path(fmt.Sprintf("cache/l%d", l)), xattrs.CopyFrom, []byte(perLayer[l]), 0); err != nil {
						b.Fatalf("copy_from of layer %d: %v", l, err)
					}
				}
				calls = append(calls, time.Since(t))
			}
			tf, lc := p50(lat), p50(calls)
			b.ReportMetric(tf, "p50-us")
			b.ReportMetric(tf/(layers*n), "us/desc")
			b.ReportMetric(lc, "layer-calls-us")
			b.ReportMetric(lc/tf, "x-layer-calls")
		})
	}
}
