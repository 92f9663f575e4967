package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorfs/tensorfs/transfer"
)

// The metrics the collector reads at scrape time, one Desc each.
var (
	descTensors = prometheus.NewDesc("tensorfs_tensors",
		"Tensors alive now (not yet released), by device.", []string{"device"}, nil)
	descUsed = prometheus.NewDesc("tensorfs_memory_used_bytes",
		"Bytes of device memory tensorfs holds now, by device.", []string{"device"}, nil)
	descCapacity = prometheus.NewDesc("tensorfs_memory_capacity_bytes",
		"Bytes tensorfs may hold on the device (its memory, or --max-memory), by device.", []string{"device"}, nil)
	descAllocs = prometheus.NewDesc("tensorfs_allocations_total",
		"Device allocations made for tensors (creations, sizings and reallocations).", nil, nil)
	descFrees = prometheus.NewDesc("tensorfs_frees_total",
		"Device allocations of tensors released (deregistered, revoked and freed).", nil, nil)
	descRegistrations = prometheus.NewDesc("tensorfs_registrations_total",
		"Memory regions (MRs) registered, automatic and manual.", nil, nil)
	descRegions = prometheus.NewDesc("tensorfs_regions",
		"Memory regions registered now (or deregistered but still pinned by a copy).", nil, nil)
	descPins = prometheus.NewDesc("tensorfs_pins",
		"Pins held on memory regions now (copies in flight).", nil, nil)
	descExportsTotal = prometheus.NewDesc("tensorfs_exports_total",
		"IPC exports made.", nil, nil)
	descExports = prometheus.NewDesc("tensorfs_exports",
		"IPC exports alive now.", nil, nil)
	descLeasesTotal = prometheus.NewDesc("tensorfs_leases_total",
		"Leases given on this daemon's IPC exports (open handles and peer daemons' imports).", nil, nil)
	descLeases = prometheus.NewDesc("tensorfs_leases",
		"Leases held on this daemon's IPC exports now.", nil, nil)
	descRevocations = prometheus.NewDesc("tensorfs_revocations_total",
		"Revocations of IPC exports (each before its memory is freed or replaced).", nil, nil)
	descDropped = prometheus.NewDesc("tensorfs_revocation_dropped_leases_total",
		"Leases a revocation dropped because their holder did not release them within --revoke-timeout.", nil, nil)
	descImports = prometheus.NewDesc("tensorfs_imports",
		"Other daemons' allocations this daemon holds open now (IPC imports).", nil, nil)
	descImportLookups = prometheus.NewDesc("tensorfs_import_cache_lookups_total",
		"Lookups in the import cache, by result: hit (an open import reused) or miss (one opened).", []string{"result"}, nil)
	descCopies = prometheus.NewDesc("tensorfs_copies_total",
		"Completed copies, by path (local, ipc, tcp) and mode (whole, in_place, mixed).", []string{"path", "mode"}, nil)
	descCopyBytes = prometheus.NewDesc("tensorfs_copy_bytes_total",
		"Bytes of completed copies, by path and mode.", []string{"path", "mode"}, nil)
	descDescriptors = prometheus.NewDesc("tensorfs_copy_descriptors_total",
		"Descriptors (whole tensors or in-place ranges) of completed copies.", nil, nil)
	descRechecks = prometheus.NewDesc("tensorfs_copy_rechecks_total",
		"TCP copies this node asked for (a copy_to's pusher, a copy_from's puller) and ran again from buffers after a chunk failed its checksum where its bytes lie, on either node (a process writing the source or destination through its mapping, another copy into the same bytes, or corruption).", nil, nil)
	descActive = prometheus.NewDesc("tensorfs_transfers_active",
		"Transfers in flight now.", nil, nil)
	descConns = prometheus.NewDesc("tensorfs_peer_connections",
		"Authenticated peer connections open between copies, by state: idle (this node's, kept for its next copies) or waiting (peers' connections to this node, served and waiting for their next request).", []string{"state"}, nil)
	descFUSE = prometheus.NewDesc("tensorfs_fuse_requests_total",
		"FUSE requests answered, by operation.", []string{"op"}, nil)
	descFUSEErrors = prometheus.NewDesc("tensorfs_fuse_errors_total",
		"FUSE requests answered with an errno (refused), by operation and errno name (EINVAL, ENOENT, ...).", []string{"op", "errno"}, nil)
)

// collector reads a daemon's counters at each scrape (Metrics.Watch).
type collector struct{ src Sources }

// Describe sends every Desc the collector may send, so the registry checks
// them for clashes once, at Watch.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTensors, descUsed, descCapacity, descAllocs, descFrees,
		descRegistrations, descRegions, descPins, descExportsTotal, descExports, descLeasesTotal,
		descLeases, descRevocations, descDropped, descImports, descImportLookups, descCopies,
		descCopyBytes, descDescriptors, descRechecks, descActive, descConns, descFUSE, descFUSEErrors} {
		ch <- d
	}
}

// Collect reads the counters now: the store's, the peer service's and the
// FUSE counts. Each source is read once per scrape, so the series of one
// source agree with each other.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}

	store := c.src.Store
	for _, ds := range store.DeviceStats() {
		gauge(descTensors, float64(ds.Tensors), ds.Name)
		gauge(descUsed, float64(ds.Used), ds.Name)
		gauge(descCapacity, float64(ds.Total), ds.Name)
	}
	live := store.Stats()
	tot := store.Totals()
	counter(descAllocs, float64(tot.Allocs))
	counter(descFrees, float64(tot.Frees))
	counter(descRegistrations, float64(tot.Registrations))
	gauge(descRegions, float64(live.Regions))
	gauge(descPins, float64(live.Pins))
	counter(descExportsTotal, float64(tot.Exports))
	gauge(descExports, float64(live.Exports))
	counter(descLeasesTotal, float64(tot.Leases))
	gauge(descLeases, float64(live.Leases))
	counter(descRevocations, float64(tot.Revokes))
	counter(descDropped, float64(tot.Dropped))

	peers := c.src.Peers
	st := peers.Stats() // a nil service reports zeros
	gauge(descImports, float64(peers.Imports()))
	counter(descImportLookups, float64(st.Imports.Hits), "hit")
	counter(descImportLookups, float64(st.Imports.Misses), "miss")
	cc := peers.CopyCounts()
	for p, pn := range transfer.PathNames {
		for m, mn := range transfer.ModeNames {
			counter(descCopies, float64(cc.Copies[p][m]), pn, mn)
			counter(descCopyBytes, float64(cc.Bytes[p][m]), pn, mn)
		}
	}
	counter(descDescriptors, float64(st.Copies.Descriptors))
	counter(descRechecks, float64(st.Copies.Rechecked))
	gauge(descActive, float64(st.Transfers.Active))
	gauge(descConns, float64(st.Connections.Idle), "idle")
	gauge(descConns, float64(st.Connections.Waiting), "waiting")

	if c.src.Ops == nil {
		return
	}
	for _, oc := range c.src.Ops.Snapshot() {
		counter(descFUSE, float64(oc.Requests), oc.Op)
		for errno, n := range oc.Errors {
			counter(descFUSEErrors, float64(n), oc.Op, errno)
		}
	}
}
