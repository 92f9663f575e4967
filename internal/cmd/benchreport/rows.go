package main

// The rows of the performance table: what each benchmark is measured
// against, and its goal. Goals and floors come from the issues that set
// them (bench/history.md tells which); a benchmark added to
// scripts/bench.sh gets a row here, or its result is reported nowhere.

// term is one measurement a row reads from a round: the metric Unit of
// the benchmark Key ("InPlace4K/ipc", the name without "Benchmark" and
// GOMAXPROCS) run on device Device ("host", or the GPU's, as bench.sh's
// "tensorfs-device:" configuration line says).
type term struct {
	Device, Key, Unit string
}

// better says which way a row's value improves.
type better string

const (
	lower  better = "lower"  // a time: the ratio is tensorfs / floor
	higher better = "higher" // a rate: the ratio is tensorfs / floor
	// faster is a time compared as a rate: the ratio is floor /
	// tensorfs, so that 1 is the floor and the goal reads as throughput
	// (≥ 0.9 of raw), as the issues state them.
	faster better = "faster"
)

// rowSpec is one row: the value of Value, against the sum of Floor (none:
// an absolute Goal, or none at all), in the row's Unit after dividing by
// Scale.
type rowSpec struct {
	ID, Group, What string
	Value           term
	Floor           []term
	FloorWhat       string
	Better          better
	// Goal is the ratio's goal (the value's, without a floor); 0: none,
	// a reference row.
	Goal  float64
	Unit  string
	Scale float64
	// GPU rows run only on a GPU host.
	GPU bool
}

// gpuDev is the device the GPU rows run on (bench.sh's TENSORFS_TEST_DEVICE).
const gpuDev = "cuda:0"

func h(key, unit string) term   { return term{"host", key, unit} }
func g(key, unit string) term   { return term{gpuDev, key, unit} }
func one(ts ...term) []term     { return ts }
func gpuFloor(unit string) term { return term{gpuDev, "GPUFloor", unit} }

// pullLayers is the row of BenchmarkInPlacePullLayers on one path (its
// subtest name and the name the table prints): a baseline, not a floor.
func pullLayers(path, name string) rowSpec {
	key := "InPlacePullLayers/" + path
	return rowSpec{ID: "inplace-pull-layers-" + path, Group: "In-place copies between daemons, host memory",
		What: "32 layers × 16 blocks of 8 KiB pulled by one batch, " + name + " path, p50", Value: h(key, "p50-us"),
		Floor: one(h(key, "layer-calls-us")), FloorWhat: "the same blocks by 32 copy_from calls, one a layer (a baseline, not a floor)", Better: lower, Unit: "µs", Scale: 1}
}

// rows is the table, in order.
var rows = []rowSpec{
	{ID: "fuse-create-template", Group: "FUSE: metadata and file I/O (vs a minimal go-fuse filesystem)",
		What: "create + unlink, 64 KiB tensors of a template", Value: h("CreateUnlink64K/tensorfs-template", "ns/op"),
		Floor: one(h("CreateUnlink64K/floor", "ns/op")), FloorWhat: "the same on the FUSE floor", Better: lower, Goal: 1.2, Unit: "µs", Scale: 1e3},
	{ID: "fuse-create-write", Group: "FUSE: metadata and file I/O (vs a minimal go-fuse filesystem)",
		What: "create + 64 KiB write + unlink", Value: h("CreateUnlink64K/tensorfs-write", "ns/op"),
		Floor: one(h("CreateUnlink64K/floor", "ns/op")), FloorWhat: "the same on the FUSE floor", Better: lower, Goal: 1.2, Unit: "µs", Scale: 1e3},
	{ID: "fuse-seq-write", Group: "FUSE: metadata and file I/O (vs a minimal go-fuse filesystem)",
		What: "sequential write, 256 MiB", Value: h("SeqWrite256M/tensorfs", "MB/s"),
		Floor: one(h("SeqWrite256M/floor", "MB/s")), FloorWhat: "the same on the FUSE floor", Better: higher, Goal: 0.9, Unit: "MB/s", Scale: 1},
	{ID: "fuse-seq-read", Group: "FUSE: metadata and file I/O (vs a minimal go-fuse filesystem)",
		What: "sequential read, 256 MiB", Value: h("SeqRead256M/tensorfs", "MB/s"),
		Floor: one(h("SeqRead256M/floor", "MB/s")), FloorWhat: "the same on the FUSE floor", Better: higher, Goal: 0.9, Unit: "MB/s", Scale: 1},

	{ID: "whole-1g-new", Group: "Whole-tensor copies between daemons, TCP",
		What: "1 GiB copy_to, new destination", Value: h("PeerCopy1G/tensorfs-new", "MB/s"),
		Floor: one(h("PeerCopy1G/raw-new", "MB/s")), FloorWhat: "raw TCP into a fresh buffer, same streams", Better: higher, Goal: 0.9, Unit: "MB/s", Scale: 1},
	{ID: "whole-1g-existing", Group: "Whole-tensor copies between daemons, TCP",
		What: "1 GiB copy_to, existing destination", Value: h("PeerCopy1G/tensorfs-existing", "MB/s"),
		Floor: one(h("PeerCopy1G/raw-existing", "MB/s")), FloorWhat: "raw TCP into a reused buffer, same streams", Better: higher, Goal: 0.9, Unit: "MB/s", Scale: 1},
	{ID: "whole-tree-existing", Group: "Whole-tensor copies between daemons, TCP",
		What: "1000 × 64 KiB tree, one directory copy_to, existing destinations", Value: h("PeerTree1000x64K/dir", "tensors/s"),
		Floor: one(h("PeerTree1000x64K/files", "tensors/s")), FloorWhat: "1000 per-file copy_to", Better: higher, Goal: 10, Unit: "tensors/s", Scale: 1},
	{ID: "whole-tree-new", Group: "Whole-tensor copies between daemons, TCP",
		What: "1000 × 64 KiB tree, one directory copy_to, new destinations", Value: h("PeerTree1000x64K/dir-new", "tensors/s"),
		Floor: one(h("PeerTree1000x64K/files-new", "tensors/s")), FloorWhat: "1000 per-file copy_to", Better: higher, Goal: 10, Unit: "tensors/s", Scale: 1},
	{ID: "whole-4k", Group: "Whole-tensor copies between daemons, TCP",
		What: "4 KiB copy_to, new tensor each time, p50", Value: h("PeerSmallCopy4K/tensorfs", "p50-us"),
		Floor: one(h("PeerSmallCopy4K/raw", "p50-us")), FloorWhat: "4 KiB request/reply on an open connection", Better: lower, Unit: "µs", Scale: 1},

	{ID: "inplace-4k-ipc", Group: "In-place copies between daemons, host memory",
		What: "4 KiB copy_to into a range, IPC path, p50", Value: h("InPlace4K/ipc", "p50-us"),
		Floor: one(h("InPlace4K/ipc", "floor-us")), FloorWhat: "setxattr + request/reply + 4 KiB memmove", Better: lower, Goal: 2, Unit: "µs", Scale: 1},
	{ID: "inplace-4k-tcp", Group: "In-place copies between daemons, host memory",
		What: "4 KiB copy_to into a range, TCP path, p50", Value: h("InPlace4K/tcp", "p50-us"),
		Floor: one(h("InPlace4K/tcp", "floor-us")), FloorWhat: "setxattr + request/reply + 4 KiB memmove", Better: lower, Goal: 2.5, Unit: "µs", Scale: 1},
	{ID: "inplace-scatter-ipc", Group: "In-place copies between daemons, host memory",
		What: "1000 × 8 KiB scattered ranges, one call, IPC path, per descriptor", Value: h("InPlaceScatter1000x8K/ipc", "us/desc"),
		FloorWhat: "(goal: µs per descriptor)", Better: lower, Goal: 2, Unit: "µs", Scale: 1},
	{ID: "inplace-scatter-tcp", Group: "In-place copies between daemons, host memory",
		What: "1000 × 8 KiB scattered ranges, one call, TCP path (checksum xxh3, the default)", Value: h("InPlaceScatter1000x8K/tcp", "p50-us"),
		Floor: one(h("InPlaceScatter1000x8K/tcp", "raw-p50-us")), FloorWhat: "raw TCP moving the 8 MiB, same streams", Better: faster, Goal: 0.8, Unit: "µs", Scale: 1},
	{ID: "inplace-4k-tcp-nocrc", Group: "In-place copies between daemons, host memory",
		What: "4 KiB copy_to into a range, TCP path, --checksum none, p50", Value: h("InPlace4K/tcp-nocrc", "p50-us"),
		Floor: one(h("InPlace4K/tcp-nocrc", "floor-us")), FloorWhat: "setxattr + request/reply + 4 KiB memmove", Better: lower, Goal: 2.5, Unit: "µs", Scale: 1},
	{ID: "inplace-scatter-tcp-crc32c", Group: "In-place copies between daemons, host memory",
		What: "1000 × 8 KiB scattered ranges, one call, TCP path, --checksum crc32c (releases before xxh3)", Value: h("InPlaceScatter1000x8K/tcp-crc32c", "p50-us"),
		Floor: one(h("InPlaceScatter1000x8K/tcp-crc32c", "raw-p50-us")), FloorWhat: "raw TCP moving the 8 MiB, same streams", Better: faster, Unit: "µs", Scale: 1},
	{ID: "inplace-scatter-tcp-nocrc", Group: "In-place copies between daemons, host memory",
		What: "1000 × 8 KiB scattered ranges, one call, TCP path, --checksum none", Value: h("InPlaceScatter1000x8K/tcp-nocrc", "p50-us"),
		Floor: one(h("InPlaceScatter1000x8K/tcp-nocrc", "raw-p50-us")), FloorWhat: "raw TCP moving the 8 MiB, same streams", Better: faster, Goal: 0.8, Unit: "µs", Scale: 1},
	{ID: "inplace-scatter-ipc-binary", Group: "In-place copies between daemons, host memory",
		What: "the same 1000 as a binary range list, IPC path, per descriptor", Value: h("InPlaceScatter1000x8K/ipc-binary", "us/desc"),
		FloorWhat: "(goal: µs per descriptor)", Better: lower, Goal: 2, Unit: "µs", Scale: 1},
	{ID: "inplace-scatter-tcp-binary", Group: "In-place copies between daemons, host memory",
		What: "the same 1000 as a binary range list, TCP path", Value: h("InPlaceScatter1000x8K/tcp-binary", "p50-us"),
		Floor: one(h("InPlaceScatter1000x8K/tcp-binary", "raw-p50-us")), FloorWhat: "raw TCP moving the 8 MiB, same streams", Better: faster, Goal: 0.8, Unit: "µs", Scale: 1},
	{ID: "inplace-scatter-tcp-nocrc-binary", Group: "In-place copies between daemons, host memory",
		What: "the same 1000 as a binary range list, TCP path, --checksum none", Value: h("InPlaceScatter1000x8K/tcp-nocrc-binary", "p50-us"),
		Floor: one(h("InPlaceScatter1000x8K/tcp-nocrc-binary", "raw-p50-us")), FloorWhat: "raw TCP moving the 8 MiB, same streams", Better: faster, Goal: 0.8, Unit: "µs", Scale: 1},
	pullLayers("ipc", "IPC"),
	pullLayers("tcp", "TCP"),
	{ID: "inplace-big-tcp", Group: "In-place copies between daemons, host memory",
		What: "large copy_to in place (INPLACE_BIG_MB), TCP path (checksum xxh3, the default)", Value: h("InPlaceBig/tcp", "MB/s"),
		Floor: one(h("InPlaceBig/tcp", "raw-MB/s")), FloorWhat: "raw TCP into a reused buffer, same streams", Better: higher, Goal: 0.9, Unit: "MB/s", Scale: 1},
	{ID: "inplace-big-tcp-crc32c", Group: "In-place copies between daemons, host memory",
		What: "large copy_to in place (INPLACE_BIG_MB), TCP path, --checksum crc32c (releases before xxh3)", Value: h("InPlaceBig/tcp-crc32c", "MB/s"),
		Floor: one(h("InPlaceBig/tcp-crc32c", "raw-MB/s")), FloorWhat: "raw TCP into a reused buffer, same streams", Better: higher, Unit: "MB/s", Scale: 1},
	{ID: "inplace-big-tcp-nocrc", Group: "In-place copies between daemons, host memory",
		What: "large copy_to in place (INPLACE_BIG_MB), TCP path, --checksum none", Value: h("InPlaceBig/tcp-nocrc", "MB/s"),
		Floor: one(h("InPlaceBig/tcp-nocrc", "raw-MB/s")), FloorWhat: "raw TCP into a reused buffer, same streams", Better: higher, Goal: 0.9, Unit: "MB/s", Scale: 1},
	{ID: "inplace-big-ipc", Group: "In-place copies between daemons, host memory",
		What: "large copy_to in place (INPLACE_BIG_MB), IPC path", Value: h("InPlaceBig/ipc", "MB/s"),
		Floor: one(h("InPlaceBig/ipc", "raw-MB/s")), FloorWhat: "memmove of the size, split as the daemons split it (≤ 8 goroutines of ≥ 1 MiB)", Better: higher, Unit: "MB/s", Scale: 1},

	{ID: "revoke-16", Group: "Leases and imports (no floor: the cost itself)",
		What: "unlink of a tensor 16 importers hold (revocation round)", Value: h("Revocation/importers=16", "ns/op"),
		Floor: one(h("Revocation/importers=0", "ns/op")), FloorWhat: "the same unlink with no importer", Better: lower, Unit: "µs", Scale: 1e3},
	{ID: "import-hit", Group: "Leases and imports (no floor: the cost itself)",
		What: "64 KiB copy_to, IPC path, import cached", Value: h("ImportCache/hit", "ns/op"),
		Floor: one(h("ImportCache/miss", "ns/op")), FloorWhat: "the same, import opened afresh", Better: lower, Unit: "µs", Scale: 1e3},
	{ID: "etcd-startup", Group: "Cluster membership through etcd",
		What: "daemon start-up with 1000 nodes in etcd", Value: h("EtcdScale", "startup-1000-ms"),
		Floor: one(h("EtcdScale", "startup-no-etcd-ms")), FloorWhat: "start-up without --etcd", Better: lower, Unit: "ms", Scale: 1},
	{ID: "etcd-gone", Group: "Cluster membership through etcd",
		What: "a node's record deleted to gone from a daemon's view, p50", Value: h("EtcdScale", "delete-to-gone-p50-ms"),
		Better: lower, Unit: "ms", Scale: 1},

	{ID: "gpu-inplace-4k-ipc", Group: "GPU (cuda:0)", GPU: true,
		What: "4 KiB copy_to into a range, IPC path, cuda:0 → cuda:0, p50", Value: g("InPlace4K/ipc", "p50-us"),
		Floor:     one(g("InPlace4K/ipc", "setxattr-us"), g("InPlace4K/ipc", "reqreply-us"), gpuFloor("copy4k-us")),
		FloorWhat: "setxattr + request/reply + 4 KiB device copy and sync", Better: lower, Goal: 2, Unit: "µs", Scale: 1},
	{ID: "gpu-inplace-4k-tcp", Group: "GPU (cuda:0)", GPU: true,
		What: "4 KiB copy_to into a range, TCP path, cuda:0 → cuda:0, p50", Value: g("InPlace4K/tcp", "p50-us"),
		Floor:     one(g("InPlace4K/tcp", "setxattr-us"), g("InPlace4K/tcp", "reqreply-us"), gpuFloor("copy4k-us")),
		FloorWhat: "setxattr + request/reply + 4 KiB device copy and sync", Better: lower, Goal: 2.5, Unit: "µs", Scale: 1},
	{ID: "gpu-inplace-scatter-ipc", Group: "GPU (cuda:0)", GPU: true,
		What: "1000 × 8 KiB scattered ranges, one call, IPC path, cuda:0", Value: g("InPlaceScatter1000x8K/ipc", "p50-us"),
		Floor:     one(g("InPlace4K/ipc", "setxattr-us"), g("InPlace4K/ipc", "reqreply-us"), gpuFloor("scatter-us")),
		FloorWhat: "setxattr + request/reply + one scatter kernel over the 1000", Better: lower, Goal: 2, Unit: "µs", Scale: 1},
	{ID: "gpu-inplace-scatter-ipc-binary", Group: "GPU (cuda:0)", GPU: true,
		What: "the same 1000 as a binary range list, IPC path, cuda:0", Value: g("InPlaceScatter1000x8K/ipc-binary", "p50-us"),
		Floor:     one(g("InPlace4K/ipc", "setxattr-us"), g("InPlace4K/ipc", "reqreply-us"), gpuFloor("scatter-us")),
		FloorWhat: "setxattr + request/reply + one scatter kernel over the 1000", Better: lower, Goal: 2, Unit: "µs", Scale: 1},
	{ID: "gpu-inplace-1g-ipc", Group: "GPU (cuda:0)", GPU: true,
		What: "1 GiB copy_to in place, IPC path, cuda:0", Value: g("InPlaceBig/ipc", "p50-us"),
		Floor:     one(g("InPlace4K/ipc", "setxattr-us"), g("InPlace4K/ipc", "reqreply-us"), gpuFloor("ipc1g-us")),
		FloorWhat: "setxattr + request/reply + 1 GiB from an IPC-opened pointer", Better: faster, Goal: 0.9, Unit: "µs", Scale: 1},
	{ID: "gpu-register-1g", Group: "GPU (cuda:0)", GPU: true,
		What: "create and register 1 GiB", Value: g("GPURegister1G/tensorfs", "ns/op"),
		Floor: one(g("GPURegister1G/cuMemAlloc+cuIpcGetMemHandle", "ns/op")), FloorWhat: "bare cuMemAlloc + cuIpcGetMemHandle", Better: lower, Unit: "µs", Scale: 1e3},
	{ID: "gpu-seq-write", Group: "GPU (cuda:0)", GPU: true,
		What: "sequential write, 1 GiB, cuda:0", Value: g("GPUSeqWrite1G/cuda:0", "MB/s"),
		Floor: one(g("GPUSeqWrite1G/host", "MB/s")), FloorWhat: "the same on a host-memory mount", Better: higher, Unit: "MB/s", Scale: 1},
	{ID: "gpu-seq-read", Group: "GPU (cuda:0)", GPU: true,
		What: "sequential read, 1 GiB, cuda:0", Value: g("GPUSeqRead1G/cuda:0", "MB/s"),
		Floor: one(g("GPUSeqRead1G/host", "MB/s")), FloorWhat: "the same on a host-memory mount", Better: higher, Unit: "MB/s", Scale: 1},
}

// sweepBench is the benchmark whose points are plotted against size:
// SweepBench/PATH/SIZE with p50-us, floor-us, MB/s and floor-MB/s.
const sweepBench = "InPlaceSweep"
