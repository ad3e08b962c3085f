//! A VMI's cloud-init seed: the data of its `cloudInitNoCloud` or `cloudInitConfigDrive` volume
//! (inline, base64, or from Secrets of its namespace) made into the small read-only ISO 9660
//! image KubeVirt's virt-launcher builds, attached as the volume's disk.
//!
//! # What goes on the image (KubeVirt's `pkg/cloud-init`)
//! - NoCloud: label `cidata`; `meta-data` (JSON: `instance-id`, `local-hostname`, and
//!   `public-keys` when there are SSH keys), `user-data`, and `network-config` when there is
//!   network data.
//! - ConfigDrive: label `config-2`; `openstack/latest/meta_data.json` (`instance_id` =
//!   `NAME.NAMESPACE`, `uuid`, `hostname`, and `public_keys` when there are SSH keys),
//!   `openstack/latest/user_data`, and `openstack/latest/network_data.json` when there is
//!   network data.
//!
//! The SSH keys are those of `spec.accessCredentials` whose propagation method is the volume's
//! kind ([`api::access_credentials`]): every non-empty value of each Secret, in key order,
//! numbered from `"0"` (KubeVirt's `resolveSSHPublicKeys`).
//!
//! The instance id (NoCloud) and uuid (ConfigDrive) are `spec.domain.firmware.uuid` when set
//! (KubeVirt's source), else the VMI's UID (KubeVirt draws a random one then). The hostname is
//! `spec.hostname`, else the VMI name up to its first dot, at most 63 characters (KubeVirt's
//! `SanitizeHostname`).
//!
//! # Flow
//! [`resolve`] before launch (it reads the API, so it is async and may wait for a Secret); then
//! [`Seed::image`] and [`write`] into the run dir, off the async threads, before QEMU starts. The
//! image goes with the run dir when the VMI goes.
//!
//! # Errors
//! [`CloudInitError`]: a Secret or its key missing ([`CloudInitError::waits_for`]: the VMI waits
//! for it, watching it ([`wait`]), as KubeVirt's launcher pod waits for its Secret volume), data admission refuses (for a spec
//! from an API server without virtplug's admission), data too large, an API error.

pub mod iso9660;
pub mod wait;

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::ResourceExt;
use serde_json::json;

use api::kubevirt::{CloudInitKind, CloudInitSource, LocalObjectReference};
use api::VirtualMachineInstance;

/// The seed image's file name in the VMI's run dir.
pub const IMAGE: &str = "cloud-init.iso";

/// Most bytes of user or network data read from a Secret (a Kubernetes Secret holds at most
/// 1 MiB anyway).
pub const SECRET_DATA_MAX: usize = 1 << 20;

/// Errors resolving a VMI's cloud-init data.
#[derive(Debug, thiserror::Error)]
pub enum CloudInitError {
    #[error("{field}: Secret {secret} not found; create it {hint} or fix the reference")]
    SecretMissing { field: String, secret: Box<wait::Awaited>, hint: &'static str },
    /// `secret.seen`: the version of the Secret that lacks the key.
    #[error("{field}: Secret {secret} has no key {key} (or {alt}); add it")]
    KeyMissing { field: String, secret: Box<wait::Awaited>, key: &'static str, alt: &'static str },
    #[error("{field}: cannot read Secret {namespace}/{name}")]
    SecretRead {
        field: String,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("cloud-init volume {volume:?}: cannot build its image")]
    Image {
        volume: String,
        #[source]
        source: iso9660::IsoError,
    },
    #[error("cloud-init volume {volume:?}: cannot write {}", path.display())]
    Write {
        volume: String,
        path: PathBuf,
        #[source]
        source: durable::WriteError,
    },
}

/// A VMI's resolved cloud-init data: what goes on its image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seed {
    /// The volume's name (its disk's).
    pub volume: String,
    pub kind: CloudInitKind,
    pub user_data: Vec<u8>,
    pub network_data: Option<Vec<u8>>,
    /// SSH public keys for the meta-data (`accessCredentials`).
    pub ssh_public_keys: Vec<String>,
    /// NoCloud's `instance-id`, ConfigDrive's `uuid`.
    pub instance_id: String,
    /// ConfigDrive's `instance_id`: `NAME.NAMESPACE`.
    pub name_namespace: String,
    pub hostname: String,
}

impl Seed {
    /// The files of the image, by path.
    #[must_use]
    pub fn files(&self) -> Vec<(&'static str, Vec<u8>)> {
        let (mut meta, keys, user, network) = match self.kind {
            CloudInitKind::NoCloud => (
                ("meta-data", json!({"instance-id": self.instance_id, "local-hostname": self.hostname})),
                "public-keys",
                "user-data",
                "network-config",
            ),
            CloudInitKind::ConfigDrive => (
                (
                    "openstack/latest/meta_data.json",
                    json!({"instance_id": self.name_namespace, "uuid": self.instance_id, "hostname": self.hostname}),
                ),
                "public_keys",
                "openstack/latest/user_data",
                "openstack/latest/network_data.json",
            ),
        };
        if !self.ssh_public_keys.is_empty() {
            let numbered: serde_json::Map<String, serde_json::Value> =
                self.ssh_public_keys.iter().enumerate().map(|(i, k)| (i.to_string(), k.as_str().into())).collect();
            meta.1[keys] = numbered.into();
        }
        let mut files = vec![(meta.0, meta.1.to_string().into_bytes()), (user, self.user_data.clone())];
        if let Some(n) = &self.network_data {
            files.push((network, n.clone()));
        }
        files
    }

    /// The ISO 9660 image (label `cidata` or `config-2`), dated `at`.
    ///
    /// # Errors
    /// [`CloudInitError::Image`] (the paths are fixed: only a size over the writer's bound).
    pub fn image(&self, at: iso9660::Stamp) -> Result<Vec<u8>, CloudInitError> {
        let label = match self.kind {
            CloudInitKind::NoCloud => "cidata",
            CloudInitKind::ConfigDrive => "config-2",
        };
        let files = self.files();
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (*p, d.as_slice())).collect();
        iso9660::build(label, &refs, at).map_err(|source| CloudInitError::Image { volume: self.volume.clone(), source })
    }
}

/// Writes the seed's image to `run_dir`/[`IMAGE`] (atomically, mode 0600) and returns its path.
///
/// # Errors
/// [`CloudInitError::Image`] or [`CloudInitError::Write`].
pub fn write(seed: &Seed, run_dir: &Path) -> Result<PathBuf, CloudInitError> {
    let image = seed.image(iso9660::Stamp::of(jiff::Timestamp::now()))?;
    let path = run_dir.join(IMAGE);
    durable::write_atomic(&path, &image, 0o600).map_err(|source| CloudInitError::Write {
        volume: seed.volume.clone(),
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// The cloud-init data of `vmi`'s first cloud-init volume (admission allows one), its Secrets
/// read through `client`; `None` without one.
///
/// # Errors
/// [`CloudInitError`].
pub async fn resolve(client: &kube::Client, vmi: &VirtualMachineInstance) -> Result<Option<Seed>, CloudInitError> {
    let Some((i, volume, kind, source)) = vmi.spec.volumes.iter().enumerate().find_map(|(i, v)| v.cloud_init().map(|(k, s)| (i, v, k, s)))
    else {
        return Ok(None);
    };
    let field = format!("spec.volumes[{i}].{}", kind.key());
    let ns = vmi.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let user = data(&secrets, &ns, source, Part::User, &field).await?;
    let network = data(&secrets, &ns, source, Part::Network, &field).await?;
    let mut ssh_public_keys = Vec::new();
    for k in api::access_credentials::ssh_key_secrets(&vmi.spec, kind) {
        ssh_public_keys.extend(public_keys(&secrets, &ns, k).await?);
    }
    let spec_str = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
    let uuid = spec_str(vmi.spec.domain.firmware.as_ref().and_then(|f| f.extra.get("uuid")));
    let name = vmi.name_any();
    let hostname = spec_str(vmi.spec.extra.get("hostname"))
        .unwrap_or_else(|| name.split('.').next().unwrap_or_default().chars().take(api::validation::DNS1123_LABEL_MAX).collect());
    Ok(Some(Seed {
        volume: volume.name.clone(),
        kind,
        user_data: user.unwrap_or_default(),
        network_data: network,
        ssh_public_keys,
        instance_id: uuid.unwrap_or_else(|| vmi.uid().unwrap_or_default()),
        name_namespace: format!("{name}.{ns}"),
        hostname,
    }))
}

/// Reads Secret `name` for `field`; missing, it is waited for ([`CloudInitError::SecretMissing`]
/// with `hint`).
async fn read(secrets: &Api<Secret>, field: &str, ns: &str, name: &str, hint: &'static str) -> Result<Secret, CloudInitError> {
    let (namespace, name) = (ns.to_owned(), name.to_owned());
    match secrets.get_opt(&name).await {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err(CloudInitError::SecretMissing {
            field: field.to_owned(),
            secret: Box::new(wait::Awaited { namespace, name, seen: None }),
            hint,
        }),
        Err(e) => Err(CloudInitError::SecretRead { field: field.to_owned(), namespace, name, source: Box::new(e) }),
    }
}

/// The SSH public keys of one `accessCredentials` Secret: its non-empty values in key order (a
/// Secret's data is sorted by key, as the files of KubeVirt's Secret volume are).
async fn public_keys(secrets: &Api<Secret>, ns: &str, k: api::access_credentials::KeySecret) -> Result<Vec<String>, CloudInitError> {
    let secret = read(secrets, &k.field, ns, &k.secret_name, "with the public keys as its values (any key names)").await?;
    let data = secret.data.unwrap_or_default();
    bounded(data.values().map(|v| v.0.len()).sum(), &k.field, ns, &k.secret_name)?;
    Ok(data.into_values().filter(|v| !v.0.is_empty()).map(|v| String::from_utf8_lossy(&v.0).into_owned()).collect())
}

/// Refuses `len` bytes from Secret `ns`/`name` past [`SECRET_DATA_MAX`].
fn bounded(len: usize, field: &str, ns: &str, name: &str) -> Result<(), CloudInitError> {
    if len > SECRET_DATA_MAX {
        return Err(CloudInitError::Invalid {
            message: format!("Secret {ns}/{name} holds {len} bytes; at most {SECRET_DATA_MAX} are put on a cloud-init image"),
            field: field.to_owned(),
        });
    }
    Ok(())
}

/// User data or network data.
#[derive(Clone, Copy)]
enum Part {
    User,
    Network,
}

/// One part's data: inline, base64 or from its Secret (`None`: not given).
async fn data(secrets: &Api<Secret>, ns: &str, s: &CloudInitSource, part: Part, field: &str) -> Result<Option<Vec<u8>>, CloudInitError> {
    let (inline, b64, secret, b64_key, secret_key, keys, hint) = match part {
        Part::User => (
            &s.user_data,
            &s.user_data_base64,
            &s.user_data_secret_ref,
            "userDataBase64",
            "secretRef",
            ["userdata", "userData"],
            "with key userdata (KubeVirt's name)",
        ),
        Part::Network => (
            &s.network_data,
            &s.network_data_base64,
            &s.network_data_secret_ref,
            "networkDataBase64",
            "networkDataSecretRef",
            ["networkdata", "networkData"],
            "with key networkdata (KubeVirt's name)",
        ),
    };
    if let Some(d) = inline.as_deref().filter(|d| !d.is_empty()) {
        return Ok(Some(d.as_bytes().to_vec()));
    }
    if let Some(b) = b64.as_deref().filter(|b| !b.is_empty()) {
        let field = format!("{field}.{b64_key}");
        return api::cloud_init::decode_base64(b)
            .map(Some)
            .map_err(|e| CloudInitError::Invalid { message: format!("{field} is not a valid base64 value ({e})"), field });
    }
    let Some(LocalObjectReference { name, .. }) = secret.as_ref().filter(|r| !r.name.is_empty()) else { return Ok(None) };
    let field = format!("{field}.{secret_key}");
    let secret = read(secrets, &field, ns, name, hint).await?;
    let map = secret.data.unwrap_or_default();
    let Some(bytes) = keys.iter().find_map(|k| map.get(*k)) else {
        let secret = Box::new(wait::Awaited { namespace: ns.to_owned(), name: name.clone(), seen: secret.metadata.resource_version });
        return Err(CloudInitError::KeyMissing { field, secret, key: keys[0], alt: keys[1] });
    };
    bounded(bytes.0.len(), &field, ns, name)?;
    Ok(Some(bytes.0.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(kind: CloudInitKind, network: Option<&[u8]>) -> Seed {
        Seed {
            volume: "cloudinitdisk".into(),
            kind,
            user_data: b"#cloud-config\npassword: fedora\n".to_vec(),
            network_data: network.map(<[u8]>::to_vec),
            ssh_public_keys: Vec::new(),
            instance_id: "6a1b-uid".into(),
            name_namespace: "testvm.default".into(),
            hostname: "testvm".into(),
        }
    }

    /// The files and meta-data KubeVirt's launcher writes, by data source.
    #[test]
    fn files_follow_kubevirts_layout() {
        let paths = |s: &Seed| s.files().into_iter().map(|(p, _)| p).collect::<Vec<_>>();
        let nc = seed(CloudInitKind::NoCloud, None);
        assert_eq!(paths(&nc), ["meta-data", "user-data"]);
        let meta: serde_json::Value = serde_json::from_slice(&nc.files()[0].1).unwrap();
        assert_eq!(meta, json!({"instance-id": "6a1b-uid", "local-hostname": "testvm"}));
        assert_eq!(nc.files()[1].1, nc.user_data);
        assert_eq!(paths(&seed(CloudInitKind::NoCloud, Some(b"version: 2\n"))), ["meta-data", "user-data", "network-config"]);
        let cd = seed(CloudInitKind::ConfigDrive, Some(b"{}"));
        assert_eq!(paths(&cd), ["openstack/latest/meta_data.json", "openstack/latest/user_data", "openstack/latest/network_data.json"]);
        let meta: serde_json::Value = serde_json::from_slice(&cd.files()[0].1).unwrap();
        assert_eq!(meta, json!({"instance_id": "testvm.default", "uuid": "6a1b-uid", "hostname": "testvm"}));
    }

    /// `accessCredentials` keys in the meta-data under KubeVirt's key of each data source,
    /// numbered from "0"; none: no key at all (KubeVirt's `omitempty`).
    #[test]
    fn ssh_public_keys_go_in_the_meta_data_numbered() {
        let keys = vec!["ssh-ed25519 AAAA one".to_owned(), "ssh-rsa BBBB two\n".to_owned()];
        let mut nc = seed(CloudInitKind::NoCloud, None);
        nc.ssh_public_keys.clone_from(&keys);
        let meta: serde_json::Value = serde_json::from_slice(&nc.files()[0].1).unwrap();
        assert_eq!(meta["public-keys"], json!({"0": "ssh-ed25519 AAAA one", "1": "ssh-rsa BBBB two\n"}));
        let mut cd = seed(CloudInitKind::ConfigDrive, None);
        cd.ssh_public_keys = keys;
        let meta: serde_json::Value = serde_json::from_slice(&cd.files()[0].1).unwrap();
        assert_eq!(meta["public_keys"]["0"], "ssh-ed25519 AAAA one");
        assert!(meta.get("public-keys").is_none());
    }

    #[test]
    fn the_image_is_written_into_the_run_dir_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = write(&seed(CloudInitKind::ConfigDrive, None), dir.path()).unwrap();
        assert_eq!(path, dir.path().join(IMAGE));
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len() % 2048, 0);
        // Too much data (a spec from an API server without admission) is refused, not written.
        let mut big = seed(CloudInitKind::NoCloud, None);
        big.user_data = vec![b'x'; iso9660::MAX_IMAGE_BYTES];
        let e = write(&big, &dir.path().join("other")).unwrap_err().to_string();
        assert!(e.contains("cannot build its image"), "{e}");
    }
}
