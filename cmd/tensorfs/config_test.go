package main

import (
	"os"
	"path/filepath"
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
	mnt, notes, err := applyConfig(f, p, nil)
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
	require.Empty(t, notes)

	mnt, _, err = applyConfig(newMountCmd().Flags(), p, []string{"/mnt/arg"})
	require.NoError(t, err)
	require.Equal(t, "/mnt/arg", mnt, "the argument wins")

	for body, want := range map[string]string{
		"mountpoint: /m\nlisten_addr: x\n": `unknown key "listen_addr"`,
		"mountpoint: /m\nconfig: x\n":      `unknown key "config"`,
		"mountpoint: /m\nstreams: many\n":  `key "streams"`,
		"mountpoint: /m\nname: [a, [b]]\n": `key "name": item 2 is not a scalar`,
		"mountpoint: /m\nname: a\nname: b": `already defined`,
		"name: a\n":                        "no MOUNTPOINT",
	} {
		_, _, err := applyConfig(newMountCmd().Flags(), write(body), nil)
		require.ErrorContains(t, err, want, body)
	}
	got, err := configMountpointOf(p)
	require.NoError(t, err)
	require.Equal(t, "/mnt/x", got)
}
