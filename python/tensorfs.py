"""A Python client of a mounted tensorfs: tensors as files, copies as xattrs.

tensorfs exposes device memory (host or GPU) as files. This module drives a
mounted tensorfs through the same interface any program uses: files and
extended attributes (``user.tensorfs.*``). It needs only the standard
library; NumPy, CuPy and PyTorch are imported lazily, by the calls that
return their arrays.

    import tensorfs
    m = tensorfs.Mount("/mnt/a")
    m.create("/kv/layer0", "BF16", (64, 16, 8, 128))     # allocated and registered
    with m.open_numpy("/kv/layer0") as t:                 # zero-copy, under a lease
        t.array[3] = 0                                    # writes the tensor's memory
    m.copy_to("/kv/layer0", "b:/kv/layer0")               # a whole-tensor copy to peer b
    m.batch([(tensorfs.ref("/kv/layer0", 0, 65536),       # in place, a descriptor list
              tensorfs.ref("/kv/layer0", 131072, peer="b"))])
    m.batch([tensorfs.ranges("/kv/layer0", "b:/kv/layer0", # the same from arrays: a
                             src_offs, dst_offs, 8192),    # binary range list
             ("/kv/req-7", "b:/kv/req-7")])                # then a notification

Paths given to a :class:`Mount` are paths inside the mount (``/kv/layer0``);
an absolute path under the mountpoint (``/mnt/a/kv/layer0``) is accepted as
well. Peer paths (the ``copy_*`` and ``batch`` values) are ``[NAME:]PATH``
with an optional byte range ``@OFFSET[+LENGTH]``: see :func:`ref`.

Leases: a process that maps a tensor's IPC handle may touch only
``[ipc_offset, ipc_offset + nbytes)`` of it, and only while it holds the
tensor file open; the open file is its lease (tensorfs reuses freed memory).
The ``open_*`` calls open the file first, read the handle through that
descriptor, and keep the descriptor open until :meth:`Mapped.close`.

Errors are :class:`TensorfsError`, an :class:`OSError` with the errno the
daemon returned and, when the daemon recorded one in ``stats``, its reason.
"""

import ctypes
import ctypes.util
import errno as _errno
import json
import mmap
import numbers
import os
import re
import select
import struct
import time

__all__ = [
    "Mount", "Mapped", "TensorfsError", "ref", "wait_for", "XATTR_SIZE_MAX",
    "split_batch", "NUMPY_DTYPES", "Ranges", "ranges", "encode_ranges", "BINARY_MAGIC",
]

PREFIX = "user.tensorfs."

#: The kernel's limit on one xattr value (linux/limits.h XATTR_SIZE_MAX):
#: a ``batch`` value larger than this is split into several calls.
XATTR_SIZE_MAX = 65536

#: tensorfs (safetensors) dtype -> the NumPy/CuPy dtype the ``open_*`` calls
#: view the bytes as. BF16 and the 8-bit float types have no NumPy type: they
#: are exposed as their raw bits (uint16 / uint8 of the same width; PyTorch
#: gets the real type). Sub-byte types (F4, F6_*) are exposed as a flat uint8
#: array of nbytes.
NUMPY_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64",
    "F16": "float16", "F32": "float32", "F64": "float64", "C64": "complex64",
    "BF16": "uint16", "F8_E4M3": "uint8", "F8_E5M2": "uint8", "F8_E8M0": "uint8",
}

_TORCH_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64",
    "F16": "float16", "F32": "float32", "F64": "float64", "C64": "complex64",
    "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}

_INT_FIELDS = ("nbytes", "mr_id", "ipc_id", "ipc_offset", "generation")
_STR_FIELDS = ("dtype", "device", "ipc_handle")

# A range suffix: the last "@" of a path followed only by OFFSET[+LENGTH].
_NUM = r"(?:0[xX][0-9a-fA-F]+|[0-9]+)"
_RANGE_RE = re.compile(r"@" + _NUM + r"(?:\+" + _NUM + r")?$")
# The daemon refuses what starts like a range after the last "@" (a digit, "-"
# or "+") but is not one, as a typo: such a name needs the bare "@" too.
_RANGE_LIKE_RE = re.compile(r"@[0-9+-][^@/]*$")


class TensorfsError(OSError):
    """An OSError from a tensorfs call: ``errno`` is the daemon's errno.

    ``reason`` is the daemon's explanation when it recorded one in ``stats``
    (``transfers.recent[].error``, or ``errors.recent``), else None; the
    message (``strerror``) contains it.
    """

    def __init__(self, err, message, filename=None, reason=None):
        super().__init__(err, message, filename)
        self.reason = reason


def ref(path, off=None, length=None, peer=None):
    """A tensor reference for copy values and batch lines: ``[NAME:]PATH[@OFF[+LEN]]``.

    ``off``/``length`` are byte offsets into the tensor (a range: the bytes
    ``[off, off+length)``; without ``length`` the range runs for the other
    side's length). With no range, a path that would read as having one, or
    as a malformed one (a name ending in ``@DIGITS``, ``@N+M``, ``@`` or
    ``@`` and a digit, ``-`` or ``+``), gets a bare ``@`` appended,
    which the daemon reads as "no range": ``ref("/x@12")`` is ``"/x@12@"``.
    ``peer`` prefixes the node name (``ref("/kv/c", 0, peer="b")`` is
    ``"b:/kv/c@0"``). ``path`` may also be ``""`` for "this file" (a
    ``copy_to``/``copy_from`` source or destination range of the file the
    attribute is set on): ``ref("", 0, 8192)`` is ``"@0+8192"``.
    """
    s = path if peer is None else "%s:%s" % (peer, path)
    if off is None:
        if length is not None:
            raise ValueError("ref: a length needs an offset")
        if _RANGE_RE.search(s) or s.endswith("@") or _RANGE_LIKE_RE.search(s):
            s += "@"
        return s
    if off < 0 or (length is not None and length < 0):
        raise ValueError("ref: negative offset or length")
    s += "@%d" % off
    if length is not None:
        s += "+%d" % length
    return s


def _range_suffix(r):
    """A range argument, (off, len) / (off,) / int / "@..." string, as "@OFF[+LEN]"."""
    if r is None:
        return None
    if isinstance(r, str):
        return r if r.startswith("@") else "@" + r
    if isinstance(r, int):
        return ref("", r)
    if len(r) == 1:
        return ref("", r[0])
    return ref("", r[0], r[1])


def _line(item):
    line = item if isinstance(item, str) else "%s %s" % tuple(item)
    if "\n" in line or "\x00" in line:
        raise ValueError("batch: a line contains a newline or a NUL: %r" % (item,))
    return line


def split_batch(lines, limit=XATTR_SIZE_MAX):
    """Split batch lines into values of at most ``limit`` bytes each, in order.

    Lines keep their order, so the last line (a batch's notification) is the
    last line of the last value and every line before it goes in an earlier
    value or before it in the same one. Raises ValueError for a single line
    over the limit.
    """
    values, cur, size = [], [], 0
    for line in lines:
        n = len(line.encode())
        if n > limit:
            raise ValueError("batch: one line is %d bytes, over the %d-byte xattr limit" % (n, limit))
        extra = n + (1 if cur else 0)
        if cur and size + extra > limit:
            values.append("\n".join(cur))
            cur, size = [], 0
            extra = n
        cur.append(line)
        size += extra
    if cur:
        values.append("\n".join(cur))
    return values


# --- binary range lists ----------------------------------------------------

#: The first bytes of a binary range list (README "Binary range lists").
BINARY_MAGIC = b"\x00ranges1\n"
_COUNT = struct.Struct("<I")


class Ranges:
    """Descriptors between two tensors: one record of a binary range list.

    Descriptor ``i`` moves ``nbytes[i]`` bytes (``nbytes`` may be one int for
    all) from byte ``src_offsets[i]`` of ``src`` to byte ``dst_offsets[i]``
    of ``dst``, in place, as the line ``SRC@s+n DST@d`` would. ``src`` and
    ``dst`` are ``[NAME:]PATH`` with no range; for :meth:`Mount.copy_to`
    ``src`` is None (the file the copy is set on), for
    :meth:`Mount.copy_from` ``dst`` is None. The offsets may be lists or
    NumPy arrays: with NumPy the record is packed without a Python loop
    (microseconds for a thousand blocks, where their text lines take
    Python a few hundred); without NumPy, ``struct`` packs them (about a
    third of a millisecond for a thousand on a 2-vCPU VM). A ``Ranges`` of
    no descriptors sends nothing (a record without descriptors would be a
    whole-tensor line).
    """

    __slots__ = ("src", "dst", "_descs")

    def __init__(self, src, dst, src_offsets, dst_offsets, nbytes):
        for name, r in (("src", src), ("dst", dst)):
            if r is not None and (not r or any(c in r for c in " \t\n\x00")):
                raise ValueError("ranges: %s %r: want [NAME:]PATH, no white space" % (name, r))
        self.src, self.dst = src, dst
        self._descs = _pack_descs(src_offsets, dst_offsets, nbytes)

    def __len__(self):
        return len(self._descs) // 24

    def __repr__(self):
        return "<tensorfs.Ranges %s -> %s, %d descriptors>" % (self.src, self.dst, len(self))

    def _line(self):
        return " ".join(r for r in (self.src, self.dst) if r is not None)


def ranges(src, dst, src_offsets, dst_offsets, nbytes):
    """A :class:`Ranges`: descriptors from ``src`` to ``dst`` for
    :meth:`Mount.batch`, :meth:`Mount.copy_to` (``src`` None) and
    :meth:`Mount.copy_from` (``dst`` None)."""
    return Ranges(src, dst, src_offsets, dst_offsets, nbytes)


def _is_int(v):
    """An integer, bools excepted (NumPy's integers are numbers.Integral)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _pack_descs(src_offsets, dst_offsets, nbytes):
    """(src, dst, n) little-endian int64 triples, as bytes. Offsets and
    lengths must be integers (a float or bool is a TypeError: truncated, it
    would move other bytes than meant)."""
    n = len(src_offsets)
    if len(dst_offsets) != n:
        raise ValueError("ranges: %d source offsets, %d destination offsets" % (n, len(dst_offsets)))
    one = _is_int(nbytes)
    if not one and len(nbytes) != n:
        raise ValueError("ranges: %d offsets, %d lengths" % (n, len(nbytes)))
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        cols = [np.asarray(c) for c in (src_offsets, dst_offsets, nbytes)]
        for c in cols:
            if c.size and c.dtype.kind not in "iu":
                raise TypeError("ranges: offsets and lengths must be integers, not %s" % c.dtype)
        a = np.empty((n, 3), dtype="<i8")
        a[:, 0], a[:, 1], a[:, 2] = cols
        if n and a.min() < 0:
            raise ValueError("ranges: a negative offset or length")
        return a.tobytes()
    lens = [nbytes] * n if one else list(nbytes)
    flat = [v for t in zip(src_offsets, dst_offsets, lens) for v in t]
    if not all(_is_int(v) for v in flat):
        raise TypeError("ranges: offsets and lengths must be integers")
    if any(v < 0 for v in flat):
        raise ValueError("ranges: a negative offset or length")
    return struct.pack("<%dq" % len(flat), *flat)


def encode_ranges(items, limit=XATTR_SIZE_MAX):
    """Binary range lists of ``items``, in order: :class:`Ranges` records and
    text lines (records without descriptors), each value at most ``limit``
    bytes (a record too large for one is split across values, the last item
    ending the last). Returns a list of bytes values."""
    values, cur = [], bytearray(BINARY_MAGIC)
    fresh = len(cur)

    def put(line, descs):
        nonlocal cur
        head = len(line) + 1 + _COUNT.size
        if fresh + head + (24 if descs else 0) > limit:
            raise ValueError("ranges: a record's line is %d bytes, over the %d-byte limit" % (len(line), limit))
        while True:
            room = (limit - len(cur) - head) // 24  # descriptors that fit now
            if not descs and room >= 0:
                cur += line + b"\n" + _COUNT.pack(0)
                return
            if descs and room >= 1:
                k = min(room, len(descs) // 24)
                cur += line + b"\n" + _COUNT.pack(k) + descs[:24 * k]
                descs = descs[24 * k:]
                if not descs:
                    return
            values.append(bytes(cur))  # full: the rest goes in the next value
            cur = bytearray(BINARY_MAGIC)

    for item in items:
        if isinstance(item, Ranges):
            if len(item):
                put(item._line().encode(), item._descs)
        else:
            put(_line(item).encode(), b"")
    if len(cur) > fresh:
        values.append(bytes(cur))
    return values


# --- inotify through libc -------------------------------------------------

IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_IGNORED = 0x00008000
IN_Q_OVERFLOW = 0x00004000
IN_ONLYDIR = 0x01000000
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")

_libc = None


def _lib():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.inotify_init1.argtypes = [ctypes.c_int]
        _libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_long]
    return _libc


def _libc_err(what, path=None):
    e = ctypes.get_errno()
    return OSError(e, "%s: %s" % (what, os.strerror(e)), path)


def wait_for(directory, name, timeout=None):
    """Wait until ``name`` exists in ``directory`` (an OS path); return its path.

    Watches the directory with inotify (IN_MOVED_TO | IN_CREATE: a tensor
    arriving by a peer's copy is renamed into place, which is IN_MOVED_TO),
    then checks whether the file is already there, so a file that arrives
    between the check and the watch is not missed. ``timeout`` in seconds
    (None: forever); raises TimeoutError when it passes, FileNotFoundError
    when the directory is removed or moved away meanwhile.

    A name that is there already returns at once: a notification tensor
    should be named per request (``req-17``), or removed once read.
    """
    lib = _lib()
    target = os.path.join(directory, name)
    want = os.fsencode(name)
    fd = lib.inotify_init1(IN_CLOEXEC | IN_NONBLOCK)
    if fd < 0:
        raise _libc_err("inotify_init1")
    try:
        wd = lib.inotify_add_watch(fd, os.fsencode(directory),
                                   IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
        if wd < 0:
            raise _libc_err("inotify_add_watch", directory)
        if os.path.lexists(target):
            return target
        deadline = None if timeout is None else time.monotonic() + timeout
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(_errno.ETIMEDOUT, "wait_for: %s did not appear within %gs" % (target, timeout))
            if not poll.poll(None if left is None else max(1, int(left * 1000))):
                continue
            try:
                buf = os.read(fd, 64 * 1024)
            except BlockingIOError:
                continue
            i = 0
            while i + _EVENT.size <= len(buf):
                _, mask, _, n = _EVENT.unpack_from(buf, i)
                ev_name = buf[i + _EVENT.size:i + _EVENT.size + n].rstrip(b"\0")
                i += _EVENT.size + n
                if mask & (IN_MOVED_TO | IN_CREATE) and ev_name == want:
                    return target
                if mask & IN_Q_OVERFLOW and os.path.lexists(target):
                    return target
                if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                    raise FileNotFoundError(_errno.ENOENT, "wait_for: %s went away" % directory, directory)
    finally:
        os.close(fd)


# --- mappings --------------------------------------------------------------

class Mapped:
    """A zero-copy array over a tensor's memory, holding the tensor file open.

    ``array`` is the NumPy array (``open_numpy``), CuPy array (``open_cupy``)
    or PyTorch tensor (``open_torch``) of the tensor's dtype and shape, over
    the memory of its IPC handle at ``ipc_offset``; ``info`` is the tensor's
    :meth:`Mount.info` read through the held descriptor; ``fd`` is that
    descriptor: the lease. :meth:`close` (or leaving a ``with`` block) drops
    the mapping and then the lease. Do not use ``array`` after close: for a
    host mapping its pages are replaced by private zero pages at close (a view
    kept past close reads zeros, never another tensor's bytes); for a GPU
    mapping the IPC handle is closed and its memory must not be touched.
    """

    def __init__(self, kind, array, info, fd, closer):
        self.kind = kind
        self.array = array
        self.info = info
        self.fd = fd
        self._closer = closer

    @property
    def closed(self):
        """True once close() has run."""
        return self.fd is None

    def fileno(self):
        """The descriptor of the open tensor file (the lease)."""
        return self.fd

    def close(self):
        """Unmap (or close the IPC handle), then close the file: the lease ends."""
        if self.fd is None:
            return
        try:
            if self._closer is not None:
                self._closer()
        finally:
            self._closer = None
            self.array = None
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __array__(self, dtype=None, copy=None):
        import numpy as np
        a = self.array
        if self.kind != "numpy":
            raise TypeError("Mapped.__array__: a %s mapping lives on the GPU; copy it explicitly" % self.kind)
        return a if dtype is None else a.astype(dtype)

    @property
    def __cuda_array_interface__(self):
        """The CuPy array's interface (open_cupy mappings), for other GPU libraries."""
        if self.kind != "cupy":
            raise AttributeError("__cuda_array_interface__")
        return self.array.__cuda_array_interface__

    def __repr__(self):
        i = self.info or {}
        return "<tensorfs.Mapped %s %s %s %s mr_id=%s%s>" % (
            self.kind, i.get("dtype"), i.get("shape"), i.get("device"), i.get("mr_id"),
            " closed" if self.closed else "")


def _layout(info):
    """(dtype name, shape) to view a tensor's bytes as in NumPy/CuPy."""
    dt = info.get("dtype") or "U8"
    shape = info.get("shape")
    if dt not in NUMPY_DTYPES or shape is None:
        return "uint8", (info["nbytes"],)
    return NUMPY_DTYPES[dt], shape


class _CudaImports:
    """Per-process cache of opened CUDA IPC handles, reference counted.

    A CUDA IPC handle maps a whole allocation, and tensorfs sub-allocates
    small GPU tensors from shared allocations: two tensors may carry one
    handle, which a process may open only once.
    """

    def __init__(self):
        self.open = {}

    def acquire(self, key, opener):
        ent = self.open.get(key)
        if ent is None:
            ent = [opener(), 0]
            self.open[key] = ent
        ent[1] += 1
        return ent[0]

    def release(self, key, closer):
        ent = self.open[key]
        ent[1] -= 1
        if ent[1] == 0:
            del self.open[key]
            closer(ent[0])


_cupy_imports = _CudaImports()
# mount root -> {stats section: the newest record id this process has looked at}
_seen_ids = {}
_driver_imports = _CudaImports()


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class _CudaArray:
    """Enough of __cuda_array_interface__ for torch.as_tensor to wrap a pointer."""

    def __init__(self, ptr, nbytes, owner):
        self.owner = owner
        self.__cuda_array_interface__ = {
            "data": (ptr, False), "shape": (nbytes,), "typestr": "|u1",
            "strides": None, "version": 3,
        }


def _cuda_ordinal(device):
    if device and device.startswith("cuda:"):
        return int(device.split(":", 1)[1])
    return 0


class Mount:
    """A mounted tensorfs, at ``path`` (its mountpoint)."""

    def __init__(self, path):
        self.root = os.path.abspath(path)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(_errno.ENOENT, "tensorfs mount not found", self.root)
        self._baseline()

    def __repr__(self):
        return "<tensorfs.Mount %s>" % self.root

    # -- paths and xattrs

    def path(self, p):
        """The OS path of ``p``, a path inside the mount (``/kv/x`` or ``kv/x``)
        or already an absolute path under the mountpoint."""
        if p == self.root or p.startswith(self.root + "/"):
            return p
        return os.path.join(self.root, p.lstrip("/"))

    def _get(self, target, name):
        """One attribute as a string, or None when it does not exist (ENODATA)."""
        try:
            return os.getxattr(target, PREFIX + name).decode()
        except OSError as e:
            if e.errno == _errno.ENODATA:
                return None
            raise

    def _setxattr(self, target, name, value):
        """The one place values are written (tests wrap it to watch calls)."""
        os.setxattr(target, name, value)

    def _target(self, node):
        """Where an action's xattr is set: the descriptor of ``node`` when it
        is an open file (an int, or an object with ``fileno()``, such as a
        :class:`Mapped`), else the OS path of ``node``, a path inside the
        mount. On a descriptor the kernel needs no lookup of the path: the
        copy is one FUSE request where a path costs two."""
        if isinstance(node, int):
            fd = node
        elif getattr(node, "fileno", None) is not None:
            fd = node.fileno()
            if fd is None:
                raise ValueError("%r is closed" % (node,))
        else:
            return self.path(node)
        # Another filesystem would keep the xattr as an ordinary one and
        # copy nothing; another tensorfs mount would copy its own tensor.
        if os.fstat(fd).st_dev != os.stat(self.root).st_dev:
            raise ValueError("descriptor %d is not a file of the tensorfs mount at %s" % (fd, self.root))
        return fd

    def _action(self, target, name, value):
        """Set an action attribute; on failure raise TensorfsError with the reason."""
        data = value if isinstance(value, bytes) else value.encode()
        if isinstance(value, bytes):
            value = "<binary range list, %d bytes>" % len(value)
        try:
            self._setxattr(target, PREFIX + name, data)
        except OSError as e:
            reason = self._reason()
            code = _errno.errorcode.get(e.errno, str(e.errno))
            shown = value if len(value) <= 200 else value[:200] + "...(%d bytes)" % len(data)
            on = target if isinstance(target, str) else "fd %d" % target
            msg = "%s (%s): %s=%r on %s" % (os.strerror(e.errno), code, name, shown, on)
            if reason:
                msg += ": " + reason
            raise TensorfsError(e.errno, msg, None, reason) from None

    def _reason(self):
        """The daemon's reason for this process's latest failure, from stats.

        Looks at the records that appeared since this process last looked
        (``transfers.recent``, whose records carry the pid of the process
        whose setxattr asked for the copy, and ``errors.recent`` where the
        daemon has one) and returns the newest error among those of this
        process, or None when the daemon recorded none.
        """
        try:
            st = self.stats()
        except (OSError, ValueError):
            return None
        pid = os.getpid()
        seen = _seen_ids.setdefault(self.root, {})
        best = None
        for section in ("transfers", "errors"):
            recent = (st.get(section) or {}).get("recent") or []
            floor = seen.get(section, 0)
            for r in recent:
                if not isinstance(r, dict):
                    continue
                rid = r.get("id")
                if isinstance(rid, int):
                    if rid <= floor:
                        continue
                    seen[section] = max(seen.get(section, 0), rid)
                err = r.get("error") or r.get("message") or r.get("reason")
                if not err or r.get("pid", pid) not in (pid, 0):
                    continue
                rank = (section == "errors", rid if isinstance(rid, int) else 0)
                if best is None or rank >= best[0]:
                    best = (rank, err)
        return None if best is None else best[1]

    def _baseline(self):
        """Remember the newest stats records now: older ones are not ours to report."""
        if self.root in _seen_ids:
            return
        seen = _seen_ids.setdefault(self.root, {})
        try:
            st = self.stats()
        except (OSError, ValueError):
            return
        for section in ("transfers", "errors"):
            ids = [r.get("id") for r in (st.get(section) or {}).get("recent") or []
                   if isinstance(r, dict) and isinstance(r.get("id"), int)]
            seen[section] = max(ids, default=0)

    # -- tensors

    def create(self, path, dtype, shape, device=None, mode=0o644):
        """Create a tensor file of ``dtype`` and ``shape`` and return its info.

        Creates the file (it must not exist), sets ``user.tensorfs.device``
        when ``device`` is given ("host", "cuda:N"; before allocation), then
        ``dtype`` (a safetensors name, or a torch/numpy spelling, stored
        canonically) and then ``shape`` (a tuple; ``()`` is a scalar), which
        allocates and registers ``prod(shape) * itemsize`` bytes. In a
        directory with a template the file is allocated at creation: the
        dtype and shape set here must then keep its nbytes (a view/reshape).
        """
        target = self.path(path)
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
        try:
            if device is not None:
                os.setxattr(fd, PREFIX + "device", device.encode())
            os.setxattr(fd, PREFIX + "dtype", str(dtype).encode())
            if isinstance(shape, int):
                shape = (shape,)
            os.setxattr(fd, PREFIX + "shape", ",".join(str(int(d)) for d in shape).encode())
        except OSError:
            os.close(fd)
            try:
                os.unlink(target)
            except OSError:
                pass
            raise
        os.close(fd)
        return self.info(path)

    def info(self, path):
        """The tensor's attributes as a dict.

        Keys: dtype, shape (a tuple of ints; ``()`` for a scalar), nbytes,
        device, mr_id, ipc_id, ipc_handle, ipc_offset, generation. An
        attribute that does not exist yet (an unallocated file has no mr_id)
        is None. ``path`` may also be an open descriptor of the file.
        """
        target = path if isinstance(path, int) else self.path(path)
        out = {}
        for k in _STR_FIELDS:
            out[k] = self._get(target, k)
        for k in _INT_FIELDS:
            v = self._get(target, k)
            out[k] = None if v is None else int(v)
        s = self._get(target, "shape")
        out["shape"] = None if s is None else tuple(int(d) for d in s.split(",") if d.strip())
        return out

    def stats(self):
        """The daemon's ``user.tensorfs.stats`` document (mount root) as a dict."""
        return json.loads(os.getxattr(self.root, PREFIX + "stats").decode())

    # -- zero-copy opens

    def _lease(self, path, writable):
        fd = os.open(self.path(path), os.O_RDWR if writable else os.O_RDONLY)
        try:
            info = self.info(fd)
        except BaseException:
            os.close(fd)
            raise
        if info["nbytes"] and info["ipc_handle"] is None:
            os.close(fd)
            raise TensorfsError(_errno.ENODATA, "%s has no IPC handle" % path, self.path(path))
        return fd, info

    def open_numpy(self, path, writable=True):
        """Map a host tensor zero-copy as a NumPy array, under a lease.

        Opens the tensor file (the lease), reads its ``memfd:/proc/PID/fd/N``
        IPC handle through that descriptor, mmaps the memfd (MAP_SHARED) from
        ``ipc_offset`` rounded down to a page, and returns a :class:`Mapped`
        whose ``array`` is the tensor's ``nbytes`` viewed as its dtype and
        shape (BF16 as uint16, F8_* as uint8: their raw bits; F4/F6 as flat
        uint8). Stores through the array are stores into the tensor: other
        mappings, reads of the file and copies see them. Only the daemon's uid
        (or root) may open the memfd path.
        """
        import numpy as np
        fd, info = self._lease(path, writable)
        try:
            handle = info["ipc_handle"]
            npdt, shape = _layout(info)
            nbytes = info["nbytes"] or 0
            if nbytes == 0:
                arr = np.zeros(0, dtype=np.uint8).view(npdt).reshape(shape)
                return Mapped("numpy", arr, info, fd, None)
            if not handle.startswith("memfd:"):
                raise TensorfsError(_errno.EINVAL, "open_numpy: %s is on %s (%s...): use open_cupy or open_torch"
                                    % (path, info["device"], handle[:12]), self.path(path))
            off = info["ipc_offset"] or 0
            gran = mmap.ALLOCATIONGRANULARITY
            start = off - off % gran
            delta = off - start
            length = delta + nbytes
            mfd = os.open(handle[len("memfd:"):], os.O_RDWR if writable else os.O_RDONLY)
            try:
                prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
                mm = mmap.mmap(mfd, length, mmap.MAP_SHARED, prot, offset=start)
            finally:
                os.close(mfd)
            raw = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=delta)
            if not writable:
                raw.flags.writeable = False
            base = raw.ctypes.data - delta
            arr = raw.view(npdt).reshape(shape)

            def closer():
                # Replace the pages with private zero pages first: views that
                # outlive close() must never see memory tensorfs has reused.
                lib = _lib()
                MAP_FIXED, MAP_PRIVATE, MAP_ANON = 0x10, 0x02, 0x20
                r = lib.mmap(base, length, mmap.PROT_READ | mmap.PROT_WRITE,
                             MAP_FIXED | MAP_PRIVATE | MAP_ANON, -1, 0)
                if r is None or r == ctypes.c_void_p(-1).value:
                    raise _libc_err("mmap over a closed mapping")
                try:
                    mm.close()
                except BufferError:
                    pass  # views alive: the mmap object unmaps at their death

            return Mapped("numpy", arr, info, fd, closer)
        except BaseException:
            os.close(fd)
            raise

    def _cuda_handle(self, path, info):
        handle = info["ipc_handle"] or ""
        if not handle.startswith("cuda:"):
            raise TensorfsError(_errno.EINVAL, "%s is on %s, not a GPU: use open_numpy" % (path, info["device"]),
                                self.path(path))
        raw = bytes.fromhex(handle[len("cuda:"):])
        if len(raw) != 64:
            raise TensorfsError(_errno.EINVAL, "%s: a CUDA IPC handle of %d bytes" % (path, len(raw)))
        return raw

    def open_cupy(self, path):
        """Map a GPU tensor zero-copy as a CuPy array, under a lease.

        Opens the tensor file (the lease), reads its ``cuda:`` IPC handle
        through that descriptor, opens it with
        ``cupy.cuda.runtime.ipcOpenMemHandle`` on the tensor's device (once
        per allocation in this process: tensors sub-allocated from one
        allocation share the import), and returns a :class:`Mapped` whose
        ``array`` is a ``cupy.ndarray`` over ``[ipc_offset, ipc_offset +
        nbytes)`` of it, of the tensor's dtype and shape (BF16 as uint16, F8_*
        as uint8). Synchronize your stream before another process or a copy
        reads what you wrote. Close drops the import and the lease.
        """
        import cupy
        fd, info = self._lease(path, True)
        try:
            dev = _cuda_ordinal(info["device"])
            npdt, shape = _layout(info)
            nbytes = info["nbytes"] or 0
            if nbytes == 0:
                with cupy.cuda.Device(dev):
                    arr = cupy.zeros(0, dtype=cupy.uint8).view(npdt).reshape(shape)
                return Mapped("cupy", arr, info, fd, None)
            raw = self._cuda_handle(path, info)
            key = (dev, raw)

            def opener():
                with cupy.cuda.Device(dev):
                    return cupy.cuda.runtime.ipcOpenMemHandle(raw)

            base = _cupy_imports.acquire(key, opener)
            try:
                mem = cupy.cuda.UnownedMemory(base + (info["ipc_offset"] or 0), nbytes, owner=None, device_id=dev)
                with cupy.cuda.Device(dev):
                    arr = cupy.ndarray(shape, dtype=npdt, memptr=cupy.cuda.MemoryPointer(mem, 0))
            except BaseException:
                _cupy_imports.release(key, cupy.cuda.runtime.ipcCloseMemHandle)
                raise

            def closer():
                with cupy.cuda.Device(dev):
                    cupy.cuda.Device(dev).synchronize()
                    _cupy_imports.release(key, cupy.cuda.runtime.ipcCloseMemHandle)

            return Mapped("cupy", arr, info, fd, closer)
        except BaseException:
            os.close(fd)
            raise

    def open_torch(self, path):
        """Map a GPU tensor zero-copy as a PyTorch tensor, under a lease.

        As :meth:`open_cupy`, with ``array`` a ``torch.Tensor`` of the real
        dtype (BF16 is ``torch.bfloat16``, F8_E4M3 ``torch.float8_e4m3fn``)
        and shape on ``cuda:N``. Uses CuPy for the import when it is
        importable (the tensor wraps the CuPy array's memory); else opens the
        handle with the driver's ``cuIpcOpenMemHandle`` through ctypes and
        wraps the pointer (``__cuda_array_interface__``).
        """
        import torch
        try:
            import cupy  # noqa: F401
            have_cupy = True
        except ImportError:
            have_cupy = False

        def view(raw_u8, info):
            d = info.get("dtype") or "U8"
            if d in _TORCH_DTYPES and info.get("shape") is not None:
                return raw_u8.view(getattr(torch, _TORCH_DTYPES[d])).reshape(info["shape"])
            return raw_u8

        if have_cupy:
            m = self.open_cupy(path)
            try:
                dev = _cuda_ordinal(m.info["device"])
                flat = m.array.reshape(-1).view("uint8") if m.info["nbytes"] else m.array
                raw = torch.as_tensor(flat, device="cuda:%d" % dev)
                m.array = view(raw, m.info)
                m.kind = "torch"
                return m
            except BaseException:
                m.close()
                raise
        fd, info = self._lease(path, True)
        try:
            dev = _cuda_ordinal(info["device"])
            torch.cuda.set_device(dev)
            torch.zeros(1, device="cuda:%d" % dev)  # makes the primary context current
            nbytes = info["nbytes"] or 0
            if nbytes == 0:
                return Mapped("torch", view(torch.zeros(0, dtype=torch.uint8, device="cuda:%d" % dev), info),
                              info, fd, None)
            rawh = self._cuda_handle(path, info)
            cu = ctypes.CDLL("libcuda.so.1")
            key = (dev, rawh)

            def opener():
                ptr = ctypes.c_uint64()
                # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1; the 64-byte handle goes by value.
                # from_buffer_copy: the constructor, _IpcHandle(rawh), stops at
                # the first NUL byte of the handle (CUresult 1, seen on an H200).
                r = cu.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), _IpcHandle.from_buffer_copy(rawh), ctypes.c_uint(1))
                if r != 0:
                    raise TensorfsError(_errno.EIO, "cuIpcOpenMemHandle_v2: CUresult %d" % r)
                return ptr.value

            def close_ptr(p):
                cu.cuIpcCloseMemHandle(ctypes.c_uint64(p))

            base = _driver_imports.acquire(key, opener)
            raw = torch.as_tensor(_CudaArray(base + (info["ipc_offset"] or 0), nbytes, None),
                                  device="cuda:%d" % dev)

            def closer():
                torch.cuda.synchronize(dev)
                _driver_imports.release(key, close_ptr)

            return Mapped("torch", view(raw, info), info, fd, closer)
        except BaseException:
            os.close(fd)
            raise

    # -- copies

    def copy_to(self, src, dst, src_range=None):
        """Push tensor (or directory) ``src`` of this mount to ``dst``; return when done.

        ``src`` is a path inside the mount, or the tensor held open: a
        :class:`Mapped`, a file object or a descriptor of it (then the copy
        costs one FUSE request instead of two: no lookup of the path, the
        fast path for a sender pushing from the same tensor again and again).

        ``dst`` is a peer path ``[NAME:]PATH[@OFF[+LEN]]`` (see :func:`ref`).
        Without a range the destination is replaced whole: new memory, renamed
        into place (watchers see IN_MOVED_TO), a missing one created with the
        source's dtype and shape. With a range it is written in place: same
        memory, mr_id, ipc_id and generation, so existing mappings of it see
        the new bytes. ``src_range`` ((off, len), an int offset, or an
        ``"@OFF+LEN"`` string) sends only those bytes of ``src``. ``dst`` may
        also be a list of destinations: one call, one transfer.

        ``dst`` may also be a :class:`Ranges` with no source
        (``ranges(None, DST, src_offsets, dst_offsets, nbytes)``), or a list
        holding some: blocks of ``src`` in place into ``DST``, sent as a
        binary range list.
        """
        dsts = [dst] if isinstance(dst, (str, Ranges)) else list(dst)
        pre = _range_suffix(src_range)
        if any(isinstance(d, Ranges) for d in dsts):
            if pre:
                raise ValueError("copy_to: src_range with Ranges (their descriptors name the source's bytes)")
            for d in dsts:
                if isinstance(d, Ranges) and d.src is not None:
                    raise ValueError("copy_to: %r names a source; the source is %r" % (d, src))
            target = self._target(src)
            for v in encode_ranges(dsts):
                self._action(target, "copy_to", v)
            return
        value = "\n".join((pre + " " + d) if pre else d for d in dsts)
        self._action(self._target(src), "copy_to", value)

    def copy_from(self, dst, src, dst_range=None):
        """Pull peer tensor (or directory) ``src`` into ``dst`` of this mount.

        ``dst`` is a path inside the mount, or the tensor held open (a
        :class:`Mapped`, a file object or a descriptor, as for
        :meth:`copy_to`).

        ``src`` is ``[NAME:]PATH[@OFF[+LEN]]``. Without ``dst_range`` the file
        ``dst`` is replaced whole (atomically, by swapping its memory inside
        the daemon: no IN_MOVED_TO; the return is the arrival). With
        ``dst_range`` ((off, len), an int offset, or ``"@OFF[+LEN]"``) the
        bytes land in place in ``dst``'s existing memory (ids and mappings
        kept).

        ``src`` may also be a :class:`Ranges` with no destination
        (``ranges(SRC, None, src_offsets, dst_offsets, nbytes)``): blocks of
        ``SRC`` in place into ``dst``, sent as a binary range list.
        """
        if isinstance(src, Ranges):
            if dst_range is not None or src.dst is not None:
                raise ValueError("copy_from: %r: the destination is %r, its offsets in the Ranges" % (src, dst))
            target = self._target(dst)
            for v in encode_ranges([src]):
                self._action(target, "copy_from", v)
            return
        suf = _range_suffix(dst_range)
        value = src + (" " + suf if suf else "")
        self._action(self._target(dst), "copy_from", value)

    def batch(self, lines, limit=XATTR_SIZE_MAX):
        """Run many copies as a descriptor list: ``user.tensorfs.batch`` on the root.

        ``lines`` are ``(src, dst)`` pairs (or ``"SRC DST"`` strings), each
        side ``[NAME:]PATH[@OFF[+LEN]]`` (build them with :func:`ref`), and
        :class:`Ranges` (:func:`ranges`: many blocks between two tensors from
        arrays of offsets; with any, the value is a binary range list). One
        call is one pipelined transfer; the daemon moves its in-place lines
        first and commits its whole-tensor lines after, so a small
        whole-tensor line last is the batch's arrival notification.

        A value larger than one xattr holds (``limit``, the kernel's 64 KiB
        XATTR_SIZE_MAX) is split into several setxattr calls, in order, each
        under the limit, the last line in the last call: a split batch is
        several transfers, each complete before the next starts (so the
        notification still lands after every byte before it), but a failure
        part-way leaves the earlier calls' copies done. Returns the number of
        calls made.
        """
        lines = list(lines)
        if any(isinstance(x, Ranges) for x in lines):
            for x in lines:
                if isinstance(x, Ranges) and (x.src is None or x.dst is None):
                    raise ValueError("batch: %r needs both a source and a destination" % (x,))
            values = encode_ranges(lines, limit)
        else:
            values = split_batch([_line(x) for x in lines], limit)
        for v in values:
            self._action(self.root, "batch", v)
        return len(values)

    def wait_for(self, directory, name, timeout=None):
        """:func:`wait_for` with ``directory`` a path inside this mount."""
        return wait_for(self.path(directory), name, timeout)
