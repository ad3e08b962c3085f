//! core/v1 `Event`: the fields its field selectors may name (kube-apiserver's
//! `EventToSelectableFields`).

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
