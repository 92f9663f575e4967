package transfer

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// InPlaceLogEvery spaces the info lines of successful in-place copies:
// the KV-cache path makes thousands a second, and their counts are in
// stats; at debug every one is logged.
const InPlaceLogEvery = time.Second

// copyLog rate-limits the info lines of successful in-place copies.
type copyLog struct {
	sync.Mutex
	last  time.Time
	quiet int // in-place copies not logged since last
}

// logEnd writes a finished record's one line: where the copy went (src,
// dst), the path it took (local, ipc, tcp), its mode (whole, in_place,
// mixed), its descriptors, bytes and streams, and how long it took. A
// failure is logged at debug only: the caller that asked for the copy
// logs it with its errno (a served copy's by the server, a daemon's own
// by the namespace), once, where an attempt that fell back from IPC to
// TCP would log twice here.
func (s *Service) logEnd(rec *Record, took time.Duration, err error) {
	l := slog.Default()
	mode, _ := rec.mode.Load().(string)
	attrs := []any{"id", rec.ID, "src", rec.Src, "dst", rec.Dst, "path", rec.Path, "mode", mode,
		"tensors", rec.Tensors.Load(), "bytes", rec.BytesTotal.Load(), "streams", rec.Streams.Load(), "seconds", took.Seconds()}
	if err != nil {
		l.Debug("copy attempt failed", append(attrs, "err", err)...)
		return
	}
	if mode != modeInPlace {
		l.Info("copy", attrs...)
		return
	}
	if l.Enabled(context.Background(), slog.LevelDebug) {
		l.Debug("copy", attrs...)
		return
	}
	s.copyLog.Lock()
	defer s.copyLog.Unlock()
	if now := time.Now(); now.Sub(s.copyLog.last) >= InPlaceLogEvery {
		l.Info("copy", append(attrs, "in_place_unlogged", s.copyLog.quiet)...)
		s.copyLog.last, s.copyLog.quiet = now, 0
		return
	}
	s.copyLog.quiet++
}
