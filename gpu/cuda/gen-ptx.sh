#!/bin/sh
# Regenerates scatter.ptx from scatter.cu; run from gpu/cuda on a machine
# with a CUDA toolkit (the build and the daemon need none: the PTX is
# embedded in the binary and JIT-compiled by the driver at the first batch).
#
# The committed scatter.ptx was made on the device machine (NVIDIA H200,
# driver 580.159.04) by nvcc 13.0 (V13.0.88) with exactly these two steps.
# nvcc 13.0 labels its PTX ".version 9.0", which only a CUDA 13 (580+)
# driver loads; the kernel uses nothing newer than PTX ISA 7.0 (CUDA 11.0,
# the first with sm_80: ld/st .v4.u32, ld.global.nc.u64, min.u64, plain
# branches), so the second step relabels it 7.0 and any driver from CUDA
# 11.0 on loads it. TestRealCopyBatch fails if the embedded kernel does not
# load on the GPU it runs on.
set -e
nvcc -ptx -arch=compute_80 -o scatter.ptx scatter.cu
sed -i 's/^\.version [0-9.]*$/.version 7.0/' scatter.ptx
