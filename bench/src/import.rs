//! DataVolume import throughput (issue 20): a raw disk image, its qcow2 form and its
//! xz-compressed form, served from a loopback HTTP server, each imported by a DataVolume into
//! a real `virtplug up` (its own process; `--import-allow-host 127.0.0.1`), timed from the
//! create call to the DataVolume's `Succeeded`; beside the same bytes handled by the tools
//! directly on the same files (the floor): `curl` from the same server for raw, `qemu-img
//! convert -O raw` for qcow2 (and `curl` + `qemu-img convert`, the two steps the importer
//! takes), `xz -d -T1 -c > FILE` for xz. Every floor ends with an fsync of its output, as an
//! import ends with one (an import is durable once `Succeeded`).
//!
//! The image (`--size-mib`, default 512) is built from a seeded generator in 64 KiB blocks: 40 %
//! random bytes (incompressible), 20 % text-like bytes from a 16-letter alphabet, 40 % zeros —
//! about what a freshly installed cloud image looks like to a compressor. MiB/s are of the
//! disk (its raw size) for every row, whatever went over the wire.
//!
//! Every wait has a deadline and names what it waited for: `up` serving (60 s), each API call
//! (60 s), each import and each floor run (`--deadline`), the deletion of each import's claim
//! (60 s). SIGTERM or SIGINT stops the run and kills `up`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use api::phases::DataVolumePhase;
use api::DataVolume;
use virtplug_bench::up::{start_up_with, API};
use virtplug_bench::waits::{secs, stop_signal, within};

#[derive(Parser)]
struct Args {
    /// The virtplug binary.
    #[arg(long, default_value = "target/release/virtplug")]
    virtplug: PathBuf,
    /// The disk image's size in MiB.
    #[arg(long, default_value_t = 512)]
    size_mib: u64,
    /// Runs of every row (the table shows the median).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// `xz` level of the compressed image (its decompression speed hardly depends on it).
    #[arg(long, default_value_t = 1)]
    xz_level: u32,
    /// Where the images and the floors' outputs go (default: a temp dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Deadline of each import and each floor run, in seconds.
    #[arg(long, default_value_t = 600)]
    deadline: u64,
}

/// How long a deleted import's claim may take to go.
const GONE: Duration = Duration::from_secs(60);

/// A block of the image: what kind of bytes it holds.
fn block(seed: &mut u64, buf: &mut [u8]) {
    let mut next = || {
        // xorshift64*: fast, deterministic, no dependency.
        *seed ^= *seed >> 12;
        *seed ^= *seed << 25;
        *seed ^= *seed >> 27;
        seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    match next() % 10 {
        0..=3 => buf.chunks_mut(8).for_each(|c| c.copy_from_slice(&next().to_le_bytes()[..c.len()])),
        4 | 5 => buf.iter_mut().for_each(|b| *b = b"etaoinshrdlucmfw"[usize::try_from(next() % 16).unwrap_or(0)]),
        _ => buf.fill(0),
    }
}

/// Writes the raw image of `mib` MiB to `path`.
fn make_image(path: &Path, mib: u64) -> anyhow::Result<()> {
    let mut f =
        std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; 64 << 10];
    for _ in 0..mib * 16 {
        block(&mut seed, &mut buf);
        f.write_all(&buf)?;
    }
    f.into_inner().map_err(std::io::IntoInnerError::into_error)?.sync_all()?;
    Ok(())
}

/// Runs `cmd` (its stdout where the caller set it) within `deadline`; an error names `what`.
async fn run(mut cmd: tokio::process::Command, deadline: Duration, what: &str) -> anyhow::Result<()> {
    let child = cmd.stderr(std::process::Stdio::piped()).kill_on_drop(true).spawn().with_context(|| format!("cannot start {what}"))?;
    let out = within(deadline, what, async { Ok(child.wait_with_output().await?) }).await?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn command(program: &str, args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(program);
    c.args(args).stdin(std::process::Stdio::null());
    c
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().with_context(|| format!("{} is not UTF-8", p.display()))
}

/// fsyncs `path`, as an import's commit does.
async fn fsync(path: PathBuf) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || {
        std::fs::File::open(&path).and_then(|f| f.sync_all()).with_context(|| format!("fsync {}", path.display()))
    })
    .await?
}

/// Serves the files of `files` (URL path → file) on a loopback port, streamed with their
/// Content-Length; returns the base URL.
async fn serve(files: Vec<(&'static str, PathBuf)>) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let files = Arc::new(files);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let files = Arc::clone(&files);
            tokio::spawn(async move {
                if let Err(e) = answer(sock, &files).await {
                    eprintln!("image server: {e:#}");
                }
            });
        }
    });
    Ok(format!("http://{addr}"))
}

async fn answer(mut sock: tokio::net::TcpStream, files: &[(&'static str, PathBuf)]) -> anyhow::Result<()> {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut buf).await?;
        if n == 0 || req.len() > 64 << 10 {
            bail!("a request without an end of its header");
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&req);
    let path = line.split_whitespace().nth(1).unwrap_or("/");
    let Some((_, file)) = files.iter().find(|(p, _)| *p == path) else {
        sock.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await?;
        return Ok(());
    };
    let f = tokio::fs::File::open(file).await?;
    let len = f.metadata().await?.len();
    sock.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut body = tokio::io::BufReader::with_capacity(1 << 20, f);
    tokio::io::copy_buf(&mut body, &mut sock).await?;
    sock.shutdown().await?;
    Ok(())
}

/// The running `up` and what it needs to import.
struct Importer {
    up: virtplug_bench::up::Up,
    dvs: Api<DataVolume>,
    pvcs: Api<PersistentVolumeClaim>,
    size: String,
    deadline: Duration,
}

impl Importer {
    /// Imports `url` into a new DataVolume `name`, timed from the create call to `Succeeded`;
    /// then deletes it and waits for its claim to go (its storage freed for the next run).
    async fn import(&self, name: &str, url: &str) -> anyhow::Result<Duration> {
        let dv: DataVolume = serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name}, "spec": {"source": {"http": {"url": url}},
            "storage": {"resources": {"requests": {"storage": self.size}}}}}))?;
        let start = Instant::now();
        within(API, format!("the API to create DataVolume {name}"), async { Ok(self.dvs.create(&PostParams::default(), &dv).await?) })
            .await?;
        within(self.deadline, format!("DataVolume {name} to succeed"), async {
            loop {
                let st = self.dvs.get(name).await?.status.unwrap_or_default();
                match st.phase {
                    Some(DataVolumePhase::Succeeded) => return Ok(()),
                    Some(DataVolumePhase::Failed) => {
                        let why = st.conditions.iter().find(|c| c.type_ == "Running").and_then(|c| c.message.clone());
                        bail!("DataVolume {name} failed: {}", why.unwrap_or_default());
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
        .await?;
        let took = start.elapsed();
        within(API, format!("the API to delete DataVolume {name}"), async { Ok(self.dvs.delete(name, &DeleteParams::default()).await?) })
            .await?;
        within(GONE, format!("DataVolume {name}'s claim to be deleted"), async {
            while self.pvcs.get_opt(name).await?.is_some() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(())
        })
        .await?;
        Ok(took)
    }
}

/// What an import is compared with: the tools on the same file.
#[derive(Clone, Copy)]
enum Floor {
    /// `curl -o FILE` from the same server.
    Curl,
    /// `qemu-img convert -O raw` of the local qcow2 file.
    Convert,
    /// `curl` to a file, then `qemu-img convert` of it: the importer's two steps.
    CurlConvert,
    /// `xz -d -T1 -c > FILE` of the local file.
    Xz,
}

/// The files the floors read and write.
struct Files {
    qcow2: PathBuf,
    xz: PathBuf,
    /// The floor's output.
    out: PathBuf,
    /// [`Floor::CurlConvert`]'s download.
    dl: PathBuf,
}

impl Floor {
    fn label(self) -> &'static str {
        match self {
            Floor::Curl => "`curl -o FILE` + fsync",
            Floor::Convert => "`qemu-img convert -O raw` + fsync",
            Floor::CurlConvert => "`curl -o FILE` + `qemu-img convert -O raw` + fsync",
            Floor::Xz => "`xz -d -T1 -c > FILE` + fsync",
        }
    }

    /// Runs the floor on `url` (or its local file), fsyncs its output, removes what it wrote;
    /// returns the time up to the fsync's end.
    async fn time(self, url: &str, f: &Files, deadline: Duration) -> anyhow::Result<Duration> {
        let (out, dl) = (path_str(&f.out)?, path_str(&f.dl)?);
        let convert = |src: &str| command("qemu-img", &["convert", "-f", "qcow2", "-O", "raw", src, out]);
        let t = Instant::now();
        match self {
            Floor::Curl => run(command("curl", &["-sSf", "-o", out, url]), deadline, "curl").await?,
            Floor::Convert => run(convert(path_str(&f.qcow2)?), deadline, "qemu-img convert").await?,
            Floor::CurlConvert => {
                run(command("curl", &["-sSf", "-o", dl, url]), deadline, "curl").await?;
                run(convert(dl), deadline, "qemu-img convert").await?;
            }
            Floor::Xz => {
                let mut c = command("xz", &["-d", "-T1", "-c", path_str(&f.xz)?]);
                c.stdout(std::fs::File::create(&f.out)?);
                run(c, deadline, "xz -d").await?;
            }
        }
        fsync(f.out.clone()).await?;
        let took = t.elapsed();
        for p in [&f.out, &f.dl] {
            let _ = std::fs::remove_file(p);
        }
        Ok(took)
    }
}

/// One row of the table: an image's import and its floor, each timed `runs` times.
struct Row {
    image: &'static str,
    /// The image's URL path.
    path: &'static str,
    wire_mib: f64,
    virtplug: Vec<Duration>,
    floor: Floor,
    floor_times: Vec<Duration>,
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

#[allow(clippy::cast_precision_loss)]
fn mib_per_s(mib: u64, d: Duration) -> f64 {
    mib as f64 / d.as_secs_f64().max(1e-9)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

#[allow(clippy::cast_precision_loss)]
async fn bench(args: &Args) -> anyhow::Result<()> {
    let tmp;
    let work = match &args.work_dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_owned()
        }
    };
    let deadline = Duration::from_secs(args.deadline);
    let (raw, qcow2, xz) = (work.join("disk.raw"), work.join("disk.qcow2"), work.join("disk.raw.xz"));
    println!("load average at start: {}", loadavg());
    let t = Instant::now();
    let mib = args.size_mib;
    {
        let raw = raw.clone();
        tokio::task::spawn_blocking(move || make_image(&raw, mib)).await??;
    }
    run(
        command("qemu-img", &["convert", "-f", "raw", "-O", "qcow2", path_str(&raw)?, path_str(&qcow2)?]),
        deadline,
        "qemu-img convert -O qcow2",
    )
    .await?;
    let mut xz_cmd = command("xz", &["-T1", &format!("-{}", args.xz_level), "-c", path_str(&raw)?]);
    xz_cmd.stdout(std::fs::File::create(&xz)?);
    run(xz_cmd, deadline, "xz -c").await?;
    let wire = |p: &Path| -> anyhow::Result<f64> { Ok(std::fs::metadata(p)?.len() as f64 / f64::from(1u32 << 20)) };
    println!(
        "images: raw {mib} MiB, qcow2 {:.1} MiB, xz -{} {:.1} MiB (made in {})",
        wire(&qcow2)?,
        args.xz_level,
        wire(&xz)?,
        secs(t.elapsed())
    );

    let base = serve(vec![("/disk.raw", raw.clone()), ("/disk.qcow2", qcow2.clone()), ("/disk.raw.xz", xz.clone())]).await?;
    let up = start_up_with(&args.virtplug, &["--import-allow-host", "127.0.0.1"]).await?;
    let importer = Importer {
        dvs: Api::namespaced(up.client.clone(), "default"),
        pvcs: Api::namespaced(up.client.clone(), "default"),
        up,
        size: format!("{mib}Mi"),
        deadline,
    };
    let files = Files { qcow2: qcow2.clone(), xz: xz.clone(), out: work.join("floor.out"), dl: work.join("floor.download") };
    let row = |image: &'static str, path: &'static str, file: &Path, floor: Floor| -> anyhow::Result<Row> {
        Ok(Row { image, path, wire_mib: wire(file)?, virtplug: vec![], floor, floor_times: vec![] })
    };
    let mut rows = vec![
        row("raw", "/disk.raw", &raw, Floor::Curl)?,
        row("qcow2", "/disk.qcow2", &qcow2, Floor::Convert)?,
        row("qcow2", "/disk.qcow2", &qcow2, Floor::CurlConvert)?,
        row("xz", "/disk.raw.xz", &xz, Floor::Xz)?,
    ];
    for run_no in 0..args.runs {
        for (i, row) in rows.iter_mut().enumerate() {
            let url = format!("{base}{}", row.path);
            let took = importer.import(&format!("r{run_no}-{i}"), &url).await?;
            row.virtplug.push(took);
            let floor = row.floor.time(&url, &files, deadline).await?;
            row.floor_times.push(floor);
            println!(
                "run {run_no}: {}: virtplug {:.2} s, floor ({}) {:.2} s",
                row.image,
                took.as_secs_f64(),
                row.floor.label(),
                floor.as_secs_f64()
            );
        }
    }
    println!("load average at end: {}", loadavg());
    println!();
    println!("| image | on the wire (MiB) | virtplug import (s) | virtplug MiB/s | floor | floor (s) | floor MiB/s | virtplug / floor |");
    println!("|---|---:|---:|---:|---|---:|---:|---:|");
    for r in &rows {
        let (v, f) = (median(&r.virtplug), median(&r.floor_times));
        let (vr, fr) = (mib_per_s(mib, v), mib_per_s(mib, f));
        println!(
            "| {} | {:.1} | {:.2} | {vr:.1} | {} | {:.2} | {fr:.1} | {:.2} |",
            r.image,
            r.wire_mib,
            v.as_secs_f64(),
            r.floor.label(),
            f.as_secs_f64(),
            vr / fr
        );
    }
    println!("\n(medians of {} runs; {mib} MiB disk; MiB/s of the disk's raw size)", args.runs);
    drop(importer.up);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    // Stopping the harness drops the run: `up` is killed.
    tokio::select! {
        r = bench(&args) => r,
        s = stop_signal() => bail!("stopped by {s}; `virtplug up` was killed"),
    }
}
