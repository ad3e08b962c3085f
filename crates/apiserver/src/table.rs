//! `meta.k8s.io/v1` Table output, which `kubectl get` asks for: the columns KubeVirt's and
//! Kubernetes' printers show for each kind.

use serde_json::{json, Value};

use crate::registry::ResourceDef;

/// Whether the `Accept` header asks for a Table.
#[must_use]
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|a| a.contains("as=Table") && a.contains("g=meta.k8s.io"))
}

struct Column {
    name: &'static str,
    ty: &'static str,
    cell: fn(&Value, i64) -> Value,
}

fn s(v: &Value, ptr: &str) -> Value {
    v.pointer(ptr).cloned().map_or(json!("<none>"), |x| if x.is_string() { x } else { json!(x.to_string()) })
}

fn age(v: &Value, now: i64) -> Value {
    let created = v.pointer("/metadata/creationTimestamp").and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok());
    match created {
        Some(t) => json!(human_duration(now - t.as_second())),
        None => json!("<unknown>"),
    }
}

/// Kubernetes' `duration.HumanDuration`, short form.
#[must_use]
pub fn human_duration(secs: i64) -> String {
    let secs = secs.max(0);
    if secs < 120 {
        format!("{secs}s")
    } else if secs < 600 {
        let (m, s) = (secs / 60, secs % 60);
        if s == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{s}s")
        }
    } else if secs < 3 * 3600 {
        format!("{}m", secs / 60)
    } else if secs < 8 * 3600 {
        let (h, m) = (secs / 3600, (secs % 3600) / 60);
        if m == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{m}m")
        }
    } else if secs < 48 * 3600 {
        format!("{}h", secs / 3600)
    } else if secs < 8 * 86400 {
        let (d, h) = (secs / 86400, (secs % 86400) / 3600);
        if h == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{h}h")
        }
    } else if secs < 2 * 365 * 86400 {
        format!("{}d", secs / 86400)
    } else {
        format!("{}y", secs / (365 * 86400))
    }
}

fn name(v: &Value, _: i64) -> Value {
    s(v, "/metadata/name")
}

fn columns(kind: &str) -> Vec<Column> {
    let c = |name, ty, cell| Column { name, ty, cell };
    let mut cols = vec![c("Name", "string", name as fn(&Value, i64) -> Value)];
    match kind {
        "PersistentVolumeClaim" => {
            cols.push(c("Status", "string", |v, _| s(v, "/status/phase")));
            cols.push(c("Volume", "string", |v, _| v.pointer("/spec/volumeName").cloned().unwrap_or(json!(""))));
            cols.push(c("Capacity", "string", |v, _| v.pointer("/status/capacity/storage").cloned().unwrap_or(json!(""))));
            cols.push(c("Access Modes", "string", |v, _| access_modes(v, "/status/accessModes")));
            cols.push(c("StorageClass", "string", |v, _| s(v, "/spec/storageClassName")));
            cols.push(c("VolumeMode", "string", |v, _| s(v, "/spec/volumeMode")));
            cols.push(c("Age", "date", age));
        }
        "Node" => {
            cols.push(c("Status", "string", |v, _| {
                let ready = v
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                    .and_then(|c| c["status"].as_str());
                json!(if ready == Some("True") { "Ready" } else { "NotReady" })
            }));
            cols.push(c("Age", "date", age));
            cols.push(c("Version", "string", |v, _| s(v, "/status/nodeInfo/kubeletVersion")));
        }
        "Namespace" => {
            cols.push(c("Status", "string", |v, _| s(v, "/status/phase")));
            cols.push(c("Age", "date", age));
        }
        "Secret" => {
            cols.push(c("Type", "string", |v, _| s(v, "/type")));
            cols.push(c("Data", "string", |v, _| json!(v.get("data").and_then(Value::as_object).map_or(0, serde_json::Map::len))));
            cols.push(c("Age", "date", age));
        }
        "Event" => {
            cols.insert(
                0,
                c("Last Seen", "string", |v, now| {
                    let t = v
                        .get("lastTimestamp")
                        .filter(|t| !t.is_null())
                        .or_else(|| v.pointer("/series/lastObservedTime"))
                        .or_else(|| v.get("deprecatedLastTimestamp").filter(|t| !t.is_null()))
                        .or_else(|| v.get("eventTime"))
                        .and_then(Value::as_str)
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
                    t.map_or(json!("<unknown>"), |t| json!(human_duration(now - t.as_second())))
                }),
            );
            cols.push(c("Type", "string", |v, _| s(v, "/type")));
            cols.push(c("Reason", "string", |v, _| s(v, "/reason")));
            // core/v1 names the object `involvedObject` and the text `message`;
            // events.k8s.io/v1 `regarding` and `note`.
            cols.push(c("Object", "string", |v, _| {
                let object = v.get("involvedObject").or_else(|| v.get("regarding")).unwrap_or(&Value::Null);
                let kind = object.get("kind").and_then(Value::as_str).unwrap_or("").to_lowercase();
                let name = object.get("name").and_then(Value::as_str).unwrap_or("");
                json!(format!("{kind}/{name}"))
            }));
            cols.push(c("Message", "string", |v, _| if v.get("message").is_some() { s(v, "/message") } else { s(v, "/note") }));
        }
        "ConfigMap" => {
            cols.push(c("Data", "string", |v, _| {
                let n = |f: &str| v.get(f).and_then(Value::as_object).map_or(0, serde_json::Map::len);
                json!(n("data") + n("binaryData"))
            }));
            cols.push(c("Age", "date", age));
        }
        "ServiceAccount" => {
            cols.push(c("Secrets", "integer", |v, _| json!(v.get("secrets").and_then(Value::as_array).map_or(0, Vec::len))));
            cols.push(c("Age", "date", age));
        }
        "Pod" => {
            cols.push(c("Ready", "string", |v, _| {
                let total = v.pointer("/spec/containers").and_then(Value::as_array).map_or(0, Vec::len);
                let ready = statuses(v).filter(|s| s["ready"] == true).count();
                json!(format!("{ready}/{total}"))
            }));
            cols.push(c("Status", "string", |v, _| {
                let waiting = statuses(v).find_map(|s| s.pointer("/state/waiting/reason").and_then(Value::as_str));
                let reason = v.pointer("/status/reason").and_then(Value::as_str);
                let deleting = v.pointer("/metadata/deletionTimestamp").is_some();
                json!(if deleting {
                    "Terminating"
                } else {
                    reason.or(waiting).or_else(|| v.pointer("/status/phase").and_then(Value::as_str)).unwrap_or("Pending")
                })
            }));
            cols.push(c("Restarts", "integer", |v, _| json!(statuses(v).filter_map(|s| s["restartCount"].as_i64()).sum::<i64>())));
            cols.push(c("Age", "date", age));
        }
        "Service" => {
            cols.push(c("Type", "string", |v, _| s(v, "/spec/type")));
            cols.push(c("Cluster-IP", "string", |v, _| s(v, "/spec/clusterIP")));
            cols.push(c("External-IP", "string", |v, _| {
                let ips: Vec<&str> =
                    v.pointer("/spec/externalIPs").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
                if v.pointer("/spec/type") == Some(&json!("ExternalName")) {
                    return s(v, "/spec/externalName");
                }
                json!(if ips.is_empty() { "<none>".to_owned() } else { ips.join(",") })
            }));
            cols.push(c("Port(s)", "string", |v, _| {
                let ports: Vec<String> = v
                    .pointer("/spec/ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let proto = p["protocol"].as_str().unwrap_or("TCP");
                        match p.get("nodePort").and_then(Value::as_i64) {
                            Some(n) => format!("{}:{n}/{proto}", p["port"]),
                            None => format!("{}/{proto}", p["port"]),
                        }
                    })
                    .collect();
                json!(if ports.is_empty() { "<none>".to_owned() } else { ports.join(",") })
            }));
            cols.push(c("Age", "date", age));
        }
        "PersistentVolume" => {
            cols.push(c("Capacity", "string", |v, _| v.pointer("/spec/capacity/storage").cloned().unwrap_or(json!(""))));
            cols.push(c("Access Modes", "string", |v, _| access_modes(v, "/spec/accessModes")));
            cols.push(c("Reclaim Policy", "string", |v, _| s(v, "/spec/persistentVolumeReclaimPolicy")));
            cols.push(c("Status", "string", |v, _| s(v, "/status/phase")));
            cols.push(c("Claim", "string", |v, _| {
                let (ns, name) = (v.pointer("/spec/claimRef/namespace"), v.pointer("/spec/claimRef/name"));
                match (ns.and_then(Value::as_str), name.and_then(Value::as_str)) {
                    (Some(ns), Some(name)) => json!(format!("{ns}/{name}")),
                    _ => json!(""),
                }
            }));
            cols.push(c("StorageClass", "string", |v, _| v.pointer("/spec/storageClassName").cloned().unwrap_or(json!(""))));
            cols.push(c("Reason", "string", |v, _| v.pointer("/status/reason").cloned().unwrap_or(json!(""))));
            cols.push(c("Age", "date", age));
        }
        "StorageClass" => {
            cols[0] = c("Name", "string", |v, _| {
                let name = v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                json!(if crate::kinds::storageclass::is_default(v) { format!("{name} (default)") } else { name.to_owned() })
            });
            cols.push(c("Provisioner", "string", |v, _| s(v, "/provisioner")));
            cols.push(c("ReclaimPolicy", "string", |v, _| s(v, "/reclaimPolicy")));
            cols.push(c("VolumeBindingMode", "string", |v, _| s(v, "/volumeBindingMode")));
            cols.push(c("AllowVolumeExpansion", "string", |v, _| {
                json!(v.get("allowVolumeExpansion").and_then(Value::as_bool).unwrap_or(false).to_string())
            }));
            cols.push(c("Age", "date", age));
        }
        "Lease" => {
            cols.push(c("Holder", "string", |v, _| v.pointer("/spec/holderIdentity").cloned().unwrap_or(json!(""))));
            cols.push(c("Age", "date", age));
        }
        _ => cols.push(c("Age", "date", age)),
    }
    cols
}

/// A Pod's container statuses.
fn statuses(v: &Value) -> impl Iterator<Item = &Value> {
    v.pointer("/status/containerStatuses").and_then(Value::as_array).into_iter().flatten()
}

/// Access modes as kubectl abbreviates them (`RWO,ROX`).
fn access_modes(v: &Value, ptr: &str) -> Value {
    let modes: Vec<&str> = v.pointer(ptr).and_then(Value::as_array).map_or_else(Vec::new, |m| {
        m.iter()
            .filter_map(Value::as_str)
            .map(|m| match m {
                "ReadWriteOnce" => "RWO",
                "ReadOnlyMany" => "ROX",
                "ReadWriteMany" => "RWX",
                "ReadWriteOncePod" => "RWOP",
                other => other,
            })
            .collect()
    });
    json!(modes.join(","))
}

/// A row's cells from its object and the time now (seconds).
type Cells<'a> = Box<dyn Fn(&Value, i64) -> Vec<Value> + 'a>;

/// The columns of a Table of `def` and how a row's cells are made.
struct Layout<'a> {
    defs: Vec<Value>,
    cells: Cells<'a>,
}

impl<'a> Layout<'a> {
    fn of(def: &'a ResourceDef) -> Layout<'a> {
        if let Some(crd) = def.crd {
            return Layout::of_crd(&crd.columns);
        }
        let cols = columns(def.kind);
        let defs = cols
            .iter()
            .map(|c| {
                let mut d = json!({"name": c.name, "type": c.ty, "format": "", "description": c.name, "priority": 0});
                if c.name == "Name" {
                    d["format"] = json!("name");
                }
                d
            })
            .collect();
        Layout { defs, cells: Box::new(move |obj, now| cols.iter().map(|c| (c.cell)(obj, now)).collect()) }
    }

    /// A custom resource's Table: `Name`, then its printer columns (`Age` when it has none), as
    /// kube-apiserver builds it from `additionalPrinterColumns`.
    fn of_crd(cols: &'a [crate::crd::columns::Column]) -> Layout<'a> {
        let cols: Vec<crate::crd::columns::Column> = if cols.is_empty() {
            crate::crd::columns::from_crd(Some(&json!([{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}])))
        } else {
            cols.to_vec()
        };
        let mut defs = vec![
            json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
        ];
        defs.extend(
            cols.iter()
                .map(|c| json!({"name": c.name, "type": c.ty, "format": c.format, "description": c.description, "priority": c.priority})),
        );
        Layout {
            defs,
            cells: Box::new(move |obj, now| {
                let mut cells = vec![s(obj, "/metadata/name")];
                cells.extend(cols.iter().map(|c| c.cell(obj, now)));
                cells
            }),
        }
    }
}

/// A Table of `items` (each a whole object).
#[must_use]
pub fn table(def: &ResourceDef, items: &[&Value], list_meta: &Value, include_object: &str) -> Value {
    let now = jiff::Timestamp::now().as_second();
    let layout = Layout::of(def);
    let rows: Vec<Value> =
        items.iter().map(|obj| json!({"cells": (layout.cells)(obj, now), "object": row_object(obj, include_object)})).collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": layout.defs, "rows": rows})
}

/// The same Table as [`table`], of stored objects, encoded as it is built: one object is parsed
/// at a time and its row written out, so a Table of many objects never holds them all parsed
/// (and builds no tree of rows to encode and free afterwards).
#[must_use]
pub fn table_bytes<'d>(
    def: &ResourceDef,
    items: impl Iterator<Item = &'d crate::store::Doc>,
    list_meta: &Value,
    include_object: &str,
) -> Vec<u8> {
    let now = jiff::Timestamp::now().as_second();
    let layout = Layout::of(def);
    let head = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": layout.defs});
    let mut out = head.to_string().into_bytes();
    out.pop(); // reopen the object: `}`
    out.extend_from_slice(b",\"rows\":[");
    for (i, doc) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let obj = doc.value();
        out.extend_from_slice(b"{\"cells\":");
        // Writing a `Value` into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &(layout.cells)(&obj, now));
        out.extend_from_slice(b",\"object\":");
        match include_object {
            "None" => out.extend_from_slice(b"null"),
            "Object" => out.extend_from_slice(doc.bytes()),
            _ => {
                out.extend_from_slice(b"{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":");
                let _ = serde_json::to_writer(&mut out, &obj["metadata"]);
                out.push(b'}');
            }
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    out
}

fn row_object(obj: &Value, include_object: &str) -> Value {
    match include_object {
        "None" => Value::Null,
        "Object" => obj.clone(),
        _ => json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"].clone()}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Doc;

    #[test]
    fn a_streamed_table_is_the_table() {
        let def = crate::registry::find("kubevirt.io", "v1", "virtualmachines").unwrap_or_else(|| panic!("VMs are served"));
        let objs = [
            json!({"metadata": {"name": "a", "creationTimestamp": "2026-01-01T00:00:00Z", "managedFields": [{"manager": "m"}]},
                   "status": {"printableStatus": "Running", "ready": true}}),
            json!({"metadata": {"name": "b"}, "spec": {"x": 1}}),
        ];
        let docs: Vec<Doc> = objs.iter().map(Doc::new).collect();
        let meta = json!({"resourceVersion": "9"});
        for include in ["Metadata", "None", "Object"] {
            let streamed: Value = serde_json::from_slice(&table_bytes(def, docs.iter(), &meta, include)).unwrap();
            let built = table(def, &objs.iter().collect::<Vec<_>>(), &meta, include);
            assert_eq!(streamed, built, "{include}");
        }
        let empty: Value = serde_json::from_slice(&table_bytes(def, [].iter(), &meta, "Metadata")).unwrap();
        assert_eq!(empty["rows"], json!([]));
    }

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3600), "60m");
        assert_eq!(human_duration(5 * 3600 + 60), "5h1m");
        assert_eq!(human_duration(3 * 86400), "3d");
    }
}
