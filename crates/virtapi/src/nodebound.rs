//! A node's tunnel is its own agent's: `nodes/NODE/tunnel` and `nodes/NODE/streams/ID` are
//! accepted only from a credential bound to NODE, beside the `SubjectAccessReview` ([`crate::authz`]).
//!
//! RBAC cannot do this: the node agents are one DaemonSet with one ServiceAccount, so a role that
//! lets an agent open its own node's tunnel lets it open every node's, and a compromised agent on
//! node A could take node B's tunnel and receive every console and VNC session of B's VMs. What
//! names the node is the credential: a pod-bound ServiceAccount token (the DaemonSet pod's
//! projected token) carries the node its pod runs on, and kube-apiserver reports it in the user's
//! extra `authentication.kubernetes.io/node-name` (KEP-4193, `ServiceAccountTokenPodNodeInfo`:
//! beta and on by default from Kubernetes 1.30, GA from 1.32), both in a `TokenReview` and in
//! the `X-Remote-Extra-Authentication.kubernetes.io%2Fnode-name` header kube-aggregator forwards.
//!
//! # Guarantees
//! - With the check on (the default), a tunnel or stream request for NODE proceeds only if the
//!   authenticated user has exactly one `authentication.kubernetes.io/node-name` extra value
//!   (keys compared case-insensitively, as front-proxy extras are lower-cased) and it is NODE;
//!   otherwise 403 in kube-apiserver's wording, naming the fix.
//! - Every other request is untouched.
//!
//! # Assumptions
//! The extras are what the API server (TokenReview) or the front proxy (headers trusted only on
//! its verified certificate, [`crate::authn`]) said; a client cannot choose them.

use apiserver::status::ApiError;

use crate::authn::User;
use crate::authz::Attributes;
use crate::TUNNEL_GROUP;

/// The user-info extra that names the node a token is bound to.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// Whether `user` may use the node tunnel `attrs` name: `Ok(())` for anything else, or for a
/// user bound to exactly that node.
///
/// # Errors
/// The 403 (see the module docs).
pub fn check(user: &User, attrs: &Attributes) -> Result<(), ApiError> {
    let Attributes::Resource { group, resource, name: node, .. } = attrs else { return Ok(()) };
    if group != TUNNEL_GROUP || resource != "nodes" {
        return Ok(());
    }
    let values: Vec<&String> =
        user.extra.iter().filter(|(k, _)| k.eq_ignore_ascii_case(NODE_NAME_EXTRA)).flat_map(|(_, v)| v.iter()).collect();
    let why = match values.as_slice() {
        [only] if *only == node => return Ok(()),
        [] => format!("the credential is bound to no node (it has no {NODE_NAME_EXTRA} extra)"),
        [only] => format!("the credential is bound to node {only:?}, not {node:?}"),
        many => format!("the credential names {} nodes in {NODE_NAME_EXTRA}, not one", many.len()),
    };
    Err(attrs.forbidden(
        user,
        &format!(
            "{why}; a node's tunnel is accepted only from a token bound to that node: the node agent must present a token bound to a pod on node {node:?} (the DaemonSet pod's projected ServiceAccount token, which names its node on Kubernetes 1.30 and later)"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;

    fn user(nodes: &[&str], key: &str) -> User {
        let mut u = User { name: "system:serviceaccount:virtplug:virtplug-node".into(), ..User::default() };
        if !nodes.is_empty() {
            u.extra.insert(key.to_owned(), nodes.iter().map(|n| (*n).to_owned()).collect());
        }
        u
    }

    /// Issue 20: only the token bound to node n1 opens n1's tunnel and streams.
    #[test]
    fn only_a_credential_bound_to_the_node_may_use_its_tunnel() {
        let tunnel = Attributes::of(&Method::GET, "/apis/subresources.virtplug.io/v1/nodes/n1/tunnel");
        let stream = Attributes::of(&Method::GET, "/apis/subresources.virtplug.io/v1/nodes/n1/streams/abc");
        for attrs in [&tunnel, &stream] {
            assert!(check(&user(&["n1"], NODE_NAME_EXTRA), attrs).is_ok());
            assert!(check(&user(&["n1"], "Authentication.Kubernetes.io/Node-Name"), attrs).is_ok(), "keys are case-insensitive");
            for (u, why) in [
                (user(&["n2"], NODE_NAME_EXTRA), "the credential is bound to node \"n2\", not \"n1\""),
                (user(&[], NODE_NAME_EXTRA), "the credential is bound to no node"),
                (user(&["n1", "n2"], NODE_NAME_EXTRA), "the credential names 2 nodes"),
                (user(&["n1"], "authentication.kubernetes.io/pod-name"), "the credential is bound to no node"),
            ] {
                let e = check(&u, attrs).unwrap_err();
                assert_eq!(e.code, 403);
                assert!(e.message.contains(why), "{}", e.message);
                assert!(
                    e.message.contains("is forbidden: User \"system:serviceaccount:virtplug:virtplug-node\" cannot get resource \"nodes/"),
                    "{}",
                    e.message
                );
                assert!(
                    e.message.ends_with("projected ServiceAccount token, which names its node on Kubernetes 1.30 and later)"),
                    "{}",
                    e.message
                );
            }
        }
        let console = Attributes::of(&Method::GET, "/apis/subresources.kubevirt.io/v1/namespaces/ns/virtualmachineinstances/vm/console");
        assert!(check(&user(&[], NODE_NAME_EXTRA), &console).is_ok(), "other requests are not node-scoped");
    }
}
