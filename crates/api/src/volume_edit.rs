//! The edits of KubeVirt's `addvolume` / `removevolume`, on an instance spec as JSON (a VM's
//! `spec.template.spec` or a VMI's `spec`), shared by the API server's subresources and the
//! controller's legacy `status.volumeRequests` path so both refuse and apply alike.
//!
//! As KubeVirt: a volume name or claim already in use is refused; adding to an empty CD-ROM
//! drive inserts a medium (the drive stays, no new disk); removing an unknown or
//! non-hot-pluggable volume is refused; removing a CD-ROM medium keeps the empty drive (eject).

use serde_json::{json, Value};

/// Why an edit was refused (KubeVirt's messages; the API answers them with 409).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EditRefused(pub String);

/// The claim or DataVolume a volume names.
#[must_use]
pub fn source_name(volume: &Value) -> Option<&str> {
    volume.pointer("/persistentVolumeClaim/claimName").or_else(|| volume.pointer("/dataVolume/name")).and_then(Value::as_str)
}

/// Whether the volume is a hot-pluggable PVC or DataVolume.
#[must_use]
pub fn is_hotplug(volume: &Value) -> bool {
    volume.pointer("/persistentVolumeClaim/hotpluggable") == Some(&Value::Bool(true))
        || volume.pointer("/dataVolume/hotpluggable") == Some(&Value::Bool(true))
}

fn name_of(v: &Value) -> Option<&str> {
    v.get("name").and_then(Value::as_str)
}

/// Adds `volume` and its `disk` (both named `name`) to `spec`.
///
/// # Errors
/// When the name or the source is already used, or a non-CD-ROM disk has the name.
pub fn add(spec: &mut Value, name: &str, disk: &Value, volume: &Value) -> Result<(), EditRefused> {
    let volumes = spec.pointer("/volumes").and_then(Value::as_array).cloned().unwrap_or_default();
    if volumes.iter().any(|v| name_of(v) == Some(name)) {
        return Err(EditRefused(format!("Unable to add volume [{name}] because volume with that name already exists")));
    }
    if let Some(src) = source_name(volume) {
        if volumes.iter().any(|v| source_name(v) == Some(src)) {
            return Err(EditRefused(format!("Unable to add volume source [{src}] because it already exists")));
        }
    }
    let disks = spec.pointer("/domain/devices/disks").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut new_disks = disks.clone();
    match disks.iter().find(|d| name_of(d) == Some(name)) {
        // An empty CD-ROM drive gets a medium: the drive is already there.
        Some(d) if d.get("cdrom").is_some() => {}
        Some(_) => return Err(EditRefused(format!("Unable to add volume [{name}] because a disk with that name already exists"))),
        None => new_disks.push(disk.clone()),
    }
    let mut new_volumes = volumes;
    new_volumes.push(volume.clone());
    spec["volumes"] = Value::Array(new_volumes);
    if spec.get("domain").is_none() {
        spec["domain"] = json!({});
    }
    if spec["domain"].get("devices").is_none() {
        spec["domain"]["devices"] = json!({});
    }
    spec["domain"]["devices"]["disks"] = Value::Array(new_disks);
    Ok(())
}

/// Removes the hot-plug volume named `name` (or whose claim is `name`) and its disk, keeping an
/// emptied CD-ROM drive. Returns the removed volume's name.
///
/// # Errors
/// When no such volume exists or it is not hot-pluggable.
pub fn remove(spec: &mut Value, name: &str) -> Result<String, EditRefused> {
    let volumes = spec.pointer("/volumes").and_then(Value::as_array).cloned().unwrap_or_default();
    let Some(v) = volumes.iter().find(|v| name_of(v) == Some(name) || source_name(v) == Some(name)) else {
        return Err(EditRefused(format!("Unable to remove volume [{name}] because it does not exist")));
    };
    if !is_hotplug(v) {
        return Err(EditRefused(format!("Unable to remove volume [{name}] because it is not hotpluggable")));
    }
    let vname = name_of(v).unwrap_or_default().to_owned();
    spec["volumes"] = Value::Array(volumes.iter().filter(|x| name_of(x) != Some(vname.as_str())).cloned().collect());
    if let Some(disks) = spec.pointer("/domain/devices/disks").and_then(Value::as_array).cloned() {
        let kept: Vec<Value> = disks.into_iter().filter(|d| name_of(d) != Some(vname.as_str()) || d.get("cdrom").is_some()).collect();
        spec["domain"]["devices"]["disks"] = Value::Array(kept);
    }
    Ok(vname)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Value {
        json!({"domain": {"devices": {"disks": [{"name": "root"}, {"name": "cd", "cdrom": {"bus": "sata"}}]}},
               "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "root"}}]})
    }

    #[test]
    fn add_then_remove_round_trips_and_a_medium_keeps_its_drive() {
        let mut s = spec();
        let hp = |c: &str| json!({"name": c, "persistentVolumeClaim": {"claimName": c, "hotpluggable": true}});
        add(&mut s, "data", &json!({"name": "data", "disk": {"bus": "scsi"}}), &hp("data")).unwrap();
        add(&mut s, "cd", &json!({"name": "cd", "cdrom": {"bus": "scsi"}}), &hp("cd")).unwrap();
        assert_eq!(s["domain"]["devices"]["disks"].as_array().unwrap().len(), 3, "the medium went into the existing drive");
        assert_eq!(remove(&mut s, "cd").unwrap(), "cd");
        assert_eq!(remove(&mut s, "data").unwrap(), "data");
        assert_eq!(s, spec());
    }

    #[test]
    fn refusals_carry_kubevirts_messages() {
        let mut s = spec();
        let v = json!({"name": "x", "persistentVolumeClaim": {"claimName": "root", "hotpluggable": true}});
        assert_eq!(
            add(&mut s, "x", &json!({"name": "x"}), &v).unwrap_err().0,
            "Unable to add volume source [root] because it already exists"
        );
        assert_eq!(remove(&mut s, "root").unwrap_err().0, "Unable to remove volume [root] because it is not hotpluggable");
        assert_eq!(remove(&mut s, "nope").unwrap_err().0, "Unable to remove volume [nope] because it does not exist");
        assert_eq!(s, spec(), "a refused edit changes nothing");
    }
}
