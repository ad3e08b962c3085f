//! The protocol layer (DSP0266 §7–8): what every response carries and what every request may
//! ask of a representation.
//!
//! - Headers: `OData-Version: 4.0` on every response; `Cache-Control: no-cache` (clients
//!   revalidate with the ETag); `Allow` on every response of a known URI; `Link: <schema>;
//!   rel=describedby` on GET and HEAD of a typed resource.
//! - ETags: strong, a digest of the resource's full representation — so it changes exactly when
//!   what the resource says changes, whatever in the backing objects moved — checked by
//!   `If-None-Match` on GET/HEAD (304) and `If-Match` on writes (412 PreconditionFailed).
//! - `OData-Version` other than 4.0 in a request: 412.
//! - Query parameters, as declared in `ProtocolFeaturesSupported`: `$select`, `$expand` (`*`,
//!   `.`, `~`, `$levels` up to [`MAX_EXPAND_LEVELS`]) and `only`. Any other parameter starting
//!   with `$` is 501; parameters without `$` are ignored.

use std::collections::BTreeSet;

use axum::body::Body;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::error::{allow_value, RfError};
use crate::uri::Uri;

/// Deepest `$expand=...($levels=N)` served.
pub const MAX_EXPAND_LEVELS: u32 = 3;

/// Which links `$expand` replaces by the resources they point to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expand {
    /// Links under `Links` (`~` and `*`).
    pub links: bool,
    /// Subordinate links, `Members` included (`.` and `*`).
    pub subordinate: bool,
    pub levels: u32,
}

/// The query of a GET.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// `$select`: property paths (`Status/Health` is `["Status", "Health"]`).
    pub select: Vec<Vec<String>>,
    pub expand: Option<Expand>,
    pub only: bool,
}

impl Query {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.select.is_empty() && self.expand.is_none() && !self.only
    }
}

/// Percent-decodes a query component (`+` is a space).
fn decode(s: &str) -> Result<String, ()> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3).ok_or(())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| ())?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| ())
}

fn parse_expand(v: &str) -> Result<Expand, RfError> {
    let bad = || RfError::query_format(v, "$expand");
    let (kind, opts) = match v.split_once('(') {
        Some((k, rest)) => (k, Some(rest.strip_suffix(')').ok_or_else(bad)?)),
        None => (v, None),
    };
    let (links, subordinate) = match kind {
        "*" => (true, true),
        "." => (false, true),
        "~" => (true, false),
        _ => return Err(bad()),
    };
    let levels = match opts {
        None => 1,
        Some(o) => {
            let n = o.strip_prefix("$levels=").ok_or_else(bad)?;
            let n: u32 = n.parse().map_err(|_| bad())?;
            if n == 0 || n > MAX_EXPAND_LEVELS {
                return Err(RfError::query_out_of_range(&n.to_string(), "$levels", &format!("1-{MAX_EXPAND_LEVELS}")));
            }
            n
        }
    };
    Ok(Expand { links, subordinate, levels })
}

/// Parses a request's query string.
///
/// # Errors
/// 501 for an unsupported `$` parameter; 400 for a malformed value.
pub fn parse_query(q: Option<&str>) -> Result<Query, RfError> {
    let mut out = Query::default();
    let Some(q) = q.filter(|q| !q.is_empty()) else { return Ok(out) };
    for part in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').map_or((part, None), |(k, v)| (k, Some(v)));
        let k = decode(k).map_err(|()| RfError::query_format(part, "query"))?;
        let v = v.map(decode).transpose().map_err(|()| RfError::query_format(part, &k))?;
        match (k.as_str(), v) {
            ("only", None) => out.only = true,
            ("only", Some(v)) => return Err(RfError::query_format(&v, "only")),
            ("$select", Some(v)) if !v.is_empty() => {
                for p in v.split(',') {
                    let path: Vec<String> = p.trim().split('/').map(str::to_owned).collect();
                    if path
                        .iter()
                        .any(|s| s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '@' || c == '.' || c == '_'))
                    {
                        return Err(RfError::query_format(&v, "$select"));
                    }
                    out.select.push(path);
                }
            }
            ("$expand", Some(v)) => out.expand = Some(parse_expand(&v)?),
            ("$select" | "$expand", _) => return Err(RfError::query_format("", &k)),
            (k, _) if k.starts_with('$') => return Err(RfError::query_unsupported(k)),
            // DSP0266: parameters without `$` that the service does not know are ignored.
            _ => {}
        }
    }
    if out.only && (out.expand.is_some() || !out.select.is_empty()) {
        return Err(RfError::query_combination());
    }
    Ok(out)
}

/// The strong ETag of a representation.
#[must_use]
pub fn etag(v: &Value) -> String {
    let d = Sha256::digest(v.to_string().as_bytes());
    let hex: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// The entity tags listed in an `If-Match`/`If-None-Match` header (`*` included as is).
fn tags(h: &HeaderMap, name: header::HeaderName) -> Option<Vec<String>> {
    let all: Vec<String> =
        h.get_all(name).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(|t| t.trim().to_owned()).collect();
    (!all.is_empty()).then_some(all)
}

/// `If-Match` (strong comparison, RFC 9110 §13.1.1): `Err(412)` when present and `current`
/// is not among its tags.
///
/// # Errors
/// PreconditionFailed.
pub fn check_if_match(h: &HeaderMap, current: &str) -> Result<(), RfError> {
    match tags(h, header::IF_MATCH) {
        Some(t) if !t.iter().any(|t| t == "*" || t == current) => Err(RfError::precondition_failed()),
        _ => Ok(()),
    }
}

/// Whether `If-None-Match` lists `current` (a GET then answers 304).
#[must_use]
pub fn none_match_hits(h: &HeaderMap, current: &str) -> bool {
    tags(h, header::IF_NONE_MATCH).is_some_and(|t| t.iter().any(|t| t == "*" || t.trim_start_matches("W/") == current))
}

/// `OData-Version` of a request: only 4.0 (or none).
///
/// # Errors
/// 412 naming the version.
pub fn check_odata_version(h: &HeaderMap) -> Result<(), RfError> {
    match h.get("odata-version").map(|v| v.to_str().unwrap_or("?").trim()) {
        None | Some("4.0") => Ok(()),
        Some(other) => Err(RfError::odata_version(other)),
    }
}

/// Keeps the selected properties of `v` (and every `@odata.*` annotation).
#[must_use]
pub fn select(v: &Value, paths: &[Vec<String>]) -> Value {
    let Value::Object(map) = v else { return v.clone() };
    let mut out = Map::new();
    for (k, val) in map {
        if k.starts_with("@odata.") {
            out.insert(k.clone(), val.clone());
            continue;
        }
        let here: Vec<&Vec<String>> = paths.iter().filter(|p| p.first() == Some(k)).collect();
        if here.is_empty() {
            continue;
        }
        if here.iter().any(|p| p.len() == 1) {
            out.insert(k.clone(), val.clone());
        } else {
            let sub: Vec<Vec<String>> = here.iter().map(|p| p[1..].to_vec()).collect();
            out.insert(k.clone(), select(val, &sub));
        }
    }
    Value::Object(out)
}

/// Replaces links by the resources they point to, per `e`; `fetch` renders a URI (a link it
/// cannot render stays a link).
pub fn expand(v: &mut Value, e: Expand, under_links: bool, fetch: &mut dyn FnMut(&str) -> Option<Value>) {
    if e.levels == 0 {
        return;
    }
    match v {
        Value::Object(map) => {
            if map.len() == 1 {
                if let Some(Value::String(target)) = map.get("@odata.id") {
                    let wanted = if under_links { e.links } else { e.subordinate };
                    if wanted {
                        if let Some(mut got) = fetch(target) {
                            expand(&mut got, Expand { levels: e.levels - 1, ..e }, false, fetch);
                            *v = got;
                        }
                    }
                    return;
                }
            }
            for (k, child) in map.iter_mut() {
                if k.starts_with('@') || k == "Actions" {
                    continue;
                }
                expand(child, e, under_links || k == "Links", fetch);
            }
        }
        Value::Array(items) => {
            for i in items {
                expand(i, e, under_links, fetch);
            }
        }
        _ => {}
    }
}

/// The `Link` header's target: the JSON Schema of the representation's `@odata.type`.
#[must_use]
pub fn described_by(v: &Value) -> Option<String> {
    let t = v.get("@odata.type")?.as_str()?.trim_start_matches('#');
    // `#ComputerSystem.v1_27_0.ComputerSystem` -> `ComputerSystem.v1_27_0`;
    // `#ComputerSystemCollection.ComputerSystemCollection` -> `ComputerSystemCollection`.
    let parts: Vec<&str> = t.split('.').collect();
    let schema = match parts.as_slice() {
        [ns, ver, _] => format!("{ns}.{ver}"),
        [ns, _] => (*ns).to_owned(),
        _ => return None,
    };
    Some(format!("<https://redfish.dmtf.org/schemas/v1/{schema}.json>; rel=describedby"))
}

/// A JSON response.
#[must_use]
pub fn json(status: StatusCode, v: &Value) -> http::Response<Body> {
    let mut r = http::Response::new(Body::from(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json;charset=utf-8"));
    r
}

/// An empty response.
#[must_use]
pub fn empty(status: StatusCode) -> http::Response<Body> {
    let mut r = http::Response::new(Body::empty());
    *r.status_mut() = status;
    r
}

/// Adds what every response carries; `Allow` for a known URI.
pub fn finish(resp: &mut http::Response<Body>, uri: Option<&Uri>) {
    let h = resp.headers_mut();
    h.insert("odata-version", HeaderValue::from_static("4.0"));
    h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-cache"));
    if let Some(u) = uri {
        if let Ok(v) = HeaderValue::from_str(&allow_value(u.allowed())) {
            h.entry(header::ALLOW).or_insert(v);
        }
    }
}

/// The methods known to the service; any other is 501.
#[must_use]
pub fn known_method(m: &Method) -> bool {
    [Method::GET, Method::HEAD, Method::POST, Method::PATCH, Method::PUT, Method::DELETE, Method::OPTIONS].contains(m)
}

/// Properties of a PATCH body without its `@odata.*` annotations (which a client may echo and
/// which change nothing).
#[must_use]
pub fn writable_part(body: &Map<String, Value>) -> BTreeSet<String> {
    body.keys().filter(|k| !k.starts_with("@odata.")).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn queries_parse_as_declared() {
        assert_eq!(parse_query(None).unwrap(), Query::default());
        assert!(parse_query(Some("rpvunknown")).unwrap().is_empty(), "no $: ignored");
        assert_eq!(parse_query(Some("$rpvunknown")).unwrap_err().status, StatusCode::NOT_IMPLEMENTED);
        assert_eq!(parse_query(Some("$filter=Name%20eq%20x")).unwrap_err().status, StatusCode::NOT_IMPLEMENTED);
        assert_eq!(parse_query(Some("only=foo")).unwrap_err().status, StatusCode::BAD_REQUEST);
        assert!(parse_query(Some("only")).unwrap().only);
        let q = parse_query(Some("%24expand=.%28%24levels%3D2%29&$select=Name,Status/Health")).unwrap();
        assert_eq!(q.expand, Some(Expand { links: false, subordinate: true, levels: 2 }));
        assert_eq!(q.select, vec![vec!["Name".to_owned()], vec!["Status".to_owned(), "Health".to_owned()]]);
        assert_eq!(parse_query(Some("$expand=*($levels=9)")).unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(parse_query(Some("only&$expand=*")).unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn select_keeps_annotations_and_the_listed_paths() {
        let v = json!({"@odata.id": "/x", "Id": "1", "Name": "n", "Status": {"State": "Enabled", "Health": "OK"}});
        let s = select(&v, &[vec!["Status".into(), "Health".into()]]);
        assert_eq!(s, json!({"@odata.id": "/x", "Status": {"Health": "OK"}}));
    }

    #[test]
    fn expand_follows_the_requested_kind_of_link() {
        let mut v = json!({"Members": [{"@odata.id": "/a"}], "Links": {"ManagedBy": [{"@odata.id": "/m"}]}});
        let mut fetch = |u: &str| Some(json!({"@odata.id": u, "Got": true}));
        expand(&mut v, Expand { links: false, subordinate: true, levels: 1 }, false, &mut fetch);
        assert_eq!(v["Members"][0]["Got"], true);
        assert!(v["Links"]["ManagedBy"][0].get("Got").is_none());
    }

    #[test]
    fn etags_follow_the_content_and_if_match_compares_strongly() {
        let a = etag(&json!({"PowerState": "On"}));
        assert_eq!(a, etag(&json!({"PowerState": "On"})));
        assert_ne!(a, etag(&json!({"PowerState": "Off"})));
        let mut h = HeaderMap::new();
        h.insert(header::IF_MATCH, HeaderValue::from_str(&format!("{a}foobar")).unwrap());
        assert_eq!(check_if_match(&h, &a).unwrap_err().status, StatusCode::PRECONDITION_FAILED);
        h.insert(header::IF_MATCH, HeaderValue::from_str(&a).unwrap());
        assert!(check_if_match(&h, &a).is_ok());
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_str(&a).unwrap());
        assert!(none_match_hits(&h, &a));
    }

    #[test]
    fn the_link_header_names_the_versioned_schema() {
        assert_eq!(
            described_by(&json!({"@odata.type": "#ComputerSystem.v1_27_0.ComputerSystem"})).unwrap(),
            "<https://redfish.dmtf.org/schemas/v1/ComputerSystem.v1_27_0.json>; rel=describedby"
        );
        assert!(described_by(&json!({"@odata.type": "#ComputerSystemCollection.ComputerSystemCollection"}))
            .unwrap()
            .contains("/ComputerSystemCollection.json"));
    }
}
