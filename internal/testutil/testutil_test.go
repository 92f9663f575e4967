package testutil

import "testing"

// TestFreePortNeverRepeats: a candidate port already returned is passed
// over, even while it is still free (a cluster picks every port before any
// daemon binds one): offered the port it gave first, again, FreePort takes
// another.
func TestFreePortNeverRepeats(t *testing.T) {
	first := FreePort(t) // free, given once, not bound by anyone
	old := pickPort
	defer func() { pickPort = old }()
	offered := 0
	pickPort = func() int {
		if offered++; offered <= 3 {
			return first
		}
		return old()
	}
	if got := FreePort(t); got == first {
		t.Fatalf("port %d returned twice", got)
	}
	if offered < 4 {
		t.Fatalf("the first port was offered %d times, not passed over", offered)
	}
}
