//! The executor against the scripted QEMU ([`qemu::qmp::fake::Fake`]) and recording effects: what
//! it sends QEMU, what it writes (write by write) and which Events it raises, in order.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::phases::{VolumePhase, VolumeReason};
use qemu::qmp::fake::Fake;
use qemu::{DeviceKind, Inventory, Machine, UNPLUG_DEADLINE};
use serde_json::json;

use super::effects::Effects;
use super::execute::Pass;
use super::plan::{Attach, Step, Target};
use super::status::Change;
use super::waiting::Volumes;
use crate::backoff::Backoff;
use crate::bindmount::{Privileged, Recorder, Request, Vm};
use crate::claims::Claim;
use crate::reasons::EventReason;
use crate::source::{Opened, SourceError};

/// What the executor did outside QEMU, in order.
#[derive(Clone, Debug, PartialEq)]
enum Did {
    /// One status write: its batches' changes, in order.
    Wrote(Vec<Change>),
    Raised(EventReason, String),
}

/// Recording effects: sources are image files in a temp dir (opened with the disk's mode);
/// the claims named in `not_ready` are not bound.
struct Recorded {
    dir: tempfile::TempDir,
    not_ready: Vec<String>,
    did: Mutex<Vec<Did>>,
    /// When set, each write first takes a permit (a write the test holds back: a slow API).
    gate: Option<Arc<tokio::sync::Semaphore>>,
    /// Per write, when each of its batches says its changes were reached, in order.
    stamps: Mutex<Vec<Vec<jiff::Timestamp>>>,
    /// The write (0: the first) the API fails, and the writes tried so far.
    refuse: Option<usize>,
    tried: Mutex<usize>,
}

impl Recorded {
    fn new() -> Recorded {
        Recorded {
            dir: tempfile::tempdir().unwrap(),
            not_ready: Vec::new(),
            did: Mutex::default(),
            gate: None,
            stamps: Mutex::default(),
            refuse: None,
            tried: Mutex::default(),
        }
    }

    fn did(&self) -> Vec<Did> {
        self.did.lock().unwrap().clone()
    }

    /// The writes, each as (volume, phase or "removed").
    fn writes(&self) -> Vec<Vec<(String, String)>> {
        let summary = |c: &Change| match c {
            Change::Set { volume, phase, .. } => (volume.clone(), phase.to_string()),
            Change::Remove(volume) => (volume.clone(), "removed".into()),
        };
        self.did()
            .iter()
            .filter_map(|d| match d {
                Did::Wrote(w) => Some(w.iter().map(summary).collect()),
                Did::Raised(..) => None,
            })
            .collect()
    }
}

impl Effects for Recorded {
    async fn open(&self, a: &Attach) -> Result<Opened, SourceError> {
        if self.not_ready.contains(&a.claim.name) {
            return Err(SourceError::NotReady(format!("claim {} is not bound yet", a.claim.name)));
        }
        let path = self.dir.path().join(format!("{}.img", a.volume));
        std::fs::write(&path, [0u8; 512]).unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(!a.readonly).open(&path).unwrap();
        Ok(Opened { fd: f.into(), path, block: false })
    }

    async fn write(&self, batches: Vec<(Vec<Change>, jiff::Timestamp)>) -> bool {
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        let n = {
            let mut tried = self.tried.lock().unwrap();
            *tried += 1;
            *tried - 1
        };
        if self.refuse == Some(n) {
            return false;
        }
        self.stamps.lock().unwrap().push(batches.iter().map(|(_, at)| *at).collect());
        self.did.lock().unwrap().push(Did::Wrote(batches.into_iter().flat_map(|(changes, _)| changes).collect()));
        true
    }

    async fn event(&self, reason: EventReason, message: String) {
        self.did.lock().unwrap().push(Did::Raised(reason, message));
    }
}

const BACKOFF: Backoff = Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(2), deadline: Duration::from_secs(5) };

fn qemu() -> (Arc<Fake>, Machine) {
    let fake = Arc::new(Fake::new());
    (Arc::clone(&fake), Machine::new(Arc::clone(&fake)))
}

/// The attach of disk `volume` from claim `volume` (also the kept inventory's tests' step).
pub(super) fn disk(volume: &str) -> Step {
    Step::Attach(Attach {
        volume: volume.into(),
        claim: Claim { name: volume.into(), data_volume: false },
        readonly: false,
        target: Target::Device { kind: DeviceKind::Disk, serial: volume.into() },
        attach_pod: None,
    })
}

/// Runs `steps` over `machine` with QEMU holding `inventory`; returns the retry.
async fn run(machine: &Machine, inventory: &Inventory, effects: &Recorded, bind: Option<&Vm>, steps: Vec<Step>) -> Option<Duration> {
    let mut volumes = Volumes::default();
    let mut pass = Pass::new(machine, inventory, effects, &mut volumes, BACKOFF);
    pass.bind = bind;
    pass.run(steps).await.retry
}

/// Waits until `done` holds (time is the test's: the 5 s deadline passes at once if nothing else
/// can happen, well before an unplug's own deadline); fails naming `what` it waited for.
async fn until(what: impl Fn() -> String, done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "waited in vain for {}", what());
}

/// Waits until QEMU was sent `command`.
async fn sent(fake: &Fake, command: &str, when: &str) {
    until(|| format!("{command} to go out {when} (sent: {:?})", fake.commands()), || fake.commands().iter().any(|c| c == command)).await;
}

fn w(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(v, p)| ((*v).to_owned(), (*p).to_owned())).collect()
}

#[tokio::test(start_paused = true)]
async fn disks_are_staged_from_the_passs_inventory_and_a_plug_is_one_write_for_all() {
    let (fake, m) = qemu();
    let effects = Recorded::new();
    assert_eq!(run(&m, &Inventory::default(), &effects, None, vec![disk("a"), disk("b")]).await, None);
    assert_eq!(
        fake.commands(),
        ["add-fd", "blockdev-add", "remove-fd", "add-fd", "blockdev-add", "remove-fd", "device_add", "device_add"],
        "no qom-list or query-named-block-nodes: staging uses what the pass asked"
    );
    assert_eq!(
        effects.writes(),
        [w(&[
            ("a", "AttachedToNode"),
            ("b", "AttachedToNode"),
            ("a", "MountedToPod"),
            ("b", "MountedToPod"),
            ("a", "Ready"),
            ("b", "Ready")
        ])],
        "the three steps' batches, in order, in one write"
    );
    assert_eq!(effects.stamps.lock().unwrap()[0].len(), 3, "each batch keeps its own time");
}

#[tokio::test(start_paused = true)]
async fn status_writes_wait_until_the_plug_is_done_keep_their_order_and_when_each_phase_was_reached() {
    let (fake, m) = qemu();
    let effects = Recorded::new();
    // QEMU answers `device_add` 50 ms late (time is the test's): nothing is written before it.
    fake.delay("device_add", Duration::from_millis(50));
    let watch = async {
        sent(&fake, "device_add", "while the pass ran").await;
        let sent_at = jiff::Timestamp::now();
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(effects.writes().is_empty(), "a write went out beside device_add: {:?}", effects.writes());
        sent_at
    };
    let held = Inventory::default();
    let (retry, sent_at) = tokio::join!(run(&m, &held, &effects, None, vec![disk("a")]), watch);
    assert_eq!(retry, None);
    assert_eq!(effects.writes(), [w(&[("a", "AttachedToNode"), ("a", "MountedToPod"), ("a", "Ready")])]);
    let stamps = effects.stamps.lock().unwrap().clone();
    assert!(
        stamps[0][..2].iter().all(|t| *t <= sent_at) && stamps[0][2] >= sent_at,
        "stamped when reached (AttachedToNode, MountedToPod before device_add; Ready after its answer): {stamps:?} vs {sent_at}"
    );
}

#[tokio::test(start_paused = true)]
async fn qemu_is_not_kept_waiting_by_a_slow_status_write_once_the_writes_have_begun() {
    let (fake, m) = qemu();
    unplugs_gone(&fake);
    let mut effects = Recorded::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    effects.gate = Some(Arc::clone(&gate));
    // The API holds every write back (the plug's and `Detaching`) until QEMU was asked to delete
    // the unplugged disk's node, after its `DEVICE_DELETED` (time is the test's: the deadline
    // passes at once if nothing else can happen).
    let api = async {
        sent(&fake, "blockdev-del", "while the plug's write was held").await;
        assert!(effects.writes().is_empty(), "no write had returned yet");
        gate.add_permits(10);
    };
    plug_a_and_unplug_gone_beside(&m, &effects, api).await;
}

/// A pass that plugs `a` and unplugs `gone`, run beside `side` (what the test does meanwhile);
/// checks the writes that come of it: the batches queued by the time QEMU took the unplug in one
/// write, the removal after the unplug's Event.
async fn plug_a_and_unplug_gone_beside(m: &Machine, effects: &Recorded, side: impl std::future::Future<Output = ()>) {
    let steps = vec![disk("a"), Step::Detach { volume: "gone".into() }];
    let held = holding_gone();
    let (retry, ()) = tokio::join!(run(m, &held, effects, None, steps), side);
    assert_eq!(retry, None);
    assert_eq!(
        effects.writes(),
        [w(&[("a", "AttachedToNode"), ("a", "MountedToPod"), ("a", "Ready"), ("gone", "Detaching")]), w(&[("gone", "removed")])]
    );
}

#[tokio::test(start_paused = true)]
async fn a_refused_device_add_leaves_the_volume_attached_to_node_with_qemus_reason() {
    let (fake, m) = qemu();
    fake.refuse("device_add", "GenericError", "Duplicate ID 'vp-a' for device");
    let effects = Recorded::new();
    let retry = run(&m, &Inventory::default(), &effects, None, vec![disk("a")]).await;
    assert!(retry.is_some_and(|d| d <= BACKOFF.base * 2), "retried at the backoff: {retry:?}");
    assert_eq!(fake.commands()[3..], ["device_add", "blockdev-del"], "the plug's rollback");
    let Some(Did::Wrote(last)) = effects.did().pop() else { panic!("a last write") };
    let Some(Change::Set { phase, reason, message, .. }) = last.last() else { panic!("{last:?}") };
    assert_eq!((phase, reason), (&VolumePhase::AttachedToNode, &VolumeReason::PvcBound));
    assert!(message.starts_with("QEMU refused the volume") && message.contains("Duplicate ID"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn a_volume_whose_claim_is_not_ready_writes_its_wait_with_the_adopted_ready_and_asks_qemu_nothing() {
    let (fake, m) = qemu();
    let mut effects = Recorded::new();
    effects.not_ready.push("late".into());
    let steps = vec![Step::RecordReady { volume: "kept".into() }, disk("late")];
    assert!(run(&m, &Inventory::default(), &effects, None, steps).await.is_some(), "it waits: a retry is due");
    assert!(fake.commands().is_empty(), "{:?}", fake.commands());
    assert_eq!(effects.writes(), [w(&[("kept", "Ready"), ("late", "Pending")])], "one write for both");
}

/// QEMU confirms volume `gone`'s unplug and frees its node.
fn unplugs_gone(fake: &Fake) {
    fake.emit_after("device_del", "DEVICE_DELETED", json!({"device": "vp-gone"}))
        .reply("query-named-block-nodes", json!([{"node-name": "n-gone"}]));
}

/// What a pass that plans the unplug of `volumes` found: their disks and nodes.
fn holding(volumes: &[&str]) -> Inventory {
    let disk =
        |v: &&str| qemu::Attached { volume: (*v).into(), device_type: "scsi-hd".into(), node: Some(format!("n-{v}")), readonly: false };
    Inventory { attached: volumes.iter().map(disk).collect(), nodes: volumes.iter().map(|v| format!("n-{v}")).collect() }
}

fn holding_gone() -> Inventory {
    holding(&["gone"])
}

#[tokio::test(start_paused = true)]
async fn volumes_unplugged_together_are_all_sent_to_qemu_before_any_confirmation_is_awaited() {
    let (fake, m) = qemu();
    // QEMU confirms each unplug right after answering its `device_del`: one at a time, the
    // second `device_del` would wait for the first's confirmation and node deletion.
    for v in ["x", "y"] {
        fake.emit_after("device_del", "DEVICE_DELETED", json!({"device": format!("vp-{v}")}));
    }
    let nodes = json!([{"node-name": "n-x"}, {"node-name": "n-y"}]);
    fake.reply("query-named-block-nodes", nodes.clone()).reply("query-named-block-nodes", nodes);
    let effects = Recorded::new();
    let steps = vec![Step::Detach { volume: "x".into() }, Step::Detach { volume: "y".into() }];
    assert_eq!(run(&m, &holding(&["x", "y"]), &effects, None, steps).await, None);
    let commands = fake.commands();
    assert_eq!(commands[..2], ["device_del", "device_del"], "both unplugs went to QEMU first: {commands:?}");
    assert_eq!(commands.iter().filter(|c| *c == "blockdev-del").count(), 2, "{commands:?}");
    assert_eq!(effects.writes(), [w(&[("x", "Detaching"), ("y", "Detaching")]), w(&[("x", "removed"), ("y", "removed")])]);
}

#[tokio::test(start_paused = true)]
async fn detaching_is_written_while_qemu_has_yet_to_confirm_the_unplug() {
    let (fake, m) = qemu();
    // QEMU answers `device_del` and never confirms it (time is the test's).
    let effects = Recorded::new();
    let watch = async {
        sent(&fake, "device_del", "for the unplug").await;
        assert!(UNPLUG_DEADLINE > Duration::from_secs(5), "the wait below ends before the unplug's own deadline");
        until(|| "a write after device_del".into(), || !effects.writes().is_empty()).await;
        assert_eq!(effects.writes(), [w(&[("gone", "Detaching")])]);
        assert_eq!(fake.commands(), ["device_del"], "written before the unplug finished");
    };
    let steps = vec![Step::Detach { volume: "gone".into() }];
    let held = holding_gone();
    let (retry, ()) = tokio::join!(run(&m, &held, &effects, None, steps), watch);
    assert_eq!(retry, Some(BACKOFF.base), "unconfirmed at the deadline: retried");
}

#[tokio::test(start_paused = true)]
async fn status_writes_wait_until_qemu_has_taken_the_unplug_too() {
    let (fake, m) = qemu();
    unplugs_gone(&fake);
    // QEMU answers `device_del` 50 ms late: the plug's write and `Detaching` wait for it.
    fake.delay("device_del", Duration::from_millis(50));
    let effects = Recorded::new();
    let watch = async {
        sent(&fake, "device_del", "after the plug").await;
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(effects.writes().is_empty(), "a write went out beside device_del: {:?}", effects.writes());
    };
    plug_a_and_unplug_gone_beside(&m, &effects, watch).await;
}

#[tokio::test(start_paused = true)]
async fn an_unplug_writes_detaching_raises_its_event_then_drops_the_entry() {
    let (fake, m) = qemu();
    unplugs_gone(&fake);
    let effects = Recorded::new();
    assert_eq!(run(&m, &holding_gone(), &effects, None, vec![Step::Detach { volume: "gone".into() }]).await, None);
    assert_eq!(
        fake.commands(),
        ["device_del", "query-named-block-nodes", "blockdev-del"],
        "the pass's inventory says the disk is there: no query before device_del"
    );
    assert_eq!(
        effects.did(),
        [
            Did::Wrote(vec![Change::detaching("gone", "unplugging")]),
            Did::Raised(EventReason::VolumeUnplugged, "volume gone unplugged".into()),
            Did::Wrote(vec![Change::Remove("gone".into())]),
        ],
        "the Event before the entry goes: whoever waits for the entry to go finds it"
    );
}

/// A status write the API fails (the entry's removal after an unplug, which left it
/// `Detaching`) is not lost: the pass asks for the next one within the base backoff though
/// nothing else waits; that pass, planned from the VMI as it is (an unwanted entry without its
/// device: `DropEntry`), writes it again.
#[tokio::test(start_paused = true)]
async fn a_failed_status_write_brings_the_next_pass_within_the_base_backoff() {
    let (fake, m) = qemu();
    unplugs_gone(&fake);
    let effects = Recorded { refuse: Some(1), ..Recorded::new() };
    assert_eq!(
        run(&m, &holding_gone(), &effects, None, vec![Step::Detach { volume: "gone".into() }]).await,
        Some(BACKOFF.base),
        "the refused removal asks for another pass"
    );
    assert_eq!(effects.writes(), [w(&[("gone", "Detaching")])], "the removal was refused");
    let (_, m) = qemu();
    assert_eq!(run(&m, &Inventory::default(), &effects, None, vec![Step::DropEntry { volume: "gone".into() }]).await, None);
    assert_eq!(effects.writes(), [w(&[("gone", "Detaching")]), w(&[("gone", "removed")])]);
}

/// A pass ends knowing which volumes QEMU holds (what the next pass plans from): those it held
/// and kept, those it attached, those it could not unplug; not a refused plug, not one unplugged.
#[tokio::test(start_paused = true)]
async fn a_pass_ends_knowing_which_volumes_qemu_holds() {
    let (fake, m) = qemu();
    fake.reply("device_add", json!({})).refuse("device_add", "GenericError", "Duplicate ID 'vp-b' for device");
    unplugs_gone(&fake);
    let effects = Recorded::new();
    let mut volumes = Volumes::default();
    let inventory = holding(&["kept", "gone", "stuck"]);
    let pass = Pass::new(&m, &inventory, &effects, &mut volumes, BACKOFF);
    let detach = |v: &str| Step::Detach { volume: v.into() };
    let steps = vec![Step::Keep { volume: "kept".into() }, disk("a"), disk("b"), detach("gone"), detach("stuck")];
    let mut held = pass.run(steps).await.held;
    held.sort();
    assert_eq!(held, ["a", "kept", "stuck"], "QEMU answered: {:?}", fake.commands());
}

#[tokio::test(start_paused = true)]
async fn an_unplug_without_device_deleted_stays_detaching_with_the_error_and_retries_at_the_base() {
    let (fake, m) = qemu();
    let effects = Recorded::new();
    assert_eq!(run(&m, &holding_gone(), &effects, None, vec![Step::Detach { volume: "gone".into() }]).await, Some(BACKOFF.base));
    assert_eq!(fake.commands(), ["device_del"], "no blockdev-del while QEMU may still hold the node");
    let did = effects.did();
    assert_eq!(did.len(), 2, "no Event, no removal: {did:?}");
    let Did::Wrote(last) = &did[1] else { panic!("{did:?}") };
    let Change::Set { phase, message, .. } = &last[0] else { panic!("{last:?}") };
    assert_eq!(phase, &VolumePhase::Detaching);
    assert!(message.contains("DEVICE_DELETED"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn an_eject_writes_detaching_ejects_raises_its_event_then_drops_the_entry() {
    let (fake, m) = qemu();
    fake.reply("query-block", json!([{"qdev": "cd0", "removable": true, "inserted": {"node-name": "n-cd0"}}]));
    let effects = Recorded::new();
    let eject = Step::Eject { drive: "cd0".into(), node: "n-cd0".into(), volume: Some("cd0".into()) };
    run(&m, &Inventory::default(), &effects, None, vec![eject]).await;
    assert_eq!(fake.commands(), ["query-block", "blockdev-open-tray", "blockdev-remove-medium", "blockdev-del", "blockdev-close-tray"]);
    assert_eq!(
        effects.did(),
        [
            Did::Wrote(vec![Change::detaching("cd0", "ejecting")]),
            Did::Raised(EventReason::VolumeUnplugged, "medium cd0 ejected from cd0".into()),
            Did::Wrote(vec![Change::Remove("cd0".into())]),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_leftover_node_qemu_still_holds_is_retried_at_the_base_backoff() {
    let (fake, m) = qemu();
    fake.refuse("blockdev-del", "GenericError", "Node 'n-old' is busy");
    let effects = Recorded::new();
    let sweep = || vec![Step::RemoveNode { node: "n-old".into() }];
    assert_eq!(run(&m, &Inventory::default(), &effects, None, sweep()).await, Some(BACKOFF.base));
    assert_eq!(run(&m, &Inventory::default(), &effects, None, sweep()).await, None, "freed on the next pass");
    assert_eq!(fake.calls()[1].args, json!({"node-name": "n-old"}));
}

#[tokio::test(start_paused = true)]
async fn in_bind_mount_mode_qemu_opens_the_target_and_a_failed_attach_releases_it() {
    let (fake, m) = qemu();
    let run_dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    let vm = Vm { host: Arc::clone(&rec) as Arc<dyn Privileged>, pid: 4242, run_dir: run_dir.path().to_owned(), cgroup: "/cg/vm".into() };
    let effects = Recorded::new();
    run(&m, &Inventory::default(), &effects, Some(&vm), vec![disk("a")]).await;
    let target = run_dir.path().join("hotplug/a");
    assert_eq!(fake.commands(), ["blockdev-add", "device_add"], "no fd handoff");
    assert_eq!(fake.calls()[0].args["file"]["filename"], json!(target.display().to_string()));
    assert_eq!(effects.writes(), [w(&[("a", "AttachedToNode"), ("a", "MountedToPod"), ("a", "Ready")])]);
    assert_eq!(rec.take(), [Request::BindMount { pid: 4242, target: target.clone(), readonly: false }], "QEMU holds it: the target stays");

    fake.refuse("device_add", "GenericError", "cannot open it");
    run(&m, &Inventory::default(), &effects, Some(&vm), vec![disk("a")]).await;
    let requests = rec.take();
    assert_eq!(requests.last(), Some(&Request::RemoveTarget { pid: 4242, target }), "{requests:?}");
}

#[tokio::test(start_paused = true)]
async fn every_line_logged_about_a_volume_names_it() {
    let (fake, m) = qemu();
    fake.emit_after("device_del", "DEVICE_DELETED", json!({"device": "vp-gone"}));
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt().with_writer(log.clone()).with_ansi(false).with_max_level(tracing::Level::INFO).finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let effects = Recorded::new();
    run(&m, &holding_gone(), &effects, None, vec![disk("a"), Step::Detach { volume: "gone".into() }]).await;
    let text = log.text();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.iter().any(|l| l.contains("attached")) && lines.iter().any(|l| l.contains("detached")), "{text}");
    for l in lines {
        let named = if l.contains("detached") { "volume=gone" } else { "volume=a" };
        assert!(l.contains(&format!("volume{{{named}}}")), "a line without its volume: {l}");
    }
}

/// A log sink for the test subscriber.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;
    fn make_writer(&'a self) -> Log {
        self.clone()
    }
}
