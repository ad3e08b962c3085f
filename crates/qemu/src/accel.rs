//! Choosing the accelerator. `auto` must never settle on one that cannot run the guest.
//!
//! Probe: KVM is used only when `/dev/kvm` opens read-write **and** the KVM implementation is not
//! `kvm_pvm` (seen in `/sys/module`, which lists built-in modules too, or `/proc/modules`, which
//! some kernels do not have). `kvm_pvm` is a paravirtualised nested KVM: QMP's `query-kvm` reports it enabled and
//! SeaBIOS runs, yet a stock Linux kernel spends minutes in its decompressor and then hangs
//! (measured on the project's machines; `reference/qemu-lab.md` §3). Everything else gets TCG,
//! with the reason.

use std::fmt;
use std::path::Path;

/// The accelerator setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Accel {
    #[default]
    Auto,
    Kvm,
    Tcg,
}

impl std::str::FromStr for Accel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Accel::Auto),
            "kvm" => Ok(Accel::Kvm),
            "tcg" => Ok(Accel::Tcg),
            other => Err(format!("unknown accelerator {other:?}: use auto, kvm or tcg")),
        }
    }
}

/// The accelerator QEMU will run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    Kvm,
    Tcg,
}

impl fmt::Display for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resolved::Kvm => "kvm",
            Resolved::Tcg => "tcg",
        })
    }
}

/// A decision and why it was taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub accel: Resolved,
    pub reason: String,
}

/// Resolves `setting` on this host.
#[must_use]
pub fn resolve(setting: Accel) -> Choice {
    let pvm = Path::new("/sys/module/kvm_pvm").exists()
        || std::fs::read_to_string("/proc/modules").unwrap_or_default().lines().any(|l| l.split_whitespace().next() == Some("kvm_pvm"));
    resolve_with(setting, Path::new("/dev/kvm"), pvm)
}

/// [`resolve`] with the probed inputs given (for tests).
#[must_use]
pub fn resolve_with(setting: Accel, dev_kvm: &Path, kvm_pvm: bool) -> Choice {
    match setting {
        Accel::Tcg => Choice { accel: Resolved::Tcg, reason: "TCG requested".into() },
        Accel::Kvm => Choice { accel: Resolved::Kvm, reason: "KVM requested".into() },
        Accel::Auto => {
            if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(dev_kvm) {
                return Choice {
                    accel: Resolved::Tcg,
                    reason: format!("{} cannot be opened ({e}); using TCG (software emulation)", dev_kvm.display()),
                };
            }
            if kvm_pvm {
                return Choice {
                    accel: Resolved::Tcg,
                    reason: "/dev/kvm is kvm_pvm, a paravirtualised nested KVM that hangs Linux guests in early boot; using TCG (software emulation)"
                        .into(),
                };
            }
            Choice { accel: Resolved::Kvm, reason: format!("{} is usable", dev_kvm.display()) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_avoids_kvm_pvm_and_missing_kvm() {
        let dir = tempfile::tempdir().unwrap();
        let kvm = dir.path().join("kvm");
        std::fs::write(&kvm, "").unwrap();
        assert_eq!(resolve_with(Accel::Auto, &kvm, true).accel, Resolved::Tcg);
        assert!(resolve_with(Accel::Auto, &kvm, true).reason.contains("kvm_pvm"));
        assert_eq!(resolve_with(Accel::Auto, &kvm, false).accel, Resolved::Kvm);
        assert_eq!(resolve_with(Accel::Auto, &dir.path().join("missing"), false).accel, Resolved::Tcg);
        assert_eq!(resolve_with(Accel::Tcg, &kvm, false).accel, Resolved::Tcg);
    }
}
