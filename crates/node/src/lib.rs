//! virtplug's node agent (KubeVirt's virt-handler): runs the VMIs scheduled onto this node under
//! QEMU and hot-plugs their volumes by handing QEMU an open file descriptor.
//!
//! Nothing is mounted into the VM's namespace and no device node or cgroup rule is created: the
//! agent opens the volume ([`source`]) and passes the fd over QMP; when QEMU exits its fds close,
//! so the volume's filesystem can be unmounted whether or not the agent is alive. KubeVirt's
//! bind-mount way stays available as a setting ([`bindmount`]).
//!
//! - [`agent`]: node registration, the VMI watch, one worker per VMI, adoption after a restart;
//! - [`config`]: the agent's settings and what its workers share;
//! - [`worker`]: one VMI's QEMU (launch, adopt, stop) and its phase; [`supervise`]: a worker
//!   that panics is logged and started again;
//! - [`hotplug`]: the volumes of a running VMI against what QEMU reports, and `volumeStatus`: a
//!   pure plan ([`hotplug::plan`]) and its executor;
//! - [`claims`]: a hot-plug volume's claim, checked ready, and its source opened;
//! - [`cloudinit`]: a VMI's cloud-init seed image (NoCloud or ConfigDrive, ISO 9660 + Joliet);
//! - [`source`]: a volume's source on this node, opened safely;
//! - [`bindmount`]: bind-mount mode (targets in QEMU's mount namespace, device cgroup rules);
//!   [`devprog`]: its cgroup v2 eBPF device program;
//! - [`caps`]: what one VMI may take from this node (emptyDisk size, guest memory);
//! - [`consolelog`]: the guests' serial logs, rotated past a cap; [`tunnel`]: the connection
//!   that carries console and VNC streams to the API server;
//! - [`reasons`]: the VMI reasons and Event reasons the agent writes; [`spans`]: its log spans;
//! - [`mountinfo`], [`checkpoint`], [`backoff`]: the parser, crash-safe records, the fallback wait.

pub mod agent;
pub mod backoff;
pub mod bindmount;
pub mod caps;
pub mod checkpoint;
pub mod claims;
pub mod cloudinit;
pub mod config;
pub mod consolelog;
pub mod devprog;
pub mod hotplug;
pub mod metrics;
pub mod mountinfo;
pub mod reasons;
pub mod seen;
pub mod source;
pub mod spans;
pub mod supervise;
pub mod tunnel;
pub mod worker;
