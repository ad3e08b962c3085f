//! The resources this server serves, and their discovery documents.

use serde_json::{json, Value};

/// Validates a whole object; returns every violation.
pub type Validator = fn(&Value) -> Vec<api::validation::Cause>;

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
    pub from_protobuf: Option<&'static crate::protobuf::message::Message>,
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
    /// What `metadata.name` must be.
    pub names: NameRule,
    /// The fields a field selector may name besides `metadata.name` and `metadata.namespace`
    /// (kube-apiserver's per-kind field label conversion); others are 400.
    pub field_labels: &'static [&'static str],
    /// A review (`SelfSubjectAccessReview`, ...): only `create`, which answers and stores nothing.
    pub review: Option<&'static crate::kinds::review::Review>,
    /// Served from a CustomResourceDefinition: its schema, printer columns and scale
    /// subresource ([`crate::crd`]).
    pub crd: Option<&'static crate::crd::Served>,
    /// Subresources with handlers of their own (routes.rs) besides `/status` and `/scale`, as
    /// discovery lists them.
    pub actions: &'static [Action],
}

/// A subresource served by a handler of its own, for discovery (`pods/binding`).
#[derive(Clone, Copy, Debug)]
pub struct Action {
    /// `binding` of `pods/binding`.
    pub name: &'static str,
    /// The body's kind, with its group and version where they are not the resource's.
    pub kind: &'static str,
    pub group_version: Option<(&'static str, &'static str)>,
    pub verbs: &'static [&'static str],
}

/// The rule an object's name follows (kube-apiserver's `ValidateObjectMeta` name function).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// DNS-1123 subdomain: most kinds.
    Subdomain,
    /// DNS-1123 label: Namespace.
    Label,
    /// DNS-1035 label (starts with a letter): Service.
    Label1035,
    /// A path segment (not `.` or `..`, no `/` or `%`): RBAC's roles and bindings, whose names
    /// have colons (`system:auth-delegator`, `kubevirt.io:edit`).
    PathSegment,
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
        if self.review.is_some() {
            return json!(["create"]);
        }
        json!(["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"])
    }

    /// The description of the kind's protobuf message, when bodies of it may be sent so.
    #[must_use]
    pub fn protobuf(&self) -> Option<&'static crate::protobuf::message::Message> {
        self.strategy.and_then(|s| s.from_protobuf).or(self.review.map(|r| r.protobuf))
    }

    /// Checks `metadata.name` against [`Self::names`].
    #[must_use]
    pub fn name_causes(&self, name: &str) -> Vec<api::validation::Cause> {
        match self.names {
            NameRule::Subdomain => api::validation::dns1123_subdomain(name, "metadata.name"),
            NameRule::Label => api::validation::dns1123_label(name, "metadata.name"),
            NameRule::PathSegment => {
                let bad = name.is_empty() || name == "." || name == ".." || name.contains(['/', '%']) || name.len() > 253;
                if bad {
                    vec![api::validation::Cause::new(
                        api::validation::CauseType::Invalid,
                        "metadata.name",
                        format!("{name:?} may not be empty, '.' or '..', contain '/' or '%', or be longer than 253 characters"),
                    )]
                } else {
                    Vec::new()
                }
            }
            NameRule::Label1035 => {
                let mut causes = api::validation::dns1123_label(name, "metadata.name");
                if causes.is_empty() && !name.starts_with(|c: char| c.is_ascii_lowercase()) {
                    causes.push(api::validation::Cause::new(
                        api::validation::CauseType::Invalid,
                        "metadata.name",
                        format!("{name:?} is not a valid DNS-1035 label: it must start with a lower case letter (e.g. 'my-service')"),
                    ));
                }
                causes
            }
        }
    }
}

/// A core/v1 namespaced resource with the generic verbs only; the rows below override fields.
const CORE: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    plural: "",
    singular: "",
    kind: "",
    namespaced: true,
    short_names: &[],
    categories: &[],
    status: false,
    custom: false,
    validate: None,
    strategy: None,
    names: NameRule::Subdomain,
    field_labels: &[],
    review: None,
    crd: None,
    actions: &[],
};

/// The built-in resources. Custom resources (KubeVirt's and CDI's among them) are served from
/// their CustomResourceDefinitions ([`crate::crd`]); [`all`] lists both.
pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        plural: "persistentvolumeclaims",
        singular: "persistentvolumeclaim",
        kind: "PersistentVolumeClaim",
        short_names: &["pvc"],
        status: true,
        ..CORE
    },
    ResourceDef {
        plural: "events",
        singular: "event",
        kind: "Event",
        short_names: &["ev"],
        field_labels: crate::kinds::event::FIELD_LABELS,
        ..CORE
    },
    ResourceDef {
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        status: true,
        field_labels: &["spec.unschedulable"],
        ..CORE
    },
    ResourceDef {
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        status: true,
        names: NameRule::Label,
        field_labels: &["status.phase"],
        strategy: Some(&crate::kinds::namespace::STRATEGY),
        ..CORE
    },
    ResourceDef {
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        validate: Some(crate::kinds::secret::validate),
        strategy: Some(&crate::kinds::secret::STRATEGY),
        field_labels: &["type"],
        ..CORE
    },
    ResourceDef {
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        short_names: &["cm"],
        validate: Some(crate::kinds::configmap::validate),
        strategy: Some(&crate::kinds::configmap::STRATEGY),
        ..CORE
    },
    ResourceDef {
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        short_names: &["sa"],
        validate: Some(crate::kinds::serviceaccount::validate),
        strategy: Some(&crate::kinds::serviceaccount::STRATEGY),
        actions: &[Action {
            name: "token",
            kind: "TokenRequest",
            group_version: Some(("authentication.k8s.io", "v1")),
            verbs: &["create"],
        }],
        ..CORE
    },
    ResourceDef {
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        short_names: &["po"],
        categories: &["all"],
        status: true,
        validate: Some(crate::kinds::pod::validate),
        strategy: Some(&crate::kinds::pod::STRATEGY),
        field_labels: crate::kinds::pod::FIELD_LABELS,
        actions: &[Action { name: "binding", kind: "Binding", group_version: None, verbs: &["create"] }],
        ..CORE
    },
    ResourceDef {
        plural: "services",
        singular: "service",
        kind: "Service",
        short_names: &["svc"],
        categories: &["all"],
        status: true,
        names: NameRule::Label1035,
        validate: Some(crate::kinds::service::validate),
        strategy: Some(&crate::kinds::service::STRATEGY),
        ..CORE
    },
    ResourceDef {
        plural: "persistentvolumes",
        singular: "persistentvolume",
        kind: "PersistentVolume",
        namespaced: false,
        short_names: &["pv"],
        status: true,
        validate: Some(crate::kinds::persistentvolume::validate),
        strategy: Some(&crate::kinds::persistentvolume::STRATEGY),
        ..CORE
    },
    ResourceDef {
        group: "storage.k8s.io",
        plural: "storageclasses",
        singular: "storageclass",
        kind: "StorageClass",
        namespaced: false,
        short_names: &["sc"],
        validate: Some(crate::kinds::storageclass::validate),
        strategy: Some(&crate::kinds::storageclass::STRATEGY),
        ..CORE
    },
    ResourceDef {
        group: "coordination.k8s.io",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        validate: Some(crate::kinds::lease::validate),
        ..CORE
    },
    ResourceDef {
        group: "events.k8s.io",
        plural: "events",
        singular: "event",
        kind: "Event",
        short_names: &["ev"],
        validate: Some(crate::kinds::event::validate_v1),
        field_labels: crate::kinds::event::V1_FIELD_LABELS,
        ..CORE
    },
    ResourceDef {
        group: "apiextensions.k8s.io",
        plural: "customresourcedefinitions",
        singular: "customresourcedefinition",
        kind: "CustomResourceDefinition",
        namespaced: false,
        short_names: &["crd", "crds"],
        categories: &["api-extensions"],
        status: true,
        validate: Some(crate::crd::validate),
        strategy: Some(&crate::crd::STRATEGY),
        ..CORE
    },
    ResourceDef {
        group: "authorization.k8s.io",
        plural: "selfsubjectaccessreviews",
        singular: "selfsubjectaccessreview",
        kind: "SelfSubjectAccessReview",
        namespaced: false,
        review: Some(&crate::kinds::review::ACCESS),
        ..CORE
    },
    ResourceDef {
        group: "authorization.k8s.io",
        plural: "selfsubjectrulesreviews",
        singular: "selfsubjectrulesreview",
        kind: "SelfSubjectRulesReview",
        namespaced: false,
        review: Some(&crate::kinds::review::RULES),
        ..CORE
    },
    ResourceDef {
        group: "authorization.k8s.io",
        plural: "subjectaccessreviews",
        singular: "subjectaccessreview",
        kind: "SubjectAccessReview",
        namespaced: false,
        review: Some(&crate::kinds::review::SUBJECT_ACCESS),
        ..CORE
    },
    ResourceDef {
        group: "authentication.k8s.io",
        plural: "tokenreviews",
        singular: "tokenreview",
        kind: "TokenReview",
        namespaced: false,
        review: Some(&crate::kinds::review::TOKEN),
        ..CORE
    },
    // RBAC: stored as they are; `SubjectAccessReview`s are decided by them (kinds::rbac).
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        plural: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        namespaced: false,
        names: NameRule::PathSegment,
        ..CORE
    },
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        namespaced: false,
        names: NameRule::PathSegment,
        ..CORE
    },
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        plural: "roles",
        singular: "role",
        kind: "Role",
        names: NameRule::PathSegment,
        ..CORE
    },
    ResourceDef {
        group: "rbac.authorization.k8s.io",
        plural: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        names: NameRule::PathSegment,
        ..CORE
    },
    ResourceDef {
        group: "authentication.k8s.io",
        plural: "selfsubjectreviews",
        singular: "selfsubjectreview",
        kind: "SelfSubjectReview",
        namespaced: false,
        review: Some(&crate::kinds::review::SUBJECT),
        ..CORE
    },
    // kubectl 1.27's `auth whoami` asks v1alpha1 and v1beta1 only.
    ResourceDef {
        group: "authentication.k8s.io",
        version: "v1beta1",
        plural: "selfsubjectreviews",
        singular: "selfsubjectreview",
        kind: "SelfSubjectReview",
        namespaced: false,
        review: Some(&crate::kinds::review::SUBJECT),
        ..CORE
    },
    ResourceDef {
        group: "authentication.k8s.io",
        version: "v1alpha1",
        plural: "selfsubjectreviews",
        singular: "selfsubjectreview",
        kind: "SelfSubjectReview",
        namespaced: false,
        review: Some(&crate::kinds::review::SUBJECT),
        ..CORE
    },
];

/// The resources served from CustomResourceDefinitions, by CRD name.
static CUSTOM: std::sync::RwLock<Vec<(String, Vec<&'static ResourceDef>)>> = std::sync::RwLock::new(Vec::new());

/// Every resource served now: the built-in ones, then those of the CRDs (virtplug's own are
/// registered on first use, so they are there before any store is opened).
#[must_use]
pub fn all() -> Vec<&'static ResourceDef> {
    crate::crd::register_builtin();
    let mut out: Vec<&'static ResourceDef> = RESOURCES.iter().collect();
    // A poisoned lock only means a panic elsewhere while it was held; the list is still whole.
    let custom = CUSTOM.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    out.extend(custom.iter().flat_map(|(_, defs)| defs.iter().copied()));
    out
}

/// Counts the changes of [`CUSTOM`]: documents built from the registry (OpenAPI) are rebuilt
/// when it moves.
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The registry's generation: it changes whenever a CRD's resources are registered anew or
/// removed.
#[must_use]
pub fn generation() -> u64 {
    GENERATION.load(std::sync::atomic::Ordering::Acquire)
}

/// Serves `defs` (the served versions of CRD `name`) instead of what the CRD served before.
pub fn register(name: &str, defs: Vec<&'static ResourceDef>) {
    let mut custom = CUSTOM.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    let changed = match custom.iter_mut().find(|(n, _)| n == name) {
        Some((_, d)) if d.len() == defs.len() && d.iter().zip(&defs).all(|(a, b)| std::ptr::eq(*a, *b)) => false,
        Some((_, d)) => {
            *d = defs;
            true
        }
        None => {
            custom.push((name.to_owned(), defs));
            true
        }
    };
    if changed {
        GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Stops serving the resources of CRD `name`.
pub fn unregister(name: &str) {
    let mut custom = CUSTOM.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = custom.len();
    custom.retain(|(n, _)| n != name);
    if custom.len() != before {
        GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Finds a resource by group, version and plural.
#[must_use]
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    all().into_iter().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds a resource by kind (the first served version of a custom resource).
#[must_use]
pub fn by_kind(group: &str, kind: &str) -> Option<&'static ResourceDef> {
    all().into_iter().find(|r| r.group == group && r.kind == kind)
}

/// `/api`
#[must_use]
pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})
}

/// The groups with their versions, the first served version of each preferred.
fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in all().into_iter().filter(|r| !r.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, versions)) if !versions.contains(&r.version) => versions.push(r.version),
            Some(_) => {}
            None => out.push((r.group, vec![r.version])),
        }
    }
    out.push(("subresources.kubevirt.io", vec!["v1"]));
    out
}

fn group_doc(group: &str, versions: &[&str]) -> Value {
    let gv = |v: &str| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    let preferred = versions.first().map_or(Value::Null, |v| gv(v));
    json!({"name": group, "versions": versions.iter().map(|v| gv(v)).collect::<Vec<_>>(), "preferredVersion": preferred})
}

/// `/apis`
#[must_use]
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = groups().iter().map(|(g, v)| group_doc(g, v)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`
#[must_use]
pub fn api_group(group: &str) -> Option<Value> {
    groups().into_iter().find(|(g, _)| *g == group).map(|(g, v)| {
        let mut doc = group_doc(g, &v);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        doc
    })
}

/// `/api/v1` or `/apis/<group>/<version>`
#[must_use]
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in all().into_iter().filter(|r| r.group == group && r.version == version) {
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
        for a in r.actions {
            let mut sub = json!({"name": format!("{}/{}", r.plural, a.name), "singularName": "", "namespaced": r.namespaced,
                                 "kind": a.kind, "verbs": a.verbs});
            if let Some((group, version)) = a.group_version {
                (sub["group"], sub["version"]) = (json!(group), json!(version));
            }
            resources.push(sub);
        }
        if r.crd.is_some_and(|c| c.scale.is_some()) {
            resources.push(json!({"name": format!("{}/scale", r.plural), "singularName": "", "namespaced": r.namespaced,
                                   "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_discovery_lists_the_binding_and_token_subresources_as_kube_apiserver_does() {
        let list = resource_list("", "v1").unwrap();
        let find = |name: &str| list["resources"].as_array().unwrap().iter().find(|r| r["name"] == name).cloned();
        let binding = find("pods/binding").expect("pods/binding is listed");
        assert_eq!((binding["kind"].as_str(), &binding["verbs"]), (Some("Binding"), &json!(["create"])));
        let token = find("serviceaccounts/token").expect("serviceaccounts/token is listed");
        assert_eq!(
            (token["group"].as_str(), token["version"].as_str(), token["kind"].as_str(), &token["verbs"]),
            (Some("authentication.k8s.io"), Some("v1"), Some("TokenRequest"), &json!(["create"]))
        );
        assert!(find("pods/status").is_some() && find("configmaps/binding").is_none());
    }
}
