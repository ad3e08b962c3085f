//! The node agent's own records, written crash-safely: temp file, fsync, rename, fsync of the
//! directory (never rewritten in place; a crash leaves the old or the new file, whole).
//!
//! What is recorded is only what QEMU cannot tell after a restart: which VMI a QEMU belongs to
//! ([`VmiRecord`], next to the QEMU's run dir), and in bind-mount mode the targets made in its
//! namespace (`mounts.json`, see [`crate::bindmount`]). What is attached is asked of QEMU.

use std::io::Write;
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

/// Writes `bytes` to `path` atomically and durably.
///
/// # Errors
/// When any step fails; `path` then still holds its previous content (or does not exist).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let err = |what| move |source| CheckpointError { what, path: path.to_owned(), source };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(err("create the directory of"))?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(err("create a temp file for"))?;
    f.write_all(bytes).map_err(err("write"))?;
    f.sync_all().map_err(err("fsync"))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err("rename into"))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err("fsync the directory of"))?;
    Ok(())
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
    }
}
