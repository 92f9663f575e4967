package namespace

import (
	"context"
	"fmt"
	"log"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/transfer"
)

// parseTarget parses a copy's peer path: peer "" (or this node's own name)
// means this mount; a path under this mount's own mountpoint is taken as
// mount-relative.
func (f *Tree) parseTarget(v string) (peer, p string, err error) {
	v = strings.TrimSpace(v)
	if f.mnt != "" && strings.HasPrefix(v, f.mnt+"/") {
		v = v[len(f.mnt):]
	}
	peer, p, err = transfer.ParsePeerPath(v)
	if err == nil && f.peers != nil && peer == f.peers.Name() {
		peer = ""
	}
	return peer, p, err
}

// CopyContext is the context of a copy asked for by a request of thread
// tid (0: unknown): not the request's own (a copy runs to completion or
// failure, whatever happens to the request), but carrying its caller's
// process id, looked up when the copy's record wants it.
func CopyContext(tid int) context.Context {
	if tid == 0 {
		return context.Background()
	}
	return transfer.WithCallerLookup(context.Background(), func() int { return tgid(tid) })
}

// tgid is the process of thread tid: FUSE names the calling thread, and a
// program knows itself by its process id. It asks the kernel through a
// pidfd of the thread (PIDFD_THREAD, Linux 6.9; PIDFD_GET_INFO, 6.13: a few
// µs) and falls back to /proc/TID/status (whose text costs the kernel 10-80
// µs to generate, 8% of a small copy's CPU). tid itself when neither says
// (the thread is gone).
func tgid(tid int) int {
	if fd, err := unix.PidfdOpen(tid, pidfdThread); err == nil {
		info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_PID}
		err := unix.IoctlPidfdInfo(fd, &info)
		unix.Close(fd)
		if err == nil && info.Mask&unix.PIDFD_INFO_PID != 0 && info.Tgid != 0 {
			return int(info.Tgid)
		}
	}
	return tgidProc(tid)
}

// pidfdThread is PIDFD_THREAD (include/uapi/linux/pidfd.h: O_EXCL), which
// x/sys does not name: a pidfd of the thread itself, not only of a
// thread-group leader.
const pidfdThread = unix.O_EXCL

// tgidProc is tgid read from /proc/TID/status.
func tgidProc(tid int) int {
	if n, _, err := procStatus(unix.AT_FDCWD, fmt.Sprintf("/proc/%d/status", tid)); err == nil {
		return n
	}
	return tid
}

// CopyTo pushes node src (a file, or a directory tree) to a peer path. It
// ignores the request's cancellation (FUSE interrupts): a copy runs to
// completion or failure.
//
// viaMount lets the final renames go through the mount (so inotify watchers
// see arrivals); batch turns it off, since the kernel holds the root's lock.
// value is [PEER:]PATH. Errors: *transfer.Error with the errno of the
// failure (EINVAL for a copy onto itself or into its own subtree, ENOENT
// for an unknown peer, EISDIR, ...; a domain error gets its errno), never
// ESTALE (see copyErr), or an error of no known errno.
func (f *Tree) CopyTo(ctx context.Context, src Node, value string, viaMount bool) (err error) {
	defer func() { err = copyErr(err) }()
	peer, dst, err := f.parseTarget(value)
	if err != nil {
		return err
	}
	srcs, isDir, err := sources(src)
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range srcs {
			s.Close()
		}
	}()
	label := f.Path(src)
	if peer != "" {
		if f.peers == nil {
			return errf(syscall.ENOENT, "unknown peer %q: no peers configured", peer)
		}
		n, err := f.peers.Send(ctx, peer, dst, srcs, isDir, label)
		logCopy(label, peer+":"+dst, n, err)
		return err
	}
	// Inside this mount: refuse a copy onto itself or into its own subtree
	// (the kernel holds src's lock for this call; a rename over it would hang).
	if target, err := f.Resolve(dst); err == nil && target == src {
		return errf(syscall.EINVAL, "copy of %s onto itself", dst)
	}
	if d, ok := src.(*Dir); ok && f.within(dst, d) {
		return errf(syscall.EINVAL, "copy of directory %s into its own subtree %s", label, dst)
	}
	if !isDir {
		if target, err := f.Resolve(dst); err == nil {
			if _, isD := target.(*Dir); isD {
				return errf(syscall.EISDIR, "%s is a directory (name the target file)", dst)
			}
		}
	}
	n, err := f.localCopy(ctx, label, dst, srcs, isDir, func(isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
		return f.prepare(dst, isDir, metas, nil, viaMount)
	})
	logCopy(label, dst, n, err)
	return err
}

// CopyFrom pulls a peer path (value: [PEER:]PATH) into node dst (a file, or
// a directory tree), replacing the data of files in place (the kernel holds
// dst's lock for this call). Errors as for CopyTo; ENOENT when dst has no
// name any more.
func (f *Tree) CopyFrom(ctx context.Context, dst Node, value string) (err error) {
	defer func() { err = copyErr(err) }()
	peer, src, err := f.parseTarget(value)
	if err != nil {
		return err
	}
	dstPath := f.Path(dst)
	if dstPath == "" {
		return errf(syscall.ENOENT, "copy_from into an unlinked file")
	}
	_, dstIsDir := dst.(*Dir)
	prepare := func(isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
		if isDir != dstIsDir {
			if dstIsDir {
				return nil, errf(syscall.EISDIR, "%s is a directory; the source %s is a file", dstPath, value)
			}
			return nil, errf(syscall.ENOTDIR, "%s is a file; the source %s is a directory", dstPath, value)
		}
		return f.prepare(dstPath, isDir, metas, dst, false)
	}
	if peer != "" {
		if f.peers == nil {
			return errf(syscall.ENOENT, "unknown peer %q: no peers configured", peer)
		}
		n, err := f.peers.Receive(ctx, peer, src, dstPath, prepare)
		logCopy(peer+":"+src, dstPath, n, err)
		return err
	}
	srcNode, err := f.Resolve(src)
	if err != nil {
		return err
	}
	if srcNode == dst {
		return errf(syscall.EINVAL, "copy of %s onto itself", src)
	}
	if d, ok := srcNode.(*Dir); ok && f.within(dstPath, d) {
		return errf(syscall.EINVAL, "copy of directory %s into its own subtree %s", src, dstPath)
	}
	if d, ok := dst.(*Dir); ok && f.within(src, d) {
		return errf(syscall.EINVAL, "copy of %s into a directory that contains it", src)
	}
	srcs, isDir, err := sources(srcNode)
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range srcs {
			s.Close()
		}
	}()
	n, err := f.localCopy(ctx, src, dstPath, srcs, isDir, prepare)
	logCopy(src, dstPath, n, err)
	return err
}

// localCopy copies tensors of this daemon device to device into dst.
func (f *Tree) localCopy(ctx context.Context, label, dst string, srcs []transfer.Source, isDir bool, prepare func(bool, []transfer.Meta) (transfer.Dest, error)) (int, error) {
	metas := make([]transfer.Meta, len(srcs))
	var total int64
	for i, s := range srcs {
		metas[i] = s.Meta()
		total += metas[i].NBytes
	}
	var rec *transfer.Record
	end := func(error) {}
	if f.peers != nil {
		rec, end = f.peers.TrackCtx(ctx, label, dst, "local", total, int64(len(srcs)))
	}
	// Local records have no phases: the engine gets no record.
	n, err := transfer.Deliver(nil, func() (transfer.Dest, error) {
		return prepare(isDir, metas)
	}, func(d transfer.Dest, _ func()) error {
		dd := d.(*dest)
		for i, s := range srcs {
			if err := dd.tensorAt(i).CopyFrom(s.(*fileSource).t); err != nil {
				return err
			}
			if rec != nil {
				rec.BytesDone.Add(metas[i].NBytes)
			}
		}
		return nil
	}, nil)
	end(err)
	return n, err
}

// batchPlan is a batch xattr's copies: pushes of local tensors by peer (in
// the order the peers first appear), and the other lines in order.
type batchPlan struct {
	order  []string
	pushes map[string][]batchPush
	others [][2]string
}

// batchPush is one local tensor of a batch sent to a peer.
type batchPush struct{ src, dst string }

// parseBatch parses a batch value: one "SRC DST" per line, blank lines and
// # comments skipped. Errors: EINVAL for a malformed line or path.
func (f *Tree) parseBatch(value string) (batchPlan, error) {
	b := batchPlan{pushes: map[string][]batchPush{}}
	for i, line := range strings.Split(value, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return b, errf(syscall.EINVAL, "batch line %d: want SRC DST, got %q", i+1, line)
		}
		sp, spath, err := f.parseTarget(fields[0])
		if err != nil {
			return b, err
		}
		dp, dpath, err := f.parseTarget(fields[1])
		if err != nil {
			return b, err
		}
		if sp == "" && dp != "" {
			if _, ok := b.pushes[dp]; !ok {
				b.order = append(b.order, dp)
			}
			b.pushes[dp] = append(b.pushes[dp], batchPush{spath, dpath})
			continue
		}
		b.others = append(b.others, [2]string{fields[0], fields[1]})
	}
	return b, nil
}

// Batch runs the copies of a batch xattr: one "SRC DST" per line. Pushes of
// local tensors to one peer go as one pipelined transfer; the rest run in
// order. It stops at the first failure and returns it (errors as CopyTo's).
func (f *Tree) Batch(ctx context.Context, value string) (err error) {
	defer func() { err = copyErr(err) }()
	b, err := f.parseBatch(value)
	if err != nil {
		return err
	}
	for _, peer := range b.order {
		if err := f.pushBatch(ctx, peer, b.pushes[peer]); err != nil {
			return err
		}
	}
	for _, o := range b.others {
		sp, spath, _ := f.parseTarget(o[0])
		if sp != "" {
			// A pull into this mount: into the destination's parent dir.
			dpPeer, dpath, _ := f.parseTarget(o[1])
			if dpPeer != "" {
				return errf(syscall.EINVAL, "batch: %s -> %s: one side must be this mount", o[0], o[1])
			}
			if err := f.pullTo(ctx, sp, spath, dpath); err != nil {
				return err
			}
			continue
		}
		n, err := f.Resolve(spath)
		if err != nil {
			return err
		}
		if err := f.CopyTo(ctx, n, o[1], false); err != nil {
			return err
		}
	}
	return nil
}

// pushBatch sends a batch's local tensors to peer as one transfer.
func (f *Tree) pushBatch(ctx context.Context, peer string, pushes []batchPush) error {
	var srcs []transfer.Source
	defer func() {
		for _, s := range srcs {
			s.Close()
		}
	}()
	for _, p := range pushes {
		n, err := f.Resolve(p.src)
		if err != nil {
			return err
		}
		file, ok := n.(*File)
		if !ok {
			return errf(syscall.EISDIR, "batch: %s is a directory (batch lines name tensors)", p.src)
		}
		s, err := openSource(file, strings.TrimPrefix(p.dst, "/"))
		if err != nil {
			return err
		}
		srcs = append(srcs, s)
	}
	if f.peers == nil {
		return errf(syscall.ENOENT, "unknown peer %q: no peers configured", peer)
	}
	n, err := f.peers.Send(ctx, peer, "/", srcs, true, "batch")
	logCopy("batch", peer+":/", n, err)
	return err
}

// pullTo copies peer:src to dst in this mount (a batch line). It renames into
// place inside the daemon: the kernel holds the root's lock for the batch.
func (f *Tree) pullTo(ctx context.Context, peer, src, dst string) error {
	if f.peers == nil {
		return errf(syscall.ENOENT, "unknown peer %q: no peers configured", peer)
	}
	n, err := f.peers.Receive(ctx, peer, src, dst, func(isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
		if !isDir {
			if t, err := f.Resolve(dst); err == nil {
				if _, isD := t.(*Dir); isD {
					return nil, errf(syscall.EISDIR, "%s is a directory", dst)
				}
			}
		}
		return f.prepare(dst, isDir, metas, nil, false)
	})
	logCopy(peer+":"+src, dst, n, err)
	return err
}

// logCopy logs a copy's outcome: its error, or how many tensors it put in
// place.
func logCopy(src, dst string, n int, err error) {
	if err != nil {
		log.Printf("copy %s -> %s: %v", src, dst, err)
		return
	}
	log.Printf("copy %s -> %s: %d tensor(s)", src, dst, n)
}
