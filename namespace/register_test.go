package namespace

import (
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tensorfs/tensorfs/ipc"
	"golang.org/x/sys/unix"
)

func TestParseRegistration(t *testing.T) {
	r, err := parseRegistration(" memfd:/proc/12/fd/3@4096+8192\n")
	require.NoError(t, err)
	require.Equal(t, ipc.Spec{Handle: ipc.Handle{Kind: ipc.KindMemfd, PID: 12, FD: 3}, Off: 4096, Len: 8192}, r)
	r, err = parseRegistration("cuda:" + strings.Repeat("ab", ipc.CUDAHandleSize))
	require.NoError(t, err)
	require.Equal(t, ipc.KindCUDA, r.Kind)
	for _, bad := range []string{"", "cuda:abcd", "memfd:/proc/0/fd/1", "memfd:/proc/1/fd/+1", "memfd:/proc/1/fds/1", "memfd:/proc/1/fd/1@0+0", "memfd:/proc/1/fd/1@+1", "memfd:/proc/1/fd/1@1+", "host:1"} {
		_, err := parseRegistration(bad)
		require.ErrorIs(t, err, syscall.EINVAL, bad)
	}
}

// TestOpenMemfdPermission: the caller's own thread group (named by any of
// its threads) and root pass; another uid's process is EACCES; a non-memfd
// fd is EINVAL, a missing one ENOENT.
func TestOpenMemfdPermission(t *testing.T) {
	fd, err := unix.MemfdCreate("mine", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(fd)
	pid := os.Getpid()
	me := &Caller{UID: 4242, GID: 4242, PID: uint32(unix.Gettid())}
	f, err := openMemfd(me, pid, fd)
	require.NoError(t, err, "the caller's own thread group, whatever the uids")
	f.Close()

	stranger := &Caller{UID: 4242, GID: 4242, PID: 1}
	_, err = openMemfd(stranger, pid, fd)
	require.ErrorIs(t, err, syscall.EACCES, "uid 4242 on a process of uid %d", os.Getuid())

	same := &Caller{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), PID: 1}
	if os.Getuid() != 0 {
		f, err = openMemfd(same, pid, fd)
		require.NoError(t, err, "a process of the caller's uid")
		f.Close()
	}
	root := &Caller{PID: 1}
	f, err = openMemfd(root, pid, fd)
	require.NoError(t, err)
	f.Close()

	notMemfd, err := os.Open("/dev/null")
	require.NoError(t, err)
	defer notMemfd.Close()
	_, err = openMemfd(root, pid, int(notMemfd.Fd()))
	require.ErrorIs(t, err, syscall.EINVAL, "/dev/null is no memfd")
	_, err = openMemfd(root, pid, 99999)
	require.ErrorIs(t, err, syscall.ENOENT)
	_, err = openMemfd(root, 999999999, 3)
	require.ErrorIs(t, err, syscall.ENOENT)
}

// TestTgid: the process of a thread, from its pidfd and from /proc alike,
// for this process's main thread and for another of its threads; a thread
// that does not exist gives back its id.
func TestTgid(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Threads of goroutines that stay locked until the test ends; one of
	// them is not the main thread.
	stop := make(chan struct{})
	defer close(stop)
	tid := os.Getpid()
	for i := 0; i < 4 && tid == os.Getpid(); i++ {
		tids := make(chan int)
		go func() {
			runtime.LockOSThread()
			tids <- unix.Gettid()
			<-stop
		}()
		tid = <-tids
	}
	require.NotEqual(t, os.Getpid(), tid, "a thread other than the leader")
	for _, id := range []int{os.Getpid(), unix.Gettid(), tid} {
		require.Equal(t, os.Getpid(), tgid(id), "thread %d", id)
		require.Equal(t, os.Getpid(), tgidProc(id), "thread %d", id)
	}
	fd, err := unix.PidfdOpen(tid, pidfdThread)
	if err == nil {
		info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_PID}
		err = unix.IoctlPidfdInfo(fd, &info)
		unix.Close(fd)
	}
	t.Logf("pidfd path on this kernel: %v", err) // nil: tgid did not need /proc
	const gone = 1 << 22                         // above pid_max's default ceiling
	require.Equal(t, gone, tgid(gone))
}
