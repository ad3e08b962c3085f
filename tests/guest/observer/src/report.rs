//! What the guest has reported, and the lines that bring the report up to date with sysfs.
//!
//! Lines (the test suites and benchmarks match on them; `t=` is the guest's uptime):
//! ```text
//! SEEN <dev> <sectors> t=T                      a disk is detected (nothing read yet)
//! BLOCK+ <dev> <sectors> <first 16 bytes, hex> id=<serial.S | wwid | none> t=T
//! BLOCK- <dev> t=T
//! MEDIA <dev> in <sectors> <first 16 bytes, hex> t=T   |   MEDIA <dev> out t=T
//! ```
//! Disks (`sd*`, `vd*`) are tracked by name *and* `diskseq`: Linux reuses a name after an
//! unplug, and a fast unplug + plug must still read as `BLOCK-` then `BLOCK+`. A disk whose size
//! is 0 counts as gone (`del_gendisk` zeroes it first). CD-ROM drives (`sr*`) are reported by
//! their medium, which only an open of the drive tells.

use std::collections::BTreeMap;
use std::fmt::Write;

/// The guest's view of its block devices: sysfs and `/dev` on the guest, a table in tests.
pub trait Host {
    /// Names in `/sys/block`.
    fn block_devices(&self) -> Vec<String>;
    /// `/sys/block/<dev>/<attr>`, trimmed; `None` when it cannot be read.
    fn attr(&self, dev: &str, attr: &str) -> Option<String>;
    /// `/sys/block/<dev>/<attr>` as bytes (for `device/vpd_pg80`).
    fn attr_bytes(&self, dev: &str, attr: &str) -> Option<Vec<u8>>;
    /// The first 16 bytes of `/dev/<dev>` (fewer if it is shorter; empty if a read fails);
    /// `None` while the node cannot be opened: the kernel lists a disk in sysfs, with its size,
    /// before `/dev/<dev>` exists and the disk is live, and another disk's uevent can send the
    /// observer scanning in between.
    fn head(&self, dev: &str) -> Option<Vec<u8>>;
    /// A CD-ROM drive's medium: `None` when the drive has none (its open fails), else its size
    /// in sectors, read while it is open (the open is what revalidates it), and its first bytes.
    fn medium(&self, dev: &str) -> Option<(u64, Vec<u8>)>;
    /// Turns on the kernel's media-change polling for a CD-ROM drive, so a medium change raises a
    /// uevent.
    fn poll_media(&self, dev: &str);
    /// The guest's uptime in seconds, as `/proc/uptime` prints it.
    fn uptime(&self) -> String;
}

/// Everything reported so far.
#[derive(Default)]
pub struct Report {
    /// disk name → the `diskseq` it was reported with.
    disks: BTreeMap<String, String>,
    /// CD-ROM drive → the medium state last reported.
    media: BTreeMap<String, String>,
}

fn is_disk(dev: &str) -> bool {
    dev.starts_with("sd") || dev.starts_with("vd")
}

fn is_cdrom(dev: &str) -> bool {
    dev.starts_with("sr")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The disk's identity as the test suites match it: its SCSI serial (VPD page 0x80) when it has
/// one, else its `wwid`.
fn ident(host: &impl Host, dev: &str) -> String {
    if let Some(page) = host.attr_bytes(dev, "device/vpd_pg80") {
        let serial: String = page.iter().skip(4).filter(|b| **b != 0 && **b != b' ').map(|b| char::from(*b)).collect();
        if !serial.is_empty() {
            return format!("serial.{serial}");
        }
    }
    host.attr(dev, "device/wwid").unwrap_or_else(|| "none".to_owned())
}

impl Report {
    /// Compares every disk in sysfs with what was reported and returns the lines for the
    /// difference: removals first (a reused name then reads in order), then additions.
    pub fn disks(&mut self, host: &impl Host) -> Vec<String> {
        let mut now = BTreeMap::new();
        for dev in host.block_devices().into_iter().filter(|d| is_disk(d)) {
            let size = host.attr(&dev, "size").unwrap_or_default();
            if size.is_empty() || size == "0" {
                continue;
            }
            let seq = host.attr(&dev, "diskseq").unwrap_or_else(|| "0".to_owned());
            now.insert(dev, (seq, size));
        }
        let mut lines = Vec::new();
        let gone: Vec<String> =
            self.disks.iter().filter(|(d, seq)| now.get(*d).is_none_or(|(s, _)| s != *seq)).map(|(d, _)| d.clone()).collect();
        for dev in gone {
            self.disks.remove(&dev);
            lines.push(format!("BLOCK- {dev} t={}", host.uptime()));
        }
        for (dev, (seq, size)) in now {
            if self.disks.contains_key(&dev) {
                continue;
            }
            // The moment of detection, taken before the disk is read.
            let t = host.uptime();
            // Not openable yet: half-way through the kernel's add_disk. Its own `add` uevent,
            // sent once it is, brings the observer back here.
            let Some(head) = host.head(&dev) else { continue };
            lines.push(format!("SEEN {dev} {size} t={t}"));
            lines.push(format!("BLOCK+ {dev} {size} {} id={} t={t}", hex(&head), ident(host, &dev)));
            self.disks.insert(dev, seq);
        }
        lines
    }

    /// Reports the medium of CD-ROM drive `dev` if it changed (or was never reported); forgets a
    /// drive that is gone. Turns on the kernel's polling for a drive seen the first time.
    pub fn medium(&mut self, host: &impl Host, dev: &str) -> Option<String> {
        if !is_cdrom(dev) {
            return None;
        }
        if !host.block_devices().iter().any(|d| d == dev) {
            self.media.remove(dev);
            return None;
        }
        if !self.media.contains_key(dev) {
            host.poll_media(dev);
        }
        let (state, line) = match host.medium(dev) {
            Some((size, head)) => {
                let h = hex(&head);
                (format!("in:{size}:{h}"), format!("MEDIA {dev} in {size} {h}"))
            }
            None => ("out".to_owned(), format!("MEDIA {dev} out")),
        };
        if self.media.get(dev) == Some(&state) {
            return None;
        }
        self.media.insert(dev.to_owned(), state);
        Some(format!("{line} t={}", host.uptime()))
    }

    /// Every CD-ROM drive in sysfs (at start, and after lost events).
    pub fn all_media(&mut self, host: &impl Host) -> Vec<String> {
        let drives: Vec<String> = host.block_devices().into_iter().filter(|d| is_cdrom(d)).collect();
        self.media.retain(|d, _| drives.contains(d));
        drives.iter().filter_map(|d| self.medium(host, d)).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use super::*;

    /// A recording fake of the guest's sysfs and `/dev`.
    #[derive(Default)]
    struct Table {
        attrs: BTreeMap<(String, String), Vec<u8>>,
        /// A disk without an entry here has no openable `/dev` node yet.
        heads: BTreeMap<String, Vec<u8>>,
        media: BTreeMap<String, (u64, Vec<u8>)>,
        polled: RefCell<Vec<String>>,
    }

    impl Table {
        fn disk(&mut self, dev: &str, seq: &str, size: &str, serial: Option<&str>, head: &[u8]) {
            self.attrs.insert((dev.into(), "size".into()), size.as_bytes().to_vec());
            self.attrs.insert((dev.into(), "diskseq".into()), seq.as_bytes().to_vec());
            if let Some(s) = serial {
                let mut page = vec![0, 0x80, 0, 8];
                page.extend_from_slice(s.as_bytes());
                page.extend_from_slice(b"  \0");
                self.attrs.insert((dev.into(), "device/vpd_pg80".into()), page);
            }
            self.heads.insert(dev.into(), head.to_vec());
        }
        fn remove(&mut self, dev: &str) {
            self.attrs.retain(|(d, _), _| d != dev);
            self.heads.remove(dev);
        }
        fn drive(&mut self, dev: &str) {
            self.attrs.insert((dev.into(), "size".into()), b"0".to_vec());
        }
    }

    impl Host for Table {
        fn block_devices(&self) -> Vec<String> {
            let mut v: Vec<String> = self.attrs.keys().map(|(d, _)| d.clone()).collect();
            v.dedup();
            v
        }
        fn attr(&self, dev: &str, attr: &str) -> Option<String> {
            self.attr_bytes(dev, attr).map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        }
        fn attr_bytes(&self, dev: &str, attr: &str) -> Option<Vec<u8>> {
            self.attrs.get(&(dev.to_owned(), attr.to_owned())).cloned()
        }
        fn head(&self, dev: &str) -> Option<Vec<u8>> {
            self.heads.get(dev).cloned()
        }
        fn medium(&self, dev: &str) -> Option<(u64, Vec<u8>)> {
            self.media.get(dev).cloned()
        }
        fn poll_media(&self, dev: &str) {
            self.polled.borrow_mut().push(dev.to_owned());
        }
        fn uptime(&self) -> String {
            "1.00".into()
        }
    }

    #[test]
    fn a_new_disk_is_seen_then_reported_with_its_serial_and_first_bytes() {
        let mut t = Table::default();
        let mut r = Report::default();
        assert!(r.disks(&t).is_empty());
        t.disk("sda", "5", "8192", Some("vol-a"), b"AB");
        assert_eq!(r.disks(&t), ["SEEN sda 8192 t=1.00", "BLOCK+ sda 8192 4142 id=serial.vol-a t=1.00"]);
        // Nothing changed: nothing to say.
        assert!(r.disks(&t).is_empty());
    }

    #[test]
    fn a_disk_in_sysfs_whose_node_cannot_be_opened_yet_is_reported_once_it_can() {
        let mut t = Table::default();
        let mut r = Report::default();
        t.disk("sda", "5", "8192", Some("vol-a"), b"AB");
        t.disk("sdb", "6", "65536", Some("data"), b"CD");
        // sda's uevent arrives while sdb is listed with its size but /dev/sdb is not live yet.
        t.heads.remove("sdb");
        assert_eq!(r.disks(&t), ["SEEN sda 8192 t=1.00", "BLOCK+ sda 8192 4142 id=serial.vol-a t=1.00"]);
        // sdb's own uevent: now it reads, and is reported with its first bytes, once.
        t.heads.insert("sdb".into(), b"CD".to_vec());
        assert_eq!(r.disks(&t), ["SEEN sdb 65536 t=1.00", "BLOCK+ sdb 65536 4344 id=serial.data t=1.00"]);
        assert!(r.disks(&t).is_empty());
    }

    #[test]
    fn a_disk_without_serial_is_named_by_wwid_or_none() {
        let mut t = Table::default();
        t.disk("sdb", "1", "16", None, b"");
        let mut r = Report::default();
        assert_eq!(r.disks(&t)[1], "BLOCK+ sdb 16  id=none t=1.00");
        t.attrs.insert(("sdc".into(), "size".into()), b"16".to_vec());
        t.attrs.insert(("sdc".into(), "device/wwid".into()), b"naa.6001\n".to_vec());
        t.heads.insert("sdc".into(), Vec::new());
        assert_eq!(r.disks(&t)[1], "BLOCK+ sdc 16  id=naa.6001 t=1.00");
    }

    /// Linux reuses `sda` after an unplug: a new diskseq under the same name is a removal and an
    /// addition, in that order, even when no event came between them.
    #[test]
    fn a_reused_name_with_a_new_diskseq_reads_as_removal_then_addition() {
        let mut t = Table::default();
        let mut r = Report::default();
        t.disk("sda", "5", "8192", Some("one"), b"");
        r.disks(&t);
        t.disk("sda", "6", "8192", Some("two"), b"");
        assert_eq!(r.disks(&t), ["BLOCK- sda t=1.00", "SEEN sda 8192 t=1.00", "BLOCK+ sda 8192  id=serial.two t=1.00"]);
    }

    #[test]
    fn a_disk_whose_size_is_zeroed_or_that_left_sysfs_is_gone() {
        let mut t = Table::default();
        let mut r = Report::default();
        t.disk("sda", "5", "8192", None, b"");
        t.disk("sdb", "6", "8192", None, b"");
        r.disks(&t);
        t.disk("sda", "5", "0", None, b"");
        t.remove("sdb");
        assert_eq!(r.disks(&t), ["BLOCK- sda t=1.00", "BLOCK- sdb t=1.00"]);
        t.remove("sda");
        assert!(r.disks(&t).is_empty());
    }

    #[test]
    fn a_medium_is_reported_on_change_only_and_its_drive_is_polled_once() {
        let mut t = Table::default();
        let mut r = Report::default();
        t.drive("sr0");
        assert_eq!(r.all_media(&t), ["MEDIA sr0 out t=1.00"]);
        assert_eq!(r.medium(&t, "sr0"), None);
        t.media.insert("sr0".into(), (2048, b"MEDIUM-A".to_vec()));
        assert_eq!(r.medium(&t, "sr0").as_deref(), Some("MEDIA sr0 in 2048 4d454449554d2d41 t=1.00"));
        // A swap to a medium of the same size still reads as a change.
        t.media.insert("sr0".into(), (2048, b"MEDIUM-B".to_vec()));
        assert_eq!(r.medium(&t, "sr0").as_deref(), Some("MEDIA sr0 in 2048 4d454449554d2d42 t=1.00"));
        t.media.remove("sr0");
        assert_eq!(r.medium(&t, "sr0").as_deref(), Some("MEDIA sr0 out t=1.00"));
        assert_eq!(*t.polled.borrow(), ["sr0"]);
        // Disks and CD-ROM drives do not mix.
        assert_eq!(r.medium(&t, "sda"), None);
        assert!(r.disks(&t).is_empty());
    }

    #[test]
    fn an_unplugged_drive_is_forgotten_and_reported_afresh_if_it_returns() {
        let mut t = Table::default();
        let mut r = Report::default();
        t.drive("sr1");
        r.all_media(&t);
        t.remove("sr1");
        assert_eq!(r.medium(&t, "sr1"), None);
        t.drive("sr1");
        assert_eq!(r.medium(&t, "sr1").as_deref(), Some("MEDIA sr1 out t=1.00"));
        assert_eq!(t.polled.borrow().len(), 2);
    }
}
