package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tensorfs/tensorfs/cluster"
	"github.com/tensorfs/tensorfs/cluster/etcdtest"
)

// putRecords writes n records node0000... of cluster cl under one lease (as
// n daemons would, each with its own), 32 at a time.
func putRecords(tb testing.TB, c *clientv3.Client, cl string, n int) {
	tb.Helper()
	g, err := c.Grant(context.Background(), 600)
	require.NoError(tb, err)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			name := fmt.Sprintf("node%04d", i)
			r := cluster.Record{Name: name, Addr: fmt.Sprintf("10.%d.%d.%d:7000", i>>16&255, i>>8&255, i&255), HostID: fmt.Sprintf("%08x-1c2b-4e6f-9a0d-5b7c3e1f2a4d", i),
				Instance: fmt.Sprintf("%032x", i), Protocol: 2, Transports: []string{"tcp"}, Devices: []string{"host", "cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:4", "cuda:5", "cuda:6", "cuda:7"},
				Started: time.Now().UTC()}
			v, _ := json.Marshal(r)
			if _, err := c.Put(context.Background(), cluster.Key(cl, name), string(v), clientv3.WithLease(g.ID)); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(tb, err)
	}
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkView: with 1000 records in one etcd, a member's Open (list and
// watch: what a daemon adds to its start-up), the heap its view holds, and
// the time from a record's deletion (the Delete call's start) to its
// disappearance from the view (Resolve fails), over 50 deletions. Run:
// go test -run '^$' -bench View -benchtime 1x ./cluster
func BenchmarkView(b *testing.B) {
	const n = 1000
	srv := etcdtest.Start(b)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	require.NoError(b, err)
	defer c.Close()
	t0 := time.Now()
	putRecords(b, c, "scale", n)
	b.Logf("%d records written in %v", n, time.Since(t0).Round(time.Millisecond))
	for i := 0; i < b.N; i++ {
		// The client's own heap: a member of an empty cluster.
		h0 := heap()
		e, err := cluster.Open(cluster.Config{Endpoints: []string{srv.Endpoint}, Cluster: "empty", Name: "me", Logf: func(string, ...any) {}})
		require.NoError(b, err)
		h1 := heap()
		client := h1 - h0
		e.Close()
		before := heap()
		start := time.Now()
		m, err := cluster.Open(cluster.Config{Endpoints: []string{srv.Endpoint}, Cluster: "scale", Name: "me", Logf: func(string, ...any) {}})
		require.NoError(b, err)
		open := time.Since(start)
		require.Len(b, m.Nodes(), n)
		after := heap()
		var lat []time.Duration
		for j := 0; j < 50; j++ {
			name := fmt.Sprintf("node%04d", (i*50+j)%n)
			ch := m.Changed()
			if _, err := m.Resolve(name); err != nil {
				continue // deleted in an earlier round
			}
			t := time.Now()
			_, err := c.Delete(context.Background(), cluster.Key("scale", name))
			require.NoError(b, err)
			for {
				if _, err := m.Resolve(name); err != nil {
					break
				}
				<-ch
				ch = m.Changed()
			}
			lat = append(lat, time.Since(t))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(open.Microseconds())/1000, "open-ms")
		b.ReportMetric(float64(after-before-client)/1024, "view-KiB")
		b.ReportMetric(float64(client)/1024, "client-KiB")
		if len(lat) > 0 {
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "delete-to-gone-p50-ms")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "delete-to-gone-max-ms")
		}
		b.Logf("open %v, heap %d KiB (client %d KiB, view %d KiB: %d B a record), deletion to disappearance p50 %v max %v (%d deletions)", open, (after-before)/1024, client/1024, (after-before-client)/1024, (after-before-client)/n,
			lat[len(lat)/2], lat[len(lat)-1], len(lat))
		m.Close()
		putRecords(b, c, "scale", n) // the deleted ones back
	}
}
