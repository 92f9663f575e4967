package tests

// Benchmarks of peer copies (copy_to through setxattr, pushed over TCP
// loopback from one real daemon to another), each next to a raw Go TCP
// baseline measured in the same run:
//
//   - BenchmarkPeerCopy1G: a 1 GiB host tensor of random bytes pushed to a
//     peer, into a new destination and over an existing one of the same size,
//     against raw TCP streams of 1 GiB into a freshly allocated buffer and
//     into a reused one (as many streams as the daemons use: --streams, set
//     by $PEERBENCH_STREAMS, default transfer.DefaultStreams).
//   - BenchmarkPeerTree1000x64K: 1000 tensors of 64 KiB as one directory
//     copy_to, against one copy_to per file, over existing destinations and
//     into new ones.
//   - BenchmarkPeerSmallCopy4K: the round trip of a 4 KiB copy_to (p50, p99),
//     against a 4 KiB request and its reply on an open TCP connection.
//
// The daemons are the real binary (`tensorfs mount --device host` with
// --listen, --peer, --secret-file and distinct --host-id, so the TCP path is
// taken, as in peers_test.go's cluster). scripts/bench.sh runs these and
// prints the ratios; docs/performance.md has the floors and
// the latest figures; bench/history.md ("Peer copies") how they were found.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/transfer"
	"github.com/tensorfs/tensorfs/xattrs"
)

const (
	// peerBigSize is the tensor of BenchmarkPeerCopy1G.
	peerBigSize = 1 << 30
	// peerTreeN and peerTreeSize make the tree of BenchmarkPeerTree1000x64K.
	peerTreeN    = 1000
	peerTreeSize = 64 << 10
	// peerSmallSize is the tensor of BenchmarkPeerSmallCopy4K, and
	// peerSmallCopies the copies timed one by one per benchmark op.
	peerSmallSize   = 4 << 10
	peerSmallCopies = 1000
	// peerIOSize is the size of the pwrites and preads that fill and check
	// tensors through the mount.
	peerIOSize = 1 << 20
)

// BenchmarkPeerCopy1G: per op, one copy of a 1 GiB host tensor of random
// bytes to a peer (setxattr user.tensorfs.copy_to "b:/dst" on daemon a's
// mount; it returns when b has put the tensor in place), or the same 1 GiB
// over raw TCP from one buffer of this process to another, in as many
// contiguous parts on as many connections as the daemons' streams
// (peerBenchRawStreams), acknowledged by the receiver with 8 bytes.
// Reported as MB/s.
//
//   - tensorfs-new: the destination does not exist (it is unlinked, untimed,
//     after each copy, and b's memory waited back to zero).
//   - raw-new: the receiver receives into a make([]byte) of 1 GiB made for
//     this transfer (inside the timed region; the previous one is collected
//     and returned to the OS, untimed, in between).
//   - tensorfs-existing: the destination exists, a 1 GiB tensor from the
//     previous copy (two untimed copies come first).
//   - raw-existing: the receiver reuses one 1 GiB buffer, touched beforehand.
//
// Each variant starts with an untimed warm-up transfer. On these VMs,
// touching memory the guest has not used lately costs 1-1.7 s per GiB
// against about 0.5 s for memory freed a moment ago, so without it a
// variant's first copy would measure the VM's memory state: after the
// warm-up, every fresh GiB (b's new tensor, the raw receiver's make) is
// memory its process has just freed.
func BenchmarkPeerCopy1G(b *testing.B) {
	data := peerBenchBigData()
	b.Run("tensorfs-new", func(b *testing.B) {
		a, d := peerBenchPair(b)
		src := a.path("src")
		peerBenchWriteFile(b, src, data)
		dst := d.path("dst")
		newCopy := func() {
			peerBenchCopyTo(b, src, "b:/dst")
		}
		removeDst := func() {
			mustNo(b, os.Remove(dst))
			d.waitLiveBytes(0)
		}
		newCopy() // warm-up: b's next 1 GiB is memory it just freed
		peerBenchCheckFile(b, dst, data, true)
		removeDst()
		b.SetBytes(peerBigSize)
		copies := 1
		for b.Loop() {
			newCopy()
			copies++
			b.StopTimer()
			peerBenchCheckFile(b, dst, data, false)
			removeDst()
			b.StartTimer()
		}
		b.StopTimer()
		reportPhases(b, d.mnt, b.N)
		a.requireTCPCopies(copies)
	})
	b.Run("raw-new", func(b *testing.B) {
		send, got := peerBenchRawStreams(b, peerBenchStreams(b), func(n int) []byte {
			return make([]byte, n) // fresh memory, touched by the receive
		})
		release := func() {
			runtime.GC()
			debug.FreeOSMemory()
		}
		send(data) // warm-up, as tensorfs-new's
		if !bytes.Equal(<-got, data) {
			b.Fatal("raw streams: the received bytes differ from the sent ones")
		}
		release()
		b.SetBytes(peerBigSize)
		for b.Loop() {
			send(data)
			b.StopTimer()
			<-got
			release()
			b.StartTimer()
		}
	})
	b.Run("tensorfs-existing", func(b *testing.B) {
		a, d := peerBenchPair(b)
		src := a.path("src")
		peerBenchWriteFile(b, src, data)
		dst := d.path("dst")
		// The destination now exists; the second copy frees the first's
		// memory, which the timed ones reuse, as in a steady state.
		for range 2 {
			peerBenchCopyTo(b, src, "b:/dst")
			d.waitLiveBytes(peerBigSize)
		}
		b.SetBytes(peerBigSize)
		copies := 2
		for b.Loop() {
			peerBenchCopyTo(b, src, "b:/dst")
			copies++
			b.StopTimer()
			// The replaced tensor is freed at the rename; wait for it so
			// that every copy starts from the same state.
			d.waitLiveBytes(peerBigSize)
			b.StartTimer()
		}
		b.StopTimer()
		reportPhases(b, d.mnt, b.N)
		peerBenchCheckFile(b, dst, data, true)
		a.requireTCPCopies(copies)
	})
	b.Run("raw-existing", func(b *testing.B) {
		buf := make([]byte, peerBigSize)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1 // touched: the memory is there before the first receive
		}
		send, got := peerBenchRawStreams(b, peerBenchStreams(b), func(n int) []byte { return buf[:n] })
		b.SetBytes(peerBigSize)
		for b.Loop() {
			send(data)
			<-got
		}
		if !bytes.Equal(buf, data) {
			b.Fatal("raw streams: the received bytes differ from the sent ones")
		}
	})
}

// BenchmarkPeerTree1000x64K: per op, the same 1000 tensors of 64 KiB of
// random bytes (daemon a's /blocks/t000../t999, dtype U8, shape 65536) copied
// to peer b:
//
//   - dir: one setxattr user.tensorfs.copy_to "b:/dir" on the directory,
//     over destinations that exist from an untimed first copy (one
//     connection, one pipelined transfer, 1000 renames into place on b, one
//     IN_MOVED_TO each for watchers of b:/dir).
//   - files: 1000 setxattr user.tensorfs.copy_to "b:/files/tNNN", one per
//     file, one after the other, over existing destinations likewise.
//   - dir-new: the same directory copy_to into a directory that does not
//     exist yet, a new one per op ("b:/dir-new-N"): b builds it under a
//     temporary name and renames it into place once.
//   - files-new: the per-file copy_to into new files ("b:/files-new-N/tNNN";
//     the directory is made, untimed, before the op).
//
// The "-new" variants remove the previous op's tree untimed (b's memory
// stays bounded). Reported as tensors/s and MB/s (the tensors' bytes, 64
// MiB per op); scripts/bench.sh reports dir ÷ files and dir-new ÷
// files-new.
func BenchmarkPeerTree1000x64K(b *testing.B) {
	for _, mode := range []string{"dir", "files", "dir-new", "files-new"} {
		b.Run(mode, func(b *testing.B) {
			a, d := peerBenchPair(b)
			blocks := a.path("blocks")
			peerBenchTemplateDir(b, blocks, "U8", fmt.Sprint(peerTreeSize))
			names := make([]string, peerTreeN)
			contents := make([][]byte, peerTreeN)
			rng := rand.NewChaCha8([32]byte{2})
			for i := range names {
				names[i] = fmt.Sprintf("t%03d", i)
				contents[i] = make([]byte, peerTreeSize)
				rng.Read(contents[i])
				mustNo(b, os.WriteFile(filepath.Join(blocks, names[i]), contents[i], 0o644))
			}
			fresh := strings.HasSuffix(mode, "-new")
			perFile := strings.HasPrefix(mode, "files")
			ops := 0
			dstDir := "" // the last op's destination directory on b
			// prepare readies op ops+1's destination (untimed) and returns it.
			prepare := func() string {
				dst := "/" + mode
				if fresh {
					if dstDir != "" {
						mustNo(b, os.RemoveAll(dstDir))
					}
					dst = fmt.Sprintf("/%s-%d", mode, ops+1)
				}
				if perFile && (fresh || ops == 0) {
					mustNo(b, os.Mkdir(d.path(dst[1:]), 0o755))
				}
				return dst
			}
			once := func(dst string) {
				if !perFile {
					peerBenchCopyTo(b, blocks, "b:"+dst)
				} else {
					for _, n := range names {
						peerBenchCopyTo(b, filepath.Join(blocks, n), "b:"+dst+"/"+n)
					}
				}
				dstDir = d.path(dst[1:])
				ops++
			}
			if !fresh {
				once(prepare()) // the destinations now exist
			}
			b.SetBytes(peerTreeN * peerTreeSize)
			for b.Loop() {
				b.StopTimer()
				dst := prepare()
				b.StartTimer()
				once(dst)
			}
			b.ReportMetric(float64(peerTreeN)*float64(b.N)/b.Elapsed().Seconds(), "tensors/s")
			if perFile {
				reportPhases(b, d.mnt, 16) // per file: the last ones stats keeps
			} else {
				reportPhases(b, d.mnt, b.N) // per directory copy
			}
			ents, err := os.ReadDir(dstDir)
			mustNo(b, err)
			if len(ents) != peerTreeN {
				b.Fatalf("%s holds %d entries, want %d", dstDir, len(ents), peerTreeN)
			}
			for _, i := range []int{0, 1, 517, peerTreeN - 1} {
				got, err := os.ReadFile(filepath.Join(dstDir, names[i]))
				mustNo(b, err)
				if !bytes.Equal(got, contents[i]) {
					b.Fatalf("%s/%s differs from its source", dstDir, names[i])
				}
			}
			if perFile {
				a.requireTCPCopies(ops * peerTreeN)
			} else {
				a.requireTCPCopies(ops)
			}
		})
	}
}

// BenchmarkPeerSmallCopy4K: per op, peerSmallCopies round trips, each timed
// on its own; reported as the p50 and p99 of all of them, in µs ("p50-us",
// "p99-us"), and their mean ("us/copy").
//
//   - tensorfs: setxattr user.tensorfs.copy_to "b:/small" of a 4 KiB tensor
//     of random bytes over an existing destination (one untimed copy first):
//     a's FUSE request, a new authenticated connection to b, the 4 KiB and
//     b's reply once the tensor is renamed into place.
//   - raw: 4 KiB written on an open TCP connection (no Nagle delay: Go sets
//     TCP_NODELAY) and an 8-byte reply read back.
func BenchmarkPeerSmallCopy4K(b *testing.B) {
	data := make([]byte, peerSmallSize)
	rand.NewChaCha8([32]byte{3}).Read(data)
	b.Run("tensorfs", func(b *testing.B) {
		a, d := peerBenchPair(b)
		src := a.path("small")
		mustNo(b, os.WriteFile(src, data, 0o644))
		peerBenchCopyTo(b, src, "b:/small")
		lat := make([]time.Duration, 0, peerSmallCopies)
		copies := 1
		for b.Loop() {
			for range peerSmallCopies {
				t := time.Now()
				peerBenchCopyTo(b, src, "b:/small")
				lat = append(lat, time.Since(t))
			}
			copies += peerSmallCopies
		}
		peerBenchReportLatency(b, lat)
		got, err := os.ReadFile(d.path("small"))
		mustNo(b, err)
		if !bytes.Equal(got, data) {
			b.Fatal("b:/small differs from its source")
		}
		a.requireTCPCopies(copies)
	})
	b.Run("raw", func(b *testing.B) {
		c := peerBenchRawPeer(b, func(c net.Conn) error {
			buf := make([]byte, peerSmallSize)
			reply := make([]byte, 8)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return err
				}
				if _, err := c.Write(reply); err != nil {
					return err
				}
			}
		})
		reply := make([]byte, 8)
		lat := make([]time.Duration, 0, peerSmallCopies)
		for b.Loop() {
			for range peerSmallCopies {
				t := time.Now()
				if _, err := c.Write(data); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, reply); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t))
			}
		}
		peerBenchReportLatency(b, lat)
	})
}

// peerBenchReportLatency reports the p50, p99 and mean of lat in µs.
func peerBenchReportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) < peerSmallCopies {
		b.Fatalf("%d samples, want at least %d", len(lat), peerSmallCopies)
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1)+0.5)]) / 1e3
	}
	var sum time.Duration
	for _, l := range lat {
		sum += l
	}
	b.ReportMetric(q(0.50), "p50-us")
	b.ReportMetric(q(0.99), "p99-us")
	b.ReportMetric(float64(sum)/float64(len(lat))/1e3, "us/copy")
}

var peerBenchBig struct {
	once sync.Once
	data []byte
}

// peerBenchBigData returns the 1 GiB of random bytes (a fixed ChaCha8 seed)
// of BenchmarkPeerCopy1G, made once per process.
func peerBenchBigData() []byte {
	peerBenchBig.once.Do(func() {
		peerBenchBig.data = make([]byte, peerBigSize)
		rand.NewChaCha8([32]byte{1}).Read(peerBenchBig.data)
	})
	return peerBenchBig.data
}

// peerBenchDaemon is one `tensorfs mount` of a benchmark: the tests'
// daemon, with the benchmark's own checks below.
type peerBenchDaemon = daemon

// waitLiveBytes waits (untimed by its callers) until the daemon's live bytes
// are n: memory of unlinked or replaced tensors goes back asynchronously.
func (d *peerBenchDaemon) waitLiveBytes(n int64) {
	d.t.Helper()
	var s xattrs.Stats
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(5 * time.Millisecond) {
		if s = d.stats(); s.Live.Bytes == n {
			return
		}
	}
	d.t.Fatalf("%s: live bytes %d after 10 s, want %d", d.mnt, s.Live.Bytes, n)
}

// requireTCPCopies checks that the benchmark measured what it means to: n
// completed copies, all over TCP, none failed.
func (d *peerBenchDaemon) requireTCPCopies(n int) {
	d.t.Helper()
	s := d.stats()
	if s.Copies.TCP != int64(n) || s.Copies.Local != 0 || s.Copies.IPC != 0 {
		d.t.Fatalf("copies %v, want %d over tcp and no other", s.Copies, n)
	}
	for _, r := range s.Transfers.Recent {
		if r.Path != "tcp" || r.Error != "" {
			d.t.Fatalf("a transfer that is not a successful TCP one: %+v", r)
		}
	}
}

// peerBenchPair starts daemons a and b on host memory that know each other
// (as peers_test.go's cluster does) and registers their clean-up: everything
// left in the mounts is removed, the live stats must drop to zero, and the
// daemons must exit 0 on SIGTERM with no mount left.
func peerBenchPair(b *testing.B) (a, d *peerBenchDaemon) {
	b.Helper()
	secret := filepath.Join(b.TempDir(), "secret")
	mustNo(b, os.WriteFile(secret, []byte("a shared secret of enough bytes\n"), 0o600))
	names := []string{"a", "b"}
	ports := map[string]int{}
	for _, n := range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		mustNo(b, err)
		ports[n] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	ds := map[string]*peerBenchDaemon{}
	for _, n := range names {
		flags := []string{"--device", "host", "--name", n, "--listen", fmt.Sprintf("127.0.0.1:%d", ports[n]),
			"--secret-file", secret, "--host-id", "bench-host-" + n, "--timeout", "30s",
			"--streams", strconv.Itoa(peerBenchStreams(b))}
		for _, o := range names {
			if o != n {
				flags = append(flags, "--peer", fmt.Sprintf("%s=127.0.0.1:%d", o, ports[o]))
			}
		}
		ds[n] = peerBenchStart(b, flags...)
	}
	return ds["a"], ds["b"]
}

// peerBenchStart mounts the tensorfs binary with flags on a fresh directory;
// before the daemon stops, everything in it is removed and its memory waited
// for, so its clean exit says nothing leaked.
func peerBenchStart(b *testing.B, flags ...string) *peerBenchDaemon {
	b.Helper()
	d := startDaemon(b, flags...)
	b.Cleanup(func() { // runs before the daemon's own cleanup stops it
		if mounted(d.mnt) {
			ents, _ := os.ReadDir(d.mnt)
			for _, e := range ents {
				os.RemoveAll(filepath.Join(d.mnt, e.Name()))
			}
			waitTensorfsIdle(b, d.mnt)
		}
	})
	return d
}

// peerBenchCopyTo sets user.tensorfs.copy_to on p; it returns when the copy
// is complete.
func peerBenchCopyTo(b *testing.B, p, target string) {
	if err := unix.Setxattr(p, xattrs.CopyTo, []byte(target), 0); err != nil {
		b.Fatalf("setxattr %s %s=%q: %v", p, xattrs.CopyTo, target, err)
	}
}

// peerBenchTemplateDir makes a directory with a dtype/shape template.
func peerBenchTemplateDir(b *testing.B, dir, dtype, shape string) {
	b.Helper()
	mustNo(b, os.Mkdir(dir, 0o755))
	mustNo(b, unix.Setxattr(dir, xattrs.DType, []byte(dtype), 0))
	mustNo(b, unix.Setxattr(dir, xattrs.Shape, []byte(shape), 0))
}

// peerBenchWriteFile creates p sized to len(data) (ftruncate, so the tensor
// is allocated once) and fills it with 1 MiB pwrites.
func peerBenchWriteFile(b *testing.B, p string, data []byte) {
	b.Helper()
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	mustNo(b, err)
	defer unix.Close(fd)
	mustNo(b, unix.Ftruncate(fd, int64(len(data))))
	for off := 0; off < len(data); off += peerIOSize {
		end := min(off+peerIOSize, len(data))
		if n, err := unix.Pwrite(fd, data[off:end], int64(off)); err != nil || n != end-off {
			b.Fatalf("pwrite %s at %d: %d bytes, %v", p, off, n, err)
		}
	}
}

// peerBenchCheckFile checks p's size and, when full, that its bytes are data.
func peerBenchCheckFile(b *testing.B, p string, data []byte, full bool) {
	b.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	mustNo(b, err)
	defer unix.Close(fd)
	var st unix.Stat_t
	mustNo(b, unix.Fstat(fd, &st))
	if st.Size != int64(len(data)) {
		b.Fatalf("%s: %d bytes, want %d", p, st.Size, len(data))
	}
	if !full {
		return
	}
	buf := make([]byte, peerIOSize)
	for off := 0; off < len(data); off += peerIOSize {
		end := min(off+peerIOSize, len(data))
		n, err := unix.Pread(fd, buf[:end-off], int64(off))
		if err != nil || n != end-off {
			b.Fatalf("pread %s at %d: %d bytes, %v", p, off, n, err)
		}
		if !bytes.Equal(buf[:n], data[off:end]) {
			b.Fatalf("%s differs from its source at [%d, %d)", p, off, end)
		}
	}
}

// peerBenchRawPeer starts a TCP listener on loopback whose one accepted
// connection is served by serve until it returns, and returns the client end
// of that connection. The clean-up closes both and waits for serve.
func peerBenchRawPeer(b *testing.B, serve func(net.Conn) error) net.Conn {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustNo(b, err)
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		served <- serve(c)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c.Close()
		if err := <-served; err != nil && !errors.Is(err, io.EOF) {
			b.Errorf("raw peer: %v", err)
		}
		ln.Close()
	})
	return c
}

// peerBenchStreams is the TCP streams per copy of the daemons and of the
// raw baselines: $PEERBENCH_STREAMS, else the daemons' default.
func peerBenchStreams(b *testing.B) int {
	v := os.Getenv("PEERBENCH_STREAMS")
	if v == "" {
		return transfer.DefaultStreams
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > transfer.MaxStreams {
		b.Fatalf("PEERBENCH_STREAMS=%q: want 1 to %d", v, transfer.MaxStreams)
	}
	return n
}

// peerBenchRawStreams is the raw baseline of a copy over n TCP streams: a
// receiver in this process on n loopback connections. send(data) writes
// data's length on the first connection, then part i of data (n contiguous
// parts) on connection i, all at once, and returns when the receiver has
// acknowledged with 8 bytes on the first connection. The receiver takes a
// buffer from buffer(len) (inside the timed region), reads each part into
// its place from its connection, acknowledges, and hands the buffer to got.
// The clean-up closes the connections and waits for the receiver.
func peerBenchRawStreams(b *testing.B, n int, buffer func(int) []byte) (send func([]byte), got <-chan []byte) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	mustNo(b, err)
	defer ln.Close()
	out := make(chan []byte, 1)
	cs := make([]net.Conn, n)
	ss := make([]net.Conn, n)
	for i := range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		mustNo(b, err)
		cs[i] = c
		s, err := ln.Accept()
		mustNo(b, err)
		ss[i] = s
	}
	part := func(total, i int) (int, int) { return total * i / n, total * (i + 1) / n }
	served := make(chan error, 1)
	go func() {
		served <- func() error {
			for {
				total, err := peerBenchReadHeader(ss[0])
				if err != nil {
					return err
				}
				buf := buffer(total)
				errs := make(chan error, n)
				for i := range n {
					go func() {
						lo, hi := part(total, i)
						_, err := io.ReadFull(ss[i], buf[lo:hi])
						errs <- err
					}()
				}
				for range n {
					if err := <-errs; err != nil {
						return err
					}
				}
				if _, err := ss[0].Write(make([]byte, 8)); err != nil {
					return err
				}
				out <- buf
			}
		}()
	}()
	b.Cleanup(func() {
		for i := range n {
			cs[i].Close()
			ss[i].Close()
		}
		if err := <-served; err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			b.Errorf("raw peer: %v", err)
		}
	})
	send = func(data []byte) {
		var hdr [8]byte
		binary.BigEndian.PutUint64(hdr[:], uint64(len(data)))
		if _, err := cs[0].Write(hdr[:]); err != nil {
			b.Fatal(err)
		}
		errs := make(chan error, n)
		for i := range n {
			go func() {
				lo, hi := part(len(data), i)
				_, err := cs[i].Write(data[lo:hi])
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		if _, err := io.ReadFull(cs[0], hdr[:]); err != nil {
			b.Fatal(err)
		}
	}
	return send, out
}

// peerBenchReadHeader reads the 8-byte length of a raw transfer.
func peerBenchReadHeader(c net.Conn) (int, error) {
	var hdr [8]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint64(hdr[:])
	if n > peerBigSize {
		return 0, fmt.Errorf("raw stream of %d bytes", n)
	}
	return int(n), nil
}
