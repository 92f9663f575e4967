package tests

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/xattrs"
)

// TestConcurrentChurn: 8 goroutines create, write, read, rename and unlink in
// one directory for 10 s (run under -race, the daemon is built with -race too).
// Tensors are written under a temporary name and renamed into place, so every
// read must see one whole tensor; at the end stats are zero.
func TestConcurrentChurn(t *testing.T) {
	d := startDaemon(t, "--max-memory", "512MiB")
	dir := d.path("churn")
	require.NoError(t, os.Mkdir(dir, 0o755))
	duration := 10 * time.Second
	if testing.Short() {
		duration = 2 * time.Second
	}
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ops := map[string]int{}
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			count := map[string]int{}
			for time.Now().Before(deadline) {
				name := fmt.Sprintf("%s/t%d", dir, rng.Intn(16))
				other := fmt.Sprintf("%s/t%d", dir, rng.Intn(16))
				var err error
				tmp := fmt.Sprintf("%s/.w%d-%d", dir, w, count["write"]+count["unlink-open"])
				switch op := rng.Intn(5); op {
				case 0: // a tensor whose bytes all equal v, renamed into place
					v := byte(rng.Intn(255) + 1)
					if err = os.WriteFile(tmp, bytes.Repeat([]byte{v}, 1+rng.Intn(256<<10)), 0o644); err == nil {
						err = os.Rename(tmp, name)
					}
					count["write"]++
				case 1: // read: whole tensors only, never a mix or garbage
					var data []byte
					data, err = os.ReadFile(name)
					if err == nil && (len(data) == 0 || bytes.Count(data, data[:1]) != len(data)) {
						t.Errorf("%s: %d bytes, not one tensor's", name, len(data))
					}
					count["read"]++
				case 2:
					err = os.Rename(name, other)
					count["rename"]++
				case 3:
					err = os.Remove(name)
					count["unlink"]++
				case 4: // open, unlink while open, keep writing and reading, close
					var f *os.File
					if f, err = os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
						f.Write(bytes.Repeat([]byte{9}, 4096))
						os.Remove(tmp)
						_, err = f.WriteAt([]byte("after unlink"), 8192)
						buf := make([]byte, 12)
						if err == nil {
							if _, err = f.ReadAt(buf, 8192); err == nil && string(buf) != "after unlink" {
								t.Errorf("unlinked tensor read back %q", buf)
							}
						}
						f.Close()
					}
					count["unlink-open"]++
				}
				if _, serr := getxErr(d.mnt, xattrs.StatsName); serr != nil {
					t.Errorf("stats during churn: %v", serr)
				}
				// ENOENT: another worker removed the name first. ESTALE: the
				// tensor was released between the kernel's lookup and the open
				// (the kernel retried the lookup once and lost the race again).
				if err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ESTALE) {
					t.Errorf("worker %d: %v", w, err)
					return
				}
			}
			mu.Lock()
			for k, v := range count {
				ops[k] += v
			}
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	t.Logf("operations: %v", ops)
	require.NoError(t, os.RemoveAll(dir))
	d.requireClean()
}

// TestLookupRacingRenameOver: stat (a kernel revalidation LOOKUP, which holds
// no directory lock) racing renames over the same name must never orphan the
// new tensor or resurrect the replaced one. go-fuse re-inserts a looked-up
// node after the handler returns; with its tree as the directory, this leaked
// one tensor in a few hundred renames.
func TestLookupRacingRenameOver(t *testing.T) {
	d := startDaemon(t)
	name := d.path("kv")
	require.NoError(t, os.WriteFile(name, []byte{0}, 0o644))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					os.Stat(name)
				}
			}
		}()
	}
	for i := 0; i < 2000; i++ {
		tmp := fmt.Sprintf("%s.tmp%d", name, i)
		require.NoError(t, os.WriteFile(tmp, []byte{byte(i)}, 0o644))
		require.NoError(t, os.Rename(tmp, name))
	}
	close(stop)
	wg.Wait()
	data, err := os.ReadFile(name)
	require.NoError(t, err)
	require.Equal(t, []byte{byte(1999 % 256)}, data, "the last rename wins")
	require.Eventually(t, func() bool { return d.stats().Live.Tensors == 1 }, 5*time.Second, 10*time.Millisecond,
		"exactly one tensor may survive: %+v", d.stats().Live)
	require.NoError(t, os.Remove(name))
	d.requireClean()
}
