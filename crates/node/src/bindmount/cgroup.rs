//! A VM's devices cgroup in bind-mount mode: every character device allowed, a block device
//! only while it is plugged. On cgroup v1 the devices controller's files; on cgroup v2 a
//! generated eBPF program ([`crate::devprog`]) for the whole allowlist. The hierarchy's version
//! is found from the cgroup's path.

use std::io;
use std::path::Path;

use crate::devprog::{BlockRule, DeviceNumber};

fn write_file(path: &Path, text: &str) -> io::Result<()> {
    std::fs::write(path, text).map_err(|e| io::Error::new(e.kind(), format!("cannot write {text:?} to {}: {e}", path.display())))
}

/// The cgroup version of the hierarchy `cgroup` is (to be) in: the nearest existing ancestor
/// holding `devices.allow` is cgroup v1's devices controller, one holding `cgroup.controllers`
/// is cgroup v2.
fn version(cgroup: &Path) -> io::Result<u8> {
    let found = cgroup.ancestors().skip(1).find_map(|a| {
        if a.join("devices.allow").exists() {
            Some(1)
        } else if a.join("cgroup.controllers").exists() {
            Some(2)
        } else {
            None
        }
    });
    found.ok_or_else(|| {
        io::Error::other(format!(
            "{} is in neither a cgroup v1 devices hierarchy nor a cgroup v2 one: bind-mount mode needs one for block volumes; \
             use the default fd mode",
            cgroup.display()
        ))
    })
}

/// Creates `cgroup` allowing every character device and no block device, and moves `pid` in.
///
/// # Errors
/// When the hierarchy is neither v1's devices controller nor v2, or a write fails.
pub fn join(cgroup: &Path, pid: i32) -> io::Result<()> {
    let v = version(cgroup)?;
    std::fs::create_dir_all(cgroup).map_err(|e| io::Error::new(e.kind(), format!("cannot create {}: {e}", cgroup.display())))?;
    if v == 1 {
        write_file(&cgroup.join("devices.deny"), "a")?;
        write_file(&cgroup.join("devices.allow"), "c *:* rwm")?;
    } else {
        crate::devprog::set(cgroup, &[])?;
    }
    write_file(&cgroup.join("cgroup.procs"), &pid.to_string())
}

/// Allows `device` (`rw`, or `r`) in `cgroup`; `allowed` is the whole allowlist after the change
/// (v2 replaces its program with it; v1 adds the one rule).
///
/// # Errors
/// As [`join`].
pub fn allow(cgroup: &Path, device: DeviceNumber, readonly: bool, allowed: &[BlockRule]) -> io::Result<()> {
    if version(cgroup)? == 1 {
        let access = if readonly { "r" } else { "rw" };
        write_file(&cgroup.join("devices.allow"), &format!("b {}:{} {access}", device.major, device.minor))
    } else {
        crate::devprog::set(cgroup, allowed)
    }
}

/// Withdraws `device` from `cgroup`; `allowed` is the allowlist after the change.
///
/// # Errors
/// As [`join`].
pub fn deny(cgroup: &Path, device: DeviceNumber, allowed: &[BlockRule]) -> io::Result<()> {
    if version(cgroup)? == 1 {
        write_file(&cgroup.join("devices.deny"), &format!("b {}:{} rwm", device.major, device.minor))
    } else {
        crate::devprog::set(cgroup, allowed)
    }
}

/// Removes a VM's cgroup once its processes are gone; one that does not exist is fine.
///
/// # Errors
/// When it cannot be removed (a process is still in it).
pub fn remove_cgroup(cgroup: &Path) -> io::Result<()> {
    match std::fs::remove_dir(cgroup) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(io::Error::new(e.kind(), format!("cannot remove the cgroup {}: {e}", cgroup.display())))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup_rules_are_what_v1_expects() {
        // Real files in a temp dir laid out like a devices hierarchy (no root needed).
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("devices.allow"), "").unwrap();
        let cg = dir.path().join("virtplug").join("vm1");
        std::fs::create_dir_all(&cg).unwrap();
        let device = DeviceNumber { major: 7, minor: 4 };
        allow(&cg, device, true, &[]).unwrap();
        assert_eq!(std::fs::read_to_string(cg.join("devices.allow")).unwrap(), "b 7:4 r");
        deny(&cg, device, &[]).unwrap();
        assert_eq!(std::fs::read_to_string(cg.join("devices.deny")).unwrap(), "b 7:4 rwm");
        let missing = join(Path::new("/nonexistent/virtplug/vm1"), 1).unwrap_err();
        assert!(missing.to_string().contains("neither a cgroup v1 devices hierarchy nor a cgroup v2"), "{missing}");
    }
}
