package metrics

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/fs"
	"github.com/tensorfs/tensorfs/gpu"
	"github.com/tensorfs/tensorfs/tensor"
)

// gather reads m's registry and returns the value of each series of the
// tensorfs_ families, keyed by name and label values ("name{v1,v2}"); a
// histogram's is its sample count.
func gather(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	fams, err := m.reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			key := f.GetName()
			if len(s.GetLabel()) > 0 {
				key += "{"
				for i, l := range s.GetLabel() {
					if i > 0 {
						key += ","
					}
					key += l.GetValue()
				}
				key += "}"
			}
			out[key] = value(s)
		}
	}
	return out
}

func value(s *dto.Metric) float64 {
	switch {
	case s.Counter != nil:
		return s.Counter.GetValue()
	case s.Gauge != nil:
		return s.Gauge.GetValue()
	case s.Histogram != nil:
		return float64(s.Histogram.GetSampleCount())
	}
	return 0
}

// TestCollector: the collector reads the store at each scrape (a tensor's
// creation and release move the gauges and counters), a nil peer service
// reports zero copies, and the hooks fill the histograms under their
// labels (labels are sorted by name: mode before path).
func TestCollector(t *testing.T) {
	host, err := gpu.NewHost(1 << 30)
	require.NoError(t, err)
	defer host.Close()
	m := New()
	store, err := tensor.NewStore(tensor.Config{Devices: []gpu.Device{host}, OnRevoke: m.ObserveRevoke})
	require.NoError(t, err)
	defer store.Close()
	var ops fs.OpCounts
	require.NoError(t, m.Watch(Sources{Store: store, Ops: &ops}))
	require.Error(t, m.Watch(Sources{Store: store}), "a second collector of the same metrics")

	v := gather(t, m)
	require.Zero(t, v["tensorfs_tensors{host}"])
	require.EqualValues(t, 1<<30, v["tensorfs_memory_capacity_bytes{host}"])
	require.Zero(t, v["tensorfs_copies_total{whole,tcp}"])
	require.Contains(t, v, "tensorfs_copy_rechecks_total")
	require.Zero(t, v["tensorfs_copy_rechecks_total"])

	tn, err := store.New(tensor.Template{DType: dtype.DType("U8"), Shape: dtype.Shape{4096}})
	require.NoError(t, err)
	v = gather(t, m)
	require.EqualValues(t, 1, v["tensorfs_tensors{host}"])
	require.EqualValues(t, 4096, v["tensorfs_memory_used_bytes{host}"])
	require.EqualValues(t, 1, v["tensorfs_allocations_total"])
	require.EqualValues(t, 1, v["tensorfs_registrations_total"])
	require.EqualValues(t, 1, v["tensorfs_exports_total"])
	require.EqualValues(t, 1, v["tensorfs_regions"])

	tn.Unlink()
	v = gather(t, m)
	require.Zero(t, v["tensorfs_tensors{host}"])
	require.EqualValues(t, 1, v["tensorfs_frees_total"])
	require.EqualValues(t, 1, v["tensorfs_revocations_total"])
	require.EqualValues(t, 1, v["tensorfs_revocation_wait_seconds"], "the store's revocation was observed")

	m.ObserveCopy("ipc", "in_place", 10, time.Millisecond)
	m.ObserveCopy("carrier-pigeon", "whole", 10, time.Millisecond) // ignored
	v = gather(t, m)
	require.EqualValues(t, 1, v["tensorfs_copy_duration_seconds{in_place,ipc}"])
	require.Zero(t, v["tensorfs_copy_duration_seconds{whole,tcp}"])
}

func TestWatchNeedsStore(t *testing.T) {
	require.Error(t, New().Watch(Sources{}))
}
