//! Flags that bound what guests and retries can make grow: Event expiry and the store's free-space
//! reserve (`virtplug apiserver`, `virtplug up`), and what one VMI may take from the node
//! (`virtplug node`, `virtplug up`).

use std::time::Duration;

use clap::Args;

/// The API server's Event TTL and the store's free-space reserve.
#[derive(Args, Clone, Debug)]
pub struct StoreArgs {
    /// Events not seen again for this long are deleted (kube-apiserver's --event-ttl), e.g. 1h,
    /// 30m, 90s; 0 keeps them forever.
    #[arg(long, default_value = "1h", value_parser = ttl, value_name = "DURATION")]
    event_ttl: Duration,
    /// Space kept free on the data dir's filesystem: a write that would leave less is refused
    /// with 507 (reads go on; writes resume by themselves once space is freed). A size such as
    /// 256Mi; 0 turns the check off [default: the larger of 64Mi and 1% of the filesystem].
    #[arg(long, value_parser = reserve, value_name = "SIZE")]
    store_reserve: Option<u64>,
}

impl StoreArgs {
    /// Sets the TTL and the reserve in `config`.
    pub fn apply(&self, config: &mut apiserver::Config) {
        config.event_ttl = (!self.event_ttl.is_zero()).then_some(self.event_ttl);
        config.store.reserve = self.store_reserve;
    }
}

/// `0` (no expiry) or a duration such as `1h`, `30m`, `1h30m`, `90s`, `500ms`.
fn ttl(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    let d: jiff::SignedDuration = s.trim().parse().map_err(|e| format!("{s:?} is not a duration such as 1h, 30m or 90s: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?}: a TTL cannot be negative"))
}

/// `0` (no check) or a quantity of bytes.
fn reserve(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    api::quantity::bytes(s)
}

/// What one VMI may take from this node.
#[derive(Args, Clone, Debug)]
pub struct CapsArgs {
    /// Largest emptyDisk one VMI may have: a size such as 100Gi, or a percentage of the free
    /// space on the filesystem of the VM run dirs at launch. A VMI asking for more fails to start,
    /// saying so.
    #[arg(long, default_value = "50%", value_name = "SIZE_OR_PERCENT")]
    max_empty_disk: node::caps::Cap,
    /// Most memory one guest may have: a size such as 16Gi, or a percentage of the host's RAM
    /// (MemTotal). A VMI asking for more fails to start, saying so.
    #[arg(long, default_value = "75%", value_name = "SIZE_OR_PERCENT")]
    max_guest_memory: node::caps::Cap,
}

impl CapsArgs {
    /// The node agent's caps.
    pub fn caps(&self) -> node::caps::Caps {
        node::caps::Caps { empty_disk: self.max_empty_disk, guest_memory: self.max_guest_memory }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_and_reserves_parse_with_zero_meaning_off() {
        assert_eq!(ttl("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(ttl("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(ttl("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(ttl("0"), Ok(Duration::ZERO));
        assert!(ttl("-1h").is_err());
        assert!(ttl("soon").is_err());
        assert_eq!(reserve("0"), Ok(0));
        assert_eq!(reserve("4Mi"), Ok(4 << 20));
        assert!(reserve("lots").is_err());
    }

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        caps: CapsArgs,
    }

    #[test]
    fn the_flags_reach_the_configs_with_their_defaults() {
        use clap::Parser;
        let dir = std::path::Path::new("/d");
        let f = Flags::try_parse_from(["t"]).unwrap_or_else(|e| panic!("{e}"));
        let mut c = apiserver::Config::new(dir);
        f.store.apply(&mut c);
        assert_eq!((c.event_ttl, c.store.reserve), (Some(Duration::from_secs(3600)), None));
        assert_eq!(f.caps.caps(), node::caps::Caps::default());
        let f = Flags::try_parse_from([
            "t",
            "--event-ttl",
            "0",
            "--store-reserve",
            "4Mi",
            "--max-empty-disk",
            "10Gi",
            "--max-guest-memory",
            "90%",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        f.store.apply(&mut c);
        assert_eq!((c.event_ttl, c.store.reserve), (None, Some(4 << 20)));
        assert_eq!(
            f.caps.caps(),
            node::caps::Caps { empty_disk: node::caps::Cap::Bytes(10 << 30), guest_memory: node::caps::Cap::Percent(90) }
        );
        assert!(Flags::try_parse_from(["t", "--max-empty-disk", "150%"]).is_err());
    }
}
