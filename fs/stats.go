package fs

import (
	"encoding/json"

	"github.com/tensorfs/tensorfs/tensor"
)

// Stats is the document user.tensorfs.stats returns on the root (the spec's
// shape). Copies, transfers and peers stay empty until the peer service exists.
type Stats struct {
	Live      tensor.Stats      `json:"live"`
	Copies    CopyStats         `json:"copies"`
	Transfers TransferStats     `json:"transfers"`
	Peers     map[string]string `json:"peers"`
}

// CopyStats counts completed copies by the path they took.
type CopyStats struct {
	Local int64 `json:"local"`
	IPC   int64 `json:"ipc"`
	TCP   int64 `json:"tcp"`
}

// TransferStats describes transfers in flight and recently finished.
type TransferStats struct {
	Active int              `json:"active"`
	Recent []TransferRecord `json:"recent"`
}

// TransferRecord is one transfer, for progress bars and post-mortems.
type TransferRecord struct {
	Src        string `json:"src"`
	Dst        string `json:"dst"`
	Path       string `json:"path"` // "local", "ipc" or "tcp"
	BytesDone  int64  `json:"bytes_done"`
	BytesTotal int64  `json:"bytes_total"`
	Tensors    int    `json:"tensors"`
	Error      string `json:"error"`
}

// statsPad is the granularity the stats document is padded to, in bytes.
const statsPad = 256

// statsJSON renders the stats document followed by a newline and padded with
// spaces (JSON whitespace, so parsers accept it) to a multiple of statsPad.
// Clients read xattrs in two calls (a size probe, then the read); a value
// whose length changed in between would fail the read with ERANGE (seen under
// load), so the length changes only when the document crosses a statsPad
// boundary. The newline comes first so a terminal shows the JSON on its own
// line.
func (f *FS) statsJSON() []byte {
	b, _ := json.Marshal(Stats{
		Live:      f.store.Stats(),
		Transfers: TransferStats{Recent: []TransferRecord{}},
		Peers:     map[string]string{},
	})
	b = append(b, '\n')
	n := (len(b) + statsPad - 1) / statsPad * statsPad
	for len(b) < n {
		b = append(b, ' ')
	}
	return b
}
