//! `virtplug up` as its own process for the end-to-end tests (API server, controller and node
//! agent in one), driven by real `kubectl` and `virtplug`'s CLI, with real QEMU (TCG) and the
//! test guest; its data dir, its guests' console logs.
//!
//! Dropping an [`Up`] kills, by PID, the `up` it started and the QEMUs under its data dir, and
//! detaches the loop devices under its storage root, pass or fail.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

pub const BOOT: Duration = Duration::from_secs(180);
pub const SEE: Duration = Duration::from_secs(90);

pub struct Up {
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        super::guest::kill_qemus_under(&self.dir.path().join("node/vmis"));
        for (dev, _) in controller::storage::loopdev::under(&self.dir.path().join("storage")) {
            let _ = controller::storage::loopdev::detach(&dev);
        }
    }
}

impl Up {
    pub fn start() -> Up {
        let mut up = Up { dir: tempfile::tempdir().unwrap(), child: None };
        up.spawn();
        up
    }

    /// Starts `virtplug up` on this data dir and waits for its first line (the URL).
    pub fn spawn(&mut self) {
        // The tests' image servers are on loopback, which imports refuse unless allowed.
        self.spawn_with(&["up", "--node-name", "e2e", "--accel", "tcg", "--import-allow-host", "127.0.0.1"]);
    }

    /// Starts `virtplug ARGS --listen 127.0.0.1:0 --data-dir DIR` (`up` or `apiserver`), its
    /// stderr appended to `DIR/stderr.log`, and waits for the line with its URL.
    pub fn spawn_with(&mut self, args: &[&str]) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("stderr.log")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_virtplug"))
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(self.dir.path())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let serving = lines.by_ref().map_while(Result::ok).any(|l| l.contains("is serving the Kubernetes API at"));
            let _ = tx.send(serving);
            // Keep draining stdout so `up` never blocks on a full pipe.
            for _ in lines {}
        });
        self.child = Some(child);
        if rx.recv_timeout(Duration::from_secs(60)) != Ok(true) {
            self.kill9();
            panic!(
                "{args:?} printed no URL within 60 s; stderr:\n{}",
                std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
            );
        }
    }

    /// SIGINT to the process started last, then its exit (with a deadline); its stderr so far.
    pub async fn interrupt(&mut self) -> String {
        let mut c = self.child.take().unwrap();
        let pid = rustix::process::Pid::from_raw(i32::try_from(c.id()).unwrap()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
        let status = super::wait_until(Duration::from_secs(60), "the process to exit after SIGINT", || {
            let r = c.try_wait().unwrap();
            async move { r }
        })
        .await;
        assert!(status.success(), "a clean exit after SIGINT: {status}");
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap()
    }

    /// `kill -9` of `up` (API server, controller and agent at once).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub fn run(&self, program: &str, args: &[&str]) -> (bool, String) {
        let out = Command::new(program).args(args).env("KUBECONFIG", self.kubeconfig()).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        let (ok, out) = self.run("kubectl", args);
        assert!(ok, "kubectl {args:?}: {out}");
        out
    }

    pub fn virtplug(&self, args: &[&str]) -> String {
        let (ok, out) = self.run(env!("CARGO_BIN_EXE_virtplug"), args);
        assert!(ok, "virtplug {args:?}: {out}");
        out
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a)).unwrap()
    }

    /// Creates a running VM booting the test guest (with an empty CD-ROM drive `cd0`).
    pub fn vm(&self, name: &str) {
        self.vm_with(name, |_| {});
    }

    /// [`Up::vm`] with the manifest changed by `tune` first.
    pub fn vm_with(&self, name: &str, tune: impl FnOnce(&mut Value)) {
        let g = super::guest::guest_dir();
        let manifest = self.dir.path().join(format!("{name}.json"));
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
            "spec": {"runStrategy": "Always", "template": {"spec": {
                "terminationGracePeriodSeconds": 1,
                "domain": {"resources": {"requests": {"memory": "200Mi"}}, "devices": {"disks": [{"name": "cd0", "cdrom": {"bus": "sata"}}]},
                           "firmware": {"kernelBoot": {"kernelArgs": GUEST_KERNEL_ARGS,
                               "container": {"kernelPath": g.join("vmlinuz"), "initrdPath": g.join("initramfs.cpio.gz")}}}},
                "volumes": []}}}});
        let mut vm = vm;
        tune(&mut vm);
        std::fs::write(&manifest, vm.to_string()).unwrap();
        self.kubectl(&["apply", "-f", manifest.to_str().unwrap()]);
    }

    pub fn uid(&self, name: &str) -> String {
        self.json(&["get", "vmi", name])["metadata"]["uid"].as_str().unwrap().to_owned()
    }

    pub fn serial_log(&self, uid: &str) -> Vec<String> {
        super::guest::console_lines(&self.dir.path().join("node/vmis").join(uid).join("serial.log"))
    }

    pub async fn ready(&self, name: &str) -> String {
        let uid = super::wait_until(BOOT, &format!("VMI {name} running"), || {
            let (ok, out) = self.run("kubectl", &["get", "vmi", name, "-o", "jsonpath={.status.phase} {.metadata.uid}"]);
            let r = (ok && out.starts_with("Running ")).then(|| out.split_whitespace().nth(1).unwrap_or_default().to_owned());
            async move { r }
        })
        .await;
        self.see(&uid, "the guest ready", |l| l.starts_with("VP-READY")).await;
        uid
    }

    pub async fn see(&self, uid: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
        super::wait_until(SEE, what, || {
            let hit = self.serial_log(uid).into_iter().find(|l| pred(l));
            async move { hit }
        })
        .await
    }

    /// The guest's current hot-plugged disks by serial.
    pub fn guest_disks(&self, uid: &str) -> BTreeSet<String> {
        super::guest::hotplugged_disks(&self.dir.path().join("node/vmis").join(uid).join("serial.log"))
    }

    pub async fn guest_has(&self, uid: &str, want: &[&str]) {
        let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
        super::wait_until(SEE, &format!("the guest to have exactly {want:?}"), || {
            let ok = self.guest_disks(uid) == want;
            async move { ok.then_some(()) }
        })
        .await;
    }

    pub fn claim(&self, name: &str, size: &str, mode: &str) {
        self.virtplug(&["volume", "create", name, "--size", size, "--mode", mode, "--wait"]);
    }
}

/// The test guest's kernel command line in [`Up::vm`].
pub const GUEST_KERNEL_ARGS: &str = "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable";

/// A [`Up::vm_with`] tune that adds `args` to the guest's kernel command line (e.g. `vp.tick=1`).
pub fn kernel_args(args: &str) -> impl FnOnce(&mut Value) + '_ {
    move |vm: &mut Value| {
        let line = &mut vm["spec"]["template"]["spec"]["domain"]["firmware"]["kernelBoot"]["kernelArgs"];
        *line = Value::String(format!("{} {args}", line.as_str().unwrap_or_default()));
    }
}
