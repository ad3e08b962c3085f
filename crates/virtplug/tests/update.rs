//! The one read-modify-write path, `client::update`, against the real embedded API server.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::VirtualMachine;
use client::{MetaKey, UpdateOptions};
use common::vmops::{boot_once, eject_media, insert_media, set_boot_order};
use common::{vm, TestServer};
use kube::api::{Api, Patch, PatchParams, PostParams};
use rand::Rng;

fn vms(c: &kube::Client) -> Api<VirtualMachine> {
    Api::namespaced(c.clone(), "default")
}

async fn create(api: &Api<VirtualMachine>, name: &str) {
    api.create(&PostParams::default(), &serde_json::from_value(vm(name)).unwrap()).await.unwrap();
}

fn names_of_disks(vm: &VirtualMachine) -> Vec<String> {
    vm.spec.template.spec.as_ref().unwrap().domain.devices.disks.iter().map(|d| d.name.clone()).collect()
}

fn names_of_volumes(vm: &VirtualMachine) -> Vec<String> {
    vm.spec.template.spec.as_ref().unwrap().volumes.iter().map(|v| v.name.clone()).collect()
}

fn violations(vm: &VirtualMachine) -> Vec<api::validation::Cause> {
    api::invariants::check(vm.spec.template.spec.as_ref().unwrap(), "spec.template.spec")
}

/// Regression test for the lost CD-ROM disk: a virtual-media insert lands between the boot-once
/// writer's read and its write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_once_racing_virtual_media_insert_loses_nothing() {
    let s = TestServer::start().await;
    let api = vms(&s.client);
    create(&api, "bmc").await;

    // --- The bug, with test-only code: a merge patch computed from a stale read, no resourceVersion.
    let stale = api.get("bmc").await.unwrap();
    let mut boot_once_version = stale.clone();
    boot_once(&mut boot_once_version, "root");
    set_boot_order(&mut boot_once_version, &["root", "cdrom0"]);
    let blind = client::merge_diff(&serde_json::to_value(&stale).unwrap(), &serde_json::to_value(&boot_once_version).unwrap());
    assert!(blind["spec"]["template"]["spec"]["domain"]["devices"]["disks"].is_array(), "the stale patch replaces the whole disks array");
    // Meanwhile the insert lands.
    client::update(&api, "bmc", |vm| insert_media(vm, "cdrom1", "iso")).await.unwrap();
    let after_insert = serde_json::to_value(api.get("bmc").await.unwrap()).unwrap();
    // A server without virtplug's admission check (KubeVirt) stores exactly this:
    let mut corrupted = after_insert.clone();
    json_patch::merge(&mut corrupted, &blind);
    let corrupted: VirtualMachine = serde_json::from_value(corrupted).unwrap();
    assert!(names_of_volumes(&corrupted).contains(&"cdrom1".to_owned()));
    assert!(!names_of_disks(&corrupted).contains(&"cdrom1".to_owned()), "the CD-ROM volume survives without its disk");
    assert_eq!(violations(&corrupted)[0].field, "spec.template.spec.volumes[1].name");
    // virtplug's server refuses that write outright (422 naming the field) instead of storing it.
    let e = api.patch("bmc", &PatchParams::default(), &Patch::Merge(&blind)).await.unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 422 && s.message.contains("volumes[1].name")), "{e}");

    // --- The fix: the same interleaving through `update`.
    client::update(&api, "bmc", |vm| eject_media(vm, "cdrom1")).await.unwrap();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let gate = Arc::new(tokio::sync::Mutex::new(Some((held_tx, release_rx))));
    let opts = UpdateOptions {
        before_write: Some(Arc::new(move |attempt| {
            let gate = Arc::clone(&gate);
            Box::pin(async move {
                // Only the first attempt is held: between its read and its write.
                if attempt == 1 {
                    if let Some((held, release)) = gate.lock().await.take() {
                        let _ = held.send(());
                        let _ = release.await;
                    }
                }
            })
        })),
        backoff_min: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
        ..UpdateOptions::default()
    };
    let boot_writer = {
        let api = api.clone();
        tokio::spawn(async move {
            client::try_update(&api, "bmc", &opts, |vm| {
                boot_once(vm, "root");
                Ok::<_, client::Never>(())
            })
            .await
        })
    };
    held_rx.await.unwrap();
    // The insert comes from another process in real life: write it without this process's lock.
    let mut current = api.get("bmc").await.unwrap();
    insert_media(&mut current, "cdrom0", "iso");
    api.replace("bmc", &PostParams::default(), &current).await.unwrap();
    release_tx.send(()).unwrap();
    let done = boot_writer.await.unwrap().unwrap();
    assert!(done.wrote);
    assert_eq!(done.attempts, 2, "the stale write was rejected and re-run on a fresh copy");

    let end = api.get("bmc").await.unwrap();
    assert!(violations(&end).is_empty(), "{:?}", violations(&end));
    assert!(names_of_disks(&end).contains(&"cdrom0".to_owned()) && names_of_volumes(&end).contains(&"cdrom0".to_owned()));
    let boot: BTreeMap<String, Option<u32>> =
        end.spec.template.spec.as_ref().unwrap().domain.devices.disks.iter().map(|d| (d.name.clone(), d.boot_order)).collect();
    assert_eq!(boot["root"], Some(1), "boot-once applied");
    assert!(boot["cdrom0"].is_some(), "the inserted drive got a boot order too: {boot:?}");
}

/// 24 VMs, writers per VM doing insert-media, eject-media, set-boot-order, boot-once and
/// annotation writes in random order and timing, 1,000 rounds in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torture_many_writers_keep_every_change_and_every_invariant() {
    let s = TestServer::start().await;
    let api = vms(&s.client);
    const VMS: usize = 24;
    const WRITERS: usize = 5; // two media writers, boot order, boot once, annotations
    const ROUNDS: usize = 1000;
    for v in 0..VMS {
        create(&api, &format!("t{v}")).await;
    }
    let per_writer = ROUNDS / (VMS * WRITERS) + 1;
    let mut tasks = Vec::new();
    for v in 0..VMS {
        for w in 0..WRITERS {
            let api = api.clone();
            tasks.push(tokio::spawn(async move {
                let name = format!("t{v}");
                // What this writer intends to be true at the end.
                let mut media: BTreeMap<String, bool> = BTreeMap::new();
                let mut annotations = BTreeSet::new();
                for round in 0..per_writer {
                    let pause = rand::rng().random_range(0..3);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    match w {
                        0 | 1 => {
                            let drive = format!("cd{w}-{}", rand::rng().random_range(0..3));
                            if rand::rng().random_bool(0.6) {
                                client::update(&api, &name, |vm| insert_media(vm, &drive, "iso")).await.unwrap();
                                media.insert(drive, true);
                            } else {
                                client::update(&api, &name, |vm| eject_media(vm, &drive)).await.unwrap();
                                media.entry(drive).and_modify(|m| *m = false);
                            }
                        }
                        2 => {
                            client::update(&api, &name, |vm| set_boot_order(vm, &["cd0-0", "root"])).await.unwrap();
                        }
                        3 => {
                            client::update(&api, &name, |vm| boot_once(vm, "root")).await.unwrap();
                        }
                        _ => {
                            // Blind single-key writes race with every update() on this VM.
                            let key = format!("example.com/n{round}");
                            client::blind_patch(&api, &name, MetaKey::Annotation, &key, Some("1")).await.unwrap();
                            annotations.insert(key);
                        }
                    }
                }
                (name, media, annotations)
            }));
        }
    }
    let mut expected: BTreeMap<String, (BTreeMap<String, bool>, BTreeSet<String>)> = BTreeMap::new();
    for t in tasks {
        let (name, media, annotations) = t.await.unwrap();
        let e = expected.entry(name).or_default();
        e.0.extend(media);
        e.1.extend(annotations);
    }
    for (name, (media, annotations)) in &expected {
        let vm = api.get(name).await.unwrap();
        assert!(violations(&vm).is_empty(), "{name}: {:?}", violations(&vm));
        let (disks, volumes) = (names_of_disks(&vm), names_of_volumes(&vm));
        for (drive, inserted) in media {
            assert!(disks.contains(drive), "{name}: drive {drive} kept its disk");
            assert_eq!(volumes.contains(drive), *inserted, "{name}: medium of {drive}");
        }
        let have = vm.metadata.annotations.clone().unwrap_or_default();
        for a in annotations {
            assert!(have.contains_key(a), "{name}: annotation {a} kept");
        }
    }
}

/// An external writer (`kubectl patch` in a loop, another process) races with `update`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_kubectl_writer_causes_counted_retries_and_loses_nothing() {
    let s = TestServer::start().await;
    let api = vms(&s.client);
    create(&api, "shared").await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let external_writes = Arc::new(AtomicUsize::new(0));
    let kubectl = {
        let (kc, stop, n) = (s.kubeconfig.clone(), Arc::clone(&stop), Arc::clone(&external_writes));
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) && i < 200 {
                let p = format!(r#"{{"metadata":{{"annotations":{{"ext-{i}":"1"}}}}}}"#);
                let out = std::process::Command::new("kubectl")
                    .args(["patch", "vm", "shared", "--type=merge", "-p", &p])
                    .env("KUBECONFIG", &kc)
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                n.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
            i
        })
    };
    let retried_before = client::metrics::get().conflicts_retried.get();
    let mut retries = 0;
    for i in 0..6 {
        // Hold the first attempt until kubectl has written after our read: a real race, made
        // certain instead of lucky. The count moves when a kubectl *process* exits, so the one
        // running now may have written before our read; the one after it started after this
        // hook did. Two more completed writes therefore include one that landed after our read
        // (waiting for one more made the test flaky under load: 4 of 6 raced).
        let (api2, n) = (api.clone(), Arc::clone(&external_writes));
        let opts = UpdateOptions {
            before_write: Some(Arc::new(move |attempt| {
                let n = Arc::clone(&n);
                let _ = &api2;
                Box::pin(async move {
                    if attempt == 1 {
                        let seen = n.load(Ordering::SeqCst);
                        common::wait_until(Duration::from_secs(20), "an external kubectl write", || {
                            let now = n.load(Ordering::SeqCst);
                            async move { (now >= seen + 2).then_some(()) }
                        })
                        .await;
                    }
                })
            })),
            ..UpdateOptions::default()
        };
        let key = format!("int-{i}");
        let done = client::try_update(&api, "shared", &opts, |vm| {
            vm.metadata.annotations.get_or_insert_with(Default::default).insert(key.clone(), "1".into());
            insert_media(vm, &format!("cd{i}"), "iso");
            Ok::<_, client::Never>(())
        })
        .await
        .unwrap();
        retries += done.attempts - 1;
    }
    stop.store(true, Ordering::SeqCst);
    let ext = kubectl.join().unwrap();
    assert!(retries >= 6, "every update was raced at least once: {retries}");
    assert!(client::metrics::get().conflicts_retried.get() - retried_before >= u64::from(retries), "retries are counted");
    let end = api.get("shared").await.unwrap();
    let ann = end.metadata.annotations.clone().unwrap();
    for i in 0..ext {
        assert!(ann.contains_key(&format!("ext-{i}")), "kubectl's write ext-{i} kept");
    }
    for i in 0..6 {
        assert!(ann.contains_key(&format!("int-{i}")), "update's write int-{i} kept");
        assert!(names_of_volumes(&end).contains(&format!("cd{i}")));
    }
    assert!(violations(&end).is_empty());
}

/// A writer that always wins: `update` gives up with the Conflict and never overwrites.
#[tokio::test]
async fn gives_up_with_the_conflict_after_the_attempt_limit() {
    let s = TestServer::start().await;
    let api = vms(&s.client);
    create(&api, "contested").await;
    let winner = api.clone();
    let opts = UpdateOptions {
        attempts: 5,
        backoff_min: Duration::from_millis(1),
        backoff_max: Duration::from_millis(2),
        before_write: Some(Arc::new(move |attempt| {
            let winner = winner.clone();
            Box::pin(async move {
                let v = format!("{attempt}");
                client::blind_patch(&winner, "contested", MetaKey::Label, "winner", Some(&v)).await.unwrap();
            })
        })),
        ..UpdateOptions::default()
    };
    let e = client::try_update(&api, "contested", &opts, |vm| {
        vm.spec.run_strategy = Some("Always".into());
        Ok::<_, client::Never>(())
    })
    .await
    .unwrap_err();
    assert!(e.is_conflict(), "{e}");
    assert!(e.to_string().contains("gave up after 5 attempts"), "{e}");
    let end = api.get("contested").await.unwrap();
    assert_eq!(end.spec.run_strategy.as_deref(), Some("Halted"), "nothing overwritten");
    assert_eq!(end.metadata.labels.unwrap()["winner"], "5");
}

/// A mutation that changes nothing sends no write (requests counted at the server).
#[tokio::test]
async fn a_mutation_that_changes_nothing_sends_no_request() {
    let s = TestServer::start().await;
    let counts: Arc<std::sync::Mutex<BTreeMap<String, usize>>> = Arc::default();
    let router = {
        let counts = Arc::clone(&counts);
        s.server.local_router().layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
            let counts = Arc::clone(&counts);
            async move {
                *counts.lock().unwrap().entry(req.method().to_string()).or_default() += 1;
                next.run(req).await
            }
        }))
    };
    let api = vms(&client::in_process(router));
    create(&api, "still").await;
    counts.lock().unwrap().clear();
    let r = client::update(&api, "still", |vm| {
        let same = vm.spec.run_strategy.clone();
        vm.spec.run_strategy = same;
    })
    .await
    .unwrap();
    assert!(!r.wrote);
    assert_eq!(r.attempts, 1);
    assert_eq!(*counts.lock().unwrap(), BTreeMap::from([("GET".to_owned(), 1)]), "one read, no write");
    let r = client::update(&api, "still", |vm| vm.spec.run_strategy = Some("Always".into())).await.unwrap();
    assert!(r.wrote);
    assert_eq!(counts.lock().unwrap().get("PATCH"), Some(&1));
}
