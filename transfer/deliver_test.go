package transfer

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// countingDest records what the engine did to it.
type countingDest struct{ writes, commits, aborts int }

func (d *countingDest) WriteAt(int, []byte, int64) error { d.writes++; return nil }
func (d *countingDest) Commit() (int, error)             { d.commits++; return 3, nil }
func (d *countingDest) Abort()                           { d.aborts++ }

// TestDeliver: a failed prepare leaves nothing to abort; a failed move
// aborts once, even when the move aborted first; a good move commits, and
// the commit's count comes back; the phases land in the record.
func TestDeliver(t *testing.T) {
	boom := errors.New("boom")
	_, err := Deliver(nil, nil, func([]Meta) (Dest, error) { return nil, boom }, func(Dest, func()) error {
		t.Fatal("no move after a failed prepare")
		return nil
	}, nil)
	require.ErrorIs(t, err, boom)

	d := &countingDest{}
	_, err = Deliver(nil, nil, func([]Meta) (Dest, error) { return d, nil }, func(_ Dest, abort func()) error {
		abort()
		return boom
	}, nil)
	require.ErrorIs(t, err, boom)
	require.Equal(t, 1, d.aborts, "one abort, however many times asked")
	require.Zero(t, d.commits)

	d = &countingDest{}
	rec := &Record{}
	n, err := Deliver(rec, nil, func([]Meta) (Dest, error) { return d, nil }, func(dst Dest, _ func()) error {
		return dst.WriteAt(0, nil, 0)
	}, nil)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, countingDest{writes: 1, commits: 1}, *d)
	require.True(t, rec.received.Load(), "the phases are recorded")

	n, err = Deliver(nil, nil, func([]Meta) (Dest, error) { return &countingDest{}, nil }, func(Dest, func()) error { return nil },
		func(Dest) (int, error) { return 1, boom })
	require.ErrorIs(t, err, boom)
	require.Equal(t, 1, n, "a failed commit reports what it placed")
}
