#!/usr/bin/env bash
# Builds virtplug's runtime image (Containerfile, stage `runtime`) on a machine that reaches no
# container registry, only a Debian mirror: the base is a bookworm minbase root filesystem made
# with debootstrap (cached, imported as a local image), the binary one built on the host
# (`cargo build --release`), stripped here with the same objcopy steps as the Containerfile's
# builder stage. Its debug information stays on the host, beside the stripped copy (--out).
#
#   scripts/build-image.sh [--binary PATH] [--tag TAG] [--out DIR] [--mirror URL]
#                          [--refresh-rootfs] [--check]
#
#   --binary PATH     the unstripped binary (default: target/release/virtplug, or under
#                     $CARGO_TARGET_DIR when set)
#   --tag TAG         the image's name (default: virtplug:local; deploy/*.yaml run virtplug:latest)
#   --out DIR         where the stripped binary (DIR/context/virtplug, the build context) and its
#                     debug file (DIR/virtplug.debug) go (default: target/image, or under
#                     $CARGO_TARGET_DIR when set)
#   --mirror URL      the Debian mirror (default: the machine's, from debian.sources)
#   --refresh-rootfs  debootstrap again instead of reusing the cached root filesystem
#                     (~/.cache/virtplug/rootfs/debian-bookworm-minbase.tar)
#   --check           run the image: `--version`, QEMU's version (must be 10.x), and `virtplug
#                     apiserver` with host networking on a free loopback port, asked for /healthz
#                     from the host; the container and its data dir are removed afterwards
#
# Root (apt-get, debootstrap, rootful podman). Installs debootstrap and podman from Debian if they
# are missing (runc too where crun cannot run containers: cgroup v1 with controllers on the v2
# hierarchy). Idempotent: a second run reuses the cached root filesystem and its imported base
# image, so podman's layer cache keeps the QEMU layer and only the binary's layers are redone.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SUITE=bookworm
BINARY=$TARGET_DIR/release/virtplug
TAG=virtplug:local
OUT=$TARGET_DIR/image
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/virtplug/rootfs
BASE_TAG=localhost/virtplug-base:$SUITE
MIRROR=
REFRESH=0
CHECK=0

usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; }
die() { echo "build-image: $*" >&2; exit 1; }
log() { echo "build-image: $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --binary) [ $# -ge 2 ] || die "--binary needs a path"; BINARY=$2; shift 2 ;;
    --tag) [ $# -ge 2 ] || die "--tag needs a name"; TAG=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; OUT=$2; shift 2 ;;
    --mirror) [ $# -ge 2 ] || die "--mirror needs a URL"; MIRROR=$2; shift 2 ;;
    --refresh-rootfs) REFRESH=1; shift ;;
    --check) CHECK=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

[ -f "$BINARY" ] || die "no virtplug binary at $BINARY: build it first (cargo build --release -p virtplug --bin virtplug) or give its path with --binary"
[ -x "$BINARY" ] || die "$BINARY is not executable"
[ "$(id -u)" = 0 ] || die "run as root (apt-get, debootstrap and rootful podman need it)"

# The machine's Debian mirror (and its security mirror), as scripts/install-deps.sh reads it.
sources=/etc/apt/sources.list.d/debian.sources
if [ -z "$MIRROR" ]; then
  MIRROR=$(awk '/^URIs:/ {print $2; exit}' "$sources" 2>/dev/null || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi
SECURITY=$(awk '/^URIs:/ {u=$2} /^Suites:.*-security/ {print u; exit}' "$sources" 2>/dev/null || true)
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}
# They reach a shell in the Containerfile's RUN (and apt's sources): plain URLs only.
url_re='^https?://[A-Za-z0-9._~:/%@+-]+$'
[[ $MIRROR =~ $url_re ]] || die "the Debian mirror must be a plain http(s) URL: $MIRROR"
[[ $SECURITY =~ $url_re ]] || die "the security mirror in $sources is not a plain http(s) URL: $SECURITY"

# crun 1.8 refuses cgroup v1 hierarchies with controllers also enabled on the v2 one ("cgroups in
# hybrid mode not supported"); runc runs there.
PODMAN=(podman)
pkgs=(debootstrap podman)
controllers=
[ -r /sys/fs/cgroup/unified/cgroup.controllers ] && read -r controllers < /sys/fs/cgroup/unified/cgroup.controllers || true
if [ -n "$controllers" ]; then pkgs+=(runc); PODMAN+=(--runtime runc); fi

missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Temporary files, removed on any exit; mounts debootstrap may leave behind on failure first.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/virtplug-image.XXXXXX")
CHECK_NAME=
cleanup() {
  if [ -n "$CHECK_NAME" ]; then "${PODMAN[@]}" rm -f -t 0 "$CHECK_NAME" >/dev/null 2>&1 || true; fi
  if [ -d "$WORK" ]; then
    awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
      umount -l "$m" || true
    done
    rm -rf --one-file-system "$WORK"
  fi
}
trap cleanup EXIT

# 1. The root filesystem: debootstrap once, a tarball in the cache from then on.
ROOTFS=$CACHE/debian-$SUITE-minbase.tar
mkdir -p "$CACHE"
if [ "$REFRESH" = 1 ] || [ ! -s "$ROOTFS" ] || [ ! -s "$ROOTFS.sha256" ]; then
  log "debootstrap $SUITE (minbase) from $MIRROR"
  rfs=$WORK/rootfs
  debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
    "$SUITE" "$rfs" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
  # What debian:bookworm-slim is besides minbase: its apt sources (updates, security) and
  # dpkg's path excludes (no docs but copyrights, no man pages or translations) and apt's
  # cleaning of downloaded packages, for the packages the Containerfile installs too.
  rm -f "$rfs/etc/apt/sources.list"
  cat > "$rfs/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  cat > "$rfs/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
CFG
  cat > "$rfs/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
  echo 'Acquire::Languages "none";' > "$rfs/etc/apt/apt.conf.d/docker-no-languages"
  # debootstrap installs the point release; the slim image also has the updates and security
  # fixes published since. (resolv.conf is the host's, copied by debootstrap; removed below.)
  mount -t proc proc "$rfs/proc"
  if ! { chroot "$rfs" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
         && chroot "$rfs" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq; } > "$WORK/upgrade.log" 2>&1; then
    tail -20 "$WORK/upgrade.log" >&2
    die "apt-get upgrade in the new root filesystem failed"  # the EXIT trap unmounts proc
  fi
  umount "$rfs/proc"
  find "$rfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$rfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  rm -rf "$rfs/usr/share/man/"* "$rfs/usr/share/info/"* "$rfs/usr/share/groff/"* "$rfs/usr/share/lintian/"*
  rm -rf "$rfs/var/lib/apt/lists/"* "$rfs/var/cache/apt/"*.bin "$rfs/var/cache/apt/archives/"*.deb
  rm -f "$rfs/etc/resolv.conf" "$rfs/etc/hostname" "$rfs/var/log/"*.log
  tar --numeric-owner --xattrs --xattrs-include='*' -C "$rfs" -cf "$WORK/rootfs.tar" .
  sha256sum "$WORK/rootfs.tar" | cut -d' ' -f1 > "$WORK/rootfs.tar.sha256"
  mv -f "$WORK/rootfs.tar" "$ROOTFS"
  mv -f "$WORK/rootfs.tar.sha256" "$ROOTFS.sha256"
  rm -rf --one-file-system "$rfs"
else
  log "reusing $ROOTFS"
fi
sum=$(cat "$ROOTFS.sha256")

# 2. The base image: imported again only when the tarball changed (a new import is a new image
# ID, which would make podman rebuild every layer above it).
have=$("${PODMAN[@]}" image inspect --format '{{index .Labels "io.virtplug.rootfs.sha256"}}' "$BASE_TAG" 2>/dev/null || true)
old_base=
if [ "$have" != "$sum" ]; then
  old_base=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$BASE_TAG" 2>/dev/null || true)
  log "importing $ROOTFS as $BASE_TAG"
  "${PODMAN[@]}" import --change "LABEL io.virtplug.rootfs.sha256=$sum" --change 'CMD ["/bin/bash"]' \
    "$ROOTFS" "$BASE_TAG" >/dev/null
else
  log "reusing image $BASE_TAG"
fi

# 3. The binary, stripped as the Containerfile's builder stage does; the debug file beside it.
mkdir -p "$OUT/context"
objcopy --only-keep-debug "$BINARY" "$OUT/virtplug.debug"
objcopy --strip-debug --strip-unneeded "$BINARY" "$OUT/context/virtplug"
objcopy --add-gnu-debuglink="$OUT/virtplug.debug" "$OUT/context/virtplug"
log "binary: $(stat -c %s "$BINARY") bytes; stripped: $(stat -c %s "$OUT/context/virtplug"); debug file: $OUT/virtplug.debug ($(stat -c %s "$OUT/virtplug.debug"))"

# 4. The runtime stage on that base, with that binary. Host networking for apt in RUN: no
# bridge or CNI setup needed.
old_image=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
"${PODMAN[@]}" build --network=host -f "$ROOT/Containerfile" --target runtime \
  --build-arg "DEBIAN=$SUITE" --build-arg "DEBIAN_IMAGE=$BASE_TAG" --build-arg "DEBIAN_MIRROR=$MIRROR" \
  --build-arg VIRTPLUG_BINARY=prebuilt -t "$TAG" "$OUT/context"
log "built $TAG: $("${PODMAN[@]}" image inspect --format '{{.Size}}' "$TAG") bytes"
# What this build replaced, so that rebuilds do not pile up images: the previous image of TAG and
# base (refused, and kept, while a container or another tag uses them) and the `prebuilt` stages'
# images (their layer is the binary; the runtime's COPY of it is cached by content).
new_image=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$TAG")
for id in "$old_image" "$old_base"; do
  if [ -n "$id" ] && [ "$id" != "$new_image" ]; then "${PODMAN[@]}" rmi "$id" >/dev/null 2>&1 || true; fi
done
"${PODMAN[@]}" image prune -f --filter label=io.virtplug.stage=prebuilt >/dev/null

[ "$CHECK" = 1 ] || exit 0

# 5. --check: run what was built. Without CAP_SYS_RESOURCE (a container host), podman's default
# rlimits (nofile 1048576) cannot be set: ask for the current hard limit, and for podman's own
# nproc (32768, the most it keeps for itself).
LIMITS=()
capeff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
if [ $(( 0x$capeff >> 24 & 1 )) = 0 ]; then
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  LIMITS=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
fi
version=$("${PODMAN[@]}" run --rm --network=none "${LIMITS[@]}" "$TAG" --version)
log "check: virtplug --version: $version"
qemu=$("${PODMAN[@]}" run --rm --network=none "${LIMITS[@]}" --entrypoint qemu-system-x86_64 "$TAG" --version | head -1)
log "check: $qemu"
case "$qemu" in *"version 10."*) ;; *) die "QEMU in $TAG is not 10.x" ;; esac

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir "$WORK/data"
CHECK_NAME=virtplug-image-check-$$
"${PODMAN[@]}" run --rm -d --name "$CHECK_NAME" --network=host "${LIMITS[@]}" -v "$WORK/data:/data" \
  "$TAG" apiserver --data-dir /data --listen "127.0.0.1:$port" >/dev/null
health=
for _ in $(seq 1 60); do
  if [ -s "$WORK/data/pki/ca.crt" ] \
    && health=$(curl -sS --max-time 2 --cacert "$WORK/data/pki/ca.crt" "https://127.0.0.1:$port/healthz" 2>/dev/null); then
    break
  fi
  health=
  sleep 0.5
done
if [ -z "$health" ]; then
  "${PODMAN[@]}" logs "$CHECK_NAME" >&2 || true
  die "apiserver in $TAG did not answer /healthz on 127.0.0.1:$port"
fi
log "check: apiserver in $TAG on 127.0.0.1:$port (host network): GET /healthz -> $health"
"${PODMAN[@]}" stop -t 10 "$CHECK_NAME" >/dev/null
CHECK_NAME=
log "check: passed"
