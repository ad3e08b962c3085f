//! Counts the processes a process creates, from the kernel's process-event connector
//! (`NETLINK_CONNECTOR`, `CN_IDX_PROC`): every fork is reported with its parent, so a test can
//! assert that the node agent spawned nothing (no `findmnt`, no `mount`) while it waited.
//! Needs root. Threads are told apart from processes by `child_pid == child_tgid`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rustix::net::{netlink, AddressFamily, RecvFlags, SocketFlags, SocketType};

pub struct ForkCounter {
    count: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 1;
const NLMSG_DONE: u16 = 3;

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

impl ForkCounter {
    /// Starts counting the processes (not threads) whose parent process is `parent_tgid`.
    pub fn start(parent_tgid: u32) -> ForkCounter {
        let fd = rustix::net::socket_with(AddressFamily::NETLINK, SocketType::DGRAM, SocketFlags::CLOEXEC, Some(netlink::CONNECTOR))
            .expect("netlink socket (root needed)");
        rustix::net::bind(&fd, &netlink::SocketAddrNetlink::new(0, CN_IDX_PROC)).expect("bind to the proc connector");
        // nlmsghdr (16) + cn_msg (20) + op (4)
        let mut msg = Vec::with_capacity(40);
        msg.extend_from_slice(&40u32.to_ne_bytes());
        msg.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&std::process::id().to_ne_bytes());
        msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&0u32.to_ne_bytes()); // ack
        msg.extend_from_slice(&4u16.to_ne_bytes()); // len
        msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
        msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        rustix::net::sendto(&fd, &msg, rustix::net::SendFlags::empty(), &netlink::SocketAddrNetlink::new(0, CN_IDX_PROC))
            .expect("subscribe");
        rustix::net::sockopt::set_socket_timeout(&fd, rustix::net::sockopt::Timeout::Recv, Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, want) = (Arc::clone(&count), Arc::clone(&stop), parent_tgid);
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 8192];
            while !s.load(Ordering::Relaxed) {
                let Ok((n, _)) = rustix::net::recv(&fd, &mut buf, RecvFlags::empty()) else { continue };
                let b = &buf[..n];
                // nlmsghdr 16 + cn_msg 20, then proc_event: what, cpu, timestamp (8), data
                if u32_at(b, 36) != PROC_EVENT_FORK {
                    continue;
                }
                let (parent_tgid, child_pid, child_tgid) = (u32_at(b, 56), u32_at(b, 60), u32_at(b, 64));
                if parent_tgid == want && child_pid == child_tgid {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        ForkCounter { count, stop, thread: Some(thread) }
    }

    /// Processes created so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl Drop for ForkCounter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
