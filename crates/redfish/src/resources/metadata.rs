//! `$metadata`: the CSDL document that references the schema of every type served
//! ([`super::TYPES`]) — generated from the same list the resources take their `@odata.type`
//! from, so the two cannot disagree — plus `RedfishExtensions` for the `@Redfish.*`
//! annotations, and the `Service` entity container.

use std::fmt::Write as _;

use axum::body::Body;
use http::{header, HeaderValue, StatusCode};

use super::{SERVICE_ROOT, TYPES};

/// The document.
#[must_use]
pub fn document() -> String {
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str("<edmx:Edmx xmlns:edmx=\"http://docs.oasis-open.org/odata/ns/edmx\" Version=\"4.0\">\n");
    let mut reference = |file: &str, namespaces: &[String], alias: Option<&str>| {
        let _ = writeln!(x, "  <edmx:Reference Uri=\"http://redfish.dmtf.org/schemas/v1/{file}\">");
        for ns in namespaces {
            match alias {
                Some(a) => {
                    let _ = writeln!(x, "    <edmx:Include Namespace=\"{ns}\" Alias=\"{a}\"/>");
                }
                None => {
                    let _ = writeln!(x, "    <edmx:Include Namespace=\"{ns}\"/>");
                }
            }
        }
        x.push_str("  </edmx:Reference>\n");
    };
    for t in TYPES {
        let mut namespaces = vec![t.ns.to_owned()];
        if let Some(v) = t.version {
            namespaces.push(format!("{}.{v}", t.ns));
        }
        reference(&format!("{}_v1.xml", t.ns), &namespaces, None);
    }
    reference("RedfishExtensions_v1.xml", &["RedfishExtensions.v1_0_0".to_owned()], Some("Redfish"));
    x.push_str("  <edmx:DataServices>\n");
    x.push_str("    <Schema xmlns=\"http://docs.oasis-open.org/odata/ns/edm\" Namespace=\"Service\">\n");
    let root = format!("{}.{}", SERVICE_ROOT.ns, SERVICE_ROOT.version.unwrap_or_default());
    let _ = writeln!(x, "      <EntityContainer Name=\"Service\" Extends=\"{root}.ServiceContainer\"/>");
    x.push_str("    </Schema>\n  </edmx:DataServices>\n</edmx:Edmx>\n");
    x
}

/// The `$metadata` response (`application/xml`).
#[must_use]
pub fn response() -> http::Response<Body> {
    let mut r = http::Response::new(Body::from(document()));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/xml;charset=utf-8"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_type_is_referenced() {
        let d = document();
        for t in TYPES {
            assert!(d.contains(&format!("Namespace=\"{}\"", t.ns)), "{}", t.ns);
            if let Some(v) = t.version {
                assert!(d.contains(&format!("Namespace=\"{}.{v}\"", t.ns)), "{}.{v}", t.ns);
            }
        }
        assert!(d.contains("Extends=\"ServiceRoot.v1_20_0.ServiceContainer\""));
    }
}
