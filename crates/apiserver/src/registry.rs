//! The resources this server serves, and their discovery documents.

use serde_json::{json, Value};

/// Validates a whole object; returns every violation.
pub type Validator = fn(&Value) -> Vec<api::validation::Cause>;

/// Decodes a kind's protobuf message into its JSON form.
pub type ProtobufDecoder = fn(&[u8]) -> Result<Value, crate::protobuf::wire::WireError>;

/// What a kind's writes do beyond the generic verbs (kube-apiserver's REST strategy); the
/// kinds with one live in [`crate::kinds`].
#[derive(Debug)]
pub struct Strategy {
    /// Brings a body into its stored form before it is validated: defaults, and write-only
    /// fields folded into stored ones (Secret: `type`, `stringData`). Runs on create and on every
    /// update, after a patch is applied; returns what is malformed (422, nothing stored).
    pub normalize: fn(&mut Value) -> Vec<api::validation::Cause>,
    /// What an update may not change, given the stored object and the new one (Secret: `type`,
    /// an immutable Secret's `data`).
    pub validate_update: fn(old: &Value, new: &Value) -> Vec<api::validation::Cause>,
    /// The kind's OpenAPI v3 schema.
    pub schema: fn() -> Value,
    /// Decodes the kind's protobuf message (the `raw` of a `runtime.Unknown`) into its JSON
    /// form; `None`: protobuf bodies of this kind are 415 (see [`crate::protobuf`]).
    pub from_protobuf: Option<ProtobufDecoder>,
}

/// One served resource.
#[derive(Clone, Debug)]
pub struct ResourceDef {
    /// API group; `""` for core.
    pub group: &'static str,
    pub version: &'static str,
    /// Plural, lower case (`virtualmachines`).
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Has a `/status` subresource (status ignored on main writes and vice versa).
    pub status: bool,
    /// A custom resource: strategic merge patch is refused (415), and `PUT` needs a resourceVersion.
    pub custom: bool,
    pub validate: Option<Validator>,
    /// Kind-specific write rules; `None`: the generic verbs only.
    pub strategy: Option<&'static Strategy>,
}

impl ResourceDef {
    /// `kubevirt.io/v1`, or `v1` for core.
    #[must_use]
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `virtualmachines.kubevirt.io` (or `persistentvolumeclaims`), as Kubernetes names it in messages.
    #[must_use]
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The store key prefix of this resource within `ns` (all namespaces when `None`).
    #[must_use]
    pub fn prefix(&self, ns: Option<&str>) -> String {
        match ns {
            Some(ns) if self.namespaced => format!("/{}/{}/{}/", self.group, self.plural, ns),
            _ => format!("/{}/{}/", self.group, self.plural),
        }
    }

    /// The store key of one object.
    #[must_use]
    pub fn key(&self, ns: Option<&str>, name: &str) -> String {
        format!("{}{name}", self.prefix(if self.namespaced { ns } else { None }))
    }

    fn verbs(&self) -> Value {
        json!(["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"])
    }
}

/// Every resource served.
pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        group: "kubevirt.io",
        version: "v1",
        plural: "virtualmachines",
        singular: "virtualmachine",
        kind: "VirtualMachine",
        namespaced: true,
        short_names: &["vm", "vms"],
        categories: &["all"],
        status: true,
        custom: true,
        validate: Some(api::validation::validate_vm),
        strategy: None,
    },
    ResourceDef {
        group: "kubevirt.io",
        version: "v1",
        plural: "virtualmachineinstances",
        singular: "virtualmachineinstance",
        kind: "VirtualMachineInstance",
        namespaced: true,
        short_names: &["vmi", "vmis"],
        categories: &["all"],
        status: true,
        custom: true,
        validate: Some(api::validation::validate_vmi),
        strategy: None,
    },
    ResourceDef {
        group: "cdi.kubevirt.io",
        version: "v1beta1",
        plural: "datavolumes",
        singular: "datavolume",
        kind: "DataVolume",
        namespaced: true,
        short_names: &["dv", "dvs"],
        categories: &["all"],
        status: true,
        custom: true,
        validate: Some(api::validation::validate_data_volume),
        strategy: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "persistentvolumeclaims",
        singular: "persistentvolumeclaim",
        kind: "PersistentVolumeClaim",
        namespaced: true,
        short_names: &["pvc"],
        categories: &[],
        status: true,
        custom: false,
        validate: None,
        strategy: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        categories: &[],
        status: false,
        custom: false,
        validate: None,
        strategy: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        categories: &[],
        status: true,
        custom: false,
        validate: None,
        strategy: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        categories: &[],
        status: true,
        custom: false,
        validate: None,
        strategy: None,
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short_names: &[],
        categories: &[],
        status: false,
        custom: false,
        validate: Some(crate::kinds::secret::validate),
        strategy: Some(&crate::kinds::secret::STRATEGY),
    },
];

/// Finds a resource by group, version and plural.
#[must_use]
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds a resource by kind.
#[must_use]
pub fn by_kind(group: &str, kind: &str) -> Option<&'static ResourceDef> {
    RESOURCES.iter().find(|r| r.group == group && r.kind == kind)
}

/// `/api`
#[must_use]
pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})
}

fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

fn group_doc(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `/apis`
#[must_use]
pub fn api_group_list() -> Value {
    let mut groups: Vec<Value> = groups().into_iter().map(|(g, v)| group_doc(g, v)).collect();
    groups.push(group_doc("subresources.kubevirt.io", "v1"));
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`
#[must_use]
pub fn api_group(group: &str) -> Option<Value> {
    let mut all = groups();
    all.push(("subresources.kubevirt.io", "v1"));
    all.into_iter().find(|(g, _)| *g == group).map(|(g, v)| {
        let mut doc = group_doc(g, v);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        doc
    })
}

/// `/api/v1` or `/apis/<group>/<version>`
#[must_use]
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group && r.version == version) {
        let mut main = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            main["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            main["categories"] = json!(r.categories);
        }
        resources.push(main);
        if r.status {
            resources.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                                   "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}
