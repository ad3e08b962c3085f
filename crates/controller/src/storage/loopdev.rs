//! Loop devices over backing files, through `/dev/loop-control` (no `losetup` subprocess).
//!
//! # Guarantees
//! - [`attach`] returns a device whose backing file is `backing` (checked through sysfs after
//!   the ioctl, so a race with another `losetup` on the same free device cannot hand us theirs).
//! - [`find`] locates the device of a backing file from sysfs alone, so a provisioner that
//!   crashed between attaching and recording the device still finds (and releases) it.
//! - [`detach`] clears the device; the kernel defers the release while the device is open
//!   (QEMU holding it), so detaching never yanks a running VM's disk.
//!
//! # Assumptions
//! Root (or `CAP_SYS_ADMIN`) and a kernel with the loop driver. `/dev/loopN` may be missing in a
//! container's static `/dev`; it is then created with `mknod` (block major 7).
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_MAJOR: u32 = 7;

/// `struct loop_info64` from `<linux/loop.h>` (232 bytes).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// A loop-device operation that failed, with the device or file it was about.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no free loop device after {0} tries (every device the kernel offered was taken by someone else first)")]
    NoneFree(u32),
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> LoopError + 'a {
    move |source| LoopError::Io { what, path: path.to_owned(), source }
}

fn get_free() -> Result<u32, LoopError> {
    let ctl_path = Path::new("/dev/loop-control");
    let ctl = OpenOptions::new().read(true).write(true).open(ctl_path).map_err(io_err("open", ctl_path))?;
    // SAFETY: LOOP_CTL_GET_FREE takes no argument and only returns an int; the fd is valid for
    // the duration of the call (`ctl` is alive).
    let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
    if n < 0 {
        return Err(io_err("allocate a loop device through", ctl_path)(io::Error::last_os_error()));
    }
    u32::try_from(n).map_err(|_| io_err("allocate a loop device through", ctl_path)(io::Error::other("negative device number")))
}

fn device_node(n: u32) -> Result<PathBuf, LoopError> {
    let path = PathBuf::from(format!("/dev/loop{n}"));
    if !path.exists() {
        let dev = libc::makedev(LOOP_MAJOR, n);
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io_err("create", &path)(io::Error::other("path contains NUL")))?;
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call; mknod reads it only.
        let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o660, dev) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(io_err("create the device node", &path)(e));
            }
        }
    }
    Ok(path)
}

/// The backing file of `/dev/loopN` per sysfs, if it is attached.
fn backing_of(n: u32) -> Option<PathBuf> {
    let s = std::fs::read_to_string(format!("/sys/block/loop{n}/loop/backing_file")).ok()?;
    Some(PathBuf::from(s.trim_end_matches('\n')))
}

/// Attaches a loop device over `backing` (an existing file) and returns its path.
///
/// # Errors
/// When the backing file or the device cannot be opened, or the ioctls fail.
pub fn attach(backing: &Path, read_only: bool) -> Result<PathBuf, LoopError> {
    let backing = backing.canonicalize().map_err(io_err("resolve", backing))?;
    let file = OpenOptions::new().read(true).write(!read_only).open(&backing).map_err(io_err("open", &backing))?;
    for _ in 0..16 {
        let n = get_free()?;
        let path = device_node(n)?;
        let dev = OpenOptions::new().read(true).write(!read_only).open(&path).map_err(io_err("open", &path))?;
        // SAFETY: both fds are valid (their Files are alive); LOOP_SET_FD takes the backing fd
        // as its integer argument and keeps its own reference to the file.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_FD, file.as_raw_fd()) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBUSY) {
                continue; // someone else took it between GET_FREE and SET_FD
            }
            return Err(io_err("attach a backing file to", &path)(e));
        }
        set_name(&dev, &backing);
        if backing_of(n).as_deref() != Some(backing.as_path()) {
            continue;
        }
        return Ok(path);
    }
    Err(LoopError::NoneFree(16))
}

/// Records the backing file's name in the device (what `losetup -l` shows). Best effort.
fn set_name(dev: &File, backing: &Path) {
    let mut info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: 0,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    };
    let bytes = backing.as_os_str().as_encoded_bytes();
    let len = bytes.len().min(63);
    info.lo_file_name[..len].copy_from_slice(&bytes[..len]);
    // SAFETY: `info` is a properly laid out `struct loop_info64` (repr(C), sizes from
    // <linux/loop.h>) that lives across the call; the kernel only reads it.
    let _ = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_STATUS64, std::ptr::addr_of!(info)) };
}

/// The loop device whose backing file is `backing`, if any.
#[must_use]
pub fn find(backing: &Path) -> Option<PathBuf> {
    let backing = backing.canonicalize().ok()?;
    let entries = std::fs::read_dir("/sys/block").ok()?;
    entries.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let n: u32 = name.strip_prefix("loop")?.parse().ok()?;
        (backing_of(n)? == backing).then(|| PathBuf::from(format!("/dev/loop{n}")))
    })
}

/// Every attached loop device whose backing file is under `root`.
#[must_use]
pub fn under(root: &Path) -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    let mut out: Vec<(PathBuf, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n: u32 = name.strip_prefix("loop")?.parse().ok()?;
            let b = backing_of(n)?;
            b.starts_with(root).then(|| (PathBuf::from(format!("/dev/loop{n}")), b))
        })
        .collect();
    out.sort();
    out
}

/// Detaches `dev`. A device already detached is fine.
///
/// # Errors
/// When the device cannot be opened or the ioctl fails for another reason than "not attached".
pub fn detach(dev: &Path) -> Result<(), LoopError> {
    let f = match OpenOptions::new().read(true).open(dev) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("open", dev)(e)),
    };
    // SAFETY: the fd is valid for the call; LOOP_CLR_FD takes no argument.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), LOOP_CLR_FD, 0) };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENXIO) {
            return Err(io_err("detach", dev)(e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_info64_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
    }

    /// Root-gated: a real loop device over a sparse file, found by its backing file, detached.
    #[test]
    fn attach_find_detach_on_a_real_device() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root for /dev/loop-control");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("block.img");
        File::create(&img).unwrap().set_len(8 << 20).unwrap();
        let dev = attach(&img, false).unwrap();
        assert_eq!(find(&img), Some(dev.clone()));
        assert_eq!(under(dir.path()).len(), 1);
        let size = std::fs::read_to_string(format!("/sys/block/{}/size", dev.file_name().unwrap().to_string_lossy())).unwrap();
        assert_eq!(size.trim(), (8u64 << 20 >> 9).to_string(), "the device has the file's size in 512-byte sectors");
        detach(&dev).unwrap();
        assert_eq!(find(&img), None);
        assert!(under(dir.path()).is_empty());
    }
}
