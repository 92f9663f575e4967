package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// notifyMsg is one datagram the daemon sent to $NOTIFY_SOCKET, with
// whether the mount was usable (mounted, and answering a statfs) when it
// arrived: checked by the reader as it took the datagram, not later.
type notifyMsg struct {
	state  string
	usable bool
}

// listenNotify opens a unix datagram socket as systemd's notify socket
// and returns its path and the datagrams, each with the state of mnt at
// its arrival.
func listenNotify(t *testing.T, mnt string) (string, <-chan notifyMsg) {
	t.Helper()
	// A short directory: a socket path has at most 107 bytes.
	dir, err := os.MkdirTemp("", "tfs-notify-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	msgs := make(chan notifyMsg, 16)
	go func() {
		defer close(msgs)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			var st unix.Statfs_t
			usable := mounted(mnt) && unix.Statfs(mnt, &st) == nil && st.Type == unix.FUSE_SUPER_MAGIC
			msgs <- notifyMsg{state: string(buf[:n]), usable: usable}
		}
	}()
	return sock, msgs
}

// TestSystemdNotify: a daemon started with $NOTIFY_SOCKET (as systemd's
// Type=notify does) sends READY=1 once its mount is usable, and
// STOPPING=1 when SIGTERM starts its shutdown.
func TestSystemdNotify(t *testing.T) {
	mnt := t.TempDir()
	sock, msgs := listenNotify(t, mnt)
	var ready *notifyMsg
	d := launchOpt(t, mnt, launchOpts{
		env: []string{"NOTIFY_SOCKET=" + sock},
		// Ready when systemd would be told so, not when the log says it.
		ready: func(d *daemon) bool {
			select {
			case m := <-msgs:
				if strings.Contains(m.state, "READY=1") {
					ready = &m
				}
			default:
			}
			return ready != nil
		},
	}, "--listen", fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)))
	require.True(t, ready.usable, "READY=1 (%q) arrived before the mount was usable", ready.state)
	// Usable indeed: a tensor written and read back.
	writeTensor(t, d.path("x"), []byte("ready"))
	requireContent(t, d.path("x"), []byte("ready"))
	require.NoError(t, os.Remove(d.path("x")))
	d.requireClean()

	d.stop()
	var stopping bool
	// The datagram was sent before the daemon exited: it is queued on the
	// socket by now (the wait bounds a broken daemon, it times nothing).
	for !stopping {
		select {
		case m, ok := <-msgs:
			require.True(t, ok, "notify socket closed before STOPPING=1")
			stopping = strings.Contains(m.state, "STOPPING=1")
		case <-time.After(10 * time.Second):
			t.Fatalf("no STOPPING=1 after SIGTERM\n%s", d.log.String())
		}
	}
}

// TestConfigFile: a --config file drives a real mount (the mountpoint,
// device, name, listen address, peers, secret file and log settings all
// from it, the metrics listener too), the command line wins over it, and
// every line of the daemon's log is then a JSON object.
func TestConfigFile(t *testing.T) {
	mnt := t.TempDir()
	secret := secretFile(t, "a shared secret of enough bytes")
	listen := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	metricsAt := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	cfg := filepath.Join(t.TempDir(), "tensorfs.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`# a node's settings
mountpoint: %s
device: host
name: from-file
listen: %s
peer:
  - b=127.0.0.1:1
  - c=127.0.0.1:2
secret-file: %s
timeout: 5s
log-format: json
log-level: info
metrics: %s
`, mnt, listen, secret, metricsAt)), 0o644))

	d := launchOpt(t, mnt, launchOpts{
		noMountArg: true,
		ready: func(d *daemon) bool {
			return mounted(mnt) && strings.Contains(d.log.String(), `"msg":"mounted"`)
		},
	}, "--config", cfg, "--name", "from-cli")

	// A copy inside the mount: its one line at its end, in JSON.
	writeTensor(t, d.path("x"), bytes.Repeat([]byte{7}, 4096))
	setx(t, d.path("x"), xattrs.CopyTo, "/y")
	requireContent(t, d.path("y"), bytes.Repeat([]byte{7}, 4096))
	d.requireLog(`"msg":"copy"`)

	var started, copied map[string]any
	for _, line := range strings.Split(strings.TrimSpace(d.log.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "not a JSON line: %s", line)
		switch {
		case m["msg"] == "mounted":
			started = m
		case m["msg"] == "copy" && m["dst"] == "/y":
			copied = m
		}
	}
	require.NotNil(t, started, d.log.String())
	require.Equal(t, mnt, started["mountpoint"])
	require.Equal(t, "host", started["device"])
	require.Equal(t, "from-cli", started["name"], "the command line wins over the file")
	require.Equal(t, listen, started["listen"])
	require.Equal(t, []any{"b=127.0.0.1:1", "c=127.0.0.1:2"}, started["peers"])
	require.Equal(t, []any{"local", "tcp", "ipc"}, started["transports"])
	// The file's metrics key set --metrics: the listener answers.
	tr := &http.Transport{DisableKeepAlives: true} // no connection left open past the test
	resp, err := (&http.Client{Transport: tr}).Get("http://" + metricsAt + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(body), "tensorfs_tensors")
	require.NotNil(t, copied, d.log.String())
	require.Equal(t, "/x", copied["src"])
	require.Equal(t, "local", copied["path"])
	require.Equal(t, "whole", copied["mode"])
	require.EqualValues(t, 4096, copied["bytes"])
	require.Contains(t, copied, "seconds")

	require.NoError(t, os.Remove(d.path("x")))
	require.NoError(t, os.Remove(d.path("y")))
	d.requireClean()
}

// TestConfigFileErrors: an unknown key is refused naming it, a value a
// flag refuses names its key, and nothing is mounted either way.
func TestConfigFileErrors(t *testing.T) {
	mnt := t.TempDir()
	dir := t.TempDir()
	for _, tc := range []struct{ body, want string }{
		{"mountpoint: " + mnt + "\nlisten-addr: 127.0.0.1:1\n", `unknown key "listen-addr"`},
		{"mountpoint: " + mnt + "\ntimeout: soon\n", `key "timeout"`},
		{"mountpoint: " + mnt + "\npeer: {b: x}\n", `key "peer"`},
		{"device: host\n", "no MOUNTPOINT"},
	} {
		cfg := filepath.Join(dir, "c.yaml")
		require.NoError(t, os.WriteFile(cfg, []byte(tc.body), 0o644))
		out, err := exec.Command(bin, "mount", "--config", cfg).CombinedOutput()
		require.Error(t, err, "%q must be refused: %s", tc.body, out)
		require.Contains(t, string(out), tc.want, tc.body)
		require.False(t, mounted(mnt), "mounted although %q was refused", tc.body)
	}
}

// TestInstallScript: scripts/install.sh into a temporary DESTDIR puts the
// binary, the unit and a default config where the unit expects them; run
// again it changes nothing an operator edited (idempotent), and the unit
// it wrote passes systemd-analyze verify where that is installed.
func TestInstallScript(t *testing.T) {
	dest := t.TempDir()
	install := func() {
		t.Helper()
		out, err := exec.Command("../scripts/install.sh", "--destdir", dest, "--prefix", "/usr/local", "--bin", bin).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	install()
	binPath := filepath.Join(dest, "usr/local/bin/tensorfs")
	unitPath := filepath.Join(dest, "etc/systemd/system/tensorfs.service")
	cfgPath := filepath.Join(dest, "etc/tensorfs/tensorfs.yaml")
	st, err := os.Stat(binPath)
	require.NoError(t, err)
	require.NotZero(t, st.Mode()&0o111, "the binary is executable")
	unit, err := os.ReadFile(unitPath)
	require.NoError(t, err)
	keys := unitKeys(string(unit))
	require.Equal(t, "notify", keys["Service.Type"])
	require.Equal(t, "on-failure", keys["Service.Restart"])
	require.Equal(t, "/usr/local/bin/tensorfs mount --config /etc/tensorfs/tensorfs.yaml", keys["Service.ExecStart"])
	require.Contains(t, keys["Service.ExecStop"], "/usr/local/bin/tensorfs unmount")
	require.Contains(t, keys, "Install.WantedBy")

	// The default config is one the daemon reads: every key known.
	cfg, err := os.ReadFile(cfgPath)
	require.NoError(t, err)
	mnt := t.TempDir()
	check := filepath.Join(t.TempDir(), "check.yaml")
	// Its mountpoint replaced, and an unknown device so that the daemon
	// stops after reading the whole file, before mounting anything.
	body := strings.Replace(string(cfg), "mountpoint: /mnt/tensorfs", "mountpoint: "+mnt, 1)
	require.NoError(t, os.WriteFile(check, []byte(body), 0o644))
	out, err := exec.Command(bin, "mount", "--config", check, "--device", "nosuch").CombinedOutput()
	require.Error(t, err)
	require.NotContains(t, string(out), "unknown key", "the default config has a key the daemon does not know")
	require.Contains(t, string(out), "nosuch", "the daemon got past the config to the device")

	// Again, after an operator's edit of the config: kept, the rest the same.
	require.NoError(t, os.WriteFile(cfgPath, append(cfg, "# edited\n"...), 0o644))
	install()
	got, err := os.ReadFile(cfgPath)
	require.NoError(t, err)
	require.True(t, bytes.HasSuffix(got, []byte("# edited\n")), "install.sh overwrote an edited config")
	unit2, err := os.ReadFile(unitPath)
	require.NoError(t, err)
	require.Equal(t, unit, unit2)

	// systemd's own check, where it is installed: the unit as installed at
	// a prefix that is this DESTDIR, so that the binary it names exists.
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze not installed: unit keys checked above only")
		return
	}
	root := t.TempDir()
	out, err = exec.Command("../scripts/install.sh", "--prefix", root, "--sysconfdir", root+"/etc", "--unitdir", root+"/unit", "--bin", bin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command("systemd-analyze", "verify", filepath.Join(root, "unit", "tensorfs.service")).CombinedOutput()
	if err != nil && bytes.Contains(out, []byte("Failed to")) && bytes.Contains(out, []byte("bus")) {
		t.Skipf("systemd-analyze cannot run here: %s", out)
	}
	require.NoError(t, err, "systemd-analyze verify: %s", out)
	// A key it cannot parse is a warning on FILE:LINE, not a failure.
	require.NotContains(t, string(out), "tensorfs.service:", "systemd-analyze verify warned")
}

// unitKeys reads a systemd unit file as SECTION.Key -> value (the last
// one, for a key given twice).
func unitKeys(unit string) map[string]string {
	keys := map[string]string{}
	section := ""
	for _, line := range strings.Split(unit, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
		default:
			if k, v, ok := strings.Cut(line, "="); ok {
				keys[section+"."+strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
	}
	return keys
}
