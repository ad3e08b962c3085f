//! Issue 14, class 5: what guests and retries can make grow stays bounded.
//! - A rebooting guest (the same Event again and again) leaves one Event with a count, as
//!   Kubernetes' event recorder does; distinct messages beyond a few are combined.
//! - Events expire after the API server's TTL (kube-apiserver's `--event-ttl`).
//! - A VMI asking for an emptyDisk or guest memory beyond what the node allows fails to start,
//!   saying which field, how much, the cap and the flag, before anything is created.
//!
//! Everything runs against the real API server on loopback (TLS, token) and the real node
//! agent; no QEMU is started (the refusals come before it).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::TestServer;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use api::{VirtualMachine, VirtualMachineInstance};
use client::events::{self, EventType};

const T: Duration = Duration::from_secs(30);

async fn vm(s: &TestServer, name: &str) -> VirtualMachine {
    let vms: Api<VirtualMachine> = Api::namespaced(s.client.clone(), "default");
    vms.create(&PostParams::default(), &serde_json::from_value(common::vm(name)).unwrap()).await.unwrap()
}

async fn events_about(s: &TestServer, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(s.client.clone(), "default");
    api.list(&ListParams::default()).await.unwrap().items.into_iter().filter(|e| e.involved_object.name.as_deref() == Some(name)).collect()
}

/// Regression (issue 14): each `publish` created a new Event, so a guest rebooting in a loop
/// grew the store by one Event per reboot, forever. Now: one Event, `count` = reboots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebooting_guest_leaves_one_event_with_a_count() {
    let s = TestServer::start().await;
    let guest = vm(&s, "rebooter").await;
    for _ in 0..200 {
        events::publish(&s.client, "virtplug-node", &guest, EventType::Normal, "GuestReboot", "the guest rebooted").await;
    }
    let evs = events_about(&s, "rebooter").await;
    assert_eq!(evs.len(), 1, "one Event for 200 reboots: {evs:#?}");
    let e = &evs[0];
    assert_eq!((e.count, e.reason.as_deref(), e.type_.as_deref()), (Some(200), Some("GuestReboot"), Some("Normal")));
    assert!(e.last_timestamp.as_ref().unwrap().0 >= e.first_timestamp.as_ref().unwrap().0);

    // Concurrent repeats (several workers of one process) queue on the key: still one Event.
    let other = vm(&s, "other").await;
    let all = (0..50).map(|_| events::publish(&s.client, "virtplug-node", &other, EventType::Warning, "VMICrashed", "QEMU exited"));
    futures::future::join_all(all).await;
    // A different reason, type or source is another Event, about the same object or not.
    events::publish(&s.client, "virtplug-node", &guest, EventType::Warning, "VMICrashed", "QEMU exited").await;
    events::publish(&s.client, "virtplug-controller", &guest, EventType::Normal, "GuestReboot", "the guest rebooted").await;
    let evs = events_about(&s, "other").await;
    assert_eq!(evs.iter().map(|e| e.count).collect::<Vec<_>>(), [Some(50)]);
    let mut counts: Vec<(String, String, i32)> = events_about(&s, "rebooter")
        .await
        .iter()
        .map(|e| (e.reason.clone().unwrap(), e.source.as_ref().and_then(|s| s.component.clone()).unwrap(), e.count.unwrap()))
        .collect();
    counts.sort();
    assert_eq!(
        counts,
        [
            ("GuestReboot".into(), "virtplug-controller".into(), 1),
            ("GuestReboot".into(), "virtplug-node".into(), 200),
            ("VMICrashed".into(), "virtplug-node".into(), 1)
        ]
    );

    // A retry loop whose message changes every time (an attempt number, a changing error):
    // beyond 9 distinct messages they are combined into one Event, as client-go's aggregator does.
    let retrier = vm(&s, "retrier").await;
    for i in 0..100 {
        events::publish(&s.client, "virtplug-node", &retrier, EventType::Warning, "LaunchFailed", &format!("attempt {i} failed")).await;
    }
    let evs = events_about(&s, "retrier").await;
    assert_eq!(evs.len(), events::AGGREGATE_MAX_MESSAGES, "{:#?}", evs.iter().map(|e| &e.message).collect::<Vec<_>>());
    let combined: Vec<&Event> = evs.iter().filter(|e| e.message.as_deref().is_some_and(|m| m.starts_with(events::COMBINED))).collect();
    assert_eq!(combined.len(), 1);
    assert_eq!(combined[0].count, Some(100 - 9));
    assert_eq!(combined[0].message.as_deref(), Some(format!("{}attempt 99 failed", events::COMBINED).as_str()));
    assert_eq!(evs.iter().filter_map(|e| e.count).sum::<i32>(), 100, "every occurrence is counted");
}

/// An Event deleted behind the recorder's back (the TTL, `kubectl delete`) is created anew on
/// the next occurrence, and someone else's write to it in between is not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorder_survives_deleted_and_concurrently_written_events() {
    let s = TestServer::start().await;
    let guest = vm(&s, "g").await;
    let publish = || events::publish(&s.client, "virtplug-node", &guest, EventType::Normal, "GuestReboot", "the guest rebooted");
    publish().await;
    publish().await;
    let api: Api<Event> = Api::namespaced(s.client.clone(), "default");
    let name = events_about(&s, "g").await[0].name_any();
    // Someone else bumps it (the cached resourceVersion is now stale): the next bump re-reads.
    api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"count": 10}))).await.unwrap();
    publish().await;
    let evs = events_about(&s, "g").await;
    assert_eq!((evs.len(), evs[0].count), (1, Some(11)));
    api.delete(&name, &Default::default()).await.unwrap();
    publish().await;
    let evs = events_about(&s, "g").await;
    assert_eq!((evs.len(), evs[0].count), (1, Some(1)), "a new Event after the old one was deleted");
    assert_ne!(evs[0].name_any(), name);
}

/// Regression (issue 14): Events were never deleted. Now an Event not seen for longer than the
/// TTL is deleted by the garbage collector's timer, and one still being bumped stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_not_seen_for_longer_than_the_ttl_are_deleted() {
    let ttl = Duration::from_secs(3);
    let s = TestServer::start_with(|c| c.event_ttl = Some(ttl)).await;
    let (quiet, busy) = (vm(&s, "quiet").await, vm(&s, "busy").await);
    events::publish(&s.client, "virtplug-node", &quiet, EventType::Normal, "GuestReboot", "the guest rebooted").await;
    assert_eq!(events_about(&s, "quiet").await.len(), 1);
    let start = std::time::Instant::now();
    let mut bumps = 0;
    common::wait_until(Duration::from_secs(30), "the quiet Event to expire", || {
        bumps += 1;
        let (s, busy) = (&s, &busy);
        async move {
            // `lastTimestamp` has whole seconds: bumping often keeps it well within the TTL.
            events::publish(&s.client, "virtplug-node", busy, EventType::Normal, "GuestReboot", "the guest rebooted").await;
            events_about(s, "quiet").await.is_empty().then_some(())
        }
    })
    .await;
    assert!(start.elapsed() >= ttl - Duration::from_secs(1), "expired after {:?}, before the TTL", start.elapsed());
    let busy = events_about(&s, "busy").await;
    assert_eq!(busy.len(), 1, "the Event still seen stays");
    assert!(busy[0].count.unwrap() >= 2);
    assert!(bumps >= 2);
}

/// The node agent on a temp data dir, without QEMU (nothing here gets that far).
struct Agent {
    s: TestServer,
    dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Agent {
    async fn start(caps: node::caps::Caps) -> Agent {
        let s = TestServer::start().await;
        let dir = tempfile::tempdir().unwrap();
        let mut config = node::agent::Config::new("node-t", dir.path());
        config.accel = qemu::accel::Accel::Tcg;
        config.caps = caps;
        config.kubelet_pods_dir = dir.path().join("pods");
        let client = client::in_process(s.server.local_router());
        common::fakenode::kubelet(&client, "node-t").await;
        let task = tokio::spawn(async move { node::agent::run(client, config).await.unwrap() });
        Agent { s, dir, task }
    }

    /// Creates a VMI scheduled onto this node (what the controller does) and waits for its phase.
    async fn run(&self, name: &str, memory: &str, empty_disk: &str) -> VirtualMachineInstance {
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(self.s.client.clone(), "default");
        let vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "labels": {"kubevirt.io/nodeName": "node-t"}},
            "spec": {"domain": {"memory": {"guest": memory}, "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
                     "volumes": [{"name": "root", "emptyDisk": {"capacity": empty_disk}}]}});
        vmis.create(&PostParams::default(), &serde_json::from_value(vmi).unwrap()).await.unwrap();
        let st = json!({"status": {"phase": "Scheduled", "nodeName": "node-t"}});
        vmis.patch_status(name, &PatchParams::default(), &Patch::Merge(st)).await.unwrap();
        common::wait_until(T, &format!("VMI {name} Failed"), || {
            let vmis = vmis.clone();
            async move { vmis.get(name).await.ok().filter(|v| v.phase() == Some(&api::phases::VmiPhase::Failed)) }
        })
        .await
    }

    fn images(&self) -> Vec<String> {
        fn walk(d: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    walk(&e.path(), out);
                } else if e.file_name().to_string_lossy().ends_with(".img") {
                    out.push(e.path().display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        walk(self.dir.path(), &mut out);
        out
    }
}

fn failure(vmi: &VirtualMachineInstance) -> String {
    let st = vmi.status.as_ref().unwrap();
    assert_eq!(st.reason.as_deref(), Some("LaunchFailed"));
    st.conditions.iter().find(|c| c.type_ == "Ready").and_then(|c| c.message.clone()).unwrap()
}

/// Regression (issue 14): the agent created an emptyDisk of any size (a sparse file the guest
/// could fill the host with) and started guests with any memory. Now a VMI beyond the node's
/// caps fails before anything is created, saying which field, how much, the cap and the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmi_beyond_the_node_caps_fails_with_the_reason_and_creates_nothing() {
    // Default emptyDisk cap (50 % of the free space); a fixed memory cap.
    let caps = node::caps::Caps { guest_memory: node::caps::Cap::Bytes(256 << 20), ..node::caps::Caps::default() };
    let a = Agent::start(caps).await;

    let disk = a.run("bigdisk", "128Mi", "1Pi").await;
    let msg = failure(&disk);
    for want in ["spec.volumes[0].emptyDisk.capacity", "1Pi", "50% of the", "free on the filesystem of", "--max-empty-disk"] {
        assert!(msg.contains(want), "{want:?} missing in: {msg}");
    }
    let mem = a.run("bigmem", "512Mi", "1Mi").await;
    let msg = failure(&mem);
    for want in ["spec.domain.memory.guest", "512Mi", "256.0 MiB", "--max-guest-memory"] {
        assert!(msg.contains(want), "{want:?} missing in: {msg}");
    }
    assert_eq!(a.images(), Vec::<String>::new(), "no image file was created");
    // Each refusal is also an Event on the VMI.
    for name in ["bigdisk", "bigmem"] {
        let evs = events_about(&a.s, name).await;
        assert!(evs.iter().any(|e| e.reason.as_deref() == Some("LaunchFailed") && e.type_.as_deref() == Some("Warning")), "{evs:#?}");
    }
}
