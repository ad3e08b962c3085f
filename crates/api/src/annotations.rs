//! Annotations virtplug's components use to talk to each other through the API (so that they
//! work the same against the embedded API server and a real kube-apiserver).

/// On a VMI: an NMI is asked for (the Redfish service's `ResetType: Nmi`); the value is the
/// request's ID. The node agent that owns the VMI's QMP connection injects it once per ID.
pub const NMI_REQUESTED: &str = "virtplug.io/nmi-requested";
/// On a VMI: the ID of the last NMI injected (the node agent's answer).
pub const NMI_INJECTED: &str = "virtplug.io/nmi-injected";
/// On a VMI: `ID: why` of the last NMI that could not be injected.
pub const NMI_FAILED: &str = "virtplug.io/nmi-failed";
