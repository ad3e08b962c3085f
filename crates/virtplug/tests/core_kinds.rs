//! The core resources as a Kubernetes user drives them: every kubectl on the machine (1.27,
//! 1.33 and the one on PATH) creates, gets, describes, edits and deletes namespaces,
//! ConfigMaps, Secrets, ServiceAccounts, Services, Pods, Leases, StorageClasses,
//! PersistentVolumes and events.k8s.io Events against a real API server; `auth can-i` and
//! `whoami`; content negotiation (406, YAML, 415); field selectors; kube-rs on Leases.

#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl::oldest_newest_and_path as kubectls;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::TestServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, PostParams};

struct Kubectl<'a> {
    bin: &'a Path,
    kubeconfig: &'a Path,
    editor: &'a Path,
}

impl Kubectl<'_> {
    fn name(&self) -> String {
        self.bin.file_name().unwrap().to_string_lossy().into_owned()
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(self.bin);
        c.args(args).env("KUBECONFIG", self.kubeconfig).env("EDITOR", self.editor).env_remove("KUBERNETES_SERVICE_HOST");
        c
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("kubectl runs")
    }
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "{} {args:?} failed: {}", self.name(), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "{} {args:?} should fail: {}", self.name(), String::from_utf8_lossy(&out.stdout));
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
    fn apply(&self, manifest: &str) -> String {
        use std::io::Write;
        let mut child = self
            .cmd(&["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        child.stdin.take().expect("stdin").write_all(manifest.as_bytes()).expect("write stdin");
        let out = child.wait_with_output().expect("kubectl finishes");
        assert!(out.status.success(), "{} apply failed: {}\n{manifest}", self.name(), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The header line and the row of `name` of a `kubectl get` table.
fn row(table: &str, name: &str) -> (String, String) {
    let header = table.lines().next().unwrap_or_default().to_owned();
    let row = table.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| panic!("no row {name} in\n{table}"));
    (header, row.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kubectl_creates_gets_describes_edits_and_deletes_core_objects() {
    let s = TestServer::start().await;
    let editor = s.dir.path().join("editor.sh");
    // The edit every `kubectl edit` below makes: the value `one` becomes `two`.
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/: one$/: two/' \"$1\"\n").unwrap();
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let kubeconfig = s.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        for bin in kubectls() {
            let k = Kubectl { bin: &bin, kubeconfig: &kubeconfig, editor: &editor };
            let v = k.name();
            let ns = format!("t-{}", v.replace(['.', '_'], "-"));

            // Namespace: kubectl 1.32+ sends it as protobuf; it gets its default ServiceAccount.
            assert!(k.ok(&["create", "namespace", &ns]).contains("created"), "{v}");
            let (header, line) = row(&k.ok(&["get", "ns"]), &ns);
            assert!(header.starts_with("NAME") && header.contains("STATUS") && line.contains("Active"), "{v}: {header}\n{line}");
            assert_eq!(k.ok(&["get", "sa", "default", "-n", &ns, "-o", "jsonpath={.metadata.name}"]), "default", "{v}");
            let n = ["-n", ns.as_str()];

            // ConfigMap.
            k.ok(&[&["create", "configmap", "settings", "--from-literal=mode=one", "--from-literal=b=x"][..], &n].concat());
            let (header, line) = row(&k.ok(&[&["get", "cm"][..], &n].concat()), "settings");
            assert_eq!(header.split_whitespace().collect::<Vec<_>>(), ["NAME", "DATA", "AGE"], "{v}");
            assert_eq!(line.split_whitespace().nth(1), Some("2"), "{v}: {line}");
            assert!(k.ok(&[&["describe", "cm", "settings"][..], &n].concat()).contains("mode"), "{v}");
            k.ok(&[&["edit", "cm", "settings"][..], &n].concat());
            assert_eq!(k.ok(&[&["get", "cm", "settings", "-o", "jsonpath={.data.mode}"][..], &n].concat()), "two", "{v}: edit");
            let err = k.fails(&[&["create", "configmap", "bad", "--from-literal=bad key=x"][..], &n].concat());
            assert!(err.contains("data[bad key]") || err.contains("bad key"), "{v}: {err}");

            // Secret: stringData folded, type shown.
            k.ok(&[&["create", "secret", "generic", "creds", "--from-literal=user=one"][..], &n].concat());
            let (_, line) = row(&k.ok(&[&["get", "secret"][..], &n].concat()), "creds");
            assert!(line.contains("Opaque"), "{v}: {line}");
            assert!(k.ok(&[&["describe", "secret", "creds"][..], &n].concat()).contains("user:  3 bytes"), "{v}");
            assert_eq!(k.ok(&[&["get", "secret", "--field-selector", "type=Opaque", "-o", "name"][..], &n].concat()).trim(), "secret/creds", "{v}");

            // ServiceAccount.
            k.ok(&[&["create", "serviceaccount", "robot"][..], &n].concat());
            let (header, _) = row(&k.ok(&[&["get", "sa"][..], &n].concat()), "robot");
            assert!(header.contains("SECRETS"), "{v}: {header}");
            assert!(k.ok(&[&["describe", "sa", "robot"][..], &n].concat()).contains("robot"), "{v}");

            // Service: defaults and the columns kubectl shows.
            k.ok(&[&["create", "service", "clusterip", "web", "--tcp=80:8080"][..], &n].concat());
            let (header, line) = row(&k.ok(&[&["get", "svc"][..], &n].concat()), "web");
            assert_eq!(header.split_whitespace().collect::<Vec<_>>(), ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"], "{v}");
            assert!(line.contains("ClusterIP") && line.contains("80/TCP"), "{v}: {line}");
            assert_eq!(k.ok(&[&["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].targetPort}"][..], &n].concat()), "8080", "{v}");
            let err = k.fails(&[&["create", "service", "clusterip", "9bad", "--tcp=80"][..], &n].concat());
            assert!(err.contains("metadata.name") || err.contains("DNS-1035"), "{v}: {err}");

            // Pod: stored Pending (nothing runs Pods in embedded mode), status is a subresource.
            k.ok(&[&["run", "box", "--image=busybox:1.36", "--labels=app=one"][..], &n, &["--", "sleep", "1d"]].concat());
            let (header, line) = row(&k.ok(&[&["get", "pods"][..], &n].concat()), "box");
            assert_eq!(header.split_whitespace().collect::<Vec<_>>(), ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], "{v}");
            assert!(line.contains("0/1") && line.contains("Pending"), "{v}: {line}");
            let pod = k.ok(&[&["get", "pod", "box", "-o", "json"][..], &n].concat());
            let pod: serde_json::Value = serde_json::from_str(&pod).unwrap();
            assert_eq!(pod["spec"]["containers"][0]["args"], serde_json::json!(["sleep", "1d"]), "{v}");
            assert_eq!(pod["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent", "{v}");
            assert!(k.ok(&[&["describe", "pod", "box"][..], &n].concat()).contains("busybox:1.36"), "{v}");
            k.ok(&[&["label", "pod", "box", "app=two", "--overwrite"][..], &n].concat());
            assert_eq!(k.ok(&[&["get", "pods", "-l", "app=two", "-o", "name"][..], &n].concat()).trim(), "pod/box", "{v}");
            assert_eq!(k.ok(&[&["get", "pods", "--field-selector", "status.phase=Pending", "-o", "name"][..], &n].concat()).trim(), "pod/box", "{v}");
            let err = k.fails(&[&["get", "pods", "--field-selector", "spec.image=x"][..], &n].concat());
            assert!(err.contains("field label not supported: spec.image"), "{v}: {err}");
            let err = k.fails(&[&["set", "env", "pod/box", "X=1"][..], &n].concat());
            assert!(err.contains("pod updates may not change fields"), "{v}: {err}");

            // Lease, StorageClass, PersistentVolume, events.k8s.io Event: from manifests.
            let lease = format!(
                "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {{name: leader, namespace: {ns}}}\n\
                 spec: {{holderIdentity: one, leaseDurationSeconds: 15, renewTime: \"2026-12-01T10:00:00.000000Z\"}}\n"
            );
            assert!(k.apply(&lease).contains("lease.coordination.k8s.io/leader created"), "{v}");
            let (header, line) = row(&k.ok(&[&["get", "lease"][..], &n].concat()), "leader");
            assert!(header.contains("HOLDER") && line.contains("one"), "{v}: {header}\n{line}");
            k.ok(&[&["edit", "lease", "leader"][..], &n].concat());
            assert_eq!(k.ok(&[&["get", "lease", "leader", "-o", "jsonpath={.spec.holderIdentity}"][..], &n].concat()), "two", "{v}: edit");
            let sc = format!("sc-{ns}");
            let class = format!("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{name: {sc}}}\nprovisioner: example.com/nfs\nreclaimPolicy: Retain\n");
            k.apply(&class);
            let (header, line) = row(&k.ok(&["get", "sc"]), &sc);
            assert!(header.contains("PROVISIONER") && header.contains("VOLUMEBINDINGMODE"), "{v}: {header}");
            assert!(line.contains("example.com/nfs") && line.contains("Retain") && line.contains("Immediate"), "{v}: {line}");
            assert!(k.ok(&["get", "sc"]).lines().any(|l| l.starts_with("local (default)")), "{v}: the default class");
            let err = k.fails(&["patch", "sc", &sc, "-p", "{\"reclaimPolicy\":\"Delete\"}"]);
            assert!(err.contains("reclaimPolicy") && err.contains("immutable"), "{v}: {err}");
            let pv = format!("pv-{ns}");
            k.apply(&format!(
                "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {pv}}}\n\
                 spec: {{capacity: {{storage: 2Gi}}, accessModes: [ReadWriteOnce], hostPath: {{path: /tmp/{pv}}}, storageClassName: {sc}}}\n"
            ));
            let (header, line) = row(&k.ok(&["get", "pv"]), &pv);
            assert!(header.contains("RECLAIM POLICY") && header.contains("CLAIM"), "{v}: {header}");
            assert!(line.contains("2Gi") && line.contains("RWO") && line.contains("Retain"), "{v}: {line}");
            assert!(k.ok(&["describe", "pv", &pv]).contains(&format!("/tmp/{pv}")), "{v}");
            let err = k.fails(&["patch", "pv", &pv, "-p", "{\"spec\":{\"hostPath\":{\"path\":\"/elsewhere\"}}}"]);
            assert!(err.contains("spec.hostPath"), "{v}: {err}");
            k.apply(&format!(
                "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {{name: booted, namespace: {ns}}}\n\
                 eventTime: \"2026-12-01T10:00:00.000000Z\"\nreportingController: example.com/ctl\nreportingInstance: one\n\
                 action: Boot\nreason: Booted\ntype: Normal\nnote: the guest booted\nregarding: {{kind: Pod, name: box, namespace: {ns}}}\n"
            ));
            let events = k.ok(&[&["get", "events.v1.events.k8s.io"][..], &n].concat());
            assert!(events.contains("pod/box") && events.contains("the guest booted"), "{v}: {events}");

            // auth.
            assert_eq!(k.ok(&["auth", "can-i", "*", "*"]).trim(), "yes", "{v}");
            assert_eq!(k.ok(&["auth", "can-i", "delete", "pods", "-n", &ns]).trim(), "yes", "{v}");
            let whoami = k.ok(&["auth", "whoami"]);
            assert!(whoami.contains("virtplug-admin") && whoami.contains("system:masters"), "{v}: {whoami}");

            // Delete, and each object is gone.
            for (kind, name, namespaced) in [
                ("cm", "settings", true),
                ("secret", "creds", true),
                ("sa", "robot", true),
                ("svc", "web", true),
                ("pod", "box", true),
                ("lease", "leader", true),
                ("events.v1.events.k8s.io", "booted", true),
                ("pv", pv.as_str(), false),
                ("sc", sc.as_str(), false),
            ] {
                let describe: Vec<&str> = if namespaced { vec!["describe", kind, name, "-n", &ns] } else { vec!["describe", kind, name] };
                assert!(k.ok(&describe).contains(name), "{v}: describe {kind}");
                let args: Vec<&str> = if namespaced { vec!["delete", kind, name, "-n", &ns] } else { vec!["delete", kind, name] };
                assert!(k.ok(&args).contains("deleted"), "{v}: delete {kind}");
                let get: Vec<&str> = if namespaced { vec!["get", kind, name, "-n", &ns] } else { vec!["get", kind, name] };
                assert!(k.fails(&get).contains("NotFound"), "{v}: {kind} {name} is gone");
            }
            k.ok(&["delete", "namespace", &ns]);
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn responses_are_negotiated_and_unreadable_bodies_are_refused_with_the_types_that_work() {
    let s = TestServer::start().await;
    let http = reqwest::Client::builder().danger_accept_invalid_certs(true).build().unwrap();
    let token = s.server.token().to_owned();
    let get =
        |accept: &'static str| http.get(format!("{}/api/v1/namespaces/default", s.url)).bearer_auth(&token).header("Accept", accept).send();
    // Only protobuf, which this server does not write: 406 naming what it writes.
    let r = get("application/vnd.kubernetes.protobuf").await.unwrap();
    assert_eq!(r.status(), 406);
    let status: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status["reason"], "NotAcceptable");
    assert!(status["message"].as_str().unwrap().contains("application/json"), "{status}");
    // client-go's list: protobuf first, JSON second.
    let r = get("application/vnd.kubernetes.protobuf, application/json").await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["content-type"].to_str().unwrap().to_owned()), (200, "application/json".to_owned()));
    // YAML when asked.
    let r = get("application/yaml").await.unwrap();
    assert_eq!(r.headers()["content-type"], "application/yaml");
    let doc: serde_json::Value = serde_yaml::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(doc["metadata"]["name"], "default");

    // A CBOR body: 415 with the accepted types (client-go then falls back to JSON).
    let (code, status) = s.raw("POST", "/api/v1/namespaces/default/configmaps", "application/cbor", vec![0xa0]).await;
    assert_eq!(code, 415, "{status}");
    assert!(status["message"].as_str().unwrap().contains("application/json"), "{status}");
    // A protobuf Pod with a field this server does not decode: refused whole, never stored
    // with the field dropped.
    let meta = [&[0x0a, 3][..], b"pbx"].concat();
    let container = [&[0x0a, 1][..], b"c", &[0x12, 1], b"i", &[0x52, 2, 0x0a, 0]].concat(); // field 10: livenessProbe
    let spec = [&[0x12, u8::try_from(container.len()).unwrap()][..], &container].concat();
    let pod = [&[0x0a, u8::try_from(meta.len()).unwrap()][..], &meta, &[0x12, u8::try_from(spec.len()).unwrap()], &spec].concat();
    let type_meta = [&[0x0a, 2][..], b"v1", &[0x12, 3], b"Pod"].concat();
    let body =
        [b"k8s\0".as_slice(), &[0x0a, u8::try_from(type_meta.len()).unwrap()], &type_meta, &[0x12, u8::try_from(pod.len()).unwrap()], &pod]
            .concat();
    let (code, status) = s.raw("POST", "/api/v1/namespaces/default/pods", "application/vnd.kubernetes.protobuf", body).await;
    assert_eq!(code, 400, "{status}");
    let msg = status["message"].as_str().unwrap();
    assert!(msg.contains("field 10 of Container") && msg.contains("JSON"), "{msg}");
    let (code, _) = s.raw("GET", "/api/v1/namespaces/default/pods/pbx", "", Vec::new()).await;
    assert_eq!(code, 404, "nothing was stored");
}

#[tokio::test]
async fn leases_are_compare_and_swap_and_namespaces_get_a_default_service_account() {
    let s = TestServer::start().await;
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "default");
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ctl"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "2026-12-01T10:00:00.000000Z"}
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut mine = created.clone();
    mine.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases.replace("ctl", &PostParams::default(), &mine).await.unwrap();
    // A second writer with the old resourceVersion loses: two leaders are never both told yes.
    let mut theirs = created;
    theirs.spec.as_mut().unwrap().holder_identity = Some("c".into());
    let err = leases.replace("ctl", &PostParams::default(), &theirs).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref e) if e.code == 409), "{err:?}");
    assert_eq!(leases.get("ctl").await.unwrap().spec.unwrap().holder_identity.as_deref(), Some("b"));
    let bad: Lease = serde_json::from_value(serde_json::json!({"metadata": {"name": "bad"}, "spec": {"leaseDurationSeconds": 0}})).unwrap();
    let err = leases.create(&PostParams::default(), &bad).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref e) if e.code == 422 && e.message.contains("spec.leaseDurationSeconds")), "{err:?}");

    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(s.client.clone());
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "fresh"}})).unwrap();
    namespaces.create(&PostParams::default(), &ns).await.unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(s.client.clone(), "fresh");
    assert_eq!(sas.get("default").await.unwrap().metadata.name.as_deref(), Some("default"));
    let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), "fresh");
    let cm: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "c"}, "data": {"k": "v"}, "binaryData": {"k": "AA=="}})).unwrap();
    let err = cms.create(&PostParams::default(), &cm).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref e) if e.code == 422 && e.message.contains("binaryData[k]")), "{err:?}");
}

/// Every kubectl on the machine, 1.27 to 1.33: namespaces, ConfigMaps and Secrets created, read,
/// patched and deleted (1.32 and later send the creates as protobuf).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kubectl_version_manages_namespaces_configmaps_and_secrets() {
    let s = TestServer::start().await;
    let editor = s.dir.path().join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\ntrue\n").unwrap();
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let kubeconfig = s.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        let versions: Vec<PathBuf> =
            common::kubectl::every_version_and_path().into_iter().filter(|p| p.to_string_lossy().contains("kubectl.1.")).collect();
        assert!(versions.len() >= 2, "kubectl 1.27 and 1.33 are on the machine: {versions:?}");
        for bin in versions {
            let k = Kubectl { bin: &bin, kubeconfig: &kubeconfig, editor: &editor };
            let v = k.name();
            let ns = format!("v-{}", v.replace(['.', '_'], "-"));
            k.ok(&["create", "namespace", &ns]);
            let n = ["-n", ns.as_str()];
            k.ok(&[&["create", "configmap", "c", "--from-literal=a=1"][..], &n].concat());
            k.ok(&[&["create", "secret", "generic", "s", "--from-literal=a=1"][..], &n].concat());
            k.ok(&[&["patch", "configmap", "c", "-p", "{\"data\":{\"b\":\"2\"}}"][..], &n].concat());
            k.ok(&[&["patch", "secret", "s", "--type=merge", "-p", "{\"stringData\":{\"b\":\"2\"}}"][..], &n].concat());
            k.ok(&["label", "namespace", &ns, "patched=yes"]);
            assert_eq!(k.ok(&[&["get", "configmap", "c", "-o", "jsonpath={.data.b}"][..], &n].concat()), "2", "{v}");
            assert_eq!(k.ok(&[&["get", "secret", "s", "-o", "jsonpath={.data.b}"][..], &n].concat()), "Mg==", "{v}");
            assert_eq!(k.ok(&["get", "namespace", &ns, "-o", "jsonpath={.metadata.labels.patched}"]), "yes", "{v}");
            k.ok(&[&["delete", "configmap", "c"][..], &n].concat());
            k.ok(&[&["delete", "secret", "s"][..], &n].concat());
            k.ok(&["delete", "namespace", &ns]);
            assert!(k.fails(&[&["get", "configmap", "c"][..], &n].concat()).contains("NotFound"), "{v}");
        }
    })
    .await
    .unwrap();
}
