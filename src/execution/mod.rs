//! Reattachable executions, server side (Spark Connect; the protocol is written down in
//! [`reference::rx`](crate::reference::rx), cited as "rx §N" below).
//!
//! A client starts a query with `ExecutePlan(reattachable = true)`; the server keeps every
//! produced response in a per-execution log with a UUID `response_id` and a 1-based index,
//! and streams the log to whichever RPC is attached. Streams rotate gracefully (2 min /
//! 1 GiB) and break; the client resumes with `ReattachExecute(last_response_id)`,
//! acknowledges with `ReleaseExecute(ReleaseUntil)` and frees everything with `ReleaseAll`.
//! Executions left detached are abandoned after 5 minutes and remembered in tombstones.
//!
//! ```text
//!                 ExecutePlan                       ReattachExecute(last_response_id)
//!   client ───────────────┐                 ┌──────────────── client (new RPC)
//!                         ▼                 ▼
//!   ┌─────────────── ExecutionManager: sessions (user, session) ─ tombstones ──────────┐
//!   │  execution (user, session, operation)                                             │
//!   │   Producer ──push──► ResponseLog [1 … first │ retained … │ unsent … last] ──►     │
//!   │   (backpressure)      id→index map, retry budget, final index     one attached    │
//!   │                                                                   ResponseStream  │
//!   └──────────────── maintain(): detached > 5 min → abandoned, idle session → closed ─┘
//! ```
//!
//! Layers, as for worker sessions:
//!
//! - Sans-IO cores, time passed in: [`ResponseLog`] (rx §3) and [`ExecutionCore`]
//!   (runner states rx §2.1, the sender rules of rx §4: one consumer, preemption, rotation).
//! - The async driver: [`ResponseStream`] (a consumer; `Stream` of responses, or
//!   [`ResponseStream::forward`] into a `Sink`), [`Producer`] (appends, waits on
//!   backpressure, finishes exactly once).
//! - The registry: [`ExecutionManager`] with the wire-level RPC handlers
//!   ([`execute_plan`](ExecutionManager::execute_plan),
//!   [`reattach_execute`](ExecutionManager::reattach_execute),
//!   [`release_execute`](ExecutionManager::release_execute),
//!   [`interrupt`](ExecutionManager::interrupt),
//!   [`release_session`](ExecutionManager::release_session)) and the maintenance pass.
//! - The inspection and management handle: [`Execution<S, K>`](Execution), with
//!   `state::Init`, `state::Streaming`, `state::Finishing`, `state::Cancelling`,
//!   `state::Terminated` (rx §2.3); a [`NonReattachable`] execution has no reattach or
//!   release API at all. It is what a program that runs executions in process holds
//!   ([`Submitted`] before `start`, [`ExecutionManager::lookup`] after): illegal orders do
//!   not compile, and its phase is re-read from the live execution. It is *not* how
//!   executions are served: the data path is [`Producer`] and [`ResponseStream`], and every
//!   state change a remote client asks for arrives as an RPC that
//!   `spark::connect` hands straight to the manager's handlers, because
//!   other parties (a client's ReleaseAll, an Interrupt, abandonment) change an execution
//!   under any handle. So `ConnectService` keeps no handle, and `Submitted::start` returns
//!   the producer and the stream only.
//!
//! Errors are [`ConnectError`]s whose `Display` starts with Spark's condition
//! (`[INVALID_CURSOR.DISCONNECTED] …`) and whose [`code`](ConnectError::code) is the gRPC
//! status category to send.
//!
//! A minimal server loop for one ExecutePlan (any transport):
//!
//! ```
//! # use std::sync::Arc;
//! # use futures::StreamExt;
//! use tether::execution::{ExecutionManager, ManagerConfig};
//! use tether::time::ManualClock;
//! use tether::wire::connect::{ExecutePlanRequest, ExecutePlanResponse, UserContext, Plan};
//! use tether::wire::connect::execute_plan_request::RequestOption;
//!
//! # futures::executor::block_on(async {
//! let manager = ExecutionManager::new(ManagerConfig::with_timer(Arc::new(ManualClock::new())));
//! let request = ExecutePlanRequest {
//!     session_id: "00112233-4455-6677-8899-aabbccddeeff".into(),
//!     user_context: Some(UserContext::new("alice")),
//!     plan: Some(Plan::root(&b"...relation..."[..])),
//!     request_options: vec![RequestOption::reattach(true)],
//!     ..Default::default()
//! };
//! let (producer, mut stream) = manager.execute_plan(&request)?.start();
//! let mut producer = producer.expect("a new execution");
//! producer.push(ExecutePlanResponse::arrow_batch(1, &b"arrow"[..])).await?;
//! producer.finish()?;
//! let first = stream.next().await.unwrap()?;
//! let last = stream.next().await.unwrap()?;
//! assert!(last.is_result_complete());
//! assert!(stream.next().await.is_none());
//! # let _ = first;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod admission;
mod budget;
pub mod client;
mod code;
pub mod condition;
mod core;
mod correlation;
mod drain;
mod error;
mod error_store;
mod events;
mod inactive;
pub(crate) mod keys;
mod log;
mod lru;
mod manager;
mod observer;
mod registry;
pub mod state;
mod status;
mod stream;
mod typed;

pub use self::core::{
    ConsumerEvent, ConsumerId, ExecutionCore, ExecutionPhase, ProduceError, RunOutcome,
    RunnerState, StreamEnd, StreamLimits,
};
pub use admission::{AdmissionConfig, AdmissionPermit, AdmissionUsage, AdmissionWait};
pub use budget::{BudgetUsage, MemoryBudget};
pub use code::Code;
pub use correlation::{Correlation, MAX_CORRELATION_LEN, OPERATION_ID_HEADER};
pub use drain::{
    DRAIN_CHECK, DRAIN_GRACE, Drain, DrainReport, DrainStep, DrainView, SESSION_QUIET,
};
pub use error::{ConnectError, SparkError};
pub use events::{ExecutionEvent, ExecutionEventKind, RotationReason};
pub use keys::{ExecuteKey, SessionKey};
pub use log::{AlreadyFinished, Consumed, LogConfig, PushError, ResponseLog, Stamp};
pub use manager::{ExecutionManager, ManagerConfig, Submitted};
pub use registry::{MaintenanceReport, ManagerStats};
pub use status::{IllegalTransition, OperationStatus, Removal};
pub use stream::{ForwardError, Producer, ResponseStream};
pub use typed::{
    AnyExecution, Execution, ExecutionOutcome, Kind, Lookup, NonReattachable, Reattachable,
};
