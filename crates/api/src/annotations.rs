//! Annotations virtplug's components use to talk to each other through the API (so that they
//! work the same against the embedded API server and a real kube-apiserver).

/// On a VMI: an NMI is asked for (the Redfish service's `ResetType: Nmi`); the value is the
/// request's ID. The node agent that owns the VMI's QMP connection injects it once per ID.
pub const NMI_REQUESTED: &str = "virtplug.io/nmi-requested";
/// On a VMI: the ID of the last NMI injected (the node agent's answer).
pub const NMI_INJECTED: &str = "virtplug.io/nmi-injected";
/// On a VMI: `ID: why` of the last NMI that could not be injected.
pub const NMI_FAILED: &str = "virtplug.io/nmi-failed";

/// On a Node: `"true"` while a virtplug node agent runs there and heartbeats, `"false"` once the
/// controller found its heartbeat stale. The scheduler places VMIs only on `"true"` nodes (KubeVirt's
/// `kubevirt.io/schedulable`, under virtplug's own name so the two never read each other's).
pub const NODE_SCHEDULABLE: &str = "virtplug.io/schedulable";
/// On a Node: the time of the node agent's last heartbeat (RFC 3339, UTC).
pub const NODE_HEARTBEAT: &str = "virtplug.io/heartbeat";
/// Kubernetes' taint for a node an administrator has fenced (non-graceful node shutdown): its
/// workloads are known to be gone, so its VMIs may be failed and started elsewhere.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// On a VMI: where the node agent forwards the guest's `ports` from (QEMU user-mode networking's
/// host forwards), as JSON: `[{"interface","name","protocol","port","hostIP","hostPort"}]`
/// ([`crate::network::PortForward`]). KubeVirt has no such field (its ports are reached through
/// the pod's IP); written by the agent that runs the VMI after every start or adoption.
pub const PORT_FORWARDS: &str = "virtplug.io/port-forwards";

/// On a VMI: `"true"` while it should be paused (KubeVirt's `pause` subresource sets it,
/// `unpause` removes it). The node agent that owns the VMI's QMP connection stops or resumes
/// the vCPUs to match and reports what QEMU does in the VMI's `Paused` condition.
pub const PAUSE_REQUESTED: &str = "virtplug.io/pause-requested";
/// On a VMI: a soft reboot is asked for (the `softreboot` subresource); the value is the
/// request's ID. The node agent resets the guest once per ID.
pub const SOFTREBOOT_REQUESTED: &str = "virtplug.io/softreboot-requested";
/// On a VMI: the ID of the last soft reboot carried out (the node agent's answer).
pub const SOFTREBOOT_DONE: &str = "virtplug.io/softreboot-done";
/// On a VMI: `ID: why` of the last soft reboot that could not be carried out.
pub const SOFTREBOOT_FAILED: &str = "virtplug.io/softreboot-failed";
