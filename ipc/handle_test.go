package ipc

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseHandle(t *testing.T) {
	h, err := ParseHandle("memfd:/proc/12/fd/3")
	require.NoError(t, err)
	require.Equal(t, Handle{Kind: KindMemfd, PID: 12, FD: 3}, h)
	require.Equal(t, "/proc/12/fd/3", h.Path())
	require.Equal(t, "memfd:/proc/12/fd/3", h.String())
	require.Equal(t, h.String(), MemfdHandle(12, 3))

	hexs := strings.Repeat("aB", CUDAHandleSize)
	h, err = ParseHandle("cuda:" + hexs)
	require.NoError(t, err)
	require.Equal(t, KindCUDA, h.Kind)
	require.Equal(t, byte(0xab), h.CUDA[63])
	require.Equal(t, "cuda:"+strings.ToLower(hexs), h.String(), "canonical form is lower case")
	require.Empty(t, h.Path())

	for _, bad := range []string{
		"", "memfd:", "memfd:/proc/0/fd/3", "memfd:/proc/+1/fd/3", "memfd:/proc/1/fd/-3",
		"memfd:/proc/1/fd/ 3", "memfd:/proc/1/fd/3/", "memfd:proc/1/fd/3", "memfd:/proc/self/fd/3",
		"cuda:abcd", "cuda:" + strings.Repeat("zz", CUDAHandleSize), "nvidia:1", "/proc/1/fd/3",
	} {
		_, err := ParseHandle(bad)
		require.True(t, errors.Is(err, ErrHandle), "%q: %v", bad, err)
	}
}

func TestParseSpec(t *testing.T) {
	sp, err := ParseSpec(" memfd:/proc/12/fd/3@4096+8192\n")
	require.NoError(t, err)
	require.Equal(t, Spec{Handle: Handle{Kind: KindMemfd, PID: 12, FD: 3}, Off: 4096, Len: 8192}, sp)
	sp, err = ParseSpec("memfd:/proc/12/fd/3")
	require.NoError(t, err)
	require.Zero(t, sp.Off)
	require.Zero(t, sp.Len, "no range: the whole memory")
	for _, bad := range []string{"memfd:/proc/12/fd/3@", "memfd:/proc/12/fd/3@1", "memfd:/proc/12/fd/3@1+0",
		"memfd:/proc/12/fd/3@-1+4", "memfd:/proc/12/fd/3@1+x", "cuda:abcd@0+4"} {
		_, err := ParseSpec(bad)
		require.True(t, errors.Is(err, ErrHandle), "%q: %v", bad, err)
	}
	_, err = ParseSpec(strings.Repeat("x", 1000))
	require.Less(t, len(err.Error()), 300, "long values are clipped in errors")
}
