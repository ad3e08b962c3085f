//! Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! decoded into the JSON objects every other verb works on.
//!
//! kubectl 1.32 and later send core objects from its typed clients (`kubectl create secret`,
//! `create namespace`, ...) as protobuf, and client-go does not fall back to JSON on 415 for
//! protobuf (only for CBOR): a core kind kubectl creates needs a decoder here. Responses stay
//! JSON, which those clients accept (they send `Accept: application/vnd.kubernetes.protobuf,
//! application/json`).
//!
//! # Flow
//! The body is `k8s\0` followed by a `runtime.Unknown` message: `typeMeta` (apiVersion, kind),
//! `raw` (the object's message). The kind is looked up in the registry; its
//! [`Strategy::from_protobuf`](crate::registry::Strategy::from_protobuf) describes `raw`
//! ([`crate::kinds`]); [`message`] decodes any described message. A kind without a decoder is 415 naming
//! the media types that work.
//!
//! # Guarantees
//! Fields are read as Go's JSON encoding would write the decoded object: empty strings, zero
//! numbers and empty maps are left out (`omitempty`). Unknown fields are skipped. Nothing
//! panics on any input; malformed input is 400.

pub mod message;
pub mod wire;

use serde_json::Value;

use crate::status::ApiError;

/// The prefix of every Kubernetes protobuf body.
pub const MAGIC: &[u8] = b"k8s\0";

/// Whether `media_type` (without parameters) is Kubernetes' protobuf.
#[must_use]
pub fn is_protobuf(media_type: &str) -> bool {
    media_type.eq_ignore_ascii_case("application/vnd.kubernetes.protobuf")
}

/// The media types objects can be sent in, for 415 messages.
pub const ACCEPTED: &str = "application/json, application/yaml, application/vnd.kubernetes.protobuf (the core kinds kubectl creates)";

/// Decodes a protobuf body into the JSON object of its kind, with the message `find` gives for
/// the envelope's group and kind (a stored kind's, or a subresource body's such as
/// `TokenRequest`: see [`crate::body::parse_object_with`]).
///
/// # Errors
/// 400 for a body that is not a Kubernetes protobuf envelope or whose object is malformed;
/// 415 for a kind `find` knows no message for.
pub fn decode_object(body: &[u8], find: impl Fn(&str, &str) -> Option<&'static message::Message>) -> Result<Value, ApiError> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| ApiError::bad_request("the protobuf body does not start with the Kubernetes magic bytes k8s\\0"))?;
    let (mut api_version, mut kind, mut raw, mut encoding) = (String::new(), String::new(), None, String::new());
    for field in wire::Fields::new(envelope) {
        match field.map_err(malformed)? {
            (1, wire::Value::Bytes(type_meta)) => {
                for f in wire::Fields::new(type_meta) {
                    match f.map_err(malformed)? {
                        (1, v) => api_version = v.string().map_err(malformed)?,
                        (2, v) => kind = v.string().map_err(malformed)?,
                        _ => {}
                    }
                }
            }
            (2, wire::Value::Bytes(r)) => raw = Some(r),
            (3, v) => encoding = v.string().map_err(malformed)?,
            _ => {}
        }
    }
    if !encoding.is_empty() {
        return Err(ApiError::unsupported_media(format!("the protobuf body uses contentEncoding {encoding:?}; send it unencoded")));
    }
    let (group, _version) = api_version.rsplit_once('/').unwrap_or(("", api_version.as_str()));
    let Some(decode) = find(group, &kind) else {
        return Err(ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format (application/vnd.kubernetes.protobuf for {kind:?} of {api_version:?}) \
             - accepted media types include: {ACCEPTED}"
        )));
    };
    let mut obj = message::decode(decode, raw.unwrap_or_default())
        .map_err(|e| ApiError::bad_request(format!("the protobuf {kind} cannot be read: {e}")))?;
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(api_version));
        m.insert("kind".into(), Value::String(kind));
    }
    Ok(obj)
}

fn malformed(e: wire::WireError) -> ApiError {
    ApiError::bad_request(format!("the protobuf body is malformed: {e}"))
}
