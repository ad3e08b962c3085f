//! Leader election against the real embedded API server: a leader whose Lease is taken stops its
//! work at its next renewal, and only one of two candidates works at a time.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::TestServer;
use controller::leader::{run_while_leading, Elector, Timings};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

const T: Duration = Duration::from_secs(20);

fn timings() -> Timings {
    Timings {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1400),
        retry_period: Duration::from_millis(200),
    }
}

/// Work that counts its ticks until it is dropped.
fn counting(ticks: &Arc<AtomicU64>) -> impl FnMut() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    let ticks = Arc::clone(ticks);
    move || {
        let ticks = Arc::clone(&ticks);
        Box::pin(async move {
            loop {
                ticks.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_taken_stops_working_and_the_other_takes_over() {
    let s = TestServer::start().await;
    let (ta, tb) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (la, mut ra) = tokio::sync::watch::channel(false);
    let (lb, mut rb) = tokio::sync::watch::channel(false);
    let a = Elector::new(s.client.clone(), "virtplug-system", "test-lease", "a", timings());
    let b = Elector::new(s.client.clone(), "virtplug-system", "test-lease", "b", timings());
    let (wa, wb) = (counting(&ta), counting(&tb));
    let run_a = tokio::spawn(async move { run_while_leading(&a, &la, wa).await });
    common::wait_until(T, "a to lead", || {
        let l = *ra.borrow_and_update();
        async move { l.then_some(()) }
    })
    .await;
    let run_b = tokio::spawn(async move { run_while_leading(&b, &lb, wb).await });

    // Someone else (an administrator, a controller with a skewed view) writes itself in: a sees it
    // at its next renewal and stops working at once.
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "virtplug-system");
    client::update(&leases, "test-lease", |l: &mut Lease| {
        l.spec.get_or_insert_with(Default::default).holder_identity = Some("intruder".to_owned());
    })
    .await
    .unwrap();
    common::wait_until(T, "a to notice it lost the Lease", || {
        let l = *ra.borrow_and_update();
        async move { (!l).then_some(()) }
    })
    .await;
    let stopped_at = ta.load(Ordering::SeqCst);
    // The intruder never renews: after the lease duration one of a and b takes the Lease over, and
    // from then on exactly one of them works.
    common::wait_until(T, "a or b to lead again after the intruder's lease expired", || {
        let (la, lb) = (*ra.borrow_and_update(), *rb.borrow_and_update());
        async move { (la || lb).then_some(()) }
    })
    .await;
    // Between losing the Lease and anyone leading again (the intruder's whole lease, 2 s: ~200
    // ticks had a kept working), a did no work beyond a tick or two at the hand-over.
    let a_since = ta.load(Ordering::SeqCst) - stopped_at;
    assert!(a_since <= 5, "a worked {a_since} ticks without the Lease");
    let holder = leases.get("test-lease").await.unwrap().spec.unwrap().holder_identity.unwrap();
    let (leader_ticks, other_ticks, other_was) = if holder == "a" { (&ta, &tb, 0) } else { (&tb, &ta, stopped_at) };
    let (l0, o0) = (leader_ticks.load(Ordering::SeqCst), other_ticks.load(Ordering::SeqCst));
    common::wait_until(T, "the leader's work to run", || {
        let now = leader_ticks.load(Ordering::SeqCst);
        async move { (now > l0 + 10).then_some(()) }
    })
    .await;
    assert_eq!(other_ticks.load(Ordering::SeqCst), o0, "the candidate that does not lead does no work");
    assert!(o0 >= other_was, "ticks only grow");
    run_a.abort();
    run_b.abort();
}
