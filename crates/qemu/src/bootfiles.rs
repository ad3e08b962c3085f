//! Which host files a VMI may hand to QEMU by path: `kernelBoot`'s `kernelPath` and
//! `initrdPath` name files on the node, and QEMU runs as root, so a spec must never make it read
//! an arbitrary host file (say `/etc/shadow` as an initrd the guest can then read).
//!
//! # Guarantees
//! A path is accepted only when it is absolute, has no comma (QEMU's multiboot loader splits
//! `-initrd` at commas into several files), and resolves (symlinks followed, `..` removed) to a
//! regular file inside one of the allowed directories. The resolved path is what QEMU is given.
//!
//! # Assumptions
//! The allowed directories are writable only by whoever runs the node agent (the data dir is
//! 0700; the test-guest cache is the operator's): a file swapped there between the check and
//! QEMU's open was put there by someone who could run QEMU anyway.

use std::path::{Path, PathBuf};

/// A path refused for a field of the spec (its message says why and what to do).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct Refused {
    pub field: String,
    pub message: String,
}

/// The directories kernels and initrds may come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedDirs {
    dirs: Vec<PathBuf>,
}

impl AllowedDirs {
    /// The given directories; those that do not exist are kept (they allow nothing until they
    /// do).
    #[must_use]
    pub fn new(dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        AllowedDirs { dirs: dirs.into_iter().collect() }
    }

    /// The default: the node's data dir and the test-guest cache (`$VIRTPLUG_GUEST_DIR`, else
    /// this source tree's `.cache/guest`, where `scripts/build-test-guest.sh` puts it).
    #[must_use]
    pub fn defaults(data_dir: &Path) -> Self {
        let guest = std::env::var_os("VIRTPLUG_GUEST_DIR")
            .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/guest"), PathBuf::from);
        AllowedDirs::new([data_dir.to_owned(), guest])
    }

    /// The configured directories, for messages and the README.
    #[must_use]
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Resolves `path` (the value of spec field `field`) to the file QEMU may open.
    ///
    /// # Errors
    /// [`Refused`] naming the field when the path is relative, has a comma, or is not a regular
    /// file inside an allowed directory. The message is the same whether the file is missing
    /// or outside, so a spec cannot probe the host's files.
    pub fn resolve(&self, path: &str, field: &str) -> Result<PathBuf, Refused> {
        let invalid = |message: String| Refused { field: field.to_owned(), message };
        if !path.starts_with('/') {
            return Err(invalid(format!("{path:?} is not an absolute path; give the host path of the file")));
        }
        if path.contains(',') {
            return Err(invalid(format!("{path:?} contains a comma, which QEMU would read as a list of files; rename the file")));
        }
        let outside = || {
            let dirs: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
            invalid(format!(
                "{path:?} is not a regular file inside the directories this node boots kernels from ({}); \
                 copy it there, or start the node agent with --boot-file-dir DIR",
                dirs.join(", ")
            ))
        };
        let resolved = std::fs::canonicalize(path).map_err(|_| outside())?;
        let inside = self.dirs.iter().filter_map(|d| std::fs::canonicalize(d).ok()).any(|d| resolved.starts_with(&d));
        let regular = std::fs::metadata(&resolved).is_ok_and(|m| m.is_file());
        if inside && regular {
            Ok(resolved)
        } else {
            Err(outside())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, AllowedDirs) {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("allowed")).unwrap();
        std::fs::write(t.path().join("allowed/vmlinuz"), b"k").unwrap();
        std::fs::write(t.path().join("secret"), b"s").unwrap();
        let dirs = AllowedDirs::new([t.path().join("allowed")]);
        (t, dirs)
    }

    #[test]
    fn a_file_inside_an_allowed_dir_resolves() {
        let (t, dirs) = setup();
        let p = t.path().join("allowed/vmlinuz");
        assert_eq!(dirs.resolve(p.to_str().unwrap(), "f").unwrap(), std::fs::canonicalize(&p).unwrap());
    }

    #[test]
    fn host_files_outside_are_refused_by_field_without_telling_whether_they_exist() {
        let (t, dirs) = setup();
        let secret = t.path().join("secret");
        let missing = t.path().join("missing");
        let e1 = dirs.resolve(secret.to_str().unwrap(), "spec.k").unwrap_err().to_string();
        let e2 = dirs.resolve(missing.to_str().unwrap(), "spec.k").unwrap_err().to_string();
        assert!(e1.starts_with("spec.k: ") && e1.contains("--boot-file-dir"), "{e1}");
        assert_eq!(e1.replace("secret", "X"), e2.replace("missing", "X"), "the same answer for a missing and a forbidden file");
        for p in ["/etc/shadow", "/proc/self/environ", "/dev/sda"] {
            assert!(dirs.resolve(p, "f").is_err(), "{p}");
        }
    }

    #[test]
    fn dot_dot_and_symlinks_out_of_the_dir_are_refused() {
        let (t, dirs) = setup();
        let up = format!("{}/allowed/../secret", t.path().display());
        assert!(dirs.resolve(&up, "f").is_err());
        std::os::unix::fs::symlink(t.path().join("secret"), t.path().join("allowed/link")).unwrap();
        assert!(dirs.resolve(t.path().join("allowed/link").to_str().unwrap(), "f").is_err());
        assert!(dirs.resolve(t.path().join("allowed").to_str().unwrap(), "f").is_err(), "a directory is not a kernel");
    }

    #[test]
    fn relative_paths_and_commas_are_refused() {
        let (t, dirs) = setup();
        assert!(dirs.resolve("allowed/vmlinuz", "f").unwrap_err().to_string().contains("absolute"));
        let comma = format!("{}/allowed/vmlinuz,/etc/shadow", t.path().display());
        assert!(dirs.resolve(&comma, "f").unwrap_err().to_string().contains("comma"));
    }
}
