"""deploy/ validated offline: every document of every deploy/*.yaml against the Kubernetes JSON
schemas that kubernetes-validate ships (no cluster, no network), in strict mode (an unknown field
is an error, as `kubectl apply --validate=strict` makes it), for the oldest and newest Kubernetes
versions virtplug targets. The CRD documents are apiextensions.k8s.io/v1
CustomResourceDefinitions and validate as such. Then what schemas cannot see: the files apply in
order, every ServiceAccount and ClusterRole a workload or binding names exists, and the
Containerfile has its stages (its from-source build is not run here: no registry to pull the
rust image from; scripts/build-image.sh builds its runtime stage from a debootstrap base)."""
import copy
import pathlib
import re

import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# 1.30: a fixed older release, for clusters that lag; 1.33: the
# version virtplug's own API server reports.
VERSIONS = ["1.30", "1.33"]
FILES = [
    "00-namespace.yaml",
    "10-crds-kubevirt.yaml",
    "11-crd-datavolume.yaml",
    "20-rbac.yaml",
    "30-controller.yaml",
    "40-node.yaml",
    "50-subresources-api.yaml",
]
# Roles every Kubernetes cluster has, which virtplug's bindings may name without defining.
BUILTIN_CLUSTER_ROLES = {"system:auth-delegator"}
BUILTIN_ROLES = {("kube-system", "extension-apiserver-authentication-reader")}


def documents():
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                out.append((f"{path.name}#{i}", doc))
    return out


def by_kind(kind):
    return [d for _, d in documents() if d["kind"] == kind]


def test_deploy_holds_exactly_the_ordered_files():
    assert sorted(p.name for p in DEPLOY.glob("*.yaml")) == FILES


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_is_valid_in_strict_mode(version):
    docs = documents()
    assert len(docs) >= 12, [name for name, _ in docs]
    failures = []
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            failures.append(f"{name} ({doc['kind']} {doc['metadata']['name']}): {e.message} at {list(e.path)}")
    assert not failures, "\n".join(failures)


def test_the_validation_can_fail():
    """A negative control: the same check refuses a misspelt field and a wrong type, so a pass
    above means something."""
    deployment = copy.deepcopy(by_kind("Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {"path": "/healthz"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)
    daemonset = copy.deepcopy(by_kind("DaemonSet")[0])
    daemonset["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, VERSIONS[0], strict=True)


def test_the_datavolume_crd_is_alone_and_says_when_to_skip_it():
    text = (DEPLOY / "11-crd-datavolume.yaml").read_text()
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(text) if d]
    assert names == ["datavolumes.cdi.kubevirt.io"]
    assert "Skip this file where CDI is installed" in text
    kubevirt = [d["metadata"]["name"] for d in yaml.safe_load_all((DEPLOY / "10-crds-kubevirt.yaml").read_text()) if d]
    assert kubevirt == ["virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io"]


def test_workloads_and_bindings_name_what_exists():
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in by_kind("ServiceAccount")}
    roles = {d["metadata"]["name"] for d in by_kind("ClusterRole")} | BUILTIN_CLUSTER_ROLES
    assert accounts == {("virtplug", "virtplug-controller"), ("virtplug", "virtplug-node"), ("virtplug", "virtplug-subresources-api")}
    for w in by_kind("Deployment") + by_kind("DaemonSet"):
        assert w["metadata"]["namespace"] == "virtplug"
        assert ("virtplug", w["spec"]["template"]["spec"]["serviceAccountName"]) in accounts, w["metadata"]["name"]
    bound = set()
    for b in by_kind("ClusterRoleBinding"):
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": b["roleRef"]["name"]}
        assert b["roleRef"]["name"] in roles, b["metadata"]["name"]
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and (s["namespace"], s["name"]) in accounts, b["metadata"]["name"]
            bound.add((s["name"], b["roleRef"]["name"]))
    for b in by_kind("RoleBinding"):
        ns = b["metadata"]["namespace"]
        assert (ns, b["roleRef"]["name"]) in BUILTIN_ROLES and b["roleRef"]["kind"] == "Role", b["metadata"]["name"]
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and (s["namespace"], s["name"]) in accounts, b["metadata"]["name"]
            bound.add((s["name"], f"{ns}/{b['roleRef']['name']}"))
    assert bound == {
        ("virtplug-controller", "virtplug-controller"),
        ("virtplug-node", "virtplug-node"),
        ("virtplug-subresources-api", "virtplug-subresources-api"),
        # An aggregated API server's delegation: TokenReviews, SubjectAccessReviews, and the
        # front proxy's settings.
        ("virtplug-subresources-api", "system:auth-delegator"),
        ("virtplug-subresources-api", "kube-system/extension-apiserver-authentication-reader"),
    }


def test_the_workloads_run_what_the_issue_asks():
    (controller,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "virtplug-controller"]
    (node,) = by_kind("DaemonSet")
    assert controller["spec"]["replicas"] == 2
    c = controller["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][0] == "controller" and "--health-listen" in c["args"]
    assert (c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]) == ("/healthz", "/readyz")
    pod = node["spec"]["template"]["spec"]
    n = pod["containers"][0]
    assert pod["hostPID"] is True and n["securityContext"]["privileged"] is True
    assert n["args"][0] == "node"
    for flag in ["--data-dir=/var/lib/virtplug", "--kubelet-pods-dir=/var/lib/kubelet/pods"]:
        assert flag in n["args"]
    assert any(a.startswith("--health-listen=") for a in n["args"])
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in n["env"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in n["volumeMounts"]}
    for path in ["/var/lib/virtplug", "/var/lib/kubelet/pods", "/dev", "/sys/fs/cgroup"]:
        assert host[mounts[path]["name"]] == path
    assert mounts["/var/lib/kubelet/pods"]["mountPropagation"] == "Bidirectional"
    assert {"operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_the_subresources_api_is_an_aggregated_api_server():
    """KubeVirt's subresources (and the node tunnels) are proxied by kube-apiserver to the
    component's Service, whose pod runs `virtplug subresources-api` with HTTPS probes; users get
    the subresources through a role aggregated into `edit` and `admin`."""
    (api,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "virtplug-subresources-api"]
    pod = api["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["serviceAccountName"] == "virtplug-subresources-api" and c["args"][0] == "subresources-api"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    (svc,) = [d for d in by_kind("Service") if d["metadata"]["name"] == "virtplug-subresources-api"]
    assert svc["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]
    services = {(d["spec"]["group"], d["spec"]["version"]): d for d in by_kind("APIService")}
    assert set(services) == {("subresources.kubevirt.io", "v1"), ("subresources.virtplug.io", "v1")}
    for (group, version), s in services.items():
        assert s["metadata"]["name"] == f"{version}.{group}"
        assert s["spec"]["service"] == {"namespace": "virtplug", "name": "virtplug-subresources-api", "port": 443}
    (edit,) = [d for d in by_kind("ClusterRole") if d["metadata"]["name"] == "virtplug-subresources-edit"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    granted = {(r, v) for rule in edit["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert ("virtualmachineinstances/console", "get") in granted and ("virtualmachines/start", "update") in granted


def test_the_containerfile_has_its_stages():
    text = (ROOT / "Containerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    # `runtime` last: a plain `docker build` (no --target) builds it, from source.
    assert [s[1] for s in stages] == ["builder", "debuginfo", "prebuilt", "binary", "runtime"], stages
    froms = {name: base for base, name in stages}
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    # The bases are build arguments (scripts/build-image.sh gives a local one), defaulting to
    # docker.io's images.
    assert froms["builder"] == "${RUST_IMAGE}" and args["RUST_IMAGE"] == "docker.io/library/rust:${RUST_VERSION}-${DEBIAN}"
    assert froms["runtime"] == "${DEBIAN_IMAGE}" and args["DEBIAN_IMAGE"] == "docker.io/library/debian:${DEBIAN}-slim"
    assert args["DEBIAN"] == "bookworm"
    # The binary comes from the builder unless VIRTPLUG_BINARY=prebuilt names the stage that takes
    # it from the build context.
    assert froms["binary"] == "${VIRTPLUG_BINARY}" and args["VIRTPLUG_BINARY"] == "builder"
    assert froms["debuginfo"] == froms["prebuilt"] == "scratch"
    assert re.search(r"apt-get install .*qemu-system-x86 qemu-utils", text)
    assert "cargo build --release --locked -p virtplug" in text
    assert "objcopy --only-keep-debug" in text and "--strip-debug" in text
    body = dict(zip([s[1] for s in stages], re.split(r"^FROM .*$", text, flags=re.M)[1:]))
    assert "COPY --from=builder /out/virtplug.debug /virtplug.debug" in body["debuginfo"]
    copies = re.findall(r"^COPY .*$", body["prebuilt"], re.M)
    assert copies == ["COPY virtplug /out/virtplug"], copies
    # The runtime image gets the stripped binary, never the debug file.
    assert "COPY --from=binary /out/virtplug /usr/local/bin/virtplug" in body["runtime"] and ".debug" not in body["runtime"]


def test_the_image_script_builds_the_runtime_stage_from_a_prebuilt_binary():
    """scripts/build-image.sh (no registry: a debootstrap base, a host-built binary) strips the
    binary with the builder stage's objcopy steps and builds `runtime` with the prebuilt stage."""
    script = (ROOT / "scripts" / "build-image.sh").read_text()
    containerfile = (ROOT / "Containerfile").read_text()

    def objcopy_flags(text):
        return [re.findall(r"--[\w-]+", line) for line in re.findall(r"^[\s&]*objcopy (--.*)$", text, re.M)]

    assert objcopy_flags(script) == objcopy_flags(containerfile) == [
        ["--only-keep-debug"],
        ["--strip-debug", "--strip-unneeded"],
        ["--add-gnu-debuglink"],
    ]
    build = script[script.index('build --network=host'):]
    build = build[: build.index('"$OUT/context"')]
    for arg in ["--target runtime", "VIRTPLUG_BINARY=prebuilt", '"DEBIAN_IMAGE=$BASE_TAG"', '"DEBIAN_MIRROR=$MIRROR"']:
        assert arg in build, arg
    assert "debootstrap --variant=minbase" in script and script.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in script
