#![allow(clippy::unwrap_used)]

use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::*;

/// The real API server, in process, with its data in `dir` (and the TLS provider the import's
/// HTTP client needs).
async fn api_server(dir: &std::path::Path) -> (apiserver::Server, kube::Client) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (server, router) = apiserver::testing::open(dir, None).await;
    (server, client::in_process(router))
}

/// Creates DataVolume `d` (1 MiB from `url`) and its claim, bound.
async fn bound_dv(client: &kube::Client, url: &str) -> DataVolume {
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), "default");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let dv: DataVolume = serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "d", "namespace": "default"},
        "spec": {"source": {"http": {"url": url}}, "storage": {"resources": {"requests": {"storage": "1Mi"}}}}}))
    .unwrap();
    let dv = dvs.create(&PostParams::default(), &dv).await.unwrap();
    let mut claim = claim_for(&dv).unwrap();
    claim.metadata.namespace = Some("default".into());
    pvcs.create(&PostParams::default(), &claim).await.unwrap();
    pvcs.patch_status("d", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Bound"}}))).await.unwrap();
    dv
}

fn phase(dv: &DataVolume) -> Option<DataVolumePhase> {
    dv.status.as_ref().and_then(|s| s.phase.clone())
}

/// The race a loaded CI run hit: an attempt writes `Failed` and lifts its gate while a
/// reconcile woken by the attempt's earlier `ImportInProgress` holds the copy from before
/// `Failed`. That reconcile wrote `ImportScheduled` over `Failed` and fetched the source
/// again; it must leave a finished import (`Failed` or `Succeeded`) as it is.
#[tokio::test]
async fn a_reconcile_holding_a_copy_from_before_the_outcome_starts_no_new_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, client) = api_server(&dir.path().join("api")).await;
    let config = ImportConfig { max_retries: 0, ..ImportConfig::default() };
    let (_running, running) = tokio::sync::watch::channel(());
    let ctx = Arc::new(Ctx::new(client.clone(), dir.path().join("storage"), config, running).unwrap());
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), "default");
    // Port 9 on loopback: refused by the network policy before any connection.
    bound_dv(&client, "http://127.0.0.1:9/disk.raw").await;

    // A fresh copy starts an attempt, which fails for good (the host is refused).
    let before = dvs.get("d").await.unwrap();
    reconcile_once(Arc::new(before.clone()), Arc::clone(&ctx)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        let now = dvs.get("d").await.unwrap();
        if phase(&now) == Some(DataVolumePhase::Failed) && ctx.gates.lock().unwrap().is_empty() {
            break now;
        }
        assert!(Instant::now() < deadline, "timed out after 30 s waiting for the attempt to fail and lift its gate: {:?}", now.status);
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    // The copy from before `Failed` schedules nothing and rewrites nothing.
    reconcile_once(Arc::new(before.clone()), Arc::clone(&ctx)).await.unwrap();
    let after = dvs.get("d").await.unwrap();
    assert_eq!(phase(&after), Some(DataVolumePhase::Failed), "{:?}", after.status);
    assert_eq!(after.metadata.resource_version, failed.metadata.resource_version, "nothing was written");
    assert!(ctx.gates.lock().unwrap().is_empty(), "no attempt holds the gate");

    // Nor after `Succeeded`.
    dvs.patch_status("d", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Succeeded"}}))).await.unwrap();
    let done = dvs.get("d").await.unwrap();
    reconcile_once(Arc::new(before), Arc::clone(&ctx)).await.unwrap();
    let after = dvs.get("d").await.unwrap();
    assert_eq!(phase(&after), Some(DataVolumePhase::Succeeded), "{:?}", after.status);
    assert_eq!(after.metadata.resource_version, done.metadata.resource_version, "nothing was written");
    assert!(ctx.gates.lock().unwrap().is_empty(), "no attempt holds the gate");
}

/// An attempt's outcome is the one write nothing else redoes: when the API server refuses it
/// (here three times, 503), it is sent again until it is written, and no reconcile of the
/// meanwhile unfinished DataVolume starts a second attempt. It used to be dropped, leaving the
/// DataVolume `ImportInProgress`.
#[tokio::test]
async fn a_refused_outcome_is_written_again_until_it_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let refusals = apiserver::testing::Refusals::first(3, |_, path, body| path.ends_with("/status") && body.contains("\"Failed\""));
    let (_server, router) = apiserver::testing::open(&dir.path().join("api"), Some(Arc::clone(&refusals))).await;
    let client = client::in_process(router);
    let config = ImportConfig { max_retries: 0, ..ImportConfig::default() };
    let (_running, running) = tokio::sync::watch::channel(());
    let ctx = Arc::new(Ctx::new(client.clone(), dir.path().join("storage"), config, running).unwrap());
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), "default");
    // Port 9 on loopback: refused by the network policy, a failure for good.
    let dv = bound_dv(&client, "http://127.0.0.1:9/disk.raw").await;

    reconcile_once(Arc::new(dv), Arc::clone(&ctx)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        // The gate is read before the DataVolume: it is lifted only once `Failed` is stored, so
        // a lifted gate and an unfinished DataVolume read after it mean a reconcile could start
        // a second attempt while the outcome is still being written.
        let gated = !ctx.gates.lock().unwrap().is_empty();
        let now = dvs.get("d").await.unwrap();
        if phase(&now) == Some(DataVolumePhase::Failed) && !gated {
            break now;
        }
        assert!(gated, "the gate was lifted while the DataVolume is {:?}: writes {:?}", phase(&now), refusals.seen());
        // As the controller would on each change: reconcile the fresh copy, which the gate keeps
        // from starting another attempt.
        reconcile_once(Arc::new(now.clone()), Arc::clone(&ctx)).await.unwrap();
        assert!(
            Instant::now() < deadline,
            "timed out after 30 s waiting for the refused `Failed` to be written again: {:?}; writes {:?}",
            now.status,
            refusals.seen()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let conditions = &failed.status.as_ref().unwrap().conditions;
    assert!(conditions.iter().any(|c| c.type_ == "Ready" && c.status == "False"), "{conditions:?}");
    let status_writes: Vec<_> = refusals.seen().into_iter().filter(|w| w.path.ends_with("/status")).collect();
    let refused = status_writes.iter().filter(|w| w.refused).count();
    let outcomes = status_writes.iter().filter(|w| w.body.contains("\"Failed\"")).count();
    assert_eq!((refused, outcomes), (3, 4), "3 refused, the 4th stored: {status_writes:?}");
}

/// An outcome is never written over another: a retry's write sent again after a later
/// attempt finished (the API was away meanwhile) leaves `Succeeded` as it is, and a
/// `Failed` neither lands on it.
#[tokio::test]
async fn an_outcome_is_never_written_over_a_finished_import() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, client) = api_server(&dir.path().join("api")).await;
    let (_running, running) = tokio::sync::watch::channel(());
    let ctx = Ctx::new(client.clone(), dir.path().join("storage"), ImportConfig::default(), running).unwrap();
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), "default");
    bound_dv(&client, "http://127.0.0.1:9/disk.raw").await;
    dvs.patch_status("d", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Succeeded"}}))).await.unwrap();
    let done = dvs.get("d").await.unwrap();

    let retry = write_outcome(&ctx, &dvs, &done, "retry", Some(Duration::from_secs(1)), |s| {
        s.phase = Some(DataVolumePhase::ImportScheduled);
        s.restart_count = Some(1);
    });
    assert!(!retry.await, "the retry was written over Succeeded");
    assert!(!write_outcome(&ctx, &dvs, &done, "failure", None, |s| failed(s, "late")).await);
    let now = dvs.get("d").await.unwrap();
    assert_eq!(phase(&now), Some(DataVolumePhase::Succeeded));
    assert_eq!(now.metadata.resource_version, done.metadata.resource_version, "nothing was written");
}

/// A retry's write refused for longer than the retry's delay (the API away, then back): no
/// reconcile starts an attempt before that write is stored, and then exactly one more attempt
/// runs. A gate set once, before the write's first send, expired while the write was being
/// refused, and the late write then landed over the attempt that had started meanwhile.
#[tokio::test]
async fn a_retry_written_late_starts_exactly_one_more_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Only the retry's write carries `restartCount`; three refusals take `persist` ~0.7 s of
    // backoff, well past the retry's 0.2 s delay.
    let refusals = apiserver::testing::Refusals::first(3, |_, path, body| path.ends_with("/status") && body.contains("restartCount"));
    let (_server, router) = apiserver::testing::open(&dir.path().join("api"), Some(Arc::clone(&refusals))).await;
    let client = client::in_process(router);
    let delay = Duration::from_millis(200);
    // Loopback allowed, on a port nothing listens on: each attempt's connection is refused, a
    // failure an attempt retries.
    let allow_hosts = vec!["127.0.0.1".parse().unwrap()];
    let config = ImportConfig { max_retries: 1, backoff_base: delay, backoff_cap: delay, allow_hosts, ..ImportConfig::default() };
    let (_running, running) = tokio::sync::watch::channel(());
    let ctx = Arc::new(Ctx::new(client.clone(), dir.path().join("storage"), config, running).unwrap());
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), "default");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dv = bound_dv(&client, &format!("http://{closed}/disk.raw")).await;
    let uid = dv.uid().unwrap();

    reconcile_once(Arc::new(dv), Arc::clone(&ctx)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        // The gate is read before the DataVolume (see the test above).
        let open = ctx.gates.lock().unwrap().get(&uid).is_none_or(|at| *at <= Instant::now());
        let now = dvs.get("d").await.unwrap();
        let retry_stored = now.status.as_ref().and_then(|s| s.restart_count) == Some(1);
        if phase(&now) == Some(DataVolumePhase::Failed) && ctx.gates.lock().unwrap().is_empty() {
            break now;
        }
        assert!(
            !open || retry_stored || phase(&now) == Some(DataVolumePhase::Failed),
            "the gate opened before the retry's write was stored ({:?}): writes {:?}",
            now.status,
            refusals.seen()
        );
        // As the controller would on each change: reconcile the fresh copy.
        reconcile_once(Arc::new(now.clone()), Arc::clone(&ctx)).await.unwrap();
        assert!(Instant::now() < deadline, "timed out after 30 s waiting for the second attempt to fail: {:?}", now.status);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(failed.status.as_ref().and_then(|s| s.restart_count), Some(1), "{:?}", failed.status);
    let refused = refusals.seen().iter().filter(|w| w.refused).count();
    assert_eq!(refused, 3, "the retry's write was refused three times, then stored");
    // Two attempts in all: one retry announced, then one failure.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let counts: Vec<_> = events.list(&Default::default()).await.unwrap().items.into_iter().map(|e| (e.reason, e.count)).collect();
    let count = |reason: &str| counts.iter().filter(|(r, _)| r.as_deref() == Some(reason)).map(|(_, c)| c.unwrap_or(1)).sum::<i32>();
    assert_eq!((count("ImportRetry"), count("ImportFailed")), (1, 1), "{counts:?}");
}
