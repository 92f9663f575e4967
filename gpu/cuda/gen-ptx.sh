#!/bin/sh
# Regenerates scatter.ptx from scatter.cu (needs a CUDA toolkit's nvcc; the
# build and the daemon do not: the PTX is embedded and JIT-compiled by the
# driver). Run from gpu/cuda.
set -e
nvcc -ptx -arch=compute_80 -o scatter.ptx scatter.cu
