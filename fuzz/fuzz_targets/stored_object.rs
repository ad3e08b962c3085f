//! Stored objects (issue 14, class 4): arbitrary JSON put straight into a real
//! [`apiserver::Store`] — past admission, as an older server, a bug or a hand-edited database
//! could have left it — as objects of every resource the server serves, then everything a
//! long-lived task or a request does with stored objects:
//!
//! 1. the HTTP layer ([`apiserver::routes::dispatch`], no socket): GET of each object as JSON and
//!    as a Table, LIST of each resource (JSON and Table, with label and field selectors), a
//!    WATCH with the initial events (JSON and Table) read up to its bookmark;
//! 2. the controller's and the node agent's per-object logic, on the objects as a Kubernetes
//!    client decodes them: typed deserialization, admission's validation, the VM's volumes as
//!    the controller's cache sees them (the input's claims and DataVolumes), the lifecycle
//!    decision and printable status, the VMI a VM starts, self-heal, the declarative hot-plug
//!    plan of each VM and its VMI, the node agent's hot-plug pass on a VMI (its plan against
//!    QEMU holding nothing and holding every volume, the status changes applied), the node's
//!    caps on a VMI, an Event's last sighting;
//! 3. one garbage-collector sweep and Event expiry ([`apiserver::gc`]);
//! 4. writes on the stored objects: metadata and status merge patches, the KubeVirt
//!    subresources (start, stop, restart, addvolume, removevolume), deletes with each
//!    propagation policy — then the collector settles (namespace deletion, cascades).
//!
//! Input: a JSON array of objects (or one object). An element's resource is the one whose kind
//! it names, else the `i % 7`-th; its key comes from `metadata.namespace` (default `default`)
//! and `metadata.name` (default `obj<i>`), whatever their types.
//!
//! Asserts: no panic anywhere (libFuzzer's panic hook aborts even on a panic the code catches,
//! so the guards of the long-lived tasks hide nothing from it), no hang (libFuzzer's `-timeout`;
//! the runtime's time is paused, so no deadline costs real time); every watch line is JSON; a
//! hot-plug plan's patch applies to the VMI it was computed from (its `test` operations hold),
//! and the patched VMI needs no further plan.
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use apiserver::registry::{ResourceDef, RESOURCES};
use apiserver::store::Op;
use apiserver::{Objects, Store, StoreConfig};
use axum::body::Body;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

struct Item {
    def: &'static ResourceDef,
    ns: Option<String>,
    name: String,
    object: Value,
}

fn items(input: Value) -> Vec<Item> {
    let list = match input {
        Value::Array(a) => a,
        v => vec![v],
    };
    list.into_iter()
        .take(32)
        .enumerate()
        .map(|(i, object)| {
            let kind = object.get("kind").and_then(Value::as_str);
            let def = RESOURCES.iter().find(|d| Some(d.kind) == kind).unwrap_or(&RESOURCES[i % RESOURCES.len()]);
            let meta = |k: &str| object.pointer(&format!("/metadata/{k}")).and_then(Value::as_str).map(str::to_owned);
            let ns = def.namespaced.then(|| meta("namespace").unwrap_or_else(|| "default".to_owned()));
            let name = meta("name").unwrap_or_else(|| format!("obj{i}"));
            Item { def, ns, name, object }
        })
        .collect()
}

/// `/api/v1/...` or `/apis/GROUP/VERSION/...` of a resource, an object or a subresource.
fn path(def: &ResourceDef, ns: Option<&str>, name: Option<&str>, sub: Option<&str>) -> String {
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let mut p = if def.group.is_empty() { format!("/api/{}", def.version) } else { format!("/apis/{}/{}", def.group, def.version) };
    if let Some(ns) = ns.filter(|_| def.namespaced) {
        p.push_str(&format!("/namespaces/{}", enc(ns)));
    }
    p.push_str(&format!("/{}", def.plural));
    if let Some(n) = name {
        p.push_str(&format!("/{}", enc(n)));
    }
    if let Some(s) = sub {
        p.push_str(&format!("/{s}"));
    }
    p
}

struct Api {
    router: axum::Router,
}

impl Api {
    /// Sends a request; reads the body whole, or for a watch up to the end of its initial events.
    async fn send(&self, method: &str, uri: &str, accept: &str, content_type: &str, body: Vec<u8>) {
        let Ok(req) = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("accept", accept)
            .header("content-type", content_type)
            .body(Body::from(body))
        else {
            return;
        };
        let Ok(resp) = self.router.clone().oneshot(req).await;
        let mut body = resp.into_body();
        let watch = uri.contains("watch=true");
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                // Each line a client reads must be JSON.
                for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                    if watch {
                        assert!(
                            serde_json::from_slice::<Value>(line).is_ok(),
                            "a watch line is not JSON: {}",
                            String::from_utf8_lossy(line)
                        );
                    }
                }
                if watch && data.windows(25).any(|w| w == b"k8s.io/initial-events-end") {
                    return;
                }
            }
        }
    }
}

/// Step 1: reads of every kind.
async fn reads(api: &Api, items: &[Item]) {
    for it in items {
        let p = path(it.def, it.ns.as_deref(), Some(&it.name), None);
        api.send("GET", &p, "application/json", "", Vec::new()).await;
        api.send("GET", &p, TABLE, "", Vec::new()).await;
    }
    for def in RESOURCES {
        let selectors = "labelSelector=app%3Dfuzz%2C%21missing&fieldSelector=metadata.name%21%3Dx%2Cstatus.phase%3D";
        let list = path(def, Some("default"), None, None);
        api.send("GET", &format!("{list}?limit=2"), "application/json", "", Vec::new()).await;
        api.send("GET", &format!("{}?{selectors}", path(def, None, None, None)), TABLE, "", Vec::new()).await;
        let watch = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
        api.send("GET", &format!("{}?{watch}", path(def, None, None, None)), "application/json", "", Vec::new()).await;
        api.send("GET", &format!("{list}?{watch}&{selectors}"), TABLE, "", Vec::new()).await;
    }
}

/// The claims and DataVolumes of the input, as the controller's cache holds them.
struct Lookup {
    pvcs: Vec<Arc<k8s_openapi::api::core::v1::PersistentVolumeClaim>>,
    dvs: Vec<Arc<api::DataVolume>>,
}

impl controller::cache::Lookup for Lookup {
    fn pvc(&self, ns: &str, name: &str) -> Option<Arc<k8s_openapi::api::core::v1::PersistentVolumeClaim>> {
        self.pvcs.iter().find(|p| p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)).cloned()
    }
    fn dv(&self, ns: &str, name: &str) -> Option<Arc<api::DataVolume>> {
        self.dvs.iter().find(|d| d.metadata.namespace.as_deref() == Some(ns) && d.metadata.name.as_deref() == Some(name)).cloned()
    }
}

fn typed<T: serde::de::DeserializeOwned>(items: &[Item], kind: &str) -> Vec<Arc<T>> {
    items.iter().filter(|i| i.def.kind == kind).filter_map(|i| serde_json::from_value(i.object.clone()).ok()).map(Arc::new).collect()
}

/// Step 2: the controller's and the node agent's logic on the objects as a client decodes
/// them (an object that does not decode is one a client never sees: its watch reports an
/// error instead).
fn per_object_logic(items: &[Item]) {
    use api::{VirtualMachine, VirtualMachineInstance};
    use controller::lifecycle::{self, Volumes};
    let host = node::caps::Host { dir: "/var/lib/virtplug".into(), free: 100 << 30, mem_total: 16 << 30 };
    let lookup = Lookup { pvcs: typed(items, "PersistentVolumeClaim"), dvs: typed(items, "DataVolume") };
    let vmis: Vec<Arc<VirtualMachineInstance>> = typed(items, "VirtualMachineInstance");
    for it in items {
        let raw = &it.object;
        match it.def.kind {
            "VirtualMachine" => {
                let _ = api::validation::validate_vm(raw);
                let Ok(vm) = serde_json::from_value::<VirtualMachine>(raw.clone()) else { continue };
                let vmi = vmis.iter().find(|v| v.metadata.name == vm.metadata.name && v.metadata.namespace == vm.metadata.namespace);
                let volumes = lifecycle::volumes(&lookup, &vm);
                for can_start in [false, true] {
                    let _ = lifecycle::decide(&vm, vmi.map(AsRef::as_ref), can_start);
                }
                for volumes in [volumes, Volumes::Ready, Volumes::Provisioning("p".into()), Volumes::NotFound("n".into())] {
                    let _ = lifecycle::printable_status(&vm, vmi.map(AsRef::as_ref), &volumes);
                }
                let _ = serde_json::to_value(lifecycle::new_vmi(&vm));
                let _ = controller::selfheal::missing_drives(&vm);
                let _ = controller::selfheal::describe(&controller::selfheal::violations(&vm));
                if let (Some(template), Some(vmi)) = (vm.spec.template.spec.as_ref(), vmi) {
                    let raw_vmi = items.iter().find(|o| o.def.kind == "VirtualMachineInstance" && o.name == it.name && o.ns == it.ns);
                    plan_holds(template, vmi, raw_vmi.map(|o| &o.object));
                }
            }
            "VirtualMachineInstance" => {
                let _ = api::validation::validate_vmi(raw);
                let Ok(vmi) = serde_json::from_value::<VirtualMachineInstance>(raw.clone()) else { continue };
                let _ = node::caps::check(&vmi.spec, node::caps::Caps::default(), &host);
                node_pass(&vmi);
                let _ = serde_json::to_value(&vmi);
            }
            "DataVolume" => {
                let _ = api::validation::validate_data_volume(raw);
            }
            "Event" => {
                let _ = apiserver::gc::ttl::last_seen(raw, jiff::Timestamp::now());
            }
            _ => {}
        }
    }
}

/// The node agent's hot-plug pass on a VMI, planned against QEMU holding nothing and against
/// QEMU holding every volume its status names, then the status changes of each step applied.
fn node_pass(vmi: &api::VirtualMachineInstance) {
    use node::hotplug::plan::{plan, wanted, Step};
    use node::hotplug::status::{apply, Change};
    let wanted = wanted(&vmi.spec);
    let named: Vec<String> = vmi.status.iter().flat_map(|s| s.volume_status.iter().map(|e| e.name.clone())).collect();
    let held = qemu::Inventory {
        attached: named
            .iter()
            .map(|v| qemu::Attached { volume: v.clone(), device_type: "scsi-hd".into(), node: Some(qemu::node_name(v)), readonly: false })
            .collect(),
        nodes: named.iter().map(|v| qemu::node_name(v)).collect(),
    };
    let drives: Vec<qemu::Drive> = vmi
        .spec
        .domain
        .devices
        .disks
        .iter()
        .filter(|d| d.cdrom.is_some())
        .map(|d| qemu::Drive { id: d.name.clone(), medium_node: Some(qemu::node_name(&d.name)), tray_open: false })
        .collect();
    for (inventory, drives) in [(qemu::Inventory::default(), &[][..]), (held, &drives[..])] {
        let steps = plan(&wanted, &inventory, drives, vmi.status.as_ref());
        let changes: Vec<Change> = steps
            .iter()
            .filter_map(|s| match s {
                Step::RecordReady { volume } => Some(Change::ready(volume)),
                Step::Detach { volume } | Step::Eject { volume: Some(volume), .. } => Some(Change::detaching(volume, "unplugging")),
                Step::DropEntry { volume } => Some(Change::Remove(volume.clone())),
                _ => None,
            })
            .collect();
        let mut status = vmi.status.clone().unwrap_or_default();
        apply(&mut status, &changes, jiff::Timestamp::UNIX_EPOCH);
        let _ = serde_json::to_value(&status);
    }
}

/// The hot-plug plan's patch applies to the VMI it was computed from, and is the last one.
fn plan_holds(template: &api::kubevirt::VirtualMachineInstanceSpec, vmi: &api::VirtualMachineInstance, raw: Option<&Value>) {
    let Ok(Some(patch)) = controller::hotplug::plan(template, vmi) else { return };
    // The VMI as stored when admission would have let it in; otherwise as the controller sees it
    // (its `test` operations compare what the controller read, e.g. a defaulted disk name).
    let raw = match raw {
        Some(raw) if api::validation::validate_vmi(raw).is_empty() => raw.clone(),
        _ => serde_json::to_value(vmi).unwrap_or_default(),
    };
    let mut patched = raw.clone();
    if let Err(e) = json_patch::patch(&mut patched, &patch) {
        panic!("the plan {patch:?} does not apply to the VMI it was made for: {e}");
    }
    // What admission would refuse is not written: no second plan to check.
    let Ok(again) = serde_json::from_value::<api::VirtualMachineInstance>(patched) else { return };
    if let Ok(Some(next)) = controller::hotplug::plan(template, &again) {
        panic!("the plan does not settle: after {patch:?}, {next:?}");
    }
}

/// Step 4: writes through the HTTP layer.
async fn writes(api: &Api, items: &[Item]) {
    for (i, it) in items.iter().enumerate() {
        let p = path(it.def, it.ns.as_deref(), Some(&it.name), None);
        let merge = "application/merge-patch+json";
        api.send("PATCH", &p, "application/json", merge, br#"{"metadata":{"labels":{"fuzz":"x"}}}"#.to_vec()).await;
        if it.def.status {
            let s = path(it.def, it.ns.as_deref(), Some(&it.name), Some("status"));
            api.send("PATCH", &s, "application/json", merge, br#"{"status":{"phase":"Running"}}"#.to_vec()).await;
        }
        let ns = it.ns.as_deref().unwrap_or("default");
        let sub = |plural: &str, s: &str| {
            format!(
                "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/{plural}/{}/{s}",
                form_urlencoded::byte_serialize(it.name.as_bytes()).collect::<String>()
            )
        };
        let add = br#"{"name":"hp","disk":{"disk":{"bus":"scsi"}},"volumeSource":{"persistentVolumeClaim":{"claimName":"c"}}}"#;
        match it.def.kind {
            "VirtualMachine" => {
                for s in ["stop", "start", "restart"] {
                    api.send("PUT", &sub("virtualmachines", s), "application/json", "application/json", br#"{"gracePeriod":5}"#.to_vec())
                        .await;
                }
                api.send("PUT", &sub("virtualmachines", "addvolume"), "application/json", "application/json", add.to_vec()).await;
                api.send(
                    "PUT",
                    &sub("virtualmachines", "removevolume"),
                    "application/json",
                    "application/json",
                    br#"{"name":"hp"}"#.to_vec(),
                )
                .await;
            }
            "VirtualMachineInstance" => {
                api.send("PUT", &sub("virtualmachineinstances", "addvolume"), "application/json", "application/json", add.to_vec()).await;
                api.send(
                    "PUT",
                    &sub("virtualmachineinstances", "removevolume"),
                    "application/json",
                    "application/json",
                    br#"{"name":"hp"}"#.to_vec(),
                )
                .await;
            }
            _ => {}
        }
        let policy = ["Background", "Foreground", "Orphan"][i % 3];
        api.send("DELETE", &format!("{p}?propagationPolicy={policy}"), "application/json", "", Vec::new()).await;
    }
}

async fn run(input: Value) {
    let Ok(dir) = tempfile::Builder::new().prefix("stored-object").tempdir_in("/dev/shm") else { return };
    let config = StoreConfig { reserve: Some(0), ..StoreConfig::default() };
    let Ok(store) = Store::open(&dir.path().join("store.db"), &config) else { return };
    let items = items(input);
    let nsdef = RESOURCES.iter().find(|d| d.kind == "Namespace").expect("Namespace is served");
    let default = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default", "uid": "ns-default"},
        "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
    let _ = store.write(Op::Create { key: nsdef.key(None, "default"), object: default }).await;
    for it in &items {
        let _ = store.write(Op::Create { key: it.def.key(it.ns.as_deref(), &it.name), object: it.object.clone() }).await;
    }
    let objects = Objects { store, enforce_invariants: true };
    let state = apiserver::routes::ApiState {
        objects: objects.clone(),
        body_limit: 3 << 20,
        git_version: "fuzz".into(),
        metrics: None,
        watches: apiserver::watch::WatchSlots::default(),
        kubevirt_subresources: true,
        tunnels: Arc::default(),
        token: None,
        tokens: apiserver::tokens::Tokens::default(),
    };
    let api = Api { router: axum::Router::new().fallback(apiserver::routes::dispatch).with_state(Arc::new(state)) };

    reads(&api, &items).await;
    per_object_logic(&items);
    apiserver::gc::sweep(&objects).await;
    apiserver::gc::ttl::expire(&objects, Duration::from_secs(3600)).await;
    writes(&api, &items).await;
    apiserver::gc::settle(&objects).await;
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(input) = serde_json::from_slice::<Value>(data) else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("a tokio runtime");
    rt.block_on(run(input));
});
