//! The QEMU command line of a VMI.
//!
//! Layout: machine q35; one virtio-scsi controller (`hotplug-scsi`) kept for hot-plugged disks
//! and LUNs, nothing else on it; `sata` CD-ROM drives on the q35 AHCI (`ide.0`…`ide.5`), declared
//! at start and empty when they have no medium; boot disks on virtio-blk (or AHCI for `sata`);
//! `bootOrder` becomes `bootindex`; serial console on a unix socket with a log file; QMP on a
//! unix socket; a pidfile (QEMU runs in a session of its own, see [`crate::process::launch`]);
//! its seccomp sandbox. The guest's interfaces are QEMU user-mode networks ([`crate::nic`]),
//! none when it has none (`-nic none`). SeaBIOS, or OVMF for `firmware.bootloader.efi`
//! ([`crate::firmware`]).
//!
//! Kernel boot in the embedded deployment: `firmware.kernelBoot.container` with no `image` (or
//! `image: local`) names host files in `kernelPath` and `initrdPath`; `kernelArgs` is the
//! command line.

use std::path::{Path, PathBuf};

use api::kubevirt::{DiskKind, VirtualMachineInstanceSpec, Volume};
use serde_json::json;

use crate::accel::Resolved;
use crate::bootfiles::AllowedDirs;
use crate::firmware::Firmware;
use crate::opts::Opts;

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

impl From<crate::bootfiles::Refused> for CmdlineError {
    fn from(r: crate::bootfiles::Refused) -> CmdlineError {
        CmdlineError::Invalid { field: r.field, message: r.message }
    }
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

/// The fd number in QEMU of the first fd it inherits from its launcher ([`DiskSource::Inherited`]):
/// right after stdin, stdout and stderr.
pub const FIRST_INHERITED_FD: u32 = 3;

/// The opaque prefix of the fd sets of inherited boot disks (`-add-fd`). Distinct from the
/// `virtplug:` of hot-plug's sets, which an agent removes as stale after a takeover
/// ([`crate::Machine::remove_stale_fdsets`]): a boot disk's set is its drive's for QEMU's life.
pub const BOOT_FDSET_PREFIX: &str = "virtplug-boot:";

/// Where QEMU reads a disk present from boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskSource {
    /// A path QEMU opens itself: QEMU runs where the path is (the agent's own QEMU; `up`).
    Path(PathBuf),
    /// The `n`-th fd QEMU inherits from its launcher ([`crate::launcher`]): with launcher pods a
    /// claim is mounted only inside the pod, where the node agent opened it (the fd-handoff
    /// rule, as for hot-plug). It is fd [`FIRST_INHERITED_FD`]` + n` in QEMU, added to fd set
    /// `n` by `-add-fd` (opaque [`BOOT_FDSET_PREFIX`]`<disk>`); the drive opens `/dev/fdset/n`.
    /// Its open mode is the disk's (a read-only disk needs a read-only fd); `block` when it is a
    /// block device (a Block claim), which QEMU's `host_device` driver opens.
    Inherited { index: u32, block: bool },
}

impl DiskSource {
    /// The file name QEMU's `file` driver opens.
    fn filename(&self) -> String {
        match self {
            DiskSource::Path(p) => p.display().to_string(),
            DiskSource::Inherited { index, .. } => format!("/dev/fdset/{index}"),
        }
    }

    /// QEMU's protocol driver for it: `host_device` for a block device (a Block claim: a loop
    /// or CSI device; the `file` driver refuses one), `file` for an image. A path is looked at
    /// here (QEMU opens it where this process runs: the agent's own QEMU, `up`).
    fn driver(&self) -> &'static str {
        let block = match self {
            DiskSource::Path(p) => std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type())),
            DiskSource::Inherited { block, .. } => *block,
        };
        if block {
            "host_device"
        } else {
            "file"
        }
    }

    /// The `-add-fd` that puts inherited fd `n` in its set, for the drive `id`; nothing for a path.
    fn add_fd(&self, id: &str) -> Vec<String> {
        let DiskSource::Inherited { index: n, .. } = self else { return Vec::new() };
        let fd = (FIRST_INHERITED_FD + n).to_string();
        let opts = Opts::new().set("fd", &fd).set("set", &n.to_string()).set("opaque", &format!("{BOOT_FDSET_PREFIX}{id}"));
        vec!["-add-fd".to_owned(), opts.build()]
    }
}

impl From<PathBuf> for DiskSource {
    fn from(p: PathBuf) -> DiskSource {
        DiskSource::Path(p)
    }
}

/// A disk present from boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootDisk {
    pub id: String,
    pub source: DiskSource,
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
    pub medium: Option<DiskSource>,
}

/// Everything needed to start one VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchSpec {
    pub name: String,
    /// Holds `qmp.sock`, `serial.sock`, `serial.log`, `vnc.sock`, `qemu.pid`.
    pub run_dir: PathBuf,
    pub memory_mib: u64,
    pub vcpus: u32,
    pub accel: Resolved,
    pub kernel: Option<KernelBoot>,
    pub boot_disks: Vec<BootDisk>,
    pub cdrom_drives: Vec<CdromDrive>,
    /// The guest's NICs ([`crate::nic::from_vmi`]; [`from_vmi`] leaves them empty: their MAC
    /// addresses depend on the VMI's namespace and name).
    pub nics: Vec<crate::nic::Nic>,
    /// Start QEMU in a mount namespace of its own (bind-mount mode), a downstream (slave) copy
    /// of the launcher's: mounts made on the host reach it, mounts made inside it (the
    /// hot-plugged volumes' bind mounts) stay inside and vanish with it.
    pub own_mount_namespace: bool,
    /// Run QEMU under its seccomp filter ([`SANDBOX`]).
    pub sandbox: bool,
    /// Drop QEMU to this user once it has opened its start-up files (`-run-with user=`). Only
    /// for fd handoff: every later volume reaches it as an open fd; a path it would open later
    /// (bind-mount mode) would be refused to that user.
    pub run_as: Option<String>,
    /// SeaBIOS or OVMF.
    pub firmware: Firmware,
    /// Start with the vCPUs stopped (`-S`): no guest code, firmware included, runs until
    /// [`crate::Machine::resume`]. For changes that must be in place before the firmware looks
    /// (a CD-ROM medium inserted over QMP for a one-time boot from it).
    pub start_paused: bool,
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
    /// QEMU's VNC server (the `vnc` subresource reaches it through the node agent).
    #[must_use]
    pub fn vnc_socket(&self) -> PathBuf {
        self.run_dir.join("vnc.sock")
    }
    #[must_use]
    pub fn pidfile(&self) -> PathBuf {
        self.run_dir.join("qemu.pid")
    }

    /// The inherited fds the drives use ([`DiskSource::Inherited`]), sorted: whoever starts
    /// QEMU must hand it exactly `0..n` of them.
    #[must_use]
    pub fn inherited_fds(&self) -> Vec<u32> {
        let cds = self.cdrom_drives.iter().filter_map(|c| c.medium.as_ref());
        let mut n: Vec<u32> = cds
            .chain(self.boot_disks.iter().map(|d| &d.source))
            .filter_map(|s| match s {
                DiskSource::Inherited { index, .. } => Some(*index),
                DiskSource::Path(_) => None,
            })
            .collect();
        n.sort_unstable();
        n
    }

    /// The arguments after the QEMU binary.
    ///
    /// Nothing from a spec can add an option: `-device` and `-blockdev` are JSON objects built
    /// with `serde_json` (a string stays one string), the `QemuOpts` arguments (`-name`,
    /// `-chardev`, `-add-fd`) escape their values ([`crate::opts`]), and `-kernel`, `-initrd`,
    /// `-append`, `-pidfile` take their value whole.
    #[must_use]
    pub fn args(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        let mut a: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| (*s).to_owned()));
        push(&["-name", &Opts::new().set("guest", &self.name).set("debug-threads", "on").build()]);
        push(&["-machine", &self.firmware.machine_arg()]);
        match self.accel {
            Resolved::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
            Resolved::Tcg => push(&["-accel", "tcg", "-cpu", "max"]),
        }
        push(&["-m", &self.memory_mib.to_string(), "-smp", &self.vcpus.to_string()]);
        push(&["-nodefaults", "-no-user-config", "-display", "none", "-pidfile", &p(&self.pidfile())]);
        if self.start_paused {
            push(&["-S"]);
        }
        if self.sandbox {
            // QEMU changes its uid itself, after its filter is in place: `elevateprivileges`
            // must allow that. A process that is no longer root cannot gain privileges anyway
            // (spawn=deny stops exec of a setuid binary), so the dropped user is the stronger
            // setting.
            push(&["-sandbox", if self.run_as.is_some() { SANDBOX_RUN_AS } else { SANDBOX }]);
        }
        if let Some(user) = &self.run_as {
            push(&["-run-with", &Opts::new().set("user", user).build()]);
        }
        let qmp = Opts::implied("socket").set("id", "qmp0").set("path", &p(&self.qmp_socket())).set("server", "on").set("wait", "off");
        push(&["-chardev", &qmp.build(), "-mon", "chardev=qmp0,mode=control"]);
        let serial = Opts::implied("socket")
            .set("id", "ser0")
            .set("path", &p(&self.serial_socket()))
            .set("server", "on")
            .set("wait", "off")
            .set("logfile", &p(&self.serial_log()))
            .set("logappend", "on");
        push(&["-chardev", &serial.build(), "-serial", "chardev:ser0"]);
        // VNC on a unix socket in the run dir, never on a TCP port: only the node agent reaches
        // it (KubeVirt's virt-launcher does the same). Without a display device QEMU still
        // answers the RFB handshake (a blank screen). The implied key is spelled out (`vnc=`):
        // an implied value with `=` in it would be read as a key.
        push(&["-vnc", &Opts::new().set("vnc", &format!("unix:{}", p(&self.vnc_socket()))).build()]);
        push(&["-device", &json!({"driver": "virtio-scsi-pci", "id": HOTPLUG_CONTROLLER}).to_string()]);
        if let Some(k) = &self.kernel {
            push(&["-kernel", &p(&k.kernel), "-append", &k.cmdline]);
            if let Some(i) = &k.initrd {
                push(&["-initrd", &p(i)]);
            }
        }
        a.extend(self.firmware.blockdev_args());
        for arg in self.drive_args() {
            a.push(arg);
        }
        if self.nics.is_empty() {
            a.extend(["-nic".to_owned(), "none".to_owned()]);
        }
        for (i, nic) in self.nics.iter().enumerate() {
            a.extend(nic.args(i));
        }
        a
    }

    /// `-blockdev`/`-device` pairs of the CD-ROM drives and boot disks, as JSON (each inherited
    /// source's `-add-fd` before its `-blockdev`).
    fn drive_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        let mut port = 0;
        for cd in &self.cdrom_drives {
            let mut dev = json!({"driver": "ide-cd", "id": cd.id, "bus": format!("ide.{port}")});
            port += 1;
            if let Some(m) = &cd.medium {
                let node = format!("{}-medium", cd.id);
                a.extend(m.add_fd(&cd.id));
                let bd = json!({"driver": "raw", "node-name": node, "read-only": true, "file": {"driver": m.driver(), "filename": m.filename(), "read-only": true}});
                a.extend(["-blockdev".to_owned(), bd.to_string()]);
                dev["drive"] = json!(node);
            }
            if let Some(b) = cd.bootindex {
                dev["bootindex"] = json!(b);
            }
            a.extend(["-device".to_owned(), dev.to_string()]);
        }
        for d in &self.boot_disks {
            let node = format!("{}-disk", d.id);
            a.extend(d.source.add_fd(&d.id));
            let bd = json!({"driver": "raw", "node-name": node, "read-only": d.readonly, "file": {"driver": d.source.driver(), "filename": d.source.filename(), "read-only": d.readonly}});
            a.extend(["-blockdev".to_owned(), bd.to_string()]);
            let mut dev = if d.sata {
                let dev = json!({"driver": "ide-hd", "id": d.id, "bus": format!("ide.{port}"), "drive": node});
                port += 1;
                dev
            } else {
                json!({"driver": "virtio-blk-pci", "id": d.id, "drive": node})
            };
            if let Some(b) = d.bootindex {
                dev["bootindex"] = json!(b);
            }
            if let Some(s) = &d.serial {
                dev["serial"] = json!(s);
            }
            a.extend(["-device".to_owned(), dev.to_string()]);
        }
        a
    }
}

/// Checks that every option argument in `args` carries only the keys this crate writes, each
/// once: the property that makes injection impossible, checked on the built command line
/// (defence in depth: [`crate::process::launch`] refuses a command line that fails it; the tests
/// and the fuzz target assert it for any spec).
///
/// # Errors
/// The flag, the argument and the keys QEMU would read from it.
pub fn audit(args: &[String]) -> Result<(), String> {
    for w in args.windows(2) {
        let (flag, arg) = (w[0].as_str(), w[1].as_str());
        let allowed: &[&str] = match flag {
            "-name" => &["guest", "debug-threads"],
            "-machine" => &["", "pflash0", "pflash1"],
            "-chardev" => &["", "id", "path", "server", "wait", "logfile", "logappend"],
            "-vnc" => &["vnc"],
            "-run-with" => &["user"],
            "-mon" => &["chardev", "mode"],
            "-device" => &["driver", "id", "bus", "drive", "bootindex", "serial", "netdev", "mac", "romfile"],
            "-netdev" => &["", "id", "restrict", "hostfwd"],
            "-blockdev" => &["driver", "node-name", "read-only", "file", "file.driver", "file.filename", "file.read-only"],
            "-add-fd" => &["fd", "set", "opaque"],
            _ => continue,
        };
        let keys: Vec<String> = match flag {
            "-device" | "-blockdev" => {
                use serde_json::Value;
                let Ok(Value::Object(v)) = serde_json::from_str::<Value>(arg) else {
                    return Err(format!("{flag} {arg}: not a JSON object"));
                };
                let scalar = |x: &Value| !(x.is_object() || x.is_array());
                let mut keys = Vec::new();
                for (k, x) in &v {
                    match x {
                        Value::Object(f) if k == "file" && f.values().all(scalar) => keys.extend(f.keys().map(|fk| format!("file.{fk}"))),
                        x if scalar(x) => {}
                        _ => return Err(format!("{flag} {arg}: {k} holds a structure where a value belongs")),
                    }
                    keys.push(k.clone());
                }
                keys
            }
            _ => crate::opts::parse(arg).into_iter().map(|(k, _)| k.unwrap_or_default()).collect(),
        };
        let mut seen = std::collections::HashSet::new();
        // A user netdev lists one `hostfwd` per forwarded port.
        let repeats = |k: &str| flag == "-netdev" && k == "hostfwd";
        if let Some(bad) = keys.iter().find(|k| !allowed.contains(&k.as_str()) || !(seen.insert(k.as_str()) || repeats(k))) {
            return Err(format!("{flag} {arg}: QEMU would read a key {bad:?} this command line never sets (keys: {keys:?})"));
        }
        if flag == "-netdev" {
            netdev_values(arg).map_err(|m| format!("{flag} {arg}: {m}"))?;
        }
        if flag == "-add-fd" {
            add_fd_values(arg).map_err(|m| format!("{flag} {arg}: {m}"))?;
        }
    }
    Ok(())
}

/// The values of a `-netdev` this crate writes: a `user` network, forwards only from an
/// ephemeral port on the host's loopback ([`crate::nic`]).
fn netdev_values(arg: &str) -> Result<(), String> {
    for (k, v) in crate::opts::parse(arg) {
        let ok = match k.as_deref().unwrap_or_default() {
            "" => v == "user",
            "restrict" => v == "on",
            "hostfwd" => ["tcp", "udp"].iter().any(|p| {
                v.strip_prefix(&format!("{p}:{}:0-:", crate::nic::HOST_IP)).is_some_and(|port| port.parse::<u16>().is_ok_and(|n| n > 0))
            }),
            _ => true,
        };
        if !ok {
            return Err(format!("{v:?} is not a value this command line writes"));
        }
    }
    Ok(())
}

/// The values of an `-add-fd` this crate writes ([`DiskSource::Inherited`]): an fd past stdio,
/// a set number, a boot opaque (never hot-plug's `virtplug:`, whose sets are removed as stale).
fn add_fd_values(arg: &str) -> Result<(), String> {
    let number = |v: &str| v.parse::<u32>().ok();
    for (k, v) in crate::opts::parse(arg) {
        let ok = match k.as_deref().unwrap_or_default() {
            "fd" => number(&v).is_some_and(|fd| fd >= FIRST_INHERITED_FD),
            "set" => number(&v).is_some(),
            "opaque" => v.starts_with(BOOT_FDSET_PREFIX),
            _ => true,
        };
        if !ok {
            return Err(format!("{v:?} is not a value this command line writes"));
        }
    }
    Ok(())
}

/// The inherited fds (`-add-fd fd=N`) that `args` name, in order.
#[must_use]
pub fn add_fd_numbers(args: &[String]) -> Vec<u32> {
    args.windows(2)
        .filter(|w| w[0] == "-add-fd")
        .flat_map(|w| crate::opts::parse(&w[1]))
        .filter(|(k, _)| k.as_deref() == Some("fd"))
        .filter_map(|(_, v)| v.parse().ok())
        .collect()
}

/// QEMU's seccomp filter as virtplug runs it (`LaunchSpec::sandbox`): no obsolete system
/// calls, no setuid/setgid, no fork/exec, no scheduler or affinity changes. fd handoff keeps
/// working: it only needs `recvmsg` on the QMP socket.
pub const SANDBOX: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// [`SANDBOX`] for a QEMU that drops to another user (`LaunchSpec::run_as`): QEMU's own setuid
/// happens after the filter is installed, so `elevateprivileges` cannot be `deny` (QEMU dies of
/// SIGSYS, measured with QEMU 10.0.2).
pub const SANDBOX_RUN_AS: &str = "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny";

/// Parses a Kubernetes quantity of bytes (`128Mi`, `1Gi`, `512M`, `1073741824`) into MiB
/// (rounded down).
///
/// # Errors
/// When the text is not a usable quantity of bytes ([`api::quantity::bytes`]).
pub fn quantity_mib(q: &str, field: &str) -> Result<u64, CmdlineError> {
    api::quantity::bytes(q).map(|b| b >> 20).map_err(|m| invalid(field, m))
}

/// cores × sockets × threads of `spec.domain.cpu`, checked.
///
/// # Errors
/// When the product exceeds [`api::validation::MAX_VCPUS`] (admission refuses it too; a spec
/// from an API server without virtplug's admission may still carry it).
pub fn vcpus(dom: &api::kubevirt::DomainSpec) -> Result<u32, CmdlineError> {
    let n = dom.vcpus();
    let max = api::validation::MAX_VCPUS;
    u32::try_from(n)
        .ok()
        .filter(|_| n <= max)
        .ok_or_else(|| invalid("spec.domain.cpu", format!("cores × sockets × threads is {n} vCPUs; a guest can have at most {max}")))
}

/// Builds the launch spec of a VMI. `source` gives where QEMU finds a volume present from boot
/// (not hot-pluggable: a host path, or an fd it inherits from its launcher); hot-pluggable
/// volumes are left for hot-plug. `boot_files` decides which
/// host files `kernelBoot` may name.
///
/// # Errors
/// When memory or the CPU topology cannot be used, more `sata` devices than AHCI ports are
/// asked for, a boot volume has no local source, or `kernelBoot` names an image instead of
/// local files, or files outside `boot_files`.
pub fn from_vmi(
    spec: &VirtualMachineInstanceSpec,
    name: &str,
    run_dir: &Path,
    accel: Resolved,
    boot_files: &AllowedDirs,
    source: impl Fn(&Volume) -> Option<DiskSource>,
) -> Result<LaunchSpec, CmdlineError> {
    let dom = &spec.domain;
    let memory_mib =
        match (dom.memory.as_ref().and_then(|m| m.guest.as_ref()), dom.resources.as_ref().and_then(|r| r.requests.get("memory"))) {
            (Some(q), _) => quantity_mib(&q.0, "spec.domain.memory.guest")?,
            (None, Some(q)) => quantity_mib(&q.0, "spec.domain.resources.requests.memory")?,
            (None, None) => 128,
        };
    let vcpus = vcpus(dom)?;
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
            const FIELD: &str = "spec.domain.firmware.kernelBoot.container";
            let kernel =
                c.kernel_path.as_deref().ok_or_else(|| invalid(format!("{FIELD}.kernelPath"), "required: the host path of the kernel"))?;
            Some(KernelBoot {
                kernel: boot_files.resolve(kernel, &format!("{FIELD}.kernelPath"))?,
                initrd: c.initrd_path.as_deref().map(|i| boot_files.resolve(i, &format!("{FIELD}.initrdPath"))).transpose()?,
                cmdline: kb.kernel_args.clone().unwrap_or_default(),
            })
        }
    };
    let firmware = firmware(dom, run_dir)?;
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
                let source =
                    source(v).ok_or_else(|| invalid(format!("{field}.name"), format!("volume {:?} has no local source", d.name)))?;
                boot_disks.push(BootDisk {
                    id: d.name.clone(),
                    source,
                    // A cloud-init seed is a read-only image (ISO 9660) the agent built.
                    readonly: d.readonly() || v.cloud_init().is_some(),
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
        nics: Vec::new(),
        own_mount_namespace: false,
        sandbox: true,
        run_as: None,
        firmware,
        start_paused: false,
    })
}

/// `spec.domain.firmware.bootloader`: `efi` is OVMF with the VM's variable store in `run_dir`;
/// `bios` or nothing is SeaBIOS (KubeVirt's default too). `kernelBoot` works under either: QEMU
/// hands the kernel to the firmware through fw_cfg.
///
/// # Errors
/// What admission refuses ([`api::validation`]), for a spec from an API server without it:
/// both `bios` and `efi`, or `efi.secureBoot: true`.
fn firmware(dom: &api::kubevirt::DomainSpec, run_dir: &Path) -> Result<Firmware, CmdlineError> {
    const FIELD: &str = "spec.domain.firmware.bootloader";
    let Some(b) = dom.firmware.as_ref().and_then(|f| f.bootloader.as_ref()) else { return Ok(Firmware::Bios) };
    match (&b.bios, &b.efi) {
        (Some(_), Some(_)) => Err(invalid(FIELD, "bios and efi are mutually exclusive; keep one of them")),
        (_, Some(efi)) if efi.secure_boot == Some(true) => {
            Err(invalid(format!("{FIELD}.efi.secureBoot"), api::validation::SECURE_BOOT_UNSUPPORTED))
        }
        (_, Some(_)) => Ok(Firmware::efi(run_dir)),
        (_, None) => Ok(Firmware::Bios),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn spec(v: Value) -> VirtualMachineInstanceSpec {
        serde_json::from_value(v).unwrap()
    }

    /// A directory with a kernel and an initrd, allowed for boot files.
    fn boot_dir() -> (tempfile::TempDir, AllowedDirs) {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("k"), b"k").unwrap();
        std::fs::write(t.path().join("i"), b"i").unwrap();
        let dirs = AllowedDirs::new([t.path().to_owned()]);
        (t, dirs)
    }

    #[test]
    fn vmi_maps_to_q35_with_ahci_cdroms_and_hotplug_controller() {
        let (t, dirs) = boot_dir();
        let d = std::fs::canonicalize(t.path()).unwrap().display().to_string();
        let s = spec(json!({
            "domain": {"memory": {"guest": "256Mi"}, "cpu": {"cores": 2},
                "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0", "container": {"kernelPath": format!("{d}/k"), "initrdPath": format!("{d}/i")}}},
                "devices": {"disks": [
                    {"name": "cd", "cdrom": {"bus": "sata"}, "bootOrder": 2},
                    {"name": "root", "disk": {"bus": "virtio"}, "bootOrder": 1},
                    {"name": "hp", "disk": {"bus": "scsi"}}]}},
            "volumes": [{"name": "root", "emptyDisk": {"capacity": "1Gi"}},
                        {"name": "hp", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}]
        }));
        let l =
            from_vmi(&s, "vm1", Path::new("/run/vm1"), Resolved::Tcg, &dirs, |v| Some(PathBuf::from(format!("/vol/{}", v.name)).into()))
                .unwrap();
        assert_eq!((l.memory_mib, l.vcpus), (256, 2));
        assert_eq!(l.cdrom_drives, [CdromDrive { id: "cd".into(), bootindex: Some(2), medium: None }]);
        assert_eq!(l.boot_disks.len(), 1, "the hot-pluggable volume is left for hot-plug");
        let args = l.args().join(" ");
        for want in [
            "-machine q35 -accel tcg -cpu max",
            "-m 256 -smp 2",
            "-display none -pidfile /run/vm1/qemu.pid",
            r#"-device {"driver":"virtio-scsi-pci","id":"hotplug-scsi"}"#,
            r#"-device {"driver":"ide-cd","id":"cd","bus":"ide.0","bootindex":2}"#,
            r#"{"driver":"virtio-blk-pci","id":"root","drive":"root-disk","bootindex":1}"#,
            &format!("-kernel {d}/k -append console=ttyS0 -initrd {d}/i"),
            "-nic none",
            "-vnc vnc=unix:/run/vm1/vnc.sock",
        ] {
            assert!(args.contains(want), "missing {want:?} in {args}");
        }
    }

    /// A cloud-init volume is attached as its disk says: a read-only virtio-blk disk, or the
    /// medium of a `sata` CD-ROM drive; the image path comes from the agent like any source.
    #[test]
    fn a_cloud_init_volume_attaches_read_only_as_its_disk_says() {
        for (disk, want) in [
            (json!({"name": "ci", "disk": {"bus": "virtio"}}), r#"{"driver":"virtio-blk-pci","id":"ci","drive":"ci-disk"}"#),
            (json!({"name": "ci", "disk": {"bus": "sata"}}), r#"{"driver":"ide-hd","id":"ci","bus":"ide.0","drive":"ci-disk"}"#),
            (json!({"name": "ci", "cdrom": {"bus": "sata"}}), r#"{"driver":"ide-cd","id":"ci","bus":"ide.0","drive":"ci-medium"}"#),
        ] {
            let s = spec(json!({"domain": {"devices": {"disks": [disk]}},
                "volumes": [{"name": "ci", "cloudInitConfigDrive": {"userData": "#cloud-config"}}]}));
            let l = from_vmi(&s, "v", Path::new("/r"), Resolved::Tcg, &AllowedDirs::default(), |v| {
                (v.name == "ci").then(|| PathBuf::from("/r/cloud-init.iso").into())
            })
            .unwrap();
            let args = l.args();
            audit(&args).unwrap();
            let args = args.join(" ");
            assert!(args.contains(want), "{want} in {args}");
            assert!(
                args.contains(r#""read-only":true,"file":{"driver":"file","filename":"/r/cloud-init.iso","read-only":true}"#),
                "{args}"
            );
        }
    }

    /// Launcher pods (issue 19): a boot claim reaches QEMU as an inherited fd — an `-add-fd`
    /// (fd 3+n, set n, a `virtplug-boot:` opaque that hot-plug's stale-set cleanup never
    /// matches) before the drive that opens `/dev/fdset/n`; no path to the claim on the command
    /// line. The audit accepts exactly that and refuses any other key or value in an `-add-fd`.
    #[test]
    fn an_inherited_boot_disk_is_an_fd_set_and_the_audit_holds_it_to_that() {
        let s = spec(json!({"domain": {"devices": {"disks": [
                {"name": "root", "disk": {"bus": "virtio"}, "bootOrder": 1},
                {"name": "data", "disk": {"bus": "virtio"}, "serial": "data"},
                {"name": "ci", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "c-root"}},
                        {"name": "data", "dataVolume": {"name": "dv"}},
                        {"name": "ci", "cloudInitNoCloud": {"userData": "#cloud-config"}}]}));
        let l = from_vmi(&s, "v", Path::new("/r"), Resolved::Tcg, &AllowedDirs::default(), |v| match v.name.as_str() {
            "root" => Some(DiskSource::Inherited { index: 0, block: false }),
            "data" => Some(DiskSource::Inherited { index: 1, block: true }),
            _ => Some(PathBuf::from("/r/ci.iso").into()),
        })
        .unwrap();
        assert_eq!(l.inherited_fds(), [0, 1]);
        let args = l.args();
        audit(&args).unwrap();
        let joined = args.join(" ");
        for want in [
            r#"-add-fd fd=3,set=0,opaque=virtplug-boot:root -blockdev {"driver":"raw","node-name":"root-disk","read-only":false,"file":{"driver":"file","filename":"/dev/fdset/0","read-only":false}}"#,
            r#"-add-fd fd=4,set=1,opaque=virtplug-boot:data -blockdev {"driver":"raw","node-name":"data-disk","read-only":false,"file":{"driver":"host_device","filename":"/dev/fdset/1","read-only":false}}"#,
            r#""filename":"/r/ci.iso""#,
        ] {
            assert!(joined.contains(want), "missing {want:?} in {joined}");
        }
        assert_eq!(add_fd_numbers(&args), [3, 4]);
        // A path that is a block device (a Block claim's loop device, `up`) is `host_device` too.
        let dev = std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| PathBuf::from("/dev").join(e.file_name()))
            .find(|p| std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type())));
        if let Some(dev) = dev {
            assert_eq!(DiskSource::Path(dev).driver(), "host_device");
        }
        assert_eq!(DiskSource::Path(PathBuf::from("/r/ci.iso")).driver(), "file");
        assert!(!BOOT_FDSET_PREFIX.starts_with("virtplug:"), "hot-plug's stale fd sets are `virtplug:`; boot sets must never match");
        for bad in [
            "fd=3,set=0,opaque=virtplug-boot:root,opaque=x",
            "fd=3,set=0,opaque=virtplug-boot:root,fdset=9",
            "fd=2,set=0,opaque=virtplug-boot:root",
            "fd=x,set=0,opaque=virtplug-boot:root",
            "fd=3,set=0,opaque=virtplug:root",
            "fd=3,set=-1,opaque=virtplug-boot:root",
        ] {
            let e = audit(&["-add-fd".to_owned(), bad.to_owned()]).unwrap_err();
            assert!(e.starts_with("-add-fd "), "{bad}: {e}");
        }
    }

    #[test]
    fn bootloader_efi_maps_to_ovmf_flash_and_bios_to_the_default() {
        let run = Path::new("/run/vm1");
        let launch = |fw: Value| {
            let s = spec(json!({"domain": {"devices": {}, "firmware": fw}}));
            from_vmi(&s, "vm1", run, Resolved::Tcg, &AllowedDirs::default(), |_| None)
        };
        let l = launch(json!({"bootloader": {"efi": {"secureBoot": false}}})).unwrap();
        assert_eq!(l.firmware, Firmware::efi(run));
        let args = l.args();
        audit(&args).unwrap();
        let args = args.join(" ");
        for want in [
            "-machine q35,pflash0=ovmf-code,pflash1=ovmf-vars -accel tcg",
            r#"-blockdev {"driver":"raw","node-name":"ovmf-code","read-only":true,"file":{"driver":"file","filename":"/usr/share/OVMF/OVMF_CODE_4M.fd","read-only":true}}"#,
            r#"-blockdev {"driver":"raw","node-name":"ovmf-vars","read-only":false,"file":{"driver":"file","filename":"/run/vm1/efivars.fd","read-only":false}}"#,
        ] {
            assert!(args.contains(want), "missing {want:?} in {args}");
        }
        assert!(!args.contains(" -S "), "not paused unless asked: {args}");
        for fw in [json!({}), json!({"bootloader": {"bios": {"useSerial": true}}}), json!({"bootloader": {}})] {
            let l = launch(fw.clone()).unwrap();
            assert_eq!(l.firmware, Firmware::Bios, "{fw}");
            let args = l.args().join(" ");
            assert!(args.contains("-machine q35 -accel") && !args.contains("pflash"), "{args}");
        }
        // What admission refuses, refused again for a spec that did not pass it.
        let e = launch(json!({"bootloader": {"bios": {}, "efi": {}}})).unwrap_err().to_string();
        assert!(e.starts_with("spec.domain.firmware.bootloader: "), "{e}");
        let e = launch(json!({"bootloader": {"efi": {"secureBoot": true}}})).unwrap_err().to_string();
        assert_eq!(e, format!("spec.domain.firmware.bootloader.efi.secureBoot: {}", api::validation::SECURE_BOOT_UNSUPPORTED));
    }

    #[test]
    fn start_paused_adds_dash_s() {
        let mut l = launch("vm", "d", "s", "/run/vm");
        l.start_paused = true;
        let args = l.args();
        assert_eq!(args.iter().filter(|a| *a == "-S").count(), 1, "{args:?}");
        audit(&args).unwrap();
    }

    #[test]
    fn the_audit_refuses_machine_options_it_never_sets() {
        for machine in ["q35,smm=on", "q35,pflash0=a,pflash0=b", "q35,memory-backend=m"] {
            let args: Vec<String> = ["-machine", machine].map(str::to_owned).into();
            assert!(audit(&args).is_err(), "{machine}");
        }
        let args: Vec<String> = ["-machine", "q35,pflash0=ovmf-code,pflash1=ovmf-vars"].map(str::to_owned).into();
        audit(&args).unwrap();
    }

    #[test]
    fn bad_memory_and_image_kernel_name_the_field() {
        let dirs = AllowedDirs::default();
        let s = spec(json!({"domain": {"memory": {"guest": "lots"}, "devices": {}}}));
        let e = from_vmi(&s, "v", Path::new("/r"), Resolved::Tcg, &dirs, |_| None).unwrap_err();
        assert!(e.to_string().starts_with("spec.domain.memory.guest:"), "{e}");
        let s =
            spec(json!({"domain": {"devices": {}, "firmware": {"kernelBoot": {"container": {"image": "quay.io/x", "kernelPath": "/k"}}}}}));
        let e = from_vmi(&s, "v", Path::new("/r"), Resolved::Tcg, &dirs, |_| None).unwrap_err();
        assert!(e.to_string().contains("kernelBoot.container.image"), "{e}");
    }

    #[test]
    fn a_kernel_or_initrd_outside_the_allowed_dirs_is_refused_by_field() {
        let (_t, dirs) = boot_dir();
        for (k, i, field) in [("/etc/shadow", None, "kernelPath"), ("/etc/hostname", Some("/etc/shadow"), "kernelPath")] {
            let s = spec(json!({"domain": {"devices": {}, "firmware": {"kernelBoot": {"container": {"kernelPath": k, "initrdPath": i}}}}}));
            let e = from_vmi(&s, "v", Path::new("/r"), Resolved::Tcg, &dirs, |_| None).unwrap_err().to_string();
            assert!(e.starts_with(&format!("spec.domain.firmware.kernelBoot.container.{field}:")), "{e}");
        }
    }

    #[test]
    fn cpu_topology_that_overflows_is_refused_not_wrapped() {
        let s = spec(json!({"domain": {"devices": {}, "cpu": {"cores": 4_294_967_295u32, "sockets": 4_294_967_295u32, "threads": 2}}}));
        let e = from_vmi(&s, "v", Path::new("/r"), Resolved::Tcg, &AllowedDirs::default(), |_| None).unwrap_err();
        assert!(e.to_string().starts_with("spec.domain.cpu:"), "{e}");
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity_mib("1Gi", "f").unwrap(), 1024);
        assert_eq!(quantity_mib("268435456", "f").unwrap(), 256);
        assert_eq!(quantity_mib("1.5Gi", "f").unwrap(), 1536);
        assert!(quantity_mib("16Ei", "f").is_err(), "2^64 bytes overflow");
        assert!(quantity_mib("18446744073709551615Ki", "f").is_err());
    }

    fn launch(name: &str, disk: &str, serial: &str, path: &str) -> LaunchSpec {
        LaunchSpec {
            name: name.to_owned(),
            run_dir: PathBuf::from(path),
            memory_mib: 128,
            vcpus: 1,
            accel: Resolved::Tcg,
            kernel: None,
            boot_disks: vec![BootDisk {
                id: disk.to_owned(),
                // Both kinds of source, by the serial's length: an inherited fd's opaque names
                // the disk, which must not add a key either.
                source: if serial.len().is_multiple_of(2) {
                    DiskSource::Inherited { index: 0, block: false }
                } else {
                    PathBuf::from(path).join("d.img").into()
                },
                readonly: false,
                sata: serial.len().is_multiple_of(2),
                bootindex: Some(1),
                serial: Some(serial.to_owned()),
            }],
            cdrom_drives: vec![CdromDrive {
                id: format!("{disk}cd"),
                bootindex: None,
                medium: Some(PathBuf::from(path).join("m.iso").into()),
            }],
            nics: Vec::new(),
            own_mount_namespace: false,
            sandbox: true,
            run_as: Some(name.to_owned()),
            firmware: Firmware::Efi { code: PathBuf::from(path).join("code.fd"), vars: PathBuf::from(path).join("vars.fd") },
            start_paused: serial.len().is_multiple_of(3),
        }
    }

    /// Each option argument carries exactly the keys it may, and the values come back whole.
    fn check_no_extra_keys(l: &LaunchSpec) {
        let args = l.args();
        audit(&args).unwrap();
        // The values come back whole.
        let name_arg = args.iter().position(|a| a == "-name").map(|i| &args[i + 1]).unwrap();
        assert_eq!(crate::opts::parse(name_arg)[0], (Some("guest".into()), l.name.clone()));
        let serial = l.boot_disks[0].serial.clone().unwrap();
        let dev = args.iter().filter_map(|a| serde_json::from_str::<Value>(a).ok()).find(|v| v["id"] == l.boot_disks[0].id).unwrap();
        assert_eq!(dev["serial"], json!(serial));
    }

    #[test]
    fn the_injections_of_the_review_add_no_option() {
        // The review's examples: a serial, a name and a path that each try to add a property.
        let l =
            launch("ns_vm,debug-threads=off,process=x", "d,drive=evil", "s,drive=root-disk,bootindex=0", "/run/a,logfile=/etc/cron.d/x");
        check_no_extra_keys(&l);
    }

    proptest::proptest! {
        /// Any name, disk id, serial and run dir: every argument parses back into exactly the
        /// intended options, no extra key, and the values whole.
        #[test]
        fn every_argument_parses_back_into_exactly_the_intended_options(
            name in ".{0,40}", disk in ".{1,20}", serial in ".{0,40}", path in "/[^\\x00]{0,40}",
        ) {
            check_no_extra_keys(&launch(&name, &disk, &serial, &path));
        }
    }
}
