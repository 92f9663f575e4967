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

func (f *FS) statsJSON() []byte {
	b, _ := json.Marshal(Stats{
		Live:      f.store.Stats(),
		Transfers: TransferStats{Recent: []TransferRecord{}},
		Peers:     map[string]string{},
	})
	return b
}
