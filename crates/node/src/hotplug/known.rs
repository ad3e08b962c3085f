//! What QEMU holds after this worker's last pass, kept so that the next pass plans without
//! asking QEMU first.
//!
//! A pass began with three queries (`qom-list`, `query-named-block-nodes`, `query-block`: one
//! round trip, about 1 ms of QEMU's main loop on this machine) between the spec change and a
//! plug's `add-fd`, and the same before an unplug's `device_del`. Only this worker changes
//! QEMU's devices, nodes and drives (its connection has one owner; the launcher's own monitor
//! only powers the guest down, which QEMU announces), and what else moves them comes with an
//! event, so a pass's outcome says what QEMU holds after it, as long as
//! - every step's outcome in QEMU is known: each device attach ended held on a node of its own
//!   making (a node left by an interrupted attach is reused as it is, read-only or not), each
//!   unplug finished (`DEVICE_DELETED`, node deleted), and the pass did nothing else to QEMU (a
//!   medium inserted or ejected, a leftover node deleted: those are not derived here), and
//! - QEMU sent no event since its inventory was asked but the `DEVICE_DELETED`s of the pass's own
//!   unplugs: a guest's tray, a reset, the late confirmation of an unplug that timed out, a lost
//!   connection all drop what is kept.
//!
//! Anything else drops it, and the next pass asks QEMU as every pass did before; so does a pass
//! more than [`KEPT_FOR`] after the state was last asked. (A kept inventory that missed a change
//! would be caught only in part: QEMU refuses a plug it contradicts (a duplicate node or device
//! id) and the retry asks, but a device it lists that QEMU lost would read as held until then.)

use std::time::Duration;

use qemu::qmp::Event;
use qemu::{device_id, node_name, Drive, Inventory, Machine, QmpError};
use serde_json::Value;
use tokio::sync::broadcast::{self, error::TryRecvError};
use tokio::time::Instant;

use super::plan::{Attach, Step, Target};

/// How long after QEMU was last asked its state is planned from without asking again: passes in
/// quick succession (a burst of edits, a plug and its unplug) skip the queries; one a person
/// starts later asks, and a state this module failed to foresee lives no longer than this.
pub const KEPT_FOR: Duration = Duration::from_secs(10);

/// What the last pass left in QEMU, while it is known (see the module).
#[derive(Default)]
pub struct Known(Option<Snapshot>);

/// QEMU's hot-plug state as one pass plans from it.
pub(super) struct Snapshot {
    pub inventory: Inventory,
    pub drives: Vec<Drive>,
    /// Both answers came: a failed `query-block` plans with no drives, and is not kept.
    complete: bool,
    /// QEMU's events since the inventory was asked.
    events: broadcast::Receiver<Event>,
    /// When QEMU was asked.
    asked: Instant,
}

impl Known {
    /// What to plan from: what the last pass left if QEMU has said nothing since, else QEMU's
    /// answer now.
    ///
    /// # Errors
    /// QEMU's error for its inventory.
    pub(super) async fn current(&mut self, machine: &Machine) -> Result<Snapshot, QmpError> {
        if let Some(mut s) = self.0.take() {
            if quiet(&mut s.events, &[]) && s.asked.elapsed() < KEPT_FOR {
                return Ok(s);
            }
        }
        // Subscribed before asking: an event after the answer is not missed.
        let (events, asked) = (machine.events(), Instant::now());
        // The three queries go out together (QMP answers in order): one round trip.
        let (inventory, drives) = tokio::join!(machine.inventory(), machine.drives());
        Ok(Snapshot { inventory: inventory?, complete: drives.is_ok(), drives: drives.unwrap_or_default(), events, asked })
    }

    /// Keeps what QEMU holds after a pass that ran `steps` from `s` and ended with QEMU holding
    /// `held`, when that is known exactly; else forgets.
    pub(super) fn after(&mut self, mut s: Snapshot, steps: &[Step], held: &[String]) {
        self.0 = (s.complete && derive(&mut s, steps, held)).then_some(s);
    }
}

/// Applies the outcome of `steps` to `s`: `false` when it is not known exactly.
fn derive(s: &mut Snapshot, steps: &[Step], held: &[String]) -> bool {
    let holds = |v: &String| held.contains(v);
    let mut unplugged = Vec::new();
    for step in steps {
        match step {
            Step::Keep { .. } | Step::RecordReady { .. } | Step::DropEntry { .. } => {}
            // On a node of its own: a leftover reused keeps its own read-only flag.
            Step::Attach(Attach { volume, readonly, target: Target::Device { kind, .. }, .. })
                if holds(volume) && !s.inventory.has_node(&node_name(volume)) =>
            {
                s.inventory.plugged(volume, *kind, *readonly);
            }
            Step::Detach { volume } if !holds(volume) => {
                s.inventory.unplugged(volume);
                unplugged.push(device_id(volume));
            }
            Step::Attach(_) | Step::Detach { .. } | Step::Eject { .. } | Step::RemoveNode { .. } => return false,
        }
    }
    quiet(&mut s.events, &unplugged)
}

/// Whether QEMU sent nothing on `events` but the `DEVICE_DELETED`s of devices `expected`.
fn quiet(events: &mut broadcast::Receiver<Event>, expected: &[String]) -> bool {
    loop {
        match events.try_recv() {
            Ok(e)
                if e.name == "DEVICE_DELETED"
                    && e.data.get("device").and_then(Value::as_str).is_some_and(|d| expected.iter().any(|x| x == d)) => {}
            Err(TryRecvError::Empty) => return true,
            Ok(_) | Err(TryRecvError::Lagged(_) | TryRecvError::Closed) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use qemu::qmp::fake::Fake;
    use qemu::DeviceKind;
    use serde_json::json;

    use super::*;
    use crate::claims::Claim;
    use crate::hotplug::execute_tests::disk;

    const ASKED: [&str; 3] = ["query-named-block-nodes", "qom-list", "query-block"];

    /// A QEMU holding `volumes` as disks on their nodes, and a drive `cd0` with no medium.
    fn qemu(volumes: &[&str]) -> (Arc<Fake>, Machine) {
        let fake = Arc::new(Fake::new());
        answer(&fake, volumes);
        (Arc::clone(&fake), Machine::new(fake))
    }

    /// Queues one answer to the three queries: `volumes` as disks on their nodes, a drive `cd0`.
    fn answer(fake: &Fake, volumes: &[&str]) {
        let devices: Vec<_> = volumes.iter().map(|v| json!({"name": device_id(v), "type": "child<scsi-hd>"})).collect();
        let nodes: Vec<_> = volumes.iter().map(|v| json!({"node-name": qemu::node_name(v), "ro": false})).collect();
        fake.reply("qom-list", json!(devices)).reply("query-named-block-nodes", json!(nodes));
        fake.reply("query-block", json!([{"qdev": "/machine/peripheral/cd0", "removable": true, "tray_open": false}]));
    }

    fn held(volumes: &[&str]) -> Vec<String> {
        volumes.iter().map(|v| (*v).to_owned()).collect()
    }

    /// The commands the next `current` sends, and what it plans from.
    async fn next(known: &mut Known, fake: &Fake, m: &Machine) -> (Vec<String>, Snapshot) {
        let before = fake.commands().len();
        let s = known.current(m).await.unwrap();
        (fake.commands()[before..].to_vec(), s)
    }

    #[tokio::test]
    async fn after_a_clean_plug_the_next_pass_asks_qemu_nothing_and_plans_with_the_plugged_disk() {
        let (fake, m) = qemu(&["a"]);
        let mut known = Known::default();
        let (asked, s) = next(&mut known, &fake, &m).await;
        assert_eq!(asked, ASKED, "the first pass asks QEMU");
        known.after(s, &[Step::Keep { volume: "a".into() }, disk("b")], &held(&["a", "b"]));
        let (asked, s) = next(&mut known, &fake, &m).await;
        assert!(asked.is_empty(), "{asked:?}");
        let mut want = Inventory::default();
        want.plugged("a", DeviceKind::Disk, false);
        want.plugged("b", DeviceKind::Disk, false);
        assert_eq!(s.inventory, want);
        assert_eq!(s.drives.len(), 1, "the drives are kept too");
    }

    #[tokio::test]
    async fn after_a_clean_unplug_its_own_device_deleted_keeps_it_and_the_disk_is_gone() {
        let (fake, m) = qemu(&["a", "b"]);
        let mut known = Known::default();
        let (_, s) = next(&mut known, &fake, &m).await;
        fake.emit("DEVICE_DELETED", json!({"device": device_id("b"), "path": "/machine/peripheral/vp-b"}));
        known.after(s, &[Step::Keep { volume: "a".into() }, Step::Detach { volume: "b".into() }], &held(&["a"]));
        let (asked, s) = next(&mut known, &fake, &m).await;
        assert!(asked.is_empty(), "{asked:?}");
        assert!(s.inventory.has_device("a") && !s.inventory.has_device("b") && !s.inventory.has_node(&qemu::node_name("b")));
    }

    /// A guest's tray, a reset, the late `DEVICE_DELETED` of an unplug that timed out, a lost
    /// connection: whatever QEMU says, the next pass asks it again.
    #[tokio::test]
    async fn any_event_from_qemu_after_or_during_the_pass_makes_the_next_pass_ask_again() {
        let late = json!({"device": device_id("old")});
        for (when, name, data) in [
            ("after", "DEVICE_TRAY_MOVED", json!({"id": "cd0", "tray-open": true})),
            ("after", "DEVICE_DELETED", late.clone()),
            ("during", "DEVICE_DELETED", late),
            ("during", "RESET", json!({"guest": true})),
        ] {
            let (fake, m) = qemu(&["a"]);
            let mut known = Known::default();
            let (_, s) = next(&mut known, &fake, &m).await;
            if when == "during" {
                fake.emit(name, data.clone());
            }
            known.after(s, &[disk("b")], &held(&["b"]));
            if when == "after" {
                fake.emit(name, data);
            }
            // What QEMU answers now: `b`'s plug undone behind the worker's back, say.
            answer(&fake, &["a"]);
            let (asked, s) = next(&mut known, &fake, &m).await;
            assert_eq!(asked, ASKED, "{name} {when} the pass");
            assert!(s.inventory.has_device("a") && !s.inventory.has_device("b"), "planned from QEMU's answer: {:?}", s.inventory);
        }
    }

    #[tokio::test]
    async fn a_pass_whose_outcome_in_qemu_is_not_known_exactly_is_not_kept() {
        let medium = Step::Attach(Attach {
            volume: "iso".into(),
            claim: Claim { name: "iso".into(), data_volume: false },
            readonly: true,
            target: Target::Medium { drive: "cd0".into() },
            attach_pod: None,
        });
        let cases: [(&str, Vec<Step>, Vec<String>); 5] = [
            ("a failed attach", vec![disk("b")], held(&[])),
            ("a failed unplug", vec![Step::Detach { volume: "a".into() }], held(&["a"])),
            ("a medium inserted", vec![medium], held(&["iso"])),
            ("a medium ejected", vec![Step::Eject { drive: "cd0".into(), node: "n-x".into(), volume: None }], held(&[])),
            ("a leftover node deleted", vec![Step::RemoveNode { node: "n-x".into() }], held(&[])),
        ];
        for (what, steps, held) in cases {
            let (fake, m) = qemu(&["a"]);
            let mut known = Known::default();
            let (_, s) = next(&mut known, &fake, &m).await;
            known.after(s, &steps, &held);
            assert_eq!(next(&mut known, &fake, &m).await.0, ASKED, "{what}");
        }
    }

    #[tokio::test]
    async fn drives_qemu_did_not_list_are_planned_with_once_and_never_kept() {
        let fake = Arc::new(Fake::new());
        fake.refuse("query-block", "GenericError", "busy");
        let m = Machine::new(Arc::clone(&fake));
        let mut known = Known::default();
        let (_, s) = next(&mut known, &fake, &m).await;
        assert!(s.drives.is_empty());
        known.after(s, &[disk("b")], &held(&["b"]));
        assert_eq!(next(&mut known, &fake, &m).await.0, ASKED);
    }

    #[tokio::test]
    async fn a_receiver_that_fell_behind_drops_it_even_if_every_missed_event_was_expected() {
        let (fake, m) = qemu(&["a"]);
        let mut known = Known::default();
        let (_, s) = next(&mut known, &fake, &m).await;
        // More events than the channel keeps, each the pass's own unplug's.
        for _ in 0..5000 {
            fake.emit("DEVICE_DELETED", json!({"device": device_id("a")}));
        }
        known.after(s, &[Step::Detach { volume: "a".into() }], &held(&[]));
        assert_eq!(next(&mut known, &fake, &m).await.0, ASKED);
    }

    /// A node an interrupted attach left is reused by the next attach as it is (its read-only
    /// flag its own, not the spec's): what QEMU then lists is not derived.
    #[tokio::test]
    async fn an_attach_onto_a_leftover_node_is_not_kept() {
        let fake = Arc::new(Fake::new());
        fake.reply("query-named-block-nodes", json!([{"node-name": qemu::node_name("b"), "ro": true}]));
        let m = Machine::new(Arc::clone(&fake));
        let mut known = Known::default();
        let (_, s) = next(&mut known, &fake, &m).await;
        assert!(s.inventory.has_node(&qemu::node_name("b")) && !s.inventory.has_device("b"));
        known.after(s, &[disk("b")], &held(&["b"]));
        assert_eq!(next(&mut known, &fake, &m).await.0, ASKED);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_long_after_qemu_was_last_asked_asks_again() {
        let (fake, m) = qemu(&["a"]);
        let mut known = Known::default();
        let (_, s) = next(&mut known, &fake, &m).await;
        known.after(s, &[disk("b")], &held(&["b"]));
        tokio::time::advance(KEPT_FOR / 2).await;
        let (asked, s) = next(&mut known, &fake, &m).await;
        assert!(asked.is_empty(), "soon after: {asked:?}");
        known.after(s, &[Step::Keep { volume: "b".into() }], &held(&["b"]));
        tokio::time::advance(KEPT_FOR / 2).await;
        assert_eq!(next(&mut known, &fake, &m).await.0, ASKED, "{KEPT_FOR:?} after QEMU was asked, however many passes kept it");
    }
}
