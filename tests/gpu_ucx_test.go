//go:build ucx

package tests

import (
	"fmt"
	"math/rand"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/xattrs"
)

// TestGPUUCX: GPU memory on cuda:0 between two daemons of different host
// ids whose bytes move on UCX over shared memory (UCX_TLS=sm,self; issue
// 17, item 5): one-sided on cma with a UCX that does RMA on it (1.19),
// emulated with Debian's 1.13; neither detects a dead peer, hence
// --ucx-any-endpoint.
// Debian's UCX has no CUDA support, so each side stages its GPU memory
// through host memory (the log says so): a whole-tensor push, an in-place
// range, a 1000-line scatter into the peer's GPU tensor (one range-list
// descriptor) and a range-list pull back into GPU memory here; every byte
// lands, the destinations keep mr_id, ipc_id and generation, the copies
// are path ucx, and no pin is left. Skips without a GPU.
func TestGPUUCX(t *testing.T) {
	requireGPU(t)
	t.Setenv("UCX_TLS", "sm,self")
	ds := cluster(t, []string{"a", "b"}, "--device", "cuda:0", "--transport", "ucx", "--ucx-any-endpoint", "--timeout", "10s")
	a, b := ds["a"], ds["b"]
	const n, blk = 1000, 8 << 10
	src := make([]byte, n*blk)
	rand.New(rand.NewSource(11)).Read(src)
	writeTensor(t, a.path("src"), src)
	require.Equal(t, "cuda:0", getx(t, a.path("src"), xattrs.Device))

	// A whole tensor, new on b.
	setx(t, a.path("src"), xattrs.CopyTo, "b:/whole")
	requireContent(t, b.path("whole"), src)
	require.Equal(t, "cuda:0", getx(t, b.path("whole"), xattrs.Device))

	// In place: one range, then 1000 scattered blocks in one call.
	zeros(t, b.path("cache"), 2*n*blk)
	before := ids(t, b.path("cache"))
	want := make([]byte, 2*n*blk)
	setx(t, a.path("src"), xattrs.CopyTo, fmt.Sprintf("@4096+%d b:/cache@%d", blk, 3*blk))
	copy(want[3*blk:], src[4096:4096+blk])
	perm := rand.New(rand.NewSource(12)).Perm(2 * n)[:n]
	var lines []string
	for i, j := range perm {
		lines = append(lines, fmt.Sprintf("@%d+%d b:/cache@%d", i*blk, blk, j*blk))
		copy(want[j*blk:], src[i*blk:(i+1)*blk])
	}
	setx(t, a.path("src"), xattrs.CopyTo, strings.Join(lines, "\n"))
	requireContent(t, b.path("cache"), want)
	require.Equal(t, before, ids(t, b.path("cache")), "kept in place")

	// A range-list pull of b's cache back into a GPU tensor here.
	zeros(t, a.path("back"), int64(n*blk))
	backIDs := ids(t, a.path("back"))
	lines = lines[:0]
	for i, j := range perm {
		lines = append(lines, fmt.Sprintf("b:/cache@%d+%d @%d", j*blk, blk, i*blk))
	}
	setx(t, a.path("back"), xattrs.CopyFrom, strings.Join(lines, "\n"))
	requireContent(t, a.path("back"), src)
	require.Equal(t, backIDs, ids(t, a.path("back")))

	st := a.stats()
	require.EqualValues(t, 4, st.Copies.UCX, "%+v", st.Copies)
	require.Zero(t, st.Copies.TCP, "%+v", st.Copies)
	for _, d := range []*daemon{a, b} {
		require.Contains(t, d.log.String(), "stage through host memory", "the log says GPU memory is staged")
		require.Zero(t, d.stats().Live.Pins)
	}
	for _, p := range []string{a.path("src"), a.path("back"), b.path("whole"), b.path("cache")} {
		require.NoError(t, os.Remove(p))
	}
}
