#!/usr/bin/env bash
# Installs what virtplug's run and tests need on a fresh Debian 12 machine. Idempotent: a second
# run changes nothing. QEMU 10 comes from bookworm-backports through private apt lists, so the
# machine's own apt sources stay untouched (bookworm's QEMU 7.2 would remove qemu-utils 10).
# ovmf is the UEFI firmware of spec.domain.firmware.bootloader.efi; grub-common (grub-mkrescue),
# grub-pc-bin, grub-efi-amd64-bin and mtools build the test guest's firmware-bootable images.
set -euo pipefail

need_root() { [ "$(id -u)" = 0 ] || { echo "install-deps: run as root (apt-get needs it)" >&2; exit 1; }; }

STATE=${VIRTPLUG_APT_STATE:-/var/cache/virtplug-apt}
mirror() { awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true; }

base_pkgs=(busybox-static kmod cpio e2fsprogs util-linux etcd-server etcd-client xorriso isolinux syslinux-common python3-venv curl
  ovmf grub-common grub-pc-bin grub-efi-amd64-bin mtools)
missing=()
for p in "${base_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
qemu_ok=0
# qemu-img (qemu-utils) converts imported qcow2 images: without it the DataVolume tests fail.
if command -v qemu-system-x86_64 >/dev/null && qemu-system-x86_64 --version | grep -q 'version 10\.' \
  && command -v qemu-img >/dev/null; then qemu_ok=1; fi

if [ ${#missing[@]} -gt 0 ] || [ $qemu_ok = 0 ]; then
  need_root
  export DEBIAN_FRONTEND=noninteractive
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  if [ $qemu_ok = 0 ]; then
    m=$(mirror); m=${m:-http://deb.debian.org/debian}
    mkdir -p "$STATE/lists/partial" "$STATE/archives/partial"
    cat > "$STATE/sources.list" <<SRC
deb $m bookworm main
deb $m bookworm-updates main
deb $m bookworm-backports main
SRC
    O=(-o "Dir::Etc::sourcelist=$STATE/sources.list" -o "Dir::Etc::sourceparts=-"
       -o "Dir::State::lists=$STATE/lists" -o "Dir::Cache::archives=$STATE/archives"
       -o "APT::Sandbox::User=root")
    apt-get "${O[@]}" update -qq
    apt-get "${O[@]}" install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 qemu-utils
  fi
fi
qemu-system-x86_64 --version | head -1
