//! The verbs on stored objects: create, get, list, update, patch, delete, with Kubernetes'
//! semantics for metadata, resourceVersion preconditions, the status subresource and finalizers.
//! HTTP parsing lives in `routes`; this module works on JSON values and returns [`ApiError`]s.

mod apply;
#[cfg(test)]
mod delete_tests;
mod metadata;

use serde_json::{json, Value};

use crate::patch::{Patch, PatchKind};
use crate::registry::{self, ResourceDef};
use crate::status::ApiError;
use crate::store::{Doc, Op, Store, StoreError, Stored};

use metadata::{check_metadata, merge_server_fields, meta, meta_mut};
pub use metadata::{check_type, Part};

/// How many times a write without a client precondition is re-applied to a fresh read when
/// another writer got in between (the apiserver's `GuaranteedUpdate` loop).
const INTERNAL_RETRIES: usize = 16;

/// `propagationPolicy` of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

/// Options of a delete (body `DeleteOptions` and query).
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation: Option<Propagation>,
    pub dry_run: bool,
    /// `gracePeriodSeconds`: only a Pod bound to a node has a grace ([`pod_grace`]).
    pub grace_period: Option<u64>,
}

/// The grace period of deleting `pod` (kube-apiserver's pod strategy, `CheckGracefulDelete`):
/// the one asked for, else the pod's `terminationGracePeriodSeconds` (default 30); none (it goes
/// at once) for a pod no node runs — not yet scheduled, or already `Succeeded`/`Failed`. With a
/// grace the pod stays, marked, until its kubelet has stopped it and deletes it with grace 0.
fn pod_grace(pod: &Value, asked: Option<u64>) -> u64 {
    let bound = pod.pointer("/spec/nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    let finished = matches!(pod.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed"));
    if !bound || finished {
        return 0;
    }
    asked.unwrap_or_else(|| pod.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_u64).unwrap_or(30))
}

/// How a write is made: as a dry run or not, and by which field manager (`fieldManager`, or the
/// User-Agent's; `None` for the server's own writes, which record no `managedFields` entry).
#[derive(Clone, Debug, Default)]
pub struct Write {
    pub dry_run: bool,
    pub manager: Option<String>,
    /// `force=true` of an apply: take the fields of other managers instead of a conflict.
    pub force: bool,
}

impl From<bool> for Write {
    /// A write by the server itself.
    fn from(dry_run: bool) -> Write {
        Write { dry_run, ..Write::default() }
    }
}

/// How a write's `managedFields` are kept.
#[derive(Clone, Copy)]
enum Track<'a> {
    /// Recorded as an Update by this manager (see [`crate::apply::record_update`]).
    Update(Option<&'a str>),
    /// Already computed by [`crate::apply::apply`].
    Applied,
}

/// The object verbs over one store.
#[derive(Clone)]
pub struct Objects {
    pub store: Store,
    /// Whether VM and VMI admission enforces [`api::invariants`]. Off models a cluster whose API
    /// server has virtplug's CRDs but no admission webhook (specs there can break them, and the
    /// controller's self-heal must cope).
    pub enforce_invariants: bool,
}

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).get(field).and_then(Value::as_str)
}

/// Whether an object still has finalizers (metadata, or a namespace's `spec.finalizers`).
fn has_finalizers(obj: &Value) -> bool {
    let non_empty = |v: Option<&Value>| v.and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    non_empty(obj.pointer("/metadata/finalizers")) || non_empty(obj.pointer("/spec/finalizers"))
}

/// A stored value that is not a JSON object (a store written past admission: by hand, by a
/// bug, or by a version without today's checks) cannot be updated, only deleted: 500 saying so.
fn not_an_object(def: &ResourceDef, name: &str, stored: &Value) -> Result<(), ApiError> {
    if stored.is_object() {
        return Ok(());
    }
    let what = match stored {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    Err(ApiError::internal(format!(
        "{} {name:?} is stored as {what}, not an object, so it cannot be updated; delete it and create it again",
        def.kind
    )))
}

/// The kind's [`registry::Strategy::normalize`] on a body about to be validated and stored.
fn normalize(def: &ResourceDef, name: &str, obj: &mut Value) -> Result<(), ApiError> {
    if let Some(crd) = def.crd {
        crate::crd::schema::prune_and_default(&crd.structural, obj);
    }
    let causes = def.strategy.map(|s| (s.normalize)(obj)).unwrap_or_default();
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def.group, def.kind, name, &causes))
    }
}

/// The kind's [`registry::Strategy::validate_update`].
fn validate_update(def: &ResourceDef, name: &str, old: &Value, new: &Value) -> Result<(), ApiError> {
    let causes = def.strategy.map(|s| (s.validate_update)(old, new)).unwrap_or_default();
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def.group, def.kind, name, &causes))
    }
}

fn store_err(def: &ResourceDef, name: &str, e: StoreError) -> ApiError {
    match e {
        StoreError::Exists { .. } => ApiError::already_exists(def.group, def.plural, name),
        StoreError::NotFound { .. } => ApiError::not_found(def.group, def.plural, name),
        StoreError::Conflict { .. } => ApiError::conflict(def.group, def.plural, name),
        StoreError::Compacted { requested, oldest } => ApiError::expired(requested, oldest),
        e @ (StoreError::NoSpace { .. } | StoreError::Full { .. }) => {
            ApiError::insufficient_storage(format!("storing {} {name:?}: {e}", def.kind))
        }
        e @ (StoreError::Sqlite { .. }
        | StoreError::InUse { .. }
        | StoreError::Commit { .. }
        | StoreError::Thread(_)
        | StoreError::WriterGone) => ApiError::internal(format!("storing {} {name:?} failed: {e}; nothing was stored", def.kind)),
    }
}

impl Objects {
    /// Reads one object.
    ///
    /// # Errors
    /// 404 when it does not exist.
    pub fn get(&self, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Stored, ApiError> {
        self.store.get(&def.key(ns, name)).ok_or_else(|| ApiError::not_found(def.group, def.plural, name))
    }

    /// Checks that the namespace of a namespaced write exists and is not being deleted.
    fn check_namespace(&self, def: &ResourceDef, ns: Option<&str>, creating: bool) -> Result<(), ApiError> {
        if !def.namespaced {
            return Ok(());
        }
        let ns = ns
            .ok_or_else(|| ApiError::bad_request(format!("{} is namespaced: send it to /namespaces/NAMESPACE/{}", def.kind, def.plural)))?;
        let nsdef = registry::find("", "v1", "namespaces").ok_or_else(ApiError::no_resource)?;
        match self.store.get(&nsdef.key(None, ns)) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(s)
                if creating
                    && s.object.mentions("\"deletionTimestamp\"")
                    && s.object.metadata_view().pointer("/metadata/deletionTimestamp").is_some() =>
            {
                Err(ApiError::forbidden(format!("unable to create new content in namespace {ns} because it is being terminated")))
            }
            Some(_) => Ok(()),
        }
    }

    /// Creates an object (POST). `ns` comes from the URL.
    ///
    /// # Errors
    /// 400 for a wrong kind, apiVersion or namespace, 404 for a missing namespace, 409
    /// AlreadyExists, 422 for an invalid name or spec.
    pub async fn create(&self, def: &ResourceDef, ns: Option<&str>, obj: Value, write: impl Into<Write>) -> Result<Doc, ApiError> {
        let write = write.into();
        self.create_tracked(def, ns, obj, write.dry_run, Track::Update(write.manager.as_deref())).await
    }

    async fn create_tracked(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        mut obj: Value,
        dry_run: bool,
        track: Track<'_>,
    ) -> Result<Doc, ApiError> {
        check_type(def, &mut obj)?;
        {
            let m = meta_mut(&mut obj);
            match (m.get("namespace").and_then(Value::as_str), ns) {
                (Some(body_ns), Some(url_ns)) if def.namespaced && !body_ns.is_empty() && body_ns != url_ns => {
                    return Err(ApiError::bad_request(format!(
                        "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({url_ns})"
                    )));
                }
                _ => {}
            }
            if def.namespaced {
                if let Some(ns) = ns {
                    m.insert("namespace".into(), json!(ns));
                }
            } else {
                m.remove("namespace");
            }
            let has_name = m.get("name").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
            if !has_name {
                let Some(prefix) = m.get("generateName").and_then(Value::as_str).filter(|g| !g.is_empty()) else {
                    return Err(ApiError::invalid(
                        def.group,
                        def.kind,
                        "",
                        &[api::validation::Cause::new(
                            api::validation::CauseType::Required,
                            "metadata.name",
                            "name or generateName is required",
                        )],
                    ));
                };
                let suffix: String = (0..5).map(|_| char::from(b"bcdfghjklmnpqrstvwxz2456789"[rand::random_range(0..27)])).collect();
                let name = format!("{prefix}{suffix}");
                m.insert("name".into(), json!(name));
            }
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), json!(now()));
            m.remove("resourceVersion");
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("selfLink");
            if def.custom || def.kind == "Namespace" {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        let name = meta_str(&obj, "name").unwrap_or_default().to_owned();
        let name_causes = def.name_causes(&name);
        if !name_causes.is_empty() {
            return Err(ApiError::invalid(def.group, def.kind, &name, &name_causes));
        }
        if def.kind != "Namespace" {
            self.check_namespace(def, ns, true)?;
        }
        // Before the server fills in status: what the client sent is what its manager owns.
        if let Track::Update(manager) = track {
            crate::apply::record_update(def, Part::Main, None, &mut obj, manager);
        }
        // A new object starts without status where status is a subresource (as for CRDs), with
        // the phase the core controllers would give it otherwise.
        match def.kind {
            "PersistentVolumeClaim" => obj["status"] = json!({"phase": api::phases::ClaimPhase::Pending.as_str()}),
            "Namespace" => {
                obj["status"] = json!({"phase": "Active"});
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
            }
            _ if def.status => {
                if let Some(o) = obj.as_object_mut() {
                    o.remove("status");
                }
            }
            _ => {}
        }
        normalize(def, &name, &mut obj)?;
        check_metadata(def, &name, &obj, None)?;
        self.validate(def, &name, &obj)?;
        crate::limits::check_object(def, &name, &obj)?;
        if dry_run {
            return Ok(Doc::new(&obj));
        }
        let key = def.key(ns, &name);
        let ev = self.store.write(Op::Create { key, object: obj }).await.map_err(|e| store_err(def, &name, e))?;
        if def.kind == "Namespace" {
            self.ensure_default_service_account(&name).await;
        }
        Ok(ev.object)
    }

    /// Creates the namespace's `default` ServiceAccount when it is missing (the
    /// service-account controller's job in Kubernetes). A failure is logged: the namespace
    /// stands without it, and the next start creates it.
    pub async fn ensure_default_service_account(&self, ns: &str) {
        let Some(sa) = registry::find("", "v1", "serviceaccounts") else { return };
        let name = crate::kinds::serviceaccount::DEFAULT;
        if self.store.get(&sa.key(Some(ns), name)).is_some() {
            return;
        }
        match Box::pin(self.create(sa, Some(ns), json!({"metadata": {"name": name}}), false)).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => tracing::warn!(namespace = ns, "creating the default ServiceAccount failed: {}", e.message),
        }
    }

    fn validate(&self, def: &ResourceDef, name: &str, obj: &Value) -> Result<(), ApiError> {
        if let Some(crd) = def.crd {
            let causes = crate::crd::schema::validate(&crd.structural, obj);
            if !causes.is_empty() {
                return Err(ApiError::invalid(def.group, def.kind, name, &causes));
            }
        }
        if let Some(validate) = def.validate {
            let mut causes = validate(obj);
            if !self.enforce_invariants && def.kind == "VirtualMachine" {
                let broken = api::validation::invariant_causes_of_vm(obj);
                causes.retain(|c| !broken.contains(c));
            }
            if !causes.is_empty() {
                return Err(ApiError::invalid(def.group, def.kind, name, &causes));
            }
        }
        Ok(())
    }

    /// Replaces an object (PUT), the whole of it or its status.
    ///
    /// # Errors
    /// 409 Conflict when `metadata.resourceVersion` is stale (required for custom resources),
    /// 404, 400, 422 as for create.
    pub async fn replace(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        mut obj: Value,
        part: Part,
        write: impl Into<Write>,
    ) -> Result<Doc, ApiError> {
        let write = write.into();
        check_type(def, &mut obj)?;
        if meta_str(&obj, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&obj, "name").unwrap_or_default()
            )));
        }
        let want_rv = meta_str(&obj, "resourceVersion").filter(|s| !s.is_empty()).map(str::to_owned);
        if want_rv.is_none() && def.custom {
            return Err(ApiError::invalid(
                def.group,
                def.kind,
                name,
                &[api::validation::Cause::new(
                    api::validation::CauseType::Invalid,
                    "metadata.resourceVersion",
                    "must be specified for an update: read the object and send it back with its resourceVersion",
                )],
            ));
        }
        self.guaranteed_update(
            def,
            ns,
            name,
            want_rv.is_some(),
            write.dry_run,
            Track::Update(write.manager.as_deref()),
            |cur| {
                if let Some(rv) = &want_rv {
                    if *rv != cur.rv.to_string() {
                        return Err(ApiError::conflict(def.group, def.plural, name));
                    }
                }
                Ok(obj.clone())
            },
            part,
        )
        .await
    }

    /// Patches an object (PATCH), the whole of it or its status.
    ///
    /// A `metadata.resourceVersion` that the patch leaves in the object (a merge patch that
    /// carries one, or a JSON patch that replaces it) is a precondition: 409 when it is stale.
    ///
    /// # Errors
    /// 415 for strategic merge patch on a custom resource and for server-side apply; 400 for a
    /// body that is not a patch; 413 for a JSON patch of too many operations or a result over
    /// the object size limit; 422 when a JSON patch operation fails or the result nests too
    /// deep; 409; 404.
    pub async fn patch(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        kind: PatchKind,
        body: &[u8],
        part: Part,
        write: impl Into<Write>,
    ) -> Result<Doc, ApiError> {
        let write = write.into();
        if kind == PatchKind::Apply {
            return self.apply(def, ns, name, body, part, &write).await.map(|(applied, _)| applied);
        }
        if kind == PatchKind::Strategic && def.custom {
            return Err(ApiError::unsupported_media(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json",
            ));
        }
        // Parsed once, up front: a malformed body is 400 even for a missing object, and a retry
        // does not parse it again.
        let parsed = Patch::parse(kind, body)?;
        let preconditioned = parsed.carries_rv();
        self.guaranteed_update(
            def,
            ns,
            name,
            preconditioned,
            write.dry_run,
            Track::Update(write.manager.as_deref()),
            |cur| {
                let patched = parsed.apply(&cur.object)?;
                if let Some(rv) = meta_str(&patched, "resourceVersion") {
                    if rv != cur.rv.to_string() {
                        return Err(ApiError::conflict(def.group, def.plural, name));
                    }
                }
                Ok(patched)
            },
            part,
        )
        .await
    }

    /// Read-modify-write on the server: `compute` gets the current object and returns the new
    /// one (its `part`: the status part ignores changes outside `status`); a write that lost a
    /// race is re-computed on a fresh read. For subresources that edit an object (addvolume,
    /// removevolume, start, stop, restart).
    ///
    /// # Errors
    /// What `compute` returns, 404, 422 when the result is invalid.
    pub async fn update_with(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        part: Part,
        dry_run: bool,
        compute: impl Fn(&Value) -> Result<Value, ApiError>,
    ) -> Result<Doc, ApiError> {
        self.guaranteed_update(def, ns, name, false, dry_run, Track::Update(None), |cur| compute(&cur.object), part).await
    }

    /// `pods/binding`: like [`Objects::update_with`] on the main part, but the update rules of
    /// the kind ([`validate_update`]) are not applied — the bind is the one writer allowed to
    /// set a Pod's `spec.nodeName` (and `status` with it); `compute` enforces its own rules.
    ///
    /// # Errors
    /// What `compute` returns, 404.
    pub async fn bind(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        dry_run: bool,
        compute: impl Fn(&Value) -> Result<Value, ApiError>,
    ) -> Result<Doc, ApiError> {
        let key = def.key(Some(ns), name);
        for _ in 0..INTERNAL_RETRIES {
            let cur = Current::read(self, def, Some(ns), name)?;
            let mut new = compute(&cur.object)?;
            crate::apply::record_update(def, Part::Main, Some(&cur.object), &mut new, None);
            check_metadata(def, name, &new, Some(&cur.object))?;
            if dry_run {
                return Ok(Doc::new(&new));
            }
            match self.store.write(Op::Update { key: key.clone(), expected: cur.rv, object: new }).await {
                Ok(ev) => return Ok(ev.object),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(store_err(def, name, e)),
            }
        }
        Err(ApiError::conflict(def.group, def.plural, name))
    }

    /// Read, compute the new object with `compute`, write with a compare-and-swap on the read
    /// revision. When the client gave no precondition a lost race is retried on a fresh read.
    #[allow(clippy::too_many_arguments)]
    async fn guaranteed_update(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        preconditioned: bool,
        dry_run: bool,
        track: Track<'_>,
        compute: impl Fn(&Current) -> Result<Value, ApiError>,
        part: Part,
    ) -> Result<Doc, ApiError> {
        let key = def.key(ns, name);
        for _ in 0..INTERNAL_RETRIES {
            let cur = Current::read(self, def, ns, name)?;
            not_an_object(def, name, &cur.object)?;
            let mut new = compute(&cur)?;
            check_type(def, &mut new)?;
            let applied_fields = matches!(track, Track::Applied).then(|| new.pointer("/metadata/managedFields").cloned()).flatten();
            let mut new = merge_server_fields(def, &cur.object, new, part);
            if part == Part::Main {
                normalize(def, name, &mut new)?;
            }
            match track {
                Track::Update(manager) => crate::apply::record_update(def, part, Some(&cur.object), &mut new, manager),
                Track::Applied => match applied_fields {
                    Some(f) => {
                        meta_mut(&mut new).insert("managedFields".into(), f);
                    }
                    None => {
                        meta_mut(&mut new).shift_remove("managedFields");
                    }
                },
            }
            check_metadata(def, name, &new, Some(&cur.object))?;
            if part == Part::Main {
                self.validate(def, name, &new)?;
                validate_update(def, name, &cur.object, &new)?;
            } else {
                let causes = crate::shapes::status_causes(def, &new);
                if !causes.is_empty() {
                    return Err(ApiError::invalid(def.group, def.kind, name, &causes));
                }
            }
            if cur.object == new {
                return Ok(cur.doc);
            }
            crate::limits::check_update(def, name, &cur.object, &new)?;
            if dry_run {
                return Ok(Doc::new(&new));
            }
            let op = if meta(&new).get("deletionTimestamp").is_some() && !has_finalizers(&new) {
                Op::Delete { key: key.clone(), expected: cur.rv }
            } else {
                Op::Update { key: key.clone(), expected: cur.rv, object: new }
            };
            match self.store.write(op).await {
                Ok(ev) => return Ok(ev.object),
                Err(StoreError::Conflict { .. }) if !preconditioned => continue,
                Err(e) => return Err(store_err(def, name, e)),
            }
        }
        Err(ApiError::conflict(def.group, def.plural, name))
    }

    /// Deletes an object, honouring preconditions, finalizers and the propagation policy.
    /// Returns the object as deleted (or as marked for deletion while finalizers remain).
    ///
    /// # Errors
    /// 404; 409 when a precondition fails; 403 for the `default` namespace.
    pub async fn delete(&self, def: &ResourceDef, ns: Option<&str>, name: &str, opts: &DeleteOptions) -> Result<Doc, ApiError> {
        if def.kind == "CustomResourceDefinition" && crate::crd::is_builtin(name) {
            return Err(ApiError::forbidden(format!(
                "customresourcedefinitions.apiextensions.k8s.io \"{name}\" is forbidden: it is virtplug's own; deleting it would delete every object of it"
            )));
        }
        if def.kind == "Namespace" && matches!(name, "default" | "kube-system" | "kube-public") {
            return Err(ApiError::forbidden(format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted")));
        }
        let key = def.key(ns, name);
        for _ in 0..INTERNAL_RETRIES {
            let cur = Current::read(self, def, ns, name)?;
            if let Some(uid) = &opts.uid {
                let actual = meta_str(&cur.object, "uid").unwrap_or_default();
                if uid != actual {
                    return Err(ApiError::precondition(
                        def.group,
                        def.plural,
                        name,
                        &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"),
                    ));
                }
            }
            if let Some(rv) = &opts.resource_version {
                if *rv != cur.rv.to_string() {
                    return Err(ApiError::precondition(
                        def.group,
                        def.plural,
                        name,
                        &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}", cur.rv),
                    ));
                }
            }
            let mut obj = cur.object.clone();
            let policy_finalizer = match opts.propagation {
                Some(Propagation::Foreground) => Some("foregroundDeletion"),
                Some(Propagation::Orphan) => Some("orphan"),
                _ => None,
            };
            let already_deleting = meta(&obj).get("deletionTimestamp").is_some();
            if let Some(f) = policy_finalizer {
                if !already_deleting && obj.is_object() {
                    let m = meta_mut(&mut obj);
                    let fins = m.entry("finalizers").or_insert_with(|| json!([]));
                    if let Some(a) = fins.as_array_mut() {
                        if !a.iter().any(|x| x == f) {
                            a.push(json!(f));
                        }
                    }
                }
            }
            let marked_grace = meta(&obj).get("deletionGracePeriodSeconds").and_then(Value::as_u64);
            // Already marked with no grace (finalizers hold it): a grace cannot lengthen that.
            let graceful = def.group.is_empty() && def.kind == "Pod" && !(already_deleting && marked_grace.is_none_or(|g| g == 0));
            let grace = if graceful { pod_grace(&obj, opts.grace_period) } else { 0 };
            // A stored value that is not an object has no finalizers to honour: it just goes.
            let op = if grace > 0 && obj.is_object() {
                // A graceful delete: marked with the time it is due; a later delete may only
                // shorten the grace (kube-apiserver's rule), a longer or equal one changes nothing.
                let kept = already_deleting && marked_grace.is_some_and(|g| g > 0 && g <= grace);
                if kept && cur.object == obj {
                    return Ok(cur.doc);
                }
                let m = meta_mut(&mut obj);
                if !kept {
                    let due = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(i64::try_from(grace).unwrap_or(i64::MAX)));
                    let due = due.unwrap_or(jiff::Timestamp::MAX).strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
                    m.insert("deletionTimestamp".into(), json!(due));
                    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                }
                Op::Update { key: key.clone(), expected: cur.rv, object: obj.clone() }
            } else if obj.is_object() && has_finalizers(&obj) {
                let m = meta_mut(&mut obj);
                if !already_deleting {
                    m.insert("deletionTimestamp".into(), json!(now()));
                }
                // (A pod marked with a grace, deleted now with none, keeps it no longer.)
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                if already_deleting && cur.object == obj {
                    return Ok(cur.doc);
                }
                if def.kind == "Namespace" {
                    // A status of another shape (written through the status subresource) is
                    // replaced: indexing into it would panic.
                    if !obj.get("status").is_some_and(Value::is_object) {
                        obj["status"] = json!({});
                    }
                    obj["status"]["phase"] = json!("Terminating");
                }
                Op::Update { key: key.clone(), expected: cur.rv, object: obj.clone() }
            } else {
                Op::Delete { key: key.clone(), expected: cur.rv }
            };
            if opts.dry_run {
                return Ok(Doc::new(&obj));
            }
            match self.store.write(op).await {
                Ok(ev) => return Ok(ev.object),
                Err(StoreError::Conflict { .. }) if opts.resource_version.is_none() => continue,
                Err(e) => return Err(store_err(def, name, e)),
            }
        }
        Err(ApiError::conflict(def.group, def.plural, name))
    }

    /// All objects of `def` in `ns` (all namespaces when `None`), after `after`, with the revision.
    #[must_use]
    pub fn list(&self, def: &ResourceDef, ns: Option<&str>, after: Option<&str>) -> (u64, Vec<(String, Doc)>) {
        let (rv, items, _) = self.list_page(def, ns, after, usize::MAX);
        (rv, items)
    }

    /// The first `max` objects of [`Objects::list`], and how many it would return in all.
    #[must_use]
    pub fn list_page(&self, def: &ResourceDef, ns: Option<&str>, after: Option<&str>, max: usize) -> (u64, Vec<(String, Doc)>, usize) {
        let (rv, items, total) = self.store.list_page(&def.prefix(ns), after, max);
        (rv, items.into_iter().map(|(k, s)| (k, s.object)).collect(), total)
    }
}

/// An object read for a read-modify-write: its revision, its stored JSON (answered as it is when
/// the write changes nothing) and the object parsed once for the computation.
pub(crate) struct Current {
    pub rv: u64,
    pub doc: Doc,
    pub object: Value,
}

impl Current {
    pub(crate) fn read(objects: &Objects, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Current, ApiError> {
        let Stored { rv, object: doc } = objects.get(def, ns, name)?;
        let object = doc.value();
        Ok(Current { rv, doc, object })
    }
}
