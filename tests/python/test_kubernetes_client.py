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


def test_core_kinds_round_trip(api):
    core = client.CoreV1Api(api)
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "py-cm"}, "data": {"a": "1"}})
    assert cm.data == {"a": "1"}
    patched = core.patch_namespaced_config_map("py-cm", "default", {"data": {"b": "2"}})
    assert patched.data == {"a": "1", "b": "2"}
    secret = core.create_namespaced_secret("default", {"metadata": {"name": "py-secret"}, "stringData": {"user": "admin"}})
    assert secret.type == "Opaque" and secret.data == {"user": "YWRtaW4="} and secret.string_data is None
    pod = core.create_namespaced_pod("default", {
        "metadata": {"name": "py-pod"}, "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
    })
    assert pod.status.phase == "Pending" and pod.spec.restart_policy == "Always"
    assert [p.metadata.name for p in core.list_namespaced_pod("default", field_selector="status.phase=Pending").items] == ["py-pod"]
    with pytest.raises(client.exceptions.ApiException) as err:
        core.list_namespaced_pod("default", field_selector="spec.image=x")
    assert err.value.status == 400 and "field label not supported" in err.value.body
    with pytest.raises(client.exceptions.ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "py-bad"}, "data": {"bad key": "x"}})
    assert err.value.status == 422 and "data[bad key]" in err.value.body
    for delete in (core.delete_namespaced_config_map, core.delete_namespaced_secret, core.delete_namespaced_pod):
        delete(name={"delete_namespaced_config_map": "py-cm", "delete_namespaced_secret": "py-secret",
                     "delete_namespaced_pod": "py-pod"}[delete.__name__], namespace="default")
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items if c.metadata.name == "py-cm"] == []


def test_leases_access_reviews_and_storage_classes(api):
    leases = client.CoordinationV1Api(api)
    lease = leases.create_namespaced_lease("default", {"metadata": {"name": "py-lease"},
                                                       "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})
    lease.spec.holder_identity = "b"
    leases.replace_namespaced_lease("py-lease", "default", lease)
    with pytest.raises(client.exceptions.ApiException) as err:
        leases.replace_namespaced_lease("py-lease", "default", lease)  # its resourceVersion is stale now
    assert err.value.status == 409
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"verb": "delete", "resource": "virtualmachines", "group": "kubevirt.io"}}})
    assert review.status.allowed is True
    classes = [c.metadata.name for c in client.StorageV1Api(api).list_storage_class().items]
    assert "local" in classes


def test_a_crd_registered_by_the_client_serves_its_objects(api):
    ext = client.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition({
        "metadata": {"name": "pythings.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "pythings", "singular": "pything", "kind": "PyThing"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {"spec": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}}]},
    })
    # Established is set by the server's own task: follow the CRD until it says so (10 s deadline).
    w = watch.Watch()
    established = False
    for ev in w.stream(ext.list_custom_resource_definition, field_selector="metadata.name=pythings.example.com",
                       timeout_seconds=10):
        conditions = (ev["object"].status and ev["object"].status.conditions) or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            established = True
            w.stop()
    assert established, "the CRD was not Established within 10 s"
    custom = client.CustomObjectsApi(api)
    created = custom.create_namespaced_custom_object("example.com", "v1", "default", "pythings", {
        "apiVersion": "example.com/v1", "kind": "PyThing", "metadata": {"name": "t"}, "spec": {"n": 1, "dropped": True}})
    assert created["spec"] == {"n": 1}
    ext.delete_custom_resource_definition("pythings.example.com")
