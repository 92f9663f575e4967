#!/usr/bin/env bash
# gpu-check.sh: check tensorfs's CUDA backend on a GPU host that has no Go.
#
#   scripts/gpu-check.sh build        here (with Go): build gpubin/ with CGO_ENABLED=0
#   scripts/gpu-check.sh builducx     here: gpubin/ucx/, the UCX build (-tags ucx,
#                                     cgo) of tensorfs and ./tests, gzipped, with
#                                     the UCX libraries and ucx_perftest it needs
#                                     (UCX_PREFIX: a UCX installed there instead
#                                     of Debian's; UCX_BIN: another folder, which
#                                     the run's ucx step takes as UCX_BIN too)
#   scripts/gpu-check.sh run [STEP..] there (repo root, with gpubin/): run the checks
#
# gpubin/ holds the tensorfs binary and `go test -c` binaries of ./tests and
# ./gpu/cuda. The run steps, in order (default: all of them):
#   env    nvidia-smi, the kernel, FUSE, python3's cupy/torch     -> env.txt
#   unit   gpu/cuda unit tests, real-driver ones included          -> cuda-unit.txt
#          (TENSORFS_CUDA_REAL=1), and its backend-only benchmarks
#   gpu    the GPU integration tests, TENSORFS_REQUIRE_GPU=1        -> gpu-tests.txt
#          (no GPU is a failure, not a skip)
#   core   the whole integration suite on --device cuda:0           -> core-cuda.txt
#          (TENSORFS_TEST_DEVICE=cuda:0; the harness must honour it)
#   bench  the GPU benchmarks: 64 KiB create rate and overhead,     -> gpu-bench.txt
#          1 GiB registration vs bare cuMemAlloc+cuIpcGetMemHandle,
#          1 GiB sequential read/write on cuda:0 vs host
#   inplace the in-place copy benchmarks (tests/inplace_bench_test.go)  -> inplace.txt
#          on cuda:0 and on host memory, with the GPU floors of the same
#          run (scripts/gpu_floor.py: 4 KiB copy+sync, one scatter kernel
#          over 1000 x 8 KiB, 1 GiB from an IPC-opened pointer); not in
#          the default steps
#   spin   the in-place benchmarks (4 KiB, 1000 x 8 KiB, 1 GiB IPC on      -> spin.txt
#          cuda:0; 4 KiB, 1000 x 8 KiB and 8 MiB TCP on host memory) once
#          for each --spin in $SPINS (default "0 1ms"), same binary, same
#          call: the A/B of spinning reads; not in the default steps
#   trace  execution traces of both daemons (TENSORFS_TRACE): 1 GiB,      -> trace.tgz
#          1000 x 8 KiB and 4 KiB IPC on cuda:0, 8 MiB over TCP on host
#          memory
#          (go tool trace, -pprof=sched|net|sync|syscall); not in the
#          default steps
#   profile CPU profiles of both daemons (TENSORFS_CPUPROFILE) under       -> prof.tgz
#          the in-place benchmarks that miss their goals: 1000 x 8 KiB
#          IPC, 1 GiB IPC, 4 KiB IPC and TCP on cuda:0, 1000 x 8 KiB
#          TCP and 8 MiB in place over TCP on host memory, as one
#          prof.tgz (read them here with go tool pprof); a few seconds
#          of each, so that a profile has thousands of samples, not the
#          daemons' start-up; not in the default steps
#   ucx    with gpubin/ucx only (builducx): the UCX copy tests on     -> ucx.txt
#          cuda:0 and host memory (TestGPUUCX, TestUCX*, the in-place
#          suite's ucx-tcp/ucx-sm subtests), the in-place benchmarks on
#          tcp and ucx-sm (cuda:0 and host), and ucx_perftest's
#          put latency (4 KiB) and bandwidth (8 KiB, 1 MiB, 1 GiB) over
#          sm,self as their floors; not in the default steps
#   report scripts/bench.sh with these binaries: every benchmark with its   -> report/
#          floor, the GPU rows included, as result.json, table.md and
#          sweep.png (REPORT_ARGS: its flags, default --rounds 1); copy
#          report/ into bench/results/ here; not in the default steps
# Outputs go to $OUT (default ./gpu-out), with summary.txt listing each step's
# result; the exit status is non-zero when any step failed. Needs root (FUSE).
#
# Environment: BENCHTIME (default 1s) for the benchmarks; INPLACE_BENCHTIME
# (default 20x) and SCATTER_BENCHTIME (default 2000x: a p50 of 20 calls
# took the first ones' cold start) for the inplace step; TIMEOUT (default 9m)
# per step; CORE_ARGS, extra flags for the core step's test binary (e.g.
# -test.skip=TestStartFailuresOneLine).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

build() {
	set -e
	mkdir -p gpubin
	export CGO_ENABLED=0
	go build -trimpath -ldflags='-s -w' -o gpubin/tensorfs ./cmd/tensorfs
	go test -c -trimpath -ldflags='-s -w' -o gpubin/tests.test ./tests
	go test -c -trimpath -ldflags='-s -w' -o gpubin/cuda.test ./gpu/cuda
	go build -trimpath -ldflags='-s -w' -o gpubin/benchreport ./internal/cmd/benchreport
	git describe --always --dirty >gpubin/COMMIT
	ls -l gpubin
}

# builducx: $UCX_BIN (default gpubin/ucx/) with the tagged tensorfs and
# tests binaries (gzipped: the carry is 64 MiB), libucp/libucs/libuct/
# libucm (and libnuma, libgomp) and UCX's cma module, and ucx_perftest,
# from Debian's UCX on this machine (the device has no UCX), or from the
# UCX installed at $UCX_PREFIX (a newer UCX built here for a measurement:
# UCX_PREFIX=/opt/ucx UCX_BIN=gpubin/ucx-new).
builducx() {
	set -e
	local u=${UCX_BIN:-gpubin/ucx} lib=/usr/lib/x86_64-linux-gnu perftest=/usr/bin/ucx_perftest
	rm -rf "$u"
	mkdir -p "$u/lib/ucx"
	export CGO_ENABLED=1
	if [ -n "${UCX_PREFIX:-}" ]; then
		lib=$UCX_PREFIX/lib perftest=$UCX_PREFIX/bin/ucx_perftest
		export CGO_CFLAGS="-I$UCX_PREFIX/include" CGO_LDFLAGS="-L$UCX_PREFIX/lib"
	fi
	go build -tags ucx -trimpath -ldflags='-s -w' -o "$u/tensorfs" ./cmd/tensorfs
	go test -c -tags ucx -trimpath -ldflags='-s -w' -o "$u/tests.test" ./tests
	gzip -9 "$u/tensorfs" "$u/tests.test"
	for l in libucp.so.0 libucs.so.0 libuct.so.0 libucm.so.0; do
		cp -L "$lib/$l" "$u/lib/"
	done
	for l in libnuma.so.1 libgomp.so.1; do
		cp -L "/usr/lib/x86_64-linux-gnu/$l" "$u/lib/"
	done
	cp -L "$lib/ucx/libuct_cma.so.0" "$u/lib/ucx/"
	cp "$perftest" "$u/"
	strip --strip-unneeded "$u"/lib/*.so* "$u"/lib/ucx/*.so* "$u/ucx_perftest" 2>/dev/null || true
	git describe --always --dirty >"$u/COMMIT"
	local info=/usr/bin/ucx_info
	[ -z "${UCX_PREFIX:-}" ] || info=$UCX_PREFIX/bin/ucx_info
	LD_LIBRARY_PATH=$u/lib "$info" -v 2>&1 | head -2 | tr '\n' ' ' >"$u/UCX_VERSION" || true
	du -sh "$u"
}

# ucx_run: the ucx step (see the header) with the build in $UCX_BIN
# (default gpubin/ucx), in a subshell (it changes directory and
# environment).
ucx_run() (
	local u=$root/${UCX_BIN:-gpubin/ucx}
	gunzip -kf "$u/tensorfs.gz" "$u/tests.test.gz"
	export LD_LIBRARY_PATH=$u/lib UCX_MODULE_DIR=$u/lib/ucx TENSORFS_BIN=$u/tensorfs
	echo "== $(cat "$u/COMMIT") with UCX $(cat "$u/UCX_VERSION" 2>/dev/null)"
	cd tests
	local rc=0
	echo "== tests, cuda:0 and host"
	# The host-memory suite maps its tensors' memfds: --device host
	# (TENSORFS_TEST_DEVICE), where auto would take the GPU.
	TENSORFS_REQUIRE_GPU=1 timeout "$TIMEOUT" "$u/tests.test" -test.v -test.count=1 -test.run='TestGPUUCX' || rc=1
	TENSORFS_TEST_DEVICE=host timeout "$TIMEOUT" "$u/tests.test" -test.v -test.count=1 -test.run='TestUCX|TestInPlaceCopies|TestInPlacePullList|TestInPlaceBatch|TestInPlacePeerKilled' || rc=1
	for dev in cuda:0 host; do
		echo "== in-place benchmarks, $dev"
		TENSORFS_TEST_DEVICE=$([ "$dev" = host ] || echo "$dev") timeout "$TIMEOUT" "$u/tests.test" -test.run='^$' -test.bench='BenchmarkInPlace(4K|Scatter1000x8K)/^(tcp|ucx-sm)$' -test.benchtime="${INPLACE_BENCHTIME:-20x}" -test.count=1 || rc=1
		TENSORFS_TEST_DEVICE=$([ "$dev" = host ] || echo "$dev") INPLACE_BIG_MB=1 timeout "$TIMEOUT" "$u/tests.test" -test.run='^$' -test.bench='BenchmarkInPlaceBig/^(tcp|ucx-sm)$' -test.benchtime=200x -test.count=1 || rc=1
		TENSORFS_TEST_DEVICE=$([ "$dev" = host ] || echo "$dev") INPLACE_BIG_MB=1024 timeout "$TIMEOUT" "$u/tests.test" -test.run='^$' -test.bench='BenchmarkInPlaceBig/^(tcp|ucx-sm)$' -test.benchtime=5x -test.count=1 || rc=1
	done
	for tls in sm,self; do
		for t in "ucp_put_lat 4096" "ucp_put_bw 8192" "ucp_put_bw 1048576" "ucp_put_bw 1073741824"; do
			set -- $t
			echo "== ucx_perftest UCX_TLS=$tls -t $1 -s $2"
			UCX_TLS=$tls UCX_NET_DEVICES=lo "$u/ucx_perftest" -t "$1" -s "$2" -n "$([ "$2" -gt 1000000 ] && echo 20 || echo 20000)" >/tmp/perf-server.txt 2>&1 &
			local srv=$!
			sleep 1
			UCX_TLS=$tls UCX_NET_DEVICES=lo timeout 120 "$u/ucx_perftest" 127.0.0.1 -t "$1" -s "$2" -n "$([ "$2" -gt 1000000 ] && echo 20 || echo 20000)" 2>&1 | tail -4 || rc=1
			wait "$srv"
		done
	done
	return $rc
)

OUT=${OUT:-$root/gpu-out}
BENCHTIME=${BENCHTIME:-1s}
TIMEOUT=${TIMEOUT:-9m}
failed=0

# step NAME FILE CMD...: run CMD with its output in $OUT/FILE and record the result.
step() {
	local name=$1 file=$2
	shift 2
	local start=$SECONDS rc=0
	echo "== $name: $*" | tee -a "$OUT/summary.txt"
	"$@" >"$OUT/$file" 2>&1 || rc=$?
	local verdict=ok
	[ "$rc" -eq 0 ] || { verdict="FAILED (exit $rc)"; failed=1; }
	echo "   $name: $verdict in $((SECONDS - start)) s; $(grep -c -- '^--- FAIL' "$OUT/$file") failed, $(grep -c -- '--- SKIP' "$OUT/$file") skipped, $(grep -c -- '--- PASS' "$OUT/$file") passed" | tee -a "$OUT/summary.txt"
	grep -E -- '^(--- FAIL|FAIL|panic)|^\s+--- FAIL' "$OUT/$file" | head -20 | sed 's/^/   /' | tee -a "$OUT/summary.txt"
}

env_info() {
	nvidia-smi
	nvidia-smi -L
	nvidia-smi topo -m || true
	uname -a
	lscpu || true
	ls -l /dev/fuse || echo "no /dev/fuse"
	command -v fusermount3 fusermount getfattr setfattr || true
	python3 -c 'import numpy; print("numpy", numpy.__version__)' || true
	python3 -c 'import cupy; print("cupy", cupy.__version__)' || true
	python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count(), "GPUs")' || true
	ls -l "$root/gpubin"
}

run() {
	mkdir -p "$OUT"
	: >"$OUT/summary.txt"
	if [ "$*" = ucx ]; then
		[ -e "${UCX_BIN:-gpubin/ucx}/tests.test.gz" ] || { echo "gpu-check.sh: ${UCX_BIN:-gpubin/ucx} missing: run 'scripts/gpu-check.sh builducx' where Go is" >&2; exit 64; }
	else
		for f in tensorfs tests.test cuda.test; do
			[ -x "gpubin/$f" ] || { echo "gpu-check.sh: gpubin/$f missing: run 'scripts/gpu-check.sh build' where Go is" >&2; exit 64; }
		done
	fi
	export TENSORFS_BIN=$root/gpubin/tensorfs
	export TENSORFS_PY_CLIENT=$root/examples/python/open_tensor.py
	export PYTHONUNBUFFERED=1
	local steps=("$@")
	[ ${#steps[@]} -gt 0 ] || steps=(env unit gpu core bench)
	for s in "${steps[@]}"; do
		case $s in
		env) step env env.txt env_info ;;
		unit) step unit cuda-unit.txt bash -c "cd gpu/cuda && TENSORFS_CUDA_REAL=1 timeout $TIMEOUT ../../gpubin/cuda.test -test.v -test.count=1 -test.bench=Real -test.benchtime=$BENCHTIME" ;;
		gpu) step gpu gpu-tests.txt bash -c "cd tests && TENSORFS_REQUIRE_GPU=1 timeout $TIMEOUT ../gpubin/tests.test -test.v -test.count=1 -test.run=GPU" ;;
		core) step core core-cuda.txt bash -c "cd tests && TENSORFS_TEST_DEVICE=cuda:0 timeout $TIMEOUT ../gpubin/tests.test -test.v -test.count=1 -test.timeout=$TIMEOUT ${CORE_ARGS:-}" ;;
		inplace) step inplace inplace.txt bash -c "python3 scripts/gpu_floor.py && cd tests && TENSORFS_TEST_DEVICE=cuda:0 timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlace4K' -test.benchtime=${INPLACE_BENCHTIME:-20x} -test.count=1 && TENSORFS_TEST_DEVICE=cuda:0 timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceScatter1000x8K' -test.benchtime=${SCATTER_BENCHTIME:-2000x} -test.count=1 && TENSORFS_TEST_DEVICE=cuda:0 INPLACE_BIG_MB=1024 timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceBig/ipc' -test.benchtime=${INPLACE_BENCHTIME:-20x} -test.count=1 && echo '== host memory' && timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlace' -test.benchtime=${INPLACE_BENCHTIME:-20x} -test.count=1 && echo '== host memory, 8 MiB in one range (as many bytes as the scatter, contiguous)' && INPLACE_BIG_MB=8 timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceBig/tcp' -test.benchtime=200x -test.count=1" ;;
		profile) mkdir -p "$OUT/prof"; step profile profile.txt bash -c "cd tests && export TENSORFS_TEST_DEVICE=cuda:0 && TENSORFS_CPUPROFILE=$OUT/prof/scatter-ipc-cuda.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceScatter1000x8K/ipc' -test.benchtime=6000x && INPLACE_BIG_MB=1024 TENSORFS_CPUPROFILE=$OUT/prof/big-ipc-cuda.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceBig/ipc' -test.benchtime=2000x && TENSORFS_CPUPROFILE=$OUT/prof/small-ipc-cuda.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlace4K/ipc' -test.benchtime=8x && TENSORFS_CPUPROFILE=$OUT/prof/small-tcp-cuda.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlace4K/tcp' -test.benchtime=8x && unset TENSORFS_TEST_DEVICE && TENSORFS_CPUPROFILE=$OUT/prof/scatter-tcp-host.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceScatter1000x8K/tcp' -test.benchtime=2000x && INPLACE_BIG_MB=8 TENSORFS_CPUPROFILE=$OUT/prof/8m-tcp-host.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceBig/tcp' -test.benchtime=2000x"; tar czf "$OUT/prof.tgz" -C "$OUT" prof && rm -rf "$OUT/prof" ;;
		spin) step spin spin.txt bash -c "cd tests && for sp in ${SPINS:-0 1ms}; do echo \"== --spin \$sp, cuda:0\" && INPLACE_SPIN=\$sp TENSORFS_TEST_DEVICE=cuda:0 timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlace4K' -test.benchtime=3x && INPLACE_SPIN=\$sp TENSORFS_TEST_DEVICE=cuda:0 timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceScatter1000x8K/ipc' -test.benchtime=400x && INPLACE_SPIN=\$sp TENSORFS_TEST_DEVICE=cuda:0 INPLACE_BIG_MB=1024 timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceBig/ipc' -test.benchtime=200x && echo \"== --spin \$sp, host\" && INPLACE_SPIN=\$sp timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlace4K' -test.benchtime=3x && INPLACE_SPIN=\$sp timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceScatter1000x8K/tcp' -test.benchtime=200x && INPLACE_SPIN=\$sp INPLACE_BIG_MB=8 timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceBig/tcp' -test.benchtime=300x || exit 1; done" ;;
		trace) mkdir -p "$OUT/trace"; step trace trace.txt bash -c "cd tests && export TENSORFS_TEST_DEVICE=cuda:0 && INPLACE_BIG_MB=1024 TENSORFS_TRACE=$OUT/trace/big-ipc-cuda.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceBig/ipc' -test.benchtime=20x && TENSORFS_TRACE=$OUT/trace/scatter-ipc-cuda.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceScatter1000x8K/ipc' -test.benchtime=50x && TENSORFS_TRACE=$OUT/trace/small-ipc-cuda.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlace4K/ipc' -test.benchtime=1x && unset TENSORFS_TEST_DEVICE && INPLACE_BIG_MB=8 TENSORFS_TRACE=$OUT/trace/8m-tcp-host.%p timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench='BenchmarkInPlaceBig/tcp' -test.benchtime=50x"; tar czf "$OUT/trace.tgz" -C "$OUT" trace && rm -rf "$OUT/trace" ;;
		ucx) step ucx ucx.txt ucx_run ;;
		report) step report report.txt env BENCH_BIN_DIR="$root/gpubin" BENCH_COMMIT="$(cat gpubin/COMMIT 2>/dev/null || echo unknown)" scripts/bench.sh --out "$OUT/report" ${REPORT_ARGS:---rounds 1} ;;
		bench) step bench gpu-bench.txt bash -c "cd tests && TENSORFS_REQUIRE_GPU=1 timeout $TIMEOUT ../gpubin/tests.test -test.run='^\$' -test.bench=GPU -test.benchtime=$BENCHTIME -test.count=1 -test.benchmem=false" ;;
		*) echo "gpu-check.sh: unknown step $s (env unit gpu core bench inplace spin trace profile ucx report)" >&2; exit 64 ;;
		esac
	done
	left=$(grep -E '^tensorfs[^ ]* [^ ]+ fuse' /proc/mounts | awk '{print $2}')
	if [ -n "$left" ]; then
		echo "FUSE mounts left behind: $left" | tee -a "$OUT/summary.txt"
		failed=1
	fi
	echo "== done: $([ $failed -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)" | tee -a "$OUT/summary.txt"
	return $failed
}

case ${1:-} in
build) build ;;
builducx) builducx ;;
run) shift; run "$@" ;;
*)
	awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
	exit 64
	;;
esac
