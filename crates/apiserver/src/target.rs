//! What a resource path names ([`Resource`]): the core group's `/api/{version}/...` or a
//! group's `/apis/{group}/{version}/...`, then
//! - for a namespaced resource `namespaces/{namespace}/{plural}[/{name}[/status]]`, or
//!   `{plural}` alone (a list across namespaces);
//! - for a cluster-scoped one `{plural}[/{name}[/status]]`.
//!
//! In the core group `namespaces/{name}/status` and `namespaces/{name}/finalize` name a
//! Namespace's subresource, not a resource called `status` in that namespace.

use std::collections::HashMap;
use std::fmt;

use crate::objects::Part;
use crate::query::ListOptions;
use crate::registry::{self, ResourceDef};
use crate::status::ApiError;

/// What of a resource a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `.../{plural}`: the collection (list, watch, create, delete many).
    Collection,
    /// `.../{plural}/{name}`: one object.
    Object,
    /// `.../{plural}/{name}/status`: its status subresource.
    Status,
    /// `.../{plural}/{name}/scale`: a custom resource's scale subresource.
    Scale,
}

/// A resource path and its query, parsed.
pub struct Resource {
    pub def: &'static ResourceDef,
    pub ns: Option<String>,
    /// `None` for [`Shape::Collection`].
    pub name: Option<String>,
    pub shape: Shape,
    pub opts: ListOptions,
}

impl Resource {
    /// The part of the object a write changes.
    #[must_use]
    pub fn part(&self) -> Part {
        if self.shape == Shape::Status {
            Part::Status
        } else {
            Part::Main
        }
    }

    /// The object's name.
    ///
    /// # Errors
    /// 404 for a collection (the routes never ask it of one).
    pub fn name(&self) -> Result<&str, ApiError> {
        self.name.as_deref().ok_or_else(ApiError::no_resource)
    }

    /// The path's template (`/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}`),
    /// for the request's log span.
    #[must_use]
    pub fn template(&self) -> impl fmt::Display + '_ {
        Template(self)
    }
}

struct Template<'a>(&'a Resource);

impl fmt::Display for Template<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.0;
        f.write_str(if r.def.group.is_empty() { "/api/{version}" } else { "/apis/{group}/{version}" })?;
        if r.ns.is_some() {
            f.write_str("/namespaces/{namespace}")?;
        }
        f.write_str(match r.shape {
            Shape::Collection => "/{plural}",
            Shape::Object => "/{plural}/{name}",
            Shape::Status => "/{plural}/{name}/status",
            Shape::Scale => "/{plural}/{name}/scale",
        })
    }
}

/// Parses a resource path (its non-empty segments) and the query.
///
/// # Errors
/// 404 when the path names no served resource (or a subresource other than a served
/// `status`), 400 for a bad query.
pub fn parse(segs: &[&str], query: &HashMap<String, String>) -> Result<Resource, ApiError> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_resource()),
    };
    let find = |plural: &str| registry::find(group, version, plural).ok_or_else(ApiError::no_resource);
    let own = |s: &&str| (*s).to_owned();
    let (def, ns, name, sub) = match rest {
        ["namespaces", ns, plural, tail @ ..] if !group.is_empty() || !matches!(*plural, "status" | "finalize") => {
            let def = find(plural)?;
            if !def.namespaced {
                return Err(ApiError::no_resource());
            }
            let (name, sub) = match tail {
                [] => (None, None),
                [n] => (Some(own(n)), None),
                [n, s] => (Some(own(n)), Some(*s)),
                _ => return Err(ApiError::no_resource()),
            };
            (def, Some((*ns).to_owned()), name, sub)
        }
        [plural, tail @ ..] => {
            let def = find(plural)?;
            let (name, sub) = match tail {
                [] => (None, None),
                [n] if !def.namespaced => (Some(own(n)), None),
                [n, s] if !def.namespaced => (Some(own(n)), Some(*s)),
                _ => return Err(ApiError::no_resource()),
            };
            (def, None, name, sub)
        }
        _ => return Err(ApiError::no_resource()),
    };
    let opts = ListOptions::parse(query)?;
    if let Some(key) = opts.fields.keys().find(|k| !matches!(*k, "metadata.name" | "metadata.namespace") && !def.field_labels.contains(k)) {
        let supported: Vec<&str> = ["metadata.name", "metadata.namespace"].into_iter().chain(def.field_labels.iter().copied()).collect();
        return Err(ApiError::bad_request(format!(
            "field label not supported: {key} ({} field selectors may name {})",
            def.kind,
            supported.join(", ")
        )));
    }
    let shape = match (&name, sub) {
        (None, _) => Shape::Collection,
        (Some(_), None) => Shape::Object,
        (Some(_), Some("status")) if def.status => Shape::Status,
        (Some(_), Some("scale")) if def.crd.is_some_and(|c| c.scale.is_some()) => Shape::Scale,
        (Some(_), Some(_)) => return Err(ApiError::no_resource()),
    };
    Ok(Resource { def, ns, name, shape, opts })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_path(path: &str) -> Result<Resource, ApiError> {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        parse(&segs, &HashMap::new())
    }

    #[test]
    fn paths_name_collections_objects_and_status() {
        let r = parse_path("/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm1/status").unwrap();
        assert_eq!(
            (r.def.plural, r.ns.as_deref(), r.name.as_deref(), r.shape),
            ("virtualmachines", Some("default"), Some("vm1"), Shape::Status)
        );
        assert_eq!(r.template().to_string(), "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status");
        let r = parse_path("/apis/kubevirt.io/v1/virtualmachines").unwrap();
        assert_eq!((r.ns, r.shape), (None, Shape::Collection));
        // The core group: a Namespace's status, not a resource "status" in namespace "ns1".
        let r = parse_path("/api/v1/namespaces/ns1/status").unwrap();
        assert_eq!((r.def.plural, r.name.as_deref(), r.shape), ("namespaces", Some("ns1"), Shape::Status));
        assert_eq!(r.template().to_string(), "/api/{version}/{plural}/{name}/status");
    }

    #[test]
    fn unknown_paths_and_subresources_are_404() {
        for p in [
            "/api",
            "/apis/kubevirt.io/v1",
            "/apis/kubevirt.io/v1/nothings",
            "/api/v1/namespaces/ns1/persistentvolumeclaims/c/x/y",
            "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm1/console",
            "/api/v1/namespaces/default/namespaces",
        ] {
            assert_eq!(parse_path(p).err().map(|e| e.code), Some(404), "{p}");
        }
    }
}
