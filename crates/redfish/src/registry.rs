//! The DMTF Base message registry (`registries/Base.1.22.1.json`, vendored with DMTF's license):
//! the texts, severities and resolutions of the messages in error bodies and Task messages, and
//! the document served at `/redfish/v1/Registries/Base`.
//!
//! # Guarantees
//! Every [`MessageId`] this crate sends exists in the vendored registry with the number of
//! arguments it is given (a unit test checks each), so a client that looks a message up in the
//! registry finds it.

use std::sync::LazyLock;

use serde_json::Value;

/// The vendored registry file.
pub const BASE_JSON: &str = include_str!("../registries/Base.1.22.1.json");
/// The registry's `Id` (`Base.1.22.1`).
pub const BASE_ID: &str = "Base.1.22.1";
/// The prefix of the MessageIds it defines: registry name, major and minor version (DSP0266:
/// `RegistryName.MajorVersion.MinorVersion.MessageKey`).
pub const PREFIX: &str = "Base.1.22";

static BASE: LazyLock<Value> = LazyLock::new(|| serde_json::from_str(BASE_JSON).unwrap_or(Value::Null));

/// The registry as JSON (served by the Registries resource).
#[must_use]
pub fn base() -> &'static Value {
    &BASE
}

/// The messages of the Base registry this service sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageId {
    Success,
    Created,
    NoOperation,
    GeneralError,
    InternalError,
    MalformedJSON,
    PropertyUnknown,
    PropertyNotWritable,
    PropertyMissing,
    PropertyValueTypeError,
    PropertyValueFormatError,
    PropertyValueNotInList,
    PropertyValueOutOfRange,
    PropertyValueConflict,
    StringValueTooLong,
    StringValueTooShort,
    ActionNotSupported,
    ActionParameterMissing,
    ActionParameterUnknown,
    ActionParameterNotSupported,
    ActionParameterValueTypeError,
    ActionParameterValueFormatError,
    ActionParameterValueNotInList,
    ActionParameterValueConflict,
    ResourceNotFound,
    ResourceMissingAtURI,
    ResourceAlreadyExists,
    ResourceCannotBeDeleted,
    ResourceInUse,
    InsufficientPrivilege,
    NoValidSession,
    ResourceAtUriUnauthorized,
    PreconditionFailed,
    OperationNotAllowed,
    PayloadTooLarge,
    HeaderInvalid,
    QueryParameterUnsupported,
    QueryParameterValueFormatError,
    QueryParameterOutOfRange,
    QueryNotSupportedOnResource,
    QueryCombinationInvalid,
    SessionLimitExceeded,
    ServiceTemporarilyUnavailable,
    OperationTimeout,
    OperationFailed,
    PasswordChangeRequired,
    AccountModified,
    AccountRemoved,
}

impl MessageId {
    /// The message key (`PropertyUnknown`).
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            MessageId::Success => "Success",
            MessageId::Created => "Created",
            MessageId::NoOperation => "NoOperation",
            MessageId::GeneralError => "GeneralError",
            MessageId::InternalError => "InternalError",
            MessageId::MalformedJSON => "MalformedJSON",
            MessageId::PropertyUnknown => "PropertyUnknown",
            MessageId::PropertyNotWritable => "PropertyNotWritable",
            MessageId::PropertyMissing => "PropertyMissing",
            MessageId::PropertyValueTypeError => "PropertyValueTypeError",
            MessageId::PropertyValueFormatError => "PropertyValueFormatError",
            MessageId::PropertyValueNotInList => "PropertyValueNotInList",
            MessageId::PropertyValueOutOfRange => "PropertyValueOutOfRange",
            MessageId::PropertyValueConflict => "PropertyValueConflict",
            MessageId::StringValueTooLong => "StringValueTooLong",
            MessageId::StringValueTooShort => "StringValueTooShort",
            MessageId::ActionNotSupported => "ActionNotSupported",
            MessageId::ActionParameterMissing => "ActionParameterMissing",
            MessageId::ActionParameterUnknown => "ActionParameterUnknown",
            MessageId::ActionParameterNotSupported => "ActionParameterNotSupported",
            MessageId::ActionParameterValueTypeError => "ActionParameterValueTypeError",
            MessageId::ActionParameterValueFormatError => "ActionParameterValueFormatError",
            MessageId::ActionParameterValueNotInList => "ActionParameterValueNotInList",
            MessageId::ActionParameterValueConflict => "ActionParameterValueConflict",
            MessageId::ResourceNotFound => "ResourceNotFound",
            MessageId::ResourceMissingAtURI => "ResourceMissingAtURI",
            MessageId::ResourceAlreadyExists => "ResourceAlreadyExists",
            MessageId::ResourceCannotBeDeleted => "ResourceCannotBeDeleted",
            MessageId::ResourceInUse => "ResourceInUse",
            MessageId::InsufficientPrivilege => "InsufficientPrivilege",
            MessageId::NoValidSession => "NoValidSession",
            MessageId::ResourceAtUriUnauthorized => "ResourceAtUriUnauthorized",
            MessageId::PreconditionFailed => "PreconditionFailed",
            MessageId::OperationNotAllowed => "OperationNotAllowed",
            MessageId::PayloadTooLarge => "PayloadTooLarge",
            MessageId::HeaderInvalid => "HeaderInvalid",
            MessageId::QueryParameterUnsupported => "QueryParameterUnsupported",
            MessageId::QueryParameterValueFormatError => "QueryParameterValueFormatError",
            MessageId::QueryParameterOutOfRange => "QueryParameterOutOfRange",
            MessageId::QueryNotSupportedOnResource => "QueryNotSupportedOnResource",
            MessageId::QueryCombinationInvalid => "QueryCombinationInvalid",
            MessageId::SessionLimitExceeded => "SessionLimitExceeded",
            MessageId::ServiceTemporarilyUnavailable => "ServiceTemporarilyUnavailable",
            MessageId::OperationTimeout => "OperationTimeout",
            MessageId::OperationFailed => "OperationFailed",
            MessageId::PasswordChangeRequired => "PasswordChangeRequired",
            MessageId::AccountModified => "AccountModified",
            MessageId::AccountRemoved => "AccountRemoved",
        }
    }

    /// The full MessageId (`Base.1.22.PropertyUnknown`).
    #[must_use]
    pub fn id(self) -> String {
        format!("{PREFIX}.{}", self.key())
    }

    fn def(self) -> Option<&'static Value> {
        BASE.get("Messages").and_then(|m| m.get(self.key()))
    }

    /// The registry's text with `%1`, `%2`, ... replaced by `args`.
    #[must_use]
    pub fn text(self, args: &[String]) -> String {
        let template = self.def().and_then(|d| d.get("Message")).and_then(Value::as_str).unwrap_or(self.key());
        let mut out = template.to_owned();
        // Highest index first, so `%1` does not eat the start of `%10`.
        for (i, a) in args.iter().enumerate().rev() {
            out = out.replace(&format!("%{}", i + 1), a);
        }
        out
    }

    /// `OK`, `Warning` or `Critical`.
    #[must_use]
    pub fn severity(self) -> &'static str {
        self.def().and_then(|d| d.get("MessageSeverity").or_else(|| d.get("Severity"))).and_then(Value::as_str).unwrap_or("Critical")
    }

    /// What the client should do, from the registry.
    #[must_use]
    pub fn resolution(self) -> &'static str {
        self.def().and_then(|d| d.get("Resolution")).and_then(Value::as_str).unwrap_or("None.")
    }

    /// How many arguments the registry's message takes.
    #[must_use]
    pub fn arg_count(self) -> usize {
        self.def().and_then(|d| d.get("NumberOfArgs")).and_then(Value::as_u64).map_or(0, |n| usize::try_from(n).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[MessageId] = &[
        MessageId::Success,
        MessageId::Created,
        MessageId::NoOperation,
        MessageId::GeneralError,
        MessageId::InternalError,
        MessageId::MalformedJSON,
        MessageId::PropertyUnknown,
        MessageId::PropertyNotWritable,
        MessageId::PropertyMissing,
        MessageId::PropertyValueTypeError,
        MessageId::PropertyValueFormatError,
        MessageId::PropertyValueNotInList,
        MessageId::PropertyValueOutOfRange,
        MessageId::PropertyValueConflict,
        MessageId::StringValueTooLong,
        MessageId::StringValueTooShort,
        MessageId::ActionNotSupported,
        MessageId::ActionParameterMissing,
        MessageId::ActionParameterUnknown,
        MessageId::ActionParameterNotSupported,
        MessageId::ActionParameterValueTypeError,
        MessageId::ActionParameterValueFormatError,
        MessageId::ActionParameterValueNotInList,
        MessageId::ActionParameterValueConflict,
        MessageId::ResourceNotFound,
        MessageId::ResourceMissingAtURI,
        MessageId::ResourceAlreadyExists,
        MessageId::ResourceCannotBeDeleted,
        MessageId::ResourceInUse,
        MessageId::InsufficientPrivilege,
        MessageId::NoValidSession,
        MessageId::ResourceAtUriUnauthorized,
        MessageId::PreconditionFailed,
        MessageId::OperationNotAllowed,
        MessageId::PayloadTooLarge,
        MessageId::HeaderInvalid,
        MessageId::QueryParameterUnsupported,
        MessageId::QueryParameterValueFormatError,
        MessageId::QueryParameterOutOfRange,
        MessageId::QueryNotSupportedOnResource,
        MessageId::QueryCombinationInvalid,
        MessageId::SessionLimitExceeded,
        MessageId::ServiceTemporarilyUnavailable,
        MessageId::OperationTimeout,
        MessageId::OperationFailed,
        MessageId::PasswordChangeRequired,
        MessageId::AccountModified,
        MessageId::AccountRemoved,
    ];

    #[test]
    fn every_message_sent_is_in_the_vendored_registry() {
        assert_eq!(base()["Id"], BASE_ID);
        for m in ALL {
            assert!(m.def().is_some(), "{} is not in {BASE_ID}", m.key());
            assert!(["OK", "Warning", "Critical"].contains(&m.severity()), "{}", m.key());
        }
    }

    #[test]
    fn arguments_fill_the_registry_text() {
        let t = MessageId::PropertyValueNotInList.text(&["Explode".into(), "ResetType".into()]);
        assert_eq!(t, "The value 'Explode' for the property ResetType is not in the list of acceptable values.");
        assert_eq!(MessageId::PropertyValueNotInList.arg_count(), 2);
        assert_eq!(MessageId::PropertyUnknown.id(), "Base.1.22.PropertyUnknown");
    }
}
