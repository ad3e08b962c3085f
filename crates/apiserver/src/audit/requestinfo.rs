//! What a request asks of which resource, classified as kube-apiserver's `RequestInfoFactory`
//! does (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`), from the method, path and
//! query alone: the same words RBAC rules are written in (verb, API group, resource,
//! subresource). Independent of [`crate::routes`] on purpose: a request is classified the way a
//! real API server would authorize it, whether or not virtplug serves the path.
//!
//! # Guarantees
//! - A path below `/api/{version}/` or `/apis/{group}/{version}/` is a resource request; every
//!   other path (`/healthz`, `/version`, `/openapi/v2`, and the discovery documents `/api`,
//!   `/api/v1`, `/apis`, `/apis/{group}[/{version}]`) is a non-resource URL, and its verb is the
//!   lower-cased method.
//! - A resource request's verb is one of get, list, watch, create, update, patch, delete,
//!   deletecollection; an unknown method gives an empty verb, as in Kubernetes.
//!
//! # Caveats
//! Kubernetes' legacy `/api/v1/watch/...` and `proxy` prefixes are classified as it does
//! (`watch`, `proxy`), though virtplug serves neither.

use http::Method;

/// A request's RBAC attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// Under `/api/` or `/apis/{group}/{version}/`.
    pub is_resource_request: bool,
    pub verb: String,
    /// `""` for the core group.
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

/// Kubernetes' `namespaceSubresources`: `namespaces/{name}/status` names the Namespace's
/// subresource, not a resource `status` in that namespace.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// Classifies a request (see the module docs). `query` is the raw query string.
#[must_use]
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> RequestInfo {
    let parts: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let non_resource = || RequestInfo { verb: method.as_str().to_lowercase(), ..RequestInfo::default() };
    let (group, version, mut rest) = match parts.as_slice() {
        // `/api/v1` and `/apis/{group}/{version}` alone are discovery: non-resource URLs.
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return non_resource(),
    };
    let mut info = RequestInfo {
        is_resource_request: true,
        api_group: group.to_owned(),
        api_version: version.to_owned(),
        verb: match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_owned(),
        ..RequestInfo::default()
    };
    // `/api/v1/watch/...` and `/api/v1/proxy/...`: the verb is the prefix, whatever the method.
    if let [first @ ("watch" | "proxy"), tail @ ..] = rest {
        if !tail.is_empty() {
            info.verb = (*first).to_owned();
            rest = tail;
        }
    }
    let special = matches!(info.verb.as_str(), "proxy");
    if let ["namespaces", ns, tail @ ..] = rest {
        info.namespace = (*ns).to_owned();
        // `namespaces/{name}` and its subresources stay the resource `namespaces`.
        if !tail.is_empty() && !NAMESPACE_SUBRESOURCES.contains(&tail[0]) {
            rest = tail;
        }
    }
    if rest.len() >= 3 && !special {
        info.subresource = rest[2].to_owned();
    }
    if rest.len() >= 2 {
        info.name = rest[1].to_owned();
    }
    if let Some(r) = rest.first() {
        info.resource = (*r).to_owned();
    }
    if info.name.is_empty() && info.verb == "get" {
        let watch = query_flag(query, "watch");
        info.verb = if watch { "watch" } else { "list" }.to_owned();
        // A list or watch narrowed to one name by `metadata.name=` is about that object, as in
        // Kubernetes (RBAC's resourceNames apply to it).
        if let Some(name) = query_param(query, "fieldSelector").and_then(|f| f.strip_prefix("metadata.name=").map(str::to_owned)) {
            if !name.contains(',') {
                info.name = name;
            }
        }
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".to_owned();
    }
    info
}

/// The value of query parameter `key` (its last occurrence), decoded.
fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes()).filter(|(k, _)| k == key).map(|(_, v)| v.into_owned()).last()
}

/// Whether boolean query parameter `key` is set (`true` or `1`, as Kubernetes parses it).
fn query_flag(query: Option<&str>, key: &str) -> bool {
    query_param(query, key).is_some_and(|v| v == "true" || v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: &str, uri: &str) -> (String, String, String, String, String, String) {
        let (path, query) = uri.split_once('?').map_or((uri, None), |(p, q)| (p, Some(q)));
        let i = classify(&Method::from_bytes(method.as_bytes()).unwrap(), path, query);
        (i.verb, i.api_group, i.resource, i.subresource, i.namespace, i.name)
    }

    fn t(v: &str, g: &str, r: &str, s: &str, ns: &str, n: &str) -> (String, String, String, String, String, String) {
        (v.into(), g.into(), r.into(), s.into(), ns.into(), n.into())
    }

    /// The cases of Kubernetes' own `TestGetAPIRequestInfo`, and the paths virtplug's
    /// components send.
    #[test]
    fn requests_are_classified_as_kube_apiserver_does() {
        let vm = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
        for (method, uri, want) in [
            ("GET", "/api/v1/namespaces", t("list", "", "namespaces", "", "", "")),
            ("GET", "/api/v1/namespaces/other", t("get", "", "namespaces", "", "other", "other")),
            ("PUT", "/api/v1/namespaces/other/finalize", t("update", "", "namespaces", "finalize", "other", "other")),
            ("GET", "/api/v1/namespaces/other/pods", t("list", "", "pods", "", "other", "")),
            ("GET", "/api/v1/namespaces/other/pods/foo", t("get", "", "pods", "", "other", "foo")),
            ("HEAD", "/api/v1/namespaces/other/pods/foo", t("get", "", "pods", "", "other", "foo")),
            ("GET", "/api/v1/pods", t("list", "", "pods", "", "", "")),
            ("GET", "/api/v1/pods?watch=true", t("watch", "", "pods", "", "", "")),
            ("GET", "/api/v1/pods?watch=1&resourceVersion=5", t("watch", "", "pods", "", "", "")),
            ("GET", "/api/v1/pods?watch=false", t("list", "", "pods", "", "", "")),
            ("GET", "/api/v1/watch/namespaces/other/pods", t("watch", "", "pods", "", "other", "")),
            ("GET", "/api/v1/namespaces/other/pods?fieldSelector=metadata.name%3Dfoo", t("list", "", "pods", "", "other", "foo")),
            ("POST", "/api/v1/namespaces/other/pods", t("create", "", "pods", "", "other", "")),
            ("PUT", "/api/v1/namespaces/other/pods/foo/status", t("update", "", "pods", "status", "other", "foo")),
            ("PATCH", "/api/v1/nodes/n1/status", t("patch", "", "nodes", "status", "", "n1")),
            ("DELETE", "/api/v1/namespaces/other/pods/foo", t("delete", "", "pods", "", "other", "foo")),
            ("DELETE", "/api/v1/namespaces/other/pods", t("deletecollection", "", "pods", "", "other", "")),
            ("GET", &format!("{vm}/vm1") as &str, t("get", "kubevirt.io", "virtualmachines", "", "default", "vm1")),
            ("PATCH", &format!("{vm}/vm1/status") as &str, t("patch", "kubevirt.io", "virtualmachines", "status", "default", "vm1")),
            (
                "PUT",
                "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/vm1/addvolume",
                t("update", "subresources.kubevirt.io", "virtualmachines", "addvolume", "default", "vm1"),
            ),
            ("GET", "/apis/storage.k8s.io/v1/storageclasses", t("list", "storage.k8s.io", "storageclasses", "", "", "")),
            ("PROPFIND", "/api/v1/pods", t("", "", "pods", "", "", "")),
        ] {
            assert_eq!(c(method, uri), want, "{method} {uri}");
        }
    }

    #[test]
    fn discovery_health_and_openapi_are_non_resource_urls() {
        for (method, path) in
            [("GET", "/healthz"), ("GET", "/apis"), ("GET", "/apis/kubevirt.io"), ("GET", "/openapi/v2"), ("POST", "/version")]
        {
            let i = classify(&Method::from_bytes(method.as_bytes()).unwrap(), path, None);
            assert!(!i.is_resource_request, "{path}");
            assert_eq!(i.verb, method.to_lowercase(), "{path}");
        }
        for path in ["/api", "/api/v1", "/apis/kubevirt.io/v1"] {
            assert!(!classify(&Method::GET, path, None).is_resource_request, "{path}");
        }
    }
}
