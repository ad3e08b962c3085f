//! Events: core/v1 `Event` (the fields its field selectors may name, kube-apiserver's
//! `EventToSelectableFields`) and `events.k8s.io/v1` `Event` (its validation).

/// The fields a core/v1 Event field selector may name.
pub const FIELD_LABELS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// The fields an `events.k8s.io/v1` Event field selector may name.
pub const V1_FIELD_LABELS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

/// Longest `note` (kube-apiserver's `NoteLengthLimit`).
pub const NOTE_LIMIT: usize = 1024;

/// Validates an `events.k8s.io/v1` Event as `ValidateEventCreate` does: `eventTime`,
/// `reportingController`, `reportingInstance`, `action` and `reason` are required (the last
/// three at most 128 characters), `note` at most 1 KiB, `type` Normal or Warning.
///
/// It is served beside core/v1 Event, not as another view of the same objects: an Event
/// written through one API is not listed by the other (kube-apiserver converts between them).
#[must_use]
pub fn validate_v1(obj: &serde_json::Value) -> Vec<api::validation::Cause> {
    use api::validation::{Cause, CauseType};
    let mut causes = super::typed_causes::<k8s_openapi::api::events::v1::Event>(obj);
    if !causes.is_empty() {
        return causes;
    }
    let text = |f: &str| obj.get(f).and_then(serde_json::Value::as_str).unwrap_or_default();
    if obj.get("eventTime").is_none_or(serde_json::Value::is_null) {
        causes.push(Cause::new(CauseType::Required, "eventTime", "the time the event happened (RFC 3339 with microseconds)"));
    }
    for (field, what) in [
        ("reportingController", "the controller that emitted it (e.g. virtplug.io/controller)"),
        ("reportingInstance", "the instance of the controller (e.g. its pod or host name)"),
        ("action", "what was done (e.g. Binding)"),
        ("reason", "why (e.g. Scheduled)"),
    ] {
        let v = text(field);
        if v.is_empty() {
            causes.push(Cause::new(CauseType::Required, field, what));
        } else if field != "reportingController" && v.len() > 128 {
            causes.push(Cause::new(CauseType::TooLong, field, "must have at most 128 characters"));
        }
    }
    if text("note").len() > NOTE_LIMIT {
        causes.push(Cause::new(CauseType::TooLong, "note", format!("must have at most {NOTE_LIMIT} bytes")));
    }
    if !matches!(text("type"), "Normal" | "Warning") {
        causes.push(Cause::new(CauseType::NotSupported, "type", "supported values: \"Normal\", \"Warning\""));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_v1_event_names_who_did_what() {
        let ok = json!({"eventTime": "2026-12-01T10:00:00.000000Z", "reportingController": "virtplug.io/controller", "reportingInstance": "h1",
                        "action": "Started", "reason": "Started", "type": "Normal", "note": "hi", "regarding": {"kind": "VirtualMachine", "name": "vm"}});
        assert!(validate_v1(&ok).is_empty(), "{:?}", validate_v1(&ok));
        let f: Vec<String> = validate_v1(&json!({"type": "Bad"})).into_iter().map(|c| c.field).collect();
        assert_eq!(f, ["eventTime", "reportingController", "reportingInstance", "action", "reason", "type"]);
    }
}
