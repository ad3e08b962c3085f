//! `client::patch_if` against the real API server: a patch lands only on the revision it was
//! planned from (a cached copy's too), a conflict re-plans on a fresh read, a refusal of an
//! unchanged object is not retried (both are 422 for a failed `test`: the resourceVersion tells
//! them apart).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use common::TestServer;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

use api::VirtualMachine;
use client::{MetaKey, PatchIfError, PatchIfOptions};

async fn vm(s: &TestServer) -> Api<VirtualMachine> {
    let vms: Api<VirtualMachine> = Api::namespaced(s.client.clone(), "default");
    vms.create(&PostParams::default(), &serde_json::from_value(common::vm("p")).unwrap()).await.unwrap();
    vms
}

/// A patch that appends `label` to the VM's `example.com/seen` annotation, planned from the
/// annotation as read (so a lost update would drop an earlier value).
fn append(vm: &VirtualMachine, label: &str) -> Result<Option<json_patch::Patch>, serde_json::Error> {
    let seen = vm.metadata.annotations.as_ref().and_then(|a| a.get("example.com/seen")).cloned().unwrap_or_default();
    let value = if seen.is_empty() { label.to_owned() } else { format!("{seen},{label}") };
    serde_json::from_value(json!([{"op": "add", "path": "/metadata/annotations", "value": {"example.com/seen": value}}])).map(Some)
}

fn hook(calls: &Arc<AtomicU32>, race: Option<Api<VirtualMachine>>) -> client::BeforeWrite {
    let calls = Arc::clone(calls);
    Arc::new(move |attempt| {
        calls.fetch_add(1, Ordering::SeqCst);
        let race = race.clone();
        Box::pin(async move {
            if let (Some(vms), 1) = (race, attempt) {
                client::blind_patch(&vms, "p", MetaKey::Annotation, "example.com/seen", Some("racer")).await.unwrap();
            }
        })
    })
}

#[tokio::test]
async fn a_concurrent_write_is_kept_and_the_patch_replanned_on_a_fresh_read() {
    let s = TestServer::start().await;
    let vms = vm(&s).await;
    let calls = Arc::new(AtomicU32::new(0));
    let opts = PatchIfOptions { before_write: Some(hook(&calls, Some(vms.clone()))), ..PatchIfOptions::default() };
    let done = client::patch_if(&vms, "p", &opts, |vm| append(vm, "mine")).await.unwrap();
    assert!(done.wrote);
    assert_eq!(done.attempts, 2, "the first patch hit the racer's write");
    let got = vms.get("p").await.unwrap();
    assert_eq!(got.metadata.annotations.unwrap()["example.com/seen"], "racer,mine", "planned again from the racer's value");
}

#[tokio::test]
async fn a_patch_from_a_cached_copy_lands_only_on_that_copys_revision() {
    let s = TestServer::start().await;
    let vms = vm(&s).await;
    // Current copy: its patch goes out at once and lands, without a read.
    let seen = vms.get("p").await.unwrap();
    let done = client::patch_if_seen(&vms, &seen, &PatchIfOptions::default(), |vm| append(vm, "one")).await.unwrap();
    assert!(done.wrote);
    assert_eq!(done.attempts, 0, "a current cached copy is written from as it is: no GET");
    // A copy a write behind (a watch cache that has not seen the racer's write yet): its patch
    // is refused by the resourceVersion test, re-planned on a fresh read, and keeps the racer's.
    let stale = vms.get("p").await.unwrap();
    client::blind_patch(&vms, "p", MetaKey::Annotation, "example.com/seen", Some("one,racer")).await.unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let opts = PatchIfOptions { before_write: Some(hook(&calls, None)), ..PatchIfOptions::default() };
    let done = client::patch_if_seen(&vms, &stale, &opts, |vm| append(vm, "two")).await.unwrap();
    assert!(done.wrote);
    assert_eq!((done.attempts, calls.load(Ordering::SeqCst)), (1, 2), "the stale copy's patch was refused, then re-planned on one read");
    let got = vms.get("p").await.unwrap();
    assert_eq!(
        got.metadata.annotations.unwrap()["example.com/seen"],
        "one,racer,two",
        "nothing lost: planned again from the racer's value"
    );
    // A plan that fails on the cached copy (here: it wants a value the copy does not have yet)
    // is tried again on a fresh read, which decides.
    let older = seen;
    let needs_racer = |vm: &VirtualMachine| {
        let has = vm.metadata.annotations.as_ref().is_some_and(|a| a["example.com/seen"].contains("racer"));
        if has {
            append(vm, "three")
        } else {
            Err(serde::de::Error::custom("no racer yet"))
        }
    };
    let done = client::patch_if_seen(&vms, &older, &PatchIfOptions::default(), needs_racer).await.unwrap();
    assert!(done.wrote && done.attempts == 1, "{done:?}");
    assert_eq!(vms.get("p").await.unwrap().metadata.annotations.unwrap()["example.com/seen"], "one,racer,two,three");
}

#[tokio::test]
async fn a_refused_patch_of_an_unchanged_object_is_not_retried() {
    let s = TestServer::start().await;
    let vms = vm(&s).await;
    let rev = s.revision();
    let calls = Arc::new(AtomicU32::new(0));
    let opts = PatchIfOptions { before_write: Some(hook(&calls, None)), ..PatchIfOptions::default() };
    // A disk without a volume: admission refuses the result (422, as a failed `test` would be).
    let bad = |_: &VirtualMachine| -> Result<Option<json_patch::Patch>, serde_json::Error> {
        serde_json::from_value(json!([{"op": "add", "path": "/spec/template/spec/domain/devices/disks/-", "value": {"name": "orphan", "disk": {"bus": "scsi"}}}])).map(Some)
    };
    let err = client::patch_if(&vms, "p", &opts, bad).await.unwrap_err();
    assert!(matches!(&err, PatchIfError::Refused { source: kube::Error::Api(e), .. } if e.code == 422), "{err:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one attempt: retrying cannot help");
    assert_eq!(s.revision(), rev, "nothing written");
}

#[tokio::test]
async fn nothing_to_do_sends_no_write_and_a_missing_object_is_reported() {
    let s = TestServer::start().await;
    let vms = vm(&s).await;
    let rev = s.revision();
    let none = |_: &VirtualMachine| -> Result<Option<json_patch::Patch>, serde_json::Error> { Ok(None) };
    let done = client::patch_if(&vms, "p", &PatchIfOptions::default(), none).await.unwrap();
    assert!(!done.wrote && done.object.is_some());
    assert_eq!(s.revision(), rev);
    let gone = client::patch_if(&vms, "nope", &PatchIfOptions::default(), |vm| append(vm, "x")).await.unwrap();
    assert!(!gone.wrote && gone.object.is_none());
    let seen: VirtualMachine = serde_json::from_value(serde_json::to_value(done.object.unwrap()).unwrap()).unwrap();
    let cached = client::patch_if_seen(&vms, &seen, &PatchIfOptions::default(), none).await.unwrap();
    assert_eq!(cached.attempts, 0, "planned nothing on the cached copy: no request at all");
    let _: Value = serde_json::to_value(cached.object).unwrap();
}
