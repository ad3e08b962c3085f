//! A request's query string (label and field selectors, `limit`, `continue`, `resourceVersion`,
//! `resourceVersionMatch`, `timeoutSeconds`, `gracePeriodSeconds`, ...), through
//! [`apiserver::fuzzing::query`]: parsed as a list/watch/delete would parse it, a `continue`
//! token decoded, the selectors matched against an object.
//!
//! Asserts: no panic and no overflow on any number (the fuzz build has debug assertions, so
//! an unchecked `+`/`*` on a value from the query panics); a parsed watch timeout never exceeds
//! [`apiserver::limits::MAX_WATCH_TIMEOUT`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    apiserver::fuzzing::query(&String::from_utf8_lossy(data));
});
