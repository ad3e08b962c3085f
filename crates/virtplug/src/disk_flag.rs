//! `--disk PATH=BYTES`, the flag of the two processes that create an empty Filesystem claim's
//! `disk.img` inside their pod (`virtplug launcher` for boot claims, `virtplug
//! attachment-holder` for hot-plugged ones), as KubeVirt's virt-launcher creates it: a fresh
//! CSI Filesystem claim is an empty file system, and the pod's process is the one that has it
//! mounted (the node agent would need the pod's mount namespace).
//!
//! # Guarantees
//! An existing image is never touched (`O_EXCL` create). A created one is fsynced with its
//! directory before the caller goes on (the launcher binds its socket, the holder listens), so
//! the node agent never opens a half-made image.

use std::path::{Component, Path, PathBuf};

use anyhow::Context as _;

/// One `--disk`: the image to create if missing, and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    pub path: PathBuf,
    pub bytes: u64,
}

/// Parses `PATH=BYTES` (the last `=` splits: a path may hold one). The path must be absolute
/// without `..` (it names a file in the pod's own mounts), the size a positive byte count.
///
/// # Errors
/// Which part is wrong and what is expected (clap names the flag and the value around it).
pub fn parse(s: &str) -> Result<Disk, String> {
    let (path, bytes) = s.rsplit_once('=').ok_or_else(|| "expected PATH=BYTES (the image to create and its size)".to_owned())?;
    let path = PathBuf::from(path);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) || path.file_name().is_none() {
        return Err(format!("PATH {:?} must be an absolute file path without \"..\"", path.display()));
    }
    let bytes =
        bytes.parse::<u64>().ok().filter(|b| *b > 0).ok_or_else(|| format!("BYTES {bytes:?} must be a positive number of bytes"))?;
    Ok(Disk { path, bytes })
}

/// Creates `path` sparse with `bytes` unless it exists; returns whether it created it.
///
/// # Errors
/// When the file cannot be created, sized or synced (the message names the path).
pub fn ensure_image(path: &Path, bytes: u64) -> anyhow::Result<bool> {
    let file = match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
    };
    file.set_len(bytes).with_context(|| format!("cannot size {} to {bytes} bytes", path.display()))?;
    file.sync_all().with_context(|| format!("cannot sync {}", path.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("cannot sync {}", dir.display()))?;
    }
    Ok(true)
}

/// [`ensure_image`] for each of `disks`, saying on stdout which it created.
///
/// # Errors
/// The first image that cannot be created.
pub fn ensure_all(disks: &[Disk]) -> anyhow::Result<()> {
    for d in disks {
        if ensure_image(&d.path, d.bytes)? {
            println!("created {} ({} bytes, sparse)", d.path.display(), d.bytes);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_claim_gets_a_sparse_image_and_an_existing_one_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        assert!(ensure_image(&img, 64 << 20).unwrap());
        let md = std::fs::metadata(&img).unwrap();
        assert_eq!(md.len(), 64 << 20);
        assert!(std::os::unix::fs::MetadataExt::blocks(&md) < 64, "sparse: no data blocks written");
        std::fs::write(&img, b"data").unwrap();
        assert!(!ensure_image(&img, 64 << 20).unwrap(), "an existing image is never recreated");
        assert_eq!(std::fs::read(&img).unwrap(), b"data");
    }

    #[test]
    fn disk_arguments_are_an_absolute_path_equals_positive_bytes() {
        assert_eq!(parse("/a=b/disk.img=10").unwrap(), Disk { path: PathBuf::from("/a=b/disk.img"), bytes: 10 });
        for (bad, says) in [
            ("/x/disk.img", "expected PATH=BYTES"),
            ("x/disk.img=10", "absolute"),
            ("/x/../etc/disk.img=10", "without \"..\""),
            ("/=10", "absolute file path"),
            ("/x/disk.img=0", "positive"),
            ("/x/disk.img=-1", "positive"),
            ("/x/disk.img=64Mi", "BYTES \"64Mi\""),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    /// clap names the flag and the value around the parser's message.
    #[test]
    fn a_bad_disk_flag_is_refused_naming_the_flag() {
        use clap::Parser;
        #[derive(clap::Parser, Debug)]
        struct Args {
            #[arg(long = "disk", value_parser = parse)]
            disks: Vec<Disk>,
        }
        let e = Args::try_parse_from(["x", "--disk", "/v/disk.img=lots"]).unwrap_err().to_string();
        assert!(e.contains("--disk") && e.contains("/v/disk.img=lots") && e.contains("positive"), "{e}");
        let ok = Args::try_parse_from(["x", "--disk", "/v/disk.img=512", "--disk", "/w/disk.img=1024"]).unwrap();
        assert_eq!(ok.disks.len(), 2);
    }
}
