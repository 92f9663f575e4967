package main

// ls and stat read a mount the way any user who can see it can: its
// directory entries and each entry's user.tensorfs. xattrs (no socket, no
// daemon API), so they work for whoever may read the files, and agree with
// getfattr by construction.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/tensorfs/tensorfs/xattrs"
)

// entryInfo is one tensor or directory as ls and stat report it (their
// --json objects). Fields the file does not have yet are absent: an
// unallocated tensor has no mr_id, ipc_id or ipc_offset.
type entryInfo struct {
	// Name is the entry's base name ("/" for a mount's root).
	Name string `json:"name"`
	// Path is the entry's path inside its mount, from its root ("/kv/b0").
	Path string `json:"path"`
	// Type is "tensor" (a file) or "dir".
	Type string `json:"type"`
	// DType, Shape and Device of a tensor; Shape is [] for a scalar and
	// absent when not set (an empty file).
	DType  string  `json:"dtype,omitempty"`
	Shape  []int64 `json:"shape,omitzero"`
	Device string  `json:"device,omitempty"`
	// NBytes is a tensor's size in bytes.
	NBytes *int64 `json:"nbytes,omitempty"`
	// MRID, IPCID, IPCOffset: the registration, once allocated.
	MRID      *uint64 `json:"mr_id,omitempty"`
	IPCID     *uint64 `json:"ipc_id,omitempty"`
	IPCOffset *int64  `json:"ipc_offset,omitempty"`
	// Generation counts the tensor's reallocations.
	Generation *uint64 `json:"generation,omitempty"`
	// Template is a directory's template (what files created in it get),
	// nil when it has none.
	Template *template `json:"template,omitempty"`
}

// template is a directory's dtype/shape/device template.
type template struct {
	DType  string  `json:"dtype,omitempty"`
	Shape  []int64 `json:"shape,omitzero"`
	Device string  `json:"device,omitempty"`
}

// scalarShape is a scalar's shape: non-nil, so that it marshals as []
// where a nil shape is omitted (omitzero): a scalar's shape is known and
// empty, which is not the same as no shape at all.
var scalarShape = []int64{}

func newLsCmd() *cobra.Command {
	var long, asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [-l] PATH",
		Short: "List the tensors and directories at PATH on a tensorfs mount",
		Long: `List the entries of the directory PATH (or PATH itself when it is a tensor),
which must be on a tensorfs mount, sorted by name; directories end in '/'.

-l adds a table: TYPE (tensor or dir), DTYPE, SHAPE, NBYTES and DEVICE, read
from each entry's user.tensorfs. xattrs; for a directory the dtype, shape and
device columns are its template (what a file created there gets), '-' when
unset. --json prints a JSON array of {name, path, type, dtype, shape, nbytes,
device, mr_id, ipc_id, ipc_offset, generation, template}, with or without -l;
a field the entry does not have is absent (shape [] is a scalar).`,
		Args: positional(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ents, err := listEntries(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), ents)
			}
			writeLs(cmd.OutOrStdout(), ents, long)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "show dtype, shape, nbytes and device")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newStatCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stat PATH",
		Short: "Show a tensor's dtype, shape, nbytes, device and registration (mr_id, ipc_id, ...)",
		Long: `Show what the user.tensorfs. xattrs of PATH, a tensor or directory on a
tensorfs mount, say: for a tensor its dtype, shape, nbytes, device, mr_id,
ipc_id, ipc_offset and generation ('-' for what it has not got yet: an
unallocated tensor has no mr_id); for a directory its template. The
ipc_handle (a capability) is not printed: read it with getfattr when you
mean to map the memory. --json prints the object ls --json lists.`,
		Args: positional(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			loc, err := locate("stat", args[0])
			if err != nil {
				return err
			}
			e, err := readEntry(loc.abs, loc.rel)
			if err != nil {
				return fmt.Errorf("stat %s: %v", args[0], errText(err))
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), e)
			}
			writeStat(cmd.OutOrStdout(), e)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// location is a path resolved onto its tensorfs mount.
type location struct {
	abs string // the path, absolute, symlinks resolved
	mnt string // the tensorfs mountpoint it is on
	rel string // its path inside the mount, from "/"
}

// locate resolves arg onto the tensorfs mount it is on. Errors, each one
// line naming the command: arg does not exist, or is on another
// filesystem (which one, and where it is mounted, so a user who typed the
// mountpoint of a mount that is not up yet sees that it is not).
func locate(op, arg string) (location, error) {
	abs, err := filepath.Abs(arg)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return location{}, fmt.Errorf("%s %s: %s", op, arg, errText(unwrapPath(err)))
	}
	ms, err := readMounts()
	if err != nil {
		return location{}, fmt.Errorf("%s %s: reading the mount table: %v", op, arg, err)
	}
	mp, fstype := mountOf(ms, abs)
	if fstype != cpFSType {
		return location{}, fmt.Errorf("%s %s: not on a tensorfs mount (it is on %s, a %s filesystem)", op, arg, mp, fstype)
	}
	return location{abs: abs, mnt: mp, rel: "/" + strings.TrimPrefix(strings.TrimPrefix(abs, mp), "/")}, nil
}

// unwrapPath is a PathError's errno, whose text alone reads well after the
// path that the caller's line already names.
func unwrapPath(err error) error {
	var pe *iofs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// listEntries is ls: the entries of the directory at arg, or arg itself
// when it is a tensor. An entry removed between the listing and its
// xattrs' reading is left out (it is gone).
func listEntries(arg string) ([]entryInfo, error) {
	loc, err := locate("ls", arg)
	if err != nil {
		return nil, err
	}
	self, err := readEntry(loc.abs, loc.rel)
	if err != nil {
		return nil, fmt.Errorf("ls %s: %s", arg, errText(err))
	}
	if self.Type != "dir" {
		return []entryInfo{self}, nil
	}
	des, err := os.ReadDir(loc.abs)
	if err != nil {
		return nil, fmt.Errorf("ls %s: %s", arg, errText(unwrapPath(err)))
	}
	ents := make([]entryInfo, 0, len(des))
	for _, de := range des {
		e, err := readEntry(filepath.Join(loc.abs, de.Name()), pathJoin(loc.rel, de.Name()))
		if errors.Is(err, syscall.ENOENT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("ls %s: %s: %s", arg, de.Name(), errText(err))
		}
		ents = append(ents, e)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
	return ents, nil
}

func pathJoin(dir, name string) string {
	if dir == "/" {
		return "/" + name
	}
	return dir + "/" + name
}

// readEntry reads the entry at abs (rel inside its mount): its kind from
// lstat, the rest from its xattrs; an attribute that is absent (ENODATA)
// is left out.
func readEntry(abs, rel string) (entryInfo, error) {
	e := entryInfo{Name: filepath.Base(rel), Path: rel}
	var st unix.Stat_t
	if err := unix.Lstat(abs, &st); err != nil {
		return e, err
	}
	get := func(name string) (string, bool, error) {
		return getxattrString(func(b []byte) (int, error) { return unix.Lgetxattr(abs, name, b) })
	}
	var firstErr error
	str := func(name string) string {
		v, _, err := get(name)
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", name, err)
		}
		return v
	}
	shape := func() []int64 {
		v, ok, err := get(xattrs.Shape)
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", xattrs.Shape, err)
		}
		if !ok {
			return nil
		}
		dims, err := parseShape(v)
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("%s %q: %w", xattrs.Shape, v, err)
		}
		return dims
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		e.Type = "dir"
		t := template{DType: str(xattrs.DType), Shape: shape(), Device: str(xattrs.Device)}
		if t.DType != "" || t.Shape != nil || t.Device != "" {
			e.Template = &t
		}
		return e, firstErr
	}
	e.Type = "tensor"
	e.DType, e.Shape, e.Device = str(xattrs.DType), shape(), str(xattrs.Device)
	num := func(name string) *int64 {
		v, ok, err := get(name)
		if err == nil && ok {
			n, perr := strconv.ParseInt(v, 10, 64)
			if perr == nil {
				return &n
			}
			err = perr
		}
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	unum := func(name string) *uint64 {
		n := num(name)
		if n == nil {
			return nil
		}
		u := uint64(*n)
		return &u
	}
	e.NBytes, e.IPCOffset = num(xattrs.NBytes), num(xattrs.IPCOffset)
	e.MRID, e.IPCID, e.Generation = unum(xattrs.MRID), unum(xattrs.IPCID), unum(xattrs.Generation)
	return e, firstErr
}

// parseShape parses the shape xattr ("16,8,128"; "" is a scalar).
func parseShape(v string) ([]int64, error) {
	if strings.TrimSpace(v) == "" {
		return scalarShape, nil
	}
	parts := strings.Split(v, ",")
	dims := make([]int64, len(parts))
	for i, p := range parts {
		n, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
		if err != nil {
			return nil, err
		}
		dims[i] = n
	}
	return dims, nil
}

// shapeText is a shape as the xattr writes it, "[]" for a scalar and "-"
// when unset.
func shapeText(s []int64) string {
	if s == nil {
		return "-"
	}
	if len(s) == 0 {
		return "[]"
	}
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return strings.Join(parts, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func intText[T int64 | uint64](p *T) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

// shown is a name (or path) as the human output prints it: as it is when
// it is printable UTF-8, else Go-quoted, so that a name holding a newline,
// a tab or a terminal escape (anyone who can write to the mount can make
// one) cannot split a row or reach the reader's terminal.
func shown(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) }) {
		return s
	}
	return strconv.Quote(s)
}

// writeLs prints ls's text: names, or with long a table.
func writeLs(w io.Writer, ents []entryInfo, long bool) {
	if !long {
		for _, e := range ents {
			name := shown(e.Name)
			if e.Type == "dir" {
				name += "/"
			}
			fmt.Fprintln(w, name)
		}
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tDTYPE\tSHAPE\tNBYTES\tDEVICE\tNAME")
	for _, e := range ents {
		dtype, shape, device, name := e.DType, e.Shape, e.Device, shown(e.Name)
		if e.Type == "dir" {
			name += "/"
			dtype, shape, device = "", nil, ""
			if t := e.Template; t != nil {
				dtype, shape, device = t.DType, t.Shape, t.Device
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Type, orDash(dtype), shapeText(shape), intText(e.NBytes), orDash(device), name)
	}
	tw.Flush()
}

// writeStat prints stat's text: one "name: value" line per attribute.
func writeStat(w io.Writer, e entryInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "path:\t%s\n", shown(e.Path))
	fmt.Fprintf(tw, "type:\t%s\n", e.Type)
	if e.Type == "dir" {
		t := template{}
		if e.Template != nil {
			t = *e.Template
		}
		fmt.Fprintf(tw, "template dtype:\t%s\n", orDash(t.DType))
		fmt.Fprintf(tw, "template shape:\t%s\n", shapeText(t.Shape))
		fmt.Fprintf(tw, "template device:\t%s\n", orDash(t.Device))
		tw.Flush()
		return
	}
	nbytes := intText(e.NBytes)
	if e.NBytes != nil && *e.NBytes >= 1024 {
		nbytes += " (" + humanize.IBytes(uint64(*e.NBytes)) + ")"
	}
	fmt.Fprintf(tw, "dtype:\t%s\n", orDash(e.DType))
	fmt.Fprintf(tw, "shape:\t%s\n", shapeText(e.Shape))
	fmt.Fprintf(tw, "nbytes:\t%s\n", nbytes)
	fmt.Fprintf(tw, "device:\t%s\n", orDash(e.Device))
	fmt.Fprintf(tw, "mr_id:\t%s\n", intText(e.MRID))
	fmt.Fprintf(tw, "ipc_id:\t%s\n", intText(e.IPCID))
	fmt.Fprintf(tw, "ipc_offset:\t%s\n", intText(e.IPCOffset))
	fmt.Fprintf(tw, "generation:\t%s\n", intText(e.Generation))
	tw.Flush()
}

// writeJSON prints v as indented JSON, the --json output of every command.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
