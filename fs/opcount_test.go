package fs

import (
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// TestOpCounts: requests count by op, errnos by op and name; ops never
// requested are left out; an out-of-range status counts under errno 0's
// name rather than being lost.
func TestOpCounts(t *testing.T) {
	var c OpCounts
	require.Empty(t, c.Snapshot())
	c.count(opSetxattr, fuse.OK)
	c.count(opSetxattr, fuse.Status(syscall.EINVAL))
	c.count(opSetxattr, fuse.Status(syscall.EINVAL))
	c.count(opLookup, fuse.ENOENT)
	c.count(opRead, fuse.Status(1000))
	got := c.Snapshot()
	require.Equal(t, []OpCount{
		{Op: "lookup", Requests: 1, Errors: map[string]int64{"ENOENT": 1}},
		{Op: "setxattr", Requests: 3, Errors: map[string]int64{"EINVAL": 2}},
		{Op: "read", Requests: 1, Errors: map[string]int64{"errno 0": 1}},
	}, got)
}
