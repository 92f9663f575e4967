package transfer

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLogEnd: a finished copy is one line with its path, mode, bytes and
// seconds; successful in-place copies within InPlaceLogEvery of the last
// line are counted, not logged, and the next line says how many; at debug
// each one is logged; a failed attempt only at debug.
func TestLogEnd(t *testing.T) {
	var buf bytes.Buffer
	level := new(slog.LevelVar)
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level})))
	t.Cleanup(func() { slog.SetDefault(old) })
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if l == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("%v: %s", err, l)
			}
			// Only this test's record: a goroutine of an earlier test may
			// still log through the default logger.
			if m["id"] == 7.0 {
				out = append(out, m)
			}
		}
		buf.Reset()
		return out
	}
	rec := func(mode string) *Record {
		r := &Record{ID: 7, Src: "/a", Dst: "b:/a", Path: "tcp"}
		r.mode.Store(mode)
		r.BytesTotal.Store(4096)
		r.Tensors.Store(1)
		r.Streams.Store(2)
		return r
	}
	s := &Service{}

	s.logEnd(rec(modeWhole), 1500*time.Millisecond, nil)
	got := lines()
	if len(got) != 1 || got[0]["msg"] != "copy" || got[0]["path"] != "tcp" || got[0]["mode"] != "whole" ||
		got[0]["bytes"] != 4096.0 || got[0]["seconds"] != 1.5 || got[0]["src"] != "/a" || got[0]["dst"] != "b:/a" {
		t.Fatalf("whole copy: %v", got)
	}

	// The last in-place line is "in the future": the next ones are within
	// the spacing whatever the clock does.
	s.copyLog.last = time.Now().Add(time.Hour)
	s.logEnd(rec(modeInPlace), time.Millisecond, nil)
	s.logEnd(rec(modeInPlace), time.Millisecond, nil)
	if got := lines(); len(got) != 0 {
		t.Fatalf("in-place copies within the spacing were logged: %v", got)
	}
	s.copyLog.last = time.Time{}
	s.logEnd(rec(modeInPlace), time.Millisecond, nil)
	if got := lines(); len(got) != 1 || got[0]["mode"] != "in_place" || got[0]["in_place_unlogged"] != 2.0 {
		t.Fatalf("in-place line after the spacing: %v", got)
	}

	s.logEnd(rec(modeWhole), time.Millisecond, errors.New("boom"))
	if got := lines(); len(got) != 0 {
		t.Fatalf("a failed attempt logged at info: %v", got)
	}
	level.Set(slog.LevelDebug)
	s.copyLog.last = time.Now().Add(time.Hour)
	s.logEnd(rec(modeInPlace), time.Millisecond, nil)
	s.logEnd(rec(modeInPlace), time.Millisecond, nil)
	s.logEnd(rec(modeWhole), time.Millisecond, errors.New("boom"))
	got = lines()
	if len(got) != 3 || got[0]["level"] != "DEBUG" || got[2]["err"] != "boom" {
		t.Fatalf("at debug, each in-place copy and the failure: %v", got)
	}
}
