package tests

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// cli runs the binary and returns its stdout, its stderr and its exit
// status (-1 when it did not run).
func cli(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("%v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// cliOK runs the binary, requiring exit 0, and returns its stdout.
func cliOK(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, code := cli(t, args...)
	require.Zero(t, code, "%v: %s%s", args, out, errs)
	return out
}

// cliEntry is the part of ls and stat's --json objects the tests check.
type cliEntry struct {
	Name       string  `json:"name"`
	Path       string  `json:"path"`
	Type       string  `json:"type"`
	DType      string  `json:"dtype"`
	Shape      []int64 `json:"shape"`
	NBytes     *int64  `json:"nbytes"`
	Device     string  `json:"device"`
	MRID       *uint64 `json:"mr_id"`
	IPCID      *uint64 `json:"ipc_id"`
	IPCOffset  *int64  `json:"ipc_offset"`
	Generation *uint64 `json:"generation"`
	Template   *struct {
		DType string  `json:"dtype"`
		Shape []int64 `json:"shape"`
	} `json:"template"`
}

// TestCLIStatusLsStat: status, ls and stat, as text and --json, agree with
// the mount's xattrs and statfs for a mount holding a template directory
// with a tensor in it, an allocated tensor and an empty file.
func TestCLIStatusLsStat(t *testing.T) {
	d := startDaemon(t, "--name", "nodeA", "--peer", "b=127.0.0.1:9")
	mkTemplateDir(t, d.path("kv"), "bfloat16", "16,8,128")
	require.NoError(t, os.WriteFile(d.path("kv", "b0"), nil, 0o644)) // 32768 bytes, registered
	require.NoError(t, os.WriteFile(d.path("w"), make([]byte, 4096), 0o644))
	require.NoError(t, os.WriteFile(d.path("empty"), nil, 0o644))
	d.requireLeases(0)

	// status: node, device, peers; errors only when stats carries them.
	out := cliOK(t, "status", d.mnt)
	for _, want := range []string{"node:", "nodeA", "mount:", d.mnt, "default device:", "capacity", "live (all devices):", "3 tensors", "peers: 1", "127.0.0.1:9", "configured", "transfers running: 0"} {
		require.Contains(t, out, want)
	}
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(getx(t, d.mnt, xattrs.StatsName)), &raw))
	_, hasErrors := raw["errors"]
	require.Equal(t, hasErrors, strings.Contains(out, "recent errors:"), "recent errors are shown exactly when stats has them:\n%s", out)

	var st struct {
		Mount  string `json:"mount"`
		Node   string `json:"node"`
		Device struct {
			Capacity, Used, Free uint64
		} `json:"device"`
		Devices   []xattrs.DeviceUse `json:"devices"`
		Live      xattrs.Live        `json:"live"`
		Peers     []struct{ Name, Addr, Source, State string }
		Transfers []xattrs.Record `json:"transfers"`
	}
	require.NoError(t, json.Unmarshal([]byte(cliOK(t, "status", "--json", d.path("kv"))), &st), "any path on the mount names it")
	require.Equal(t, d.mnt, st.Mount)
	require.Equal(t, "nodeA", st.Node)
	var sf syscall.Statfs_t
	require.NoError(t, syscall.Statfs(d.mnt, &sf))
	require.EqualValues(t, sf.Blocks*uint64(sf.Bsize), st.Device.Capacity)
	require.Equal(t, st.Device.Capacity, st.Device.Used+st.Device.Free)
	// Every device, default first, with its capacity and use (host here:
	// the default; a GPU host lists its GPUs after it).
	require.NotEmpty(t, st.Devices)
	require.True(t, st.Devices[0].Default)
	require.EqualValues(t, st.Device.Capacity, st.Devices[0].Total)
	require.GreaterOrEqual(t, st.Devices[0].Used, int64(32768+4096))
	require.Contains(t, out, "device "+st.Devices[0].Name+":")
	require.Equal(t, 3, st.Live.Tensors)
	require.EqualValues(t, 32768+4096, st.Live.Bytes)
	require.Len(t, st.Peers, 1)
	require.Equal(t, "b", st.Peers[0].Name)
	require.Equal(t, "configured", st.Peers[0].State)
	require.Empty(t, st.Transfers)

	// ls: names, -l's table, --json.
	require.Equal(t, "empty\nkv/\nw\n", cliOK(t, "ls", d.mnt))
	rows := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(cliOK(t, "ls", "-l", d.mnt)), "\n")[1:] {
		f := strings.Fields(l)
		rows[f[len(f)-1]] = f
	}
	require.Equal(t, []string{"dir", "BF16", "16,8,128", "-", "-", "kv/"}, rows["kv/"], "a directory shows its template")
	dev := getx(t, d.path("w"), xattrs.Device)
	require.Equal(t, []string{"tensor", "U8", "4096", "4096", dev, "w"}, rows["w"])
	require.Equal(t, []string{"tensor", "-", "-", "0", dev, "empty"}, rows["empty"])
	out = cliOK(t, "ls", "-l", d.path("kv"))
	require.Contains(t, out, "BF16")
	require.Contains(t, out, "32768")
	var ents []cliEntry
	require.NoError(t, json.Unmarshal([]byte(cliOK(t, "ls", "--json", d.mnt)), &ents))
	require.Len(t, ents, 3)
	require.Equal(t, "kv", ents[1].Name)
	require.Equal(t, "dir", ents[1].Type)
	require.Equal(t, "BF16", ents[1].Template.DType)
	require.Equal(t, []int64{16, 8, 128}, ents[1].Template.Shape)
	require.Equal(t, "/w", ents[2].Path)
	require.EqualValues(t, 4096, *ents[2].NBytes)
	require.Nil(t, ents[0].MRID, "an empty file has no registration")

	// stat: every attribute, as the xattrs say.
	b0 := d.path("kv", "b0")
	out = cliOK(t, "stat", b0)
	for _, kv := range [][2]string{{"path", "/kv/b0"}, {"dtype", "BF16"}, {"shape", "16,8,128"}, {"nbytes", "32768 (32 KiB)"}, {"device", dev},
		{"mr_id", getx(t, b0, xattrs.MRID)}, {"ipc_id", getx(t, b0, xattrs.IPCID)}, {"ipc_offset", getx(t, b0, xattrs.IPCOffset)}, {"generation", getx(t, b0, xattrs.Generation)}} {
		require.Regexp(t, "(?m)^"+kv[0]+`: +`+regexpQuote(kv[1])+"$", out)
	}
	require.NotContains(t, out, "memfd:", "the IPC handle, a capability, is not printed")
	var e cliEntry
	require.NoError(t, json.Unmarshal([]byte(cliOK(t, "stat", "--json", b0)), &e))
	require.Equal(t, "tensor", e.Type)
	require.Equal(t, "BF16", e.DType)
	require.Equal(t, []int64{16, 8, 128}, e.Shape)
	require.EqualValues(t, 32768, *e.NBytes)
	require.Equal(t, getx(t, b0, xattrs.MRID), strconv.FormatUint(*e.MRID, 10))
	require.Equal(t, getx(t, b0, xattrs.IPCID), strconv.FormatUint(*e.IPCID, 10))
	require.Equal(t, getx(t, b0, xattrs.IPCOffset), strconv.FormatInt(*e.IPCOffset, 10))
	require.Equal(t, getx(t, b0, xattrs.Generation), strconv.FormatUint(*e.Generation, 10))
	require.Regexp(t, `(?m)^type: +dir$`, cliOK(t, "stat", d.path("kv")))

	require.NoError(t, os.RemoveAll(d.path("kv")))
	require.NoError(t, os.Remove(d.path("w")))
	require.NoError(t, os.Remove(d.path("empty")))
	d.requireClean()
}

func regexpQuote(s string) string {
	return strings.NewReplacer(`(`, `\(`, `)`, `\)`, `.`, `\.`, `+`, `\+`).Replace(s)
}

// TestCLINotOnMount: status, ls and stat of a path that is not on a
// tensorfs mount, or does not exist, fail with one line.
func TestCLINotOnMount(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"status", dir}, {"ls", dir}, {"ls", "-l", dir}, {"stat", dir}, {"status", "--json", dir}, {"stat", dir + "/missing"}} {
		out, errs, code := cli(t, args...)
		require.NotZero(t, code, "%v", args)
		require.Empty(t, out, "%v", args)
		lines := strings.Split(strings.TrimSpace(errs), "\n")
		require.Len(t, lines, 1, "%v: %s", args, errs)
		want := "not on a tensorfs mount"
		if strings.HasSuffix(args[len(args)-1], "missing") {
			want = "No such file or directory"
		}
		require.Contains(t, lines[0], want, "%v", args)
		require.True(t, strings.HasPrefix(lines[0], "tensorfs: "+args[0]+" "), "%q", lines[0])
	}
}

// TestCLIWait: wait succeeds on a live mount, and on one that a mount
// started beside it brings up; it fails with one line at its timeout on a
// plain directory and a missing one.
func TestCLIWait(t *testing.T) {
	d := startDaemon(t)
	cliOK(t, "wait", d.mnt)

	dir := t.TempDir()
	for _, tc := range []struct{ dir, why string }{{dir, "no tensorfs mounted there"}, {dir + "/missing", "no such directory"}} {
		out, errs, code := cli(t, "wait", tc.dir, "--timeout", "200ms")
		require.Equal(t, 1, code, "%s%s", out, errs)
		require.Equal(t, "tensorfs: wait "+tc.dir+": not up after 200ms: "+tc.why+"\n", errs)
	}

	// The scripts' form: tensorfs mount ... & tensorfs wait MNT.
	mnt := t.TempDir()
	ours.Store(mnt, true)
	m := daemonCommand(bin, testDeviceFlags([]string{"mount", mnt, "--max-memory", "16MiB"})...)
	log := &testutil.SyncBuffer{}
	m.Stderr = log
	require.NoError(t, m.Start())
	defer func() {
		m.Process.Signal(syscall.SIGTERM)
		require.NoError(t, m.Wait(), log.String())
		require.False(t, mounted(mnt))
	}()
	cliOK(t, "wait", mnt, "--timeout", "30s")
	getx(t, mnt, xattrs.StatsName) // up: it answers
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "t"), []byte("x"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(mnt, "t")))
	// Signalled only once it says it is ready (TestStaleMountCleanedUp:
	// killed during go-fuse's own probe, a daemon can hang in exit).
	waitReady(t, mnt, log)
}

// TestCLIMissingArgumentUsage: a command without its argument names what
// is missing, prints its usage and exits 2.
func TestCLIMissingArgumentUsage(t *testing.T) {
	for _, tc := range []struct{ cmd, missing string }{
		{"mount", "MOUNTPOINT"}, {"unmount", "MOUNTPOINT"}, {"cp", "SRC and DST"}, {"import", "FILE.safetensors and DIR"},
		{"status", "MOUNT"}, {"ls", "PATH"}, {"stat", "PATH"}, {"wait", "MOUNT"},
	} {
		out, errs, code := cli(t, tc.cmd)
		require.Equal(t, 2, code, "%s: %s%s", tc.cmd, out, errs)
		lines := strings.Split(errs, "\n")
		require.Equal(t, "tensorfs: "+tc.cmd+": missing "+tc.missing, lines[0])
		require.Contains(t, errs, "\nUsage:\n  tensorfs "+tc.cmd+" ")
		require.Contains(t, errs, "--help")
	}
	_, errs, code := cli(t, "cp", "a")
	require.Equal(t, 2, code)
	require.True(t, strings.HasPrefix(errs, "tensorfs: cp: missing DST\n"), "%s", errs)
}

// TestCLIUnmountErrors: unmount of a path that does not exist, of a file,
// and of a directory with no tensorfs on it each says which.
func TestCLIUnmountErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, tc := range []struct{ path, want string }{
		{dir + "/missing", "no such directory"},
		{file, "not a directory (not a tensorfs mount)"},
		{dir, "not a tensorfs mount (nothing is mounted there)"},
		{"/proc", "not a tensorfs mount (a proc filesystem is mounted there)"},
	} {
		out, errs, code := cli(t, "unmount", tc.path)
		require.Equal(t, 1, code, "%s: %s%s", tc.path, out, errs)
		require.Equal(t, "tensorfs: unmount "+tc.path+": "+tc.want+"\n", errs)
	}
}

// TestCLIVersionRevision: a binary built from a git checkout prints its
// revision and commit time (from the build info), and -X main.version
// replaces the module version. The binary is built from a clone of HEAD:
// the go command stamps no VCS information in a git worktree (its .git is
// a file) nor with -buildvcs=false, which this environment may set.
func TestCLIVersionRevision(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git to stamp a revision with")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): no revision to stamp", err)
	}
	clone := t.TempDir()
	out, err := exec.Command("git", "clone", "--quiet", "--shared", strings.TrimSpace(string(top)), clone).CombinedOutput()
	require.NoError(t, err, "%s", out)
	rev, err := exec.Command("git", "-C", clone, "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	// Without -X the version is the module's as the go command stamps it
	// (a pseudo-version made from the revision, since Go 1.24).
	for _, tc := range []struct{ ldflags, version string }{{"", `\S+`}, {"-X main.version=v9.9.9-test", `v9\.9\.9-test`}} {
		exe := filepath.Join(t.TempDir(), "tensorfs")
		build := exec.Command("go", "build", "-buildvcs=true", "-trimpath", "-ldflags", tc.ldflags, "-o", exe, "./cmd/tensorfs")
		build.Dir = clone
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		require.NoError(t, err, "%s", out)
		v, err := exec.Command(exe, "version").Output()
		require.NoError(t, err)
		line := strings.TrimSpace(string(v))
		require.Regexp(t, `^tensorfs `+tc.version+` \(revision `+strings.TrimSpace(string(rev))[:12]+`, [0-9-]+T[0-9:]+Z\) go`, line)
		require.NotContains(t, line, "modified", "a fresh clone is clean")
	}
}

// TestStatusPeerReached: a --peer is "configured" until a handshake with it
// succeeds, whichever side dials; then stats gives when, its host id and
// whether it shares this host, and status shows it "reached" (a new user
// read "configured" after many copies as nothing known of the peer).
func TestStatusPeerReached(t *testing.T) {
	ds := cluster(t, []string{"a", "b"})
	a, b := ds["a"], ds["b"]
	type peer struct{ Name, State, Reached string }
	status := func(d *daemon) map[string]peer {
		var st struct{ Peers []peer }
		require.NoError(t, json.Unmarshal([]byte(cliOK(t, "status", "--json", d.mnt)), &st))
		out := map[string]peer{}
		for _, p := range st.Peers {
			out[p.Name] = p
		}
		return out
	}
	require.Equal(t, "configured", status(a)["b"].State)
	require.Empty(t, a.stats().Peers["b"].Reached)
	require.NoError(t, os.WriteFile(a.path("x"), []byte("tensor bytes"), 0o644))
	setx(t, a.path("x"), xattrs.CopyTo, "b:/x")
	for _, c := range []struct {
		d    *daemon
		peer string
	}{{a, "b"}, {b, "a"}} { // a dialled b: both handshakes' ends know
		p := c.d.stats().Peers[c.peer]
		require.NotEmpty(t, p.Reached, "%s's stats of %s", c.d.mnt, c.peer)
		require.Equal(t, "host-"+c.peer, p.HostID)
		require.False(t, p.SameHost)
		require.NotEmpty(t, p.Instance)
		require.Equal(t, "reached", status(c.d)[c.peer].State)
	}
	out := cliOK(t, "status", a.mnt)
	require.Regexp(t, `(?m)^\s+b\s+127\.0\.0\.1:\d+\s+peer\s+reached\s+no\s`, out)
}
