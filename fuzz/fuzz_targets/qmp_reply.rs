//! QMP replies: the real [`qemu::Qmp`] client and the [`qemu::Machine`] operations against a fake
//! QEMU on a unix socket in this process that answers each command with fuzzer-chosen bytes.
//!
//! Input: one answer per line (`\n`), in the order the commands arrive (the first answers
//! `qmp_capabilities`). In an answer, `$ID` becomes the id of the command it answers, and the
//! byte 0x1E splits it into several lines (events before or after the reply, a reply for
//! another id, junk). An empty answer is no answer: the command times out. When the answers run
//! out the fake closes the socket, so every later command fails at once.
//!
//! The operations, in order: `inventory`, `attached`, `drives`, `remove_stale_fdsets`, an
//! attach by fd and one by path, `detach` (which waits for `DEVICE_DELETED`), a CD-ROM
//! `insert_medium` and `eject`, `set_bootindex`, `powerdown`.
//!
//! The runtime is tokio's current-thread one with paused time: a command without an answer
//! reaches its 10 s deadline (and `detach` its unplug deadline) at once, without waiting.
//!
//! Asserts: no panic, no hang (libFuzzer's `-timeout`); every error formats; an inventory is
//! sorted, its nodes deduplicated and this crate's (`n-…`), and each device's node is the one
//! named after its volume.
#![no_main]

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use qemu::{Attach, DeviceKind, Machine, Qmp, Source};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

const GREETING: &[u8] =
    b"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 2, \"minor\": 0, \"major\": 10}, \"package\": \"\"}, \"capabilities\": [\"oob\"]}}\n";

fn dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::Builder::new().prefix("qmp-fuzz").tempdir().expect("a temp dir for the fuzz sockets")).path()
}

/// The fake QEMU: greets, then answers each command with the next answer.
async fn fake_qemu(listener: UnixListener, answers: Vec<Vec<u8>>) {
    let Ok((stream, _)) = listener.accept().await else { return };
    let (read, mut write) = stream.into_split();
    if write.write_all(GREETING).await.is_err() {
        return;
    }
    let mut lines = BufReader::new(read).lines();
    for answer in answers {
        let Ok(Some(command)) = lines.next_line().await else { return };
        let id = serde_json::from_str::<serde_json::Value>(&command).ok().and_then(|c| c.get("id").cloned()).unwrap_or_default();
        if answer.is_empty() {
            continue;
        }
        let text = String::from_utf8_lossy(&answer).replace("$ID", &id.to_string());
        for line in text.split('\x1e') {
            if write.write_all(line.as_bytes()).await.is_err() || write.write_all(b"\n").await.is_err() {
                return;
            }
        }
    }
    // Out of answers: the socket closes (QEMU exited).
}

fn fd(readonly: bool) -> Option<OwnedFd> {
    std::fs::OpenOptions::new().read(true).write(!readonly).open("/dev/null").ok().map(OwnedFd::from)
}

fn check(e: &dyn std::error::Error) {
    let _ = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let _ = s.to_string();
        source = s.source();
    }
}

async fn operations(machine: &Machine) {
    match machine.inventory().await {
        Ok(inv) => {
            assert!(inv.attached.windows(2).all(|w| w[0].volume <= w[1].volume), "devices not sorted: {inv:?}");
            assert!(inv.nodes.windows(2).all(|w| w[0] < w[1]), "nodes not sorted and unique: {inv:?}");
            assert!(inv.nodes.iter().all(|n| n.starts_with("n-")), "a node not named by virtplug: {inv:?}");
            for a in &inv.attached {
                assert!(a.node.as_ref().is_none_or(|n| *n == qemu::node_name(&a.volume)), "device {a:?} on another volume's node");
            }
        }
        Err(e) => check(&e),
    }
    if let Err(e) = machine.attached().await {
        check(&e);
    }
    if let Err(e) = machine.drives().await {
        check(&e);
    }
    if let Err(e) = machine.remove_stale_fdsets().await {
        check(&e);
    }
    if let Some(f) = fd(false) {
        let a = Attach { volume: "data1".into(), serial: "data1".into(), kind: DeviceKind::Disk, readonly: false, source: Source::Fd(f) };
        if let Err(e) = machine.attach(a).await {
            check(&e);
        }
    }
    let by_path = Attach {
        volume: "a-volume-name-long-enough-to-be-hashed".into(),
        serial: "s".into(),
        kind: DeviceKind::Disk,
        readonly: true,
        source: Source::Path(PathBuf::from("/nonexistent/disk.img")),
    };
    if let Err(e) = machine.attach(by_path).await {
        check(&e);
    }
    if let Err(e) = machine.detach("data1").await {
        check(&e);
    }
    if let Some(f) = fd(true) {
        if let Err(e) = machine.insert_medium("cdrom0", "iso", Source::Fd(f)).await {
            check(&e);
        }
    }
    if let Err(e) = machine.eject("cdrom0").await {
        check(&e);
    }
    if let Err(e) = machine.set_bootindex("vp-data1", 2).await {
        check(&e);
    }
    if let Err(e) = machine.powerdown(Duration::from_secs(30)).await {
        check(&e);
    }
}

async fn session(data: &[u8]) {
    static N: AtomicU64 = AtomicU64::new(0);
    let socket = dir().join(format!("q{}.sock", N.fetch_add(1, Ordering::Relaxed)));
    let Ok(listener) = UnixListener::bind(&socket) else { return };
    let answers: Vec<Vec<u8>> = data.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
    let fake = tokio::spawn(fake_qemu(listener, answers));
    match Qmp::connect(&socket).await {
        Ok(qmp) => operations(&Machine::new(qmp)).await,
        Err(e) => check(&e),
    }
    fake.abort();
    let _ = std::fs::remove_file(&socket);
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("a tokio runtime");
    rt.block_on(session(data));
});
