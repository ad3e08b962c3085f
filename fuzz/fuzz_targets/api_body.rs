//! A create, update or patch request body per `Content-Type` (JSON, YAML, JSON patch, JSON merge
//! patch, strategic merge patch, apply patch, and a type the server does not know), through
//! [`apiserver::fuzzing::request_body`]: the same parsing, YAML expansion budget, patch limits
//! and stored-object checks a request goes through.
//!
//! Input: the first byte picks the content type, the rest is the body.
//!
//! Asserts: no panic, no unbounded recursion, time or memory (libFuzzer's `-timeout` and
//! `-rss_limit_mb` catch those); and every object the checks accept is within the stored-object
//! limits ([`apiserver::limits::MAX_OBJECT_BYTES`], [`apiserver::limits::MAX_OBJECT_DEPTH`]) —
//! a request that would store more is refused.
#![no_main]

const CONTENT_TYPES: [&str; 8] = [
    "application/json",
    "application/yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
    "application/vnd.kubernetes.protobuf",
    "",
];

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((first, body)) = data.split_first() else { return };
    apiserver::fuzzing::request_body(CONTENT_TYPES[usize::from(*first) % CONTENT_TYPES.len()], body);
});
