//! The VM's network as `virtplug vm get` prints it, and `virtplug vm port`: where a guest port
//! is forwarded on the VM's node (the agent's [`api::annotations::PORT_FORWARDS`]).

use anyhow::bail;

use api::network::{port_forwards, PortForward, Protocol};
use api::VirtualMachineInstance;
use kube::ResourceExt;

/// `HOST:PORT` of a forward.
fn address(f: &PortForward) -> String {
    format!("{}:{}", f.host_ip, f.host_port)
}

/// The lines `vm get` prints: one per interface (name, MAC, address), one per forwarded port.
#[must_use]
pub fn lines(vmi: Option<&VirtualMachineInstance>) -> String {
    let Some(vmi) = vmi else { return "Network: not running".to_owned() };
    let mut out = Vec::new();
    for i in vmi.status.iter().flat_map(|s| &s.interfaces) {
        let v = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".to_owned());
        out.push(format!("Interface {}: mac {}, ip {}", v(&i.name), v(&i.mac), v(&i.ip_address)));
    }
    for f in port_forwards(vmi.annotations()) {
        let name = f.name.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
        out.push(format!("Port {}/{}{name} of {}: {}", f.port, f.protocol.as_str(), f.interface, address(&f)));
    }
    if out.is_empty() {
        "Network: none".to_owned()
    } else {
        out.join("\n")
    }
}

/// The forward of guest port `port`/`protocol` of `vmi` (named `name`).
///
/// # Errors
/// When the port is not forwarded, saying which are and how to forward it.
pub fn find(vmi: &VirtualMachineInstance, name: &str, port: u16, protocol: Protocol) -> anyhow::Result<PortForward> {
    let all = port_forwards(vmi.annotations());
    if let Some(f) = all.iter().find(|f| f.port == port && f.protocol == protocol) {
        return Ok(f.clone());
    }
    let listed: Vec<String> = all.iter().map(|f| format!("{}/{}", f.port, f.protocol.as_str())).collect();
    bail!(
        "port {port}/{} of VM {name} is not forwarded (forwarded: {}); list it in \
         spec.template.spec.domain.devices.interfaces[].ports and restart the VM",
        protocol.as_str(),
        if listed.is_empty() { "none".to_owned() } else { listed.join(", ") }
    )
}

/// What `vm port` prints: `HOST:PORT`, and the forward as a document for `-o json|yaml`.
#[must_use]
pub fn report(f: &PortForward) -> (String, serde_json::Value) {
    (address(f), serde_json::to_value(f).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn vmi(annotations: &serde_json::Value, status: &serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "annotations": annotations}, "spec": {"domain": {}}, "status": status}))
        .unwrap()
    }

    #[test]
    fn get_prints_interfaces_and_forwards_and_port_finds_one() {
        let fw = r#"[{"interface":"default","name":"ssh","protocol":"TCP","port":22,"hostIP":"127.0.0.1","hostPort":40022}]"#;
        let v = vmi(
            &json!({api::annotations::PORT_FORWARDS: fw}),
            &json!({"interfaces": [{"name": "default", "mac": "02:00:00:00:00:01", "ipAddress": "10.0.2.15"}]}),
        );
        assert_eq!(
            lines(Some(&v)),
            "Interface default: mac 02:00:00:00:00:01, ip 10.0.2.15\nPort 22/TCP (ssh) of default: 127.0.0.1:40022"
        );
        assert_eq!(report(&find(&v, "v", 22, Protocol::Tcp).unwrap()).0, "127.0.0.1:40022");
        let e = find(&v, "v", 22, Protocol::Udp).unwrap_err().to_string();
        assert!(e.contains("port 22/UDP of VM v is not forwarded (forwarded: 22/TCP)"), "{e}");
        assert_eq!(lines(Some(&vmi(&json!({}), &json!({})))), "Network: none");
        assert_eq!(lines(None), "Network: not running");
    }
}
