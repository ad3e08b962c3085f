//! The kubectl binaries the tests drive: the one on PATH and the `kubectl.1.NN` next to its real
//! file (the machine has 1.27 to 1.33 there).

use std::path::PathBuf;
use std::process::Command;

/// The directory of the real `kubectl` and the real file itself.
fn real() -> (PathBuf, PathBuf) {
    let on_path = Command::new("sh").args(["-c", "readlink -f \"$(command -v kubectl)\""]).output().expect("sh runs");
    let real = PathBuf::from(String::from_utf8_lossy(&on_path.stdout).trim());
    assert!(real.is_file(), "kubectl must be on PATH for these tests");
    (real.parent().expect("kubectl has a directory").to_owned(), real)
}

/// The oldest and newest kubectl on the machine (1.27, 1.33; those present) and the one on PATH.
#[must_use]
pub fn oldest_newest_and_path() -> Vec<PathBuf> {
    let (dir, real) = real();
    let mut found: Vec<PathBuf> = ["kubectl.1.27", "kubectl.1.33"].iter().map(|n| dir.join(n)).filter(|p| p.is_file()).collect();
    found.push(real);
    found
}

/// Every `kubectl.1.27` … `kubectl.1.33` present, and the one on PATH.
#[must_use]
pub fn every_version_and_path() -> Vec<PathBuf> {
    let (dir, real) = real();
    let mut found: Vec<PathBuf> = (27..=33).map(|minor| dir.join(format!("kubectl.1.{minor}"))).filter(|p| p.is_file()).collect();
    found.push(real);
    found
}
