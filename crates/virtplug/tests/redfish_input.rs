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
    assert_eq!(r.headers["allow"], "GET, HEAD, PATCH", "a System's Boot is writable");
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

/// A System's ETag follows what the System says, not the VM's bookkeeping: a label edit (the VM's
/// resourceVersion moves, the System's content does not) keeps it; a memory change (its
/// `MemorySummary` changes) changes it. `If-None-Match` with the current ETag is 304 for GET
/// and HEAD; HEAD carries the same ETag and no body.
#[tokio::test]
async fn a_systems_etag_changes_exactly_when_its_content_does() {
    let up = RfUp::start();
    let uid = up.vm("default", "etag-0", json!(null)).await;
    let admin = up.admin();
    let path = format!("/redfish/v1/Systems/{uid}");
    let first = up.get(&path, &admin).await;
    let etag = first.headers["etag"].to_str().unwrap().to_owned();
    assert!(etag.starts_with('"'), "a strong ETag: {etag}");
    let head = up.req_raw(Method::HEAD, &path, &admin, None, &[]).await;
    assert_eq!((head.status, head.headers["etag"].to_str().unwrap()), (StatusCode::OK, etag.as_str()));
    for m in [Method::GET, Method::HEAD] {
        let r = up.req_raw(m.clone(), &path, &admin, None, &[("If-None-Match", &etag)]).await;
        assert_eq!(r.status, StatusCode::NOT_MODIFIED, "{m}");
    }

    let rv = up.vm_version("default", "etag-0").await;
    up.set_vm_labels("default", "etag-0", json!({"rack": "r1"})).await;
    assert_ne!(up.vm_version("default", "etag-0").await, rv);
    // The service's cache has the label once an account scoped by it sees the System.
    up.add_account("racks", "racks-password", &["--role", "ReadOnly", "--selector", "rack=r1"]);
    let racks = Auth::basic("racks", "racks-password");
    redfish_support::common_wait("the label in the Redfish cache", || async {
        (up.get(&path, &racks).await.status == StatusCode::OK).then_some(())
    })
    .await;
    let same = up.get(&path, &admin).await;
    assert_eq!(same.headers["etag"].to_str().unwrap(), etag, "the System says the same: {:?}", same.body);

    let vms: kube::Api<api::VirtualMachine> = kube::Api::namespaced(up.kube().await, "default");
    let patch = json!({"spec": {"template": {"spec": {"domain": {"resources": {"requests": {"memory": "512Mi"}}}}}}});
    vms.patch("etag-0", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch)).await.unwrap();
    let changed = redfish_support::common_wait("the new memory size in the System", || async {
        let r = up.get(&path, &admin).await;
        (r.body["MemorySummary"]["TotalSystemMemoryGiB"] == json!(0.5)).then_some(r)
    })
    .await;
    assert_ne!(changed.headers["etag"].to_str().unwrap(), etag);
    let r = up.req_raw(Method::GET, &path, &admin, None, &[("If-None-Match", &etag)]).await;
    assert_eq!(r.status, StatusCode::OK, "the old ETag no longer matches");
}

/// `virtplug redfish account`: bad input is refused naming the flag, and nothing is created;
/// add, list, set-password and delete act on the accounts the service uses.
#[tokio::test]
async fn the_account_cli_refuses_bad_input_and_manages_accounts() {
    let up = RfUp::start();
    for (args, names) in [
        (vec!["redfish", "account", "add", "ops", "--namespace", "a,b"], "--namespace"),
        (vec!["redfish", "account", "add", "ops", "--selector", "a in ("], "--selector"),
        (vec!["redfish", "account", "add", "ops", "--role", "Root"], "--role"),
        (vec!["redfish", "account", "add", "Ops!"], "user name"),
    ] {
        let (ok, out) = up.cli(&args, "ops-password");
        assert!(!ok && out.contains(names), "{args:?}: {out}");
    }
    let (_, list) = up.cli(&["redfish", "account", "list"], "");
    assert!(!list.lines().any(|l| l.starts_with("ops ")), "nothing was created: {list}");

    up.add_account("ops", "ops-password", &["--role", "Operator", "--namespace", "default", "--namespace", "lab"]);
    let (ok, list) = up.cli(&["redfish", "account", "list"], "");
    assert!(ok && list.lines().any(|l| l.starts_with("ops ") && l.contains("Operator") && l.contains("default,lab")), "{list}");
    assert_eq!(up.get("/redfish/v1/Systems", &Auth::basic("ops", "ops-password")).await.status, StatusCode::OK);

    let (ok, out) = up.cli(&["redfish", "account", "set-password", "ops"], "ops-new-password");
    assert!(ok, "{out}");
    redfish_support::common_wait("the new password to work", || async {
        (up.get("/redfish/v1/Systems", &Auth::basic("ops", "ops-new-password")).await.status == StatusCode::OK).then_some(())
    })
    .await;
    assert_eq!(up.get("/redfish/v1/Systems", &Auth::basic("ops", "ops-password")).await.status, StatusCode::UNAUTHORIZED);

    let (ok, out) = up.cli(&["redfish", "account", "delete", "ops"], "");
    assert!(ok, "{out}");
    redfish_support::common_wait("the deleted account to be refused", || async {
        (up.get("/redfish/v1/Systems", &Auth::basic("ops", "ops-new-password")).await.status == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    let (_, list) = up.cli(&["redfish", "account", "list"], "");
    assert!(!list.lines().any(|l| l.starts_with("ops ")), "{list}");
}
