//! A field-level violation, as Kubernetes reports it in a 422 `Invalid` Status: what
//! [`crate::validation`] and [`crate::invariants`] both return.

use serde::{Deserialize, Serialize};

/// Kubernetes' `CauseType` values used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CauseType {
    Required,
    Invalid,
    Duplicate,
    NotSupported,
    TooLong,
    Forbidden,
}

impl CauseType {
    /// The wire value (`FieldValueInvalid`, ...).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            CauseType::Required => "FieldValueRequired",
            CauseType::Invalid => "FieldValueInvalid",
            CauseType::Duplicate => "FieldValueDuplicate",
            CauseType::NotSupported => "FieldValueNotSupported",
            CauseType::TooLong => "FieldValueTooLong",
            CauseType::Forbidden => "FieldValueForbidden",
        }
    }
}

/// One violation: a field path (`spec.template.spec.volumes[1].name`) and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    #[serde(rename = "reason")]
    pub kind: String,
    pub message: String,
    pub field: String,
}

impl Cause {
    /// A cause of `kind` at `field`.
    #[must_use]
    pub fn new(kind: CauseType, field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause { kind: kind.as_str().to_owned(), message: message.into(), field: field.into() }
    }
}
