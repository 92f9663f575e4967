#!/usr/bin/env bash
# gpu-ab.sh: an A/B of the in-place benchmarks that miss their goals, on a
# GPU host without Go, between builds of tensorfs carried there, in one
# call (device machines differ from call to call: compare only within one).
#
#   scripts/gpu-ab.sh DIR [DIR...]
#
# Each DIR holds a build (scripts/gpu-check.sh build's gpubin/, or a copy of
# it: tensorfs and tests.test, plain or gzipped). For ROUNDS rounds (default
# 2), the builds take turns, each running, into $OUT/ab.txt:
#   cuda:0  BenchmarkInPlace4K (ipc, tcp), BenchmarkInPlaceScatter1000x8K/ipc,
#           BenchmarkInPlaceBig/ipc of 1 GiB
#   host    BenchmarkInPlaceScatter1000x8K/tcp, BenchmarkInPlaceBig/tcp of
#           8 MiB (the scatter's bytes in one range)
# and, once a round, scripts/gpu_floor.py (the GPU floors: 4 KiB copy and
# sync, one scatter kernel over 1000 x 8 KiB, 1 GiB from an IPC-opened
# pointer). The lines "== ROUND BUILD" head each part; scripts/ab_summary.py
# turns them into $OUT/summary.txt, each p50 with its ratio. Needs root
# (FUSE) and CuPy for the floors (the device's /opt/torch/.venv).
#
# Environment: ROUNDS; N4K (rounds of 1000 copies for the 4 KiB rows,
# default 3), NSCATTER (calls, default 300), NBIG (1 GiB calls, default
# 100), NTCP (calls on TCP, default 200); TIMEOUT per benchmark (5m).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
ROUNDS=${ROUNDS:-2} N4K=${N4K:-3} NSCATTER=${NSCATTER:-300} NBIG=${NBIG:-100} NTCP=${NTCP:-200}
TIMEOUT=${TIMEOUT:-5m}
[ $# -gt 0 ] || { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 64; }
for d in "$@"; do
	for f in tensorfs tests.test; do
		[ -e "$d/$f.gz" ] && gunzip -kf "$d/$f.gz" && chmod +x "$d/$f" # a .gz made from a pipe keeps no mode
		[ -x "$d/$f" ] || { echo "gpu-ab.sh: $d/$f missing" >&2; exit 64; }
	done
done
export PATH=/opt/torch/.venv/bin:$PATH
log=$OUT/ab.txt
: >"$log"
rc=0
bench() { # BUILD-DIR DEVICE ENV... -- BENCH BENCHTIME
	local d=$1 dev=$2
	shift 2
	local envs=()
	while [ "$1" != -- ]; do envs+=("$1"); shift; done
	shift
	(cd tests && env TENSORFS_BIN="$d/tensorfs" TENSORFS_TEST_DEVICE="$dev" "${envs[@]}" \
		timeout "$TIMEOUT" "$d/tests.test" -test.run='^$' -test.bench="$1" -test.benchtime="$2" -test.count=1) 2>&1 |
		grep -E '^(Benchmark|--- FAIL|FAIL|panic)' >>"$log" || rc=1
}
for r in $(seq "$ROUNDS"); do
	echo "== $r floors" >>"$log"
	python3 scripts/gpu_floor.py >>"$log" 2>&1 || rc=1
	for d in "$@"; do
		d=$(cd "$d" && pwd)
		echo "== $r $d ($(cat "$d/COMMIT" 2>/dev/null))" >>"$log"
		bench "$d" cuda:0 -- 'BenchmarkInPlace4K' "${N4K}x"
		bench "$d" cuda:0 -- 'BenchmarkInPlaceScatter1000x8K/ipc' "${NSCATTER}x"
		bench "$d" cuda:0 INPLACE_BIG_MB=1024 -- 'BenchmarkInPlaceBig/ipc' "${NBIG}x"
		bench "$d" "" -- 'BenchmarkInPlaceScatter1000x8K/tcp' "${NTCP}x"
		bench "$d" "" INPLACE_BIG_MB=8 -- 'BenchmarkInPlaceBig/tcp' "${NTCP}x"
	done
done
left=$(grep -E '^tensorfs[^ ]* [^ ]+ fuse' /proc/mounts | awk '{print $2}')
[ -z "$left" ] || { echo "FUSE mounts left behind: $left" >>"$log"; rc=1; }
cat "$log"
python3 scripts/ab_summary.py "$log" | tee "$OUT/summary.txt"
exit $rc
