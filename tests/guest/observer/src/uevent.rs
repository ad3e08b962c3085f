//! Kernel uevents as they arrive on a `NETLINK_KOBJECT_UEVENT` socket (multicast group 1):
//! a header `ACTION@DEVPATH`, then `KEY=VALUE` pairs, every part NUL-terminated.
//! Messages from udev (`libudev` header) never reach group 1 and would be skipped anyway.

/// What the observer needs of one kernel uevent.
#[derive(Debug, PartialEq, Eq)]
pub struct Event<'a> {
    pub subsystem: Option<&'a str>,
    pub devtype: Option<&'a str>,
    pub devname: Option<&'a str>,
}

impl Event<'_> {
    /// A whole disk (not a partition) of the block layer: the only events that change what the
    /// guest reports.
    pub fn is_block_disk(&self) -> bool {
        self.subsystem == Some("block") && self.devtype == Some("disk")
    }
}

/// Parses one datagram; `None` for anything that is not a kernel uevent.
pub fn parse(msg: &[u8]) -> Option<Event<'_>> {
    let mut parts = msg.split(|b| *b == 0).filter(|p| !p.is_empty()).map(std::str::from_utf8);
    let header = parts.next()?.ok()?;
    // `ACTION@DEVPATH`: the action does not matter (every disk event means "rescan").
    header.split_once('@')?;
    let mut event = Event { subsystem: None, devtype: None, devname: None };
    for part in parts.flatten() {
        match part.split_once('=') {
            Some(("SUBSYSTEM", v)) => event.subsystem = Some(v),
            Some(("DEVTYPE", v)) => event.devtype = Some(v),
            Some(("DEVNAME", v)) => event.devname = Some(v),
            _ => {}
        }
    }
    Some(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_add_event_names_the_disk() {
        let msg = b"add@/devices/pci0000:00/0000:00:03.0/virtio1/host0/target0:0:0/0:0:0:1/block/sda\0ACTION=add\0\
DEVPATH=/devices/pci0000:00/0000:00:03.0/virtio1/host0/target0:0:0/0:0:0:1/block/sda\0SUBSYSTEM=block\0MAJOR=8\0MINOR=0\0\
DEVNAME=sda\0DEVTYPE=disk\0DISKSEQ=9\0SEQNUM=1234\0";
        let e = parse(msg).unwrap();
        assert_eq!(e, Event { subsystem: Some("block"), devtype: Some("disk"), devname: Some("sda") });
        assert!(e.is_block_disk());
    }

    #[test]
    fn a_partition_or_another_subsystem_is_not_a_disk() {
        let part = parse(b"add@/x/block/sda/sda1\0ACTION=add\0SUBSYSTEM=block\0DEVNAME=sda1\0DEVTYPE=partition\0").unwrap();
        assert!(!part.is_block_disk());
        let scsi = parse(b"add@/x/0:0:0:1\0ACTION=add\0SUBSYSTEM=scsi\0DEVTYPE=scsi_device\0").unwrap();
        assert!(!scsi.is_block_disk());
    }

    #[test]
    fn udev_messages_and_garbage_are_skipped() {
        assert_eq!(parse(b"libudev\0\xfe\xed\xca\xfe"), None);
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"\xff\xfe@x\0"), None);
    }
}
