package tests

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// ipcPair is two daemons of one host (the IPC path).
func ipcPair(t *testing.T) (a, b *daemon) {
	t.Helper()
	return pairOn(t, copyPath{name: "ipc", path: "ipc"})
}

// bindOn copies src in place into dst on b once (two-sided), and waits
// until a holds the binding that the next copies there take one-sided.
func bindOn(t *testing.T, a, b *daemon, src, dst string, wantBindings int) {
	t.Helper()
	setx(t, src, xattrs.CopyTo, dst)
	require.Eventually(t, func() bool { return a.stats().Live.Bindings == wantBindings }, 5*time.Second, 5*time.Millisecond,
		"a binds %s after its first in-place copy there", dst)
	require.EqualValues(t, wantBindings, b.stats().Live.Bound)
}

// receivedInPlace is how many in-place IPC copies d took part in.
func receivedInPlace(d *daemon) int64 { return d.stats().Copies.InPlace.IPC }

// TestInPlaceOneSided: between daemons of one host, the in-place copies to
// a tensor after the first go one-sided (the sender writes through its
// own import of the receiver's allocation, asking nothing): every byte
// lands where its line says, seen through a mapping the receiver's process
// made before, and nowhere else; the registration is kept; the sender
// counts the copies, the receiver none. A range outside the tensor is
// still EINVAL with nothing written.
func TestInPlaceOneSided(t *testing.T) {
	a, b := ipcPair(t)
	const size = 256 << 10
	src := fill(64<<10, 3)
	writeTensor(t, a.path("src"), src)
	zeros(t, b.path("cache"), size)
	before := ids(t, b.path("cache"))
	m := mapTensor(t, b.path("cache"))
	want := make([]byte, size)

	bindOn(t, a, b, a.path("src"), "b:/cache@0", 1)
	copy(want, src)
	got := receivedInPlace(b)
	sent := a.stats().Copies.InPlace.IPC

	setx(t, a.path("src"), xattrs.CopyTo, "b:/cache@131072")
	copy(want[131072:], src)
	setx(t, a.path("src"), xattrs.CopyTo, "@0x1000+8192 b:/cache@0+8192")
	copy(want[0:], src[4096:4096+8192])
	// A block list: unsorted, adjacent and rewritten blocks, one call.
	var lines []string
	for i := range 40 {
		k := (i * 7) % 8
		lines = append(lines, fmt.Sprintf("@%d+8192 b:/cache@%d", k*8192, 65536+k*8192))
	}
	setx(t, a.path("src"), xattrs.CopyTo, strings.Join(lines, "\n"))
	copy(want[65536:], src)
	require.True(t, bytes.Equal(want, m.mem), "the mapping made before the copies sees their bytes, and only theirs")
	requireContent(t, b.path("cache"), want)
	require.Equal(t, before, ids(t, b.path("cache")), "mr_id, ipc_id and generation are kept")
	require.Equal(t, got, receivedInPlace(b), "the receiver took no part in the one-sided copies")
	require.Equal(t, sent+3, a.stats().Copies.InPlace.IPC, "the sender counts them")

	// Outside the tensor: EINVAL from the receiver, nothing written.
	requireErrnoNoChange(t, b.path("cache"), syscall.EINVAL, "a range past the end", func() error {
		return unix.Setxattr(a.path("src"), xattrs.CopyTo, []byte("b:/cache@262000"), 0)
	})
	require.True(t, bytes.Equal(want, m.mem))
	m.close()
	require.NoError(t, os.Remove(b.path("cache")))
	require.NoError(t, os.Remove(a.path("src")))
	a.requireClean()
	b.requireClean()
}

// TestInPlaceOneSidedRevoked: every change that makes a binding wrong ends
// it before it takes effect, so that the next copy asks the receiver
// again: a truncate (the range past the new end is EINVAL, nothing
// written), a rename of the file or of a directory above it, an exchange,
// and an unlink of a file still open (ENOENT, nothing written into the
// tensor that had the name).
func TestInPlaceOneSidedRevoked(t *testing.T) {
	a, b := ipcPair(t)
	src := fill(4096, 5)
	writeTensor(t, a.path("src"), src)

	t.Run("truncate", func(t *testing.T) {
		zeros(t, b.path("t"), 64<<10)
		bindOn(t, a, b, a.path("src"), "b:/t@0", 1)
		require.NoError(t, os.Truncate(b.path("t"), 8192))
		require.Zero(t, b.stats().Live.Bound, "the truncate revoked the binding before it returned")
		require.Zero(t, a.stats().Live.Bindings)
		requireErrnoNoChange(t, b.path("t"), syscall.EINVAL, "a range past the new end", func() error {
			return unix.Setxattr(a.path("src"), xattrs.CopyTo, []byte("b:/t@32768"), 0)
		})
		require.NoError(t, os.Remove(b.path("t")))
	})
	t.Run("rename", func(t *testing.T) {
		zeros(t, b.path("r"), 8192)
		bindOn(t, a, b, a.path("src"), "b:/r@0", 1)
		require.Equal(t, 1, b.settledLive().Leases, "the binding's lease on the export")
		require.NoError(t, os.Rename(b.path("r"), b.path("r2")))
		require.Zero(t, b.stats().Live.Bound)
		// a never wrote through this binding (no import of b's memory):
		// the export's lease goes back with it, not at the tensor's end.
		require.Eventually(t, func() bool { return b.stats().Live.Leases == 0 }, 5*time.Second, 5*time.Millisecond,
			"the export's lease of a binding never written through goes with the binding")
		requireErrnoNoChange(t, b.path("r2"), syscall.ENOENT, "the old name", func() error {
			return unix.Setxattr(a.path("src"), xattrs.CopyTo, []byte("b:/r@4096"), 0)
		})
		require.NoError(t, os.Remove(b.path("r2")))
	})
	t.Run("directory", func(t *testing.T) {
		require.NoError(t, os.Mkdir(b.path("d"), 0o755))
		zeros(t, b.path("d/kv"), 8192)
		bindOn(t, a, b, a.path("src"), "b:/d/kv@0", 1)
		require.NoError(t, os.Rename(b.path("d"), b.path("e")))
		require.Zero(t, b.stats().Live.Bound)
		requireErrnoNoChange(t, b.path("e/kv"), syscall.ENOENT, "a path through the old directory", func() error {
			return unix.Setxattr(a.path("src"), xattrs.CopyTo, []byte("b:/d/kv@4096"), 0)
		})
		require.NoError(t, os.RemoveAll(b.path("e")))
	})
	t.Run("exchange", func(t *testing.T) {
		zeros(t, b.path("x"), 8192)
		zeros(t, b.path("y"), 8192)
		bindOn(t, a, b, a.path("src"), "b:/x@0", 1)
		require.NoError(t, unix.Renameat2(unix.AT_FDCWD, b.path("x"), unix.AT_FDCWD, b.path("y"), unix.RENAME_EXCHANGE))
		require.Zero(t, b.stats().Live.Bound)
		// "x" names the other tensor now: the copy lands there.
		setx(t, a.path("src"), xattrs.CopyTo, "b:/x@4096")
		want := make([]byte, 8192)
		copy(want[4096:], src)
		requireContent(t, b.path("x"), want)
		want = make([]byte, 8192)
		copy(want, src)
		requireContent(t, b.path("y"), want)
		require.NoError(t, os.Remove(b.path("x")))
		require.NoError(t, os.Remove(b.path("y")))
	})
	t.Run("unlink-open", func(t *testing.T) {
		zeros(t, b.path("u"), 8192)
		// Gone before the parent's clean check, also when a GPU tensor
		// skips the test (mapTensor maps host memory).
		t.Cleanup(func() { os.Remove(b.path("u")) })
		m := mapTensor(t, b.path("u"))
		bindOn(t, a, b, a.path("src"), "b:/u@0", 1)
		require.NoError(t, os.Remove(b.path("u")))
		require.Zero(t, b.stats().Live.Bound)
		err := unix.Setxattr(a.path("src"), xattrs.CopyTo, []byte("b:/u@4096"), 0)
		require.ErrorIs(t, err, syscall.ENOENT)
		want := make([]byte, 8192)
		copy(want, src)
		require.True(t, bytes.Equal(want, m.mem), "nothing landed in the unlinked tensor")
		m.close()
	})
	require.NoError(t, os.Remove(a.path("src")))
	a.requireClean()
	b.requireClean()
}

// TestInPlaceOneSidedTruncateWaits: a truncate of a tensor a peer is
// bound to waits for that peer's one-sided copy in flight, and an unlink
// too; everything is freed after.
func TestInPlaceOneSidedTruncateWaits(t *testing.T) {
	a, b := ipcPair(t)
	const n = 128 << 20
	bigSource(t, a, n)
	zeros(t, b.path("dst"), n)
	zeros(t, b.path("dst2"), n)
	bindOn(t, a, b, a.path("big"), "b:/dst@0", 1)
	bindOn(t, a, b, a.path("big"), "b:/dst2@0", 2)
	for _, c := range []struct {
		dst    string
		change func() error
	}{
		{"b:/dst@0", func() error { return os.Truncate(b.path("dst"), 4096) }},
		{"b:/dst2@0", func() error { return os.Remove(b.path("dst2")) }},
	} {
		active := a.stats().Transfers.Active
		done := make(chan error, 1)
		go func() { done <- unix.Setxattr(a.path("big"), xattrs.CopyTo, []byte(c.dst), 0) }()
		require.Eventually(t, func() bool { return a.stats().Transfers.Active > active || len(done) > 0 }, 10*time.Second, time.Millisecond)
		require.NoError(t, c.change(), "the change waits, then succeeds")
		select {
		case err := <-done:
			require.NoError(t, err, "the copy's range stayed inside the tensor")
		case <-time.After(time.Second):
			t.Fatal("the change returned before the copy")
		}
	}
	require.Zero(t, b.stats().Live.Bound)
	os.Remove(b.path("dst"))
	os.Remove(a.path("big"))
	a.requireClean()
	b.requireClean()
}

// TestInPlaceOneSidedPeerKilled: a receiver killed while a sender is bound
// to its tensor: the sender's bindings and imports end with their lease
// channel, and its next copy there fails (no write into the dead peer's
// memory reported done); a sender killed while bound: the receiver's
// bindings end with the channel, and a truncate of the tensor goes on at
// once.
func TestInPlaceOneSidedPeerKilled(t *testing.T) {
	a, b := ipcPair(t)
	writeTensor(t, a.path("src"), fill(4096, 1))
	zeros(t, b.path("cache"), 1<<20)
	bindOn(t, a, b, a.path("src"), "b:/cache@0", 1)
	setx(t, a.path("src"), xattrs.CopyTo, "b:/cache@8192")
	b.kill()
	require.Eventually(t, func() bool { l := a.stats().Live; return l.Bindings == 0 && l.Imports == 0 }, 10*time.Second, 10*time.Millisecond,
		"the sender lets go of the dead peer's memory")
	err := unix.Setxattr(a.path("src"), xattrs.CopyTo, []byte("b:/cache@4096"), 0)
	require.Error(t, err, "a copy to a dead peer fails")
	require.NoError(t, os.Remove(a.path("src")))
	a.requireClean()

	c, d := ipcPair(t)
	writeTensor(t, c.path("src"), fill(4096, 2))
	zeros(t, d.path("cache"), 1<<20)
	bindOn(t, c, d, c.path("src"), "b:/cache@0", 1)
	c.kill()
	require.Eventually(t, func() bool { return d.stats().Live.Bound == 0 }, 10*time.Second, 10*time.Millisecond,
		"the receiver's bindings end with the channel")
	start := time.Now()
	require.NoError(t, os.Truncate(d.path("cache"), 4096))
	require.Less(t, time.Since(start), 2*time.Second, "nothing is left to wait for")
	require.NoError(t, os.Remove(d.path("cache")))
	d.requireClean()
}

// TestInPlaceOneSidedCalls: the lines of one call to several bound
// tensors of a peer go one-sided as one transfer (a batch, and a directory's
// "@0" weight update), every byte where its line says; a call that ends
// with a whole-tensor line (a notification) goes as one two-sided transfer,
// the notification after the bytes.
func TestInPlaceOneSidedCalls(t *testing.T) {
	a, b := ipcPair(t)
	require.NoError(t, os.Mkdir(a.path("m"), 0o755))
	require.NoError(t, os.Mkdir(b.path("m"), 0o755))
	w0, w1 := fill(8192, 3), fill(16384, 4)
	writeTensor(t, a.path("m/w0"), w0)
	writeTensor(t, a.path("m/w1"), w1)
	zeros(t, b.path("m/w0"), 8192)
	zeros(t, b.path("m/w1"), 16384)
	bindOn(t, a, b, a.path("m"), "b:/m@0", 2)
	got := receivedInPlace(b)
	w0, w1 = fill(8192, 5), fill(16384, 6)
	writeTensor(t, a.path("m/w0"), w0)
	writeTensor(t, a.path("m/w1"), w1)
	setx(t, a.path("m"), xattrs.CopyTo, "b:/m@0")
	requireContent(t, b.path("m/w0"), w0)
	requireContent(t, b.path("m/w1"), w1)
	require.Equal(t, got, receivedInPlace(b), "the weight update went one-sided")

	// A batch into both: one-sided.
	setx(t, a.mnt, xattrs.Batch, "/m/w1@0+4096 b:/m/w0@4096\n/m/w0@0+4096 b:/m/w1@12288")
	want0 := append(append([]byte{}, w0[:4096]...), w1[:4096]...)
	want1 := append(append([]byte{}, w1[:12288]...), w0[:4096]...)
	requireContent(t, b.path("m/w0"), want0)
	requireContent(t, b.path("m/w1"), want1)
	require.Equal(t, got, receivedInPlace(b), "the batch went one-sided")

	// With a notification: one two-sided transfer (mode "mixed").
	ipcs := b.stats().Copies.IPC
	writeTensor(t, a.path("note"), []byte("req-1"))
	setx(t, a.mnt, xattrs.Batch, "/m/w0@0+4096 b:/m/w1@0\n/note b:/note")
	require.Equal(t, got, receivedInPlace(b))
	require.Equal(t, ipcs+1, b.stats().Copies.IPC, "the call with its notification went two-sided, as one transfer")
	requireContent(t, b.path("note"), []byte("req-1"))
	copy(want1, w0[:4096])
	requireContent(t, b.path("m/w1"), want1)
	b.removeAll() // a's bindings and imports go with b's tensors
	a.removeAll()
	a.requireClean()
	b.requireClean()
}
