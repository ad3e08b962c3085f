"""Ironic's `redfish-virtual-media` boot, through sushy (Ironic's own Redfish client), against
the Redfish service of a real `virtplug up`: the ISO served from a loopback HTTP server that
answers late, imported into a DataVolume, and the guest (the firmware-bootable test images of
scripts/build-test-guest.sh, under QEMU/TCG) saying on its console which medium it booted from.

The CD image passes `vp.reboot=1`: a guest booted from it reboots itself (a guest-initiated
reset inside the same QEMU), as Ironic's ramdisk does after deploying, so the test sees whether
the next boot uses the one-time override again.
"""
import os
import subprocess
import time

import pytest
import requests
import sushy
from kubernetes import client

from redfish_up import GROUP, GUEST, REPO, VERSION, connect, system_named, wait_until

BOOT_DEADLINE = 420


@pytest.fixture(autouse=True)
def own_ca(monkeypatch):
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)


def create_bm(up, images, name):
    """A VM as metal3 sees a bare-metal host: off, a disk that boots through the firmware
    (imported from the image server), no kernel boot."""
    size = os.path.getsize(os.path.join(GUEST, "boot-disk.img"))
    dv = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": f"{name}-root"},
          "spec": {"source": {"http": {"url": images.url("boot-disk.img")}},
                   "storage": {"resources": {"requests": {"storage": str(size)}}}}}
    up.api.create_namespaced_custom_object("cdi.kubevirt.io", "v1beta1", "default", "datavolumes", dv)
    spec = {"terminationGracePeriodSeconds": 1,
            # 512 MiB: GRUB under OVMF runs out of memory with 256.
            "domain": {"resources": {"requests": {"memory": "512Mi"}},
                       "devices": {"disks": [{"name": "root", "bootOrder": 1, "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "dataVolume": {"name": f"{name}-root"}}]}
    vm = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualMachine", "metadata": {"name": name},
          "spec": {"runStrategy": "Halted", "template": {"spec": spec}}}
    up.api.create_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachines", vm)


def vm_spec(up, name):
    return up.api.get_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachines", name)


def vm_get(up, name):
    """`virtplug vm get NAME` (the table and the lines after it)."""
    binary = os.environ.get("VIRTPLUG_BIN", os.path.join(REPO, "target", "debug", "virtplug"))
    p = subprocess.run([binary, "vm", "get", name, "--kubeconfig", os.path.join(up.data_dir, "kubeconfig")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def wait_power(system, state, what):
    def reached():
        system.refresh()
        return system.power_state == state
    wait_until(BOOT_DEADLINE, what, reached)


def boots(console, line):
    return console.count(line)


@pytest.mark.parametrize("mode,firmware", [(sushy.BootSourceOverrideMode.LEGACY, "bios"), (sushy.BootSourceOverrideMode.UEFI, "efi")])
def test_ironic_virtual_media_sequence_boots_the_cd_once_then_the_disk(up, images, mode, firmware):
    name = f"bm-{firmware}"
    create_bm(up, images, name)
    conn = connect(up)
    system = system_named(conn, f"default/{name}")
    assert system.managers, "Links.ManagedBy"

    # prepare_ramdisk, in Ironic's order (reference/redfish.md 4.3).
    system.reset_system(sushy.ResetType.FORCE_OFF)
    wait_power(system, sushy.PowerState.OFF, "PowerState Off after ForceOff")
    members = system.virtual_media.get_members()
    cd = next(m for m in members if sushy.VirtualMediaType.CD in m.media_types)
    assert not cd.inserted and cd.image is None
    if cd.inserted:
        cd.eject_media()
    images.delay = 3.0  # the ISO answers late: the power-on below must wait for it
    cd.insert_media(images.url("boot-cd.iso"))
    if system.boot.mode != mode:
        system.set_system_boot_options(mode=mode)
        system.refresh()
        assert system.boot.mode == mode
    system.set_system_boot_options(sushy.BootSource.CD, enabled=sushy.BootSourceOverrideEnabled.ONCE)
    system.refresh()
    assert system.boot.target == sushy.BootSource.CD and system.boot.enabled == sushy.BootSourceOverrideEnabled.ONCE
    powered_on = time.time()
    system.reset_system(sushy.ResetType.ON)
    system.refresh()
    assert system.power_state == sushy.PowerState.POWERING_ON, "On is accepted while the ISO imports; the VM waits for it"

    uid = up.wait_guest_ready(name, deadline_s=BOOT_DEADLINE)
    vmi = up.vmi(name)
    wait_until(BOOT_DEADLINE, "the guest booted from the CD", lambda: f"VP-BOOT medium=cd firmware={firmware}" in up.console(uid))
    assert "boot-cd.iso" in images.served and images.served["boot-cd.iso"] > powered_on, \
        "the ISO was served only after On was sent: the start waited for it"
    assert vmi["status"].get("phase") == "Running"

    cd.refresh()
    assert cd.inserted and cd.image == images.url("boot-cd.iso")
    system.refresh()
    assert system.boot.enabled == sushy.BootSourceOverrideEnabled.DISABLED, "Once is used up by the boot"
    spec = vm_spec(up, name)["spec"]["template"]["spec"]
    orders = {d["name"]: d.get("bootOrder") for d in spec["domain"]["devices"]["disks"]}
    assert orders["root"] == 1, f"the original order is back: {orders}"

    # The CD's guest reboots itself (same QEMU): the firmware now boots the disk.
    qemu_pid = open(os.path.join(up.data_dir, "node", "vmis", uid, "qemu.pid")).read().strip()
    wait_until(BOOT_DEADLINE, "the disk's boot after the guest's own reboot",
               lambda: f"VP-BOOT medium=disk firmware={firmware}" in up.console(uid))
    assert boots(up.console(uid), "VP-BOOT medium=cd") == 1, "the CD booted exactly once"
    assert open(os.path.join(up.data_dir, "node", "vmis", uid, "qemu.pid")).read().strip() == qemu_pid

    # A power cycle boots the disk too.
    system.reset_system(sushy.ResetType.FORCE_OFF)
    wait_power(system, sushy.PowerState.OFF, "Off after ForceOff")
    system.reset_system(sushy.ResetType.ON)
    second = up.wait_guest_ready(name, deadline_s=BOOT_DEADLINE, not_uid=uid)
    wait_until(BOOT_DEADLINE, "the disk's boot after a power cycle", lambda: "VP-BOOT medium=disk" in up.console(second))
    assert "medium=cd" not in up.console(second)
    # And a ForceRestart (a new VMI from the VM's restored spec).
    system.reset_system(sushy.ResetType.FORCE_RESTART)
    third = up.wait_guest_ready(name, deadline_s=BOOT_DEADLINE, not_uid=second)
    wait_until(BOOT_DEADLINE, "the disk's boot after ForceRestart", lambda: "VP-BOOT medium=disk" in up.console(third))
    assert "medium=cd" not in up.console(third)

    # Ironic's prepare_instance: eject, Hdd persistent.
    cd.refresh()
    cd.eject_media()
    system.set_system_boot_options(sushy.BootSource.HDD, enabled=sushy.BootSourceOverrideEnabled.CONTINUOUS)
    system.refresh()
    assert system.boot.enabled == sushy.BootSourceOverrideEnabled.CONTINUOUS and system.boot.target == sushy.BootSource.HDD
    wait_until(120, "the ejected medium gone from the drive", lambda: (cd.refresh() or True) and not cd.inserted)
    assert cd.image is None
    system.reset_system(sushy.ResetType.FORCE_OFF)
    wait_power(system, sushy.PowerState.OFF, "Off at the end")


def test_continuous_cd_boots_the_cd_at_every_reboot(up, images):
    create_bm(up, images, "bm-1")
    system = system_named(connect(up), "default/bm-1")
    cd = system.virtual_media.get_members()[0]
    # Override first, medium second: the same spec as the other order.
    system.set_system_boot_options(sushy.BootSource.CD, enabled=sushy.BootSourceOverrideEnabled.CONTINUOUS)
    images.delay = 0
    cd.insert_media(images.url("boot-cd.iso"))
    system.reset_system(sushy.ResetType.ON)
    uid = up.wait_guest_ready("bm-1", deadline_s=BOOT_DEADLINE)
    wait_until(BOOT_DEADLINE, "two CD boots in one QEMU (Continuous survives the guest's reboot)",
               lambda: boots(up.console(uid), "VP-BOOT medium=cd") >= 2)
    system.refresh()
    assert system.boot.enabled == sushy.BootSourceOverrideEnabled.CONTINUOUS

    # Once, set while the guest runs: its next reset boots the CD (one more, at most two if a
    # reboot was already under way), then the disk, in the same QEMU.
    system.set_system_boot_options(sushy.BootSource.CD, enabled=sushy.BootSourceOverrideEnabled.ONCE)
    before = boots(up.console(uid), "VP-BOOT medium=cd")
    wait_until(BOOT_DEADLINE, "the disk's boot after the one-time override was used",
               lambda: "VP-BOOT medium=disk" in up.console(uid))
    assert boots(up.console(uid), "VP-BOOT medium=cd") - before <= 2, up.console(uid)[-2000:]
    system.refresh()
    assert system.boot.enabled == sushy.BootSourceOverrideEnabled.DISABLED
    system.reset_system(sushy.ResetType.FORCE_OFF)
    wait_power(system, sushy.PowerState.OFF, "Off at the end")


def post(up, path, body):
    return requests.post(up.url + path, json=body, verify=up.ca, auth=("admin", up.password), timeout=60)


def test_bad_images_are_refused_or_fail_the_task_naming_the_cause(up, images):
    create_bm(up, images, "bm-2")
    system = system_named(connect(up), "default/bm-2")
    insert = f"/redfish/v1/Systems/{system.identity}/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia"
    before = vm_spec(up, "bm-2")["spec"]
    for bad in ("file:///etc/passwd", "gopher://127.0.0.1/x", "not a url"):
        r = post(up, insert, {"Image": bad})
        assert r.status_code == 400, (bad, r.text)
        assert "ActionParameterValueFormatError" in r.text and "Image" in r.text
    r = post(up, insert, {"Image": images.url("boot-cd.iso"), "TransferProtocolType": "NFS"})
    assert r.status_code == 400 and "TransferProtocolType" in r.text
    r = post(up, insert, {"Image": images.url("boot-cd.iso"), "Bogus": 1})
    assert r.status_code == 400 and "ActionParameterUnknown" in r.text
    assert vm_spec(up, "bm-2")["spec"] == before, "refused requests change nothing"

    closed = images.url("x").replace(str(images.httpd.server_address[1]), "9")

    def outcome(r, what):
        """The error text of a refused insert, or of its failed Task."""
        if r.status_code != 202:
            assert r.status_code == 409, r.text
            return r.text
        task = r.headers["Location"]

        def done():
            t = requests.get(up.url + task, verify=up.ca, auth=("admin", up.password), timeout=30).json()
            return t if t["TaskState"] != "Running" else None
        t = wait_until(600, f"the task of {what} to end", done, every=1)
        assert t["TaskState"] == "Exception", t
        return str(t["Messages"])

    for url, cause in ((images.url("missing.iso"), "404"), (images.url("huge.iso"), "larger"),
                       (images.url("disk.qcow2"), "qcow2"), (closed + ".iso", "connect")):
        text = outcome(post(up, insert, {"Image": url}), f"the insert of {url}")
        assert cause in text.lower() or cause in text, (url, text)
        assert vm_spec(up, "bm-2")["spec"] == before, f"a failed insert of {url} is taken back"
        system.refresh()
        assert system.power_state == sushy.PowerState.OFF

    # On right after an insert whose import then fails (Ironic's order): the VM waits for the
    # medium, the insert fails, and the VM stays off with the failed medium holding it (a VM
    # asked to boot an ISO never boots without it); the VM has a VirtualMediaInsertFailed Event.
    r = post(up, insert, {"Image": closed + "/late.iso"})
    on = post(up, f"/redfish/v1/Systems/{system.identity}/Actions/ComputerSystem.Reset", {"ResetType": "On"})
    assert on.status_code in (202, 204, 409), on.text
    outcome(r, "the insert before On")
    if on.status_code == 202:
        outcome(on, "On")
    assert up.vmi("bm-2") is None, "no VMI: the VM never started without its medium"
    system.refresh()
    assert system.power_state == sushy.PowerState.POWERING_ON and system.status.health != sushy.Health.OK
    core = client.CoreV1Api(up.api.api_client)
    reasons = [e.reason for e in core.list_namespaced_event("default").items if e.involved_object.name == "bm-2"]
    assert "VirtualMediaInsertFailed" in reasons, reasons
    system.reset_system(sushy.ResetType.FORCE_OFF)


def test_hdd_continuous_boots_the_disk_and_media_swap_in_the_running_guest(up, images):
    """Ironic's prepare_instance (Hdd, persistent) with a medium in the drive: the disk boots;
    ejecting and inserting while the guest runs takes the medium out of and into the same drive,
    as the guest's kernel sees it."""
    create_bm(up, images, "bm-3")
    system = system_named(connect(up), "default/bm-3")
    cd = system.virtual_media.get_members()[0]
    images.delay = 0
    cd.insert_media(images.url("boot-cd.iso"))
    system.set_system_boot_options(sushy.BootSource.HDD, enabled=sushy.BootSourceOverrideEnabled.CONTINUOUS)
    system.reset_system(sushy.ResetType.ON)
    uid = up.wait_guest_ready("bm-3", deadline_s=BOOT_DEADLINE)
    wait_until(BOOT_DEADLINE, "the disk's boot", lambda: "VP-BOOT medium=disk" in up.console(uid))
    assert "medium=cd" not in up.console(uid)
    wait_until(120, "Inserted with the guest running", lambda: (cd.refresh() or True) and cd.inserted)

    cd.eject_media()
    wait_until(120, "the guest's kernel sees the medium go", lambda: "MEDIA sr0 out" in up.console(uid))
    cd.refresh()
    assert not cd.inserted and cd.image is None
    disks = [d["name"] for d in vm_spec(up, "bm-3")["spec"]["template"]["spec"]["domain"]["devices"]["disks"]]
    assert "vmedia-cd" in disks, "the drive stays, as on real hardware"

    def media_dvs():
        return up.api.list_namespaced_custom_object("cdi.kubevirt.io", "v1beta1", "default", "datavolumes",
                                                    label_selector="virtplug.io/virtual-medium-of=bm-3")["items"]
    wait_until(120, "the ejected medium's import freed", lambda: not [d for d in media_dvs() if not d["metadata"].get("deletionTimestamp")])

    # `virtplug vm get` shows the empty drive and the override.
    shown = vm_get(up, "bm-3")
    assert "Virtual media (Cd): empty (drive vmedia-cd)" in shown and "override Hdd Continuous" in shown, shown

    ins = up.console(uid).count("MEDIA sr0 in")
    cd.insert_media(images.url("boot-cd.iso"))
    wait_until(120, "the guest's kernel sees the medium come back", lambda: up.console(uid).count("MEDIA sr0 in") > ins)
    wait_until(120, "Inserted again", lambda: (cd.refresh() or True) and cd.inserted)
    system.refresh()
    assert system.boot.enabled == sushy.BootSourceOverrideEnabled.CONTINUOUS and system.boot.target == sushy.BootSource.HDD
    shown = vm_get(up, "bm-3")
    assert images.url("boot-cd.iso") in shown and "Succeeded" in shown, shown
    system.reset_system(sushy.ResetType.FORCE_OFF)
    wait_power(system, sushy.PowerState.OFF, "Off at the end")


def test_the_override_lives_in_the_vm_and_survives_a_restart_of_up(up, images):
    create_bm(up, images, "bm-4")
    system = system_named(connect(up), "default/bm-4")
    cd = system.virtual_media.get_members()[0]
    images.delay = 0
    cd.insert_media(images.url("boot-cd.iso"))
    wait_until(120, "the medium imported", lambda: (cd.refresh() or True) and cd.inserted)
    # The same image again: nothing to do, no second download, no second DataVolume.
    sent = images.count.get("boot-cd.iso", 0)
    dvs = up.api.list_namespaced_custom_object("cdi.kubevirt.io", "v1beta1", "default", "datavolumes",
                                               label_selector="virtplug.io/virtual-medium-of=bm-4")["items"]
    cd.insert_media(images.url("boot-cd.iso"))
    assert images.count.get("boot-cd.iso", 0) == sent
    assert len(up.api.list_namespaced_custom_object("cdi.kubevirt.io", "v1beta1", "default", "datavolumes",
                                                    label_selector="virtplug.io/virtual-medium-of=bm-4")["items"]) == len(dvs) == 1
    system.set_system_boot_options(sushy.BootSource.CD, enabled=sushy.BootSourceOverrideEnabled.ONCE)
    up.stop()
    up.start()
    system = system_named(connect(up), "default/bm-4")
    assert system.boot.target == sushy.BootSource.CD and system.boot.enabled == sushy.BootSourceOverrideEnabled.ONCE
    cd = system.virtual_media.get_members()[0]
    assert cd.image == images.url("boot-cd.iso")
    system.reset_system(sushy.ResetType.ON)
    uid = up.wait_guest_ready("bm-4", deadline_s=BOOT_DEADLINE)
    wait_until(BOOT_DEADLINE, "the CD boot after the restart", lambda: "VP-BOOT medium=cd" in up.console(uid))
    system.refresh()
    assert system.boot.enabled == sushy.BootSourceOverrideEnabled.DISABLED
    system.reset_system(sushy.ResetType.FORCE_OFF)
    wait_power(system, sushy.PowerState.OFF, "Off at the end")
