//go:build ucx

package ucx

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseLanes: the transports named in ucp_ep_print_info's lanes (UCX
// 1.13's text), path indexes dropped, once each; whether an RMA lane
// reaches registered memory (OneSided).
func TestParseLanes(t *testing.T) {
	tcp := "#                 lane[0]:  0:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am am_bw#0 keepalive wireup\n"
	require.Equal(t, []string{"tcp/lo"}, parseLanes(tcp))
	sm := "#   lane[0]:  8:posix/memory.0 md[4] -> md[4]/posix/memory[8] rma_bw#0 am am_bw#0\n" +
		"#   lane[1]:  9:cma/memory.0 md[5] -> md[5]/cma/memory[9] rma_bw#1\n" +
		"#   lane[2]:  8:posix/memory.0 md[4] -> md[4]/posix/memory[8] rma_bw#2\n"
	require.Equal(t, []string{"cma/memory", "posix/memory"}, parseLanes(sm))
	ib := "#   lane[0]:  3:rc_mlx5/mlx5_0:1.0 md[1] -> md[1]/ib/sysdev[255] rma_bw#0\n"
	require.Equal(t, []string{"rc_mlx5/mlx5_0:1"}, parseLanes(ib))
	require.Empty(t, parseLanes("# no lanes\n"))
	require.False(t, hasRMALane(tcp), "tcp: puts emulated with active messages")
	// UCX 1.13's shared memory lanes, as it prints them on this VM: RMA
	// lanes on posix and sysv, which reach only segments UCX allocated.
	sm113 := "#                 lane[0]:  1:sysv/memory.0 md[1]           -> md[1]/sysv/sysdev[255] am am_bw#0\n" +
		"#                 lane[1]:  2:posix/memory.0 md[2]          -> md[2]/posix/sysdev[255]\n#\n" +
		"#                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)\n" +
		"#                  get[0]: 0..<bcopy>..(inf)\n" +
		"#                  put[1]: 0..<short>..4294967296..<bcopy>..(inf)\n" +
		"#                  get[1]: 0..<bcopy>..(inf)\n#\n#                  rma_bw: mds #\n"
	require.False(t, hasRMALane(sm113), "UCX 1.13's sm: emulated for registered memory")
	require.False(t, hasRMALane(tcp+"#\n#                  rma_bw: mds #\n"), "an empty rma_bw list is no lane")
	require.True(t, hasRMALane(sm), "cma's rma_bw lane reaches registered memory")
	require.False(t, hasRMALane(sm[:strings.Index(sm, "#   lane[1]")]), "posix's rma_bw lane alone does not")
	require.True(t, hasRMALane(ib))
	rc := "#   lane[0]:  3:rc_mlx5/mlx5_0:1.0 md[1] -> md[1]/ib/sysdev[255] am am_bw#0\n" +
		"#   lane[1]:  1:sysv/memory.0 md[0] -> md[0]/sysv/sysdev[255]\n#\n" +
		"#                  put[1]: 0..<short>..(inf)\n#                  put[0]: 0..<short>..<bcopy>..<zcopy>..(inf)\n"
	require.True(t, hasRMALane(rc), "an RDMA lane's put")
	// UCX 1.19.1's shared memory, verbatim (TestOneSidedStoppedPeer's log):
	// no put[N] lines (the newer protocols), cma's rma_bw lane.
	sm119 := "#                 lane[0]:  1:sysv/memory.0 md[1]           -> md[1]/sysv/sysdev[255] seg 4294967295 am\n" +
		"#                 lane[1]:  2:posix/memory.0 md[2]          -> md[2]/posix/sysdev[255] seg 4294967295\n" +
		"#                 lane[2]:  3:cma/memory.0 md[3]            -> md[3]/cma/sysdev[255] seg 4294967295 rma_bw#0\n#\n"
	require.True(t, hasRMALane(sm119), "1.19's cma")
	// The original protocols (put[N] lines printed) use only those lanes
	// for puts and gets: a cma rma_bw lane beside them does not count.
	v1 := strings.Replace(sm113, "#\n#                  put[0]", "#                 lane[2]:  3:cma/memory.0 md[3] -> md[3]/cma/sysdev[255] rma_bw#0\n#\n#                  put[0]", 1)
	require.Contains(t, v1, "cma")
	require.False(t, hasRMALane(v1), "put[N] lines decide")
	// UCX 1.10 prints the peer's component without a second field.
	require.True(t, hasRMALane("#   lane[0]:  3:rc_mlx5/mlx5_0:1.0 md[1] -> md[1]/ib rma_bw#0\n"))
	require.False(t, hasRMALane(""))
}
