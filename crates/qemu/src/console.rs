//! The guest's serial console, read line by line from its unix socket (QEMU also writes every
//! byte to `serial.log`).

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// A line the guest printed, with when it was read.
#[derive(Clone, Debug)]
pub struct Line {
    pub text: String,
    pub at: Instant,
}

/// A connected console.
pub struct Console {
    rx: mpsc::UnboundedReceiver<Line>,
    /// Lines received so far, in order.
    pub seen: Vec<Line>,
}

impl Console {
    /// Connects to the serial socket, retrying until `deadline`.
    ///
    /// # Errors
    /// The connect error after the deadline.
    pub async fn connect(socket: &Path, deadline: Duration) -> std::io::Result<Console> {
        let end = Instant::now() + deadline;
        let stream = loop {
            match UnixStream::connect(socket).await {
                Ok(s) => break s,
                Err(e) if Instant::now() >= end => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                let text = l.trim_end_matches('\r').to_owned();
                if tx.send(Line { text, at: Instant::now() }).is_err() {
                    return;
                }
            }
        });
        Ok(Console { rx, seen: Vec::new() })
    }

    /// Waits for the next line (after those already consumed) that matches `pred`.
    /// Returns `None` at the deadline or when the console closed.
    pub async fn wait_for(&mut self, deadline: Duration, pred: impl Fn(&str) -> bool) -> Option<Line> {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            let line = tokio::time::timeout_at(end, self.rx.recv()).await.ok()??;
            self.seen.push(line.clone());
            if pred(&line.text) {
                return Some(line);
            }
        }
    }
}
