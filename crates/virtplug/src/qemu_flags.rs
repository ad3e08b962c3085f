//! Flags that bound what a VMI may make QEMU do on this node, and what its guest may write
//! (`virtplug node`, `virtplug up`).

use std::path::{Path, PathBuf};

use clap::Args;

/// Which host files QEMU may be handed, and its sandbox.
#[derive(Args, Clone, Debug)]
pub struct QemuArgs {
    /// A directory `kernelBoot`'s kernelPath/initrdPath may name files in (repeatable). QEMU runs
    /// as root: a VMI naming any other host file fails to start, saying so [default: the data dir
    /// and the test-guest cache ($VIRTPLUG_GUEST_DIR or the source tree's .cache/guest)].
    #[arg(long, value_name = "DIR")]
    boot_file_dir: Vec<PathBuf>,
    /// Run QEMU under its seccomp filter (-sandbox on,obsolete=deny,elevateprivileges=deny,
    /// spawn=deny,resourcecontrol=deny): a compromised QEMU cannot exec, fork, change its
    /// privileges or scheduling. `false` turns it off.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    qemu_sandbox: bool,
    /// Drop QEMU to this user (e.g. nobody) once it has opened its start-up files, so a
    /// compromised QEMU holds no root privileges: later volumes reach it only as open fds.
    /// Only with --attach-mode fd [default: QEMU stays root].
    #[arg(long, value_name = "USER")]
    qemu_user: Option<String>,
    /// Let guests open connections out through their user-mode network (QEMU's slirp: to the
    /// outside, and to this host's loopback services at 10.0.2.2). Off by default: a guest
    /// reaches nothing, and only its forwarded `ports` reach it.
    #[arg(long)]
    guest_egress: bool,
    /// The largest a guest's serial log (RUN_DIR/serial.log) may grow: past it, checked every
    /// 30 s, its last quarter is kept in serial.log.1 and it starts again.
    #[arg(long, default_value = "8Mi", value_parser = api::quantity::bytes, value_name = "SIZE")]
    serial_log_max: u64,
}

impl QemuArgs {
    /// Refuses flags that cannot work together.
    ///
    /// # Errors
    /// `--qemu-user` with bind-mount mode, where QEMU opens volume paths itself.
    pub fn check(&self, mode: node::bindmount::AttachMode) -> anyhow::Result<()> {
        if self.qemu_user.is_some() && mode == node::bindmount::AttachMode::BindMount {
            anyhow::bail!("--qemu-user works only with --attach-mode fd: in bind-mount mode QEMU opens volume paths itself, as root");
        }
        Ok(())
    }

    /// Sets the boot-file directories, the sandbox and the user in `config` (defaults from
    /// `data_dir`).
    pub fn apply(&self, config: &mut node::agent::Config, data_dir: &Path) {
        config.boot_files = if self.boot_file_dir.is_empty() {
            qemu::bootfiles::AllowedDirs::defaults(data_dir)
        } else {
            qemu::bootfiles::AllowedDirs::new(self.boot_file_dir.iter().cloned())
        };
        config.qemu_sandbox = self.qemu_sandbox;
        config.qemu_user.clone_from(&self.qemu_user);
        config.guest_egress = self.guest_egress;
        config.serial_log_max = self.serial_log_max;
    }
}
