//! Label and annotation rules, as Kubernetes' `ValidateLabels` and `ValidateAnnotations` apply
//! them on every write: keys are qualified names (an optional DNS subdomain prefix of at most
//! 253 characters and `/`, then a name of at most 63), label values at most 63 characters of the
//! same alphabet, and all annotations together at most [`MAX_ANNOTATIONS_BYTES`].
//!
//! Messages are apimachinery's, so tools that show them read as they do against a real cluster.

use serde_json::{Map, Value};

use api::validation::{Cause, CauseType};

use crate::limits::MAX_ANNOTATIONS_BYTES;
use crate::status::ApiError;

const NAME_MAX: usize = 63;
const PREFIX_MAX: usize = 253;
const VALUE_MAX: usize = 63;

const NAME_FMT: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an \
     alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is \
     '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const QUALIFIED_FMT: &str = "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
     with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is \
     '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
const PREFIX_FMT: &str = "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or \
     '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is \
     '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const VALUE_FMT: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and \
     must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for \
     validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, non-empty.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => f.is_ascii_alphanumeric() && l.is_ascii_alphanumeric() && b.iter().all(inner),
        _ => false,
    }
}

/// A lowercase RFC 1123 subdomain.
fn is_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// apimachinery's `IsQualifiedName`: every problem with `key`, as messages.
#[must_use]
pub fn qualified_name_errors(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                if prefix.len() > PREFIX_MAX {
                    errs.push(format!("prefix part must be no more than {PREFIX_MAX} characters"));
                }
                if !is_subdomain(prefix) {
                    errs.push(PREFIX_FMT.to_owned());
                }
            }
            *name
        }
        _ => return vec![QUALIFIED_FMT.to_owned()],
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else {
        if name.len() > NAME_MAX {
            errs.push(format!("name part must be no more than {NAME_MAX} characters"));
        }
        if !is_name_part(name) {
            errs.push(NAME_FMT.to_owned());
        }
    }
    errs
}

/// apimachinery's `IsValidLabelValue`.
#[must_use]
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > VALUE_MAX {
        errs.push(format!("must be no more than {VALUE_MAX} characters"));
    }
    if !value.is_empty() && !is_name_part(value) {
        errs.push(VALUE_FMT.to_owned());
    }
    errs
}

/// `Invalid value: "x": message`, as a field error reads.
fn invalid(field: &str, value: &str, msg: &str) -> Cause {
    let shown: String = value.chars().take(100).collect();
    Cause::new(CauseType::Invalid, field, format!("Invalid value: {shown:?}: {msg}"))
}

/// The map at `metadata.<field>`, which must be an object of strings.
fn string_map<'a>(obj: &'a Value, field: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
    match obj.get("metadata").and_then(|m| m.get(field)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => {
            if let Some((k, _)) = m.iter().find(|(_, v)| !v.is_string()) {
                return Err(ApiError::bad_request(format!("metadata.{field}[{k:?}] must be a string: quote the value")));
            }
            Ok(Some(m))
        }
        Some(_) => Err(ApiError::bad_request(format!("metadata.{field} must be an object of string keys and string values"))),
    }
}

/// Every violation of the label and annotation rules in `obj`'s metadata.
///
/// # Errors
/// 400 when labels or annotations are not maps of strings (Kubernetes cannot even decode
/// those); the rule violations are returned as causes for a 422.
pub fn causes(obj: &Value) -> Result<Vec<Cause>, ApiError> {
    let mut out = Vec::new();
    if let Some(labels) = string_map(obj, "labels")? {
        for (k, v) in labels {
            out.extend(qualified_name_errors(k).iter().map(|m| invalid("metadata.labels", k, m)));
            let v = v.as_str().unwrap_or_default();
            out.extend(label_value_errors(v).iter().map(|m| invalid("metadata.labels", v, m)));
        }
    }
    if let Some(annotations) = string_map(obj, "annotations")? {
        let mut total: usize = 0;
        for (k, v) in annotations {
            // As Kubernetes: the key rule is the qualified-name rule, case-insensitively.
            out.extend(qualified_name_errors(&k.to_ascii_lowercase()).iter().map(|m| invalid("metadata.annotations", k, m)));
            total = total.saturating_add(k.len()).saturating_add(v.as_str().map_or(0, str::len));
        }
        if total > MAX_ANNOTATIONS_BYTES {
            out.push(Cause::new(
                CauseType::TooLong,
                "metadata.annotations",
                format!("Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes (keys and values add up to {total})"),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qualified_names_follow_apimachinery() {
        for ok in ["app", "kubevirt.io/vm", "a.b-c_d", "example.com/My.Name", "A"] {
            assert!(qualified_name_errors(ok).is_empty(), "{ok}");
        }
        for bad in ["", "-a", "a-", "has space", "a/b/c", "/name", "Upper.Case/x", "x/", &"n".repeat(64)] {
            assert!(!qualified_name_errors(bad).is_empty(), "{bad:?}");
        }
        assert!(qualified_name_errors(&format!("{}/x", "a".repeat(254))).iter().any(|m| m.contains("no more than 253")));
    }

    #[test]
    fn label_values_may_be_empty_but_not_long_or_odd() {
        assert!(label_value_errors("").is_empty());
        assert!(label_value_errors("v1.2_3-x").is_empty());
        assert!(!label_value_errors("has space").is_empty());
        assert!(!label_value_errors(&"v".repeat(64)).is_empty());
    }

    #[test]
    fn annotations_over_256_kib_are_too_long_with_kubes_message() {
        let obj = json!({"metadata": {"annotations": {"a": "x".repeat(MAX_ANNOTATIONS_BYTES)}}});
        let c = causes(&obj).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].field, "metadata.annotations");
        assert_eq!(c[0].kind, "FieldValueTooLong");
        assert!(c[0].message.starts_with("Too long: must have at most 262144 bytes"), "{}", c[0].message);
        let at_limit = json!({"metadata": {"annotations": {"a": "x".repeat(MAX_ANNOTATIONS_BYTES - 1)}}});
        assert!(causes(&at_limit).unwrap().is_empty());
    }

    #[test]
    fn bad_keys_and_values_are_causes_and_non_strings_are_400() {
        let obj = json!({"metadata": {"labels": {"bad key": "ok", "ok": "bad value"}, "annotations": {"Upper/x": "v", "a b": "v"}}});
        let c = causes(&obj).unwrap();
        // "Upper/x" is fine for an annotation: its key rule ignores case.
        assert_eq!(c.len(), 3, "{c:?}");
        assert!(c.iter().all(|c| c.message.starts_with("Invalid value: ")));
        assert_eq!(causes(&json!({"metadata": {"labels": {"a": 1}}})).unwrap_err().code, 400);
        assert_eq!(causes(&json!({"metadata": {"annotations": []}})).unwrap_err().code, 400);
    }
}
