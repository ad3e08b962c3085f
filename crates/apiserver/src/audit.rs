//! The audit log (`virtplug apiserver --audit-log PATH`): one JSON line per request, with who
//! asked (`userAgent`), what it asked in RBAC's words ([`requestinfo`]: `verb`, `apiGroup`,
//! `resource`, `subresource`, `namespace`, `name`) and the answer's `code` — what a test needs
//! to prove that a ClusterRole grants every request a component sends, as kube-apiserver's
//! audit log (`--audit-log-path`) lets an operator do on a cluster.
//!
//! # Flow
//! [`layer`] wraps the whole router (authentication included, so a 401 is logged too) and
//! writes the line once the response's status is known: a watch is logged when its stream
//! starts (kube-apiserver's `ResponseStarted` stage), not when it ends.
//!
//! # Guarantees
//! - A request is never failed or delayed by the log beyond one append: a write error is
//!   counted, reported once in the process's log (and again every 1000th failure), and the
//!   request answered as usual.
//! - The file is bounded: past `max_bytes` it is renamed to `PATH.1` (replacing the previous
//!   one) and a new file started, so at most twice `max_bytes` are kept, as kube-apiserver's
//!   `--audit-log-maxsize` with one backup.
//! - Every field is a JSON string written by serde (escaped); the user agent and path are cut
//!   to [`MAX_FIELD`] characters, so no request can write an unbounded line.
//! - Lines are whole: each is one `write` to a file opened with `O_APPEND`, under a lock.
//!
//! # Caveats
//! No user name: the server knows one bearer token, so every authenticated client is the same
//! user; the user agent is what tells components apart.

pub mod requestinfo;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use serde::Serialize;

/// Where the audit log goes and how large it may grow.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    pub path: PathBuf,
    /// The size at which the file is rotated to `PATH.1`.
    pub max_bytes: u64,
}

/// Longest user agent or path written (in characters); longer ones are cut.
pub const MAX_FIELD: usize = 512;

/// Errors opening the audit log.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the audit log {path}")]
pub struct OpenError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// One line of the log.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Entry<'a> {
    time: String,
    user_agent: &'a str,
    method: &'a str,
    #[serde(rename = "requestURI")]
    request_uri: &'a str,
    /// RBAC's resource attributes; for a non-resource URL only `verb` and `nonResourceURL`.
    #[serde(flatten)]
    info: Info<'a>,
    code: u16,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Info<'a> {
    #[serde(rename_all = "camelCase")]
    Resource {
        verb: &'a str,
        api_group: &'a str,
        api_version: &'a str,
        resource: &'a str,
        subresource: &'a str,
        namespace: &'a str,
        name: &'a str,
    },
    NonResource {
        verb: &'a str,
        #[serde(rename = "nonResourceURL")]
        non_resource_url: &'a str,
    },
}

/// The open log file and its rotation state.
pub struct AuditLog {
    config: AuditConfig,
    file: Mutex<Written>,
    failures: AtomicU64,
}

struct Written {
    file: Option<File>,
    bytes: u64,
}

fn open_append(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

impl AuditLog {
    /// Opens (appends to) the log.
    ///
    /// # Errors
    /// When the file cannot be opened or created.
    pub fn open(config: &AuditConfig) -> Result<AuditLog, OpenError> {
        let err = |source| OpenError { path: config.path.clone(), source };
        let file = open_append(&config.path).map_err(err)?;
        let bytes = file.metadata().map_err(err)?.len();
        Ok(AuditLog { config: config.clone(), file: Mutex::new(Written { file: Some(file), bytes }), failures: AtomicU64::new(0) })
    }

    /// Appends one line; never fails (see the module docs).
    fn append(&self, line: &[u8]) {
        let mut w = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let result = (|| -> std::io::Result<()> {
            if w.file.is_none() || w.bytes + line.len() as u64 > self.config.max_bytes {
                w.file = None;
                let rotated = PathBuf::from(format!("{}.1", self.config.path.display()));
                if w.bytes > 0 {
                    std::fs::rename(&self.config.path, rotated)?;
                }
                w.file = Some(open_append(&self.config.path)?);
                w.bytes = 0;
            }
            if let Some(f) = w.file.as_mut() {
                f.write_all(line)?;
            }
            w.bytes += line.len() as u64;
            Ok(())
        })();
        if let Err(e) = result {
            let n = self.failures.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(1000) {
                tracing::warn!(path = %self.config.path.display(), failures = n + 1, "cannot write the audit log (requests are served without it): {e}");
            }
        }
    }

    /// How many lines could not be written.
    #[must_use]
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// `s` cut to [`MAX_FIELD`] characters.
fn cut(s: &str) -> &str {
    s.char_indices().nth(MAX_FIELD).map_or(s, |(i, _)| &s[..i])
}

/// The middleware: serves the request, then logs it to `log`.
pub async fn layer(log: Arc<AuditLog>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let info = requestinfo::classify(&method, &path, req.uri().query());
    let user_agent =
        req.headers().get(http::header::USER_AGENT).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).unwrap_or_default();
    let resp = next.run(req).await;
    let entry = Entry {
        time: jiff::Timestamp::now().to_string(),
        user_agent: cut(&user_agent),
        method: method.as_str(),
        request_uri: cut(&path),
        info: if info.is_resource_request {
            Info::Resource {
                verb: &info.verb,
                api_group: &info.api_group,
                api_version: &info.api_version,
                resource: &info.resource,
                subresource: &info.subresource,
                namespace: &info.namespace,
                name: &info.name,
            }
        } else {
            Info::NonResource { verb: &info.verb, non_resource_url: cut(&path) }
        },
        code: resp.status().as_u16(),
    };
    if let Ok(mut line) = serde_json::to_vec(&entry) {
        line.push(b'\n');
        log.append(&line);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn the_log_rotates_at_its_size_and_keeps_one_backup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(&AuditConfig { path: path.clone(), max_bytes: 100 }).unwrap();
        for i in 0..10 {
            log.append(format!("{{\"n\":{i},\"pad\":\"{}\"}}\n", "x".repeat(20)).as_bytes());
        }
        let (now, before) = (lines(&path), lines(&dir.path().join("audit.log.1")));
        assert!(std::fs::metadata(&path).unwrap().len() <= 100);
        assert_eq!(now.last().unwrap()["n"], 9);
        assert_eq!(before.last().unwrap()["n"], now[0]["n"].as_i64().unwrap() - 1, "the backup holds the lines just before");
        assert_eq!(log.failures(), 0);
    }

    /// A log whose directory is gone cannot be written; the request is still served.
    #[tokio::test]
    async fn a_write_error_is_counted_not_returned() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("gone");
        std::fs::create_dir(&sub).unwrap();
        let path = sub.join("audit.log");
        let log = Arc::new(AuditLog::open(&AuditConfig { path, max_bytes: 10 }).unwrap());
        std::fs::remove_dir_all(&sub).unwrap();
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" })).layer(axum::middleware::from_fn({
            let log = Arc::clone(&log);
            move |req: Request, next: Next| layer(Arc::clone(&log), req, next)
        }));
        for _ in 0..2 {
            let resp = app.clone().oneshot(Request::builder().uri("/healthz").body(axum::body::Body::empty()).unwrap()).await.unwrap();
            assert_eq!(resp.status(), 200);
        }
        assert!(log.failures() >= 1, "the lost lines are counted");
    }

    #[tokio::test]
    async fn a_line_says_who_asked_what_in_rbac_terms_with_request_data_escaped() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = Arc::new(AuditLog::open(&AuditConfig { path: path.clone(), max_bytes: 1 << 20 }).unwrap());
        let app = axum::Router::new().fallback(|| async { (http::StatusCode::NOT_FOUND, "no") }).layer(axum::middleware::from_fn({
            let log = Arc::clone(&log);
            move |req: Request, next: Next| layer(Arc::clone(&log), req, next)
        }));
        // Quotes, a backslash, a tab and a byte that is not UTF-8 (HTTP allows them in a header;
        // not a newline): the line stays one JSON object.
        let mut agent = b"evil\"}\\\t{\"verb\":\"x\xff".to_vec();
        agent.extend(std::iter::repeat_n(b'y', 2000));
        let req = Request::builder()
            .method("PATCH")
            .uri("/apis/kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/status?fieldManager=a")
            .header("user-agent", http::HeaderValue::from_bytes(&agent).unwrap())
            .body(axum::body::Body::empty())
            .unwrap();
        app.oneshot(req).await.unwrap();
        let got = lines(&path);
        assert_eq!(got.len(), 1, "one line, whatever the user agent holds");
        let l = &got[0];
        assert_eq!(
            (&l["verb"], &l["apiGroup"], &l["resource"], &l["subresource"], &l["namespace"], &l["name"], &l["code"]),
            (
                &"patch".into(),
                &"kubevirt.io".into(),
                &"virtualmachines".into(),
                &"status".into(),
                &"ns1".into(),
                &"vm1".into(),
                &404.into()
            )
        );
        assert_eq!(l["requestURI"], "/apis/kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/status", "the path, not the query");
        assert_eq!(l["userAgent"].as_str().unwrap().chars().count(), MAX_FIELD);
        assert!(l["userAgent"].as_str().unwrap().starts_with("evil\"}\\\t{\"verb\":\"x\u{fffd}y"), "{l}");
    }
}
