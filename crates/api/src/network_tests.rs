#![allow(clippy::unwrap_used)]
use super::*;
use serde_json::json;

fn spec(ifaces: &Value, nets: &Value) -> VirtualMachineInstanceSpec {
    serde_json::from_value(json!({"domain": {"devices": {"interfaces": ifaces}}, "networks": nets})).unwrap()
}

/// The fields of the causes, for assertions.
fn fields(c: &[Cause]) -> Vec<&str> {
    c.iter().map(|c| c.field.as_str()).collect()
}

#[test]
fn masquerade_or_no_binding_on_a_pod_network_is_admitted_and_resolved() {
    let s = spec(
        &json!([{"name": "default", "masquerade": {}, "model": "e1000e", "macAddress": "52-54-00-AA-BB-CC",
                 "ports": [{"name": "ssh", "port": 22}, {"port": 53, "protocol": "UDP"}]}]),
        &json!([{"name": "default", "pod": {}}]),
    );
    assert_eq!(validate(&s, "spec"), []);
    let p = pod_interfaces(&s, "ns", "vm").unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].device, p[0].mac.to_string()), ("e1000e", "52:54:00:aa:bb:cc".to_owned()));
    assert_eq!(
        p[0].ports,
        [
            GuestPort { name: Some("ssh".into()), protocol: Protocol::Tcp, port: 22 },
            GuestPort { name: None, protocol: Protocol::Udp, port: 53 }
        ]
    );
    // No binding: KubeVirt's default binding on the pod network, virtio by default.
    let s = spec(&json!([{"name": "n"}]), &json!([{"name": "n", "pod": {}}]));
    let p = pod_interfaces(&s, "ns", "vm").unwrap();
    assert_eq!((p[0].device, p[0].mac), ("virtio-net-pci", derived_mac("ns", "vm", "n")));
}

#[test]
fn without_interfaces_and_networks_the_default_pod_interface_is_attached_unless_turned_off() {
    let s: VirtualMachineInstanceSpec = serde_json::from_value(json!({"domain": {"devices": {}}})).unwrap();
    let p = pod_interfaces(&s, "ns", "vm").unwrap();
    assert_eq!(p.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), [DEFAULT_INTERFACE]);
    assert_eq!(p[0].mac, derived_mac("ns", "vm", DEFAULT_INTERFACE));
    let s: VirtualMachineInstanceSpec = serde_json::from_value(json!({"domain": {"devices": {"autoattachPodInterface": false}}})).unwrap();
    assert_eq!(pod_interfaces(&s, "ns", "vm").unwrap(), []);
}

#[test]
fn the_derived_mac_is_stable_locally_administered_unicast_and_per_vm_and_interface() {
    let m = derived_mac("ns", "vm", "default");
    assert_eq!(m, derived_mac("ns", "vm", "default"), "stable");
    assert_eq!(m.0[0], 0x02, "locally administered, unicast");
    assert_ne!(m, derived_mac("ns", "vm2", "default"));
    assert_ne!(m, derived_mac("ns2", "vm", "default"));
    assert_ne!(m, derived_mac("ns", "vm", "eth1"));
    assert_eq!(Mac::parse(&m.to_string()), Some(m), "its text parses back");
}

#[test]
fn mac_addresses_parse_as_go_does_for_six_bytes() {
    assert_eq!(Mac::parse("02:00:00:0a:0B:ff"), Some(Mac([2, 0, 0, 0x0a, 0x0b, 0xff])));
    assert_eq!(Mac::parse("02-00-00-0a-0b-ff"), Some(Mac([2, 0, 0, 0x0a, 0x0b, 0xff])));
    for bad in
        ["", "02:00:00:00:00", "02:00:00:00:00:00:00", "02:00:00:00:00:0g", "020:00:00:00:00:0", "02:00-00:00:00:00", "0x:00:00:00:00:00,a"]
    {
        assert_eq!(Mac::parse(bad), None, "{bad}");
    }
}

#[test]
fn other_bindings_and_network_sources_are_refused_naming_what_is_supported() {
    for binding in ["bridge", "sriov", "macvtap", "passt", "slirp"] {
        let s = spec(&json!([{"name": "n", binding: {}}]), &json!([{"name": "n", "pod": {}}]));
        let c = validate(&s, "spec.template.spec");
        assert_eq!(fields(&c), [format!("spec.template.spec.domain.devices.interfaces[0].{binding}")], "{binding}");
        assert_eq!(c[0].kind, "FieldValueNotSupported");
        assert!(c[0].message.contains("masquerade"), "{}", c[0].message);
    }
    let s = spec(&json!([{"name": "n", "binding": {"name": "passt"}}]), &json!([{"name": "n", "pod": {}}]));
    assert_eq!(fields(&validate(&s, "spec")), ["spec.domain.devices.interfaces[0].binding"]);
    let s = spec(&json!([{"name": "n", "masquerade": {}, "bridge": {}}]), &json!([{"name": "n", "pod": {}}]));
    assert_eq!(fields(&validate(&s, "spec")), ["spec.domain.devices.interfaces[0]"]);
    let s = spec(&json!([{"name": "n", "masquerade": {}}]), &json!([{"name": "n", "multus": {"networkName": "blue"}}]));
    let c = validate(&s, "spec");
    assert_eq!(fields(&c), ["spec.networks[0].multus"]);
    assert!(c[0].message.contains("pod: {}"), "{}", c[0].message);
    let s = spec(&json!([{"name": "n"}]), &json!([{"name": "n", "pod": {"vmNetworkCIDR": "10.1.0.0/24"}}]));
    assert_eq!(fields(&validate(&s, "spec")), ["spec.networks[0].pod.vmNetworkCIDR"]);
    let s = spec(&json!([{"name": "n"}]), &json!([{"name": "n"}]));
    assert_eq!(fields(&validate(&s, "spec")), ["spec.networks[0]"]);
}

#[test]
fn interfaces_and_networks_must_pair_up_once_each_as_kubevirt_words_it() {
    let s = spec(&json!([{"name": "a"}]), &json!([{"name": "b", "pod": {}}]));
    let c = validate(&s, "spec");
    assert_eq!(fields(&c), ["spec.networks[0].name", "spec.domain.devices.interfaces[0].name"]);
    assert_eq!(c[0].message, "spec.networks[0].name 'b' not found.");
    assert_eq!(c[1].message, "spec.domain.devices.interfaces[0].name 'a' not found.");
    let s = spec(&json!([{"name": "a"}, {"name": "a"}]), &json!([{"name": "a", "pod": {}}, {"name": "a", "pod": {}}]));
    let c = validate(&s, "spec");
    assert!(c.iter().any(|c| c.field == "spec.networks[1].name" && c.kind == "FieldValueDuplicate"), "{c:?}");
    assert!(c.iter().any(|c| c.field == "spec.domain.devices.interfaces[1].name" && c.kind == "FieldValueDuplicate"), "{c:?}");
    assert!(c.iter().any(|c| c.field == "spec.networks" && c.message.contains("more than one")), "two pod networks: {c:?}");
    // An interface whose network is missing, when there are networks at all: no auto-attach.
    let s = spec(&json!([]), &json!([{"name": "a", "pod": {}}]));
    assert_eq!(fields(&validate(&s, "spec")), ["spec.networks[0].name"]);
    assert!(pod_interfaces(&s, "ns", "vm").is_err(), "refused at start too");
}

#[test]
fn names_macs_models_and_ports_are_checked() {
    let s = spec(
        &json!([{"name": "a,b=c", "model": "ne2k_pci", "macAddress": "02:00:00:00:00:zz",
                 "ports": [{"port": 0}, {"port": 70000}, {"port": 22, "protocol": "SCTP"}, {"name": "ssh", "port": 22}, {"name": "ssh", "port": 23},
                           {"port": 22, "protocol": "TCP"}, {"name": "Bad_Name", "port": 24}]}]),
        &json!([{"name": "a,b=c", "pod": {}}]),
    );
    let c = validate(&s, "spec");
    let p = "spec.domain.devices.interfaces[0]";
    let want = [
        format!("{p}.name"),
        format!("{p}.model"),
        format!("{p}.macAddress"),
        format!("{p}.ports[0]"),
        format!("{p}.ports[1]"),
        format!("{p}.ports[2].protocol"),
        format!("{p}.ports[4].name"),
        format!("{p}.ports[5]"),
        format!("{p}.ports[6].name"),
    ];
    assert_eq!(fields(&c), want, "{c:#?}");
    assert!(c[1].message.contains("virtio, e1000, e1000e, rtl8139"), "{}", c[1].message);
    let s = spec(&json!([{"name": "n", "macAddress": "03:00:00:00:00:01"}]), &json!([{"name": "n", "pod": {}}]));
    assert_eq!(fields(&validate(&s, "spec")), ["spec.domain.devices.interfaces[0].macAddress"], "multicast");
    let s = spec(&json!([{"name": "n", "ports": [{"port": "22"}]}]), &json!([{"name": "n", "pod": {}}]));
    assert_eq!(fields(&validate(&s, "spec")), ["spec.domain.devices.interfaces[0].ports[0].port"], "not a number");
}

#[test]
fn the_port_forwards_annotation_reads_back() {
    let f = PortForward {
        interface: "default".into(),
        name: Some("ssh".into()),
        protocol: Protocol::Tcp,
        port: 22,
        host_ip: "127.0.0.1".into(),
        host_port: 40022,
    };
    let text = serde_json::to_string(std::slice::from_ref(&f)).unwrap();
    assert_eq!(text, r#"[{"interface":"default","name":"ssh","protocol":"TCP","port":22,"hostIP":"127.0.0.1","hostPort":40022}]"#);
    let a = BTreeMap::from([(crate::annotations::PORT_FORWARDS.to_owned(), text)]);
    assert_eq!(port_forwards(&a), [f]);
    assert_eq!(port_forwards(&BTreeMap::new()), []);
}
