#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;
use tokio::sync::{mpsc, Semaphore};

use super::*;

/// How a test's reconciler answers the `n`th reconcile of an object.
type Answer = Box<dyn Fn(&str, usize) -> Result<Action, String> + Send + Sync>;

/// What each test's reconciler saw and how it answers.
struct Probe {
    /// (name, the `n` label's value) of each reconcile, in start order.
    started: Mutex<Vec<(String, String)>>,
    /// Reconciles running now, by name, and the most ever running for one name.
    running: Mutex<HashMap<String, usize>>,
    most_at_once: Mutex<usize>,
    /// Each reconcile takes a permit before it returns (a test holds them to keep one running).
    gate: Semaphore,
    /// Tells the test each start.
    tx: mpsc::UnboundedSender<String>,
    answer: Answer,
}

const DEADLINE: Duration = Duration::from_secs(20);

async fn next_start(rx: &mut mpsc::UnboundedReceiver<String>, what: &str) -> String {
    tokio::time::timeout(DEADLINE, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no reconcile within {DEADLINE:?}: waited for {what}"))
        .unwrap()
}

async fn reconcile(cm: Arc<ConfigMap>, p: Arc<Probe>) -> Result<Action, String> {
    let name = cm.name_any();
    let n = cm.labels().get("n").cloned().unwrap_or_default();
    let count = {
        let mut s = p.started.lock().unwrap();
        s.push((name.clone(), n));
        s.iter().filter(|(x, _)| *x == name).count()
    };
    {
        let mut r = p.running.lock().unwrap();
        let now = r.entry(name.clone()).or_default();
        *now += 1;
        let mut most = p.most_at_once.lock().unwrap();
        *most = (*most).max(*now);
    }
    p.tx.send(name.clone()).unwrap();
    p.gate.acquire().await.unwrap().forget();
    *p.running.lock().unwrap().get_mut(&name).unwrap() -= 1;
    (p.answer)(&name, count)
}

#[allow(clippy::needless_pass_by_value)]
fn error_policy(_: Arc<ConfigMap>, _: &String, _: Arc<Probe>) -> Action {
    Action::requeue(Duration::from_millis(20))
}

struct Setup {
    _dir: tempfile::TempDir,
    _server: apiserver::Server,
    cms: Api<ConfigMap>,
    probe: Arc<Probe>,
    rx: mpsc::UnboundedReceiver<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn cm(cms: &Api<ConfigMap>, name: &str, n: u32) {
    let c: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"n": n.to_string()}}})).unwrap();
    cms.create(&PostParams::default(), &c).await.unwrap();
}

async fn relabel(cms: &Api<ConfigMap>, name: &str, n: u32) {
    cms.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"n": n.to_string()}}}))).await.unwrap();
}

/// The real API server in process, `before` ConfigMaps created, then a runner over ConfigMaps
/// whose reconciles each wait for a permit (`permits` given at the start).
async fn setup(before: &[&str], permits: usize, answer: impl Fn(&str, usize) -> Result<Action, String> + Send + Sync + 'static) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (server, router) = apiserver::testing::open(dir.path(), None).await;
    let client = client::in_process(router);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in before {
        cm(&cms, name, 0).await;
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let probe = Arc::new(Probe {
        started: Mutex::default(),
        running: Mutex::default(),
        most_at_once: Mutex::new(0),
        gate: Semaphore::new(permits),
        tx,
        answer: Box::new(answer),
    });
    let runner = Runner::new(Api::<ConfigMap>::all(client), watcher::Config::default());
    let task = tokio::spawn(runner.run(reconcile, error_policy, Arc::clone(&probe)));
    Setup { _dir: dir, _server: server, cms, probe, rx, task }
}

#[tokio::test]
async fn objects_listed_at_start_are_each_reconciled_once_the_store_holds_them() {
    let mut s = setup(&["a", "b", "c"], 100, |_, _| Ok(Action::await_change())).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(next_start(&mut s.rx, "the listed ConfigMaps' first reconciles").await);
    }
    seen.sort();
    assert_eq!(seen, ["a", "b", "c"]);
    // A change after the list: reconciled once more, with the change in hand.
    relabel(&s.cms, "b", 7).await;
    assert_eq!(next_start(&mut s.rx, "b's reconcile after its change").await, "b");
    assert_eq!(s.probe.started.lock().unwrap().last().unwrap(), &("b".to_owned(), "7".to_owned()));
}

/// While one reconcile of an object runs, its changes wait: one more reconcile when it ends,
/// with the last of them, never two of the same object at once.
#[tokio::test]
async fn changes_during_a_reconcile_run_it_once_more_after_it_with_the_latest_object() {
    let mut s = setup(&[], 0, |_, _| Ok(Action::await_change())).await;
    cm(&s.cms, "x", 1).await;
    assert_eq!(next_start(&mut s.rx, "x's first reconcile").await, "x");
    for n in 2..=4 {
        relabel(&s.cms, "x", n).await;
    }
    // The store is filled by the same watch that triggers: the changes are in it once a
    // reconcile of another object, created after them, starts.
    cm(&s.cms, "marker", 0).await;
    assert_eq!(next_start(&mut s.rx, "the marker's reconcile").await, "marker");
    assert_eq!(s.probe.started.lock().unwrap().iter().filter(|(n, _)| n == "x").count(), 1, "x ran again while it ran");
    s.probe.gate.add_permits(100);
    assert_eq!(next_start(&mut s.rx, "x's reconcile after the one that held its changes").await, "x");
    let starts = s.probe.started.lock().unwrap().clone();
    let x: Vec<&str> = starts.iter().filter(|(n, _)| n == "x").map(|(_, v)| v.as_str()).collect();
    assert_eq!(x, ["1", "4"], "x's reconciles and the label each saw");
    assert_eq!(*s.probe.most_at_once.lock().unwrap(), 1);
}

/// A requeue runs the object again with no change; an error's requeue comes from the error
/// policy.
#[tokio::test]
async fn requeues_and_error_policies_run_it_again() {
    let mut s = setup(&[], 100, |name, count| match (name, count) {
        ("r", 1) => Ok(Action::requeue(Duration::from_millis(30))),
        ("e", 1) => Err("refused".to_owned()),
        _ => Ok(Action::await_change()),
    })
    .await;
    cm(&s.cms, "r", 0).await;
    assert_eq!(next_start(&mut s.rx, "r's first reconcile").await, "r");
    assert_eq!(next_start(&mut s.rx, "r's requeue").await, "r");
    cm(&s.cms, "e", 0).await;
    assert_eq!(next_start(&mut s.rx, "e's first reconcile").await, "e");
    assert_eq!(next_start(&mut s.rx, "e's retry from the error policy").await, "e");
    let count = |name: &str| s.probe.started.lock().unwrap().iter().filter(|(n, _)| n == name).count();
    assert_eq!((count("r"), count("e")), (2, 2));
}

/// A trigger before a requeue is due runs the object now and drops the requeue (the run it
/// starts says what comes next); a trigger while it runs is remembered, not started.
#[test]
fn a_trigger_replaces_a_pending_requeue_and_waits_for_a_running_reconcile() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let _guard = rt.enter();
    let mut state = State::<ConfigMap, String>::new(reflector::store().0);
    let r = ObjectRef::<ConfigMap>::new("x").within("default");
    assert_eq!(state.finished(r.clone(), Action::requeue(Duration::from_secs(3600))), None);
    assert_eq!(state.timers.len(), 1);
    assert_eq!(state.trigger(r.clone(), true), Some(r.clone()));
    assert!(state.timers.is_empty() && state.timer_keys.is_empty(), "the hour's requeue is dropped");
    state.running.insert(r.clone(), false);
    assert_eq!(state.trigger(r.clone(), true), None, "started while it runs");
    assert_eq!(state.finished(r.clone(), Action::requeue(Duration::from_secs(3600))), Some(r.clone()), "run again at once");
    assert!(state.timers.is_empty(), "the run it starts says what comes next");
    assert_eq!(state.trigger(r.clone(), false), None);
    assert_eq!(state.trigger(r.clone(), false), None);
    assert_eq!(state.before_ready.len(), 1, "held once until the store is ready");
    assert!(state.before_ready.contains(&r));
}

/// An object deleted before its reconcile could start is not reconciled; the others are.
#[tokio::test]
async fn a_deleted_object_is_not_reconciled() {
    let mut s = setup(&[], 0, |_, _| Ok(Action::await_change())).await;
    cm(&s.cms, "held", 0).await;
    assert_eq!(next_start(&mut s.rx, "held's first reconcile").await, "held");
    // A change while it runs queues one more run; the deletion then takes it out of the store.
    relabel(&s.cms, "held", 1).await;
    s.cms.delete("held", &DeleteParams::default()).await.unwrap();
    cm(&s.cms, "marker", 0).await;
    assert_eq!(next_start(&mut s.rx, "the marker's reconcile (after the deletion in the watch)").await, "marker");
    s.probe.gate.add_permits(100);
    cm(&s.cms, "after", 0).await;
    assert_eq!(next_start(&mut s.rx, "the reconcile of a ConfigMap created after the deletion").await, "after");
    let names: Vec<String> = s.probe.started.lock().unwrap().iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, ["held", "marker", "after"]);
}
