//! CustomResourceDefinitions as data: an `apiextensions.k8s.io/v1` CustomResourceDefinition
//! stored here registers its resources live, as kube-apiserver's apiextensions server does.
//!
//! # Flow
//! - A CRD is validated on write ([`validate`]) and stored like any object, with the
//!   `customresourcecleanup.apiextensions.k8s.io` finalizer.
//! - The establishing task ([`run`]) follows the store: each stored CRD's served versions
//!   become [`ResourceDef`]s ([`defs`]) in the registry (discovery, OpenAPI, the verbs), and its
//!   status gets `NamesAccepted` and `Established`, `acceptedNames` and `storedVersions`.
//! - A CRD being deleted stops being served at once, its objects are deleted, and then its
//!   finalizer is removed, so the CRD goes last (kube's `Terminating`, then gone).
//! - virtplug's own CRDs (KubeVirt's VirtualMachine and VirtualMachineInstance, CDI's
//!   DataVolume, from [`api::crd::all`], the manifests `virtplug crds` prints) are registered
//!   the same way on first use and stored at first start; their admission rules ([`BUILTIN`])
//!   stay attached to those resources by CRD name. They cannot be deleted (403): deleting one
//!   would delete every VM.
//!
//! Objects of a CRD are pruned, defaulted and validated against the served version's
//! structural schema ([`schema`]); printer columns come from `additionalPrinterColumns`
//! ([`columns`]).
//!
//! # Guarantees
//! - Registration never leaks without bound: the defs of a CRD spec are built once and reused
//!   for the same spec; at most [`MAX_REGISTRATIONS`] distinct specs are built per process,
//!   after which a changed CRD is not established (condition `Established: False`, reason
//!   `TooManyRegistrations`) until the server restarts.
//! - A CRD's names cannot collide with a built-in resource or another CRD (NamesAccepted False).

pub mod columns;
pub mod scale;
pub mod schema;

use std::collections::HashMap;
use std::sync::{Mutex, Once, PoisonError};

use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

use crate::objects::{DeleteOptions, Objects, Part};
use crate::registry::{self, ResourceDef, Validator};
use crate::store::EventType;

/// The finalizer that keeps a CRD until its objects are gone.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// How many distinct CRD specs one process builds resource definitions for.
pub const MAX_REGISTRATIONS: usize = 4096;

/// Admission of virtplug's own custom resources, by CRD name.
pub const BUILTIN: [(&str, Validator); 3] = [
    ("virtualmachines.kubevirt.io", api::validation::validate_vm),
    ("virtualmachineinstances.kubevirt.io", api::validation::validate_vmi),
    ("datavolumes.cdi.kubevirt.io", api::validation::validate_data_volume),
];

/// What a resource served from a CRD carries beyond a [`ResourceDef`].
#[derive(Debug)]
pub struct Served {
    /// The CRD's name (`<plural>.<group>`).
    pub name: String,
    /// The version's `openAPIV3Schema` (an object schema when the CRD has none).
    pub schema: Value,
    /// The same schema compiled for the writes' pruning, defaulting and validation.
    pub structural: schema::Structural,
    pub columns: Vec<columns::Column>,
    /// `.spec.replicas`-style paths of the scale subresource.
    pub scale: Option<Scale>,
}

/// A CRD's scale subresource.
#[derive(Debug, Clone)]
pub struct Scale {
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

/// Whether `name` is one of virtplug's own CRDs.
#[must_use]
pub fn is_builtin(name: &str) -> bool {
    BUILTIN.iter().any(|(n, _)| *n == name)
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

fn leak_list(v: Option<&Value>) -> &'static [&'static str] {
    let list: Vec<&'static str> = v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(leak).collect();
    Box::leak(list.into_boxed_slice())
}

/// The specs registered so far and their defs (see the module guarantees).
static BUILT: Mutex<Option<HashMap<String, Vec<&'static ResourceDef>>>> = Mutex::new(None);

/// The resource definitions of a CRD's served versions, built once per distinct spec.
///
/// # Errors
/// A message when the CRD is malformed or the registration budget is spent.
pub fn defs(crd: &Value) -> Result<Vec<&'static ResourceDef>, String> {
    let spec = crd.get("spec").ok_or("the CRD has no spec")?;
    let key = spec.to_string();
    let mut built = BUILT.lock().unwrap_or_else(PoisonError::into_inner);
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(d) = built.get(&key) {
        return Ok(d.clone());
    }
    if built.len() >= MAX_REGISTRATIONS {
        return Err(format!("{MAX_REGISTRATIONS} CRD specs were registered since the server started; restart it to register more"));
    }
    let causes = validate(crd);
    if let Some(c) = causes.first() {
        return Err(format!("{}: {}", c.field, c.message));
    }
    let s = |p: &str| spec.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let (group, plural) = (s("/group"), s("/names/plural"));
    let name = format!("{plural}.{group}");
    let admission = BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let mut out = Vec::new();
    for version in spec.get("versions").and_then(Value::as_array).into_iter().flatten() {
        if version.get("served") != Some(&Value::Bool(true)) {
            continue;
        }
        let v = |p: &str| version.pointer(p);
        let scale = v("/subresources/scale").map(|sc| Scale {
            spec_replicas_path: sc.get("specReplicasPath").and_then(Value::as_str).unwrap_or(".spec.replicas").to_owned(),
            status_replicas_path: sc.get("statusReplicasPath").and_then(Value::as_str).unwrap_or(".status.replicas").to_owned(),
            label_selector_path: sc.get("labelSelectorPath").and_then(Value::as_str).map(str::to_owned),
        });
        let openapi = v("/schema/openAPIV3Schema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        let served = Served {
            name: name.clone(),
            structural: schema::Structural::compile(&openapi),
            schema: openapi,
            columns: columns::from_crd(v("/additionalPrinterColumns")),
            scale,
        };
        let kind = s("/names/kind");
        let singular = match s("/names/singular") {
            "" => kind.to_lowercase(),
            x => x.to_owned(),
        };
        // `selectableFields: [{jsonPath: .spec.color}]` select as `spec.color`.
        let selectable: Vec<Value> = v("/selectableFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|x| x.get("jsonPath").and_then(Value::as_str))
            .map(|p| json!(p.trim_start_matches('.')))
            .collect();
        let def = ResourceDef {
            group: leak(group),
            version: leak(v("/name").and_then(Value::as_str).unwrap_or_default()),
            plural: leak(plural),
            singular: leak(&singular),
            kind: leak(kind),
            namespaced: s("/scope") != "Cluster",
            short_names: leak_list(spec.pointer("/names/shortNames")),
            categories: leak_list(spec.pointer("/names/categories")),
            status: v("/subresources/status").is_some(),
            custom: true,
            validate: admission,
            strategy: None,
            names: registry::NameRule::Subdomain,
            field_labels: leak_list(Some(&Value::Array(selectable))),
            review: None,
            crd: Some(Box::leak(Box::new(served))),
            actions: &[],
        };
        out.push(&*Box::leak(Box::new(def)));
    }
    built.insert(key, out.clone());
    Ok(out)
}

/// Registers virtplug's own CRDs (once per process).
pub fn register_builtin() {
    static DONE: Once = Once::new();
    DONE.call_once(|| {
        for crd in api::crd::all() {
            let value = serde_json::to_value(&crd).unwrap_or(Value::Null);
            let name = crd.metadata.name.clone().unwrap_or_default();
            match defs(&value) {
                Ok(d) => registry::register(&name, d),
                Err(e) => tracing::error!(crd = name, "virtplug's own CRD does not register: {e}"),
            }
        }
    });
}

/// The manifests of virtplug's own CRDs, as stored at first start.
#[must_use]
pub fn builtin_manifests() -> Vec<Value> {
    api::crd::all().iter().filter_map(|c| serde_json::to_value(c).ok()).collect()
}

/// Validates a CustomResourceDefinition (`ValidateCustomResourceDefinition`, the parts that
/// decide what is served).
#[must_use]
pub fn validate(crd: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let s = |p: &str| crd.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let (group, plural) = (s("/spec/group"), s("/spec/names/plural"));
    if group.is_empty() || !group.contains('.') {
        causes.push(Cause::new(CauseType::Invalid, "spec.group", "should be a domain with at least one dot (e.g. example.com)"));
    } else {
        causes.extend(api::validation::dns1123_subdomain(group, "spec.group"));
    }
    for field in ["plural", "kind"] {
        if s(&format!("/spec/names/{field}")).is_empty() {
            causes.push(Cause::new(CauseType::Required, format!("spec.names.{field}"), "required"));
        }
    }
    if !plural.is_empty() {
        causes.extend(api::validation::dns1123_label(plural, "spec.names.plural"));
        let name = s("/metadata/name");
        if name != format!("{plural}.{group}") {
            causes.push(Cause::new(
                CauseType::Invalid,
                "metadata.name",
                format!("must be spec.names.plural+\".\"+spec.group ({plural}.{group})"),
            ));
        }
    }
    if !matches!(s("/spec/scope"), "Namespaced" | "Cluster") {
        causes.push(Cause::new(CauseType::NotSupported, "spec.scope", "supported values: \"Cluster\", \"Namespaced\""));
    }
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array).cloned().unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::new(CauseType::Required, "spec.versions", "must have at least one version"));
    }
    let storage = versions.iter().filter(|v| v.get("storage") == Some(&Value::Bool(true))).count();
    if !versions.is_empty() && storage != 1 {
        causes.push(Cause::new(CauseType::Invalid, "spec.versions", "must have exactly one version marked as storage version"));
    }
    for (i, v) in versions.iter().enumerate() {
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        causes.extend(api::validation::dns1123_label(name, &format!("spec.versions[{i}].name")));
        if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
            causes.extend(schema::structural_causes(schema, &format!("spec.versions[{i}].schema.openAPIV3Schema")));
        }
        for (j, c) in v.get("additionalPrinterColumns").and_then(Value::as_array).into_iter().flatten().enumerate() {
            if c.get("jsonPath").and_then(Value::as_str).is_none_or(|p| columns::parse(p).is_none()) {
                causes.push(Cause::new(
                    CauseType::Invalid,
                    format!("spec.versions[{i}].additionalPrinterColumns[{j}].jsonPath"),
                    "must be a JSONPath such as .spec.size or .status.conditions[?(@.type==\"Ready\")].status",
                ));
            }
        }
    }
    causes
}

/// Keeps a CRD until its objects are gone: the cleanup finalizer on every CRD not being deleted.
#[must_use]
pub fn normalize(crd: &mut Value) -> Vec<Cause> {
    if crd.pointer("/metadata/deletionTimestamp").is_some() {
        return Vec::new();
    }
    let fins = crd.pointer("/metadata/finalizers").and_then(Value::as_array).cloned().unwrap_or_default();
    if !fins.iter().any(|f| f == CLEANUP_FINALIZER) {
        let mut fins = fins;
        fins.push(json!(CLEANUP_FINALIZER));
        if let Some(m) = crd.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("finalizers".into(), Value::Array(fins));
        }
    }
    Vec::new()
}

/// The CRD strategy.
pub static STRATEGY: registry::Strategy = registry::Strategy {
    normalize,
    validate_update: crate::kinds::no_update_rules,
    schema: crate::kinds::object_schema,
    from_protobuf: None,
};

fn crd_def() -> Option<&'static ResourceDef> {
    registry::find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
}

/// Stores virtplug's own CRDs when they are missing (first start).
pub async fn ensure_builtin(objects: &Objects) {
    let Some(def) = crd_def() else { return };
    for crd in builtin_manifests() {
        let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        if objects.store.get(&def.key(None, &name)).is_none() {
            if let Err(e) = objects.create(def, None, crd, false).await {
                tracing::error!(crd = name, "storing virtplug's own CRD failed: {}", e.message);
            }
        }
    }
}

/// Names a CRD claims that something else serves already (another CRD or a built-in).
fn name_conflict(crd: &Value, own: &[&'static ResourceDef]) -> Option<String> {
    let s = |p: &str| crd.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let (group, plural, kind) = (s("/spec/group"), s("/spec/names/plural"), s("/spec/names/kind"));
    let name = format!("{plural}.{group}");
    registry::all()
        .into_iter()
        .filter(|d| !own.iter().any(|o| std::ptr::eq(*o, *d)) && d.crd.is_none_or(|c| c.name != name))
        .find(|d| d.group == group && (d.plural == plural || d.kind == kind))
        .map(|d| format!("{} is already served as {}/{}", if d.plural == plural { plural } else { kind }, d.api_version(), d.kind))
}

/// Brings the registry and the CRD's status in line with the stored CRD `name`.
async fn reconcile(objects: &Objects, name: &str) {
    let Some(def) = crd_def() else { return };
    let Some(stored) = objects.store.get(&def.key(None, name)) else {
        if !is_builtin(name) {
            registry::unregister(name);
        }
        return;
    };
    let crd = stored.object.value();
    if crd.pointer("/metadata/deletionTimestamp").is_some() {
        terminate(objects, def, name, &crd).await;
        return;
    }
    let (established, reason, message) = match defs(&crd) {
        Ok(d) => match name_conflict(&crd, &d) {
            Some(conflict) => (false, "NameConflict", conflict),
            None => {
                registry::register(name, d);
                (true, "InitialNamesAccepted", "the initial names have been accepted".to_owned())
            }
        },
        Err(e) => (false, "TooManyRegistrations", e),
    };
    let status = status_of(&crd, established, reason, &message, crd.get("status"));
    if crd.get("status") == Some(&status) {
        return;
    }
    let write = objects.update_with(def, None, name, Part::Status, false, |cur| {
        let mut next = cur.clone();
        next["status"] = status.clone();
        Ok(next)
    });
    if let Err(e) = write.await {
        tracing::warn!(crd = name, "writing the CRD's status failed: {}", e.message);
    }
}

fn status_of(crd: &Value, ok: bool, reason: &str, message: &str, old: Option<&Value>) -> Value {
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let flag = if ok { "True" } else { "False" };
    let since = |ty: &str| {
        old.and_then(|o| o.get("conditions"))
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty && c["status"] == flag))
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(now))
    };
    let storage: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v["storage"] == true)
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let mut stored_versions: Vec<Value> = old.and_then(|o| o.get("storedVersions")).and_then(Value::as_array).cloned().unwrap_or_default();
    for v in storage {
        if !stored_versions.contains(&v) {
            stored_versions.push(v);
        }
    }
    json!({
        "conditions": [
            {"type": "NamesAccepted", "status": flag, "reason": if ok { "NoConflicts" } else { reason },
             "message": if ok { "no conflicts found" } else { message }, "lastTransitionTime": since("NamesAccepted")},
            {"type": "Established", "status": flag, "reason": if ok { reason } else { "NotAccepted" },
             "message": message, "lastTransitionTime": since("Established")},
        ],
        "acceptedNames": if ok { crd.pointer("/spec/names").cloned().unwrap_or(Value::Null) } else { json!({"plural": "", "kind": ""}) },
        "storedVersions": stored_versions,
    })
}

/// A CRD being deleted: stop serving it, delete its objects, then let it go.
async fn terminate(objects: &Objects, def: &ResourceDef, name: &str, crd: &Value) {
    let served = defs(crd).unwrap_or_default();
    registry::unregister(name);
    let mut left = 0usize;
    if let Some(storage) = served.first() {
        for (_, obj) in objects.store.list(&storage.prefix(None), None).1 {
            let meta = obj.object.metadata_view();
            let n = meta.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
            let ns = meta.pointer("/metadata/namespace").and_then(Value::as_str).map(str::to_owned);
            match objects.delete(storage, ns.as_deref(), &n, &DeleteOptions::default()).await.map(|d| d.metadata_view()) {
                Ok(v) if v.pointer("/metadata/deletionTimestamp").is_some() && v.pointer("/metadata/finalizers").is_some() => left += 1,
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => {
                    left += 1;
                    tracing::warn!(crd = name, object = n, "deleting an object of a deleted CRD failed: {}", e.message);
                }
            }
        }
    }
    if left > 0 {
        // Their finalizers hold them; their deletion wakes this again (see `run`).
        return;
    }
    let write = objects.update_with(def, None, name, Part::Main, false, |cur| {
        let mut next = cur.clone();
        if let Some(Value::Array(f)) = next.pointer_mut("/metadata/finalizers") {
            f.retain(|x| x != CLEANUP_FINALIZER);
        }
        Ok(next)
    });
    match write.await {
        Ok(_) => {}
        Err(e) if e.code == 404 => {}
        Err(e) => tracing::warn!(crd = name, "releasing the CRD failed: {}", e.message),
    }
}

/// Registers every stored CRD and writes its status (the server does this before it serves,
/// so a client never sees a stored CRD that is not served yet).
pub async fn reconcile_all(objects: &Objects) {
    let Some(def) = crd_def() else { return };
    let prefix = def.prefix(None);
    for (key, _) in objects.store.list(&prefix, None).1 {
        reconcile(objects, key.trim_start_matches(&prefix)).await;
    }
}

/// The establishing task: registers every stored CRD, then follows the store. A CRD event
/// reconciles that CRD; a deletion of an object of a terminating CRD reconciles the CRD again.
pub async fn run(objects: Objects) {
    let Some(def) = crd_def() else { return };
    let prefix = def.prefix(None);
    // A CRD's own changes, and deletions (an object of a terminating CRD may have been its
    // last); no other write wakes this task.
    let mut rx = {
        let prefix = prefix.clone();
        objects.store.subscribe(move |e| e.kind == EventType::Deleted || e.key.starts_with(&prefix))
    };
    reconcile_all(&objects).await;
    loop {
        let ev = match rx.recv().await {
            Ok(ev) => ev,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                reconcile_all(&objects).await;
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        if let Some(name) = ev.key.strip_prefix(&prefix) {
            reconcile(&objects, name).await;
        } else if ev.kind == EventType::Deleted {
            // An object of a terminating CRD went: that CRD may be released now.
            for (key, crd) in objects.store.list(&prefix, None).1 {
                // The byte check first: most CRDs are not terminating, and they are large.
                if crd.object.mentions("\"deletionTimestamp\"")
                    && crd.object.metadata_view().pointer("/metadata/deletionTimestamp").is_some()
                {
                    reconcile(&objects, key.trim_start_matches(&prefix)).await;
                }
            }
        }
    }
}
