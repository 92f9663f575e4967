package transfer

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeLease is a PeerLease whose revocation the test triggers.
type fakeLease struct {
	revoked  chan struct{}
	released chan struct{}
	once     sync.Once
}

func newFakeLease() *fakeLease {
	return &fakeLease{revoked: make(chan struct{}), released: make(chan struct{})}
}
func (l *fakeLease) Revoked() <-chan struct{} { return l.revoked }
func (l *fakeLease) Release()                 { l.once.Do(func() { close(l.released) }) }

// exportSource is a one-tensor Source that exports "fake:1" (allocation 1,
// export 7); each Export's lease is handed to onExport, which may block.
type exportSource struct {
	meta     Meta
	onExport func(l *fakeLease)
}

func (s *exportSource) Meta() Meta                              { return s.meta }
func (s *exportSource) ReadAt(p []byte, off int64) (int, error) { return len(p), nil }
func (s *exportSource) Close()                                  {}
func (s *exportSource) Export(holder string, accept func(string) bool, keep bool) (IPCDesc, func(), PeerLease, bool) {
	if !accept("fake:1") {
		return IPCDesc{}, nil, nil, false
	}
	l := newFakeLease()
	s.onExport(l)
	return IPCDesc{Handle: "fake:1", Alloc: 1, Export: 7}, func() {}, l, true
}

// exportLocal serves src at every path; Put is a memLocal's.
type exportLocal struct {
	*memLocal
	src *exportSource
}

func (l exportLocal) Get(string) ([]Source, bool, error) { return []Source{l.src}, false, nil }

// gatedMapping is an import whose reads wait for gate (a copy in flight).
type gatedMapping struct {
	gate   chan struct{}
	closed *atomic.Int32
}

func (m gatedMapping) ReadAt(p []byte, off int64) (int, error) { <-m.gate; return len(p), nil }
func (m gatedMapping) Close() error                            { m.closed.Add(1); return nil }

// TestLateDescriptorAfterRevoke: a copy's descriptor handed out just before
// its export is revoked can reach the importer after the revocation did (the
// copy's connection and the lease channel are not ordered). The importer
// must not keep that export leased: the revocation has to be answered
// promptly (not after the peer timeout) and the import closed once the
// copies end.
func TestLateDescriptorAfterRevoke(t *testing.T) {
	var mu sync.Mutex
	var leases []*fakeLease
	exported := make(chan struct{}, 4)
	proceed := make(chan struct{}) // the second export waits for it
	src := &exportSource{meta: Meta{DType: "U8", Shape: "64", NBytes: 64}}
	src.onExport = func(l *fakeLease) {
		mu.Lock()
		leases = append(leases, l)
		n := len(leases)
		mu.Unlock()
		exported <- struct{}{}
		if n == 2 {
			<-proceed
		}
	}
	exp := startServer(t, "e", exportLocal{newMemLocal(), src}, testSecret, func(c *Config) {
		c.HostID = "one"
		c.Timeout = 10 * time.Second
	})
	gate := make(chan struct{})
	var closed atomic.Int32
	into := newMemLocal()
	imp := newClient(t, "i", into, testSecret, map[string]string{"e": addrOf(exp)}, func(c *Config) {
		c.HostID = "one"
		c.Timeout = 10 * time.Second
		c.Importers = map[string]func(string) (Mapping, error){
			"fake": func(string) (Mapping, error) { return gatedMapping{gate, &closed}, nil },
		}
	})
	ctx := context.Background()
	errs := make(chan error, 2)
	// Copy 1 imports and reads (held at the gate): the import is in use.
	go func() { _, err := pull(ctx, imp, into, "e", "/t", "/one"); errs <- err }()
	<-exported
	require.Eventually(t, func() bool { return imp.imports.len() == 1 }, 5*time.Second, time.Millisecond)
	// Copy 2's descriptor is made (its lease taken) before the revocation...
	go func() { _, err := pull(ctx, imp, into, "e", "/t", "/two"); errs <- err }()
	<-exported
	// ...which reaches the importer first: it drops the export's lease and
	// waits for copy 1 to end before answering.
	mu.Lock()
	for _, l := range leases {
		close(l.revoked)
	}
	mu.Unlock()
	require.Eventually(t, func() bool {
		imp.imports.mu.Lock()
		defer imp.imports.mu.Unlock()
		for _, e := range imp.imports.m {
			return len(e.lease) == 0 && e.idle != nil
		}
		return false
	}, 5*time.Second, time.Millisecond, "the revocation reached the importer")
	close(proceed) // copy 2's late descriptor now arrives, while copy 1 reads
	require.Eventually(t, func() bool {
		imp.imports.mu.Lock()
		defer imp.imports.mu.Unlock()
		for _, e := range imp.imports.m {
			return e.refs == 2
		}
		return false
	}, 5*time.Second, time.Millisecond, "copy 2 imported")
	close(gate)
	for range 2 {
		require.NoError(t, <-errs)
	}
	// The lease held on the channel (the first one) ends with the
	// importer's answer, well before the 10 s timeout.
	select {
	case <-leases[0].released:
	case <-time.After(3 * time.Second):
		t.Fatal("the revocation was not answered: the importer kept the late descriptor's lease")
	}
	// Closed with the copies' end, not at the lease channel's idle close
	// (about 2 s later).
	require.Eventually(t, func() bool { return imp.imports.len() == 0 && closed.Load() == 1 }, 500*time.Millisecond, time.Millisecond,
		"the import is closed")
}
