//! # tether
//!
//! Two of Apache Spark's session protocols — external UDF worker sessions and Spark Connect
//! reattachable executions — as compile-time typestates over any transport.
//!
//! ## Where to start
//!
//! Each side's entry point (the items a feature gates carry its badge):
//!
#![cfg_attr(
    feature = "tokio",
    doc = "- **Engine** (runs UDFs on worker processes, as Spark's executor does, udf §6): a \
      [`worker::dispatcher::Dispatcher`] spawns workers from a \
      [`wire::UdfWorkerSpecification`] and \
      [`create_session`](worker::dispatcher::Dispatcher::create_session) gives a \
      [`worker::engine::Session`]: `init` → `process` (or `send`/`recv`) → `close`."
)]
#![cfg_attr(
    not(feature = "tokio"),
    doc = "- **Engine** (runs UDFs on worker processes, udf §6): `worker::dispatcher::Dispatcher` \
      (feature `tokio`), or a [`worker::engine::Session`] on a connection of your own."
)]
//! - **Worker** (a UDF worker written in Rust, udf §2): implement [`worker::endpoint::Udf`]
//!   and run [`worker::endpoint::serve`] on each session's connection (or drive the
//!   [`worker::endpoint::Endpoint`] typestates yourself).
#![cfg_attr(
    feature = "grpc",
    doc = "- **gRPC** (Spark's own transport, udf §1.1, §6.4): \
      [`spark::udf_grpc::GrpcTransport`] for the engine's dispatcher; \
      [`spark::udf_grpc::WorkerMain`] is a whole worker process's `main` (arguments, \
      socket, signals, graceful stop), built on [`spark::udf_grpc::WorkerServer`]."
)]
#![cfg_attr(
    not(feature = "grpc"),
    doc = "- **gRPC** (Spark's own transport, udf §1.1, §6.4): `spark::udf_grpc` (feature `grpc`)."
)]
//! - **Executions** (the server side of reattachable executions, rx §2–§5):
//!   [`execution::ExecutionManager`].
//! - **Client** (reads a reattachable execution, with Spark's retry policy, rx §6):
//!   [`execution::client::ReattachingStream`] over any [`execution::client::ExecutionRpc`].
#![cfg_attr(
    feature = "spark-connect",
    doc = "- **Spark Connect service** (connect §1–§4): \
      [`spark::connect::ConnectService`] serves a query engine of yours; \
      [`spark::connect::ConnectClient`] is the matching client."
)]
#![cfg_attr(
    not(feature = "spark-connect"),
    doc = "- **Spark Connect service** (connect §1–§4): `spark::connect::ConnectService` and \
      `spark::connect::ConnectClient` (feature `spark-connect`)."
)]
//!
//! ## Worker sessions (engine side, [`worker::engine::Session`])
//!
//! One UDF execution on an external worker process: `Init`, data streamed both ways, then
//! `Finish` or `Cancel`, and exactly one terminal outcome ([`worker::engine::Termination`]):
//!
#![doc = include_str!("../docs/diagrams/engine-session.md")]
//!
//! - Methods exist only where the protocol allows them: no data before `init`, no second
//!   `init`, no `finish` before `init`, nothing but inspection and `close` after
//!   `Terminated`. Transitions consume the session.
//! - `close()` is the single finalizer: it returns the [`worker::engine::Termination`], calls
//!   [`worker::engine::WorkerHandle::mark_invalid`] before
//!   [`worker::engine::WorkerHandle::release_session`] when the outcome is unsalvageable
//!   (`TransportFailed`, `Interrupted`), and releases the worker exactly once.
//! - Dropping a session, or a transition future mid-await, is a defined cancel (see
//!   [`worker::engine::Session`]).
//!
//! ## Worker sessions (worker side, [`worker::endpoint`])
//!
//! The same session from the worker's side: a [`worker::endpoint::Udf`] of yours answers
//! each step, and [`worker::endpoint::serve`] (or the [`worker::endpoint::Endpoint`]
//! typestates) turns its answers into the protocol's messages:
//!
#![doc = include_str!("../docs/diagrams/worker-session.md")]
//!
//! ## Reattachable executions ([`execution`])
//!
//! A long streamed result (Spark Connect `ExecutePlan` with `reattachable = true`) that
//! survives broken streams: every response has a UUID `response_id`; the client resumes with
//! `ReattachExecute(last_response_id)`, acknowledges with `ReleaseExecute(ReleaseUntil)` and
//! ends with `ReleaseAll`. Server side: [`execution::ExecutionManager`], the per-execution
//! [`execution::ResponseLog`] and [`execution::Execution`] typestates; client side:
//! [`execution::client::ReattachingStream`].
//!
#![doc = include_str!("../docs/diagrams/execution.md")]
//!
//! ## Layers
//!
//! Dependencies point one way, downwards; the two protocols are independent halves and
//! neither imports the other.
//!
//! - [`time`]: the clock both protocols run on ([`time::Timer`], [`time::TokioTimer`],
//!   [`time::ManualClock`]). It imports nothing from the layers above.
//! - [`wire`]: the Spark 4.3.0 protobuf messages (`org.apache.spark.udf.worker`, and the
//!   Spark Connect subset in [`wire::connect`]), written by hand with prost and the official
//!   field numbers, and a length-delimited frame codec.
//! - [`connection`]: the small [`connection::Connection`] trait that any transport
//!   implements (blanket impl for `Sink + Stream`), a bounded in-memory pair, and framed
//!   Unix/TCP sockets ([`connection::framed`], feature `tokio`).
//! - [`worker`]: UDF worker sessions. [`worker::engine`] is the engine side
//!   ([`worker::engine::Session`] over the sans-IO [`worker::engine::EngineCore`]);
//!   [`worker::endpoint`] is the worker side ([`worker::endpoint::Endpoint`] over
//!   [`worker::endpoint::WorkerCore`]); [`worker::state`] holds the typestate markers both
//!   share; `worker::dispatcher` (feature `tokio`) spawns and reuses worker processes.
//! - [`execution`]: reattachable executions — [`execution::ResponseLog`],
//!   [`execution::ExecutionCore`] (sans-IO, time passed in), [`execution::ExecutionManager`],
//!   and the client [`execution::client::ReattachingStream`].
//! - `spark`: Spark's own transports. `spark::udf_grpc` (feature `grpc`): the official
//!   `UdfWorker` gRPC service over a Unix socket — an engine channel opening one `Execute`
//!   stream per session, a worker server and `WorkerMain`. `spark::connect` (feature
//!   `spark-connect`): the Spark Connect service over an `ExecutionManager` and its client.
//!
//! ## Naming conventions
//!
//! - Typestate markers are always written with their module, `state::Init`,
//!   `state::Streaming`, …: the bare name `Init` is the wire message [`wire::Init`].
//! - Each protocol's phases have their own name: [`worker::engine::EnginePhase`],
//!   [`worker::endpoint::WorkerPhase`], [`execution::ExecutionPhase`],
//!   [`execution::client::ClientPhase`].
//! - Every item has exactly one public path; the modules above are the only namespaces.
//!
//! ## Errors
//!
//! - An error's `Display` states that error and never repeats its cause; the cause is
//!   reached through [`std::error::Error::source`] (walk the chain to print it all).
//! - Texts that travel on the wire come from their own functions, stable and pinned by
//!   tests, not from `Display`: [`worker::endpoint::EngineViolation::wire_message`] and
//!   [`worker::endpoint::InitRejection::wire_message`] (the worker's `ProtocolError`
//!   messages) and [`execution::ConnectError::message`] (the Spark Connect status message).
//!
//! ## Protocol reference
//!
//! The rules are written down in the [`reference`](mod@reference) chapters, shipped with the crate:
//! [`reference::udf`] (worker sessions), [`reference::rx`] (reattachable executions) and
//! [`reference::connect`] (Spark Connect facts measured on Spark 4.3.0). Doc comments cite
//! them by chapter and section — "udf §4.5", "rx §3.5", "connect §2" — beside the upstream
//! Spark class, method or JIRA where there is one.
//!
//! ## Features
//!
//! - `tokio` (default): tokio's clock for the session timeouts and the bounded drop-cleanup
//!   task. With `default-features = false` the crate is runtime-agnostic (bytes, futures,
//!   pin-project, thiserror, prost, uuid, tracing); supply a [`time::Timer`] for timeouts.
//! - `grpc`: the official `UdfWorker` gRPC service (tonic), `spark::udf_grpc`.
//! - `spark-connect`: Spark Connect over gRPC (tonic), `spark::connect`: a service over
//!   [`execution::ExecutionManager`] and a client for
//!   [`execution::client::ReattachingStream`]. The messages themselves
//!   ([`wire::connect`]) need no feature.
//!
//! Test support (message fixtures, scripted peers, the engine × worker core pair, fault
//! injection) is a crate of its own in this repository, `tether-testing` (not published).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![forbid(unused_must_use)]
#![deny(missing_docs)]
#![warn(unreachable_pub)]
#![warn(clippy::use_self)]

/// Declares a module's sealed typestate trait `State` and its five markers (used by
/// [`worker::state`] and [`execution::state`], whose markers are distinct types). Each
/// invocation passes the docs of the trait and of every marker, citing the lifecycle state
/// the marker stands for: udf §4.1 (worker sessions) or rx §2.3 (reattachable executions).
macro_rules! typestate_markers {
    (
        $(#[$trait_doc:meta])*
        trait State;
        $($(#[$doc:meta])* $name:ident,)*
    ) => {
        mod sealed {
            /// Seals `State`: only the markers declared beside it implement it, so the
            /// typestates are exactly the protocol's lifecycle states (udf §4.1 for worker
            /// sessions, rx §2.3 for reattachable executions).
            pub trait Sealed {}
        }

        $(#[$trait_doc])*
        ///
        /// The markers are the protocol's named lifecycle states: udf §4.1 (Spark's
        /// `WorkerSession` states) for worker sessions, rx §2.3 for reattachable executions.
        pub trait State: sealed::Sealed + Send + Sync + 'static {
            /// The marker's name (`"Init"`, `"Streaming"`, …), for `Debug` output.
            const NAME: &'static str;
        }

        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
            pub struct $name;
            impl sealed::Sealed for $name {}
            impl State for $name {
                const NAME: &'static str = stringify!($name);
            }
        )*
    };
}

/// The conversions between a typestate handle and its erased enum, for each of the five
/// markers: `From<Typed<state::S, P>> for Any<P>` and `TryFrom<Any<P>> for Typed<state::S, P>`
/// (the error hands the enum back). Used for [`worker::engine::AnySession`] (udf §4.1) and
/// [`execution::AnyExecution`] (rx §2.3); `state` is resolved where it is invoked. The
/// parameter's bound is required (`Sized` where there is none).
macro_rules! any_state_conversions {
    ($any:ident, $typed:ident<$param:ident: $bound:path>: $($state:ident),*) => {$(
        impl<$param: $bound> From<$typed<state::$state, $param>> for $any<$param> {
            fn from(typed: $typed<state::$state, $param>) -> Self {
                $any::$state(typed)
            }
        }

        impl<$param: $bound> TryFrom<$any<$param>> for $typed<state::$state, $param> {
            type Error = $any<$param>;

            fn try_from(any: $any<$param>) -> Result<Self, Self::Error> {
                match any {
                    $any::$state(typed) => Ok(typed),
                    other => Err(other),
                }
            }
        }
    )*};
}

pub mod connection;
pub mod execution;
pub mod observe;
pub mod reference;
#[cfg(any(feature = "grpc", feature = "spark-connect"))]
pub mod spark;
pub(crate) mod sync;
pub mod time;
pub mod wire;
pub mod worker;
