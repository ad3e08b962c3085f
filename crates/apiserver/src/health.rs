//! Liveness of the long-lived tasks a server depends on, for `/readyz` and for `virtplug up`.
//!
//! # Flow
//! Every long-lived task is started with [`Health::spawn`] under a component name (the garbage
//! collector, in `up` the controller and the node agent). The wrapper catches a panic of the
//! task (`catch_unwind` around the future, so a panic does not vanish into a `JoinHandle` nobody
//! awaits) and records the component as dead with the panic message, the error it returned, or
//! "stopped" when it returned at all: these tasks are meant to run until the process stops.
//! Threads (the store's writer) report through [`Health::fail`].
//!
//! # Guarantees
//! - A component that died stays dead in the registry: `/readyz` answers 503 naming it and the
//!   reason until the process restarts (nothing restarts a task in place).
//! - [`Health::first_failure`] resolves as soon as a component dies, however early (also when it
//!   died before the call).
//!
//! # Caveats
//! A task stopped on purpose (aborted at shutdown) is not recorded: dropping the future runs no
//! wrapper code past the abort point.
//!
//! # Fault injection (tests only)
//! `VIRTPLUG_FAULT=<component>[,<component>...]` makes the named components panic as they
//! start, so tests can check that a dying task is noticed; see [`injected`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

use futures::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The store's writer thread, as named in [`Health`] (and `VIRTPLUG_FAULT`).
pub const STORE_WRITER: &str = "store-writer";
/// The garbage collector task, likewise.
pub const GARBAGE_COLLECTOR: &str = "garbage-collector";
/// The task that serves stored CustomResourceDefinitions ([`crate::crd::run`]).
pub const CRD_ESTABLISHER: &str = "crd-establisher";

/// Why a component died.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub component: String,
    pub reason: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.component, self.reason)
    }
}

/// The registry; cheap to clone (clones share it).
#[derive(Clone)]
pub struct Health {
    /// Component name -> `None` while it runs, `Some(reason)` once it died.
    state: Arc<watch::Sender<BTreeMap<String, Option<String>>>>,
}

impl Default for Health {
    fn default() -> Self {
        Health { state: Arc::new(watch::channel(BTreeMap::new()).0) }
    }
}

impl Health {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `component` as running (it is listed by `/readyz?verbose`).
    pub fn register(&self, component: &str) {
        self.state.send_modify(|m| {
            m.entry(component.to_owned()).or_insert(None);
        });
    }

    /// Records that `component` died and why; logs it. The first reason recorded is kept.
    pub fn fail(&self, component: &str, reason: String) {
        tracing::error!("{component} {reason}; the server is no longer ready (/readyz answers 503)");
        self.state.send_modify(|m| {
            let entry = m.entry(component.to_owned()).or_insert(None);
            if entry.is_none() {
                *entry = Some(reason);
            }
        });
    }

    /// The components that died, in name order.
    #[must_use]
    pub fn failures(&self) -> Vec<Failure> {
        failures_of(&self.state.borrow())
    }

    /// Every component with its state (`None`: running).
    #[must_use]
    pub fn components(&self) -> Vec<(String, Option<String>)> {
        self.state.borrow().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Waits until a component has died (returns at once if one has).
    pub async fn first_failure(&self) -> Failure {
        let mut rx = self.state.subscribe();
        loop {
            if let Some(f) = failures_of(&rx.borrow_and_update()).into_iter().next() {
                return f;
            }
            // The sender lives in `self`, so `changed` cannot fail while we wait.
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Spawns the long-lived task `task` as `component`: a panic, an error or a return is
    /// recorded as its death (see the module docs). Aborting the handle stops it unrecorded.
    pub fn spawn<F, E>(&self, component: &'static str, task: F) -> JoinHandle<()>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::error::Error,
    {
        self.register(component);
        let health = self.clone();
        tokio::spawn(async move {
            let run = async move {
                if injected(component) {
                    panic!("fault injected by VIRTPLUG_FAULT={component}");
                }
                task.await
            };
            let reason = match AssertUnwindSafe(run).catch_unwind().await {
                Ok(Ok(())) => "stopped (it should run until the server stops)".to_owned(),
                Ok(Err(e)) => format!("failed: {}", error_chain(&e)),
                Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
            };
            health.fail(component, reason);
        })
    }
}

/// Runs `body` as the thread `component` (call it as the thread's whole body) and publishes why
/// it ended on `exit`: "stopped" when it returned, "panicked: ..." when it panicked. A test can
/// make it panic at once with `VIRTPLUG_FAULT` (see [`injected`]).
pub fn supervise_thread(component: &str, exit: &watch::Sender<Option<String>>, body: impl FnOnce()) {
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        if injected(component) {
            panic!("fault injected by VIRTPLUG_FAULT={component}");
        }
        body();
    }));
    let reason = match run {
        Ok(()) => "stopped".to_owned(),
        Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
    };
    // Nobody listening (every `Store` dropped) is the normal end: nothing to tell.
    let _ = exit.send(Some(reason));
}

fn failures_of(m: &BTreeMap<String, Option<String>>) -> Vec<Failure> {
    m.iter().filter_map(|(c, r)| r.as_ref().map(|r| Failure { component: c.clone(), reason: r.clone() })).collect()
}

pub use api::diag::error_chain;

pub use api::diag::panic_message;

/// Whether `VIRTPLUG_FAULT` (a comma-separated list, read once) names `component`. Test-only
/// fault injection: it lets an integration test kill a component of the real binary the way a
/// bug would, to check that the death is noticed. Unset in production, where it costs one
/// lookup per component start.
#[must_use]
pub fn injected(component: &str) -> bool {
    static FAULTS: OnceLock<Vec<String>> = OnceLock::new();
    FAULTS
        .get_or_init(|| std::env::var("VIRTPLUG_FAULT").map(|v| v.split(',').map(|s| s.trim().to_owned()).collect()).unwrap_or_default())
        .iter()
        .any(|f| f == component)
}

/// The body of `/readyz`: Kubernetes' format (`[+]name ok` / `[-]name failed: reason`, then a
/// verdict line). `detailed`: show the reasons (else "reason withheld", as kube-apiserver answers
/// clients that are not trusted with internals). Returns whether everything is alive.
#[must_use]
pub fn readyz_body(health: &Health, detailed: bool, verbose: bool) -> (bool, String) {
    let components = health.components();
    let ok = components.iter().all(|(_, r)| r.is_none());
    if ok && !verbose {
        return (true, "ok".to_owned());
    }
    let mut out = String::from("[+]ping ok\n");
    for (name, reason) in &components {
        match reason {
            None => {
                if verbose {
                    let _ = writeln!(out, "[+]{name} ok");
                }
            }
            Some(r) if detailed => {
                let _ = writeln!(out, "[-]{name} failed: {r}");
            }
            Some(_) => {
                let _ = writeln!(out, "[-]{name} failed: reason withheld");
            }
        }
    }
    out.push_str(if ok { "readyz check passed\n" } else { "readyz check failed\n" });
    (ok, out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[tokio::test]
    async fn a_panicking_task_is_recorded_with_its_message() {
        let h = Health::new();
        fn boom(n: u32) -> Result<(), std::convert::Infallible> {
            panic!("boom at {n}");
        }
        let t = h.spawn("doomed", async { boom(42) });
        assert!(t.await.is_ok(), "the wrapper itself does not panic");
        assert_eq!(h.first_failure().await, Failure { component: "doomed".into(), reason: "panicked: boom at 42".into() });
        let (ok, body) = readyz_body(&h, true, false);
        assert!(!ok);
        assert_eq!(body, "[+]ping ok\n[-]doomed failed: panicked: boom at 42\nreadyz check failed\n");
        assert_eq!(readyz_body(&h, false, false).1, "[+]ping ok\n[-]doomed failed: reason withheld\nreadyz check failed\n");
    }

    #[tokio::test]
    async fn an_error_or_a_return_is_a_death_and_an_abort_is_not() {
        let h = Health::new();
        h.spawn("erring", async { Err(Outer(std::io::Error::other("disk on fire"))) }).await.unwrap();
        h.spawn("returning", async { Ok::<(), Outer>(()) }).await.unwrap();
        let aborted = h.spawn("aborted", async {
            std::future::pending::<()>().await;
            Ok::<(), Outer>(())
        });
        aborted.abort();
        assert!(aborted.await.unwrap_err().is_cancelled());
        let f = h.failures();
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].reason, "failed: outer: disk on fire");
        assert_eq!(f[1].reason, "stopped (it should run until the server stops)");
        assert_eq!(readyz_body(&h, true, true).1.lines().next(), Some("[+]ping ok"));
        assert!(readyz_body(&h, true, true).1.contains("[+]aborted ok"));
    }

    #[tokio::test]
    async fn all_alive_is_ok() {
        let h = Health::new();
        h.register("gc");
        assert_eq!(readyz_body(&h, false, false), (true, "ok".to_owned()));
        assert_eq!(readyz_body(&h, false, true), (true, "[+]ping ok\n[+]gc ok\nreadyz check passed\n".to_owned()));
    }
}
