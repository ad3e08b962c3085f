//! Flags that pick one of a few modes, as clap `ValueEnum`s: clap refuses any other value,
//! listing the choices, so there is no hand-written parse with a fallback.

use clap::ValueEnum;

/// `--accel`: the QEMU accelerator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AccelFlag {
    /// KVM where it can run guests, else TCG.
    Auto,
    Kvm,
    Tcg,
}

impl From<AccelFlag> for qemu::accel::Accel {
    fn from(f: AccelFlag) -> Self {
        match f {
            AccelFlag::Auto => qemu::accel::Accel::Auto,
            AccelFlag::Kvm => qemu::accel::Accel::Kvm,
            AccelFlag::Tcg => qemu::accel::Accel::Tcg,
        }
    }
}

/// `--attach-mode`: how hot-plugged volumes reach QEMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AttachModeFlag {
    /// The agent opens the volume and passes the fd; nothing is mounted.
    Fd,
    /// KubeVirt's way: bind mounts and device nodes in the VM's mount namespace (root).
    BindMount,
}

impl From<AttachModeFlag> for node::bindmount::AttachMode {
    fn from(f: AttachModeFlag) -> Self {
        match f {
            AttachModeFlag::Fd => node::bindmount::AttachMode::Fd,
            AttachModeFlag::BindMount => node::bindmount::AttachMode::BindMount,
        }
    }
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[arg(long, value_enum, default_value_t = AccelFlag::Auto)]
        accel: AccelFlag,
        #[arg(long, value_enum, default_value_t = AttachModeFlag::Fd)]
        attach_mode: AttachModeFlag,
    }

    #[test]
    fn the_wire_names_parse_and_anything_else_is_refused_with_the_choices() {
        let f = Flags::try_parse_from(["x", "--accel", "tcg", "--attach-mode", "bind-mount"]).unwrap();
        assert_eq!(
            (qemu::accel::Accel::from(f.accel), node::bindmount::AttachMode::from(f.attach_mode)),
            (qemu::accel::Accel::Tcg, node::bindmount::AttachMode::BindMount)
        );
        let f = Flags::try_parse_from(["x"]).unwrap();
        assert_eq!((f.accel, f.attach_mode), (AccelFlag::Auto, AttachModeFlag::Fd));
        let e = Flags::try_parse_from(["x", "--accel", "kvmm"]).err().unwrap().to_string();
        assert!(e.contains("auto") && e.contains("kvm") && e.contains("tcg"), "{e}");
        assert!(Flags::try_parse_from(["x", "--attach-mode", "bind"]).is_err());
    }
}
