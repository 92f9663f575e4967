package transfer

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSplitRange: the range suffix is the last "@" followed only by a
// range; a trailing bare "@" means none; anything else is the name's.
func TestSplitRange(t *testing.T) {
	for _, c := range []struct {
		in, path string
		r        Range
	}{
		{"/kv/cache", "/kv/cache", Range{}},
		{"/kv/cache@131072", "/kv/cache", Range{Set: true, Off: 131072}},
		{"/kv/cache@0+8192", "/kv/cache", Range{Set: true, Off: 0, Len: 8192, HasLen: true}},
		{"/c@0x10+0x1f", "/c", Range{Set: true, Off: 16, Len: 31, HasLen: true}},
		{"/x@12@", "/x@12", Range{}},
		{"/x@12@4", "/x@12", Range{Set: true, Off: 4}},
		{"/a@b", "/a@b", Range{}},
		{"/a@", "/a", Range{}},
		{"b:/kv@8", "b:/kv", Range{Set: true, Off: 8}},
		{"@0+10", "", Range{Set: true, Len: 10, HasLen: true}},
		// Decimal with leading zeros, never octal (as the range lines'
		// fast parser reads them).
		{"/a@010+010", "/a", Range{Set: true, Off: 10, Len: 10, HasLen: true}},
		{"/a@09", "/a", Range{Set: true, Off: 9}},
	} {
		p, r, err := SplitRange(c.in)
		require.NoError(t, err, c.in)
		require.Equal(t, c.path, p, c.in)
		require.Equal(t, c.r, r, c.in)
		if r.Set && !strings.Contains(c.in, "0x") && !strings.Contains(c.in, "@0") {
			require.Equal(t, c.in[len(p):], r.String(), "%s: String gives the suffix back (decimal)", c.in)
		}
	}
	for _, in := range []string{"/a@99999999999999999999", "/a@1+9223372036854775807", "/a@1+", "/a@-1", "/a@+1", "/c@0x10+0X1", "/a@0x", "/a@12abc"} {
		_, _, err := SplitRange(in)
		require.ErrorIs(t, err, syscall.EINVAL, in)
	}
}

// TestRangeApply: a file's destination range takes the source's length
// (a given one must agree); a directory's is only @0, each tensor whole.
func TestRangeApply(t *testing.T) {
	src := []Meta{{NBytes: 100}}
	got, err := Range{Set: true, Off: 8}.Apply(src, false)
	require.NoError(t, err)
	require.Equal(t, []Meta{{NBytes: 100, InPlace: true, Off: 8}}, got)
	_, err = Range{Set: true, Off: 8, Len: 99, HasLen: true}.Apply(src, false)
	require.ErrorIs(t, err, syscall.EINVAL)
	got, err = Range{Set: true}.Apply([]Meta{{Rel: "a", NBytes: 1}, {Rel: "b", NBytes: 2}}, true)
	require.NoError(t, err)
	require.Equal(t, []Meta{{Rel: "a", NBytes: 1, InPlace: true, Exact: true}, {Rel: "b", NBytes: 2, InPlace: true, Exact: true}}, got)
	_, err = Range{Set: true, Off: 1}.Apply(src, true)
	require.ErrorIs(t, err, syscall.EINVAL)
	got, err = Range{}.Apply(src, false)
	require.NoError(t, err)
	require.Equal(t, src, got)
	require.NoError(t, checkMetas([]Meta{{Rel: "a", InPlace: true, NBytes: 1}, {Rel: "a", InPlace: true, Off: 1, NBytes: 1}}, true), "many ranges of one tensor")
	require.Error(t, checkMetas([]Meta{{Rel: "a", NBytes: 1}, {Rel: "a", NBytes: 1}}, true), "one tensor replaced twice")
	require.Error(t, checkMetas([]Meta{{Rel: "a", NBytes: 1, Off: 3}}, true), "an offset on a whole tensor")
}

// TestCallerPID: a known caller pid is in the record at once.
func TestCallerPID(t *testing.T) {
	s, err := New(Config{}, nil)
	require.NoError(t, err)
	_, end := s.TrackCtx(WithCallerPID(context.Background(), 99), "/a", "b:/a", "tcp", []Meta{{NBytes: 1}})
	require.Equal(t, 99, s.Stats().Transfers.Recent[0].PID)
	end(nil)
}

// TestSecretMismatch: a refused handshake names the side without a
// secret, or says that the two differ, naming both nodes (a node run with
// no secret was told the secrets differ: its own was nil, not empty).
func TestSecretMismatch(t *testing.T) {
	for _, c := range []struct {
		selfNone, peerNone bool
		want               string
	}{
		{false, true, "peer b at 10.0.0.2:7000 has no shared secret (--secret-file) and node a has one"},
		{true, false, "node a has no shared secret (--secret-file) and peer b at 10.0.0.2:7000 has one"},
		{true, true, "neither node a nor peer b at 10.0.0.2:7000 has a shared secret"},
		{false, false, "node a and peer b at 10.0.0.2:7000 hold different shared secrets"},
	} {
		got := secretMismatch("a", c.selfNone, c.peerNone, "b", "10.0.0.2:7000")
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("node without a secret %v, peer without one %v: %q, want %q...", c.selfNone, c.peerNone, got, c.want)
		}
	}
}
