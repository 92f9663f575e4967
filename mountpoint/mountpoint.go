// Package mountpoint finds and cleans up tensorfs mountpoints without
// speaking FUSE: whether a directory is a tensorfs mount (per
// /proc/self/mounts), and the lazy unmount of a dead daemon's mount.
package mountpoint

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// errHung: a stat of the path did not return in time (a FUSE mount whose
// daemon is stuck).
var errHung = errors.New("no answer")

// statTimeout stats path, giving up (errHung) after d; the stat goroutine of
// a hung mount stays blocked until the mount is aborted.
func statTimeout(path string, d time.Duration) error {
	done := make(chan error, 1)
	go func() {
		var st syscall.Stat_t
		done <- syscall.Stat(path, &st)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return errHung
	}
}

// abortConnection aborts the FUSE connection of the mount at dir through
// fusectl (/sys/fs/fuse/connections/N/abort, N the mount's device minor from
// /proc/self/mountinfo), so that every request waiting on it fails; needs root.
func abortConnection(dir string) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || unescapeMount(f[4]) != abs {
			continue
		}
		if _, minor, ok := strings.Cut(f[2], ":"); ok {
			conn := "/sys/fs/fuse/connections/" + minor
			if _, err := os.Stat(conn); err != nil {
				exec.Command("mount", "-t", "fusectl", "none", "/sys/fs/fuse/connections").Run()
			}
			os.WriteFile(conn+"/abort", []byte("1"), 0)
		}
	}
}

// ErrMounted: the mountpoint is already served by a live tensorfs daemon.
var ErrMounted = errors.New("already mounted by a live tensorfs daemon")

// CleanStale lazily unmounts dir when it is a dead FUSE mount (a killed
// daemon's: stat fails with ENOTCONN, or gives no answer within 3 s, in
// which case its FUSE connection is aborted first) and returns nil; it
// leaves an ordinary directory alone, and refuses (an error wrapping
// ErrMounted) a live tensorfs mount, whose daemon still holds tensors that
// taking over the mountpoint would strand.
func CleanStale(dir string) error {
	err := statTimeout(dir, 3*time.Second)
	if err == errHung {
		slog.Warn("a mount that does not answer; aborting its FUSE connection", "path", dir)
		abortConnection(dir)
		err = syscall.ENOTCONN
	}
	if err == syscall.ENOTCONN || err == syscall.ECONNABORTED {
		slog.Info("cleaning up a stale mount left by a dead daemon", "path", dir)
		if syscall.Unmount(dir, syscall.MNT_DETACH) != nil {
			// Not root: ask fusermount3, which may unmount our own mounts.
			_ = runQuiet("fusermount3", "-u", "-z", dir)
		}
		return nil
	}
	if err == nil && isMountpoint(dir) {
		return fmt.Errorf("%s: %w (unmount it first: tensorfs unmount %s)", dir, ErrMounted, dir)
	}
	return nil
}

// IsMounted reports whether dir is the mountpoint of a tensorfs FUSE mount
// (per /proc/self/mounts); it makes no request on the mount.
func IsMounted(dir string) bool { return isMountpoint(dir) }

// isMountpoint reports whether dir is the mountpoint of a FUSE mount named
// tensorfs in /proc/self/mounts.
func isMountpoint(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && unescapeMount(fields[1]) == abs && strings.HasPrefix(fields[2], "fuse") && strings.Contains(fields[0], "tensorfs") {
			return true
		}
	}
	return false
}

// unescapeMount undoes /proc/mounts' octal escapes (\040 for space, ...).
func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func runQuiet(name string, args ...string) error {
	return exec.Command(name, args...).Run()
}
