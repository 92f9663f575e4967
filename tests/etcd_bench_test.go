package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	tfcluster "github.com/tensorfs/tensorfs/cluster"
	"github.com/tensorfs/tensorfs/cluster/etcdtest"
	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// rssKiB is a process's resident memory (VmRSS), in KiB.
func rssKiB(tb testing.TB, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(tb, err)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// BenchmarkEtcdScale: 1000 node records in one etcd (written here, not by
// 1000 daemons): a daemon's start-up time to a ready mount and its
// resident memory, beside the same daemon in an empty cluster and without
// --etcd; then the time from a record's deletion to its disappearance from
// the daemon's stats (polled every ms), over 20 deletions. Run:
// go test -run '^$' -bench EtcdScale -benchtime 1x ./tests
func BenchmarkEtcdScale(b *testing.B) {
	const n = 1000
	srv := etcdtest.Start(b)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	require.NoError(b, err)
	defer c.Close()
	g, err := c.Grant(context.Background(), 3600)
	require.NoError(b, err)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			name := fmt.Sprintf("node%04d", i)
			r := tfcluster.Record{Name: name, Addr: fmt.Sprintf("10.0.%d.%d:7000", i>>8, i&255), HostID: fmt.Sprintf("%08x-1c2b-4e6f-9a0d-5b7c3e1f2a4d", i),
				Instance: fmt.Sprintf("%032x", i), Protocol: 2, Transports: []string{"tcp"}, Devices: []string{"cuda:0", "cuda:1", "cuda:2", "cuda:3"}, Started: time.Now().UTC()}
			v, _ := json.Marshal(r)
			_, err := c.Put(context.Background(), tfcluster.Key("big", name), string(v), clientv3.WithLease(g.ID))
			require.NoError(b, err)
		}(i)
	}
	wg.Wait()
	secret := secretFile(b, "a shared secret of enough bytes")
	start := func(extra ...string) (*daemon, time.Duration, int) {
		flags := append([]string{"--name", "me", "--listen", fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(b)), "--secret-file", secret, "--device", "host"}, extra...)
		t := time.Now()
		d := startDaemon(b, flags...)
		took := time.Since(t)
		d.stats() // once, as a client would
		return d, took, rssKiB(b, d.cmd.Process.Pid)
	}
	for i := 0; i < b.N; i++ {
		plain, tPlain, rPlain := start()
		plain.stop()
		empty, tEmpty, rEmpty := start("--etcd", srv.Endpoint, "--cluster", "empty")
		empty.stop()
		big, tBig, rBig := start("--etcd", srv.Endpoint, "--cluster", "big")
		st := big.stats()
		require.Equal(b, n+1, st.Cluster.Nodes)
		var lat []time.Duration
		for j := 0; j < 20; j++ {
			name := fmt.Sprintf("node%04d", j)
			t := time.Now()
			_, err := c.Delete(context.Background(), tfcluster.Key("big", name))
			require.NoError(b, err)
			for {
				v := getx(b, big.mnt, xattrs.StatsName)
				var s xattrs.Stats
				require.NoError(b, json.Unmarshal([]byte(v), &s))
				if s.Cluster.Nodes == n-j {
					break
				}
				time.Sleep(time.Millisecond)
			}
			lat = append(lat, time.Since(t))
		}
		big.stop()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(tBig.Milliseconds()), "startup-1000-ms")
		b.ReportMetric(float64(tEmpty.Milliseconds()), "startup-empty-ms")
		b.ReportMetric(float64(tPlain.Milliseconds()), "startup-no-etcd-ms")
		b.ReportMetric(float64(rBig-rEmpty), "rss-1000-minus-empty-KiB")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "delete-to-gone-p50-ms")
		b.Logf("start-up to a ready mount: %v with 1000 records, %v in an empty cluster, %v without --etcd; RSS %d KiB, %d KiB, %d KiB; deletion to disappearance from stats p50 %v, max %v (%d deletions)",
			tBig.Round(time.Millisecond), tEmpty.Round(time.Millisecond), tPlain.Round(time.Millisecond), rBig, rEmpty, rPlain, lat[len(lat)/2], lat[len(lat)-1], len(lat))
		for j := 0; j < 20; j++ { // the deleted ones back, for the next round
			name := fmt.Sprintf("node%04d", j)
			_, err := c.Put(context.Background(), tfcluster.Key("big", name), fmt.Sprintf(`{"name":%q,"addr":"10.9.9.9:7000","host_id":"h","instance":"i","started":"2026-12-02T00:00:00Z"}`, name), clientv3.WithLease(g.ID))
			require.NoError(b, err)
		}
	}
}
