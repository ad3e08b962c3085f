//! Crash-safe files: [`write_atomic`] replaces a whole file so that a crash (even power loss, as
//! far as the disk honours fsync) leaves either the old content or the new, never a mix, never
//! an empty file, and never a copy readable with a looser mode than asked for.
//!
//! The one writer of the API server's credentials and kubeconfig and the node agent's
//! checkpoints (DESIGN: "Checkpoints are written atomically (temp file, fsync, rename, fsync of
//! the directory)"; STYLE: "Crash-safe files ... Never rewrite in place").
//!
//! It blocks (two fsyncs): async callers run it off the reactor (`spawn_blocking`) unless it is
//! a one-off at start.

use std::ffi::OsStr;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The step of [`write_atomic`] that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Creating the temp file next to the target.
    CreateTemp,
    /// Writing the bytes into the temp file.
    Write,
    /// Flushing the temp file to the disk.
    Fsync,
    /// Renaming the temp file over the target.
    Rename,
    /// Flushing the directory, so the rename itself survives a crash.
    FsyncDir,
}

impl Step {
    /// The step as the verb of an error message ("cannot {step} {path}").
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Step::CreateTemp => "create a temp file for",
            Step::Write => "write",
            Step::Fsync => "fsync",
            Step::Rename => "rename into",
            Step::FsyncDir => "fsync the directory of",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A file that could not be written: which step failed, on which target.
#[derive(Debug, thiserror::Error)]
#[error("cannot {step} {}", path.display())]
pub struct WriteError {
    pub step: Step,
    /// The target (not the temp file).
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Writes `bytes` to `path` atomically and durably, the file having `mode` (less the umask) from
/// its creation.
///
/// # Flow
/// A temp file unique to this call (`.NAME.<random>.tmp` next to `path`, created with
/// `O_CREAT|O_EXCL` and `mode`, so never shared with another target or another writer and never
/// readable with a looser mode), write, fsync, rename over `path`, fsync the directory.
///
/// # Assumptions
/// The directory of `path` exists (callers create it with the mode they want).
///
/// # Errors
/// [`WriteError`] naming the step and `path`; `path` then still holds its previous content (or
/// does not exist), and the temp file is removed. After a failed [`Step::FsyncDir`] the new
/// content is in place but may not survive a crash.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), WriteError> {
    let err = |step| move |source| WriteError { step, path: path.to_owned(), source };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name =
        path.file_name().ok_or_else(|| err(Step::CreateTemp)(io::Error::new(io::ErrorKind::InvalidInput, "the path names no file")))?;
    let (tmp, mut f) = create_temp(dir, name, mode).map_err(err(Step::CreateTemp))?;
    let written = f.write_all(bytes).map_err(err(Step::Write)).and_then(|()| f.sync_all().map_err(err(Step::Fsync)));
    drop(f);
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path).map_err(err(Step::Rename))) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(err(Step::FsyncDir))
}

/// Creates a new temp file for `name` in `dir` with `mode`.
fn create_temp(dir: &Path, name: &OsStr, mode: u32) -> io::Result<(PathBuf, File)> {
    for _ in 0..8 {
        let tmp = dir.join(format!(".{}.{:016x}.tmp", name.to_string_lossy(), rand::random::<u64>()));
        match OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, "no unused temp file name after 8 tries"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn the_file_has_its_mode_and_no_temp_file_is_left() {
        let t = tempfile::tempdir().unwrap();
        write_atomic(&t.path().join("key"), b"secret", 0o600).unwrap();
        write_atomic(&t.path().join("crt"), b"public", 0o644).unwrap();
        write_atomic(&t.path().join("key"), b"secret 2", 0o600).unwrap();
        assert_eq!(fs::read(t.path().join("key")).unwrap(), b"secret 2");
        assert_eq!(fs::metadata(t.path().join("key")).unwrap().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(t.path().join("crt")).unwrap().mode() & 0o777, 0o644 & !umask());
        assert_eq!(names(t.path()), ["crt", "key"]);
    }

    fn umask() -> u32 {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("probe");
        OpenOptions::new().write(true).create_new(true).mode(0o777).open(&p).unwrap();
        !fs::metadata(&p).unwrap().mode() & 0o777
    }

    #[test]
    fn a_failed_write_keeps_the_old_content_and_removes_its_temp_file() {
        let t = tempfile::tempdir().unwrap();
        // A non-empty directory at the target: the rename fails after the temp file is written.
        let target = t.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("old"), b"old").unwrap();
        let e = write_atomic(&target, b"new", 0o600).unwrap_err();
        assert_eq!(e.step, Step::Rename);
        assert_eq!(e.path, target);
        assert_eq!(e.to_string(), format!("cannot rename into {}", target.display()));
        assert_eq!(fs::read(target.join("old")).unwrap(), b"old");
        assert_eq!(names(t.path()), ["target"], "the temp file is removed");
    }

    #[test]
    fn two_targets_and_concurrent_writers_never_share_a_temp_file() {
        let t = tempfile::tempdir().unwrap();
        // Old code: `a.key` and `a.crt` both used `a.tmp`; concurrent writers of one file too
        // (the node agent's was `NAME.tmp.<pid>`: two tasks of one agent shared it, and one
        // renamed the other's half-written file into place).
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let dir = t.path().to_owned();
                std::thread::spawn(move || {
                    let target = dir.join(if i % 2 == 0 { "a.key" } else { "a.crt" });
                    let body = format!("{i}").repeat(10_000);
                    for _ in 0..20 {
                        write_atomic(&target, body.as_bytes(), 0o600).unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        for f in ["a.key", "a.crt"] {
            let text = fs::read_to_string(t.path().join(f)).unwrap();
            let first = &text[..text.len() / 10_000];
            assert_eq!(text, first.repeat(10_000), "{f} holds one whole write");
        }
        assert_eq!(names(t.path()), ["a.crt", "a.key"], "no temp file left");
    }
}
