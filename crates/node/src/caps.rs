//! What one VMI may take from this node: an emptyDisk no larger than a share of the free space
//! where its image goes, guest memory no larger than a share of the host's RAM.
//!
//! # Why on the node
//! In a cluster the API server cannot know the host a VMI lands on; the node agent can. The
//! check runs in [`crate::worker`] before anything is created for the VMI (no image file, no
//! QEMU): a VMI beyond a cap ends `Failed` with a message naming the field, the size asked for,
//! the cap, and the flag that changes it.
//!
//! # Defaults, and why
//! - emptyDisk: 50 % of the free space of the filesystem of the VM run dirs, at launch. The
//!   image is sparse, so it takes space only as the guest writes; the cap keeps a single guest
//!   from being able to fill the filesystem that the node (and, with `up`, the API server's
//!   store) lives on.
//! - guest memory: 75 % of `MemTotal`. `MemTotal`, not `MemAvailable`: QEMU allocates guest RAM
//!   lazily, so what happens to be available at launch says little about what the guest can
//!   take later, and a cap that moved with the page cache would let the same VMI start or not
//!   by chance. The cap refuses what the host can never hold (a typo like `64Ti`) and leaves a
//!   quarter for the host (the kubelet's `system-reserved` role); it is no scheduler: several
//!   guests may together ask for more.
//!
//! Sizes are parsed with [`api::quantity::bytes`], which refuses rather than wraps a size past
//! 8 EiB; all arithmetic here is checked or saturating towards the safe side.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use api::kubevirt::VirtualMachineInstanceSpec;

/// A cap: a size in bytes or a percentage of what the host has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    Bytes(u64),
    /// 1 to 100.
    Percent(u8),
}

impl FromStr for Cap {
    type Err = String;

    /// `50%` or a quantity of bytes (`100Gi`).
    fn from_str(s: &str) -> Result<Cap, String> {
        let s = s.trim();
        if let Some(p) = s.strip_suffix('%') {
            return match p.trim().parse::<u8>() {
                Ok(n @ 1..=100) => Ok(Cap::Percent(n)),
                _ => Err(format!("{s:?}: a percentage must be a whole number from 1% to 100%")),
            };
        }
        api::quantity::bytes(s).map(Cap::Bytes)
    }
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cap::Bytes(b) => f.write_str(&human(*b)),
            Cap::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Cap {
    /// The cap in bytes for a host that has `of` bytes.
    #[must_use]
    pub fn bytes(self, of: u64) -> u64 {
        match self {
            Cap::Bytes(b) => b,
            // At most `of`: no overflow (u128), no rounding up.
            Cap::Percent(p) => u64::try_from(u128::from(of) * u128::from(p) / 100).unwrap_or(of),
        }
    }
}

/// The node's caps (flags `--max-empty-disk` and `--max-guest-memory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub empty_disk: Cap,
    pub guest_memory: Cap,
}

impl Default for Caps {
    fn default() -> Self {
        Caps { empty_disk: Cap::Percent(50), guest_memory: Cap::Percent(75) }
    }
}

/// What the host has, read at launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// The directory the images go in (for messages).
    pub dir: PathBuf,
    /// Free bytes on its filesystem (for an unprivileged user: `f_bavail`).
    pub free: u64,
    /// `MemTotal` in bytes.
    pub mem_total: u64,
}

impl Host {
    /// Reads the free space under `dir` and the host's `MemTotal`.
    ///
    /// # Errors
    /// When either cannot be read: the VMI is refused (a cap that cannot be judged is not met).
    pub fn read(dir: &Path) -> Result<Host, String> {
        let st = rustix::fs::statvfs(dir).map_err(|e| format!("cannot read the free space of {}: {e}", dir.display()))?;
        let meminfo = std::fs::read_to_string("/proc/meminfo").map_err(|e| format!("cannot read /proc/meminfo: {e}"))?;
        let mem_total = mem_total(&meminfo).ok_or("/proc/meminfo has no MemTotal line")?;
        Ok(Host { dir: dir.to_owned(), free: st.f_bavail.saturating_mul(st.f_frsize), mem_total })
    }
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// Checks a VMI's emptyDisks and guest memory against the caps. Only volumes present from boot
/// count (a hot-pluggable emptyDisk is not created at launch).
///
/// # Errors
/// The first refusal: the field, the size asked for, the cap and how to change it.
pub fn check(spec: &VirtualMachineInstanceSpec, caps: Caps, host: &Host) -> Result<(), String> {
    let dom = &spec.domain;
    let memory = match (dom.memory.as_ref().and_then(|m| m.guest.as_ref()), dom.resources.as_ref().and_then(|r| r.requests.get("memory"))) {
        (Some(q), _) => Some(("spec.domain.memory.guest", q)),
        (None, Some(q)) => Some(("spec.domain.resources.requests.memory", q)),
        (None, None) => None,
    };
    if let Some((field, q)) = memory {
        let asked = api::quantity::bytes(&q.0).map_err(|e| format!("{field}: {e}"))?;
        let cap = caps.guest_memory.bytes(host.mem_total);
        if asked > cap {
            let of = match caps.guest_memory {
                Cap::Bytes(_) => String::new(),
                Cap::Percent(p) => format!(", {p}% of the host's {} of RAM", human(host.mem_total)),
            };
            return Err(format!(
                "{field}: {} ({}) is more than this node allows for one guest: {}{of}. Ask for less, or change the cap with \
                 --max-guest-memory (a size such as 16Gi, or a percentage of the host's RAM)",
                q.0,
                human(asked),
                human(cap),
            ));
        }
    }
    for (i, v) in spec.volumes.iter().enumerate().filter(|(_, v)| !v.is_hotpluggable()) {
        let Some(e) = &v.empty_disk else { continue };
        let field = format!("spec.volumes[{i}].emptyDisk.capacity");
        let asked = api::quantity::bytes(&e.capacity.0).map_err(|e| format!("{field}: {e}"))?;
        let cap = caps.empty_disk.bytes(host.free);
        if asked > cap {
            let of = match caps.empty_disk {
                Cap::Bytes(_) => String::new(),
                Cap::Percent(p) => format!(", {p}% of the {} free on the filesystem of {}", human(host.free), host.dir.display()),
            };
            return Err(format!(
                "{field}: {} ({}) of volume {:?} is more than this node allows for one emptyDisk: {}{of}. Ask for less, or change \
                 the cap with --max-empty-disk (a size such as 100Gi, or a percentage of the free space)",
                e.capacity.0,
                human(asked),
                v.name,
                human(cap),
            ));
        }
    }
    Ok(())
}

/// `1.5 GiB`, for messages.
#[must_use]
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut unit = 0;
    let mut whole = bytes;
    while whole >= 1024 && unit + 1 < UNITS.len() {
        whole /= 1024;
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    // One decimal, from integers: tenths of the unit.
    let tenths = u128::from(bytes) * 10 / (1u128 << (10 * unit));
    format!("{}.{} {}", tenths / 10, tenths % 10, UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(memory: &str, disks: &[(&str, &str)]) -> VirtualMachineInstanceSpec {
        let volumes: Vec<_> = disks.iter().map(|(n, c)| json!({"name": n, "emptyDisk": {"capacity": c}})).collect();
        serde_json::from_value(json!({"domain": {"devices": {}, "memory": {"guest": memory}}, "volumes": volumes}))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn host() -> Host {
        Host { dir: PathBuf::from("/data/node/vmis"), free: 10 << 30, mem_total: 8 << 30 }
    }

    #[test]
    fn caps_parse_as_sizes_or_percentages() {
        assert_eq!("50%".parse(), Ok(Cap::Percent(50)));
        assert_eq!("100Gi".parse(), Ok(Cap::Bytes(100 << 30)));
        assert!("0%".parse::<Cap>().unwrap_err().contains("1% to 100%"));
        assert!("101%".parse::<Cap>().is_err());
        assert!("lots".parse::<Cap>().is_err());
        assert!("99999999Ei".parse::<Cap>().is_err(), "no wrap past u64");
        assert_eq!(Cap::Percent(100).bytes(u64::MAX), u64::MAX);
        assert_eq!(Cap::Percent(50).bytes(3), 1);
        assert_eq!(Cap::Percent(75).to_string(), "75%");
    }

    #[test]
    fn within_the_caps_passes() {
        assert_eq!(check(&spec("1Gi", &[("a", "5Gi"), ("b", "5Gi")]), Caps::default(), &host()), Ok(()));
        assert_eq!(check(&spec("6Gi", &[]), Caps::default(), &host()), Ok(()));
    }

    #[test]
    fn an_empty_disk_beyond_the_cap_names_field_size_cap_and_flag() {
        let err = check(&spec("1Gi", &[("a", "1Gi"), ("big", "6Gi")]), Caps::default(), &host()).unwrap_err();
        for want in [
            "spec.volumes[1].emptyDisk.capacity",
            "6Gi",
            "\"big\"",
            "5.0 GiB",
            "50%",
            "10.0 GiB free",
            "/data/node/vmis",
            "--max-empty-disk",
        ] {
            assert!(err.contains(want), "{want:?} missing in {err}");
        }
        let fixed = Caps { empty_disk: Cap::Bytes(1 << 30), ..Caps::default() };
        let err = check(&spec("1Gi", &[("a", "2Gi")]), fixed, &host()).unwrap_err();
        assert!(err.contains("1.0 GiB. Ask for less"), "{err}");
    }

    #[test]
    fn guest_memory_beyond_the_cap_or_past_u64_is_refused() {
        let err = check(&spec("7Gi", &[]), Caps::default(), &host()).unwrap_err();
        for want in ["spec.domain.memory.guest", "7Gi", "6.0 GiB", "75%", "8.0 GiB of RAM", "--max-guest-memory"] {
            assert!(err.contains(want), "{want:?} missing in {err}");
        }
        let err = check(&spec("100000000Ti", &[]), Caps::default(), &host()).unwrap_err();
        assert!(err.starts_with("spec.domain.memory.guest: "), "{err}");
        let err = check(&spec("1Gi", &[("a", "99999999999Ei")]), Caps::default(), &host()).unwrap_err();
        assert!(err.starts_with("spec.volumes[0].emptyDisk.capacity: "), "{err}");
    }

    #[test]
    fn mem_total_is_read_from_meminfo() {
        assert_eq!(mem_total("MemTotal:       24579412 kB\nMemFree: 1 kB\n"), Some(24_579_412 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: 99999999999999999999 kB\n"), None);
        assert!(Host::read(Path::new("/")).is_ok_and(|h| h.mem_total > 0));
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(u64::MAX), "15.9 EiB");
    }
}
