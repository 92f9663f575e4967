#!/usr/bin/env bash
# On a GPU host: the Python client's GPU tests (open_cupy, open_torch, an
# in-place copy into a CuPy mapping) and the whole-tensor/in-place tests with
# tensors on cuda:0, against two daemons of one host, then the disaggregated
# example on cuda:0. TENSORFS_BIN names the binary (gpubin/tensorfs from
# scripts/gpu-check.sh build, or any build); needs fuse3 and a python3 with
# numpy and CuPy or PyTorch. Leaves no mount behind.
set -uo pipefail
cd "$(dirname "$0")/.."
tfs=${TENSORFS_BIN:-gpubin/tensorfs}
dev=${TENSORFS_TEST_GPU:-cuda:0}
py=${PYTHON:-python3}
work=$(mktemp -d /tmp/tensorfs-pygpu.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	for m in "$work/a" "$work/b"; do grep -qs " $m fuse" /proc/mounts && umount -l "$m"; done
	rm -rf "$work"
}
trap cleanup EXIT
head -c 32 /dev/urandom >"$work/secret"; chmod 600 "$work/secret"
mkdir "$work/a" "$work/b"
"$tfs" mount "$work/a" --name a --listen 127.0.0.1:17501 --peer b=127.0.0.1:17502 --secret-file "$work/secret" --host-id one --device "$dev" 2>"$work/a.log" & pids+=($!)
"$tfs" mount "$work/b" --name b --listen 127.0.0.1:17502 --peer a=127.0.0.1:17501 --secret-file "$work/secret" --host-id one --device "$dev" 2>"$work/b.log" & pids+=($!)
for m in a b; do
	for _ in $(seq 300); do "$py" -c "import os,sys; os.getxattr(sys.argv[1], 'user.tensorfs.stats')" "$work/$m" 2>/dev/null && break; sleep 0.1; done
done
rc=0
(cd python && TENSORFS_MOUNT_A=$work/a TENSORFS_MOUNT_B=$work/b TENSORFS_TEST_GPU=$dev "$py" -m unittest -v test_tensorfs.Refs test_tensorfs.Copies test_tensorfs.GPU) || rc=1
(cd python && TENSORFS_MOUNT_A=$work/a TENSORFS_MOUNT_B=$work/b TENSORFS_TEST_GPU=$dev TENSORFS_TEST_NO_CUPY=1 "$py" -m unittest -v test_tensorfs.GPU.test_open_torch) || rc=1
[ $rc = 0 ] || { tail -n 20 "$work/a.log" "$work/b.log"; }
cleanup; trap - EXIT
TENSORFS_BIN=$tfs examples/disagg/run.sh --device "$dev" "$@" || rc=1
TENSORFS_BIN=$tfs examples/disagg/run.sh --device "$dev" --mapper torch "$@" || rc=1
exit $rc
