#!/usr/bin/env bash
# Disaggregated serving on one host: two tensorfs daemons (prefill and decode),
# decode.py maps its KV cache and waits, prefill.py pushes a request's blocks
# into it in place in one batch, decode checks every byte and exits 0.
#
#   examples/disagg/run.sh                                   # small, host memory (CI size)
#   examples/disagg/run.sh --layers 32 --blocks 1024 --num-blocks 256 --device cuda:0
#
# Options go to both decode.py and prefill.py (see common.py). Env:
# TENSORFS_BIN (else built here with go), PYTHON (else a python3 with numpy),
# PREFILL_PORT/DECODE_PORT (17401/17402). Unmounts and removes everything at
# exit, on failure too.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=examples/disagg

work=$(mktemp -d /tmp/tensorfs-disagg.XXXXXX)
pids=() mnts=() decode_pid=
cleanup() {
	rc=$?
	if [ -n "$decode_pid" ]; then # SIGTERM: decode removes its cache and exits
		kill "$decode_pid" 2>/dev/null || true
		wait "$decode_pid" 2>/dev/null || true
	fi
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	done
	for m in "${mnts[@]}"; do
		if grep -qs " $m fuse" /proc/mounts; then umount -l "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true; fi
	done
	if [ $rc != 0 ]; then
		for f in "$work"/*.log; do [ -e "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
	fi
	rm -rf "$work"
	[ $rc = 0 ] && echo "run.sh: OK" || echo "run.sh: FAILED (exit $rc)" >&2
}
trap cleanup EXIT

tfs=${TENSORFS_BIN:-}
if [ -z "$tfs" ]; then
	tfs=$work/tensorfs
	CGO_ENABLED=0 go build -o "$tfs" ./cmd/tensorfs
fi
py=
for c in ${PYTHON:-} python3 /usr/bin/python3; do
	if "$c" -c 'import numpy' 2>/dev/null; then py=$c; break; fi
done
[ -n "$py" ] || { echo "run.sh: no python3 with numpy (apt-get install python3 python3-numpy)" >&2; exit 1; }

head -c 32 /dev/urandom >"$work/secret" && chmod 600 "$work/secret"
pp=${PREFILL_PORT:-17401} dp=${DECODE_PORT:-17402}
mount_node() { # name port peer peerport
	local mnt=$work/$1
	mkdir -p "$mnt"
	mnts+=("$mnt")
	"$tfs" mount "$mnt" --name "$1" --listen "127.0.0.1:$2" --peer "$3=127.0.0.1:$4" \
		--secret-file "$work/secret" --device auto 2>"$work/$1.log" &
	pids+=($!)
}
ready() { # name pid: until the stats xattr of the mount root answers
	for _ in $(seq 300); do
		if command -v getfattr >/dev/null; then
			getfattr -n user.tensorfs.stats "$work/$1" >/dev/null 2>&1 && return 0
		else # no attr package: the same getxattr from Python
			"$py" -c 'import os, sys; os.getxattr(sys.argv[1], "user.tensorfs.stats")' "$work/$1" 2>/dev/null && return 0
		fi
		kill -0 "$2" 2>/dev/null || { echo "run.sh: the $1 daemon exited" >&2; return 1; }
		sleep 0.1
	done
	echo "run.sh: the $1 mount did not come up" >&2
	return 1
}
mount_node prefill "$pp" decode "$dp"
mount_node decode "$dp" prefill "$pp"
ready prefill "${pids[0]}"
ready decode "${pids[1]}"

"$py" "$here/decode.py" --mount "$work/decode" "$@" >"$work/decode.out" 2>&1 &
decode_pid=$!
for _ in $(seq 600); do
	grep -q '^decode: ready' "$work/decode.out" && break
	kill -0 "$decode_pid" 2>/dev/null || { cat "$work/decode.out" >&2; exit 1; }
	sleep 0.1
done
grep -q '^decode: ready' "$work/decode.out" || { echo "run.sh: decode did not get ready" >&2; exit 1; }
cat "$work/decode.out"
"$py" "$here/prefill.py" --mount "$work/prefill" --peer decode "$@"
rc=0
wait "$decode_pid" || rc=$?
decode_pid=
sed 1d "$work/decode.out"
exit $rc
