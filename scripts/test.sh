#!/usr/bin/env bash
# The test entry point (README's test command; .ci/run calls it): vet, ban
# naked panics outside tests (and third_party/, upstream's code), run every
# test with the race detector (the integration tests mount the real binary,
# built with -race too), then the UCX binding's tests (build tag ucx; needs
# libucx-dev), run every benchmark once at small sizes (scripts/bench.sh --quick: each produces its
# result, the report its JSON and plot), and fail if a mount of this run is
# left behind. Needs root (FUSE mounts) and fuse3+attr.
#
# Tests mount under a TMPDIR of this run, so the leftover check (and the
# clean-up) touch only this run's mounts, never another user's or run's.
set -euo pipefail
cd "$(dirname "$0")/.."

run_tmp=$(mktemp -d /tmp/tensorfs-test.XXXXXX)
export TMPDIR=$run_tmp
ours() { awk -v p="$run_tmp/" '$3 ~ /^fuse/ && index($2, p) == 1 {print $2}' /proc/mounts; }
finish() {
	rc=$?
	left=$(ours)
	if [ -n "$left" ]; then
		echo "test.sh: FUSE mounts left behind: $left" >&2
		for m in $left; do umount -l "$m" 2>/dev/null || true; done
		rc=1
	fi
	rm -rf "$run_tmp"
	exit $rc
}
trap finish EXIT

go vet ./...
if grep -rn --include='*.go' --exclude='*_test.go' --exclude-dir=third_party -E '(^|[^.[:alnum:]_])panic\(' . ; then
	echo "test.sh: naked panic() outside tests: return an error instead" >&2
	exit 1
fi
go test -race -count=1 -timeout 30m ./...
# The UCX binding (transfer/ucx: build tag ucx, cgo against Debian's
# libucx-dev), over UCX_TLS=tcp and UCX_TLS=sm,self; the default build above
# has no UCX and needs no C toolchain beyond the race detector's.
CGO_ENABLED=1 go vet -tags ucx ./transfer/ucx/ ./cmd/tensorfs/ ./tests/
CGO_ENABLED=1 go test -race -count=1 -timeout 10m -tags ucx ./transfer/ucx/
# The daemon built with UCX: its regions mapped, their rkeys as xattrs, an
# endpoint to each peer from the addresses in the handshake.
CGO_ENABLED=1 go test -race -count=1 -timeout 10m -tags ucx -run 'TestRKeyXattr|TestUCX|TestInPlace|TestEtcdCluster$' ./tests/
scripts/bench.sh --quick --out "$run_tmp/bench"
