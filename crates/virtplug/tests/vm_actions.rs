//! KubeVirt's VM actions beyond start and stop, end to end through the binary (`virtplug up`,
//! real `kubectl`, `virtplug`'s CLI, real QEMU under TCG and the test guest): `pause` /
//! `unpause` (the guest's clock stops and goes on), `softreboot` (the guest boots again in the
//! same VMI) and the crash-loop backoff (a VM whose VMIs fail before they run is restarted
//! after growing delays, visible in its status, and a VMI that runs ends the loop).
//!
//! Each test kills, by PID, the `up` it started and the QEMUs under its data dir, pass or fail
//! ([`common::up::Up`]).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::up::{kernel_args, Up, SEE};
use serde_json::{json, Value};

/// The guest's ticks (`VP-TICK n`, printed every second of its own clock with `vp.tick=1`).
fn ticks(up: &Up, uid: &str) -> Vec<u64> {
    up.serial_log(uid).iter().filter_map(|l| l.strip_prefix("VP-TICK ")?.trim().parse().ok()).collect()
}

fn jsonpath(up: &Up, kind: &str, name: &str, path: &str) -> String {
    let (ok, out) = up.run("kubectl", &["get", kind, name, "-o", &format!("jsonpath={path}")]);
    if ok {
        out
    } else {
        String::new()
    }
}

/// Waits until `kubectl get KIND NAME -o jsonpath=PATH` prints `want`.
async fn until_jsonpath(up: &Up, kind: &str, name: &str, path: &str, want: &str) {
    common::wait_until(SEE, &format!("{kind} {name} {path} to be {want:?}"), || {
        let hit = jsonpath(up, kind, name, path) == want;
        async move { hit.then_some(()) }
    })
    .await;
}

const PAUSED_REASON: &str = "{.status.conditions[?(@.type==\"Paused\")].reason}";
const READY: &str = "{.status.conditions[?(@.type==\"Ready\")].status} {.status.conditions[?(@.type==\"Ready\")].reason}";

/// The READY column of `kubectl get KIND NAME` (the CRD's printer column, as users see it).
fn ready_column(up: &Up, kind: &str, name: &str) -> String {
    let table = up.kubectl(&["get", kind, name]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    let row: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    let i = header.iter().position(|h| *h == "READY").unwrap_or_else(|| panic!("no READY column: {table}"));
    row.get(i).copied().unwrap_or_default().to_owned()
}

/// `virtplug vm pause` stops the guest (its clock: no tick while paused, however long), the
/// VMI says so (`Paused`/`PausedByUser`, which the node agent sets only once QEMU's `stop`
/// succeeded) and so does the VM (`printableStatus: Paused`, its own `Paused` condition); both
/// are not Ready while paused, as in KubeVirt (`Ready=False`, reason `ReadinessGatesNotReady`:
/// the launcher pod's readiness gate; `kubectl get vmi` READY `False`, the VM's `ready: false`); a
/// disk plugged meanwhile is seen by the guest once it runs; a new agent (after `kill -9` of
/// `up`) adopts the paused QEMU and leaves it paused; `unpause` resumes it where it stopped
/// (the tick numbering goes on without a gap). Refusals as KubeVirt words them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_the_guests_clock_and_unpause_resumes_it_where_it_stopped() {
    let mut up = Up::start();
    up.claim("hp", "8Mi", "Filesystem");
    up.vm_with("t1", kernel_args("vp.tick=1"));
    let uid = up.ready("t1").await;
    up.see(&uid, "the guest's clock ticking", |l| l == "VP-TICK 2").await;

    let out = up.virtplug(&["vm", "pause", "t1"]);
    assert!(out.contains("VMI t1 was scheduled to pause"), "{out}");
    until_jsonpath(&up, "vmi", "t1", PAUSED_REASON, "PausedByUser").await;
    until_jsonpath(&up, "vm", "t1", "{.status.printableStatus}", "Paused").await;
    until_jsonpath(&up, "vm", "t1", PAUSED_REASON, "PausedByUser").await;
    assert_eq!(jsonpath(&up, "vmi", "t1", "{.status.phase}"), "Running", "a paused VMI is still Running, as in KubeVirt");
    assert_eq!(jsonpath(&up, "vmi", "t1", READY), "False ReadinessGatesNotReady", "a paused VMI is not Ready, as in KubeVirt");
    assert_eq!(ready_column(&up, "vmi", "t1"), "False");
    until_jsonpath(&up, "vm", "t1", READY, "False ReadinessGatesNotReady").await;
    assert_eq!((jsonpath(&up, "vm", "t1", "{.status.ready}"), ready_column(&up, "vm", "t1")), ("false".into(), "False".into()));
    let last_before = *ticks(&up, &uid).last().unwrap();

    // KubeVirt's refusals, through the CLI (exit 1) and the raw API (409).
    let (ok, err) = up.run(env!("CARGO_BIN_EXE_virtplug"), &["vm", "pause", "t1"]);
    assert!(!ok && err.contains("VMI is already paused") && err.contains("409"), "{err}");
    let (ok, err) = up.run(env!("CARGO_BIN_EXE_virtplug"), &["vm", "softreboot", "t1"]);
    assert!(!ok && err.contains("VMI is paused"), "{err}");

    // Hot-plug while paused: QEMU takes the disk (the volume becomes Ready) with the vCPUs
    // stopped.
    let disk = json!({"spec": {"template": {"spec": {
        "domain": {"devices": {"disks": [{"name": "cd0", "cdrom": {"bus": "sata"}}, {"name": "hp", "disk": {"bus": "scsi"}, "serial": "hp"}]}},
        "volumes": [{"name": "hp", "persistentVolumeClaim": {"claimName": "hp", "hotpluggable": true}}]}}}});
    up.kubectl(&["patch", "vm", "t1", "--type=merge", "-p", &disk.to_string()]);
    until_jsonpath(&up, "vmi", "t1", "{.status.volumeStatus[?(@.name==\"hp\")].phase}", "Ready").await;
    // A new agent adopts the paused QEMU and asks it, rather than resuming it: from then on, a
    // 3 s window of host time that the guest's clock must not see.
    up.kill9();
    up.spawn();
    common::wait_until(SEE, "the new agent to find the guest paused", || {
        let seen = std::fs::read_to_string(up.dir.path().join("stderr.log")).unwrap_or_default().contains("QEMU reports the guest paused");
        async move { seen.then_some(()) }
    })
    .await;
    let paused_at = Instant::now();
    let window = Duration::from_secs(3);
    if let Some(rest) = window.checked_sub(paused_at.elapsed()) {
        tokio::time::sleep(rest).await; // the measurement window itself, not a synchronisation
    }
    let during = ticks(&up, &uid);
    assert_eq!(*during.last().unwrap(), last_before, "no tick in {:?} of host time while paused", paused_at.elapsed());
    assert!(!up.serial_log(&uid).iter().any(|l| l.starts_with("BLOCK+")), "the paused guest cannot have seen the disk yet");

    let out = up.virtplug(&["vm", "unpause", "t1"]);
    assert!(out.contains("VMI t1 was scheduled to unpause"), "{out}");
    until_jsonpath(&up, "vmi", "t1", PAUSED_REASON, "").await;
    until_jsonpath(&up, "vm", "t1", "{.status.printableStatus}", "Running").await;
    until_jsonpath(&up, "vm", "t1", PAUSED_REASON, "").await;
    until_jsonpath(&up, "vm", "t1", "{.status.ready}", "true").await;
    assert_eq!(jsonpath(&up, "vmi", "t1", READY), "True ", "Ready again once running");
    assert_eq!(ready_column(&up, "vmi", "t1"), "True");
    let next = format!("VP-TICK {}", last_before + 2);
    up.see(&uid, "the guest's clock going on", |l| l == next).await;
    let all = ticks(&up, &uid);
    assert_eq!(all, (1..=*all.last().unwrap()).collect::<Vec<_>>(), "the ticks go on where they stopped: no gap, no repeat");
    up.guest_has(&uid, &["hp"]).await;
    assert_eq!(up.uid("t1"), uid, "the same VMI");

    let (ok, err) = up.run(env!("CARGO_BIN_EXE_virtplug"), &["vm", "unpause", "t1"]);
    assert!(!ok && err.contains("VMI is not paused") && err.contains("409"), "{err}");
    // `dryRun` checks and changes nothing (KubeVirt's PauseOptions).
    let path = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/t1/pause";
    let body = up.dir.path().join("dry.json");
    std::fs::write(&body, r#"{"dryRun": ["All"]}"#).unwrap();
    let (ok, out) = up.run("kubectl", &["replace", "--raw", path, "-f", body.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert_eq!(jsonpath(&up, "vmi", "t1", "{.metadata.annotations.virtplug\\.io/pause-requested}"), "", "a dry run writes nothing");
}

/// `virtplug vm softreboot` resets the guest: it boots again (its banner a second time) in the
/// same VMI and the same QEMU; the request is answered on the VMI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn softreboot_boots_the_guest_again_in_the_same_vmi() {
    let up = Up::start();
    up.vm("r1");
    let uid = up.ready("r1").await;
    let pid = std::fs::read_to_string(up.dir.path().join("node/vmis").join(&uid).join("qemu.pid")).unwrap();
    let boots = |up: &Up| up.serial_log(&uid).iter().filter(|l| l.starts_with("VP-BOOT")).count();
    assert_eq!(boots(&up), 1);

    let out = up.virtplug(&["vm", "softreboot", "r1"]);
    assert!(out.contains("VMI r1 was scheduled to softreboot"), "{out}");
    common::wait_until(SEE, "the guest to boot a second time", || {
        let twice = up.serial_log(&uid).iter().filter(|l| l.starts_with("VP-READY")).count() == 2;
        async move { twice.then_some(()) }
    })
    .await;
    assert_eq!(boots(&up), 2, "one more boot");
    assert_eq!(up.uid("r1"), uid, "the same VMI");
    let pid_after = std::fs::read_to_string(up.dir.path().join("node/vmis").join(&uid).join("qemu.pid")).unwrap();
    assert_eq!(pid, pid_after, "the same QEMU");
    let vmi = up.json(&["get", "vmi", "r1"]);
    let ann = &vmi["metadata"]["annotations"];
    assert_eq!(ann["virtplug.io/softreboot-done"], ann["virtplug.io/softreboot-requested"], "answered: {ann}");
    assert_eq!(vmi["status"]["phase"], "Running");

    // A VMI that does not run cannot be rebooted (KubeVirt's words).
    up.kubectl(&["patch", "vm", "r1", "--type=merge", "-p", r#"{"spec": {"runStrategy": "Halted"}}"#]);
    common::wait_until(SEE, "the VMI to go", || {
        let gone = !up.run("kubectl", &["get", "vmi", "r1"]).0;
        async move { gone.then_some(()) }
    })
    .await;
    let (ok, err) = up.run(env!("CARGO_BIN_EXE_virtplug"), &["vm", "softreboot", "r1"]);
    assert!(!ok && err.contains("404"), "no VMI, nothing to reboot: {err}");
}

/// The RFC 3339 time `s` (whole seconds, as `metav1.Time`).
fn time(s: &str) -> jiff::Timestamp {
    s.parse().unwrap_or_else(|e| panic!("{s:?} is not a time: {e}"))
}

/// The `LaunchFailed` Events (the node agent's, one per VMI): the VMI's UID and when, oldest
/// first.
fn launch_failures(up: &Up) -> Vec<(String, jiff::Timestamp)> {
    let events = up.json(&["get", "events"]);
    let mut out: Vec<(String, jiff::Timestamp)> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "LaunchFailed")
        .map(|e| {
            let at = e["firstTimestamp"].as_str().or_else(|| e["eventTime"].as_str()).unwrap();
            (e["involvedObject"]["uid"].as_str().unwrap().to_owned(), time(at))
        })
        .collect();
    out.sort_by_key(|(_, t)| *t);
    out
}

/// A VM whose VMIs fail before they run (its kernel file is missing: the node agent fails the
/// VMI at launch) goes into KubeVirt's crash loop: `printableStatus: CrashLoopBackOff`,
/// `status.startFailure` with a growing `consecutiveFailCount` and retry times whose delays grow
/// (10–15 s, then 40–60 s), no VMI started before its retry time. Once the kernel is there, the
/// next VMI runs and the record is cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_that_fails_at_once_is_restarted_with_growing_delays_until_it_runs() {
    let up = Up::start();
    let kernel = up.dir.path().join("vmlinuz-later");
    let missing = kernel.clone();
    up.vm_with("c1", move |vm| {
        vm["spec"]["template"]["spec"]["domain"]["firmware"]["kernelBoot"]["container"]["kernelPath"] = json!(missing);
    });
    let created = time(up.json(&["get", "vm", "c1"])["metadata"]["creationTimestamp"].as_str().unwrap());

    // The status as the controller wrote it at `count` failures.
    let failure = |count: u64| {
        let up = &up;
        async move {
            common::wait_until(Duration::from_secs(120), &format!("start failure {count} and CrashLoopBackOff"), || {
                let st = up.json(&["get", "vm", "c1"])["status"].clone();
                let hit =
                    (st["startFailure"]["consecutiveFailCount"] == count && st["printableStatus"] == "CrashLoopBackOff").then_some(st);
                async move { hit }
            })
            .await
        }
    };
    let first = failure(1).await;
    let retry1 = time(first["startFailure"]["retryAfterTimestamp"].as_str().unwrap());
    let second: Value = failure(2).await;
    let retry2 = time(second["startFailure"]["retryAfterTimestamp"].as_str().unwrap());
    assert_ne!(first["startFailure"]["lastFailedVMIUID"], second["startFailure"]["lastFailedVMIUID"], "two VMIs, each counted once");

    let fails = launch_failures(&up);
    assert_eq!(fails.len(), 2, "two launches failed so far: {fails:?}");
    assert_eq!(Some(fails[1].0.as_str()), second["startFailure"]["lastFailedVMIUID"].as_str());
    assert!(fails[0].1 >= created);
    // The first delay is KubeVirt's 10–15 s from the failure; the second VMI failed only after
    // the retry time (none was started earlier), and its delay is 40–60 s: the delays grow.
    // (Both times are whole seconds, and the controller sees a failure a little after the
    // agent's Event: a second of slack either way.)
    let d1 = fails[0].1.duration_until(retry1).as_secs();
    let d2 = fails[1].1.duration_until(retry2).as_secs();
    assert!((9..=20).contains(&d1), "first delay {d1} s");
    assert!(fails[1].1 >= retry1, "the second VMI failed at {} — before its retry time {retry1}", fails[1].1);
    assert!((39..=65).contains(&d2), "second delay {d2} s");

    // The kernel is put in place: the next VMI (after the second delay) runs, which ends the loop.
    std::fs::copy(common::guest::guest_dir().join("vmlinuz"), &kernel).unwrap();
    common::wait_until(Duration::from_secs(60) + common::up::BOOT, "a VMI that runs to clear the start failures", || {
        let st = up.json(&["get", "vm", "c1"])["status"].clone();
        let hit = (st["printableStatus"] == "Running" && st.get("startFailure").is_none()).then_some(());
        async move { hit }
    })
    .await;
    let uid = up.ready("c1").await;
    assert!(jiff::Timestamp::now() >= retry2, "the third VMI started after the second retry time");
    assert_eq!(launch_failures(&up).len(), 2, "no failure since");
    assert_eq!(up.serial_log(&uid).iter().filter(|l| l.starts_with("VP-BOOT")).count(), 1);
}
