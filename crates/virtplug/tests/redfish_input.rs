//! Bad input to the Redfish service of a real `virtplug up`: malformed JSON, unknown
//! properties, wrong types, values not in the list (`ResetType: "Explode"`), oversized bodies,
//! unknown URIs, wrong methods, stale ETags, a wrong OData-Version. Each is a 4xx Redfish error
//! with a Base registry MessageId naming the property, and nothing changed: the VM's and the
//! account's resourceVersions are the same after.

#![allow(clippy::unwrap_used)]

mod redfish_support;

use http::{Method, StatusCode};
use serde_json::json;

use redfish_support::{Auth, RfUp};

#[tokio::test]
async fn a_bad_reset_is_a_redfish_error_naming_the_parameter_and_changes_nothing() {
    let up = RfUp::start();
    let uid = up.vm("default", "bad-0", json!(null)).await;
    let before = up.vm_version("default", "bad-0").await;
    let reset = format!("/redfish/v1/Systems/{uid}/Actions/ComputerSystem.Reset");
    let admin = up.admin();
    let big = format!("{{\"ResetType\": \"On\", \"pad\": \"{}\"}}", "x".repeat(100 * 1024));
    let cases: Vec<(&[u8], StatusCode, &str, serde_json::Value)> = vec![
        (b"{\"ResetType\": ", StatusCode::BAD_REQUEST, "MalformedJSON", json!(null)),
        (b"[\"On\"]", StatusCode::BAD_REQUEST, "MalformedJSON", json!(null)),
        (b"{\"ResetType\": \"Explode\"}", StatusCode::BAD_REQUEST, "ActionParameterValueNotInList", json!(["#/ResetType"])),
        (b"{\"ResetType\": 3}", StatusCode::BAD_REQUEST, "ActionParameterValueTypeError", json!(["#/ResetType"])),
        (b"{}", StatusCode::BAD_REQUEST, "ActionParameterMissing", json!(["#/ResetType"])),
        (b"{\"ResetType\": \"On\", \"Force\": true}", StatusCode::BAD_REQUEST, "ActionParameterUnknown", json!(["#/Force"])),
        (big.as_bytes(), StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLarge", json!(null)),
    ];
    for (body, status, id, related) in cases {
        let r = up.req_raw(Method::POST, &reset, &admin, Some(body), &[]).await;
        let shown = String::from_utf8_lossy(&body[..body.len().min(60)]).into_owned();
        assert_eq!(r.status, status, "{shown}: {:?}", r.body);
        assert_eq!(r.message_id(), id, "{shown}");
        assert_eq!(r.related(), related, "{shown}");
        assert!(r.body["error"]["message"].is_string() && r.body["error"]["code"].as_str().unwrap().starts_with("Base.1.22."));
    }
    let r = up.req_raw(Method::POST, &reset, &admin, Some(b"ResetType=On"), &[("Content-Type", "text/plain")]).await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(up.vm_version("default", "bad-0").await, before, "no bad request touched the VM");
}

#[tokio::test]
async fn unknown_uris_wrong_methods_and_versions_are_redfish_errors() {
    let up = RfUp::start();
    let uid = up.vm("default", "uri-0", json!(null)).await;
    let admin = up.admin();
    for p in [
        "/redfish/v1/Systems/no-such-system",
        "/redfish/v1/Managers/x",
        "/redfish/v1/Chassis/c/Systems/s",
        "/redfish/v1/AccountService/Roles/Root",
        "/redfish/v2/",
    ] {
        let r = up.get(p, &admin).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{p}");
        assert!(["ResourceNotFound", "ResourceMissingAtURI"].contains(&r.message_id().as_str()), "{p}: {:?}", r.body);
    }
    // A wrong method: 405 with what is allowed.
    let r = up.req(Method::DELETE, &format!("/redfish/v1/Systems/{uid}"), &admin, None).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers["allow"], "GET, HEAD");
    let r = up.get(&format!("/redfish/v1/Systems/{uid}/Actions/ComputerSystem.Reset"), &admin).await;
    assert_eq!((r.status, r.headers["allow"].to_str().unwrap()), (StatusCode::METHOD_NOT_ALLOWED, "POST"));
    let r =
        up.req(Method::PATCH, "/redfish/v1/AccountService/Roles/ReadOnly", &admin, Some(&json!({"AssignedPrivileges": ["Login"]}))).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "predefined roles are not modifiable");
    let r = up.req_raw(Method::GET, "/redfish/v1/", &Auth::None, None, &[("OData-Version", "4.1")]).await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED);
    let r = up.req_raw(Method::GET, "/redfish/v1/Systems?$filter=Name", &admin, None, &[]).await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "an unsupported $ query");
    // Every response says its OData version and how to cache it.
    assert_eq!(r.headers["odata-version"], "4.0");
    assert!(r.headers.contains_key("cache-control"));
}

#[tokio::test]
async fn bad_account_edits_name_the_property_and_a_stale_etag_is_412() {
    let up = RfUp::start();
    let admin = up.admin();
    up.add_account("ironic", "ironic-password", &["--role", "Operator"]);
    let path = "/redfish/v1/AccountService/Accounts/ironic";
    let first = up.get(path, &admin).await;
    let etag = first.headers["etag"].to_str().unwrap().to_owned();
    let cases = [
        (json!({"Password": "long enough pw", "BogusProp": "foo"}), "PropertyUnknown", json!(["#/BogusProp"])),
        (json!({"Enabled": "yes"}), "PropertyValueTypeError", json!(["#/Enabled"])),
        (json!({"RoleId": "Root"}), "PropertyValueNotInList", json!(["#/RoleId"])),
        (json!({"Id": "other"}), "PropertyNotWritable", json!(["#/Id"])),
        (json!({"Password": "short"}), "StringValueTooShort", json!(["#/Password"])),
        (json!({"@odata.id": "/x"}), "NoOperation", json!(null)),
    ];
    for (body, id, related) in cases {
        let r = up.req(Method::PATCH, path, &admin, Some(&body)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {:?}", r.body);
        assert_eq!((r.message_id().as_str(), r.related()), (id, related), "{body}");
    }
    let r = up.req_raw(Method::PATCH, path, &admin, Some(br#"{"RoleId": "ReadOnly"}"#), &[("If-Match", &format!("{etag}x"))]).await;
    assert_eq!((r.status, r.message_id().as_str()), (StatusCode::PRECONDITION_FAILED, "PreconditionFailed"));
    let now = up.get(path, &admin).await;
    assert_eq!(now.headers["etag"].to_str().unwrap(), etag, "nothing changed the account");
    assert_eq!(now.body["RoleId"], "Operator");
    assert_eq!(
        up.get("/redfish/v1/Systems", &Auth::basic("ironic", "ironic-password")).await.status,
        StatusCode::OK,
        "the password is the old one"
    );
    // With the current ETag the change goes through, and the ETag moves.
    let r = up.req_raw(Method::PATCH, path, &admin, Some(br#"{"RoleId": "ReadOnly"}"#), &[("If-Match", &etag)]).await;
    assert_eq!((r.status, r.body["RoleId"].clone()), (StatusCode::OK, json!("ReadOnly")));
    let after = up.get(path, &admin).await;
    assert_ne!(after.headers["etag"].to_str().unwrap(), etag);
    let r = up.req_raw(Method::GET, path, &admin, None, &[("If-None-Match", after.headers["etag"].to_str().unwrap())]).await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    // Creating: a taken name, a bad name.
    let r = up
        .req(
            Method::POST,
            "/redfish/v1/AccountService/Accounts",
            &admin,
            Some(&json!({"UserName": "ironic", "Password": "another password", "RoleId": "ReadOnly"})),
        )
        .await;
    assert_eq!((r.status, r.message_id().as_str()), (StatusCode::CONFLICT, "ResourceAlreadyExists"));
    let r = up
        .req(
            Method::POST,
            "/redfish/v1/AccountService/Accounts",
            &admin,
            Some(&json!({"UserName": "Bad Name", "Password": "another password", "RoleId": "ReadOnly"})),
        )
        .await;
    assert_eq!(
        (r.status, r.message_id().as_str(), r.related()),
        (StatusCode::BAD_REQUEST, "PropertyValueFormatError", json!(["#/UserName"]))
    );
    // The last Administrator cannot be deleted (nobody could manage accounts any more).
    let r = up.req(Method::DELETE, "/redfish/v1/AccountService/Accounts/admin", &admin, None).await;
    assert_eq!((r.status, r.message_id().as_str()), (StatusCode::CONFLICT, "ResourceCannotBeDeleted"));
}
