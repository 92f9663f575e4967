//go:build ucx

package ucx

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseLanes: the transports named in ucp_ep_print_info's lanes (UCX
// 1.13's text), path indexes dropped, once each; whether a lane does
// remote memory access (OneSided).
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
	// UCX 1.13's shared memory lanes, as it prints them on this VM.
	sm113 := "#                 lane[0]:  1:sysv/memory.0 md[1]           -> md[1]/sysv/sysdev[255] am am_bw#0\n" +
		"#                 lane[1]:  2:posix/memory.0 md[2]          -> md[2]/posix/sysdev[255]\n#\n" +
		"#                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)\n" +
		"#                  get[0]: 0..<bcopy>..(inf)\n#\n#                  rma_bw: mds #\n"
	require.True(t, hasRMALane(sm113))
	require.False(t, hasRMALane(tcp+"#\n#                  rma_bw: mds #\n"), "an empty rma_bw list is no lane")
	require.True(t, hasRMALane(sm))
	require.True(t, hasRMALane(ib))
	require.False(t, hasRMALane(""))
}
