#!/usr/bin/env bash
# peerbench.sh: run tensorfs's peer-copy benchmarks (tests/peerbench_test.go)
# with their raw TCP baselines in one `go test` run, and print a markdown
# table of medians, ranges and ratios.
#
# Usage: scripts/peerbench.sh [COUNT]
#   COUNT        rounds (-count), default 3; also settable as $COUNT
#   BENCHTIME    -benchtime per sub-benchmark and round, default 1x (one op:
#                one 1 GiB copy, one copy of the 1000-tensor tree or 1000
#                per-file copies, 1000 timed 4 KiB copies)
#   BENCH        -bench regexp, default all three benchmarks
#   RAW          file to keep the raw `go test` output in (default: a temp file)
#   STRICT=1     exit 2 when a goal is missed (default: report only)
#   PEERBENCH_STREAMS  TCP streams per copy: the daemons' --streams and the
#                raw baselines' connections (default: the daemons' default)
#   TENSORFS_BIN benchmark this tensorfs binary (default: built by the tests)
#
# Needs root (FUSE mounts) and about 6 GiB of free memory (the 1 GiB source,
# destinations and raw buffers). Exits non-zero when a benchmark fails, a
# result is missing, or a mount of this run is left behind (the run mounts
# under its own TMPDIR, so other runs' mounts are not looked at).
#
# Ratios are computed within this one run, round by round: each round is one
# test process that runs every sub-benchmark once, tensorfs right before its
# baseline. Throughput
# ratios (tensorfs MB/s ÷ raw MB/s, dir tensors/s ÷ per-file tensors/s) are
# better higher; latency ratios (tensorfs µs ÷ raw µs) better lower. A ratio
# cell is the ratio of the medians, then the range of the per-round ratios.
set -euo pipefail

cd "$(dirname "$0")/.."

COUNT=${1:-${COUNT:-3}}
BENCHTIME=${BENCHTIME:-1x}
BENCH=${BENCH:-'^BenchmarkPeer(Copy1G|Tree1000x64K|SmallCopy4K)$'}
RAW=${RAW:-$(mktemp /tmp/tensorfs-peerbench.XXXXXX)}

case $COUNT in
'' | *[!0-9]* | 0)
	echo "peerbench.sh: COUNT must be a positive integer, got '$COUNT'" >&2
	exit 64
	;;
esac

run_tmp=$(mktemp -d /tmp/tensorfs-peerbench-tmp.XXXXXX)
ours() { awk -v p="$run_tmp/" '$3 ~ /^fuse/ && index($2, p) == 1 {print $2}' /proc/mounts; }
finish() {
	rc=$?
	left=$(ours)
	if [ -n "$left" ]; then
		echo "peerbench.sh: FUSE mounts left behind: $left" >&2
		for m in $left; do umount -l "$m" 2>/dev/null || true; done
		rc=1
	fi
	rm -rf "$run_tmp"
	exit $rc
}
trap finish EXIT

# One process per round, so that each round runs every sub-benchmark once,
# tensorfs right before its baseline (with -count N, go test would run each
# sub-benchmark N times in a row instead).
bindir=$run_tmp/bin
mkdir -p "$bindir"
if [ -z "${TENSORFS_BIN:-}" ]; then
	CGO_ENABLED=0 go build -o "$bindir/tensorfs" ./cmd/tensorfs
	export TENSORFS_BIN=$bindir/tensorfs
fi
go test -c -o "$bindir/tests.test" ./tests/
echo "# $COUNT rounds of: go test -run '^\$' -bench '$BENCH' -benchtime $BENCHTIME -count 1 ./tests/ (TENSORFS_BIN=$TENSORFS_BIN, PEERBENCH_STREAMS=${PEERBENCH_STREAMS:-default})" >&2
echo "# raw output: $RAW" >&2
: >"$RAW"
status=0
for round in $(seq "$COUNT"); do
	echo "# round $round" >>"$RAW"
	(cd tests && TMPDIR=$run_tmp "$bindir/tests.test" -test.run '^$' -test.bench "$BENCH" \
		-test.benchtime "$BENCHTIME" -test.count 1 -test.timeout 20m) >>"$RAW" 2>&1 || status=$?
	[ "$status" -eq 0 ] || break
done
grep -E '^(# round|goos|goarch|pkg|cpu|Benchmark|PASS|FAIL|ok)' "$RAW" >&2 || true
if [ "$status" -ne 0 ]; then
	echo "peerbench.sh: benchmarks failed (exit $status); output in $RAW:" >&2
	grep -v '^Benchmark' "$RAW" | tail -40 >&2
	exit "$status"
fi

awk -v strict="${STRICT:-0}" -f scripts/benchstats.awk -f /dev/fd/3 "$RAW" 3<<'AWK'
# values of key and unit, each divided by scale
function scaled(key, unit, scale,   a, n, i, out) {
	n = split(vals[key, unit], a, " ")
	out = ""
	for (i = 1; i <= n; i++) out = out (i > 1 ? " " : "") (a[i] / scale)
	return out
}
function cell(key, unit, scale, label,   l, m, r) {
	if (!((key, unit) in vals)) { missing = 1; return "missing" }
	l = scaled(key, unit, scale)
	m = median(l)
	split(minmax(l), r, " ")
	return fmtnum(m) " (" fmtnum(r[1]) "–" fmtnum(r[2]) ") " label
}
# ratio of key t to key r in unit: sets rmed (ratio of medians) and rlo/rhi
# (range of the per-round ratios); returns the cell
function rcell(t, r, unit,   i, n, a, b, x, lo, hi) {
	rmed = ""
	if (!((t, unit) in vals) || !((r, unit) in vals)) { missing = 1; return "missing" }
	rmed = median(vals[t, unit]) / median(vals[r, unit])
	n = split(vals[t, unit], a, " ")
	split(vals[r, unit], b, " ")
	lo = hi = ""
	for (i = 1; i <= n; i++) {
		if (!(i in b) || b[i] + 0 == 0) continue
		x = a[i] / b[i]
		if (lo == "" || x < lo) lo = x
		if (hi == "" || x > hi) hi = x
	}
	return sprintf("%.2f (%.2f–%.2f)", rmed, lo, hi)
}
# one table row: what, tensorfs key, baseline key, unit, scale, label,
# goal text, goal kind (min: ratio >= g; none)
function row(what, t, r, unit, scale, label, goaltext, kind, g,   rc, met) {
	if (!(t in seen) && !(r in seen)) return
	rows++
	rc = rcell(t, r, unit)
	if (rmed == "") met = "n/a"
	else if (kind == "min") met = (rmed >= g) ? "yes" : "**no**"
	else met = "—"
	if (met == "**no**") missed = 1
	printf "| %s | %s | %s | %s | %s | %s |\n", what, cell(t, unit, scale, label), cell(r, unit, scale, label), rc, goaltext, met
}
/^Benchmark/ && / ns\/op/ {
	name = $1
	sub(/-[0-9]+$/, "", name)
	split(name, p, "/")
	b = p[1]; sub(/^Benchmark/, "", b)
	key = b "/" p[2]
	seen[key] = 1
	nu = split("MB/s tensors/s p50-us p99-us us/copy", us, " ")
	for (i = 1; i <= nu; i++) {
		x = metric(us[i])
		if (x != "") vals[key, us[i]] = ((key, us[i]) in vals) ? vals[key, us[i]] " " x : x
	}
}
END {
	missing = 0; missed = 0
	print "| benchmark | tensorfs: median (min–max) | baseline: median (min–max) | ratio, rounds | goal | met |"
	print "| --- | --- | --- | --- | --- | --- |"
	row("1 GiB push, new destination (vs raw TCP into a fresh `make`)", "PeerCopy1G/tensorfs-new", "PeerCopy1G/raw-new", "MB/s", 1, "MB/s", "throughput ≥ 0.90", "min", 0.9)
	row("1 GiB push, existing destination (vs raw TCP into a reused buffer)", "PeerCopy1G/tensorfs-existing", "PeerCopy1G/raw-existing", "MB/s", 1, "MB/s", "throughput ≥ 0.90", "min", 0.9)
	row("1000 × 64 KiB, existing destinations: one directory copy_to (vs 1000 per-file copy_to)", "PeerTree1000x64K/dir", "PeerTree1000x64K/files", "tensors/s", 1, "tensors/s", "rate ≥ 10", "min", 10)
	row("1000 × 64 KiB, existing destinations: the same, in GB/s", "PeerTree1000x64K/dir", "PeerTree1000x64K/files", "MB/s", 1000, "GB/s", "—", "none", 0)
	row("1000 × 64 KiB, new destinations: one directory copy_to (vs 1000 per-file copy_to)", "PeerTree1000x64K/dir-new", "PeerTree1000x64K/files-new", "tensors/s", 1, "tensors/s", "rate ≥ 10", "min", 10)
	row("1000 × 64 KiB, new destinations: the same, in GB/s", "PeerTree1000x64K/dir-new", "PeerTree1000x64K/files-new", "MB/s", 1000, "GB/s", "—", "none", 0)
	row("4 KiB copy_to round trip, p50 (vs 4 KiB request/reply on an open connection)", "PeerSmallCopy4K/tensorfs", "PeerSmallCopy4K/raw", "p50-us", 1, "µs", "(none; time ratio)", "none", 0)
	row("4 KiB copy_to round trip, p99", "PeerSmallCopy4K/tensorfs", "PeerSmallCopy4K/raw", "p99-us", 1, "µs", "(none; time ratio)", "none", 0)
	row("4 KiB copy_to round trip, mean", "PeerSmallCopy4K/tensorfs", "PeerSmallCopy4K/raw", "us/copy", 1, "µs", "(none; time ratio)", "none", 0)
	print ""
	print "Ratios: tensorfs ÷ baseline, round by round; throughput and rate ratios are better higher, latency (µs) ratios better lower."
	print "Each ratio is the ratio of the medians, then the range of the per-round ratios."
	if (!rows) { print "peerbench.sh: no benchmark results" > "/dev/stderr"; exit 1 }
	if (missing) { print "peerbench.sh: some results are missing" > "/dev/stderr"; exit 1 }
	if (missed) {
		print "peerbench.sh: a goal was missed" > "/dev/stderr"
		if (strict == 1) exit 2
	}
}
AWK
