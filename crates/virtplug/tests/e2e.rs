//! End to end through the binary: `virtplug up` as its own process (API server, controller and
//! node agent in one), driven by real `kubectl` and by `virtplug`'s CLI, with real QEMU (TCG)
//! and the test guest. Every assertion about a device is made from inside the guest.
//!
//! Each test kills, by PID, the `up` it started and the QEMUs under its data dir, and detaches
//! the loop devices under its storage root, pass or fail.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::procs::{line_reader, wait_line, KillOnDrop};
use common::up::{Up, SEE};
use serde_json::{json, Value};

fn plug_patch(vols: &[(&str, &str)]) -> String {
    let disks: Vec<Value> = vols.iter().map(|(v, _)| json!({"name": v, "disk": {"bus": "scsi"}, "serial": v})).collect();
    let volumes: Vec<Value> =
        vols.iter().map(|(v, c)| json!({"name": v, "persistentVolumeClaim": {"claimName": c, "hotpluggable": true}})).collect();
    let mut all_disks = vec![json!({"name": "cd0", "cdrom": {"bus": "sata"}})];
    all_disks.extend(disks);
    json!({"spec": {"template": {"spec": {"domain": {"devices": {"disks": all_disks}}, "volumes": volumes}}}}).to_string()
}

/// 1. `kubectl patch` adds a Filesystem and a Block claim to a running VM's spec; the guest sees
///    both; removing them, the guest loses both; the VM never restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_patch_plugs_and_unplugs_filesystem_and_block_claims() {
    let up = Up::start();
    up.claim("fs", "64Mi", "Filesystem");
    let block = common::guest::is_root();
    if block {
        up.claim("blk", "32Mi", "Block");
    }
    up.vm("p1");
    let uid = up.ready("p1").await;
    let vols: Vec<(&str, &str)> = if block { vec![("fs", "fs"), ("blk", "blk")] } else { vec![("fs", "fs")] };
    up.kubectl(&["patch", "vm", "p1", "--type=merge", "-p", &plug_patch(&vols)]);
    up.guest_has(&uid, &vols.iter().map(|(v, _)| *v).collect::<Vec<_>>()).await;
    up.kubectl(&["patch", "vm", "p1", "--type=merge", "-p", &plug_patch(&[])]);
    up.guest_has(&uid, &[]).await;
    assert_eq!(up.uid("p1"), uid, "same VMI");
    assert_eq!(up.serial_log(&uid).iter().filter(|l| l.starts_with("VP-READY")).count(), 1, "one boot");
}

/// 2 and 3. An image imported over HTTP (`virtplug volume import`) becomes the medium of the
/// running VM's empty CD-ROM drive, and is ejected; `virtplug addvolume --wait` and
/// `removevolume --wait` plug and unplug a disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_media_and_the_cli_with_wait() {
    let up = Up::start();
    let iso = std::fs::read(common::guest::guest_dir().join("guest.iso")).unwrap();
    let url = common::guest::serve_file(iso.clone()).await;
    let out = up.virtplug(&["volume", "import", "iso", "--url", &url, "--size", "64Mi"]);
    assert!(out.contains("datavolume/iso imported"), "{out}");
    up.vm("p2");
    let uid = up.ready("p2").await;

    let out =
        up.virtplug(&["addvolume", "p2", "--volume-name", "cd0", "--datavolume", "iso", "--disk-type", "cdrom", "--bus", "sata", "--wait"]);
    assert!(out.contains("is Ready") && out.contains("Ready "), "{out}");
    let line = up.see(&uid, "the medium", |l| l.starts_with("MEDIA") && l.contains(" in ")).await;
    let head: String = iso[..16].iter().map(|b| format!("{b:02x}")).collect();
    assert!(line.contains(&head), "{line}");
    up.virtplug(&["removevolume", "p2", "--volume-name", "cd0", "--wait"]);
    common::wait_until(SEE, "the eject", || {
        let lines = up.serial_log(&uid);
        let ok = lines
            .iter()
            .position(|l| l.starts_with("MEDIA") && l.contains(" in "))
            .is_some_and(|i| lines[i + 1..].iter().any(|l| l.contains(" out")));
        async move { ok.then_some(()) }
    })
    .await;

    up.claim("d", "16Mi", "Filesystem");
    let out = up.virtplug(&["addvolume", "p2", "--volume-name", "d", "--claim", "d", "--serial", "d", "--wait"]);
    for phase in ["Bound", "AttachedToNode", "Ready", "total"] {
        assert!(out.contains(phase), "the timeline names {phase}: {out}");
    }
    up.guest_has(&uid, &["d"]).await;
    let (ok, dry) = up.run(env!("CARGO_BIN_EXE_virtplug"), &["removevolume", "p2", "--volume-name", "d", "--dry-run"]);
    assert!(ok && dry.contains("dry run"), "{dry}");
    up.virtplug(&["removevolume", "p2", "--volume-name", "d", "--wait"]);
    up.guest_has(&uid, &[]).await;
    // `-o json`: what a script reads instead of the prose (the entry as it became Ready, the
    // unplug confirmed, the imported DataVolume).
    let doc: Value =
        serde_json::from_str(&up.virtplug(&["addvolume", "p2", "--volume-name", "d", "--claim", "d", "--wait", "-o", "json"])).unwrap();
    assert_eq!((doc["volume"].as_str(), doc["volumeStatus"]["phase"].as_str()), (Some("d"), Some("Ready")), "{doc}");
    assert!(doc["elapsedMs"].is_number(), "{doc}");
    up.guest_has(&uid, &["d"]).await;
    let doc: Value = serde_json::from_str(&up.virtplug(&["removevolume", "p2", "--volume-name", "d", "--wait", "-o", "json"])).unwrap();
    assert_eq!(doc["unplugged"], true, "{doc}");
    up.guest_has(&uid, &[]).await;
    let small = common::guest::serve_file(vec![7u8; 1 << 20]).await;
    let doc: Value =
        serde_json::from_str(&up.virtplug(&["volume", "import", "small", "--url", &small, "--size", "4Mi", "-o", "json"])).unwrap();
    assert_eq!((doc["kind"].as_str(), doc["status"]["phase"].as_str()), (Some("DataVolume"), Some("Succeeded")), "{doc}");
    // A script can rely on the exit code: an unknown volume is refused with KubeVirt's message.
    let (ok, err) = up.run(env!("CARGO_BIN_EXE_virtplug"), &["removevolume", "p2", "--volume-name", "nope"]);
    assert!(!ok && err.contains("Unable to remove volume [nope] because it does not exist"), "{err}");
    // `--wait` on a volume that cannot become Ready: exit 1 at the timeout, naming the state the
    // watch saw last (the agent's reason), not a bare "timed out".
    let (ok, err) =
        up.run(env!("CARGO_BIN_EXE_virtplug"), &["addvolume", "p2", "--volume-name", "w", "--claim", "never", "--wait", "--timeout", "3s"]);
    assert!(!ok && err.contains("volume w of VM p2: not Ready after 3s") && err.contains("claim never does not exist"), "{err}");
    up.virtplug(&["removevolume", "p2", "--volume-name", "w", "--wait"]);
}

/// 4. 8 VMs × 4 volumes plugged at once, then unplugged: every guest agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_vms_four_volumes_each_plug_and_unplug_together() {
    let up = Up::start();
    let names: Vec<String> = (0..8).map(|i| format!("m{i}")).collect();
    for n in &names {
        for j in 0..4 {
            up.claim(&format!("{n}-v{j}"), "8Mi", "Filesystem");
        }
        up.vm(n);
    }
    let mut uids = Vec::new();
    for n in &names {
        uids.push(up.ready(n).await);
    }
    for n in &names {
        let claims: Vec<String> = (0..4).map(|j| format!("{n}-v{j}")).collect();
        let vols: Vec<(&str, &str)> = claims.iter().map(|c| (c.as_str(), c.as_str())).collect();
        up.kubectl(&["patch", "vm", n, "--type=merge", "-p", &plug_patch(&vols)]);
    }
    for (n, uid) in names.iter().zip(&uids) {
        let want: Vec<String> = (0..4).map(|j| format!("{n}-v{j}")).collect();
        up.guest_has(uid, &want.iter().map(String::as_str).collect::<Vec<_>>()).await;
    }
    for n in &names {
        up.kubectl(&["patch", "vm", n, "--type=merge", "-p", &plug_patch(&[])]);
    }
    for uid in &uids {
        up.guest_has(uid, &[]).await;
    }
}

/// 5. `kill -9` of `virtplug up` in the middle of a hot-plug, then `up` again: the VM still runs
///    (same QEMU, one boot) and its spec is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_up_mid_hotplug_then_up_again_honours_the_spec() {
    let mut up = Up::start();
    for c in ["k0", "k1", "k2"] {
        up.claim(c, "8Mi", "Filesystem");
    }
    up.vm("p5");
    let uid = up.ready("p5").await;
    let pid = std::fs::read_to_string(up.dir.path().join("node/vmis").join(&uid).join("qemu.pid")).unwrap();
    up.kubectl(&["patch", "vm", "p5", "--type=merge", "-p", &plug_patch(&[("k0", "k0"), ("k1", "k1"), ("k2", "k2")])]);
    up.kill9();
    up.spawn();
    up.guest_has(&uid, &["k0", "k1", "k2"]).await;
    up.kubectl(&["patch", "vm", "p5", "--type=merge", "-p", &plug_patch(&[("k1", "k1")])]);
    up.kill9();
    up.spawn();
    up.guest_has(&uid, &["k1"]).await;
    let pid_after = std::fs::read_to_string(up.dir.path().join("node/vmis").join(&uid).join("qemu.pid")).unwrap();
    assert_eq!(pid, pid_after, "the same QEMU");
    assert_eq!(up.uid("p5"), uid);
    assert_eq!(up.serial_log(&uid).iter().filter(|l| l.starts_with("VP-READY")).count(), 1, "one boot");
}

/// 6. The node agent is gone when the VM dies (seed bug 2040235): nothing stays mounted, the
///    claim can be deleted and its storage is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_up_is_gone_and_the_vm_dies_the_claim_is_freed() {
    let mut up = Up::start();
    up.claim("s", "16Mi", "Filesystem");
    up.vm("p6");
    let uid = up.ready("p6").await;
    up.kubectl(&["patch", "vm", "p6", "--type=merge", "-p", &plug_patch(&[("s", "s")])]);
    up.guest_has(&uid, &["s"]).await;
    let claim_dir = PathBuf::from(up.json(&["get", "pvc", "s"])["metadata"]["annotations"]["virtplug.io/local-path"].as_str().unwrap());
    up.kill9();
    let q = qemu::process::adopt(&up.dir.path().join("node/vmis").join(&uid)).unwrap();
    rustix::process::kill_process(rustix::process::Pid::from_raw(q.pid).unwrap(), rustix::process::Signal::KILL).unwrap();
    assert!(q.wait_gone(Duration::from_secs(10)).await);
    assert!(common::guest::mounts_under(up.dir.path()).is_empty(), "nothing mounted: {:?}", common::guest::mounts_under(up.dir.path()));
    up.spawn();
    up.kubectl(&["delete", "vm", "p6", "--wait=true", "--timeout=90s"]);
    up.kubectl(&["delete", "pvc", "s", "--wait=true", "--timeout=90s"]);
    assert!(!claim_dir.exists(), "the claim's storage is freed");
}

/// `up --stop-vms-on-exit`: SIGINT stops the VMs with `up` — their QEMUs are gone, no worker
/// reports the stop as a crash on the way out, and the VMI records why it stopped (`Failed`,
/// reason `NodeShutdown`) — and the next `up` starts the VM again (runStrategy `Always`: a new
/// VMI, a new boot) instead of finding a `Running` VMI without QEMU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_vms_on_exit_stops_them_with_up_and_the_next_up_starts_them_again() {
    let mut up = Up { dir: tempfile::tempdir().unwrap(), child: None };
    up.spawn_with(&["up", "--node-name", "e2e", "--accel", "tcg", "--stop-vms-on-exit"]);
    up.vm("s1");
    let uid = up.ready("s1").await;
    let pid = qemu::process::adopt(&up.dir.path().join("node/vmis").join(&uid)).unwrap().pid;
    let stderr = up.interrupt().await;
    assert!(stderr.contains("stopping VM default/s1"), "{stderr}");
    for bad in ["VMICrashed", "cannot set phase", "cannot record"] {
        assert!(!stderr.contains(bad), "nothing reported as crashed or failed on the way out ({bad}): {stderr}");
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(!String::from_utf8_lossy(&cmdline).contains(&uid), "QEMU {pid} is gone");
    assert!(!up.dir.path().join("node/vmis").join(&uid).exists(), "its run dir is removed");

    // What `up` left in the store, read through the API server alone (no controller to move on).
    up.spawn_with(&["apiserver"]);
    let vmi = up.json(&["get", "vmi", "s1"]);
    assert_eq!(vmi["metadata"]["uid"], uid.as_str());
    assert_eq!((vmi["status"]["phase"].as_str(), vmi["status"]["reason"].as_str()), (Some("Failed"), Some("NodeShutdown")), "{vmi}");
    up.interrupt().await;

    up.spawn();
    let again = up.ready("s1").await;
    assert_ne!(again, uid, "a new VMI");
    assert_eq!(up.serial_log(&again).iter().filter(|l| l.starts_with("VP-READY")).count(), 1);
}

/// Cloud-init as KubeVirt's user guide shows it: a `cloudInitNoCloud` volume whose user data is
/// in a Secret (`kubectl create secret generic my-vmi-secret --from-file=userdata=...`), on a
/// virtio disk. Created before the Secret, the VMI waits and says why (Ready condition and Event
/// `CloudInitSecretMissing`); once the Secret exists the guest boots and finds the `cidata` disk
/// with the Secret's user data (the test guest mounts it and prints the first line). The seed
/// image lives in the VMI's run dir and goes with the VMI.
///
/// The wait is a watch, not a retry loop (regression: the agent re-read the Secret every 250 ms
/// to 5 s for as long as it was missing): `up`'s audit log, which holds its own node agent's
/// requests, shows one read of the Secret, then one list and one watch narrowed to its name, and
/// no further read while the VMI waits.
///
/// The VM also has an SSH public key (`accessCredentials`, `propagationMethod: noCloud`) from a
/// second Secret, created last: the VMI then waits for that one (the message names its field),
/// and the guest finds the key in the `cidata` disk's `meta-data` (`public-keys`, as KubeVirt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cloud_user_data_from_a_secret_reaches_the_guest_once_the_secret_exists() {
    let mut up = Up { dir: tempfile::tempdir().unwrap(), child: None };
    let audit = up.dir.path().join("audit.log");
    let audit_arg = audit.to_str().unwrap().to_owned();
    up.spawn_with(&["up", "--node-name", "e2e", "--accel", "tcg", "--audit-log", &audit_arg]);
    up.vm_with("ci1", |vm| {
        devices(
            json!([{"name": "cloudinitdisk", "disk": {"bus": "virtio"}}]),
            json!([{"name": "cloudinitdisk", "cloudInitNoCloud": {"secretRef": {"name": "my-vmi-secret"}}}]),
        )(vm);
        vm["spec"]["template"]["spec"]["accessCredentials"] = ssh_key("my-pub-key", "noCloud");
    });
    let why = waiting_for(&up, "ci1", "my-vmi-secret").await;
    assert!(why.contains("cloudInitNoCloud.secretRef"), "{why}");
    let events = up.kubectl(&["get", "events", "--field-selector", "reason=CloudInitSecretMissing", "-o", "jsonpath={.items[*].message}"]);
    assert!(events.contains("my-vmi-secret"), "{events}");
    let secret_requests = |verb: &str| {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["verb"] == verb && e["resource"] == "secrets" && e["namespace"] == "default" && e["name"] == "my-vmi-secret")
            .count()
    };
    common::wait_until(SEE, "the node agent's watch of Secret my-vmi-secret in the audit log", || {
        let n = secret_requests("watch");
        async move { (n > 0).then_some(()) }
    })
    .await;
    // An observation window, not a synchronisation: longer than the old retry's first four
    // intervals (0.25 + 0.5 + 1 + 2 s), quiet with a watch.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let reads = (secret_requests("get"), secret_requests("list"), secret_requests("watch"));
    assert_eq!(reads, (1, 1, 1), "(get, list, watch) of the missing Secret while the VMI waits");

    // The Secret first comes without the key KubeVirt reads: the VMI waits for the key, says
    // which, and goes on when the Secret is replaced by one that has it.
    up.kubectl(&["create", "secret", "generic", "my-vmi-secret", "--from-literal=user-data=wrong key"]);
    let why = waiting_for_reason(&up, "ci1", "has no key userdata (or userData)").await;
    assert!(why.contains("cloudInitNoCloud.secretRef") && why.contains("Secret default/my-vmi-secret"), "{why}");
    up.kubectl(&["delete", "secret", "my-vmi-secret"]);
    let script = up.dir.path().join("startup-script");
    std::fs::write(&script, "#cloud-config from my-vmi-secret\npassword: fedora\nchpasswd: { expire: False }\n").unwrap();
    up.kubectl(&["create", "secret", "generic", "my-vmi-secret", &format!("--from-file=userdata={}", script.display())]);
    let why = waiting_for(&up, "ci1", "my-pub-key").await;
    assert!(why.contains("spec.accessCredentials[0].sshPublicKey.source.secret.secretName"), "{why}");
    up.kubectl(&["create", "secret", "generic", "my-pub-key", &format!("--from-literal=key1={PUB_KEY}")]);
    let uid = up.ready("ci1").await;
    let line = up.see(&uid, "the guest to read its cidata disk", |l| l.starts_with("VP-CIDATA")).await;
    assert_eq!(line, "VP-CIDATA label=cidata dev=vda first-line=#cloud-config from my-vmi-secret");
    let key = up.see(&uid, "the guest to find the SSH key in the meta-data", |l| l.starts_with("VP-SSHKEY")).await;
    assert_eq!(key, format!("VP-SSHKEY label=cidata first-key={PUB_KEY}"));
    let run_dir = up.dir.path().join("node/vmis").join(&uid);
    assert!(run_dir.join("cloud-init.iso").is_file(), "the seed is in the run dir");
    up.kubectl(&["delete", "vm", "ci1", "--wait=true", "--timeout=90s"]);
    up.kubectl(&["wait", "--for=delete", "vmi/ci1", "--timeout=90s"]);
    assert!(!run_dir.exists(), "the seed went with the VMI's run dir");
}

/// Waits until VMI `vmi` is `Scheduled` waiting for Secret `secret` (its `Ready` condition:
/// reason `CloudInitSecretMissing`, the message naming the Secret); returns what it says.
async fn waiting_for(up: &Up, vmi: &str, secret: &str) -> String {
    waiting_for_reason(up, vmi, &format!("Secret default/{secret} not found")).await
}

/// Waits until VMI `vmi` is `Scheduled` with `Ready` reason `CloudInitSecretMissing` and a
/// message containing `text`; returns what it says.
async fn waiting_for_reason(up: &Up, vmi: &str, text: &str) -> String {
    let jsonpath =
        "jsonpath={.status.phase} {.status.conditions[?(@.type=='Ready')].reason} {.status.conditions[?(@.type=='Ready')].message}";
    common::wait_until(SEE, &format!("VMI {vmi} to wait with CloudInitSecretMissing: {text}"), || {
        let (ok, out) = up.run("kubectl", &["get", "vmi", vmi, "-o", jsonpath]);
        let hit = ok && out.starts_with("Scheduled CloudInitSecretMissing ") && out.contains(text);
        async move { hit.then_some(out) }
    })
    .await
}

/// A public key as a user would put in a Secret for `accessCredentials`.
const PUB_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHZpcnRwbHVnLXRlc3Qta2V5LWZvci10aGUtZ3Vlc3Q vp@test";

/// `accessCredentials` with one SSH public key from Secret `secret`, propagated by `method`.
fn ssh_key(secret: &str, method: &str) -> Value {
    json!([{"sshPublicKey": {"source": {"secret": {"secretName": secret}}, "propagationMethod": {method: {}}}}])
}

/// `cloudInitConfigDrive` with inline base64 user data and network data, on a `sata` CD-ROM: the
/// guest finds the `config-2` medium and reads `openstack/latest/user_data`, and the SSH key of
/// `accessCredentials` (`configDrive`) in `openstack/latest/meta_data.json` (`public_keys`).
/// Admission refuses what the agent could not honour (both userData and userDataBase64; an SSH
/// key propagated by the QEMU guest agent) with a field error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_drive_user_data_reaches_the_guest_and_bad_sources_are_refused() {
    use base64::Engine;
    let up = Up::start();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let disks = json!([{"name": "configdrive", "cdrom": {"bus": "sata"}}]);
    let (ok, err) = {
        let bad = up.dir.path().join("bad.json");
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "bad"},
            "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {"disks": disks}},
                "volumes": [{"name": "configdrive", "cloudInitConfigDrive": {"userData": "a", "userDataBase64": b64("b")}}]}}}});
        std::fs::write(&bad, vm.to_string()).unwrap();
        up.run("kubectl", &["apply", "-f", bad.to_str().unwrap()])
    };
    assert!(!ok && err.contains("spec.template.spec.volumes[0].cloudInitConfigDrive") && err.contains("only one userdatasource"), "{err}");
    let (ok, err) = {
        let bad = up.dir.path().join("bad-key.json");
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "bad"},
            "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {"disks": disks}},
                "volumes": [{"name": "configdrive", "cloudInitConfigDrive": {"userData": "a"}}],
                "accessCredentials": ssh_key("my-pub-key", "qemuGuestAgent")}}}});
        std::fs::write(&bad, vm.to_string()).unwrap();
        up.run("kubectl", &["apply", "-f", bad.to_str().unwrap()])
    };
    let field = "spec.template.spec.accessCredentials[0].sshPublicKey.propagationMethod.qemuGuestAgent";
    assert!(!ok && err.contains(field) && err.contains("use noCloud") && err.contains("or configDrive"), "{err}");

    up.kubectl(&["create", "secret", "generic", "my-pub-key", &format!("--from-literal=key1={PUB_KEY}")]);
    let volumes = json!([{"name": "configdrive", "cloudInitConfigDrive": {
        "userDataBase64": b64("#!/bin/sh\necho config drive\n"), "networkData": "{\"links\": []}"}}]);
    up.vm_with("ci2", |vm| {
        devices(disks, volumes)(vm);
        vm["spec"]["template"]["spec"]["accessCredentials"] = ssh_key("my-pub-key", "configDrive");
    });
    let uid = up.ready("ci2").await;
    let line = up.see(&uid, "the guest to read its config-2 medium", |l| l.starts_with("VP-CIDATA")).await;
    assert!(line.starts_with("VP-CIDATA label=config-2 dev=sr") && line.ends_with(" first-line=#!/bin/sh"), "{line}");
    let key = up.see(&uid, "the guest to find the SSH key in meta_data.json", |l| l.starts_with("VP-SSHKEY")).await;
    assert_eq!(key, format!("VP-SSHKEY label=config-2 first-key={PUB_KEY}"));
}

/// A [`Up::vm_with`] tune that gives the VM these disks and volumes (instead of the empty `cd0`).
fn devices(disks: Value, volumes: Value) -> impl FnOnce(&mut Value) {
    move |vm: &mut Value| {
        let spec = &mut vm["spec"]["template"]["spec"];
        spec["domain"]["devices"]["disks"] = disks;
        spec["volumes"] = volumes;
    }
}

/// Reads the one line a TCP service at `addr` sends, within a second (`None`: refused, closed
/// without a line — QEMU's user-mode network accepts on the host before the guest answers).
fn answer(addr: &str) -> Option<String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.lines().next().map(str::to_owned)
}

/// Guest networking: a VM with KubeVirt's masquerade interface on the pod network and a port
/// gets a NIC whose MAC is the derived one (the guest prints it), its port is reached from the
/// host through the loopback port the VMI's annotation names (and `virtplug vm port` prints),
/// and its status says the interface; a spec MAC is the guest's MAC. Bindings and networks
/// virtplug cannot give are refused at admission, naming what is supported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_port_is_reached_through_its_forwarded_loopback_port() {
    let mut up = Up::start();
    let net = |iface: Value| {
        move |vm: &mut Value| {
            let spec = &mut vm["spec"]["template"]["spec"];
            spec["domain"]["devices"]["interfaces"] = json!([iface]);
            spec["networks"] = json!([{"name": "default", "pod": {}}]);
            let args = spec["domain"]["firmware"]["kernelBoot"]["kernelArgs"].as_str().unwrap().to_owned();
            spec["domain"]["firmware"]["kernelBoot"]["kernelArgs"] = json!(format!("{args} vp.net=8022"));
        }
    };
    // Refused at admission: nothing is created.
    for (iface, field) in [
        (json!({"name": "default", "bridge": {}}), "spec.template.spec.domain.devices.interfaces[0].bridge"),
        (json!({"name": "other", "masquerade": {}}), "spec.template.spec.domain.devices.interfaces[0].name"),
        (json!({"name": "default", "macAddress": "02:00:00:00:00"}), "spec.template.spec.domain.devices.interfaces[0].macAddress"),
        (json!({"name": "default", "ports": [{"port": 70000}]}), "spec.template.spec.domain.devices.interfaces[0].ports[0]"),
    ] {
        let manifest = up.dir.path().join("bad.json");
        let mut vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "bad"},
            "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}, "firmware": {"kernelBoot": {"kernelArgs": ""}}}}}}});
        net(iface)(&mut vm);
        std::fs::write(&manifest, vm.to_string()).unwrap();
        let (ok, out) = up.run("kubectl", &["apply", "-f", manifest.to_str().unwrap()]);
        assert!(!ok && out.contains(field), "{field}: {out}");
    }
    let (ok, out) = up.run("kubectl", &["get", "vm", "bad"]);
    assert!(!ok && out.contains("NotFound"), "{out}");

    up.vm_with("net1", net(json!({"name": "default", "masquerade": {}, "ports": [{"name": "hello", "port": 8022}]})));
    up.vm_with("net2", net(json!({"name": "default", "macAddress": "02:AA:bb:cc:dd:0e"})));
    let uid1 = up.ready("net1").await;
    let uid2 = up.ready("net2").await;
    let derived = api::network::derived_mac("default", "net1", "default").to_string();
    up.see(&uid1, "the derived MAC in the guest", |l| l == format!("VP-NET mac={derived}")).await;
    up.see(&uid2, "the spec's MAC in the guest", |l| l == "VP-NET mac=02:aa:bb:cc:dd:0e").await;

    // The forward, as the agent reports it (before `Running`), and as the CLI prints it.
    let vmi = up.json(&["get", "vmi", "net1"]);
    let forwards: Value = serde_json::from_str(vmi["metadata"]["annotations"]["virtplug.io/port-forwards"].as_str().unwrap()).unwrap();
    let f = &forwards[0];
    assert_eq!(
        (&f["interface"], &f["name"], &f["protocol"], &f["port"], &f["hostIP"]),
        (&json!("default"), &json!("hello"), &json!("TCP"), &json!(8022), &json!("127.0.0.1")),
        "{forwards}"
    );
    let addr = format!("127.0.0.1:{}", f["hostPort"]);
    assert_eq!(up.virtplug(&["vm", "port", "net1", "8022"]).trim(), addr);
    let (ok, out) = up.run(env!("CARGO_BIN_EXE_virtplug"), &["vm", "port", "net1", "22"]);
    assert!(!ok && out.contains("port 22/TCP of VM net1 is not forwarded (forwarded: 8022/TCP)"), "{out}");
    let iface = &vmi["status"]["interfaces"][0];
    assert_eq!((&iface["name"], &iface["mac"], &iface["ipAddress"]), (&json!("default"), &json!(derived), &json!("10.0.2.15")), "{vmi}");
    let get = up.virtplug(&["vm", "get", "net1"]);
    assert!(
        get.contains(&format!("Interface default: mac {derived}, ip 10.0.2.15"))
            && get.contains(&format!("Port 8022/TCP (hello) of default: {addr}")),
        "{get}"
    );

    // The guest answers through the forward (its listener starts as it prints its MAC).
    let line = common::wait_until(SEE, &format!("the guest's answer on {addr}"), || {
        let a = answer(&addr);
        async move { a }
    })
    .await;
    assert_eq!(line, format!("VP-NET hello mac={derived}"));
    assert!(
        up.json(&["get", "vmi", "net2"])["metadata"]["annotations"].get("virtplug.io/port-forwards").is_none(),
        "no ports, no forwards"
    );

    // The next agent reads the forwards from the QEMU it adopts, not from the VMI.
    up.kubectl(&["annotate", "vmi", "net1", "virtplug.io/port-forwards-"]);
    up.kill9();
    up.spawn();
    let again = common::wait_until(SEE, "the adopting agent to report the forwards again", || {
        let (_, out) = up.run("kubectl", &["get", "vmi", "net1", "-o", r"jsonpath={.metadata.annotations.virtplug\.io/port-forwards}"]);
        let r = (!out.trim().is_empty()).then_some(out);
        async move { r }
    })
    .await;
    assert_eq!(serde_json::from_str::<Value>(&again).unwrap(), forwards, "the same QEMU, the same ports");
    assert_eq!(up.uid("net1"), uid1, "the same VMI");
    assert_eq!(answer(&addr).as_deref(), Some(format!("VP-NET hello mac={derived}").as_str()));
}

/// A CLI process that only has a copy of the kubeconfig: no data dir, no `$HOME` config, run
/// from an empty directory (what a user on another machine has).
fn remote_cli(up: &Up, args: &[&str]) -> (Command, tempfile::TempDir) {
    let elsewhere = tempfile::tempdir().unwrap();
    let kubeconfig = elsewhere.path().join("kubeconfig");
    std::fs::copy(up.kubeconfig(), &kubeconfig).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_virtplug"));
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .current_dir(elsewhere.path())
        .env("HOME", elsewhere.path())
        .env_remove("KUBECONFIG");
    (cmd, elsewhere)
}

/// KubeVirt's `console` and `vnc` subresources through the API, from a process that has only
/// the kubeconfig (as `virtctl console|vnc` from another machine): what the guest prints reaches
/// it, a line typed into it reaches the guest (the test guest answers `VP-ECHO <line>`, also in
/// QEMU's own log of the serial port), and the VNC proxy's first 12 bytes are QEMU's RFB
/// version. Refusals come as KubeVirt's status codes, before any upgrade: no such VMI (404), a
/// VMI that is not running (400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_and_vnc_through_the_api_from_a_process_with_only_the_kubeconfig() {
    let up = Up::start();
    up.vm("con1");
    let uid = up.ready("con1").await;

    let (mut cmd, _elsewhere) = remote_cli(&up, &["vm", "console", "con1"]);
    let mut console = KillOnDrop(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let out = line_reader(console.0.stdout.take().unwrap());
    let err = line_reader(console.0.stderr.take().unwrap());
    wait_line(&err, SEE, "the console's greeting", |l| l.contains("Successfully connected to con1 console. The escape sequence is ^]"));
    let mut stdin = console.0.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, b"hello through the api\n").unwrap();
    wait_line(&out, SEE, "the guest's answer over the websocket", |l| l == "VP-ECHO hello through the api");
    up.see(&uid, "the guest's answer in QEMU's serial log", |l| l == "VP-ECHO hello through the api").await;
    // `^]` leaves, as in virtctl.
    std::io::Write::write_all(&mut stdin, b"\x1d").unwrap();
    let status = common::wait_until(SEE, "the console to leave on ^]", || {
        let s = console.0.try_wait().unwrap();
        async move { s }
    })
    .await;
    assert!(status.success(), "{status}");

    let (mut cmd, _elsewhere) = remote_cli(&up, &["vm", "vnc", "con1", "--proxy-only"]);
    let mut vnc = KillOnDrop(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let out = line_reader(vnc.0.stdout.take().unwrap());
    let port: Value = serde_json::from_str(&wait_line(&out, SEE, "the proxy's port", |l| l.starts_with("{\"port\":"))).unwrap();
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", u16::try_from(port["port"].as_u64().unwrap()).unwrap())).unwrap();
    tcp.set_read_timeout(Some(SEE)).unwrap();
    let mut version = [0u8; 12];
    std::io::Read::read_exact(&mut tcp, &mut version).unwrap();
    assert_eq!(&version, b"RFB 003.008\n");
    drop(vnc);

    let refused = |name: &str| {
        let (mut cmd, _elsewhere) = remote_cli(&up, &["vm", "console", name]);
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        assert!(!out.status.success(), "console {name} must fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = refused("nosuch");
    assert!(e.contains(r#"virtualmachineinstances.kubevirt.io "nosuch" not found (404)"#), "{e}");
    // A VMI no node can take stays Pending.
    let vmi = up.dir.path().join("pending.json");
    let g = common::guest::guest_dir();
    std::fs::write(
        &vmi,
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "pending1"},
            "spec": {"nodeSelector": {"no-such-label": "x"}, "domain": {"resources": {"requests": {"memory": "64Mi"}},
                "firmware": {"kernelBoot": {"container": {"kernelPath": g.join("vmlinuz"), "initrdPath": g.join("initramfs.cpio.gz")}}}}}})
        .to_string(),
    )
    .unwrap();
    up.kubectl(&["apply", "-f", vmi.to_str().unwrap()]);
    let e = refused("pending1");
    assert!(e.contains("VMI is not running (its phase is") && e.contains("(400)"), "{e}");
}
