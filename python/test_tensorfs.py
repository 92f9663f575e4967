"""Tests of the tensorfs Python client against two live daemons on host memory.

Run by tests/python_test.go (TestPython...), which mounts two daemons that
know each other as peers and sets:

    TENSORFS_MOUNT_A, TENSORFS_MOUNT_B   the two mountpoints
    TENSORFS_NAME_A, TENSORFS_NAME_B     their peer names

Without them only the tests that need no mount run (ref, split_batch).
The tests of in-place copies (class InPlace) need the daemon's range support.
"""

import errno
import os
import struct
import sys
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if os.environ.get("TENSORFS_TEST_NO_CUPY"):
    sys.modules["cupy"] = None  # as if CuPy were not installed: open_torch takes the driver path
import tensorfs  # noqa: E402
from tensorfs import ref  # noqa: E402

try:
    import numpy as np
except ImportError:  # the Go test refuses to run without it; plain runs skip
    np = None

A = os.environ.get("TENSORFS_MOUNT_A")
B = os.environ.get("TENSORFS_MOUNT_B")
NA = os.environ.get("TENSORFS_NAME_A", "a")
NB = os.environ.get("TENSORFS_NAME_B", "b")


def pattern(n, seed=0):
    return ((np.arange(n, dtype=np.int64) * 7 + 3 + seed * 31) % 251).astype(np.uint8)


class Refs(unittest.TestCase):
    """ref() and split_batch(): no mount needed."""

    def test_ref(self):
        self.assertEqual(ref("/kv/c"), "/kv/c")
        self.assertEqual(ref("/kv/c", 0), "/kv/c@0")
        self.assertEqual(ref("/kv/c", 131072, 8192), "/kv/c@131072+8192")
        self.assertEqual(ref("/kv/c", 64, peer="b"), "b:/kv/c@64")
        self.assertEqual(ref("", 0, 8192), "@0+8192")
        # A name that reads as having a range gets a bare "@": "no range".
        self.assertEqual(ref("/x@12"), "/x@12@")
        self.assertEqual(ref("/x@1+2"), "/x@1+2@")
        self.assertEqual(ref("/x@0x10"), "/x@0x10@")
        self.assertEqual(ref("/x@"), "/x@@")
        self.assertEqual(ref("/x@y"), "/x@y")
        self.assertEqual(ref("/x@12", 4, 4), "/x@12@4+4")
        self.assertRaises(ValueError, ref, "/x", None, 4)
        self.assertRaises(ValueError, ref, "/x", -1)

    def test_split_batch(self):
        lines = ["/s%04d b:/d%04d" % (i, i) for i in range(10000)]
        values = tensorfs.split_batch(lines)
        self.assertGreater(len(values), 1)
        for v in values:
            self.assertLessEqual(len(v.encode()), tensorfs.XATTR_SIZE_MAX)
        self.assertEqual("\n".join(values).split("\n"), lines)
        self.assertTrue(values[-1].endswith(lines[-1]))
        self.assertEqual(tensorfs.split_batch(lines[:3]), ["\n".join(lines[:3])])
        self.assertRaises(ValueError, tensorfs.split_batch, ["x" * 70000])


class BinaryRanges(unittest.TestCase):
    """encode_ranges(): the binary range list's bytes, no mount needed."""

    def decode(self, value):
        """The records of one value: [(line, [(src, dst, n), ...]), ...]."""
        self.assertTrue(value.startswith(tensorfs.BINARY_MAGIC))
        rest, recs = value[len(tensorfs.BINARY_MAGIC):], []
        while rest:
            line, rest = rest.split(b"\n", 1)
            (count,) = struct.unpack("<I", rest[:4])
            descs = struct.unpack("<%dq" % (3 * count), rest[4:4 + 24 * count])
            recs.append((line.decode(), [descs[i:i + 3] for i in range(0, len(descs), 3)]))
            rest = rest[4 + 24 * count:]
        return recs

    def test_layout(self):
        r = tensorfs.ranges("/s", "b:/d", [0, 8192], [65536, 0], 8192)
        v = tensorfs.encode_ranges([r, ("/note", "b:/note")])
        self.assertEqual(len(v), 1)
        self.assertEqual(v[0], tensorfs.BINARY_MAGIC + b"/s b:/d\n" + struct.pack("<I6q", 2, 0, 65536, 8192, 8192, 0, 8192)
                         + b"/note b:/note\n" + struct.pack("<I", 0))
        self.assertEqual(len(r), 2)
        # Lengths one by one; copy_to's record names only its destination.
        r = tensorfs.ranges(None, "b:/d", [1], [2], [3])
        self.assertEqual(self.decode(tensorfs.encode_ranges([r])[0]), [("b:/d", [(1, 2, 3)])])
        # Without NumPy the same bytes come from struct.
        with_np = tensorfs.ranges("/s", "b:/d", [0, 8192], [65536, 0], 8192)._descs
        saved = sys.modules.get("numpy")
        sys.modules["numpy"] = None  # import numpy raises ImportError
        try:
            without = tensorfs.ranges("/s", "b:/d", [0, 8192], [65536, 0], 8192)._descs
            self.assertRaises(ValueError, tensorfs.ranges, "/s", "b:/d", [-1], [0], 8)
        finally:
            if saved is None:
                del sys.modules["numpy"]
            else:
                sys.modules["numpy"] = saved
        self.assertEqual(with_np, without)

    def test_split_keeps_order_and_last(self):
        n = 7000
        r = tensorfs.ranges("/s", "b:/d", list(range(n)), list(range(n, 2 * n)), 16)
        values = tensorfs.encode_ranges([("/first", "b:/first"), r, ("/note", "b:/note")])
        self.assertGreater(len(values), 2)
        recs = []
        for v in values:
            self.assertLessEqual(len(v), tensorfs.XATTR_SIZE_MAX)
            recs += self.decode(v)
        self.assertEqual(recs[0], ("/first b:/first", []))
        self.assertEqual(recs[-1], ("/note b:/note", []))
        got = [d for line, ds in recs[1:-1] for d in ds]
        self.assertTrue(all(line == "/s b:/d" for line, _ in recs[1:-1]))
        self.assertEqual(got, [(i, n + i, 16) for i in range(n)])
        self.assertEqual(self.decode(values[-1])[-1], ("/note b:/note", []))

    def test_refusals(self):
        self.assertRaises(ValueError, tensorfs.ranges, "/s", "b:/d", [0, 1], [0], 8)
        self.assertRaises(ValueError, tensorfs.ranges, "/s", "b:/d", [0], [0], [8, 8])
        self.assertRaises(ValueError, tensorfs.ranges, "/s", "b:/d", [-1], [0], 8)
        self.assertRaises(ValueError, tensorfs.ranges, "/s x", "b:/d", [0], [0], 8)
        self.assertRaises(ValueError, tensorfs.encode_ranges, [("/" + "x" * 70000, "b:/d")])
        self.assertRaises(ValueError, tensorfs.encode_ranges, [("/s\n/t", "b:/d")])
        # Integers only: a float offset was truncated (other bytes moved).
        self.assertRaises(TypeError, tensorfs.ranges, "/s", "b:/d", [1.7], [0], 10)
        self.assertRaises(TypeError, tensorfs.ranges, "/s", "b:/d", [True], [0], 10)
        self.assertEqual(len(tensorfs.ranges("/s", "b:/d", [1], [0], np.int64(10)) if np else [0]), 1)


@unittest.skipUnless(A and B, "TENSORFS_MOUNT_A/B not set (run by tests/python_test.go)")
@unittest.skipUnless(np is not None, "numpy is missing")
class Base(unittest.TestCase):
    """Each test works in its own directory on both mounts, removed after."""

    def setUp(self):
        self.a = tensorfs.Mount(A)
        self.b = tensorfs.Mount(B)
        self.d = "/" + self._testMethodName + "-" + uuid.uuid4().hex[:6]
        os.mkdir(self.a.path(self.d))
        os.mkdir(self.b.path(self.d))
        self.maps = []

    def tearDown(self):
        for m in self.maps:
            m.close()
        import shutil
        shutil.rmtree(self.a.path(self.d), ignore_errors=True)
        shutil.rmtree(self.b.path(self.d), ignore_errors=True)

    def p(self, name):
        return self.d + "/" + name

    def write(self, m, name, data):
        with open(m.path(self.p(name)), "r+b", buffering=0) as f:
            f.write(bytes(data))

    def read(self, m, name):
        with open(m.path(self.p(name)), "rb", buffering=0) as f:
            return f.read()

    def tensor(self, m, name, data, dtype="U8"):
        """A U8 tensor holding data (bytes), written through the mount."""
        m.create(self.p(name), dtype, (len(data),) if dtype == "U8" else (len(data) // 4,))
        self.write(m, name, data)

    def mapped(self, m, name):
        t = m.open_numpy(self.p(name))
        self.maps.append(t)
        return t


class Tensors(Base):

    def test_create_info(self):
        i = self.a.create(self.p("t"), "bfloat16", (4, 8))
        self.assertEqual(i["dtype"], "BF16")
        self.assertEqual(i["shape"], (4, 8))
        self.assertEqual(i["nbytes"], 64)
        self.assertEqual(i["device"], "host")
        for k in ("mr_id", "ipc_id", "ipc_offset", "generation"):
            self.assertIsInstance(i[k], int, k)
        self.assertTrue(i["ipc_handle"].startswith("memfd:/proc/"), i["ipc_handle"])
        self.assertEqual(os.stat(self.a.path(self.p("t"))).st_size, 64)
        s = self.a.create(self.p("scalar"), "F32", ())
        self.assertEqual((s["shape"], s["nbytes"]), ((), 4))
        # Unallocated: the ids do not exist yet (ENODATA -> None).
        open(self.a.path(self.p("empty")), "w").close()
        e = self.a.info(self.p("empty"))
        self.assertIsNone(e["mr_id"])
        self.assertIsNone(e["ipc_handle"])
        self.assertRaises(FileExistsError, self.a.create, self.p("t"), "U8", (1,))
        with self.assertRaises(OSError) as cm:
            self.a.create(self.p("bad"), "nonsense", (1,))
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertFalse(os.path.exists(self.a.path(self.p("bad"))))

    def test_open_numpy_sees_writes_both_ways(self):
        self.a.create(self.p("t"), "F32", (16, 16))
        t = self.mapped(self.a, "t")
        self.assertEqual((t.array.dtype, t.array.shape), (np.dtype("float32"), (16, 16)))
        want = np.arange(256, dtype=np.float32).reshape(16, 16)
        self.write(self.a, "t", want.tobytes())
        np.testing.assert_array_equal(t.array, want)          # the file's write, seen in the mapping
        t.array[3, :] = -1.5                                  # a store, seen by a read of the file
        got = np.frombuffer(self.read(self.a, "t"), dtype=np.float32).reshape(16, 16)
        self.assertTrue((got[3] == -1.5).all())
        np.testing.assert_array_equal(got[4:], want[4:])

    def test_open_numpy_bf16_and_small_offsets(self):
        # Many small tensors: whatever ipc_offset each gets, each maps its own bytes.
        for k in range(8):
            self.a.create(self.p("b%d" % k), "BF16", (3, 5))
            self.write(self.a, "b%d" % k, pattern(30, k).tobytes())
        for k in range(8):
            t = self.mapped(self.a, "b%d" % k)
            self.assertEqual((t.array.dtype, t.array.shape), (np.dtype("uint16"), (3, 5)))
            self.assertEqual(t.array.tobytes(), pattern(30, k).tobytes(), "b%d at ipc_offset %d" % (k, t.info["ipc_offset"]))

    def test_lease_and_close(self):
        self.a.create(self.p("t"), "U8", (8192,))
        base = self.a.stats()["live"]["leases"]
        t = self.a.open_numpy(self.p("t"))
        t.array[:] = 7
        self.assertGreater(self.a.stats()["live"]["leases"], base - 1)
        view = t.array
        with t:
            self.assertFalse(t.closed)
        self.assertTrue(t.closed)
        self.assertEqual(self.read(self.a, "t"), b"\x07" * 8192)
        # A view kept past close reads private zero pages, not the tensor.
        self.assertEqual(int(view.sum()), 0)
        for _ in range(500):
            if self.a.stats()["live"]["leases"] <= base:
                break
            time.sleep(0.01)
        self.assertLessEqual(self.a.stats()["live"]["leases"], base)

    def test_stats(self):
        s = self.a.stats()
        for k in ("live", "copies", "transfers"):
            self.assertIn(k, s)


class Copies(Base):

    def test_copy_to_peer_and_copy_from(self):
        data = pattern(10000)
        self.tensor(self.a, "src", data)
        self.a.copy_to(self.p("src"), NB + ":" + self.p("dst"))
        self.assertEqual(self.read(self.b, "dst"), data.tobytes())
        i = self.b.info(self.p("dst"))
        self.assertEqual((i["dtype"], i["shape"], i["nbytes"]), ("U8", (10000,), 10000))
        # A pull over an existing file of another size.
        self.tensor(self.a, "back", b"x" * 10)
        self.a.copy_from(self.p("back"), NB + ":" + self.p("dst"))
        self.assertEqual(self.read(self.a, "back"), data.tobytes())

    def test_batch(self):
        self.tensor(self.a, "s0", pattern(100, 1))
        self.tensor(self.a, "s1", pattern(200, 2))
        n = self.a.batch([(self.p("s0"), NB + ":" + self.p("d0")), (self.p("s1"), NB + ":" + self.p("d1"))])
        self.assertEqual(n, 1)
        self.assertEqual(self.read(self.b, "d0"), pattern(100, 1).tobytes())
        self.assertEqual(self.read(self.b, "d1"), pattern(200, 2).tobytes())

    def test_batch_split_over_64k(self):
        # Long names in deep directories make few lines of ~1.6 KB each.
        deep = "/".join(("%s%d" % ("d" * 200, k)) for k in range(4))
        for m in (self.a, self.b):
            os.makedirs(m.path(self.p(deep)))
        self.tensor(self.a, deep + "/" + "s" * 200, pattern(64))
        src = self.p(deep + "/" + "s" * 200)
        lines = [(src, NB + ":" + self.p(deep + "/" + "t%03d" % k + "t" * 190)) for k in range(100)]
        calls = []
        real = self.a._setxattr

        def spy(target, name, value):
            calls.append((name, value))
            real(target, name, value)

        self.a._setxattr = spy
        n = self.a.batch(lines)
        self.assertEqual(n, len(calls))
        self.assertGreaterEqual(n, 3)
        for name, value in calls:
            self.assertEqual(name, "user.tensorfs.batch")
            self.assertLessEqual(len(value), tensorfs.XATTR_SIZE_MAX)
        sent = b"\n".join(v for _, v in calls).decode().split("\n")
        self.assertEqual(sent, ["%s %s" % l for l in lines])
        self.assertTrue(calls[-1][1].decode().endswith(lines[-1][1]))  # the last line last
        names = os.listdir(self.b.path(self.p(deep)))
        self.assertEqual(len(names), 100)
        self.assertEqual(self.read(self.b, deep + "/t099" + "t" * 190), pattern(64).tobytes())

    def test_wait_for_already_there(self):
        self.tensor(self.b, "here", b"1")
        t0 = time.monotonic()
        self.assertEqual(self.b.wait_for(self.d, "here", timeout=5), self.b.path(self.p("here")))
        self.assertLess(time.monotonic() - t0, 1)

    def test_wait_for_appears_later(self):
        self.tensor(self.a, "note", b'{"request": 1}')
        errs = []

        def later():
            time.sleep(0.3)
            try:
                self.a.copy_to(self.p("note"), NB + ":" + self.p("note"))  # renamed into place: IN_MOVED_TO
            except Exception as e:  # reported below
                errs.append(e)

        th = threading.Thread(target=later)
        th.start()
        t0 = time.monotonic()
        got = self.b.wait_for(self.d, "note", timeout=10)
        took = time.monotonic() - t0
        th.join()
        self.assertEqual(errs, [])
        self.assertEqual(got, self.b.path(self.p("note")))
        self.assertGreater(took, 0.2)
        self.assertEqual(self.read(self.b, "note"), b'{"request": 1}')
        # A plain create is seen too (IN_CREATE).
        th = threading.Thread(target=lambda: (time.sleep(0.2), open(self.b.path(self.p("made")), "w").close()))
        th.start()
        self.b.wait_for(self.d, "made", timeout=10)
        th.join()

    def test_wait_for_timeout(self):
        t0 = time.monotonic()
        self.assertRaises(TimeoutError, self.b.wait_for, self.d, "never", timeout=0.3)
        self.assertGreater(time.monotonic() - t0, 0.25)

    def test_errors_carry_errno(self):
        self.tensor(self.a, "src", b"abc")
        cases = [
            ("unknown peer", lambda: self.a.copy_to(self.p("src"), "nosuchpeer:" + self.p("x")), errno.ENOENT),
            ("missing parent", lambda: self.a.copy_to(self.p("src"), NB + ":" + self.p("no/such/dir")), errno.ENOENT),
            ("onto itself", lambda: self.a.copy_to(self.p("src"), self.p("src")), errno.EINVAL),
            ("dotdot", lambda: self.a.copy_to(self.p("src"), NB + ":/../x"), errno.EINVAL),
            ("batch line", lambda: self.a.batch(["only-one-field"]), errno.EINVAL),
        ]
        for what, fn, want in cases:
            with self.subTest(what):
                with self.assertRaises(tensorfs.TensorfsError) as cm:
                    fn()
                e = cm.exception
                self.assertIsInstance(e, OSError)
                self.assertEqual(e.errno, want, str(e))
                self.assertIn(errno.errorcode[want], str(e))
                print("  %s: %s" % (what, e), file=sys.stderr)

    def test_error_reason_from_stats(self):
        # A copy that reaches the peer and fails there: its record in stats
        # carries the error text, which the exception must carry too.
        self.tensor(self.a, "src", b"abc")
        with self.assertRaises(tensorfs.TensorfsError) as cm:
            self.a.copy_to(self.p("src"), NB + ":" + self.p("missing/dst"))
        self.assertEqual(cm.exception.errno, errno.ENOENT)
        self.assertTrue(cm.exception.reason, "no reason in stats for: %s" % cm.exception)
        self.assertIn(cm.exception.reason, str(cm.exception))

    def test_refusal_reason_from_stats(self):
        # Refused before any transfer (a copy onto itself): the reason is in
        # stats' errors.recent, by this process's thread.
        self.tensor(self.a, "self", b"abc")
        with self.assertRaises(tensorfs.TensorfsError) as cm:
            self.a.copy_to(self.p("self"), self.p("self"))
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertIn("onto itself", cm.exception.reason or "", str(cm.exception))
        self.assertIn("onto itself", str(cm.exception))


class InPlace(Base):
    """In-place copies (ranges): need the daemon's range support."""

    def cache(self, m, name, n, fill=0xEE):
        m.create(self.p(name), "U8", (n,))
        t = self.mapped(m, name)           # mapped BEFORE the copy
        t.array[:] = fill
        return t

    def ids(self, m, name):
        i = m.info(self.p(name))
        return (i["mr_id"], i["ipc_id"], i["generation"], i["nbytes"], i["ipc_handle"])

    def test_copy_to_range_lands_in_mapping(self):
        cache = self.cache(self.b, "cache", 16384)
        before = self.ids(self.b, "cache")
        self.tensor(self.a, "src", pattern(4096))
        self.a.copy_to(self.p("src"), ref(self.p("cache"), 8192, peer=NB))
        a = cache.array
        np.testing.assert_array_equal(a[8192:12288], pattern(4096))
        self.assertTrue((a[:8192] == 0xEE).all() and (a[12288:] == 0xEE).all(), "bytes outside the range changed")
        self.assertEqual(self.ids(self.b, "cache"), before)
        self.assertEqual(self.read(self.b, "cache")[8192:12288], pattern(4096).tobytes())

    def test_copy_by_descriptor(self):
        # The tensor held open is the target of the action's xattr: a Mapped,
        # a file object or a descriptor, for copy_to and copy_from alike.
        cache = self.cache(self.b, "cache", 16384)
        src = self.cache(self.a, "src", 4096, fill=0)
        src.array[:] = pattern(4096, 3)
        for i, held in enumerate([src, src.fileno()]):
            self.a.copy_to(held, ref(self.p("cache"), 4096 * i, peer=NB))
            np.testing.assert_array_equal(cache.array[4096 * i:4096 * (i + 1)], pattern(4096, 3))
        local = self.cache(self.a, "local", 8192)
        with open(self.a.path(self.p("local")), "rb") as f:
            self.a.copy_from(f, ref(self.p("cache"), 0, 4096, peer=NB), dst_range=(4096,))
        np.testing.assert_array_equal(local.array[4096:], pattern(4096, 3))
        self.assertTrue((local.array[:4096] == 0xEE).all())
        # A descriptor of another filesystem, or of the other mount, is
        # refused before any xattr is set (ext4 would keep it and copy
        # nothing; the other daemon would copy its own tensor).
        other = self.cache(self.b, "other", 4096)
        with open(__file__, "rb") as f:
            for held in (f, other):
                with self.assertRaises(ValueError):
                    self.a.copy_to(held, ref(self.p("cache"), 0, peer=NB))
            self.assertNotIn("user.tensorfs.copy_to", os.listxattr(f.fileno()))
        closed = self.mapped(self.a, "src")
        closed.close()
        with self.assertRaises(ValueError):
            self.a.copy_to(closed, ref(self.p("cache"), 0, peer=NB))
        # A refusal through a descriptor names it, with the errno and reason.
        with self.assertRaises(tensorfs.TensorfsError) as cm:
            self.a.copy_to(src.fileno(), ref(self.p("cache"), 16000, peer=NB))
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertIn("fd %d" % src.fileno(), str(cm.exception))

    def test_copy_to_source_range(self):
        cache = self.cache(self.b, "cache", 8192)
        self.tensor(self.a, "src", pattern(4096))
        self.a.copy_to(self.p("src"), ref(self.p("cache"), 100, peer=NB), src_range=(1024, 512))
        np.testing.assert_array_equal(cache.array[100:612], pattern(4096)[1024:1536])
        self.assertTrue((cache.array[:100] == 0xEE).all() and (cache.array[612:] == 0xEE).all())

    def test_copy_from_range(self):
        src = self.cache(self.b, "cache", 8192, fill=0)
        src.array[:] = pattern(8192, 5)
        dst = self.cache(self.a, "local", 16384)
        before = self.ids(self.a, "local")
        self.a.copy_from(self.p("local"), ref(self.p("cache"), 4096, 2048, peer=NB), dst_range=(10000,))
        np.testing.assert_array_equal(dst.array[10000:12048], pattern(8192, 5)[4096:6144])
        self.assertTrue((dst.array[:10000] == 0xEE).all() and (dst.array[12048:] == 0xEE).all())
        self.assertEqual(self.ids(self.a, "local"), before)

    def test_local_range(self):
        cache = self.cache(self.a, "cache", 4096)
        before = self.ids(self.a, "cache")
        self.tensor(self.a, "src", pattern(1000))
        self.a.copy_to(self.p("src"), ref(self.p("cache"), 3000, 1000))
        np.testing.assert_array_equal(cache.array[3000:4000], pattern(1000))
        self.assertTrue((cache.array[:3000] == 0xEE).all() and (cache.array[4000:] == 0xEE).all())
        self.assertEqual(self.ids(self.a, "cache"), before)

    def test_batch_scattered_then_notification(self):
        block, nblocks = 1024, 32
        cache = self.cache(self.b, "cache", block * nblocks)
        before = self.ids(self.b, "cache")
        ids = [29, 3, 17, 8]
        staging = np.concatenate([pattern(block, bid) for bid in ids])
        self.tensor(self.a, "staging", staging)
        self.tensor(self.a, "note", b'{"blocks": [29, 3, 17, 8]}')
        os.mkdir(self.b.path(self.p("notify")))
        lines = [(ref(self.p("staging"), j * block, block), ref(self.p("cache"), bid * block, peer=NB))
                 for j, bid in enumerate(ids)]
        lines.append((self.p("note"), NB + ":" + self.p("notify/req1")))
        got = []
        th = threading.Thread(target=lambda: got.append(self.b.wait_for(self.p("notify"), "req1", timeout=20)))
        th.start()
        self.a.batch(lines)
        th.join()
        self.assertEqual(len(got), 1)
        a = cache.array.reshape(nblocks, block)
        for bid in range(nblocks):
            if bid in ids:
                np.testing.assert_array_equal(a[bid], pattern(block, bid), "block %d" % bid)
            else:
                self.assertTrue((a[bid] == 0xEE).all(), "block %d was not in the batch" % bid)
        self.assertEqual(self.ids(self.b, "cache"), before)
        self.assertEqual(self.read(self.b, "notify/req1"), b'{"blocks": [29, 3, 17, 8]}')

    def test_batch_split_in_place_notification_last(self):
        # 3000 in-place lines (~100 KB of value) split into several calls:
        # every byte lands, the notification arrives, and it is in the last call.
        block, nblocks = 16, 3000
        cache = self.cache(self.b, "cache", block * nblocks)
        self.tensor(self.a, "staging", np.concatenate([pattern(block, k) for k in range(nblocks)]))
        self.tensor(self.a, "note", b"done")
        order = list(range(nblocks))[::-1]
        lines = [(ref(self.p("staging"), k * block, block), ref(self.p("cache"), k * block, peer=NB)) for k in order]
        lines.append((self.p("note"), NB + ":" + self.p("done")))
        calls = []
        real = self.a._setxattr
        self.a._setxattr = lambda t, n, v: (calls.append(v), real(t, n, v))
        n = self.a.batch(lines)
        self.assertGreaterEqual(n, 2)
        self.assertTrue(all(len(v) <= tensorfs.XATTR_SIZE_MAX for v in calls))
        self.assertTrue(calls[-1].endswith((NB + ":" + self.p("done")).encode()))
        self.assertNotIn(b"done", b"".join(calls[:-1]))
        self.assertTrue(os.path.exists(self.b.path(self.p("done"))))
        want = np.concatenate([pattern(block, k) for k in range(nblocks)])
        np.testing.assert_array_equal(cache.array, want)

    def test_binary_ranges(self):
        # The blocks of a batch as arrays (a binary range list), into two
        # peer tensors and one of this mount, then a notification; copy_to
        # and copy_from take them too. Every block lands, through mappings
        # made before.
        block, nblocks = 512, 64
        caches = [self.cache(self.b, "c%d" % k, block * nblocks) for k in range(2)]
        local = self.cache(self.a, "local", block * nblocks)
        before = [self.ids(self.b, "c%d" % k) for k in range(2)]
        staging = np.concatenate([pattern(block, k) for k in range(40)])
        self.tensor(self.a, "staging", staging)
        self.tensor(self.a, "note", b"req 9")
        rng = np.random.default_rng(3)
        ids = [rng.permutation(nblocks)[:20] for _ in range(3)]
        src = np.arange(20) * block
        items = [tensorfs.ranges(self.p("staging"), NB + ":" + self.p("c0"), src, ids[0] * block, block),
                 tensorfs.ranges(self.p("staging"), NB + ":" + self.p("c1"), src + 20 * block, ids[1] * block, block),
                 tensorfs.ranges(self.p("staging"), self.p("local"), src, ids[2] * block, block),
                 (self.p("note"), NB + ":" + self.p("note"))]
        self.assertEqual(self.a.batch(items), 1)
        for k, (m, first) in enumerate([(caches[0], 0), (caches[1], 20), (local, 0)]):
            a = m.array.reshape(nblocks, block)
            for j, bid in enumerate(ids[k]):
                np.testing.assert_array_equal(a[bid], pattern(block, first + j), "target %d block %d" % (k, bid))
            rest = np.setdiff1d(np.arange(nblocks), ids[k])
            self.assertTrue((a[rest] == 0xEE).all(), "target %d: bytes outside the ranges changed" % k)
        self.assertEqual([self.ids(self.b, "c%d" % k) for k in range(2)], before)
        self.assertEqual(self.read(self.b, "note"), b"req 9")
        # copy_to: the source is the file; copy_from: the destination is.
        self.a.copy_to(self.p("staging"), tensorfs.ranges(None, NB + ":" + self.p("c0"), [0], [0], block))
        np.testing.assert_array_equal(caches[0].array[:block], pattern(block, 0))
        self.a.copy_from(self.p("local"), tensorfs.ranges(NB + ":" + self.p("c1"), None, ids[1][:2] * block, [0, block], block))
        np.testing.assert_array_equal(local.array[:2 * block], np.concatenate([pattern(block, 20), pattern(block, 21)]))
        # A refused list writes nothing, and says why.
        snap = caches[0].array.copy()
        bad = tensorfs.ranges(self.p("staging"), NB + ":" + self.p("c0"), [0, 0], [0, block * nblocks], block)
        with self.assertRaises(tensorfs.TensorfsError) as cm:
            self.a.batch([bad])
        self.assertEqual(cm.exception.errno, errno.EINVAL, str(cm.exception))
        self.assertIn("binary range list", str(cm.exception))
        np.testing.assert_array_equal(caches[0].array, snap)

    def test_range_errors_write_nothing(self):
        cache = self.cache(self.b, "cache", 4096)
        self.tensor(self.a, "src", pattern(1024))
        with self.assertRaises(tensorfs.TensorfsError) as cm:
            self.a.copy_to(self.p("src"), ref(self.p("cache"), 3584, peer=NB))  # runs past nbytes
        self.assertEqual(cm.exception.errno, errno.EINVAL, str(cm.exception))
        with self.assertRaises(tensorfs.TensorfsError) as cm:
            self.a.copy_to(self.p("src"), ref(self.p("nothere"), 0, peer=NB))   # must exist
        self.assertEqual(cm.exception.errno, errno.ENOENT, str(cm.exception))
        with self.assertRaises(tensorfs.TensorfsError) as cm:
            self.a.copy_to(self.p("src"), ref(self.p("cache"), 0, 100, peer=NB))  # lengths disagree
        self.assertEqual(cm.exception.errno, errno.EINVAL, str(cm.exception))
        with self.assertRaises(tensorfs.TensorfsError) as cm:                    # a bad line among good ones
            self.a.batch([(ref(self.p("src"), 0, 512), ref(self.p("cache"), 0, peer=NB)),
                          (ref(self.p("src"), 0, 512), ref(self.p("cache"), 4000, peer=NB))])
        self.assertEqual(cm.exception.errno, errno.EINVAL, str(cm.exception))
        print("  range error: %s" % cm.exception, file=sys.stderr)
        self.assertTrue((cache.array == 0xEE).all(), "a refused copy wrote bytes")


GPU_DEV = os.environ.get("TENSORFS_TEST_GPU")


@unittest.skipUnless(GPU_DEV, "TENSORFS_TEST_GPU (cuda:N) not set")
class GPU(Base):
    """open_cupy/open_torch on GPU tensors (python/gpu_check.sh runs these on a GPU host)."""

    def gpu_tensor(self, m, name, dtype, shape, data=None):
        m.create(self.p(name), dtype, shape, device=GPU_DEV)
        if data is not None:
            self.write(m, name, data)

    def test_open_cupy_both_ways(self):
        import cupy
        self.gpu_tensor(self.a, "g", "BF16", (64, 1024), pattern(131072).tobytes())
        with self.a.open_cupy(self.p("g")) as t:
            self.assertEqual((t.array.dtype, t.array.shape), (cupy.dtype("uint16"), (64, 1024)))
            self.assertEqual(cupy.asnumpy(t.array).tobytes(), pattern(131072).tobytes())
            t.array[0] = 7
            cupy.cuda.runtime.deviceSynchronize()
            self.assertEqual(self.read(self.a, "g")[:2048], np.full(1024, 7, np.uint16).tobytes())

    def test_open_torch(self):
        import torch
        self.gpu_tensor(self.a, "g", "BF16", (8, 16), pattern(256).tobytes())
        with self.a.open_torch(self.p("g")) as t:
            self.assertEqual((t.array.dtype, tuple(t.array.shape)), (torch.bfloat16, (8, 16)))
            self.assertEqual(t.array.view(torch.uint8).cpu().numpy().tobytes(), pattern(256).tobytes())
            t.array[1] = 2.0
            torch.cuda.synchronize()
            want = torch.full((16,), 2.0, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
            self.assertEqual(self.read(self.a, "g")[32:64], want)

    def test_shared_allocation_opened_once(self):
        import cupy
        for k in range(3):
            self.gpu_tensor(self.a, "s%d" % k, "U8", (4096,), pattern(4096, k).tobytes())
        ts = [self.a.open_cupy(self.p("s%d" % k)) for k in range(3)]
        try:
            for k, t in enumerate(ts):
                self.assertEqual(cupy.asnumpy(t.array).tobytes(), pattern(4096, k).tobytes(),
                                 "s%d at ipc_offset %d" % (k, t.info["ipc_offset"]))
        finally:
            for t in ts:
                t.close()

    def test_in_place_into_gpu_mapping(self):
        import cupy
        self.gpu_tensor(self.b, "cache", "U8", (1 << 20,))
        with self.b.open_cupy(self.p("cache")) as cache:
            cache.array[:] = 0xEE
            cupy.cuda.runtime.deviceSynchronize()
            before = self.b.info(self.p("cache"))
            self.tensor(self.a, "src", pattern(65536))
            self.a.copy_to(self.p("src"), ref(self.p("cache"), 131072, peer=NB))
            got = cupy.asnumpy(cache.array)
            np.testing.assert_array_equal(got[131072:196608], pattern(65536))
            self.assertTrue((got[:131072] == 0xEE).all() and (got[196608:] == 0xEE).all())
            after = self.b.info(self.p("cache"))
            self.assertEqual([before[k] for k in ("mr_id", "ipc_id", "generation")],
                             [after[k] for k in ("mr_id", "ipc_id", "generation")])


if __name__ == "__main__":
    unittest.main()
