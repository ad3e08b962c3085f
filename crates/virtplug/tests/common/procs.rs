//! Child processes of a test: killed by PID when dropped, their output read line by line.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::time::Duration;

/// A child process killed (by its PID) and reaped when dropped, pass or fail.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines of a child's stdout, read on a thread, for waits with a deadline.
pub fn line_reader(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits up to `deadline` for a line matching `pred`; panics naming `what` and the lines seen.
pub fn wait_line(rx: &std::sync::mpsc::Receiver<String>, deadline: Duration, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let end = std::time::Instant::now() + deadline;
    let mut seen = Vec::new();
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if pred(l.trim_end_matches('\r')) => return l,
            Ok(l) => seen.push(l),
            Err(_) => panic!("no line with {what} within {deadline:?}; seen: {seen:?}"),
        }
    }
}
