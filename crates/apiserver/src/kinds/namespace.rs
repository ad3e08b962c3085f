//! core/v1 `Namespace`: the protobuf kubectl 1.32 and later send for `kubectl create namespace`.
//! Its create rules (phase `Active`, the `kubernetes` finalizer) and deletion are in
//! [`crate::objects`] and [`crate::gc`].

use crate::protobuf::message::{f, rep, Message, Ty, OBJECT_META};
use crate::registry::Strategy;

static SPEC: Message = Message { name: "NamespaceSpec", fields: &[rep(1, "finalizers", Ty::Str)], skip: &[] };

/// `Namespace` (metadata 1, spec 2; status 3 is the server's).
pub static PROTOBUF: Message =
    Message { name: "Namespace", fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META)), f(2, "spec", Ty::Msg(&SPEC))], skip: &[3] };

/// The Namespace strategy: its protobuf only.
pub static STRATEGY: Strategy = Strategy {
    normalize: super::no_normalize,
    validate_update: super::no_update_rules,
    schema: super::object_schema,
    from_protobuf: Some(&PROTOBUF),
};
