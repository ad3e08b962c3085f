//! `spec.accessCredentials` (KubeVirt's `AccessCredential`): SSH public keys from a Secret put on
//! the VMI's cloud-init disk, parsed and admitted here, put on the image by the node agent.
//!
//! # What KubeVirt does (`pkg/cloud-init`, virt-launcher)
//! For each `sshPublicKey` whose `propagationMethod` is `noCloud` (`configDrive`), every
//! non-empty value of its `source.secret.secretName` Secret, in key order, becomes one public
//! key, numbered from `"0"` across the credentials in their order, in the meta-data of the
//! `cloudInitNoCloud` (`cloudInitConfigDrive`) volume: NoCloud's `meta-data` key `public-keys`,
//! ConfigDrive's `openstack/latest/meta_data.json` key `public_keys`. KubeVirt's admission
//! (`validateAccessCredentials`) requires one credential type per entry, one source and one
//! propagation method per key, and a volume of the method's kind.
//!
//! # What virtplug refuses besides
//! `qemuGuestAgent` propagation and `userPassword` (both need a QEMU guest agent, which the node
//! agent does not talk to), unknown fields, and Secret names that are not object names: each a
//! field error naming what is supported.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::cause::{Cause, CauseType};
use crate::kubevirt::{CloudInitKind, VirtualMachineInstanceSpec};

/// One `spec.accessCredentials[]` entry.
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct AccessCredential {
    ssh_public_key: Option<SshPublicKey>,
    user_password: Option<Value>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct SshPublicKey {
    #[serde(default)]
    source: Source,
    #[serde(default)]
    propagation_method: PropagationMethod,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct Source {
    secret: Option<SecretSource>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct SecretSource {
    #[serde(default)]
    secret_name: String,
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct PropagationMethod {
    no_cloud: Option<Value>,
    config_drive: Option<Value>,
    qemu_guest_agent: Option<Value>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// An SSH public key Secret that goes on a cloud-init disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySecret {
    /// Its field: `spec.accessCredentials[i].sshPublicKey.source.secret.secretName`.
    pub field: String,
    pub secret_name: String,
}

/// The entries of `spec.accessCredentials` (`None`: not a list of objects).
fn entries(spec: &VirtualMachineInstanceSpec) -> Option<Vec<Result<AccessCredential, String>>> {
    match spec.extra.get("accessCredentials") {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Array(a)) => Some(a.iter().map(|v| AccessCredential::deserialize(v).map_err(|e| e.to_string())).collect()),
        Some(_) => None,
    }
}

/// The SSH public key Secrets whose keys go on a cloud-init volume of `kind`, in the order
/// KubeVirt numbers their keys. Entries admission would refuse are skipped.
#[must_use]
pub fn ssh_key_secrets(spec: &VirtualMachineInstanceSpec, kind: CloudInitKind) -> Vec<KeySecret> {
    let mut out = Vec::new();
    for (i, entry) in entries(spec).unwrap_or_default().into_iter().enumerate() {
        let Ok(AccessCredential { ssh_public_key: Some(key), .. }) = entry else { continue };
        let method = match kind {
            CloudInitKind::NoCloud => &key.propagation_method.no_cloud,
            CloudInitKind::ConfigDrive => &key.propagation_method.config_drive,
        };
        if let Some(SecretSource { secret_name }) = key.source.secret.filter(|s| method.is_some() && !s.secret_name.is_empty()) {
            out.push(KeySecret { field: format!("spec.accessCredentials[{i}].sshPublicKey.source.secret.secretName"), secret_name });
        }
    }
    out
}

/// The admission causes of `spec.accessCredentials` (under `prefix`).
#[must_use]
pub fn validate(spec: &VirtualMachineInstanceSpec, prefix: &str) -> Vec<Cause> {
    let field = format!("{prefix}.accessCredentials");
    let Some(entries) = entries(spec) else {
        return vec![Cause::new(CauseType::Invalid, field, "accessCredentials must be a list of access credentials".to_owned())];
    };
    let has = |kind: CloudInitKind| spec.volumes.iter().any(|v| v.cloud_init().is_some_and(|(k, _)| k == kind));
    let mut causes = Vec::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let at = format!("{field}[{i}]");
        match entry {
            Ok(c) => causes.extend(entry_causes(&c, &at, has(CloudInitKind::NoCloud), has(CloudInitKind::ConfigDrive))),
            Err(e) => causes.push(Cause::new(CauseType::Invalid, at.clone(), format!("{at} is not an access credential: {e}"))),
        }
    }
    causes
}

/// Unknown fields of one object, as causes.
fn unknown(extra: &Map<String, Value>, at: &str, known: &str) -> Vec<Cause> {
    extra.keys().map(|k| Cause::new(CauseType::NotSupported, format!("{at}.{k}"), format!("unknown field {k:?}; use {known}"))).collect()
}

/// One entry's causes (KubeVirt's words where KubeVirt refuses).
fn entry_causes(c: &AccessCredential, at: &str, no_cloud_volume: bool, config_drive_volume: bool) -> Vec<Cause> {
    let mut causes = unknown(&c.extra, at, "sshPublicKey");
    let types = usize::from(c.ssh_public_key.is_some()) + usize::from(c.user_password.is_some());
    if types != 1 {
        causes.push(Cause::new(CauseType::Invalid, at, format!("{at} must have exactly one access credential type set")));
    }
    if c.user_password.is_some() {
        causes.push(Cause::new(
            CauseType::NotSupported,
            format!("{at}.userPassword"),
            "userPassword is propagated by the QEMU guest agent, which virtplug does not use; \
             use sshPublicKey with propagationMethod noCloud or configDrive"
                .to_owned(),
        ));
    }
    let Some(key) = &c.ssh_public_key else { return causes };
    let ssh = format!("{at}.sshPublicKey");
    causes.extend(unknown(&key.extra, &ssh, "source or propagationMethod"));
    let source = format!("{ssh}.source");
    causes.extend(unknown(&key.source.extra, &source, "secret"));
    match &key.source.secret {
        Some(s) => causes.extend(crate::validation::dns1123_subdomain(&s.secret_name, &format!("{source}.secret.secretName"))),
        None => causes.push(Cause::new(CauseType::Invalid, source, format!("{at} must have exactly one source set"))),
    }
    let method = format!("{ssh}.propagationMethod");
    let m = &key.propagation_method;
    causes.extend(unknown(&m.extra, &method, "noCloud or configDrive"));
    let count = usize::from(m.no_cloud.is_some()) + usize::from(m.config_drive.is_some()) + usize::from(m.qemu_guest_agent.is_some());
    if count != 1 {
        causes.push(Cause::new(CauseType::Invalid, method.clone(), format!("{at} must have exactly one propagationMethod set")));
    }
    for (set, has_volume, kind) in
        [(m.no_cloud.is_some(), no_cloud_volume, "noCloud"), (m.config_drive.is_some(), config_drive_volume, "configDrive")]
    {
        if set && !has_volume {
            causes.push(Cause::new(
                CauseType::Invalid,
                method.clone(),
                format!("{at} requires a {kind} volume to exist when the {kind} propagationMethod is in use."),
            ));
        }
    }
    if m.qemu_guest_agent.is_some() {
        causes.push(Cause::new(
            CauseType::NotSupported,
            format!("{method}.qemuGuestAgent"),
            "propagationMethod qemuGuestAgent needs a QEMU guest agent, which virtplug does not use; \
             use noCloud (with a cloudInitNoCloud volume) or configDrive (with a cloudInitConfigDrive volume)"
                .to_owned(),
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::tests::vm;
    use crate::validation::validate_vm;
    use serde_json::json;

    const F: &str = "spec.template.spec.accessCredentials[0]";

    /// The causes (field, message) of a VM with `creds` and one cloud-init volume of `kind`.
    fn refused(kind: &str, creds: &Value) -> Vec<(String, String)> {
        let mut v = vm(&json!([{"name":"ci","disk":{"bus":"virtio"}}]), &json!([{"name":"ci", kind: {"userData": "x"}}]));
        v["spec"]["template"]["spec"]["accessCredentials"] = creds.clone();
        validate_vm(&v).into_iter().map(|c| (c.field, c.message)).collect()
    }

    fn key(method: &Value) -> Value {
        json!([{"sshPublicKey": {"source": {"secret": {"secretName": "my-pub-key"}}, "propagationMethod": method}}])
    }

    #[test]
    fn keys_for_the_volumes_kind_are_admitted() {
        assert_eq!(refused("cloudInitNoCloud", &key(&json!({"noCloud": {}}))), vec![]);
        assert_eq!(refused("cloudInitConfigDrive", &key(&json!({"configDrive": {}}))), vec![]);
    }

    /// Each refusal names its field; KubeVirt's words where KubeVirt refuses too, and what is
    /// supported where virtplug cannot honour it.
    #[test]
    fn what_cannot_be_honoured_is_refused_by_field() {
        let method = format!("{F}.sshPublicKey.propagationMethod");
        for (kind, creds, field, words) in [
            (
                "cloudInitNoCloud",
                key(&json!({"qemuGuestAgent": {"users": ["fedora"]}})),
                format!("{method}.qemuGuestAgent"),
                "use noCloud (with a cloudInitNoCloud volume) or configDrive",
            ),
            (
                "cloudInitNoCloud",
                key(&json!({"configDrive": {}})),
                method.clone(),
                "requires a configDrive volume to exist when the configDrive propagationMethod is in use.",
            ),
            ("cloudInitConfigDrive", key(&json!({"noCloud": {}})), method.clone(), "requires a noCloud volume to exist"),
            (
                "cloudInitNoCloud",
                key(&json!({"noCloud": {}, "configDrive": {}})),
                method.clone(),
                "must have exactly one propagationMethod set",
            ),
            ("cloudInitNoCloud", key(&json!({})), method.clone(), "must have exactly one propagationMethod set"),
            (
                "cloudInitNoCloud",
                json!([{"sshPublicKey": {"propagationMethod": {"noCloud": {}}}}]),
                format!("{F}.sshPublicKey.source"),
                "must have exactly one source set",
            ),
            (
                "cloudInitNoCloud",
                json!([{"sshPublicKey": {"source": {"secret": {"secretName": "Bad_Name"}}, "propagationMethod": {"noCloud": {}}}}]),
                format!("{F}.sshPublicKey.source.secret.secretName"),
                "is not a valid name",
            ),
            (
                "cloudInitNoCloud",
                json!([{"userPassword": {"source": {"secret": {"secretName": "p"}}, "propagationMethod": {"qemuGuestAgent": {}}}}]),
                format!("{F}.userPassword"),
                "use sshPublicKey with propagationMethod noCloud or configDrive",
            ),
            ("cloudInitNoCloud", json!([{}]), F.to_owned(), "must have exactly one access credential type set"),
            ("cloudInitNoCloud", json!([{"sshKey": {}}]), format!("{F}.sshKey"), "unknown field \"sshKey\""),
            ("cloudInitNoCloud", json!([7]), F.to_owned(), "is not an access credential"),
            ("cloudInitNoCloud", json!({"a": 1}), "spec.template.spec.accessCredentials".to_owned(), "must be a list"),
        ] {
            let causes = refused(kind, &creds);
            assert!(causes.iter().any(|(f, m)| *f == field && m.contains(words)), "{creds}: want {field} {words:?}, got {causes:?}");
        }
    }

    #[test]
    fn the_agent_takes_the_secrets_of_its_volumes_kind_in_order() {
        let spec: VirtualMachineInstanceSpec = serde_json::from_value(json!({"domain": {}, "accessCredentials": [
            {"sshPublicKey": {"source": {"secret": {"secretName": "a"}}, "propagationMethod": {"noCloud": {}}}},
            {"sshPublicKey": {"source": {"secret": {"secretName": "b"}}, "propagationMethod": {"configDrive": {}}}},
            {"sshPublicKey": {"source": {"secret": {"secretName": "c"}}, "propagationMethod": {"noCloud": {}}}},
        ]}))
        .unwrap();
        let names = |k| ssh_key_secrets(&spec, k).into_iter().map(|s| (s.field, s.secret_name)).collect::<Vec<_>>();
        let at = |i: usize| format!("spec.accessCredentials[{i}].sshPublicKey.source.secret.secretName");
        assert_eq!(names(CloudInitKind::NoCloud), [(at(0), "a".to_owned()), (at(2), "c".to_owned())]);
        assert_eq!(names(CloudInitKind::ConfigDrive), [(at(1), "b".to_owned())]);
    }
}
