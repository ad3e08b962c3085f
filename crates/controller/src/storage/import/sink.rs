//! The bytes of an http import on their way to the claim: detected, decompressed when they are
//! gzip or xz, and written to the [`Target`] (raw) or to a [`Scratch`] file (qcow2, converted
//! afterwards by `qemu-img`).
//!
//! # Guarantees
//! - The decompressed bytes are counted as they come out of the decoder: a raw image past
//!   `min(claim, max_bytes)` or a qcow2 file past `min(qcow2_file_limit(claim), max_bytes)` stops
//!   the import at that byte, so a decompression bomb costs at most the claim's size of disk and
//!   never the memory of the whole stream (xz's decoder is also capped at
//!   [`XZ_MEMLIMIT`]).
//! - A qcow2 header announcing a disk larger than the claim is refused after its first 32
//!   bytes, before the download.
//!
//! Every method does blocking file I/O and decompression: callers run it on the blocking pool.

use std::io::{self, Write};

use super::format::{self, Format, HEAD_LEN};
use super::target::{Scratch, Target, TargetError};

/// The most memory xz's decoder may use (xz -9 needs 65 MiB; larger dictionaries are refused).
pub const XZ_MEMLIMIT: u64 = 256 << 20;

/// Why a write into the pipeline failed, carried through the decoders as an `io::Error`.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// A permanent refusal, its status message.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The compressed stream is not valid.
    #[error("the {format} stream is corrupt: {source}")]
    Corrupt {
        format: &'static str,
        #[source]
        source: io::Error,
    },
}

/// What the import left to finish.
pub enum Decoded {
    /// The image is in the target.
    Raw { target: Target, bytes: u64 },
    /// A qcow2 image is in `scratch`, to be converted into `target`.
    Qcow2 { target: Target, scratch: Scratch, bytes: u64 },
}

/// The sizes the decompressed image is held to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The claim's size in bytes.
    pub capacity: u64,
    /// [`ImportConfig::max_bytes`](super::ImportConfig::max_bytes).
    pub max_bytes: u64,
}

enum Out {
    /// Holding the first bytes until the format is known.
    Sniff(Target, Vec<u8>),
    Raw(Target),
    Qcow2(Target, Scratch),
}

/// Where the decoded bytes go (the image, not the compressed stream).
struct Sink {
    out: Option<Out>,
    bytes: u64,
    limits: Limits,
    /// The compression around the image, for messages.
    compressed: Option<&'static str>,
}

fn refused(msg: String) -> io::Error {
    io::Error::other(SinkError::Refused(msg))
}

impl Sink {
    fn take(&mut self) -> io::Result<Out> {
        // Taken only inside one call; gone only after an error already returned.
        self.out.take().ok_or_else(|| refused("the import was already abandoned".into()))
    }

    /// Decides the format from `head` (all of it, or the whole image) and writes it.
    fn decide(&mut self, target: Target, head: &[u8]) -> io::Result<()> {
        let fmt = Format::sniff(head);
        let inside = self.compressed.map(|c| format!(" inside {c}")).unwrap_or_default();
        let out = match fmt {
            Format::Gzip | Format::Xz => {
                return Err(refused(format!(
                    "the source is {} compressed{inside}; only one layer of gzip or xz around a raw or qcow2 image is imported",
                    fmt.name()
                )))
            }
            Format::Raw => Out::Raw(target),
            Format::Qcow2 => {
                let Some(size) = format::qcow2_header_size(head) else {
                    return Err(refused(format!("the qcow2 image{inside} is truncated: {} bytes, shorter than its header", head.len())));
                };
                if size > self.limits.capacity {
                    return Err(refused(format::virtual_too_large(size, self.limits.capacity)));
                }
                let scratch = target.scratch("qcow2").map_err(|e| io::Error::other(SinkError::Target(e)))?;
                Out::Qcow2(target, scratch)
            }
        };
        self.out = Some(out);
        self.put(head)
    }

    /// Writes decided bytes, within the limit of their format.
    fn put(&mut self, buf: &[u8]) -> io::Result<()> {
        let n = buf.len() as u64;
        let Limits { capacity, max_bytes } = self.limits;
        let at = self.bytes + n;
        let r = match self.out.as_mut() {
            Some(Out::Raw(t)) => {
                if at > capacity.min(max_bytes) {
                    return Err(refused(too_large(at, capacity, max_bytes, self.compressed)));
                }
                t.write_all(buf)
            }
            Some(Out::Qcow2(_, s)) => {
                let limit = format::qcow2_file_limit(capacity).min(max_bytes);
                if at > limit {
                    return Err(refused(format!(
                        "the qcow2 image is more than {limit} bytes, more than a qcow2 image of a disk of the claim's {capacity} bytes \
                         takes (or than the import limit of {max_bytes} bytes)"
                    )));
                }
                s.write_all(buf)
            }
            Some(Out::Sniff(..)) | None => return Err(refused("the import was already abandoned".into())),
        };
        self.bytes = at;
        r.map_err(|e| io::Error::other(SinkError::Target(e)))
    }

    fn finish(&mut self) -> io::Result<Decoded> {
        match self.take()? {
            Out::Sniff(t, head) => self.decide(t, &head)?,
            decided => self.out = Some(decided),
        }
        let bytes = self.bytes;
        match self.take()? {
            Out::Raw(target) => Ok(Decoded::Raw { target, bytes }),
            Out::Qcow2(target, scratch) => Ok(Decoded::Qcow2 { target, scratch, bytes }),
            Out::Sniff(..) => Err(refused("the import was already abandoned".into())),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.out.as_mut() {
            Some(Out::Sniff(_, head)) => {
                let want = (HEAD_LEN - head.len()).min(buf.len());
                head.extend_from_slice(&buf[..want]);
                if head.len() == HEAD_LEN {
                    let Out::Sniff(t, head) = self.take()? else { unreachable!("matched above") };
                    self.decide(t, &head)?;
                    self.put(&buf[want..])?;
                }
            }
            _ => self.put(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A source too large, naming the limit it passed.
fn too_large(bytes: u64, capacity: u64, max: u64, compressed: Option<&str>) -> String {
    let limit = capacity.min(max);
    let what = match compressed {
        Some(c) => format!("the source decompresses ({c}) to more than {limit} bytes"),
        None => format!("the source is at least {bytes} bytes"),
    };
    if max < capacity {
        format!("{what}, more than the import limit of {max} bytes")
    } else {
        format!("{what}, larger than the claim's {capacity} bytes; request a larger spec.storage.resources.requests.storage")
    }
}

enum Stage {
    /// Holding the stream's first bytes until its compression is known.
    Sniff(Vec<u8>, Sink),
    Plain(Sink),
    Gzip(flate2::write::MultiGzDecoder<Sink>),
    Xz(xz2::write::XzDecoder<Sink>),
}

/// The import's pipeline: see the module docs.
pub struct Pipeline {
    stage: Option<Stage>,
}

impl Pipeline {
    #[must_use]
    pub fn new(target: Target, limits: Limits) -> Pipeline {
        let sink = Sink { out: Some(Out::Sniff(target, Vec::new())), bytes: 0, limits, compressed: None };
        Pipeline { stage: Some(Stage::Sniff(Vec::new(), sink)) }
    }

    /// The image's format once known: `qcow2` or `raw`, after `gzip`/`xz` if compressed.
    #[must_use]
    pub fn is_qcow2(&self) -> bool {
        let sink = match &self.stage {
            Some(Stage::Plain(s)) => s,
            Some(Stage::Gzip(d)) => d.get_ref(),
            Some(Stage::Xz(d)) => d.get_ref(),
            Some(Stage::Sniff(..)) | None => return false,
        };
        matches!(sink.out, Some(Out::Qcow2(..)))
    }

    /// Feeds the next bytes of the stream.
    ///
    /// # Errors
    /// A refusal (too large, nested compression, a qcow2 larger than the claim), a corrupt
    /// compressed stream, or the target's write error.
    pub fn write(&mut self, buf: &[u8]) -> Result<(), SinkError> {
        let r = match self.stage.as_mut() {
            Some(Stage::Sniff(head, _)) => {
                let want = (HEAD_LEN - head.len()).min(buf.len());
                head.extend_from_slice(&buf[..want]);
                if head.len() < HEAD_LEN {
                    return Ok(());
                }
                let head = std::mem::take(head);
                self.choose(&head)?;
                return self.write(&buf[want..]);
            }
            Some(Stage::Plain(s)) => s.write_all(buf),
            Some(Stage::Gzip(d)) => d.write_all(buf),
            Some(Stage::Xz(d)) => d.write_all(buf),
            None => Err(refused("the import was already abandoned".into())),
        };
        r.map_err(|e| self.error(e))
    }

    /// Picks the decoder for a stream starting with `head`, and feeds it `head`.
    fn choose(&mut self, head: &[u8]) -> Result<(), SinkError> {
        let Some(Stage::Sniff(_, mut sink)) = self.stage.take() else { unreachable!("choose() is called while sniffing") };
        let fmt = Format::sniff(head);
        sink.compressed = fmt.is_compressed().then(|| fmt.name());
        let mut stage = match fmt {
            Format::Gzip => Stage::Gzip(flate2::write::MultiGzDecoder::new(sink)),
            Format::Xz => {
                let stream = xz2::stream::Stream::new_stream_decoder(XZ_MEMLIMIT, xz2::stream::CONCATENATED)
                    .map_err(|e| SinkError::Refused(format!("cannot start the xz decoder: {e}")))?;
                Stage::Xz(xz2::write::XzDecoder::new_stream(sink, stream))
            }
            Format::Qcow2 | Format::Raw => Stage::Plain(sink),
        };
        let r = match &mut stage {
            Stage::Plain(s) => s.write_all(head),
            Stage::Gzip(d) => d.write_all(head),
            Stage::Xz(d) => d.write_all(head),
            Stage::Sniff(..) => Ok(()),
        };
        self.stage = Some(stage);
        r.map_err(|e| self.error(e))
    }

    /// The stream ended: flushes the decoder and hands over what is left to do.
    ///
    /// # Errors
    /// As [`Pipeline::write`], and a compressed stream that ends early.
    pub fn finish(mut self) -> Result<Decoded, SinkError> {
        if let Some(Stage::Sniff(head, _)) = &mut self.stage {
            let head = std::mem::take(head);
            self.choose(&head)?;
        }
        let r = match self.stage.take() {
            Some(Stage::Plain(mut s)) => s.finish(),
            Some(Stage::Gzip(d)) => {
                let fmt = Format::Gzip;
                d.finish().and_then(|mut s| s.finish()).map_err(|e| corrupt_or(e, fmt))
            }
            Some(Stage::Xz(mut d)) => d.finish().and_then(|mut s| s.finish()).map_err(|e| corrupt_or(e, Format::Xz)),
            Some(Stage::Sniff(..)) | None => Err(refused("the import was already abandoned".into())),
        };
        r.map_err(unwrap_error)
    }

    /// The error of a write: the sink's own, or the decoder's (a corrupt stream).
    fn error(&self, e: io::Error) -> SinkError {
        let fmt = match &self.stage {
            Some(Stage::Gzip(_)) => Format::Gzip,
            Some(Stage::Xz(_)) => Format::Xz,
            _ => Format::Raw,
        };
        unwrap_error(corrupt_or(e, fmt))
    }
}

/// Marks a decoder's own error as a corrupt stream; the sink's errors pass through.
fn corrupt_or(e: io::Error, fmt: Format) -> io::Error {
    if is_ours(&e) || !fmt.is_compressed() {
        e
    } else {
        io::Error::other(SinkError::Corrupt { format: fmt.name(), source: e })
    }
}

fn is_ours(e: &io::Error) -> bool {
    match e.get_ref() {
        Some(inner) => inner.is::<SinkError>(),
        None => false,
    }
}

fn unwrap_error(e: io::Error) -> SinkError {
    if !is_ours(&e) {
        return SinkError::Refused(format!("the import failed: {e}"));
    }
    match e.into_inner() {
        Some(inner) => match inner.downcast::<SinkError>() {
            Ok(s) => *s,
            Err(other) => SinkError::Refused(format!("the import failed: {other}")),
        },
        None => SinkError::Refused("the import failed".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;

    const CLAIM: u64 = 64 << 10;

    /// A Filesystem claim of 64 KiB under a fresh root, and a pipeline into it.
    fn pipeline() -> (tempfile::TempDir, Pipeline) {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("u")).unwrap();
        std::fs::write(root.path().join("u/disk.img"), vec![0u8; 64 << 10]).unwrap();
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({"metadata": {"name": "c", "uid": "u"},
            "spec": {"resources": {"requests": {"storage": "64Ki"}}}}))
        .unwrap();
        let target = Target::open(root.path(), &pvc, "c").unwrap();
        (root, Pipeline::new(target, Limits { capacity: CLAIM, max_bytes: 1 << 30 }))
    }

    fn files(root: &tempfile::TempDir) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(root.path().join("u")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    /// Feeds `data` in pieces of `piece` bytes (so detection sees short writes too).
    fn feed(p: &mut Pipeline, data: &[u8], piece: usize) -> Result<(), SinkError> {
        data.chunks(piece).try_for_each(|c| p.write(c))
    }

    fn xz(data: &[u8]) -> Vec<u8> {
        let mut e = xz2::write::XzEncoder::new(Vec::new(), 1);
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn gzip_and_xz_raw_images_are_decompressed_into_the_target() {
        let raw: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
        for (what, stream) in [("gzip", gzip(&raw)), ("xz", xz(&raw)), ("plain", raw.clone())] {
            let (root, mut p) = pipeline();
            feed(&mut p, &stream, 5).unwrap();
            let Decoded::Raw { target, bytes } = p.finish().unwrap() else { panic!("{what}: raw expected") };
            assert_eq!(bytes, raw.len() as u64, "{what}");
            target.commit().unwrap();
            let img = std::fs::read(root.path().join("u/disk.img")).unwrap();
            assert_eq!(&img[..raw.len()], &raw[..], "{what}");
            assert_eq!(files(&root), ["disk.img"], "{what}");
        }
    }

    #[test]
    fn a_bomb_stops_at_the_claim_and_leaves_nothing() {
        let bomb = xz(&vec![0u8; 8 << 20]);
        let (root, mut p) = pipeline();
        // Refused while the stream is fed, long before its 8 MiB are out.
        let e = feed(&mut p, &bomb, 4096).unwrap_err();
        assert_eq!(e.to_string(), "the source decompresses (xz) to more than 65536 bytes, larger than the claim's 65536 bytes; request a larger spec.storage.resources.requests.storage");
        drop(p);
        assert_eq!(files(&root), ["disk.img"]);
    }

    #[test]
    fn nested_compression_and_corrupt_streams_are_refused() {
        let (_root, mut p) = pipeline();
        // gzip's decoder hands its output on when its buffer fills or at the end.
        let e = feed(&mut p, &gzip(&xz(b"hello")), 1000).and_then(|()| p.finish().map(|_| ())).unwrap_err();
        assert!(e.to_string().contains("xz compressed inside gzip"), "{e}");
        let (_root, mut p) = pipeline();
        let mut broken = gzip(&[7u8; 30_000]);
        broken[20..40].fill(0xff);
        let e = feed(&mut p, &broken, 1000).and_then(|()| p.finish().map(|_| ())).unwrap_err();
        assert!(matches!(e, SinkError::Corrupt { format: "gzip", .. }), "{e}");
    }

    #[test]
    fn a_qcow2_goes_to_a_scratch_file_and_its_header_is_checked_first() {
        let mut head = b"QFI\xfb\x00\x00\x00\x03".to_vec();
        head.resize(24, 0);
        let mut fits = head.clone();
        fits.extend_from_slice(&CLAIM.to_be_bytes());
        fits.resize(1000, 9);
        let (root, mut p) = pipeline();
        feed(&mut p, &fits, 7).unwrap();
        assert!(p.is_qcow2());
        let Decoded::Qcow2 { scratch, bytes, .. } = p.finish().unwrap() else { panic!("qcow2 expected") };
        assert_eq!((bytes, std::fs::read(scratch.path()).unwrap()), (1000, fits));
        drop(scratch);
        assert_eq!(files(&root), ["disk.img"], "the scratch file is removed on drop");

        let mut big = head.clone();
        big.extend_from_slice(&(CLAIM + 1).to_be_bytes());
        let (_root, mut p) = pipeline();
        let e = feed(&mut p, &big, 100).unwrap_err();
        assert!(e.to_string().contains("65537 bytes, larger than the claim's 65536 bytes"), "{e}");
        let (_root, mut p) = pipeline();
        feed(&mut p, &head[..10], 100).unwrap();
        let e = p.finish().map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("qcow2 image is truncated: 10 bytes"), "{e}");
    }
}
