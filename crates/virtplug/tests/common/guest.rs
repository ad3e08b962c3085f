//! What the guest-booting tests share: the test guest, root detection, the mounts of every
//! namespace, and a loopback HTTP server for one file.

use std::path::{Path, PathBuf};

/// The test guest (`scripts/build-test-guest.sh`), or `$VIRTPLUG_GUEST_DIR`.
pub fn guest_dir() -> PathBuf {
    let dir = std::env::var_os("VIRTPLUG_GUEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/guest"), PathBuf::from);
    assert!(dir.join("vmlinuz").is_file(), "no test guest in {}: run scripts/build-test-guest.sh", dir.display());
    dir.canonicalize().expect("guest dir")
}

/// The complete lines of a guest's console log (QEMU's `serial.log`), `\r` trimmed. The line
/// being written is left out: QEMU logs the UART's bytes as they come, so a reader can catch a
/// line half-way (`MEDIA sr0 in 131`, its first bytes) and must not judge it.
pub fn console_lines(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    complete.lines().map(|l| l.trim_end_matches('\r').to_owned()).collect()
}

/// The guest's hot-plugged disks by serial, from its console log (the test guest prints
/// `BLOCK+ dev ... id=serial.X` when a disk appears and `BLOCK- dev` when it goes).
pub fn hotplugged_disks(log: &Path) -> std::collections::BTreeSet<String> {
    let mut by_dev = std::collections::BTreeMap::new();
    for l in console_lines(log) {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.first() {
            Some(&"BLOCK+") => {
                if let Some(id) = w.iter().find_map(|t| t.strip_prefix("id=serial.")) {
                    by_dev.insert(w[1].to_owned(), id.to_owned());
                }
            }
            Some(&"BLOCK-") => {
                by_dev.remove(w[1]);
            }
            _ => {}
        }
    }
    by_dev.into_values().collect()
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Every mount, in any process's namespace, whose mount point or source is under `dir`.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for p in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if !p.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(p.path().join("mountinfo")) else { continue };
        let Ok(mounts) = node::mountinfo::parse(&text) else { continue };
        for m in mounts {
            if m.mount_point.starts_with(dir) || Path::new(&m.source).starts_with(dir) {
                out.push(format!("pid {}: {} on {}", p.file_name().to_string_lossy(), m.source, m.mount_point.display()));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Serves `body` at any path on a loopback port; returns the URL (`.../guest.iso`).
pub async fn serve_file(body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = sock.read(&mut buf).await;
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(&body).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    format!("http://{addr}/guest.iso")
}

/// SIGKILLs every QEMU whose run dir is under `vmis` (a node agent's `DATA_DIR/node/vmis`), found
/// as the node agent adopts them (pidfile, else the QMP socket's peer): a test's cleanup, pass or
/// fail, of guests its node agents left behind.
pub fn kill_qemus_under(vmis: &Path) {
    for d in std::fs::read_dir(vmis).into_iter().flatten().flatten() {
        if let Ok(p) = qemu::process::adopt(&d.path()) {
            if let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// Opens VMI `vm`'s console (namespace `default`) through `client` (retrying until `deadline`
/// while the node agent's tunnel connects), types `line`, and waits until the test guest's
/// answer `VP-ECHO <line>` comes back over the websocket.
pub async fn console_echo(client: &kube::Client, vm: &str, line: &str, deadline: std::time::Duration) {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let path = format!("/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/{vm}/console");
    let mut ws = super::wait_until(deadline, &format!("the console of {vm} through the node agent's tunnel"), || async {
        client::upgrade::websocket(client, &path, api::tunnel::PLAIN_SUBPROTOCOL).await.ok()
    })
    .await;
    ws.send(Message::binary(format!("{line}\n").into_bytes())).await.unwrap();
    let want = format!("VP-ECHO {line}");
    let mut got = String::new();
    tokio::time::timeout(deadline, async {
        while !got.contains(&want) {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => got.push_str(&String::from_utf8_lossy(&b)),
                Some(Ok(_)) => {}
                other => panic!("the console ended before {want:?}: {other:?}; got {got:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {want:?} on the console within {deadline:?}; got {got:?}"));
}
