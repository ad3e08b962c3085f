#!/usr/bin/env python3
"""Redfish read latency under sushy's polling pattern: virtplug's service beside sushy-tools.

sushy (Ironic's client) polls a node by re-reading its System and the VirtualMedia collection
(then each member) over one keep-alive HTTPS session, with an X-Auth-Token. This replays that
pattern with `requests` (sushy's own HTTP stack) against:

- virtplug: `virtplug up` (the binary in $VIRTPLUG_BIN, default target/release/virtplug) with
  --vms VMs (stopped, so no guest competes for the CPU), a Redfish session of the admin account;
- sushy-tools: `sushy-emulator --fake` (its fake driver: systems held in memory, nothing behind
  them), HTTPS with the same certificate, no auth (sushy-tools has none by default).

Both run at once; the rounds alternate between them, so machine noise falls on both alike.
Every request has a deadline (10 s); each server's start has one (120 s).

    .venv/bin/python bench/redfish_poll.py --rounds 2000

Prints p50/p99/max per URL kind and server, and the ratios (sushy-tools / virtplug).
"""
import argparse
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from redfish_up import REPO, Up, wait_until  # noqa: E402

TIMEOUT = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def timed_get(session, url):
    t0 = time.perf_counter()
    r = session.get(url, timeout=TIMEOUT)
    dt = (time.perf_counter() - t0) * 1000
    if r.status_code != 200:
        raise SystemExit(f"GET {url}: {r.status_code} {r.text[:300]}")
    return dt, r.json()


def one_poll(session, base, system, collection, samples):
    """sushy's poll: the System, the VirtualMedia collection, each member."""
    dt, _ = timed_get(session, base + system)
    samples["System"].append(dt)
    dt, coll = timed_get(session, base + collection)
    samples["VirtualMedia collection"].append(dt)
    for m in coll.get("Members", []):
        dt, _ = timed_get(session, base + m["@odata.id"])
        samples["VirtualMedia member"].append(dt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2000, help="polls per server")
    ap.add_argument("--vms", type=int, default=8, help="VMs behind virtplug's service")
    args = ap.parse_args()
    os.environ.setdefault("VIRTPLUG_BIN", os.path.join(REPO, "target", "release", "virtplug"))
    for k in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        os.environ.pop(k, None)

    up = Up()
    emulator = None
    try:
        for i in range(args.vms):
            up.create_vm(f"poll-{i}")
        vp = requests.Session()
        vp.verify = up.ca
        r = vp.post(up.url + "/redfish/v1/SessionService/Sessions", json={"UserName": "admin", "Password": up.password}, timeout=TIMEOUT)
        assert r.status_code == 201, r.text
        vp.headers["X-Auth-Token"] = r.headers["X-Auth-Token"]
        systems = wait_until(60, f"{args.vms} Systems in virtplug's Redfish service", lambda: (lambda m: m if len(m) == args.vms else None)(
            vp.get(up.url + "/redfish/v1/Systems", timeout=TIMEOUT).json()["Members"]))
        vp_system = systems[0]["@odata.id"]
        vp_manager = vp.get(up.url + vp_system, timeout=TIMEOUT).json()["Links"]["ManagedBy"][0]["@odata.id"]
        vp_collection = vp.get(up.url + vp_manager, timeout=TIMEOUT).json()["VirtualMedia"]["@odata.id"]

        # sushy-tools with the same certificate (issued by up's CA for 127.0.0.1).
        tls = os.path.join(up.data_dir, "redfish", "tls")
        cert = next(iter(glob.glob(os.path.join(tls, "*.crt")) + glob.glob(os.path.join(tls, "*cert*"))))
        key = next(iter(glob.glob(os.path.join(tls, "*.key")) + glob.glob(os.path.join(tls, "*key*"))))
        port = free_port()
        emulator = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "sushy-emulator"), "--fake", "-i", "127.0.0.1",
                                     "-p", str(port), "--ssl-certificate", cert, "--ssl-key", key],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        st_url = f"https://127.0.0.1:{port}"
        st = requests.Session()
        st.verify = up.ca

        def st_systems():
            try:
                return st.get(st_url + "/redfish/v1/Systems", timeout=TIMEOUT).json()["Members"]
            except (requests.RequestException, ValueError):
                return None
        st_system = wait_until(120, "sushy-emulator --fake to answer", st_systems)[0]["@odata.id"]
        st_manager = st.get(st_url + st_system, timeout=TIMEOUT).json()["Links"]["ManagedBy"][0]["@odata.id"]
        st_collection = st.get(st_url + st_manager, timeout=TIMEOUT).json()["VirtualMedia"]["@odata.id"]

        results = {"virtplug": {k: [] for k in ("System", "VirtualMedia collection", "VirtualMedia member")},
                   "sushy-tools": {k: [] for k in ("System", "VirtualMedia collection", "VirtualMedia member")}}
        for _ in range(20):  # warm both
            one_poll(vp, up.url, vp_system, vp_collection, {k: [] for k in results["virtplug"]})
            one_poll(st, st_url, st_system, st_collection, {k: [] for k in results["virtplug"]})
        for _ in range(args.rounds):
            one_poll(vp, up.url, vp_system, vp_collection, results["virtplug"])
            one_poll(st, st_url, st_system, st_collection, results["sushy-tools"])

        print(f"{args.rounds} polls each, alternating; {args.vms} VMs behind virtplug; latency in ms (client: requests, keep-alive HTTPS)")
        print(f"{'server':<12} {'URL':<26} {'n':>6} {'p50':>8} {'p99':>8} {'max':>8}")
        summary = {}
        for server, kinds in results.items():
            for kind, xs in kinds.items():
                if not xs:
                    print(f"{server:<12} {kind:<26} {0:>6} {'-':>8} {'-':>8} {'-':>8}")
                    continue
                row = (percentile(xs, 50), percentile(xs, 99), max(xs))
                summary[(server, kind)] = row
                print(f"{server:<12} {kind:<26} {len(xs):>6} {row[0]:>8.2f} {row[1]:>8.2f} {row[2]:>8.2f}")
        for kind in ("System", "VirtualMedia collection"):
            a, b = summary[("virtplug", kind)], summary[("sushy-tools", kind)]
            print(f"ratio sushy-tools/virtplug, {kind}: p50 {b[0] / a[0]:.2f}x, p99 {b[1] / a[1]:.2f}x")
        print(json.dumps({f"{s}/{k}": {"p50": v[0], "p99": v[1], "max": v[2]} for (s, k), v in summary.items()}))
        print(f"(median of all virtplug System GETs {statistics.median(results['virtplug']['System']):.2f} ms)")
    finally:
        if emulator:
            emulator.terminate()
            try:
                emulator.wait(timeout=10)
            except subprocess.TimeoutExpired:
                emulator.kill()
        up.close()


if __name__ == "__main__":
    main()
