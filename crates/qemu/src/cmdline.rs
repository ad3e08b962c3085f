//! The QEMU command line of a VMI.
//!
//! Layout: machine q35; one virtio-scsi controller (`hotplug-scsi`) kept for hot-plugged disks
//! and LUNs, nothing else on it; `sata` CD-ROM drives on the q35 AHCI (`ide.0`…`ide.5`), declared
//! at start and empty when they have no medium; boot disks on virtio-blk (or AHCI for `sata`);
//! `bootOrder` becomes `bootindex`; serial console on a unix socket with a log file; QMP on a
//! unix socket; a pidfile; `-daemonize`, so QEMU runs in its own session and survives whoever
//! launched it. No network unless user-mode networking is asked for.
//!
//! Kernel boot in the embedded deployment: `firmware.kernelBoot.container` with no `image` (or
//! `image: local`) names host files in `kernelPath` and `initrdPath`; `kernelArgs` is the
//! command line.

use std::path::{Path, PathBuf};

use api::kubevirt::{DiskKind, VirtualMachineInstanceSpec, Volume};
use serde_json::json;

use crate::accel::Resolved;

/// The virtio-scsi controller reserved for hot-plug; its bus is `hotplug-scsi.0`.
pub const HOTPLUG_CONTROLLER: &str = "hotplug-scsi";
/// The bus hot-plugged disks and LUNs go on.
pub const HOTPLUG_BUS: &str = "hotplug-scsi.0";
/// SATA ports of the q35 AHCI.
pub const AHCI_PORTS: usize = 6;

/// Errors building a command line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CmdlineError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> CmdlineError {
    CmdlineError::Invalid { field: field.into(), message: message.into() }
}

/// Direct kernel boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelBoot {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
}

/// A disk present from boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootDisk {
    pub id: String,
    pub path: PathBuf,
    pub readonly: bool,
    pub sata: bool,
    pub bootindex: Option<u32>,
    pub serial: Option<String>,
}

/// A `sata` CD-ROM drive on the AHCI, empty or with a medium from boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CdromDrive {
    pub id: String,
    pub bootindex: Option<u32>,
    pub medium: Option<PathBuf>,
}

/// Everything needed to start one VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchSpec {
    pub name: String,
    /// Holds `qmp.sock`, `serial.sock`, `serial.log`, `qemu.pid`.
    pub run_dir: PathBuf,
    pub memory_mib: u64,
    pub vcpus: u32,
    pub accel: Resolved,
    pub kernel: Option<KernelBoot>,
    pub boot_disks: Vec<BootDisk>,
    pub cdrom_drives: Vec<CdromDrive>,
    pub user_net: bool,
    /// Start QEMU in a mount namespace of its own (bind-mount mode), a downstream (slave) copy
    /// of the launcher's: mounts made on the host reach it, mounts made inside it (the
    /// hot-plugged volumes' bind mounts) stay inside and vanish with it.
    pub own_mount_namespace: bool,
}

impl LaunchSpec {
    #[must_use]
    pub fn qmp_socket(&self) -> PathBuf {
        self.run_dir.join("qmp.sock")
    }
    #[must_use]
    pub fn serial_socket(&self) -> PathBuf {
        self.run_dir.join("serial.sock")
    }
    #[must_use]
    pub fn serial_log(&self) -> PathBuf {
        self.run_dir.join("serial.log")
    }
    #[must_use]
    pub fn pidfile(&self) -> PathBuf {
        self.run_dir.join("qemu.pid")
    }

    /// The arguments after the QEMU binary.
    #[must_use]
    pub fn args(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        let mut a: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| (*s).to_owned()));
        push(&["-name", &format!("guest={},debug-threads=on", self.name)]);
        match self.accel {
            Resolved::Kvm => push(&["-machine", "q35", "-accel", "kvm", "-cpu", "host"]),
            Resolved::Tcg => push(&["-machine", "q35", "-accel", "tcg", "-cpu", "max"]),
        }
        push(&["-m", &self.memory_mib.to_string(), "-smp", &self.vcpus.to_string()]);
        push(&["-nodefaults", "-no-user-config", "-display", "none", "-daemonize", "-pidfile", &p(&self.pidfile())]);
        push(&[
            "-chardev",
            &format!("socket,id=qmp0,path={},server=on,wait=off", p(&self.qmp_socket())),
            "-mon",
            "chardev=qmp0,mode=control",
        ]);
        push(&[
            "-chardev",
            &format!("socket,id=ser0,path={},server=on,wait=off,logfile={},logappend=on", p(&self.serial_socket()), p(&self.serial_log())),
            "-serial",
            "chardev:ser0",
        ]);
        push(&["-device", &format!("virtio-scsi-pci,id={HOTPLUG_CONTROLLER}")]);
        if let Some(k) = &self.kernel {
            push(&["-kernel", &p(&k.kernel), "-append", &k.cmdline]);
            if let Some(i) = &k.initrd {
                push(&["-initrd", &p(i)]);
            }
        }
        let mut port = 0;
        for cd in &self.cdrom_drives {
            let mut dev = format!("ide-cd,id={},bus=ide.{port}", cd.id);
            port += 1;
            if let Some(m) = &cd.medium {
                let node = format!("{}-medium", cd.id);
                let bd = json!({"driver": "raw", "node-name": node, "read-only": true, "file": {"driver": "file", "filename": p(m), "read-only": true}});
                push(&["-blockdev", &bd.to_string()]);
                dev.push_str(&format!(",drive={node}"));
            }
            if let Some(b) = cd.bootindex {
                dev.push_str(&format!(",bootindex={b}"));
            }
            push(&["-device", &dev]);
        }
        for d in &self.boot_disks {
            let node = format!("{}-disk", d.id);
            let bd = json!({"driver": "raw", "node-name": node, "read-only": d.readonly, "file": {"driver": "file", "filename": p(&d.path), "read-only": d.readonly}});
            push(&["-blockdev", &bd.to_string()]);
            let mut dev = if d.sata {
                let s = format!("ide-hd,id={},bus=ide.{port},drive={node}", d.id);
                port += 1;
                s
            } else {
                format!("virtio-blk-pci,id={},drive={node}", d.id)
            };
            if let Some(b) = d.bootindex {
                dev.push_str(&format!(",bootindex={b}"));
            }
            if let Some(s) = &d.serial {
                dev.push_str(&format!(",serial={s}"));
            }
            push(&["-device", &dev]);
        }
        if self.user_net {
            push(&["-nic", "user,model=virtio-net-pci"]);
        } else {
            push(&["-nic", "none"]);
        }
        a
    }
}

/// Parses a Kubernetes quantity of bytes (`128Mi`, `1Gi`, `512M`, `1073741824`) into MiB.
///
/// # Errors
/// When the text is not a quantity of bytes.
pub fn quantity_mib(q: &str, field: &str) -> Result<u64, CmdlineError> {
    let q = q.trim();
    let (num, mult): (&str, u64) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ]
    .iter()
    .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
    .unwrap_or((q, 1));
    let n: u64 = num.parse().map_err(|_| invalid(field, format!("{q:?} is not a quantity of bytes; use e.g. 256Mi or 1Gi")))?;
    Ok(n.saturating_mul(mult) / (1 << 20))
}

/// Builds the launch spec of a VMI. `source` gives the host path of a volume present from boot
/// (not hot-pluggable); hot-pluggable volumes are left for hot-plug.
///
/// # Errors
/// When memory cannot be parsed, more `sata` devices than AHCI ports are asked for, a boot
/// volume has no local source, or `kernelBoot` names an image instead of local files.
pub fn from_vmi(
    spec: &VirtualMachineInstanceSpec,
    name: &str,
    run_dir: &Path,
    accel: Resolved,
    source: impl Fn(&Volume) -> Option<PathBuf>,
) -> Result<LaunchSpec, CmdlineError> {
    let dom = &spec.domain;
    let memory_mib =
        match (dom.memory.as_ref().and_then(|m| m.guest.as_ref()), dom.resources.as_ref().and_then(|r| r.requests.get("memory"))) {
            (Some(q), _) => quantity_mib(&q.0, "spec.domain.memory.guest")?,
            (None, Some(q)) => quantity_mib(&q.0, "spec.domain.resources.requests.memory")?,
            (None, None) => 128,
        };
    let vcpus = dom.cpu.as_ref().map_or(1, |c| c.cores.unwrap_or(1) * c.sockets.unwrap_or(1) * c.threads.unwrap_or(1)).max(1);
    let kernel = match dom.firmware.as_ref().and_then(|f| f.kernel_boot.as_ref()) {
        None => None,
        Some(kb) => {
            let c = kb
                .container
                .as_ref()
                .ok_or_else(|| invalid("spec.domain.firmware.kernelBoot.container", "kernelBoot needs container.kernelPath"))?;
            if c.image.as_deref().is_some_and(|i| !i.is_empty() && i != "local") {
                return Err(invalid(
                    "spec.domain.firmware.kernelBoot.container.image",
                    "container images are not supported here; leave image empty (or \"local\") and set kernelPath/initrdPath to host files",
                ));
            }
            let kernel = c
                .kernel_path
                .clone()
                .ok_or_else(|| invalid("spec.domain.firmware.kernelBoot.container.kernelPath", "required: the host path of the kernel"))?;
            Some(KernelBoot {
                kernel: kernel.into(),
                initrd: c.initrd_path.clone().map(PathBuf::from),
                cmdline: kb.kernel_args.clone().unwrap_or_default(),
            })
        }
    };
    let mut cdrom_drives = Vec::new();
    let mut boot_disks = Vec::new();
    for (i, d) in dom.devices.disks.iter().enumerate() {
        let field = format!("spec.domain.devices.disks[{i}]");
        let volume = spec.volumes.iter().find(|v| v.name == d.name);
        let hotplug = volume.is_some_and(Volume::is_hotpluggable);
        match d.kind() {
            DiskKind::Cdrom if d.bus().unwrap_or("sata") == "sata" => {
                let medium = match volume {
                    Some(v) if !hotplug => Some(
                        source(v).ok_or_else(|| invalid(format!("{field}.name"), format!("volume {:?} has no local source", d.name)))?,
                    ),
                    _ => None,
                };
                cdrom_drives.push(CdromDrive { id: d.name.clone(), bootindex: d.boot_order, medium });
            }
            _ if hotplug || volume.is_none() => {}
            _ => {
                let Some(v) = volume else { continue };
                if v.cloud_init_no_cloud.is_some() {
                    continue;
                }
                let path = source(v).ok_or_else(|| invalid(format!("{field}.name"), format!("volume {:?} has no local source", d.name)))?;
                boot_disks.push(BootDisk {
                    id: d.name.clone(),
                    path,
                    readonly: d.readonly(),
                    sata: d.bus() == Some("sata"),
                    bootindex: d.boot_order,
                    serial: d.serial.clone(),
                });
            }
        }
    }
    let sata = cdrom_drives.len() + boot_disks.iter().filter(|d| d.sata).count();
    if sata > AHCI_PORTS {
        return Err(invalid(
            "spec.domain.devices.disks",
            format!("{sata} sata devices, but the q35 AHCI has {AHCI_PORTS} ports; move disks to virtio or scsi"),
        ));
    }
    Ok(LaunchSpec {
        name: name.to_owned(),
        run_dir: run_dir.to_owned(),
        memory_mib,
        vcpus,
        accel,
        kernel,
        boot_disks,
        cdrom_drives,
        user_net: false,
        own_mount_namespace: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> VirtualMachineInstanceSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn vmi_maps_to_q35_with_ahci_cdroms_and_hotplug_controller() {
        let s = spec(json!({
            "domain": {"memory": {"guest": "256Mi"}, "cpu": {"cores": 2},
                "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0", "container": {"kernelPath": "/k", "initrdPath": "/i"}}},
                "devices": {"disks": [
                    {"name": "cd", "cdrom": {"bus": "sata"}, "bootOrder": 2},
                    {"name": "root", "disk": {"bus": "virtio"}, "bootOrder": 1},
                    {"name": "hp", "disk": {"bus": "scsi"}}]}},
            "volumes": [{"name": "root", "emptyDisk": {"capacity": "1Gi"}},
                        {"name": "hp", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}]
        }));
        let l = from_vmi(&s, "vm1", Path::new("/run/vm1"), Resolved::Tcg, |v| Some(PathBuf::from(format!("/vol/{}", v.name)))).unwrap();
        assert_eq!((l.memory_mib, l.vcpus), (256, 2));
        assert_eq!(l.cdrom_drives, [CdromDrive { id: "cd".into(), bootindex: Some(2), medium: None }]);
        assert_eq!(l.boot_disks.len(), 1, "the hot-pluggable volume is left for hot-plug");
        let args = l.args().join(" ");
        for want in [
            "-machine q35 -accel tcg -cpu max",
            "-m 256 -smp 2",
            "-daemonize -pidfile /run/vm1/qemu.pid",
            "-device virtio-scsi-pci,id=hotplug-scsi",
            "-device ide-cd,id=cd,bus=ide.0,bootindex=2",
            "virtio-blk-pci,id=root,drive=root-disk,bootindex=1",
            "-kernel /k -append console=ttyS0 -initrd /i",
            "-nic none",
        ] {
            assert!(args.contains(want), "missing {want:?} in {args}");
        }
    }

    #[test]
    fn bad_memory_and_image_kernel_name_the_field() {
        let s = spec(json!({"domain": {"memory": {"guest": "lots"}, "devices": {}}}));
        let e = from_vmi(&s, "v", Path::new("/r"), Resolved::Tcg, |_| None).unwrap_err();
        assert!(e.to_string().starts_with("spec.domain.memory.guest:"), "{e}");
        let s =
            spec(json!({"domain": {"devices": {}, "firmware": {"kernelBoot": {"container": {"image": "quay.io/x", "kernelPath": "/k"}}}}}));
        let e = from_vmi(&s, "v", Path::new("/r"), Resolved::Tcg, |_| None).unwrap_err();
        assert!(e.to_string().contains("kernelBoot.container.image"), "{e}");
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity_mib("1Gi", "f").unwrap(), 1024);
        assert_eq!(quantity_mib("268435456", "f").unwrap(), 256);
        assert!(quantity_mib("1.5Gi", "f").is_err());
    }
}
