package main

// import and export are clients of a mounted tensorfs: they move bytes with
// ordinary file I/O and describe tensors with xattrs, exactly as a script or a
// program in another language would, so they exercise the same interface users
// do. Package tensor is used only for its pure dtype/shape vocabulary (the
// names the xattrs carry), never for its store.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/dtype"
	"github.com/tensorfs/tensorfs/safetensors"
	"github.com/tensorfs/tensorfs/xattrs"
)

const (
	// xattrSTMetadata holds a file's __metadata__ as a JSON object on the
	// imported directory. It is an ordinary user attribute, not a tensorfs
	// one, so it survives any copy tool that keeps xattrs.
	xattrSTMetadata = "user.safetensors.metadata"
	// stChunk is the size of each read and write: large enough that FUSE
	// round trips do not dominate, small enough to keep memory flat.
	stChunk = 1 << 20
	// stNameMax is Linux's NAME_MAX: the longest path component, in bytes.
	stNameMax = 255
	// stXattrMax is the largest xattr value Linux (and tensorfs) keeps.
	stXattrMax = 64 << 10
	// fuseSuperMagic is statfs's f_type for every FUSE mount.
	fuseSuperMagic = 0x65735546
)

// stSummary counts what an import or export moved.
type stSummary struct {
	tensors int
	bytes   int64
}

func (s stSummary) String() string {
	noun := "tensors"
	if s.tensors == 1 {
		noun = "tensor"
	}
	return fmt.Sprintf("%d %s, %s bytes (%s)", s.tensors, noun, humanize.Comma(s.bytes), humanize.IBytes(uint64(s.bytes)))
}

func newImportCmd() *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:   "import FILE.safetensors DIR",
		Short: "Load a safetensors file into DIR on a tensorfs mount, one tensor file per entry",
		Long: `Load a safetensors file into DIR, which must be on a tensorfs mount and must
be new or empty. Each tensor becomes a file with its dtype and shape set (so it
is allocated and registered at its exact size) and its bytes written; a name
with '/' becomes subdirectories. The file's __metadata__, if any, is kept as
JSON in the user.safetensors.metadata xattr of DIR.

The header is validated before anything is created. If the import fails part
way, the tensors already imported are left in place, the error says how many,
and the exit status is non-zero.`,
		Args: positional(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sum, err := importSafetensors(ctx, args[0], args[1])
			if err != nil {
				return err
			}
			if !quiet {
				fmt.Fprintf(cmd.ErrOrStderr(), "imported %v from %s into %s\n", sum, args[0], args[1])
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print no summary line")
	return cmd
}

func newExportCmd() *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:   "export DIR FILE.safetensors",
		Short: "Write every tensor under DIR to a safetensors file (- for stdout)",
		Long: `Write every regular file under DIR, recursively, as one safetensors file.
Tensor names are paths relative to DIR with '/' separators, in sorted order;
dtype and shape come from each file's user.tensorfs.dtype and
user.tensorfs.shape (a file without a shape is 1-D: its size in elements of its
dtype, U8 when it has none). A file whose size disagrees with its dtype and
shape fails the export. DIR's user.safetensors.metadata, when present, becomes
__metadata__.

FILE is written under a temporary name next to it and renamed into place only
when complete, so a failed export leaves no FILE behind. FILE "-" is stdout.`,
		Args: positional(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sum, err := exportSafetensors(ctx, args[0], args[1], cmd.OutOrStdout())
			if err != nil {
				return err
			}
			if !quiet {
				to := args[1]
				if to == "-" {
					to = "stdout"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "exported %v from %s to %s\n", sum, args[0], to)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print no summary line")
	return cmd
}

// importSafetensors loads src into dir (see newImportCmd).
func importSafetensors(ctx context.Context, src, dir string) (stSummary, error) {
	var sum stSummary
	f, err := os.Open(src)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return sum, err
	}
	if !fi.Mode().IsRegular() {
		return sum, fmt.Errorf("%s is not a regular file", src)
	}
	h, err := safetensors.ReadHeader(f, fi.Size())
	if err != nil {
		return sum, fmt.Errorf("%s: %w", src, err)
	}
	if err := checkImportNames(h.Tensors); err != nil {
		return sum, fmt.Errorf("%s: %w; nothing was imported", src, err)
	}
	var md []byte
	if h.Metadata != nil {
		if md, err = marshalMetadata(h.Metadata); err != nil {
			return sum, err
		}
		if len(md) > stXattrMax {
			return sum, fmt.Errorf("%s: __metadata__ is %d bytes of JSON, more than the %d an xattr holds; nothing was imported", src, len(md), stXattrMax)
		}
	}
	if err := prepareImportDir(dir); err != nil {
		return sum, err
	}

	stopped := func(err error) error {
		return fmt.Errorf("import into %s stopped after %d of %d tensors (%s bytes), which are left in place: %w",
			dir, sum.tensors, len(h.Tensors), humanize.Comma(sum.bytes), err)
	}
	if md != nil {
		if err := unix.Setxattr(dir, xattrSTMetadata, md, 0); err != nil {
			return sum, stopped(fmt.Errorf("setting %s on %s: %w", xattrSTMetadata, dir, err))
		}
	}
	buf := make([]byte, stChunk)
	made := map[string]bool{}
	for _, t := range h.Tensors {
		if err := importTensor(ctx, f, h.DataOffset, t, dir, made, buf); err != nil {
			return sum, stopped(fmt.Errorf("tensor %q: %w", t.Name, err))
		}
		sum.tensors++
		sum.bytes += t.Size()
	}
	return sum, nil
}

// checkImportNames refuses names that cannot be paths under the import
// directory, or that would escape or alias it, and names that need one path
// to be both a file and a directory ("a" and "a/b").
func checkImportNames(ts []safetensors.Tensor) error {
	files := make(map[string]bool, len(ts))
	for _, t := range ts {
		if err := checkImportName(t.Name); err != nil {
			return err
		}
		files[t.Name] = true
	}
	for _, t := range ts {
		for i := range len(t.Name) {
			if t.Name[i] == '/' && files[t.Name[:i]] {
				return fmt.Errorf("tensor %q needs %q to be a directory, but that is also a tensor", t.Name, t.Name[:i])
			}
		}
	}
	return nil
}

func checkImportName(name string) error {
	switch {
	case name == "":
		return errors.New("a tensor has an empty name, which cannot be a file name")
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("tensor name %q contains a NUL byte, which cannot be in a file name", name)
	}
	for _, c := range strings.Split(name, "/") {
		switch {
		case c == "":
			return fmt.Errorf("tensor name %q has an empty path component (a leading, trailing or doubled '/')", name)
		case c == "." || c == "..":
			return fmt.Errorf("tensor name %q has a %q path component, which would alias or leave its directory", name, c)
		case len(c) > stNameMax:
			return fmt.Errorf("tensor name %q has a path component of %d bytes; a file name is at most %d", name, len(c), stNameMax)
		}
	}
	return nil
}

// marshalMetadata is the JSON kept in xattrSTMetadata: an object with sorted
// keys, without HTML escaping so that it reads as written.
func marshalMetadata(md map[string]string) ([]byte, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(md); err != nil {
		return nil, err
	}
	return []byte(strings.TrimSuffix(b.String(), "\n")), nil
}

// prepareImportDir creates dir, or accepts an existing empty directory, after
// checking that it is on a FUSE mount (a tensorfs one, as far as statfs can
// tell; importTensor checks the rest).
func prepareImportDir(dir string) error {
	fi, err := os.Stat(dir)
	exists := err == nil
	if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return err
	}
	where := dir
	if !exists {
		where = filepath.Dir(dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(where, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", where, err)
	}
	if st.Type != fuseSuperMagic {
		return fmt.Errorf("%s is not on a tensorfs mount (filesystem type %#x); mount one with `tensorfs mount`", where, st.Type)
	}
	if !exists {
		if err := os.Mkdir(dir, 0o777); err != nil {
			return err
		}
		return stripShapeTemplate(dir)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s exists and is not a directory", dir)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(1)
	d.Close()
	if err != nil && err != io.EOF {
		return err
	}
	if len(names) > 0 {
		return fmt.Errorf("refusing to import into %s: it is not empty (it holds %q); import into a new or empty directory", dir, names[0])
	}
	if v, ok, err := getxattrString(func(b []byte) (int, error) { return unix.Getxattr(dir, xattrs.Shape, b) }); err != nil {
		return fmt.Errorf("reading %s of %s: %w", xattrs.Shape, dir, err)
	} else if ok {
		return fmt.Errorf("refusing to import into %s: it has a shape template (%s=%q) that would size every file created in it; remove it (setfattr -x %s %s) or import into a new directory", dir, xattrs.Shape, v, xattrs.Shape, dir)
	}
	return nil
}

// stripShapeTemplate removes the shape template a new directory inherits
// from its parent: with one, every file created in it would be allocated at
// the template's size before import could set its own dtype and shape.
func stripShapeTemplate(dir string) error {
	if err := unix.Removexattr(dir, xattrs.Shape); err != nil && !errors.Is(err, unix.ENODATA) {
		return fmt.Errorf("removing the inherited shape template of %s: %w", dir, err)
	}
	return nil
}

// importTensor creates one tensor file: dtype first, then shape (which
// allocates exactly its bytes), then the data in stChunk pwrites. On failure
// the incomplete file is removed, so every file left is a whole tensor. made
// records the directories created so far.
func importTensor(ctx context.Context, src io.ReaderAt, dataOffset int64, t safetensors.Tensor, dir string, made map[string]bool, buf []byte) (err error) {
	parts := strings.Split(t.Name, "/")
	for i := 1; i < len(parts); i++ {
		p := filepath.Join(dir, filepath.Join(parts[:i]...))
		if made[p] {
			continue
		}
		if err := os.Mkdir(p, 0o777); err != nil {
			return err
		}
		if err := stripShapeTemplate(p); err != nil {
			return err
		}
		made[p] = true
	}
	path := filepath.Join(dir, filepath.FromSlash(t.Name))
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			out.Close()
			if rmErr := os.Remove(path); rmErr == nil {
				err = fmt.Errorf("%w (the incomplete file was removed)", err)
			}
		}
	}()
	fd := int(out.Fd())
	if err := unix.Fsetxattr(fd, xattrs.DType, []byte(t.DType), 0); err != nil {
		return fmt.Errorf("setting %s=%s: %w", xattrs.DType, t.DType, err)
	}
	shape := t.Shape.String()
	if err := unix.Fsetxattr(fd, xattrs.Shape, []byte(shape), 0); err != nil {
		return fmt.Errorf("setting %s=%q (allocating %s bytes): %w", xattrs.Shape, shape, humanize.Comma(t.Size()), err)
	}
	fi, err := out.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != t.Size() {
		return fmt.Errorf("setting its shape made it %d bytes, not %d: is %s a tensorfs mount?", fi.Size(), t.Size(), dir)
	}
	for off := int64(0); off < t.Size(); {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted after %d of %d bytes", off, t.Size())
		}
		k := min(int64(len(buf)), t.Size()-off)
		if n, err := src.ReadAt(buf[:k], dataOffset+t.Begin+off); int64(n) != k {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("reading the source at %d: %w", dataOffset+t.Begin+off, err)
		}
		// WriteAt is pwrite, repeated until the chunk is written.
		if _, err := out.WriteAt(buf[:k], off); err != nil {
			return err
		}
		off += k
	}
	return out.Close()
}

// stEntry is one file that export writes.
type stEntry struct {
	path string
	t    safetensors.Tensor
}

// exportSafetensors writes every tensor under dir to dst, or to stdout when
// dst is "-" (see newExportCmd).
func exportSafetensors(ctx context.Context, dir, dst string, stdout io.Writer) (stSummary, error) {
	if dst != "-" {
		if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
			return stSummary{}, fmt.Errorf("export %s: %s is a directory; name the file to write", dir, dst)
		}
	}
	sum, err := exportTo(ctx, dir, dst, stdout)
	if err != nil {
		if dst != "-" {
			return stSummary{}, fmt.Errorf("export %s: %w (%s was not written)", dir, err, dst)
		}
		return sum, fmt.Errorf("export %s to stdout failed after %d tensors: %w", dir, sum.tensors, err)
	}
	return sum, nil
}

func exportTo(ctx context.Context, dir, dst string, stdout io.Writer) (stSummary, error) {
	var sum stSummary
	fi, err := os.Stat(dir)
	if err != nil {
		return sum, err
	}
	if !fi.IsDir() {
		return sum, fmt.Errorf("%s is not a directory", dir)
	}
	entries, err := collectTensors(dir)
	if err != nil {
		return sum, err
	}
	md, err := readMetadata(dir)
	if err != nil {
		return sum, err
	}
	ts := make([]safetensors.Tensor, len(entries))
	byName := make(map[string]string, len(entries))
	for i, e := range entries {
		ts[i] = e.t
		byName[e.t.Name] = e.path
	}
	h, err := safetensors.NewHeader(ts, md)
	if err != nil {
		return sum, err
	}
	enc, err := h.Encode()
	if err != nil {
		return sum, err
	}
	write := func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, stChunk)
		if _, err := bw.Write(enc); err != nil {
			return err
		}
		buf := make([]byte, stChunk)
		for _, t := range h.Tensors {
			if err := copyTensorFile(ctx, bw, byName[t.Name], t.Size(), buf); err != nil {
				return err
			}
			sum.tensors++
			sum.bytes += t.Size()
		}
		return bw.Flush()
	}
	if dst == "-" {
		return sum, write(stdout)
	}
	return sum, writeAtomically(dst, write)
}

// collectTensors walks dir and describes every regular file under it, sorted
// by name, checking that each file's size agrees with its dtype and shape.
func collectTensors(dir string) ([]stEntry, error) {
	var entries []stEntry
	err := filepath.WalkDir(dir, func(path string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is neither a regular file nor a directory", path)
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		t, err := describeTensorFile(path)
		if err != nil {
			return err
		}
		t.Name = filepath.ToSlash(rel)
		entries = append(entries, stEntry{path: path, t: t})
		return nil
	})
	if err != nil {
		return nil, err
	}
	// WalkDir's order puts "a/b" before "a.b"; the header wants byte order.
	sort.Slice(entries, func(i, j int) bool { return entries[i].t.Name < entries[j].t.Name })
	return entries, nil
}

// describeTensorFile reads a file's dtype and shape xattrs and checks them
// against its size. A file with no shape (never sized by shape, or not on
// tensorfs) is 1-D: its size in elements of its dtype, U8 when it has none.
func describeTensorFile(path string) (safetensors.Tensor, error) {
	var t safetensors.Tensor
	f, err := os.Open(path)
	if err != nil {
		return t, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return t, err
	}
	fd := int(f.Fd())
	ds, hasDType, err := getxattrString(func(b []byte) (int, error) { return unix.Fgetxattr(fd, xattrs.DType, b) })
	if err != nil {
		return t, fmt.Errorf("%s: reading %s: %w", path, xattrs.DType, err)
	}
	ss, hasShape, err := getxattrString(func(b []byte) (int, error) { return unix.Fgetxattr(fd, xattrs.Shape, b) })
	if err != nil {
		return t, fmt.Errorf("%s: reading %s: %w", path, xattrs.Shape, err)
	}
	t.DType = "U8"
	if hasDType {
		if t.DType, err = dtype.Parse(ds); err != nil {
			return t, fmt.Errorf("%s: %s: %w", path, xattrs.DType, err)
		}
	}
	size := fi.Size()
	if hasShape {
		if t.Shape, err = dtype.ParseShape(ss); err != nil {
			return t, fmt.Errorf("%s: %s: %w", path, xattrs.Shape, err)
		}
	} else {
		bits := int64(t.DType.Bits())
		if size > (1<<62)/8 || size*8%bits != 0 {
			return t, fmt.Errorf("%s: %d bytes with no shape is not a whole number of %s elements", path, size, t.DType)
		}
		t.Shape = dtype.Shape{size * 8 / bits}
	}
	nb, err := dtype.NBytes(t.DType, t.Shape)
	if err != nil {
		return t, fmt.Errorf("%s: %w", path, err)
	}
	if nb != size {
		return t, fmt.Errorf("%s is %d bytes, but its dtype %s and shape [%s] need %d", path, size, t.DType, t.Shape, nb)
	}
	t.End = size
	return t, nil
}

// readMetadata reads xattrSTMetadata of dir: nil when absent.
func readMetadata(dir string) (map[string]string, error) {
	v, ok, err := getxattrString(func(b []byte) (int, error) { return unix.Getxattr(dir, xattrSTMetadata, b) })
	if err != nil {
		return nil, fmt.Errorf("reading %s of %s: %w", xattrSTMetadata, dir, err)
	}
	if !ok {
		return nil, nil
	}
	var md map[string]string
	if err := json.Unmarshal([]byte(v), &md); err != nil || md == nil {
		return nil, fmt.Errorf("%s of %s is not a JSON object of strings (%v); fix or remove it", xattrSTMetadata, dir, err)
	}
	return md, nil
}

// getxattrString reads an xattr through get (a Getxattr or Fgetxattr call):
// a size probe, then the read, again if the value grew in between. ok is
// false when the attribute does not exist (ENODATA).
func getxattrString(get func(dest []byte) (int, error)) (v string, ok bool, err error) {
	for {
		n, err := get(nil)
		if errors.Is(err, unix.ENODATA) {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		buf := make([]byte, n)
		n, err = get(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if errors.Is(err, unix.ENODATA) {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		return string(buf[:n]), true, nil
	}
}

// copyTensorFile appends the size bytes of the file at path to w, failing if
// the file's size changed since it was described.
func copyTensorFile(ctx context.Context, w io.Writer, path string, size int64, buf []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return errors.New("interrupted")
		}
		k := min(int64(len(buf)), size-off)
		n, err := f.ReadAt(buf[:k], off)
		if int64(n) != k {
			if err == nil || err == io.EOF {
				return fmt.Errorf("%s shrank below %d bytes during the export", path, size)
			}
			return err
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		off += k
	}
	if fi, err := f.Stat(); err != nil {
		return err
	} else if fi.Size() != size {
		return fmt.Errorf("%s changed size during the export (%d bytes, was %d)", path, fi.Size(), size)
	}
	return nil
}

// writeAtomically writes dst through a temporary file in the same directory,
// synced and renamed into place only when write succeeds; on any failure the
// temporary file is removed and dst is untouched.
func writeAtomically(dst string, write func(io.Writer) error) (err error) {
	var tmp *os.File
	var tmpPath string
	for range 10 {
		var r [6]byte
		if _, err := rand.Read(r[:]); err != nil {
			return err
		}
		tmpPath = filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-"+hex.EncodeToString(r[:]))
		// Not os.CreateTemp: its 0600 would survive the rename; 0666 lets
		// the umask decide, as for any new file.
		tmp, err = os.OpenFile(tmpPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
		if !errors.Is(err, iofs.ErrExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmpPath)
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmpPath, dst)
}
