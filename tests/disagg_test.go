package tests

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDisaggExample runs examples/disagg (decode.py, prefill.py) on host
// memory between two daemons of the harness (not run.sh, so nothing outlives
// the test): decode maps its KV cache and waits, prefill pushes a request's
// scattered blocks into it in place in one batch with a notification last,
// and decode must verify every byte and exit 0 with its summary. Both ways
// two daemons of one machine reach each other: as two hosts (TCP) and as
// one (IPC).
func TestDisaggExample(t *testing.T) {
	py := findPython(t)
	for _, mode := range pythonModes {
		t.Run(mode.name, func(t *testing.T) {
			ds := cluster(t, []string{"prefill", "decode"}, mode.extra...)
			dir, err := filepath.Abs("../examples/disagg")
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			common := []string{"--request", "req-" + mode.name, "--layers", "4", "--blocks", "64", "--num-blocks", "12", "--seed", "7"}

			dec := exec.CommandContext(ctx, py, append([]string{filepath.Join(dir, "decode.py"), "--mount", ds["decode"].mnt, "--timeout", "60"}, common...)...)
			dec.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
			dec.Stderr = os.Stderr
			stdout, err := dec.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, dec.Start())
			lines := make(chan string, 16)
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			var out []string
			select {
			case l, ok := <-lines:
				require.True(t, ok, "decode exited before it was ready")
				out = append(out, l)
				require.True(t, strings.HasPrefix(l, "decode: ready"), l)
			case <-time.After(60 * time.Second):
				t.Fatal("decode did not print 'decode: ready' within 60 s")
			}

			pre := exec.CommandContext(ctx, py, append([]string{filepath.Join(dir, "prefill.py"), "--mount", ds["prefill"].mnt, "--peer", "decode"}, common...)...)
			pre.Env = dec.Env
			po, perr := pre.CombinedOutput()
			t.Log(string(po))
			if perr != nil {
				dec.Process.Signal(syscall.SIGTERM) // decode removes its cache and exits
			}
			for l := range lines {
				out = append(out, l)
			}
			derr := dec.Wait()
			t.Log(strings.Join(out, "\n"))
			require.NoError(t, perr, "prefill.py failed")
			require.NoError(t, derr, "decode.py failed")
			summary := out[len(out)-1]
			require.True(t, strings.HasPrefix(summary, "decode: OK: request req-"+mode.name+": 12 blocks x 4 layers (1572864 bytes) verified in place"), summary)
			require.Contains(t, summary, "52 other blocks untouched; mr_id/ipc_id/generation unchanged")
			ds["prefill"].requireClean()
			ds["decode"].requireClean()
		})
	}
}
