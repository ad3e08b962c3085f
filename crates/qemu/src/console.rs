//! The guest's serial console, read line by line from its unix socket (QEMU also writes every
//! byte to `serial.log`).
//!
//! What the guest prints is not trusted: bytes that are not UTF-8 are replaced (they do not end
//! the reader), and a line longer than [`MAX_LINE`] bytes is cut into pieces of that size.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// The longest line kept whole; longer ones arrive in pieces of this size.
pub const MAX_LINE: u64 = 64 << 10;

/// A line the guest printed, with when it was read.
#[derive(Clone, Debug)]
pub struct Line {
    pub text: String,
    pub at: Instant,
}

/// Why a wait for a line ended without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Missed {
    /// The deadline passed.
    #[error("no matching line within {0:?}")]
    Deadline(Duration),
    /// The console closed (QEMU exited, or closed the socket) before a matching line.
    #[error("the console closed before a matching line")]
    Closed,
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
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let text = String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r']).to_owned();
                if tx.send(Line { text, at: Instant::now() }).is_err() {
                    return;
                }
            }
        });
        Ok(Console { rx, seen: Vec::new() })
    }

    /// Waits for the next line (after those already consumed) that matches `pred`.
    /// Returns `None` at the deadline or when the console closed ([`Console::next_matching`]
    /// tells the two apart).
    pub async fn wait_for(&mut self, deadline: Duration, pred: impl Fn(&str) -> bool) -> Option<Line> {
        self.next_matching(deadline, pred).await.ok()
    }

    /// Waits for the next line (after those already consumed) that matches `pred`, for at most
    /// `deadline`.
    ///
    /// # Errors
    /// [`Missed::Deadline`] or [`Missed::Closed`].
    pub async fn next_matching(&mut self, deadline: Duration, pred: impl Fn(&str) -> bool) -> Result<Line, Missed> {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            let line = tokio::time::timeout_at(end, self.rx.recv()).await.map_err(|_| Missed::Deadline(deadline))?.ok_or(Missed::Closed)?;
            self.seen.push(line.clone());
            if pred(&line.text) {
                return Ok(line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn lines_survive_bad_bytes_and_long_lines_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serial.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let mut console = Console::connect(&path, Duration::from_secs(5)).await.unwrap();
        let (mut guest, _) = listener.accept().await.unwrap();
        let long = vec![b'x'; usize::try_from(MAX_LINE).unwrap() + 10];
        guest.write_all(b"bad \xff byte\r\n").await.unwrap();
        guest.write_all(&long).await.unwrap();
        guest.write_all(b"\nVP-READY\n").await.unwrap();
        let bad = console.next_matching(Duration::from_secs(5), |l| l.starts_with("bad")).await.unwrap();
        assert_eq!(bad.text, "bad \u{fffd} byte");
        let ready = console.next_matching(Duration::from_secs(5), |l| l == "VP-READY").await.unwrap();
        assert_eq!(ready.text, "VP-READY");
        let lens: Vec<usize> = console.seen.iter().map(|l| l.text.len()).collect();
        assert_eq!(lens, [bad.text.len(), usize::try_from(MAX_LINE).unwrap(), 10, 8]);
        assert_eq!(
            console.next_matching(Duration::from_millis(20), |_| true).await.unwrap_err(),
            Missed::Deadline(Duration::from_millis(20))
        );
        drop(guest);
        assert_eq!(console.next_matching(Duration::from_secs(5), |_| true).await.unwrap_err(), Missed::Closed);
    }
}
