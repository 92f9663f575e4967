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
	transfer.Stats
}

// statsPad is the granularity the stats document is padded to, in bytes.
const statsPad = 256

// StatsJSON renders the stats document followed by a newline and padded with
// spaces (JSON whitespace, so parsers accept it) to a multiple of statsPad.
// Clients read xattrs in two calls (a size probe, then the read); a value
// whose length changed in between would fail the read with ERANGE (seen under
// load), so the length changes only when the document crosses a statsPad
// boundary. The newline comes first so a terminal shows the JSON on its own
// line.
func (f *Tree) StatsJSON() []byte {
	live := f.store.Stats()
	live.Imports = f.peers.Imports()
	b, _ := json.Marshal(Stats{Live: live, Stats: f.peers.Stats()})
	b = append(b, '\n')
	n := (len(b) + statsPad - 1) / statsPad * statsPad
	for len(b) < n {
		b = append(b, ' ')
	}
	return b
}
