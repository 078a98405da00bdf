//! Typestate markers of a UDF worker session, shared by both sides (udf §4.1): the engine's
//! [`Session<S, C>`](crate::worker::engine::Session) and the worker's
//! [`Endpoint<S, C>`](crate::worker::endpoint::Endpoint).
//!
//! The markers are named from the engine's side of the stream (Spark's `WorkerSession`
//! states). On an `Endpoint` they name the same stream positions: `Finishing` means "the
//! engine sent `Finish`", `Cancelling` means "a `Cancel` is due or has arrived".
//!
//! # Naming convention
//!
//! The marker `Init` and the wire message [`wire::Init`](crate::wire::Init) share Spark's
//! name. The crate therefore never imports a bare marker: it always writes `state::Init`,
//! `state::Streaming`, … (as in `Session<state::Init, C>`), and the bare name `Init` is the
//! message. Examples and tests follow the same rule.

typestate_markers! {
    /// A typestate of [`Session`](crate::worker::engine::Session) and
    /// [`Endpoint`](crate::worker::endpoint::Endpoint). Sealed: the five markers below are all.
    trait State;

    /// Created; `init` not yet called (udf §4.1 `Created`).
    Init,
    /// `InitResponse` accepted: data flows both ways (udf §4.1 `Initialized`/`Streaming`).
    Streaming,
    /// `Finish` sent: trailing output and the terminator follow (udf §4.1 `Finishing`).
    Finishing,
    /// Cancel sent: the terminator follows (udf §4.1 `Cancelling`).
    Cancelling,
    /// The session has settled its [`Termination`](crate::worker::engine::Termination); only
    /// inspection and `close` remain (udf §4.1 `Terminal`).
    Terminated,
}
