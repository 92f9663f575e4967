#!/usr/bin/env python3
"""Map a tensorfs tensor zero-copy in another process, from its xattrs alone.

    open_tensor.py PATH                  print dtype, shape, a checksum, first values
    open_tensor.py PATH --check-file     also compare with the bytes read through the file
    open_tensor.py PATH --write-pattern  write byte i = (i*7+3) % 251 into the tensor's
                                         memory (on the GPU), synchronize, and exit

A CUDA tensor ("cuda:" + 128 hex digits) is opened with CuPy's
ipcOpenMemHandle, or, without CuPy, with the driver's cuIpcOpenMemHandle
through ctypes and wrapped by PyTorch (__cuda_array_interface__). The handle
maps the whole allocation: the tensor starts at ipc_offset. A host tensor
("memfd:/proc/PID/fd/N") is mmapped with numpy; only the daemon's uid (or
root) may open that path. Keep the tensor file open while you use the mapping:
the open file is your lease, and tensorfs reuses freed memory.
"""

import argparse
import ctypes
import mmap
import os
import sys

import numpy as np

# safetensors dtype -> numpy dtype of the same width. BF16 and the fp8 types
# have no numpy/CuPy type: they are viewed as their raw bits (torch gets the
# real type). Sub-byte types (F4, F6_*) are read as raw bytes.
NUMPY = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64",
    "F16": "float16", "F32": "float32", "F64": "float64", "C64": "complex64",
    "BF16": "uint16", "F8_E4M3": "uint8", "F8_E5M2": "uint8", "F8_E8M0": "uint8",
}
TORCH = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
         "F8_E8M0": "float8_e8m0fnu"}


def xattr(path, name):
    return os.getxattr(path, "user.tensorfs." + name).decode()


def pattern(n):
    return ((np.arange(n, dtype=np.int64) * 7 + 3) % 251).astype(np.uint8)


def layout(dtype, shape, nbytes):
    """The numpy dtype and shape to view the bytes as."""
    if dtype not in NUMPY:
        return "uint8", (nbytes,)
    return NUMPY[dtype], shape


def open_cupy(handle, device, offset, nbytes, dtype, shape):
    import cupy

    cupy.cuda.Device(device).use()
    base = cupy.cuda.runtime.ipcOpenMemHandle(handle)
    mem = cupy.cuda.UnownedMemory(base + offset, nbytes, owner=None, device_id=device)
    npdt, npshape = layout(dtype, shape, nbytes)
    arr = cupy.ndarray(npshape, dtype=npdt, memptr=cupy.cuda.MemoryPointer(mem, 0))
    raw = arr.view(cupy.uint8).reshape(-1) if nbytes else cupy.zeros(0, cupy.uint8)

    def write():
        raw[...] = cupy.asarray(pattern(nbytes))
        cupy.cuda.Device(device).synchronize()

    def close():
        cupy.cuda.Device(device).synchronize()
        cupy.cuda.runtime.ipcCloseMemHandle(base)

    return "cupy", arr, lambda: cupy.asnumpy(raw).tobytes(), write, close


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class _CudaArray:
    """Enough of __cuda_array_interface__ for torch.as_tensor to wrap a pointer."""

    def __init__(self, ptr, shape, typestr):
        self.__cuda_array_interface__ = {
            "data": (ptr, False), "shape": tuple(shape), "typestr": typestr,
            "strides": None, "version": 3,
        }


def open_torch(handle, device, offset, nbytes, dtype, shape):
    import torch

    torch.cuda.set_device(device)
    torch.zeros(1, device="cuda")  # makes the primary context current on this thread
    cu = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_uint64()
    # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1; the 64-byte handle goes by value.
    r = cu.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), _Handle(handle), ctypes.c_uint(1))
    if r != 0:
        sys.exit(f"cuIpcOpenMemHandle_v2: CUresult {r}")
    raw = torch.as_tensor(_CudaArray(ptr.value + offset, (nbytes,), "|u1"), device="cuda")
    if dtype in NUMPY:
        arr = raw.view(getattr(torch, TORCH.get(dtype, NUMPY[dtype]))).reshape(shape)
    else:
        arr = raw

    def write():
        raw.copy_(torch.from_numpy(pattern(nbytes)).to("cuda"))
        torch.cuda.synchronize()

    def close():
        torch.cuda.synchronize()
        cu.cuIpcCloseMemHandle(ctypes.c_uint64(ptr.value))

    return "torch", arr, lambda: raw.cpu().numpy().tobytes(), write, close


def open_memfd(path, offset, nbytes, dtype, shape):
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, offset + nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    raw = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=offset)
    npdt, npshape = layout(dtype, shape, nbytes)
    arr = raw.view(npdt).reshape(npshape)

    def write():
        raw[...] = pattern(nbytes)

    def close():
        pass  # numpy views of the mapping live until exit; the mapping goes with them

    return "numpy", arr, lambda: raw.tobytes(), write, close


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--check-file", action="store_true", help="compare with the bytes read through the file")
    ap.add_argument("--write-pattern", action="store_true", help="write (i*7+3) %% 251 into each byte")
    args = ap.parse_args()

    lease = open(args.path, "rb")  # held until exit: the open file is the lease
    handle = xattr(args.path, "ipc_handle")
    offset = int(xattr(args.path, "ipc_offset"))
    dtype = xattr(args.path, "dtype")
    shape = [int(d) for d in xattr(args.path, "shape").split(",") if d]
    nbytes = int(xattr(args.path, "nbytes"))
    device = xattr(args.path, "device")

    if handle.startswith("cuda:"):
        raw_handle = bytes.fromhex(handle[len("cuda:"):])
        assert len(raw_handle) == 64, handle
        ordinal = int(device.split(":")[1]) if device.startswith("cuda:") else 0
        try:
            import cupy  # noqa: F401
            opener = open_cupy
        except ImportError:
            opener = open_torch
        lib, arr, readback, write, close = opener(raw_handle, ordinal, offset, nbytes, dtype, shape)
    elif handle.startswith("memfd:"):
        lib, arr, readback, write, close = open_memfd(handle[len("memfd:"):], offset, nbytes, dtype, shape)
    else:
        sys.exit(f"{args.path}: unknown handle {handle!r}")

    try:
        if args.write_pattern:
            write()
            print(f"{args.path}: wrote the pattern into {nbytes} bytes on {device} ({lib})")
            return
        data = readback()
        total = int(np.frombuffer(data, dtype=np.uint8).sum(dtype=np.uint64))
        first = arr.reshape(-1)[:4].tolist() if nbytes else []
        print(f"{args.path}: {device} {dtype} {shape} at offset {offset} ({lib}): "
              f"{nbytes} bytes, byte sum {total}, first {first}")
        if args.check_file:
            with open(args.path, "rb") as f:
                through_file = f.read()
            if through_file != data:
                diff = next(i for i in range(min(len(data), len(through_file)))
                            if data[i] != through_file[i]) if len(data) == len(through_file) else "length"
                sys.exit(f"{args.path}: the mapped memory and the file differ (first at {diff})")
            print(f"{args.path}: matches the {len(through_file)} bytes read through the file")
    finally:
        close()
        lease.close()


if __name__ == "__main__":
    main()
