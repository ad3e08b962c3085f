//! Real `kubectl` against the embedded API server: the oldest and the newest kubectl on the
//! machine (1.27 and 1.33, found next to the `kubectl` on PATH), plus the one on PATH.

#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl::oldest_newest_and_path as kubectls;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::TestServer;

struct Kubectl<'a> {
    bin: &'a Path,
    kubeconfig: &'a Path,
}

impl Kubectl<'_> {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(self.bin);
        // No KUBECTL_EXPLAIN_OPENAPIV3: `explain` works from the defaults (tests/openapi.rs).
        c.args(args).env("KUBECONFIG", self.kubeconfig).env_remove("KUBECTL_EXPLAIN_OPENAPIV3").env_remove("KUBERNETES_SERVICE_HOST");
        c
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("kubectl runs")
    }
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "{} {args:?} failed: {}", self.bin.display(), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    fn stdin(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write;
        let mut child = self.cmd(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("kubectl runs");
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
        child.wait_with_output().expect("kubectl finishes")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drives_virtual_machines() {
    let s = TestServer::start().await;
    let manifest = std::fs::read_to_string(common::fixture("testvm.yaml")).expect("fixture");
    for bin in kubectls() {
        let k = Kubectl { bin: &bin, kubeconfig: &s.kubeconfig };
        let v = bin.file_name().unwrap().to_string_lossy().into_owned();
        let run = |args: Vec<String>| {
            let bin = bin.clone();
            let kc = s.kubeconfig.clone();
            tokio::task::spawn_blocking(move || {
                Kubectl { bin: &bin, kubeconfig: &kc }.run(&args.iter().map(String::as_str).collect::<Vec<_>>())
            })
        };

        // apply (create, then configure with a change), from stdin.
        let out = k.stdin(&["apply", "-f", "-"], &manifest);
        assert!(out.status.success(), "{v} apply: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("virtualmachine.kubevirt.io/testvm created"), "{v}");
        let out = k.stdin(&["apply", "-f", "-"], &manifest.replace("runStrategy: Halted", "runStrategy: Manual"));
        assert!(out.status.success(), "{v} re-apply: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("configured"), "{v}");
        assert_eq!(k.ok(&["get", "vm", "testvm", "-o", "jsonpath={.spec.runStrategy}"]), "Manual", "{v}");

        // get: table, yaml, json, jsonpath, short name.
        let table = k.ok(&["get", "vm"]);
        let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header, ["NAME", "AGE", "STATUS", "READY"], "{v}: {table}");
        assert!(table.lines().nth(1).unwrap().starts_with("testvm "), "{v}: {table}");
        let yaml = k.ok(&["get", "virtualmachines.kubevirt.io", "testvm", "-o", "yaml"]);
        assert!(yaml.contains("kind: VirtualMachine") && yaml.contains("masquerade: {}"), "{v}: unmodelled fields survive: {yaml}");
        let json: serde_json::Value = serde_json::from_str(&k.ok(&["get", "vm", "testvm", "-o", "json"])).unwrap();
        assert_eq!(json["spec"]["template"]["spec"]["networks"][0]["name"], "default", "{v}");
        assert_eq!(k.ok(&["get", "vm", "-o", "jsonpath={.items[*].metadata.name}"]), "testvm");

        // describe.
        let describe = k.ok(&["describe", "vm", "testvm"]);
        assert!(
            describe.contains("Name:         testvm")
                && describe.lines().any(|l| l.trim().starts_with("Run Strategy:") && l.trim().ends_with("Manual")),
            "{v}: {describe}"
        );

        // patch --type=merge with a stale resourceVersion: the Conflict message.
        let rv: u64 = k.ok(&["get", "vm", "testvm", "-o", "jsonpath={.metadata.resourceVersion}"]).parse().unwrap();
        let stale = format!(r#"{{"metadata":{{"resourceVersion":"{}"}},"spec":{{"runStrategy":"Always"}}}}"#, rv - 1);
        let out = k.run(&["patch", "vm", "testvm", "--type=merge", "-p", &stale]);
        assert!(!out.status.success(), "{v}: a stale patch must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Conflict")
                && err.contains("the object has been modified; please apply your changes to the latest version and try again"),
            "{v}: {err}"
        );
        assert_eq!(k.ok(&["get", "vm", "testvm", "-o", "jsonpath={.spec.runStrategy}"]), "Manual", "{v}");

        // patch --type=json.
        k.ok(&["patch", "vm", "testvm", "--type=json", "-p", r#"[{"op":"add","path":"/metadata/labels/patched","value":"yes"}]"#]);
        assert_eq!(k.ok(&["get", "vm", "testvm", "-o", "jsonpath={.metadata.labels.patched}"]), "yes");

        // edit through an EDITOR script.
        let editor = s.dir.path().join("editor.sh");
        std::fs::write(&editor, "#!/bin/sh\nsed -i 's/runStrategy: Manual/runStrategy: Always/' \"$1\"\n").unwrap();
        std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let out = k.cmd(&["edit", "vm", "testvm"]).env("EDITOR", &editor).output().unwrap();
        assert!(out.status.success(), "{v} edit: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(k.ok(&["get", "vm", "testvm", "-o", "jsonpath={.spec.runStrategy}"]), "Always", "{v}");

        // get -w receives the events; wait --for sees a status change.
        let mut watch = k
            .cmd(&["get", "vm", "testvm", "-w", "-o", "jsonpath={.metadata.labels.step}{\"\\n\"}"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl get -w runs");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let stdout = watch.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // The first line is the initial state: from here on kubectl watches from that list's
        // resourceVersion, so no later change can be missed.
        let first = rx.recv_timeout(Duration::from_secs(20));
        k.ok(&["label", "vm", "testvm", "--overwrite", "step=one"]);
        let waiter =
            run(vec!["wait".into(), "vm/testvm".into(), "--for=jsonpath={.status.printableStatus}=Running".into(), "--timeout=20s".into()]);
        let p = serde_json::json!({"status": {"printableStatus": "Running"}}).to_string();
        k.ok(&["patch", "vm", "testvm", "--subresource=status", "--type=merge", "-p", &p]);
        let waited = waiter.await.unwrap();
        assert!(waited.status.success(), "{v} wait: {}", String::from_utf8_lossy(&waited.stderr));
        k.ok(&["label", "vm", "testvm", "--overwrite", "step=two"]);
        let mut seen = vec![first.expect("kubectl get -w printed the initial state")];
        while !seen.iter().any(|l| l == "two") {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => seen.push(line),
                Err(_) => break,
            }
        }
        // kubectl -w never exits by itself: stop the one this test started, by PID.
        let _ = watch.kill();
        let _ = watch.wait();
        let _ = reader.join();
        assert!(seen.iter().any(|l| l == "one") && seen.iter().any(|l| l == "two"), "{v}: get -w printed the events: {seen:?}");

        // explain, from the defaults (v3, or v2 where a kubectl finds no v3).
        let explain = k.ok(&["explain", "vm.spec"]);
        assert!(explain.contains("KIND:       VirtualMachine") && explain.contains("runStrategy"), "{v}: {explain}");

        // delete, and the object is gone.
        let out = k.ok(&["delete", "vm", "testvm", "--wait=true", "--timeout=20s"]);
        assert!(out.contains("deleted"), "{v}: {out}");
        let out = k.run(&["get", "vm", "testvm"]);
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound"), "{v}");
    }
}
