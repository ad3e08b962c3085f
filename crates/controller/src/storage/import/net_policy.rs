//! Which addresses an import may connect to: the guard against server-side request forgery.
//!
//! An import URL comes from whoever may create a DataVolume, and the controller fetches it from
//! inside the host's network. Unguarded, `http://169.254.169.254/` reads the cloud metadata
//! service (credentials), `http://127.0.0.1:PORT/` reaches whatever listens on loopback, and
//! the status messages scan ports.
//!
//! # Guarantees
//! - The address connected to is the address checked. Host names are resolved once, by
//!   [`GuardedResolver`], which drops refused addresses before reqwest connects to what is left
//!   (no DNS-rebinding window between check and connect). IP literals never reach a resolver:
//!   [`check_url`] checks them before the request, and [`redirect_policy`] at every redirect.
//! - Refused unless allowed: the classes of [`classify`] (unspecified, loopback, link-local,
//!   multicast, broadcast, reserved, cloud metadata — also inside IPv4-mapped, IPv4-compatible
//!   and NAT64 IPv6 forms) and every address of this machine's interfaces ([`local_nets`], read
//!   afresh at each check, so an address added later counts too).
//! - Redirects: http and https only, at most [`super::ImportConfig::max_redirects`].
//!
//! # Allow-list
//! [`AllowEntry`]: an address or CIDR allows the addresses in it; a host name allows whatever
//! that name resolves to (it is matched against the URL's host, not against addresses).
//!
//! # Caveats
//! - No proxy is used: a proxy would resolve and connect out of our sight.
//! - Private ranges (10/8, 172.16/12, 192.168/16, fc00::/7) are not refused: image servers live
//!   there. Only the AWS IPv6 metadata address of fc00::/7 is.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

/// AWS's instance metadata service over IPv6 (`fd00:ec2::254`).
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x254);

/// Why an address is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forbidden {
    Unspecified,
    Loopback,
    LinkLocal,
    Multicast,
    Broadcast,
    Reserved,
    CloudMetadata,
    ThisHost,
}

impl fmt::Display for Forbidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Forbidden::Unspecified => "an unspecified address",
            Forbidden::Loopback => "a loopback address",
            Forbidden::LinkLocal => "a link-local address (where cloud metadata services live)",
            Forbidden::Multicast => "a multicast address",
            Forbidden::Broadcast => "a broadcast address",
            Forbidden::Reserved => "a reserved address",
            Forbidden::CloudMetadata => "a cloud metadata address",
            Forbidden::ThisHost => "an address of this machine",
        })
    }
}

/// The class of `ip` that is never fetched from unless allowed (`None`: an ordinary address).
/// Does not know this machine's addresses: see [`NetPolicy::refusal`].
#[must_use]
pub fn classify(ip: IpAddr) -> Option<Forbidden> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Forbidden> {
    let [a, b, ..] = ip.octets();
    match (a, b) {
        // 0.0.0.0/8 "this network": Linux connects 0.0.0.0 to the host itself.
        (0, _) => Some(Forbidden::Unspecified),
        (127, _) => Some(Forbidden::Loopback),
        (169, 254) => Some(Forbidden::LinkLocal),
        _ if ip.is_broadcast() => Some(Forbidden::Broadcast),
        (224..=239, _) => Some(Forbidden::Multicast),
        (240..=255, _) => Some(Forbidden::Reserved),
        _ => None,
    }
}

fn classify_v6(ip: Ipv6Addr) -> Option<Forbidden> {
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    if ip.is_unspecified() {
        Some(Forbidden::Unspecified)
    } else if ip.is_loopback() {
        Some(Forbidden::Loopback)
    } else if ip.segments()[0] & 0xffc0 == 0xfe80 {
        Some(Forbidden::LinkLocal)
    } else if ip.is_multicast() {
        Some(Forbidden::Multicast)
    } else if ip == AWS_METADATA_V6 {
        Some(Forbidden::CloudMetadata)
    } else {
        None
    }
}

/// The IPv4 address an IPv6 address stands for: IPv4-mapped (`::ffff:a.b.c.d`, which the
/// kernel connects over IPv4), IPv4-compatible (`::a.b.c.d`, deprecated) and NAT64
/// (`64:ff9b::a.b.c.d`, which a NAT64 gateway connects to).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7]));
    match s[..6] {
        [0, 0, 0, 0, 0, 0xffff] | [0x64, 0xff9b, 0, 0, 0, 0] => Some(tail),
        [0, 0, 0, 0, 0, 0] if !ip.is_unspecified() && !ip.is_loopback() => Some(tail),
        _ => None,
    }
}

/// A network: an address and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    /// The network of `addr` with `prefix` bits (`None` when the prefix is longer than the
    /// address). An IPv4-mapped IPv6 network of ≥ 96 bits is stored as the IPv4 network.
    #[must_use]
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Net> {
        match addr {
            IpAddr::V4(_) if prefix <= 32 => Some(Net { addr, prefix }),
            IpAddr::V6(v6) if prefix <= 128 => match v6.to_ipv4_mapped() {
                Some(v4) if prefix >= 96 => Some(Net { addr: IpAddr::V4(v4), prefix: prefix - 96 }),
                _ => Some(Net { addr, prefix }),
            },
            _ => None,
        }
    }

    /// The network holding only `addr`.
    #[must_use]
    pub fn host(addr: IpAddr) -> Net {
        let addr = addr.to_canonical();
        Net { addr, prefix: if addr.is_ipv4() { 32 } else { 128 } }
    }

    /// Whether `ip` (or the IPv4 address it maps) is in this network.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// One `--import-allow-host` value: an address, a CIDR network, or a host name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowEntry {
    Net(Net),
    Host(String),
}

impl FromStr for AllowEntry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("--import-allow-host {s:?}: {why}; give an address (127.0.0.1), a network (127.0.0.0/8, ::1/128) or a host name (localhost)")
        };
        let t = s.trim();
        let unbracketed = t.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(t);
        if let Ok(ip) = unbracketed.parse::<IpAddr>() {
            return Ok(AllowEntry::Net(Net::host(ip)));
        }
        if let Some((addr, prefix)) = t.split_once('/') {
            let addr: IpAddr = addr.parse().map_err(|_| bad("the part before / is not an IP address"))?;
            let prefix: u8 = prefix.parse().map_err(|_| bad("the prefix length after / is not a number"))?;
            return Net::new(addr, prefix).map(AllowEntry::Net).ok_or_else(|| bad("the prefix length is longer than the address"));
        }
        let name = t.strip_suffix('.').unwrap_or(t).to_ascii_lowercase();
        if name.contains(':') {
            return Err(bad("a host takes no port (the allow-list is by host, every port)"));
        }
        let label_ok = |l: &str| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(bad("not an address, a network or a host name"));
        }
        Ok(AllowEntry::Host(name))
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowEntry::Net(n) => n.fmt(f),
            AllowEntry::Host(h) => f.write_str(h),
        }
    }
}

/// The addresses this machine answers on, from the kernel's local routing table
/// (`/proc/net/fib_trie`: `LOCAL` and `BROADCAST` routes of every interface) and
/// `/proc/net/if_inet6`, of this process's network namespace.
///
/// # Errors
/// When `/proc/net/fib_trie` cannot be read (a missing `if_inet6` means no IPv6: no error).
pub fn local_nets() -> std::io::Result<Vec<Net>> {
    let mut nets = parse_fib_trie(&std::fs::read_to_string("/proc/net/fib_trie")?);
    match std::fs::read_to_string("/proc/net/if_inet6") {
        Ok(text) => nets.extend(parse_if_inet6(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(nets)
}

/// The `LOCAL` and `BROADCAST` routes of a `/proc/net/fib_trie` dump: a leaf line
/// (`|-- 10.0.2.15`) followed by its routes (`/32 host LOCAL`, `/8 host LOCAL` for a whole
/// local network such as 127.0.0.0/8).
fn parse_fib_trie(text: &str) -> Vec<Net> {
    let mut nets = Vec::new();
    let mut leaf: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(addr) = t.strip_prefix("|-- ") {
            leaf = addr.trim().parse().ok();
        } else if let (Some(route), Some(addr)) = (t.strip_prefix('/'), leaf) {
            let mut words = route.split_whitespace();
            let (prefix, kind) = (words.next().and_then(|p| p.parse().ok()), words.nth(1));
            if let (Some(prefix), Some("LOCAL" | "BROADCAST")) = (prefix, kind) {
                if let Some(net) = Net::new(IpAddr::V4(addr), prefix) {
                    if !nets.contains(&net) {
                        nets.push(net);
                    }
                }
            }
        } else {
            leaf = None;
        }
    }
    nets
}

/// The addresses of `/proc/net/if_inet6` (32 hex digits first on each line).
fn parse_if_inet6(text: &str) -> Vec<Net> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|hex| u128::from_str_radix(hex, 16).ok().filter(|_| hex.len() == 32))
        .map(|n| Net::host(IpAddr::V6(Ipv6Addr::from(n))))
        .collect()
}

/// Why a URL or an address was refused before connecting.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{host} is {addr}, {class}, and not in --import-allow-host")]
    Host { host: String, addr: IpAddr, class: Forbidden },
    #[error("a redirect to a {0:?} URL; only http and https are followed")]
    Scheme(String),
    #[error("more than {0} redirects")]
    TooManyRedirects(usize),
    #[error("a URL without a host")]
    NoHost,
    #[error("cannot read this machine's addresses from /proc/net")]
    LocalAddrs(#[source] std::io::Error),
}

/// The policy: the allow-list over the refused classes and this machine's addresses.
#[derive(Clone, Debug, Default)]
pub struct NetPolicy {
    allow: Vec<AllowEntry>,
}

impl NetPolicy {
    #[must_use]
    pub fn new(allow: Vec<AllowEntry>) -> NetPolicy {
        NetPolicy { allow }
    }

    /// Why `ip`, reached as `host`, may not be connected to (`None`: it may), given this
    /// machine's networks `local`.
    #[must_use]
    pub fn refusal(&self, host: &str, ip: IpAddr, local: &[Net]) -> Option<Forbidden> {
        let host = host.strip_suffix('.').unwrap_or(host);
        let allowed = self.allow.iter().any(|a| match a {
            AllowEntry::Net(n) => n.contains(ip),
            AllowEntry::Host(h) => h.eq_ignore_ascii_case(host),
        });
        if allowed {
            return None;
        }
        classify(ip).or_else(|| local.iter().any(|n| n.contains(ip)).then_some(Forbidden::ThisHost))
    }

    fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), Refusal> {
        let local = local_nets().map_err(Refusal::LocalAddrs)?;
        match self.refusal(host, ip, &local) {
            Some(class) => Err(Refusal::Host { host: host.to_owned(), addr: ip, class }),
            None => Ok(()),
        }
    }
}

/// Checks a URL before it is requested (the first one, and each redirect): its scheme, and its
/// host when that is an IP literal (names are checked by [`GuardedResolver`] as they resolve).
///
/// # Errors
/// A [`Refusal`] naming the host.
pub fn check_url(policy: &NetPolicy, url: &reqwest::Url) -> Result<(), Refusal> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Refusal::Scheme(url.scheme().to_owned()));
    }
    let host = url.host_str().filter(|h| !h.is_empty()).ok_or(Refusal::NoHost)?;
    // The URL parser has turned every IPv4 spelling (`2130706433`, `0x7f.1`) into dotted form;
    // IPv6 literals keep their brackets.
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    match bare.parse::<IpAddr>() {
        Ok(ip) => policy.check_ip(bare, ip),
        Err(_) => Ok(()),
    }
}

/// reqwest's redirect policy for imports: each hop passes [`check_url`]; at most `max` hops.
#[must_use]
pub fn redirect_policy(policy: Arc<NetPolicy>, max: usize) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > max {
            return attempt.error(Refusal::TooManyRedirects(max));
        }
        // Reads /proc/net for an IP-literal hop: a few microseconds, on the runtime's thread.
        match check_url(&policy, attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(r) => attempt.error(r),
        }
    })
}

/// A DNS resolver that resolves a name once and hands reqwest only the addresses the policy
/// allows, so the connection goes to a checked address.
pub struct GuardedResolver(pub Arc<NetPolicy>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.0);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let local = local_nets().map_err(Refusal::LocalAddrs)?;
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.refusal(&host, a.ip(), &local) {
                    None => true,
                    Some(class) => {
                        refused.get_or_insert(Refusal::Host { host: host.clone(), addr: a.ip(), class });
                        false
                    }
                })
                .collect();
            match refused {
                Some(r) if allowed.is_empty() => Err(r.into()),
                _ => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// The [`Refusal`] somewhere in `err`'s chain of sources.
#[must_use]
pub fn find_refusal<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refusal> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<Refusal>() {
            return Some(r);
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_refused_class_and_its_ipv6_spellings() {
        let cases = [
            ("0.0.0.0", Some(Forbidden::Unspecified)),
            ("0.1.2.3", Some(Forbidden::Unspecified)),
            ("::", Some(Forbidden::Unspecified)),
            ("127.0.0.1", Some(Forbidden::Loopback)),
            ("127.255.255.254", Some(Forbidden::Loopback)),
            ("::1", Some(Forbidden::Loopback)),
            ("169.254.169.254", Some(Forbidden::LinkLocal)),
            ("169.254.0.1", Some(Forbidden::LinkLocal)),
            ("fe80::1", Some(Forbidden::LinkLocal)),
            ("febf:ffff::1", Some(Forbidden::LinkLocal)),
            ("224.0.0.1", Some(Forbidden::Multicast)),
            ("239.255.255.250", Some(Forbidden::Multicast)),
            ("ff02::1", Some(Forbidden::Multicast)),
            ("255.255.255.255", Some(Forbidden::Broadcast)),
            ("240.0.0.1", Some(Forbidden::Reserved)),
            ("fd00:ec2::254", Some(Forbidden::CloudMetadata)),
            // IPv4-mapped, IPv4-compatible and NAT64 forms carry their IPv4 address's class.
            ("::ffff:127.0.0.1", Some(Forbidden::Loopback)),
            ("::ffff:169.254.169.254", Some(Forbidden::LinkLocal)),
            ("::ffff:0.0.0.0", Some(Forbidden::Unspecified)),
            ("::ffff:224.0.0.1", Some(Forbidden::Multicast)),
            ("::ffff:255.255.255.255", Some(Forbidden::Broadcast)),
            ("::127.0.0.1", Some(Forbidden::Loopback)),
            ("::169.254.169.254", Some(Forbidden::LinkLocal)),
            ("64:ff9b::127.0.0.1", Some(Forbidden::Loopback)),
            ("64:ff9b::a9fe:a9fe", Some(Forbidden::LinkLocal)),
            // Ordinary addresses, private ones included (image servers live there).
            ("8.8.8.8", None),
            ("10.1.2.3", None),
            ("192.168.1.1", None),
            ("169.253.255.255", None),
            ("169.255.0.1", None),
            ("126.255.255.255", None),
            ("128.0.0.1", None),
            ("223.255.255.255", None),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::808:808", None),
            ("2001:db8::1", None),
            ("fd00::2", None),
            ("fec0::1", None),
            ("fe7f::1", None),
            ("fec0::", None),
        ];
        for (addr, want) in cases {
            assert_eq!(classify(ip(addr)), want, "{addr}");
        }
    }

    #[test]
    fn networks_match_their_addresses_and_ipv4_mapped_forms() {
        let n = Net::new(ip("127.0.0.0"), 8).unwrap();
        assert!(n.contains(ip("127.9.9.9")));
        assert!(n.contains(ip("::ffff:127.0.0.1")), "the IPv4-mapped form is the same address");
        assert!(!n.contains(ip("128.0.0.1")));
        assert!(!n.contains(ip("::1")));
        let all = Net::new(ip("0.0.0.0"), 0).unwrap();
        assert!(all.contains(ip("1.2.3.4")) && !all.contains(ip("::2")));
        let v6 = Net::new(ip("fe80::"), 10).unwrap();
        assert!(v6.contains(ip("fe80::1")) && v6.contains(ip("febf::1")) && !v6.contains(ip("fec0::1")));
        assert_eq!(Net::new(ip("::ffff:10.0.0.0"), 104), Net::new(ip("10.0.0.0"), 8));
        assert_eq!(Net::new(ip("10.0.0.0"), 33), None);
        assert_eq!(Net::new(ip("::"), 129), None);
    }

    #[test]
    fn allow_entries_parse_addresses_networks_and_host_names() {
        let e = |s: &str| s.parse::<AllowEntry>();
        assert_eq!(e("127.0.0.1"), Ok(AllowEntry::Net(Net::host(ip("127.0.0.1")))));
        assert_eq!(e("[::1]"), Ok(AllowEntry::Net(Net::host(ip("::1")))));
        assert_eq!(e("127.0.0.2/32").unwrap().to_string(), "127.0.0.2/32");
        assert_eq!(e("fe80::/10").unwrap().to_string(), "fe80::/10");
        assert_eq!(e("LocalHost."), Ok(AllowEntry::Host("localhost".into())));
        assert_eq!(e("images.example.com"), Ok(AllowEntry::Host("images.example.com".into())));
        for bad in ["", "localhost:8080", "10.0.0.0/33", "10.0.0/8", "a..b", "exa mple", "1.2.3.4/x"] {
            let err = e(bad).unwrap_err();
            assert!(err.contains("--import-allow-host"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn the_allow_list_lifts_a_refusal_by_network_or_by_host_name() {
        let local = [Net::host(ip("192.0.2.2")), Net::new(ip("127.0.0.0"), 8).unwrap()];
        let none = NetPolicy::default();
        assert_eq!(none.refusal("127.0.0.1", ip("127.0.0.1"), &local), Some(Forbidden::Loopback));
        assert_eq!(none.refusal("192.0.2.2", ip("192.0.2.2"), &local), Some(Forbidden::ThisHost));
        assert_eq!(none.refusal("h", ip("::ffff:192.0.2.2"), &local), Some(Forbidden::ThisHost));
        assert_eq!(none.refusal("192.0.2.3", ip("192.0.2.3"), &local), None);
        let some = NetPolicy::new(vec!["127.0.0.2/32".parse().unwrap(), "localhost".parse().unwrap()]);
        assert_eq!(some.refusal("127.0.0.2", ip("127.0.0.2"), &local), None);
        assert_eq!(some.refusal("127.0.0.1", ip("127.0.0.1"), &local), Some(Forbidden::Loopback));
        assert_eq!(some.refusal("LOCALHOST.", ip("127.0.0.1"), &local), None, "an allowed name may resolve anywhere");
        assert_eq!(some.refusal("evil.example", ip("127.0.0.2"), &local), None, "an allowed network, whatever the name");
    }

    #[test]
    fn fib_trie_yields_local_and_broadcast_routes_of_every_interface() {
        let text = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n\
                    Local:\n  +-- 0.0.0.0/0 3 0 5\n     +-- 127.0.0.0/8 2 0 2\n        +-- 127.0.0.0/31 1 0 0\n\
                    \x20          |-- 127.0.0.0\n              /8 host LOCAL\n           |-- 127.0.0.1\n              /32 host LOCAL\n\
                    \x20       |-- 127.255.255.255\n           /32 link BROADCAST\n     +-- 192.0.2.0/24 2 0 2\n\
                    \x20          |-- 192.0.2.0\n              /24 link UNICAST\n           |-- 192.0.2.2\n              /32 host LOCAL\n\
                    \x20       |-- 10.9.0.0\n           /16 host LOCAL\n";
        let nets: Vec<String> = parse_fib_trie(text).iter().map(ToString::to_string).collect();
        assert_eq!(nets, ["127.0.0.0/8", "127.0.0.1/32", "127.255.255.255/32", "192.0.2.2/32", "10.9.0.0/16"]);
        let v6 = parse_if_inet6(
            "00000000000000000000000000000001 01 80 10 80       lo\nfe8000000000000000fc00fffe000001 04 40 20 80 eth0\nbogus\n",
        );
        assert_eq!(v6.iter().map(ToString::to_string).collect::<Vec<_>>(), ["::1/128", "fe80::fc:ff:fe00:1/128"]);
    }

    /// The addresses read from /proc are this machine's: the source address the kernel picks
    /// to reach another network is among them, and each of them can be bound.
    #[test]
    fn local_nets_hold_the_addresses_the_kernel_uses() {
        let nets = local_nets().unwrap();
        assert!(nets.iter().any(|n| n.contains(ip("127.0.0.1"))), "{nets:?}");
        for target in ["192.0.2.200:9", "203.0.113.1:9", "[2001:db8::1]:9"] {
            let any: SocketAddr = if target.starts_with('[') { "[::]:0" } else { "0.0.0.0:0" }.parse().unwrap();
            let Ok(sock) = std::net::UdpSocket::bind(any) else { continue };
            // A UDP connect sends nothing; it only picks the route and source address.
            if sock.connect(target).is_ok() {
                let src = sock.local_addr().unwrap().ip();
                assert!(nets.iter().any(|n| n.contains(src)), "source address {src} for {target} missing from {nets:?}");
            }
        }
        for n in nets.iter().filter(|n| n.prefix == 32 || n.prefix == 128) {
            if matches!(n.addr, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80) {
                continue; // link-local addresses bind only with a scope id
            }
            // Linux binds local and broadcast addresses only (EADDRNOTAVAIL otherwise).
            assert!(std::net::UdpSocket::bind((n.addr, 0)).is_ok(), "{n} is not an address of this machine");
        }
    }
}
