package tests

import (
	"fmt"
	"testing"

	"github.com/tensorfs/tensorfs/internal/testutil"
	"github.com/tensorfs/tensorfs/xattrs"
)

// copyPath is a way the copy suite runs a pair of daemons: its subtest
// name, the path stats report for its copies between them, for UCX the
// UCX_TLS its daemons run with, and sum, the --checksum its daemons run
// with ("": the default, xxh3).
type copyPath struct {
	name, path, tls, sum string
}

// copyPaths are the paths of the copy suite: "ipc" (one host id), "tcp"
// (two: tensorfs's streams) and, in a build with UCX, "ucx-sm" (two host
// ids, --transport ucx --ucx-any-endpoint, the bytes on UCX over
// UCX_TLS=sm,self: gets that UCX 1.13 emulates with active messages and
// 1.19 does one-sided on cma, neither detecting a dead peer: the only way
// to drive tensorfs's UCX data path on machines without RDMA),
// "ucx-tcp-emulated" (the same over UCX_TLS=tcp: gets emulated with
// active messages, on endpoints that detect a dead peer) and "ucx-tcp"
// (--transport auto over UCX_TLS=tcp, whose endpoints are not one-sided:
// the copies stay on tensorfs's TCP, path "tcp", beside the UCX
// endpoints). "tcp" runs the default checksum (XXH3); "tcp-nocrc" is "tcp"
// with --checksum none on both daemons:
// chunks without a checksum, host memory sent straight from the
// mapping. withIPC false leaves out "ipc".
func copyPaths(withIPC bool) []copyPath {
	var ps []copyPath
	if withIPC {
		ps = append(ps, copyPath{name: "ipc", path: "ipc"})
	}
	ps = append(ps, copyPath{name: "tcp", path: "tcp"}, copyPath{name: "tcp-nocrc", path: "tcp", sum: "none"})
	if ucxBuild {
		ps = append(ps, copyPath{name: "ucx-tcp", path: "tcp", tls: "tcp"}, copyPath{name: "ucx-sm", path: "ucx", tls: "sm,self"},
			copyPath{name: "ucx-tcp-emulated", path: "ucx", tls: "tcp"})
	}
	return ps
}

// flags are the daemon flags of a pair on p between two host ids, set
// into the environment t gives its daemons (UCX_TLS).
func (p copyPath) flags(t testing.TB) []string {
	if p.sum != "" {
		f := []string{"--checksum", p.sum}
		if ucxBuild {
			f = append(f, "--transport", "tcp")
		}
		return f
	}
	switch {
	case p.tls != "":
		t.Setenv("UCX_TLS", p.tls)
		t.Setenv("UCX_NET_DEVICES", "lo")
		if p.path != "ucx" {
			return []string{"--transport", "auto"}
		}
		return []string{"--transport", "ucx", "--ucx-any-endpoint"}
	case ucxBuild:
		return []string{"--transport", "tcp"}
	}
	return nil
}

// pairOn starts two daemons a and b that know each other, for p: one host
// id for "ipc", two otherwise.
func pairOn(t *testing.T, p copyPath) (a, b *daemon) {
	t.Helper()
	if p.path != "ipc" {
		ds := cluster(t, []string{"a", "b"}, p.flags(t)...)
		return ds["a"], ds["b"]
	}
	pa, pb := testutil.FreePort(t), testutil.FreePort(t)
	secret := secretFile(t, "a shared secret of enough bytes")
	common := []string{"--secret-file", secret, "--host-id", "one-host", "--timeout", "3s"}
	a = startDaemon(t, append([]string{"--name", "a", "--listen", fmt.Sprintf("127.0.0.1:%d", pa), "--peer", fmt.Sprintf("b=127.0.0.1:%d", pb)}, common...)...)
	b = startDaemon(t, append([]string{"--name", "b", "--listen", fmt.Sprintf("127.0.0.1:%d", pb), "--peer", fmt.Sprintf("a=127.0.0.1:%d", pa)}, common...)...)
	return a, b
}

// onPaths runs body as a subtest on each of copyPaths(withIPC), each on a
// fresh pair; path is what stats report for its copies.
func onPaths(t *testing.T, withIPC bool, body func(t *testing.T, a, b *daemon, path string)) {
	for _, p := range copyPaths(withIPC) {
		t.Run(p.name, func(t *testing.T) {
			a, b := pairOn(t, p)
			body(t, a, b, p.path)
		})
	}
}

// onBothPaths is onPaths with the IPC path.
func onBothPaths(t *testing.T, body func(t *testing.T, a, b *daemon, path string)) {
	onPaths(t, true, body)
}

// ofPath is pc's count for path ("local", "ipc", "tcp", "ucx").
func ofPath(pc xattrs.Paths, path string) int64 {
	return map[string]int64{"local": pc.Local, "ipc": pc.IPC, "tcp": pc.TCP, "ucx": pc.UCX}[path]
}

// allPaths is pc's count over every path.
func allPaths(pc xattrs.Paths) int64 { return pc.Local + pc.IPC + pc.TCP + pc.UCX }
