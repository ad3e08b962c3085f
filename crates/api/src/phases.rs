//! The states KubeVirt, CDI and Kubernetes write as strings, as enums: volume phases and
//! reasons, VMI phases, VM printable statuses, state change actions, DataVolume and claim
//! phases. Code matches on variants, never on
//! string literals.
//!
//! # Guarantees
//! Each enum serializes to exactly KubeVirt's wire string and reads any string: a value this
//! version does not know (written by KubeVirt or a newer virtplug) is kept verbatim in `Other`
//! and written back unchanged by a read-modify-write.

use std::borrow::Cow;

/// Declares a wire enum: the variants with their wire strings, plus `Other(String)`.
macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $wire:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
            /// A value this version does not know, kept verbatim.
            Other(String),
        }

        impl $name {
            /// The wire string.
            #[must_use]
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $wire,)*
                    $name::Other(s) => s,
                }
            }

            /// Reads a wire string (never fails: unknown values become `Other`).
            #[must_use]
            pub fn parse(s: &str) -> Self {
                match s {
                    $($wire => $name::$variant,)*
                    other => $name::Other(other.to_owned()),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = Cow::<str>::deserialize(d)?;
                Ok($name::parse(&s))
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                Cow::Borrowed("string")
            }

            fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                String::json_schema(generator)
            }

            fn inline_schema() -> bool {
                true
            }
        }
    };
}

wire_enum! {
    /// `volumeStatus[].phase` (KubeVirt's `VolumePhase`; see DESIGN's table for what each
    /// means here).
    VolumePhase {
        /// In the VMI spec; its claim not bound (or its import not done).
        Pending = "Pending",
        /// The claim is bound; the node may stage it.
        Bound = "Bound",
        /// The source is resolved and opened on the node.
        AttachedToNode = "AttachedToNode",
        /// The block node is in QEMU (or, in bind-mount mode, the bind mount exists).
        MountedToPod = "MountedToPod",
        /// QEMU reports the device.
        Ready = "Ready",
        /// Unplug in progress.
        Detaching = "Detaching",
    }
}

wire_enum! {
    /// `volumeStatus[].reason` (KubeVirt's reasons).
    VolumeReason {
        PvcNotReady = "PVCNotReady",
        PvcBound = "PVCBound",
        SuccessfulCreate = "SuccessfulCreate",
        VolumeMountedToPod = "VolumeMountedToPod",
        VolumeReady = "VolumeReady",
        SuccessfulDelete = "SuccessfulDelete",
        /// A step failed past the deadline (it is still retried).
        HotplugFailed = "HotplugFailed",
    }
}

impl VolumePhase {
    /// The reason that goes with reaching this phase normally (KubeVirt's pairs).
    #[must_use]
    pub fn reason(&self) -> VolumeReason {
        match self {
            VolumePhase::Pending => VolumeReason::PvcNotReady,
            VolumePhase::Bound => VolumeReason::PvcBound,
            VolumePhase::AttachedToNode => VolumeReason::SuccessfulCreate,
            VolumePhase::MountedToPod => VolumeReason::VolumeMountedToPod,
            VolumePhase::Ready => VolumeReason::VolumeReady,
            VolumePhase::Detaching => VolumeReason::SuccessfulDelete,
            VolumePhase::Other(s) => VolumeReason::Other(s.clone()),
        }
    }

    /// Whether the node agent owns this phase (every phase past `Bound`); the controller owns
    /// `Pending` and `Bound`.
    #[must_use]
    pub fn owned_by_node(&self) -> bool {
        !matches!(self, VolumePhase::Pending | VolumePhase::Bound)
    }
}

wire_enum! {
    /// `VirtualMachineInstance.status.phase`.
    VmiPhase {
        Pending = "Pending",
        Scheduling = "Scheduling",
        Scheduled = "Scheduled",
        Running = "Running",
        Succeeded = "Succeeded",
        Failed = "Failed",
        Unknown = "Unknown",
    }
}

impl VmiPhase {
    /// Whether the VMI has finished (it will not run again).
    #[must_use]
    pub fn is_final(&self) -> bool {
        matches!(self, VmiPhase::Succeeded | VmiPhase::Failed)
    }
}

wire_enum! {
    /// `VirtualMachine.status.printableStatus` (what `kubectl get vm` shows).
    PrintableStatus {
        Stopped = "Stopped",
        Provisioning = "Provisioning",
        Starting = "Starting",
        Running = "Running",
        Paused = "Paused",
        Stopping = "Stopping",
        Terminating = "Terminating",
        CrashLoopBackOff = "CrashLoopBackOff",
        Migrating = "Migrating",
        Unknown = "Unknown",
        ErrorUnschedulable = "ErrorUnschedulable",
        ErrImagePull = "ErrImagePull",
        ImagePullBackOff = "ImagePullBackOff",
        ErrorPvcNotFound = "ErrorPvcNotFound",
        DataVolumeError = "DataVolumeError",
        WaitingForVolumeBinding = "WaitingForVolumeBinding",
        WaitingForReceiver = "WaitingForReceiver",
    }
}

wire_enum! {
    /// `PersistentVolumeClaim.status.phase` (core/v1; the claim's own type keeps it a string).
    ClaimPhase {
        Pending = "Pending",
        Bound = "Bound",
        Lost = "Lost",
    }
}

impl ClaimPhase {
    /// The phase of `pvc` (`None` until someone wrote one).
    #[must_use]
    pub fn of(pvc: &k8s_openapi::api::core::v1::PersistentVolumeClaim) -> Option<ClaimPhase> {
        pvc.status.as_ref().and_then(|s| s.phase.as_deref()).map(ClaimPhase::parse)
    }

    /// Whether `pvc` is `Bound`.
    #[must_use]
    pub fn is_bound(pvc: &k8s_openapi::api::core::v1::PersistentVolumeClaim) -> bool {
        ClaimPhase::of(pvc) == Some(ClaimPhase::Bound)
    }
}

wire_enum! {
    /// `VirtualMachine.status.stateChangeRequests[].action` (KubeVirt's `StateChangeRequestAction`).
    StateChangeAction {
        Start = "Start",
        Stop = "Stop",
    }
}

wire_enum! {
    /// `DataVolume.status.phase` (CDI's values that virtplug writes or reads).
    DataVolumePhase {
        Pending = "Pending",
        PvcBound = "PVCBound",
        ImportScheduled = "ImportScheduled",
        ImportInProgress = "ImportInProgress",
        CloneScheduled = "CloneScheduled",
        CloneInProgress = "CloneInProgress",
        WaitForFirstConsumer = "WaitForFirstConsumer",
        /// CDI's phase of a DataVolume with a volume populator whose claim waits for its
        /// first consumer (what `WaitForFirstConsumer` is without populators).
        PendingPopulation = "PendingPopulation",
        Succeeded = "Succeeded",
        Failed = "Failed",
        Unknown = "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn known_values_round_trip_as_kubevirts_strings() {
        for p in [VolumePhase::Pending, VolumePhase::MountedToPod, VolumePhase::Ready] {
            let v = serde_json::to_value(&p).unwrap();
            assert_eq!(v, json!(p.as_str()));
            assert_eq!(serde_json::from_value::<VolumePhase>(v).unwrap(), p);
        }
        assert_eq!(serde_json::to_value(VolumeReason::PvcNotReady).unwrap(), json!("PVCNotReady"));
        assert_eq!(VolumePhase::Ready.reason(), VolumeReason::VolumeReady);
        assert_eq!(serde_json::to_value(PrintableStatus::ErrorPvcNotFound).unwrap(), json!("ErrorPvcNotFound"));
    }

    #[test]
    fn unknown_values_survive_a_read_modify_write() {
        let p: VmiPhase = serde_json::from_value(json!("WaitingForSync")).unwrap();
        assert_eq!(p, VmiPhase::Other("WaitingForSync".into()));
        assert_eq!(serde_json::to_value(&p).unwrap(), json!("WaitingForSync"));
        assert!(!p.is_final());
    }
}
