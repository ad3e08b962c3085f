//! core/v1 `ServiceAccount`. Every namespace gets a `default` one when it is created (the
//! service-account controller's job in Kubernetes, done by [`crate::objects`] here). No tokens
//! are minted: the API server's one bearer token is the only credential.

use serde_json::Value;

use api::validation::Cause;

use crate::protobuf::message::{f, ptr, rep, Message, Ty, LOCAL_OBJECT_REFERENCE, OBJECT_META, OBJECT_REFERENCE};
use crate::registry::Strategy;

/// The name of the ServiceAccount every namespace has.
pub const DEFAULT: &str = "default";

/// `ServiceAccount` (metadata 1, secrets 2, imagePullSecrets 3, automountServiceAccountToken 4),
/// as `kubectl create serviceaccount` sends it from 1.32 on.
pub static PROTOBUF: Message = Message {
    name: "ServiceAccount",
    fields: &[
        f(1, "metadata", Ty::Msg(&OBJECT_META)),
        rep(2, "secrets", Ty::Msg(&OBJECT_REFERENCE)),
        rep(3, "imagePullSecrets", Ty::Msg(&LOCAL_OBJECT_REFERENCE)),
        ptr(4, "automountServiceAccountToken", Ty::Bool),
    ],
    skip: &[],
};

/// The ServiceAccount strategy.
pub static STRATEGY: Strategy = Strategy {
    normalize: super::no_normalize,
    validate_update: super::no_update_rules,
    schema: super::object_schema,
    from_protobuf: Some(&PROTOBUF),
};

/// Validates a ServiceAccount: its fields have Kubernetes' types.
#[must_use]
pub fn validate(obj: &Value) -> Vec<Cause> {
    super::typed_causes::<k8s_openapi::api::core::v1::ServiceAccount>(obj)
}
