//! Admission validation mirroring KubeVirt's webhooks for the fields virtplug models.
//!
//! Validation never stops at the first problem: it returns every [`Cause`] with the field path
//! and what to do, which the API server turns into a 422 `Invalid` Status.

use serde_json::Value;

use crate::cdi::{DataVolume, SourceKind};
use crate::invariants;
use crate::kubevirt::{DiskKind, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceSpec};

pub use crate::cause::{Cause, CauseType};

/// Longest DNS-1123 label.
pub const DNS1123_LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (the longest object name).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;

/// Checks a DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters).
#[must_use]
pub fn dns1123_label(value: &str, field: &str) -> Vec<Cause> {
    if value.len() > DNS1123_LABEL_MAX {
        return vec![Cause::new(
            CauseType::TooLong,
            field,
            format!("{value:?} is {} characters long; it must be no more than {DNS1123_LABEL_MAX}", value.len()),
        )];
    }
    if is_label(value) {
        Vec::new()
    } else {
        vec![Cause::new(
            CauseType::Invalid,
            field,
            format!(
                "{value:?} is not a valid DNS-1123 label: use lower case letters, digits and '-', \
                 starting and ending with a letter or digit (e.g. 'my-disk')"
            ),
        )]
    }
}

/// Checks a DNS-1123 subdomain (dot-separated labels, at most 253 characters): object names.
#[must_use]
pub fn dns1123_subdomain(value: &str, field: &str) -> Vec<Cause> {
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        return vec![Cause::new(
            CauseType::TooLong,
            field,
            format!("name is {} characters long; it must be no more than {DNS1123_SUBDOMAIN_MAX}", value.len()),
        )];
    }
    if !value.is_empty() && value.split('.').all(is_label) {
        Vec::new()
    } else {
        vec![Cause::new(
            CauseType::Invalid,
            field,
            format!(
                "{value:?} is not a valid name: use lower case letters, digits, '-' and '.', \
                 starting and ending with a letter or digit (e.g. 'my-vm')"
            ),
        )]
    }
}

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= DNS1123_LABEL_MAX
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Run strategies KubeVirt accepts.
pub const RUN_STRATEGIES: [&str; 6] = ["Always", "Halted", "Manual", "RerunOnFailure", "Once", "WaitAsReceiver"];

/// Validates a `VirtualMachine` given as JSON. Unparseable fields are reported by path.
#[must_use]
pub fn validate_vm(obj: &Value) -> Vec<Cause> {
    let vm: VirtualMachine = match parse(obj) {
        Ok(vm) => vm,
        Err(cause) => return vec![cause],
    };
    let mut causes = Vec::new();
    if vm.spec.running.is_some() && vm.spec.run_strategy.is_some() {
        causes.push(Cause::new(
            CauseType::Invalid,
            "spec.running",
            "running and runStrategy are mutually exclusive; remove spec.running and keep spec.runStrategy",
        ));
    }
    if let Some(rs) = &vm.spec.run_strategy {
        if !RUN_STRATEGIES.contains(&rs.as_str()) {
            causes.push(Cause::new(
                CauseType::NotSupported,
                "spec.runStrategy",
                format!("unsupported value {rs:?}; use one of {}", RUN_STRATEGIES.join(", ")),
            ));
        }
    }
    match &vm.spec.template.spec {
        Some(spec) => causes.extend(validate_instance_spec(spec, "spec.template.spec")),
        None => causes.push(Cause::new(
            CauseType::Required,
            "spec.template.spec",
            "a VirtualMachine needs spec.template.spec with at least spec.template.spec.domain",
        )),
    }
    causes
}

/// The [`invariants`] violations among [`validate_vm`]'s causes (for an API server that, like a
/// cluster without virtplug's admission, accepts specs that break them).
#[must_use]
pub fn invariant_causes_of_vm(obj: &Value) -> Vec<Cause> {
    match parse::<VirtualMachine>(obj) {
        Ok(vm) => vm.spec.template.spec.map(|s| invariants::check(&s, "spec.template.spec")).unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

/// Validates a `VirtualMachineInstance` given as JSON.
#[must_use]
pub fn validate_vmi(obj: &Value) -> Vec<Cause> {
    match parse::<VirtualMachineInstance>(obj) {
        Ok(vmi) => validate_instance_spec(&vmi.spec, "spec"),
        Err(cause) => vec![cause],
    }
}

/// Validates a `DataVolume` given as JSON: exactly one source, a size unless cloning.
#[must_use]
pub fn validate_data_volume(obj: &Value) -> Vec<Cause> {
    let dv: DataVolume = match parse(obj) {
        Ok(dv) => dv,
        Err(cause) => return vec![cause],
    };
    let mut causes = Vec::new();
    match dv.spec.source_kind() {
        Err((field, msg)) => {
            let kind = if field == "spec.source" && dv.spec.source.is_none() { CauseType::Required } else { CauseType::NotSupported };
            causes.push(Cause::new(kind, field, msg));
        }
        Ok(SourceKind::Http(http)) => {
            if !(http.url.starts_with("http://") || http.url.starts_with("https://")) {
                causes.push(Cause::new(
                    CauseType::NotSupported,
                    "spec.source.http.url",
                    format!("{:?} is not an http:// or https:// URL; only those schemes are imported", http.url),
                ));
            }
        }
        Ok(SourceKind::Pvc(p)) => {
            if p.name.is_empty() {
                causes.push(Cause::new(CauseType::Required, "spec.source.pvc.name", "the name of the claim to clone is required"));
            }
        }
        Ok(SourceKind::Blank) => {}
    }
    if dv.spec.storage.is_none() && dv.spec.pvc.is_none() {
        causes.push(Cause::new(
            CauseType::Required,
            "spec.storage",
            "a DataVolume needs spec.storage (or spec.pvc) with resources.requests.storage",
        ));
    }
    causes
}

/// Whether `value` decodes as a `T` (what every Kubernetes client of the resource does with
/// it): no cause, or one naming the first field that does not, under `prefix` (`status`).
#[must_use]
pub fn decode_causes<T: serde::de::DeserializeOwned>(value: &Value, prefix: &str) -> Vec<Cause> {
    match parse::<T>(value) {
        Ok(_) => Vec::new(),
        Err(mut cause) => {
            cause.field = match (prefix, cause.field.as_str()) {
                (p, "") => p.to_owned(),
                ("", f) => f.to_owned(),
                (p, f) => format!("{p}.{f}"),
            };
            vec![cause]
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(obj: &Value) -> Result<T, Cause> {
    serde_path_to_error::deserialize(obj).map_err(|e| {
        let path = e.path().to_string();
        Cause::new(CauseType::Invalid, if path == "." { String::new() } else { path }, e.inner().to_string())
    })
}

/// Validates an instance spec (VMI `spec` or VM `spec.template.spec`) under `prefix`.
#[must_use]
pub fn validate_instance_spec(spec: &VirtualMachineInstanceSpec, prefix: &str) -> Vec<Cause> {
    let mut causes = invariants::check(spec, prefix);
    let disks_path = format!("{prefix}.domain.devices.disks");
    for (i, disk) in spec.domain.devices.disks.iter().enumerate() {
        let field = format!("{disks_path}[{i}]");
        causes.extend(dns1123_label(&disk.name, &format!("{field}.name")));
        if disk.kinds().len() > 1 {
            causes.push(Cause::new(
                CauseType::Invalid,
                field.clone(),
                format!("disk {:?} sets more than one of disk, lun, cdrom; keep exactly one", disk.name),
            ));
        }
        causes.extend(serial(disk.serial.as_deref(), &field));
        let kind = disk.kind();
        if let Some(bus) = disk.bus() {
            let known: &[&str] = match kind {
                DiskKind::Disk => &["virtio", "sata", "scsi", "usb"],
                DiskKind::Lun => &["virtio", "sata", "scsi"],
                DiskKind::Cdrom => &["sata", "scsi", "usb"],
            };
            if !known.contains(&bus) {
                causes.push(Cause::new(
                    CauseType::NotSupported,
                    format!("{field}.{}.bus", kind.key()),
                    format!("unsupported bus {bus:?} for a {}; use one of {}", kind.key(), known.join(", ")),
                ));
            }
        }
        let hotplug = spec.volumes.iter().any(|v| v.name == disk.name && v.is_hotpluggable());
        if hotplug {
            let allowed: &[&str] = match kind {
                DiskKind::Disk => &["scsi", "virtio"],
                DiskKind::Lun => &["scsi"],
                DiskKind::Cdrom => &["sata"],
            };
            let bus = disk.bus().unwrap_or(match kind {
                DiskKind::Cdrom => "sata",
                _ => "virtio",
            });
            if !allowed.contains(&bus) {
                causes.push(Cause::new(
                    CauseType::NotSupported,
                    format!("{field}.{}.bus", kind.key()),
                    format!(
                        "disk {:?} is hot-pluggable, and a hot-plugged {} must use bus {}; change the bus or set hotpluggable: false",
                        disk.name,
                        kind.key(),
                        allowed.join(" or ")
                    ),
                ));
            }
        }
    }
    causes.extend(domain(spec, prefix));
    causes.extend(crate::cloud_init::validate(spec, prefix));
    causes.extend(crate::access_credentials::validate(spec, prefix));
    causes.extend(crate::network::validate(spec, prefix));
    for (i, volume) in spec.volumes.iter().enumerate() {
        let field = format!("{prefix}.volumes[{i}]");
        causes.extend(dns1123_label(&volume.name, &format!("{field}.name")));
        let sources = volume.source_keys();
        if sources.len() != 1 {
            causes.push(Cause::new(
                if sources.is_empty() { CauseType::Required } else { CauseType::Invalid },
                field.clone(),
                format!(
                    "volume {:?} must have exactly one source (persistentVolumeClaim, dataVolume, cloudInitNoCloud, cloudInitConfigDrive, emptyDisk, ...), found {}",
                    volume.name,
                    if sources.is_empty() { "none".to_owned() } else { sources.join(", ") }
                ),
            ));
        }
        if let Some(pvc) = &volume.persistent_volume_claim {
            causes.extend(dns1123_subdomain(&pvc.claim_name, &format!("{field}.persistentVolumeClaim.claimName")));
        }
        if let Some(dv) = &volume.data_volume {
            causes.extend(dns1123_subdomain(&dv.name, &format!("{field}.dataVolume.name")));
        }
    }
    causes
}

/// Longest disk serial (KubeVirt's `maxStrLen`).
pub const SERIAL_MAX: usize = 256;

/// Most vCPUs (cores × sockets × threads) of a guest: QEMU's q35 maximum.
pub const MAX_VCPUS: u64 = 4096;

/// A disk serial as KubeVirt admits it: `[A-Za-z0-9_.+-]`, at most 256 characters. It reaches
/// QEMU and the guest's `/dev/disk/by-id`, so nothing else is let through.
fn serial(serial: Option<&str>, disk_field: &str) -> Vec<Cause> {
    let Some(s) = serial.filter(|s| !s.is_empty()) else { return Vec::new() };
    let mut causes = Vec::new();
    if !s.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'+' | b'-')) {
        causes.push(Cause::new(
            CauseType::Invalid,
            format!("{disk_field}.serial"),
            format!("{disk_field} must be made up of the following characters [A-Za-z0-9_.+-], if specified"),
        ));
    }
    if s.chars().count() > SERIAL_MAX {
        causes.push(Cause::new(
            CauseType::Invalid,
            format!("{disk_field}.serial"),
            format!("{disk_field} must be less than or equal to {SERIAL_MAX} in length, if specified"),
        ));
    }
    causes
}

/// A host path as KubeVirt admits it (`validatePath`): absolute, without `.`/`..` components or
/// doubled slashes, not `/`. virtplug also refuses commas and NULs (QEMU's `-initrd` splits at
/// commas; a NUL cannot be a path). Which directories it may be in is the node's decision.
fn host_path(path: &str, field: &str) -> Vec<Cause> {
    if path == "/" {
        return vec![Cause::new(CauseType::Invalid, field, format!("{field} must not point to root"))];
    }
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    let clean = trimmed.starts_with('/') && trimmed[1..].split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    let mut causes = Vec::new();
    if !clean {
        causes.push(Cause::new(
            CauseType::Invalid,
            field,
            format!("{field} must be an absolute path to a file without relative components"),
        ));
    }
    if path.contains([',', '\0']) {
        causes.push(Cause::new(CauseType::Invalid, field, format!("{field} must not contain a comma or a NUL character; rename the file")));
    }
    causes
}

/// The message for `efi.secureBoot: true`.
pub const SECURE_BOOT_UNSUPPORTED: &str = "secureBoot is not supported here (no SMM/secure-boot OVMF build); set secureBoot: false";

/// `spec.domain.firmware.bootloader`: one of `bios` and `efi`; no secure boot (virtplug runs
/// OVMF without SMM, which a secure-boot OVMF build needs). `efi` with `kernelBoot` is allowed:
/// QEMU hands the kernel to OVMF, which starts it (the test guest boots so).
fn bootloader(spec: &VirtualMachineInstanceSpec, prefix: &str) -> Vec<Cause> {
    let Some(b) = spec.domain.firmware.as_ref().and_then(|f| f.bootloader.as_ref()) else { return Vec::new() };
    let field = format!("{prefix}.domain.firmware.bootloader");
    let mut causes = Vec::new();
    if b.bios.is_some() && b.efi.is_some() {
        causes.push(Cause::new(CauseType::Invalid, field.clone(), "bios and efi are mutually exclusive; keep one of them"));
    }
    if b.efi.as_ref().and_then(|e| e.secure_boot) == Some(true) {
        causes.push(Cause::new(CauseType::NotSupported, format!("{field}.efi.secureBoot"), SECURE_BOOT_UNSUPPORTED));
    }
    causes
}

/// `spec.domain`: CPU topology, memory, kernel boot, bootloader.
fn domain(spec: &VirtualMachineInstanceSpec, prefix: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let dom = &spec.domain;
    let n = dom.vcpus();
    if n > MAX_VCPUS {
        causes.push(Cause::new(
            CauseType::Invalid,
            format!("{prefix}.domain.cpu"),
            format!("cores × sockets × threads is {n}; a guest can have at most {MAX_VCPUS} vCPUs"),
        ));
    }
    let guest = dom.memory.as_ref().and_then(|m| m.guest.as_ref()).map(|q| ("memory.guest", q));
    let requested = dom.resources.as_ref().and_then(|r| r.requests.get("memory")).map(|q| ("resources.requests.memory", q));
    for (name, q) in guest.into_iter().chain(requested) {
        if let Err(m) = crate::quantity::bytes(&q.0) {
            causes.push(Cause::new(CauseType::Invalid, format!("{prefix}.domain.{name}"), m));
        }
    }
    causes.extend(bootloader(spec, prefix));
    if let Some(kb) = dom.firmware.as_ref().and_then(|f| f.kernel_boot.as_ref()) {
        let field = format!("{prefix}.domain.firmware.kernelBoot");
        if let Some(c) = &kb.container {
            for (name, value) in [("kernelPath", &c.kernel_path), ("initrdPath", &c.initrd_path)] {
                if let Some(p) = value {
                    causes.extend(host_path(p, &format!("{field}.container.{name}")));
                }
            }
        }
        if kb.kernel_args.as_deref().is_some_and(|a| a.contains('\0')) {
            causes.push(Cause::new(CauseType::Invalid, format!("{field}.kernelArgs"), "kernelArgs must not contain a NUL character"));
        }
    }
    causes
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A VM with these disks and volumes (shared with the admission tests of other modules).
    pub(crate) fn vm(disks: &Value, volumes: &Value) -> Value {
        json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"vm1"},
               "spec":{"runStrategy":"Always","template":{"spec":{"domain":{"devices":{"disks":disks}},"volumes":volumes}}}})
    }

    #[test]
    fn a_valid_vm_passes() {
        let v = vm(
            &json!([{"name":"root","disk":{"bus":"virtio"},"bootOrder":1},{"name":"cd","cdrom":{"bus":"sata"}},
                   {"name":"data","serial":"d1","disk":{"bus":"scsi"}}]),
            &json!([{"name":"root","emptyDisk":{"capacity":"1Gi"}},
                   {"name":"data","persistentVolumeClaim":{"claimName":"pvc1","hotpluggable":true}}]),
        );
        assert_eq!(validate_vm(&v), vec![]);
    }

    #[test]
    fn hotplug_bus_rules_name_the_bus_field() {
        let v = vm(
            &json!([{"name":"a","disk":{"bus":"sata"}},{"name":"b","lun":{"bus":"virtio"}},{"name":"c","cdrom":{"bus":"scsi"}}]),
            &json!([{"name":"a","dataVolume":{"name":"dva","hotpluggable":true}},
                   {"name":"b","persistentVolumeClaim":{"claimName":"b","hotpluggable":true}},
                   {"name":"c","dataVolume":{"name":"iso","hotpluggable":true}}]),
        );
        let fields: Vec<String> = validate_vm(&v).into_iter().map(|c| c.field).collect();
        assert_eq!(
            fields,
            [
                "spec.template.spec.domain.devices.disks[0].disk.bus",
                "spec.template.spec.domain.devices.disks[1].lun.bus",
                "spec.template.spec.domain.devices.disks[2].cdrom.bus"
            ]
        );
    }

    #[test]
    fn running_and_run_strategy_are_exclusive() {
        let mut v = vm(&json!([]), &json!([]));
        v["spec"]["running"] = json!(true);
        let c = validate_vm(&v);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].field, "spec.running");
    }

    #[test]
    fn wrong_types_are_reported_by_path() {
        let v = vm(&json!([{"name":"a","bootOrder":"first"}]), &json!([]));
        let c = validate_vm(&v);
        assert_eq!(c.len(), 1);
        assert!(c[0].field.contains("bootOrder"), "{c:?}");
    }

    #[test]
    fn names_must_be_dns_labels() {
        assert!(dns1123_label("ok-name-1", "f").is_empty());
        assert_eq!(dns1123_label("Bad_Name", "f")[0].kind, "FieldValueInvalid");
        assert_eq!(dns1123_label(&"a".repeat(64), "f")[0].kind, "FieldValueTooLong");
        assert!(dns1123_subdomain("a.b-c", "f").is_empty());
        assert!(!dns1123_subdomain("-a", "f").is_empty());
    }

    #[test]
    fn serials_follow_kubevirts_characters_and_length() {
        for (serial, ok) in [
            ("d1", true),
            ("A-z_0.9+", true),
            (&*"a".repeat(256), true),
            (&*"a".repeat(257), false),
            ("a,drive=x", false),
            ("a b", false),
            ("ü", false),
            ("a\nb", false),
        ] {
            let v =
                vm(&json!([{"name":"d","serial":serial,"disk":{"bus":"virtio"}}]), &json!([{"name":"d","emptyDisk":{"capacity":"1Gi"}}]));
            let c = validate_vm(&v);
            assert_eq!(c.is_empty(), ok, "{serial:?}: {c:?}");
            if !ok {
                assert_eq!(c[0].field, "spec.template.spec.domain.devices.disks[0].serial");
            }
        }
    }

    #[test]
    fn kernel_paths_must_be_clean_absolute_paths_without_commas() {
        for (path, ok) in [
            ("/var/lib/k", true),
            ("k", false),
            ("/a/../etc/shadow", false),
            ("/a/./k", false),
            ("/", false),
            ("/a//k", false),
            ("/a/k,/etc/shadow", false),
            ("/a/k\u{0}", false),
        ] {
            let mut v = vm(&json!([]), &json!([]));
            v["spec"]["template"]["spec"]["domain"]["firmware"] = json!({"kernelBoot": {"container": {"kernelPath": path}}});
            let c = validate_vm(&v);
            assert_eq!(c.is_empty(), ok, "{path:?}: {c:?}");
            if !ok {
                assert_eq!(c[0].field, "spec.template.spec.domain.firmware.kernelBoot.container.kernelPath");
            }
        }
    }

    #[test]
    fn bootloader_is_bios_or_efi_without_secure_boot() {
        for (bootloader, fields) in [
            (json!({"bios": {"useSerial": true}}), vec![]),
            (json!({"efi": {}}), vec![]),
            (json!({"efi": {"secureBoot": false, "persistent": true}}), vec![]),
            (json!({"bios": {}, "efi": {}}), vec!["spec.template.spec.domain.firmware.bootloader"]),
            (json!({"efi": {"secureBoot": true}}), vec!["spec.template.spec.domain.firmware.bootloader.efi.secureBoot"]),
        ] {
            let mut v = vm(&json!([]), &json!([]));
            v["spec"]["template"]["spec"]["domain"]["firmware"] = json!({"bootloader": bootloader});
            let c = validate_vm(&v);
            assert_eq!(c.iter().map(|c| c.field.as_str()).collect::<Vec<_>>(), fields, "{bootloader}: {c:?}");
            if bootloader["efi"]["secureBoot"] == json!(true) {
                assert_eq!(c[0].message, SECURE_BOOT_UNSUPPORTED);
            }
        }
    }

    #[test]
    fn efi_with_kernel_boot_is_allowed() {
        // QEMU loads the kernel through fw_cfg and OVMF starts it (crates/qemu/tests/firmware.rs
        // boots the test guest so).
        let mut v = vm(&json!([]), &json!([]));
        v["spec"]["template"]["spec"]["domain"]["firmware"] =
            json!({"bootloader": {"efi": {"secureBoot": false}}, "kernelBoot": {"container": {"kernelPath": "/var/lib/k"}}});
        assert_eq!(validate_vm(&v), vec![]);
    }

    #[test]
    fn cpu_topology_and_memory_that_overflow_are_refused() {
        let mut v = vm(&json!([]), &json!([]));
        v["spec"]["template"]["spec"]["domain"]["cpu"] = json!({"cores": 4_294_967_295u32, "sockets": 4_294_967_295u32, "threads": 2});
        v["spec"]["template"]["spec"]["domain"]["memory"] = json!({"guest": "99Ei"});
        let fields: Vec<String> = validate_vm(&v).into_iter().map(|c| c.field).collect();
        assert_eq!(fields, ["spec.template.spec.domain.cpu", "spec.template.spec.domain.memory.guest"]);
    }

    #[test]
    fn data_volume_needs_one_http_or_https_source() {
        let dv = json!({"apiVersion":"cdi.kubevirt.io/v1beta1","kind":"DataVolume","metadata":{"name":"d"},
            "spec":{"source":{"http":{"url":"file:///etc/passwd"}},"storage":{"resources":{"requests":{"storage":"1Gi"}}}}});
        let c = validate_data_volume(&dv);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].field, "spec.source.http.url");
    }

    /// Sources virtplug does not import from are refused naming the field and what is
    /// supported, not accepted and then failed by the importer.
    #[test]
    fn data_volume_sources_that_are_not_imported_are_refused_naming_the_supported_ones() {
        let with = |spec: Value| {
            let mut s = json!({"storage": {"resources": {"requests": {"storage": "1Gi"}}}});
            s.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
            validate_data_volume(
                &json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "d"}, "spec": s}),
            )
        };
        for (spec, field) in [
            (json!({"sourceRef": {"kind": "DataSource", "name": "fedora"}}), "spec.sourceRef"),
            (json!({"source": {"registry": {"url": "docker://quay.io/x"}}}), "spec.source.registry"),
            (json!({"source": {"upload": {}}}), "spec.source.upload"),
            (json!({"source": {"vddk": {"url": "https://vc"}}}), "spec.source.vddk"),
            (json!({"source": {"http": {"url": "http://a/b"}, "blank": {}}}), "spec.source"),
        ] {
            let c = with(spec.clone());
            assert_eq!(c.len(), 1, "{spec}: {c:?}");
            assert_eq!(c[0].field, field, "{spec}");
            assert!(c[0].message.contains("http") && c[0].message.contains("pvc"), "{spec}: {}", c[0].message);
        }
        assert_eq!(with(json!({"source": {"pvc": {"namespace": "default", "name": "golden"}}})), vec![]);
        assert_eq!(with(json!({"source": {"pvc": {"namespace": "default", "name": ""}}}))[0].field, "spec.source.pvc.name");
    }
}
