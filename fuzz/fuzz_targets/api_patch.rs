//! A patch of each kind (JSON patch, merge patch, strategic merge patch, apply) applied to a
//! fuzzer-chosen current object, through [`apiserver::fuzzing::patch`].
//!
//! Input: `KIND CURRENT 0xFF BODY` — the first byte picks the kind, the bytes up to the first
//! 0xFF (never in UTF-8 text, so never in JSON) are the current object (the sample VM when they
//! are not a JSON object), the rest is the patch body.
//!
//! Asserts: no panic, no unbounded time or memory (RFC 6902 `copy` and `move` loops, array
//! shifting), and a result the checks accept is within the size and depth limits; a patch that
//! would make it bigger or deeper is refused.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((kind, rest)) = data.split_first() else { return };
    let (current, body) = match rest.iter().position(|b| *b == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b""[..], rest),
    };
    apiserver::fuzzing::patch(*kind, current, body);
});
