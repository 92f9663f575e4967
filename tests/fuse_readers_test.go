package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/internal/testutil"
)

// fuseReaders counts the daemon's threads waiting in read(/dev/fuse): its
// go-fuse readers between requests.
func (d *daemon) fuseReaders() int {
	d.t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", d.cmd.Process.Pid))
	require.NoError(d.t, err)
	n := 0
	for _, w := range tasks {
		b, err := os.ReadFile(w)
		if err == nil && strings.TrimSpace(string(b)) == "fuse_dev_do_read" {
			n++
		}
	}
	return n
}

// settledReaders is fuseReaders once it is 1 to 3, polled for up to 5 s
// (a reader that just replied may not be back in read yet); else its last
// count.
func (d *daemon) settledReaders() int {
	n := d.fuseReaders()
	for deadline := time.Now().Add(5 * time.Second); (n < 1 || n > 3) && time.Now().Before(deadline); n = d.fuseReaders() {
		time.Sleep(20 * time.Millisecond)
	}
	return n
}

// TestFUSEReadersFew: a daemon with GOMAXPROCS 16 (a GPU host's) keeps at
// most three threads waiting in read(/dev/fuse) after bursts of concurrent
// requests (fs.newServer). go-fuse kept up to seventeen, and the kernel
// gives each request to the one that has waited longest: a copy_to's
// LOOKUP and SETXATTR, call after call, each woke a thread on a CPU that
// had gone idle. The cap is set by lowering GOMAXPROCS around go-fuse's
// NewServer: the daemon's GOMAXPROCS is back to what it was after the
// mount (16 from its environment; the runtime's default without one).
func TestFUSEReadersFew(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	d := launchOpt(t, t.TempDir(), launchOpts{env: []string{"GOMAXPROCS=16"}}, "--metrics", addr)
	require.Equal(t, 16.0, scrapeMetrics(t, addr).value("go_sched_gomaxprocs_threads"), "GOMAXPROCS after the mount")
	const files = 8
	for i := range files {
		require.NoError(t, os.WriteFile(d.path(fmt.Sprintf("f%d", i)), []byte("x"), 0o644))
		require.NoError(t, unix.Setxattr(d.path(fmt.Sprintf("f%d", i)), "user.tag", []byte("v"), 0))
	}
	// Bursts of concurrent getxattrs (FUSE sends every one), each going
	// to a reader while the others are busy: go-fuse starts a reader
	// whenever it takes a request with none waiting.
	for round := range 5 {
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Go(func() {
				buf := make([]byte, 16)
				for i := range 200 {
					p := d.path(fmt.Sprintf("f%d", (g+i)%files))
					if _, err := unix.Getxattr(p, "user.tag", buf); err != nil {
						t.Errorf("round %d: getxattr %s: %v", round, p, err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	// The readers that finish their last request find the others
	// waiting and leave; one at least always waits (else the mount would
	// serve nothing), which also shows that wchan names them here.
	n := d.settledReaders()
	require.True(t, n >= 1 && n <= 3, "threads waiting in read(/dev/fuse) after the bursts: %d, want 1 to 3", n)
	// Serial requests after the bursts (getxattr: the kernel caches no
	// xattrs, so each is a request) are served as before.
	buf := make([]byte, 16)
	for i := range 100 {
		_, err := unix.Getxattr(d.path(fmt.Sprintf("f%d", i%files)), "user.tag", buf)
		require.NoError(t, err)
	}
	n = d.settledReaders()
	require.True(t, n >= 1 && n <= 3, "threads waiting in read(/dev/fuse) after serial requests: %d, want 1 to 3", n)
}

// TestFUSEReadersGOMAXPROCS: without GOMAXPROCS in its environment a
// daemon's is the runtime's default after the mount (fs.newServer gives it
// back with runtime.SetDefaultGOMAXPROCS, which keeps following the CPU
// limit), as in this process, whose environment it shares; below 4 (this
// 2-CPU VM and CI) two more, for the FUSE readers waiting in system calls.
func TestFUSEReadersGOMAXPROCS(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set in the environment: TestFUSEReadersFew covers a daemon started with it")
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	startDaemon(t, "--metrics", addr)
	want := runtime.GOMAXPROCS(0)
	if want < 4 {
		want += 2
	}
	require.Equal(t, float64(want), scrapeMetrics(t, addr).value("go_sched_gomaxprocs_threads"), "GOMAXPROCS after the mount")
}
