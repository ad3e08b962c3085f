//! The guests' serial logs stay bounded.
//!
//! QEMU appends every byte a guest prints to `RUN_DIR/serial.log` (`logappend=on`, so the file is
//! open with `O_APPEND`). A guest that prints without end would fill the node's disk. Every
//! [`PERIOD`] the agent looks at each run dir's log; one larger than the cap is rotated: its last
//! quarter is kept in `serial.log.1` (0600) and `serial.log` is truncated, so QEMU's next write
//! lands at its new end. A log can thus exceed the cap by what the guest prints in one period.
//!
//! # Caveats
//! Bytes the guest prints between the copy and the truncation are lost (microseconds); a
//! console client attached to the serial socket sees everything regardless.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

/// How often the logs are looked at: a stat per VM per period.
pub const PERIOD: Duration = Duration::from_secs(30);

/// The default cap of one guest's serial log.
pub const DEFAULT_MAX: u64 = 8 << 20;

/// Rotates `log` if it is larger than `max`. Returns whether it did.
///
/// # Errors
/// When the log or its rotated copy cannot be read or written.
pub fn rotate_if_larger(log: &Path, max: u64) -> std::io::Result<bool> {
    let mut f = match std::fs::OpenOptions::new().read(true).write(true).open(log) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    if len <= max {
        return Ok(false);
    }
    let keep = max / 4;
    f.seek(SeekFrom::Start(len - keep))?;
    let mut tail = Vec::with_capacity(usize::try_from(keep).unwrap_or(0));
    Read::by_ref(&mut f).take(keep).read_to_end(&mut tail)?;
    let rotated = log.with_extension("log.1");
    let mut out = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&rotated)?;
    out.write_all(&tail)?;
    f.set_len(0)?;
    Ok(true)
}

/// Rotates, every [`PERIOD`], the serial log of every run dir under `vmis_dir` that exceeds
/// `max`. Runs until dropped.
pub async fn keep_bounded(vmis_dir: std::path::PathBuf, max: u64) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let dir = vmis_dir.clone();
        let rotated = tokio::task::spawn_blocking(move || {
            let mut rotated = Vec::new();
            for run_dir in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let log = run_dir.path().join("serial.log");
                match rotate_if_larger(&log, max) {
                    Ok(true) => rotated.push(log),
                    Ok(false) => {}
                    Err(e) => tracing::warn!("cannot rotate {}: {e}", log.display()),
                }
            }
            rotated
        })
        .await
        .unwrap_or_default();
        for log in rotated {
            tracing::info!("rotated {} (over {max} bytes): its last quarter is in serial.log.1", log.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_over_the_cap_keeps_its_last_quarter_and_starts_again() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("serial.log");
        let text: Vec<u8> = (0..4000u32).flat_map(|i| format!("line {i:04}\n").into_bytes()).collect();
        std::fs::write(&log, &text).unwrap();
        // The writer keeps its O_APPEND handle across the rotation, as QEMU does.
        let mut qemu = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        assert!(!rotate_if_larger(&log, text.len() as u64).unwrap(), "at the cap: nothing to do");
        assert!(rotate_if_larger(&log, 4000).unwrap());
        assert_eq!(std::fs::read(dir.path().join("serial.log.1")).unwrap(), text[text.len() - 1000..]);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        qemu.write_all(b"after\n").unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"after\n", "the next write lands at the new start, not after a hole");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(dir.path().join("serial.log.1")).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_missing_log_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!rotate_if_larger(&dir.path().join("serial.log"), 1).unwrap());
    }
}
