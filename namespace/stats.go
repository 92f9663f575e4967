package namespace

import (
	"encoding/json"
	"os"

	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// Stats is the document user.tensorfs.stats returns on the root (the spec's
// shape): what lives now, then the peer service's copies, transfers and
// peers (zeros when the node has no peer service).
type Stats struct {
	Live tensor.Stats `json:"live"`
	// Devices are the devices' capacity and use, default first.
	Devices []tensor.DeviceStats `json:"devices"`
	transfer.Stats
	// Errors are the refused attribute sets and actions (Refuse).
	Errors Errors `json:"errors"`
	// Truncated says the document dropped its peers to stay under 64 KiB
	// (the recent lists were emptied first).
	Truncated bool `json:"truncated,omitempty"`
	// PID is this daemon's process id (xattrs.Stats.PID).
	PID int `json:"pid,omitempty"`
}

// statsPad is the granularity the stats document is padded to, in bytes.
const statsPad = 256

// statsMax bounds the stats document, padding included, in bytes: under
// the 64 KiB an xattr value may have (XATTR_SIZE_MAX).
const statsMax = 64<<10 - statsPad

// StatsJSON renders the stats document padded with spaces (JSON
// whitespace, so parsers accept it) to a multiple of statsPad, the last
// byte a newline. Clients read xattrs in two calls (a size probe, then the
// read); a value whose length changed in between would fail the read with
// ERANGE (seen under load), so the length changes only when the document
// crosses a statsPad boundary. The newline comes last so that a terminal
// shows the prompt on a line of its own after `getfattr --only-values`.
//
// The document stays under statsMax (an xattr value is at most 64 KiB, and
// a client cannot read a larger one: E2BIG): the oldest entries of its
// recent lists are dropped until it fits (paths of 4 KiB in 16 refusals
// went past it, found by trying to break it).
func (f *Tree) StatsJSON() []byte {
	live := f.store.Stats()
	live.Imports = f.peers.Imports()
	live.Bindings = f.peers.Bindings()
	st := Stats{Live: live, Devices: f.store.DeviceStats(), Stats: f.peers.Stats(), Errors: f.errorStats(), PID: os.Getpid()}
	b, _ := json.Marshal(st)
	for len(b) >= statsMax {
		tr, er := &st.Transfers.Recent, &st.Errors.Recent
		switch {
		case len(*er) > 0 && len(*er) >= len(*tr):
			*er = (*er)[1:]
		case len(*tr) > 0:
			*tr = (*tr)[1:]
		default:
			// Nothing left to drop (a thousand peers?): the lists that
			// remain are the peers'; the document says it was cut.
			st.Peers = nil
			st.Truncated = true
		}
		b, _ = json.Marshal(st)
		if st.Truncated {
			break
		}
	}
	n := (len(b) + 1 + statsPad - 1) / statsPad * statsPad
	for len(b) < n-1 {
		b = append(b, ' ')
	}
	return append(b, '\n')
}
