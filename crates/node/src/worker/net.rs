//! The VMI's network interfaces as the agent reports them, after every start or adoption:
//! `status.interfaces` (KubeVirt's fields, what the agent knows: name, MAC, the address QEMU's
//! user-mode network leases) and where each forwarded port is on this node
//! ([`api::annotations::PORT_FORWARDS`]).
//!
//! # Guarantees
//! - The host ports are QEMU's own answer (`info usernet`, [`qemu::nic::host_forwards`]), never a
//!   remembered value: after an agent restart they are read again.
//! - Written only when they differ from what the VMI already says.
//! - Reported before the VMI is set `Running` at a start, so a client that sees `Running` finds
//!   its forwards; a VMI whose QEMU exited loses the annotation (the ports are closed).
//!
//! The annotation is a single-key write without a resourceVersion ([`client::blind_patch`], the
//! marked exception to `client::update`): only this agent writes it.

use kube::api::Api;
use kube::ResourceExt;

use api::annotations::PORT_FORWARDS;
use api::kubevirt::{InterfaceStatus, VirtualMachineInstanceStatus};
use api::network::{PodInterface, PortForward, GUEST_IP, INFO_SOURCE_DOMAIN};
use api::VirtualMachineInstance;
use qemu::nic::HostForward;
use qemu::Machine;

use crate::config::Shared;

/// `status.interfaces` for `ifaces`.
fn statuses(ifaces: &[PodInterface]) -> Vec<InterfaceStatus> {
    ifaces
        .iter()
        .map(|i| InterfaceStatus {
            name: Some(i.name.clone()),
            mac: Some(i.mac.to_string()),
            ip_address: Some(GUEST_IP.to_owned()),
            ip_addresses: vec![GUEST_IP.to_owned()],
            info_source: Some(INFO_SOURCE_DOMAIN.to_owned()),
            ..InterfaceStatus::default()
        })
        .collect()
}

/// The forwards of `ifaces` that QEMU holds (`host`), in the spec's order.
fn forwards(ifaces: &[PodInterface], host: &[HostForward]) -> Vec<PortForward> {
    let mut out = Vec::new();
    for (index, i) in ifaces.iter().enumerate() {
        let netdev = qemu::nic::id(index);
        for p in &i.ports {
            let Some(h) = host.iter().find(|h| h.netdev == netdev && h.protocol == p.protocol && h.guest_port == p.port) else { continue };
            out.push(PortForward {
                interface: i.name.clone(),
                name: p.name.clone(),
                protocol: p.protocol,
                port: p.port,
                host_ip: qemu::nic::HOST_IP.to_owned(),
                host_port: h.host_port,
            });
        }
    }
    out
}

fn api_of(shared: &Shared, vmi: &VirtualMachineInstance) -> Api<VirtualMachineInstance> {
    Api::namespaced(shared.client.clone(), &vmi.namespace().unwrap_or_default())
}

/// Sets the annotation to `value` (removes it for `None`) unless it already is.
async fn annotate(shared: &Shared, vmi: &VirtualMachineInstance, value: Option<&str>) {
    if vmi.annotations().get(PORT_FORWARDS).map(String::as_str) == value {
        return;
    }
    if let Err(e) = client::blind_patch(&api_of(shared, vmi), &vmi.name_any(), client::MetaKey::Annotation, PORT_FORWARDS, value).await {
        tracing::warn!("cannot record the forwarded ports on the VMI: {e}");
    }
}

/// Reports the interfaces of `vmi`, whose QEMU is `machine`.
pub(super) async fn report(shared: &Shared, vmi: &VirtualMachineInstance, machine: &Machine) {
    // A spec that does not resolve never started (launch refuses it); an adopted QEMU of such a
    // spec has nothing to report.
    let Ok(ifaces) = api::network::pod_interfaces(&vmi.spec, &vmi.namespace().unwrap_or_default(), &vmi.name_any()) else { return };
    let host = if ifaces.iter().any(|i| !i.ports.is_empty()) {
        match qemu::nic::host_forwards(machine).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("cannot ask QEMU for its forwarded ports: {e}");
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    let wanted = statuses(&ifaces);
    if vmi.status.as_ref().map_or(&[][..], |s| &s.interfaces[..]) != wanted.as_slice() {
        let r = client::update_status(&api_of(shared, vmi), &vmi.name_any(), |v: &mut VirtualMachineInstance| {
            v.status.get_or_insert_with(VirtualMachineInstanceStatus::default).interfaces.clone_from(&wanted);
        })
        .await;
        if let Err(e) = r {
            tracing::warn!("cannot report the VMI's interfaces: {e}");
        }
    }
    let forwards = forwards(&ifaces, &host);
    let text = (!forwards.is_empty()).then(|| serde_json::to_string(&forwards).unwrap_or_default());
    annotate(shared, vmi, text.as_deref()).await;
}

/// QEMU is gone: its forwarded ports with it. `vmi` may predate the annotation (the last
/// version the worker saw), so a VMI with ports loses it whatever `vmi` says.
pub(super) async fn forget(shared: &Shared, vmi: &VirtualMachineInstance) {
    let Ok(ifaces) = api::network::pod_interfaces(&vmi.spec, &vmi.namespace().unwrap_or_default(), &vmi.name_any()) else { return };
    if ifaces.iter().all(|i| i.ports.is_empty()) {
        return;
    }
    if let Err(e) = client::blind_patch(&api_of(shared, vmi), &vmi.name_any(), client::MetaKey::Annotation, PORT_FORWARDS, None).await {
        tracing::warn!("cannot remove the forwarded ports from the VMI: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::network::{GuestPort, Mac, Protocol};

    #[test]
    fn each_spec_port_is_reported_at_the_host_port_qemu_bound_for_its_netdev() {
        let port = |name: Option<&str>, protocol, port| GuestPort { name: name.map(str::to_owned), protocol, port };
        let ifaces = [PodInterface {
            name: "default".into(),
            device: "virtio-net-pci",
            mac: Mac([2, 0, 0, 0, 0, 1]),
            ports: vec![port(Some("ssh"), Protocol::Tcp, 22), port(None, Protocol::Udp, 22), port(None, Protocol::Tcp, 80)],
        }];
        let host = [
            HostForward { netdev: "net0".into(), protocol: Protocol::Udp, host_port: 40001, guest_port: 22 },
            HostForward { netdev: "net1".into(), protocol: Protocol::Tcp, host_port: 40009, guest_port: 22 },
            HostForward { netdev: "net0".into(), protocol: Protocol::Tcp, host_port: 40000, guest_port: 22 },
        ];
        let f = forwards(&ifaces, &host);
        let got: Vec<_> = f.iter().map(|f| (f.name.as_deref(), f.protocol, f.port, f.host_ip.as_str(), f.host_port)).collect();
        // Port 80 has no forward in QEMU (an adopted QEMU of an older spec): it is not invented.
        assert_eq!(got, [(Some("ssh"), Protocol::Tcp, 22, "127.0.0.1", 40000), (None, Protocol::Udp, 22, "127.0.0.1", 40001)]);
        let s = statuses(&ifaces);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!([{"name": "default", "mac": "02:00:00:00:00:01", "ipAddress": "10.0.2.15", "ipAddresses": ["10.0.2.15"], "infoSource": "domain"}])
        );
    }
}
