#!/usr/bin/env python3
"""ab_summary.py AB_TXT: scripts/gpu-ab.sh's output (ab.txt) as one line per round,
build and benchmark, sorted by benchmark, build, round: the p50 in µs and its ratio
to the floor issue 12 names for it (the small-copy floor, setxattr + request/reply +
copy, of the same build and round, with the round's GPU floor where one applies:
the 4 KiB device copy, one scatter kernel, 1 GiB from an IPC-opened pointer, as
internal/cmd/benchreport's GPU rows), or to raw TCP. Standard
library only (it runs on the GPU host too)."""
import re
import sys


def main(path):
    cur, floors, rows = None, {}, []
    for line in open(path).read().splitlines():
        m = re.match(r"== (\d+) floors", line)
        if m:
            cur = ("floors", m.group(1))
            continue
        m = re.match(r"== (\d+) (\S+)", line)
        if m:
            cur = (m.group(2).rstrip("/").split("/")[-1], m.group(1))
            continue
        if line.startswith("Benchmark"):
            name = line.split()[0].rsplit("-", 1)[0].replace("BenchmarkInPlace", "")
            mets = {u: float(v) for v, u in re.findall(r"([0-9.]+) ([\w/-]+)", line)}
            rows.append((cur[0], cur[1], name, mets))
        elif cur and cur[0] == "floors" and len(line.split()) == 2:
            k, v = line.split()
            floors.setdefault(cur[1], {})[k] = float(v)
    out = []
    for build, rnd, name, m in rows:
        f = floors.get(rnd, {})
        small = [x[3] for x in rows if x[:3] == (build, rnd, "4K/ipc")]
        small = small[0]["floor-us"] if small else None
        if name in ("Scatter1000x8K/ipc", "Scatter1000x8K/ipc-binary") and small is not None and "scatter-us" in f:
            fl = small + f["scatter-us"]
            extra = "floor %.1f x-floor %.2f" % (fl, m["p50-us"] / fl)
        elif name == "Big/ipc" and small is not None and "ipc1g-us" in f:
            fl = small + f["ipc1g-us"]
            extra = "floor %.1f ratio %.3f idle-setxattr %.1f setxattr %.1f" % (
                fl, fl / m["p50-us"], m.get("idle-setxattr-us", 0), m.get("setxattr-us", 0))
        elif name.startswith("4K") and "copy4k-us" in f:
            # benchreport's gpu-inplace-4k rows: the copy is the device's
            # (copy4k-us), not the memmove of the benchmark's own floor-us.
            fl = m["setxattr-us"] + m["reqreply-us"] + f["copy4k-us"]
            extra = "floor %.1f (setxattr %.1f) x-floor %.2f | host-floor x %.2f | fd-p50 %s" % (
                fl, m["setxattr-us"], m["p50-us"] / fl, m["x-floor"], m.get("fd-p50-us", "-"))
        elif name.startswith("4K"):
            extra = "floor %.1f (setxattr %.1f) x-floor %.2f | fd-p50 %s fd-x-floor %s" % (
                m["floor-us"], m["setxattr-us"], m["x-floor"], m.get("fd-p50-us", "-"), m.get("fd-x-floor", "-"))
        elif "x-raw" in m:
            extra = "x-raw %.3f" % m["x-raw"]
        else:
            extra = ""
        out.append((name, build, rnd, "%s %s %s p50 %.1f %s" % (rnd, build, name, m["p50-us"], extra)))
    for *_, line in sorted(out):
        print(line)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
