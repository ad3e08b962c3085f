//! Redfish error responses (DSP0266 §9.5 "Error responses"): a status code and a body
//! `{"error": {"code", "message", "@Message.ExtendedInfo": [...]}}` whose messages come from the
//! Base registry ([`crate::registry`]), each naming the offending property in
//! `RelatedProperties` (a JSON pointer into the request body, `#/ResetType`).
//!
//! # Guarantees
//! - Anything a client sends that the service cannot act on is a 4xx here; 5xx only reports the
//!   service's own trouble (the API it reads from unreachable), never a client's input.
//! - An error changes nothing: handlers validate the whole request into a typed action before
//!   anything is written.

use axum::body::Body;
use http::{header, HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use crate::registry::MessageId;

/// One message of an error or a Task.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub id: MessageId,
    pub args: Vec<String>,
    /// JSON pointers into the request (`#/Boot/BootSourceOverrideTarget`).
    pub related: Vec<String>,
    /// A resolution of the service's own, instead of the registry's.
    pub resolution: Option<String>,
}

impl Message {
    #[must_use]
    pub fn new(id: MessageId, args: &[&str]) -> Message {
        Message { id, args: args.iter().map(|s| (*s).to_owned()).collect(), related: Vec::new(), resolution: None }
    }

    /// Adds a sentence of this service's own (the registry's `GeneralError` says to look at
    /// `Resolution`): it replaces the registry's resolution text.
    #[must_use]
    pub fn explained(mut self, why: &str) -> Message {
        self.resolution = Some(why.to_owned());
        self
    }

    /// Names the property (a path like `Boot/BootSourceOverrideTarget`) the message is about.
    #[must_use]
    pub fn about(mut self, property: &str) -> Message {
        self.related.push(format!("#/{}", property.trim_start_matches('/')));
        self
    }

    /// The `Message` object (Message.v1_3_0) as it appears in `@Message.ExtendedInfo` and in a
    /// Task's `Messages`.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut m = json!({
            "@odata.type": "#Message.v1_3_0.Message",
            "MessageId": self.id.id(),
            "Message": self.id.text(&self.args),
            "MessageArgs": self.args,
            "MessageSeverity": self.id.severity(),
            "Resolution": self.resolution.as_deref().unwrap_or(self.id.resolution()),
        });
        if !self.related.is_empty() {
            m["RelatedProperties"] = json!(self.related);
        }
        m
    }
}

/// A Redfish error: status, messages, and the headers that go with it (`Allow` on 405,
/// `WWW-Authenticate` on 401, `Retry-After` on 503).
#[derive(Clone, Debug)]
pub struct RfError {
    pub status: StatusCode,
    pub messages: Vec<Message>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl RfError {
    #[must_use]
    pub fn new(status: StatusCode, message: Message) -> RfError {
        RfError { status, messages: vec![message], headers: Vec::new() }
    }

    /// Adds a message (several problems in one request are reported together).
    #[must_use]
    pub fn and(mut self, message: Message) -> RfError {
        self.messages.push(message);
        self
    }

    #[must_use]
    pub fn with_header(mut self, name: HeaderName, value: &str) -> RfError {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.push((name, v));
        }
        self
    }

    /// The body of this error.
    #[must_use]
    pub fn body(&self) -> Value {
        let first = self.messages.first();
        let code = first.map_or_else(|| MessageId::GeneralError.id(), |m| m.id.id());
        let message = first.map_or_else(|| MessageId::GeneralError.text(&[]), |m| m.id.text(&m.args));
        json!({"error": {
            "code": code,
            "message": message,
            "@Message.ExtendedInfo": self.messages.iter().map(Message::to_json).collect::<Vec<_>>(),
        }})
    }

    /// The response (the protocol layer adds the headers every response carries).
    #[must_use]
    pub fn into_response(self) -> http::Response<Body> {
        let body = self.body().to_string();
        let mut resp = http::Response::new(Body::from(body));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json;charset=utf-8"));
        for (k, v) in self.headers {
            h.insert(k, v);
        }
        resp
    }

    // --- constructors, one per situation ---

    fn bad(id: MessageId, args: &[&str], property: Option<&str>) -> RfError {
        let m = Message::new(id, args);
        RfError::new(StatusCode::BAD_REQUEST, property.map_or_else(|| m.clone(), |p| m.clone().about(p)))
    }

    #[must_use]
    pub fn malformed_json() -> RfError {
        RfError::bad(MessageId::MalformedJSON, &[], None)
    }
    #[must_use]
    pub fn property_unknown(property: &str) -> RfError {
        RfError::bad(MessageId::PropertyUnknown, &[property], Some(property))
    }
    #[must_use]
    pub fn property_not_writable(property: &str) -> RfError {
        RfError::bad(MessageId::PropertyNotWritable, &[property], Some(property))
    }
    #[must_use]
    pub fn property_missing(property: &str) -> RfError {
        RfError::bad(MessageId::PropertyMissing, &[property], Some(property))
    }
    #[must_use]
    pub fn property_type(value: &Value, property: &str) -> RfError {
        RfError::bad(MessageId::PropertyValueTypeError, &[&shown(value), property], Some(property))
    }
    #[must_use]
    pub fn property_format(value: &str, property: &str) -> RfError {
        RfError::bad(MessageId::PropertyValueFormatError, &[value, property], Some(property))
    }
    #[must_use]
    pub fn property_not_in_list(value: &str, property: &str) -> RfError {
        RfError::bad(MessageId::PropertyValueNotInList, &[value, property], Some(property))
    }
    #[must_use]
    pub fn property_out_of_range(value: &Value, property: &str) -> RfError {
        RfError::bad(MessageId::PropertyValueOutOfRange, &[&shown(value), property], Some(property))
    }
    #[must_use]
    pub fn string_too_long(value: &str, property: &str, max: usize) -> RfError {
        RfError::bad(MessageId::StringValueTooLong, &[value, &max.to_string()], Some(property))
    }
    #[must_use]
    pub fn string_too_short(property: &str, min: usize) -> RfError {
        // The value itself is not echoed: it is a password more often than not.
        RfError::bad(MessageId::StringValueTooShort, &["(hidden)", &min.to_string()], Some(property))
    }
    #[must_use]
    pub fn no_operation() -> RfError {
        RfError::bad(MessageId::NoOperation, &[], None)
    }
    #[must_use]
    pub fn action_parameter_missing(action: &str, param: &str) -> RfError {
        RfError::bad(MessageId::ActionParameterMissing, &[action, param], Some(param))
    }
    #[must_use]
    pub fn action_parameter_unknown(action: &str, param: &str) -> RfError {
        RfError::bad(MessageId::ActionParameterUnknown, &[action, param], Some(param))
    }
    #[must_use]
    pub fn action_parameter_type(value: &Value, param: &str, action: &str) -> RfError {
        RfError::bad(MessageId::ActionParameterValueTypeError, &[&shown(value), param, action], Some(param))
    }
    #[must_use]
    pub fn action_parameter_not_in_list(value: &str, param: &str, action: &str) -> RfError {
        RfError::bad(MessageId::ActionParameterValueNotInList, &[value, param, action], Some(param))
    }
    /// 400 ActionParameterValueFormatError, with a sentence saying what is accepted.
    #[must_use]
    pub fn action_parameter_format(value: &str, param: &str, action: &str, why: &str) -> RfError {
        RfError::bad(MessageId::ActionParameterValueFormatError, &[value, param, action], Some(param))
            .and(Message::new(MessageId::GeneralError, &[]).explained(why))
    }
    /// 400 ActionParameterNotSupported, with a sentence saying why.
    #[must_use]
    pub fn action_parameter_unsupported(param: &str, action: &str, why: &str) -> RfError {
        RfError::bad(MessageId::ActionParameterNotSupported, &[param, action], Some(param))
            .and(Message::new(MessageId::GeneralError, &[]).explained(why))
    }
    #[must_use]
    pub fn action_not_supported(action: &str) -> RfError {
        RfError::bad(MessageId::ActionNotSupported, &[action], None)
    }
    /// 409: the parameter's value conflicts with the resource's state (e.g. `ResetType` `Nmi`
    /// to a powered-off System), with a sentence saying why.
    #[must_use]
    pub fn action_conflict(param: &str, value: &str, why: &str) -> RfError {
        RfError::new(StatusCode::CONFLICT, Message::new(MessageId::ActionParameterValueConflict, &[param, value]).about(param))
            .and(Message::new(MessageId::GeneralError, &[]).explained(why))
    }
    #[must_use]
    pub fn resource_not_found(kind: &str, name: &str) -> RfError {
        RfError::new(StatusCode::NOT_FOUND, Message::new(MessageId::ResourceNotFound, &[kind, name]))
    }
    #[must_use]
    pub fn uri_not_found(uri: &str) -> RfError {
        RfError::new(StatusCode::NOT_FOUND, Message::new(MessageId::ResourceMissingAtURI, &[uri]))
    }
    #[must_use]
    pub fn already_exists(kind: &str, property: &str, value: &str) -> RfError {
        RfError::new(StatusCode::CONFLICT, Message::new(MessageId::ResourceAlreadyExists, &[kind, property, value]).about(property))
    }
    #[must_use]
    pub fn cannot_delete() -> RfError {
        RfError::new(StatusCode::CONFLICT, Message::new(MessageId::ResourceCannotBeDeleted, &[]))
    }
    #[must_use]
    pub fn in_use() -> RfError {
        RfError::new(StatusCode::CONFLICT, Message::new(MessageId::ResourceInUse, &[]))
    }
    #[must_use]
    pub fn insufficient_privilege() -> RfError {
        RfError::new(StatusCode::FORBIDDEN, Message::new(MessageId::InsufficientPrivilege, &[]))
    }
    /// 401 with the challenge (DSP0266: `WWW-Authenticate` on every 401 for Basic).
    #[must_use]
    pub fn unauthorized() -> RfError {
        RfError::new(StatusCode::UNAUTHORIZED, Message::new(MessageId::NoValidSession, &[]))
            .with_header(header::WWW_AUTHENTICATE, "Basic realm=\"virtplug\", charset=\"UTF-8\"")
    }
    #[must_use]
    pub fn precondition_failed() -> RfError {
        RfError::new(StatusCode::PRECONDITION_FAILED, Message::new(MessageId::PreconditionFailed, &[]))
    }
    /// 412 for an `OData-Version` the service does not speak (DSP0266 §8.4).
    #[must_use]
    pub fn odata_version(value: &str) -> RfError {
        RfError::new(StatusCode::PRECONDITION_FAILED, Message::new(MessageId::HeaderInvalid, &[&format!("OData-Version: {value}")]))
    }
    /// 405 with the methods the resource allows.
    #[must_use]
    pub fn method_not_allowed(allow: &[Method]) -> RfError {
        RfError::new(StatusCode::METHOD_NOT_ALLOWED, Message::new(MessageId::OperationNotAllowed, &[]))
            .with_header(header::ALLOW, &allow_value(allow))
    }
    /// 501 for a method no resource implements.
    #[must_use]
    pub fn method_not_implemented() -> RfError {
        RfError::new(StatusCode::NOT_IMPLEMENTED, Message::new(MessageId::OperationNotAllowed, &[]))
    }
    #[must_use]
    pub fn payload_too_large() -> RfError {
        RfError::new(StatusCode::PAYLOAD_TOO_LARGE, Message::new(MessageId::PayloadTooLarge, &[]))
    }
    #[must_use]
    pub fn unsupported_media_type(value: &str) -> RfError {
        RfError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, Message::new(MessageId::HeaderInvalid, &[&format!("Content-Type: {value}")]))
    }
    /// 501 for a `$` query parameter the service does not implement (DSP0266 §7.4).
    #[must_use]
    pub fn query_unsupported(param: &str) -> RfError {
        RfError::new(StatusCode::NOT_IMPLEMENTED, Message::new(MessageId::QueryParameterUnsupported, &[param]))
    }
    #[must_use]
    pub fn query_format(value: &str, param: &str) -> RfError {
        RfError::new(StatusCode::BAD_REQUEST, Message::new(MessageId::QueryParameterValueFormatError, &[value, param]))
    }
    #[must_use]
    pub fn query_out_of_range(value: &str, param: &str, range: &str) -> RfError {
        RfError::new(StatusCode::BAD_REQUEST, Message::new(MessageId::QueryParameterOutOfRange, &[value, param, range]))
    }
    #[must_use]
    pub fn query_combination() -> RfError {
        RfError::new(StatusCode::BAD_REQUEST, Message::new(MessageId::QueryCombinationInvalid, &[]))
    }
    #[must_use]
    pub fn session_limit() -> RfError {
        RfError::new(StatusCode::SERVICE_UNAVAILABLE, Message::new(MessageId::SessionLimitExceeded, &[]))
            .with_header(header::RETRY_AFTER, "30")
    }
    /// 503: the service cannot reach the API (or is still loading its caches).
    #[must_use]
    pub fn unavailable(retry_after_secs: u32) -> RfError {
        let s = retry_after_secs.to_string();
        RfError::new(StatusCode::SERVICE_UNAVAILABLE, Message::new(MessageId::ServiceTemporarilyUnavailable, &[&s]))
            .with_header(header::RETRY_AFTER, &s)
    }
    /// 500: the service's own failure, logged with its cause (never a client's input).
    #[must_use]
    pub fn internal(what: &str) -> RfError {
        tracing::warn!("Redfish request failed inside the service: {what}");
        RfError::new(StatusCode::INTERNAL_SERVER_ERROR, Message::new(MessageId::InternalError, &[]))
    }
}

/// A JSON value as it appears in a message argument (strings without their quotes).
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The `Allow` header's value.
#[must_use]
pub fn allow_value(allow: &[Method]) -> String {
    allow.iter().map(Method::as_str).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_names_the_registry_message_and_the_property() {
        let e = RfError::action_parameter_not_in_list("Explode", "ResetType", "ComputerSystem.Reset");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let b = e.body();
        assert_eq!(b["error"]["code"], "Base.1.22.ActionParameterValueNotInList");
        let info = &b["error"]["@Message.ExtendedInfo"][0];
        assert_eq!(info["RelatedProperties"], json!(["#/ResetType"]));
        assert_eq!(info["MessageArgs"], json!(["Explode", "ResetType", "ComputerSystem.Reset"]));
        assert!(info["Message"].as_str().unwrap_or_default().contains("'Explode'"));
    }

    #[test]
    fn every_constructor_gives_its_message_the_registry_arity() {
        let v = json!(1);
        for e in [
            RfError::malformed_json(),
            RfError::property_unknown("X"),
            RfError::property_not_writable("X"),
            RfError::property_missing("X"),
            RfError::property_type(&v, "X"),
            RfError::property_format("v", "X"),
            RfError::property_not_in_list("v", "X"),
            RfError::property_out_of_range(&v, "X"),
            RfError::string_too_long("v", "X", 3),
            RfError::string_too_short("X", 3),
            RfError::no_operation(),
            RfError::action_parameter_missing("A", "P"),
            RfError::action_parameter_unknown("A", "P"),
            RfError::action_parameter_type(&v, "P", "A"),
            RfError::action_parameter_not_in_list("v", "P", "A"),
            RfError::action_not_supported("A"),
            RfError::action_conflict("P", "v", "why"),
            RfError::resource_not_found("K", "n"),
            RfError::uri_not_found("/x"),
            RfError::already_exists("K", "P", "v"),
            RfError::cannot_delete(),
            RfError::in_use(),
            RfError::insufficient_privilege(),
            RfError::unauthorized(),
            RfError::precondition_failed(),
            RfError::odata_version("4.1"),
            RfError::method_not_allowed(&[Method::GET]),
            RfError::method_not_implemented(),
            RfError::payload_too_large(),
            RfError::unsupported_media_type("text/plain"),
            RfError::query_unsupported("$x"),
            RfError::query_format("v", "$x"),
            RfError::query_out_of_range("v", "$x", "1-3"),
            RfError::query_combination(),
            RfError::session_limit(),
            RfError::unavailable(3),
        ] {
            for m in &e.messages {
                assert_eq!(m.args.len(), m.id.arg_count(), "{}", m.id.key());
            }
            assert!(e.status.is_client_error() || e.status.is_server_error());
        }
    }
}
