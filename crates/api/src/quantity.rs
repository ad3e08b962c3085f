//! Kubernetes quantities of bytes (`1Gi`, `500M`, `1073741824`, `1.5Gi`, `1e9`): one parser for
//! every size in a spec (claims, DataVolumes, guest memory, emptyDisk capacity).

/// The largest size accepted, in bytes (below `u64::MAX`, so sums of a few stay representable).
pub const MAX_BYTES: f64 = 9.0e18;

/// Parses a quantity of bytes, rounded up to a whole byte.
///
/// # Errors
/// A message naming the value when it is not a quantity, less than 1 byte, or more than
/// [`MAX_BYTES`] (never a wrapped or saturated number).
pub fn bytes(q: &str) -> Result<u64, String> {
    let q = q.trim();
    let units: [(&str, f64); 12] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let (num, mult) = units.iter().find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m))).unwrap_or((q, 1.0));
    // Kubernetes' number syntax: digits, one optional point, an optional exponent; no sign,
    // no "inf"/"nan", which Rust's float parser would take.
    let numeric = !num.is_empty() && num.bytes().all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-'));
    let n: f64 = num
        .parse()
        .ok()
        .filter(|_| numeric && !num.starts_with(['+', '-']))
        .ok_or_else(|| format!("{q:?} is not a quantity; write e.g. 1Gi, 512Mi or 1000000000"))?;
    let bytes = (n * mult).ceil();
    if !bytes.is_finite() || !(1.0..=MAX_BYTES).contains(&bytes) {
        return Err(format!("{q:?} is not a usable size; give between 1 byte and 8Ei, e.g. 1Gi"));
    }
    // Truncation is exact here: `bytes` is a whole number between 1 and 9e18.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_binary_decimal_and_plain_form() {
        assert_eq!(bytes("1Gi"), Ok(1 << 30));
        assert_eq!(bytes("512Mi"), Ok(512 << 20));
        assert_eq!(bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(bytes("500M"), Ok(500_000_000));
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("1e9"), Ok(1_000_000_000));
        assert!(bytes("lots").unwrap_err().contains("not a quantity"));
        assert!(bytes("0").unwrap_err().contains("between 1 byte"));
    }

    #[test]
    fn overflow_and_float_words_are_refused_not_wrapped() {
        for q in ["16Ei", "18446744073709551615Ki", "1e300", "inf", "NaN", "infGi", "-1Gi", "+1Gi", "Gi"] {
            assert!(bytes(q).is_err(), "{q}");
        }
    }
}
