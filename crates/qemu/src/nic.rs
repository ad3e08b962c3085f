//! The guest's network interfaces: QEMU user-mode networking (slirp) behind a NIC, with the
//! interface's `ports` forwarded from the host's loopback.
//!
//! # Command line
//! Interface `i` is `-netdev user,id=netI[,restrict=on],hostfwd=PROTO:127.0.0.1:0-:PORT...` and
//! `-device {"driver": MODEL, "id": "netI", "netdev": "netI", "mac": MAC, "romfile": ""}`.
//! Nothing the spec writes reaches either as text: the ids are this crate's, the model is one
//! of [`api::network::MODELS`], the MAC is printed from its six bytes, the ports are `u16`s.
//! No option ROM (`romfile: ""`): there is no PXE over user-mode networking worth booting, and
//! the machine may not have iPXE's ROMs at all (QEMU refuses to start without the default one).
//!
//! # Host ports
//! Every forward asks for host port 0: the kernel picks a free ephemeral port when QEMU binds
//! it, so two VMs (or another program) can never race for one. Which port each forward got is
//! QEMU's to say ([`host_forwards`]: `info usernet`), after a start as after an agent restart.
//!
//! # Caveats
//! `restrict=on` (the node's default) cuts the guest off from the host and the outside: only the
//! forwards reach it. Without it the guest can open connections out through QEMU, and to the
//! host's own loopback services at 10.0.2.2, which KubeVirt's pod network would not allow.

use api::network::{Mac, PodInterface, Protocol};
use serde_json::json;

use crate::cmdline::CmdlineError;
use crate::opts::Opts;
use crate::Machine;

/// The host address forwards listen on.
pub const HOST_IP: &str = "127.0.0.1";

/// One guest NIC with its user-mode network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    /// The QEMU device (`virtio-net-pci`, `e1000`, ...).
    pub device: &'static str,
    pub mac: Mac,
    /// The guest ports forwarded from the host's loopback.
    pub forwards: Vec<(Protocol, u16)>,
    /// `restrict=on`: the guest reaches nothing but what is forwarded to it.
    pub restrict: bool,
}

/// The netdev and device id of the interface at `index`.
#[must_use]
pub fn id(index: usize) -> String {
    format!("net{index}")
}

impl Nic {
    /// `-netdev` and `-device` of the NIC at `index`.
    #[must_use]
    pub fn args(&self, index: usize) -> Vec<String> {
        let id = id(index);
        let mut netdev = Opts::implied("user").set("id", &id);
        if self.restrict {
            netdev = netdev.set("restrict", "on");
        }
        for (proto, port) in &self.forwards {
            netdev = netdev.set("hostfwd", &format!("{}:{HOST_IP}:0-:{port}", proto.qemu()));
        }
        let dev = json!({"driver": self.device, "id": id, "netdev": id, "mac": self.mac.to_string(), "romfile": ""});
        vec!["-netdev".to_owned(), netdev.build(), "-device".to_owned(), dev.to_string()]
    }
}

/// The NICs of VMI `namespace/name` ([`api::network::pod_interfaces`]), in interface order.
///
/// # Errors
/// What admission refuses, for a spec that did not pass it: the first cause's field and all
/// the messages.
pub fn from_vmi(
    spec: &api::kubevirt::VirtualMachineInstanceSpec,
    namespace: &str,
    name: &str,
    restrict: bool,
) -> Result<Vec<Nic>, CmdlineError> {
    let ifaces = api::network::pod_interfaces(spec, namespace, name).map_err(|causes| CmdlineError::Invalid {
        field: causes.first().map(|c| c.field.clone()).unwrap_or_default(),
        message: causes.iter().map(|c| c.message.as_str()).collect::<Vec<_>>().join("; "),
    })?;
    Ok(ifaces.iter().map(|i| nic(i, restrict)).collect())
}

fn nic(i: &PodInterface, restrict: bool) -> Nic {
    Nic { device: i.device, mac: i.mac, forwards: i.ports.iter().map(|p| (p.protocol, p.port)).collect(), restrict }
}

/// A host forward as QEMU reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostForward {
    /// The netdev it belongs to ([`id`]).
    pub netdev: String,
    pub protocol: Protocol,
    pub host_port: u16,
    pub guest_port: u16,
}

/// Parses HMP's `info usernet` (libslirp's connection table, one per netdev under a
/// `Hub -1 (ID):` heading): its `TCP[HOST_FORWARD]`/`UDP[HOST_FORWARD]` rows, whose columns are
/// FD, source address, source (host) port, destination address, destination (guest) port.
#[must_use]
pub fn parse_usernet(text: &str) -> Vec<HostForward> {
    let mut out = Vec::new();
    let mut netdev = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_suffix("):") {
            netdev = rest.rsplit_once('(').map(|(_, id)| id.to_owned());
            continue;
        }
        let cols: Vec<&str> = line.split_whitespace().collect();
        let protocol = match cols.first() {
            Some(&"TCP[HOST_FORWARD]") => Protocol::Tcp,
            Some(&"UDP[HOST_FORWARD]") => Protocol::Udp,
            _ => continue,
        };
        let (Some(netdev), Some(host), Some(guest)) = (&netdev, cols.get(3), cols.get(5)) else { continue };
        if let (Ok(host_port), Ok(guest_port)) = (host.parse(), guest.parse()) {
            out.push(HostForward { netdev: netdev.clone(), protocol, host_port, guest_port });
        }
    }
    out
}

/// The host forwards QEMU holds, from `info usernet` over QMP.
///
/// # Errors
/// The QMP error.
pub async fn host_forwards(machine: &Machine) -> Result<Vec<HostForward>, crate::QmpError> {
    let r = machine.execute("human-monitor-command", json!({"command-line": "info usernet"})).await?;
    Ok(parse_usernet(r.as_str().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn a_nic_is_a_user_netdev_with_loopback_forwards_and_a_device_without_rom() {
        let n = Nic {
            device: "virtio-net-pci",
            mac: Mac([2, 1, 2, 3, 4, 0xab]),
            forwards: vec![(Protocol::Tcp, 22), (Protocol::Udp, 53)],
            restrict: true,
        };
        let a = n.args(0);
        assert_eq!(a[..3], ["-netdev", "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:0-:22,hostfwd=udp:127.0.0.1:0-:53", "-device"]);
        let dev: Value = serde_json::from_str(&a[3]).unwrap();
        assert_eq!(dev, json!({"driver": "virtio-net-pci", "id": "net0", "netdev": "net0", "mac": "02:01:02:03:04:ab", "romfile": ""}));
        crate::cmdline::audit(&a).unwrap();
        let open = Nic { restrict: false, forwards: vec![], ..n };
        assert_eq!(open.args(1)[1], "user,id=net1");
    }

    #[test]
    fn the_audit_refuses_netdev_options_and_forwards_this_crate_never_writes() {
        for netdev in [
            "user,id=net0,hostfwd=tcp:0.0.0.0:0-:22",
            "user,id=net0,hostfwd=tcp:127.0.0.1:2222-:22",
            "user,id=net0,guestfwd=tcp:10.0.2.100:1-cmd:sh",
            "user,id=net0,smb=/",
            "user,id=net0,id=net1",
            "tap,id=net0",
        ] {
            let args: Vec<String> = ["-netdev", netdev].map(str::to_owned).into();
            assert!(crate::cmdline::audit(&args).is_err(), "{netdev}");
        }
    }

    #[test]
    fn nics_come_from_the_interfaces_with_their_ports_and_refuse_what_admission_refuses() {
        let spec = |v: Value| serde_json::from_value::<api::kubevirt::VirtualMachineInstanceSpec>(v).unwrap();
        let s = spec(json!({"domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}, "model": "rtl8139",
            "ports": [{"port": 8022}]}]}}, "networks": [{"name": "default", "pod": {}}]}));
        let n = from_vmi(&s, "ns", "vm", true).unwrap();
        assert_eq!(
            n,
            [Nic {
                device: "rtl8139",
                mac: api::network::derived_mac("ns", "vm", "default"),
                forwards: vec![(Protocol::Tcp, 8022)],
                restrict: true
            }]
        );
        let s = spec(
            json!({"domain": {"devices": {"interfaces": [{"name": "default", "bridge": {}}]}}, "networks": [{"name": "default", "pod": {}}]}),
        );
        let e = from_vmi(&s, "ns", "vm", true).unwrap_err().to_string();
        assert!(e.starts_with("spec.domain.devices.interfaces[0].bridge: "), "{e}");
    }

    #[test]
    fn info_usernet_gives_the_host_port_of_each_forward() {
        // QEMU 10.0.2's output, measured, with a second netdev and a guest connection added.
        let text = "Hub -1 (net0):\r\n  Protocol[State]    FD  Source Address  Port   Dest. Address  Port RecvQ SendQ\r\n  \
                    TCP[HOST_FORWARD]   9       127.0.0.1 45911       10.0.2.15  8022     0     0\r\n  \
                    UDP[HOST_FORWARD]   8       127.0.0.1 37386       10.0.2.15    53     0     0\r\n  \
                    TCP[ESTABLISHED]   12       127.0.0.1 45911       10.0.2.15  8022     0     0\r\n\
                    Hub -1 (net1):\r\n  Protocol[State]    FD  Source Address  Port   Dest. Address  Port RecvQ SendQ\r\n  \
                    TCP[HOST_FORWARD]  10       127.0.0.1 40000       10.0.2.15    22     0     0\r\n";
        let f = parse_usernet(text);
        let fw = |n: &str, protocol, host_port, guest_port| HostForward { netdev: n.into(), protocol, host_port, guest_port };
        assert_eq!(f, [fw("net0", Protocol::Tcp, 45911, 8022), fw("net0", Protocol::Udp, 37386, 53), fw("net1", Protocol::Tcp, 40000, 22)]);
        assert_eq!(parse_usernet(""), []);
        assert_eq!(parse_usernet("TCP[HOST_FORWARD] 9 127.0.0.1 1 10.0.2.15 2 0 0"), [], "a row outside a netdev is not guessed at");
    }
}
