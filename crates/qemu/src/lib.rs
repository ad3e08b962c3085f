//! The only crate that knows QEMU.
//!
//! - [`accel`]: choosing KVM or TCG, never an accelerator that cannot run the guest.
//! - [`cmdline`]: the command line of a VMI (q35, hot-plug SCSI bus, AHCI CD-ROMs, kernel boot).
//! - [`process`]: launch in a session of its own under its seccomp sandbox, adopt from the pidfile, stop by PID.
//! - [`qmp`]: the async QMP client with SCM_RIGHTS fd passing.
//! - [`ops`]: attach, detach, media insert/eject/swap, what is attached, boot order, shutdown.
//! - [`console`]: the guest's serial console, line by line.

pub mod accel;
pub mod bootfiles;
pub mod cmdline;
pub mod console;
pub mod ops;
pub mod opts;
pub mod process;
pub mod qmp;

pub use accel::Accel;
pub use cmdline::LaunchSpec;
pub use ops::{Attach, DeviceKind, Machine, OpError, Source};
pub use qmp::{Qmp, QmpError};
