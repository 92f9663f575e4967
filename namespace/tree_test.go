package namespace

import (
	"slices"
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
	got, err := actionLines("a b\n\n# c\n  x\t\t y \n@0+1\tb:/k@2\nsolo", "SRC DST")
	if err != nil {
		t.Fatal(err)
	}
	want := []actionLine{{"a", "b"}, {"x", "y"}, {"@0+1", "b:/k@2"}, {"solo", ""}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for _, bad := range []string{"a\tb c", "a b c", "", "# only"} {
		if _, err := actionLines(bad, "SRC DST"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
