package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// bigTree makes dir on d with n tensors of size bytes (and one in sub/).
func bigTree(t *testing.T, d *daemon, dir string, n, size int) {
	t.Helper()
	mkTemplateDir(t, d.path(dir), "U8", fmt.Sprint(size))
	for i := range n {
		require.NoError(t, os.WriteFile(d.path(fmt.Sprintf("%s/t%d", dir, i)), fill(size, byte(i)), 0o644))
	}
	require.NoError(t, os.Mkdir(d.path(dir, "sub"), 0o755))
	require.NoError(t, os.WriteFile(d.path(dir, "sub", "z"), fill(size, 99), 0o644))
}

// tmpsIn lists the .tensorfs-tmp-* names in dir.
func tmpsIn(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tensorfs-tmp-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// copyUntilStaged starts copy_to value on src in the background and waits
// until a staged temporary appears in watch; it returns the copy's result
// channel and the temporary's name.
func copyUntilStaged(t *testing.T, src, value, watch string) (<-chan error, string) {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- unix.Setxattr(src, xattrs.CopyTo, []byte(value), 0) }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		require.True(t, time.Now().Before(deadline), "no staged directory appeared in %s", watch)
		if ts := tmpsIn(watch); len(ts) > 0 {
			return res, ts[0]
		}
	}
}

// owners maps every path below dir (and "." for dir) to its uid and gid.
func owners(t *testing.T, dir string) map[string][2]uint32 {
	t.Helper()
	out := map[string][2]uint32{}
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = [2]uint32{st.Uid, st.Gid}
		return nil
	}))
	return out
}

// mkDeep makes under root (a directory of d) a chain of depth directories
// with long names, holding one tensor at the bottom, via relative calls (the
// full path is past PATH_MAX); it returns the chain's relative path.
func mkDeep(t *testing.T, root string, depth int) string {
	t.Helper()
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	require.NoError(t, err)
	var parts []string
	for i := range depth {
		name := fmt.Sprintf("%03d%s", i, strings.Repeat("d", 200))
		require.NoError(t, unix.Mkdirat(fd, name, 0o755))
		nfd, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY, 0)
		require.NoError(t, err)
		unix.Close(fd)
		fd = nfd
		parts = append(parts, name)
	}
	tf, err := unix.Openat(fd, "leaf", unix.O_CREAT|unix.O_WRONLY, 0o644)
	require.NoError(t, err)
	_, err = unix.Write(tf, fill(64, 3))
	require.NoError(t, err)
	unix.Close(tf)
	unix.Close(fd)
	return strings.Join(parts, "/")
}

// unhang aborts d's FUSE connection (the only way out of a deadlock that
// involves the kernel's inode locks: even SIGKILL leaves the daemon a
// zombie with a thread stuck in vfs_rename) and kills d.
func unhang(d *daemon) {
	d.abortFUSE()
	d.kill()
}

// TestStagedDirStolenNoDeadlock: a copy whose staged directory a user
// renamed away before Commit, while a process holds the parent's lock and
// waits for the source's (mv of the source to another directory; the
// documented lock cycle), fails instead of hanging. The rename through the
// mount waits 2 s, the internal move finds no temporary (ENOENT), and
// renameViaMount took that to mean that the kernel's rename got it and
// waited for the kernel's rename, which waits for the lock that the mv
// holds, which waits for this copy: forever, and its daemon could not even
// be killed (a zombie with a thread in vfs_rename).
func TestStagedDirStolenNoDeadlock(t *testing.T) {
	a := startDaemon(t)
	const n, size = 16, 64 << 20 // a data phase of seconds, so that the steps below come before Commit
	require.NoError(t, os.Mkdir(a.path("p"), 0o755))
	require.NoError(t, os.Mkdir(a.path("q"), 0o755))
	bigTree(t, a, "p/src", n, size)
	res, tmp := copyUntilStaged(t, a.path("p/src"), "/p/new", a.path("p"))
	// A user renames the staged directory (it is visible in the listing).
	require.NoError(t, os.Rename(a.path("p", tmp), a.path("p/stolen")))
	// mv takes p's and q's locks, then waits for src's (held by the copy).
	mv := make(chan error, 1)
	go func() { mv <- unix.Rename(a.path("p/src"), a.path("q/src")) }()
	select {
	case err := <-res:
		t.Logf("copy: %v", err) // a failure is fine: its directory was taken
	case <-time.After(30 * time.Second):
		unhang(a)
		t.Fatalf("the copy hung (deadlock); its daemon's log:\n%s", a.log.String())
	}
	require.NoError(t, <-mv)
	require.NoError(t, os.RemoveAll(a.path("p")))
	require.NoError(t, os.RemoveAll(a.path("q")))
	a.requireClean()
}

// TestStagedDirKeepsForeignEntries: when a copy into a new directory fails
// (its source daemon dies mid-transfer) after a user put a tensor into its
// staged directory (it is visible), the copy's own tensors go and the
// staged directory stays with the user's tensor in it, under its temporary
// name (it was dropped whole, and that tensor's memory leaked, unreachable).
func TestStagedDirKeepsForeignEntries(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	const n, size = 6, 32 << 20
	bigTree(t, a, "src", n, size)
	require.NoError(t, os.Mkdir(b.path("home"), 0o755))
	res, tmp := copyUntilStaged(t, a.path("src"), "b:/home/new", b.path("home"))
	a.pause() // hold the copy
	require.NoError(t, os.WriteFile(b.path("home", tmp, "mine"), fill(1000, 1), 0o644))
	a.kill()
	require.Error(t, <-res)
	// b notices the dead sender and aborts: the staged directory keeps only
	// the user's tensor, under its temporary name.
	staged := b.path("home", tmp)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ents, err := os.ReadDir(staged)
		require.NoError(t, err, "the staged directory holding a user's tensor stays")
		if len(ents) == 1 {
			require.Equal(t, "mine", ents[0].Name())
			break
		}
		require.True(t, time.Now().Before(deadline), "the copy's tensors stayed: %v", ents)
	}
	got, err := os.ReadFile(filepath.Join(staged, "mine"))
	require.NoError(t, err)
	require.Equal(t, fill(1000, 1), got)
	b.requireLog("left in place")
	require.NoError(t, os.RemoveAll(b.path("home")))
	b.requireClean()
}

// TestTemporaryNamesAvoidUsersFiles: a copy's temporaries (a staged
// directory, a tensor's temporary) take names no entry has: a user's own
// tensor named .tensorfs-tmp-1 (the first name a fresh daemon uses) was
// replaced by a pushed directory's staged one, and its memory leaked.
func TestTemporaryNamesAvoidUsersFiles(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	bigTree(t, a, "src", 2, 4096)
	require.NoError(t, os.Mkdir(b.path("home"), 0o755))
	require.NoError(t, os.WriteFile(b.path("home/.tensorfs-tmp-1"), fill(100, 5), 0o644))
	setx(t, a.path("src"), xattrs.CopyTo, "b:/home/new")
	got, err := os.ReadFile(b.path("home/.tensorfs-tmp-1"))
	require.NoError(t, err, "the user's own file")
	require.Equal(t, fill(100, 5), got)
	require.NoError(t, os.RemoveAll(b.path("home")))
	require.NoError(t, os.RemoveAll(a.path("src")))
	a.requireClean()
	b.requireClean()
}

// TestStagedDirMadeMeanwhileOwners: a push into b:/home/new (home owned by
// 1234) while root makes home/new meanwhile: the staged rename fails with
// EEXIST and the staged tensors are moved into root's new one by one, with
// the owners a copy into an existing directory gives them (they kept the
// staged directory's, 1234's, in root's 0750 directory).
func TestStagedDirMadeMeanwhileOwners(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	const n, size = 6, 32 << 20
	bigTree(t, a, "src", n, size)
	require.NoError(t, os.Mkdir(b.path("home"), 0o755))
	require.NoError(t, os.Chown(b.path("home"), 1234, 1234))
	res, _ := copyUntilStaged(t, a.path("src"), "b:/home/new", b.path("home"))
	a.pause()                                  // hold the copy
	err := os.Mkdir(b.path("home/new"), 0o750) // root's
	a.resume()
	require.NoError(t, err)
	require.NoError(t, <-res)
	b.requireLog("made meanwhile", "the EEXIST fallback ran")
	racing := owners(t, b.path("home/new"))

	// The same copy into a directory that exists from the start.
	require.NoError(t, os.Mkdir(b.path("home/old"), 0o750))
	setx(t, a.path("src"), xattrs.CopyTo, "b:/home/old")
	existing := owners(t, b.path("home/old"))
	require.Equal(t, existing, racing, "owners (uid, gid) by path: into a directory made meanwhile vs. into one that existed")

	require.NoError(t, os.RemoveAll(b.path("home")))
	require.NoError(t, os.RemoveAll(a.path("src")))
	a.requireClean()
	b.requireClean()
}

// TestCopyDeeperThanPathMax: a tree deeper than PATH_MAX (made with
// relative calls, like any tool may) copies into a new directory and over
// the existing one, pushed or local: a destination directory the daemon
// cannot open by its path through the mount (ENAMETOOLONG past 4096
// bytes) gets its tensors put in place inside the daemon.
func TestCopyDeeperThanPathMax(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	require.NoError(t, os.Mkdir(a.path("src"), 0o755))
	mkDeep(t, a.path("src"), 25)
	for _, target := range []string{"b:/new", "/lnew"} {
		setx(t, a.path("src"), xattrs.CopyTo, target)
		err := unix.Setxattr(a.path("src"), xattrs.CopyTo, []byte(target), 0)
		require.NoError(t, err, "copy over the existing tree %s", target)
	}
	require.Empty(t, tmpsIn(b.mnt))
	for _, p := range []string{b.path("new"), a.path("lnew"), a.path("src")} {
		_, err := runCmd("rm", "-rf", p)
		require.NoError(t, err)
	}
	a.requireClean()
	b.requireClean()
}

// TestCopyRunsOncePerCall: a copy whose temporaries are removed by a
// user mid-transfer (rm -rf of the parent, which holds the staged tree)
// fails with ENOENT. It was ESTALE (a released tensor), on which the
// kernel repeats a path-based setxattr (retry_estale): the copy silently
// ran a second time, recreated the directory the user removed, and the
// caller saw success for a copy that failed.
func TestCopyRunsOncePerCall(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	const n, size = 6, 32 << 20
	bigTree(t, a, "src", n, size)
	require.NoError(t, os.Mkdir(b.path("home"), 0o755))
	recentBefore := len(a.stats().Transfers.Recent)
	res, tmp := copyUntilStaged(t, a.path("src"), "b:/home/new", b.path("home"))
	// Prepare is over once the staged directory holds the whole tree.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the staged tree did not fill")
		if ents, _ := os.ReadDir(b.path("home", tmp)); len(ents) == n+1 {
			break
		}
	}
	a.pause() // hold the copy
	out, err := runCmd("rm", "-rf", b.path("home"))
	a.resume()
	require.NoError(t, err, out)
	err = <-res
	require.ErrorIs(t, err, syscall.ENOENT, "the copy whose destination was removed")
	recent := a.stats().Transfers.Recent[recentBefore:]
	var lines []string
	for _, r := range recent {
		lines = append(lines, fmt.Sprintf("%+v", r))
	}
	require.Len(t, recent, 1, "transfers run by one setxattr:\n%s", strings.Join(lines, "\n"))
	runCmd("rm", "-rf", b.path("home"))
	require.NoError(t, os.RemoveAll(a.path("src")))
	a.requireClean()
	b.requireClean()
}
