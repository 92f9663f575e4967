// Package metrics serves a daemon's Prometheus metrics (tensorfs mount
// --metrics HOST:PORT, at /metrics).
//
// Almost every metric is read at scrape time from the counters the daemon
// keeps anyway (the ones behind user.tensorfs.stats): the tensor store's live
// counts and totals, the peer service's copy counters, the FUSE request
// counts (fs.OpCounts). A custom prometheus.Collector turns them into
// metrics when scraped, so the copy and FUSE paths pay no Prometheus cost
// and the stats document and the metrics cannot disagree. Only latency
// distributions need an observation per event; those come in through
// ObserveCopy and ObserveRevoke, the hooks transfer.Config.CopyDone and
// tensor.Config.OnRevoke call.
//
// Names follow Prometheus's conventions: the tensorfs_ prefix, base units
// (bytes, seconds) in the name, _total on counters. README.md ("Metrics")
// lists them.
package metrics

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tensorfs/tensorfs/fs"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// latencyBuckets are the upper bounds, in seconds, of the latency
// histograms: 10 µs (an in-place copy inside one daemon is a few µs over
// a 16 µs FUSE round trip) to 42 s (a large copy between hosts, a
// revocation waiting out its 10 s default timeout), by factors of 4.
var latencyBuckets = prometheus.ExponentialBuckets(10e-6, 4, 12)

// Metrics is a daemon's metrics registry: the histograms fed by the
// observe hooks, and, once Watch has been called, the collector that reads
// the daemon's counters at each scrape. Its methods are safe for
// concurrent use.
type Metrics struct {
	reg *prometheus.Registry
	// copies[path][mode] are the copy-latency histogram's series,
	// resolved once (transfer.PathNames x transfer.ModeNames), so that an
	// observation costs no label lookup.
	copies [len(transfer.PathNames)][len(transfer.ModeNames)]prometheus.Observer
	revoke prometheus.Histogram
}

// New returns a registry with the Go runtime's and the process's standard
// metrics (go_*, process_*) and tensorfs's histograms; Watch adds the rest.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	copyDur := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tensorfs_copy_duration_seconds",
		Help:    "How long each successful copy took on this node, in seconds, by path (local, ipc, tcp) and mode (whole, in_place, mixed).",
		Buckets: latencyBuckets,
	}, []string{"path", "mode"})
	for p, pn := range transfer.PathNames {
		for md, mn := range transfer.ModeNames {
			m.copies[p][md] = copyDur.WithLabelValues(pn, mn)
		}
	}
	m.revoke = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tensorfs_revocation_wait_seconds",
		Help:    "How long each revocation of an IPC export waited for its importers to release their leases, in seconds (bounded by --revoke-timeout).",
		Buckets: latencyBuckets,
	})
	m.reg.MustRegister(copyDur, m.revoke,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveCopy records a successful copy's duration (transfer.Config.
// CopyDone's signature): path is one of transfer.PathNames, mode one of
// transfer.ModeNames; others are ignored. bytes is not used: the bytes
// counters come from the peer service at scrape time.
func (m *Metrics) ObserveCopy(path, mode string, bytes int64, took time.Duration) {
	p, md := index(transfer.PathNames[:], path), index(transfer.ModeNames[:], mode)
	if p < 0 || md < 0 {
		return
	}
	m.copies[p][md].Observe(took.Seconds())
}

// ObserveRevoke records how long a revocation waited for its leases
// (tensor.Config.OnRevoke's signature).
func (m *Metrics) ObserveRevoke(wait time.Duration) { m.revoke.Observe(wait.Seconds()) }

func index(names []string, s string) int {
	for i, n := range names {
		if n == s {
			return i
		}
	}
	return -1
}

// Sources are the daemon's counters the collector reads at each scrape.
type Sources struct {
	// Store is the daemon's tensor store (required).
	Store *tensor.Store
	// Peers is the peer service; nil reports zero copies and connections.
	Peers *transfer.Service
	// Ops are the mount's FUSE request counts; nil reports none.
	Ops *fs.OpCounts
}

// Watch adds the collector of src's counters to the registry. Call it once,
// before Serve. Errors: src without a Store; a second Watch (the
// registry refuses duplicate metrics).
func (m *Metrics) Watch(src Sources) error {
	if src.Store == nil {
		return errors.New("metrics: no tensor store to watch")
	}
	return m.reg.Register(&collector{src: src})
}

// Handler serves the registry in Prometheus's text or protobuf formats, as
// the scraper asks.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: log.Default()})
}

// Listen opens the metrics listener on addr (HOST:PORT), so that a bad or
// busy address is refused at start, before anything else is set up. The
// error says which flag it was.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	return ln, nil
}

// Serve serves /metrics on ln (from Listen) in the background until stop,
// which closes ln and waits for the server to end. Other paths are 404.
func (m *Metrics) Serve(ln net.Listener) (stop func()) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Printf("metrics on %s: %v", ln.Addr(), err)
		}
	}()
	return func() {
		srv.Close()
		<-done
	}
}
