//! The mount helper: a fresh single-threaded process (`virtplug mount-helper REQUEST`) that
//! joins QEMU's mount namespace — `setns` into a mount namespace refuses a multi-threaded caller —
//! and makes or removes one target there.

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use super::request::Request;

/// The helper subcommand of the `virtplug` binary (hidden): `virtplug mount-helper REQUEST`.
pub const HELPER_SUBCOMMAND: &str = "mount-helper";

/// The helper: carries out one namespace request given as JSON, in this (single-threaded)
/// process. The `virtplug` binary calls it for `virtplug mount-helper REQUEST` before it starts
/// any thread.
///
/// # Errors
/// What failed, for the agent to report.
pub fn helper_main(request: &str) -> Result<(), String> {
    let req: Request = serde_json::from_str(request).map_err(|e| format!("bad request {request:?}: {e}"))?;
    let pid = match &req {
        Request::BindMount { pid, .. } | Request::MakeNode { pid, .. } | Request::RemoveTarget { pid, .. } => *pid,
        _ => return Err(format!("not a namespace request: {request}")),
    };
    let ns = format!("/proc/{pid}/ns/mnt");
    let nsfd = rustix::fs::open(&ns, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| format!("cannot open {ns} (is QEMU {pid} running?): {e}"))?;
    rustix::thread::move_into_link_name_space(nsfd.as_fd(), Some(rustix::thread::LinkNameSpaceType::Mount))
        .map_err(|e| format!("cannot join the mount namespace of {pid}: {e}"))?;
    let mkdirs = |t: &Path| match t.parent() {
        Some(p) => std::fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display())),
        None => Ok(()),
    };
    match req {
        Request::BindMount { target, readonly, .. } => {
            mkdirs(&target)?;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&target)
                .map_err(|e| format!("cannot create the target {}: {e}", target.display()))?;
            let tree = std::io::stdin();
            rustix::mount::move_mount(tree.as_fd(), "", rustix::fs::CWD, &target, rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
                .map_err(|e| format!("cannot mount the volume on {}: {e}", target.display()))?;
            if readonly {
                use rustix::mount::MountFlags as M;
                rustix::mount::mount_remount(&target, M::BIND | M::RDONLY, "")
                    .map_err(|e| format!("cannot make {} read-only: {e}", target.display()))?;
            }
            Ok(())
        }
        Request::MakeNode { target, device, .. } => {
            mkdirs(&target)?;
            let _ = std::fs::remove_file(&target);
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &target,
                rustix::fs::FileType::BlockDevice,
                rustix::fs::Mode::from_raw_mode(0o600),
                rustix::fs::makedev(device.major, device.minor),
            )
            .map_err(|e| format!("cannot create the device node {}: {e}", target.display()))
        }
        Request::RemoveTarget { target, .. } => {
            // Lazily: QEMU may still hold the file open (it closes it on blockdev-del).
            // Stacked mounts (an attach retried by hand) are unmounted one by one, up to a bound.
            for _ in 0..64 {
                match rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH) {
                    Ok(()) => {}
                    Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => break,
                    Err(e) => return Err(format!("cannot unmount {}: {e}", target.display())),
                }
            }
            match std::fs::remove_file(&target) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(format!("cannot remove {}: {e}", target.display())),
                _ => Ok(()),
            }
        }
        other => Err(format!("not a namespace request: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devprog::DeviceNumber;

    #[test]
    fn requests_round_trip_through_the_helpers_json() {
        let r = Request::MakeNode { pid: 7, target: "/run/x/hotplug/b".into(), device: DeviceNumber { major: 7, minor: 2 } };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""op":"makeNode""#), "{json}");
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), r);
        assert!(helper_main("{\"op\":\"joinCgroup\",\"cgroup\":\"/x\",\"pid\":1}").unwrap_err().contains("not a namespace request"));
        assert!(helper_main("nonsense").unwrap_err().contains("bad request"));
    }
}
