//! The verbs on a resource path ([`crate::target`]): list and watch, get, create, replace,
//! patch, delete and delete a collection, each a call on [`crate::objects::Objects`].

use std::collections::HashMap;

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use crate::call::Call;
use crate::limits::FRESHNESS_WAIT;
use crate::objects::{DeleteOptions, Propagation, Write};
use crate::patch::PatchKind;
use crate::query;
use crate::reply::{doc_response, json_response};
use crate::selectors::Selection;
use crate::status::ApiError;
use crate::target::Resource;
use crate::{list, table, watch};

type Answer = Result<Response, ApiError>;

/// `GET` of a collection: a list, or a watch with `?watch=true`.
pub async fn list(c: Call<'_>, r: Resource) -> Answer {
    let accept = c.header(header::ACCEPT);
    if r.opts.watch {
        return watch::serve(&c.st.objects, &c.st.watches, r.def, r.ns.as_deref(), None, &r.opts, accept);
    }
    list::serve(&c.st.objects, r.def, r.ns.as_deref(), &r.opts, accept).await
}

/// `GET` of an object (or its status): the object, as a Table when asked, or a watch of it with
/// `?watch=true`.
pub async fn get(c: Call<'_>, r: Resource) -> Answer {
    let accept = c.header(header::ACCEPT);
    let (objects, ns, name) = (&c.st.objects, r.ns.as_deref(), r.name()?);
    if r.opts.watch {
        return watch::serve(objects, &c.st.watches, r.def, ns, Some(name), &r.opts, accept);
    }
    if let Some(rv) = r.opts.resource_version.filter(|rv| *rv > 0) {
        watch::wait_for_revision(&objects.store, rv, FRESHNESS_WAIT).await?;
    }
    let doc = objects.get(r.def, ns, name)?.object;
    if table::wants_table(accept) {
        let obj = doc.value();
        let t = table::table(r.def, &[&obj], &json!({"resourceVersion": obj.pointer("/metadata/resourceVersion")}), &r.opts.include_object);
        return Ok(json_response(StatusCode::OK, &t));
    }
    Ok(doc_response(StatusCode::OK, &doc))
}

/// `POST` to a collection.
pub async fn create(mut c: Call<'_>, r: Resource) -> Answer {
    let body = c.body().await?;
    let obj = parse_body(&c, &body)?;
    if let Some(review) = r.def.review {
        let cx = crate::kinds::review::Context { objects: &c.st.objects, token: c.st.token.as_deref(), tokens: &c.st.tokens };
        return answer_review(r.def, review, &cx, obj);
    }
    let write = write_options(&c, &r, "CreateOptions", false)?;
    let created = c.st.objects.create(r.def, r.ns.as_deref(), obj, write).await?;
    Ok(doc_response(StatusCode::CREATED, &created))
}

/// An access review: answered, not stored (201, as kube-apiserver).
fn answer_review(
    def: &crate::registry::ResourceDef,
    review: &crate::kinds::review::Review,
    cx: &crate::kinds::review::Context<'_>,
    mut obj: Value,
) -> Answer {
    crate::objects::check_type(def, &mut obj)?;
    if let Some(m) = obj.as_object_mut() {
        m.insert("metadata".into(), json!({"creationTimestamp": null}));
    }
    let answered = (review.answer)(cx, obj).map_err(|causes| ApiError::invalid(def.group, def.kind, "", &causes))?;
    Ok(json_response(StatusCode::CREATED, &answered))
}

/// `PUT` of an object or its status.
pub async fn replace(mut c: Call<'_>, r: Resource) -> Answer {
    let body = c.body().await?;
    let obj = parse_body(&c, &body)?;
    let write = write_options(&c, &r, "UpdateOptions", false)?;
    let out = c.st.objects.replace(r.def, r.ns.as_deref(), r.name()?, obj, r.part(), write).await?;
    Ok(doc_response(StatusCode::OK, &out))
}

/// `PATCH` of an object or its status: JSON, merge or strategic merge patch, or server-side
/// apply (201 when the apply created the object), by content type.
pub async fn patch(mut c: Call<'_>, r: Resource) -> Answer {
    let ct = c.header(header::CONTENT_TYPE);
    let kind = PatchKind::from_content_type(ct).ok_or_else(|| {
        let strategic = if r.def.custom { "" } else { ", application/strategic-merge-patch+json" };
        ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format ({ct:?}) - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml{strategic}"
        ))
    })?;
    let write = write_options(&c, &r, "PatchOptions", kind == PatchKind::Apply)?;
    let body = c.body().await?;
    let (objects, ns, name) = (&c.st.objects, r.ns.as_deref(), r.name()?);
    if kind == PatchKind::Apply {
        let (out, created) = objects.apply(r.def, ns, name, &body, r.part(), &write).await?;
        return Ok(doc_response(if created { StatusCode::CREATED } else { StatusCode::OK }, &out));
    }
    let out = objects.patch(r.def, ns, name, kind, &body, r.part(), write).await?;
    Ok(doc_response(StatusCode::OK, &out))
}

/// The write options of a create, update or patch: `dryRun`, the field manager (`fieldManager`,
/// else the User-Agent's, as kube-apiserver; an apply needs `fieldManager`) and `force`, which
/// only an apply may send.
fn write_options(c: &Call<'_>, r: &Resource, options: &str, apply: bool) -> Result<Write, ApiError> {
    let invalid = |kind, field: &str, message: &str| {
        ApiError::invalid("meta.k8s.io", options, "", &[api::validation::Cause::new(kind, field, message)])
    };
    let given = c.query.get("fieldManager").filter(|m| !m.is_empty());
    if let Some(m) = given {
        crate::apply::check_manager(m, options)?;
    }
    let force = match c.query.get("force").map(String::as_str) {
        None => false,
        Some(_) if !apply && options == "PatchOptions" => {
            return Err(invalid(api::validation::CauseType::Forbidden, "force", "Forbidden: may not be specified for non-apply patch"));
        }
        Some("true") => true,
        Some("false" | "") => false,
        Some(other) => return Err(ApiError::bad_request(format!("force {other:?} is not a boolean: send force=true or force=false"))),
    };
    let manager = if apply {
        // Checked by the apply itself (422 naming fieldManager), after the body's type.
        given.cloned()
    } else {
        given.cloned().or_else(|| crate::apply::manager_from_user_agent(c.header(header::USER_AGENT)))
    };
    Ok(Write { dry_run: r.opts.dry_run, manager, force })
}

/// `DELETE` of an object, with `DeleteOptions` from the query and body.
pub async fn delete(mut c: Call<'_>, r: Resource) -> Answer {
    let body = c.body().await?;
    let opts = delete_options(&c.query, &body, r.opts.dry_run)?;
    let out = c.st.objects.delete(r.def, r.ns.as_deref(), r.name()?, &opts).await?;
    Ok(doc_response(StatusCode::OK, &out))
}

/// `DELETE` of a collection: every object the label and field selectors match; the answer
/// lists the deleted ones (one deleted meanwhile by someone else is left out).
pub async fn delete_collection(mut c: Call<'_>, r: Resource) -> Answer {
    let body = c.body().await?;
    let del = delete_options(&c.query, &body, r.opts.dry_run)?;
    let (def, objects) = (r.def, &c.st.objects);
    let (rv, items) = objects.list(def, r.ns.as_deref(), None);
    let selection = Selection::new(None, &r.opts.labels, &r.opts.fields);
    let mut deleted = Vec::new();
    for (_, doc) in items.iter().filter(|(key, o)| selection.matches(key, o)) {
        let obj = doc.metadata_view();
        let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let ons = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        match objects.delete(def, ons, name, &del).await {
            Ok(v) => deleted.push(v),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let head =
        json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(), "metadata": {"resourceVersion": rv.to_string()}});
    Ok(list::splice_response(&head, deleted.iter()))
}

/// Parses a JSON or YAML body into an object (see [`crate::body`]; JSON unless the content
/// type says YAML).
fn parse_body(c: &Call<'_>, body: &Bytes) -> Result<Value, ApiError> {
    crate::body::parse_object(c.header(header::CONTENT_TYPE), body)
}

fn delete_options(query: &HashMap<String, String>, body: &Bytes, dry_run: bool) -> Result<DeleteOptions, ApiError> {
    // Objects go at once (deletionGracePeriodSeconds 0) but a Pod on a node (see
    // `objects::pod_grace`); a bad grace period is refused for every kind.
    let mut opts = DeleteOptions { dry_run, grace_period: query::grace_period(query)?, ..DeleteOptions::default() };
    let mut policy = query.get("propagationPolicy").cloned();
    if !body.is_empty() {
        let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("DeleteOptions is not valid JSON: {e}")))?;
        opts.uid = v.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_owned);
        opts.resource_version = v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(str::to_owned);
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            policy = Some(p.to_owned());
        }
        if v.get("orphanDependents") == Some(&json!(true)) {
            policy = Some("Orphan".to_owned());
        }
        if v.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All")) {
            opts.dry_run = true;
        }
        match v.get("gracePeriodSeconds") {
            None | Some(Value::Null) => {}
            Some(g) => {
                let g = g.as_u64().ok_or_else(|| {
                    ApiError::bad_request(format!("DeleteOptions.gracePeriodSeconds {g} is not a whole number of seconds, 0 or more"))
                })?;
                opts.grace_period = Some(g);
            }
        }
    }
    opts.propagation = match policy.as_deref() {
        None => None,
        Some("Background") => Some(Propagation::Background),
        Some("Foreground") => Some(Propagation::Foreground),
        Some("Orphan") => Some(Propagation::Orphan),
        Some(other) => {
            return Err(ApiError::bad_request(format!("unknown propagationPolicy {other:?}: use Background, Foreground or Orphan")));
        }
    };
    Ok(opts)
}
