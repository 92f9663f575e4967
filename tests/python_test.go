package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// findPython returns a python3 that can import numpy: $TENSORFS_PYTHON, the
// python3 on PATH, or Debian's /usr/bin/python3 (a pyenv or venv python3 on
// PATH may lack numpy while Debian's python3-numpy is installed). It skips
// the test, saying so, when there is none: .ci/run installs python3 and
// python3-numpy.
func findPython(t *testing.T) string {
	t.Helper()
	var cands []string
	if p := os.Getenv("TENSORFS_PYTHON"); p != "" {
		cands = append(cands, p)
	}
	if p, err := exec.LookPath("python3"); err == nil {
		cands = append(cands, p)
	}
	cands = append(cands, "/usr/bin/python3")
	for _, c := range cands {
		if exec.Command(c, "-c", "import numpy").Run() == nil {
			return c
		}
	}
	t.Skipf("no python3 that imports numpy (tried %s): apt-get install python3 python3-numpy", strings.Join(cands, ", "))
	return ""
}

// runPython runs python args in dir (relative to the repository root) with
// env added, under a 5-minute limit, and returns its combined output and
// error.
func runPython(t *testing.T, py, dir string, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Dir = filepath.Join("..", dir)
	cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// pythonModes are the two ways two daemons of one machine reach each other:
// as two hosts (different --host-id: TCP) and as one host (IPC).
var pythonModes = []struct {
	name  string
	extra []string
}{
	{"tcp", nil},
	{"ipc", []string{"--host-id", "one-host"}},
}

// pythonSuite runs python/test_tensorfs.py's selected tests against two
// daemons a and b that know each other, then requires both clean.
func pythonSuite(t *testing.T, selection ...string) {
	py := findPython(t)
	for _, mode := range pythonModes {
		t.Run(mode.name, func(t *testing.T) {
			ds := cluster(t, []string{"a", "b"}, mode.extra...)
			env := []string{
				"TENSORFS_MOUNT_A=" + ds["a"].mnt, "TENSORFS_MOUNT_B=" + ds["b"].mnt,
				"TENSORFS_NAME_A=a", "TENSORFS_NAME_B=b",
			}
			out, err := runPython(t, py, "python", env, append([]string{"-m", "unittest", "-v"}, selection...)...)
			t.Log("\n" + out)
			require.NoError(t, err, "python3 -m unittest %s failed (output above)", strings.Join(selection, " "))
			require.Contains(t, out, "\nOK")
			require.NotContains(t, out, "skipped=", "tests skipped: the mounts were not seen")
			ds["a"].requireClean()
			ds["b"].requireClean()
		})
	}
}

// TestPythonClient: the client module's whole-tensor surface (create/info,
// open_numpy mappings both ways, copy_to/copy_from a peer, batch, a batch
// split over 64 KiB, wait_for, errors with errno and reason).
func TestPythonClient(t *testing.T) {
	pythonSuite(t, "test_tensorfs.Refs", "test_tensorfs.Tensors", "test_tensorfs.Copies")
}

// TestPythonInPlace: in-place copies (ranges) through the client: a mapping
// made before the copy sees the new bytes, ids and generation are kept, bytes
// outside the range are untouched, bad ranges write nothing; binary range
// lists from arrays (their encoding, then copies with them).
func TestPythonInPlace(t *testing.T) {
	pythonSuite(t, "test_tensorfs.BinaryRanges", "test_tensorfs.InPlace")
}
