//! The only crate that knows QEMU.
//!
//! - [`accel`]: choosing KVM or TCG, never an accelerator that cannot run the guest.
//! - [`cmdline`]: the command line of a VMI (q35, hot-plug SCSI bus, AHCI CD-ROMs, kernel boot).
//! - [`firmware`]: SeaBIOS or OVMF (its flash devices and the VM's EFI variable store).
//! - [`process`]: launch in a session of its own under its seccomp sandbox (or hand the launch to a
//!   launcher pod, [`launcher`]), adopt from the pidfile, stop by PID.
//! - [`qmp`]: the QMP seam ([`qmp::Monitor`]), its async client with SCM_RIGHTS fd passing
//!   ([`Qmp`]), and a scripted fake for tests.
//! - [`machine`]: [`Machine`], the operations on one running QEMU: raw commands, boot order, shutdown.
//! - [`hotplug`]: attach (stage, plug) and detach of disks and LUNs.
//! - [`media`]: CD-ROM media insert, swap, eject.
//! - [`inventory`]: what QEMU holds, and the leftovers of an interrupted operation.
//! - [`names`]: a volume's device id and block node name.
//! - [`nic`]: the guest's NICs on QEMU user-mode networks, and their forwarded host ports.
//! - [`console`]: the guest's serial console, line by line.

pub mod accel;
pub mod bootfiles;
pub mod cmdline;
pub mod console;
pub mod firmware;
pub mod hotplug;
pub mod inventory;
pub mod launcher;
pub mod machine;
pub mod media;
pub mod names;
pub mod nic;
pub mod opts;
pub mod process;
pub mod qmp;

pub use accel::Accel;
pub use cmdline::LaunchSpec;
pub use firmware::Firmware;
pub use hotplug::{Attach, DeviceKind, OpError, Source, Staged, Unplugging, UNPLUG_DEADLINE};
pub use inventory::{Attached, Drive, Inventory};
pub use machine::Machine;
pub use names::{device_id, node_name};
pub use qmp::{Monitor, Qmp, QmpError};
