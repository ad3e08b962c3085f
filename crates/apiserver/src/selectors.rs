//! Label and field selectors, as `kubectl -l` and `--field-selector` send them.
//!
//! A selector is at most [`MAX_SELECTOR_BYTES`] long; label selectors follow apimachinery's
//! rules for keys and values (400 otherwise), and `in`/`notin` sets are looked up, not scanned,
//! so matching costs the same for a set of 2 or 10,000 values.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::labels;
use crate::limits::MAX_SELECTOR_BYTES;
use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    reqs: Vec<Req>,
}

fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().map(str::trim).filter(|p| !p.is_empty()).collect()
}

fn set(s: &str) -> Option<BTreeSet<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    let values: BTreeSet<String> = inner.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect();
    // As apimachinery: "for 'in', 'notin' operators, values set can't be empty".
    (!values.is_empty()).then_some(values)
}

fn check_length(s: &str, what: &str) -> Result<(), ApiError> {
    if s.len() > MAX_SELECTOR_BYTES {
        return Err(ApiError::bad_request(format!(
            "the {what} is {} bytes long, more than the {MAX_SELECTOR_BYTES} bytes a selector may have",
            s.len()
        )));
    }
    Ok(())
}

impl Req {
    fn key_and_values(&self) -> (&str, Vec<&str>) {
        match self {
            Req::Eq(k, v) | Req::Ne(k, v) => (k, vec![v.as_str()]),
            Req::In(k, vs) | Req::NotIn(k, vs) => (k, vs.iter().map(String::as_str).collect()),
            Req::Exists(k) | Req::NotExists(k) => (k, Vec::new()),
        }
    }
}

/// apimachinery's checks on a parsed label requirement.
fn check_label_req(part: &str, req: &Req) -> Result<(), ApiError> {
    let (key, values) = req.key_and_values();
    let problems: Vec<String> = labels::qualified_name_errors(key)
        .into_iter()
        .map(|m| format!("key {key:?}: {m}"))
        .chain(values.iter().flat_map(|v| labels::label_value_errors(v).into_iter().map(move |m| format!("value {v:?}: {m}"))))
        .collect();
    match problems.first() {
        None => Ok(()),
        Some(p) => Err(ApiError::bad_request(format!("unable to parse requirement {part:?} in labelSelector: {p}"))),
    }
}

impl Selector {
    /// Parses a label selector (`a=b,c!=d,e in (x,y),f notin (z),g,!h`).
    ///
    /// # Errors
    /// 400 naming the part that cannot be parsed.
    pub fn labels(s: &str) -> Result<Selector, ApiError> {
        check_length(s, "labelSelector")?;
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let bad = || {
                ApiError::bad_request(format!(
                    "unable to parse requirement {part:?} in labelSelector; use key=value, key!=value, key in (a,b), key notin (a,b), key or !key"
                ))
            };
            if let Some(k) = part.strip_prefix('!') {
                reqs.push(Req::NotExists(k.trim().to_owned()));
            } else if let Some((k, v)) = part.split_once(" notin ") {
                reqs.push(Req::NotIn(k.trim().to_owned(), set(v).ok_or_else(bad)?));
            } else if let Some((k, v)) = part.split_once(" in ") {
                reqs.push(Req::In(k.trim().to_owned(), set(v).ok_or_else(bad)?));
            } else if let Some((k, v)) = part.split_once("!=") {
                reqs.push(Req::Ne(k.trim().to_owned(), v.trim().to_owned()));
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                reqs.push(Req::Eq(k.trim().to_owned(), v.trim().to_owned()));
            } else if part.contains(char::is_whitespace) {
                return Err(bad());
            } else {
                reqs.push(Req::Exists(part.to_owned()));
            }
            if let Some(req) = reqs.last() {
                check_label_req(part, req)?;
            }
        }
        Ok(Selector { reqs })
    }

    /// Parses a field selector (`metadata.name=x,involvedObject.uid!=y`); fields are dotted paths.
    ///
    /// # Errors
    /// 400 naming the part that cannot be parsed.
    pub fn fields(s: &str) -> Result<Selector, ApiError> {
        check_length(s, "fieldSelector")?;
        let mut reqs = Vec::new();
        for part in split_top(s) {
            if let Some((k, v)) = part.split_once("!=") {
                reqs.push(Req::Ne(k.trim().to_owned(), v.trim().to_owned()));
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                reqs.push(Req::Eq(k.trim().to_owned(), v.trim().to_owned()));
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector {part:?}: use field=value or field!=value (e.g. metadata.name=my-vm)"
                )));
            }
        }
        Ok(Selector { reqs })
    }

    /// Whether this is the empty selector (it matches everything).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether a stored object matches both selectors, parsing only what they need: nothing
    /// for empty selectors, else the labels and the fields' paths ([`crate::store::Doc::project`]).
    #[must_use]
    pub fn doc_matches(labels: &Selector, fields: &Selector, doc: &crate::store::Doc) -> bool {
        if labels.is_empty() && fields.is_empty() {
            return true;
        }
        // Only what the selectors look at is parsed (a watch checks every event, a list every
        // object): the labels, and each field's path.
        let paths: Vec<&str> = (!labels.is_empty()).then_some("metadata.labels").into_iter().chain(fields.keys()).collect();
        let obj = doc.project(&paths);
        labels.matches_labels(&obj) && fields.matches_fields(&obj)
    }

    /// Whether the object's labels match.
    #[must_use]
    pub fn matches_labels(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.matches(get)
    }

    /// Whether the object's fields match. A field reads as kube-apiserver's field set has it: a
    /// boolean as `true`/`false` (missing: `false`, Go's zero value), anything else missing as
    /// empty.
    #[must_use]
    pub fn matches_fields(&self, obj: &Value) -> bool {
        let get = |k: &str| -> std::borrow::Cow<'_, str> {
            let mut cur = obj;
            for seg in k.split('.') {
                match cur.get(seg) {
                    Some(next) => cur = next,
                    None if BOOL_FIELDS.contains(&k) => return "false".into(),
                    None => return "".into(),
                }
            }
            match cur {
                Value::String(s) => s.as_str().into(),
                Value::Bool(b) => b.to_string().into(),
                Value::Number(n) => n.to_string().into(),
                _ => "".into(),
            }
        };
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == v.as_str(),
            Req::Ne(k, v) => get(k) != v.as_str(),
            _ => true,
        })
    }

    /// The fields the selector names.
    /// Removes the requirements `key=value` (equality only) and returns their values, for a
    /// caller that checks them without parsing the object ([`Selection`]). What is left matches
    /// exactly what the whole did, together with them.
    fn take_equal(&mut self, key: &str) -> Vec<String> {
        let mut taken = Vec::new();
        self.reqs.retain(|r| match r {
            Req::Eq(k, v) if k == key => {
                taken.push(v.clone());
                false
            }
            _ => true,
        });
        taken
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.reqs.iter().map(|r| r.key_and_values().0)
    }

    fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Selectable fields that are booleans in Go (a missing one is `false`).
const BOOL_FIELDS: [&str; 2] = ["spec.hostNetwork", "spec.unschedulable"];

/// What a list, a watch or a collection delete selects: its label selector, and its field
/// selector with `metadata.name=` checked on the store key (which ends in `/NAME`; names hold no
/// `/`) instead of on the object. Listing or watching one object by name (kube-rs's
/// `watch_object`, `kubectl get -w NAME`, `kubectl wait`) parses no object; other requirements
/// read a projection of it ([`Selector::doc_matches`]).
#[derive(Clone, Debug)]
pub struct Selection {
    /// Names the object must have: the URL's, and each `metadata.name=` of the field selector.
    names: Vec<String>,
    labels: Selector,
    fields: Selector,
}

impl Selection {
    /// The selection of `labels` and `fields`, and of the object `name` (a watch's URL) if given.
    #[must_use]
    pub fn new(name: Option<&str>, labels: &Selector, fields: &Selector) -> Selection {
        let mut fields = fields.clone();
        let names = name.map(str::to_owned).into_iter().chain(fields.take_equal("metadata.name")).collect();
        Selection { names, labels: labels.clone(), fields }
    }

    /// Whether the object stored under `key` is selected.
    #[must_use]
    pub fn matches(&self, key: &str, doc: &crate::store::Doc) -> bool {
        let name = key.rsplit('/').next().unwrap_or(key);
        self.names.iter().all(|want| want == name) && Selector::doc_matches(&self.labels, &self.fields, doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_forms() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "db"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=db", true),
            ("app!=web", false),
            ("tier in (db, cache)", true),
            ("tier notin (db)", false),
            ("app", true),
            ("!missing", true),
            ("!app", false),
            ("missing notin (x)", true),
        ] {
            assert_eq!(Selector::labels(sel).unwrap().matches_labels(&o), want, "{sel}");
        }
        assert!(Selector::labels("a in x").is_err());
    }

    #[test]
    fn label_selectors_follow_apimachinerys_rules_and_have_a_length_limit() {
        for bad in ["bad key=x", "app=has space", "a in ()", "a/b/c", &format!("app={}", "v".repeat(64))] {
            let e = Selector::labels(bad).unwrap_err();
            assert_eq!(e.code, 400, "{bad}");
        }
        assert!(Selector::labels("kubevirt.io/vm=my-vm,!x.io/y").is_ok());
        let long = format!("a in ({})", vec!["v"; MAX_SELECTOR_BYTES].join(","));
        assert!(Selector::labels(&long).unwrap_err().message.contains("bytes a selector may have"));
        assert!(Selector::fields(&"a".repeat(MAX_SELECTOR_BYTES + 1)).is_err());
    }

    #[test]
    fn large_sets_match_by_lookup() {
        let values: Vec<String> = (0..10_000).map(|i| format!("v{i}")).collect();
        let sel = Selector::labels(&format!("app in ({})", values.join(","))).unwrap();
        assert!(sel.matches_labels(&json!({"metadata": {"labels": {"app": "v9999"}}})));
        assert!(!sel.matches_labels(&json!({"metadata": {"labels": {"app": "w"}}})));
    }

    #[test]
    fn a_stored_object_matches_on_its_projection_as_on_the_whole_object() {
        let o = json!({
            "metadata": {"name": "a", "namespace": "ns", "labels": {"app": "web"}, "managedFields": [{"manager": "m"}]},
            "spec": {"nodeName": "n1", "unschedulable": true, "replicas": 3},
            "status": {"phase": "Running"}
        });
        let doc = crate::store::Doc::new(&o);
        for (labels, fields) in [
            ("", ""),
            ("app=web", ""),
            ("app=db", ""),
            ("!app", ""),
            ("", "metadata.name=a,metadata.namespace=ns"),
            ("", "metadata.name=b"),
            ("app=web", "spec.nodeName=n1,status.phase!=Failed"),
            ("", "spec.unschedulable=true,spec.hostNetwork=false"),
            ("", "spec.replicas=3,spec.missing="),
            ("", "status.phase.deeper="),
            ("app in (web,db)", "spec.nodeName!=n1"),
        ] {
            let (l, f) = (Selector::labels(labels).unwrap(), Selector::fields(fields).unwrap());
            let whole = l.matches_labels(&o) && f.matches_fields(&o);
            assert_eq!(Selector::doc_matches(&l, &f, &doc), whole, "{labels:?} {fields:?}");
        }
    }

    #[test]
    fn field_selector_dotted_paths() {
        let o = json!({"metadata": {"name": "a", "namespace": "ns"}, "involvedObject": {"uid": "u1"}});
        assert!(Selector::fields("metadata.name=a,involvedObject.uid=u1").unwrap().matches_fields(&o));
        assert!(!Selector::fields("metadata.namespace!=ns").unwrap().matches_fields(&o));
        assert!(Selector::fields("nonsense").is_err());
    }
}
