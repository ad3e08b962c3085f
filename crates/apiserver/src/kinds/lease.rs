//! `coordination.k8s.io/v1` `Lease`: leader election's record (`holderIdentity`, `renewTime`,
//! `leaseDurationSeconds`, `leaseTransitions`). Writers compare and swap on resourceVersion;
//! the server checks the fields' types and ranges.

use serde_json::Value;

use api::validation::{Cause, CauseType};

/// Validates a Lease (`ValidateLeaseSpec`).
#[must_use]
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut causes = super::typed_causes::<k8s_openapi::api::coordination::v1::Lease>(obj);
    if !causes.is_empty() {
        return causes;
    }
    let int = |f: &str| obj.pointer(&format!("/spec/{f}")).and_then(Value::as_i64);
    if int("leaseDurationSeconds").is_some_and(|d| d <= 0) {
        causes.push(Cause::new(CauseType::Invalid, "spec.leaseDurationSeconds", "must be greater than 0"));
    }
    if int("leaseTransitions").is_some_and(|t| t < 0) {
        causes.push(Cause::new(CauseType::Invalid, "spec.leaseTransitions", "must be greater than or equal to 0"));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations_and_transitions_are_checked() {
        let ok = json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "2026-12-01T10:00:00.000000Z", "leaseTransitions": 0}});
        assert!(validate(&ok).is_empty(), "{:?}", validate(&ok));
        let bad = json!({"spec": {"leaseDurationSeconds": 0, "leaseTransitions": -1}});
        let f: Vec<String> = validate(&bad).into_iter().map(|c| c.field).collect();
        assert_eq!(f, ["spec.leaseDurationSeconds", "spec.leaseTransitions"]);
        assert_eq!(validate(&json!({"spec": {"renewTime": "yesterday"}}))[0].field, "spec.renewTime");
    }
}
