package tests

// Attacks on copies landing in recycled memory they do not clear
// (gpu.UninitAllocator, tensor.Template.Uninit): the bytes an earlier
// tensor left must never show to anyone who could not read that tensor,
// and a tensor grown by a user reads zeros.

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
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
		setx(t, d.path("empty"), xattrs.CopyTo, "/dst")
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

// TestCopyFromKeepsTargetsOwner: copy_from into an existing file replaces
// its memory by adoption. That memory must stay the file's owner's: bob's
// file in alice's (world-writable) directory, filled by copy_from with his
// secret, must not leave the secret, once he deletes it, in memory that
// alice's next copy reuses uncleared (which she can read through the
// copy's temporary, hers, mid-copy).
func TestCopyFromKeepsTargetsOwner(t *testing.T) {
	secretStaysBobs(t, func(d *daemon, f string) {
		out, err := asUser(bob, "sh", "-c", `touch "$1" && chmod 600 "$1" && setfattr -n `+xattrs.CopyFrom+` -v /private/src "$1"`, "sh", f)
		require.NoError(t, err, out)
	})
}

// TestChownKeepsMemoryWithOwner: a tensor alice made and root then gave
// to bob (chown) holds what bob writes into it; once bob deletes it, that
// memory must not go, uncleared, to alice's next copy.
func TestChownKeepsMemoryWithOwner(t *testing.T) {
	secretStaysBobs(t, func(d *daemon, f string) {
		out, err := asUser(alice, "sh", "-c", `head -c 2097152 /dev/zero > "$1"`, "sh", f)
		require.NoError(t, err, out)
		require.NoError(t, os.Chown(f, bob, bob))
		require.NoError(t, os.Chmod(f, 0o600))
		out, err = asUser(bob, "sh", "-c", `head -c 2097152 /dev/zero | tr '\000' '\253' > "$1"`, "sh", f)
		require.NoError(t, err, out)
	})
}

const alice, bob = 1001, 1002

// secretStaysBobs: plant puts bob's secret (2 MiB of 0xab) into his 0600
// file f in alice's world-writable directory; bob then deletes f, and
// alice, copying a tree of hers with a 2 MiB tensor in it, reads that
// tensor's temporary mid-copy: she must never see bob's bytes.
func secretStaysBobs(t *testing.T, plant func(d *daemon, f string)) {
	needOtherUsers(t, "setfattr")
	d := startDaemon(t, "--allow-other")
	openToOthers(d.mnt)
	const n = 2 << 20 // a small spare: kept as it is for reuse
	secret := bytes.Repeat([]byte{0xAB}, n)

	// bob's secret, private.
	require.NoError(t, os.Mkdir(d.path("private"), 0o700))
	require.NoError(t, os.WriteFile(d.path("private/src"), secret, 0o600))
	require.NoError(t, os.Chown(d.path("private/src"), bob, bob))
	require.NoError(t, os.Chown(d.path("private"), bob, bob))
	// alice's team directory, open to all; her own tree to copy.
	for _, dir := range []string{"shared", "alice", "alice/src", "alice/dst"} {
		require.NoError(t, os.Mkdir(d.path(dir), 0o755))
		require.NoError(t, os.Chown(d.path(dir), alice, alice))
	}
	require.NoError(t, os.Chmod(d.path("shared"), 0o777))
	const big = 512 << 20
	require.NoError(t, os.WriteFile(d.path("alice/src/a_big"), fill(big, 5), 0o644))
	require.NoError(t, os.WriteFile(d.path("alice/src/b_small"), bytes.Repeat([]byte{0x11}, n), 0o644))
	// A big deleted tensor of alice's: the big temporary reuses it at once.
	out, err := asUser(alice, "sh", "-c", `head -c 536870912 /dev/zero > "$1"`, "sh", d.path("alice/junk"))
	require.NoError(t, err, out)

	f := d.path("shared/f")
	plant(d, f)
	out, err = asUser(alice, "cat", f)
	require.Error(t, err, "bob's 0600 file is not alice's to read: %s", out)
	got, err := os.ReadFile(f)
	require.NoError(t, err)
	require.True(t, bytes.Equal(secret, got), "bob's file holds his secret")

	out, err = asUser(bob, "rm", f)
	require.NoError(t, err, out)
	require.NoError(t, os.Remove(d.path("alice/junk"))) // after: small spares fit only beside no large one
	done := make(chan error, 1)
	go func() {
		done <- unix.Setxattr(d.path("alice/src"), xattrs.CopyTo, []byte("/alice/dst"), 0)
	}()
	leaked := ""
	read := false
	start := time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		select {
		case err := <-done:
			require.NoError(t, err)
			deadline = time.Time{}
			continue
		default:
		}
		// b_small's temporary, by name: the daemon numbers them from 1 and
		// this copy makes the first two, a_big's then b_small's (a listing
		// would wait: a temporary being written answers only once its copy
		// is over).
		out, err := asUser(alice, "od", "-An", "-tx1", "-N16", d.path("alice/dst/.tensorfs-tmp-2"))
		if err == nil {
			if !read {
				t.Logf("%v: alice reads her temporary: %s", time.Since(start), strings.TrimSpace(out))
			}
			read = true
			if strings.Contains(out, "ab ab ab ab") {
				leaked = out
			}
		}
	}
	require.True(t, read, "alice's small temporary was never read mid-copy (the copy was too fast)")
	require.Empty(t, leaked, "alice read bob's deleted secret through her copy's temporary")
	got, err = os.ReadFile(d.path("alice/dst/b_small"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(bytes.Repeat([]byte{0x11}, n), got))
}

// TestPullWhileSourceShrinks: a pull reads the source on the serving
// daemon while nothing holds its inode lock there; a truncate (or a write)
// of the source mid-copy waits for the copy (the source is frozen,
// tensor.Freeze), so the copy delivers the source as it was when it began,
// and the truncate lands after. Over TCP (streams of chunks read from the
// source) and over IPC (the puller copies straight out of the source's
// exported memory, which an in-place truncate used to zero under it).
func TestPullWhileSourceShrinks(t *testing.T) {
	for _, path := range []string{"tcp", "ipc"} {
		t.Run(path, func(t *testing.T) {
			var ds map[string]*daemon
			if path == "tcp" {
				ds = cluster(t, []string{"a", "b"})
			} else {
				ds = sameHost(t, []string{"a", "b"})
			}
			a, b := ds["a"], ds["b"]
			size := 512 << 20
			if path == "ipc" {
				size = 1 << 30 // one memmove: give the truncate time to land in it
			}
			data := fill(size, 9)
			for i := 0; i < size; i += 1 << 20 {
				data[i] = byte(i >> 20) // each MiB differs from the others
			}
			require.NoError(t, os.WriteFile(a.path("x"), data, 0o644))
			require.NoError(t, os.WriteFile(b.path("x"), nil, 0o644))
			done := make(chan error, 1)
			go func() {
				done <- unix.Setxattr(b.path("x"), xattrs.CopyFrom, []byte("a:/x"), 0)
			}()
			// Shrink the source once the serving side has its record of the copy.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if st := a.stats(); st.Transfers.Active > 0 && len(st.Transfers.Recent) > 0 &&
					st.Transfers.Recent[len(st.Transfers.Recent)-1].Path == path {
					break
				}
			}
			start := time.Now()
			require.NoError(t, os.Truncate(a.path("x"), 0))
			t.Logf("the truncate waited %v for the copy", time.Since(start))
			require.NoError(t, <-done, "a:\n%s\nb:\n%s", a.log.String(), b.log.String())
			fi, err := os.Stat(a.path("x"))
			require.NoError(t, err)
			require.Zero(t, fi.Size(), "the truncate landed, after the copy")
			got, err := os.ReadFile(b.path("x"))
			require.NoError(t, err)
			require.Equal(t, len(data), len(got))
			if !bytes.Equal(data, got) {
				i := 0
				for i < len(got) && got[i] == data[i] {
					i++
				}
				t.Fatalf("the copy delivered other bytes than the source's from byte %d (MiB %d) on", i, i>>20)
			}
		})
	}
}
