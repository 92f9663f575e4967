#!/usr/bin/env bash
# The test entry point (README's test command; .ci/run calls it): vet, ban
# naked panics outside tests, run every test with the race detector (the
# integration tests mount the real binary, built with -race too), and fail if
# any tensorfs mount is left behind. Needs root (FUSE mounts) and fuse3+attr.
set -euo pipefail
cd "$(dirname "$0")/.."

leftovers() { grep -E '^tensorfs[^ ]* [^ ]+ fuse' /proc/mounts | awk '{print $2}' || true; }
for m in $(leftovers); do umount -l "$m" 2>/dev/null || true; done

go vet ./...
if grep -rn --include='*.go' --exclude='*_test.go' -E '(^|[^.[:alnum:]_])panic\(' . ; then
	echo "test.sh: naked panic() outside tests: return an error instead" >&2
	exit 1
fi
go test -race -count=1 -timeout 30m ./...

left=$(leftovers)
if [ -n "$left" ]; then
	echo "test.sh: FUSE mounts left behind: $left" >&2
	for m in $left; do umount -l "$m" 2>/dev/null || true; done
	exit 1
fi
