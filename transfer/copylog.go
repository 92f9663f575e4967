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

// viaAttrs is a "ucx" record's transports, as log attributes.
func (rec *Record) viaAttrs() []any {
	if t := rec.transports(); t != nil {
		return []any{"transports", t}
	}
	return nil
}

// logEnd writes a finished record's one line: where the copy went (src,
// dst), the path it took (local, ipc, tcp), its mode (whole, in_place,
// mixed), its descriptors, bytes and streams, and how long it took. A
// failure is logged at debug only: the caller that asked for the copy
// logs it with its errno (a served copy's by the server, a daemon's own
// by the namespace), once, where an attempt that fell back from IPC to
// TCP would log twice here.
//
// The in-place path is the hot one: a copy the rate limit skips builds no
// attributes (no allocation), as before the line existed.
func (s *Service) logEnd(rec *Record, took time.Duration, err error) {
	l := slog.Default()
	mode, _ := rec.mode.Load().(string)
	attrs := func(more ...any) []any {
		return append([]any{"id", rec.ID, "src", rec.Src, "dst", rec.Dst, "path", rec.Path, "mode", mode,
			"tensors", rec.Tensors.Load(), "bytes", rec.BytesTotal.Load(), "streams", rec.Streams.Load(),
			"seconds", took.Seconds()}, append(rec.viaAttrs(), more...)...)
	}
	debug := l.Enabled(context.Background(), slog.LevelDebug)
	switch {
	case err != nil:
		if debug {
			l.Debug("copy attempt failed", attrs("err", err)...)
		}
		return
	case mode != modeInPlace:
		l.Info("copy", attrs()...)
		return
	case debug:
		l.Debug("copy", attrs()...)
		return
	}
	s.copyLog.Lock()
	now := time.Now()
	if now.Sub(s.copyLog.last) < InPlaceLogEvery {
		s.copyLog.quiet++
		s.copyLog.Unlock()
		return
	}
	quiet := s.copyLog.quiet
	s.copyLog.last, s.copyLog.quiet = now, 0
	s.copyLog.Unlock()
	l.Info("copy", attrs("in_place_unlogged", quiet)...)
}
