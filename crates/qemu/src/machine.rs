//! [`Machine`]: one running QEMU, driven over its QMP connection (a [`Monitor`]).
//!
//! The operations live by concept — [`crate::hotplug`] (attach, detach), [`crate::media`]
//! (CD-ROM media), [`crate::inventory`] (what QEMU holds, and what an interrupted operation left)
//! — each an `impl Machine` block. Here: the handle, raw commands, boot order and shutdown.
//!
//! Every operation logs within the caller's span (the node agent's VMI) and its own (the volume
//! or drive); every QMP command it sends is logged at `debug` with its duration.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::qmp::{Event, Monitor, QmpError};

/// Operations over one VM's QMP connection.
///
/// It holds the connection as a trait object, not as a type parameter: its users (the node
/// agent's worker and hot-plug reconcile, the benches) stay non-generic, and a test hands it a
/// [`Fake`](crate::qmp::fake::Fake) without making every function on the way generic. The cost
/// is one boxed future per command, nothing beside a QMP round trip.
pub struct Machine {
    monitor: Box<dyn Monitor>,
}

impl Machine {
    /// Wraps a connection: a connected [`Qmp`](crate::Qmp), or a fake (an `Arc` of one, to read
    /// what was sent).
    #[must_use]
    pub fn new(monitor: impl Monitor + 'static) -> Machine {
        Machine { monitor: Box::new(monitor) }
    }

    /// Runs one command of an operation, logging it.
    pub(crate) async fn command(&self, command: &str, args: Value) -> Result<Value, QmpError> {
        let t = Instant::now();
        let r = self.monitor.execute(command, args).await;
        tracing::debug!(command, ms = t.elapsed().as_secs_f64() * 1000.0, ok = r.is_ok(), "QMP");
        r
    }

    /// Runs one command of an operation with `fd` attached, logging it.
    pub(crate) async fn command_with_fd(&self, command: &str, args: Value, fd: BorrowedFd<'_>) -> Result<Value, QmpError> {
        let t = Instant::now();
        let r = self.monitor.execute_with_fd(command, args, fd).await;
        tracing::debug!(command, ms = t.elapsed().as_secs_f64() * 1000.0, ok = r.is_ok(), "QMP");
        r
    }

    /// Subscribes to QEMU's events from now on.
    #[must_use]
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.monitor.events()
    }

    /// Waits for an event matching `pred` on `rx` (subscribed before sending the command that
    /// causes it), until `deadline`.
    ///
    /// # Errors
    /// `Timeout` naming `what`; `Disconnected` when the connection is gone.
    pub(crate) async fn wait_event(
        &self,
        rx: &mut broadcast::Receiver<Event>,
        what: &str,
        deadline: Duration,
        pred: impl Fn(&Event) -> bool,
    ) -> Result<Event, QmpError> {
        let wait = async {
            loop {
                match rx.recv().await {
                    Ok(e) if pred(&e) => return Ok(e),
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(QmpError::Disconnected { socket: self.monitor.socket().to_owned() })
                    }
                }
            }
        };
        tokio::time::timeout(deadline, wait).await.map_err(|_| QmpError::Timeout { command: what.to_owned(), deadline })?
    }

    /// Runs a raw QMP command (diagnostics, round-trip measurements, tests).
    ///
    /// # Errors
    /// The QMP error.
    pub async fn execute(&self, command: &str, args: Value) -> Result<Value, QmpError> {
        self.monitor.execute(command, args).await
    }

    /// Runs a raw QMP command with `fd` attached (tests that build what an interrupted attach
    /// leaves).
    ///
    /// # Errors
    /// The QMP error.
    pub async fn execute_with_fd(&self, command: &str, args: Value, fd: BorrowedFd<'_>) -> Result<Value, QmpError> {
        self.monitor.execute_with_fd(command, args, fd).await
    }

    /// Closes the connection now (QEMU then accepts the next client); later commands fail.
    pub fn close(&self) {
        self.monitor.close();
    }

    /// Sets the boot index of device `id` for the next boot.
    ///
    /// # Errors
    /// The QMP error (e.g. a duplicate boot index).
    pub async fn set_bootindex(&self, id: &str, index: i32) -> Result<(), QmpError> {
        self.command("qom-set", json!({"path": format!("/machine/peripheral/{id}"), "property": "bootindex", "value": index}))
            .await
            .map(|_| ())
    }

    /// Starts the vCPUs of a QEMU started paused ([`LaunchSpec::start_paused`](crate::LaunchSpec)),
    /// or stopped (QMP `cont`). The guest (its firmware first) runs from here; a QEMU already
    /// running stays so (`cont` succeeds).
    ///
    /// # Errors
    /// The QMP error.
    pub async fn resume(&self) -> Result<(), QmpError> {
        self.command("cont", json!({})).await.map(|_| ())
    }

    /// Stops the vCPUs (QMP `stop`): the guest and its clock stand still, its memory and
    /// devices stay; [`Machine::resume`] continues it. Devices can still be plugged.
    ///
    /// # Errors
    /// The QMP error.
    pub async fn pause(&self) -> Result<(), QmpError> {
        self.command("stop", json!({})).await.map(|_| ())
    }

    /// Whether the vCPUs stand still: QEMU's `query-status` is `paused` (a [`Machine::pause`])
    /// or `prelaunch` (started paused, not yet resumed).
    ///
    /// # Errors
    /// The QMP error.
    pub async fn paused(&self) -> Result<bool, QmpError> {
        let s = self.command("query-status", json!({})).await?;
        Ok(matches!(s.get("status").and_then(Value::as_str), Some("paused" | "prelaunch")))
    }

    /// Resets the machine (QMP `system_reset`): the firmware and the guest boot again in the
    /// same QEMU, as the reset button does; the guest is not asked first.
    ///
    /// # Errors
    /// The QMP error.
    pub async fn reset(&self) -> Result<(), QmpError> {
        self.command("system_reset", json!({})).await.map(|_| ())
    }

    /// Injects a non-maskable interrupt into every vCPU (QMP `inject-nmi`): the guest's NMI
    /// handler runs (Linux logs it, or panics with `unknown_nmi_panic`), as a BMC's diagnostic
    /// interrupt does (Redfish `ResetType: Nmi`).
    ///
    /// # Errors
    /// The QMP error.
    pub async fn inject_nmi(&self) -> Result<(), QmpError> {
        self.command("inject-nmi", json!({})).await.map(|_| ())
    }

    /// Asks the guest to power off (ACPI) and waits up to `deadline` for QEMU to shut down.
    /// Returns whether it did; the caller then stops QEMU by force.
    ///
    /// # Errors
    /// The QMP error of `system_powerdown`.
    pub async fn powerdown(&self, deadline: Duration) -> Result<bool, QmpError> {
        let mut events = self.monitor.events();
        self.command("system_powerdown", json!({})).await?;
        Ok(self.wait_event(&mut events, "SHUTDOWN", deadline, |e| e.name == "SHUTDOWN" || e.name == "DISCONNECTED").await.is_ok())
    }

    /// Stops QEMU at once (`quit`).
    pub async fn quit(&self) {
        let _ = self.monitor.execute_within("quit", json!({}), Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::*;
    use crate::qmp::fake::Fake;

    #[tokio::test]
    async fn resume_sends_cont() {
        let fake = Arc::new(Fake::new());
        let m = Machine::new(Arc::clone(&fake));
        m.resume().await.unwrap();
        assert_eq!((fake.calls()[0].command.as_str(), &fake.calls()[0].args), ("cont", &json!({})));
    }

    #[tokio::test]
    async fn pause_reset_and_status_send_their_commands() {
        let fake = Arc::new(Fake::new());
        let m = Machine::new(Arc::clone(&fake));
        m.pause().await.unwrap();
        m.reset().await.unwrap();
        let sent: Vec<_> = fake.calls().iter().map(|c| (c.command.clone(), c.args.clone())).collect();
        assert_eq!(sent, [("stop".to_owned(), json!({})), ("system_reset".to_owned(), json!({}))]);
        fake.reply("query-status", json!({"status": "paused", "running": false}));
        assert!(m.paused().await.unwrap());
        fake.reply("query-status", json!({"status": "prelaunch", "running": false}));
        assert!(m.paused().await.unwrap(), "started paused counts as paused");
        fake.reply("query-status", json!({"status": "running", "running": true}));
        assert!(!m.paused().await.unwrap());
    }

    #[tokio::test]
    async fn inject_nmi_sends_inject_nmi_and_reports_a_refusal() {
        let fake = Arc::new(Fake::new());
        let m = Machine::new(Arc::clone(&fake));
        m.inject_nmi().await.unwrap();
        assert_eq!(fake.calls()[0].command, "inject-nmi");
        assert_eq!(fake.calls()[0].args, json!({}));
        fake.refuse("inject-nmi", "GenericError", "not supported");
        assert!(m.inject_nmi().await.is_err());
    }
}
