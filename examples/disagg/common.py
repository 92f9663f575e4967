"""Shared by decode.py and prefill.py: options, the KV cache's layout, the block pattern.

The KV cache is one tensor per layer, ``/kv/layerL`` of shape
``[blocks, tokens, heads, head_dim]``: block ``b`` of layer ``L`` is the
``block_bytes`` bytes at ``b * block_bytes``. Prefill fills block ``b`` of
layer ``L`` with :func:`block_pattern` and decode checks it, byte for byte.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import tensorfs  # noqa: E402,F401

ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def parser(doc):
    """Options both sides take (so run.sh can pass one set to both)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mount", required=True, help="this node's tensorfs mountpoint")
    ap.add_argument("--peer", default="decode", help="prefill: the decode node's peer name (default decode)")
    ap.add_argument("--kv", default="/kv", help="the KV cache directory on the decode node (default /kv)")
    ap.add_argument("--notify-dir", default="/notify", help="where notifications arrive on the decode node")
    ap.add_argument("--request", default="req-1", help="the request id; its notification file's name")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=64, help="blocks per layer in the decode node's cache")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per block")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="BF16", choices=sorted(ITEMSIZE))
    ap.add_argument("--device", default="host", help="host or cuda:N (decode maps with CuPy/PyTorch on a GPU)")
    ap.add_argument("--mapper", default="auto", choices=["auto", "numpy", "cupy", "torch"],
                    help="decode: how to map the cache (auto: numpy on host, CuPy else PyTorch on a GPU)")
    ap.add_argument("--num-blocks", type=int, default=12, help="prefill: blocks of the request")
    ap.add_argument("--block-ids", default=None, help="prefill: comma-separated block ids (default: scattered, from --seed)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120, help="decode: seconds to wait for the notification")
    return ap


def block_shape(a):
    return (a.tokens, a.heads, a.head_dim)


def block_bytes(a):
    return a.tokens * a.heads * a.head_dim * ITEMSIZE[a.dtype]


def block_pattern(np, layer, ids, nbytes):
    """The bytes prefill writes into blocks ``ids`` of ``layer``: a (len(ids), nbytes) uint8 array."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1, 1)
    i = np.arange(nbytes, dtype=np.int64).reshape(1, -1)
    return ((i * 7 + ids * 131 + layer * 17 + 1) % 251).astype(np.uint8)
