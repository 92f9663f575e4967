package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// versionString: the -X version wins over the module's; the revision (12
// digits), commit time and dirty flag come from the build info, each only
// when recorded; a binary without build info still prints a line.
func TestVersionString(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "016309a078fbf793ced4a9131daab83f60a17d09"},
		{Key: "vcs.time", Value: "2026-12-02T06:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	require.Equal(t, "tensorfs v1.2.3 (revision 016309a078fb, 2026-12-02T06:00:00Z, modified) go1.26.8", versionString("", bi))
	require.Equal(t, "tensorfs v9.0.0 (revision 016309a078fb, 2026-12-02T06:00:00Z, modified) go1.26.8", versionString("v9.0.0", bi))
	bi.Settings[2].Value = "false"
	require.Equal(t, "tensorfs v1.2.3 (revision 016309a078fb, 2026-12-02T06:00:00Z) go1.26.8", versionString("", bi))
	require.Equal(t, "tensorfs (devel) go1.26.8", versionString("", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}))
	require.Equal(t, "tensorfs (devel)", versionString("", nil))
}

// A missing or extra argument names what is missing from the Use line,
// prints the command's usage after the one error line, and exits 2; a
// failure while running is one line and exits 1.
func TestArgumentErrorsPrintUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		line string
	}{
		{[]string{"mount"}, "tensorfs: mount: missing MOUNTPOINT"},
		{[]string{"cp"}, "tensorfs: cp: missing SRC and DST"},
		{[]string{"cp", "a"}, "tensorfs: cp: missing DST"},
		{[]string{"ls"}, "tensorfs: ls: missing PATH"},
		{[]string{"wait", "a", "b"}, `tensorfs: wait: too many arguments: want MOUNT, got 2 (["a" "b"])`},
		{[]string{"version", "x"}, `tensorfs: version takes no arguments (got ["x"])`},
	} {
		var stderr bytes.Buffer
		root := newRootCmd()
		root.SetArgs(tc.args)
		root.SetOut(&stderr) // usage goes to the command's output otherwise
		require.Equal(t, 2, run(root, &stderr), "%v", tc.args)
		lines := strings.Split(stderr.String(), "\n")
		require.Equal(t, tc.line, lines[0], "%v", tc.args)
		require.Contains(t, stderr.String(), "Usage:\n  tensorfs "+tc.args[0], "%v", tc.args)
	}
	var stderr bytes.Buffer
	root := newRootCmd()
	root.SetArgs([]string{"unmount", "/no/such/dir"})
	require.Equal(t, 1, run(root, &stderr))
	require.Equal(t, "tensorfs: unmount /no/such/dir: no such directory\n", stderr.String())
}

// Every command validates its arguments with positional (so every one
// prints its usage), and --help is not an argument error.
func TestEveryCommandHasArgs(t *testing.T) {
	for _, c := range newRootCmd().Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		require.NotNil(t, c.Args, "%s has no Args validator", c.Name())
	}
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"status", "--help"})
	require.Equal(t, 0, run(root, &out))
	require.Contains(t, out.String(), "tensorfs status MOUNT")
}

// argNames reads the positional arguments of a Use line, flags aside.
func TestArgNames(t *testing.T) {
	require.Equal(t, []string{"PATH"}, argNames("ls [-l] PATH"))
	require.Equal(t, []string{"SRC", "DST"}, argNames("cp SRC DST"))
	require.Equal(t, []string{"[MOUNTPOINT]"}, argNames("nodes [MOUNTPOINT]"))
	require.Empty(t, argNames("version"))
}

// parseShape: the shape xattr's dims; "" is a scalar, [] (not absent).
func TestParseShape(t *testing.T) {
	s, err := parseShape("16,8,128")
	require.NoError(t, err)
	require.Equal(t, []int64{16, 8, 128}, s)
	s, err = parseShape("")
	require.NoError(t, err)
	require.NotNil(t, s)
	require.Empty(t, s)
	b, _ := json.Marshal(entryInfo{Name: "x", Shape: s})
	require.Contains(t, string(b), `"shape":[]`)
	b, _ = json.Marshal(entryInfo{Name: "x"})
	require.NotContains(t, string(b), `"shape"`)
	require.Equal(t, "[]", shapeText(s))
	require.Equal(t, "-", shapeText(nil))
}

// mountSource carries the node's name unless the mount options could not.
func TestMountSource(t *testing.T) {
	require.Equal(t, "tensorfs:a", mountSource("a"))
	require.Equal(t, "tensorfs", mountSource("a,b"))
	require.Equal(t, "tensorfs", mountSource(""))
}

// TestShown: printable names print as they are; one with a newline, a
// tab, an escape or invalid UTF-8 is quoted (a row split, a terminal
// reached by an escape: found by trying to break it).
func TestShown(t *testing.T) {
	require.Equal(t, "block 0 ü", shown("block 0 ü"))
	require.Equal(t, `"a\nb"`, shown("a\nb"))
	require.Equal(t, `"a\tb"`, shown("a\tb"))
	require.Equal(t, `"\x1b[31mred"`, shown("\x1b[31mred"))
	require.Equal(t, `"\xff\xfe"`, shown("\xff\xfe"))
}

// TestDaemonProcExited: unmount's wait for the daemon (daemonProc) sees a
// running process as running, and a dead one as exited while its parent
// has not reaped it (a zombie) and once it has (gone); a process that
// does not hold /dev/fuse is not taken for a daemon.
func TestDaemonProcExited(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	start, state := procState(pid)
	require.NotEmpty(t, start)
	require.NotEqual(t, "Z", state)
	require.False(t, holdsFUSE(pid), "sleep holds no /dev/fuse")
	d := daemonProc{pid: pid, start: start}
	require.False(t, d.exited(50*time.Millisecond), "a running process")
	require.NoError(t, cmd.Process.Kill())
	require.True(t, d.exited(10*time.Second), "killed, not reaped: a zombie")
	_ = cmd.Wait()
	require.True(t, d.exited(0), "reaped: gone")
	require.True(t, daemonProc{pid: pid, start: "1"}.exited(0), "another start time: another process")
}
