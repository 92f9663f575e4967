package namespace

import (
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tensorfs/tensorfs/tensor"
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
// refuses with its own message) alone.
func TestNextRangeLine(t *testing.T) {
	for _, c := range []struct {
		line    string
		withSrc bool
		want    rangeLine
	}{
		{"@0+8192 b:/kv/0@131072", false, rangeLine{"", "b:/kv/0", 0, 8192, 131072}},
		{"@5+3 /cache@7+3", false, rangeLine{"", "/cache", 5, 3, 7}},
		{"/blocks@256+256 b:/kv@0", true, rangeLine{"/blocks", "b:/kv", 256, 256, 0}},
		{"/a@b@1+2 /c@d@3", true, rangeLine{"/a@b", "/c@d", 1, 2, 3}},
	} {
		got, after, ok := nextRangeLine(c.line+"\nnext", c.withSrc)
		if !ok || got != c.want || after != "next" {
			t.Errorf("%q: got %+v, %q, %v; want %+v", c.line, got, after, ok, c.want)
		}
	}
	for _, bad := range []string{
		"@0+1  b:/k@2", " @0+1 b:/k@2", "@0+1 b:/k@2 ", "@0+1\tb:/k@2", // other white space
		"@0 b:/k@2", "@0x10+1 b:/k@2", "@0+1 b:/k@0x2", "@+1 b:/k@2", "@0+ b:/k@2", // no length, hex, no digits
		"@0+1 b:/k@2+3",                      // a destination length that differs
		"@0+1 b:/k", "@0+1 b:/k@", "@0+1 @2", // a whole tensor, a bare @, no destination path
		"@1234567890123456789+1 b:/k@2", // 19 digits
		"#@0+1 b:/k@2", "",
	} {
		if _, _, ok := nextRangeLine(bad, false); ok {
			t.Errorf("%q: taken", bad)
		}
	}
	for _, bad := range []string{"@0+1 b:/k@2", "/src@0 b:/k@2", "/src b:/k@2"} {
		if _, _, ok := nextRangeLine(bad, true); ok {
			t.Errorf("batch %q: taken", bad)
		}
	}
}
