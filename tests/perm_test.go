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

// TestCopySourceNeedsRead: a copy's source in this mount needs the caller's
// read permission, as open(O_RDONLY) would: nobody copied root's 0600
// tensor into a file of its own (copy_from, batch, a range list, a binary
// one, a new tensor) and read it there. A source it may read copies.
func TestCopySourceNeedsRead(t *testing.T) {
	needOtherUsers(t, "setfattr")
	d := startDaemon(t, "--allow-other")
	openToOthers(d.mnt)
	require.NoError(t, os.Chmod(d.mnt, 0o777))
	secret, shared, mine := d.path("secret"), d.path("shared"), d.path("mine")
	require.NoError(t, os.WriteFile(secret, fill(4096, 7), 0o600))
	require.NoError(t, os.WriteFile(shared, fill(4096, 8), 0o644))
	zeros(t, mine, 4096)
	require.NoError(t, os.Chown(mine, 65534, 65534))
	require.NoError(t, os.Mkdir(d.path("dir"), 0o755))
	require.NoError(t, os.WriteFile(d.path("dir", "s"), fill(64, 9), 0o600))
	binary := fmt.Sprintf("0x%x", binValue(binRec{"/secret /mine", [][3]int64{{0, 0, 100}}}))
	for _, c := range []struct{ on, attr, v string }{
		{mine, xattrs.CopyFrom, "/secret@0+100 @0"},
		{mine, xattrs.CopyFrom, "/secret"},
		{d.mnt, xattrs.Batch, "/secret@0+100 /mine@0"},
		{d.mnt, xattrs.Batch, "/secret@0+100 /mine@0\n/secret@100+100 /mine@100"},
		{d.mnt, xattrs.Batch, "/secret /stolen"},
		{d.mnt, xattrs.Batch, "/dir /dir2"},
		{d.mnt, xattrs.Batch, binary},
	} {
		out, err := asNobody("setfattr", "-n", c.attr, "-v", c.v, c.on)
		require.Error(t, err, "%s %q: %s", c.attr, c.v, out)
		require.Contains(t, out, "Permission denied", "%s %q", c.attr, c.v)
		requireContent(t, mine, make([]byte, 4096))
	}
	for _, p := range []string{d.path("stolen"), d.path("dir2")} {
		_, err := os.Stat(p)
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	d.requireLog(`may not read the source`)
	// What nobody may read, it copies.
	out, err := asNobody("setfattr", "-n", xattrs.CopyFrom, "-v", "/shared@0+100 @0", mine)
	require.NoError(t, err, out)
	out, err = asNobody("setfattr", "-n", xattrs.Batch, "-v", "/shared@100+100 /mine@100\n/shared@200+100 /mine@200", d.mnt)
	require.NoError(t, err, out)
	want := make([]byte, 4096)
	copy(want, fill(4096, 8)[:300])
	requireContent(t, mine, want)
}
