package tests

// Benchmarks of tensorfs against two references, measured in the same run:
//
//   - floor: a minimal in-process go-fuse filesystem over preallocated Go byte
//     slices (floorfs_test.go), mounted with tensorfs's options. It is the cost
//     of FUSE and go-fuse themselves; tensorfs's time over it is what tensorfs
//     adds (allocation, registration, its locks and bookkeeping).
//   - tmpfs: the kernel's in-memory filesystem, no FUSE at all.
//
// tensorfs is the real binary, mounted as a subprocess on host memory.
// scripts/bench.sh runs these and prints the ratios; docs/performance.md has
// the method and the figures.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

const (
	// metaSize is the tensor size of the create/unlink benchmarks.
	metaSize = 64 << 10
	// seqSize is the tensor size of the sequential I/O benchmarks.
	seqSize = 256 << 20
	// ioSize is the size of each read and write of the sequential benchmarks.
	ioSize = 1 << 20
	// tmpfsSource names the benchmarks' tmpfs mounts in /proc/mounts.
	tmpfsSource = "tensorfs-bench-tmpfs"
)

// BenchmarkCreateUnlink64K measures the metadata path: per op, one
// openat(O_CREAT|O_EXCL|O_WRONLY), one 64 KiB pwrite at offset 0, close and
// unlinkat, the same syscalls on every filesystem. On tensorfs-template the
// directory's template (U8, shape 65536) makes create allocate and register
// the 64 KiB tensor, and the write fills it; on tensorfs-write the file starts
// empty and the write allocates and registers it. Reported as ops/s.
func BenchmarkCreateUnlink64K(b *testing.B) {
	b.Run("tensorfs-template", func(b *testing.B) {
		mnt := startDaemon(b, "--device", "host").mnt
		dir := filepath.Join(mnt, "tmpl")
		mustNo(b, os.Mkdir(dir, 0o755))
		mustNo(b, unix.Setxattr(dir, xattrs.DType, []byte("U8"), 0))
		mustNo(b, unix.Setxattr(dir, xattrs.Shape, []byte("65536"), 0))
		checkTensorfsCreate(b, dir, true)
		createUnlinkLoop(b, dir)
		waitTensorfsIdle(b, mnt)
	})
	b.Run("tensorfs-write", func(b *testing.B) {
		mnt := startDaemon(b, "--device", "host").mnt
		dir := filepath.Join(mnt, "plain")
		mustNo(b, os.Mkdir(dir, 0o755))
		checkTensorfsCreate(b, dir, false)
		createUnlinkLoop(b, dir)
		waitTensorfsIdle(b, mnt)
	})
	b.Run("floor", func(b *testing.B) {
		fsys, dir := mountFloor(b)
		fsys.prealloc(metaSize, 4)
		createUnlinkLoop(b, dir)
	})
	b.Run("tmpfs", func(b *testing.B) {
		createUnlinkLoop(b, mountTmpfs(b))
	})
}

// BenchmarkSeqWrite256M measures sequential 1 MiB pwrites over a 256 MiB file
// that is already sized (ftruncate) and written once, so that only the data
// path is timed. Reported as MB/s.
func BenchmarkSeqWrite256M(b *testing.B) {
	forEachDataTarget(b, func(b *testing.B, dir string) {
		fd, buf, done := openSeqFile(b, dir)
		b.SetBytes(seqSize)
		for b.Loop() {
			writeAll(b, fd, buf)
		}
		done()
	})
}

// BenchmarkSeqRead256M measures sequential 1 MiB preads of a 256 MiB file
// written beforehand. Reported as MB/s.
func BenchmarkSeqRead256M(b *testing.B) {
	forEachDataTarget(b, func(b *testing.B, dir string) {
		fd, buf, done := openSeqFile(b, dir)
		b.SetBytes(seqSize)
		for b.Loop() {
			for off := int64(0); off < seqSize; off += ioSize {
				n, err := unix.Pread(fd, buf, off)
				if err != nil || n != ioSize {
					b.Fatalf("pread at %d: %d bytes, %v", off, n, err)
				}
			}
		}
		done()
	})
}

// forEachDataTarget runs fn as sub-benchmarks tensorfs, floor and tmpfs, each
// in a fresh mount.
func forEachDataTarget(b *testing.B, fn func(b *testing.B, dir string)) {
	b.Run("tensorfs", func(b *testing.B) {
		mnt := startDaemon(b, "--device", "host").mnt
		fn(b, mnt)
		waitTensorfsIdle(b, mnt)
	})
	b.Run("floor", func(b *testing.B) {
		fsys, dir := mountFloor(b)
		fsys.prealloc(seqSize, 1)
		fn(b, dir)
	})
	b.Run("tmpfs", func(b *testing.B) {
		fn(b, mountTmpfs(b))
	})
}

// createUnlinkLoop is the timed loop of BenchmarkCreateUnlink64K. Names are
// resolved relative to an fd of dir (openat, unlinkat), so that every
// filesystem does the same lookups whatever the depth of dir: tensorfs's
// template needs a subdirectory, the floor and tmpfs work in their root.
func createUnlinkLoop(b *testing.B, dir string) {
	buf := pattern(metaSize)
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	mustNo(b, err)
	defer unix.Close(dfd)
	const name = "t"
	for b.Loop() {
		fd, err := unix.Openat(dfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			b.Fatalf("create %s/%s: %v", dir, name, err)
		}
		if n, err := unix.Pwrite(fd, buf, 0); err != nil || n != len(buf) {
			unix.Close(fd)
			b.Fatalf("pwrite %s/%s: %d bytes, %v", dir, name, n, err)
		}
		if err := unix.Close(fd); err != nil {
			b.Fatalf("close %s/%s: %v", dir, name, err)
		}
		if err := unix.Unlinkat(dfd, name, 0); err != nil {
			b.Fatalf("unlink %s/%s: %v", dir, name, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// openSeqFile creates dir/seq, sizes it to seqSize, writes it once (so tmpfs
// has its pages and every filesystem holds the data) and returns the open fd,
// a 1 MiB buffer and done, which closes and unlinks the file (a cleanup calls
// it too, for a benchmark that fails before it does).
func openSeqFile(b *testing.B, dir string) (fd int, buf []byte, done func()) {
	b.Helper()
	name := filepath.Join(dir, "seq")
	fd, err := unix.Open(name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	mustNo(b, err)
	closed := false
	done = func() {
		if !closed {
			closed = true
			unix.Close(fd)
			unix.Unlink(name)
		}
	}
	b.Cleanup(done)
	mustNo(b, unix.Ftruncate(fd, seqSize))
	buf = pattern(ioSize)
	writeAll(b, fd, buf)
	var st unix.Stat_t
	mustNo(b, unix.Fstat(fd, &st))
	if st.Size != seqSize {
		b.Fatalf("%s: size %d after writing, want %d", name, st.Size, seqSize)
	}
	return fd, buf, done
}

// writeAll writes seqSize bytes to fd in ioSize pwrites.
func writeAll(b *testing.B, fd int, buf []byte) {
	for off := int64(0); off < seqSize; off += ioSize {
		n, err := unix.Pwrite(fd, buf, off)
		if err != nil || n != len(buf) {
			b.Fatalf("pwrite at %d: %d bytes, %v", off, n, err)
		}
	}
}

// pattern returns n bytes that are not all zero.
func pattern(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + 1)
	}
	return p
}

// mustNo fails the benchmark on a non-nil error.
func mustNo(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// checkTensorfsCreate checks, untimed, the path a benchmark means to measure:
// with a template, create alone allocates and registers 64 KiB; without one,
// the file starts empty and unregistered and the first write registers it.
func checkTensorfsCreate(b *testing.B, dir string, template bool) {
	b.Helper()
	name := filepath.Join(dir, "check")
	fd, err := unix.Open(name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	mustNo(b, err)
	defer unix.Unlink(name)
	defer unix.Close(fd)
	var st unix.Stat_t
	mustNo(b, unix.Fstat(fd, &st))
	_, xerr := getxErr(name, xattrs.MRID)
	if template && (st.Size != metaSize || xerr != nil) {
		b.Fatalf("template create: size %d (want %d), mr_id: %v", st.Size, metaSize, xerr)
	}
	if !template && (st.Size != 0 || xerr == nil) {
		b.Fatalf("plain create: size %d (want 0), mr_id present: %v", st.Size, xerr == nil)
	}
	_, err = unix.Pwrite(fd, pattern(metaSize), 0)
	mustNo(b, err)
	if _, err := getxErr(name, xattrs.MRID); err != nil {
		b.Fatalf("no mr_id after a 64 KiB write: %v", err)
	}
}

// waitTensorfsIdle fails the benchmark unless the daemon's live stats drop to
// zero within 5 s once the benchmark's files are gone (RELEASE is asynchronous
// to close).
func waitTensorfsIdle(b *testing.B, mnt string) {
	b.Helper()
	var s xattrs.Stats
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(20 * time.Millisecond) {
		v, err := getxErr(mnt, xattrs.StatsName)
		if err != nil {
			b.Fatalf("stats: %v", err)
		}
		if err := json.Unmarshal([]byte(v), &s); err != nil {
			b.Fatalf("stats %q: %v", v, err)
		}
		if s.Live == (xattrs.Live{}) {
			return
		}
	}
	b.Errorf("tensorfs not idle after the benchmark: %+v", s.Live)
}

// mountTmpfs mounts a tmpfs (as `mount -t tmpfs` does) on a fresh directory
// and registers a cleanup that unmounts it. It needs root.
func mountTmpfs(b *testing.B) string {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("mounting a tmpfs needs root")
	}
	dir := b.TempDir()
	if err := unix.Mount(tmpfsSource, dir, "tmpfs", 0, "size=1g,mode=0755"); err != nil {
		b.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	b.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
			b.Errorf("unmount tmpfs %s: %v", dir, err)
		}
	})
	return dir
}
