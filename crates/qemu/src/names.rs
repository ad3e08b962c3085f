//! The names this crate gives in QEMU: a volume `v` is device `vp-v` on the hot-plug bus and
//! block node `n-v` (hashed when QEMU's 31-byte node-name limit would be exceeded). Every
//! `vp-…` device and `n-…` node is this crate's: that is how QEMU tells what is attached after a
//! restart of the caller.

/// The device id of a volume.
#[must_use]
pub fn device_id(volume: &str) -> String {
    format!("vp-{volume}")
}

/// The block node name of a volume (at most 31 bytes, starting with a letter).
#[must_use]
pub fn node_name(volume: &str) -> String {
    let plain = format!("n-{volume}");
    if plain.len() <= 31 {
        return plain;
    }
    // FNV-1a: stable across runs and versions, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in volume.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("n-{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_volume_name_becomes_a_stable_node_name_within_qemus_limit() {
        assert_eq!(node_name("data"), "n-data");
        let long = "a-volume-name-far-longer-than-qemu-allows";
        let n = node_name(long);
        assert!(n.len() <= 31 && n.starts_with("n-"), "{n}");
        assert_eq!(n, node_name(long), "stable");
        assert_ne!(n, node_name("a-volume-name-far-longer-than-qemu-allowz"), "distinct");
    }
}
