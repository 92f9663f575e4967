package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// asNobody runs a command as uid/gid 65534 and returns its combined output.
func asNobody(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestPermissions: mode bits and ownership are honoured by the kernel
// (default_permissions): ipc_handle needs read permission, actions and
// template changes need write permission, and without --allow-other other
// users cannot enter the mount at all.
func TestPermissions(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	if _, err := exec.LookPath("getfattr"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("getfattr (Debian package attr) is needed; .ci/run installs it")
		}
		t.Skip("getfattr (Debian package attr) is not installed here")
	}

	private := startDaemon(t)
	// The mountpoint's parents are 0700 temp dirs: open them for the other user.
	for p := private.mnt; p != "/tmp" && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o755)
	}
	out, err := asNobody("stat", private.mnt)
	require.Error(t, err, "without --allow-other another user cannot use the mount: %s", out)

	d := startDaemon(t, "--allow-other")
	for p := d.mnt; p != "/tmp" && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o755)
	}
	secret, shared := d.path("secret"), d.path("shared")
	require.NoError(t, os.WriteFile(secret, []byte("k"), 0o600))
	require.NoError(t, os.WriteFile(shared, []byte("k"), 0o644))

	out, err = asNobody("getfattr", "--only-values", "-n", "user.tensorfs.ipc_handle", shared)
	require.NoError(t, err, out)
	require.Contains(t, out, "memfd:/proc/")
	out, err = asNobody("getfattr", "--only-values", "-n", "user.tensorfs.ipc_handle", secret)
	require.Error(t, err)
	require.Contains(t, out, "Permission denied")
	out, err = asNobody("cat", secret)
	require.Error(t, err, out)

	// Writing an xattr (an action, a dtype) needs write permission.
	out, err = asNobody("setfattr", "-n", "user.tensorfs.dtype", "-v", "I8", shared)
	require.Error(t, err)
	require.Contains(t, out, "Permission denied")
	require.Equal(t, "U8", getx(t, shared, "user.tensorfs.dtype"))
	out, err = asNobody("setfattr", "-n", "user.tensorfs.shape", "-v", "4", d.mnt)
	require.Error(t, err, "the root directory is 0755 root: %s", out)
	out, err = asNobody("touch", d.path("intruder"))
	require.Error(t, err, out)

	// chmod and chown are kept and enforced.
	require.NoError(t, os.Chmod(secret, 0o644))
	out, err = asNobody("getfattr", "--only-values", "-n", "user.tensorfs.ipc_handle", secret)
	require.NoError(t, err, out)
	require.NoError(t, os.Chown(shared, 65534, 65534))
	out, err = asNobody("setfattr", "-n", "user.tensorfs.dtype", "-v", "I8", shared)
	require.NoError(t, err, out)
	require.Equal(t, "I8", getx(t, shared, "user.tensorfs.dtype"))
	var st unix.Stat_t
	require.NoError(t, unix.Stat(shared, &st))
	require.EqualValues(t, 65534, st.Uid)

	require.NoError(t, os.Remove(secret))
	require.NoError(t, os.Remove(shared))
	d.requireClean()
	private.requireClean()
}
