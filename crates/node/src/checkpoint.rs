//! The node agent's own records, written crash-safely: temp file, fsync, rename, fsync of the
//! directory (never rewritten in place; a crash leaves the old or the new file, whole).
//!
//! What is recorded is only what QEMU cannot tell after a restart: which VMI a QEMU belongs to
//! ([`VmiRecord`], next to the QEMU's run dir), and in bind-mount mode the targets made in its
//! namespace (`mounts.json`, see [`crate::bindmount`]). What is attached is asked of QEMU.
//!
//! Run dirs are private (0700: the QMP socket in them controls a root QEMU) and so are the files
//! the agent creates there (0600: records, `emptyDisk` images), from their creation.

use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Which VMI the QEMU in this directory runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmiRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Bind-mount mode: the VM's devices cgroup, removed when the VM is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
}

/// A record that could not be written or read, with its path.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} {path}")]
pub struct CheckpointError {
    pub what: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Writes `bytes` to `path` atomically and durably, mode 0600 from its creation, with
/// [`durable::write_atomic`] (a temp file unique to this call, fsync, rename, fsync of the
/// directory). A missing directory is created 0700.
///
/// # Errors
/// When any step fails; `path` then still holds its previous content (or does not exist), and
/// the temp file is removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    create_private_dir(dir).map_err(|source| CheckpointError { what: "create the directory of", path: path.to_owned(), source })?;
    durable::write_atomic(path, bytes, 0o600).map_err(|e| CheckpointError { what: e.step.as_str(), path: e.path, source: e.source })
}

/// Creates `dir` (and missing parents) with mode 0700; an existing one is left as it is.
///
/// # Errors
/// As `mkdir`.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Creates the new file `path` with mode 0600 (`O_CREAT|O_EXCL`).
///
/// # Errors
/// As `open`; `AlreadyExists` if it exists.
pub fn create_private_file(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)
}

/// Writes the record of the VMI whose QEMU runs in `run_dir`.
///
/// # Errors
/// As [`write_atomic`].
pub fn write_record(run_dir: &Path, record: &VmiRecord) -> Result<(), CheckpointError> {
    let bytes =
        serde_json::to_vec_pretty(record).map_err(|e| CheckpointError { what: "encode", path: run_dir.to_owned(), source: e.into() })?;
    write_atomic(&run_dir.join("vmi.json"), &bytes)
}

/// Every `(run dir, record)` under `vmis_dir`; unreadable records are skipped with a warning.
#[must_use]
pub fn records(vmis_dir: &Path) -> Vec<(PathBuf, VmiRecord)> {
    let Ok(entries) = std::fs::read_dir(vmis_dir) else { return Vec::new() };
    entries.flatten().filter_map(|e| read_record(&e.path()).map(|r| (e.path(), r))).collect()
}

/// The record of the run dir `run_dir`, if it has a readable one (an unreadable one is logged).
#[must_use]
pub fn read_record(run_dir: &Path) -> Option<VmiRecord> {
    let path = run_dir.join("vmi.json");
    let text = std::fs::read(&path).ok()?;
    serde_json::from_slice(&text).map_err(|err| tracing::warn!("ignoring the unreadable record {}: {err}", path.display())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("u1");
        let r = VmiRecord { namespace: "default".into(), name: "vm".into(), uid: "u1".into(), cgroup: None };
        write_record(&run, &r).unwrap();
        write_record(&run, &r).unwrap();
        assert_eq!(records(dir.path()), [(run.clone(), r)]);
        let names: Vec<_> = std::fs::read_dir(&run).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["vmi.json"]);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&run).unwrap().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(run.join("vmi.json")).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn concurrent_writers_of_two_files_never_share_a_temp_file() {
        // The old temp name was `NAME.tmp.<pid>`: two tasks of one agent writing the same file
        // shared it (one renamed the other's half-written file into place).
        let dir = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let dir = dir.path().to_owned();
                std::thread::spawn(move || {
                    let body = format!("{i}").repeat(20_000);
                    for _ in 0..20 {
                        write_atomic(&dir.join(if i % 2 == 0 { "a.json" } else { "b.json" }), body.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for f in ["a.json", "b.json"] {
            let text = std::fs::read_to_string(dir.path().join(f)).unwrap();
            assert_eq!(text, text[..1].repeat(20_000), "{f} holds one whole write");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "no temp file left");
    }
}
