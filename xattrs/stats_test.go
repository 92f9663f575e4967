package xattrs_test

// This test imports the producers of the stats document (tensor, transfer);
// the xattrs package itself imports neither.

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tensorfs/tensorfs/namespace"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
	"github.com/tensorfs/tensorfs/xattrs"
)

// TestStatsMatchesProducers: the document the daemon builds (fs.Stats: the
// store's tensor.Stats as "live" beside the peer service's transfer.Stats),
// with every field set, decodes strictly (no unknown field) into
// xattrs.Stats and encodes back to the same JSON.
func TestStatsMatchesProducers(t *testing.T) {
	var peer transfer.Stats
	peer.Copies.Local, peer.Copies.IPC, peer.Copies.TCP, peer.Copies.UCX = 1, 2, 3, 31
	peer.Copies.InPlace = transfer.PathCounts{Local: 21, IPC: 22, TCP: 23, UCX: 32}
	peer.Copies.Bytes = transfer.PathCounts{Local: 24, IPC: 25, TCP: 26, UCX: 33}
	peer.Copies.Descriptors = 27
	peer.Copies.Rechecked = 28
	peer.Transfers.Active = 4
	peer.Transfers.Recent = []transfer.RecordReport{
		{ID: 5, PID: 6, Src: "/a", Dst: "b:/a", Path: "tcp", BytesDone: 7, BytesTotal: 8, Tensors: 9, Mode: "in_place", Error: "e",
			Streams: 10, PhaseUS: &transfer.PhaseReport{Prepare: 11, Data: 12, Commit: 13}, TookUS: 14},
		{ID: 15, Src: "/c", Dst: "/d", Path: "local"},
		{ID: 16, Src: "/e", Dst: "b:/e", Path: "ucx", Transports: []string{"tcp/lo"}},
	}
	peer.Peers = map[string]transfer.PeerReport{"b": {Addr: "10.0.0.2:7000"}, "c": {Addr: "10.0.0.3:7000", Source: "etcd", Self: true,
		HostID: "h", SameHost: true, Instance: "i", Transports: []string{"tcp"}, UCX: []string{"posix/memory"}, UCXOneSided: true, Since: "2026-12-02T00:00:00Z", Stale: true}}
	peer.Cluster = &transfer.ClusterReport{Backend: "etcd", Endpoints: []string{"http://127.0.0.1:2379"}, Cluster: "default", State: "lost",
		Since: "2026-12-02T00:00:00Z", Error: "e", Registered: true, Nodes: 3, Revision: 18}
	peer.Imports.Hits, peer.Imports.Misses = 16, 17
	peer.Connections.Idle, peer.Connections.Waiting = 18, 19
	doc := namespace.Stats{Live: tensor.Stats{Tensors: 1, Regions: 2, Exports: 3, Imports: 4, Leases: 5, Pins: 6, Bytes: 7}, Stats: peer,
		Truncated: true, Devices: []tensor.DeviceStats{{Name: "cuda:0", Tensors: 27, Used: 24, Total: 23, Default: true}, {Name: "host", Used: 26, Total: 25}},
		Errors: namespace.Errors{Total: 20, Recent: []namespace.Refusal{{ID: 22, Time: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC), PID: 21,
			Path: "/x", Attr: "user.tensorfs.dtype", Errno: "EINVAL", Reason: "r"}}}}
	want, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}

	var got xattrs.Stats
	dec := json.NewDecoder(bytes.NewReader(want))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("the daemon's document does not decode into xattrs.Stats: %v\n%s", err, want)
	}
	again, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, want) {
		t.Fatalf("xattrs.Stats loses or changes fields:\n got %s\nwant %s", again, want)
	}
}

// TestNames: every attribute name is in the user.tensorfs. namespace.
func TestNames(t *testing.T) {
	for _, n := range []string{xattrs.DType, xattrs.Shape, xattrs.Device, xattrs.MRID, xattrs.IPCID, xattrs.IPCHandle,
		xattrs.IPCOffset, xattrs.NBytes, xattrs.Generation, xattrs.RKey, xattrs.CopyTo, xattrs.CopyFrom, xattrs.Batch,
		xattrs.Register, xattrs.StatsName} {
		if !strings.HasPrefix(n, xattrs.Prefix) || len(n) == len(xattrs.Prefix) {
			t.Errorf("%q is not a name under %q", n, xattrs.Prefix)
		}
	}
}
