//! What an imported image is, from its first bytes, and whether `qemu-img` may convert it.
//!
//! # Detection
//! By magic bytes, never by the URL's suffix or Content-Type (as CDI's `headerMatch`): gzip
//! (`1f 8b`), xz (`fd 37 7a 58 5a 00`), qcow2 (`QFI\xfb`); anything else is raw (an ISO is
//! raw). A compressed stream is decompressed first and its content detected again; a
//! compressed stream inside a compressed stream is refused (no cloud image ships so, and each
//! layer would multiply a bomb).
//!
//! # What `qemu-img` is trusted with
//! A qcow2 image may name a backing file or an external data file, which QEMU would open from
//! the controller's filesystem: [`check_info`] refuses both, any format but qcow2, and a
//! virtual size larger than the claim, from `qemu-img info --output=json` run with `-f qcow2`
//! (never letting QEMU probe the format of untrusted bytes, as QEMU's documentation advises).

use serde::Deserialize;

/// How many first bytes detection needs: a qcow2 header up to its virtual size.
pub const HEAD_LEN: usize = 32;

const GZIP: &[u8] = b"\x1f\x8b";
const XZ: &[u8] = b"\xfd7zXZ\x00";
const QCOW2: &[u8] = b"QFI\xfb";

/// An image's format by its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Gzip,
    Xz,
    Qcow2,
    Raw,
}

impl Format {
    /// The format of an image starting with `head` (at least [`HEAD_LEN`] bytes, or all of a
    /// shorter image).
    #[must_use]
    pub fn sniff(head: &[u8]) -> Format {
        if head.starts_with(GZIP) {
            Format::Gzip
        } else if head.starts_with(XZ) {
            Format::Xz
        } else if head.starts_with(QCOW2) {
            Format::Qcow2
        } else {
            Format::Raw
        }
    }

    #[must_use]
    pub fn is_compressed(self) -> bool {
        matches!(self, Format::Gzip | Format::Xz)
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Format::Gzip => "gzip",
            Format::Xz => "xz",
            Format::Qcow2 => "qcow2",
            Format::Raw => "raw",
        }
    }
}

/// The virtual size a qcow2 header announces (big-endian at offset 24), checked before the
/// image is downloaded whole; `qemu-img info` is the final word.
#[must_use]
pub fn qcow2_header_size(head: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = head.get(24..32)?.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

/// The most a qcow2 file of a claim of `capacity` bytes may take while it is downloaded: its
/// data (at most the virtual size, itself at most the claim) plus its metadata (L1/L2 and
/// refcount tables: well under 1/64 of the data with 512-byte clusters, 1/4096 with the default
/// 64 KiB) and a margin for small images.
#[must_use]
pub fn qcow2_file_limit(capacity: u64) -> u64 {
    capacity.saturating_add(capacity / 64).saturating_add(4 << 20)
}

#[derive(Deserialize)]
struct Info {
    format: String,
    #[serde(rename = "virtual-size")]
    virtual_size: u64,
    #[serde(rename = "backing-filename")]
    backing_filename: Option<String>,
    #[serde(rename = "format-specific")]
    specific: Option<Specific>,
}

#[derive(Deserialize)]
struct Specific {
    data: Option<serde_json::Value>,
}

/// Checks `qemu-img info --output=json` of a downloaded qcow2 image against a claim of
/// `capacity` bytes; returns the image's virtual size.
///
/// # Errors
/// A status message: not JSON, not qcow2, a backing file, an external data file, or a virtual
/// size larger than the claim (naming both sizes).
pub fn check_info(json: &str, capacity: u64) -> Result<u64, String> {
    let info: Info = serde_json::from_str(json).map_err(|e| format!("qemu-img info gave an answer that is not understood: {e}"))?;
    if info.format != "qcow2" {
        return Err(format!("the image is {:?}, not qcow2", info.format));
    }
    if let Some(b) = info.backing_filename {
        return Err(format!(
            "the qcow2 image has a backing file ({b:?}); only self-contained images are imported (flatten it with: qemu-img convert -O qcow2 IN OUT)"
        ));
    }
    let data_file = info.specific.and_then(|s| s.data).and_then(|d| d.get("data-file").cloned());
    if let Some(d) = data_file {
        return Err(format!("the qcow2 image keeps its data in an external file ({d}); only self-contained images are imported"));
    }
    if info.virtual_size > capacity {
        return Err(virtual_too_large(info.virtual_size, capacity));
    }
    Ok(info.virtual_size)
}

/// The message for a qcow2 image whose disk is larger than the claim.
#[must_use]
pub fn virtual_too_large(virtual_size: u64, capacity: u64) -> String {
    format!(
        "the qcow2 image's virtual size is {virtual_size} bytes, larger than the claim's {capacity} bytes; \
         request at least {virtual_size} bytes in spec.storage.resources.requests.storage"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_their_magic_bytes() {
        assert_eq!(Format::sniff(b"\x1f\x8b\x08\x00rest"), Format::Gzip);
        assert_eq!(Format::sniff(b"\xfd7zXZ\x00\x00\x04"), Format::Xz);
        assert_eq!(Format::sniff(b"QFI\xfb\x00\x00\x00\x03"), Format::Qcow2);
        // An ISO, zeros, a short file, and xz's magic cut short are raw.
        assert_eq!(Format::sniff(b"\x00\x00\x00\x00"), Format::Raw);
        assert_eq!(Format::sniff(b"\x1f"), Format::Raw);
        assert_eq!(Format::sniff(b"\xfd7zXZ"), Format::Raw);
        assert_eq!(Format::sniff(b""), Format::Raw);
        assert!(Format::Xz.is_compressed() && !Format::Qcow2.is_compressed());
    }

    #[test]
    fn the_qcow2_header_gives_the_virtual_size() {
        let mut head = b"QFI\xfb\x00\x00\x00\x03".to_vec();
        head.resize(24, 0);
        assert_eq!(qcow2_header_size(&head), None, "too short");
        head.extend_from_slice(&(5u64 << 30).to_be_bytes());
        assert_eq!(qcow2_header_size(&head), Some(5 << 30));
    }

    #[test]
    fn the_qcow2_download_is_bounded_near_the_claim() {
        assert_eq!(qcow2_file_limit(64 << 20), (64 << 20) + (1 << 20) + (4 << 20));
        assert_eq!(qcow2_file_limit(u64::MAX), u64::MAX);
    }

    fn info(extra: &str) -> String {
        format!(
            r#"{{"virtual-size": 1048576, "filename": "/x", "format": "qcow2", "format-specific": {{"type": "qcow2", "data": {{"compat": "1.1"{extra}}}}}}}"#
        )
    }

    #[test]
    fn a_self_contained_qcow2_no_larger_than_the_claim_passes() {
        assert_eq!(check_info(&info(""), 1 << 20), Ok(1 << 20));
    }

    #[test]
    fn a_virtual_size_above_the_claim_is_refused_naming_both_sizes() {
        let e = check_info(&info(""), 1000).unwrap_err();
        assert!(e.contains("1048576 bytes") && e.contains("claim's 1000 bytes"), "{e}");
    }

    #[test]
    fn backing_and_data_files_and_other_formats_are_refused() {
        let backing = r#"{"virtual-size": 1, "format": "qcow2", "backing-filename": "/etc/shadow", "backing-filename-format": "raw"}"#;
        assert!(check_info(backing, 1 << 20).unwrap_err().contains("backing file"));
        let data = info(r#", "data-file": "/dev/sda", "data-file-raw": false"#);
        assert!(check_info(&data, 1 << 20).unwrap_err().contains("external file"));
        assert!(check_info(r#"{"virtual-size": 1, "format": "vmdk"}"#, 1 << 20).unwrap_err().contains("not qcow2"));
        assert!(check_info("qemu-img: oops", 1 << 20).unwrap_err().contains("not understood"));
    }
}
