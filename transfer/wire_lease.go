package transfer

// idsMsg carries export ids on a lease channel: frameRevoke (exporter ->
// importer: drop these) and frameRevoked (importer -> exporter: dropped,
// whether asked or on its own).
type idsMsg struct {
	IDs []uint64 `json:"ids"`
}
