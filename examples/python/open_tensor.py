#!/usr/bin/env python3
"""Map a tensorfs tensor zero-copy in another process, from its xattrs alone,
with the Python client (python/tensorfs.py).

    open_tensor.py PATH                  print dtype, shape, a checksum, first values
    open_tensor.py PATH --check-file     also compare with the bytes read through the file
    open_tensor.py PATH --write-pattern  write byte i = (i*7+3) % 251 into the tensor's
                                         memory (on the GPU), synchronize, and exit

A CUDA tensor is opened with CuPy (Mount.open_cupy) or, without CuPy, with
PyTorch (Mount.open_torch); a host tensor with NumPy (Mount.open_numpy). The
mapping holds the tensor file open while it is used: the open file is the
lease.
"""

import argparse
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import tensorfs  # noqa: E402


def mount_of(path):
    """The mountpoint of the tensorfs mount that holds path."""
    path = os.path.abspath(path)
    best = None
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            mnt, kind = fields[1], fields[2]
            if kind.startswith("fuse") and (path == mnt or path.startswith(mnt.rstrip("/") + "/")):
                if best is None or len(mnt) > len(best):
                    best = mnt
    if best is None:
        sys.exit("open_tensor.py: %s is not in a tensorfs mount" % path)
    return best


def open_mapped(m, path):
    if m.info(path)["device"] == "host":
        return m.open_numpy(path)
    try:
        import cupy  # noqa: F401
        return m.open_cupy(path)
    except ImportError:
        return m.open_torch(path)


def raw_bytes(mapped):
    """The tensor's bytes, copied to the host."""
    a = mapped.array
    if mapped.kind == "torch":
        return a.contiguous().view(-1).cpu().numpy().view("uint8").tobytes() if a.numel() else b""
    if mapped.kind == "cupy":
        import cupy
        return cupy.asnumpy(a.reshape(-1).view(cupy.uint8)).tobytes()
    return a.reshape(-1).view("uint8").tobytes()


def write_pattern(mapped, n):
    if mapped.kind == "numpy":
        import numpy as np
        mapped.array.reshape(-1).view(np.uint8)[:] = (np.arange(n, dtype=np.int64) * 7 + 3) % 251
        return
    if mapped.kind == "cupy":
        import cupy
        mapped.array.reshape(-1).view(cupy.uint8)[:] = ((cupy.arange(n, dtype=cupy.int64) * 7 + 3) % 251).astype(cupy.uint8)
        cupy.cuda.runtime.deviceSynchronize()
        return
    import torch
    flat = mapped.array.view(-1).view(torch.uint8)
    flat.copy_(((torch.arange(n, dtype=torch.int64, device=flat.device) * 7 + 3) % 251).to(torch.uint8))
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--check-file", action="store_true", help="compare with the bytes read through the file")
    ap.add_argument("--write-pattern", action="store_true", help="write (i*7+3) %% 251 into each byte")
    args = ap.parse_args()
    m = tensorfs.Mount(mount_of(args.path))
    with open_mapped(m, args.path) as mapped:
        n = mapped.info["nbytes"]
        if args.write_pattern:
            write_pattern(mapped, n)
            return
        data = raw_bytes(mapped)
        if args.check_file:
            with open(args.path, "rb") as f:
                if f.read() != data:
                    sys.exit("open_tensor.py: %s: the mapping and the file differ" % args.path)
        print("%s %s %s %s crc32=%08x first=%s" % (args.path, mapped.info["dtype"], mapped.info["shape"], mapped.kind,
                                                  zlib.crc32(data), data[:8].hex()))


if __name__ == "__main__":
    main()
