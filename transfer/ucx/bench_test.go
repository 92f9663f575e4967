//go:build ucx

package ucx

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPut: per op, one descriptor list posted and flushed between two
// workers of this process, on each transport, with the target's progress
// goroutine sleeping at once or spinning 1 ms: 1 x 4 KiB (latency), 1000
// scattered x 8 KiB (the KV-cache list) and 1 x 64 MiB (bandwidth).
// ucx_perftest (ucx-utils) with the same UCX_TLS and sizes is the raw
// floor these are read against.
func BenchmarkPut(b *testing.B) {
	for _, tc := range transports {
		for _, spin := range []time.Duration{0, time.Millisecond} {
			for _, sh := range []struct {
				name   string
				n, blk int
			}{{"4K", 1, 4 << 10}, {"1000x8K", 1000, 8 << 10}, {"64M", 1, 64 << 20}} {
				b.Run(fmt.Sprintf("%s/spin=%v/%s", tc.name, spin, sh.name), func(b *testing.B) {
					b.Setenv("UCX_TLS", tc.tls)
					if tc.tls == "tcp" {
						b.Setenv("UCX_NET_DEVICES", "lo")
					}
					a, err := Open(Config{})
					if err != nil {
						b.Fatal(err)
					}
					defer a.Close()
					d, err := Open(Config{Spin: spin})
					if err != nil {
						b.Fatal(err)
					}
					defer d.Close()
					ep, err := a.Connect(d.Address())
					if err != nil {
						b.Fatal(err)
					}
					defer ep.Close(false, time.Now().Add(5*time.Second))
					src, dst := mappedB(b, sh.n*sh.blk), mappedB(b, 2*sh.n*sh.blk)
					reg, err := d.Map(addr(dst), len(dst))
					if err != nil {
						b.Fatal(err)
					}
					defer reg.Unmap()
					key, err := ep.Unpack(reg.Rkey(), reg.Base(), reg.Len())
					if err != nil {
						b.Fatal(err)
					}
					defer key.Destroy()
					descs := make([]Desc, sh.n)
					for i := range descs {
						descs[i] = Desc{Local: addr(src) + uintptr(i*sh.blk), Off: uint64((2*i + 1) % (2 * sh.n) * sh.blk), N: uint64(sh.blk)}
					}
					b.SetBytes(int64(sh.n * sh.blk))
					lat := make([]time.Duration, 0, b.N)
					for b.Loop() {
						t0 := time.Now()
						if err := key.Put(descs, time.Now().Add(30*time.Second), nil); err != nil {
							b.Fatal(err)
						}
						lat = append(lat, time.Since(t0))
					}
					b.ReportMetric(p50us(lat), "p50-us")
				})
			}
		}
	}
}
