package tests

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// TestRegisterRaces: register races open, read, unlink, recreation and
// copies (local and to a peer of the same host) on the same files, with
// the same memfd registered in several files at once; then the owner
// exits while a file still holds its memory. Every call succeeds or fails
// with an errno, every read sees the owner's bytes, and nothing is left.
func TestRegisterRaces(t *testing.T) {
	ds := sameHost(t, []string{"a", "b"})
	d, b := ds["a"], ds["b"]
	const size = 65536
	o := startOwner(t, size, nil)
	want := ownerBytes(0, size)
	files := []string{d.path("r0"), d.path("r1")}
	for _, f := range files {
		mkEmpty(t, f)
	}
	// Local copies land in /out: a copy_to whose commit renames in the
	// directory where its source is being unlinked deadlocks (the unlink
	// holds the directory and waits for the source, which the copy_to
	// holds; see the report of this test's commit).
	require.NoError(t, os.Mkdir(d.path("out"), 0o755))
	ok := func(err error) bool {
		return err == nil || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EBUSY) || errors.Is(err, syscall.EIO) ||
			errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENODATA) || errors.Is(err, syscall.ESTALE)
	}
	deadline := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	loop := func(name string, f func(i int) error) {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				if err := f(i); !ok(err) {
					errs <- fmt.Errorf("%s: %w", name, err)
					return
				}
			}
		})
	}
	for k, p := range files {
		loop("register", func(i int) error {
			v := o.handle(-1)
			if i%2 == 1 {
				v += "@4096+8192"
			}
			return unix.Setxattr(p, xattrs.Register, []byte(v), 0)
		})
		loop("read", func(int) error {
			got, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if len(got) > 0 && !(len(got) == size && string(got) == string(want) || len(got) == 8192 && string(got) == string(want[4096:4096+8192])) {
				return fmt.Errorf("%s: %d bytes, not the owner's", p, len(got))
			}
			return nil
		})
		loop("unlink", func(int) error {
			time.Sleep(time.Millisecond)
			os.Remove(p)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		})
		loop("copy", func(i int) error {
			if i%2 == 0 {
				return unix.Setxattr(p, xattrs.CopyTo, fmt.Appendf(nil, "/out/c%d", k), 0)
			}
			return unix.Setxattr(p, xattrs.CopyTo, fmt.Appendf(nil, "b:/c%d", k), 0)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A file that outlives its owner keeps the memory (the daemon's own fd).
	setx(t, files[0], xattrs.Register, o.handle(-1))
	o.close()
	got, err := os.ReadFile(files[0])
	require.NoError(t, err)
	require.Equal(t, want, got)
	setx(t, files[0], xattrs.CopyTo, "b:/after")
	got, err = os.ReadFile(b.path("after"))
	require.NoError(t, err)
	require.Equal(t, want, got)
	for _, dd := range []*daemon{d, b} {
		require.NoError(t, os.RemoveAll(dd.path("out")))
		ents, err := os.ReadDir(dd.path())
		require.NoError(t, err)
		for _, e := range ents {
			require.NoError(t, os.Remove(dd.path(e.Name())))
		}
		dd.requireClean()
	}
}
