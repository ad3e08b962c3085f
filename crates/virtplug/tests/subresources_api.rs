//! `virtplug subresources-api` (KubeVirt's virt-api for cluster mode) as an aggregated API
//! server: console, VNC and the VM/VMI subresources through it, authenticated as kube-apiserver's
//! front proxy authenticates, authorized by SubjectAccessReviews against RBAC.
//!
//! STAND-INS (no real cluster here): `virtplug apiserver` plays kube-apiserver (it stores the
//! RBAC objects, answers the component's TokenReviews and SubjectAccessReviews from them, and
//! holds kube-system/extension-apiserver-authentication, written by the test as kube-apiserver
//! would from its `--requestheader-*` flags); the test plays kube-aggregator's proxy: it has its
//! own front-proxy CA and presents that CA's client certificate (CN `front-proxy-client`) with
//! `X-Remote-User`/`X-Remote-Group` headers, as kube-aggregator does for each user it proxies;
//! the node agent's DaemonSet pod is a Pod object on its node, and its projected token one that
//! `kubectl create token --bound-object-kind Pod` mints from `virtplug apiserver`, handed to the
//! agent with `--tunnel-token-file` (in a cluster, the in-cluster config reads the kubelet's).
//! Real: the component, `virtplug controller` and `virtplug node` as their own processes on
//! loopback (the agent's console tunnel opened to the component with `--tunnel-server`), QEMU
//! under TCG with the test guest, the RBAC role users get from deploy/50-subresources-api.yaml.
//!
//! Every process is killed by PID when the test ends, pass or fail, and QEMU too (`Up`).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use http_body_util::BodyExt;
use kube::api::{Api, PostParams};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use api::VirtualMachine;
use common::procs::{line_reader, wait_line, KillOnDrop};
use common::up::{Up, BOOT, SEE};

/// Deadline of each API-level step.
const STEP: Duration = Duration::from_secs(60);

/// The front proxy's certificates, as kube-apiserver's `--requestheader-client-ca-file` and
/// `--proxy-client-cert-file` would be (written to `dir`).
struct FrontProxy {
    ca_pem: String,
    /// (certificate, key) files of the client certificate named `front-proxy-client`.
    proxy: (PathBuf, PathBuf),
    /// A certificate of the same CA under another name, which is not allowed to proxy.
    intruder: (PathBuf, PathBuf),
}

fn front_proxy(dir: &Path) -> FrontProxy {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "front-proxy-ca");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let client = |cn: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &issuer).unwrap();
        let (c, k) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    };
    FrontProxy { ca_pem, proxy: client("front-proxy-client"), intruder: client("intruder") }
}

/// A client of the component at `url` (trusting `server_ca`), with `cert` as its client
/// certificate if given, sending `headers` on every request: kube-aggregator's proxy when `cert`
/// is the front proxy's.
async fn client_of(
    dir: &Path,
    name: &str,
    url: &str,
    server_ca: &Path,
    cert: Option<&(PathBuf, PathBuf)>,
    headers: &[(&str, &str)],
) -> kube::Client {
    let user = match cert {
        Some((c, k)) => json!({"client-certificate": c, "client-key": k}),
        None => json!({}),
    };
    let kc = json!({"apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": url, "certificate-authority": server_ca}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"});
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, kc.to_string()).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.unwrap();
    for (k, v) in headers {
        config.headers.push((http::HeaderName::from_bytes(k.as_bytes()).unwrap(), http::HeaderValue::from_str(v).unwrap()));
    }
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// `METHOD path` with a JSON body: the status code and the body (a `Status` on errors).
async fn call(client: &kube::Client, method: &str, path: &str, body: Value) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(body.to_string().into_bytes()))
        .unwrap();
    let res = client.send(req).await.unwrap();
    let code = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The object of `kind` named `name` in deploy/`file`.
fn manifest_object(file: &str, kind: &str, name: &str) -> Value {
    let path = format!("{}/../../deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let found = serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name);
    found.unwrap_or_else(|| panic!("{path} has no {kind} {name}"))
}

/// The ClusterRole users get the subresources through (deploy/50-subresources-api.yaml).
fn edit_role() -> Value {
    manifest_object("50-subresources-api.yaml", "ClusterRole", "virtplug-subresources-edit")
}

/// Starts `virtplug ARGS`, stderr to `DIR/NAME.log`; with `url_line`, waits (60 s) for the
/// stdout line containing it and returns it.
fn spawn(dir: &Path, name: &str, args: &[&str], url_line: Option<&str>) -> (KillOnDrop, String) {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_virtplug")).args(args).stdout(Stdio::piped()).stderr(log).spawn().unwrap();
    let out = line_reader(child.stdout.take().unwrap());
    let child = KillOnDrop(child);
    let line = url_line.map(|want| wait_line(&out, Duration::from_secs(60), &format!("{name}'s {want:?}"), |l| l.contains(want)));
    // Keep draining stdout so the process never blocks on a full pipe.
    std::thread::spawn(move || for _ in out {});
    (child, line.unwrap_or_default())
}

/// On failure, the components' logs say why.
struct Logs(PathBuf);

impl Drop for Logs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for name in ["subresources-api", "controller", "node"] {
                let text = std::fs::read_to_string(self.0.join(format!("{name}.log"))).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                eprintln!("--- {name}.log (last 30 lines)\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            }
        }
    }
}

/// The stand-in kube-apiserver with the front proxy's settings and RBAC (alice may use the
/// subresources in `default`, bob may not), and the component running against it.
struct Stack {
    up: Up,
    aux: PathBuf,
    admin: kube::Client,
    fp: FrontProxy,
    url: String,
    server_ca: PathBuf,
    _virtapi: KillOnDrop,
    _logs: Logs,
}

impl Stack {
    async fn start() -> Stack {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // STAND-IN for kube-apiserver.
        let mut up = Up { dir: tempfile::tempdir().unwrap(), child: None };
        up.spawn_with(&["apiserver"]);
        let d = up.dir.path().to_owned();
        let aux = d.join("aux");
        std::fs::create_dir(&aux).unwrap();
        let kubeconfig = up.kubeconfig();
        let kc = kubeconfig.to_str().unwrap();
        let admin = client::connect(Some(&kubeconfig)).await.unwrap();

        // What kube-apiserver publishes for aggregated API servers, and the RBAC: alice may use the
        // subresources in `default` (the role users get from deploy/), bob may not.
        let fp = front_proxy(&aux);
        let cm = json!({"metadata": {"name": "extension-apiserver-authentication"}, "data": {
            "requestheader-client-ca-file": fp.ca_pem,
            "requestheader-allowed-names": "[\"front-proxy-client\"]",
            "requestheader-username-headers": "[\"X-Remote-User\"]",
            "requestheader-group-headers": "[\"X-Remote-Group\"]",
            "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]"}});
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
        cms.create(&PostParams::default(), &serde_json::from_value(cm).unwrap()).await.unwrap();
        let rbac = |plural: &str| kube::api::ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: String::new(),
            plural: plural.into(),
        };
        let roles: Api<kube::api::DynamicObject> = Api::all_with(admin.clone(), &rbac("clusterroles"));
        roles.create(&PostParams::default(), &serde_json::from_value(edit_role()).unwrap()).await.unwrap();
        let bindings: Api<kube::api::DynamicObject> = Api::namespaced_with(admin.clone(), "default", &rbac("rolebindings"));
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "alice-vms"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "virtplug-subresources-edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]});
        bindings.create(&PostParams::default(), &serde_json::from_value(binding).unwrap()).await.unwrap();
        // STAND-IN of kube-apiserver's bootstrap role: discovery for every authenticated user.
        let discovery = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:discovery"},
            "rules": [{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/version"], "verbs": ["get"]}]});
        roles.create(&PostParams::default(), &serde_json::from_value(discovery).unwrap()).await.unwrap();
        let everyone = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:discovery"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:discovery"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]});
        let cluster_bindings: Api<kube::api::DynamicObject> = Api::all_with(admin.clone(), &rbac("clusterrolebindings"));
        cluster_bindings.create(&PostParams::default(), &serde_json::from_value(everyone).unwrap()).await.unwrap();

        // The component; its own identity is the kubeconfig's.
        let certs = aux.join("virtapi");
        let (_virtapi, line) = spawn(
            &aux,
            "subresources-api",
            &["subresources-api", "--kubeconfig", kc, "--listen", "127.0.0.1:0", "--cert-dir", certs.to_str().unwrap()],
            Some("is serving subresources.kubevirt.io at https://"),
        );
        assert!(line.contains("(front proxy: trusted)"), "{line}");
        let url = line.split_whitespace().find(|w| w.starts_with("https://")).unwrap().to_owned();
        let server_ca = certs.join("ca.crt");
        Stack { up, aux: aux.clone(), admin, fp, url, server_ca, _virtapi, _logs: Logs(aux) }
    }

    /// A client of the component as kube-aggregator's proxy sends `user`'s requests.
    async fn proxied(&self, user: &'static str) -> kube::Client {
        client_of(&self.aux, user, &self.url, &self.server_ca, Some(&self.fp.proxy), &as_user(user)).await
    }

    /// A client of the component presenting the bearer token `token`.
    async fn bearer(&self, name: &str, token: &str) -> kube::Client {
        let auth = format!("Bearer {token}");
        client_of(&self.aux, name, &self.url, &self.server_ca, None, &[("Authorization", auth.as_str())]).await
    }

    /// The node agents' identity as deploy/ makes it: namespace `virtplug`, ServiceAccount
    /// `virtplug-node`, and its ClusterRole and ClusterRoleBinding from deploy/20-rbac.yaml (which
    /// grant `nodes/tunnel` and `nodes/streams` of every node).
    async fn agent_identity(&self) {
        let dynamic = |group: &str, plural: &str| kube::api::ApiResource {
            group: group.into(),
            version: "v1".into(),
            api_version: if group.is_empty() { "v1".into() } else { format!("{group}/v1") },
            kind: String::new(),
            plural: plural.into(),
        };
        let create = |api: Api<kube::api::DynamicObject>, obj: Value| async move {
            api.create(&PostParams::default(), &serde_json::from_value(obj).unwrap()).await.unwrap();
        };
        create(Api::all_with(self.admin.clone(), &dynamic("", "namespaces")), json!({"metadata": {"name": "virtplug"}})).await;
        let account = manifest_object("20-rbac.yaml", "ServiceAccount", "virtplug-node");
        create(Api::namespaced_with(self.admin.clone(), "virtplug", &dynamic("", "serviceaccounts")), account).await;
        let rbac = "rbac.authorization.k8s.io";
        create(
            Api::all_with(self.admin.clone(), &dynamic(rbac, "clusterroles")),
            manifest_object("20-rbac.yaml", "ClusterRole", "virtplug-node"),
        )
        .await;
        let binding = manifest_object("20-rbac.yaml", "ClusterRoleBinding", "virtplug-node");
        create(Api::all_with(self.admin.clone(), &dynamic(rbac, "clusterrolebindings")), binding).await;
    }

    /// STAND-IN for the DaemonSet pod of `node` and the kubelet's projected token: a Pod
    /// `virtplug-node-NODE` running as `virtplug-node` on `node`, and a token bound to it, asked
    /// by real `kubectl create token` (a protobuf `TokenRequest` to `serviceaccounts/token`).
    async fn agent_pod_token(&self, node: &str) -> String {
        let name = format!("virtplug-node-{node}");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"serviceAccountName": "virtplug-node", "nodeName": node, "containers": [{"name": "node", "image": "virtplug:latest"}]}});
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(self.admin.clone(), "virtplug");
        pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
        let args = ["create", "token", "virtplug-node", "-n", "virtplug", "--bound-object-kind", "Pod", "--bound-object-name", &name];
        self.up.kubectl(&args).trim().to_owned()
    }

    /// A `virtplug-node` token with `spec`.
    async fn mint(&self, spec: Value) -> String {
        let path = "/api/v1/namespaces/virtplug/serviceaccounts/virtplug-node/token";
        let (code, answer) =
            call(&self.admin, "POST", path, json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})).await;
        assert_eq!(code, 201, "{answer}");
        answer["status"]["token"].as_str().unwrap().to_owned()
    }
}

fn as_user(user: &'static str) -> [(&'static str, &'static str); 2] {
    [("X-Remote-User", user), ("X-Remote-Group", "system:authenticated")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consoles_and_subresources_through_the_aggregated_api_with_front_proxy_authentication_and_rbac() {
    let st = Stack::start().await;
    let (up, aux, admin, fp, url, server_ca) = (&st.up, &st.aux, &st.admin, &st.fp, &st.url, &st.server_ca);
    let d = up.dir.path().to_owned();
    let kc = up.kubeconfig();
    let kc = kc.to_str().unwrap();
    // The node agent's tunnel credential: a token bound to its pod on n1 (in a cluster, the
    // DaemonSet pod's projected token), written where --tunnel-token-file reads it.
    st.agent_identity().await;
    let token_file = aux.join("node-n1.token");
    std::fs::write(&token_file, st.agent_pod_token("n1").await).unwrap();
    // The controller, and a node agent whose console tunnel goes to the component.
    let (_controller, _) = spawn(aux, "controller", &["controller", "--kubeconfig", kc, "--health-listen", "127.0.0.1:0"], None);
    let (_node, _) = spawn(
        aux,
        "node",
        &[
            "node",
            "--kubeconfig",
            kc,
            "--node-name",
            "n1",
            "--register-node",
            "--data-dir",
            d.to_str().unwrap(),
            "--accel",
            "tcg",
            "--health-listen",
            "127.0.0.1:0",
            "--tunnel-server",
            url,
            "--tunnel-ca",
            server_ca.to_str().unwrap(),
            "--tunnel-token-file",
            token_file.to_str().unwrap(),
        ],
        None,
    );
    let (alice, bob) = (st.proxied("alice").await, st.proxied("bob").await);

    up.vm("con1");
    let uid = common::wait_until(BOOT, "VMI con1 running", || {
        let (ok, out) = up.run("kubectl", &["get", "vmi", "con1", "-o", "jsonpath={.status.phase} {.metadata.uid}"]);
        let r = (ok && out.starts_with("Running ")).then(|| out.split_whitespace().nth(1).unwrap_or_default().to_owned());
        async move { r }
    })
    .await;
    up.see(&uid, "the guest ready", |l| l.starts_with("VP-READY")).await;

    // alice's console through the component: a line typed reaches the guest, its answer comes back.
    common::guest::console_echo(&alice, "con1", "hello through virt-api", SEE).await;
    up.see(&uid, "alice's line in QEMU's serial log", |l| l == "VP-ECHO hello through virt-api").await;
    // VNC: the RFB handshake's first bytes.
    let vnc = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/con1/vnc";
    let mut ws = client::upgrade::websocket(&alice, vnc, api::tunnel::PLAIN_SUBPROTOCOL).await.unwrap();
    let mut rfb = Vec::new();
    tokio::time::timeout(STEP, async {
        while rfb.len() < 12 {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => rfb.extend_from_slice(&b),
                Some(Ok(_)) => {}
                other => panic!("VNC ended before the RFB version: {other:?}"),
            }
        }
    })
    .await
    .expect("the RFB version within the deadline");
    assert_eq!(&rfb[..12], b"RFB 003.008\n");
    drop(ws);

    // bob has no grant: 403 in kube-apiserver's words, for the console and for a stop.
    let console = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/con1/console";
    let (code, status) = call(&bob, "GET", console, Value::Null).await;
    assert_eq!(code, 403, "{status}");
    assert_eq!(
        status["message"],
        "virtualmachineinstances.subresources.kubevirt.io \"con1\" is forbidden: User \"bob\" cannot get resource \"virtualmachineinstances/console\" in API group \"subresources.kubevirt.io\" in the namespace \"default\""
    );
    assert_eq!((status["reason"].as_str(), status["details"]["kind"].as_str()), (Some("Forbidden"), Some("virtualmachineinstances")));
    let vm_path = |sub: &str| format!("/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/con1/{sub}");
    let (code, _) = call(&bob, "PUT", &vm_path("stop"), json!({})).await;
    assert_eq!(code, 403);
    // The X-Remote-User headers without the front proxy's certificate, or with a certificate of
    // its CA under a name not allowed to proxy: nobody (401), whatever the headers say.
    for (name, cert) in [("spoof", None), ("intruder", Some(&fp.intruder))] {
        let c = client_of(aux, name, url, server_ca, cert, &as_user("alice")).await;
        let (code, status) = call(&c, "GET", console, Value::Null).await;
        assert_eq!((code, status["reason"].as_str()), (401, Some("Unauthorized")), "{name}: {status}");
    }

    // The edits, with the embedded server's codes and words: start on a running VM is the same
    // 409 from both.
    let (code, refused) = call(&alice, "PUT", &vm_path("start"), json!({})).await;
    let (embedded_code, embedded) = call(admin, "PUT", &vm_path("start"), json!({})).await;
    assert_eq!((code, &refused["message"]), (409, &json!("VM is already running")));
    assert_eq!((embedded_code, &embedded["message"]), (code, &refused["message"]));
    // pause: the node agent stops the guest's CPUs and says so in the VMI's Paused condition.
    let vmi_path = |sub: &str| format!("/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/con1/{sub}");
    let paused = |want: bool| {
        let up = &up;
        async move {
            common::wait_until(STEP, &format!("VMI con1 Paused condition {want}"), || {
                let v = up.json(&["get", "vmi", "con1"]);
                let has =
                    v["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Paused" && c["status"] == "True");
                async move { (has == want).then_some(()) }
            })
            .await;
        }
    };
    assert_eq!(call(&alice, "PUT", &vmi_path("pause"), json!({})).await.0, 202);
    paused(true).await;
    let (code, again) = call(&alice, "PUT", &vmi_path("pause"), json!({})).await;
    assert_eq!((code, again["message"].as_str()), (409, Some("VMI is already paused")));
    assert_eq!(call(&alice, "PUT", &vmi_path("unpause"), json!({})).await.0, 202);
    paused(false).await;
    // addvolume and removevolume edit the VM's template; a bad body is the embedded server's 400.
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), "default");
    let volumes = || async {
        let vm = vms.get("con1").await.unwrap();
        vm.spec.template.spec.unwrap().volumes.into_iter().map(|v| serde_json::to_value(v).unwrap()).collect::<Vec<_>>()
    };
    let add =
        json!({"name": "extra", "disk": {"disk": {"bus": "scsi"}}, "volumeSource": {"persistentVolumeClaim": {"claimName": "extra"}}});
    assert_eq!(call(&alice, "PUT", &vm_path("addvolume"), add).await.0, 202);
    let added = volumes().await;
    assert!(added.iter().any(|v| v["name"] == "extra" && v["persistentVolumeClaim"]["hotpluggable"] == true), "{added:?}");
    let (code, bad) = call(&alice, "PUT", &vm_path("addvolume"), json!({"name": "x"})).await;
    let (embedded_code, embedded_bad) = call(admin, "PUT", &vm_path("addvolume"), json!({"name": "x"})).await;
    assert_eq!((code, &bad["message"]), (embedded_code, &embedded_bad["message"]), "{bad}");
    assert_eq!(code, 400);
    assert_eq!(call(&alice, "PUT", &vm_path("removevolume"), json!({"name": "extra"})).await.0, 202);
    assert!(!volumes().await.iter().any(|v| v["name"] == "extra"));
    // stop: the VM halts and its VMI goes.
    assert_eq!(call(&alice, "PUT", &vm_path("stop"), json!({})).await.0, 202);
    assert_eq!(vms.get("con1").await.unwrap().spec.run_strategy.map(|s| serde_json::to_value(s).unwrap()), Some(json!("Halted")));
    common::wait_until(STEP, "VMI con1 gone after alice's stop", || {
        let (ok, out) = up.run("kubectl", &["get", "vmi", "con1", "--ignore-not-found", "-o", "name"]);
        async move { (ok && out.trim().is_empty()).then_some(()) }
    })
    .await;
}

/// Without a guest: what the component answers besides the subresources' effects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_edits_are_all_kept_and_discovery_health_and_tokens_answer_as_kube_apiserver() {
    let st = Stack::start().await;
    let alice = st.proxied("alice").await;
    // Health needs no credentials.
    let anonymous = client_of(&st.aux, "anonymous", &st.url, &st.server_ca, None, &[]).await;
    let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
    assert_eq!(anonymous.request_text(req).await.unwrap(), "ok");
    // Discovery is the embedded server's, authorized as a non-resource path (`system:discovery`
    // grants it to every authenticated user; one the proxy names without that group gets none).
    let (code, served) = call(&alice, "GET", "/apis/subresources.kubevirt.io/v1", Value::Null).await;
    let (_, embedded) = call(&st.admin, "GET", "/apis/subresources.kubevirt.io/v1", Value::Null).await;
    assert_eq!((code, &served), (200, &embedded));
    let groupless = client_of(&st.aux, "groupless", &st.url, &st.server_ca, Some(&st.fp.proxy), &[("X-Remote-User", "carol")]).await;
    let (code, status) = call(&groupless, "GET", "/apis/subresources.kubevirt.io/v1", Value::Null).await;
    assert_eq!(
        (code, status["message"].as_str()),
        (403, Some("forbidden: User \"carol\" cannot get path \"/apis/subresources.kubevirt.io/v1\""))
    );
    // A bearer token is reviewed by the API server (TokenReview): the kubeconfig's is its
    // administrator, another is nobody.
    let kc: Value = serde_yaml::from_str(&std::fs::read_to_string(st.up.kubeconfig()).unwrap()).unwrap();
    let token = kc["users"][0]["user"]["token"].as_str().unwrap().to_owned();
    for (name, token, want) in [("admin-token", token.clone(), 200), ("wrong-token", format!("{}x", &token[..token.len() - 1]), 401)] {
        let auth = format!("Bearer {token}");
        let c = client_of(&st.aux, name, &st.url, &st.server_ca, None, &[("Authorization", auth.as_str())]).await;
        assert_eq!(call(&c, "GET", "/apis/subresources.kubevirt.io/v1", Value::Null).await.0, want, "{name}");
    }

    // A client certificate of another CA, even named as the front proxy, fails the handshake.
    let other = st.aux.join("other-ca");
    std::fs::create_dir(&other).unwrap();
    let forged = front_proxy(&other);
    let c = client_of(&other, "forged", &st.url, &st.server_ca, Some(&forged.proxy), &as_user("alice")).await;
    let req = http::Request::get("/apis/subresources.kubevirt.io/v1").body(kube::client::Body::empty()).unwrap();
    let refused = c.send(req).await;
    assert!(refused.is_err(), "a certificate of another CA must not get an answer: {refused:?}");

    // Eight addvolume requests at once on one VM: each edit is a write conditional on the
    // resourceVersion it read, redone on conflict, so every volume is there at the end.
    let vms: Api<VirtualMachine> = Api::namespaced(st.admin.clone(), "default");
    vms.create(&PostParams::default(), &serde_json::from_value(common::vm("many")).unwrap()).await.unwrap();
    let path = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/many/addvolume";
    let adds = (0..8).map(|i| {
        let alice = alice.clone();
        let body = json!({"name": format!("v{i}"), "disk": {"disk": {"bus": "scsi"}}, "volumeSource": {"persistentVolumeClaim": {"claimName": format!("c{i}")}}});
        async move { call(&alice, "PUT", path, body).await }
    });
    for (code, status) in futures::future::join_all(adds).await {
        assert_eq!(code, 202, "{status}");
    }
    let vm = vms.get("many").await.unwrap();
    let names: std::collections::BTreeSet<String> = vm.spec.template.spec.unwrap().volumes.into_iter().map(|v| v.name).collect();
    for i in 0..8 {
        assert!(names.contains(&format!("v{i}")), "volume v{i} lost: {names:?}");
    }
}

/// `GET` of `path` as an upgrade to `protocol` (a node tunnel or stream): the status code and
/// the `Status` body of a refusal.
async fn upgrade(client: &kube::Client, path: &str, protocol: &str) -> (u16, Value) {
    let req = http::Request::get(path)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, protocol)
        .body(kube::client::Body::empty())
        .unwrap();
    let res = tokio::time::timeout(STEP, client.send(req)).await.expect("an answer to the upgrade within the deadline").unwrap();
    let code = res.status().as_u16();
    if code == 101 {
        return (code, Value::Null);
    }
    let bytes =
        tokio::time::timeout(STEP, res.into_body().collect()).await.expect("the refusal's body within the deadline").unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Issue 20: node agents share one ServiceAccount, whose role grants the tunnel of every node, so
/// RBAC alone let an agent on n2 take n1's tunnel and receive n1's consoles. The component now
/// also asks for a credential bound to the node (`authentication.kubernetes.io/node-name`), by
/// bearer token (TokenReview) and through the front proxy (`X-Remote-Extra-*`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_tunnel_is_accepted_only_from_a_credential_bound_to_that_node() {
    use api::tunnel::{STREAM_UPGRADE, TUNNEL_UPGRADE};
    let st = Stack::start().await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(st.admin.clone());
    for n in ["n1", "n2"] {
        nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap()).await.unwrap();
    }
    st.agent_identity().await;
    let (on_n1, on_n2) = (st.agent_pod_token("n1").await, st.agent_pod_token("n2").await);
    let node_bound = st.mint(json!({"boundObjectRef": {"kind": "Node", "apiVersion": "v1", "name": "n1"}})).await;
    let unbound = st.mint(json!({})).await;
    let kc: Value = serde_yaml::from_str(&std::fs::read_to_string(st.up.kubeconfig()).unwrap()).unwrap();
    let admin_token = kc["users"][0]["user"]["token"].as_str().unwrap().to_owned();
    let tunnel = "/apis/subresources.virtplug.io/v1/nodes/n1/tunnel";
    let stream = "/apis/subresources.virtplug.io/v1/nodes/n1/streams/0123456789abcdef0123456789abcdef";
    let fix = "a node's tunnel is accepted only from a token bound to that node: the node agent must present a token bound to a pod on node \"n1\" (the DaemonSet pod's projected ServiceAccount token, which names its node on Kubernetes 1.30 and later)";
    let refusal = |user: &str, sub: &str, why: &str| {
        format!("nodes.subresources.virtplug.io \"n1\" is forbidden: User \"{user}\" cannot get resource \"nodes/{sub}\" in API group \"subresources.virtplug.io\" at the cluster scope: {why}; {fix}")
    };
    let agent = "system:serviceaccount:virtplug:virtplug-node";

    // The token of the agent's pod on n1, and one bound to Node n1 itself, open n1's tunnel.
    for (name, token) in [("pod-n1", &on_n1), ("node-n1", &node_bound)] {
        let (code, status) = upgrade(&st.bearer(name, token).await, tunnel, TUNNEL_UPGRADE).await;
        assert_eq!(code, 101, "{name}: {status}");
    }
    // The same role, but the token of the pod on n2, of no pod, or the administrator's: 403,
    // saying what the agent must present.
    for (name, token, user, why) in [
        ("pod-n2", &on_n2, agent, "the credential is bound to node \"n2\", not \"n1\""),
        ("unbound", &unbound, agent, "the credential is bound to no node (it has no authentication.kubernetes.io/node-name extra)"),
        (
            "admin",
            &admin_token,
            "virtplug-admin",
            "the credential is bound to no node (it has no authentication.kubernetes.io/node-name extra)",
        ),
    ] {
        let c = st.bearer(name, token).await;
        let (code, status) = upgrade(&c, tunnel, TUNNEL_UPGRADE).await;
        assert_eq!((code, status["reason"].as_str()), (403, Some("Forbidden")), "{name}: {status}");
        assert_eq!(status["message"].as_str(), Some(refusal(user, "tunnel", why).as_str()), "{name}");
        // Streams too: a stream id read elsewhere does not let another node's agent attach it.
        let (code, status) = upgrade(&c, stream, STREAM_UPGRADE).await;
        assert_eq!(code, 403, "{name}'s stream: {status}");
        assert_eq!(status["message"].as_str(), Some(refusal(user, "streams", why).as_str()), "{name}'s stream");
    }
    // n1's own token passes the check for a stream (and then finds no stream waiting).
    let (code, status) = upgrade(&st.bearer("pod-n1", &on_n1).await, stream, STREAM_UPGRADE).await;
    assert_eq!(code, 404, "{status}");

    // Through the front proxy, as kube-aggregator forwards the agent's token's extras.
    let proxied = |node: &'static str| {
        let st = &st;
        async move {
            let headers = [
                ("X-Remote-User", agent),
                ("X-Remote-Group", "system:serviceaccounts"),
                ("X-Remote-Group", "system:serviceaccounts:virtplug"),
                ("X-Remote-Group", "system:authenticated"),
                ("X-Remote-Extra-Authentication.kubernetes.io%2Fnode-name", node),
            ];
            client_of(&st.aux, &format!("proxied-{node}"), &st.url, &st.server_ca, Some(&st.fp.proxy), &headers).await
        }
    };
    let (code, status) = upgrade(&proxied("n1").await, tunnel, TUNNEL_UPGRADE).await;
    assert_eq!(code, 101, "the front proxy naming n1: {status}");
    let (code, status) = upgrade(&proxied("n2").await, tunnel, TUNNEL_UPGRADE).await;
    assert_eq!(code, 403, "the front proxy naming n2: {status}");
    assert_eq!(status["message"].as_str(), Some(refusal(agent, "tunnel", "the credential is bound to node \"n2\", not \"n1\"").as_str()));

    // The pod's token goes with its pod: once deleted, nobody (401).
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(st.admin.clone(), "virtplug");
    // No kubelet here to stop it and remove it after its grace: removed at once, as its kubelet would.
    pods.delete("virtplug-node-n1", &kube::api::DeleteParams::default().grace_period(0)).await.unwrap();
    common::wait_until(STEP, "the deleted pod's token refused (401)", || {
        let st = &st;
        let on_n1 = on_n1.clone();
        async move {
            let (code, _) = upgrade(&st.bearer("pod-n1-deleted", &on_n1).await, tunnel, TUNNEL_UPGRADE).await;
            (code == 401).then_some(())
        }
    })
    .await;
}
