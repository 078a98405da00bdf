//! # tether
//!
//! Two of Apache Spark's session protocols — external UDF worker sessions and Spark Connect
//! reattachable executions — as compile-time typestates over any transport.
//!
//! ## Worker sessions (engine side, [`worker::Session`])
//!
//! One UDF execution on an external worker process: `Init`, data streamed both ways, then
//! `Finish` or `Cancel`, and exactly one terminal outcome ([`worker::Termination`]):
//!
//! ```text
//!                    init() ─ InitResponse ok
//!   ┌──────┐ ───────────────────────────────────► ┌───────────┐ send()/recv()
//!   │ Init │                                      │ Streaming │ ◄────────────┐
//!   └──────┘ ──┐ InitResponse.error /             └───────────┘ ─────────────┘
//!              │ ErrorResponse: Cancel round trip    │      │
//!              │                          finish()   │      │ cancel(), ErrorResponse
//!              │                                     ▼      ▼
//!              │                            ┌───────────┐ cancel() ┌────────────┐
//!              │                            │ Finishing │ ───────► │ Cancelling │
//!              │                            └───────────┘          └────────────┘
//!              │                  FinishResponse │   CancelResponse │
//!              ▼                                 ▼                  ▼
//!   ┌─────────────────────────────────────────────────────────────────────────┐
//!   │ Terminated: Finished | Cancelled | Failed | TransportFailed | Interrupted │
//!   └─────────────────────────────────────────────────────────────────────────┘
//!        any state ── transport error, peer violation, timeout ──► TransportFailed
//!        any state ── dropped, Cancel not acknowledged in 2 s ───► Interrupted
//!        any state ── close() ──► Cancel if needed ──► Terminated ──► handle released once
//! ```
//!
//! - Methods exist only where the protocol allows them: no data before `init`, no second
//!   `init`, no `finish` before `init`, nothing but inspection and `close` after
//!   `Terminated`. Transitions consume the session.
//! - `close()` is the single finalizer: it returns the [`worker::Termination`], calls
//!   [`worker::WorkerHandle::mark_invalid`] before
//!   [`worker::WorkerHandle::release_session`] when the outcome is unsalvageable
//!   (`TransportFailed`, `Interrupted`), and releases the worker exactly once.
//! - Dropping a session, or a transition future mid-await, is a defined cancel (see
//!   [`worker::Session`]).
//!
//! ## Worker sessions (worker side, [`worker::endpoint`])
//!
//! ```text
//!   AwaitingInit ─ Init (+ PayloadChunks … last) ─► InitPending ─ accept ─► Data ─ Finish ─► Draining
//!        │                                              │ reject                │ fail        │ finish
//!        │                                              ▼                       ▼             ▼
//!        └── Cancel (any time) ──► CancelResponse    PostError ─ Cancel ─► CancelResponse   FinishResponse
//!   engine protocol violation ─► ErrorResponse(ProtocolError) (or in InitResponse) ─► CancelResponse ─► close
//! ```
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
//! ```text
//!              ExecutePlan              responses flow         ResultComplete seen
//!   ┌──────┐ ─────────────► ┌───────────┐ ─────────────► ┌───────────┐
//!   │ Init │                │ Streaming │ reattach,      │ Finishing │ release-all only
//!   └──────┘                └───────────┘ release-until  └───────────┘
//!                                 │ interrupt / release-all      │ ReleaseAll
//!                                 ▼                              ▼
//!                           ┌────────────┐  OPERATION_CANCELED  ┌────────────┐
//!                           │ Cancelling │ ───────────────────► │ Terminated │ absorbs all
//!                           └────────────┘                      └────────────┘
//!   one attached stream at a time (a new attach interrupts the old with
//!   INVALID_CURSOR.DISCONNECTED); streams rotate after 2 min / 1 GiB; detached executions
//!   are abandoned after 5 min and leave a tombstone (OPERATION_ABANDONED).
//! ```
//!
//! ## Layers
//!
//! - [`wire`]: the Spark 4.3.0 protobuf messages (`org.apache.spark.udf.worker`), written by
//!   hand with prost and the official field numbers, and a length-delimited frame codec.
//! - [`connection`]: the small [`connection::Connection`] trait that any transport
//!   implements (blanket impl for `Sink + Stream`), and a bounded in-memory pair.
//! - [`worker`]: the sans-IO protocol cores ([`worker::EngineCore`],
//!   [`worker::endpoint::WorkerCore`]) and the async typestate drivers over them; the
//!   framed and process layers: [`worker::transport`], `worker::dispatcher` (feature
//!   `tokio`).
//! - [`execution`]: reattachable executions — [`execution::ResponseLog`],
//!   [`execution::ExecutionCore`] (sans-IO, time passed in), [`execution::ExecutionManager`],
//!   and the client [`execution::client::ReattachingStream`].
//! - `spark` (feature `grpc`): the official `UdfWorker` gRPC service over a Unix socket —
//!   an engine channel opening one `Execute` stream per session and a worker server.
//!
//! References (the project's protocol notes, kept outside the crate):
//! `spec/udf-worker-protocol.md` for worker sessions and `spec/reattach-protocol.md` for
//! executions (section numbers in the docs, e.g. "spec
//! §4.5", refer to the one of their module).
//!
//! ## Features
//!
//! - `tokio` (default): tokio's clock for the session timeouts and the bounded drop-cleanup
//!   task. With `default-features = false` the crate is runtime-agnostic (bytes, futures,
//!   pin-project, thiserror, prost, uuid, tracing); supply a [`worker::Timer`] for timeouts.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod connection;
pub mod execution;
#[cfg(feature = "grpc")]
pub mod spark;
pub mod wire;
pub mod worker;
