#!/usr/bin/env python3
"""gpu_floor.py: the GPU floors of the in-place benchmarks, measured with CuPy
on device 0 in the same run as them (scripts/gpu-check.sh inplace):

  copy4k-us    a 4 KiB device-to-device copy plus a stream synchronize (p50)
  scatter-us   1000 scattered 8 KiB copies as one CUDA kernel (p50)
  ipc1g-us     1 GiB device-to-device from a pointer opened with
               cuIpcOpenMemHandle (another process's allocation), p50
  ipc1g-GB/s   the same as bandwidth

Prints one "name value" line each. Needs CuPy (the device's /opt/torch/.venv).
"""
import subprocess, sys, time

import cupy

KERNEL = r'''
extern "C" __global__ void scatter(const unsigned long long* d, int n) {
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const uint4* s = (const uint4*)d[3 * i + 1];
        uint4* t = (uint4*)d[3 * i];
        int words = (int)(d[3 * i + 2] / 16);
        for (int w = threadIdx.x; w < words; w += blockDim.x) t[w] = s[w];
    }
}
'''


def p50(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def child(n):
    cupy.cuda.Device(0).use()
    mem = cupy.cuda.memory.Memory(n)
    cupy.cuda.runtime.memset(mem.ptr, 7, n)
    cupy.cuda.runtime.deviceSynchronize()
    print(bytes(cupy.cuda.runtime.ipcGetMemHandle(mem.ptr)).hex(), flush=True)
    sys.stdin.readline()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        return child(int(sys.argv[2]))
    cupy.cuda.Device(0).use()
    s = cupy.cuda.Stream(non_blocking=True)
    a = cupy.zeros(16 << 20, cupy.uint8)
    b = cupy.zeros(16 << 20, cupy.uint8)
    lat = []
    for i in range(2000):
        t = time.perf_counter()
        cupy.cuda.runtime.memcpyAsync(b.data.ptr + (i % 256) * 4096, a.data.ptr, 4096, 3, s.ptr)
        s.synchronize()
        lat.append(time.perf_counter() - t)
    print("copy4k-us %.2f" % (p50(lat[200:]) * 1e6))

    k = cupy.RawKernel(KERNEL, "scatter")
    n, blk = 1000, 8192
    desc = []
    for i in range(n):
        j = (i * 389 + 17) % 1500
        desc += [b.data.ptr + j * blk, a.data.ptr + i * blk, blk]
    d = cupy.asarray(desc, dtype=cupy.uint64)
    lat = []
    for _ in range(200):
        t = time.perf_counter()
        with s:
            k((min(n, 1024),), (256,), (d, cupy.int32(n)))
        s.synchronize()
        lat.append(time.perf_counter() - t)
    print("scatter-us %.2f" % (p50(lat[20:]) * 1e6))

    size = 1 << 30
    ch = subprocess.Popen([sys.executable, __file__, "child", str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    h = bytes.fromhex(ch.stdout.readline().strip())
    src = cupy.cuda.runtime.ipcOpenMemHandle(h)
    dst = cupy.cuda.memory.alloc(size)
    lat = []
    for _ in range(20):
        t = time.perf_counter()
        cupy.cuda.runtime.memcpyAsync(dst.ptr, src, size, 3, s.ptr)
        s.synchronize()
        lat.append(time.perf_counter() - t)
    us = p50(lat[3:]) * 1e6
    print("ipc1g-us %.1f" % us)
    print("ipc1g-GB/s %.1f" % (size / us / 1e3))
    cupy.cuda.runtime.ipcCloseMemHandle(src)
    ch.stdin.write("\n")
    ch.stdin.flush()
    ch.wait()


if __name__ == "__main__":
    main()
