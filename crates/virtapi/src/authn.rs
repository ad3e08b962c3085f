//! Who sent a request, as an aggregated API server decides it (kube-apiserver's
//! `--requestheader-*` front proxy, then delegated bearer tokens).
//!
//! # Flow
//! 1. Front proxy: a request on a connection whose client certificate was verified against the
//!    request-header CA ([`RequestHeader::client_ca_pem`], checked by TLS during the handshake)
//!    and whose common name is one of [`RequestHeader::allowed_names`] (any, when the list is
//!    empty, as kube-apiserver) is the user its username header names (`X-Remote-User`), with the
//!    groups of its group headers and the extras of its extra-header prefix.
//! 2. Otherwise a `Authorization: Bearer` token is sent to the API server as a `TokenReview`.
//! 3. Otherwise: 401.
//!
//! # Guarantees
//! - The `X-Remote-*` headers are read only in step 1: a client without the front proxy's
//!   certificate (or with one of a name not allowed) cannot choose its user by sending them.
//! - A request authenticated by neither is answered 401 before its body is read.
//!
//! # Caveats
//! Client certificates other than the front proxy's CA's fail the TLS handshake (kube-apiserver
//! would also accept its `--client-ca-file` users): a client connecting directly authenticates
//! with a bearer token. Token reviews are not cached (every request with a token costs one review; node agents
//! send one per tunnel and stream connection, users come through the front proxy). The
//! request-header settings are read once at start ([`RequestHeader::from_cluster`]): a rotated
//! front-proxy CA needs a restart.

use std::collections::BTreeMap;

use http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::{json, Value};

/// The authenticated caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The namespace and name of the ConfigMap kube-apiserver publishes its front-proxy settings in.
pub const AUTHENTICATION_CONFIGMAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// kube-apiserver's `--requestheader-*` settings.
#[derive(Clone, Debug)]
pub struct RequestHeader {
    /// The CA that signs the front proxy's client certificate (PEM).
    pub client_ca_pem: String,
    /// Common names the front proxy's certificate may have; empty: any signed by the CA.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub uid_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_prefixes: Vec<String>,
}

/// Why the request-header settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read ConfigMap {}/{}", AUTHENTICATION_CONFIGMAP.0, AUTHENTICATION_CONFIGMAP.1)]
    Read(#[source] kube::Error),
    #[error("ConfigMap {}/{}: {key} is not a JSON list of strings", AUTHENTICATION_CONFIGMAP.0, AUTHENTICATION_CONFIGMAP.1)]
    NotAList { key: &'static str },
}

impl RequestHeader {
    /// Reads kube-apiserver's `extension-apiserver-authentication` ConfigMap in `kube-system`
    /// (what the `extension-apiserver-authentication-reader` Role grants). `Ok(None)` when it
    /// holds no `requestheader-client-ca-file`: kube-apiserver runs without a front proxy, and
    /// only bearer tokens authenticate.
    ///
    /// # Errors
    /// When the ConfigMap cannot be read, or a list in it is not a JSON list of strings.
    pub async fn from_cluster(client: &kube::Client) -> Result<Option<RequestHeader>, ConfigError> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), AUTHENTICATION_CONFIGMAP.0);
        let Some(cm) = api.get_opt(AUTHENTICATION_CONFIGMAP.1).await.map_err(ConfigError::Read)? else { return Ok(None) };
        let data = cm.data.unwrap_or_default();
        let Some(ca) = data.get("requestheader-client-ca-file").filter(|c| !c.trim().is_empty()) else { return Ok(None) };
        let list = |key: &'static str, default: &[&str]| -> Result<Vec<String>, ConfigError> {
            match data.get(key) {
                None => Ok(default.iter().map(|s| (*s).to_owned()).collect()),
                Some(text) => serde_json::from_str(text).map_err(|_| ConfigError::NotAList { key }),
            }
        };
        Ok(Some(RequestHeader {
            client_ca_pem: ca.clone(),
            allowed_names: list("requestheader-allowed-names", &[])?,
            username_headers: list("requestheader-username-headers", &["X-Remote-User"])?,
            uid_headers: list("requestheader-uid-headers", &[])?,
            group_headers: list("requestheader-group-headers", &["X-Remote-Group"])?,
            extra_prefixes: list("requestheader-extra-headers-prefix", &["X-Remote-Extra-"])?,
        }))
    }

    /// Whether a verified client certificate `leaf` (DER) is the front proxy's.
    #[must_use]
    pub fn allows(&self, leaf: &[u8]) -> bool {
        if self.allowed_names.is_empty() {
            return true;
        }
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else { return false };
        let cn = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok());
        cn.is_some_and(|cn| self.allowed_names.iter().any(|a| a == cn))
    }

    /// The user the front proxy's headers name; `None` without a username header.
    #[must_use]
    pub fn user(&self, headers: &HeaderMap) -> Option<User> {
        let values = |name: &str| headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::to_owned).collect::<Vec<_>>();
        let name = self.username_headers.iter().find_map(|h| values(h).into_iter().find(|v| !v.is_empty()))?;
        let uid = self.uid_headers.iter().find_map(|h| values(h).into_iter().find(|v| !v.is_empty())).unwrap_or_default();
        let groups = self.group_headers.iter().flat_map(|h| values(h)).collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in headers {
            let Ok(v) = v.to_str() else { continue };
            for prefix in &self.extra_prefixes {
                if let Some(key) = k.as_str().strip_prefix(&prefix.to_ascii_lowercase()) {
                    // Extra keys are percent-encoded in the header name (kube-aggregator's
                    // `headerKeyEscape`, undone by `url.PathUnescape`: a `+` stays a `+`).
                    let escaped = format!("k={}", key.replace('+', "%2B"));
                    let key: String = form_urlencoded::parse(escaped.as_bytes()).map(|(_, v)| v.into_owned()).next().unwrap_or_default();
                    extra.entry(key.to_lowercase()).or_default().push(v.to_owned());
                }
            }
        }
        Some(User { name, uid, groups, extra })
    }
}

/// Asks the API server who holds `token` (a `TokenReview`). `Ok(None)`: nobody.
///
/// # Errors
/// When the API server cannot be asked.
pub async fn review_token(client: &kube::Client, token: &str) -> Result<Option<User>, kube::Error> {
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
    let req = http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&review).unwrap_or_default())
        .map_err(kube::Error::HttpError)?;
    let answer: Value = client.request(req).await?;
    if answer.pointer("/status/authenticated") != Some(&json!(true)) {
        return Ok(None);
    }
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
    };
    let user = answer.pointer("/status/user").cloned().unwrap_or_default();
    let extra = user
        .get("extra")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), strings(Some(v)))).collect())
        .unwrap_or_default();
    Ok(Some(User {
        name: user.get("username").and_then(Value::as_str).unwrap_or_default().to_owned(),
        uid: user.get("uid").and_then(Value::as_str).unwrap_or_default().to_owned(),
        groups: strings(user.get("groups")),
        extra,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(allowed: &[&str]) -> RequestHeader {
        RequestHeader {
            client_ca_pem: String::new(),
            allowed_names: allowed.iter().map(|s| (*s).to_owned()).collect(),
            username_headers: vec!["X-Remote-User".into()],
            uid_headers: vec![],
            group_headers: vec!["X-Remote-Group".into()],
            extra_prefixes: vec!["X-Remote-Extra-".into()],
        }
    }

    #[test]
    fn the_headers_name_the_user_its_groups_and_extras() {
        let mut h = HeaderMap::new();
        h.insert("x-remote-user", "alice".parse().unwrap());
        h.append("x-remote-group", "ops".parse().unwrap());
        h.append("x-remote-group", "system:authenticated".parse().unwrap());
        h.insert("x-remote-extra-scopes%2fa", "one".parse().unwrap());
        h.insert("x-remote-extra-authentication.kubernetes.io%2Fnode-name", "n1".parse().unwrap());
        h.insert("x-remote-extra-a+b", "plus".parse().unwrap());
        let u = settings(&[]).user(&h).unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, ["ops", "system:authenticated"]);
        assert_eq!(u.extra.get("scopes/a").map(Vec::as_slice), Some(&["one".to_owned()][..]));
        assert_eq!(u.extra.get("authentication.kubernetes.io/node-name").map(Vec::as_slice), Some(&["n1".to_owned()][..]));
        assert!(u.extra.contains_key("a+b"), "a `+` is not a space in a path escape: {:?}", u.extra);
        assert!(settings(&[]).user(&HeaderMap::new()).is_none(), "no username header, no user");
    }

    #[test]
    fn only_an_allowed_common_name_is_the_front_proxy() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "front-proxy-client");
        let der = params.self_signed(&key).unwrap().der().to_vec();
        assert!(settings(&["front-proxy-client"]).allows(&der));
        assert!(settings(&[]).allows(&der), "an empty list allows any name");
        assert!(!settings(&["aggregator"]).allows(&der));
    }
}
