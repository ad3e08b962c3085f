//! Query parameters of reads (get, list, watch) and deletes, parsed at the edge into typed
//! options with Kubernetes' rules, so the handlers never see a raw string.
//!
//! # Guarantees
//! - Every number is parsed with its range checked: nothing a client sends overflows or
//!   panics (`timeoutSeconds=18446744073709551615` is a 400, as kube-apiserver answers a value
//!   that is not an int64; a huge int64 is capped at [`MAX_WATCH_TIMEOUT`]).
//! - `resourceVersion` is empty, `0`, or a decimal number (400 otherwise).

use std::collections::HashMap;
use std::time::Duration;

use crate::limits::MAX_WATCH_TIMEOUT;
use crate::selectors::Selector;
use crate::status::ApiError;

/// `resourceVersionMatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvMatch {
    NotOlderThan,
    Exact,
}

/// The options of a get, list or watch.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    pub labels: Selector,
    pub fields: Selector,
    /// `limit`; `None` for no limit (0 and negative values mean none, as in Kubernetes).
    pub limit: Option<usize>,
    /// `continue`, still encoded (see `list::Continue`).
    pub continue_token: Option<String>,
    /// `resourceVersion`: `None` when empty (most recent), `Some(0)` for "any".
    pub resource_version: Option<u64>,
    pub rv_match: Option<RvMatch>,
    pub watch: bool,
    /// `timeoutSeconds` of a watch, capped; `None` for the default.
    pub timeout: Option<Duration>,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    /// `includeObject` of a Table (`Metadata` by default).
    pub include_object: String,
    /// `dryRun=All`.
    pub dry_run: bool,
}

fn flag(q: &HashMap<String, String>, k: &str) -> bool {
    q.get(k).is_some_and(|v| v == "true" || v == "1")
}

/// An int64 query parameter, as Kubernetes decodes it.
fn int64(q: &HashMap<String, String>, k: &str) -> Result<Option<i64>, ApiError> {
    match q.get(k).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<i64>()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("{k} {:?} is not a whole number that fits in 64 bits", short(v)))),
    }
}

fn short(v: &str) -> String {
    v.chars().take(64).collect()
}

/// Parses a `resourceVersion`: `None` for empty, a number otherwise.
///
/// # Errors
/// 400 when it is not a decimal number.
pub fn resource_version(v: &str) -> Result<Option<u64>, ApiError> {
    if v.is_empty() {
        return Ok(None);
    }
    let bad = || {
        ApiError::bad_request(format!(
            "resourceVersion {:?} is not valid: send a metadata.resourceVersion the server returned, \"0\", or nothing",
            short(v)
        ))
    };
    if !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    v.parse::<u64>().map(Some).map_err(|_| bad())
}

impl ListOptions {
    /// Parses the query of a read.
    ///
    /// # Errors
    /// 400 for a malformed selector, number, resourceVersion or `continue` with a
    /// resourceVersion; 422 Invalid for an unknown `resourceVersionMatch`.
    pub fn parse(q: &HashMap<String, String>) -> Result<ListOptions, ApiError> {
        let get = |k: &str| q.get(k).map_or("", String::as_str);
        let resource_version = resource_version(get("resourceVersion"))?;
        let rv_match = match get("resourceVersionMatch") {
            "" => None,
            "NotOlderThan" => Some(RvMatch::NotOlderThan),
            "Exact" => Some(RvMatch::Exact),
            other => {
                let cause = api::validation::Cause::new(
                    api::validation::CauseType::NotSupported,
                    "resourceVersionMatch",
                    format!("Unsupported value: {:?}: supported values: \"Exact\", \"NotOlderThan\", \"\"", short(other)),
                );
                return Err(ApiError::invalid("meta.k8s.io", "ListOptions", "", &[cause]));
            }
        };
        let continue_token = q.get("continue").filter(|c| !c.is_empty()).cloned();
        if continue_token.is_some() && resource_version.is_some_and(|rv| rv != 0) {
            return Err(ApiError::bad_request("specifying resource version is not allowed when using continue"));
        }
        let limit = int64(q, "limit")?.filter(|l| *l > 0).map(|l| usize::try_from(l).unwrap_or(usize::MAX));
        let timeout = int64(q, "timeoutSeconds")?.filter(|t| *t > 0).map(|t| Duration::from_secs(t.unsigned_abs()).min(MAX_WATCH_TIMEOUT));
        Ok(ListOptions {
            labels: Selector::labels(get("labelSelector"))?,
            fields: Selector::fields(get("fieldSelector"))?,
            limit,
            continue_token,
            resource_version,
            rv_match,
            watch: flag(q, "watch"),
            timeout,
            bookmarks: flag(q, "allowWatchBookmarks"),
            send_initial_events: get("sendInitialEvents") == "true",
            include_object: q.get("includeObject").cloned().unwrap_or_else(|| "Metadata".to_owned()),
            dry_run: get("dryRun") == "All",
        })
    }
}

/// Parses `gracePeriodSeconds` of a delete: a whole number of seconds, 0 or more.
///
/// # Errors
/// 400 otherwise.
pub fn grace_period(q: &HashMap<String, String>) -> Result<Option<u64>, ApiError> {
    match int64(q, "gracePeriodSeconds")? {
        None => Ok(None),
        Some(g) => u64::try_from(g)
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("gracePeriodSeconds {g} is negative: send 0 or more seconds"))),
    }
}

/// Parses a raw query string into its parameters (the last value of a repeated key wins).
#[must_use]
pub fn params(q: Option<&str>) -> HashMap<String, String> {
    q.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: &str) -> Result<ListOptions, ApiError> {
        ListOptions::parse(&params(Some(q)))
    }

    #[test]
    fn numbers_from_the_query_never_overflow() {
        assert_eq!(parse("timeoutSeconds=18446744073709551615").unwrap_err().code, 400);
        assert_eq!(parse(&format!("timeoutSeconds={}", i64::MAX)).unwrap().timeout, Some(MAX_WATCH_TIMEOUT));
        assert_eq!(parse("timeoutSeconds=-5").unwrap().timeout, None);
        assert_eq!(parse("timeoutSeconds=30").unwrap().timeout, Some(Duration::from_secs(30)));
        assert_eq!(parse("limit=-1").unwrap().limit, None);
        assert_eq!(parse(&format!("limit={}", i64::MAX)).unwrap().limit, Some(usize::try_from(i64::MAX).unwrap()));
        assert_eq!(parse("limit=ten").unwrap_err().code, 400);
        assert_eq!(grace_period(&params(Some("gracePeriodSeconds=-1"))).unwrap_err().code, 400);
        assert_eq!(grace_period(&params(Some("gracePeriodSeconds=99999999999999999999"))).unwrap_err().code, 400);
    }

    #[test]
    fn resource_versions_are_decimal_numbers() {
        assert_eq!(parse("resourceVersion=").unwrap().resource_version, None);
        assert_eq!(parse("resourceVersion=0").unwrap().resource_version, Some(0));
        assert_eq!(parse("resourceVersion=42").unwrap().resource_version, Some(42));
        for bad in ["abc", "-1", "+5", "1e3", "18446744073709551616", " 1"] {
            let e = parse(&format!("resourceVersion={}", form_urlencoded::byte_serialize(bad.as_bytes()).collect::<String>())).unwrap_err();
            assert_eq!(e.code, 400, "{bad}");
        }
    }

    #[test]
    fn kubes_option_rules() {
        assert_eq!(parse("continue=abc&resourceVersion=5").unwrap_err().code, 400);
        assert!(parse("continue=abc&resourceVersion=0").is_ok());
        let e = parse("resourceVersion=5&resourceVersionMatch=Sometimes").unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert_eq!(parse("resourceVersion=5&resourceVersionMatch=Exact").unwrap().rv_match, Some(RvMatch::Exact));
    }
}
