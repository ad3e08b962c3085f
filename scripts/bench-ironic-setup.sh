#!/usr/bin/env bash
# Setup for bench/ironic_cycle.py (the Ironic virtual-media cycle, virtplug beside sushy-tools'
# libvirt driver): Debian's libvirt 9.0 driving the machine's QEMU (10.x from
# bookworm-backports), a running libvirtd (qemu:///system), and libvirt-python in .venv.
# Idempotent; run as root. Refuses to install when apt would remove or downgrade QEMU.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$REPO/.venv}"
PKGS=(libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-dev pkg-config gcc)
LIBVIRT_PYTHON="${LIBVIRT_PYTHON:-libvirt-python==9.0.0}"

[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive

qemu_before="$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)"
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    sim="$(apt-get install -s --no-install-recommends "${missing[@]}")"
    # A removal of anything, or any change to a qemu package, aborts (QEMU 10 comes from backports).
    if grep -E '^Remv ' <<<"$sim"; then
        echo "apt would remove packages (above): aborting" >&2; exit 1
    fi
    if grep -E '^Inst qemu' <<<"$sim"; then
        echo "apt would replace QEMU $qemu_before (above): aborting" >&2; exit 1
    fi
    apt-get install -y --no-install-recommends "${missing[@]}"
fi
qemu_after="$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)"
[ "$qemu_before" = "$qemu_after" ] || { echo "qemu-system-x86 changed: $qemu_before -> $qemu_after" >&2; exit 1; }

# /dev/kvm present but root-only (0600): libvirt 9.0 probes QEMU's capabilities as root (KVM
# found), then checks the cached result against /dev/kvm as its QEMU user (libvirt-qemu: no KVM),
# so it throws the cache away and probes QEMU again (~10-60 s) on every capabilities lookup — which
# sushy-tools does on most requests ("KVM was enabled when probing '/usr/bin/qemu-system-x86_64',
# but it is not available now" in its debug log). QEMU as root, as virtplug runs it, makes the two
# agree; the bench's domain is type 'qemu' (TCG) regardless. /dev/kvm itself is left alone.
CONF=/etc/libvirt/qemu.conf
restart=0
if [ -e /dev/kvm ] && ! su -s /bin/sh libvirt-qemu -c 'test -r /dev/kvm -a -w /dev/kvm' 2>/dev/null; then
    if ! grep -qE '^user = "root"' "$CONF"; then
        printf '\n# bench-ironic-setup.sh: QEMU as root (see the script)\nuser = "root"\ngroup = "root"\n' >>"$CONF"
        restart=1
    fi
fi
if [ "$restart" = 1 ] && [ "$(ps -p 1 -o comm=)" != systemd ] && [ -s /run/libvirtd.pid ]; then
    pid="$(cat /run/libvirtd.pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
elif [ "$restart" = 1 ] && [ "$(ps -p 1 -o comm=)" = systemd ]; then
    systemctl restart libvirtd
fi

# libvirtd: through systemd when it is PID 1, else as a daemon of its own.
if ! virsh -c qemu:///system version >/dev/null 2>&1; then
    if [ "$(ps -p 1 -o comm=)" = systemd ]; then
        systemctl start libvirtd
    else
        mkdir -p /run/libvirt
        # virtlogd writes the domains' console logs; libvirtd spawns it on demand, started here too.
        pgrep -x virtlogd >/dev/null || virtlogd -d
        libvirtd -d
    fi
    for _ in $(seq 1 60); do
        virsh -c qemu:///system version >/dev/null 2>&1 && break
        sleep 0.5
    done
fi
virsh -c qemu:///system version

# The QEMU libvirt found, and that it can run a 'qemu' (TCG) domain on it.
virsh -c qemu:///system domcapabilities --virttype qemu --arch x86_64 | grep -m1 '<path>' \
    || { echo "libvirt found no QEMU emulator" >&2; exit 1; }

if ! "$VENV/bin/python" -c 'import libvirt' 2>/dev/null; then
    "$VENV/bin/pip" install "$LIBVIRT_PYTHON"
fi
"$VENV/bin/python" -c 'import libvirt; print("libvirt-python", libvirt.getVersion())'
