package transfer

import "sync"

// Deliver is the one destination engine: every copy into this node (a
// local copy, a TCP or IPC put from a peer, a pull over TCP or IPC) runs
// prepare → move → commit through it, so that a destination is either
// committed whole or aborted, leaving nothing, whichever path the bytes took.
//
// descs is the transfer's descriptor list, each a (destination, offset,
// length): a whole tensor, or bytes written in place (Meta.InPlace); prepare
// gets it and makes the destination of every descriptor (allocates and
// registers the temporaries of the whole ones, checks and pins the in-place
// ranges): all destinations are checked before any byte moves;
// move writes the bytes into it; commit puts it in place and returns how
// many tensors it placed (nil means Dest.Commit; a caller passes its own to
// keep a connection alive or report a failure while it runs). A move that
// fails aborts the destination; a prepare that fails has nothing to abort.
// rec, when not nil, gets each phase's duration (stats' phase_us); local
// copies pass nil, as their records have no phases.
//
// A move may abort the destination itself, at once, at its failure (the TCP
// receive does, so that no more chunks land), through abort: the engine's
// own abort is then a no-op, as Dest's contract wants Abort once. (A
// wrapper Dest would do the same but hide the interfaces the receive looks
// for on dest, such as in-place writes.)
//
// It returns the tensors placed (on a failed commit, those placed before it
// failed) and the first error, unchanged.
func Deliver(rec *Record, descs []Meta, prepare func([]Meta) (Dest, error), move func(dest Dest, abort func()) error, commit func(Dest) (int, error)) (n int, err error) {
	var dest Dest
	err = rec.timed(phasePrepare, func() (err error) {
		dest, err = prepare(descs)
		return err
	})
	if err != nil {
		return 0, err
	}
	var once sync.Once
	abort := func() { once.Do(dest.Abort) }
	if err = rec.timed(phaseData, func() error { return move(dest, abort) }); err != nil {
		abort()
		return 0, err
	}
	if commit == nil {
		commit = Dest.Commit
	}
	err = rec.timed(phaseCommit, func() (err error) {
		n, err = commit(dest)
		return err
	})
	return n, err
}
