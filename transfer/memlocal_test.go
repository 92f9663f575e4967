package transfer

import (
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// memTensor is one tensor of a memLocal: its metadata (Rel unused) and bytes.
type memTensor struct {
	meta Meta
	data []byte
}

// memLocal is an in-memory Local: a map of absolute mount path -> tensor.
// Directories are implied by the paths of the tensors below them, plus
// those made explicitly (mkdir, or created by a directory copy). The root
// "/" always exists.
//
// It counts what it hands out so tests can check that nothing leaks: open
// sources, open (neither committed nor aborted) destinations, commits and
// aborts, and misuse (double close, write after commit, writes outside a
// tensor).
type memLocal struct {
	mu    sync.Mutex
	files map[string]*memTensor
	dirs  map[string]bool

	// maxBytes caps the bytes one Put may prepare (ENOSPC past it); 0 means
	// 1 GiB. It keeps hostile or fuzzed sizes from exhausting memory.
	maxBytes int64
	// sink makes destinations count bytes instead of storing them: for
	// large transfers where only the outcome matters. A committed sink
	// tensor holds no data (nil) but its Meta.
	sink bool
	// commitDelay makes every Commit take this long (a large tree's renames).
	commitDelay time.Duration
	// inPlace lets destinations take chunks straight into their memory
	// (WriteInPlace), as host tensors do; otherwise they take WriteAt only,
	// as GPU tensors do.
	inPlace  bool
	inPlaces int64 // chunks written in place
	// inFill counts the in-place fills running now: each holds the
	// destination (a real tensor's lock).
	inFill atomic.Int32
	// batch: its dests take WriteBatch (else they decline it, and the
	// chunks come one by one); batches counts the batches taken.
	batch   bool
	batches int64
	// hostMem: its sources offer their bytes as host memory (RMASource),
	// as host tensors do; reads counts the bytes read through ReadAt.
	hostMem bool
	reads   atomic.Int64

	// Hooks, called without mu held.
	onWrite func(i int, off int64, n int) error // before each Dest.WriteAt
	onRead  func(rel string, off int64) error   // before each Source.ReadAt

	openSrcs   int // sources handed out by Get and not closed yet
	srcsOpened int
	openDests  int // destinations neither committed nor aborted
	commits    int
	aborts     int
	misuse     []string // double closes, writes after the end, ...
	writes     int64    // bytes written through Dest.WriteAt
	gets, puts []string // paths asked for, in order
	badWrites  int      // WriteAt calls outside a tensor
}

func newMemLocal() *memLocal {
	return &memLocal{files: map[string]*memTensor{}, dirs: map[string]bool{"/": true}}
}

func join(dir, rel string) string {
	if rel == "" {
		return dir
	}
	if dir == "/" {
		return "/" + rel
	}
	return dir + "/" + rel
}

// isDirLocked says whether p is a directory: the root, an explicit one, or
// a prefix of some tensor's path.
func (l *memLocal) isDirLocked(p string) bool {
	if p == "/" || l.dirs[p] {
		return true
	}
	prefix := p + "/"
	for f := range l.files {
		if strings.HasPrefix(f, prefix) {
			return true
		}
	}
	return false
}

// mkdirAllLocked makes p and its parents explicit directories; ENOTDIR when
// one of them is a tensor.
func (l *memLocal) mkdirAllLocked(p string) error {
	for q := p; q != "/"; q = path.Dir(q) {
		if _, ok := l.files[q]; ok {
			return &Error{Errno: syscall.ENOTDIR, Msg: fmt.Sprintf("%s is a tensor", q)}
		}
	}
	for q := p; q != "/"; q = path.Dir(q) {
		l.dirs[q] = true
	}
	return nil
}

// put stores a tensor at p (test setup), making its parents.
func (l *memLocal) put(p string, data []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.mkdirAllLocked(path.Dir(p)); err != nil {
		panic(err)
	}
	l.files[p] = &memTensor{meta: Meta{DType: "U8", Shape: fmt.Sprint(len(data)), NBytes: int64(len(data))}, data: append([]byte(nil), data...)}
}

// mkdir makes an explicit directory (and its parents).
func (l *memLocal) mkdir(p string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.mkdirAllLocked(p); err != nil {
		panic(err)
	}
}

// get returns a copy of the tensor at p.
func (l *memLocal) get(p string) ([]byte, Meta, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.files[p]
	if !ok {
		return nil, Meta{}, false
	}
	return append([]byte(nil), t.data...), t.meta, true
}

// snapshot deep-copies every tensor, for "nothing changed" checks.
func (l *memLocal) snapshot() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]string, len(l.files))
	for p, t := range l.files {
		m[p] = fmt.Sprintf("%s|%s|%d|%s", t.meta.DType, t.meta.Shape, t.meta.NBytes, t.data)
	}
	return m
}

type memCounts struct {
	OpenSrcs, SrcsOpened, OpenDests, Commits, Aborts, BadWrites int
	Misuse                                                      []string
}

func (l *memLocal) counts() memCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return memCounts{l.openSrcs, l.srcsOpened, l.openDests, l.commits, l.aborts, l.badWrites, append([]string(nil), l.misuse...)}
}

// inPlaceChunks is inPlaces, read under the lock its writers hold (a
// copy's end reaches the test over a socket, which the race detector does
// not count as an ordering).
func (l *memLocal) inPlaceChunks() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inPlaces
}

func (l *memLocal) seen() (gets, puts []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.gets...), append([]string(nil), l.puts...)
}

// Get implements Local.
func (l *memLocal) Get(p string, r Range) ([]Source, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gets = append(l.gets, p+r.String())
	if t, ok := l.files[p]; ok {
		m, data := withRel(t.meta, ""), t.data
		if r.Set {
			n := int64(len(data)) - r.Off
			if r.HasLen {
				n = r.Len
			}
			if r.Off < 0 || r.Off > int64(len(data)) || n < 0 || n > int64(len(data))-r.Off {
				return nil, false, &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("range %s of %d bytes", r, len(data))}
			}
			data = data[r.Off : r.Off+n]
			m.NBytes, m.DType, m.Shape = n, "U8", fmt.Sprint(n)
		}
		l.openSrcs++
		l.srcsOpened++
		return []Source{l.source(m, data)}, false, nil
	}
	if r.Set {
		return nil, false, &Error{Errno: syscall.EINVAL, Msg: "a range on a directory"}
	}
	if !l.isDirLocked(p) {
		return nil, false, &Error{Errno: syscall.ENOENT, Msg: fmt.Sprintf("%s: no such tensor or directory", p)}
	}
	prefix := p + "/"
	if p == "/" {
		prefix = "/"
	}
	var names []string
	for f := range l.files {
		if strings.HasPrefix(f, prefix) {
			names = append(names, f)
		}
	}
	sort.Strings(names)
	srcs := make([]Source, 0, len(names))
	for _, f := range names {
		t := l.files[f]
		l.openSrcs++
		l.srcsOpened++
		srcs = append(srcs, l.source(withRel(t.meta, strings.TrimPrefix(f, prefix)), t.data))
	}
	return srcs, true, nil
}

// source is a Source of data (a tensor's bytes, or a range's): one that
// offers them as host memory when l is hostMem.
func (l *memLocal) source(m Meta, data []byte) Source {
	s := &memSource{l: l, meta: m, data: data}
	if l.hostMem {
		return &memHostSource{s}
	}
	return s
}

// memHostSource is a memSource whose bytes are offered as host memory
// (RMASource).
type memHostSource struct{ *memSource }

// RMAMemory implements RMASource: Mem starts at the range's first byte
// (a source without spans is addressed from Off, 0 here).
func (s *memHostSource) RMAMemory() (RMAMemory, bool) {
	return RMAMemory{Mem: s.data}, len(s.data) > 0
}

func withRel(m Meta, rel string) Meta {
	m.Rel = rel
	return m
}

// Put implements Local: the tensors are written into temporaries that
// Commit swaps in.
func (l *memLocal) Put(p string, isDir bool, metas []Meta) (Dest, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.puts = append(l.puts, p)
	max := l.maxBytes
	if max == 0 {
		max = 1 << 30
	}
	var total int64
	for _, m := range metas {
		if m.NBytes < 0 || m.NBytes > max-total {
			return nil, &Error{Errno: syscall.ENOSPC, Msg: fmt.Sprintf("%s: %d bytes do not fit", p, m.NBytes)}
		}
		total += m.NBytes
	}
	d := &memDest{l: l, root: p}
	if !isDir {
		if len(metas) != 1 {
			return nil, &Error{Errno: syscall.EINVAL, Msg: "a file copy needs one tensor"}
		}
		if l.isDirLocked(p) {
			return nil, &Error{Errno: syscall.EISDIR, Msg: fmt.Sprintf("%s is a directory", p)}
		}
		parent := path.Dir(p)
		if _, ok := l.files[parent]; ok {
			return nil, &Error{Errno: syscall.ENOTDIR, Msg: fmt.Sprintf("%s is a tensor", parent)}
		}
		if !l.isDirLocked(parent) {
			return nil, &Error{Errno: syscall.ENOENT, Msg: fmt.Sprintf("%s: no such directory", parent)}
		}
		d.paths = []string{p}
	} else {
		if _, ok := l.files[p]; ok {
			return nil, &Error{Errno: syscall.ENOTDIR, Msg: fmt.Sprintf("%s is a tensor", p)}
		}
		for _, m := range metas {
			q := join(p, m.Rel)
			if l.isDirLocked(q) {
				return nil, &Error{Errno: syscall.EISDIR, Msg: fmt.Sprintf("%s is a directory", q)}
			}
			d.paths = append(d.paths, q)
		}
	}
	d.metas = make([]Meta, len(metas))
	d.tmp = make([][]byte, len(metas))
	d.sinkN = make([]int64, len(metas))
	d.written = make([][][2]int64, len(metas))
	for i, m := range metas {
		d.metas[i] = withRel(m, "")
		if m.InPlace {
			// Into the tensor's own bytes, which stay its (Commit swaps
			// nothing in).
			t, ok := l.files[d.paths[i]]
			if !ok {
				return nil, &Error{Errno: syscall.ENOENT, Msg: fmt.Sprintf("%s: no such tensor", d.paths[i])}
			}
			if m.Off > int64(len(t.data))-m.NBytes || m.Exact && m.NBytes != int64(len(t.data)) {
				return nil, &Error{Errno: syscall.EINVAL, Msg: fmt.Sprintf("%s: [%d,+%d) outside %d bytes", d.paths[i], m.Off, m.NBytes, len(t.data))}
			}
			d.tmp[i] = t.data[m.Off : m.Off+m.NBytes]
			continue
		}
		if !l.sink {
			d.tmp[i] = make([]byte, m.NBytes)
		}
	}
	l.openDests++
	return d, nil
}

// memSource reads a tensor's bytes as they were at Get (a Commit swaps in
// new slices; it never writes into old ones).
type memSource struct {
	l      *memLocal
	meta   Meta
	data   []byte
	mu     sync.Mutex
	closed bool
}

func (s *memSource) Meta() Meta { return s.meta }

func (s *memSource) ReadAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		s.l.noteMisuse("ReadAt on a closed source " + s.meta.Rel)
		return 0, syscall.EBADF
	}
	if h := s.l.onRead; h != nil {
		if err := h(s.meta.Rel, off); err != nil {
			return 0, err
		}
	}
	if off < 0 || off > int64(len(s.data)) {
		return 0, syscall.EINVAL
	}
	s.l.reads.Add(int64(len(p)))
	n := copy(p, s.data[off:])
	if n < len(p) {
		return n, syscall.EIO
	}
	return n, nil
}

func (s *memSource) Close() {
	s.mu.Lock()
	already := s.closed
	s.closed = true
	s.mu.Unlock()
	if already {
		s.l.noteMisuse("double Close of source " + s.meta.Rel)
		return
	}
	s.l.mu.Lock()
	s.l.openSrcs--
	s.l.mu.Unlock()
}

func (l *memLocal) noteMisuse(s string) {
	l.mu.Lock()
	l.misuse = append(l.misuse, s)
	l.mu.Unlock()
}

// memDest holds a copy's tensors in temporaries until Commit.
type memDest struct {
	l     *memLocal
	root  string
	paths []string
	metas []Meta
	tmp   [][]byte
	sinkN []int64
	mu    sync.Mutex
	done  bool
	// written lists the [off, end) ranges written into each tensor, so
	// Commit can tell a tensor with holes or bytes written twice.
	written [][][2]int64
}

func (d *memDest) WriteAt(i int, p []byte, off int64) error {
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done {
		d.l.noteMisuse("WriteAt after Commit/Abort of " + d.root)
		return syscall.EBADF
	}
	if h := d.l.onWrite; h != nil {
		if err := h(i, off, len(p)); err != nil {
			return err
		}
	}
	// Overflow-safe bounds check: 0 <= off && off+len(p) <= NBytes.
	if i < 0 || i >= len(d.metas) || off < 0 || off > d.metas[i].NBytes-int64(len(p)) {
		d.l.mu.Lock()
		d.l.badWrites++
		d.l.mu.Unlock()
		return &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("memLocal: write [%d,+%d) outside tensor %d", off, len(p), i)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.written[i] = append(d.written[i], [2]int64{off, off + int64(len(p))})
	if d.l.sink {
		d.sinkN[i] += int64(len(p))
	} else {
		copy(d.tmp[i][off:], p)
	}
	d.l.mu.Lock()
	d.l.writes += int64(len(p))
	d.l.mu.Unlock()
	return nil
}

// WriteBatch implements BatchWriter when the local takes batches: each
// chunk as WriteAt would write it.
func (d *memDest) WriteBatch(data []byte, chunks []BatchChunk) (bool, error) {
	if !d.l.batch {
		return false, nil
	}
	for _, c := range chunks {
		if err := d.WriteAt(c.I, data[c.Pos:c.Pos+c.N], c.Off); err != nil {
			return true, err
		}
	}
	d.l.mu.Lock()
	d.l.batches++
	d.l.mu.Unlock()
	return true, nil
}

// WriteInPlace implements inPlaceDest when the local is inPlace: fill gets
// the temporary's bytes. The checks match WriteAt's; the range is recorded
// once (a second call on the same range reads it, for the CRC32C).
func (d *memDest) WriteInPlace(i int, off, n int64, fill func(iov [][]byte) (int64, error)) (bool, error) {
	if !d.l.inPlace || d.l.sink {
		return false, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		d.l.noteMisuse("WriteInPlace after Commit/Abort of " + d.root)
		return true, syscall.EBADF
	}
	if i < 0 || i >= len(d.metas) || off < 0 || n < 0 || off > d.metas[i].NBytes-n {
		d.l.mu.Lock()
		d.l.badWrites++
		d.l.mu.Unlock()
		return true, &Error{Errno: syscall.EIO, Msg: fmt.Sprintf("memLocal: in place [%d,+%d) outside tensor %d", off, n, i)}
	}
	d.l.inFill.Add(1)
	k, err := fill([][]byte{d.tmp[i][off : off+n]})
	d.l.inFill.Add(-1)
	// What fill wrote (a stream's read of what its socket held; all of it
	// for a check), once.
	if r := [2]int64{off, off + k}; k > 0 && !slices.Contains(d.written[i], r) {
		d.written[i] = append(d.written[i], r)
		d.l.mu.Lock()
		d.l.writes += k
		d.l.inPlaces++
		d.l.mu.Unlock()
	}
	return true, err
}

func (d *memDest) finish(what string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		d.l.noteMisuse(what + " after Commit/Abort of " + d.root)
		return false
	}
	d.done = true
	return true
}

func (d *memDest) Commit() (int, error) {
	if !d.finish("Commit") {
		return 0, syscall.EBADF
	}
	time.Sleep(d.l.commitDelay)
	for i, m := range d.metas {
		if msg := coverage(d.written[i], m.NBytes); msg != "" {
			d.l.noteMisuse(fmt.Sprintf("hole: Commit of %s: %s", d.paths[i], msg))
		}
	}
	l := d.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.openDests--
	l.commits++
	for i, p := range d.paths {
		if d.metas[i].InPlace {
			continue
		}
		if err := l.mkdirAllLocked(path.Dir(p)); err != nil {
			return i, err
		}
		l.files[p] = &memTensor{meta: d.metas[i], data: d.tmp[i]}
	}
	return len(d.paths), nil
}

func (d *memDest) Abort() {
	if !d.finish("Abort") {
		return
	}
	d.l.mu.Lock()
	d.l.openDests--
	d.l.aborts++
	d.l.mu.Unlock()
}

// coverage says what is wrong with ranges as a tiling of [0, n): "" when
// every byte was written exactly once.
func coverage(ranges [][2]int64, n int64) string {
	rs := append([][2]int64(nil), ranges...)
	sort.Slice(rs, func(a, b int) bool { return rs[a][0] < rs[b][0] })
	var at int64
	for _, r := range rs {
		if r[0] == r[1] {
			continue
		}
		if r[0] < at {
			return fmt.Sprintf("bytes [%d,%d) written twice", r[0], min(at, r[1]))
		}
		if r[0] > at {
			return fmt.Sprintf("bytes [%d,%d) never written", at, r[0])
		}
		at = r[1]
	}
	if at != n {
		return fmt.Sprintf("bytes [%d,%d) never written", at, n)
	}
	return ""
}
