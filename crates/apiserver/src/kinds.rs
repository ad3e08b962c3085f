//! Rules of core kinds beyond the generic verbs: what kube-apiserver's REST strategy for each
//! kind does (defaulting, conversion of write-only fields, validation on create and update), as a
//! [`Strategy`](crate::registry::Strategy) that [`crate::registry::RESOURCES`] points to.
//!
//! One file per kind; a kind without special rules needs none.

pub mod secret;
