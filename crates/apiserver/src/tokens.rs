//! ServiceAccount tokens: minted by `POST /api/v1/namespaces/NS/serviceaccounts/NAME/token`
//! (kube-apiserver's `serviceaccounts/token`, an `authentication.k8s.io/v1` `TokenRequest`, what
//! `kubectl create token` and the kubelet's projected token volumes ask), and authenticated by
//! the `TokenReview` ([`crate::kinds::review`]) as kube-apiserver authenticates the tokens it
//! signs. They exist so that `virtplug subresources-api`'s node-bound tunnel check can be
//! exercised against this server as it is against a real cluster.
//!
//! # Flow
//! 1. A `TokenRequest` is checked (`spec.expirationSeconds` at least 600, default 3600, at most
//!    2^32, as kube-apiserver; `spec.boundObjectRef` of kind `Pod` or `Node`), the ServiceAccount
//!    `NS/NAME` must exist, and so must the bound object (a Pod in `NS` running as that
//!    ServiceAccount; its UID, when given, must still be the object's).
//! 2. A token of 256 random bits is answered once (`status.token`, `status.expirationTimestamp`);
//!    the server keeps its SHA-256 with what the token stands for.
//! 3. A `TokenReview` of it answers `system:serviceaccount:NS:NAME` in `system:serviceaccounts`,
//!    `system:serviceaccounts:NS` and `system:authenticated`, with the extras kube-apiserver sets
//!    (KEP-4193): for a token bound to a Pod, `authentication.kubernetes.io/pod-name` and
//!    `pod-uid`, and when the Pod was bound to a node, `node-name` (and `node-uid` if that Node
//!    existed); for a token bound to a Node, `node-name` and `node-uid`.
//!
//! # Guarantees
//! - A token is authenticated only while it has not expired, its ServiceAccount still exists
//!   with the UID it had, its bound object still exists with the UID it had, and one of its
//!   audiences is one the review asks for (without `spec.audiences`: [`API_AUDIENCE`]).
//! - The token itself is never stored or logged; a lookup hashes what the review presents.
//!
//! # Caveats
//! - Tokens are kept in memory: a restart of the server forgets them (kube-apiserver's are signed
//!   JWTs that outlive it; a holder here requests a new one, as the kubelet does before expiry).
//! - They are opaque, not JWTs: only this server's `TokenReview` can tell who holds one.
//! - `dryRun` is not read (every request mints).
//! - They authenticate only through `TokenReview`: this server's own API still answers only its
//!   one credential, the kubeconfig's token (it has one identity and authorizes nothing else).
//! - Only that credential's holder, an administrator, can mint them, so their number is bounded
//!   by what the administrator asks; expired ones are dropped at each mint.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use axum::http::StatusCode;
use axum::response::Response;
use jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use api::validation::{Cause, CauseType};

use crate::call::Call;
use crate::objects::Objects;
use crate::protobuf::message::{f, ptr, rep, Message, Ty, OBJECT_META};
use crate::registry;
use crate::status::ApiError;

/// The audience of a token minted without `spec.audiences`, and the one a review without
/// `spec.audiences` asks for: kube-apiserver's default `--api-audiences` (its issuer) on kubeadm
/// clusters.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// `spec.expirationSeconds` when the request gives none (kube-apiserver's default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// The shortest lifetime kube-apiserver mints (`MinTokenAgeSec`).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// The longest (2^32 s).
pub const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

/// The user-info extras of a bound token (`k8s.io/apiserver/pkg/authentication/serviceaccount`).
pub const POD_NAME_KEY: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_KEY: &str = "authentication.kubernetes.io/pod-uid";
pub const NODE_NAME_KEY: &str = "authentication.kubernetes.io/node-name";
pub const NODE_UID_KEY: &str = "authentication.kubernetes.io/node-uid";

/// `TokenRequest` in protobuf (k8s.io/api/authentication/v1 generated.proto), as `kubectl create
/// token` sends it; the status (3) is the server's.
static BOUND_OBJECT_REFERENCE: Message = Message {
    name: "BoundObjectReference",
    fields: &[f(1, "kind", Ty::Str), f(2, "apiVersion", Ty::Str), f(3, "name", Ty::Str), f(4, "uid", Ty::Str)],
    skip: &[],
};
static TOKEN_REQUEST_SPEC: Message = Message {
    name: "TokenRequestSpec",
    fields: &[rep(1, "audiences", Ty::Str), f(3, "boundObjectRef", Ty::Msg(&BOUND_OBJECT_REFERENCE)), ptr(4, "expirationSeconds", Ty::Int)],
    skip: &[],
};
static TOKEN_REQUEST: Message = Message {
    name: "TokenRequest",
    fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META)), f(2, "spec", Ty::Msg(&TOKEN_REQUEST_SPEC))],
    skip: &[3],
};

/// What a token can be bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BoundKind {
    Pod,
    Node,
}

impl BoundKind {
    fn plural(self) -> &'static str {
        match self {
            BoundKind::Pod => "pods",
            BoundKind::Node => "nodes",
        }
    }
}

/// `spec.boundObjectRef`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct BoundRef {
    kind: BoundKind,
    name: String,
    uid: Option<String>,
}

/// A `TokenRequest`'s spec, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Spec {
    audiences: Vec<String>,
    expiration_seconds: i64,
    bound: Option<BoundRef>,
}

/// The object a minted token is bound to, as it was at minting.
#[derive(Clone, Debug)]
struct Bound {
    kind: BoundKind,
    namespace: Option<String>,
    name: String,
    uid: String,
}

/// What a minted token stands for.
#[derive(Clone, Debug)]
struct Minted {
    namespace: String,
    service_account: String,
    service_account_uid: String,
    audiences: Vec<String>,
    expires: Timestamp,
    bound: Option<Bound>,
    extra: BTreeMap<String, Vec<String>>,
}

/// Who a reviewed token authenticates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenUser {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
    /// The audiences both the token and the review name.
    pub audiences: Vec<String>,
}

/// The minted tokens, by the SHA-256 of the token.
#[derive(Default)]
pub struct Tokens {
    minted: Mutex<HashMap<[u8; 32], Minted>>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn invalid(causes: &[Cause]) -> ApiError {
    ApiError::invalid("authentication.k8s.io", "TokenRequest", "", causes)
}

fn text<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Reads and checks a `TokenRequest` body, as kube-apiserver's validation and defaulting.
fn parse_spec(body: &Value) -> Result<Spec, ApiError> {
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let mut causes = Vec::new();
    let audiences: Vec<String> = match spec.get("audiences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        Some(_) => return Err(ApiError::bad_request("spec.audiences must be a list of strings")),
    };
    let expiration_seconds = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => v.as_i64().ok_or_else(|| ApiError::bad_request("spec.expirationSeconds must be an integer"))?,
    };
    if expiration_seconds < MIN_EXPIRATION_SECONDS {
        causes.push(Cause::new(
            CauseType::Invalid,
            "spec.expirationSeconds",
            format!("Invalid value: {expiration_seconds}: may not specify a duration less than 10 minutes"),
        ));
    }
    if expiration_seconds > MAX_EXPIRATION_SECONDS {
        causes.push(Cause::new(
            CauseType::Invalid,
            "spec.expirationSeconds",
            format!("Invalid value: {expiration_seconds}: may not specify a duration larger than 2^32 seconds"),
        ));
    }
    let bound = match spec.get("boundObjectRef") {
        None | Some(Value::Null) => None,
        Some(r) => {
            let (kind, api_version, name) = (text(r, "/kind"), text(r, "/apiVersion"), text(r, "/name"));
            let kind = match kind {
                "Pod" => Some(BoundKind::Pod),
                "Node" => Some(BoundKind::Node),
                // kube-apiserver refuses other kinds later, in its storage, as 400 "cannot bind
                // token to object of type ..." (and also binds to Secrets, which nothing here
                // needs); here a 422 names the field.
                other => {
                    causes.push(Cause::new(
                        CauseType::NotSupported,
                        "spec.boundObjectRef.kind",
                        format!("Unsupported value: {other:?}: supported values: \"Node\", \"Pod\""),
                    ));
                    None
                }
            };
            if !(api_version.is_empty() || api_version == "v1") {
                causes.push(Cause::new(
                    CauseType::NotSupported,
                    "spec.boundObjectRef.apiVersion",
                    format!("Unsupported value: {api_version:?}: supported values: \"v1\""),
                ));
            }
            if name.is_empty() {
                causes.push(Cause::new(CauseType::Required, "spec.boundObjectRef.name", "Required value"));
            }
            let uid = Some(text(r, "/uid")).filter(|u| !u.is_empty()).map(str::to_owned);
            kind.map(|kind| BoundRef { kind, name: name.to_owned(), uid })
        }
    };
    if !causes.is_empty() {
        return Err(invalid(&causes));
    }
    Ok(Spec { audiences, expiration_seconds, bound })
}

fn def(plural: &str) -> Result<&'static registry::ResourceDef, ApiError> {
    registry::find("", "v1", plural).ok_or_else(ApiError::no_resource)
}

/// The stored object `plural` `name` (in `ns`), or kube-apiserver's 404.
fn read(objects: &Objects, plural: &str, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
    Ok(objects.get(def(plural)?, ns, name)?.object.value())
}

fn uid_of(obj: &Value) -> String {
    text(obj, "/metadata/uid").to_owned()
}

fn stamp(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl Tokens {
    /// Mints a token for the ServiceAccount `ns/name` as the `TokenRequest` `body` asks, at
    /// `now`: the answered `TokenRequest` (with `status`).
    ///
    /// # Errors
    /// 422 naming the field for a bad spec; 404 when the ServiceAccount or the bound object does
    /// not exist; 400 for a Pod that runs as another ServiceAccount; 409 when the bound object's
    /// UID is not the one the request names.
    pub fn mint(&self, objects: &Objects, ns: &str, name: &str, body: &Value, now: Timestamp) -> Result<Value, ApiError> {
        let spec = parse_spec(body)?;
        let account = read(objects, "serviceaccounts", Some(ns), name)?;
        let mut extra = BTreeMap::new();
        let bound = match &spec.bound {
            None => None,
            Some(r) => {
                let namespace = (r.kind == BoundKind::Pod).then(|| ns.to_owned());
                let obj = read(objects, r.kind.plural(), namespace.as_deref(), &r.name)?;
                let uid = uid_of(&obj);
                if r.uid.as_ref().is_some_and(|want| *want != uid) {
                    return Err(ApiError::conflict_message(format!(
                        "the UID in the bound object reference ({}) does not match the UID in record ({uid}). The object might have been deleted and then recreated",
                        r.uid.as_deref().unwrap_or_default()
                    )));
                }
                match r.kind {
                    BoundKind::Pod => {
                        let runs_as = Some(text(&obj, "/spec/serviceAccountName")).filter(|s| !s.is_empty()).unwrap_or("default");
                        if runs_as != name {
                            return Err(ApiError::bad_request(format!(
                                "cannot bind token for serviceaccount {name:?} to pod running with serviceaccount {runs_as:?}"
                            )));
                        }
                        extra.insert(POD_NAME_KEY.to_owned(), vec![r.name.clone()]);
                        extra.insert(POD_UID_KEY.to_owned(), vec![uid.clone()]);
                        // KEP-4193 (ServiceAccountTokenPodNodeInfo): the node the Pod is bound to,
                        // as it is when the token is minted.
                        let node = text(&obj, "/spec/nodeName");
                        if !node.is_empty() {
                            extra.insert(NODE_NAME_KEY.to_owned(), vec![node.to_owned()]);
                            if let Ok(n) = read(objects, "nodes", None, node) {
                                extra.insert(NODE_UID_KEY.to_owned(), vec![uid_of(&n)]);
                            }
                        }
                    }
                    BoundKind::Node => {
                        extra.insert(NODE_NAME_KEY.to_owned(), vec![r.name.clone()]);
                        extra.insert(NODE_UID_KEY.to_owned(), vec![uid.clone()]);
                    }
                }
                Some(Bound { kind: r.kind, namespace, name: r.name.clone(), uid })
            }
        };
        let expires = now.checked_add(SignedDuration::from_secs(spec.expiration_seconds)).map_err(|_| {
            invalid(&[Cause::new(CauseType::Invalid, "spec.expirationSeconds", "the expiry is past the last representable time")])
        })?;
        let audiences = if spec.audiences.is_empty() { vec![API_AUDIENCE.to_owned()] } else { spec.audiences.clone() };
        let bytes: [u8; 32] = rand::random();
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let minted = Minted {
            namespace: ns.to_owned(),
            service_account: name.to_owned(),
            service_account_uid: uid_of(&account),
            audiences: audiences.clone(),
            expires,
            bound,
            extra,
        };
        {
            let mut all = self.minted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            all.retain(|_, m| m.expires > now);
            all.insert(digest(&token), minted);
        }
        let mut answer = json!({
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": stamp(now)},
            "spec": {"audiences": audiences, "expirationSeconds": spec.expiration_seconds, "boundObjectRef": null},
            "status": {"token": token, "expirationTimestamp": stamp(expires)},
        });
        if let Some(r) = &spec.bound {
            answer["spec"]["boundObjectRef"] =
                json!({"kind": if r.kind == BoundKind::Pod { "Pod" } else { "Node" }, "apiVersion": "v1", "name": r.name, "uid": r.uid});
        }
        Ok(answer)
    }

    /// Who `token` authenticates at `now` for a review asking `audiences` (empty: this API
    /// server's): `None` when it is not a token this server minted; `Some(Err(why))` when it
    /// was, but no longer authenticates.
    #[must_use]
    pub fn review(&self, objects: &Objects, token: &str, audiences: &[String], now: Timestamp) -> Option<Result<TokenUser, String>> {
        let m = self.minted.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&digest(token)).cloned()?;
        Some(check(objects, &m, audiences, now))
    }
}

/// Whether the minted token `m` still authenticates (see the module's Guarantees).
fn check(objects: &Objects, m: &Minted, audiences: &[String], now: Timestamp) -> Result<TokenUser, String> {
    if m.expires <= now {
        return Err("service account token has expired".to_owned());
    }
    let gone = |what: String| format!("{what} has been deleted");
    let account = read(objects, "serviceaccounts", Some(&m.namespace), &m.service_account)
        .map_err(|_| gone(format!("service account {}/{}", m.namespace, m.service_account)))?;
    if uid_of(&account) != m.service_account_uid {
        return Err(gone(format!("service account {}/{} (UID {})", m.namespace, m.service_account, m.service_account_uid)));
    }
    if let Some(b) = &m.bound {
        let what = match b.kind {
            BoundKind::Pod => format!("pod {}/{} (UID {})", b.namespace.as_deref().unwrap_or_default(), b.name, b.uid),
            BoundKind::Node => format!("node {} (UID {})", b.name, b.uid),
        };
        let obj = read(objects, b.kind.plural(), b.namespace.as_deref(), &b.name).map_err(|_| gone(what.clone()))?;
        if uid_of(&obj) != b.uid {
            return Err(gone(what));
        }
        // A pod in its deletion grace still authenticates (its processes are being stopped);
        // once the grace is over it no longer does, removed or not (kube-apiserver's rule).
        let due = obj.pointer("/metadata/deletionTimestamp").and_then(Value::as_str).and_then(|t| t.parse::<Timestamp>().ok());
        if due.is_some_and(|t| t < now) {
            return Err(format!("{what} is deleted and awaiting removal"));
        }
    }
    let wanted: Vec<String> = if audiences.is_empty() { vec![API_AUDIENCE.to_owned()] } else { audiences.to_vec() };
    let both: Vec<String> = m.audiences.iter().filter(|a| wanted.contains(a)).cloned().collect();
    if both.is_empty() {
        return Err(format!("token audiences {:?} is invalid for the target audiences {wanted:?}", m.audiences));
    }
    Ok(TokenUser {
        username: format!("system:serviceaccount:{}:{}", m.namespace, m.service_account),
        uid: m.service_account_uid.clone(),
        groups: vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{}", m.namespace),
            "system:authenticated".to_owned(),
        ],
        extra: m.extra.clone(),
        audiences: both,
    })
}

/// `POST /api/v1/namespaces/{namespace}/serviceaccounts/{name}/token`: 201 with the
/// `TokenRequest` and its token.
///
/// # Errors
/// 400 for a body that is neither JSON nor a protobuf `TokenRequest`, and those of [`Tokens::mint`].
pub async fn request(mut c: Call<'_>) -> Result<Response, ApiError> {
    let body = c.body().await?;
    let find = |group: &str, kind: &str| (group == "authentication.k8s.io" && kind == "TokenRequest").then_some(&TOKEN_REQUEST);
    let body = crate::body::parse_object_with(c.header(axum::http::header::CONTENT_TYPE), &body, find)?;
    if body.get("kind").and_then(Value::as_str).is_some_and(|k| k != "TokenRequest") {
        return Err(ApiError::bad_request(format!(
            "the body of serviceaccounts/token must be a TokenRequest, not a {}",
            text(&body, "/kind")
        )));
    }
    let answer = c.st.tokens.mint(&c.st.objects, c.capture("namespace"), c.capture("name"), &body, Timestamp::now())?;
    Ok(crate::reply::json_response(StatusCode::CREATED, &answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn objects() -> (tempfile::TempDir, Objects) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(&dir.path().join("store.db"), &crate::StoreConfig::default()).unwrap();
        let objects = Objects { store, enforce_invariants: true };
        // `default` and its ServiceAccount `default` are created with the namespace.
        objects.create(def("namespaces").unwrap(), None, json!({"metadata": {"name": "ops"}}), false).await.unwrap();
        objects.create(def("serviceaccounts").unwrap(), Some("ops"), json!({"metadata": {"name": "agent"}}), false).await.unwrap();
        for n in ["n1", "n2"] {
            objects.create(def("nodes").unwrap(), None, json!({"metadata": {"name": n}}), false).await.unwrap();
        }
        (dir, objects)
    }

    async fn pod(objects: &Objects, name: &str, account: &str, node: Option<&str>) -> String {
        let mut p =
            json!({"metadata": {"name": name}, "spec": {"serviceAccountName": account, "containers": [{"name": "c", "image": "i"}]}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        let created = objects.create(def("pods").unwrap(), Some("ops"), p, false).await.unwrap();
        uid_of(&created.value())
    }

    fn bound(kind: &str, name: &str) -> Value {
        json!({"spec": {"boundObjectRef": {"kind": kind, "apiVersion": "v1", "name": name}}})
    }

    fn token_of(answer: &Value) -> String {
        answer.pointer("/status/token").and_then(Value::as_str).unwrap().to_owned()
    }

    /// A token bound to a Pod on a node carries the Pod and that node, as kube-apiserver's from
    /// 1.30 (KEP-4193); one bound to a Node carries the Node; an unbound one carries neither.
    #[tokio::test]
    async fn bound_tokens_carry_their_pod_and_node_and_unbound_ones_nothing() {
        let (_dir, objects) = objects().await;
        let tokens = Tokens::default();
        let now = Timestamp::now();
        let pod_uid = pod(&objects, "agent-x", "agent", Some("n1")).await;
        let node_uid = uid_of(&read(&objects, "nodes", None, "n1").unwrap());
        let on_pod = tokens.mint(&objects, "ops", "agent", &bound("Pod", "agent-x"), now).unwrap();
        assert_eq!(on_pod.pointer("/spec/expirationSeconds"), Some(&json!(DEFAULT_EXPIRATION_SECONDS)));
        assert_eq!(on_pod.pointer("/spec/audiences"), Some(&json!([API_AUDIENCE])));
        assert_eq!(
            on_pod.pointer("/status/expirationTimestamp"),
            Some(&json!(stamp(now.checked_add(SignedDuration::from_secs(3600)).unwrap())))
        );
        let token = token_of(&on_pod);
        assert!(token.len() >= 32, "at least 128 bits: {token}");
        let user = tokens.review(&objects, &token, &[], now).unwrap().unwrap();
        assert_eq!(user.username, "system:serviceaccount:ops:agent");
        assert_eq!(user.groups, ["system:serviceaccounts", "system:serviceaccounts:ops", "system:authenticated"]);
        let want: BTreeMap<String, Vec<String>> = [
            (POD_NAME_KEY, "agent-x".to_owned()),
            (POD_UID_KEY, pod_uid),
            (NODE_NAME_KEY, "n1".to_owned()),
            (NODE_UID_KEY, node_uid.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), vec![v]))
        .collect();
        assert_eq!(user.extra, want);

        let on_node = token_of(&tokens.mint(&objects, "ops", "agent", &bound("Node", "n1"), now).unwrap());
        let user = tokens.review(&objects, &on_node, &[], now).unwrap().unwrap();
        assert_eq!(user.extra.get(NODE_NAME_KEY), Some(&vec!["n1".to_owned()]));
        assert_eq!(user.extra.get(NODE_UID_KEY), Some(&vec![node_uid]));
        assert!(!user.extra.contains_key(POD_NAME_KEY));

        let unbound = token_of(&tokens.mint(&objects, "ops", "agent", &json!({}), now).unwrap());
        assert!(tokens.review(&objects, &unbound, &[], now).unwrap().unwrap().extra.is_empty());
        // A Pod not yet bound to a node gives a token without a node.
        pod(&objects, "pending", "agent", None).await;
        let pending = token_of(&tokens.mint(&objects, "ops", "agent", &bound("Pod", "pending"), now).unwrap());
        assert!(!tokens.review(&objects, &pending, &[], now).unwrap().unwrap().extra.contains_key(NODE_NAME_KEY));
        assert!(tokens.review(&objects, "not-minted-here", &[], now).is_none(), "a token this server never minted is nobody's");
    }

    /// A token outlives neither its expiry nor its bound object (deleted, or replaced under the
    /// same name), nor its ServiceAccount; and it is only for its audiences.
    #[tokio::test]
    async fn expired_tokens_and_tokens_of_deleted_objects_do_not_authenticate() {
        let (_dir, objects) = objects().await;
        let tokens = Tokens::default();
        let now = Timestamp::now();
        pod(&objects, "agent-x", "agent", Some("n1")).await;
        let ask = json!({"spec": {"expirationSeconds": 600, "boundObjectRef": {"kind": "Pod", "name": "agent-x"}}});
        let token = token_of(&tokens.mint(&objects, "ops", "agent", &ask, now).unwrap());
        let later = |s| now.checked_add(SignedDuration::from_secs(s)).unwrap();
        assert!(tokens.review(&objects, &token, &[], later(599)).unwrap().is_ok());
        let expired = tokens.review(&objects, &token, &[], later(600)).unwrap().unwrap_err();
        assert_eq!(expired, "service account token has expired");

        let other_audience = tokens.review(&objects, &token, &["vault".to_owned()], now).unwrap().unwrap_err();
        assert!(other_audience.contains("is invalid for the target audiences"), "{other_audience}");
        let for_vault = json!({"spec": {"audiences": ["vault"]}});
        let vault = token_of(&tokens.mint(&objects, "ops", "agent", &for_vault, now).unwrap());
        assert_eq!(tokens.review(&objects, &vault, &["vault".to_owned()], now).unwrap().unwrap().audiences, ["vault"]);
        assert!(tokens.review(&objects, &vault, &[], now).unwrap().is_err(), "not for the API server");

        // Deleted with its grace (30 s: it runs on n1), the pod's token works through the
        // grace, not after; once its kubelet removes it, it is refused as deleted.
        let pods = def("pods").unwrap();
        objects.delete(pods, Some("ops"), "agent-x", &crate::objects::DeleteOptions::default()).await.unwrap();
        assert!(tokens.review(&objects, &token, &[], now).unwrap().is_ok(), "in its grace");
        let over = tokens.review(&objects, &token, &[], later(31)).unwrap().unwrap_err();
        assert!(over.starts_with("pod ops/agent-x") && over.ends_with("is deleted and awaiting removal"), "{over}");
        let force = crate::objects::DeleteOptions { grace_period: Some(0), ..crate::objects::DeleteOptions::default() };
        objects.delete(pods, Some("ops"), "agent-x", &force).await.unwrap();
        let deleted = tokens.review(&objects, &token, &[], now).unwrap().unwrap_err();
        assert!(deleted.starts_with("pod ops/agent-x") && deleted.ends_with("has been deleted"), "{deleted}");
        // The same name again is another Pod: the token stays refused.
        pod(&objects, "agent-x", "agent", Some("n1")).await;
        assert!(tokens.review(&objects, &token, &[], now).unwrap().is_err(), "a Pod recreated under the name is not the token's");

        let node_token = token_of(&tokens.mint(&objects, "ops", "agent", &bound("Node", "n2"), now).unwrap());
        objects.delete(def("nodes").unwrap(), None, "n2", &crate::objects::DeleteOptions::default()).await.unwrap();
        assert!(tokens.review(&objects, &node_token, &[], now).unwrap().unwrap_err().starts_with("node n2"));

        let unbound = token_of(&tokens.mint(&objects, "ops", "agent", &json!({}), now).unwrap());
        objects.delete(def("serviceaccounts").unwrap(), Some("ops"), "agent", &crate::objects::DeleteOptions::default()).await.unwrap();
        assert!(tokens.review(&objects, &unbound, &[], now).unwrap().unwrap_err().starts_with("service account ops/agent"));
    }

    /// What kube-apiserver refuses is refused here, with its codes and the field named.
    #[tokio::test]
    async fn requests_kube_apiserver_refuses_are_refused() {
        let (_dir, objects) = objects().await;
        let tokens = Tokens::default();
        let now = Timestamp::now();
        let mint = |account: &str, body: Value| tokens.mint(&objects, "ops", account, &body, now).unwrap_err();

        let missing = mint("nobody", json!({}));
        assert_eq!((missing.code, missing.message.as_str()), (404, "serviceaccounts \"nobody\" not found"));
        let short = mint("agent", json!({"spec": {"expirationSeconds": 60}}));
        assert_eq!(
            (short.code, short.message.as_str()),
            (422, "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes")
        );
        let kind = mint("agent", bound("Secret", "s"));
        assert_eq!(kind.code, 422);
        assert_eq!(kind.details.as_ref().and_then(|d| d.pointer("/causes/0/field")), Some(&json!("spec.boundObjectRef.kind")));
        assert!(kind.message.contains("spec.boundObjectRef.kind: Unsupported value: \"Secret\""), "{}", kind.message);
        assert_eq!(mint("agent", bound("Pod", "absent")).code, 404);
        assert_eq!(mint("agent", bound("Node", "absent")).code, 404);
        pod(&objects, "web", "default", Some("n1")).await;
        let other_account = mint("agent", bound("Pod", "web"));
        assert_eq!(
            (other_account.code, other_account.message.as_str()),
            (400, "cannot bind token for serviceaccount \"agent\" to pod running with serviceaccount \"default\"")
        );
        let stale = mint("agent", json!({"spec": {"boundObjectRef": {"kind": "Node", "name": "n1", "uid": "not-its-uid"}}}));
        assert_eq!(stale.code, 409);
    }
}
