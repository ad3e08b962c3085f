//! Cloud-init volumes (`cloudInitNoCloud`, `cloudInitConfigDrive`): KubeVirt's admission rules,
//! plus what virtplug's node agent cannot honour, refused the same way; and the one base64
//! decoder of their data, shared by admission and the agent.
//!
//! KubeVirt's rules (virt-api's `ValidateVolumes`): at most one user-data source and at most
//! one network-data source per volume, at least one of either, base64 that decodes, inline data
//! of at most 2048 bytes each (`cloudInitUserMaxLen`, `cloudInitNetworkMaxLen`: larger data goes
//! in a Secret). virtplug's own: one cloud-init volume per VMI (KubeVirt's launcher reads only the
//! first one: a second would be ignored), its disk a `disk` on `virtio` or `sata` or a `cdrom` on
//! `sata` (the buses the agent attaches a start-up image to), Secret names that are object names,
//! and no field virtplug does not know (a misspelt `userDataSecretRef` would otherwise be kept and
//! ignored: KubeVirt's JSON name is `secretRef`).

use base64::Engine;

use crate::cause::{Cause, CauseType};
use crate::kubevirt::{CloudInitSource, DiskKind, VirtualMachineInstanceSpec};

/// Most bytes of inline (or base64-decoded) user data: KubeVirt's `cloudInitUserMaxLen`.
pub const USER_DATA_MAX: usize = 2048;
/// Most bytes of inline (or base64-decoded) network data: KubeVirt's `cloudInitNetworkMaxLen`.
pub const NETWORK_DATA_MAX: usize = 2048;

/// Decodes `userDataBase64`/`networkDataBase64` as KubeVirt does (Go's `StdEncoding`: padded
/// standard alphabet; line breaks are skipped, as Go's decoder skips them).
///
/// # Errors
/// The decoder's message when `s` is not base64.
pub fn decode_base64(s: &str) -> Result<Vec<u8>, String> {
    let compact: String = s.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    base64::engine::general_purpose::STANDARD.decode(compact).map_err(|e| e.to_string())
}

/// The admission causes of the cloud-init volumes of `spec` (under `prefix`).
#[must_use]
pub fn validate(spec: &VirtualMachineInstanceSpec, prefix: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let mut first: Option<String> = None;
    for (i, volume) in spec.volumes.iter().enumerate() {
        let Some((kind, source)) = volume.cloud_init() else { continue };
        let field = format!("{prefix}.volumes[{i}]");
        if let Some(other) = &first {
            causes.push(Cause::new(
                CauseType::Invalid,
                field.clone(),
                format!(
                    "volume {:?} is a second cloud-init volume; a VMI has at most one (volume {other:?} is the first): merge their data into one",
                    volume.name
                ),
            ));
        } else {
            first = Some(volume.name.clone());
        }
        causes.extend(source_causes(source, &format!("{field}.{}", kind.key())));
        if let Some((j, disk)) = spec.domain.devices.disks.iter().enumerate().find(|(_, d)| d.name == volume.name) {
            let bus = disk.bus();
            let ok = match disk.kind() {
                DiskKind::Disk => matches!(bus, None | Some("virtio" | "sata")),
                DiskKind::Cdrom => matches!(bus, None | Some("sata")),
                DiskKind::Lun => false,
            };
            if !ok {
                causes.push(Cause::new(
                    CauseType::NotSupported,
                    format!("{prefix}.domain.devices.disks[{j}].{}", disk.kind().key()),
                    format!(
                        "disk {:?} carries a cloud-init volume, which attaches as a disk on bus virtio or sata, or as a cdrom on bus sata; use one of those",
                        disk.name
                    ),
                ));
            }
        }
    }
    causes
}

/// One source's causes; `field` is `...volumes[i].cloudInitNoCloud` (or `...ConfigDrive`).
fn source_causes(s: &CloudInitSource, field: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    for key in s.extra.keys() {
        let hint = if key == "userDataSecretRef" { ": KubeVirt names the user-data Secret reference secretRef" } else { "" };
        causes.push(Cause::new(
            CauseType::NotSupported,
            format!("{field}.{key}"),
            format!(
                "unknown field {key:?}{hint}; use userData, userDataBase64, secretRef, networkData, networkDataBase64 or networkDataSecretRef"
            ),
        ));
    }
    let present = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.is_empty());
    let parts = [
        (
            "user",
            "userdatasource",
            &s.user_data,
            &s.user_data_base64,
            &s.user_data_secret_ref,
            "userDataBase64",
            "secretRef",
            USER_DATA_MAX,
        ),
        (
            "network",
            "networkdata source",
            &s.network_data,
            &s.network_data_base64,
            &s.network_data_secret_ref,
            "networkDataBase64",
            "networkDataSecretRef",
            NETWORK_DATA_MAX,
        ),
    ];
    let mut sources = 0;
    for (what, wording, inline, b64, secret, b64_key, secret_key, max) in parts {
        let secret_named = secret.as_ref().is_some_and(|r| !r.name.is_empty());
        let count = usize::from(present(inline)) + usize::from(present(b64)) + usize::from(secret_named);
        sources += count;
        if count > 1 {
            causes.push(Cause::new(CauseType::Invalid, field, format!("{field} must have only one {wording} set.")));
        }
        let mut len = inline.as_deref().map_or(0, str::len);
        if let Some(b) = b64.as_deref().filter(|b| !b.is_empty()) {
            match decode_base64(b) {
                Ok(bytes) => len = len.max(bytes.len()),
                Err(e) => causes.push(Cause::new(
                    CauseType::Invalid,
                    format!("{field}.{b64_key}"),
                    format!("{field}.{b64_key} is not a valid base64 value ({e})."),
                )),
            }
        }
        if len > max {
            causes.push(Cause::new(
                CauseType::Invalid,
                field,
                format!("{field} {what}data exceeds {max} byte limit. Should use {secret_key} for larger data."),
            ));
        }
        if let Some(r) = secret.as_ref().filter(|r| !r.name.is_empty()) {
            causes.extend(crate::validation::dns1123_subdomain(&r.name, &format!("{field}.{secret_key}.name")));
        }
    }
    if sources == 0 {
        causes.push(Cause::new(
            CauseType::Invalid,
            field,
            format!("{field} must have at least one userdatasource or one networkdatasource set."),
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::tests::vm;
    use crate::validation::validate_vm;
    use serde_json::{json, Value};

    /// The causes (field, first words of the message) of a VM with one cloud-init volume `ci`
    /// of `source` on a virtio disk.
    fn refused(kind: &str, source: &Value) -> Vec<(String, String)> {
        let v = vm(&json!([{"name":"ci","disk":{"bus":"virtio"}}]), &json!([{"name":"ci", kind: source}]));
        validate_vm(&v).into_iter().map(|c| (c.field, c.message)).collect()
    }

    const F: &str = "spec.template.spec.volumes[0].cloudInitNoCloud";

    #[test]
    fn kubevirt_style_sources_are_admitted() {
        for kind in ["cloudInitNoCloud", "cloudInitConfigDrive"] {
            for source in [
                json!({"userData": "#cloud-config\npassword: fedora\n"}),
                json!({"userDataBase64": "I2Nsb3VkLWNvbmZpZwo="}),
                json!({"userDataBase64": "I2Nsb3VkLWNv\nbmZpZwo="}),
                json!({"secretRef": {"name": "my-vmi-secret"}}),
                json!({"networkData": "version: 2\n"}),
                json!({"secretRef": {"name": "u"}, "networkDataSecretRef": {"name": "n"}}),
                json!({"userData": "x".repeat(USER_DATA_MAX), "networkDataBase64": "dmVyc2lvbjogMgo="}),
            ] {
                assert_eq!(refused(kind, &source), vec![], "{kind} {source}");
            }
        }
    }

    /// Each refusal names the field and says what to do; every one is a case KubeVirt's webhook
    /// refuses too, or one the agent could not honour.
    #[test]
    fn what_cannot_be_honoured_is_refused_by_field() {
        for (source, field, words) in [
            (json!({"userData": "a", "userDataBase64": "YQ=="}), F.to_owned(), "must have only one userdatasource set"),
            (json!({"userData": "a", "secretRef": {"name": "s"}}), F.to_owned(), "must have only one userdatasource set"),
            (json!({"networkData": "a", "networkDataSecretRef": {"name": "s"}}), F.to_owned(), "must have only one networkdata source"),
            (json!({"userDataBase64": "not base64!"}), format!("{F}.userDataBase64"), "is not a valid base64 value"),
            (json!({"userData": "a", "networkDataBase64": "%%%"}), format!("{F}.networkDataBase64"), "is not a valid base64 value"),
            (json!({"userData": "x".repeat(USER_DATA_MAX + 1)}), F.to_owned(), "userdata exceeds 2048 byte limit. Should use secretRef"),
            (json!({"networkData": "x".repeat(NETWORK_DATA_MAX + 1)}), F.to_owned(), "networkdata exceeds 2048 byte limit"),
            (json!({}), F.to_owned(), "must have at least one userdatasource or one networkdatasource set"),
            (json!({"userData": ""}), F.to_owned(), "must have at least one"),
            (
                json!({"userDataSecretRef": {"name": "s"}}),
                format!("{F}.userDataSecretRef"),
                "unknown field \"userDataSecretRef\": KubeVirt names",
            ),
            (json!({"secretRef": {"name": "Bad_Name"}}), format!("{F}.secretRef.name"), "is not a valid name"),
        ] {
            let causes = refused("cloudInitNoCloud", &source);
            assert!(causes.iter().any(|(f, m)| *f == field && m.contains(words)), "{source}: want {field} {words:?}, got {causes:?}");
        }
        // The decoded size counts for base64, as in KubeVirt.
        let big = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; USER_DATA_MAX + 1]);
        assert_eq!(
            refused("cloudInitConfigDrive", &json!({"userDataBase64": big}))[0].0,
            "spec.template.spec.volumes[0].cloudInitConfigDrive"
        );
    }

    #[test]
    fn a_second_cloud_init_volume_is_refused_naming_the_first() {
        let v = vm(
            &json!([{"name":"a","disk":{}},{"name":"b","cdrom":{"bus":"sata"}}]),
            &json!([{"name":"a","cloudInitNoCloud":{"userData":"x"}},{"name":"b","cloudInitConfigDrive":{"userData":"y"}}]),
        );
        let c = validate_vm(&v);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].field, "spec.template.spec.volumes[1]");
        assert!(c[0].message.contains("\"a\" is the first"), "{}", c[0].message);
    }

    #[test]
    fn the_disk_of_a_cloud_init_volume_must_be_one_the_agent_attaches() {
        for (disk, ok) in [
            (json!({"name":"ci","disk":{"bus":"virtio"}}), true),
            (json!({"name":"ci","disk":{}}), true),
            (json!({"name":"ci","disk":{"bus":"sata"}}), true),
            (json!({"name":"ci","cdrom":{"bus":"sata"}}), true),
            (json!({"name":"ci","cdrom":{}}), true),
            (json!({"name":"ci","disk":{"bus":"scsi"}}), false),
            (json!({"name":"ci","cdrom":{"bus":"scsi"}}), false),
            (json!({"name":"ci","lun":{}}), false),
        ] {
            let c = validate_vm(&vm(&json!([disk]), &json!([{"name":"ci","cloudInitNoCloud":{"userData":"x"}}])));
            assert_eq!(c.is_empty(), ok, "{disk}: {c:?}");
            if !ok {
                assert!(c[0].field.starts_with("spec.template.spec.domain.devices.disks[0]."), "{c:?}");
            }
        }
    }

    #[test]
    fn a_cloud_init_volume_without_a_disk_is_refused() {
        let c = validate_vm(&vm(&json!([]), &json!([{"name":"ci","cloudInitNoCloud":{"userData":"x"}}])));
        assert_eq!(c.iter().map(|c| c.field.as_str()).collect::<Vec<_>>(), ["spec.template.spec.volumes[0].name"], "{c:?}");
    }

    #[test]
    fn base64_decodes_as_gos_std_encoding() {
        assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64("aG\r\nk=").unwrap(), b"hi");
        assert!(decode_base64("aGk").is_err(), "padding is required");
        assert!(decode_base64("aG-k").is_err(), "URL alphabet is not standard");
    }
}
