package tests

import (
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
