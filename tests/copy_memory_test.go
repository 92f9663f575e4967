package tests

// Tests of what a copy's destination memory and its directories look like
// from outside: a copy lands in recycled memory it does not clear first
// (gpu.UninitAllocator), so nothing of the old bytes may show, before or
// after; and directories a copy creates inside the daemon change their
// parent's attributes, which the kernel may cache (attrTimeout).

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// TestCopyIntoRecycledMemory: copies of different contents over the same
// destination, small (arena or small spare) and large, each read back
// exactly; a tensor then created by a user on that daemon, of the same size
// (so it may get the very memory the replaced tensors left), reads zeros.
func TestCopyIntoRecycledMemory(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	for _, size := range []int{64 << 10, 8 << 20} {
		for i := range 4 {
			data := fill(size, byte(7*i+1))
			require.NoError(t, os.WriteFile(a.path("x"), data, 0o644))
			setx(t, a.path("x"), xattrs.CopyTo, "b:/x")
			got, err := os.ReadFile(b.path("x"))
			require.NoError(t, err)
			require.True(t, bytes.Equal(data, got), "copy %d of %d bytes: the destination holds other bytes", i, size)
		}
		require.NoError(t, os.Remove(b.path("x")))
		f, err := os.Create(b.path("fresh"))
		require.NoError(t, err)
		require.NoError(t, f.Truncate(int64(size)))
		got := make([]byte, size)
		_, err = f.ReadAt(got, 0)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		require.True(t, bytes.Equal(make([]byte, size), got), "a new %d-byte tensor must read zeros", size)
		require.NoError(t, os.Remove(b.path("fresh")))
	}
}

// TestCopyTemporaryOwnerOnly: while a large copy is on its way, its
// temporary in the destination directory is readable by its owner only
// (its memory may still hold what an earlier tensor left there); once in
// place the tensor has the usual mode, and no temporary is left.
func TestCopyTemporaryOwnerOnly(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	const size = 512 << 20
	data := fill(size, 3)
	require.NoError(t, os.WriteFile(a.path("big"), data, 0o644))
	done := make(chan error, 1)
	go func() {
		done <- unix.Setxattr(a.path("big"), xattrs.CopyTo, []byte("b:/big"), 0)
	}()
	var mode os.FileMode
	seen := false
	for deadline := time.Now().Add(30 * time.Second); !seen && time.Now().Before(deadline); {
		ents, err := os.ReadDir(b.mnt)
		require.NoError(t, err)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tensorfs-tmp-") {
				if fi, err := os.Lstat(b.path(e.Name())); err == nil {
					mode, seen = fi.Mode().Perm(), true
				}
			}
		}
		select {
		case err := <-done:
			require.NoError(t, err)
			done <- nil
			deadline = time.Time{} // over: the loop ends
		default:
		}
	}
	require.True(t, seen, "the copy's temporary was never seen in the destination directory")
	require.Equal(t, os.FileMode(0o600), mode, "a temporary is owner-only")
	require.NoError(t, <-done)
	fi, err := os.Stat(b.path("big"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), fi.Mode().Perm(), "in place, the tensor has the mode of a copied tensor")
	got, err := os.ReadFile(b.path("big"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	ents, err := os.ReadDir(b.mnt)
	require.NoError(t, err)
	for _, e := range ents {
		require.False(t, strings.HasPrefix(e.Name(), ".tensorfs-tmp-"), "temporary %s left behind", e.Name())
	}
}

// TestCopyMadeDirectoriesShowAtOnce: directories a copy creates inside the
// daemon (a pushed tree, a pulled tree; the pull runs while the kernel
// holds the target directory's lock) change their parent's link count,
// and fstat of an open directory, and stat of the mount's root (neither
// looked up again by name), show it right after the copy although the
// kernel may keep a directory's attributes for a while.
func TestCopyMadeDirectoriesShowAtOnce(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	require.NoError(t, os.MkdirAll(a.path("tree/sub"), 0o755))
	require.NoError(t, os.WriteFile(a.path("tree/sub/t"), fill(4096, 1), 0o644))
	nlink := func(fd int) uint64 {
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(fd, &st))
		return uint64(st.Nlink)
	}
	open := func(p string) int {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	root := open(b.mnt)
	rootLinks := nlink(root) // now cached by the kernel
	fds := map[string]int{}
	for _, dir := range []string{"push", "pull"} {
		require.NoError(t, os.Mkdir(b.path(dir), 0o755))
		fds[dir] = open(b.path(dir))
		require.EqualValues(t, 2, nlink(fds[dir]), "an empty directory") // cached
	}
	require.EqualValues(t, rootLinks+2, nlink(root))
	setx(t, a.path("tree"), xattrs.CopyTo, "b:/push")
	require.EqualValues(t, 3, nlink(fds["push"]), "push/sub was made by the copy")
	setx(t, b.path("pull"), xattrs.CopyFrom, "a:/tree")
	require.EqualValues(t, 3, nlink(fds["pull"]), "pull/sub was made by the copy")
	got, err := os.ReadFile(b.path("pull/sub/t"))
	require.NoError(t, err)
	require.Equal(t, fill(4096, 1), got)
	setx(t, a.path("tree"), xattrs.CopyTo, "b:/new")
	require.EqualValues(t, rootLinks+3, nlink(root), "the root got new/ from the copy")
}
