package main

// What bench checks before it makes anything: the peer, and room for its
// largest phase in each mount and in the host's memory.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// preflight refuses, before anything is created, what cannot run: a peer
// the mount does not know (or the mount's own node), a peer whose mount is
// not on this host without --leave-peer-dir, a phase that does not fit in
// the mount's free space or the peer's (when its mount is here), or in the
// host's available memory for host-memory mounts, and a --plot file that
// cannot be written.
func (b *bench) preflight() error {
	if b.opt.plot != "" {
		if err := checkWritableDir(filepath.Dir(b.opt.plot)); err != nil {
			return b.fail("--plot %s: %v", b.opt.plot, err)
		}
	}
	var remote *benchSpace
	if peer := b.opt.peer; peer != "" {
		st, err := readStats(b.mnt)
		if err != nil {
			return b.fail("%v", err)
		}
		p, known := st.Peers[peer]
		if peer == b.node || known && p.Self {
			return b.fail("--peer %s is this mount's own node; leave --peer out to copy inside the mount", peer)
		}
		if !known && !st.Truncated {
			// (A document that had to drop its peers to stay under 64 KiB
			// cannot say; the first copy would then fail with ENOENT.)
			return b.fail("unknown peer %s: %s knows %s (its --peer flags and etcd view)", peer, b.mnt, peerList(st.Peers))
		}
		cands := b.peerCandidates()
		if len(cands) == 0 && !b.opt.leavePeerDir {
			return b.fail("peer %s's mount is not on this host (no tensorfs:%s in /proc/mounts), and tensorfs cannot remove a peer's files: run bench on %s's host, or pass --leave-peer-dir to leave an empty directory on %s",
				peer, peer, peer, peer)
		}
		if len(cands) == 1 {
			// Most likely the peer's (makeDirs makes sure): check it now,
			// while nothing is made.
			r, err := b.space(cands[0])
			if err != nil {
				return err
			}
			remote = &r
		}
	}
	local, err := b.space(b.mnt)
	if err != nil {
		return err
	}
	avail, _ := memAvailable()
	return b.checkSpace(local, remote, avail)
}

// benchSpace is what a mount has room for: its free bytes (statfs), and
// whether bench's tensors there are host memory (then the host's available
// memory bounds them too: a host daemon's statfs counts all of the host's
// memory as its own, as does every other daemon's on the host).
type benchSpace struct {
	mnt  string
	free uint64
	host bool
}

// space reads mnt's free space and whether its tensors (at the root's
// template device, or the default device) are host memory.
func (b *bench) space(mnt string) (benchSpace, error) {
	sp := benchSpace{mnt: mnt}
	var err error
	if sp.free, err = statfsFree(mnt); err != nil {
		return sp, b.fail("statfs %s: %s", mnt, errText(err))
	}
	dev, ok, err := getxattrString(func(p []byte) (int, error) { return unix.Getxattr(mnt, xattrs.Device, p) })
	if err != nil || !ok {
		dev = ""
		if st, err := readStats(mnt); err == nil {
			for _, d := range st.Devices {
				if d.Default {
					dev = d.Name
				}
			}
		}
	}
	sp.host = dev == "host"
	return sp, nil
}

// checkSpace refuses the first phase that needs, at once, more than the
// local mount's free space, the peer's (remote, nil when its mount is not
// here), or the host's available memory (avail bytes, 0 when unknown) for
// the host-memory mounts of the two together.
func (b *bench) checkSpace(local benchSpace, remote *benchSpace, avail uint64) error {
	for _, mode := range b.opt.modes {
		for _, size := range b.opt.sizes {
			l, r := benchNeeds(benchPhase{mode: mode, size: size, n: b.opt.batch}, b.opt.dirs, b.opt.peer != "", b.opt.check > 0)
			parts := "sources and destinations"
			if mode == modeWhole {
				parts = "sources, destinations and the temporaries of replacing copies"
			}
			what := fmt.Sprintf("size %s x batch %d needs %%s at once %%s for its %s copies (%s)",
				humanize.IBytes(uint64(size)), b.opt.batch, mode, parts)
			fix := "give smaller --sizes or --batch"
			if uint64(l) > local.free {
				return b.fail(what+", which has %s free (statfs): %s", humanize.IBytes(uint64(l)), "on "+local.mnt, humanize.IBytes(local.free), fix)
			}
			if remote != nil && uint64(r) > remote.free {
				return b.fail(what+", which has %s free (statfs): %s", humanize.IBytes(uint64(r)), fmt.Sprintf("on %s (%s's mount)", remote.mnt, b.opt.peer), humanize.IBytes(remote.free), fix)
			}
			var host int64
			where := []string{}
			if local.host {
				host += l
				where = append(where, local.mnt)
			}
			if remote != nil && remote.host && r > 0 {
				host += r
				where = append(where, remote.mnt)
			}
			if avail > 0 && uint64(host) > avail {
				return b.fail(what+", and this host has %s available (MemAvailable, /proc/meminfo): %s", humanize.IBytes(uint64(host)), "of host memory on "+strings.Join(where, " and "), humanize.IBytes(avail), fix)
			}
		}
	}
	return nil
}

// memAvailable is the host's MemAvailable, in bytes (0 when unknown).
func memAvailable() (uint64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			var kb uint64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}

// benchNeeds is the most memory a phase holds at once, in bytes, on the
// local mount and on the peer's (0 without a peer): its tensors, and for
// whole copies the temporaries a replacing copy allocates before it frees
// what it replaces. With a peer and checks, a scratch tensor (of one
// descriptor, at most scratchMax) carries bytes to and from the peer.
func benchNeeds(ph benchPhase, dirs []string, peer, check bool) (local, remote int64) {
	s, t := ph.size, ph.total()
	pull := slices.Contains(dirs, dirPull)
	scratch := int64(0)
	if peer && check {
		scratch = scratchSize(s)
	}
	switch {
	case ph.mode == modeInPlace && peer:
		return t + scratch, t
	case ph.mode == modeInPlace:
		return 2 * t, 0
	case peer:
		local = s + scratch
		if pull {
			local += 2 * t
		}
		return local, 2 * t
	default:
		// The source, its copies, their temporaries, and the pulled copies.
		local = s + 2*t
		if pull {
			local += t
		}
		return local, 0
	}
}

// statfsFree is the free bytes of the mount at mnt, as df shows them.
func statfsFree(mnt string) (uint64, error) {
	var sf unix.Statfs_t
	if err := unix.Statfs(mnt, &sf); err != nil {
		return 0, err
	}
	return sf.Bavail * uint64(sf.Bsize), nil
}

// peerList is the names of peers, sorted, for an unknown peer's error.
func peerList(peers map[string]xattrs.Peer) string {
	var names []string
	for n, p := range peers {
		if !p.Self {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "no peers"
	}
	slices.Sort(names)
	return "only " + strings.Join(names, ", ")
}

// checkWritableDir reports whether a file can be created in dir, by
// creating one and removing it: a plot that cannot be written should fail
// before the bench, not after it.
func checkWritableDir(dir string) error {
	f, err := os.CreateTemp(dir, ".tensorfs-bench-plot-*")
	if err != nil {
		return errors.New(errText(unwrapPath(err)))
	}
	f.Close()
	return os.Remove(f.Name())
}

// peerCandidates are the tensorfs mounts on this host, other than this
// one, whose source says they serve the node named --peer.
func (b *bench) peerCandidates() []string {
	ms, err := readMounts()
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range ms {
		if m.fstype == cpFSType && m.source == mountSourcePrefix+b.opt.peer && m.dir != b.mnt && !slices.Contains(out, m.dir) {
			out = append(out, m.dir)
		}
	}
	return out
}
