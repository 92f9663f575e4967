// scatter.cu: tensorfs's gather/scatter copy kernel (gpu/cuda/batch.go runs it).
//
// One launch copies a whole list of descriptors {dst, src, n}: block b takes
// descriptors b, b+gridDim.x, ... and its threads copy each one together,
// 16 bytes per load/store when dst and src agree modulo 16 (a byte head up to
// the alignment, then uint4 words four at a time per thread so that four loads
// are in flight before the stores, then a byte tail), else byte by byte.
// Descriptors are at most batchPiece bytes (batch.go splits longer extents),
// so the blocks of one launch get similar work.
//
// The PTX beside it (scatter.ptx) is embedded in the Go binary and loaded with
// cuModuleLoadData, so neither build nor run needs a CUDA toolkit. Regenerate
// it with gen-ptx.sh (the exact commands are there):
//   nvcc -ptx -arch=compute_80 -o scatter.ptx scatter.cu
//   sed -i 's/^\.version [0-9.]*$/.version 7.0/' scatter.ptx
// (nvcc 13 labels its PTX 9.0, which only CUDA 13 drivers load; nothing in
// the kernel needs more than PTX ISA 7.0, CUDA 11.0's).
// compute_80 PTX is JIT-compiled by the driver for sm_80 and every later GPU
// (A100, H100/H200 are sm_90, B200 sm_100).

struct tensorfs_desc {
    unsigned long long dst;  // CUdeviceptr of the first destination byte
    unsigned long long src;  // CUdeviceptr of the first source byte
    unsigned long long n;    // bytes
};

extern "C" __global__ void __launch_bounds__(256)
tensorfs_scatter(const tensorfs_desc* __restrict__ descs, unsigned long long count)
{
    const unsigned long long t = threadIdx.x, nt = blockDim.x;
    for (unsigned long long i = blockIdx.x; i < count; i += gridDim.x) {
        const unsigned long long da = descs[i].dst, sa = descs[i].src, n = descs[i].n;
        unsigned char* dst = (unsigned char*)da;
        const unsigned char* src = (const unsigned char*)sa;
        if (((da ^ sa) & 15) != 0) {
            for (unsigned long long k = t; k < n; k += nt)
                dst[k] = src[k];
            continue;
        }
        unsigned long long head = (16 - (da & 15)) & 15;
        if (head > n)
            head = n;
        if (t < head)
            dst[t] = src[t];
        const unsigned long long words = (n - head) >> 4;
        uint4* dw = (uint4*)(dst + head);
        const uint4* sw = (const uint4*)(src + head);
        unsigned long long w = t;
        for (; w + 3 * nt < words; w += 4 * nt) {
            const uint4 a = sw[w], b = sw[w + nt], c = sw[w + 2 * nt], d = sw[w + 3 * nt];
            dw[w] = a;
            dw[w + nt] = b;
            dw[w + 2 * nt] = c;
            dw[w + 3 * nt] = d;
        }
        for (; w < words; w += nt)
            dw[w] = sw[w];
        for (unsigned long long k = head + (words << 4) + t; k < n; k += nt)
            dst[k] = src[k];
    }
}
