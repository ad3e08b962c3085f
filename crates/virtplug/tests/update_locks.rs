//! The lock table of `client::update` holds entries only while someone holds or waits: after
//! 10,000 distinct objects were updated once each, it is empty. (Its own test binary, so no other
//! test's updates share the process-wide table.)

#![allow(clippy::unwrap_used)]

mod common;

use api::VirtualMachine;
use futures::StreamExt;
use kube::api::{Api, PostParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_objects_leave_no_lock_entries() {
    let s = common::TestServer::start().await;
    // In-process client: the same router, no TLS, so the test spends its time in the path under test.
    let api: Api<VirtualMachine> = Api::namespaced(client::in_process(s.server.local_router()), "default");
    let names: Vec<String> = (0..10_000).map(|i| format!("o{i:05}")).collect();
    futures::stream::iter(names.clone())
        .for_each_concurrent(64, |n| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &serde_json::from_value(common::vm(&n)).unwrap()).await.unwrap();
            }
        })
        .await;
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    futures::stream::iter(names)
        .for_each_concurrent(64, |n| {
            let (api, peak) = (api.clone(), std::sync::Arc::clone(&peak));
            async move {
                let r = client::update(&api, &n, |vm| vm.spec.run_strategy = Some("Always".into())).await.unwrap();
                assert!(r.wrote);
                peak.fetch_max(client::locks::entries(), std::sync::atomic::Ordering::Relaxed);
            }
        })
        .await;
    assert!(peak.load(std::sync::atomic::Ordering::Relaxed) > 1, "updates of different objects ran concurrently");
    assert_eq!(client::locks::entries(), 0, "no lock entries left");
}
