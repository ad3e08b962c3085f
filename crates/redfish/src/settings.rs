//! What the service keeps in its data dir (`DIR/service.json`, written atomically): the service
//! UUID (ServiceRoot `UUID`, stable across restarts, as DSP0266 requires of it) and the
//! `SessionTimeout` last PATCHed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sessions::DEFAULT_TIMEOUT;

/// The persisted settings.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub uuid: String,
    pub session_timeout: u64,
}

/// Errors reading or writing the settings file.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a settings file; move it away to start with new settings (a new service UUID)", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Write(#[from] durable::WriteError),
}

/// The file of `dir`.
#[must_use]
pub fn path(dir: &Path) -> PathBuf {
    dir.join("service.json")
}

/// Loads the settings, creating them (a new random UUID, the default timeout) on first start.
///
/// # Errors
/// An unreadable or malformed file (never silently replaced: the UUID must not change).
pub fn load(dir: &Path) -> Result<Settings, SettingsError> {
    let p = path(dir);
    match std::fs::read(&p) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| SettingsError::Parse { path: p, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let s = Settings { uuid: uuid::Uuid::new_v4().to_string(), session_timeout: DEFAULT_TIMEOUT };
            save(dir, &s)?;
            Ok(s)
        }
        Err(source) => Err(SettingsError::Read { path: p, source }),
    }
}

/// Writes the settings (temp file, fsync, rename).
///
/// # Errors
/// The write's.
pub fn save(dir: &Path, s: &Settings) -> Result<(), SettingsError> {
    let bytes = serde_json::to_vec_pretty(s).unwrap_or_default();
    durable::write_atomic(&path(dir), &bytes, 0o600)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uuid_survives_a_restart_and_a_bad_file_is_not_replaced() {
        let d = tempfile::tempdir().unwrap();
        let first = load(d.path()).unwrap();
        assert_eq!(load(d.path()).unwrap(), first);
        std::fs::write(path(d.path()), b"garbage").unwrap();
        assert!(matches!(load(d.path()), Err(SettingsError::Parse { .. })));
        assert_eq!(std::fs::read(path(d.path())).unwrap(), b"garbage");
    }
}
