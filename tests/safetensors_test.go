package tests

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/safetensors"
	"github.com/tensorfs/tensorfs/xattrs"
)

const stMetadataXattr = "user.safetensors.metadata"

// stFixtures returns the shared safetensors fixtures: ../shared/fixtures/
// safetensors relative to the module root. Missing fixtures fail the test
// under CI=true (they are part of what CI must check) and skip it elsewhere.
func stFixtures(t *testing.T) []string {
	t.Helper()
	root, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			t.Fatal("no go.mod above the test's directory")
		}
		root = parent
	}
	dir := filepath.Join(root, "..", "shared", "fixtures", "safetensors")
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(files) == 0 {
		msg := "no safetensors fixtures in " + dir + " (../shared/fixtures/safetensors from the module root)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg + "; skipping (set CI=true to make this a failure)")
	}
	return files
}

// stRun runs the tensorfs binary and returns its stdout, stderr and exit code.
func stRun(t *testing.T, args ...string) (stdout []byte, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.Bytes(), errb.String(), ee.ExitCode()
	}
	require.NoError(t, err, "running tensorfs %v", args)
	return out.Bytes(), errb.String(), 0
}

// stParse parses a whole safetensors file with the codec.
func stParse(t *testing.T, raw []byte) *safetensors.Header {
	t.Helper()
	h, err := safetensors.ReadHeader(bytes.NewReader(raw), int64(len(raw)))
	require.NoError(t, err)
	return h
}

// stData is a tensor's bytes in a whole file.
func stData(raw []byte, h *safetensors.Header, ts safetensors.Tensor) []byte {
	return raw[h.DataOffset+ts.Begin : h.DataOffset+ts.End]
}

type stSpec struct {
	name  string
	dtype dtype.DType
	shape dtype.Shape
}

// stBuild writes a safetensors file of random data to a temporary directory
// and returns its path and bytes.
func stBuild(t *testing.T, specs []stSpec, md map[string]string) (string, []byte) {
	t.Helper()
	ts := make([]safetensors.Tensor, len(specs))
	for i, s := range specs {
		ts[i] = safetensors.Tensor{Name: s.name, DType: s.dtype, Shape: s.shape}
	}
	h, err := safetensors.NewHeader(ts, md)
	require.NoError(t, err)
	raw, err := h.Encode()
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(uint64(len(specs)), 42))
	data := make([]byte, dataSize(h))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	raw = append(raw, data...)
	path := filepath.Join(t.TempDir(), "in.safetensors")
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	return path, raw
}

// stFiles lists the regular files under dir as slash-separated relative paths.
func stFiles(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, de os.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		names = append(names, filepath.ToSlash(rel))
		return err
	}))
	sort.Strings(names)
	return names
}

// stCheckImported checks that dir holds exactly the tensors of the file raw,
// each with the header's dtype, shape and nbytes and the file's bytes, and
// the file's metadata as JSON on dir.
func stCheckImported(t *testing.T, dir string, raw []byte) {
	t.Helper()
	h := stParse(t, raw)
	var want []string
	for _, ts := range h.Tensors {
		want = append(want, ts.Name)
		p := filepath.Join(dir, filepath.FromSlash(ts.Name))
		require.Equal(t, string(ts.DType), getx(t, p, xattrs.DType), ts.Name)
		require.Equal(t, ts.Shape.String(), getx(t, p, xattrs.Shape), ts.Name)
		require.Equal(t, ts.Size(), mustAtoi(t, getx(t, p, xattrs.NBytes)), ts.Name)
		got, err := os.ReadFile(p)
		require.NoError(t, err)
		require.True(t, bytes.Equal(stData(raw, h, ts), got), "bytes of %s", ts.Name)
	}
	sort.Strings(want)
	require.Equal(t, want, stFiles(t, dir))
	v, err := getxErr(dir, stMetadataXattr)
	if h.Metadata == nil {
		require.ErrorIs(t, err, syscall.ENODATA)
		return
	}
	require.NoError(t, err)
	var md map[string]string
	require.NoError(t, json.Unmarshal([]byte(v), &md))
	require.Equal(t, h.Metadata, md)
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// stSameTensors requires two safetensors files to hold the same tensors
// (names, dtypes, shapes, bytes) and metadata, whatever their layout. An
// empty __metadata__ equals none: the writer omits it.
func stSameTensors(t *testing.T, a, b []byte) {
	t.Helper()
	ha, hb := stParse(t, a), stParse(t, b)
	require.Len(t, hb.Tensors, len(ha.Tensors))
	for i, ta := range ha.Tensors {
		tb := hb.Tensors[i]
		require.Equal(t, ta.Name, tb.Name)
		require.Equal(t, ta.DType, tb.DType, ta.Name)
		require.Equal(t, ta.Shape.String(), tb.Shape.String(), ta.Name)
		require.True(t, bytes.Equal(stData(a, ha, ta), stData(b, hb, tb)), "bytes of %s", ta.Name)
	}
	if len(ha.Metadata) > 0 || len(hb.Metadata) > 0 {
		require.Equal(t, ha.Metadata, hb.Metadata)
	}
}

// stCheckWriterLayout checks what export promises beyond equivalence: a
// header padded to 8 bytes, tensors contiguous in name order, nothing after.
func stCheckWriterLayout(t *testing.T, raw []byte) {
	t.Helper()
	h := stParse(t, raw)
	require.Zero(t, h.DataOffset%8, "header padded to a multiple of 8 bytes")
	var off int64
	for _, ts := range h.Tensors {
		require.Equal(t, off, ts.Begin, "tensor %s contiguous in name order", ts.Name)
		off = ts.End
	}
	require.Equal(t, int64(len(raw)), h.DataOffset+off, "no bytes after the last tensor")
	if len(h.Metadata) == 0 {
		require.NotContains(t, string(raw[:h.DataOffset]), "__metadata__")
	}
}

// stRoundTrip imports src into dir, checks it, exports it (to a file and to
// stdout), checks the export, re-imports it into dir+".again" and checks that,
// then removes both directories.
func stRoundTrip(t *testing.T, d *daemon, src string, raw []byte, dir string) {
	t.Helper()
	h := stParse(t, raw)
	_, stderr, code := stRun(t, "import", src, dir)
	require.Zero(t, code, stderr)
	require.Contains(t, stderr, "imported ")
	require.Equal(t, 1, strings.Count(stderr, "\n"), "one summary line: %q", stderr)
	stCheckImported(t, dir, raw)

	outDir := t.TempDir()
	out := filepath.Join(outDir, "out.safetensors")
	_, stderr, code = stRun(t, "export", dir, out)
	require.Zero(t, code, stderr)
	require.Contains(t, stderr, "exported ")
	exported, err := os.ReadFile(out)
	require.NoError(t, err)
	stSameTensors(t, raw, exported)
	stCheckWriterLayout(t, exported)
	left, err := os.ReadDir(outDir)
	require.NoError(t, err)
	require.Len(t, left, 1, "no temporary file left next to the export")

	stdout, stderr, code := stRun(t, "export", "--quiet", dir, "-")
	require.Zero(t, code, stderr)
	require.Empty(t, stderr, "--quiet prints nothing")
	require.True(t, bytes.Equal(exported, stdout), "export to stdout matches export to a file")

	again := dir + ".again"
	_, stderr, code = stRun(t, "import", "-q", out, again)
	require.Zero(t, code, stderr)
	require.Empty(t, stderr)
	stCheckImported(t, again, exported)
	for _, ts := range h.Tensors {
		p := filepath.FromSlash(ts.Name)
		a, err := os.ReadFile(filepath.Join(dir, p))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(again, p))
		require.NoError(t, err)
		require.True(t, bytes.Equal(a, b), ts.Name)
		require.Equal(t, getx(t, filepath.Join(dir, p), xattrs.Shape), getx(t, filepath.Join(again, p), xattrs.Shape))
	}
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.RemoveAll(again))
}

// TestSafetensorsFixtures round-trips every real file the reference writer
// made: import, check against the header, export, re-import.
func TestSafetensorsFixtures(t *testing.T) {
	files := stFixtures(t)
	d := startDaemon(t)
	for _, fx := range files {
		t.Run(filepath.Base(fx), func(t *testing.T) {
			raw, err := os.ReadFile(fx)
			require.NoError(t, err)
			stRoundTrip(t, d, fx, raw, d.path(strings.TrimSuffix(filepath.Base(fx), ".safetensors")))
			d.requireClean()
		})
	}
	d.requireClean()
}

// TestSafetensorsNames covers names with '/' (subdirectories), names whose
// sort order differs from a directory walk's ("a.b" < "a/b"), scalars,
// zero-element tensors, sub-byte dtypes and metadata that JSON would escape.
func TestSafetensorsNames(t *testing.T) {
	d := startDaemon(t)
	src, raw := stBuild(t, []stSpec{
		{"model/layers.0/attn/w", "F32", dtype.Shape{4, 3}},
		{"model/layers.0/b", "BF16", dtype.Shape{3}},
		{"model/embed", "I64", dtype.Shape{}},
		{"empty", "F16", dtype.Shape{0, 4}},
		{"a/b", "U8", dtype.Shape{5}},
		{"a.b", "I32", dtype.Shape{2}},
		{"fp4", "F4", dtype.Shape{6}},
		{"sp ace ñ", "F64", dtype.Shape{1, 1, 1}},
		{strings.Repeat("n", 255), "BOOL", dtype.Shape{3}},
		{"big", "F32", dtype.Shape{3, 1 << 17}}, // 1.5 MiB: several 1 MiB chunks
	}, map[string]string{"format": "pt", "html": "<a&b>", "quote": `"\`})
	dir := d.path("names")
	_, stderr, code := stRun(t, "import", src, dir)
	require.Zero(t, code, stderr)
	for _, sub := range []string{"model", "model/layers.0", "model/layers.0/attn", "a"} {
		fi, err := os.Stat(filepath.Join(dir, sub))
		require.NoError(t, err)
		require.True(t, fi.IsDir(), sub)
	}
	fi, err := os.Stat(filepath.Join(dir, "empty"))
	require.NoError(t, err)
	require.Zero(t, fi.Size())
	require.NoError(t, os.RemoveAll(dir))
	stRoundTrip(t, d, src, raw, dir)
	d.requireClean()
}

// TestSafetensorsBadNames: names that cannot be paths inside DIR are refused
// before anything is created.
func TestSafetensorsBadNames(t *testing.T) {
	d := startDaemon(t)
	for _, tc := range []struct{ name, want string }{
		{"", "empty name"},
		{"../escape", `".." path component`},
		{"a/../../b", `".." path component`},
		{"./a", `"." path component`},
		{"a//b", "empty path component"},
		{"/abs", "empty path component"},
		{"a/", "empty path component"},
		{"x\x00y", "NUL"},
		{strings.Repeat("n", 256), "256 bytes"},
		{"d/" + strings.Repeat("n", 300), "300 bytes"},
	} {
		src, _ := stBuild(t, []stSpec{{"ok", "U8", dtype.Shape{2}}, {tc.name, "U8", dtype.Shape{2}}}, nil)
		dir := d.path("bad")
		_, stderr, code := stRun(t, "import", src, dir)
		require.NotZero(t, code, "name %q", tc.name)
		require.Contains(t, stderr, tc.want, "name %q", tc.name)
		require.Contains(t, stderr, "nothing was imported")
		require.True(t, strings.HasPrefix(stderr, "tensorfs: "), stderr)
		_, err := os.Stat(dir)
		require.ErrorIs(t, err, os.ErrNotExist, "name %q: nothing created", tc.name)
	}
	src, _ := stBuild(t, []stSpec{{"a", "U8", dtype.Shape{2}}, {"a/b", "U8", dtype.Shape{2}}}, nil)
	_, stderr, code := stRun(t, "import", src, d.path("bad"))
	require.NotZero(t, code)
	require.Contains(t, stderr, `needs "a" to be a directory`)
	_, err := os.Stat(d.path("bad"))
	require.ErrorIs(t, err, os.ErrNotExist)
	d.requireClean()
}

// TestSafetensorsImportDirs: an existing non-empty directory is refused and
// left exactly as it was; an existing empty one is fine; a new directory
// under a shape template imports at each tensor's own size; an existing one
// with a shape template is refused; DIR off tensorfs is refused.
func TestSafetensorsImportDirs(t *testing.T) {
	d := startDaemon(t)
	src, raw := stBuild(t, []stSpec{{"w", "F32", dtype.Shape{2, 2}}, {"sub/v", "U8", dtype.Shape{3}}}, map[string]string{"k": "v"})

	full := d.path("full")
	require.NoError(t, os.Mkdir(full, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(full, "keep"), []byte("hello"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(full, "sub"), 0o755))
	_, stderr, code := stRun(t, "import", src, full)
	require.NotZero(t, code)
	require.Contains(t, stderr, "not empty")
	require.Equal(t, []string{"keep"}, stFiles(t, full))
	ents, err := os.ReadDir(full)
	require.NoError(t, err)
	require.Len(t, ents, 2)
	b, err := os.ReadFile(filepath.Join(full, "keep"))
	require.NoError(t, err)
	require.Equal(t, "hello", string(b))
	_, err = getxErr(full, stMetadataXattr)
	require.ErrorIs(t, err, syscall.ENODATA, "no metadata set on a refused directory")
	require.NoError(t, os.RemoveAll(full))

	empty := d.path("empty")
	require.NoError(t, os.Mkdir(empty, 0o755))
	_, stderr, code = stRun(t, "import", src, empty)
	require.Zero(t, code, stderr)
	stCheckImported(t, empty, raw)
	require.NoError(t, os.RemoveAll(empty))

	tmpl := d.path("tmpl")
	mkTemplateDir(t, tmpl, "F64", "16")
	_, stderr, code = stRun(t, "import", src, filepath.Join(tmpl, "x"))
	require.Zero(t, code, stderr)
	stCheckImported(t, filepath.Join(tmpl, "x"), raw)
	require.NoError(t, os.Mkdir(filepath.Join(tmpl, "y"), 0o755))
	_, stderr, code = stRun(t, "import", src, filepath.Join(tmpl, "y"))
	require.NotZero(t, code)
	require.Contains(t, stderr, "shape template")
	require.NoError(t, os.RemoveAll(tmpl))

	local := filepath.Join(t.TempDir(), "local")
	_, stderr, code = stRun(t, "import", src, local)
	require.NotZero(t, code)
	require.Contains(t, stderr, "not on a tensorfs mount")
	_, err = os.Stat(local)
	require.ErrorIs(t, err, os.ErrNotExist)
	d.requireClean()
}

// TestSafetensorsCorrupt: truncated or malformed files exit non-zero with one
// clear line and create nothing.
func TestSafetensorsCorrupt(t *testing.T) {
	d := startDaemon(t)
	_, raw := stBuild(t, []stSpec{{"w", "F32", dtype.Shape{4, 4}}, {"x", "F64", dtype.Shape{3}}}, map[string]string{"k": "v"})
	n := binary.LittleEndian.Uint64(raw)
	hdr := string(raw[8 : 8+n])
	withHeader := func(js string) []byte {
		require.NotEqual(t, hdr, js, "the corruption applies")
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
		return append(append(b, js...), raw[8+n:]...)
	}
	dir := t.TempDir()
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "shorter than the 8-byte header length"},
		{"four bytes", raw[:4], "shorter than the 8-byte header length"},
		{"truncated header", raw[:40], "runs past the end"},
		{"truncated data", raw[:len(raw)-5], "run past the"},
		{"huge header length", append(binary.LittleEndian.AppendUint64(nil, 1<<40), raw[8:]...), "over the"},
		{"not JSON", withHeader(strings.Replace(hdr, `"`, "'", 1)), "invalid JSON"},
		{"bad dtype", withHeader(strings.Replace(hdr, `"F64"`, `"F99"`, 1)), `unknown dtype "F99"`},
		{"bad offsets", withHeader(strings.Replace(hdr, `"data_offsets":[64,88]`, `"data_offsets":[64,80]`, 1)), "hold 16 bytes, but F64 [3] needs 24"},
	}
	for _, tc := range cases {
		p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
		require.NoError(t, os.WriteFile(p, tc.data, 0o644))
		out := d.path("corrupt")
		_, stderr, code := stRun(t, "import", p, out)
		require.NotZero(t, code, tc.name)
		require.True(t, strings.HasPrefix(stderr, "tensorfs: "), "%s: %q", tc.name, stderr)
		require.Equal(t, 1, strings.Count(stderr, "\n"), "%s: one line: %q", tc.name, stderr)
		require.Contains(t, stderr, tc.want, tc.name)
		_, err := os.Stat(out)
		require.ErrorIs(t, err, os.ErrNotExist, "%s: nothing created", tc.name)
	}
	_, stderr, code := stRun(t, "import", filepath.Join(dir, "missing"), d.path("corrupt"))
	require.NotZero(t, code)
	require.Contains(t, stderr, "no such file")
	d.requireClean()
}

// TestSafetensorsImportPartialFailure: running out of device memory part way
// exits non-zero, says how many tensors were imported, and leaves them.
func TestSafetensorsImportPartialFailure(t *testing.T) {
	// 2 MiB tensors under a 5 MiB cap stop after two on every backend (CUDA
	// allocates in 2 MiB granules).
	d := startDaemon(t, "--max-memory", "5MiB")
	src, raw := stBuild(t, []stSpec{
		{"a", "U8", dtype.Shape{2 << 20}},
		{"b", "U8", dtype.Shape{2 << 20}},
		{"c", "U8", dtype.Shape{2 << 20}},
	}, nil)
	dir := d.path("partial")
	_, stderr, code := stRun(t, "import", src, dir)
	require.NotZero(t, code)
	require.Contains(t, stderr, "stopped after 2 of 3 tensors")
	require.Contains(t, stderr, `tensor "c"`)
	require.Contains(t, stderr, "no space left on device")
	require.Equal(t, []string{"a", "b"}, stFiles(t, dir))
	h := stParse(t, raw)
	for _, ts := range h.Tensors[:2] {
		got, err := os.ReadFile(filepath.Join(dir, ts.Name))
		require.NoError(t, err)
		require.True(t, bytes.Equal(stData(raw, h, ts), got), ts.Name)
	}
	require.NoError(t, os.RemoveAll(dir))
	d.requireClean()
}

// TestSafetensorsExportSizeMismatch: a file whose size disagrees with its
// shape fails the export, which leaves no output (and no temporary) file.
// tensorfs itself keeps size and shape consistent, so the directory is on
// the local disk, where user.tensorfs.* are plain user xattrs; the output
// goes to the mount, so a leaked temporary file would also show in stats.
func TestSafetensorsExportSizeMismatch(t *testing.T) {
	d := startDaemon(t)
	src := t.TempDir()
	good, bad := filepath.Join(src, "good"), filepath.Join(src, "bad")
	require.NoError(t, os.WriteFile(good, make([]byte, 16), 0o644))
	require.NoError(t, os.WriteFile(bad, make([]byte, 10), 0o644))
	if err := syscall.Setxattr(good, xattrs.DType, []byte("F32"), 0); errors.Is(err, syscall.ENOTSUP) {
		t.Skipf("the local filesystem under %s has no user xattrs", src)
	}
	for _, p := range []string{good, bad} {
		setx(t, p, xattrs.DType, "F32")
		setx(t, p, xattrs.Shape, "2,2")
	}
	for _, out := range []string{d.path("out.safetensors"), filepath.Join(t.TempDir(), "out.safetensors")} {
		_, stderr, code := stRun(t, "export", src, out)
		require.NotZero(t, code)
		require.Contains(t, stderr, bad+" is 10 bytes, but its dtype F32 and shape [2,2] need 16")
		require.Contains(t, stderr, "was not written")
		ents, err := os.ReadDir(filepath.Dir(out))
		require.NoError(t, err)
		require.Empty(t, ents, "no output or temporary file in %s", filepath.Dir(out))
	}
	d.requireClean()
}

// TestSafetensorsExportPlainFiles: files with no dtype/shape export as U8 of
// their size; a tensorfs file sized by writes exports with the shape tensorfs
// gave it; the export imports back.
func TestSafetensorsExportPlainFiles(t *testing.T) {
	d := startDaemon(t)
	src := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "raw.bin"), []byte("0123456"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(src, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src, "sub", "zero"), nil, 0o644))
	out := d.path("plain.safetensors")
	_, stderr, code := stRun(t, "export", src, out)
	require.Zero(t, code, stderr)
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	h := stParse(t, raw)
	require.Len(t, h.Tensors, 2)
	require.Equal(t, safetensors.Tensor{Name: "raw.bin", DType: "U8", Shape: dtype.Shape{7}, Begin: 0, End: 7}, h.Tensors[0])
	require.Equal(t, safetensors.Tensor{Name: "sub/zero", DType: "U8", Shape: dtype.Shape{0}, Begin: 7, End: 7}, h.Tensors[1])
	require.Nil(t, h.Metadata)
	require.Equal(t, "0123456", string(stData(raw, h, h.Tensors[0])))

	// A file written through the mount: tensorfs sizes it as U8 by itself.
	written := d.path("written")
	require.NoError(t, os.Mkdir(written, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(written, "w"), []byte("abc"), 0o644))
	stdout, stderr, code := stRun(t, "export", written, "-")
	require.Zero(t, code, stderr)
	hw := stParse(t, stdout)
	require.Equal(t, "abc", string(stData(stdout, hw, hw.Tensors[0])))
	require.NoError(t, os.RemoveAll(written))

	stRoundTrip(t, d, out, raw, d.path("plain"))
	require.NoError(t, os.Remove(out))
	d.requireClean()
}

// dataSize is the length of the data region h's tensors describe: the
// largest End (0 with no tensors).
func dataSize(h *safetensors.Header) int64 {
	var n int64
	for _, t := range h.Tensors {
		n = max(n, t.End)
	}
	return n
}
