#!/usr/bin/env bash
# tensorfs demo: the main job end to end on host memory (no GPU needed).
# Builds tensorfs, mounts it on a temporary directory, makes a KV-cache-like
# directory with a template, touches 64 blocks into it, shows a block's
# registration xattrs, writes and reads data back with dd, exports the
# directory to safetensors and imports it again, removes everything and shows
# the stats back at zero, and unmounts. Exits non-zero on any mismatch and
# never leaves a mount behind, even when it fails half-way.
set -euo pipefail

cd "$(dirname "$0")/.."
if [ -t 1 ]; then say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }; else say() { printf '\n== %s\n' "$*"; }; fi
die() { echo "demo: FAILED: $*" >&2; exit 1; }

# Tools the demo drives, installed from Debian when missing (as root).
need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v getfattr --absolute-names >/dev/null || need+=(attr)
# inotifywait: the README's two-node example watches arrivals with it.
command -v inotifywait >/dev/null || need+=(inotify-tools)
if ((${#need[@]})); then
	[ "$(id -u)" = 0 ] || die "missing ${need[*]}: install them (apt-get install ${need[*]})"
	echo "installing ${need[*]}"
	apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

work=$(mktemp -d /tmp/tensorfs-demo.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
pid=
cleanup() {
	rc=$?
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	if grep -qs " $mnt fuse" /proc/mounts; then
		umount -l "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" 2>/dev/null || true
	fi
	rm -rf "$work"
	[ $rc = 0 ] && echo "demo: OK" || echo "demo: exit $rc" >&2
}
trap cleanup EXIT

say "build"
CGO_ENABLED=0 go build -o "$work/tensorfs" ./cmd/tensorfs
tfs=$work/tensorfs
"$tfs" version

say "mount $mnt (host memory, capped at 1 GiB)"
"$tfs" mount "$mnt" --device auto --max-memory 1GiB 2>"$work/daemon.log" &
pid=$!
for _ in $(seq 100); do grep -qs " $mnt fuse" /proc/mounts && break; kill -0 $pid 2>/dev/null || { cat "$work/daemon.log"; die "daemon exited"; }; sleep 0.1; done
grep -qs " $mnt fuse" /proc/mounts || die "mount did not appear"
cat "$work/daemon.log"
df -h "$mnt"

say "a KV-cache directory: template BF16 [16,8,128], 64 blocks created with touch"
mkdir "$mnt/kv"
setfattr -n user.tensorfs.dtype -v bfloat16 "$mnt/kv"
setfattr -n user.tensorfs.shape -v 16,8,128 "$mnt/kv"
for i in $(seq 0 63); do touch "$mnt/kv/block$(printf %02d "$i")"; done
ls "$mnt/kv" | wc -l | grep -qx 64 || die "expected 64 blocks"
ls -l "$mnt/kv" | head -4

say "getfattr -d of one block: allocated and registered at creation"
getfattr --absolute-names -d -m - "$mnt/kv/block00"
[ "$(stat -c %s "$mnt/kv/block00")" = 32768 ] || die "block size is not 16*8*128*2 bytes"
getfattr --absolute-names --only-values -n user.tensorfs.mr_id "$mnt/kv/block00" >/dev/null || die "no mr_id"

say "write and read back with dd"
head -c 32768 /dev/urandom >"$work/payload"
for i in 00 17 63; do
	dd if="$work/payload" of="$mnt/kv/block$i" bs=32768 count=1 conv=notrunc status=none
done
want=$(sha256sum <"$work/payload" | cut -d' ' -f1)
for i in 00 17 63; do
	got=$(dd if="$mnt/kv/block$i" bs=1M status=none | sha256sum | cut -d' ' -f1)
	echo "block$i sha256 $got"
	[ "$got" = "$want" ] || die "block$i read back differs"
done

say "export the directory to safetensors, import it into a second directory, compare"
"$tfs" export "$mnt/kv" "$work/kv.safetensors"
ls -l "$work/kv.safetensors"
"$tfs" import "$work/kv.safetensors" "$mnt/kv2"
for f in "$mnt"/kv/*; do
	b=$(basename "$f")
	cmp -s "$f" "$mnt/kv2/$b" || die "$b differs after export+import"
	for a in dtype shape; do
		[ "$(getfattr --absolute-names --only-values -n user.tensorfs.$a "$f")" = "$(getfattr --absolute-names --only-values -n user.tensorfs.$a "$mnt/kv2/$b")" ] || die "$b: $a differs"
	done
done
echo "64 tensors identical (bytes, dtype, shape)"

say "stats with 128 tensors live"
getfattr --absolute-names --only-values -n user.tensorfs.stats "$mnt"

say "rm everything: registrations end, memory is freed"
rm -r "$mnt/kv" "$mnt/kv2"
stats=$(getfattr --absolute-names --only-values -n user.tensorfs.stats "$mnt")
echo "$stats"
echo "$stats" | grep -q '"live":{"tensors":0,"regions":0,"exports":0,"imports":0,"leases":0,"pins":0,"bytes":0}' || die "stats not back at zero"
df -h "$mnt"

say "unmount"
kill -TERM "$pid"
wait "$pid" || die "daemon exited non-zero"
pid=
grep -qs " $mnt fuse" /proc/mounts && die "mount still present"
echo "unmounted; daemon exited 0"
