package tests

import (
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// TestRKeyXattr: with UCX built in (and --transport auto, the default), a
// host tensor's memory region is mapped with UCX and user.tensorfs.rkey is
// its packed rkey in hex, listed, read-only, and a new allocation (a
// truncate past the capacity) is a new region with its own mapping; with
// --transport tcp, or in a build without UCX, there is no rkey (ENODATA,
// not listed), and --transport ucx is refused in one line by a build
// without UCX. A --transport that is not one is refused by every build.
func TestRKeyXattr(t *testing.T) {
	d := startDaemon(t)
	p := d.path("kv")
	require.NoError(t, os.WriteFile(p, make([]byte, 64<<10), 0o644))
	if ucxBuild {
		k := getx(t, p, xattrs.RKey)
		b, err := hex.DecodeString(k)
		require.NoError(t, err, "%q", k)
		require.NotEmpty(t, b)
		require.Contains(t, listx(t, p), xattrs.RKey)
		require.ErrorIs(t, unix.Setxattr(p, xattrs.RKey, []byte("00"), 0), syscall.EPERM)
		mr := getx(t, p, xattrs.MRID)
		require.NoError(t, os.Truncate(p, 64<<20))
		require.NotEqual(t, mr, getx(t, p, xattrs.MRID), "reallocated")
		_, err = hex.DecodeString(getx(t, p, xattrs.RKey))
		require.NoError(t, err, "the new region is mapped too")
		require.NoError(t, os.Remove(p))

		tcp := startDaemon(t, "--transport", "tcp")
		q := tcp.path("kv")
		require.NoError(t, os.WriteFile(q, make([]byte, 4096), 0o644))
		_, err = getxErr(q, xattrs.RKey)
		require.ErrorIs(t, err, syscall.ENODATA, "--transport tcp maps nothing")
	} else {
		_, err := getxErr(p, xattrs.RKey)
		require.ErrorIs(t, err, syscall.ENODATA)
		require.False(t, slices.Contains(listx(t, p), xattrs.RKey))
		mnt := t.TempDir()
		out, err := exec.Command(bin, "mount", mnt, "--transport", "ucx").CombinedOutput()
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "%v: %s", err, out)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		require.Len(t, lines, 1, "%s", out)
		require.Contains(t, lines[0], "built without UCX")
		require.False(t, mounted(mnt))
	}
	mnt := t.TempDir()
	out, err := exec.Command(bin, "mount", mnt, "--transport", "rdma").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), `--transport "rdma": want auto, tcp or ucx`)
	require.False(t, mounted(mnt))
	// --ucx-any-endpoint needs UCX: refused on TCP (and without UCX
	// built in).
	out, err = exec.Command(bin, "mount", mnt, "--transport", "tcp", "--ucx-any-endpoint").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "--ucx-any-endpoint: no UCX here")
	require.False(t, mounted(mnt))
}
