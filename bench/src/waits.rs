//! Deadlines for the harnesses' waits. Every wait in a benchmark ends: when its deadline
//! expires it fails with what it waited for (and, for a guest, the tail of its console), never
//! by hanging the run.

use std::fmt::Display;
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use anyhow::{bail, Context};

/// How many console lines a report shows of a guest that failed.
pub const TAIL_LINES: usize = 30;

/// Runs `fut` for at most `deadline`; its error, or the expiry, names `what` it waited for.
///
/// # Errors
/// `fut`'s error with `what` as context, or "timed out after … waiting for `what`".
pub async fn within<T>(deadline: Duration, what: impl Display, fut: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    match tokio::time::timeout(deadline, fut).await {
        Ok(r) => r.with_context(|| format!("waiting for {what}")),
        Err(_) => bail!("timed out after {} waiting for {what}", secs(deadline)),
    }
}

/// The boot deadline of `guests` guests booting at once: `flag` seconds when it is set (not 0),
/// else 120 s + 8 s per guest. Under TCG a boot is CPU-bound (about 5.4 s of a core for the
/// test guest), so a fleet's boot grows with its size: 32 guests on 2 cores boot in ~120 s on a
/// quiet machine and took up to ~420 s beside other builds; the default for 32 is 376 s, and a
/// guest that misses it gets a second chance.
#[must_use]
pub fn boot_deadline(flag: u64, guests: usize) -> Duration {
    if flag > 0 {
        Duration::from_secs(flag)
    } else {
        Duration::from_secs(120 + 8 * u64::try_from(guests).unwrap_or(u64::MAX / 16))
    }
}

/// `d` for a message: `300 s`, `1.5 s`.
#[must_use]
pub fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// The last `n` complete lines of a guest's console log (QEMU's `serial.log`), `\r` and control
/// characters dropped, each indented for a report. Reads at most the last 64 KiB: a guest
/// controls how much it prints.
#[must_use]
pub fn console_tail(log: &Path, n: usize) -> String {
    const MAX: u64 = 64 << 10;
    let read = || -> std::io::Result<String> {
        let mut f = std::fs::File::open(log)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(MAX)))?;
        let mut bytes = Vec::new();
        f.take(MAX).read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    let text = match read() {
        Ok(t) => t,
        Err(e) => return format!("    (no console log at {}: {e})", log.display()),
    };
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.chars().filter(|c| !c.is_control() || *c == '\t').collect::<String>())
        .filter(|l| !l.trim().is_empty())
        .collect();
    if lines.is_empty() {
        return format!("    (the guest printed nothing; {})", log.display());
    }
    let from = lines.len().saturating_sub(n);
    let mut out = format!("    --- last {} lines of {} ---", lines.len() - from, log.display());
    for l in &lines[from..] {
        out.push_str("\n    | ");
        out.push_str(l);
    }
    out
}

/// Reads `out` (a child's stdout) line by line in a thread until a line contains `needle`,
/// for at most `deadline`; keeps draining the rest so the child never blocks on a full pipe.
///
/// # Errors
/// When the output ends first (the child exited) or the deadline passes; the message names
/// `what` and the lines seen.
pub fn wait_for_line(out: impl Read + Send + 'static, needle: &'static str, deadline: Duration, what: &str) -> anyhow::Result<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut lines = BufReader::new(out).lines();
        for l in lines.by_ref() {
            let Ok(l) = l else { break };
            if l.contains(needle) {
                let _ = tx.send(Ok(l));
                for _ in lines {}
                return;
            }
            seen.push(l);
        }
        let _ = tx.send(Err(seen));
    });
    match rx.recv_timeout(deadline) {
        Ok(Ok(line)) => Ok(line),
        Ok(Err(seen)) => bail!("{what}: its output ended without {needle:?}; it printed: {seen:?}"),
        Err(_) => bail!("timed out after {} waiting for {what} to print {needle:?}", secs(deadline)),
    }
}

/// Runs `cmd` to completion within `deadline` and returns its output. At the deadline the
/// child gets SIGTERM (the harnesses stop their QEMUs on it) and, 20 s later, SIGKILL; the
/// error then names `what`. If this future is dropped first (the harness itself was stopped),
/// the child gets SIGTERM too.
///
/// # Errors
/// When it cannot start, or does not finish in time.
pub async fn output_within(mut cmd: tokio::process::Command, deadline: Duration, what: &str) -> anyhow::Result<Output> {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {what}"))?;
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).and_then(rustix::process::Pid::from_raw);
    let wait = child.wait_with_output();
    tokio::pin!(wait);
    // Declared after the child's future, so dropped before it: the PID is still the child's
    // (unreaped) whenever the guard signals it, and it is disarmed once the child is reaped.
    let mut term = TermOnDrop(pid);
    if let Ok(r) = tokio::time::timeout(deadline, &mut wait).await {
        term.0 = None;
        return r.with_context(|| format!("waiting for {what}"));
    }
    term.send();
    let out = tokio::time::timeout(Duration::from_secs(20), &mut wait).await;
    let stopped = if out.is_ok() {
        term.0 = None;
        "it stopped on SIGTERM"
    } else {
        if let Some(pid) = term.0.take() {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        "killed (SIGKILL) 20 s after SIGTERM"
    };
    let stderr = out.ok().and_then(Result::ok).map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
    bail!("timed out after {} waiting for {what} ({stopped}); its stderr: {}", secs(deadline), stderr.trim())
}

/// SIGTERM to a child (by PID) unless disarmed (`None`).
struct TermOnDrop(Option<rustix::process::Pid>);

impl TermOnDrop {
    fn send(&mut self) {
        if let Some(pid) = self.0 {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
}

impl Drop for TermOnDrop {
    fn drop(&mut self) {
        self.send();
    }
}

/// Resolves on SIGTERM or SIGINT, with the signal's name; a harness races its run against it,
/// so that stopping the harness drops the run and with it every QEMU the run started.
pub async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_the_last_complete_lines_without_control_characters() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("serial.log");
        let text: String = (0..40).map(|i| format!("line {i}\r\n")).collect::<String>() + "\x1b[0mINFO: task insmod:92 blocked\r\n";
        std::fs::write(&log, text).expect("write");
        let tail = console_tail(&log, 3);
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), 4, "{tail}");
        assert!(lines[0].contains("last 3 lines"), "{tail}");
        assert_eq!(lines[1..], ["    | line 38", "    | line 39", "    | [0mINFO: task insmod:92 blocked"]);
        assert!(console_tail(&dir.path().join("none"), 3).contains("no console log"));
    }

    #[test]
    fn waiting_for_a_line_names_what_when_it_never_comes() {
        let (r, w) = std::io::pipe().expect("pipe");
        let e = wait_for_line(r, "serving", Duration::from_millis(100), "the server").expect_err("no line");
        assert!(e.to_string().contains("timed out after 0.1 s waiting for the server to print \"serving\""), "{e}");
        drop(w);
        let e =
            wait_for_line(std::io::Cursor::new(b"hello\n".to_vec()), "serving", Duration::from_secs(5), "the server").expect_err("ended");
        assert!(e.to_string().contains("ended without") && e.to_string().contains("hello"), "{e}");
        let ok =
            wait_for_line(std::io::Cursor::new(b"a\nx serving at y\nb\n".to_vec()), "serving", Duration::from_secs(5), "s").expect("line");
        assert_eq!(ok, "x serving at y");
    }

    #[tokio::test]
    async fn a_child_past_its_deadline_is_stopped_and_named() {
        let mut cmd = tokio::process::Command::new("sleep");
        cmd.arg("30");
        let t = std::time::Instant::now();
        let e = output_within(cmd, Duration::from_millis(200), "the sleeper").await.expect_err("deadline");
        assert!(e.to_string().contains("waiting for the sleeper (it stopped on SIGTERM)"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}
