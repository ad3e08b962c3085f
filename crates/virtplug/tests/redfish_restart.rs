//! `virtplug vm bmc`, and what survives a restart of the Redfish service: the accounts (Secrets in the API), the
//! service UUID (`DIR/service.json`) and the System ids (VM uids) — across a restart of `up`,
//! and of a standalone `virtplug redfish` against the same API. Session tokens do not: sessions
//! live in the service's memory, so a token from before the restart is refused (401) and the
//! client logs in again (as sushy does on a 401).

#![allow(clippy::unwrap_used)]

mod redfish_support;

use http::StatusCode;
use serde_json::json;

use redfish_support::{Auth, RfUp};

async fn member_ids(up: &RfUp, path: &str) -> Vec<String> {
    let r = up.get(path, &up.admin()).await;
    r.body["Members"].as_array().unwrap().iter().map(|m| m["@odata.id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn accounts_uuid_and_system_ids_survive_a_restart_of_up_and_old_tokens_are_refused() {
    let mut up = RfUp::start();
    up.vm("default", "keep-a", json!(null)).await;
    up.vm("default", "keep-b", json!(null)).await;
    up.add_account("ironic", "ironic-password", &["--role", "Operator", "--namespace", "default"]);
    let password = up.password();
    let uuid = up.get("/redfish/v1/", &Auth::None).await.body["UUID"].clone();
    let systems = member_ids(&up, "/redfish/v1/Systems").await;
    let accounts = member_ids(&up, "/redfish/v1/AccountService/Accounts").await;
    assert_eq!(systems.len(), 2);
    let (token, _) = up.login("ironic", "ironic-password").await;

    up.stop();
    up.restart();

    assert_eq!(up.get("/redfish/v1/", &Auth::None).await.body["UUID"], uuid, "the service UUID is stable");
    assert_eq!(up.password(), password, "the first password is written once");
    assert_eq!(member_ids(&up, "/redfish/v1/Systems").await, systems, "System ids are the VMs' uids");
    assert_eq!(member_ids(&up, "/redfish/v1/AccountService/Accounts").await, accounts);
    let ironic = Auth::basic("ironic", "ironic-password");
    assert_eq!(up.get("/redfish/v1/Systems", &ironic).await.status, StatusCode::OK, "accounts keep their passwords");
    let r = up.get("/redfish/v1/AccountService/Accounts/ironic", &ironic).await;
    assert_eq!((r.body["RoleId"].clone(), r.body["Description"].as_str().unwrap().contains("default")), (json!("Operator"), true));
    // Documented: sessions end with the service.
    let r = up.get("/redfish/v1/Systems", &Auth::Token(token)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let (token, _) = up.login("ironic", "ironic-password").await;
    assert_eq!(up.get("/redfish/v1/Systems", &Auth::Token(token)).await.status, StatusCode::OK, "a new login works");
}

#[tokio::test]
async fn a_standalone_redfish_service_keeps_its_uuid_and_shares_the_accounts() {
    let up = RfUp::start();
    let uid = up.vm("default", "shared-0", json!(null)).await;
    up.add_account("metal3", "metal3-password", &["--role", "Operator"]);
    let dir = up.dir.path().join("standalone");
    let kubeconfig = up.kubeconfig();
    let args = [
        "redfish",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let log = up.dir.path().join("standalone.log");
    let mut uuids = Vec::new();
    for _ in 0..2 {
        let (mut child, line) = redfish_support::spawn_until(&args, &log, "is serving Redfish at");
        let url = redfish_support::url_in(&line);
        // A data dir of its own: its certificate comes from a CA of its own, DATA_DIR/pki.
        let http = redfish_support::https_client(&dir.join("pki/ca.crt"));
        let metal3 = Auth::basic("metal3", "metal3-password");
        let r = redfish_support::send(&http, &url, http::Method::GET, &format!("/redfish/v1/Systems/{uid}"), &metal3, None, &[]).await;
        assert_eq!((r.status, r.body["Name"].clone()), (StatusCode::OK, json!("default/shared-0")), "the same VMs and accounts");
        let root = redfish_support::send(&http, &url, http::Method::GET, "/redfish/v1/", &Auth::None, None, &[]).await;
        uuids.push(root.body["UUID"].as_str().unwrap().to_owned());
        // Its failed logins are counted in its own metrics.
        let wrong = Auth::basic("metal3", "not-the-password");
        let r = redfish_support::send(&http, &url, http::Method::GET, "/redfish/v1/Systems", &wrong, None, &[]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        let metrics_url = &line[line.find("(metrics at ").unwrap() + "(metrics at ".len()..line.rfind(')').unwrap()];
        let text = reqwest::get(metrics_url).await.unwrap().text().await.unwrap();
        let failures = text.lines().find(|l| l.starts_with("virtplug_redfish_login_failures_total")).unwrap_or_default().to_owned();
        assert!(failures.split_whitespace().last().and_then(|n| n.parse::<f64>().ok()).is_some_and(|n| n >= 1.0), "{text}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert_eq!(uuids[0], uuids[1], "its UUID survives its restart");
    assert_ne!(uuids[0], up.get("/redfish/v1/", &Auth::None).await.body["UUID"].as_str().unwrap(), "a service of its own");
    assert!(!dir.join("redfish/initial-admin-password").exists(), "accounts existed: no second admin");
    assert!(dir.join("redfish/service.json").exists(), "its state is in DATA_DIR/redfish");
}

/// `virtplug vm bmc NAME` prints the address metal3 and Ironic take for the VM — the service
/// `up` on that data dir announced, the System named by the VM's uid — and where the
/// credentials and the CA are; and that address answers as the VM's System.
#[tokio::test]
async fn vm_bmc_prints_the_address_ironic_takes() {
    let up = RfUp::start();
    let uid = up.vm("default", "bmc-0", json!(null)).await;
    let data_dir = up.dir.path().to_str().unwrap().to_owned();
    let (ok, out) = up.cli(&["vm", "bmc", "bmc-0", "--data-dir", &data_dir], "");
    assert!(ok, "{out}");
    let address = format!("redfish-virtualmedia+{}/redfish/v1/Systems/{uid}", up.url);
    assert_eq!(out.lines().next(), Some(address.as_str()), "{out}");
    assert!(
        out.contains(&format!("{data_dir}/redfish/initial-admin-password")) && out.contains(&format!("{data_dir}/pki/ca.crt")),
        "{out}"
    );
    let system = address.trim_start_matches("redfish-virtualmedia+").trim_start_matches(&up.url).to_owned();
    let r = up.get(&system, &up.admin()).await;
    assert_eq!((r.status, r.body["Name"].clone()), (StatusCode::OK, json!("default/bmc-0")));

    let (ok, out) = up.cli(&["vm", "bmc", "no-such-vm", "--data-dir", &data_dir], "");
    assert!(!ok && out.contains("no-such-vm"), "{out}");
}
