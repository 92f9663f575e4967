package gpu

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// rssOfMapping is the resident size, in bytes, of this process's mapping
// that starts at addr (/proc/self/smaps).
func rssOfMapping(t *testing.T, addr uintptr) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	start := fmt.Sprintf("%x-", addr)
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "-") && !strings.Contains(line, ":") || strings.HasPrefix(line, start) {
			in = strings.HasPrefix(line, start)
			continue
		}
		if in && strings.HasPrefix(line, "Rss:") {
			kb, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatalf("no mapping at %#x in /proc/self/smaps", addr)
	return 0
}

// TestHostAllocMapsPages: a new host buffer comes with its pages already in
// the daemon's page table (MAP_POPULATE), so the first write into it (a
// copy landing in a new tensor) takes no page fault per page: on the
// virtualized machines of docs/performance.md that halves the first write
// of a 64 KiB tensor.
func TestHostAllocMapsPages(t *testing.T) {
	h, err := NewHost(64 << 20)
	require.NoError(t, err)
	for _, n := range []int64{64 << 10, 3 << 20} {
		b, err := h.Alloc(n, 7)
		require.NoError(t, err)
		require.Equal(t, n, rssOfMapping(t, b.Addr()), "%d-byte buffer: resident before any access", n)
		require.NoError(t, b.Free())
	}
}

// BenchmarkHostFirstWrite: allocate a new host buffer (never a recycled one:
// each op's owner is new) and write it whole once, the way a copy fills a
// new tensor; against "raw", a memfd made the same way (memfd_create,
// ftruncate, fallocate) but mapped without MAP_POPULATE and written whole.
// docs/performance.md has the ratio.
func BenchmarkHostFirstWrite(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20, 16 << 20} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(i)
		}
		b.Run(fmt.Sprintf("tensorfs-%dK", n>>10), func(b *testing.B) {
			h, err := NewHost(1 << 40)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(n))
			owner := uint32(0)
			for b.Loop() {
				owner++
				buf, err := h.Alloc(int64(n), owner)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := buf.WriteAt(src, 0); err != nil {
					b.Fatal(err)
				}
				buf.Free()
			}
		})
		b.Run(fmt.Sprintf("raw-%dK", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				fd, err := unix.MemfdCreate("raw", unix.MFD_CLOEXEC)
				if err != nil {
					b.Fatal(err)
				}
				if err := unix.Ftruncate(fd, int64(n)); err != nil {
					b.Fatal(err)
				}
				if err := unix.Fallocate(fd, 0, 0, int64(n)); err != nil {
					b.Fatal(err)
				}
				mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
				if err != nil {
					b.Fatal(err)
				}
				copy(mem, src)
				unix.Munmap(mem)
				unix.Close(fd)
			}
		})
	}
}
