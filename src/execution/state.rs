//! Typestate markers of an [`Execution`](super::Execution) (rx §2.3).
//!
//! As in [`worker::state`](crate::worker::state), the markers are always written with their
//! module (`state::Init`, `state::Streaming`, …).

typestate_markers! {
    /// A typestate of [`Execution`](super::Execution). Sealed: the five markers below.
    trait State;

    /// Submitted and registered; not yet answered (producer not started): rx §2.3
    /// *created* (runner `notStarted`).
    Init,
    /// Responses flowing; reattach and release-until allowed (reattachable only): rx §2.3
    /// *running*, attached or detached.
    Streaming,
    /// The final index is fixed (`ResultComplete` or a terminal error); release-all
    /// only: rx §2.3 *completed*.
    Finishing,
    /// Interrupted, or released while running; waiting for the producer to stop and/or
    /// the release: rx §2.3 *interrupted* (the close of rx §2.2 T12 still running).
    Cancelling,
    /// Removed and stopped: inspection only. rx §2.3 *released* or *abandoned*, and
    /// *closed*.
    Terminated,
}
