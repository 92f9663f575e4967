package main

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// waitPoll is how often wait looks at the mount table and the mount.
const waitPoll = 50 * time.Millisecond

func newWaitCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait MOUNT",
		Short: "Wait until the daemon at MOUNT answers (for scripts: tensorfs mount ... & tensorfs wait MNT)",
		Long: `Wait until a tensorfs is mounted at MOUNT and its daemon answers (the root's
user.tensorfs.stats xattr reads), then exit 0: the mount is ready for every
use, peers included (mount makes the mount appear only once it is). Exits 1
with one line at --timeout (default 30s), saying what it saw last: no such
directory, nothing or another filesystem mounted there, or a daemon that does
not answer.

  tensorfs mount /mnt/tfs --device host & tensorfs wait /mnt/tfs && ls /mnt/tfs`,
		Args: positional(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return fmt.Errorf("--timeout %v: must be positive", timeout)
			}
			return waitMount(args[0], timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait")
	return cmd
}

// waitMount polls until dir is a tensorfs mountpoint whose stats xattr
// reads, or timeout passes (an error naming the last reason it was not
// up). Each read of the mount runs beside the wait, so a daemon that hangs
// costs the timeout, never more.
func waitMount(dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	why := "not checked yet"
	for {
		up, reason := probeMount(dir, time.Until(deadline))
		if up {
			return nil
		}
		why = reason
		if !time.Now().Add(waitPoll).Before(deadline) {
			return fmt.Errorf("wait %s: not up after %v: %s", dir, timeout, why)
		}
		time.Sleep(waitPoll)
	}
}

// probeMount looks once: whether dir is a live tensorfs mount, and if not
// why, in a few words. A read of the mount gets at most budget.
func probeMount(dir string, budget time.Duration) (bool, string) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, err.Error()
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	ms, err := readMounts()
	if err != nil {
		return false, "reading the mount table: " + err.Error()
	}
	mp, fstype := mountOf(ms, abs)
	if mp != abs || fstype != cpFSType {
		if _, err := os.Stat(abs); errors.Is(err, iofs.ErrNotExist) {
			return false, "no such directory"
		}
		if mp == abs {
			return false, fmt.Sprintf("not a tensorfs mount (a %s filesystem is mounted there)", fstype)
		}
		return false, "no tensorfs mounted there"
	}
	done := make(chan error, 1)
	go func() {
		_, ok, err := getxattrString(func(b []byte) (int, error) { return unix.Getxattr(abs, xattrs.StatsName, b) })
		if err == nil && !ok {
			err = unix.ENODATA
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return false, fmt.Sprintf("the daemon does not answer (reading %s: %s)", xattrs.StatsName, errText(err))
		}
		return true, ""
	case <-time.After(max(budget, 0)):
		return false, "the daemon does not answer (a read of the mount is still waiting)"
	}
}
