//! `virtplug vm console|vnc`: KubeVirt's `console` and `vnc` subresources (websockets,
//! `plain.kubevirt.io`) through the API server, so they work from any machine the kubeconfig
//! works on, as `virtctl console|vnc` do.
//!
//! The console puts a terminal in raw mode (restored on the way out, errors included) and
//! leaves on `^]` (virtctl's escape), or at the end of standard input when it is not a terminal.
//! VNC listens on a loopback port and carries each viewer connection over its own websocket.

use std::io::Write;

use anyhow::Context;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

use api::tunnel::PLAIN_SUBPROTOCOL;

/// virtctl's escape byte: `^]` (GS).
const ESCAPE: u8 = 0x1d;

fn path(ns: &str, name: &str, sub: &str) -> String {
    format!("/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/{sub}")
}

async fn open(
    client: &kube::Client,
    ns: &str,
    name: &str,
    sub: &str,
) -> anyhow::Result<tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>> {
    client::upgrade::websocket(client, &path(ns, name, sub), PLAIN_SUBPROTOCOL).await.map_err(|e| match &e {
        client::upgrade::UpgradeError::Refused { message, code, .. } => {
            anyhow::anyhow!("cannot open the {sub} of VMI {ns}/{name}: {message} ({code})")
        }
        _ => anyhow::Error::new(e).context(format!("cannot open the {sub} of VMI {ns}/{name}")),
    })
}

/// Restores the terminal's settings when dropped.
struct RawTerminal(rustix::termios::Termios);

impl RawTerminal {
    /// Raw mode on standard input if it is a terminal.
    fn enter() -> anyhow::Result<Option<RawTerminal>> {
        let stdin = std::io::stdin();
        if !rustix::termios::isatty(&stdin) {
            return Ok(None);
        }
        let saved = rustix::termios::tcgetattr(&stdin).context("cannot read the terminal's settings")?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw).context("cannot put the terminal in raw mode")?;
        Ok(Some(RawTerminal(saved)))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(std::io::stdin(), rustix::termios::OptionalActions::Now, &self.0);
    }
}

/// `virtplug vm console NAME`.
pub async fn console(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<()> {
    let ws = open(client, ns, name, "console").await?;
    eprintln!("Successfully connected to {name} console. The escape sequence is ^]");
    let raw = RawTerminal::enter()?;
    let (mut sink, mut stream) = ws.split();
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let mut buf = vec![0u8; 4096];
    let ended = loop {
        tokio::select! {
            m = stream.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    stdout.write_all(&b).await.context("cannot write to standard output")?;
                    stdout.flush().await.context("cannot write to standard output")?;
                }
                Some(Ok(Message::Text(t))) => {
                    stdout.write_all(t.as_bytes()).await.context("cannot write to standard output")?;
                    stdout.flush().await.context("cannot write to standard output")?;
                }
                Some(Ok(Message::Close(_))) | None => break "the VMI's console closed",
                Some(Ok(_)) => {}
                Some(Err(e)) => break if matches!(e, tokio_tungstenite::tungstenite::Error::ConnectionClosed) { "the connection closed" } else { "the connection failed" },
            },
            n = stdin.read(&mut buf) => {
                let n = n.context("cannot read standard input")?;
                let input = &buf[..n];
                let (send, leave) = match input.iter().position(|&b| b == ESCAPE) {
                    Some(i) => (&input[..i], true),
                    None => (input, n == 0),
                };
                if !send.is_empty() {
                    sink.send(Message::binary(send.to_vec())).await.context("cannot send to the console")?;
                }
                if leave {
                    let _ = sink.send(Message::Close(None)).await;
                    break "";
                }
            }
        }
    };
    drop(raw);
    if !ended.is_empty() {
        eprintln!("\n{ended}");
    }
    Ok(())
}

/// `virtplug vm vnc NAME`: a loopback port whose connections reach the VMI's VNC server.
pub async fn vnc(client: &kube::Client, ns: &str, name: &str, port: u16, proxy_only: bool) -> anyhow::Result<()> {
    // Refusals (no VMI, not running, node unreachable) are said before a port is offered.
    let first = open(client, ns, name, "vnc").await?;
    let listener =
        tokio::net::TcpListener::bind(("127.0.0.1", port)).await.with_context(|| format!("cannot listen on 127.0.0.1:{port}"))?;
    let addr = listener.local_addr().context("cannot read the listening address")?;
    if proxy_only {
        // virtctl vnc --proxy-only's output.
        println!("{}", serde_json::json!({"port": addr.port()}));
    } else {
        println!("{addr}");
        eprintln!("VNC of VMI {ns}/{name}: point a VNC viewer at {addr} (e.g. `vncviewer {addr}`); Ctrl-C stops the proxy");
    }
    std::io::stdout().flush().context("cannot write to standard output")?;
    let mut first = Some(first);
    loop {
        let (tcp, peer) = listener.accept().await.context("cannot accept a VNC connection")?;
        let ws = match first.take() {
            Some(ws) => ws,
            None => match open(client, ns, name, "vnc").await {
                Ok(ws) => ws,
                Err(e) => {
                    eprintln!("{peer}: {e:#}");
                    continue;
                }
            },
        };
        tokio::spawn(async move {
            if let Err(e) = apiserver::websocket::pump(ws, tcp, None).await {
                eprintln!("{peer}: the VNC connection ended: {}", client::error_chain(&e));
            }
        });
    }
}
