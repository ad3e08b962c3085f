"""The Python `kubernetes` client against the embedded API server: list, watch, patch round trip.

The server is the real `virtplug apiserver` binary ($VIRTPLUG_BIN) on a loopback port with a
temporary data dir; the client reads the kubeconfig the server wrote.
"""
import os
import re
import subprocess
import tempfile
import threading

import pytest
from kubernetes import client, config, watch

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
def api():
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
            api_client = config.new_client_from_config(os.path.join(data_dir, "kubeconfig"))
            yield api_client
        finally:
            proc.kill()  # the server this fixture started, by its handle
            proc.wait()


def test_list_namespaces(api):
    names = [ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items]
    assert "default" in names


def test_create_list_and_patch_round_trip(api):
    custom = client.CustomObjectsApi(api)
    created = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, vm("py-vm"))
    assert created["metadata"]["uid"]
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["py-vm"]

    patched = custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "py-vm", {"metadata": {"labels": {"tier": "db"}}, "spec": {"runStrategy": "Always"}})
    assert patched["spec"]["runStrategy"] == "Always"
    assert patched["metadata"]["generation"] == 2
    got = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "py-vm")
    assert got["metadata"]["labels"] == {"tier": "db"}
    # Unrelated fields were kept by the merge patch.
    assert got["spec"]["template"]["spec"]["volumes"][0]["name"] == "root"

    stale = {"metadata": {"resourceVersion": "1"}, "spec": {"runStrategy": "Halted"}}
    with pytest.raises(client.exceptions.ApiException) as err:
        custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "py-vm", stale)
    assert err.value.status == 409


def test_watch_sees_changes_from_a_resource_version(api):
    custom = client.CustomObjectsApi(api)
    rv = custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["metadata"]["resourceVersion"]
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, vm("watched"))
    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "watched")
    seen = []
    w = watch.Watch()
    for event in w.stream(custom.list_namespaced_custom_object, GROUP, VERSION, "default", PLURAL,
                          resource_version=rv, timeout_seconds=10):
        seen.append((event["type"], event["object"]["metadata"]["name"]))
        if len(seen) == 2:
            w.stop()
    assert seen == [("ADDED", "watched"), ("DELETED", "watched")]


def test_core_pvc_strategic_patch(api):
    core = client.CoreV1Api(api)
    core.create_namespaced_persistent_volume_claim("default", {
        "metadata": {"name": "py-claim"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    })
    patched = core.patch_namespaced_persistent_volume_claim("py-claim", "default", {"metadata": {"labels": {"a": "b"}}})
    assert patched.metadata.labels == {"a": "b"}
    assert patched.status.phase == "Pending"
