//! Every request's path through the service.
//!
//! # Flow
//! 1. `OData-Version` other than 4.0: 412. A method no resource implements: 501.
//! 2. Authenticate (bad credentials: 401, whatever the URI).
//! 3. Parse the URI. Unknown: 404 for a caller, 401 without credentials (nothing is revealed
//!    to an anonymous client). Without credentials only the public URIs answer GET/HEAD, and
//!    `POST Sessions` logs in; everything else is 401 with `WWW-Authenticate`.
//! 4. A method the resource does not allow: 405 with `Allow`.
//! 5. GET/HEAD: render from the caches, ETag, `If-None-Match` (304), then the query
//!    (`only`, `$expand`, `$select`). Writes: read the body (at most [`BODY_LIMIT`], else 413),
//!    parse it into an [`Action`](crate::actions::Action) and hand it to the executor.
//! 6. Every response gets the protocol headers ([`protocol::finish`]).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use bytes::Bytes;
use http::{header, request::Parts, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::auth::{self, Caller};
use crate::error::RfError;
use crate::metrics::StatusLabel;
use crate::protocol::{self, Query};
use crate::resources::{self, metadata, Ctx};
use crate::service::{Service, BODY_LIMIT};
use crate::uri::Uri;

/// The router's one handler.
pub async fn handle(State(svc): State<Arc<Service>>, req: Request) -> http::Response<Body> {
    let (parts, body) = req.into_parts();
    let uri = Uri::parse(parts.uri.path());
    let mut resp = match process(&svc, &parts, uri.as_ref(), body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    if parts.method == Method::HEAD {
        *resp.body_mut() = Body::empty();
    }
    protocol::finish(&mut resp, uri.as_ref());
    crate::metrics::get().responses.get_or_create(&StatusLabel { code: resp.status().as_u16() }).inc();
    resp
}

async fn process(svc: &Arc<Service>, parts: &Parts, uri: Option<&Uri>, body: Body) -> Result<http::Response<Body>, RfError> {
    protocol::check_odata_version(&parts.headers)?;
    if !protocol::known_method(&parts.method) {
        return Err(RfError::method_not_implemented());
    }
    let caller = auth::authenticate(svc, &parts.headers).await?;
    let reads = parts.method == Method::GET || parts.method == Method::HEAD;
    let Some(uri) = uri else {
        return Err(if caller.is_some() { RfError::uri_not_found(parts.uri.path()) } else { RfError::unauthorized() });
    };
    let login = *uri == Uri::Sessions && parts.method == Method::POST;
    if caller.is_none() && !(reads && uri.is_public()) && !login {
        return Err(RfError::unauthorized());
    }
    if !uri.allowed().contains(&parts.method) {
        return Err(RfError::method_not_allowed(uri.allowed()));
    }
    if reads {
        return read(svc, caller.as_ref(), uri, parts);
    }
    let bytes = read_body(body).await?;
    let action = crate::actions::parse(uri, &parts.method, &parts.headers, &bytes)?;
    crate::executor::execute(svc, caller.as_ref(), action, &parts.headers, &String::from_utf8_lossy(&bytes)).await
}

/// The body, at most [`BODY_LIMIT`] bytes.
async fn read_body(body: Body) -> Result<Bytes, RfError> {
    match http_body_util::Limited::new(body, BODY_LIMIT).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(RfError::payload_too_large()),
        Err(_) => Err(RfError::malformed_json()),
    }
}

fn read(svc: &Service, caller: Option<&Caller>, uri: &Uri, parts: &Parts) -> Result<http::Response<Body>, RfError> {
    let query = protocol::parse_query(parts.uri.query())?;
    if *uri == Uri::Metadata {
        return Ok(metadata::response());
    }
    let ctx = Ctx { svc, caller };
    let full = resources::get(&ctx, uri)?;
    let tag = match uri {
        Uri::Account(id) => svc.cache.account(id).map_or_else(|| protocol::etag(&full), |a| resources::account_etag(&a)),
        _ => protocol::etag(&full),
    };
    if protocol::none_match_hits(&parts.headers, &tag) {
        let mut r = protocol::empty(StatusCode::NOT_MODIFIED);
        set_etag(&mut r, &tag);
        return Ok(r);
    }
    let link = protocol::described_by(&full);
    let mut full = full;
    // The ETag in the payload too (DSP0266 §6.5.4), for clients that read it from there.
    if let Some(o) = full.as_object_mut().filter(|o| o.contains_key("@odata.id")) {
        o.insert("@odata.etag".to_owned(), Value::String(tag.clone()));
    }
    let shown = apply(&ctx, full, &query)?;
    let mut r = protocol::json(StatusCode::OK, &shown);
    set_etag(&mut r, &tag);
    if let Some(l) = link.and_then(|l| HeaderValue::from_str(&l).ok()) {
        r.headers_mut().insert(header::LINK, l);
    }
    Ok(r)
}

fn set_etag(r: &mut http::Response<Body>, tag: &str) {
    if let Ok(v) = HeaderValue::from_str(tag) {
        r.headers_mut().insert(header::ETAG, v);
    }
}

/// `only`, `$expand`, `$select`, in that order.
fn apply(ctx: &Ctx<'_>, mut v: Value, q: &Query) -> Result<Value, RfError> {
    if q.is_empty() {
        return Ok(v);
    }
    if q.only {
        let Some(members) = v.get("Members").and_then(Value::as_array) else {
            return Err(RfError::new(
                StatusCode::BAD_REQUEST,
                crate::error::Message::new(crate::registry::MessageId::QueryNotSupportedOnResource, &[]),
            ));
        };
        if let [one] = members.as_slice() {
            if let Some(u) = one.get("@odata.id").and_then(Value::as_str).and_then(Uri::parse) {
                v = resources::get(ctx, &u)?;
            }
        }
        return Ok(v);
    }
    if let Some(e) = q.expand {
        let mut fetch = |target: &str| Uri::parse(target).and_then(|u| resources::get(ctx, &u).ok());
        protocol::expand(&mut v, e, false, &mut fetch);
    }
    if !q.select.is_empty() {
        v = protocol::select(&v, &q.select);
    }
    Ok(v)
}
