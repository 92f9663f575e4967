package fs

import gofs "github.com/hanwen/go-fuse/v2/fs"

// Compile-time checks that the nodes implement the go-fuse operations tensorfs
// relies on; a missing one would silently fall back to go-fuse's default.
var (
	_ = (gofs.NodeLookuper)((*Dir)(nil))
	_ = (gofs.NodeGetattrer)((*Dir)(nil))
	_ = (gofs.NodeSetattrer)((*Dir)(nil))
	_ = (gofs.NodeCreater)((*Dir)(nil))
	_ = (gofs.NodeMkdirer)((*Dir)(nil))
	_ = (gofs.NodeUnlinker)((*Dir)(nil))
	_ = (gofs.NodeRmdirer)((*Dir)(nil))
	_ = (gofs.NodeRenamer)((*Dir)(nil))
	_ = (gofs.NodeLinker)((*Dir)(nil))
	_ = (gofs.NodeSymlinker)((*Dir)(nil))
	_ = (gofs.NodeMknoder)((*Dir)(nil))
	_ = (gofs.NodeStatfser)((*Dir)(nil))
	_ = (gofs.NodeGetxattrer)((*Dir)(nil))
	_ = (gofs.NodeSetxattrer)((*Dir)(nil))
	_ = (gofs.NodeRemovexattrer)((*Dir)(nil))
	_ = (gofs.NodeListxattrer)((*Dir)(nil))
	_ = (gofs.NodeStatxer)((*Dir)(nil))
	_ = (gofs.NodeFsyncer)((*Dir)(nil))
	_ = (gofs.NodeReaddirer)((*Dir)(nil))

	_ = (gofs.NodeGetattrer)((*File)(nil))
	_ = (gofs.NodeSetattrer)((*File)(nil))
	_ = (gofs.NodeOpener)((*File)(nil))
	_ = (gofs.NodeReader)((*File)(nil))
	_ = (gofs.NodeWriter)((*File)(nil))
	_ = (gofs.NodeReleaser)((*File)(nil))
	_ = (gofs.NodeFlusher)((*File)(nil))
	_ = (gofs.NodeFsyncer)((*File)(nil))
	_ = (gofs.NodeAllocater)((*File)(nil))
	_ = (gofs.NodeStatfser)((*File)(nil))
	_ = (gofs.NodeGetxattrer)((*File)(nil))
	_ = (gofs.NodeSetxattrer)((*File)(nil))
	_ = (gofs.NodeRemovexattrer)((*File)(nil))
	_ = (gofs.NodeListxattrer)((*File)(nil))
	_ = (gofs.NodeStatxer)((*File)(nil))
)
