//! Who may do what on the Redfish service of a real `virtplug up`: every URI without
//! credentials and with wrong ones, a ReadOnly account writing, an account scoped to another
//! namespace or label (its Systems, Tasks, sessions; no service-wide setting, no account
//! management), session login/logout, expiry, limits and identity, and failed logins that slow
//! only their own account. Accounts are made with the real CLI (`virtplug redfish account add`).

#![allow(clippy::unwrap_used)]

mod redfish_support;

use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::json;

use redfish_support::{common_wait, Auth, RfUp};

/// Every GET-able URI of a service with one System `uid`.
fn uris(uid: &str) -> Vec<String> {
    let mut v: Vec<String> = [
        "/redfish/v1/Systems",
        "/redfish/v1/Managers",
        "/redfish/v1/Chassis",
        "/redfish/v1/SessionService",
        "/redfish/v1/SessionService/Sessions",
        "/redfish/v1/AccountService",
        "/redfish/v1/AccountService/Accounts",
        "/redfish/v1/AccountService/Accounts/admin",
        "/redfish/v1/AccountService/Roles",
        "/redfish/v1/AccountService/Roles/ReadOnly",
        "/redfish/v1/TaskService",
        "/redfish/v1/TaskService/Tasks",
        "/redfish/v1/Registries",
        "/redfish/v1/Registries/Base.1.22.1",
        "/redfish/v1/Registries/Base.1.22.1/Base.1.22.1.json",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for p in [
        "Systems/{}",
        "Systems/{}/EthernetInterfaces",
        "Systems/{}/EthernetInterfaces/default",
        "Systems/{}/VirtualMedia",
        "Managers/{}",
        "Managers/{}/VirtualMedia",
        "Chassis/{}",
    ] {
        v.push(format!("/redfish/v1/{}", p.replace("{}", uid)));
    }
    v
}

const PUBLIC: [&str; 4] = ["/redfish", "/redfish/v1/", "/redfish/v1/$metadata", "/redfish/v1/odata"];

#[tokio::test]
async fn without_valid_credentials_only_the_four_public_uris_answer() {
    let up = RfUp::start();
    let uid = up.vm("default", "auth-0", json!(null)).await;
    for p in PUBLIC {
        assert_eq!(up.get(p, &Auth::None).await.status, StatusCode::OK, "{p} is public");
    }
    let mut all = uris(&uid);
    all.push("/redfish/v1/NoSuchThing".to_owned());
    for (i, p) in all.iter().enumerate() {
        // A wrong password of a real account, then of unknown names: one name failing on every
        // URI would be throttled (the admin's cheap verified logins do not reset its count).
        let wrong = if i < 2 { Auth::basic("admin", "not the password") } else { Auth::basic(&format!("nobody-{i}"), "not the password") };
        for auth in [&Auth::None, &wrong, &Auth::Token("0123456789abcdef".into())] {
            let r = up.get(p, auth).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "GET {p} with {auth:?}: {:?}", r.body);
            assert!(r.headers["www-authenticate"].to_str().unwrap().starts_with("Basic"), "{p}");
            assert_eq!(r.message_id(), "NoValidSession");
        }
        let admin = up.get(p, &up.admin()).await;
        let want = if p.ends_with("NoSuchThing") { StatusCode::NOT_FOUND } else { StatusCode::OK };
        assert_eq!(admin.status, want, "GET {p} as admin: {:?}", admin.body);
    }
    // Writes need credentials too, even to a public URI.
    let r = up
        .req(
            Method::POST,
            &format!("/redfish/v1/Systems/{uid}/Actions/ComputerSystem.Reset"),
            &Auth::None,
            Some(&json!({"ResetType": "On"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(up.req(Method::PATCH, "/redfish/v1/", &Auth::None, Some(&json!({}))).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_read_only_account_reads_but_every_write_is_403_and_changes_nothing() {
    let up = RfUp::start();
    let uid = up.vm("default", "ro-0", json!(null)).await;
    up.add_account("viewer", "viewer-password", &["--role", "ReadOnly"]);
    let ro = Auth::basic("viewer", "viewer-password");
    assert_eq!(up.get(&format!("/redfish/v1/Systems/{uid}"), &ro).await.status, StatusCode::OK);
    let before = up.vm_version("default", "ro-0").await;
    let writes = [
        (Method::POST, format!("/redfish/v1/Systems/{uid}/Actions/ComputerSystem.Reset"), json!({"ResetType": "On"})),
        (Method::PATCH, "/redfish/v1/SessionService".to_owned(), json!({"SessionTimeout": 600})),
        (
            Method::POST,
            "/redfish/v1/AccountService/Accounts".to_owned(),
            json!({"UserName": "sneaky", "Password": "sneaky-password", "RoleId": "Administrator"}),
        ),
        (Method::PATCH, "/redfish/v1/AccountService/Accounts/viewer".to_owned(), json!({"RoleId": "Administrator"})),
        (Method::DELETE, "/redfish/v1/AccountService/Accounts/admin".to_owned(), json!({})),
    ];
    for (m, p, body) in writes {
        let r = up.req(m.clone(), &p, &ro, Some(&body)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{m} {p}: {:?}", r.body);
        assert_eq!(r.message_id(), "InsufficientPrivilege", "{m} {p}");
    }
    assert_eq!(up.vm_version("default", "ro-0").await, before, "the refused reset changed nothing");
    assert_eq!(up.get("/redfish/v1/SessionService", &up.admin()).await.body["SessionTimeout"], 1800);
    assert_eq!(up.get("/redfish/v1/AccountService/Accounts/sneaky", &up.admin()).await.status, StatusCode::NOT_FOUND);
    // ConfigureSelf: its own password, and nothing else of its own account.
    let r =
        up.req(Method::PATCH, "/redfish/v1/AccountService/Accounts/viewer", &ro, Some(&json!({"Password": "a new viewer password"}))).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(up.get("/redfish/v1/Systems", &Auth::basic("viewer", "a new viewer password")).await.status, StatusCode::OK);
    assert_eq!(up.get("/redfish/v1/Systems", &ro).await.status, StatusCode::UNAUTHORIZED, "the old password is gone");
}

#[tokio::test]
async fn an_account_scoped_elsewhere_sees_none_of_these_vms() {
    let up = RfUp::start();
    let a = up.vm("tenant-a", "scoped-a", json!({"bmc": "yes"})).await;
    let b = up.vm("tenant-b", "scoped-b", json!({"bmc": "no"})).await;
    up.add_account("ops-b", "ops-b-password", &["--role", "Operator", "--namespace", "tenant-b"]);
    up.add_account("ops-bmc", "ops-bmc-password", &["--role", "Operator", "--selector", "bmc=yes"]);
    let ops_b = Auth::basic("ops-b", "ops-b-password");
    let listed = up.get("/redfish/v1/Systems", &ops_b).await.members();
    assert_eq!(listed, [format!("/redfish/v1/Systems/{b}")]);
    for p in [
        format!("/redfish/v1/Systems/{a}"),
        format!("/redfish/v1/Managers/{a}"),
        format!("/redfish/v1/Chassis/{a}"),
        format!("/redfish/v1/Systems/{a}/EthernetInterfaces"),
    ] {
        let r = up.get(&p, &ops_b).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{p} is outside ops-b's namespace");
    }
    let before = up.vm_version("tenant-a", "scoped-a").await;
    let r = up
        .req(Method::POST, &format!("/redfish/v1/Systems/{a}/Actions/ComputerSystem.Reset"), &ops_b, Some(&json!({"ResetType": "On"})))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{:?}", r.body);
    assert_eq!(up.vm_version("tenant-a", "scoped-a").await, before);
    let by_label = up.get("/redfish/v1/Managers", &Auth::basic("ops-bmc", "ops-bmc-password")).await.members();
    assert_eq!(by_label, [format!("/redfish/v1/Managers/{a}")]);
}

#[tokio::test]
async fn a_session_logs_in_logs_out_and_expires_after_its_idle_timeout() {
    let up = RfUp::start();
    let (token, location) = up.login("admin", &up.password()).await;
    let t = Auth::Token(token.clone());
    assert_eq!(up.get("/redfish/v1/Systems", &t).await.status, StatusCode::OK);
    assert_eq!(up.get(&location, &t).await.body["UserName"], "admin");
    assert_eq!(up.req(Method::DELETE, &location, &t, None).await.status, StatusCode::NO_CONTENT);
    assert_eq!(up.get("/redfish/v1/Systems", &t).await.status, StatusCode::UNAUTHORIZED, "logged out");

    let r = up.req(Method::PATCH, "/redfish/v1/SessionService", &up.admin(), Some(&json!({"SessionTimeout": 30}))).await;
    assert_eq!((r.status, r.body["SessionTimeout"].clone()), (StatusCode::OK, json!(30)));
    let (token, _) = up.login("admin", &up.password()).await;
    let t = Auth::Token(token);
    let created = Instant::now();
    assert_eq!(up.get("/redfish/v1/Systems", &t).await.status, StatusCode::OK);
    let used = Instant::now();
    // Idle for the timeout: the next use is refused.
    tokio::time::sleep(Duration::from_secs(31).saturating_sub(used.elapsed())).await;
    let r = up.get("/redfish/v1/Systems", &t).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "idle for {:?}", created.elapsed());
}

/// The API's `/metrics` value of `name`.
async fn metric(up: &RfUp, name: &str) -> f64 {
    let text = up.kube().await.request_text(http::Request::get("/metrics").body(Vec::new()).unwrap()).await.unwrap();
    text.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

/// `f`'s result and the moment it finished.
async fn timed<F: std::future::Future>(f: F) -> (F::Output, Instant) {
    let out = f.await;
    (out, Instant::now())
}

/// Runs `a` and `b` at once; each one's result and the moment it finished.
async fn race<A: std::future::Future, B: std::future::Future>(a: A, b: B) -> ((A::Output, Instant), (B::Output, Instant)) {
    tokio::join!(timed(a), timed(b))
}

/// `POST Sessions` (the response, whatever it is).
async fn try_login(up: &RfUp, user: &str, pass: &str) -> redfish_support::Resp {
    let body = json!({"UserName": user, "Password": pass});
    up.req(Method::POST, "/redfish/v1/SessionService/Sessions", &Auth::None, Some(&body)).await
}

#[tokio::test]
async fn failed_logins_slow_their_account_and_never_lock_out_another() {
    let up = RfUp::start();
    up.add_account("victim", "victim-password", &["--role", "Operator"]);
    let before = metric(&up, "virtplug_redfish_login_failures_total").await;
    let wrong = Auth::basic("victim", "guess");
    for _ in 0..6 {
        assert_eq!(up.get("/redfish/v1/Systems", &wrong).await.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(up.logged_failures("victim"), 6);
    // The victim's next check waits its delay (the 4th..6th failures already did), and the
    // admin, at the same time, logs in without waiting for it.
    let start = Instant::now();
    let ((victim, victim_done), (admin, admin_done)) =
        race(up.get("/redfish/v1/Systems", &wrong), up.get("/redfish/v1/Systems", &up.admin())).await;
    assert_eq!(victim.status, StatusCode::UNAUTHORIZED);
    assert!(victim_done - start >= Duration::from_millis(1000), "the 7th failure waited {:?}", victim_done - start);
    assert_eq!(admin.status, StatusCode::OK, "{:?}", admin.body);
    assert!(admin_done < victim_done, "the admin was not held up by the victim's throttle");
    // Slowed, not locked out: the right password still works, and resets the count.
    assert_eq!(up.get("/redfish/v1/Systems", &Auth::basic("victim", "victim-password")).await.status, StatusCode::OK);
    assert_eq!(up.get("/redfish/v1/Systems", &wrong).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(up.logged_failures("victim"), 1, "the count was reset by the success");
    assert!(metric(&up, "virtplug_redfish_login_failures_total").await >= before + 8.0);
    let log = up.log();
    assert!(log.contains("Redfish login failed") && log.contains("victim"), "failures are logged by account");
    assert!(!log.contains("guess"), "never the password");
}

/// Someone guessing an account's password neither evicts the legitimate client's verified
/// credentials (it would be pushed into the throttled slow path) nor gets its own failure count
/// reset by that client's requests.
#[tokio::test]
async fn a_wrong_password_does_not_slow_the_client_that_knows_the_right_one() {
    let up = RfUp::start();
    up.add_account("ironic", "ironic-password", &["--role", "Operator"]);
    let right = Auth::basic("ironic", "ironic-password");
    let wrong = Auth::basic("ironic", "a guess");
    assert_eq!(up.get("/redfish/v1/Systems", &right).await.status, StatusCode::OK);
    for _ in 0..5 {
        assert_eq!(up.get("/redfish/v1/Systems", &wrong).await.status, StatusCode::UNAUTHORIZED);
    }
    // A throttled guess (it waits its delay) and the client's request, at once: the client is
    // answered first.
    let start = Instant::now();
    let ((guess, guess_done), (client, client_done)) =
        race(up.get("/redfish/v1/Systems", &wrong), up.get("/redfish/v1/Systems", &right)).await;
    assert_eq!(guess.status, StatusCode::UNAUTHORIZED);
    assert!(guess_done - start >= Duration::from_millis(500), "the 6th guess waited {:?}", guess_done - start);
    assert_eq!(client.status, StatusCode::OK);
    assert!(client_done < guess_done, "the client did not wait behind the guess");
    // Its requests never went through the throttle: the guesses are still counted from where
    // they were (a check of the right password would have reset the count).
    assert_eq!(up.get("/redfish/v1/Systems", &wrong).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(up.logged_failures("ironic"), 7);
}

/// An account scoped to a namespace or a selector — even an Administrator — sees and ends only
/// its own sessions, and cannot change the service-wide session timeout.
#[tokio::test]
async fn a_scoped_administrator_sees_and_ends_only_its_own_sessions() {
    let up = RfUp::start();
    up.add_account("tenant-admin", "tenant-password", &["--role", "Administrator", "--namespace", "tenant-a"]);
    up.add_account("label-admin", "label-password", &["--role", "Administrator", "--selector", "bmc=yes"]);
    let (admin_token, admin_session) = up.login("admin", &up.password()).await;
    let admin = Auth::Token(admin_token);
    for (user, pass) in [("tenant-admin", "tenant-password"), ("label-admin", "label-password")] {
        let (token, mine) = up.login(user, pass).await;
        let me = Auth::Token(token);
        assert_eq!(up.get("/redfish/v1/SessionService/Sessions", &me).await.members(), vec![mine.clone()], "{user} lists only its own");
        assert_eq!(up.get(&admin_session, &me).await.status, StatusCode::NOT_FOUND, "{user}: another account's session");
        let r = up.req(Method::DELETE, &admin_session, &me, None).await;
        assert_eq!((r.status, r.message_id()), (StatusCode::NOT_FOUND, "ResourceNotFound".to_owned()), "{user}: {:?}", r.body);
        assert_eq!(up.get("/redfish/v1/Systems", &admin).await.status, StatusCode::OK, "the admin's session survived {user}");
        let r = up.req(Method::PATCH, "/redfish/v1/SessionService", &me, Some(&json!({"SessionTimeout": 600}))).await;
        assert_eq!((r.status, r.message_id()), (StatusCode::FORBIDDEN, "InsufficientPrivilege".to_owned()), "{user}: {:?}", r.body);
        assert_eq!(up.get("/redfish/v1/SessionService", &admin).await.body["SessionTimeout"], 1800, "unchanged by {user}");
        // The unscoped admin sees every session and may end this one.
        assert!(up.get("/redfish/v1/SessionService/Sessions", &admin).await.members().contains(&mine));
        assert_eq!(up.req(Method::DELETE, &mine, &admin, None).await.status, StatusCode::NO_CONTENT);
        assert_eq!(up.get("/redfish/v1/Systems", &me).await.status, StatusCode::UNAUTHORIZED, "{user} was logged out");
        // Its own session it ends itself.
        let (token, mine) = up.login(user, pass).await;
        assert_eq!(up.req(Method::DELETE, &mine, &Auth::Token(token), None).await.status, StatusCode::NO_CONTENT);
    }
}

/// Account management needs an unscoped Administrator; any other caller reads and writes only
/// its own account (its password), and a write to any other account is 403 whether it exists
/// or not.
#[tokio::test]
async fn only_an_unscoped_administrator_manages_accounts_and_names_are_not_revealed() {
    let up = RfUp::start();
    up.add_account("tenant-admin", "tenant-password", &["--role", "Administrator", "--namespace", "tenant-a"]);
    up.add_account("peer", "peer-password", &["--role", "Administrator", "--namespace", "tenant-a"]);
    up.add_account("viewer", "viewer-password", &["--role", "ReadOnly"]);
    let tenant = Auth::basic("tenant-admin", "tenant-password");
    let viewer = Auth::basic("viewer", "viewer-password");
    let accounts = "/redfish/v1/AccountService/Accounts";
    assert_eq!(up.get(accounts, &tenant).await.members(), [format!("{accounts}/tenant-admin")]);
    assert_eq!(up.get(&format!("{accounts}/peer"), &tenant).await.status, StatusCode::NOT_FOUND);
    let new = json!({"UserName": "tenant-new", "Password": "tenant-new-password", "RoleId": "Administrator"});
    let r = up.req(Method::POST, accounts, &tenant, Some(&new)).await;
    assert_eq!((r.status, r.message_id()), (StatusCode::FORBIDDEN, "InsufficientPrivilege".to_owned()), "{:?}", r.body);
    assert_eq!(up.get(&format!("{accounts}/tenant-new"), &up.admin()).await.status, StatusCode::NOT_FOUND, "nothing was created");
    for (who, auth) in [("tenant-admin", &tenant), ("viewer", &viewer)] {
        for target in ["admin", "peer", "no-such-account"] {
            let uri = format!("{accounts}/{target}");
            for (m, body) in [(Method::PATCH, Some(json!({"Password": "taken over!"}))), (Method::DELETE, None)] {
                let r = up.req(m.clone(), &uri, auth, body.as_ref()).await;
                assert_eq!(
                    (r.status, r.message_id()),
                    (StatusCode::FORBIDDEN, "InsufficientPrivilege".to_owned()),
                    "{who}: {m} {uri}: {:?}",
                    r.body
                );
            }
        }
    }
    assert_eq!(up.get("/redfish/v1/Systems", &Auth::basic("peer", "peer-password")).await.status, StatusCode::OK, "peer unchanged");
    // Its own password, it changes (ConfigureSelf).
    let r = up.req(Method::PATCH, &format!("{accounts}/tenant-admin"), &tenant, Some(&json!({"Password": "a new tenant password"}))).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(up.get("/redfish/v1/Systems", &Auth::basic("tenant-admin", "a new tenant password")).await.status, StatusCode::OK);
    // The unscoped admin manages them all.
    assert_eq!(up.req(Method::DELETE, &format!("{accounts}/peer"), &up.admin(), None).await.status, StatusCode::NO_CONTENT);
    assert_eq!(up.req(Method::DELETE, &format!("{accounts}/no-such-account"), &up.admin(), None).await.status, StatusCode::NOT_FOUND);
}

/// A Task names its System (`Name`, `Payload.TargetUri`): a scoped caller sees only tasks of
/// Systems in its scope — not an unscoped admin's tasks elsewhere, and not its own once the
/// System left its scope.
#[tokio::test]
async fn tasks_of_systems_outside_a_scope_do_not_exist_for_it() {
    let up = RfUp::start();
    let uid = up.running_vm_with_grace("task-0", 600).await;
    up.add_account("ops-bmc", "ops-bmc-password", &["--role", "Operator", "--selector", "bmc=yes"]);
    up.add_account("tenant-admin", "tenant-password", &["--role", "Administrator", "--namespace", "tenant-a"]);
    let ops = Auth::basic("ops-bmc", "ops-bmc-password");
    let tenant = Auth::basic("tenant-admin", "tenant-password");
    let system = format!("/redfish/v1/Systems/{uid}");
    up.set_vm_labels("default", "task-0", json!({"bmc": "yes"})).await;
    common_wait("ops-bmc to see the labelled System", || async { (up.get(&system, &ops).await.status == StatusCode::OK).then_some(()) })
        .await;
    let reset = format!("{system}/Actions/ComputerSystem.Reset");
    let r = up.req(Method::POST, &reset, &ops, Some(&json!({"ResetType": "GracefulShutdown"}))).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "a 600 s grace period outlasts the request: {:?}", r.body);
    let task = r.headers["location"].to_str().unwrap().to_owned();
    assert_eq!(up.get(&task, &ops).await.status, StatusCode::OK);
    assert_eq!(up.get("/redfish/v1/TaskService/Tasks", &ops).await.members(), vec![task.clone()]);
    // An Administrator scoped to another namespace: no such task.
    assert_eq!(up.get("/redfish/v1/TaskService/Tasks", &tenant).await.members(), Vec::<String>::new());
    assert_eq!(up.get(&task, &tenant).await.status, StatusCode::NOT_FOUND);
    assert_eq!(up.get(&task, &up.admin()).await.body["Payload"]["TargetUri"], reset.as_str(), "the unscoped admin sees it");
    // The System leaves ops-bmc's scope: so does its task.
    up.set_vm_labels("default", "task-0", json!({"bmc": "no"})).await;
    common_wait("the System to leave ops-bmc's scope", || async {
        (up.get(&system, &ops).await.status == StatusCode::NOT_FOUND).then_some(())
    })
    .await;
    assert_eq!(up.get(&task, &ops).await.status, StatusCode::NOT_FOUND);
    assert_eq!(up.get("/redfish/v1/TaskService/Tasks", &ops).await.members(), Vec::<String>::new());
}

/// One account cannot take every session: past its own limit its logins are refused with
/// SessionLimitExceeded while other accounts still log in, and a logout makes room.
#[tokio::test]
async fn one_account_cannot_use_up_the_sessions_of_everyone() {
    let up = RfUp::start();
    up.add_account("greedy", "greedy-password", &["--role", "ReadOnly"]);
    let mut sessions = Vec::new();
    for _ in 0..redfish::sessions::MAX_PER_ACCOUNT {
        sessions.push(up.login("greedy", "greedy-password").await);
    }
    let r = try_login(&up, "greedy", "greedy-password").await;
    assert_eq!((r.status, r.message_id()), (StatusCode::SERVICE_UNAVAILABLE, "SessionLimitExceeded".to_owned()), "{:?}", r.body);
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(try_login(&up, "admin", &up.password()).await.status, StatusCode::CREATED, "another account still logs in");
    let (token, location) = &sessions[0];
    assert_eq!(up.req(Method::DELETE, location, &Auth::Token(token.clone()), None).await.status, StatusCode::NO_CONTENT);
    assert_eq!(try_login(&up, "greedy", "greedy-password").await.status, StatusCode::CREATED, "a logout made room");
}

/// A session belongs to the account it was opened for: it ends when that account's password
/// changes (out of band, or through the session itself) or the account is deleted and
/// recreated under the same name, even with the same password.
#[tokio::test]
async fn a_session_ends_when_its_password_changes_or_its_account_is_recreated() {
    let up = RfUp::start();
    up.add_account("ironic", "first-password", &["--role", "Operator"]);
    let account = "/redfish/v1/AccountService/Accounts/ironic";
    let etag = |r: &redfish_support::Resp| r.headers.get("etag").map(|v| v.to_str().unwrap().to_owned());
    let changed = |before: Option<String>| {
        let up = &up;
        async move {
            common_wait("the account change in the Redfish cache", || async {
                let r = up.get(account, &up.admin()).await;
                (r.status == StatusCode::OK && etag(&r) != before).then_some(())
            })
            .await;
        }
    };
    let (token, _) = up.login("ironic", "first-password").await;
    let session = Auth::Token(token);
    assert_eq!(up.get("/redfish/v1/Systems", &session).await.status, StatusCode::OK);
    let before = etag(&up.get(account, &up.admin()).await);
    let (ok, out) = up.cli(&["redfish", "account", "set-password", "ironic"], "second-password");
    assert!(ok, "{out}");
    changed(before).await;
    assert_eq!(up.get("/redfish/v1/Systems", &session).await.status, StatusCode::UNAUTHORIZED, "a new password ends the session");

    let (token, _) = up.login("ironic", "second-password").await;
    let session = Auth::Token(token);
    assert_eq!(up.get("/redfish/v1/Systems", &session).await.status, StatusCode::OK);
    let before = etag(&up.get(account, &up.admin()).await);
    let (ok, out) = up.cli(&["redfish", "account", "delete", "ironic"], "");
    assert!(ok, "{out}");
    up.add_account("ironic", "second-password", &["--role", "Operator"]);
    changed(before).await;
    assert_eq!(up.get("/redfish/v1/Systems", &session).await.status, StatusCode::UNAUTHORIZED, "a recreated account is another account");

    let (token, _) = up.login("ironic", "second-password").await;
    let session = Auth::Token(token);
    let r = up.req(Method::PATCH, account, &session, Some(&json!({"Password": "third-password"}))).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(up.get("/redfish/v1/Systems", &session).await.status, StatusCode::UNAUTHORIZED, "its own new password ends it too");
    assert_eq!(up.get("/redfish/v1/Systems", &Auth::basic("ironic", "third-password")).await.status, StatusCode::OK);
}
