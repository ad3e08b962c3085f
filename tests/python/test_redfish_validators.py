"""DMTF's conformance tools against the Redfish service of a real `virtplug up` with two VMs, one
with a virtual medium inserted: redfish-service-validator (every payload against the CSDL
schemas, offline: tests/redfish/csdl), redfish-protocol-validator (DSP0266's HTTP rules:
headers, ETags, sessions, accounts, roles, errors) and redfish-interop-validator with OpenStack
Ironic's profile (tests/redfish/profiles). Each must report 0 FAIL; the counts are printed.

The service validator's WARNs are deprecations it notes in what the service serves: the
`Severity` property of every message in DMTF's own Base registry (served verbatim) and the
Manager's `VirtualMedia` link (kept because Ironic looks there on older BMCs).
"""
import os
import re
import subprocess
import sys

import pytest

import requests

from redfish_up import REPO, Images, Up, wait_until

CSDL = os.path.join(REPO, "tests", "redfish", "csdl")
PROFILE = os.path.join(REPO, "tests", "redfish", "profiles", "OpenStackIronicProfile.v1_2_0.json")
BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def up():
    images = Images()
    u = Up(extra_args=["--import-allow-host", "127.0.0.1"])
    try:
        u.create_vm("bmc-a")
        u.create_vm("bmc-b", labels={"bmc": "yes"})
        insert_medium(u, "bmc-a", images.url("boot-cd.iso"))
        yield u
    finally:
        u.close()
        images.close()


def insert_medium(up, name, url):
    """InsertMedia into VM `name`'s Cd, then wait until it says Inserted."""
    s = requests.Session()
    s.verify, s.auth, s.trust_env = up.ca, ("admin", up.password), False
    systems = s.get(up.url + "/redfish/v1/Systems", timeout=30).json()["Members"]
    system = next(m["@odata.id"] for m in systems if s.get(up.url + m["@odata.id"], timeout=30).json()["Name"] == f"default/{name}")
    r = s.post(up.url + system + "/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia", json={"Image": url}, timeout=60)
    assert r.status_code in (202, 204), r.text
    wait_until(300, f"the medium in {name}'s drive",
               lambda: s.get(up.url + system + "/VirtualMedia/Cd", timeout=30).json()["Inserted"], every=0.5)


def env():
    # requests prefers these over a session's own `verify` (the validators set theirs).
    e = dict(os.environ)
    e.pop("REQUESTS_CA_BUNDLE", None)
    e.pop("CURL_CA_BUNDLE", None)
    return e


def run(args, timeout=600):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env())
    return p.returncode, p.stdout + p.stderr


def test_the_service_validator_finds_no_failure(up, tmp_path):
    rc, out = run([os.path.join(BIN, "rf_service_validator"), "-r", up.url, "-u", "admin", "-p", up.password,
                   "--authtype", "Session", "--schema_directory", CSDL, "--skipschema", "--logdir", str(tmp_path)])
    m = re.search(r"PASS\s*\|\s*WARN\s*\|\s*FAIL\s*\|\s*NOT TESTED\s*\|\s*\n[+-]+\n\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)", out)
    assert m, out[-3000:]
    passed, warned, failed, untested = map(int, m.groups())
    print(f"\nredfish-service-validator: PASS {passed}, WARN {warned}, FAIL {failed}, NOT TESTED {untested}")
    assert failed == 0 and rc == 0, out[-5000:]
    assert passed > 1000, "it validated the whole tree (two Systems, Managers, Chassis, accounts, roles)"


def test_the_protocol_validator_finds_no_failure(up, tmp_path):
    rc, out = run([sys.executable, os.path.join(os.path.dirname(__file__), "protocol_validator_loopback.py"),
                   "-r", up.url, "-u", "admin", "-p", up.password, "--report-dir", str(tmp_path),
                   "--report-type", "tsv", "--ca-bundle", up.ca, "--avoid-http-redirect"])
    m = re.search(r"PASS: (\d+), WARN: (\d+), FAIL: (\d+), NOT_TESTED: (\d+)", out)
    assert m, out[-3000:]
    passed, warned, failed, untested = map(int, m.groups())
    print(f"\nredfish-protocol-validator: PASS {passed}, WARN {warned}, FAIL {failed}, NOT TESTED {untested}")
    if failed:
        for f in tmp_path.glob("*.tsv"):
            print("\n".join(l for l in f.read_text().splitlines() if "\tFAIL\t" in l))
    assert failed == 0 and rc == 0, out[-3000:]
    assert passed > 300


def test_the_interop_validator_with_ironics_profile_finds_no_failure(up, tmp_path):
    rc, out = run([os.path.join(BIN, "rf_interop_validator"), "-r", up.url, "-u", "admin", "-p", up.password,
                   "--authtype", "Session", "--logdir", str(tmp_path), PROFILE])
    m = re.search(r"PASS\s*\|\s*WARN\s*\|\s*FAIL\s*\|\s*NOT TESTED\s*\|\s*\n[+-]+\n\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)", out)
    assert m, out[-3000:]
    passed, warned, failed, untested = map(int, m.groups())
    print(f"\nredfish-interop-validator (OpenStackIronicProfile v1.2.0): PASS {passed}, WARN {warned}, FAIL {failed}, NOT TESTED {untested}")
    assert failed == 0 and rc == 0, out[-5000:]
    assert "VirtualMedia/Cd" in out, "the profile's VirtualMedia requirements were checked"
