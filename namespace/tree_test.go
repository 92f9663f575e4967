package namespace

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tensorfs/tensorfs/tensor"
	"github.com/tensorfs/tensorfs/transfer"
)

// TestPathWalksParents: a node's path follows renames (within and across
// directories) and is "" once it, or a directory above it, has no name.
func TestPathWalksParents(t *testing.T) {
	tr := unmountedFS(t)
	require.Equal(t, "/", tr.Path(tr.Root()))
	a, err := tr.mkdirAll("/a/b")
	require.NoError(t, err)
	require.Equal(t, "/a/b", tr.Path(a))
	ten, err := tr.store.New(u8tmpl())
	require.NoError(t, err)
	f := NewFile(ten, 0o644, 0, 0)
	require.NoError(t, a.Add("x", f))
	require.ErrorIs(t, a.Add("x", f), syscall.EEXIST)
	require.Equal(t, "/a/b/x", tr.Path(f))
	require.NoError(t, a.Rename("x", tr.Root(), "y", false, false))
	require.Equal(t, "/y", tr.Path(f))
	require.Equal(t, "/a/b", tr.Path(a))
	require.ErrorIs(t, tr.Root().Rmdir("a"), syscall.ENOTEMPTY)
	require.NoError(t, tr.Root().Child("a").(*Dir).Rmdir("b"))
	require.Equal(t, "", tr.Path(a))
	require.NoError(t, tr.Root().Unlink("y"))
	require.Equal(t, "", tr.Path(f))
}

// u8tmpl is the template of an empty tensor on the default device.
func u8tmpl() tensor.Template { return tensor.Template{} }

// TestActionLines: one or two fields per line, split at any run of spaces
// or tabs; comments and blank lines skipped; a third field is EINVAL.
func TestActionLines(t *testing.T) {
	got, err := actionLines("a b\n\n# c\n  x\t\t y \n@0+1\tb:/k@2\nsolo", 0, "SRC DST")
	if err != nil {
		t.Fatal(err)
	}
	want := []actionLine{{"a", "b"}, {"x", "y"}, {"@0+1", "b:/k@2"}, {"solo", ""}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for _, bad := range []string{"a\tb c", "a b c", "", "# only"} {
		if _, err := actionLines(bad, 0, "SRC DST"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	// After lines planRangeLines took, none is left to plan; an error
	// names the line by its number in the whole value.
	if got, err := actionLines("", 3, "SRC DST"); err != nil || len(got) != 0 {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := actionLines("a b c", 3, "SRC DST"); err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("error %v, want line 4", err)
	}
}

// TestNextRangeLine: the fast parser takes exactly the range lines it
// knows, leaving every other form (which the general parser reads, or
// refuses with its own message) alone; the same with the line before
// given (its paths are compared, not searched for), whether or not it
// names the same paths, or ones that are a prefix of this line's.
func TestNextRangeLine(t *testing.T) {
	prevs := func(want rangeLine) []*rangeLine {
		other := rangeLine{"/other", "b:/other", 1, 1, 1}
		prefix := rangeLine{want.srcRef, want.dstRef, 1, 1, 1}
		if i := strings.IndexByte(want.srcRef, '@'); i > 0 {
			prefix.srcRef = want.srcRef[:i] // "/a" of "/a@b"
		}
		if i := strings.IndexByte(want.dstRef, '@'); i > 0 {
			prefix.dstRef = want.dstRef[:i]
		}
		same := rangeLine{want.srcRef, want.dstRef, 9, 9, 9}
		return []*rangeLine{nil, &other, &prefix, &same}
	}
	for _, c := range []struct {
		line    string
		withSrc bool
		want    rangeLine
	}{
		{"@0+8192 b:/kv/0@131072", false, rangeLine{"", "b:/kv/0", 0, 8192, 131072}},
		{"@5+3 /cache@7+3", false, rangeLine{"", "/cache", 5, 3, 7}},
		{"/blocks@256+256 b:/kv@0", true, rangeLine{"/blocks", "b:/kv", 256, 256, 0}},
		{"/a@b@1+2 /c@d@3", true, rangeLine{"/a@b", "/c@d", 1, 2, 3}},
		{"/a@b@1+2 /c@d@3+2", true, rangeLine{"/a@b", "/c@d", 1, 2, 3}},
	} {
		for _, prev := range prevs(c.want) {
			for _, tail := range []string{"\nnext", ""} {
				want := map[string]string{"\nnext": "next", "": ""}[tail]
				got, after, ok := nextRangeLine(c.line+tail, c.withSrc, prev)
				if !ok || got != c.want || after != want {
					t.Errorf("%q (line before %+v): got %+v, %q, %v; want %+v", c.line+tail, prev, got, after, ok, c.want)
				}
			}
		}
	}
	bads := []string{
		"@0+1  b:/k@2", " @0+1 b:/k@2", "@0+1 b:/k@2 ", "@0+1\tb:/k@2", "@0+1 b:/k@2\r", "@0+1 b:/k @2", // other white space
		"@0 b:/k@2", "@0x10+1 b:/k@2", "@0+1 b:/k@0x2", "@+1 b:/k@2", "@0+ b:/k@2", // no length, hex, no digits
		"@0+1 b:/k@2+3",                      // a destination length that differs
		"@0+1 b:/k", "@0+1 b:/k@", "@0+1 @2", // a whole tensor, a bare @, no destination path
		"@1234567890123456789+1 b:/k@2", // 19 digits
		"#@0+1 b:/k@2", "",
	}
	k := rangeLine{"", "b:/k", 0, 1, 2}
	for _, bad := range bads {
		for _, prev := range []*rangeLine{nil, &k} {
			if _, _, ok := nextRangeLine(bad, false, prev); ok {
				t.Errorf("%q (line before %+v): taken", bad, prev)
			}
		}
	}
	src := rangeLine{"/src", "b:/k", 0, 1, 2}
	for _, bad := range []string{"@0+1 b:/k@2", "/src@0 b:/k@2", "/src b:/k@2", "/src@0+1  b:/k@2", "/src @0+1 b:/k@2", "/src@0+1\tb:/k@2", "/s\nrc@0+1 b:/k@2", "/src@0+1\n b:/k@2"} {
		for _, prev := range []*rangeLine{nil, &src} {
			if _, _, ok := nextRangeLine(bad, true, prev); ok {
				t.Errorf("batch %q (line before %+v): taken", bad, prev)
			}
		}
	}
}

// TestScanNumber: the number parse agrees with strconv on
// every length of 1 to 19 digits, at every position against the end of the
// string, followed by each kind of byte that ends a number; 19 digits and
// none are refused.
func TestScanNumber(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for digits := 1; digits <= 19; digits++ {
		for trial := 0; trial < 50; trial++ {
			num := make([]byte, digits)
			for k := range num {
				num[k] = byte('0' + r.IntN(10))
			}
			for _, tail := range []string{"", "+", " ", "\n", "@", "/" /* before 0 */, ":" /* after 9 */, "\xff"} {
				for _, pad := range []string{"", "x", "ab@"} {
					s := pad + string(num) + tail + strings.Repeat("z", r.IntN(10))
					v, j, ok := scanNumber(s, len(pad))
					want, err := strconv.ParseInt(string(num), 10, 64)
					if digits > 18 {
						if ok {
							t.Errorf("%q: %d digits taken", s, digits)
						}
						continue
					}
					if err != nil || !ok || v != want || j != len(pad)+digits {
						t.Errorf("%q at %d: got %d, %d, %v; want %d, %d", s, len(pad), v, j, ok, want, len(pad)+digits)
					}
				}
			}
		}
	}
	for _, s := range []string{"", "+1", " 1", "a"} {
		if _, _, ok := scanNumber(s, 0); ok {
			t.Errorf("%q: taken", s)
		}
	}
}

// TestFastLine: fastLine takes a line exactly when the general parser
// reads it as a range line with the same paths, no destination length and
// a source range inside the tensor, with the same numbers and rest; every
// other line it leaves alone (nothing added), for the general way and its
// errors.
func TestFastLine(t *testing.T) {
	const size = 1 << 20
	newCur := func() *fileSource {
		return &fileSource{meta: transfer.Meta{NBytes: 0}, ref: &openTensor{meta: transfer.Meta{NBytes: size}}}
	}
	for _, c := range []struct {
		src, dst, rest string
		ok             bool
	}{
		{"", "b:/cache", "@0+8192 b:/cache@16384", true},
		{"", "b:/cache", "@0+8192 b:/cache@16384\n@8192+8192 b:/cache@0", true},
		{"/blocks", "b:/cache", "/blocks@4096+4096 b:/cache@4096\n", true},
		{"", "b:/cache", "@0+8192 b:/cache@16384+8192", true},         // a destination length, the same
		{"", "b:/cache", "@0+8192 b:/cache@16384+4096", false},        // a destination length that differs
		{"", "b:/cache", "@0+8192 b:/cache2@16384", false},            // another destination
		{"", "b:/cache", "@0+8192 b:/cach@16384", false},              // a prefix of it
		{"", "b:/cache", "@0+8192  b:/cache@16384", false},            // two spaces
		{"", "b:/cache", "@0+8192 b:/cache@16384 ", false},            // a trailing space
		{"", "b:/cache", "@0x10+8192 b:/cache@16384", false},          // hex
		{"", "b:/cache", "@1048576+1 b:/cache@0", false},              // past the tensor
		{"", "b:/cache", "@1048570+8 b:/cache@0", false},              // across its end
		{"", "b:/cache", "@+8 b:/cache@0", false},                     // no offset
		{"", "b:/cache", "@0+8 b:/cache@", false},                     // no destination offset
		{"", "b:/cache", "@0+8 b:/cache@0\r\n", false},                // CR
		{"", "b:/cache", "@99999999999999999999+8 b:/cache@0", false}, // 20 digits
		{"/blocks", "b:/cache", "/blocks2@0+8 b:/cache@0", false},     // another source
		{"/blocks", "b:/cache", "@0+8 b:/cache@0", false},             // a batch line names its source
		{"", "b:/cache", "", false},
	} {
		cur := newCur()
		after, ok := fastLine(c.rest, c.src, c.dst, cur, 4)
		require.Equal(t, c.ok, ok, "%q", c.rest)
		if !ok {
			require.Nil(t, cur.meta.Spans, "%q: nothing added", c.rest)
			continue
		}
		prev := &rangeLine{srcRef: c.src, dstRef: c.dst}
		l, wantAfter, wantOK := nextRangeLine(c.rest, c.src != "", prev)
		require.True(t, wantOK, "%q", c.rest)
		require.Equal(t, wantAfter, after, "%q", c.rest)
		require.Equal(t, []transfer.Span{{Pos: 0, Src: 0, Dst: 0, N: 0}, {Pos: 0, Src: l.src, Dst: l.dst, N: l.n}}, cur.meta.Spans, "%q", c.rest)
	}
}

// TestRangeNumbersAgree: the range lines' fast parser (nextRangeLine,
// fastLine: a call of several lines) and the general one (transfer's
// SplitRange: a single line, a pull) read every number form alike, or one
// of them refuses it: "010" was octal 8 to the general parser and 10 to
// the fast one, so one line's bytes landed elsewhere alone than in a
// longer call.
func TestRangeNumbersAgree(t *testing.T) {
	compared := 0
	for _, n := range []string{"0", "7", "010", "0009", "8192", "000000000000000001", "123456789012345678"} {
		for _, m := range []string{"1", "010", "4096"} {
			line := "@" + n + "+" + m + " b:/c@" + n
			l, _, ok := nextRangeLine(line, false, nil)
			_, r, err := transfer.SplitRange("/s@" + n + "+" + m)
			if !ok || err != nil {
				continue // a form the fast parser leaves to the general one
			}
			compared++
			require.Equal(t, r.Off, l.src, "%q", line)
			require.Equal(t, r.Len, l.n, "%q", line)
			_, d, err := transfer.SplitRange("b:/c@" + n)
			require.NoError(t, err)
			require.Equal(t, d.Off, l.dst, "%q", line)
		}
	}
	require.Equal(t, 21, compared, "every form read by both parsers")
}
