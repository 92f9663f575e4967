package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/xattrs"
)

// cp follows its own record: newer than the baseline, asked for by its own
// process, with its src and dst; of several, the newest (a pull that fell
// back from IPC to TCP). Concurrent copies of the same src and dst by other
// processes, and older copies by this one, are not it.
func TestCpPicksItsOwnRecord(t *testing.T) {
	m := &cpMonitor{srcs: []string{"/kv/x"}, dsts: []string{"b:/kv/x", "/kv/x"}, pid: 100, maxID: 7}
	rec := func(id uint64, pid int, src, dst string, total int64) xattrs.Record {
		return xattrs.Record{ID: id, PID: pid, Src: src, Dst: dst, BytesTotal: total}
	}
	recs := []xattrs.Record{
		rec(6, 100, "/kv/x", "b:/kv/x", 10), // before the baseline
		rec(8, 200, "/kv/x", "b:/kv/x", 10), // another process, same src and dst
		rec(9, 100, "/kv/x", "b:/kv/y", 10), // another dst
		rec(10, 100, "/kv/x", "b:/kv/x", 0), // ours, size not known yet
		rec(11, 300, "/kv/x", "b:/kv/x", 10),
	}
	require.Equal(t, uint64(10), m.pick(recs, false).ID)
	require.Nil(t, m.pick(recs, true), "no record of ours has a size yet")
	recs = append(recs, rec(12, 100, "/kv/x", "b:/kv/x", 10))
	require.Equal(t, uint64(12), m.pick(recs, true).ID)
	require.Nil(t, m.pick(recs[:2], false))
}
