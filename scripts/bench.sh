#!/usr/bin/env bash
# bench.sh: every benchmark of the repository in one invocation, each next
# to its floor measured in the same run, over several rounds; one result.
#
# Usage: scripts/bench.sh [--quick] [--rounds N] [--out DIR] [--strict]
#   --quick      one round, short: the in-place sizes small (32 MiB, a
#                4K,1M sweep) and few iterations (the 1 GiB peer copies and
#                256 MiB file I/O stay), under 2 minutes on 2 cores: a smoke
#                test that every benchmark runs and the report, JSON and
#                plot come out (CI runs it: scripts/test.sh), not figures
#   --rounds N   rounds (default 3; --quick 1): one test process per
#                benchmark set and round, tensorfs right before its floor
#   --out DIR    where the result goes (default bench/results/DATE-HOST-COMMIT,
#                with --quick a new temporary directory)
#   --strict     exit 2 when a goal is missed (default: report only)
# Environment: BENCH_BIN_DIR, a directory with prebuilt tensorfs, tests.test
#   and benchreport (scripts/gpu-check.sh build makes them; for a GPU host
#   without Go), and BENCH_COMMIT, the commit they were built from.
#
# The result directory holds result.json (machine, CPU count, kernel, GPU
# and driver, Go version, commit, date, and every row: tensorfs, floor and
# ratio as median/min/max over the rounds, goal, met), table.md (printed
# too), sweep.png (in-place copy_to against size, IPC and TCP paths, with
# their floors) and raw-N.txt (each round's go test output). On a host with
# a GPU (nvidia-smi lists one, and python3 has CuPy for the GPU floors:
# scripts/gpu_floor.py) the GPU rows run as well; without one the result
# says they were skipped. Needs root (FUSE and tmpfs mounts) and about 6 GiB
# of free memory (the 1 GiB peer copies). Exits non-zero when a benchmark
# fails, a row has no result, or a mount of this run is left behind.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

quick=0 rounds= out= strict=
while [ $# -gt 0 ]; do
	case $1 in
	--quick) quick=1 ;;
	--rounds | --out)
		[ $# -ge 2 ] && [ -n "$2" ] || { echo "bench.sh: $1 takes a value (see --help)" >&2; exit 64; }
		if [ "$1" = --rounds ]; then rounds=$2; else out=$2; fi
		shift ;;
	--strict) strict=-strict ;;
	-h | --help) sed -n '2,/^set -e/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	*) echo "bench.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
	esac
	shift
done
[ -n "$rounds" ] || rounds=$([ $quick = 1 ] && echo 1 || echo 3)
case $rounds in
'' | *[!0-9]* | 0*) echo "bench.sh: --rounds takes a positive integer, got '$rounds'" >&2; exit 64 ;;
esac

run_tmp=$(mktemp -d /tmp/tensorfs-bench-run.XXXXXX)
ours() { awk -v p="$run_tmp/" '($3 ~ /^fuse/ || $1 == "tensorfs-bench-tmpfs") && index($2, p) == 1 {print $2}' /proc/mounts; }
child= interrupted=
finish() {
	rc=$?
	left=$(ours)
	if [ -n "$left" ]; then
		# After an interruption the killed benchmark's mounts are expected.
		[ -n "$interrupted" ] || { echo "bench.sh: mounts left behind: $left" >&2; rc=1; }
		for m in $left; do umount -l "$m" 2>/dev/null || true; done
	fi
	rm -rf "$run_tmp"
	exit $rc
}
trap finish EXIT
# A signal to this script alone reaches the benchmark running now, and the
# script waits for it before it cleans up under it.
on_signal() {
	interrupted=1
	if [ -n "$child" ]; then
		kill -"$1" "$child" 2>/dev/null || true
		# A benchmark killed with a request of its own in-process FUSE floor
		# in flight never exits (a zombie whose thread waits on the dead
		# server): abort this run's FUSE connections (fusectl; the device
		# numbers from mountinfo, no syscall on the mounts) after a grace.
		exited() { # gone, or a zombie with no thread left
			[ ! -d "/proc/$child" ] || { [ "$(awk '{print $3}' "/proc/$child/stat" 2>/dev/null)" = Z ] && [ "$(ls "/proc/$child/task" 2>/dev/null | wc -l)" -le 1 ]; }
		}
		for _ in 1 2 3 4 5 6 7 8 9 10; do exited && break; sleep 0.3; done
		if ! exited; then
			mountpoint -q /sys/fs/fuse/connections || mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null || true
			awk -v p="$run_tmp/" 'index($5, p) == 1 {split($3, d, ":"); print d[2]}' /proc/self/mountinfo |
				while read -r n; do echo 1 >"/sys/fs/fuse/connections/$n/abort" 2>/dev/null || true; done
		fi
		wait "$child" 2>/dev/null || true
	fi
	echo "bench.sh: interrupted (SIG$1)" >&2
	exit $((128 + $2))
}
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM
trap 'on_signal HUP 1' HUP

bindir=${BENCH_BIN_DIR:-}
if [ -z "$bindir" ]; then
	bindir=$run_tmp/bin
	mkdir -p "$bindir"
	echo "# building tensorfs, tests.test and benchreport" >&2
	CGO_ENABLED=0 go build -o "$bindir/tensorfs" ./cmd/tensorfs
	CGO_ENABLED=0 go test -c -o "$bindir/tests.test" ./tests
	CGO_ENABLED=0 go build -o "$bindir/benchreport" ./internal/cmd/benchreport
fi
for f in tensorfs tests.test benchreport; do
	[ -x "$bindir/$f" ] || { echo "bench.sh: $bindir/$f missing" >&2; exit 64; }
done
export TENSORFS_BIN=$bindir/tensorfs
commit=${BENCH_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}
if [ -z "$out" ]; then
	if [ $quick = 1 ]; then
		out=$(mktemp -d /tmp/tensorfs-bench-quick.XXXXXX)
	else
		out=bench/results/$(date -u +%Y-%m-%dT%H%MZ)-$(hostname -s)-$commit
	fi
fi
mkdir -p "$out"

# Benchmark sets: "NAME;BENCH regexp;benchtime;environment". Each runs as
# one test process per round. Quick sizes keep every benchmark, smaller.
if [ $quick = 1 ]; then
	big=32 sweep=4K,1M fusetime=100x seqtime=1x leasetime=5x scattertime=20x bigtime=5x gpuscattertime=20x
else
	# The GPU scatter's p50 from 2000 calls: of 20 (before 2026-12-07)
	# it took the first calls' imports and cold start, 208 µs where 6
	# runs of 3000 calls on the same H100 host gave 107-140.
	big=512 sweep=4K,64K,1M,16M,256M fusetime=1s seqtime=1s leasetime=1s scattertime=200x bigtime=10x gpuscattertime=2000x
fi
sets=(
	"fuse-meta;^BenchmarkCreateUnlink64K\$;$fusetime;"
	"fuse-io;^Benchmark(SeqWrite256M|SeqRead256M)\$;$seqtime;"
	"peer;^BenchmarkPeer(Copy1G|Tree1000x64K|SmallCopy4K)\$;1x;"
	"inplace-4k;^BenchmarkInPlace4K\$;1x;"
	"inplace-scatter;^BenchmarkInPlace(Scatter1000x8K|PullLayers)\$;$scattertime;"
	"inplace-big;^BenchmarkInPlaceBig\$;$bigtime;INPLACE_BIG_MB=$big"
	"inplace-sweep;^BenchmarkInPlaceSweep\$;1x;INPLACE_SWEEP=$sweep"
	"leases;^Benchmark(Revocation|ImportCache)\$;$leasetime;"
)
gpu=() skipped=() without=()
if command -v etcd >/dev/null; then
	sets+=("etcd;^BenchmarkEtcdScale\$;1x;")
else
	without+=(-without etcd-)
	skipped+=("etcd rows: no etcd server on this host (Debian's etcd-server)")
fi
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
	if python3 -c 'import cupy' 2>/dev/null; then
		gpu=(-gpu)
	else
		skipped+=("GPU rows: a GPU is here, but python3 has no CuPy for their floors (scripts/gpu_floor.py)")
	fi
else
	skipped+=("GPU rows: no GPU on this host (nvidia-smi lists none)")
fi

runset() { # runset ROUNDFILE NAME REGEXP BENCHTIME ENV
	local f=$1 name=$2 re=$3 bt=$4 env=$5
	echo "# set $name: -test.bench '$re' -test.benchtime $bt $env" >>"$f"
	(cd tests && exec env TMPDIR="$run_tmp" $env "$bindir/tests.test" -test.run '^$' -test.bench "$re" \
		-test.benchtime "$bt" -test.count 1 -test.timeout 20m) >>"$f" 2>&1 &
	child=$!
	local st=0
	wait "$child" || st=$?
	child=
	return $st
}

raws=()
status=0
for r in $(seq "$rounds"); do
	f=$out/raw-$r.txt
	raws+=("$f")
	echo "tensorfs-device: host" >"$f"
	for s in "${sets[@]}"; do
		IFS=';' read -r name re bt env <<<"$s"
		echo "# round $r/$rounds: $name ($SECONDS s in)" >&2
		runset "$f" "$name" "$re" "$bt" "$env" || { status=$?; echo "bench.sh: set $name failed (exit $status); see $f" >&2; break 2; }
	done
	if [ ${#gpu[@]} -gt 0 ]; then
		echo "# round $r/$rounds: GPU" >&2
		{
			echo "tensorfs-device: cuda:0"
			printf 'BenchmarkGPUFloor 1 1 ns/op'
			python3 scripts/gpu_floor.py | awk '{printf " %s %s", $2, $1}'
			echo
		} >>"$f" || { status=1; break; }
		for s in "gpu;^BenchmarkGPU(CreateUnlink64K|Overhead64K|Register1G|SeqWrite1G|SeqRead1G)\$;1s;TENSORFS_REQUIRE_GPU=1" \
			"gpu-inplace-4k;^BenchmarkInPlace4K\$;20x;TENSORFS_TEST_DEVICE=cuda:0" \
			"gpu-inplace-scatter;^BenchmarkInPlaceScatter1000x8K\$;$gpuscattertime;TENSORFS_TEST_DEVICE=cuda:0" \
			"gpu-inplace-big;^BenchmarkInPlaceBig/ipc\$;20x;TENSORFS_TEST_DEVICE=cuda:0 INPLACE_BIG_MB=1024"; do
			IFS=';' read -r name re bt env <<<"$s"
			runset "$f" "$name" "$re" "$bt" "$env" || { status=$?; echo "bench.sh: set $name failed (exit $status); see $f" >&2; break 2; }
		done
	fi
done
if [ "$status" -ne 0 ]; then
	grep -E -- '--- FAIL|^FAIL|panic|Error' "${raws[-1]}" | head -20 >&2 || true
	exit "$status"
fi

args=(-out "$out" -commit "$commit" "${gpu[@]}" "${without[@]}" $strict)
[ $quick = 1 ] && args+=(-quick)
for s in "${skipped[@]}"; do args+=(-skipped "$s"); done
rc=0
"$bindir/benchreport" "${args[@]}" "${raws[@]}" || rc=$?
echo "# result: $out (result.json, table.md, sweep.png, raw-*.txt)" >&2
exit $rc
