package transfer

import (
	"errors"
	"syscall"
	"testing"
)

type fakeResolver map[string]string

func (f fakeResolver) Resolve(name string) (string, error) {
	if a, ok := f[name]; ok {
		return a, nil
	}
	return "", &Error{Errno: syscall.EHOSTUNREACH, Msg: "peer " + name + " left"}
}

func (f fakeResolver) Report() ResolverReport {
	r := ResolverReport{Nodes: map[string]PeerReport{}, State: &ClusterReport{Backend: "fake", State: "connected"}}
	for n, a := range f {
		r.Nodes[n] = PeerReport{Addr: a, Source: "fake"}
	}
	return r
}

// TestResolve: Config.Peers wins over the Resolver for the names it gives;
// the Resolver answers the others and its error comes back as it is; stats
// merge both; without a Resolver an unknown name is ENOENT and stats peers
// carry only their addresses.
func TestResolve(t *testing.T) {
	s, err := New(Config{Name: "a", Peers: map[string]string{"b": "10.0.0.2:1"}, Resolver: fakeResolver{"b": "10.9.9.9:9", "c": "10.0.0.3:1"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if addr, err := s.resolve("b"); err != nil || addr != "10.0.0.2:1" {
		t.Fatalf("b: %q %v, want the --peer address", addr, err)
	}
	if addr, err := s.resolve("c"); err != nil || addr != "10.0.0.3:1" {
		t.Fatalf("c: %q %v", addr, err)
	}
	if _, err := s.resolve("d"); !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Fatalf("d: %v, want the resolver's EHOSTUNREACH", err)
	}
	st := s.Stats()
	if p := st.Peers["b"]; p.Addr != "10.0.0.2:1" || p.Source != "peer" {
		t.Fatalf("stats b: %+v", p)
	}
	if p := st.Peers["c"]; p.Source != "fake" || st.Cluster == nil || st.Cluster.Backend != "fake" {
		t.Fatalf("stats c: %+v, cluster %+v", p, st.Cluster)
	}

	s, err = New(Config{Name: "a", Peers: map[string]string{"b": "10.0.0.2:1"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.resolve("c"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("c without a resolver: %v, want ENOENT", err)
	}
	st = s.Stats()
	if p := st.Peers["b"]; p.Addr != "10.0.0.2:1" || p.Source != "" || st.Cluster != nil {
		t.Fatalf("without a resolver stats change: %+v %+v", p, st.Cluster)
	}
}
