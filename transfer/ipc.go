package transfer

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// Exporter is implemented by sources whose bytes another daemon of the same
// host can read in place (host memory exported as a memfd). Export pins the
// memory and takes a lease for holder until release is called; ok is false
// when the tensor has no such export (e.g. GPU memory, which goes over TCP
// until the CUDA IPC import lands).
type Exporter interface {
	Export(holder string) (desc IPCDesc, release func(), ok bool)
}

// errNoIPC: the peer could not reach the exporter's memory (another PID
// namespace, no permission); the copy is retried over TCP.
var errNoIPC = errors.New("exported memory not reachable")

// exports pins and describes every source for an IPC copy, or returns
// ok=false (releasing what it took) when one of them cannot be exported.
func exports(srcs []Source, holder string) (descs []IPCDesc, release func(), ok bool) {
	var rels []func()
	release = func() {
		for _, r := range rels {
			r()
		}
	}
	for _, sc := range srcs {
		ex, is := sc.(Exporter)
		if !is {
			release()
			return nil, func() {}, false
		}
		d, rel, ok := ex.Export(holder)
		if !ok {
			release()
			return nil, func() {}, false
		}
		descs = append(descs, d)
		rels = append(rels, rel)
	}
	return descs, release, true
}

// openExports opens every exported memfd (so that a failure is known before
// anything is written) and returns the files; the caller closes them.
func openExports(descs []IPCDesc) ([]*os.File, error) {
	files := make([]*os.File, 0, len(descs))
	for _, d := range descs {
		path, ok := strings.CutPrefix(d.Handle, "memfd:")
		if !ok || !strings.HasPrefix(path, "/proc/") {
			closeFiles(files)
			return nil, fmt.Errorf("handle %q: %w", d.Handle, errNoIPC)
		}
		f, err := os.Open(path)
		if err != nil {
			closeFiles(files)
			return nil, fmt.Errorf("open %s: %v: %w", path, err, errNoIPC)
		}
		// Only another daemon's tensor memory may be read this way: a handle
		// naming any other file (a peer's lie, or an fd number reused since
		// it was exported) is refused. Checked on what was opened, not on
		// the path, so the fd cannot change in between.
		if target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd())); err != nil || !strings.HasPrefix(target, "/memfd:tensorfs") {
			f.Close()
			closeFiles(files)
			return nil, fmt.Errorf("handle %q is not a tensorfs memfd (%q): %w", d.Handle, target, errNoIPC)
		}
		files = append(files, f)
	}
	return files, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// copyExports copies each tensor from its exported memfd into dest with
// pread (never a mapping: memory another process owns could shrink under a
// mapping and fault; a short read is an EIO instead).
func copyExports(files []*os.File, descs []IPCDesc, metas []Meta, dest Dest, chunk int, rec *Record) error {
	buf := make([]byte, chunk)
	for i, f := range files {
		n := metas[i].NBytes
		for off := int64(0); off < n; {
			m := min(int64(chunk), n-off)
			got, err := f.ReadAt(buf[:m], descs[i].Offset+off)
			if int64(got) != m {
				return &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("read %s at %d: %d of %d bytes (%v)", descs[i].Handle, descs[i].Offset+off, got, m, err)}
			}
			if err := dest.WriteAt(i, buf[:m], off); err != nil {
				return err
			}
			off += m
			rec.BytesDone.Add(m)
		}
	}
	return nil
}
