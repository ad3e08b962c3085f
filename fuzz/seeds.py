#!/usr/bin/env python3
"""Writes the hand-made seed inputs of the fuzz targets into fuzz/corpus/<target>/seed-*.

Realistic inputs get the fuzzers past parsing at once: the test VM manifest
(tests/fixtures/testvm.yaml) as JSON and YAML, patches kubectl and the controllers send, query
strings clients send, QMP sessions as QEMU 10 answers them, and sets of stored objects as the
server holds them. Run it from anywhere; it only (re)writes seed-* files.
"""
import json
import os
import pathlib

import yaml

FUZZ = pathlib.Path(__file__).resolve().parent
ROOT = FUZZ.parent


def write(target, name, data):
    d = FUZZ / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / f"seed-{name}").write_bytes(data)


def j(v):
    return json.dumps(v, separators=(",", ":"))


TESTVM_YAML = (ROOT / "tests/fixtures/testvm.yaml").read_text()
TESTVM = yaml.safe_load(TESTVM_YAML)

# --- api_body: first byte = content type index (see api_body.rs) -------------------------
CT = {"json": 0, "yaml": 1, "jsonpatch": 2, "merge": 3, "strategic": 4, "apply": 5, "protobuf": 6, "none": 7}
PATCHES = {
    "jsonpatch": [
        [{"op": "add", "path": "/metadata/labels/x", "value": "y"}],
        [{"op": "test", "path": "/spec/runStrategy", "value": "Halted"}, {"op": "replace", "path": "/spec/runStrategy", "value": "Always"}],
        [{"op": "remove", "path": "/spec/template/spec/domain/devices/disks/0"}],
        [{"op": "copy", "from": "/spec", "path": "/spec/template/x"}, {"op": "move", "from": "/metadata/labels", "path": "/metadata/annotations"}],
        [{"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "hp", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": True}}}],
    ],
    "merge": [
        {"metadata": {"labels": {"app": None, "b": "c"}, "finalizers": None}},
        {"spec": {"runStrategy": "Always"}},
        {"status": {"printableStatus": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}}},
    ],
    "strategic": [
        {"metadata": {"labels": {"a": "b"}}, "spec": {"template": {"spec": {"volumes": [{"name": "x", "$patch": "delete"}]}}}},
        {"metadata": {"$setElementOrder/finalizers": ["a"]}},
    ],
}
write("api_body", "json-testvm", bytes([CT["json"]]) + j(TESTVM).encode())
write("api_body", "yaml-testvm", bytes([CT["yaml"]]) + TESTVM_YAML.encode())
write("api_body", "apply-testvm", bytes([CT["apply"]]) + TESTVM_YAML.encode())
write("api_body", "yaml-anchors", bytes([CT["yaml"]]) + b"a: &x [1, 2]\nb: *x\nc: {d: *x}\n")
write("api_body", "none-testvm", bytes([CT["none"]]) + j(TESTVM).encode())
for kind in ("jsonpatch", "merge", "strategic"):
    for i, p in enumerate(PATCHES[kind]):
        write("api_body", f"{kind}-{i}", bytes([CT[kind]]) + j(p).encode())

# --- api_patch: kind byte (0 json, 1 merge, 2 strategic, 3 apply) + current + 0xFF + body ---
KIND = {"jsonpatch": 0, "merge": 1, "strategic": 2}
for kind in ("jsonpatch", "merge", "strategic"):
    for i, p in enumerate(PATCHES[kind]):
        write("api_patch", f"{kind}-{i}", bytes([KIND[kind]]) + j(TESTVM).encode() + b"\xff" + j(p).encode())
write("api_patch", "apply-0", bytes([3]) + j(TESTVM).encode() + b"\xff" + TESTVM_YAML.encode())
write("api_patch", "jsonpatch-array", bytes([0]) + b'{"a":[1,2,3,{"b":[]}]}\xff' + j([
    {"op": "add", "path": "/a/0", "value": [[[]]]}, {"op": "copy", "from": "/a", "path": "/a/-"},
    {"op": "move", "from": "/a/1", "path": "/c"}, {"op": "test", "path": "/c", "value": 2}]).encode())

# --- api_query ------------------------------------------------------------------------------
QUERIES = [
    "labelSelector=app%3Dweb%2Ctier+in+%28db%2Ccache%29%2C%21legacy&limit=500",
    "fieldSelector=metadata.name%3Dtestvm%2Cmetadata.namespace%21%3Dkube-system",
    "watch=true&resourceVersion=12&timeoutSeconds=300&allowWatchBookmarks=true",
    "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=",
    "resourceVersion=0&resourceVersionMatch=Exact&limit=1",
    "continue=eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NTAsInN0YXJ0IjoiYSIsInByZWZpeCI6Ii9rdWJldmlydC5pby92aXJ0dWFsbWFjaGluZXMvZGVmYXVsdC8ifQ&limit=2",
    "gracePeriodSeconds=30&propagationPolicy=Foreground&dryRun=All",
    "includeObject=Object&labelSelector=kubevirt.io%2Fvm%3Dtestvm",
    "timeoutSeconds=9223372036854775807&limit=-1",
]
for i, q in enumerate(QUERIES):
    write("api_query", f"q{i}", q)

# --- qemu_cmdline: the test VM's instance spec and a few variants ---------------------------
spec = TESTVM["spec"]["template"]["spec"]
write("qemu_cmdline", "testvm", j(spec))
kb = json.loads(j(spec))
kb["domain"]["firmware"] = {"kernelBoot": {"kernelArgs": "console=ttyS0 root=/dev/vda", "container": {"kernelPath": "/boot/vmlinuz", "initrdPath": "/boot/initrd"}}}
kb["domain"]["cpu"] = {"cores": 2, "sockets": 2, "threads": 1}
kb["volumes"].append({"name": "scratch", "emptyDisk": {"capacity": "2Gi"}})
kb["domain"]["devices"]["disks"].append({"name": "scratch", "disk": {"bus": "virtio"}, "bootOrder": 2})
write("qemu_cmdline", "kernelboot", j(kb))

# --- mountinfo --------------------------------------------------------------------------------
MOUNTS = """22 27 0:21 / /proc rw,relatime - proc proc rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684084k
31 27 253:0 /var/lib/virtplug/storage/uid /var/lib/kubelet/pods/p/volumes/a\\040b rw,relatime shared:1 master:2 - ext4 /dev/vda rw
40 31 7:3 / /run/vp/mnt\\011tab\\012nl\\134bs rw - xfs /dev/loop3 rw,attr2
"""
write("mountinfo", "real", MOUNTS)
write("mountinfo", "self", pathlib.Path("/proc/self/mountinfo").read_bytes()[:4000])

# --- qmp_reply: answers in command order (see qmp_reply.rs) ---------------------------------
def ret(v):
    return j({"return": v, "id": "$ID"}).replace('"$ID"', "$ID")


def err(cls, desc):
    return j({"error": {"class": cls, "desc": desc}, "id": "$ID"}).replace('"$ID"', "$ID")


def ev(name, data):
    return j({"timestamp": {"seconds": 1733000000, "microseconds": 1}, "event": name, "data": data})


NODES = ret([{"node-name": "n-data1", "ro": False, "drv": "raw", "file": "/dev/fdset/0"},
             {"node-name": "#block123", "ro": False}, {"node-name": "drive-cd0", "ro": True}, {"node-name": "n-gone", "ro": False}])
QOM = ret([{"name": "type", "type": "string"}, {"name": "vp-data1", "type": "child<scsi-hd>"},
           {"name": "cdrom0", "type": "child<ide-cd>"}, {"name": "vp-lun", "type": "child<scsi-block>"}])
BLOCK = ret([{"device": "", "qdev": "cdrom0", "removable": True, "locked": False, "tray_open": False,
              "inserted": {"node-name": "n-old", "ro": True}},
             {"qdev": "/machine/peripheral/vp-data1/virtio-backend", "removable": False}])
FDSETS = ret([{"fdset-id": 0, "fds": [{"fd": 30, "opaque": "virtplug:a"}]}, {"fdset-id": 1, "fds": [{"fd": 31}]}])
EMPTY_NODES, EMPTY_QOM = ret([]), ret([{"name": "type", "type": "string"}])
session = [
    ret({}),  # qmp_capabilities
    NODES, QOM,  # inventory
    NODES, QOM,  # attached
    BLOCK,  # drives
    FDSETS, ret({}),  # remove_stale_fdsets, remove-fd 0
    EMPTY_NODES, EMPTY_QOM, ret({"fdset-id": 0, "fd": 40}), ret({}), ret({}), ret({}),  # attach by fd
    EMPTY_NODES, EMPTY_QOM, ret({}), ret({}),  # attach by path
    QOM, ret({}) + "\x1e" + ev("DEVICE_DELETED", {"device": "vp-data1", "path": "/machine/peripheral/vp-data1"}), NODES, ret({}),  # detach
    BLOCK, EMPTY_NODES, ret({"fdset-id": 1, "fd": 41}), ret({}), ret({}), ret({}), ret({}), ret({}), ret({}), ret({}),  # insert
    BLOCK, ret({}), ret({}), ret({}), ret({}),  # eject
    ret({}),  # set_bootindex
    ret({}) + "\x1e" + ev("SHUTDOWN", {"guest": True, "reason": "guest-shutdown"}),  # powerdown
]
write("qmp_reply", "session", "\n".join(session))
errors = [ret({}), err("GenericError", "x"), "", ret("not a list"), ret([{"name": 5}]), err("DeviceNotFound", "Device 'vp-data1' not found"),
          "{\"return\": {}, \"id\": 999}\x1e" + ret({}), "garbage\x1e" + ret([]), ev("RESET", {"guest": True}) + "\x1e" + ret([])]
write("qmp_reply", "errors", "\n".join(errors))

# --- stored_object: sets of objects as the server stores them -------------------------------
ns, uid_vm, uid_vmi = "default", "0b7c2f56-vm", "5a1d-vmi"
vm = json.loads(j(TESTVM))
vm["metadata"].update({"namespace": ns, "uid": uid_vm, "resourceVersion": "7", "generation": 2, "creationTimestamp": "2025-01-01T00:00:00Z"})
vm["status"] = {"printableStatus": "Running", "ready": True, "created": True,
                "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": None}],
                "stateChangeRequests": [{"action": "Stop", "uid": uid_vmi}]}
owner = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "testvm", "uid": uid_vm, "controller": True, "blockOwnerDeletion": True}]
vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
       "metadata": {"name": "testvm", "namespace": ns, "uid": uid_vmi, "ownerReferences": owner,
                    "finalizers": ["kubevirt.io/foregroundDeleteVirtualMachine"], "labels": {"kubevirt.io/nodeName": "node1"}},
       "spec": json.loads(j(spec)),
       "status": {"phase": "Running", "nodeName": "node1", "conditions": [{"type": "Ready", "status": "True"}],
                  "volumeStatus": [{"name": "data1", "phase": "Ready", "reason": "VolumeReady", "hotplugVolume": {},
                                    "persistentVolumeClaimInfo": {"claimName": "pvc-data1", "accessModes": ["ReadWriteOnce"],
                                                                  "capacity": {"storage": "1Gi"}}}]}}
vmi["spec"]["volumes"] = [v for v in vmi["spec"]["volumes"] if v["name"] != "data1"]
dv = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "testvm-root", "namespace": ns, "uid": "dv1", "ownerReferences": owner},
      "spec": {"source": {"http": {"url": "http://example.com/disk.img"}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}},
      "status": {"phase": "ImportInProgress", "progress": "45.0%", "restartCount": 1}}
pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "pvc-data1", "namespace": ns, "uid": "pvc1",
       "ownerReferences": [{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": "testvm-root", "uid": "dv1"}]},
       "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem", "resources": {"requests": {"storage": "1Gi"}}},
       "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}}
event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "testvm.1", "namespace": ns, "creationTimestamp": "2025-01-01T00:00:00Z"},
         "involvedObject": {"kind": "VirtualMachineInstance", "name": "testvm", "namespace": ns, "uid": uid_vmi},
         "reason": "GuestReboot", "message": "the guest rebooted", "type": "Normal", "count": 3,
         "firstTimestamp": "2025-01-01T00:00:00Z", "lastTimestamp": "2025-01-01T00:05:00Z", "source": {"component": "virtplug-node"}}
node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1", "labels": {"kubevirt.io/schedulable": "true"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "virtplug-0.1.0"}}}
doomed = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed", "uid": "ns2", "deletionTimestamp": "2025-01-01T00:00:00Z"},
          "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Terminating"}}
doomed_vm = json.loads(j(vm))
doomed_vm["metadata"].update({"namespace": "doomed", "uid": "vm2"})
write("stored_object", "cluster", j([vm, vmi, dv, pvc, event, node]))
write("stored_object", "namespace-deletion", j([doomed, doomed_vm, dict(event, metadata=dict(event["metadata"], namespace="doomed"))]))
orphan = json.loads(j(vm))
orphan["metadata"].update({"deletionTimestamp": "2025-01-01T00:00:00Z", "finalizers": ["orphan"]})
write("stored_object", "orphan", j([orphan, vmi, dv]))
fg = json.loads(j(vm))
fg["metadata"].update({"deletionTimestamp": "2025-01-01T00:00:00Z", "finalizers": ["foregroundDeletion"]})
write("stored_object", "foreground", j([fg, vmi, dv, pvc]))
hot = json.loads(j(vm))
hot["spec"]["template"]["spec"]["volumes"].append({"name": "hp2", "dataVolume": {"name": "dv-hp2", "hotpluggable": True}})
hot["spec"]["template"]["spec"]["domain"]["devices"]["disks"].append({"name": "hp2", "disk": {"bus": "scsi"}})
write("stored_object", "hotplug", j([hot, vmi]))
