//! Guest networking: `spec.domain.devices.interfaces` and `spec.networks` as virtplug honours
//! them, their admission rules, and the MAC address a VM's interface has.
//!
//! # What is honoured
//! One interface on the pod network (`networks: [{name, pod: {}}]`) with the `masquerade`
//! binding, or no binding (KubeVirt's default binding on a pod network): the node agent gives
//! the guest QEMU user-mode networking (slirp) behind it, the NIC model asked for (`virtio`,
//! `e1000`, `e1000e`, `rtl8139`), the interface's `macAddress` or a stable derived one
//! ([`derived_mac`]), and each of the interface's `ports` forwarded from an ephemeral port on
//! the host's loopback ([`PortForward`]). A VMI with neither interfaces nor networks gets
//! KubeVirt's auto-attached `default` interface on the pod network unless
//! `devices.autoattachPodInterface: false`.
//!
//! # What is refused (admission, [`validate`])
//! The `bridge`, `sriov`, `macvtap`, `passt`, `slirp` bindings and binding plugins, Multus and
//! every network source but `pod`, more than one pod network, an interface without its network
//! and a network without its interface, duplicate names, malformed MAC addresses, ports out of
//! range or of another protocol than TCP/UDP. The messages follow KubeVirt's network admitter
//! where it has one.
//!
//! The types here are views: interfaces and networks stay in the spec's `extra` maps (so a
//! read-modify-write keeps every field), and are decoded from there when needed.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::cause::{Cause, CauseType};
use crate::kubevirt::{Extra, VirtualMachineInstanceSpec};

/// KubeVirt's name for the auto-attached pod interface and network.
pub const DEFAULT_INTERFACE: &str = "default";

/// The guest address QEMU's user-mode network gives the guest (its DHCP server's first lease),
/// and the address every forwarded port leads to.
pub const GUEST_IP: &str = "10.0.2.15";

/// The NIC models virtplug gives the guest, with the QEMU device of each.
pub const MODELS: [(&str, &str); 4] = [("virtio", "virtio-net-pci"), ("e1000", "e1000"), ("e1000e", "e1000e"), ("rtl8139", "rtl8139")];

/// The interface bindings KubeVirt knows that virtplug refuses.
const REFUSED_BINDINGS: [&str; 6] = ["bridge", "sriov", "macvtap", "passt", "slirp", "binding"];

/// What the messages name as supported.
const SUPPORTED: &str = "masquerade on a pod network (QEMU user-mode networking), or no binding";

/// `spec.domain.devices.interfaces[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masquerade: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `interfaces[].ports[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// KubeVirt's `int32`; decoded wider so that a value out of range is reported, not wrapped.
    #[serde(default)]
    pub port: i64,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.networks[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<BTreeMap<String, Value>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A forwarded port's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
}

impl Protocol {
    /// `TCP` or `UDP`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
    /// QEMU's (and slirp's) spelling: `tcp`, `udp`.
    #[must_use]
    pub fn qemu(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// A MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// Parses `aa:bb:cc:dd:ee:ff` or `aa-bb-cc-dd-ee-ff` (either case): the 6-byte forms of Go's
    /// `net.ParseMAC`, which KubeVirt admits with.
    #[must_use]
    pub fn parse(s: &str) -> Option<Mac> {
        let sep = if s.contains('-') { '-' } else { ':' };
        let parts: Vec<&str> = s.split(sep).collect();
        if parts.len() != 6 {
            return None;
        }
        let mut b = [0u8; 6];
        for (i, p) in parts.iter().enumerate() {
            if p.len() != 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            b[i] = u8::from_str_radix(p, 16).ok()?;
        }
        Some(Mac(b))
    }
}

impl fmt::Display for Mac {
    /// Lower case, colon-separated: how QEMU and Linux print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// The MAC address of interface `iface` of VM (or VMI) `namespace/name` when its spec sets none:
/// `02:xx:xx:xx:xx:xx` (locally administered, unicast) from a hash of the three, so the same VM
/// has the same address at every start and on every node, and the Redfish service's
/// EthernetInterface reports the address the guest has. (KubeVirt leaves it to libvirt, or to
/// kubemacpool when installed, which keeps one per VM too.)
#[must_use]
pub fn derived_mac(namespace: &str, name: &str, iface: &str) -> Mac {
    let d = Sha256::digest(format!("virtplug-mac/{namespace}/{name}/{iface}").as_bytes());
    Mac([0x02, d[0], d[1], d[2], d[3], d[4]])
}

/// A forwarded port as the guest sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestPort {
    pub name: Option<String>,
    pub protocol: Protocol,
    pub port: u16,
}

/// An interface the node agent gives the guest: user-mode networking behind a NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInterface {
    pub name: String,
    /// The QEMU device ([`MODELS`]).
    pub device: &'static str,
    pub mac: Mac,
    pub ports: Vec<GuestPort>,
}

/// `status.interfaces[]`'s `infoSource` for what the node agent knows from the domain it built
/// (KubeVirt's `domain`; the guest agent adds `guest-agent`).
pub const INFO_SOURCE_DOMAIN: &str = "domain";

/// One forwarded port, as the annotation [`crate::annotations::PORT_FORWARDS`] lists them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PortForward {
    /// The interface it belongs to.
    pub interface: String,
    /// The port's name in the spec, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub protocol: Protocol,
    /// The guest's port.
    pub port: u16,
    /// Where to connect on the node: `127.0.0.1`.
    #[serde(rename = "hostIP")]
    pub host_ip: String,
    pub host_port: u16,
}

/// The forwards of a VMI's [`crate::annotations::PORT_FORWARDS`] annotation (none when it is
/// absent or unreadable).
#[must_use]
pub fn port_forwards(annotations: &BTreeMap<String, String>) -> Vec<PortForward> {
    annotations.get(crate::annotations::PORT_FORWARDS).and_then(|v| serde_json::from_str(v).ok()).unwrap_or_default()
}

/// The interfaces and networks of `spec`, decoded.
///
/// # Errors
/// A cause naming the first field that does not decode.
pub fn decode(spec: &VirtualMachineInstanceSpec, prefix: &str) -> Result<(Vec<Interface>, Vec<Network>), Cause> {
    fn list<T: serde::de::DeserializeOwned>(v: Option<&Value>, field: &str) -> Result<Vec<T>, Cause> {
        let Some(v) = v else { return Ok(Vec::new()) };
        serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let at = if path == "." {
                field.to_owned()
            } else {
                format!("{field}{}", if path.starts_with('[') { path } else { format!(".{path}") })
            };
            Cause::new(CauseType::Invalid, at, e.inner().to_string())
        })
    }
    let ifaces = list(spec.domain.devices.extra.get("interfaces"), &format!("{prefix}.domain.devices.interfaces"))?;
    let nets = list(spec.extra.get("networks"), &format!("{prefix}.networks"))?;
    Ok((ifaces, nets))
}

/// Whether KubeVirt would auto-attach the `default` pod interface: neither interfaces nor
/// networks, and `autoattachPodInterface` not `false`.
fn auto_attach(spec: &VirtualMachineInstanceSpec, ifaces: &[Interface], nets: &[Network]) -> bool {
    ifaces.is_empty() && nets.is_empty() && spec.domain.devices.extra.get("autoattachPodInterface").and_then(Value::as_bool) != Some(false)
}

/// The interfaces the guest of VM (or VMI) `namespace/name` gets, with their MAC addresses and
/// forwarded ports: what [`validate`] admits, resolved.
///
/// # Errors
/// Every cause [`validate`] reports, for a spec from an API server without virtplug's admission.
pub fn pod_interfaces(spec: &VirtualMachineInstanceSpec, namespace: &str, name: &str) -> Result<Vec<PodInterface>, Vec<Cause>> {
    let causes = validate(spec, "spec");
    if !causes.is_empty() {
        return Err(causes);
    }
    let (ifaces, nets) = decode(spec, "spec").map_err(|c| vec![c])?;
    if auto_attach(spec, &ifaces, &nets) {
        return Ok(vec![PodInterface {
            name: DEFAULT_INTERFACE.to_owned(),
            device: MODELS[0].1,
            mac: derived_mac(namespace, name, DEFAULT_INTERFACE),
            ports: Vec::new(),
        }]);
    }
    Ok(ifaces
        .into_iter()
        .map(|i| PodInterface {
            device: MODELS.iter().find(|(m, _)| Some(*m) == i.model.as_deref()).map_or(MODELS[0].1, |(_, d)| d),
            mac: i.mac_address.as_deref().and_then(Mac::parse).unwrap_or_else(|| derived_mac(namespace, name, &i.name)),
            ports: i
                .ports
                .iter()
                .filter_map(|p| {
                    Some(GuestPort {
                        name: p.name.clone(),
                        protocol: if p.protocol.as_deref() == Some("UDP") { Protocol::Udp } else { Protocol::Tcp },
                        port: u16::try_from(p.port).ok()?,
                    })
                })
                .collect(),
            name: i.name,
        })
        .collect())
}

/// The binding keys an interface sets (modelled and not).
fn bindings(i: &Interface) -> Vec<&str> {
    let mut b: Vec<&str> = REFUSED_BINDINGS.iter().copied().filter(|k| i.extra.contains_key(*k)).collect();
    if i.masquerade.is_some() {
        b.push("masquerade");
    }
    b
}

/// Admission rules of `spec.domain.devices.interfaces` and `spec.networks` (see the module
/// docs), under `prefix` (`spec` or `spec.template.spec`).
#[must_use]
pub fn validate(spec: &VirtualMachineInstanceSpec, prefix: &str) -> Vec<Cause> {
    let (ifaces, nets) = match decode(spec, prefix) {
        Ok(x) => x,
        Err(c) => return vec![c],
    };
    let mut causes = Vec::new();
    let ifaces_field = format!("{prefix}.domain.devices.interfaces");
    let mut pod_networks = 0;
    let mut seen = HashSet::new();
    for (i, n) in nets.iter().enumerate() {
        let field = format!("{prefix}.networks[{i}]");
        if !seen.insert(n.name.as_str()) {
            causes.push(Cause::new(
                CauseType::Duplicate,
                format!("{field}.name"),
                format!("Network with name {:?} already exists, every network must have a unique name", n.name),
            ));
        }
        let mut sources: Vec<&str> = n.extra.keys().map(String::as_str).collect();
        if n.pod.is_some() {
            sources.push("pod");
            pod_networks += 1;
        }
        match sources.as_slice() {
            ["pod"] => {}
            [] => causes.push(Cause::new(
                CauseType::Required,
                field.clone(),
                format!("network {:?} needs a source; the one supported here is pod: {{}}", n.name),
            )),
            [one] => causes.push(Cause::new(
                CauseType::NotSupported,
                format!("{field}.{one}"),
                format!("{one} networks are not supported here; the only network source supported is pod: {{}} ({SUPPORTED})"),
            )),
            many => causes.push(Cause::new(
                CauseType::Invalid,
                field.clone(),
                format!("should have only one network type, found {}; use pod: {{}}", many.join(", ")),
            )),
        }
        for key in n.pod.iter().flat_map(BTreeMap::keys) {
            causes.push(Cause::new(
                CauseType::NotSupported,
                format!("{field}.pod.{key}"),
                format!("pod.{key} is not supported here: QEMU user-mode networking gives the guest {GUEST_IP} on 10.0.2.0/24; remove it"),
            ));
        }
        if !ifaces.iter().any(|x| x.name == n.name) {
            let f = format!("{field}.name");
            causes.push(Cause::new(CauseType::Required, f.clone(), format!("{f} '{}' not found.", n.name)));
        }
    }
    if pod_networks > 1 {
        causes.push(Cause::new(
            CauseType::Invalid,
            format!("{prefix}.networks"),
            format!("more than one interface is connected to a pod network in {prefix}.networks"),
        ));
    }
    let mut seen = HashSet::new();
    for (i, x) in ifaces.iter().enumerate() {
        let field = format!("{ifaces_field}[{i}]");
        causes.extend(interface(x, &field, &nets));
        if !seen.insert(x.name.as_str()) {
            causes.push(Cause::new(
                CauseType::Duplicate,
                format!("{field}.name"),
                "Only one interface can be connected to one specific network",
            ));
        }
    }
    causes
}

/// Longest interface name: it is shown in status and Redfish URIs, and needs no more.
pub const INTERFACE_NAME_MAX: usize = 63;

/// The rules of one interface at `field`.
fn interface(x: &Interface, field: &str, nets: &[Network]) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name_ok = !x.name.is_empty() && x.name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
    if !name_ok {
        causes.push(Cause::new(
            CauseType::Invalid,
            format!("{field}.name"),
            "Network interface name can only contain alphabetical characters, numbers, dashes (-) or underscores (_)",
        ));
    } else if x.name.len() > INTERFACE_NAME_MAX {
        causes.push(Cause::new(
            CauseType::TooLong,
            format!("{field}.name"),
            format!("interface name is {} characters long; it must be no more than {INTERFACE_NAME_MAX}", x.name.len()),
        ));
    }
    if !nets.iter().any(|n| n.name == x.name) {
        let f = format!("{field}.name");
        causes.push(Cause::new(CauseType::Invalid, f.clone(), format!("{f} '{}' not found.", x.name)));
    }
    match bindings(x).as_slice() {
        [] | ["masquerade"] => {}
        [one] => causes.push(Cause::new(
            CauseType::NotSupported,
            format!("{field}.{one}"),
            format!("the {one} binding is not supported here; use {SUPPORTED}"),
        )),
        many => causes.push(Cause::new(
            CauseType::Invalid,
            field,
            format!("should only have one binding method, found {}; use {SUPPORTED}", many.join(", ")),
        )),
    }
    if let Some(m) = x.model.as_deref() {
        if !MODELS.iter().any(|(k, _)| *k == m) {
            let known: Vec<&str> = MODELS.iter().map(|(k, _)| *k).collect();
            causes.push(Cause::new(
                CauseType::NotSupported,
                format!("{field}.model"),
                format!("interface {field}.name uses model {m} that is not supported; use one of {}", known.join(", ")),
            ));
        }
    }
    if let Some(mac) = x.mac_address.as_deref().filter(|m| !m.is_empty()) {
        match Mac::parse(mac) {
            None => causes.push(Cause::new(
                CauseType::Invalid,
                format!("{field}.macAddress"),
                format!("interface {field}.name has malformed MAC address ({mac}); write six hex pairs, e.g. 02:00:00:00:00:01"),
            )),
            Some(m) if m.0[0] & 1 == 1 => causes.push(Cause::new(
                CauseType::Invalid,
                format!("{field}.macAddress"),
                format!("interface {field}.name has a multicast MAC address ({mac}); the first byte must be even"),
            )),
            Some(_) => {}
        }
    }
    causes.extend(ports(&x.ports, field));
    causes
}

/// The rules of an interface's `ports`.
fn ports(ports: &[Port], field: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let mut names = HashSet::new();
    let mut pairs = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let pf = format!("{field}.ports[{i}]");
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            if !names.insert(n) {
                causes.push(Cause::new(CauseType::Duplicate, format!("{pf}.name"), format!("Duplicate name of the port: {n}")));
            }
            if !valid_port_name(n) {
                causes.push(Cause::new(
                    CauseType::Invalid,
                    format!("{pf}.name"),
                    format!("Invalid name of the port: {n} (an IANA service name: at most 15 lower case letters, digits and '-', with a letter)"),
                ));
            }
        }
        if p.port == 0 {
            causes.push(Cause::new(CauseType::Required, pf.clone(), "Port field is mandatory."));
        } else if !(1..=65535).contains(&p.port) {
            causes.push(Cause::new(CauseType::Invalid, pf.clone(), "Port field must be in range 0 < x < 65536."));
        }
        let protocol = match p.protocol.as_deref() {
            None | Some("" | "TCP") => Some(Protocol::Tcp),
            Some("UDP") => Some(Protocol::Udp),
            Some(_) => {
                causes.push(Cause::new(CauseType::Invalid, format!("{pf}.protocol"), "Unknown protocol, only TCP or UDP allowed"));
                None
            }
        };
        if let Some(proto) = protocol {
            if !pairs.insert((proto, p.port)) {
                causes.push(Cause::new(
                    CauseType::Duplicate,
                    pf.clone(),
                    format!("port {} {} is listed twice on this interface; list each port once", proto.as_str(), p.port),
                ));
            }
        }
    }
    causes
}

/// Kubernetes' `IsValidPortName`: an IANA service name.
fn valid_port_name(n: &str) -> bool {
    let b = n.as_bytes();
    n.len() <= 15
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.iter().any(u8::is_ascii_lowercase)
        && !n.starts_with('-')
        && !n.ends_with('-')
        && !n.contains("--")
}

#[cfg(test)]
#[path = "network_tests.rs"]
mod tests;
