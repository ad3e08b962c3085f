//! Where an import writes, opened without following symbolic links.
//!
//! # Flow
//! - `Filesystem` claim: a fresh file `ROOT/<uid>/.disk.img.import-<random>` (mode 0600,
//!   `O_EXCL`), reached with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the storage
//!   root, so neither the claim's directory nor the file may be a symlink. [`Target::commit`]
//!   gives it the image's size, syncs it and renames it over `disk.img` (then syncs the
//!   directory): a failed or cancelled import leaves the blank image as it was, never a half
//!   image, and a symlink planted at `disk.img` is replaced, never written through.
//! - `Block` claim: its loop device, opened `O_NOFOLLOW` and checked to be a block device,
//!   written in place.
//! - A qcow2 source is downloaded first into a [`Scratch`] file beside the image
//!   (`.disk.img.import-<random>.qcow2`, or `.block.img.…` beside a Block claim's backing
//!   file), created the same way, then converted into the target by `qemu-img`, which is given
//!   only these two paths.
//!
//! # Guarantees
//! Dropping an uncommitted `Target` removes its temp file, and dropping a `Scratch` its file
//! (also when the import is cancelled mid-transfer). Temp files left by a crashed controller
//! are removed by the next attempt.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::super::{data_path, requested_bytes, VolumeMode};

/// Why the target could not be opened or finished.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("claim {claim} has no backing on this node yet")]
    NoBacking { claim: String },
    #[error("{path} is a symbolic link or under one; imports do not follow symbolic links")]
    Symlink { path: PathBuf },
    #[error("{path} is not a block device")]
    NotBlockDevice { path: PathBuf },
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> TargetError + 'a {
    move |e| {
        if e == Errno::LOOP || e == Errno::XDEV {
            TargetError::Symlink { path: path.to_owned() }
        } else {
            TargetError::Io { what, path: path.to_owned(), source: e.into() }
        }
    }
}

enum Kind {
    /// A temp file in `dir`, renamed over `image` at commit.
    Image {
        dir: OwnedFd,
        dir_path: PathBuf,
        tmp: String,
        image: &'static str,
        size: u64,
        committed: bool,
    },
    Device {
        path: PathBuf,
    },
}

/// The claim's directory, where scratch files go.
struct ClaimDir {
    fd: OwnedFd,
    path: PathBuf,
    image: &'static str,
}

/// An open import target: see the module docs.
pub struct Target {
    file: File,
    kind: Kind,
    dir: ClaimDir,
}

/// A scratch file of the import in the claim's directory, removed on drop.
pub struct Scratch {
    file: File,
    dir: OwnedFd,
    name: String,
    path: PathBuf,
}

/// Opens `name` (one path component) under `dir` without following any symlink.
fn beneath(dir: &OwnedFd, name: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(dir, name, flags | OFlags::CLOEXEC, mode, how) {
        // Kernels before 5.6: `name` is a single component, so O_NOFOLLOW is the same guarantee.
        Err(Errno::NOSYS) => rustix::fs::openat(dir, name, flags | OFlags::CLOEXEC | OFlags::NOFOLLOW, mode),
        r => r,
    }
}

impl Target {
    /// Opens the target of claim `pvc` (named `claim`) under the storage root `root`.
    ///
    /// # Errors
    /// When the claim has no backing yet, a component is a symlink, or a file operation fails.
    pub fn open(root: &Path, pvc: &PersistentVolumeClaim, claim: &str) -> Result<Target, TargetError> {
        let no_backing = || TargetError::NoBacking { claim: claim.to_owned() };
        let uid = pvc.uid().ok_or_else(no_backing)?;
        if uid.is_empty() || uid.contains('/') || uid == "." || uid == ".." {
            return Err(no_backing());
        }
        let mode = VolumeMode::of(pvc);
        let root_fd =
            rustix::fs::open(root, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).map_err(io_err("open", root))?;
        let dir_path = root.join(&uid);
        let dir = beneath(&root_fd, &uid, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).map_err(io_err("open", &dir_path))?;
        let image = mode.image_name();
        sweep(&dir, image);
        if mode == VolumeMode::Block {
            let path = data_path(root, pvc).ok_or_else(no_backing)?;
            return Target::open_device(path, ClaimDir { fd: dir, path: dir_path, image });
        }
        let claim_dir = ClaimDir {
            fd: dir.try_clone().map_err(|source| TargetError::Io { what: "open", path: dir_path.clone(), source })?,
            path: dir_path.clone(),
            image,
        };
        let existing = rustix::fs::statat(&dir, image, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .filter(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile);
        let size = match &existing {
            Some(st) => u64::try_from(st.st_size).unwrap_or(0),
            None => requested_bytes(pvc).map_err(|_| no_backing())?,
        };
        let tmp = format!(".{image}.import-{:016x}", rand::random::<u64>());
        let tmp_path = dir_path.join(&tmp);
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
        let fd = beneath(&dir, &tmp, flags, Mode::from_raw_mode(0o600)).map_err(io_err("create", &tmp_path))?;
        let target =
            Target { file: File::from(fd), kind: Kind::Image { dir, dir_path, tmp, image, size, committed: false }, dir: claim_dir };
        // The image's owner carries over (a QEMU that runs as another user must still open it).
        if let Some(st) = existing {
            let st_new = rustix::fs::fstat(&target.file).map_err(io_err("stat", &tmp_path))?;
            if (st.st_uid, st.st_gid) != (st_new.st_uid, st_new.st_gid) {
                let (uid, gid) = (rustix::fs::Uid::from_raw(st.st_uid), rustix::fs::Gid::from_raw(st.st_gid));
                rustix::fs::fchown(&target.file, Some(uid), Some(gid)).map_err(io_err("change the owner of", &tmp_path))?;
            }
        }
        Ok(target)
    }

    fn open_device(path: PathBuf, dir: ClaimDir) -> Result<Target, TargetError> {
        let fd =
            rustix::fs::open(&path, OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()).map_err(io_err("open", &path))?;
        let st = rustix::fs::fstat(&fd).map_err(io_err("stat", &path))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::BlockDevice {
            return Err(TargetError::NotBlockDevice { path });
        }
        Ok(Target { file: File::from(fd), kind: Kind::Device { path }, dir })
    }

    /// Whether the target is a block device (written in place, not a fresh sparse file).
    pub fn is_device(&self) -> bool {
        matches!(self.kind, Kind::Device { .. })
    }

    /// The open target, to copy into.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Makes a fresh temp image at least `len` bytes long (sparse), so that `qemu-img convert
    /// -n` finds room for a disk of `len` bytes; a device is left as it is.
    ///
    /// # Errors
    /// The resize's error, with the path.
    pub fn reserve(&mut self, len: u64) -> Result<(), TargetError> {
        if let Kind::Image { size, .. } = &self.kind {
            let len = len.max(*size);
            self.file.set_len(len).map_err(|source| TargetError::Io { what: "resize", path: self.path(), source })?;
        }
        Ok(())
    }

    /// Creates an empty scratch file beside the image: see the module docs.
    ///
    /// # Errors
    /// When it cannot be created.
    pub fn scratch(&self, suffix: &str) -> Result<Scratch, TargetError> {
        let name = format!(".{}.import-{:016x}.{suffix}", self.dir.image, rand::random::<u64>());
        let path = self.dir.path.join(&name);
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL;
        let fd = beneath(&self.dir.fd, &name, flags, Mode::from_raw_mode(0o600)).map_err(io_err("create", &path))?;
        let dir = self.dir.fd.try_clone().map_err(|source| TargetError::Io { what: "open", path: self.dir.path.clone(), source })?;
        Ok(Scratch { file: File::from(fd), dir, name, path })
    }

    /// Where the bytes go, for messages.
    pub fn path(&self) -> PathBuf {
        match &self.kind {
            Kind::Image { dir_path, tmp, .. } => dir_path.join(tmp),
            Kind::Device { path } => path.clone(),
        }
    }

    /// Appends `buf`.
    ///
    /// # Errors
    /// The write's error, with the path.
    pub fn write_all(&mut self, buf: &[u8]) -> Result<(), TargetError> {
        self.file.write_all(buf).map_err(|source| TargetError::Io { what: "write", path: self.path(), source })
    }

    /// Makes the import durable: a temp image gets the image's size, is synced, renamed over
    /// the image, and the directory synced; a device is synced.
    ///
    /// # Errors
    /// The failing step, with the path; an uncommitted temp file is removed on drop.
    pub fn commit(mut self) -> Result<(), TargetError> {
        let path = self.path();
        let io = |what: &'static str, p: &Path| {
            let p = p.to_owned();
            move |source: std::io::Error| TargetError::Io { what, path: p, source }
        };
        if let Kind::Image { size, .. } = &self.kind {
            let len = self.file.metadata().map_err(io("stat", &path))?.len();
            if len < *size {
                self.file.set_len(*size).map_err(io("resize", &path))?;
            }
        }
        self.file.sync_all().map_err(io("sync", &path))?;
        if let Kind::Image { dir, dir_path, tmp, image, committed, .. } = &mut self.kind {
            rustix::fs::renameat(&*dir, tmp.as_str(), &*dir, *image).map_err(io_err("rename", &path))?;
            *committed = true;
            rustix::fs::fsync(&*dir).map_err(io_err("sync", dir_path))?;
        }
        Ok(())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Kind::Image { dir, tmp, committed: false, .. } = &self.kind {
            // One unlink: short enough for whichever thread drops the target.
            let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
        }
    }
}

impl Scratch {
    /// The file's path, for `qemu-img` and messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `buf`.
    ///
    /// # Errors
    /// The write's error, with the path.
    pub fn write_all(&mut self, buf: &[u8]) -> Result<(), TargetError> {
        self.file.write_all(buf).map_err(|source| TargetError::Io { what: "write", path: self.path.clone(), source })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = rustix::fs::unlinkat(&self.dir, self.name.as_str(), AtFlags::empty());
    }
}

/// Removes temp files of earlier attempts on `image` in `dir` (a crashed controller's).
fn sweep(dir: &OwnedFd, image: &str) {
    let prefix = format!(".{image}.import-");
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_bytes();
        if name.starts_with(prefix.as_bytes()) {
            let _ = rustix::fs::unlinkat(dir, entry.file_name(), AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn claim(uid: &str) -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "c", "uid": uid},
            "spec": {"resources": {"requests": {"storage": "4Ki"}}}}))
        .unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_committed_import_replaces_the_image_and_keeps_its_size() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("u1");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("disk.img"), vec![0u8; 8192]).unwrap();
        std::fs::write(dir.join(".disk.img.import-0000000000000001"), b"stale").unwrap();
        let mut t = Target::open(root.path(), &claim("u1"), "c").unwrap();
        assert_eq!(names(&dir).len(), 2, "the stale temp file is gone, a new one is there: {:?}", names(&dir));
        assert_eq!(std::fs::metadata(t.path()).unwrap().permissions().mode() & 0o777, 0o600);
        t.write_all(b"hello").unwrap();
        t.commit().unwrap();
        assert_eq!(names(&dir), ["disk.img"]);
        let data = std::fs::read(dir.join("disk.img")).unwrap();
        assert_eq!((data.len(), &data[..5]), (8192, &b"hello"[..]));
    }

    #[test]
    fn a_dropped_import_leaves_the_blank_image_and_no_temp_file() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("u2");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("disk.img"), vec![0u8; 4096]).unwrap();
        let mut t = Target::open(root.path(), &claim("u2"), "c").unwrap();
        t.write_all(b"partial").unwrap();
        drop(t);
        assert_eq!(names(&dir), ["disk.img"]);
        assert!(std::fs::read(dir.join("disk.img")).unwrap().iter().all(|b| *b == 0));
    }

    #[test]
    fn symlinks_are_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        // The image is a symlink: replaced, not written through.
        std::fs::create_dir(root.path().join("u3")).unwrap();
        std::os::unix::fs::symlink(&victim, root.path().join("u3/disk.img")).unwrap();
        let mut t = Target::open(root.path(), &claim("u3"), "c").unwrap();
        t.write_all(b"data").unwrap();
        t.commit().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert!(std::fs::symlink_metadata(root.path().join("u3/disk.img")).unwrap().is_file());
        // The claim's directory is a symlink: refused.
        std::os::unix::fs::symlink(outside.path(), root.path().join("u4")).unwrap();
        let err = Target::open(root.path(), &claim("u4"), "c").err().unwrap();
        assert!(matches!(err, TargetError::Symlink { .. }), "{err}");
        assert_eq!(names(outside.path()), ["victim"]);
        // A UID that is not one path component is no backing at all.
        assert!(matches!(Target::open(root.path(), &claim(".."), "c"), Err(TargetError::NoBacking { .. })));
    }
}
