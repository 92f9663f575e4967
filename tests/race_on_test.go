//go:build race

package tests

// raceEnabled makes TestMain build the daemon with -race too, so the
// concurrency tests check the daemon's own goroutines, not just the client's.
const raceEnabled = true
