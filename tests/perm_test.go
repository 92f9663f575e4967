package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// asUser runs a command as uid (and gid) uid and returns its combined
// output.
func asUser(uid int, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// asNobody runs a command as uid/gid 65534 (asUser).
func asNobody(name string, args ...string) (string, error) { return asUser(65534, name, args...) }

// needOtherUsers skips a test that acts as other users unless it runs as
// root, and needs tool (Debian package attr): missing, it fails under
// CI=true (.ci/run installs it) and skips elsewhere.
func needOtherUsers(t *testing.T, tool string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as other users")
	}
	if _, err := exec.LookPath(tool); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s (Debian package attr) is needed; .ci/run installs it", tool)
		}
		t.Skipf("%s (Debian package attr) is not installed here", tool)
	}
}

// openToOthers opens the parents of mountpoint mnt (0700 temp dirs) for
// other users.
func openToOthers(mnt string) {
	for p := mnt; p != "/tmp" && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o755)
	}
}

// TestPermissions: mode bits and ownership are honoured by the kernel
// (default_permissions): ipc_handle needs read permission, actions and
// template changes need write permission, and without --allow-other other
// users cannot enter the mount at all.
func TestPermissions(t *testing.T) {
	needOtherUsers(t, "getfattr")

	private := startDaemon(t)
	openToOthers(private.mnt)
	out, err := asNobody("stat", private.mnt)
	require.Error(t, err, "without --allow-other another user cannot use the mount: %s", out)

	d := startDaemon(t, "--allow-other")
	openToOthers(d.mnt)
	secret, shared := d.path("secret"), d.path("shared")
	require.NoError(t, os.WriteFile(secret, []byte("k"), 0o600))
	require.NoError(t, os.WriteFile(shared, []byte("k"), 0o644))

	out, err = asNobody("getfattr", "--only-values", "-n", xattrs.IPCHandle, shared)
	require.NoError(t, err, out)
	require.Contains(t, out, "memfd:/proc/")
	out, err = asNobody("getfattr", "--only-values", "-n", xattrs.IPCHandle, secret)
	require.Error(t, err)
	require.Contains(t, out, "Permission denied")
	out, err = asNobody("cat", secret)
	require.Error(t, err, out)

	// Writing an xattr (an action, a dtype) needs write permission.
	out, err = asNobody("setfattr", "-n", xattrs.DType, "-v", "I8", shared)
	require.Error(t, err)
	require.Contains(t, out, "Permission denied")
	require.Equal(t, "U8", getx(t, shared, xattrs.DType))
	out, err = asNobody("setfattr", "-n", xattrs.Shape, "-v", "4", d.mnt)
	require.Error(t, err, "the root directory is 0755 root: %s", out)
	out, err = asNobody("touch", d.path("intruder"))
	require.Error(t, err, out)

	// chmod and chown are kept and enforced.
	require.NoError(t, os.Chmod(secret, 0o644))
	out, err = asNobody("getfattr", "--only-values", "-n", xattrs.IPCHandle, secret)
	require.NoError(t, err, out)
	require.NoError(t, os.Chown(shared, 65534, 65534))
	out, err = asNobody("setfattr", "-n", xattrs.DType, "-v", "I8", shared)
	require.NoError(t, err, out)
	require.Equal(t, "I8", getx(t, shared, xattrs.DType))
	var st unix.Stat_t
	require.NoError(t, unix.Stat(shared, &st))
	require.EqualValues(t, 65534, st.Uid)

	require.NoError(t, os.Remove(secret))
	require.NoError(t, os.Remove(shared))
	d.requireClean()
	private.requireClean()
}

// TestCopyPermissions: a copy inside one mount asks of its caller what the
// same reads, creates and renames through the mount would (a breaker's
// findings, 2026-12-06; nobody did each of these): read permission on a
// source (root's 0600 tensor copied into a file of nobody's own), search
// permission on every directory of a path (a tensor read or written
// inside root's 0700 directory), write and search permission on the
// directory whose entry a whole copy creates or replaces (a tensor made
// in root's 0755 directory), the sticky bit (root's tensor replaced in a
// 01777 directory: in a 0777 one, anyone may), and read permission on a source tree's directories.
// What nobody may do, it does.
func TestCopyPermissions(t *testing.T) {
	needOtherUsers(t, "setfattr")
	d := startDaemon(t, "--allow-other")
	openToOthers(d.mnt)
	require.NoError(t, os.Chmod(d.mnt, 0o777))
	require.NoError(t, os.Mkdir(d.path("sticky"), 0o755))
	require.NoError(t, os.Chmod(d.path("sticky"), 0o777|os.ModeSticky))
	require.NoError(t, os.WriteFile(d.path("sticky", "roots"), fill(64, 2), 0o644))
	mine := d.path("mine")
	require.NoError(t, os.WriteFile(d.path("secret"), fill(4096, 7), 0o600))
	require.NoError(t, os.WriteFile(d.path("shared"), fill(4096, 8), 0o644))
	zeros(t, mine, 4096)
	require.NoError(t, os.Chown(mine, 65534, 65534))
	require.NoError(t, os.Mkdir(d.path("dir"), 0o755))
	require.NoError(t, os.WriteFile(d.path("dir", "s"), fill(64, 9), 0o600))
	require.NoError(t, os.Mkdir(d.path("secdir"), 0o755))
	require.NoError(t, os.WriteFile(d.path("secdir", "pub"), fill(64, 3), 0o644))
	require.NoError(t, os.Mkdir(d.path("privdir"), 0o700))
	require.NoError(t, os.WriteFile(d.path("privdir", "f"), fill(64, 4), 0o644))
	require.NoError(t, os.WriteFile(d.path("privdir", "w"), fill(64, 5), 0o666))
	require.NoError(t, os.MkdirAll(d.path("tree", "hidden"), 0o755))
	require.NoError(t, os.Chmod(d.path("tree", "hidden"), 0o700))
	require.NoError(t, os.WriteFile(d.path("tree", "hidden", "x"), fill(64, 6), 0o644))
	binary := fmt.Sprintf("0x%x", binValue(binRec{"/secret /mine", [][3]int64{{0, 0, 100}}}))
	snap := snapMounts(d)
	before := snap()
	for _, c := range []struct{ on, attr, v string }{
		// Read permission on the source.
		{mine, xattrs.CopyFrom, "/secret@0+100 @0"},
		{mine, xattrs.CopyFrom, "/secret"},
		{d.mnt, xattrs.Batch, "/secret@0+100 /mine@0"},
		{d.mnt, xattrs.Batch, "/secret@0+100 /mine@0\n/secret@100+100 /mine@100"},
		{d.mnt, xattrs.Batch, "/secret /stolen"},
		{d.mnt, xattrs.Batch, "/dir /dir2"},
		{d.mnt, xattrs.Batch, binary},
		// Search permission on the path.
		{mine, xattrs.CopyFrom, "/privdir/f@0+8 @0"},
		{mine, xattrs.CopyFrom, "/privdir/f"},
		{d.mnt, xattrs.Batch, "/privdir/f /leak"},
		{d.mnt, xattrs.Batch, "/privdir/f@0+8 /mine@0\n/privdir/f@8+8 /mine@8"},
		{d.mnt, xattrs.Batch, "/mine@0+8 /privdir/w@0"},
		{mine, xattrs.CopyTo, "/privdir/new"},
		{mine, xattrs.CopyTo, "@0+8 /privdir/w@0"},
		// The destination's directory: write and search; sticky.
		{mine, xattrs.CopyTo, "/secdir/pub"},
		{mine, xattrs.CopyTo, "/secdir/new"},
		{d.mnt, xattrs.Batch, "/mine /secdir/s"},
		{mine, xattrs.CopyTo, "/sticky/roots"},
		{d.mnt, xattrs.Batch, "/mine /sticky/roots"},
		// A source tree's directories.
		{d.mnt, xattrs.Batch, "/tree /tree2"},
	} {
		out, err := asNobody("setfattr", "-n", c.attr, "-v", c.v, c.on)
		require.Error(t, err, "%s %q: %s", c.attr, c.v, out)
		require.Contains(t, out, "Permission denied", "%s %q", c.attr, c.v)
		require.Equal(t, before, snap(), "%s %q wrote something", c.attr, c.v)
	}
	for _, p := range []string{d.path("stolen"), d.path("dir2"), d.path("leak"), d.path("tree2"), d.path("secdir", "new")} {
		_, err := os.Stat(p)
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	d.requireLog(`may not read the source`)
	d.requireLog(`may not search a directory on the path to /privdir`)
	d.requireLog(`may not create or replace entries in the destination directory`)
	d.requireLog(`may not replace roots in a sticky directory`)
	// What nobody may do, it does: read what it may, write its own, make
	// a tensor in the sticky directory (owned like the directory, as a
	// copy's tensors are: root's, so nobody may not replace it there).
	out, err := asNobody("setfattr", "-n", xattrs.CopyFrom, "-v", "/shared@0+100 @0", mine)
	require.NoError(t, err, out)
	out, err = asNobody("setfattr", "-n", xattrs.Batch, "-v", "/shared@100+100 /mine@100\n/shared@200+100 /mine@200", d.mnt)
	require.NoError(t, err, out)
	want := make([]byte, 4096)
	copy(want, fill(4096, 8)[:300])
	requireContent(t, mine, want)
	out, err = asNobody("setfattr", "-n", xattrs.CopyTo, "-v", "/sticky/copy", mine)
	require.NoError(t, err, out)
	requireContent(t, d.path("sticky", "copy"), want)
	out, err = asNobody("setfattr", "-n", xattrs.Batch, "-v", "/secdir/pub /pub2", d.mnt)
	require.NoError(t, err, out)
	requireContent(t, d.path("pub2"), fill(64, 3))
}
