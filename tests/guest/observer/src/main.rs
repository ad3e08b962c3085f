//! `vp-observer`: PID 1 of the test guest once `tests/guest/init` has mounted /proc, /sys, /dev
//! and loaded the drivers. It prints `VP-READY`, then reports every block device that appears or
//! disappears and every CD-ROM medium change on the console (line formats: `report.rs`).
//!
//! Why a program and not a shell loop: the guest used to poll `/sys/block` every 10 ms from
//! busybox sh. Under TCG that loop cost 6.4 % of a host core per idle guest (this program: 1.0–1.4
//! %; `qemu-hotplug --idle-seconds 20`), so 32 guests on 2 cores starved themselves and every
//! host process; the P2
//! fleet floor measured the polling, not the hot-plug. Here nothing runs until the kernel
//! sends a uevent: a disk's `add`/`remove`, or a CD-ROM drive's `change` (media-change
//! polling is left to the kernel, `events_poll_msecs`, every `vp.cdpoll` ms, default 1000 —
//! udisks polls drives every 2 s; each poll is an ATAPI command, which under TCG costs an idle
//! guest about as much again as everything else it does: 2.4 % of a core at 100 ms).
//!
//! Guarantees: a line per change, in the order the kernel made them; lost events (socket
//! overrun) are recovered by a full rescan; if the uevent socket cannot be opened the observer
//! says so and falls back to rescanning every 100 ms. It never exits (it is PID 1).

mod report;
mod uevent;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::time::Duration;

use report::{Host, Report};
use rustix::io::Errno;
use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SocketFlags, SocketType};

/// The guest's own sysfs and device nodes.
struct Guest {
    /// Media-change polling period for CD-ROM drives, in ms.
    cd_poll_ms: u32,
}

impl Host for Guest {
    fn block_devices(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/sys/block") else { return Vec::new() };
        dir.flatten().filter_map(|e| e.file_name().into_string().ok()).collect()
    }

    fn attr(&self, dev: &str, attr: &str) -> Option<String> {
        std::fs::read_to_string(format!("/sys/block/{dev}/{attr}")).ok().map(|s| s.trim().to_owned())
    }

    fn attr_bytes(&self, dev: &str, attr: &str) -> Option<Vec<u8>> {
        std::fs::read(format!("/sys/block/{dev}/{attr}")).ok()
    }

    fn head(&self, dev: &str) -> Option<Vec<u8>> {
        std::fs::File::open(format!("/dev/{dev}")).ok().map(|f| read16(&f))
    }

    fn medium(&self, dev: &str) -> Option<(u64, Vec<u8>)> {
        // A blocking open of an sr drive fails (ENOMEDIUM) when it is empty.
        let f = std::fs::File::open(format!("/dev/{dev}")).ok()?;
        let head = read16(&f);
        if head.is_empty() {
            return None;
        }
        let size = self.attr(dev, "size").and_then(|s| s.parse().ok()).unwrap_or(0);
        Some((size, head))
    }

    fn poll_media(&self, dev: &str) {
        // Not fatal: a drive without media events just reports what its open shows.
        let _ = std::fs::write(format!("/sys/block/{dev}/events_poll_msecs"), self.cd_poll_ms.to_string());
    }

    fn uptime(&self) -> String {
        std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|s| s.split_whitespace().next().map(str::to_owned))
            .unwrap_or_else(|| "0".to_owned())
    }
}

fn read16(mut f: &std::fs::File) -> Vec<u8> {
    let mut buf = [0u8; 16];
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    buf[..n].to_vec()
}

fn emit(lines: impl IntoIterator<Item = String>) {
    for l in lines {
        // stdout is the console; a line-buffered write per report.
        println!("{l}");
    }
}

/// `vp.cdpoll=MS` from the kernel command line.
fn cd_poll_ms() -> u32 {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    cmdline.split_whitespace().find_map(|w| w.strip_prefix("vp.cdpoll=")).and_then(|v| v.parse().ok()).unwrap_or(1000)
}

/// The kernel's uevent multicast group, bound before the first scan so nothing falls between.
fn uevents() -> rustix::io::Result<OwnedFd> {
    let sock = rustix::net::socket_with(AddressFamily::NETLINK, SocketType::DGRAM, SocketFlags::CLOEXEC, Some(netlink::KOBJECT_UEVENT))?;
    // A burst of hot-plugs must not overrun the socket; if it does anyway, ENOBUFS → rescan.
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size_force(&sock, 4 << 20);
    rustix::net::bind(&sock, &SocketAddrNetlink::new(0, 1))?;
    Ok(sock)
}

fn rescan(report: &mut Report, guest: &Guest) {
    emit(report.disks(guest));
    emit(report.all_media(guest));
}

fn main() {
    let guest = Guest { cd_poll_ms: cd_poll_ms() };
    let mut report = Report::default();
    let sock = uevents();
    println!("VP-READY t={}", guest.uptime());
    rescan(&mut report, &guest);
    let sock = match sock {
        Ok(s) => s,
        Err(e) => {
            println!("VP-OBSERVER no uevent socket ({e}): rescanning every 100 ms");
            loop {
                std::thread::sleep(Duration::from_millis(100));
                rescan(&mut report, &guest);
            }
        }
    };
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match rustix::net::recv(&sock, &mut buf[..], RecvFlags::empty()) {
            Ok((n, _)) => {
                let Some(event) = uevent::parse(&buf[..n]) else { continue };
                if !event.is_block_disk() {
                    continue;
                }
                emit(report.disks(&guest));
                if let Some(dev) = event.devname {
                    emit(report.medium(&guest, dev));
                }
            }
            Err(Errno::NOBUFS) => rescan(&mut report, &guest),
            Err(Errno::INTR) => {}
            Err(e) => {
                println!("VP-OBSERVER uevent socket: {e}; rescanning");
                std::thread::sleep(Duration::from_millis(100));
                rescan(&mut report, &guest);
            }
        }
    }
}
