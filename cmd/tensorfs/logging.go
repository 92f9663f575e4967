package main

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"
)

// logFlags are the mount flags of the daemon's log (--log-format,
// --log-level).
type logFlags struct {
	format, level string
}

func (l *logFlags) register(f *pflag.FlagSet) {
	f.StringVar(&l.format, "log-format", "text", "log format: text (key=value) or json (one object a line)")
	f.StringVar(&l.level, "log-level", "info", "least severe level logged: debug, info, warn or error")
}

// setup makes the daemon's default slog logger write to w in the chosen
// format from the chosen level, and sends the standard log package's
// lines through it too (at info), so that a line of a library still
// written with log.Printf lands in the same stream and format.
// Errors: an unknown format or level, named as its flag.
func (l *logFlags) setup(w io.Writer) error {
	var lv slog.Level
	switch strings.ToLower(l.level) {
	case "debug":
		lv = slog.LevelDebug
	case "info":
		lv = slog.LevelInfo
	case "warn", "warning":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	o := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch strings.ToLower(l.format) {
	case "text":
		h = slog.NewTextHandler(w, o)
	case "json":
		h = slog.NewJSONHandler(w, o)
	default:
		return fmt.Errorf("--log-format %q: want text or json", l.format)
	}
	slog.SetDefault(slog.New(h))
	// SetDefault routes the log package through h; its own prefix and
	// time stamp would repeat what the handler writes.
	log.SetFlags(0)
	return nil
}
