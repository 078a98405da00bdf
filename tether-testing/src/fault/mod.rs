//! Fault injection for tests, at three levels: typed messages and bytes on the UDF side, and
//! the Reattach RPCs of Spark Connect. The first two inject the transport failures after
//! which a worker is unsafe (udf §6.5: a crash, a half-close without a terminator, a failed
//! write, silence until a udf §7 timeout), the third the lost and refused RPCs a reattaching
//! client recovers from (rx §6.3), each at a chosen point; each counts what it injected so
//! a test can assert that the fault really fired.
//!
//! - **Messages**: [`FaultyConnection`] wraps any [`Connection`](tether::connection::Connection)
//!   and applies a [`FaultPlan`] of [`MessageFault`]s: cut the connection at the n-th
//!   message sent or received, stall a direction, delay a message (on the crate's
//!   [`Timer`](tether::time::Timer), so under a [`ManualClock`](tether::time::ManualClock) or
//!   tokio's paused clock), fail a write, or half-close the send side without a terminator.
//! - **Bytes** (feature `tokio`): `FaultyIo` wraps any `tokio::io::AsyncRead + AsyncWrite`
//!   (a socket under [`framed`](tether::connection::framed)) and applies an `IoPlan`: truncate
//!   the read side (EOF or an error after n bytes), truncate the write side, cut the whole
//!   stream mid-frame, split reads and writes into k-byte pieces, return `Pending` (waking
//!   itself at once) every n-th poll.
//! - **Reattach RPCs**: [`FaultyRpc`] wraps any
//!   [`ExecutionRpc`](tether::execution::client::ExecutionRpc) (the client end of rx §1.1) and
//!   applies an [`RpcPlan`] of [`RpcFault`]s: refuse a call (before or after the server saw
//!   it), break a response stream after the n-th response with the next one lost in flight
//!   (gracefully or with a status), delay a call, fail a `ReleaseExecute`. A reattaching
//!   client must survive all of them with every response delivered once and in order
//!   (rx §6.3, §6.4) as long as its retry policy covers the errors (rx §6.1).
//!   [`ResultServer`] is a small in-memory server for it to wrap.
//!
//! The plans are built by hand or drawn from a seed (`random`), the same seed giving the
//! same plan, for model tests and soaks. Injected errors carry an [`InjectedFault`] as their
//! cause; [`is_injected`] finds it in an error's chain.
//!
//! A session whose worker connection is cut after two messages ends `TransportFailed` and
//! invalidates the worker (udf §4.5, §6.5):
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use tether::connection::pair;
//! use tether_testing::fault::{Direction, FaultPlan, FaultyConnection};
//! use tether::wire::{Init, UdfPayload, UdfRequest, UdfResponse, UdfWorkerDataFormat};
//! use tether::worker::endpoint::{EndpointConfig, serve};
//! use tether::worker::engine::{CountingHandle, Session, SessionConfig, TerminationKind};
//! # use tether::wire::{ExecutionError, FinishResponse};
//! # use tether::worker::endpoint::Udf;
//! # struct Echo;
//! # impl Udf for Echo {
//! #     fn init(&mut self, _: &Init) -> Result<Option<Bytes>, ExecutionError> { Ok(None) }
//! #     fn process(&mut self, b: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
//! #         out.push(b);
//! #         Ok(())
//! #     }
//! #     fn finish(&mut self, _: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
//! #         Ok(FinishResponse::default())
//! #     }
//! # }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true)
//! #     .build().unwrap().block_on(async {
//! let (engine, worker) = pair::<UdfRequest, UdfResponse>(8);
//! // The engine's third message (Init, one batch, then this one) never leaves.
//! let engine = FaultyConnection::new(engine, FaultPlan::new().drop_at(Direction::Send, 2));
//! let counters = engine.counters();
//! let worker = tokio::spawn(serve(worker, Echo, EndpointConfig::default()));
//!
//! let handle = Arc::new(CountingHandle::for_one_session());
//! let session = Session::new(engine, handle.clone(), SessionConfig::default());
//! let init = Init::new(UdfWorkerDataFormat::Arrow, UdfPayload::new(Bytes::new(), "echo"));
//! let (mut session, _) = session.init(init).await.expect("init");
//! session.send(Bytes::from("one")).await.expect("message 1 passes");
//! assert!(session.send(Bytes::from("two")).await.is_err());
//! let outcome = session.close().await;
//!
//! assert_eq!(outcome.kind(), TerminationKind::TransportFailed);
//! assert!(handle.is_invalid());
//! assert_eq!(counters.report().dropped, 1);
//! // The worker lost its engine too: no clean terminator on its side (udf §2 R8).
//! assert!(!worker.await.unwrap().is_clean());
//! # });
//! # use tether::worker::engine::WorkerHandle as _;
//! ```
//!
//! The same session over the framed transport still finishes with every batch when each
//! write reaches the socket in 3-byte pieces and every third poll returns `Pending`: such
//! schedules must not change a session's outcome (udf §1.4: the transport only moves
//! bytes):
//!
//! ```
//! # #[cfg(feature = "tokio")]
//! # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true)
//! #     .build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use futures::StreamExt;
//! use tether::connection::framed::{FramedConfig, FramedConnection};
//! use tether_testing::fault::{FaultyIo, IoPlan};
//! use tether::wire::{Init, UdfPayload, UdfRequest, UdfResponse, UdfWorkerDataFormat};
//! use tether::worker::endpoint::{EndpointConfig, EndpointOutcome, serve};
//! use tether::worker::engine::{CountingHandle, Session, SessionConfig, Termination};
//! # use tether::wire::{ExecutionError, FinishResponse};
//! # use tether::worker::endpoint::Udf;
//! # struct Echo;
//! # impl Udf for Echo {
//! #     fn init(&mut self, _: &Init) -> Result<Option<Bytes>, ExecutionError> { Ok(None) }
//! #     fn process(&mut self, b: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
//! #         out.push(b);
//! #         Ok(())
//! #     }
//! #     fn finish(&mut self, _: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
//! #         Ok(FinishResponse::default())
//! #     }
//! # }
//!
//! let (a, b) = tokio::net::UnixStream::pair().unwrap();
//! let plan = IoPlan::new().split_writes(3).split_reads(5).pending_every(3);
//! let io = FaultyIo::new(a, plan);
//! let counters = io.counters();
//! let config = FramedConfig::default();
//! let engine = FramedConnection::<_, UdfRequest, UdfResponse>::new(io, &config);
//! let worker = FramedConnection::<_, UdfResponse, UdfRequest>::new(b, &config);
//! let worker = tokio::spawn(serve(worker, Echo, EndpointConfig::default()));
//!
//! let session = Session::new(engine, Arc::new(CountingHandle::for_one_session()), SessionConfig::default());
//! let init = Init::new(UdfWorkerDataFormat::Arrow, UdfPayload::new(Bytes::new(), "echo"));
//! let (session, _) = session.init(init).await.expect("init");
//! let input = ["a", "bb", "ccc"].map(Bytes::from);
//! let mut output = session.process(futures::stream::iter(input.clone()));
//! let mut echoed = Vec::new();
//! while let Some(batch) = output.next().await {
//!     echoed.push(batch.expect("no error"));
//! }
//! assert!(matches!(output.close().await, Termination::Finished { .. }));
//! assert_eq!(echoed, input);
//! assert!(matches!(worker.await.unwrap(), EndpointOutcome::Finished));
//! let report = counters.report();
//! assert!(report.split_writes > 0 && report.pendings > 0, "{report:?}");
//! # });
//! ```

mod io;
mod message;
mod rpc;

pub use io::{FaultyIo, IoCounters, IoPlan, IoReport, RandomIo, ReadEnd};
pub use message::{
    Direction, FaultCounters, FaultPlan, FaultReport, FaultyConnection, MessageFault, RandomFaults,
    WriteStep,
};
pub use rpc::{
    FaultyRpc, RandomRpcFaults, ReleaseFault, ResultServer, RpcCounters, RpcEvent, RpcFault,
    RpcPlan, RpcReport, SERVER_SIDE_SESSION, ServerCall,
};

use std::error::Error as StdError;

/// The error every injected fault reports (as the cause of a
/// [`ConnectionError::Transport`](tether::connection::ConnectionError::Transport) or inside
/// an `io::Error`): which of the udf §6.5 transport failures was injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum InjectedFault {
    /// The connection was cut ([`MessageFault::Drop`], or a cut byte stream; udf §8.4).
    #[error("injected fault: connection dropped")]
    ConnectionDropped,
    /// A write failed ([`MessageFault::FailWrite`]; udf §4.7).
    #[error("injected fault: write failed")]
    WriteFailed,
    /// The read side was truncated with an error (byte level; udf §4.5).
    #[error("injected fault: read truncated")]
    ReadTruncated,
    /// The write side was truncated: shut down mid-stream (byte level; udf §2 R10).
    #[error("injected fault: write side truncated")]
    WriteTruncated,
}

/// Whether `error`, or any error in its `source()` chain (looking inside `io::Error`s too),
/// is an [`InjectedFault`]: tells an injected failure from a real one (udf §6.5).
pub fn is_injected(error: &(dyn StdError + 'static)) -> bool {
    injected(error).is_some()
}

/// The [`InjectedFault`] in `error`'s chain, if any (see [`is_injected`]; udf §6.5).
pub fn injected(error: &(dyn StdError + 'static)) -> Option<InjectedFault> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(fault) = e.downcast_ref::<InjectedFault>() {
            return Some(*fault);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(fault) = injected(inner)
        {
            return Some(fault);
        }
        next = e.source();
    }
    None
}

/// The seeded plans' random source: the client's SplitMix64 jitter source with a fixed
/// seed (the same seed gives the same plan on every platform).
pub(crate) struct SplitMix(tether::execution::client::Jitter);

impl SplitMix {
    pub(crate) fn new(seed: u64) -> Self {
        Self(tether::execution::client::Jitter::new(Some(seed)))
    }

    /// A number in `0..n` (`0` when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.0.next_u64() % n }
    }
}

/// The timer a fault wrapper's delays run on by default: tokio's clock
/// ([`TokioTimer`](tether::time::TokioTimer)) when created inside a tokio runtime, else
/// [`NoTimeouts`](tether::time::NoTimeouts), so that outside a runtime a delay is skipped as
/// documented instead of waiting forever on a sleep no runtime drives (udf §6.5, rx §6.3
/// delays).
fn ambient_timer() -> std::sync::Arc<dyn tether::time::Timer> {
    if tokio::runtime::Handle::try_current().is_err() {
        return std::sync::Arc::new(tether::time::NoTimeouts);
    }
    std::sync::Arc::new(tether::time::TokioTimer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_plans_repeat_and_vary() {
        let settings = RandomFaults::default();
        assert_eq!(
            FaultPlan::random(7, &settings),
            FaultPlan::random(7, &settings)
        );
        let distinct: std::collections::BTreeSet<String> = (0..64)
            .map(|s| format!("{:?}", FaultPlan::random(s, &settings)))
            .collect();
        assert!(
            distinct.len() > 32,
            "only {} distinct plans",
            distinct.len()
        );
        let benign = RandomFaults {
            destructive: false,
            ..settings
        };
        assert!((0..64).all(|s| FaultPlan::random(s, &benign).is_benign()));
    }

    #[test]
    fn injected_faults_are_found_through_io_and_connection_errors() {
        let io = std::io::Error::other(InjectedFault::ReadTruncated);
        let conn = tether::connection::ConnectionError::from(io);
        assert_eq!(injected(&conn), Some(InjectedFault::ReadTruncated));
        let real = tether::connection::ConnectionError::from(std::io::Error::other("real"));
        assert!(!is_injected(&real));
    }
}
