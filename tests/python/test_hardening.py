"""The Python `kubernetes` client against the API server's limits (issue 14): what a client sees
for a future resourceVersion, a tampered continue token, an oversized JSON patch and oversized
annotations. The server is the real `virtplug apiserver` binary ($VIRTPLUG_BIN).
"""
import base64
import json
import os
import re
import subprocess
import tempfile
import threading

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

GROUP, VERSION, PLURAL = "kubevirt.io", "v1", "virtualmachines"


def vm(name):
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name},
        "spec": {
            "runStrategy": "Halted",
            "template": {"spec": {
                "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
                "volumes": [{"name": "root", "emptyDisk": {"capacity": "1Gi"}}],
            }},
        },
    }


@pytest.fixture(scope="module")
def custom():
    binary = os.environ.get("VIRTPLUG_BIN", "target/debug/virtplug")
    with tempfile.TemporaryDirectory() as data_dir:
        proc = subprocess.Popen(
            [binary, "apiserver", "--data-dir", data_dir, "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            first = proc.stdout.readline()
            assert re.search(r"https://127\.0\.0\.1:\d+", first), first
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            api = client.CustomObjectsApi(config.new_client_from_config(os.path.join(data_dir, "kubeconfig")))
            for i in range(3):
                api.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, vm(f"h-{i}"))
            yield api
        finally:
            proc.kill()  # the server this fixture started, by its handle
            proc.wait()


def refused(call):
    with pytest.raises(ApiException) as e:
        call()
    return e.value.status, json.loads(e.value.body)


def test_a_future_resource_version_is_too_large_as_client_go_detects_it(custom):
    rv = int(custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["metadata"]["resourceVersion"])
    status, body = refused(lambda: custom.list_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, resource_version=str(rv + 1000)))
    assert status == 504
    assert body["reason"] == "Timeout"
    assert body["details"]["causes"][0] == {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}


def test_a_tampered_continue_token_is_refused(custom):
    page = custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, limit=1)
    token = json.loads(base64.urlsafe_b64decode(page["metadata"]["continue"] + "=="))
    token["prefix"] = "/kubevirt.io/virtualmachines/kube-system/"
    tampered = base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")
    status, body = refused(lambda: custom.list_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, limit=1, _continue=tampered))
    assert status == 400
    assert body["message"].startswith("invalid continue token: continue key is not valid")


def test_a_json_patch_of_20000_operations_is_413(custom):
    ops = [{"op": "test", "path": "/metadata/name", "value": "h-0"}] * 20000
    status, body = refused(lambda: custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "h-0", ops, _content_type="application/json-patch+json"))
    assert status == 413
    assert body["message"].endswith("The allowed maximum operations in a JSON patch is 10000, got 20000")


def test_annotations_over_256_kib_are_invalid(custom):
    patch = {"metadata": {"annotations": {"big": "x" * 262144}}}
    status, body = refused(lambda: custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "h-0", patch))
    assert status == 422
    assert body["details"]["causes"][0]["field"] == "metadata.annotations"
    assert body["details"]["causes"][0]["message"].startswith("Too long: must have at most 262144 bytes")
