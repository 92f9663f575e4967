package benchplot

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The latency axis is labelled in the tables' units: at powers of ten
// over many decades, at 1, 2 and 5 times them over two or fewer.
func TestLatencyTicks(t *testing.T) {
	labels := func(lo, hi float64) (major []string, minor int) {
		for _, tk := range (LatencyTicks{}).Ticks(lo, hi) {
			if tk.Label == "" {
				minor++
			} else {
				major = append(major, tk.Label)
			}
		}
		return major, minor
	}
	major, minor := labels(35, 2.1e6)
	require.Equal(t, []string{"100 µs", "1 ms", "10 ms", "100 ms", "1 s"}, major)
	require.Equal(t, 10, minor)
	major, minor = labels(300, 12000)
	require.Equal(t, []string{"500 µs", "1 ms", "2 ms", "5 ms", "10 ms"}, major)
	require.Zero(t, minor)
}

// Floors are drawn after their measurement; one point still makes a plot;
// a file that cannot be made is an error and leaves nothing.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sweep.png")
	pts := []Point{{4 << 10, 0.05, 80}, {1 << 20, 3, 350}, {256 << 20, 9, 29000}}
	ss := []Series{{Name: "ipc", Points: pts}, {Name: "ipc floor", Points: pts, Floor: true}, {Name: "tcp", Points: pts[:2]}}
	require.NoError(t, Write(p, "title", "bytes", "p50", ss))
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")), "PNG signature")
	require.Greater(t, len(data), 20<<10)
	require.NoError(t, Write(p, "title", "bytes", "p50", []Series{{Name: "one", Points: pts[:1]}}), "one point")
	require.Error(t, Write(filepath.Join(dir, "no", "such.png"), "t", "b", "l", ss))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "only sweep.png")
}
