//! An account's scope: which VMs it sees. Namespaces (none: every namespace) and a label
//! selector on the VM's labels (none: every VM). A VM outside the scope does not exist for the
//! account: 404, exactly like a VM that does not exist, so a scope does not reveal what lies
//! outside it.
//!
//! The selector syntax is Kubernetes' equality- and set-based one: `k=v`, `k==v`, `k!=v`, `k`,
//! `!k`, `k in (a,b)`, `k notin (a,b)`, comma-separated (all must hold).

use std::collections::BTreeMap;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Selector {
    text: String,
    reqs: Vec<Req>,
}

/// Why a selector was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("cannot parse the label selector requirement {part:?}: use key=value, key!=value, key in (a,b), key notin (a,b), key or !key")]
pub struct SelectorError {
    pub part: String,
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= 317 && k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63 && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn parse_set(key: &str, rest: &str, part: &str) -> Result<(String, Vec<String>), SelectorError> {
    let err = || SelectorError { part: part.to_owned() };
    let inner = rest.trim().strip_prefix('(').and_then(|r| r.strip_suffix(')')).ok_or_else(err)?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_owned()).collect();
    if !valid_key(key) || values.iter().any(|v| v.is_empty() || !valid_value(v)) {
        return Err(err());
    }
    Ok((key.to_owned(), values))
}

fn parse_req(part: &str) -> Result<Req, SelectorError> {
    let err = || SelectorError { part: part.to_owned() };
    let p = part.trim();
    if let Some(k) = p.strip_prefix('!') {
        return if valid_key(k.trim()) { Ok(Req::NotExists(k.trim().to_owned())) } else { Err(err()) };
    }
    for (op, ne) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = p.split_once(op) {
            let (k, v) = (k.trim(), v.trim());
            if !valid_key(k) || !valid_value(v) {
                return Err(err());
            }
            return Ok(if ne { Req::Ne(k.to_owned(), v.to_owned()) } else { Req::Eq(k.to_owned(), v.to_owned()) });
        }
    }
    if let Some((k, rest)) = p.split_once(" notin ") {
        let (k, v) = parse_set(k.trim(), rest, part)?;
        return Ok(Req::NotIn(k, v));
    }
    if let Some((k, rest)) = p.split_once(" in ") {
        let (k, v) = parse_set(k.trim(), rest, part)?;
        return Ok(Req::In(k, v));
    }
    if valid_key(p) {
        Ok(Req::Exists(p.to_owned()))
    } else {
        Err(err())
    }
}

impl Selector {
    /// Parses a selector; the empty string selects everything.
    ///
    /// # Errors
    /// The requirement that does not parse.
    pub fn parse(s: &str) -> Result<Selector, SelectorError> {
        let text = s.trim().to_owned();
        if text.is_empty() {
            return Ok(Selector::default());
        }
        let reqs = split_top(&text).into_iter().map(parse_req).collect::<Result<Vec<_>, _>>()?;
        Ok(Selector { text, reqs })
    }

    /// Whether `labels` satisfy every requirement.
    #[must_use]
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::Ne(k, v) => labels.get(k) != Some(v),
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
            Req::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        })
    }

    /// The selector as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }
}

/// Which VMs an account sees.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Scope {
    /// Empty: every namespace.
    pub namespaces: Vec<String>,
    pub selector: Selector,
}

impl Scope {
    /// Whether the account sees a VM in `namespace` with `labels`.
    #[must_use]
    pub fn sees(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)) && self.selector.matches(labels)
    }

    /// Whether this scope is no wider than `other` (an account may only create or manage
    /// accounts that see no more than it does).
    #[must_use]
    pub fn within(&self, other: &Scope) -> bool {
        if other.is_unrestricted() {
            return true;
        }
        self == other
    }

    #[must_use]
    pub fn is_unrestricted(&self) -> bool {
        self.namespaces.is_empty() && self.selector.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        let l = labels(&[("env", "prod"), ("team", "metal")]);
        for (sel, want) in [
            ("", true),
            ("env=prod", true),
            ("env==prod", true),
            ("env!=prod", false),
            ("env in (dev, prod)", true),
            ("env notin (prod)", false),
            ("team", true),
            ("!team", false),
            ("env=prod,team=metal", true),
            ("env=prod,team=other", false),
            ("missing notin (x)", true),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        for bad in ["env in prod", "=x", "a=b c", "env in (a,)"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_scope_sees_only_its_namespaces_and_labels() {
        let s = Scope { namespaces: vec!["tenant-a".into()], selector: Selector::parse("bmc=yes").unwrap() };
        assert!(s.sees("tenant-a", &labels(&[("bmc", "yes")])));
        assert!(!s.sees("tenant-b", &labels(&[("bmc", "yes")])));
        assert!(!s.sees("tenant-a", &labels(&[])));
        assert!(Scope::default().sees("any", &labels(&[])));
        assert!(s.within(&Scope::default()));
        assert!(!Scope::default().within(&s));
    }
}
