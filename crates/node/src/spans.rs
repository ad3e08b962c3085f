//! The spans the agent logs in, so that every line names its object — in the text format as
//! `vmi{vmi=ns/name}:volume{volume=v}:`, in the JSON format as the `span`/`spans` fields:
//! a worker runs in its VMI's span, each volume's work in that volume's span within it.

/// The span of everything about one VMI: its worker, and the stop of a VMI that is gone.
#[must_use]
pub fn vmi(namespace: &str, name: &str) -> tracing::Span {
    tracing::info_span!("vmi", vmi = %format_args!("{namespace}/{name}"))
}

/// The span of everything done for one volume (or one drive's medium), within its VMI's.
#[must_use]
pub fn volume(volume: &str) -> tracing::Span {
    tracing::info_span!("volume", volume = %volume)
}
