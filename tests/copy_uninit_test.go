package tests

// Attacks on copies landing in recycled memory they do not clear
// (gpu.UninitAllocator, tensor.Template.Uninit): the bytes an earlier
// tensor left must never show to anyone who could not read that tensor,
// and a tensor grown by a user reads zeros.

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCopiedEmptyTensorGrowsIntoZeros: a copy of an empty (0-byte) tensor
// allocates nothing, so its uninit permission must not outlive the copy:
// the tensor it leaves, grown later by truncate or by a write past its end,
// reads zeros, not the bytes of a tensor deleted just before.
func TestCopiedEmptyTensorGrowsIntoZeros(t *testing.T) {
	d := startDaemon(t)
	require.NoError(t, os.WriteFile(d.path("empty"), nil, 0o644))
	const n = 4096
	secret := bytes.Repeat([]byte{0xAB}, n)
	for _, how := range []string{"truncate", "write"} {
		// A deleted tensor's bytes, kept for reuse (same size, same owner).
		require.NoError(t, os.WriteFile(d.path("secret"), secret, 0o600))
		require.NoError(t, os.Remove(d.path("secret")))
		setx(t, d.path("empty"), "user.tensorfs.copy_to", "/dst")
		want := make([]byte, n)
		switch how {
		case "truncate":
			require.NoError(t, os.Truncate(d.path("dst"), n))
		case "write":
			f, err := os.OpenFile(d.path("dst"), os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteAt([]byte{1}, n-1)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			want[n-1] = 1
		}
		got, err := os.ReadFile(d.path("dst"))
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "%s of a copied empty tensor: it reads %x... instead of zeros", how, got[:8])
		require.NoError(t, os.Remove(d.path("dst")))
	}
}
