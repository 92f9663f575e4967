package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/transfer"
)

// TestSpinFlag: --spin defaults to DefaultSpin on a host of 4 CPUs or more
// and to 0 on a smaller one; a value given (on the command line, or by a
// config file key, which sets the flag) wins on either; one outside 0..1s
// is refused with its name.
func TestSpinFlag(t *testing.T) {
	parse := func(args ...string) *peerFlags {
		var p peerFlags
		f := pflag.NewFlagSet("mount", pflag.ContinueOnError)
		p.register(f)
		require.NoError(t, f.Parse(args))
		return &p
	}
	require.Equal(t, transfer.DefaultSpin, parse().spinFor(16))
	require.Equal(t, time.Duration(0), parse().spinFor(2))
	require.Equal(t, time.Duration(0), parse("--spin", "0").spinFor(16))
	require.Equal(t, 300*time.Microsecond, parse("--spin", "300us").spinFor(2))
	for _, bad := range []string{"-1ms", "2s"} {
		p := parse("--spin", bad, "--name", "n", "--host-id", "h")
		_, err := p.config()
		require.ErrorContains(t, err, "--spin")
	}
	p := parse("--spin", "500us", "--name", "n", "--host-id", "h")
	cfg, err := p.config()
	require.NoError(t, err)
	require.Equal(t, 500*time.Microsecond, cfg.Spin)
}

// TestChecksumFlag: --checksum is xxh3 by default, crc32c and none set
// theirs, anything else is refused with its name and the choices.
func TestChecksumFlag(t *testing.T) {
	config := func(args ...string) (transfer.Config, error) {
		var p peerFlags
		f := pflag.NewFlagSet("mount", pflag.ContinueOnError)
		p.register(f)
		require.NoError(t, f.Parse(append(args, "--name", "n", "--host-id", "h")))
		return p.config()
	}
	cfg, err := config()
	require.NoError(t, err)
	require.Equal(t, transfer.ChecksumXXH3, cfg.Checksum)
	for _, k := range []transfer.Checksum{transfer.ChecksumXXH3, transfer.ChecksumCRC32C, transfer.ChecksumNone} {
		cfg, err = config("--checksum", k.String())
		require.NoError(t, err)
		require.Equal(t, k, cfg.Checksum)
	}
	_, err = config("--checksum", "md5")
	require.ErrorContains(t, err, `--checksum "md5": want xxh3, crc32c or none`)
}
