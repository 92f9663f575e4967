package transfer

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestOpenExportsRefusesOtherFiles: an IPC handle must name a tensorfs memfd;
// a peer cannot make the daemon read any other file of this host through it.
func TestOpenExportsRefusesOtherFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(p, []byte("private"), 0o600))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	other, err := unix.MemfdCreate("not-tensorfs", 0)
	require.NoError(t, err)
	defer unix.Close(other)
	for _, h := range []string{
		"memfd:/proc/" + itoa(os.Getpid()) + "/fd/" + itoa(int(f.Fd())),
		"memfd:/proc/" + itoa(os.Getpid()) + "/fd/" + itoa(other),
		"memfd:/etc/passwd",
		"cuda:00",
	} {
		_, err := (&Service{}).openHandle(h)
		require.True(t, errors.Is(err, errNoIPC), "%s: %v", h, err)
	}
	ok, err := unix.MemfdCreate("tensorfs", 0)
	require.NoError(t, err)
	defer unix.Close(ok)
	m, err := (&Service{}).openHandle("memfd:/proc/" + itoa(os.Getpid()) + "/fd/" + itoa(ok))
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

func itoa(n int) string { return strconv.Itoa(n) }
