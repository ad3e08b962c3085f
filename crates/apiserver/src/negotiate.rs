//! Content negotiation of responses, as kube-apiserver does it: the `Accept` header picks JSON
//! or YAML; a header that accepts neither is 406 Not Acceptable naming what is served.
//!
//! # Flow
//! [`choose`] reads the header's media ranges by quality (`q`), first listed first among
//! equals, and returns the first this server produces. JSON covers `application/json` with any
//! parameters (`as=Table`, discovery's `as=APIGroupDiscoveryList`: the handlers read those),
//! `application/*` and `*/*`. Protobuf is not produced, so a client that lists it first and
//! JSON second (client-go) gets JSON. [`crate::routes::dispatch`] turns a JSON answer into YAML
//! when YAML was chosen; watch streams stay JSON.

use crate::status::ApiError;

/// What a response is written as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Media {
    Json,
    Yaml,
}

/// The media types named in a 406.
pub const PRODUCED: &str = "application/json, application/yaml, application/json;as=Table;v=v1;g=meta.k8s.io";

/// Picks the response's media type from an `Accept` header (empty: JSON).
///
/// # Errors
/// 406 when no range of the header is one this server produces.
pub fn choose(accept: &str) -> Result<Media, ApiError> {
    if accept.trim().is_empty() {
        return Ok(Media::Json);
    }
    let mut ranges: Vec<(f32, &str)> = accept
        .split(',')
        .filter_map(|range| {
            let mut parts = range.split(';');
            let media = parts.next()?.trim();
            let q = parts.filter_map(|p| p.trim().strip_prefix("q=")).find_map(|q| q.trim().parse::<f32>().ok()).unwrap_or(1.0);
            (!media.is_empty() && q > 0.0).then_some((q, media))
        })
        .collect();
    // Stable: among equal qualities the header's order stands.
    ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (_, media) in ranges {
        match media.to_ascii_lowercase().as_str() {
            "application/json" | "application/*" | "*/*" => return Ok(Media::Json),
            "application/yaml" => return Ok(Media::Yaml),
            _ => {}
        }
    }
    Err(ApiError::not_acceptable(format!("only the following media types are accepted: {PRODUCED} (the request asked for {accept:?})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_producible_range_by_quality_wins() {
        assert_eq!(choose("").unwrap(), Media::Json);
        assert_eq!(choose("application/vnd.kubernetes.protobuf, application/json").unwrap(), Media::Json);
        assert_eq!(choose("application/json;as=Table;v=v1;g=meta.k8s.io,application/json").unwrap(), Media::Json);
        assert_eq!(choose("application/yaml").unwrap(), Media::Yaml);
        assert_eq!(choose("application/json;q=0.5, application/yaml").unwrap(), Media::Yaml);
        assert_eq!(choose("text/html, */*;q=0.1").unwrap(), Media::Json);
        let e = choose("application/vnd.kubernetes.protobuf").unwrap_err();
        assert_eq!(e.code, 406);
        assert!(e.message.contains("application/json"), "{}", e.message);
        assert_eq!(choose("text/html, application/json;q=0").unwrap_err().code, 406);
    }
}
