//! One import attempt: the request (through the [`net_policy`](super::net_policy) guard), the
//! transfer into the [`Target`], and its limits.
//!
//! # Limits
//! - [`ImportConfig::deadline`](super::ImportConfig::deadline): the whole attempt, from the
//!   first connect to the final sync.
//! - [`ImportConfig::min_rate`](super::ImportConfig::min_rate) over each
//!   [`ImportConfig::min_rate_window`](super::ImportConfig::min_rate_window) of the body (as
//!   curl's `--speed-limit`/`--speed-time`).
//! - The size limits: Content-Length against the claim and
//!   [`ImportConfig::max_bytes`](super::ImportConfig::max_bytes); the image's bytes, after
//!   decompression, in the [`sink`](super::sink).
//!
//! # Progress
//! `status.progress` is the share of the body received (of its Content-Length; compressed
//! bytes for a compressed source). A qcow2 image's download counts for the first half and its
//! conversion (`qemu-img convert -p`) for the second: the conversion writes the whole disk,
//! often the longer part.
//!
//! # Messages
//! Status messages name the host, never the port, a resolved address, or why a connection
//! failed: every connect, DNS or header-wait failure reads "could not connect to HOST", and a
//! refused host "could not connect to HOST: the host is not allowed (...)", so status messages
//! cannot scan ports or map a network. The controller's log has the details.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use tokio::time::{Instant, MissedTickBehavior};

use api::phases::DataVolumePhase;
use api::DataVolume;

use super::format;
use super::net_policy::{check_url, find_refusal, Refusal};
use super::qemu_img;
use super::sink::{Decoded, Limits, Pipeline, SinkError};
use super::target::{Target, TargetError};
use super::{condition, report_progress, set_condition, set_status, Ctx, Done, ImportError};

/// One attempt under the configured deadline. Dropping the returned future (the DataVolume was
/// deleted) closes the connection and removes the partial file.
pub(super) async fn attempt(
    ctx: &Ctx,
    dvs: &Api<DataVolume>,
    name: &str,
    pvc: &PersistentVolumeClaim,
    url: &str,
) -> Result<Done, ImportError> {
    let deadline = ctx.config.deadline;
    match tokio::time::timeout(deadline, import(ctx, dvs, name, pvc, url)).await {
        Ok(r) => r,
        Err(_) => Err(ImportError::Transient(format!(
            "the import did not finish within {deadline:?}, the deadline of one attempt (the controller's --import-deadline)"
        ))),
    }
}

/// The host of `url` for messages: no port, no path.
fn host_of(url: &reqwest::Url) -> String {
    url.host_str().unwrap_or("(no host)").to_owned()
}

/// The status message for a refusal; the log gets the resolved address and its class.
fn refused(r: &Refusal) -> ImportError {
    tracing::warn!("import refused: {r}");
    match r {
        Refusal::Host { host, .. } => ImportError::Permanent(format!(
            "could not connect to {host}: the host is not allowed (imports refuse loopback, link-local, multicast, broadcast, \
             unspecified, cloud metadata and this machine's own addresses; the controller's --import-allow-host allows a host)"
        )),
        Refusal::Scheme(s) => ImportError::Permanent(format!("a redirect to a {s:?} URL was refused; only http and https are followed")),
        Refusal::TooManyRedirects(n) => ImportError::Permanent(format!("more than {n} redirects; the import gave up")),
        Refusal::NoHost => ImportError::Permanent("a redirect to a URL without a host was refused".to_owned()),
        Refusal::LocalAddrs(_) => ImportError::Transient("cannot check the host against this machine's addresses".to_owned()),
    }
}

pub(super) fn target_error(e: &TargetError) -> ImportError {
    let msg = client::error_chain(e);
    match e {
        TargetError::Symlink { .. } | TargetError::NotBlockDevice { .. } => ImportError::Permanent(msg),
        TargetError::NoBacking { .. } | TargetError::Io { .. } => ImportError::Transient(msg),
    }
}

fn sink_error(e: SinkError) -> ImportError {
    match e {
        SinkError::Target(t) => target_error(&t),
        SinkError::Refused(_) | SinkError::Corrupt { .. } => ImportError::Permanent(client::error_chain(&e)),
    }
}

/// Runs `f` (decompression and file I/O) on the blocking pool.
async fn blocking_sink<T: Send + 'static>(f: impl FnOnce() -> Result<T, SinkError> + Send + 'static) -> Result<T, ImportError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ImportError::Transient(e.to_string()))?.map_err(sink_error)
}

/// Runs `f` (file I/O) on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, TargetError> + Send + 'static) -> Result<T, ImportError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ImportError::Transient(e.to_string()))?.map_err(|e| target_error(&e))
}

/// Sends the request; a non-2xx answer is an error.
async fn request(ctx: &Ctx, url: reqwest::Url) -> Result<reqwest::Response, ImportError> {
    let host = host_of(&url);
    check_url(&ctx.policy, &url).map_err(|r| refused(&r))?;
    let resp = ctx.http.get(url).send().await.map_err(|e| match find_refusal(&e) {
        Some(r) => refused(r),
        None => {
            let at = e.url().map_or_else(|| host.clone(), host_of);
            tracing::warn!("import from {at}: {}", client::error_chain(&e));
            ImportError::Transient(format!("could not connect to {at}"))
        }
    })?;
    if !resp.status().is_success() {
        return Err(ImportError::Transient(format!("{} answered HTTP {}", host_of(resp.url()), resp.status())));
    }
    Ok(resp)
}

/// One attempt: stream `url` into the claim.
async fn import(ctx: &Ctx, dvs: &Api<DataVolume>, name: &str, pvc: &PersistentVolumeClaim, url: &str) -> Result<Done, ImportError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| ImportError::Permanent(format!("spec.source.http.url {url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ImportError::Permanent(format!(
            "spec.source.http.url uses the scheme {:?}; only http and https sources are imported (no local files)",
            parsed.scheme()
        )));
    }
    let capacity = super::super::requested_bytes(pvc).map_err(ImportError::Permanent)?;
    // The bytes on the wire: a qcow2 image may pass the claim's size by its metadata; the
    // image's own limits are the sink's.
    let limit = format::qcow2_file_limit(capacity).min(ctx.config.max_bytes);
    let resp = request(ctx, parsed).await?;
    let host = host_of(resp.url());
    let total = resp.content_length();
    if let Some(len) = total {
        if len > limit {
            return Err(ImportError::Permanent(too_large(len, capacity, ctx.config.max_bytes)));
        }
    }
    set_status(dvs, name, |s| {
        s.phase = Some(DataVolumePhase::ImportInProgress);
        s.progress = Some("0.00%".into());
        set_condition(&mut s.conditions, condition("Running", true, "Pod is running", "importing"));
    })
    .await?;
    let target = {
        let (root, pvc, claim) = (ctx.root.clone(), pvc.clone(), name.to_owned());
        blocking(move || Target::open(&root, &pvc, &claim)).await?
    };
    let body = Body { host: &host, total, limit, capacity };
    let pipe = Pipeline::new(target, Limits { capacity, max_bytes: ctx.config.max_bytes });
    let (pipe, received) = transfer(ctx, dvs, name, &body, resp, pipe).await?;
    let (target, written) = match blocking_sink(move || pipe.finish()).await? {
        Decoded::Raw { target, bytes } => (target, bytes),
        Decoded::Qcow2 { target, scratch, bytes } => {
            tracing::info!("received a qcow2 image of {bytes} bytes ({received} bytes on the wire); converting it to raw");
            // No fsync of the scratch file: `qemu-img` reads it through the same page cache
            // (an O_DIRECT read too sees what was written), and it is deleted after the
            // conversion; durability is the target's, synced at commit. The fsync cost a
            // quarter of a second per 300 MiB (BENCHMARKS.md, DataVolume import throughput).
            let info = qemu_img::info(scratch.path()).await?;
            let virtual_size = format::check_info(&info, capacity).map_err(ImportError::Permanent)?;
            let mut target = target;
            target = blocking(move || target.reserve(virtual_size).map(|()| target)).await?;
            convert(ctx, dvs, name, &scratch, &target).await?;
            drop(scratch);
            (target, virtual_size)
        }
    };
    blocking(move || target.commit()).await?;
    tracing::info!("imported {written} bytes from {url} into its claim");
    Ok(Done { running: "import done", ready: format!("imported {written} bytes") })
}

/// Converts the qcow2 image in `scratch` into `target`, reporting the second half of the
/// progress.
async fn convert(
    ctx: &Ctx,
    dvs: &Api<DataVolume>,
    name: &str,
    scratch: &super::target::Scratch,
    target: &Target,
) -> Result<(), ImportError> {
    let (tx, mut rx) = tokio::sync::watch::channel(0.0f64);
    let dst = target.path();
    let run = qemu_img::convert(scratch.path(), &dst, !target.is_device(), move |p| {
        let _ = tx.send(p);
    });
    let mut run = std::pin::pin!(run);
    let mut last_report = Instant::now();
    loop {
        tokio::select! {
            r = &mut run => return r,
            changed = rx.changed() => {
                if changed.is_err() || last_report.elapsed() < ctx.config.progress_interval {
                    continue;
                }
                last_report = Instant::now();
                let pct = format!("{:.2}%", 50.0 + *rx.borrow_and_update() * 50.0);
                report_progress(dvs, name, &pct).await;
            }
        }
    }
}

/// What is known about the body before it is read.
struct Body<'a> {
    host: &'a str,
    total: Option<u64>,
    limit: u64,
    capacity: u64,
}

/// Whether `moved` bytes in `window` is below `min_rate` bytes per second.
fn too_slow(moved: u64, min_rate: u64, window: Duration) -> bool {
    // u128 holds `moved` × 10⁶; the product of two flags may not fit: it saturates.
    u128::from(moved) * 1_000_000 < u128::from(min_rate).saturating_mul(window.as_micros())
}

/// Streams the body into `pipe`, reporting progress; returns the pipeline and the bytes received.
async fn transfer(
    ctx: &Ctx,
    dvs: &Api<DataVolume>,
    name: &str,
    body: &Body<'_>,
    resp: reqwest::Response,
    mut pipe: Pipeline,
) -> Result<(Pipeline, u64), ImportError> {
    let (host, cfg) = (body.host, &ctx.config);
    let window = cfg.min_rate_window;
    let check_rate = cfg.min_rate > 0 && !window.is_zero();
    // A window of any length (a flag): one too long to add to now never ticks.
    let now = Instant::now();
    let mut tick = tokio::time::interval_at(
        now.checked_add(window).unwrap_or(now + Duration::from_secs(86400 * 365 * 30)),
        window.max(Duration::from_millis(1)),
    );
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let (mut written, mut window_start) = (0u64, 0u64);
    let mut last_report = Instant::now();
    let mut stream = resp.bytes_stream();
    loop {
        let next = tokio::select! {
            next = stream.next() => next,
            _ = tick.tick(), if check_rate => {
                let moved = written - window_start;
                if too_slow(moved, cfg.min_rate, window) {
                    return Err(ImportError::Transient(format!(
                        "the transfer from {host} was slower than {} bytes/s over {window:?} ({moved} bytes); aborted \
                         (the controller's --import-min-rate and --import-min-rate-window)",
                        cfg.min_rate
                    )));
                }
                window_start = written;
                continue;
            }
        };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| {
            tracing::warn!("import from {host} into {name}: {}", client::error_chain(&e));
            ImportError::Transient(match body.total {
                Some(t) => format!("the transfer from {host} broke off after {written} of {t} bytes"),
                None => format!("the transfer from {host} broke off after {written} bytes"),
            })
        })?;
        written += chunk.len() as u64;
        if written > body.limit {
            return Err(ImportError::Permanent(too_large(written, body.capacity, cfg.max_bytes)));
        }
        // Decompression and the write of one chunk (at most a few hundred KiB): on the blocking pool.
        pipe = blocking_sink(move || pipe.write(&chunk).map(|()| pipe)).await?;
        if let Some(t) = body.total.filter(|t| *t > 0) {
            if last_report.elapsed() >= cfg.progress_interval {
                last_report = Instant::now();
                // A qcow2 image's download is the first half of its import.
                let share = if pipe.is_qcow2() { 50.0 } else { 100.0 };
                #[allow(clippy::cast_precision_loss)]
                let pct = format!("{:.2}%", written as f64 * share / t as f64);
                report_progress(dvs, name, &pct).await;
            }
        }
    }
    if let Some(t) = body.total {
        if written != t {
            return Err(ImportError::Transient(format!("the transfer from {host} ended after {written} of {t} bytes (truncated)")));
        }
    }
    Ok((pipe, written))
}

fn too_large(bytes: u64, capacity: u64, max: u64) -> String {
    if bytes > max && max < capacity {
        format!("the source is at least {bytes} bytes, more than the import limit of {max} bytes")
    } else {
        format!("the source is at least {bytes} bytes, larger than the claim's {capacity} bytes; request a larger spec.storage.resources.requests.storage")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_check_averages_over_the_window() {
        let w = Duration::from_secs(60);
        assert!(too_slow(16 * 1024 * 60 - 1, 16 * 1024, w));
        assert!(!too_slow(16 * 1024 * 60, 16 * 1024, w));
        assert!(too_slow(0, 1, Duration::from_millis(1)));
        assert!(!too_slow(u64::MAX, u64::MAX, Duration::from_secs(1)));
    }

    /// The product of two flags (`--import-min-rate`, `--import-min-rate-window`) overflowed
    /// u128 and panicked in a debug build.
    #[test]
    fn the_rate_check_does_not_overflow_on_any_flags() {
        assert!(too_slow(u64::MAX, u64::MAX, Duration::MAX));
    }
}
