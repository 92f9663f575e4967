package tests

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// scrape is one read of a daemon's /metrics, parsed.
type scrape map[string]*dto.MetricFamily

// scrapeClient opens a connection per scrape and closes it after: a kept-
// alive one would stay open in the daemon and count as an fd leak at the
// test's end (requireClean).
var scrapeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// scrapeMetrics GETs http://addr/metrics and parses the text format.
func scrapeMetrics(t *testing.T, addr string) scrape {
	t.Helper()
	resp, err := scrapeClient.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// value sums the series of family name whose labels include every pair of
// labels (name, value, name, value, ...): a counter's or gauge's value, a
// histogram's sample count. 0 when no series matches.
func (s scrape) value(name string, labels ...string) float64 {
	f := s[name]
	if f == nil {
		return 0
	}
	var sum float64
	for _, m := range f.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// TestMetrics: --metrics serves /metrics from before the mount appears, and
// its values follow what the daemon does: tensors and bytes per device,
// allocations and frees, copies by path and mode with their bytes and
// latency histogram, on both ends of a TCP copy, FUSE requests and the
// errno of a refused setxattr, revocations. The counts are compared as
// differences from a first scrape, never against time.
func TestMetrics(t *testing.T) {
	pa, pb := testutil.FreePort(t), testutil.FreePort(t)
	ma, mb := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	secret := secretFile(t, "a shared secret of enough bytes")
	common := []string{"--secret-file", secret, "--timeout", "3s"}
	a := startDaemon(t, append([]string{"--name", "a", "--host-id", "host-a", "--listen", fmt.Sprintf("127.0.0.1:%d", pa), "--peer", fmt.Sprintf("b=127.0.0.1:%d", pb), "--metrics", ma}, common...)...)
	b := startDaemon(t, append([]string{"--name", "b", "--host-id", "host-b", "--listen", fmt.Sprintf("127.0.0.1:%d", pb), "--peer", fmt.Sprintf("a=127.0.0.1:%d", pa), "--metrics", mb}, common...)...)
	a.requireLog("metrics: serving http://" + ma + "/metrics")

	s0 := scrapeMetrics(t, ma)
	require.Zero(t, s0.value("tensorfs_tensors"), "no tensor yet")
	require.Contains(t, s0, "tensorfs_memory_capacity_bytes")
	require.Contains(t, s0, "go_goroutines", "the Go runtime's metrics are served too")

	// A tensor: counted on its device, with its bytes and one allocation.
	const n = 1 << 20
	data := fill(n, 5)
	require.NoError(t, os.WriteFile(a.path("x"), data, 0o644))
	s1 := scrapeMetrics(t, ma)
	require.EqualValues(t, 1, s1.value("tensorfs_tensors"))
	require.GreaterOrEqual(t, s1.value("tensorfs_memory_used_bytes"), float64(n))
	require.GreaterOrEqual(t, s1.value("tensorfs_allocations_total")-s0.value("tensorfs_allocations_total"), 1.0)
	require.GreaterOrEqual(t, s1.value("tensorfs_registrations_total"), 1.0)
	require.GreaterOrEqual(t, s1.value("tensorfs_exports_total"), 1.0)

	// Copies inside a (whole, then in place) and to b over TCP.
	setx(t, a.path("x"), xattrs.CopyTo, "/y")
	setx(t, a.path("x"), xattrs.CopyTo, "/y@0")
	setx(t, a.path("x"), xattrs.CopyTo, "b:/z")
	got, err := os.ReadFile(b.path("z"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))

	// A refused setxattr: a dtype that does not exist is EINVAL.
	require.Equal(t, unix.EINVAL, unix.Setxattr(a.path("x"), xattrs.DType, []byte("float33"), 0))

	s2 := scrapeMetrics(t, ma)
	for _, c := range []struct{ path, mode string }{{"local", "whole"}, {"local", "in_place"}, {"tcp", "whole"}} {
		l := []string{"path", c.path, "mode", c.mode}
		require.EqualValues(t, 1, s2.value("tensorfs_copies_total", l...), "copies %v", l)
		require.EqualValues(t, n, s2.value("tensorfs_copy_bytes_total", l...), "bytes %v", l)
		require.EqualValues(t, 1, s2.value("tensorfs_copy_duration_seconds", l...), "latency samples %v", l)
	}
	require.EqualValues(t, 3, s2.value("tensorfs_copies_total"))
	require.EqualValues(t, 2, s2.value("tensorfs_tensors"), "x and y")
	require.EqualValues(t, 1, s2.value("tensorfs_fuse_errors_total", "op", "setxattr", "errno", "EINVAL")-s0.value("tensorfs_fuse_errors_total", "op", "setxattr", "errno", "EINVAL"))
	require.GreaterOrEqual(t, s2.value("tensorfs_fuse_requests_total", "op", "setxattr")-s0.value("tensorfs_fuse_requests_total", "op", "setxattr"), 4.0)
	require.GreaterOrEqual(t, s2.value("tensorfs_fuse_requests_total", "op", "write"), 1.0)
	require.Contains(t, s2, "tensorfs_peer_connections")

	// The receiving end counts the same TCP copy.
	sb := scrapeMetrics(t, mb)
	require.EqualValues(t, 1, sb.value("tensorfs_copies_total", "path", "tcp", "mode", "whole"))
	require.EqualValues(t, n, sb.value("tensorfs_copy_bytes_total", "path", "tcp"))
	require.EqualValues(t, 1, sb.value("tensorfs_tensors"))

	// Everything removed: no tensor, every allocation freed, each revoked.
	for _, p := range []string{a.path("x"), a.path("y"), b.path("z")} {
		require.NoError(t, os.Remove(p))
	}
	a.requireClean()
	b.requireClean()
	s3 := scrapeMetrics(t, ma)
	require.Zero(t, s3.value("tensorfs_tensors"))
	require.Zero(t, s3.value("tensorfs_memory_used_bytes"))
	require.Equal(t, s3.value("tensorfs_allocations_total"), s3.value("tensorfs_frees_total"))
	require.GreaterOrEqual(t, s3.value("tensorfs_revocations_total")-s2.value("tensorfs_revocations_total"), 2.0)
	require.Equal(t, s3.value("tensorfs_revocations_total"), s3.value("tensorfs_revocation_wait_seconds"), "one wait observed per revocation")

	resp, err := scrapeClient.Get("http://" + ma + "/other")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// TestMetricsBadAddress: an address --metrics cannot listen on (malformed,
// or already taken) is refused at start, in one line, exit non-zero, and
// nothing is mounted.
func TestMetricsBadAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	for _, addr := range []string{"127.0.0.1:notaport", busy.Addr().String()} {
		mnt := t.TempDir()
		cmd := exec.Command(bin, testDeviceFlags([]string{"mount", mnt, "--metrics", addr})...)
		done := make(chan struct{})
		var out []byte
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("--metrics %s: still running after 30 s\n%s", addr, out)
		}
		require.Error(t, err, "--metrics %s", addr)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		require.Len(t, lines, 1, "one line: %s", out)
		require.Contains(t, lines[0], "--metrics "+addr)
		require.False(t, mounted(mnt))
	}
}
