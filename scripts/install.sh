#!/usr/bin/env bash
# Installs tensorfs as a service: the binary, the systemd unit
# (scripts/tensorfs.service, its paths filled in) and a default config.
# Idempotent: run again, it puts the same binary and unit in place and
# leaves an existing config as the operator edited it.
#
#   scripts/install.sh [--prefix DIR] [--sysconfdir DIR] [--unitdir DIR]
#                      [--destdir DIR] [--bin FILE] [--no-reload]
#
# --prefix (default /usr/local): the binary goes to PREFIX/bin.
# --sysconfdir (default /etc): the config is SYSCONFDIR/tensorfs/tensorfs.yaml.
# --unitdir (default /etc/systemd/system): where the unit goes.
# --destdir DIR (or $DESTDIR): a staging root every path is written under,
#   while the unit names the final paths (for packages, and for the tests).
# --bin FILE: the binary to install (default: built here with go build).
# --no-reload: no systemctl daemon-reload (also skipped with a DESTDIR,
#   or where systemd is not running).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

prefix=/usr/local sysconfdir=/etc unitdir=/etc/systemd/system
destdir=${DESTDIR:-} bin= reload=1
while [ $# -gt 0 ]; do
	case $1 in
	--prefix) prefix=$2; shift 2 ;;
	--sysconfdir) sysconfdir=$2; shift 2 ;;
	--unitdir) unitdir=$2; shift 2 ;;
	--destdir) destdir=$2; shift 2 ;;
	--bin) bin=$2; shift 2 ;;
	--no-reload) reload=0; shift ;;
	-h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done

bindir=$prefix/bin
config=$sysconfdir/tensorfs/tensorfs.yaml

if [ -z "$bin" ]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd "$here/.." && CGO_ENABLED=0 go build -o "$tmp/tensorfs" ./cmd/tensorfs)
	bin=$tmp/tensorfs
fi
[ -x "$bin" ] || { echo "install.sh: $bin is not an executable" >&2; exit 1; }

# install(1) writes a new file and renames it: a running daemon keeps its
# binary, and the same content twice is the same result.
install -D -m 0755 "$bin" "$destdir$bindir/tensorfs"
unit=$(sed -e "s|@BINDIR@|$bindir|g" -e "s|@CONFIG@|$config|g" "$here/tensorfs.service")
mkdir -p "$destdir$unitdir"
printf '%s\n' "$unit" >"$destdir$unitdir/tensorfs.service.tmp"
chmod 0644 "$destdir$unitdir/tensorfs.service.tmp"
mv -f "$destdir$unitdir/tensorfs.service.tmp" "$destdir$unitdir/tensorfs.service"

if [ -e "$destdir$config" ]; then
	echo "install.sh: $destdir$config exists; kept as it is"
else
	mkdir -p "$destdir$sysconfdir/tensorfs"
	cat >"$destdir$config" <<'CONF'
# tensorfs mount settings, read by `tensorfs mount --config` (the service's
# ExecStart). A key is a flag of `tensorfs mount` without its dashes (see
# tensorfs mount --help); a flag given on the command line wins; an unknown
# key is an error. Lists may be YAML lists.

# The directory to mount at (it must exist).
mountpoint: /mnt/tensorfs
# auto (cuda:0 when a GPU is there, else host), host, or cuda:N.
device: auto
# max-memory: 64GiB

# Peers: this node's name, where it listens, the peers it names, and the
# shared secret (mode 0600, at least 16 bytes) every node holds.
# name: node-a
# listen: 10.0.0.1:7070
# peer:
#   - node-b=10.0.0.2:7070
# secret-file: /etc/tensorfs/secret

# Or find peers through etcd (needs listen).
# etcd:
#   - http://10.0.0.10:2379
# cluster: default

# Reserved for the metrics listener (ignored, with a warning, by a build
# without --metrics).
# metrics: 127.0.0.1:9400

log-format: text
log-level: info
CONF
	chmod 0644 "$destdir$config"
	echo "install.sh: wrote $destdir$config"
fi
echo "install.sh: installed $destdir$bindir/tensorfs and $destdir$unitdir/tensorfs.service"

if [ "$reload" = 1 ] && [ -z "$destdir" ] && [ -d /run/systemd/system ] && [ "$(id -u)" = 0 ]; then
	systemctl daemon-reload
	echo "install.sh: systemd reloaded; start with: systemctl enable --now tensorfs"
fi
