#!/usr/bin/env python3
"""A/B of two virtplug builds on the writes of a hot-plug, server side.

Starts `A apiserver` and `B apiserver`, each on its own temporary data dir and loopback port,
creates the same VMI and ConfigMap in both, then runs alternating blocks of ROUNDS rounds
against each (A first in even blocks, B first in odd ones). A round is three conditional JSON
merge patches over one kept-alive HTTPS connection, as the controller and the node agent send
them: the VMI's spec gains (or loses) a hot-plug disk and volume, a ConfigMap's data changes,
the VMI's status gains (or loses) a volume entry. Prints each build's median of the block
medians per patch, in ms, and in how many blocks A was faster.

    python3 bench/patch_ab.py target/release/virtplug /path/to/other/virtplug --blocks 10 --rounds 200

The client is Python's http.client: its own cost is in every figure, the same for both builds.
"""

import argparse
import base64
import http.client
import json
import selectors
import shutil
import ssl
import statistics
import subprocess
import tempfile
import time

START_DEADLINE = 60.0

VMI = {
    "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
    "metadata": {"name": "p1", "labels": {"kubevirt.io/nodeName": "node1", "kubevirt.io/vm": "p1"},
                 "annotations": {"kubevirt.io/latest-observed-api-version": "v1"}},
    "spec": {"terminationGracePeriodSeconds": 1,
             "domain": {"resources": {"requests": {"memory": "160Mi"}},
                        "devices": {"disks": [{"name": "cd0", "cdrom": {"bus": "sata"}}],
                                    "interfaces": [{"name": "default", "masquerade": {}}]},
                        "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0 quiet",
                                                    "container": {"kernelPath": "/guest/vmlinuz",
                                                                  "initrdPath": "/guest/initramfs.cpio.gz"}}}},
             "networks": [{"name": "default", "pod": {}}], "volumes": []},
}
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}, "data": {"a": "b"}}
VMI_PATH = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances"
CM_PATH = "/api/v1/namespaces/default/configmaps"
PATCHES = ("VMI spec", "ConfigMap", "VMI status")


class Server:
    """One `apiserver`, killed by PID and its data dir removed on close."""

    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="patch-ab-")
        self.proc = subprocess.Popen([binary, "apiserver", "--data-dir", self.dir, "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            self._connect(binary)
        except BaseException:
            self.close()
            raise

    def _connect(self, binary):
        end = time.monotonic() + START_DEADLINE
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        while True:
            left = end - time.monotonic()
            if left <= 0 or not sel.select(timeout=left):
                raise SystemExit(f"{binary} apiserver did not say it serves within {START_DEADLINE:.0f} s")
            line = self.proc.stdout.readline()
            if "serving" in line:
                break
            if not line:
                raise SystemExit(f"{binary} apiserver exited before it said it serves")
        kc = open(f"{self.dir}/kubeconfig").read()
        field = lambda key: next(l.split(":", 1)[1].strip() for l in kc.splitlines() if l.strip().startswith(key + ":"))
        host, port = field("server").split("//", 1)[1].rsplit(":", 1)
        ctx = ssl.create_default_context(cadata=base64.b64decode(field("certificate-authority-data")).decode())
        ctx.check_hostname = False
        self.conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)
        self.token = field("token")
        self.request("POST", VMI_PATH, VMI, "application/json")
        self.request("POST", CM_PATH, CONFIGMAP, "application/json")

    def request(self, method, path, body=None, content="application/merge-patch+json"):
        headers = {"Authorization": "Bearer " + self.token, "Accept": "application/json", "Content-Type": content}
        self.conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        r = self.conn.getresponse()
        data = r.read()
        if r.status >= 300:
            raise SystemExit(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data)

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def block(s, rounds):
    """Medians (ms) of the three patches over `rounds` rounds."""
    vmi, cm = f"{VMI_PATH}/p1", f"{CM_PATH}/c1"
    rv = s.request("GET", vmi)["metadata"]["resourceVersion"]
    rvc = s.request("GET", cm)["metadata"]["resourceVersion"]
    times = ([], [], [])
    for i in range(rounds):
        plugged = i % 2 == 0
        disks = [{"name": "cd0", "cdrom": {"bus": "sata"}}] + ([{"name": "p1", "disk": {"bus": "scsi"}, "serial": "p1"}] if plugged else [])
        volumes = [{"name": "p1", "persistentVolumeClaim": {"claimName": "p1", "hotpluggable": True}}] if plugged else []
        entries = [{"name": "p1", "phase": "Bound", "reason": "PVCBound", "message": f"PVC p1 is in phase Bound ({i})"}] if plugged else []
        writes = (
            (vmi, lambda: {"metadata": {"resourceVersion": rv}, "spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}}),
            (cm, lambda: {"metadata": {"resourceVersion": rvc}, "data": {"a": str(i)}}),
            (vmi + "/status", lambda: {"metadata": {"resourceVersion": rv}, "status": {"phase": "Running", "volumeStatus": entries}}),
        )
        for k, (path, body) in enumerate(writes):
            t = time.perf_counter()
            out = s.request("PATCH", path, body())
            times[k].append(time.perf_counter() - t)
            if path == cm:
                rvc = out["metadata"]["resourceVersion"]
            else:
                rv = out["metadata"]["resourceVersion"]
    return [statistics.median(t) * 1000 for t in times]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args()
    # Keyed by role, not path: a build may be compared with itself.
    builds = {"A": args.a, "B": args.b}
    servers = {}
    try:
        for role, binary in builds.items():
            servers[role] = Server(binary)
        results = {"A": [], "B": []}
        for k in range(args.blocks):
            for role in ("A", "B") if k % 2 == 0 else ("B", "A"):
                results[role].append(block(servers[role], args.rounds))
    finally:
        for s in servers.values():
            s.close()
    print(f"| build | {' | '.join(f'{p} patch (ms)' for p in PATCHES)} |")
    print("|---|" + "---:|" * len(PATCHES))
    for role, binary in builds.items():
        cols = list(zip(*results[role]))
        print(f"| {role}: {binary} | {' | '.join(f'{statistics.median(c):.3f}' for c in cols)} |")
    for i, label in enumerate(PATCHES):
        wins = sum(1 for x, y in zip(results["A"], results["B"]) if x[i] < y[i])
        print(f"{label}: A faster in {wins} of {args.blocks} blocks")


if __name__ == "__main__":
    main()
