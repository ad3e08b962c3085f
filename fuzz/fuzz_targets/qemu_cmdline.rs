//! The QEMU command line from an arbitrary VMI spec (as an API server without virtplug's
//! admission could store it): building it never panics, and every option argument parses back
//! into exactly the options this crate writes — no string from the spec adds a key.
#![no_main]

use std::path::{Path, PathBuf};

use qemu::accel::Resolved;
use qemu::bootfiles::AllowedDirs;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(spec) = serde_json::from_slice::<api::kubevirt::VirtualMachineInstanceSpec>(data) else { return };
    // Names and paths from the spec itself: the volume name becomes part of the source path, as
    // emptyDisk image names do; a volume whose name has an odd length is an fd inherited from a
    // launcher instead (its disk name goes into the `-add-fd` opaque).
    let source = |v: &api::kubevirt::Volume| {
        Some(if v.name.len() % 2 == 1 {
            qemu::cmdline::DiskSource::Inherited { index: u32::try_from(v.name.len()).unwrap_or(0), block: v.name.len() % 4 == 1 }
        } else {
            PathBuf::from(format!("/run/vp,{}/empty-{}.img", v.name, v.name)).into()
        })
    };
    let name = spec.domain.devices.disks.first().map(|d| format!("ns_{},x=y", d.name)).unwrap_or_default();
    if let Ok(mut launch) = qemu::cmdline::from_vmi(&spec, &name, Path::new("/run/vp,x=y"), Resolved::Tcg, &AllowedDirs::default(), source)
    {
        // The NICs, as the node agent adds them: interfaces, MACs and ports from the spec.
        match qemu::nic::from_vmi(&spec, "ns,x=y", &name, true) {
            Ok(nics) => launch.nics = nics,
            Err(_) => return,
        }
        let args = launch.args();
        if let Err(e) = qemu::cmdline::audit(&args) {
            panic!("{e}");
        }
    }
});
