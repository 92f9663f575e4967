package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestApplyConfig: keys set their flags (a list as a repeatable flag's
// items, or comma-joined for --etcd), the command line wins, the
// argument wins over the file's mountpoint, metrics sets --metrics, and
// an unknown key is named.
func TestApplyConfig(t *testing.T) {
	write := func(body string) string {
		p := filepath.Join(t.TempDir(), "c.yaml")
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}
	cmd := newMountCmd()
	f := cmd.Flags()
	require.NoError(t, f.Parse([]string{"--name", "cli"}))
	p := write("mountpoint: /mnt/x\nname: file\nlisten: 127.0.0.1:1\npeer: [b=h:1, c=h:2]\netcd: [http://a:1, http://b:2]\ntimeout: 3s\nmetrics: :9400\n")
	mnt, err := applyConfig(f, p, nil)
	require.NoError(t, err)
	require.Equal(t, "/mnt/x", mnt)
	get := func(name string) string { return f.Lookup(name).Value.String() }
	require.Equal(t, "cli", get("name"), "the command line wins")
	require.Equal(t, "127.0.0.1:1", get("listen"))
	require.Equal(t, "[b=h:1,c=h:2]", get("peer"))
	require.Equal(t, "http://a:1,http://b:2", get("etcd"))
	require.Equal(t, "3s", get("timeout"))
	require.True(t, f.Changed("listen"), "a key reads as a changed flag")
	require.Equal(t, ":9400", get("metrics"))

	mnt, err = applyConfig(newMountCmd().Flags(), p, []string{"/mnt/arg"})
	require.NoError(t, err)
	require.Equal(t, "/mnt/arg", mnt, "the argument wins")

	for body, want := range map[string]string{
		"mountpoint: /m\nlisten_addr: x\n": `unknown key "listen_addr"`,
		"mountpoint: /m\nconfig: x\n":      `unknown key "config"`,
		"mountpoint: /m\nstreams: many\n":  `key "streams"`,
		"mountpoint: /m\nname: [a, [b]]\n": `key "name": item 2 is not a scalar`,
		"mountpoint: /m\nname: a\nname: b": `already defined`,
		"name: a\n":                        "no MOUNTPOINT",
		// Found by trying to break it: a null taken as the name "null", a
		// second document's keys ignored, an unknown key holding a map
		// refused for its type rather than its name.
		"mountpoint: /m\nname: null\n":           `key "name": no value (null)`,
		"mountpoint: /m\nname: ~\n":              `key "name": no value (null)`,
		"mountpoint: /m\n---\ndevice: host\n":    "more than one YAML document",
		"mountpoint: /m\nbase: {device: host}\n": `unknown key "base"`,
		"mountpoint: /m\npeer: [a=h:1, null]\n":  `item 2 is not a scalar`,
	} {
		_, err := applyConfig(newMountCmd().Flags(), write(body), nil)
		require.ErrorContains(t, err, want, body)
	}
	// An anchor's value serves where its alias is written.
	mnt, err = applyConfig(newMountCmd().Flags(), write("mountpoint: /m\ndevice: &d host\nname: *d\n"), nil)
	require.NoError(t, err)
	require.Equal(t, "/m", mnt)
	// Not a regular file, or too large: refused before reading it whole.
	_, err = applyConfig(newMountCmd().Flags(), "/dev/zero", nil)
	require.ErrorContains(t, err, "not a regular file")
	_, err = applyConfig(newMountCmd().Flags(), write("mountpoint: /m\n# "+strings.Repeat("x", maxConfig)+"\n"), nil)
	require.ErrorContains(t, err, "larger than")
	got, err := configMountpointOf(p)
	require.NoError(t, err)
	require.Equal(t, "/mnt/x", got)
}

// TestCheckNodeName: a name a peer path, the mount's source and a log
// line can carry; the rest refused (a, b and a\nb were taken as --name).
func TestCheckNodeName(t *testing.T) {
	for _, ok := range []string{"a", "node-1", "gpu_07.rack3", "ü"} {
		require.NoError(t, checkNodeName(ok), ok)
	}
	for _, bad := range []string{"", "a,b", "a\nb", "a\tb", `a\b`, "-x", "a:b", "a/b", "a b", "a\x00", strings.Repeat("n", 65)} {
		require.Error(t, checkNodeName(bad), "%q", bad)
	}
}
