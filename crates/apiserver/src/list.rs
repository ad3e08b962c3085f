//! Lists: selectors, pages with `continue` tokens, and `resourceVersion` as kube-apiserver
//! answers it.
//!
//! # Continue tokens
//! A token is kube-apiserver's (base64url of `{"v":"meta.k8s.io/v1","rv":N,"start":KEY}`, with
//! KEY relative to the list's key prefix, so it cannot name anything outside the list) plus the
//! prefix it was issued for. A token that does not decode, names another version, an empty or
//! unclean start key, another list (resource or namespace), revision 0 or a revision the store
//! has not reached is 400 BadRequest (`invalid continue token: continue key is not valid: ...`);
//! one older than the watch window is 410 Expired. A token is never silently ignored or
//! reinterpreted, so no item is skipped or repeated because of one.
//!
//! # resourceVersion
//! Empty: the current state. `0`: any state (the current one). `N` (NotOlderThan): at least N;
//! when the store has not reached N the list waits up to [`FRESHNESS_WAIT`] for it, then answers
//! 504 "Too large resource version" (kube-apiserver's watch cache does the same). `Exact`: N only
//! (410 once the store has moved past N, since lists are served from the current state).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};

use crate::limits::FRESHNESS_WAIT;
use crate::objects::Objects;
use crate::query::{ListOptions, RvMatch};
use crate::registry::ResourceDef;
use crate::selectors::Selection;
use crate::status::ApiError;
use crate::store::Doc;
use crate::{table, watch};

/// The only token version issued and accepted.
const TOKEN_VERSION: &str = "meta.k8s.io/v1";

#[derive(serde::Serialize, serde::Deserialize)]
struct Token {
    v: String,
    rv: u64,
    /// The last key returned, relative to `prefix`; the next page starts after it.
    start: String,
    prefix: String,
}

/// A decoded continue token.
#[derive(Debug, PartialEq, Eq)]
pub struct Continue {
    /// The revision of the first page.
    pub rv: u64,
    /// The full store key after which the next page starts.
    pub after: String,
}

/// The token for the page after `last_key` of the list of `prefix` at revision `rv`.
#[must_use]
pub fn encode(prefix: &str, rv: u64, last_key: &str) -> String {
    let start = last_key.strip_prefix(prefix).unwrap_or(last_key).to_owned();
    let token = Token { v: TOKEN_VERSION.to_owned(), rv, start, prefix: prefix.to_owned() };
    // Serialising a struct of strings and a number cannot fail.
    let json = serde_json::to_vec(&token).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// Decodes and checks a token for the list of `prefix` on a store at `revision` whose oldest
/// kept revision is `oldest`.
///
/// # Errors
/// 400 for a token that is not one this list issued (see the module docs); 410 when it is older
/// than the store keeps.
pub fn decode(token: &str, prefix: &str, revision: u64, oldest: u64) -> Result<Continue, ApiError> {
    let invalid = |why: String| {
        ApiError::bad_request(format!("invalid continue token: continue key is not valid: {why}; start the list again without continue"))
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|e| invalid(e.to_string()))?;
    let t: Token = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if t.v != TOKEN_VERSION {
        return Err(invalid("server does not recognize this encoded version".to_owned()));
    }
    if t.rv == 0 {
        return Err(invalid(format!("incorrect encoded start resourceVersion (version {TOKEN_VERSION})")));
    }
    if t.start.is_empty() {
        return Err(invalid(format!("encoded start key empty (version {TOKEN_VERSION})")));
    }
    // A relative key is a name or NAMESPACE/NAME: nothing that could climb out of the prefix.
    let segments: Vec<&str> = t.start.split('/').collect();
    if segments.len() > 2 || segments.iter().any(|s| s.is_empty() || *s == "." || *s == "..") {
        return Err(invalid(format!("encoded start key {:?} is not a key of this list", t.start)));
    }
    if t.prefix != prefix {
        return Err(invalid(format!("it was issued for the list of {:?}, not of {prefix:?}", t.prefix)));
    }
    if t.rv > revision {
        return Err(invalid(format!("its resourceVersion {} is newer than the store's {revision}", t.rv)));
    }
    if t.rv < oldest {
        return Err(ApiError::expired(t.rv, oldest).with_message(
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
        ));
    }
    Ok(Continue { rv: t.rv, after: format!("{prefix}{}", t.start) })
}

/// Serves a list (JSON or Table).
///
/// # Errors
/// 400/410 for a bad continue token, 504 for a resourceVersion the store does not reach in
/// time, 410 for an `Exact` resourceVersion that is gone.
pub async fn serve(objects: &Objects, def: &ResourceDef, ns: Option<&str>, opts: &ListOptions, accept: &str) -> Result<Response, ApiError> {
    let prefix = def.prefix(ns);
    let cont = match &opts.continue_token {
        Some(c) => Some(decode(c, &prefix, objects.store.revision(), objects.store.oldest())?),
        None => None,
    };
    if let Some(rv) = opts.resource_version.filter(|rv| *rv > 0) {
        watch::wait_for_revision(&objects.store, rv, FRESHNESS_WAIT).await?;
    }
    let after = cont.as_ref().map(|c| c.after.as_str());
    let unselected = opts.labels.is_empty() && opts.fields.is_empty();
    // A page without selectors copies out only its items and the next one (which says whether
    // there is a next page); a selector must look further.
    let max = opts.limit.filter(|_| unselected).map_or(usize::MAX, |limit| limit.saturating_add(1));
    let (current_rv, items, total) = objects.list_page(def, ns, after, max);
    if let (Some(rv), Some(RvMatch::Exact)) = (opts.resource_version, opts.rv_match) {
        if rv != current_rv {
            return Err(ApiError::expired(rv, current_rv));
        }
    }
    let list_rv = cont.as_ref().map_or(current_rv, |c| c.rv);
    let selection = Selection::new(None, &opts.labels, &opts.fields);
    let mut selected: Vec<(&String, &Doc)> = Vec::new();
    let mut next = None;
    for (i, (key, obj)) in items.iter().enumerate() {
        if !selection.matches(key, obj) {
            continue;
        }
        if opts.limit.is_some_and(|l| selected.len() >= l) {
            next = selected.last().map(|(k, _)| ((*k).clone(), total - i));
            break;
        }
        selected.push((key, obj));
    }
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if let Some((last, remaining)) = next {
        meta["continue"] = json!(encode(&prefix, list_rv, &last));
        // As kube-apiserver: how many items follow, when no selector makes that unknown.
        if unselected {
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    if table::wants_table(accept) {
        let body = table::table_bytes(def, selected.iter().map(|(_, o)| *o), &meta, &opts.include_object);
        return Ok((StatusCode::OK, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response());
    }
    let head = json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(), "metadata": meta});
    Ok(splice_response(&head, selected.iter().map(|(_, o)| *o)))
}

/// `head` (an object) with an `items` array of the stored objects, spliced in as the store
/// keeps them: nothing is parsed or encoded again.
pub(crate) fn splice_response<'a>(head: &Value, items: impl ExactSizeIterator<Item = &'a Doc> + Clone) -> Response {
    let head = head.to_string();
    let size = head.len() + 12 + items.len() + items.clone().map(|d| d.bytes().len()).sum::<usize>();
    let mut body = Vec::with_capacity(size);
    // `head` is a JSON object: reopen it before its closing brace.
    body.extend_from_slice(head.strip_suffix('}').unwrap_or(&head).as_bytes());
    body.extend_from_slice(if head.len() > 2 { b",\"items\":[" } else { b"\"items\":[" });
    for (i, d) in items.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(d.bytes());
    }
    body.extend_from_slice(b"]}");
    (StatusCode::OK, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selectors::Selector;

    const P: &str = "/kubevirt.io/virtualmachines/default/";

    fn raw(v: &Value) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    }

    async fn body_of(r: Response) -> Value {
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX).await.unwrap();
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)))
    }

    #[tokio::test]
    async fn spliced_lists_are_the_list_kube_apiserver_would_encode() {
        let head =
            json!({"kind": "VirtualMachineList", "apiVersion": "kubevirt.io/v1", "metadata": {"resourceVersion": "7", "continue": "x"}});
        let docs = [Doc::new(&json!({"metadata": {"name": "a"}})), Doc::new(&json!({"metadata": {"name": "b"}, "spec": {"x": [1, {}]}}))];
        let mut want = head.clone();
        want["items"] = json!([{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}, "spec": {"x": [1, {}]}}]);
        assert_eq!(body_of(splice_response(&head, docs.iter())).await, want);
        want["items"] = json!([]);
        assert_eq!(body_of(splice_response(&head, [].iter())).await, want);
        assert_eq!(body_of(splice_response(&json!({}), docs[..1].iter())).await, json!({"items": [{"metadata": {"name": "a"}}]}));
    }

    /// A list by `metadata.name=` (checked on the key) returns what the object's name says, in
    /// one namespace and across all, beside other selectors, and pages as any selected list.
    #[tokio::test]
    async fn a_list_by_name_selects_on_the_key_what_the_object_says() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(&dir.path().join("s.db"), &crate::StoreConfig::default()).unwrap();
        let objects = Objects { store: store.clone(), enforce_invariants: true };
        let def = crate::registry::find("", "v1", "configmaps").unwrap();
        for (ns, name, app) in [("a", "x", "web"), ("a", "xy", "web"), ("b", "x", "db"), ("b", "y", "web"), ("c", "x", "web")] {
            let object =
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}});
            store.write(crate::store::Op::Create { key: def.key(Some(ns), name), object }).await.unwrap();
        }
        let names = |body: &Value| -> Vec<String> {
            body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| format!("{}/{}", o["metadata"]["namespace"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()))
                .collect()
        };
        for (ns, labels, fields, limit, want) in [
            (None, "", "metadata.name=x", None, vec!["a/x", "b/x", "c/x"]),
            (Some("a"), "", "metadata.name=x", None, vec!["a/x"]),
            (Some("a"), "", "metadata.name=z", None, vec![]),
            (None, "app=web", "metadata.name=x", None, vec!["a/x", "c/x"]),
            (None, "", "metadata.name=x,metadata.namespace=b", None, vec!["b/x"]),
            (None, "", "metadata.name!=x", None, vec!["a/xy", "b/y"]),
            (None, "", "metadata.name=x", Some(2), vec!["a/x", "b/x"]),
        ] {
            let opts = ListOptions {
                labels: Selector::labels(labels).unwrap(),
                fields: Selector::fields(fields).unwrap(),
                limit,
                ..ListOptions::default()
            };
            let body = body_of(serve(&objects, def, ns, &opts, "application/json").await.unwrap()).await;
            assert_eq!(names(&body), want, "namespace {ns:?}, labels {labels:?}, fields {fields:?}, limit {limit:?}");
            if let Some(token) = body["metadata"]["continue"].as_str() {
                let rest = ListOptions { continue_token: Some(token.to_owned()), ..opts };
                assert_eq!(
                    names(&body_of(serve(&objects, def, ns, &rest, "application/json").await.unwrap()).await),
                    vec!["c/x"],
                    "the next page"
                );
            }
        }
    }

    #[test]
    fn a_token_round_trips_for_its_own_list() {
        let t = encode(P, 7, &format!("{P}vm-09"));
        assert_eq!(decode(&t, P, 9, 1).unwrap(), Continue { rv: 7, after: format!("{P}vm-09") });
    }

    #[test]
    fn tampered_tokens_are_400_and_old_ones_410() {
        let good = json!({"v": "meta.k8s.io/v1", "rv": 7, "start": "vm-09", "prefix": P});
        let with = |k: &str, v: Value| {
            let mut t = good.clone();
            t[k] = v;
            raw(&t)
        };
        for (what, token) in [
            ("bad base64", "!!!".to_owned()),
            ("bad JSON", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("{")),
            ("other version", with("v", json!("v2"))),
            ("revision 0", with("rv", json!(0))),
            ("negative revision", with("rv", json!(-1))),
            ("empty start", with("start", json!(""))),
            ("climbing start", with("start", json!("../../secrets/x"))),
            ("other namespace", with("prefix", json!("/kubevirt.io/virtualmachines/other/"))),
            ("other resource", with("prefix", json!("/cdi.kubevirt.io/datavolumes/default/"))),
            ("future revision", with("rv", json!(10))),
            ("no prefix", raw(&json!({"v": "meta.k8s.io/v1", "rv": 7, "start": "vm-09"}))),
        ] {
            let e = decode(&token, P, 9, 1).unwrap_err();
            assert_eq!(e.code, 400, "{what}: {}", e.message);
            assert!(e.message.starts_with("invalid continue token: continue key is not valid"), "{what}: {}", e.message);
        }
        let e = decode(&with("rv", json!(3)), P, 9, 5).unwrap_err();
        assert_eq!((e.code, e.reason), (410, "Expired"));
    }
}
