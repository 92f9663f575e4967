package testutil

import "testing"

// TestFreePortNeverRepeats: ports picked before any is bound (a cluster's)
// are all different. 3000 picks from 12000 ports repeat one almost surely
// when picks are independent.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 3000; i++ {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d returned twice (pick %d)", p, i)
		}
		if p < 20000 || p >= 32000 {
			t.Fatalf("port %d outside 20000-32000", p)
		}
		seen[p] = true
	}
}
