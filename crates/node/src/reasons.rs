//! The reasons the node agent writes, as enums: a VMI's `status.reason` when it stops, and its
//! Events' reasons. (Volume phases and reasons are [`api::phases`]'.)

use client::events::EventType;

/// `VirtualMachineInstance.status.reason`, as the agent sets it with the phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmiReason {
    /// QEMU could not be started (`Failed`).
    LaunchFailed,
    /// A `Running` VMI whose QEMU is gone when the agent comes back (`Failed`).
    QemuGone,
    /// QEMU exited without a guest shutdown (`Failed`).
    QemuExited,
    /// The guest powered off (`Succeeded`).
    GuestShutdown,
    /// Stopped with `virtplug up --stop-vms-on-exit` (`Failed`).
    NodeShutdown,
    /// A `Scheduled` VMI waits for the Secret (or the key) of its cloud-init volume: it starts
    /// when it appears (KubeVirt's launcher pod waits for its Secret volume likewise).
    CloudInitSecretMissing,
}

impl VmiReason {
    /// The wire string.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            VmiReason::LaunchFailed => "LaunchFailed",
            VmiReason::QemuGone => "QEMUGone",
            VmiReason::QemuExited => "QEMUExited",
            VmiReason::GuestShutdown => "GuestShutdown",
            VmiReason::NodeShutdown => "NodeShutdown",
            VmiReason::CloudInitSecretMissing => "CloudInitSecretMissing",
        }
    }
}

/// The reasons of the Events the agent raises on a VMI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventReason {
    /// A volume failed past its deadline, or was refused (Warning).
    HotplugFailed,
    /// A volume was unplugged or a medium ejected (Normal).
    VolumeUnplugged,
    /// The guest rebooted (Normal).
    GuestReboot,
    /// QEMU could not be started (Warning).
    LaunchFailed,
    /// QEMU exited without a guest shutdown (Warning).
    VmiCrashed,
    /// The Secret of a cloud-init volume (or its key) is missing: the VMI waits (Warning).
    CloudInitSecretMissing,
}

impl EventReason {
    /// The wire string.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::HotplugFailed => "HotplugFailed",
            EventReason::VolumeUnplugged => "VolumeUnplugged",
            EventReason::GuestReboot => "GuestReboot",
            EventReason::LaunchFailed => "LaunchFailed",
            EventReason::VmiCrashed => "VMICrashed",
            EventReason::CloudInitSecretMissing => "CloudInitSecretMissing",
        }
    }

    /// Whether the Event is a `Warning` or `Normal` one.
    #[must_use]
    pub fn kind(self) -> EventType {
        match self {
            EventReason::HotplugFailed | EventReason::LaunchFailed | EventReason::VmiCrashed | EventReason::CloudInitSecretMissing => {
                EventType::Warning
            }
            EventReason::VolumeUnplugged | EventReason::GuestReboot => EventType::Normal,
        }
    }
}

/// The component the agent's Events name as their source (KubeVirt's virt-handler's role).
pub const COMPONENT: &str = "virtplug-node";

/// Raises an Event with `reason` on `vmi` (best effort, as every Event).
pub async fn publish(client: &kube::Client, vmi: &api::VirtualMachineInstance, reason: EventReason, message: &str) {
    client::events::publish(client, COMPONENT, vmi, reason.kind(), reason.as_str(), message).await;
}
