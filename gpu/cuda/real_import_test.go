package cuda

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/gpu"
)

// childEnv switches the test binary into the exporting process of the
// cross-process tests: TestRealImportChild allocates buffers of the sizes
// it lists (comma-separated bytes) and serves them until told to quit.
// cuIpcOpenMemHandle refuses handles of the calling process, so a real
// import needs a second process, and the test binary itself is the only
// program sure to be on the device machine.
const childEnv = "TENSORFS_CUDA_IMPORT_CHILD"

// childTag starts every line of the child's protocol on its stdout; other
// lines (the testing package's own) are skipped.
const childTag = "TFSCHILD"

// childPatternMax: buffers larger than this are left zeroed (a pattern of
// 1 GiB costs seconds of CPU for a benchmark that only copies).
const childPatternMax = 64 << 20

// TestRealImportChild is the exporting process of TestRealImport and
// BenchmarkRealImport (started by startChild, never on its own). Protocol,
// one line each: it prints "TFSCHILD buf HANDLE OFFSET SIZE" per buffer
// (buffer i holds pattern(SIZE, i+1)), then "TFSCHILD ready"; on stdin
// "verify I SEED" answers "TFSCHILD ok" when buffer I holds pattern(SIZE,
// SEED), else "TFSCHILD bad ..."; "quit" or end of input frees everything
// and prints "TFSCHILD freed".
func TestRealImportChild(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		t.Skipf("helper process of TestRealImport: runs only with %s set", childEnv)
	}
	d := openReal(t)[0]
	// A first small buffer, so that the exported small ones start at a
	// non-zero ipc_offset inside their arena, as most tensors do.
	first, err := d.Alloc(1000, 0)
	require.NoError(t, err)
	defer first.Free()
	var bufs []gpu.Buffer
	for i, f := range strings.Split(spec, ",") {
		n, err := strconv.ParseInt(f, 10, 64)
		require.NoError(t, err)
		b, err := d.Alloc(n, 0)
		require.NoError(t, err)
		defer b.Free()
		if n <= childPatternMax {
			_, err = b.WriteAt(pattern(int(n), byte(i+1)), 0)
			require.NoError(t, err)
		}
		bufs = append(bufs, b)
		fmt.Printf("%s buf %s %d %d\n", childTag, b.Handle(), b.Offset(), n)
	}
	fmt.Printf("%s ready\n", childTag)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var i, seed int
		if in.Text() == "quit" {
			break
		}
		if _, err := fmt.Sscanf(in.Text(), "verify %d %d", &i, &seed); err != nil || i < 0 || i >= len(bufs) {
			fmt.Printf("%s bad command %q\n", childTag, in.Text())
			continue
		}
		got := make([]byte, bufs[i].Size())
		if _, err := bufs[i].ReadAt(got, 0); err != nil {
			fmt.Printf("%s bad %v\n", childTag, err)
		} else if want := pattern(len(got), byte(seed)); !bytes.Equal(got, want) {
			fmt.Printf("%s bad buffer %d differs\n", childTag, i)
		} else {
			fmt.Printf("%s ok\n", childTag)
		}
	}
	for _, b := range bufs {
		require.NoError(t, b.Free())
	}
	fmt.Printf("%s freed\n", childTag)
}

// child is a running TestRealImportChild.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	bufs []childBuf

	waited bool
	err    error // the exit's, once waited
}

type childBuf struct {
	handle    string
	off, size int64
}

// startChild re-executes the test binary as an exporting process with
// buffers of the given sizes and waits until they are exported; cleanup
// tells it to quit and waits for it.
func startChild(tb testing.TB, sizes ...int64) *child {
	tb.Helper()
	var spec []string
	for _, n := range sizes {
		spec = append(spec, strconv.FormatInt(n, 10))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRealImportChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(spec, ","))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	require.NoError(tb, err)
	out, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	require.NoError(tb, cmd.Start())
	c := &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	tb.Cleanup(func() { require.NoError(tb, c.wait(), "exporting child") })
	for {
		line := c.line(tb)
		if line == "ready" {
			break
		}
		var b childBuf
		_, err := fmt.Sscanf(line, "buf %s %d %d", &b.handle, &b.off, &b.size)
		require.NoError(tb, err, "child said %q", line)
		c.bufs = append(c.bufs, b)
	}
	return c
}

// wait closes the child's stdin (its quit) and waits for it to exit, once;
// a child that does not exit in 30 s is killed.
func (c *child) wait() error {
	if c.waited {
		return c.err
	}
	c.waited = true
	c.in.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case c.err = <-done:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		c.err = fmt.Errorf("did not exit in 30 s: %v", <-done)
	}
	return c.err
}

// line returns the child's next protocol line, without the tag.
func (c *child) line(tb testing.TB) string {
	tb.Helper()
	for c.out.Scan() {
		if rest, ok := strings.CutPrefix(c.out.Text(), childTag+" "); ok {
			return rest
		}
	}
	tb.Fatalf("exporting child ended: %v", c.out.Err())
	return ""
}

// ask sends one command and returns the answer.
func (c *child) ask(tb testing.TB, cmd string) string {
	tb.Helper()
	_, err := fmt.Fprintln(c.in, cmd)
	require.NoError(tb, err)
	return c.line(tb)
}

func TestRealImport(t *testing.T) {
	devs := openReal(t)
	if os.Getenv(childEnv) != "" {
		t.Skip("in the exporting child")
	}
	d := devs[0]
	sizes := []int64{1000, 9<<20 + 7}
	c := startChild(t, sizes...)
	require.Len(t, c.bufs, len(sizes))
	require.NotZero(t, c.bufs[0].off, "the small buffer sits inside an arena")

	for i, cb := range c.bufs {
		n := cb.size
		used := d.MemInfo().Used
		imp, err := d.Import(cb.handle, cb.off, n)
		require.NoError(t, err, "buffer %d", i)
		require.Equal(t, n, imp.Size())
		require.Equal(t, cb.off, imp.Offset())
		require.Equal(t, cb.handle, imp.Handle())
		require.Equal(t, used, d.MemInfo().Used, "an import is not tensorfs's memory")
		want := pattern(int(n), byte(i+1))
		got := make([]byte, n)
		_, err = imp.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "buffer %d: the child's bytes, read through the import", i)

		// Device to device out of the import.
		local, err := d.Alloc(n, 0)
		require.NoError(t, err)
		require.NoError(t, gpu.Copy(local, 0, imp, 0, n))
		clear(got)
		_, err = local.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "buffer %d: dtod from the import", i)

		// And into it: half device to device, half staged; the child checks.
		w := pattern(int(n), byte(100+i))
		_, err = local.WriteAt(w, 0)
		require.NoError(t, err)
		require.NoError(t, gpu.Copy(imp, 0, local, 0, n/2))
		_, err = imp.WriteAt(w[n/2:], n/2)
		require.NoError(t, err)
		require.Equal(t, "ok", c.ask(t, fmt.Sprintf("verify %d %d", i, 100+i)), "buffer %d: the child sees the writes", i)

		if len(devs) > 1 {
			other, err := devs[1].Import(cb.handle, cb.off, n)
			require.NoError(t, err)
			require.NoError(t, local.Zero(0, n))
			require.NoError(t, gpu.Copy(local, 0, other, 0, n))
			_, err = local.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(w, got), "buffer %d: peer copy from the cuda:1 import", i)
			require.NoError(t, other.Free())
		}

		require.NoError(t, local.Free())
		require.NoError(t, imp.Free())
		require.ErrorIs(t, imp.Free(), gpu.ErrFreed)
	}

	// Own handles: an allocation of this process is aliased, memory
	// exported outside the allocator is refused by the driver.
	own, err := d.Alloc(4096, 0)
	require.NoError(t, err)
	p := pattern(4096, 42)
	_, err = own.WriteAt(p, 0)
	require.NoError(t, err)
	al, err := d.Import(own.Handle(), own.Offset(), 4096)
	require.NoError(t, err)
	got := make([]byte, 4096)
	_, err = al.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, p, got)
	require.NoError(t, al.Free())
	require.NoError(t, own.Free())
	h, free, err := d.RawAllocExport(64 << 10)
	require.NoError(t, err)
	_, err = d.Import(h, 0, 0)
	t.Logf("import of this process's own raw export: %v", err)
	require.ErrorIs(t, err, gpu.ErrHandle)
	require.NoError(t, free())

	require.Equal(t, "freed", c.ask(t, "quit"))
	require.NoError(t, c.wait())
	_, err = d.Import(c.bufs[1].handle, 0, 0)
	t.Logf("import after the exporter exited: %v", err)
	require.ErrorIs(t, err, gpu.ErrHandle)
	require.Eventually(t, func() bool { return d.MemInfo().Used == 0 }, 2*time.Second, 10*time.Millisecond)
}

// BenchmarkRealImport measures, against another process's exports: a 64
// KiB device-to-device copy out of a fresh import (Import, whose
// cuIpcOpenMemHandle is the cache miss, copy, Free) against the same with
// the handle still open (the mapping is shared: the cache hit) and against
// a copy through an import held open, with the copy between two local
// buffers as the floor; and a 1 GiB copy out of an imported pointer
// against one between two local buffers (the ratio is the cost of going
// through IPC), on one GPU and, with two, GPU0 to GPU1.
func BenchmarkRealImport(b *testing.B) {
	devs := openReal(b)
	d := devs[0]
	const small, large = 64 << 10, 1 << 30
	c := startChild(b, small, large)
	hs, hl := c.bufs[0], c.bufs[1]
	dst, err := d.Alloc(small, 0)
	require.NoError(b, err)
	defer dst.Free()
	copyFrom := func(b *testing.B, dst, src gpu.Buffer, n int64) {
		if err := gpu.Copy(dst, 0, src, 0, n); err != nil {
			b.Fatal(err)
		}
	}
	importCopy := func(b *testing.B) {
		imp, err := d.Import(hs.handle, hs.off, small)
		if err != nil {
			b.Fatal(err)
		}
		copyFrom(b, dst, imp, small)
		if err := imp.Free(); err != nil {
			b.Fatal(err)
		}
	}
	// Import and Free alone (cuIpcOpenMemHandle_v2, cuMemGetAddressRange_v2,
	// cuIpcCloseMemHandle) of the 2 MiB arena and of the 1 GiB allocation.
	for _, cb := range []childBuf{hs, hl} {
		b.Run(fmt.Sprintf("open-close-%dM", roundUp(cb.size, ArenaSize)>>20), func(b *testing.B) {
			for b.Loop() {
				imp, err := d.Import(cb.handle, cb.off, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := imp.Free(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("64K-import-miss", func(b *testing.B) {
		for b.Loop() {
			importCopy(b)
		}
	})
	b.Run("64K-import-hit", func(b *testing.B) {
		hold, err := d.Import(hs.handle, hs.off, small)
		require.NoError(b, err)
		defer hold.Free()
		for b.Loop() {
			importCopy(b)
		}
	})
	b.Run("64K-held-import", func(b *testing.B) {
		imp, err := d.Import(hs.handle, hs.off, small)
		require.NoError(b, err)
		defer imp.Free()
		for b.Loop() {
			copyFrom(b, dst, imp, small)
		}
	})
	b.Run("64K-local", func(b *testing.B) {
		src, err := d.Alloc(small, 0)
		require.NoError(b, err)
		defer src.Free()
		for b.Loop() {
			copyFrom(b, dst, src, small)
		}
	})

	big, err := d.Alloc(large, 0)
	require.NoError(b, err)
	defer big.Free()
	b.Run("1G-imported", func(b *testing.B) {
		imp, err := d.Import(hl.handle, hl.off, large)
		require.NoError(b, err)
		defer imp.Free()
		b.SetBytes(large)
		for b.Loop() {
			copyFrom(b, big, imp, large)
		}
	})
	b.Run("1G-local", func(b *testing.B) {
		src, err := d.Alloc(large, 0)
		require.NoError(b, err)
		defer src.Free()
		b.SetBytes(large)
		for b.Loop() {
			copyFrom(b, big, src, large)
		}
	})
	if len(devs) < 2 {
		return
	}
	big1, err := devs[1].Alloc(large, 0)
	require.NoError(b, err)
	defer big1.Free()
	b.Run("1G-imported-gpu0-gpu1", func(b *testing.B) {
		// Mapped into cuda:1's context (lazy peer access): a copy there.
		imp, err := devs[1].Import(hl.handle, hl.off, large)
		require.NoError(b, err)
		defer imp.Free()
		b.SetBytes(large)
		for b.Loop() {
			copyFrom(b, big1, imp, large)
		}
	})
	b.Run("1G-local-gpu0-gpu1", func(b *testing.B) {
		b.SetBytes(large)
		for b.Loop() {
			copyFrom(b, big1, big, large)
		}
	})
}
