package namespace

import (
	"context"
	"strings"
	"syscall"

	"github.com/tensorfs/tensorfs/transfer"
)

// runLines runs the lines of one call (a batch, or a copy_to of several
// lines) as one descriptor list (DESIGN.md "In-place copies"):
//
//   - the pushes of this mount's tensors (or their ranges) to one peer are
//     one transfer; the in-place lines into this mount are one local batch
//     (one gather/scatter kernel launch on CUDA); a pull is one get per
//     line; a directory line is a copy of its tree;
//   - every in-place line is moved before any whole-tensor line is
//     committed, so that a final small whole-tensor line is the call's
//     arrival notification: the in-place work runs first, then the
//     whole-tensor work. When the whole-tensor work is one peer's push
//     only, that peer's in-place descriptors travel in the same transfer
//     (its commit follows its own bytes), saving a round trip.
//
// It stops at the first failure and returns it. label names the call's
// source in records and logs.
func (f *Tree) runLines(ctx context.Context, lines []copyLine, viaMount bool, label string) error {
	set := sourceSet{}
	var opened []transfer.Source
	defer func() { closeAll(opened) }()
	type push struct {
		inPlace, whole []transfer.Source
	}
	pushes := map[string]*push{}
	var peers []string // in the order they first appear
	var local []transfer.Source
	var first, then []func() error // the in-place work, the whole-tensor work
	later := func(inPlace bool, fn func() error) {
		if inPlace {
			first = append(first, fn)
		} else {
			then = append(then, fn)
		}
	}
	for _, l := range lines {
		inPlace := l.dst.r.Set
		if l.src.peer != "" {
			if l.dst.peer != "" {
				return errf(syscall.EINVAL, "%s -> %s: one side of a line must be this mount", l.src, l.dst)
			}
			later(inPlace, func() error { return f.pullLine(ctx, l) })
			continue
		}
		node := l.node
		if node == nil {
			n, err := f.Resolve(l.src.path)
			if err != nil {
				return err
			}
			node = n
		}
		file, ok := node.(*File)
		if !ok {
			later(inPlace, func() error { return f.copyNode(ctx, node, l, viaMount) })
			continue
		}
		if l.dst.peer == "" && !inPlace {
			later(false, func() error { return f.copyNode(ctx, node, l, viaMount) })
			continue
		}
		s, err := set.open(file, strings.TrimPrefix(l.dst.path, "/"), l.src.r)
		if err != nil {
			return err
		}
		opened = append(opened, s)
		if inPlace {
			if s.meta, err = l.dst.r.Dest(s.meta); err != nil {
				return err
			}
		}
		if l.dst.peer == "" {
			local = append(local, s)
			continue
		}
		p := pushes[l.dst.peer]
		if p == nil {
			p = &push{}
			pushes[l.dst.peer] = p
			peers = append(peers, l.dst.peer)
		}
		if inPlace {
			p.inPlace = append(p.inPlace, s)
		} else {
			p.whole = append(p.whole, s)
		}
	}
	if len(local) > 0 {
		first = append(first, func() error { return f.localLines(ctx, label, local) })
	}
	// One peer's push is all the whole-tensor work: its in-place
	// descriptors go with it.
	merge := ""
	if len(then) == 0 {
		for _, peer := range peers {
			if len(pushes[peer].whole) == 0 {
				continue
			}
			if merge != "" {
				merge = ""
				break
			}
			merge = peer
		}
	}
	for _, peer := range peers {
		p := pushes[peer]
		if peer == merge {
			p.whole, p.inPlace = append(p.inPlace, p.whole...), nil
		}
		if len(p.inPlace) > 0 {
			first = append(first, func() error { return f.pushLines(ctx, peer, label, p.inPlace) })
		}
		if len(p.whole) > 0 {
			then = append(then, func() error { return f.pushLines(ctx, peer, label, p.whole) })
		}
	}
	for _, fn := range append(first, then...) {
		if err := fn(); err != nil {
			return err
		}
	}
	return nil
}

// pushLines sends a call's descriptors to peer as one transfer, rooted at
// its mount's root.
func (f *Tree) pushLines(ctx context.Context, peer, label string, srcs []transfer.Source) error {
	if f.peers == nil {
		return errf(syscall.ENOENT, "unknown peer %q: no peers configured", peer)
	}
	n, err := f.peers.Send(ctx, peer, "/", srcs, true, label)
	logCopy(label, peer+":/", n, err)
	return err
}

// localLines writes a call's in-place descriptors into this mount, as one
// batch.
func (f *Tree) localLines(ctx context.Context, label string, srcs []transfer.Source) error {
	n, err := f.localCopy(ctx, label, "/", srcs, true, func(isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
		return f.prepare("/", isDir, metas, prepOpts{caller: callerOf(ctx)})
	})
	logCopy(label, "/", n, err)
	return err
}

// pullLine copies one line's peer source into this mount. It renames into
// place inside the daemon: the kernel holds the root's lock for a batch.
func (f *Tree) pullLine(ctx context.Context, l copyLine) error {
	if f.peers == nil {
		return errf(syscall.ENOENT, "unknown peer %q: no peers configured", l.src.peer)
	}
	dst := l.dst.path
	pull := transfer.Pull{Peer: l.src.peer, Path: l.src.path, Range: l.src.r, Dst: dst, DstRange: l.dst.r}
	n, err := f.peers.Receive(ctx, pull, func(isDir bool, metas []transfer.Meta) (transfer.Dest, error) {
		if !isDir && !l.dst.r.Set {
			if t, err := f.Resolve(dst); err == nil {
				if _, isD := t.(*Dir); isD {
					return nil, errf(syscall.EISDIR, "%s is a directory", dst)
				}
			}
		}
		return f.prepare(dst, isDir, metas, prepOpts{caller: callerOf(ctx)})
	})
	logCopy(l.src.String(), l.dst.String(), n, err)
	return err
}
