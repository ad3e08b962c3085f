//! `source.pvc`: a copy of another claim's bytes, as CDI's host-assisted clone.
//!
//! # Flow
//! The source claim must exist, be `Bound`, be in the DataVolume's namespace, and ask for no
//! more than the new claim. Its bytes are the provisioner's image of it (`disk.img` of a
//! Filesystem claim, the backing file `block.img` of a Block claim's loop device), opened read
//! only beneath the storage root without following symbolic links. Into a Filesystem claim they
//! are first reflinked (`FICLONE`: instant, shares extents on btrfs and XFS); where the
//! filesystem cannot, and into a Block claim's loop device, they are copied data extent by
//! data extent (`SEEK_DATA`/`SEEK_HOLE`), so holes stay holes. The copy goes to the same
//! temp file as an http import, renamed over the image when complete.
//!
//! # Progress
//! `status.progress` is the offset reached in the source over its size.
//!
//! # Namespaces
//! Only a claim of the DataVolume's own namespace is cloned. CDI allows another namespace when
//! the DataVolume's creator may create `datavolumes/source` there (a SubjectAccessReview);
//! virtplug has no such check, so a cross-namespace clone would read any namespace's disks.
//!
//! # Failures
//! Permanent: another namespace, a source larger than the claim, a symlink. Transient (retried,
//! then `Failed`): the source claim missing or not yet `Bound` (it may be created with the
//! DataVolume), a read or write error.
//!
//! # Caveats
//! The copy reads the source while it may be in use: clone a claim no running VM writes to
//! (CDI also clones a claim in use, with the same caveat for a filesystem-level copy).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::ResourceExt;
use rustix::fs::{Mode, OFlags, ResolveFlags, SeekFrom};
use rustix::io::Errno;

use api::cdi::PvcSource;
use api::phases::{ClaimPhase, DataVolumePhase};
use api::DataVolume;

use super::super::{claim_dir, requested_bytes, VolumeMode};
use super::fetch::{blocking, target_error};
use super::target::{Target, TargetError};
use super::{condition, report_progress, set_condition, set_status, Ctx, Done, ImportError};

/// The size of one read and write of the copy.
const PIECE: usize = 1 << 20;

/// One clone attempt of the claim named by `src` into `pvc`.
pub(super) async fn attempt(
    ctx: &Ctx,
    dvs: &Api<DataVolume>,
    dv: &DataVolume,
    pvc: &PersistentVolumeClaim,
    src: &PvcSource,
) -> Result<Done, ImportError> {
    let (ns, name) = (dv.namespace().unwrap_or_default(), dv.name_any());
    let src_ns = if src.namespace.is_empty() { ns.as_str() } else { src.namespace.as_str() };
    if src_ns != ns {
        return Err(ImportError::Permanent(format!(
            "spec.source.pvc.namespace: cloning from another namespace ({src_ns}) is not supported; clone a claim of namespace {ns}"
        )));
    }
    let who = format!("{src_ns}/{}", src.name);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), src_ns);
    let source = pvcs
        .get_opt(&src.name)
        .await
        .map_err(|e| ImportError::Transient(format!("cannot read the source claim {who}: {e}")))?
        .ok_or_else(|| ImportError::Transient(format!("the source claim {who} does not exist")))?;
    if !ClaimPhase::is_bound(&source) {
        return Err(ImportError::Transient(format!("the source claim {who} is not Bound yet")));
    }
    let capacity = requested_bytes(pvc).map_err(ImportError::Permanent)?;
    let src_size = requested_bytes(&source).map_err(|e| ImportError::Permanent(format!("the source claim {who}: {e}")))?;
    if src_size > capacity {
        return Err(ImportError::Permanent(format!(
            "the source claim {who} is {src_size} bytes, larger than this claim's {capacity} bytes; request at least {src_size} bytes"
        )));
    }
    let uid = source.uid().unwrap_or_default();
    if uid.is_empty() || uid.contains('/') || uid == "." || uid == ".." {
        return Err(ImportError::Transient(format!("the source claim {who} has no backing on this node yet")));
    }
    set_status(dvs, &name, |s| {
        s.phase = Some(DataVolumePhase::CloneInProgress);
        s.progress = Some("0.00%".into());
        set_condition(&mut s.conditions, condition("Running", true, "Pod is running", &format!("cloning {who}")));
    })
    .await?;

    let (root, image) = (ctx.root.clone(), VolumeMode::of(&source).image_name());
    let src_file = blocking(move || open_source(&root, &uid, image)).await?;
    let target = {
        let (root, pvc, claim) = (ctx.root.clone(), pvc.clone(), name.clone());
        blocking(move || Target::open(&root, &pvc, &claim)).await?
    };
    let len = src_file.metadata().map_err(|e| ImportError::Transient(format!("cannot stat the source claim {who}'s image: {e}")))?.len();
    if len > capacity {
        return Err(ImportError::Permanent(format!(
            "the source claim {who}'s image is {len} bytes, larger than this claim's {capacity} bytes"
        )));
    }
    // The copy runs on the blocking pool; dropping this attempt (the DataVolume was deleted)
    // stops it at the next piece and its temp file is removed with the target.
    let done = Arc::new(AtomicU64::new(0));
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let copy = {
        let (done, stop) = (Arc::clone(&done), Arc::clone(&stop.0));
        tokio::task::spawn_blocking(move || copy(&src_file, target, len, &done, &stop))
    };
    let mut copy = std::pin::pin!(copy);
    let mut tick = tokio::time::interval(ctx.config.progress_interval.max(Duration::from_millis(1)));
    let (target, how) = loop {
        tokio::select! {
            r = &mut copy => break r.map_err(|e| ImportError::Transient(e.to_string()))?.map_err(|e| target_error(&e))?,
            _ = tick.tick() => {
                if len > 0 {
                    #[allow(clippy::cast_precision_loss)]
                    let pct = format!("{:.2}%", done.load(Ordering::Relaxed) as f64 * 100.0 / len as f64);
                    report_progress(dvs, &name, &pct).await;
                }
            }
        }
    };
    blocking(move || target.commit()).await?;
    tracing::info!("cloned {len} bytes from {who} into its claim ({how})");
    Ok(Done { running: "clone done", ready: format!("cloned {len} bytes from {who} ({how})") })
}

/// Sets its flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Opens `ROOT/<uid>/<image>` read only, without following symbolic links.
fn open_source(root: &Path, uid: &str, image: &str) -> Result<File, TargetError> {
    let path: PathBuf = claim_dir(root, uid).join(image);
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let root_fd = rustix::fs::open(root, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| TargetError::Io { what: "open", path: root.to_owned(), source: e.into() })?;
    let rel = format!("{uid}/{image}");
    let fd = match rustix::fs::openat2(&root_fd, rel.as_str(), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty(), how) {
        Err(Errno::NOSYS) => rustix::fs::open(&path, OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty()),
        r => r,
    };
    match fd {
        Ok(fd) => Ok(File::from(fd)),
        Err(e) if e == Errno::LOOP || e == Errno::XDEV => Err(TargetError::Symlink { path }),
        Err(e) => Err(TargetError::Io { what: "open", path, source: e.into() }),
    }
}

/// Copies `len` bytes of `src` into `target`: a reflink where it can, else data extents only.
/// Returns the target and how it was copied.
fn copy(src: &File, target: Target, len: u64, done: &AtomicU64, stop: &AtomicBool) -> Result<(Target, &'static str), TargetError> {
    let io = |what: &'static str, t: &Target| {
        let path = t.path();
        move |source: std::io::Error| TargetError::Io { what, path, source }
    };
    if !target.is_device() && rustix::fs::ioctl_ficlone(target.file(), src).is_ok() {
        done.store(len, Ordering::Relaxed);
        return Ok((target, "reflink"));
    }
    let mut buf = vec![0u8; PIECE];
    let mut at = 0u64;
    while at < len {
        // The next data extent; a file system without SEEK_DATA reports all of it as data.
        let start = match rustix::fs::seek(src, SeekFrom::Data(at)) {
            Ok(off) => off,
            Err(Errno::NXIO) => break, // only a hole is left
            Err(_) => at,
        };
        let end = rustix::fs::seek(src, SeekFrom::Hole(start)).unwrap_or(len).min(len);
        let mut off = start;
        while off < end {
            if stop.load(Ordering::Relaxed) {
                return Err(TargetError::Io { what: "copy into", path: target.path(), source: std::io::Error::other("cancelled") });
            }
            let n = usize::try_from(end - off).unwrap_or(PIECE).min(PIECE);
            src.read_exact_at(&mut buf[..n], off).map_err(io("read the source for", &target))?;
            target.file().write_all_at(&buf[..n], off).map_err(io("write", &target))?;
            off += n as u64;
            done.store(off, Ordering::Relaxed);
        }
        at = end;
    }
    done.store(len, Ordering::Relaxed);
    Ok((target, "copy"))
}
