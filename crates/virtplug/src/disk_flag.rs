//! `--disk PATH=BYTES`, the flag of the two processes that create an empty Filesystem claim's
//! `disk.img` inside their pod (`virtplug launcher` for boot claims, `virtplug
//! attachment-holder` for hot-plugged ones), as KubeVirt's virt-launcher creates it: a fresh
//! CSI Filesystem claim is an empty file system, and the pod's process is the one that has it
//! mounted (the node agent would need the pod's mount namespace).
//!
//! # Guarantees
//! A new image is never bigger than the space its file system has left: a provisioner may give
//! a claim less room than it asked for (the file system's own overhead), and a sparse image
//! bigger than the room would fail the guest's writes near its end with `ENOSPC`. As KubeVirt's
//! virt-launcher does, the image takes the available space (less [`RESERVE`]) when that is
//! within [`TOLERATION_PERCENT`] of the request, and is refused — naming the sizes — beyond it.
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

/// Bytes kept free on the claim's file system (KubeVirt's default `minimumPVCReserveBytes`).
pub const RESERVE: u64 = 1 << 20;
/// How much smaller than requested an image may be (KubeVirt's default
/// `pvc-tolerate-less-space-up-to-percent`).
pub const TOLERATION_PERCENT: u64 = 10;

/// The size of a new image of `requested` bytes on a file system with `available` bytes free
/// (see the module's guarantees).
///
/// # Errors
/// When even the tolerated size does not fit, with both sizes.
pub fn image_size(requested: u64, available: u64) -> Result<u64, String> {
    let room = available.saturating_sub(RESERVE);
    if requested <= room {
        return Ok(requested);
    }
    let tolerated = requested / 100 * (100 - TOLERATION_PERCENT);
    if tolerated > room {
        return Err(format!(
            "not enough space: the claim asks for {requested} bytes and its file system has {room} left (after a {RESERVE}-byte reserve), \
             more than {TOLERATION_PERCENT} % less; give the claim more room or ask for less"
        ));
    }
    Ok(room)
}

/// Creates `path` sparse with `bytes` (or the room its file system has, [`image_size`]) unless it
/// exists; returns the size it created, `None` when it existed.
///
/// # Errors
/// When the file cannot be created, sized or synced, or does not fit (the message names the
/// path).
pub fn ensure_image(path: &Path, bytes: u64) -> anyhow::Result<Option<u64>> {
    if path.exists() {
        return Ok(None);
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let st = rustix::fs::statvfs(dir).with_context(|| format!("cannot read the free space of {}", dir.display()))?;
    let bytes =
        image_size(bytes, st.f_bavail.saturating_mul(st.f_frsize)).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
    let file = match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
    };
    file.set_len(bytes).with_context(|| format!("cannot size {} to {bytes} bytes", path.display()))?;
    file.sync_all().with_context(|| format!("cannot sync {}", path.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("cannot sync {}", dir.display()))?;
    }
    Ok(Some(bytes))
}

/// [`ensure_image`] for each of `disks`, saying on stdout which it created.
///
/// # Errors
/// The first image that cannot be created.
pub fn ensure_all(disks: &[Disk]) -> anyhow::Result<()> {
    for d in disks {
        match ensure_image(&d.path, d.bytes)? {
            Some(b) if b < d.bytes => {
                println!("created {} ({b} bytes, sparse: {} asked, more than its file system has left)", d.path.display(), d.bytes);
            }
            Some(b) => println!("created {} ({b} bytes, sparse)", d.path.display()),
            None => {}
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
        assert_eq!(ensure_image(&img, 64 << 20).unwrap(), Some(64 << 20));
        let md = std::fs::metadata(&img).unwrap();
        assert_eq!(md.len(), 64 << 20);
        assert!(std::os::unix::fs::MetadataExt::blocks(&md) < 64, "sparse: no data blocks written");
        std::fs::write(&img, b"data").unwrap();
        assert_eq!(ensure_image(&img, 64 << 20).unwrap(), None, "an existing image is never recreated");
        assert_eq!(std::fs::read(&img).unwrap(), b"data");
    }

    /// KubeVirt's rule: the request when it fits; the room left when that is within 10 % of
    /// the request; refused, naming both, beyond.
    #[test]
    fn an_image_takes_the_room_left_within_the_toleration_and_is_refused_beyond() {
        let mib = 1 << 20;
        assert_eq!(image_size(64 * mib, 200 * mib), Ok(64 * mib));
        assert_eq!(image_size(64 * mib, 65 * mib), Ok(64 * mib), "the reserve still fits");
        assert_eq!(image_size(100 * mib, 95 * mib), Ok(94 * mib), "5 % short: the room left");
        let e = image_size(100 * mib, 80 * mib).unwrap_err();
        assert!(e.contains(&(100 * mib).to_string()) && e.contains(&(79 * mib).to_string()) && e.contains("10 %"), "{e}");
    }

    /// On a real file system too small for the request (a 16 MiB tmpfs; root to mount it).
    #[test]
    fn a_claim_smaller_than_asked_gets_an_image_of_its_room() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=16m", "claim"]).arg(dir.path()).status().unwrap();
        assert!(ok.success());
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(self.0).status();
            }
        }
        let _unmount = Unmount(dir.path());
        let made = ensure_image(&dir.path().join("disk.img"), 16 << 20).unwrap().unwrap();
        assert_eq!(made, (16 << 20) - RESERVE, "the room left, within 10 % of the request");
        assert_eq!(std::fs::metadata(dir.path().join("disk.img")).unwrap().len(), made);
        let e = ensure_image(&dir.path().join("big.img"), 64 << 20).unwrap_err().to_string();
        assert!(e.contains("big.img") && e.contains("not enough space"), "{e}");
        assert!(!dir.path().join("big.img").exists(), "nothing made when refused");
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
