//! Label and field selectors, as `kubectl -l` and `--field-selector` send them.

use serde_json::Value;

use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
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

fn set(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect())
}

impl Selector {
    /// Parses a label selector (`a=b,c!=d,e in (x,y),f notin (z),g,!h`).
    ///
    /// # Errors
    /// 400 naming the part that cannot be parsed.
    pub fn labels(s: &str) -> Result<Selector, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let bad = || {
                ApiError::bad_request(format!("unable to parse requirement {part:?} in labelSelector; use key=value, key!=value, key in (a,b), key notin (a,b), key or !key"))
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
        }
        Ok(Selector { reqs })
    }

    /// Parses a field selector (`metadata.name=x,involvedObject.uid!=y`); fields are dotted paths.
    ///
    /// # Errors
    /// 400 naming the part that cannot be parsed.
    pub fn fields(s: &str) -> Result<Selector, ApiError> {
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

    /// Whether the object's labels match.
    #[must_use]
    pub fn matches_labels(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.matches(get)
    }

    /// Whether the object's fields match (a missing field reads as empty).
    #[must_use]
    pub fn matches_fields(&self, obj: &Value) -> bool {
        let get = |k: &str| {
            let mut cur = obj;
            for seg in k.split('.') {
                cur = cur.get(seg)?;
            }
            cur.as_str()
        };
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k).unwrap_or("") == v,
            Req::Ne(k, v) => get(k).unwrap_or("") != v,
            _ => true,
        })
    }

    fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
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
    fn field_selector_dotted_paths() {
        let o = json!({"metadata": {"name": "a", "namespace": "ns"}, "involvedObject": {"uid": "u1"}});
        assert!(Selector::fields("metadata.name=a,involvedObject.uid=u1").unwrap().matches_fields(&o));
        assert!(!Selector::fields("metadata.namespace!=ns").unwrap().matches_fields(&o));
        assert!(Selector::fields("nonsense").is_err());
    }
}
