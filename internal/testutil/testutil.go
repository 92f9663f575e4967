// Package testutil holds the helpers that the integration tests (./tests)
// and the etcd test server (cluster/etcdtest) share: a free loopback port
// and a buffer safe for a process's output and a reader at once.
package testutil

import (
	"bytes"
	"fmt"
	"math/rand"
	"net"
	"sync"
	"testing"
)

// FreePort returns a loopback TCP port that was free a moment ago and that
// it has not returned before in this process, below the kernel's ephemeral
// range (32768 and up by default): a port from ":0" is an ephemeral one,
// which another test's outgoing connection may take before the server
// binds it (seen as a daemon failing to start). Never twice: a cluster
// picks all its ports before any daemon binds one, and a port picked twice
// (one in a hundred for a cluster of 17) failed the second daemon's bind.
func FreePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for i := 0; i < 1000; i++ {
		port := pickPort()
		if portsGiven[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			ln.Close()
			portsGiven[port] = true
			return port
		}
	}
	t.Fatal("no free port in 20000-32000")
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{} // every port FreePort returned
	// pickPort is FreePort's next candidate (a test gives its own).
	pickPort = func() int { return 20000 + rand.Intn(12000) }
)

// SyncBuffer is a bytes.Buffer that a child process writes (its stdout and
// stderr) while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
