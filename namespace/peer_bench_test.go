package namespace

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
	"github.com/tensorfs/tensorfs/xattrs"
)

// peerTrees starts two trees on host memory with peer services that know
// each other ("a" and "b"), on one host id (the IPC path) or two (TCP):
// the daemons' copy path without FUSE.
func peerTrees(tb testing.TB, sameHost bool) (a, b *Tree) {
	tb.Helper()
	mk := func(name, host string, peers map[string]string) *Tree {
		h, err := gpu.NewHost(1 << 30)
		if err != nil {
			tb.Fatal(err)
		}
		store, err := tensor.NewStore(tensor.Config{Devices: []gpu.Device{h}})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(store.Close)
		cfg := transfer.Config{Name: name, HostID: host, Listen: "127.0.0.1:0", Peers: peers,
			Importers: Importers(store), ImportFile: ImportFile(store)}
		tree, svc, err := New(store, func(l transfer.Local) (*transfer.Service, error) { return transfer.New(cfg, l) })
		if err != nil {
			tb.Fatal(err)
		}
		if err := svc.Start(); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { svc.Close() })
		return tree
	}
	hostB := "host-a"
	if !sameHost {
		hostB = "host-b"
	}
	b = mk("b", hostB, nil)
	a = mk("a", "host-a", map[string]string{"b": b.peers.Addr().String()})
	return a, b
}

// addTensor adds an n-byte U8 tensor named name to t's root, filled with
// seed's bytes.
func addTensor(tb testing.TB, t *Tree, name string, n int, seed uint64) *File {
	tb.Helper()
	ten, err := t.store.New(u8tmpl())
	if err != nil {
		tb.Fatal(err)
	}
	if err := ten.Truncate(int64(n)); err != nil {
		tb.Fatal(err)
	}
	data := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed)}).Read(data)
	if _, err := ten.WriteAt(data, 0); err != nil {
		tb.Fatal(err)
	}
	f := NewFile(ten, 0o644, 0, 0)
	if err := t.Root().Add(name, f); err != nil {
		tb.Fatal(err)
	}
	return f
}

// BenchmarkPeerInPlace: in-place copy_to calls between two trees of this
// process over their peer services, without FUSE: what the two daemons'
// CPU costs a call (ns/op), on the IPC path and over TCP. Sub-benchmarks:
// 4 KiB into a range, and 1000 descriptors of 64 bytes as a binary range
// list (the scatter row's per-descriptor cost with next to no bytes).
func BenchmarkPeerInPlace(b *testing.B) {
	for _, same := range []bool{true, false} {
		path := "ipc"
		if !same {
			path = "tcp"
		}
		b.Run(path+"/4K", func(b *testing.B) {
			a, d := peerTrees(b, same)
			src := addTensor(b, a, "src", 4096, 1)
			addTensor(b, d, "cache", 1<<20, 2)
			ctx := context.Background()
			i := 0
			for b.Loop() {
				if err := a.CopyTo(ctx, src, fmt.Appendf(nil, "b:/cache@%d", (i%256)*4096), false); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
		b.Run(path+"/1000x64-binary", func(b *testing.B) {
			const n, blk = 1000, 64
			a, d := peerTrees(b, same)
			src := addTensor(b, a, "blocks", n*blk, 1)
			addTensor(b, d, "cache", 2*n*blk, 2)
			perm := rand.New(rand.NewPCG(1, 2)).Perm(2 * n)[:n]
			var descs []xattrs.RangeDesc
			for i, j := range perm {
				descs = append(descs, xattrs.RangeDesc{Src: int64(i * blk), Dst: int64(j * blk), Len: blk})
			}
			value := xattrs.AppendRangeRecord(nil, "b:/cache", descs)
			ctx := context.Background()
			for b.Loop() {
				if err := a.CopyTo(ctx, src, value, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
