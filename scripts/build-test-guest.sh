#!/usr/bin/env bash
# Builds the test guest from Debian packages and caches it: the generic kernel (vmlinuz; the cloud
# flavour has no AHCI for sata CD-ROMs), an initramfs with static busybox, the virtio/SCSI/CD-ROM
# modules, isofs (cloud-init seed images), virtio_net, tests/guest/init and the static vp-observer (tests/guest/observer, built here with
# cargo into its own target dir so the workspace's build cache is untouched), and a bootable ISO
# of the same guest (isolinux). Output: $VIRTPLUG_GUEST_DIR (default .cache/guest).
# Two more images boot the same guest through firmware, each under SeaBIOS and OVMF alike
# (grub-mkrescue with the i386-pc and x86_64-efi targets: an El Torito CD with a BIOS and an EFI
# boot image, which is also a hybrid MBR/GPT disk): boot-cd.iso passes vp.medium=cd and
# boot-disk.img (the same kind of image, a whole number of 512-byte sectors, for a disk)
# vp.medium=disk; tests/guest/init prints which one booted it and through which firmware
# ("VP-BOOT medium=cd firmware=efi").
# The images boot with the kernel parameters the harnesses pass (bench/src/lib.rs,
# GUEST_KERNEL_ARGS): no_timer_check (under a loaded TCG host the IO-APIC timer check can miss
# its ticks and panic the kernel: "IO-APIC + timer doesn't work!") and tsc=unstable (the TSC can
# be calibrated 10-80x wrong under load; tests/guest/init says more).
# A second run with unchanged inputs does nothing (beyond cargo's no-op check of the observer).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${VIRTPLUG_GUEST_DIR:-$PWD/.cache/guest}
obs_target=${CARGO_TARGET_DIR:-$PWD/target}/guest-observer
RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" CARGO_TARGET_DIR=$obs_target \
  cargo build -q --release --locked -p vp-guest-observer
observer=$obs_target/release/vp-observer
stamp_in=$(sha256sum tests/guest/init scripts/build-test-guest.sh "$observer" | sha256sum | cut -c1-16)
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp_in" ] && [ -f "$out/vmlinuz" ] && [ -f "$out/initramfs.cpio.gz" ] && [ -f "$out/guest.iso" ] \
  && [ -f "$out/boot-cd.iso" ] && [ -f "$out/boot-disk.img" ]; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$pkg" ] || { echo "build-test-guest: cannot resolve linux-image-amd64 (run apt-get update)" >&2; exit 1; }
(cd "$work" && apt-get download -qq "$pkg")
dpkg-deb -x "$work"/linux-image-*.deb "$work/k"
kver=$(ls "$work/k/lib/modules")
depmod -b "$work/k" "$kver"
root="$work/root"
mkdir -p "$root/bin" "$root/modules"
cp /bin/busybox "$root/bin/busybox"
install -m 0755 tests/guest/init "$root/init"
install -m 0755 "$observer" "$root/bin/vp-observer"
: > "$root/modules.order"
for m in virtio_pci virtio_scsi sd_mod sr_mod virtio_blk ahci isofs virtio_net; do
  modprobe -d "$work/k" -S "$kver" --show-depends "$m" | awk '/^insmod/ {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  name=$(basename "$ko" .ko)
  cp "$ko" "$root/modules/$name.ko"
  echo "$name" >> "$root/modules.order"
done
# The ACPI power button's driver and the input device it reports on, loaded only by guests
# booted with vp.acpi=1 (tests/guest/init), so they are not in modules.order.
for m in button evdev; do
  modprobe -d "$work/k" -S "$kver" --show-depends "$m" | awk '/^insmod/ {print $2}' | while read -r ko; do
    cp "$ko" "$root/modules/$(basename "$ko")"
  done
done
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -9) > "$work/initramfs.cpio.gz"
cp "$work/k/boot/vmlinuz-$kver" "$work/vmlinuz"
# Bootable ISO of the same guest.
iso="$work/iso"
mkdir -p "$iso/isolinux"
cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 "$iso/isolinux/"
cp "$work/vmlinuz" "$work/initramfs.cpio.gz" "$iso/"
kernel_args="console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable"
printf 'DEFAULT guest\nPROMPT 0\nTIMEOUT 0\nLABEL guest\n  KERNEL /vmlinuz\n  INITRD /initramfs.cpio.gz\n  APPEND %s\n' "$kernel_args" > "$iso/isolinux/isolinux.cfg"
xorriso -as mkisofs -quiet -o "$work/guest.iso" -V VPGUEST -b isolinux/isolinux.bin -c isolinux/boot.cat \
  -no-emul-boot -boot-load-size 4 -boot-info-table "$iso"
# Firmware-bootable images (GRUB for BIOS and UEFI). GRUB talks on the serial port too, so a
# boot that stops in GRUB says why on the console; the kernel prints there by console=ttyS0.
grub_image() { # medium output [extra kernel args]
  local tree="$work/grub-$1"
  mkdir -p "$tree/boot/grub"
  cp "$work/vmlinuz" "$work/initramfs.cpio.gz" "$tree/"
  cat > "$tree/boot/grub/grub.cfg" <<CFG
set timeout=0
set default=0
serial --unit=0 --speed=115200
terminal_input serial
terminal_output serial
menuentry guest {
  linux /vmlinuz $kernel_args vp.medium=$1${3:+ $3}
  initrd /initramfs.cpio.gz
}
CFG
  grub-mkrescue -o "$2" --locales= --fonts= --themes= "$tree" 2>"$work/grub-mkrescue.log" \
    || { cat "$work/grub-mkrescue.log" >&2; exit 1; }
  truncate -s %512 "$2"
}
# The CD's guest reboots itself once up (vp.reboot=1), as Ironic's ramdisk does after a deploy:
# tests see what the firmware boots after a guest-initiated reset in the same QEMU.
grub_image cd "$work/boot-cd.iso" vp.reboot=1
grub_image disk "$work/boot-disk.img"
mv "$work/vmlinuz" "$work/initramfs.cpio.gz" "$work/guest.iso" "$work/boot-cd.iso" "$work/boot-disk.img" "$out/"
echo "$stamp_in" > "$out/stamp"
echo "test guest: $out (kernel $kver)"
