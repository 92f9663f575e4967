#!/usr/bin/env python3
"""The decode node of a disaggregated-serving example: a KV cache filled in place.

Creates its KV cache once, as one tensor per layer (``/kv/layerL``, a
directory template of ``[blocks, tokens, heads, head_dim]``), maps every
layer once at start (``open_numpy`` on host memory; ``open_cupy``, or
``open_torch`` without CuPy, on ``--device cuda:N``), fills it with a
sentinel byte through those mappings, prints ``decode: ready``, and waits
(inotify) for the request's notification file ``/notify/REQUEST``. Prefill
pushes the request's blocks into the cache in place and the notification
last, in one batch. Decode then reads the notification (JSON: request id,
block ids), checks every byte of those blocks through the mappings it made at
start, checks that every other block still holds the sentinel and that no
layer's mr_id, ipc_id or generation changed, prints one summary line and
exits 0; any mismatch exits 1. It removes its cache and notification at exit.
"""

import json
import os
import signal
import sys
import time

import common
from common import tensorfs

SENTINEL = 0xEE


def raw_rows(mapped, blocks):
    """The mapping's bytes as (blocks, block_bytes) uint8, on its device."""
    a = mapped.array
    if mapped.kind == "torch":
        import torch
        return a.reshape(-1).view(torch.uint8).reshape(blocks, -1)
    return a.reshape(-1).view("uint8").reshape(blocks, -1)


def take(mapped, rows, idx):
    """Rows idx (a list of block ids) of rows, copied to host memory as NumPy."""
    if mapped.kind == "cupy":
        import cupy
        return cupy.asnumpy(rows[cupy.asarray(idx, dtype=cupy.int64)])
    if mapped.kind == "torch":
        import torch
        return rows[torch.as_tensor(idx, dtype=torch.int64, device=rows.device)].cpu().numpy()
    import numpy as np
    return rows[np.asarray(idx, dtype=np.int64)]


def sync(mapped):
    if mapped.kind == "cupy":
        import cupy
        cupy.cuda.runtime.deviceSynchronize()
    elif mapped.kind == "torch":
        import torch
        torch.cuda.synchronize()


def main():
    a = common.parser(__doc__).parse_args()
    import numpy as np
    # SIGTERM (run.sh, the Go test) unwinds through the finally below: the
    # cache is removed and the mappings' leases closed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    m = tensorfs.Mount(a.mount)
    bb = common.block_bytes(a)
    os.mkdir(m.path(a.kv))
    made = [a.kv]
    os.setxattr(m.path(a.kv), "user.tensorfs.dtype", a.dtype.encode())
    os.setxattr(m.path(a.kv), "user.tensorfs.shape",
                ",".join(map(str, (a.blocks,) + common.block_shape(a))).encode())
    if a.device != "host":
        os.setxattr(m.path(a.kv), "user.tensorfs.device", a.device.encode())
    if not os.path.isdir(m.path(a.notify_dir)):
        os.makedirs(m.path(a.notify_dir))
        made.append(a.notify_dir)
    maps, layers = [], []
    try:
        for layer in range(a.layers):
            p = "%s/layer%d" % (a.kv, layer)
            os.close(os.open(m.path(p), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644))  # allocated by the template
            layers.append(p)
        opener = m.open_numpy
        if a.mapper != "auto":
            opener = getattr(m, "open_" + a.mapper)
        elif a.device.startswith("cuda"):
            try:
                import cupy  # noqa: F401
                opener = m.open_cupy
            except ImportError:
                opener = m.open_torch
        for p in layers:
            t = opener(p)
            maps.append(t)
            raw_rows(t, a.blocks)[...] = SENTINEL
            sync(t)
        ids_before = [(t.info["mr_id"], t.info["ipc_id"], t.info["generation"]) for t in maps]
        kind = maps[0].kind if maps else "-"
        print("decode: ready: %d layers x %d blocks x %d bytes (%s %s on %s, mapped with %s)" % (
            a.layers, a.blocks, bb, a.dtype, (a.blocks,) + common.block_shape(a), a.device, kind), flush=True)

        t0 = time.monotonic()
        note_path = m.wait_for(a.notify_dir, a.request, timeout=a.timeout)
        waited = time.monotonic() - t0
        with open(note_path, "rb") as f:
            note = json.loads(f.read().decode())
        ids = [int(b) for b in note["blocks"]]
        if note.get("request") != a.request:
            sys.exit("decode: FAILED: notification names request %r, want %r" % (note.get("request"), a.request))
        bad = []
        others = np.ones(a.blocks, dtype=bool)
        others[ids] = False
        for layer, t in enumerate(maps):
            sync(t)
            rows = raw_rows(t, a.blocks)
            got = take(t, rows, ids)
            want = common.block_pattern(np, layer, ids, bb)
            for j in np.nonzero((got != want).any(axis=1))[0]:
                first = int(np.nonzero(got[j] != want[j])[0][0])
                bad.append("layer %d block %d: first wrong byte at %d (%d, want %d)" % (
                    layer, ids[j], first, got[j][first], want[j][first]))
            rest_ids = np.nonzero(others)[0].tolist()
            if rest_ids and not (take(t, rows, rest_ids) == SENTINEL).all():
                bad.append("layer %d: a block outside the request changed" % layer)
            now = m.info(layers[layer])
            if (now["mr_id"], now["ipc_id"], now["generation"]) != ids_before[layer]:
                bad.append("layer %d: ids changed %s -> %s" % (layer, ids_before[layer],
                                                               (now["mr_id"], now["ipc_id"], now["generation"])))
        if bad:
            for b in bad[:20]:
                print("decode: " + b, file=sys.stderr)
            print("decode: FAILED: request %s: %d mismatches" % (a.request, len(bad)))
            return 1
        print("decode: OK: request %s: %d blocks x %d layers (%d bytes) verified in place through the "
              "%d mappings made at start; %d other blocks untouched; mr_id/ipc_id/generation unchanged; "
              "notified %.0f ms after waiting began" % (
                  a.request, len(ids), a.layers, len(ids) * a.layers * bb, len(maps),
                  a.blocks - len(set(ids)), waited * 1000))
        return 0
    finally:
        for t in maps:
            t.close()
        for p in layers:
            os.unlink(m.path(p))
        try:
            os.unlink(m.path("%s/%s" % (a.notify_dir, a.request)))
        except FileNotFoundError:
            pass
        for d in reversed(made):
            os.rmdir(m.path(d))


if __name__ == "__main__":
    sys.exit(main())
