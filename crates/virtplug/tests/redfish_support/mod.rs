//! What the Redfish tests share: `virtplug up` as its own process (API server, controller, node
//! agent and Redfish service), an HTTPS client that trusts its CA, raw Redfish requests, and
//! the `virtplug` CLI. Every listener is on a loopback ephemeral port.
//!
//! Dropping an [`RfUp`] kills, by PID, the `up` it started and the QEMUs under its data dir.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};

/// Credentials of a request.
#[derive(Clone, Debug)]
pub enum Auth {
    None,
    Basic(String, String),
    Token(String),
}

impl Auth {
    pub fn basic(user: &str, pass: &str) -> Auth {
        Auth::Basic(user.to_owned(), pass.to_owned())
    }
}

/// A response: status, headers, JSON body (`Null` when empty or not JSON).
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Resp {
    /// The `@odata.id`s of a collection's `Members`.
    pub fn members(&self) -> Vec<String> {
        self.body["Members"]
            .as_array()
            .map_or_else(Vec::new, |m| m.iter().filter_map(|m| m["@odata.id"].as_str().map(str::to_owned)).collect())
    }

    /// The first MessageId of a Redfish error body, without the registry prefix.
    pub fn message_id(&self) -> String {
        let id = self.body["error"]["@Message.ExtendedInfo"][0]["MessageId"].as_str().unwrap_or_default();
        id.rsplit('.').next().unwrap_or_default().to_owned()
    }

    /// The `RelatedProperties` of the first message.
    pub fn related(&self) -> Value {
        self.body["error"]["@Message.ExtendedInfo"][0]["RelatedProperties"].clone()
    }
}

pub struct RfUp {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    /// `https://127.0.0.1:PORT` of the Redfish service.
    pub url: String,
    http: reqwest::Client,
}

impl Drop for RfUp {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in std::fs::read_dir(self.dir.path().join("node/vmis")).into_iter().flatten().flatten() {
            if let Ok(p) = qemu::process::adopt(&d.path()) {
                if let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }
}

/// Spawns `virtplug ARGS`, its stderr appended to `log`, and returns it with the first stdout
/// line matching `marker` (within 90 s); stdout keeps being drained.
pub fn spawn_until(args: &[&str], log: &Path, marker: &'static str) -> (Child, String) {
    let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_virtplug")).args(args).stdout(Stdio::piped()).stderr(log_file).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(l) = lines.by_ref().map_while(Result::ok).find(|l| l.contains(marker)) {
            let _ = tx.send(l);
        }
        for _ in lines {}
    });
    match rx.recv_timeout(Duration::from_secs(90)) {
        Ok(line) => (child, line),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} printed no {marker:?} within 90 s; stderr:\n{}", std::fs::read_to_string(log).unwrap_or_default());
        }
    }
}

/// The `https://...` in `line`, before `/redfish/v1/`.
pub fn url_in(line: &str) -> String {
    let start = line.find("https://").unwrap();
    let rest = &line[start..];
    rest[..rest.find("/redfish/v1/").unwrap_or(rest.len())].trim().to_owned()
}

/// An HTTPS client that trusts only `ca`.
pub fn https_client(ca: &Path) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    reqwest::Client::builder().tls_certs_only([cert]).timeout(Duration::from_secs(60)).build().unwrap()
}

/// Sends one request.
pub async fn send(
    http: &reqwest::Client,
    url: &str,
    method: Method,
    path: &str,
    auth: &Auth,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Resp {
    let mut rb = http.request(method, format!("{url}{path}"));
    rb = match auth {
        Auth::None => rb,
        Auth::Basic(u, p) => rb.basic_auth(u, Some(p)),
        Auth::Token(t) => rb.header("X-Auth-Token", t),
    };
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    if let Some(b) = body {
        rb = rb.header("Content-Type", "application/json").body(b.to_vec());
    }
    let r = rb.send().await.unwrap();
    let (status, headers) = (r.status(), r.headers().clone());
    let bytes = r.bytes().await.unwrap();
    Resp { status, headers, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) }
}

impl RfUp {
    /// `virtplug up` on a new data dir.
    pub fn start() -> RfUp {
        let dir = tempfile::tempdir().unwrap();
        let (child, url) = Self::spawn(dir.path());
        let http = https_client(&dir.path().join("pki/ca.crt"));
        RfUp { dir, child: Some(child), url, http }
    }

    fn spawn(dir: &Path) -> (Child, String) {
        let d = dir.to_str().unwrap();
        let args =
            ["up", "--data-dir", d, "--listen", "127.0.0.1:0", "--redfish-listen", "127.0.0.1:0", "--node-name", "rf", "--accel", "tcg"];
        let (child, line) = spawn_until(&args, &dir.join("stderr.log"), "Redfish (a BMC per VM) at");
        (child, url_in(&line))
    }

    /// SIGINT, and its clean exit (within 60 s).
    pub fn stop(&mut self) {
        let mut c = self.child.take().unwrap();
        let pid = rustix::process::Pid::from_raw(i32::try_from(c.id()).unwrap()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
        let end = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                assert!(status.success(), "up exits cleanly after SIGINT: {status}");
                return;
            }
            assert!(std::time::Instant::now() < end, "up did not exit within 60 s of SIGINT");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `up` again on the same data dir (after [`RfUp::stop`]).
    pub fn restart(&mut self) {
        let (child, url) = Self::spawn(self.dir.path());
        self.child = Some(child);
        self.url = url;
    }

    pub fn password(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redfish/initial-admin-password")).unwrap().trim().to_owned()
    }

    pub fn admin(&self) -> Auth {
        Auth::basic("admin", &self.password())
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub async fn kube(&self) -> kube::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        client::connect(Some(&self.kubeconfig())).await.unwrap()
    }

    pub async fn req(&self, method: Method, path: &str, auth: &Auth, body: Option<&Value>) -> Resp {
        let b = body.map(|b| b.to_string().into_bytes());
        send(&self.http, &self.url, method, path, auth, b.as_deref(), &[]).await
    }

    pub async fn req_raw(&self, method: Method, path: &str, auth: &Auth, body: Option<&[u8]>, headers: &[(&str, &str)]) -> Resp {
        send(&self.http, &self.url, method, path, auth, body, headers).await
    }

    pub async fn get(&self, path: &str, auth: &Auth) -> Resp {
        self.req(Method::GET, path, auth, None).await
    }

    /// Logs in; the token and the session's URI.
    pub async fn login(&self, user: &str, pass: &str) -> (String, String) {
        let r = self
            .req(Method::POST, "/redfish/v1/SessionService/Sessions", &Auth::None, Some(&json!({"UserName": user, "Password": pass})))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
        let token = r.headers["x-auth-token"].to_str().unwrap().to_owned();
        let location = r.headers["location"].to_str().unwrap().to_owned();
        (token, location)
    }

    /// `virtplug ARGS --kubeconfig K` with `stdin`; (success, stdout+stderr).
    pub fn cli(&self, args: &[&str], stdin: &str) -> (bool, String) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_virtplug"))
            .args(args)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        // Deadline: a CLI that hangs is killed (by its PID) and named.
        let end = std::time::Instant::now() + Duration::from_secs(60);
        while c.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > end {
                let _ = c.kill();
                let _ = c.wait();
                panic!("`virtplug {}` did not finish within 60 s", args.join(" "));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = c.wait_with_output().unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }

    /// Adds an account through the CLI.
    pub fn add_account(&self, name: &str, password: &str, extra: &[&str]) {
        let mut args = vec!["redfish", "account", "add", name];
        args.extend_from_slice(extra);
        let (ok, out) = self.cli(&args, password);
        assert!(ok, "{out}");
    }

    /// Creates a Halted VM in `ns` with `labels`; its uid (the System id).
    pub async fn vm(&self, ns: &str, name: &str, labels: Value) -> String {
        let mut v = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"runStrategy": "Halted", "template": {"spec": {
                "domain": {"devices": {"disks": [], "interfaces": [{"name": "default", "macAddress": "52:54:00:00:00:01"}]},
                           "resources": {"requests": {"memory": "128Mi"}}}, "volumes": [],
                "networks": [{"name": "default", "pod": {}}]}}}});
        if labels.is_null() {
            v["metadata"]["labels"] = json!({});
        }
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(self.kube().await);
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        // It may exist already (`default`, or a second VM in it).
        let _ = namespaces.create(&Default::default(), &serde_json::from_value(namespace).unwrap()).await;
        let api: kube::Api<api::VirtualMachine> = kube::Api::namespaced(self.kube().await, ns);
        let vm = api.create(&Default::default(), &serde_json::from_value(v).unwrap()).await.unwrap();
        let uid = vm.metadata.uid.unwrap();
        // The service's cache shows it (its watch is a moment behind the create).
        let admin = self.admin();
        common_wait(&format!("System {uid} in the Redfish cache"), || async {
            (self.get(&format!("/redfish/v1/Systems/{uid}"), &admin).await.status == StatusCode::OK).then_some(())
        })
        .await;
        uid
    }

    /// Creates a running VM booting the test guest; its uid, once the guest printed VP-READY.
    pub async fn running_vm(&self, name: &str) -> String {
        self.running_vm_with_grace(name, 1).await
    }

    /// [`Self::running_vm`] with `terminationGracePeriodSeconds` = `grace`: the test guest
    /// ignores ACPI power-button presses, so a graceful stop takes the whole grace period.
    pub async fn running_vm_with_grace(&self, name: &str, grace: u32) -> String {
        self.create_guest_vm(guest_vm(name, grace)).await
    }

    /// A running VM that says so with the legacy `spec.running: true` instead of a runStrategy.
    pub async fn running_legacy_vm(&self, name: &str) -> String {
        let mut v = guest_vm(name, 1);
        let spec = v["spec"].as_object_mut().unwrap();
        spec.remove("runStrategy");
        spec.insert("running".to_owned(), json!(true));
        self.create_guest_vm(v).await
    }

    async fn create_guest_vm(&self, v: Value) -> String {
        let name = v["metadata"]["name"].as_str().unwrap().to_owned();
        let api: kube::Api<api::VirtualMachine> = kube::Api::namespaced(self.kube().await, "default");
        let vm = api.create(&Default::default(), &serde_json::from_value(v).unwrap()).await.unwrap();
        self.guest_ready(&name, None).await;
        vm.metadata.uid.unwrap()
    }

    /// Waits (240 s) for the VMI of `name` — another than `not` — to run and its guest to print
    /// VP-READY; the VMI's uid.
    pub async fn guest_ready(&self, name: &str, not: Option<&str>) -> String {
        let vmis: kube::Api<api::VirtualMachineInstance> = kube::Api::namespaced(self.kube().await, "default");
        let end = std::time::Instant::now() + Duration::from_secs(240);
        loop {
            if let Some(v) = vmis.get_opt(name).await.unwrap().filter(api::VirtualMachineInstance::is_running) {
                let uid = v.metadata.uid.clone().unwrap();
                if Some(uid.as_str()) != not && self.console(&uid).contains("VP-READY") {
                    return uid;
                }
            }
            assert!(std::time::Instant::now() < end, "the guest of {name} did not print VP-READY within 240 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The serial console log of VMI `uid`.
    pub fn console(&self, uid: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("node/vmis").join(uid).join("serial.log")).unwrap_or_default()
    }

    /// Whether a QEMU of VMI `uid` runs: its pidfile names a live process whose command line
    /// names the VMI's run dir (a reused PID does not count).
    pub fn qemu_running(&self, uid: &str) -> bool {
        let run = self.dir.path().join("node/vmis").join(uid);
        let Ok(pid) = std::fs::read_to_string(run.join("qemu.pid")) else { return false };
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).contains(uid)
    }

    /// Replaces the labels of VM `ns/name` (a merge patch through the API).
    pub async fn set_vm_labels(&self, ns: &str, name: &str, labels: Value) {
        let api: kube::Api<api::VirtualMachine> = kube::Api::namespaced(self.kube().await, ns);
        let patch = kube::api::Patch::Merge(json!({"metadata": {"labels": labels}}));
        api.patch(name, &kube::api::PatchParams::default(), &patch).await.unwrap();
    }

    /// The service's log (`up`'s stderr), without terminal colour codes.
    pub fn log(&self) -> String {
        let raw = std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // CSI: ESC [ parameters final-byte.
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// The `consecutive_failures` of the last logged failed login of `user` (0: none logged).
    pub fn logged_failures(&self, user: &str) -> u32 {
        let who = format!("user=\"{user}\"");
        self.log()
            .lines()
            .rev()
            .find(|l| l.contains("Redfish login failed") && l.contains(&who))
            .and_then(|l| l.split("consecutive_failures=").nth(1))
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// The VM's resourceVersion, read from the API.
    pub async fn vm_version(&self, ns: &str, name: &str) -> String {
        let api: kube::Api<api::VirtualMachine> = kube::Api::namespaced(self.kube().await, ns);
        api.get(name).await.unwrap().metadata.resource_version.unwrap()
    }
}

/// Polls `check` until it answers (20 ms apart, 30 s deadline naming `what`).
pub async fn common_wait<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(std::time::Instant::now() < end, "timed out after 30 s waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A VM (runStrategy Always) booting the test guest by kernel boot.
fn guest_vm(name: &str, grace: u32) -> Value {
    let g = std::env::var_os("VIRTPLUG_GUEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/guest"), PathBuf::from)
        .canonicalize()
        .expect("the test guest: run scripts/build-test-guest.sh");
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": "default"},
            "spec": {"runStrategy": "Always", "template": {"spec": {
                "terminationGracePeriodSeconds": grace,
                "domain": {"resources": {"requests": {"memory": "256Mi"}}, "devices": {"disks": []},
                           "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable",
                               "container": {"kernelPath": g.join("vmlinuz"), "initrdPath": g.join("initramfs.cpio.gz")}}}},
                "volumes": []}}}})
}
