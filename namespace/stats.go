package namespace

import (
	"encoding/json"

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
}

// statsPad is the granularity the stats document is padded to, in bytes.
const statsPad = 256

// StatsJSON renders the stats document padded with spaces (JSON
// whitespace, so parsers accept it) to a multiple of statsPad, the last
// byte a newline. Clients read xattrs in two calls (a size probe, then the
// read); a value whose length changed in between would fail the read with
// ERANGE (seen under load), so the length changes only when the document
// crosses a statsPad boundary. The newline comes last so that a terminal
// shows the prompt on a line of its own after `getfattr --only-values`.
func (f *Tree) StatsJSON() []byte {
	live := f.store.Stats()
	live.Imports = f.peers.Imports()
	b, _ := json.Marshal(Stats{Live: live, Devices: f.store.DeviceStats(), Stats: f.peers.Stats(), Errors: f.errorStats()})
	n := (len(b) + 1 + statsPad - 1) / statsPad * statsPad
	for len(b) < n-1 {
		b = append(b, ' ')
	}
	return append(b, '\n')
}
