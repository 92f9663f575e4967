package tests

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// TestMixedChecksums: two daemons that run different --checksum settings
// copy both ways, small (one eager put), large (two streams), whole and in
// place, every byte right; each names the checksum the rule gives
// (crc32c if either runs it, none only when both do, else xxh3) as its
// peer's and as every TCP transfer's, and both end clean.
func TestMixedChecksums(t *testing.T) {
	for _, tc := range []struct{ a, b, want string }{
		{"crc32c", "xxh3", "crc32c"},
		{"xxh3", "crc32c", "crc32c"},
		{"none", "xxh3", "xxh3"},
		{"crc32c", "none", "crc32c"},
		{"none", "none", "none"},
	} {
		t.Run(fmt.Sprintf("a=%s,b=%s", tc.a, tc.b), func(t *testing.T) {
			ds := clusterOf(t, []string{"a", "b"}, map[string][]string{"a": {"--checksum", tc.a}, "b": {"--checksum", tc.b}})
			a, b := ds["a"], ds["b"]
			small, large := fill(4096+3, 1), fill(6<<20+5, 2)
			writeTensor(t, a.path("small"), small)
			writeTensor(t, a.path("large"), large)
			writeTensor(t, b.path("t"), fill(128<<10, 3))
			setx(t, a.path("small"), xattrs.CopyTo, "b:/small")
			setx(t, a.path("large"), xattrs.CopyTo, "b:/large")
			requireContent(t, b.path("small"), small)
			requireContent(t, b.path("large"), large)
			writeTensor(t, a.path("back"), []byte("x"))
			require.NoError(t, unix.Setxattr(a.path("back"), xattrs.CopyFrom, []byte("b:/large"), 0))
			requireContent(t, a.path("back"), large)
			setx(t, a.path("large"), xattrs.CopyTo, "@0+8192 b:/t@65536")
			got, err := os.ReadFile(b.path("t"))
			require.NoError(t, err)
			require.Equal(t, large[:8192], got[65536:65536+8192])
			require.NoError(t, unix.Setxattr(a.path("back"), xattrs.CopyFrom, []byte("b:/t@0+4096 @8192"), 0))
			for me, d := range map[string]*daemon{"a": a, "b": b} {
				other := map[string]string{"a": "b", "b": "a"}[me]
				st := d.stats()
				require.Equal(t, tc.want, st.Peers[other].Checksum, "%s's peer %s", me, other)
				n := 0
				for _, r := range st.Transfers.Recent {
					if r.Path == "tcp" {
						n++
						require.Equal(t, tc.want, r.Checksum, "%s: %+v", me, r)
					}
				}
				require.NotZero(t, n, "%s's TCP transfers", me)
			}
			a.removeAll()
			b.removeAll()
			a.requireClean()
			b.requireClean()
		})
	}
}

// TestChecksumFlagRefused: the daemon refuses a --checksum it does not
// know, naming it and the choices, and mounts nothing.
func TestChecksumFlagRefused(t *testing.T) {
	mnt := t.TempDir()
	for _, v := range []string{"md5", "XXH3", ""} {
		out, err := runCmd(bin, "mount", "--checksum", v, mnt)
		require.Error(t, err, "--checksum %q", v)
		require.Contains(t, out, fmt.Sprintf("--checksum %q: want xxh3, crc32c or none", v))
		require.False(t, mounted(mnt), "--checksum %q left a mount", v)
	}
}
