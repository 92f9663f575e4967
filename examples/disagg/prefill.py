#!/usr/bin/env python3
"""The prefill node of a disaggregated-serving example: push a request's KV blocks in place.

Computes (here: a deterministic pattern per layer and block id) the KV
blocks of one request into staging tensors on its own node
(``/prefill/REQUEST/layerL``, the request's blocks back to back), then sends
them, in ONE ``batch`` call, into the decode node's cache at the request's
scattered block ids, IN PLACE (block j of ``/prefill/REQUEST/layerL`` ->
``decode:/kv/layerL`` at BLOCK*BLOCKBYTES: one ``tensorfs.ranges`` record
per layer, from arrays of offsets, a binary range list), with a last whole-tensor line: the
small notification file ``decode:/notify/REQUEST`` whose bytes are JSON with
the request id and the block ids. The daemon commits that line only after
every in-place byte before it has landed, so its arrival (IN_MOVED_TO on the
decode node) is the request's arrival. A batch over 64 KiB of lines is split
by the client into several calls, the notification in the last.
"""

import json
import os
import random
import shutil
import sys
import time

import common
from common import tensorfs


def main():
    a = common.parser(__doc__).parse_args()
    import numpy as np
    m = tensorfs.Mount(a.mount)
    bb = common.block_bytes(a)
    if a.block_ids:
        ids = [int(x) for x in a.block_ids.split(",")]
    else:
        ids = random.Random(a.seed).sample(range(a.blocks), min(a.num_blocks, a.blocks))
    stage = "/prefill/%s" % a.request
    os.makedirs(m.path(stage))
    try:
        os.setxattr(m.path(stage), "user.tensorfs.dtype", a.dtype.encode())
        os.setxattr(m.path(stage), "user.tensorfs.shape",
                    ",".join(map(str, (len(ids),) + common.block_shape(a))).encode())
        if a.device != "host":
            os.setxattr(m.path(stage), "user.tensorfs.device", a.device.encode())
        lines = []
        for layer in range(a.layers):
            p = "%s/layer%d" % (stage, layer)
            # The "prefill computation": written through the file (direct I/O
            # into the tensor's memory, host or GPU).
            with open(m.path(p), "xb", buffering=0) as f:
                f.write(common.block_pattern(np, layer, ids, bb).tobytes())
            # Block j of the staging tensor into block ids[j] of the layer.
            lines.append(tensorfs.ranges(p, "%s:%s/layer%d" % (a.peer, a.kv, layer),
                                         np.arange(len(ids)) * bb, np.array(ids) * bb, bb))
        note = json.dumps({"request": a.request, "blocks": ids, "layers": a.layers}).encode()
        note_path = "%s.notify" % stage
        m.create(note_path, "U8", (len(note),))
        with open(m.path(note_path), "r+b", buffering=0) as f:
            f.write(note)
        lines.append((note_path, "%s:%s/%s" % (a.peer, a.notify_dir, tensorfs.ref(a.request))))
        t0 = time.monotonic()
        calls = m.batch(lines)
        took = time.monotonic() - t0
        n = len(ids) * a.layers
        print("prefill: request %s: %d blocks (%d layers x %d) = %d bytes in place into %s:%s in %d batch "
              "call(s) with the notification last, %.1f ms (%.2f GB/s)" % (
                  a.request, n, a.layers, len(ids), n * bb, a.peer, a.kv, calls, took * 1000,
                  n * bb / took / 1e9 if took else 0))
        return 0
    finally:
        shutil.rmtree(m.path(stage), ignore_errors=True)
        for leftover in (m.path("%s.notify" % stage),):
            if os.path.exists(leftover):
                os.unlink(leftover)
        try:
            os.rmdir(m.path("/prefill"))
        except OSError:
            pass  # other requests' staging is still there


if __name__ == "__main__":
    sys.exit(main())
