//! CPU time of a process from `/proc/PID/stat`, shared by the harnesses.

use anyhow::Context;

/// utime + stime of process `pid`, in seconds (10 ms ticks: USER_HZ is 100).
///
/// # Errors
/// When the process is gone or its stat line cannot be read.
pub fn cpu_seconds(pid: impl std::fmt::Display) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).context("no ')' in /proc/PID/stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15, i.e. 12 and 13 after the ")".
    Ok((f[11].parse::<f64>()? + f[12].parse::<f64>()?) / 100.0)
}

/// Bytes process `pid` has caused to be written to storage (`write_bytes` of `/proc/PID/io`:
/// the block layer's count, so the WAL, the database file and checkpoints; 0 on tmpfs).
///
/// # Errors
/// When the process is gone or its io file cannot be read (it needs the same user or root).
pub fn write_bytes(pid: impl std::fmt::Display) -> anyhow::Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let line = io.lines().find_map(|l| l.strip_prefix("write_bytes:")).context("no write_bytes in /proc/PID/io")?;
    Ok(line.trim().parse()?)
}
