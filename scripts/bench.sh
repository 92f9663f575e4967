#!/usr/bin/env bash
# bench.sh: run tensorfs's benchmarks against the FUSE floor (a minimal
# in-process go-fuse filesystem) and tmpfs in one `go test` run, and print a
# markdown table of medians, spreads and ratios.
#
# Usage: scripts/bench.sh [COUNT]
#   COUNT        rounds (-count), default 5; also settable as $COUNT
#   BENCHTIME    -benchtime per sub-benchmark and round, default 1s
#   BENCH        -bench regexp, default all three benchmarks
#   RAW          file to keep the raw `go test` output in (default: a temp file)
#   STRICT=1     exit 2 when a goal is missed (default: report only)
#
# Needs root (tmpfs and FUSE mounts). Exits non-zero when the benchmarks fail,
# when a result is missing, or when a benchmark mount is left behind.
#
# Ratios are computed within this one run. Metadata (CreateUnlink64K) is a time
# ratio, tensorfs time per op / reference time per op (goal vs floor <= 1.2);
# data I/O (SeqWrite256M, SeqRead256M) is a throughput ratio, tensorfs MB/s /
# reference MB/s (goal vs floor >= 0.9). Each round runs every sub-benchmark
# once, one after the other, so the "rounds" column gives the range of the
# per-round ratios: a measure of how much the machine's noise moves them.
set -euo pipefail

cd "$(dirname "$0")/.."

COUNT=${1:-${COUNT:-5}}
BENCHTIME=${BENCHTIME:-1s}
BENCH=${BENCH:-'^Benchmark(CreateUnlink64K|SeqWrite256M|SeqRead256M)$'}
RAW=${RAW:-$(mktemp /tmp/tensorfs-bench.XXXXXX)}

case $COUNT in
'' | *[!0-9]*)
	echo "bench.sh: COUNT must be a positive integer, got '$COUNT'" >&2
	exit 64
	;;
esac

echo "# go test -run '^\$' -bench '$BENCH' -benchtime $BENCHTIME -count $COUNT -timeout 30m ./tests/" >&2
echo "# raw output: $RAW" >&2
status=0
go test -run '^$' -bench "$BENCH" -benchtime "$BENCHTIME" -count "$COUNT" -timeout 30m ./tests/ \
	>"$RAW" 2>&1 || status=$?
grep -E '^(goos|goarch|pkg|cpu|Benchmark|PASS|FAIL|ok)' "$RAW" >&2 || true

# The FUSE mounts are checked by the tests' TestMain; the tmpfs ones here.
if grep -q '^tensorfs-bench-tmpfs ' /proc/self/mounts; then
	echo "bench.sh: tmpfs mounts left behind:" >&2
	grep '^tensorfs-bench-tmpfs ' /proc/self/mounts >&2
	status=1
fi
if [ "$status" -ne 0 ]; then
	echo "bench.sh: benchmarks failed (exit $status); output in $RAW:" >&2
	grep -v '^Benchmark' "$RAW" | tail -40 >&2
	exit "$status"
fi

awk -v strict="${STRICT:-0}" -f scripts/benchstats.awk -f /dev/fd/3 "$RAW" 3<<'AWK'
function cell(key, unit,   m, r) {
	if (!((key, unit) in vals)) return "missing"
	m = median(vals[key, unit])
	split(minmax(vals[key, unit]), r, " ")
	return fmtnum(m) " (" fmtnum(r[1]) "–" fmtnum(r[2]) ")"
}
# ratio of tensorfs to ref: time ratio for ops, throughput ratio for MB/s;
# sets rmed (ratio of medians) and rlo/rhi (range of per-round ratios)
function ratio(tkey, rkey, unit,   i, n, a, b, x, lo, hi) {
	rmed = ""
	if (!((tkey, unit) in vals) || !((rkey, unit) in vals)) return
	rmed = median(vals[tkey, unit]) / median(vals[rkey, unit])
	n = split(vals[tkey, unit], a, " ")
	split(vals[rkey, unit], b, " ")
	lo = hi = ""
	for (i = 1; i <= n; i++) {
		if (!(i in b) || b[i] + 0 == 0) continue
		x = a[i] / b[i]
		if (lo == "" || x < lo) lo = x
		if (hi == "" || x > hi) hi = x
	}
	rlo = lo; rhi = hi
}
function rcell(tkey, rkey, unit) {
	ratio(tkey, rkey, unit)
	if (rmed == "") return "missing"
	return sprintf("%.2f (%.2f–%.2f)", rmed, rlo, rhi)
}
/^Benchmark/ && / ns\/op/ {
	name = $1
	sub(/-[0-9]+$/, "", name)
	split(name, p, "/")
	b = p[1]; sub(/^Benchmark/, "", b)
	v = p[2]
	key = b "/" v
	if (!(key in seen)) { seen[key] = 1 }
	units["ns/op"]; units["ops/s"]; units["MB/s"]
	for (u in units) {
		x = metric(u)
		if (x != "") vals[key, u] = ((key, u) in vals) ? vals[key, u] " " x : x
	}
}
END {
	missing = 0; missed = 0
	print "| benchmark | filesystem | median (min–max) | tensorfs/floor, rounds | tensorfs/tmpfs, rounds | goal vs floor | met |"
	print "| --- | --- | --- | --- | --- | --- | --- |"
	nb = split("CreateUnlink64K SeqWrite256M SeqRead256M", benches, " ")
	for (i = 1; i <= nb; i++) {
		b = benches[i]
		if (b == "CreateUnlink64K") {
			nt = split("tensorfs-template tensorfs-write", tv, " ")
			unit = "ops/s"; runit = "ns/op"; kind = "time"
		} else {
			nt = split("tensorfs", tv, " ")
			unit = "MB/s"; runit = "MB/s"; kind = "throughput"
		}
		if (!((b "/floor") in seen) && !((b "/" tv[1]) in seen)) continue
		rows++
		for (j = 1; j <= nt; j++) {
			tkey = b "/" tv[j]
			goal = (kind == "time") ? "time ≤ 1.20" : "throughput ≥ 0.90"
			rf = rcell(tkey, b "/floor", runit) # sets rmed
			if (rmed == "") { met = "n/a"; missing = 1 }
			else if (kind == "time") met = (rmed <= 1.2) ? "yes" : "**no**"
			else met = (rmed >= 0.9) ? "yes" : "**no**"
			if (met == "**no**") missed = 1
			rt = rcell(tkey, b "/tmpfs", runit)
			printf "| %s | %s | %s %s | %s | %s | %s | %s |\n", b, tv[j], cell(tkey, unit), unit, rf, rt, goal, met
		}
		printf "| %s | floor | %s %s | | | | |\n", b, cell(b "/floor", unit), unit
		printf "| %s | tmpfs | %s %s | | | | |\n", b, cell(b "/tmpfs", unit), unit
	}
	print ""
	print "Ratios: CreateUnlink64K is a time ratio (tensorfs s/op ÷ reference s/op; lower is better);"
	print "SeqWrite256M and SeqRead256M are throughput ratios (tensorfs MB/s ÷ reference MB/s; higher is better)."
	print "Each ratio is the ratio of the medians, then the range of the per-round ratios."
	if (!rows) { print "bench.sh: no benchmark results" > "/dev/stderr"; exit 1 }
	if (missing) { print "bench.sh: some results are missing" > "/dev/stderr"; exit 1 }
	if (missed) {
		print "bench.sh: a goal was missed" > "/dev/stderr"
		if (strict == 1) exit 2
	}
}
AWK
