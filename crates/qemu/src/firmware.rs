//! The guest's firmware: SeaBIOS (QEMU's default) or OVMF (UEFI, `bootloader.efi`).
//!
//! # Flow
//! OVMF runs from two flash devices, as libvirt (and so KubeVirt) gives it: pflash0 the firmware
//! code, read-only, shared by every VM; pflash1 the VM's own variable store (NVRAM: boot
//! entries, boot order, settings), writable. Each is a `-blockdev` (JSON, like the disks) that
//! `-machine q35,pflash0=…,pflash1=…` names. [`Firmware::prepare_vars`] copies the variable
//! store from the package's template into the run dir before the first launch.
//!
//! # Guarantees
//! - A VMI never chooses a firmware file: [`Firmware::efi`] takes [`OVMF_CODE`] and
//!   [`OVMF_VARS_TEMPLATE`], constants; only the run dir (the node's) places the copy.
//! - The variable store outlives QEMU: a restart with the same run dir keeps what the guest
//!   wrote there (KubeVirt's `efi.persistent`, here always). It is never rewritten by us once it
//!   exists; a new one appears whole or not at all (temp file, fsync, rename, fsync the dir).
//!
//! # Assumptions
//! Debian's `ovmf` package (`scripts/install-deps.sh`): the 4 MiB build without secure boot,
//! which needs no SMM, so it runs under TCG and KVM alike. Admission refuses `secureBoot: true`.
//!
//! # Caveats
//! GRUB 2.06's EFI loader fails with "out of memory" on a 256 MiB guest that SeaBIOS boots
//! fine (measured with the test guest's images; 512 MiB boots): OVMF keeps more memory.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::opts::Opts;

/// OVMF's code (pflash0): Debian's 4 MiB build without secure boot.
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
/// The empty variable store each VM starts from (copied, never used in place).
pub const OVMF_VARS_TEMPLATE: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// The VM's variable store in its run dir.
pub const VARS_FILE: &str = "efivars.fd";
/// Block node names of the two flash devices.
pub const CODE_NODE: &str = "ovmf-code";
pub const VARS_NODE: &str = "ovmf-vars";

/// The firmware QEMU starts the guest with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS, QEMU's built-in default (no option needed).
    #[default]
    Bios,
    /// OVMF: `code` read-only, `vars` the VM's writable variable store.
    Efi { code: PathBuf, vars: PathBuf },
}

/// The variable store could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot create the EFI variable store {path} from {template}")]
pub struct VarsError {
    pub path: PathBuf,
    pub template: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl Firmware {
    /// OVMF from Debian's package, with the variable store of the VM whose run dir is `run_dir`.
    #[must_use]
    pub fn efi(run_dir: &Path) -> Firmware {
        Firmware::Efi { code: PathBuf::from(OVMF_CODE), vars: run_dir.join(VARS_FILE) }
    }

    /// The `-machine` argument: q35, with the flash devices for OVMF.
    pub(crate) fn machine_arg(&self) -> String {
        match self {
            Firmware::Bios => "q35".to_owned(),
            Firmware::Efi { .. } => Opts::implied("q35").set("pflash0", CODE_NODE).set("pflash1", VARS_NODE).build(),
        }
    }

    /// The `-blockdev` arguments of the flash devices (none for SeaBIOS).
    pub(crate) fn blockdev_args(&self) -> Vec<String> {
        let Firmware::Efi { code, vars } = self else { return Vec::new() };
        let node = |name: &str, path: &Path, ro: bool| {
            json!({"driver": "raw", "node-name": name, "read-only": ro,
                   "file": {"driver": "file", "filename": path.display().to_string(), "read-only": ro}})
            .to_string()
        };
        vec!["-blockdev".to_owned(), node(CODE_NODE, code, true), "-blockdev".to_owned(), node(VARS_NODE, vars, false)]
    }

    /// Creates the variable store from [`OVMF_VARS_TEMPLATE`] when it does not exist yet; an
    /// existing one is kept as it is (the guest's boot entries and settings live there).
    ///
    /// # Errors
    /// [`VarsError`] with the store's path: the template is missing (the `ovmf` package is not
    /// installed) or the run dir is not writable.
    pub fn prepare_vars(&self) -> Result<(), VarsError> {
        match self {
            Firmware::Bios => Ok(()),
            Firmware::Efi { vars, .. } => copy_new(Path::new(OVMF_VARS_TEMPLATE), vars),
        }
    }
}

/// Copies `template` to `path` unless `path` exists, crash-safe: a temp file next to it,
/// fsync, rename, fsync the directory, so a crash leaves no half-written store behind.
fn copy_new(template: &Path, path: &Path) -> Result<(), VarsError> {
    if path.exists() {
        return Ok(());
    }
    let err = |source| VarsError { path: path.to_owned(), template: template.to_owned(), source };
    let data = std::fs::read(template).map_err(err)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("fd.tmp");
    let write = || -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(&data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efi_uses_the_package_files_and_the_run_dir() {
        let f = Firmware::efi(Path::new("/run/vm1"));
        assert_eq!(f, Firmware::Efi { code: OVMF_CODE.into(), vars: "/run/vm1/efivars.fd".into() });
        assert_eq!(f.machine_arg(), "q35,pflash0=ovmf-code,pflash1=ovmf-vars");
        assert_eq!(
            f.blockdev_args(),
            [
                "-blockdev",
                r#"{"driver":"raw","node-name":"ovmf-code","read-only":true,"file":{"driver":"file","filename":"/usr/share/OVMF/OVMF_CODE_4M.fd","read-only":true}}"#,
                "-blockdev",
                r#"{"driver":"raw","node-name":"ovmf-vars","read-only":false,"file":{"driver":"file","filename":"/run/vm1/efivars.fd","read-only":false}}"#,
            ]
        );
        assert_eq!(Firmware::Bios.machine_arg(), "q35");
        assert!(Firmware::Bios.blockdev_args().is_empty());
    }

    #[test]
    fn the_variable_store_is_created_once_and_then_kept() {
        let t = tempfile::tempdir().unwrap();
        let template = t.path().join("template.fd");
        std::fs::write(&template, b"empty store").unwrap();
        let vars = t.path().join("run/efivars.fd");
        std::fs::create_dir(t.path().join("run")).unwrap();
        copy_new(&template, &vars).unwrap();
        assert_eq!(std::fs::read(&vars).unwrap(), b"empty store");
        // What the guest wrote survives the next launch.
        std::fs::write(&vars, b"boot entries").unwrap();
        copy_new(&template, &vars).unwrap();
        assert_eq!(std::fs::read(&vars).unwrap(), b"boot entries");
        assert!(!vars.with_extension("fd.tmp").exists());
    }

    #[test]
    fn a_missing_template_names_both_paths() {
        let t = tempfile::tempdir().unwrap();
        let e = copy_new(&t.path().join("none.fd"), &t.path().join("vars.fd")).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("vars.fd") && msg.contains("none.fd"), "{msg}");
        assert!(!t.path().join("vars.fd").exists());
    }
}
