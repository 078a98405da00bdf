//! The client side of reattachable executions (Spark Connect, rx §6): consume a long
//! streamed result without loss across broken, preempted and rotated RPCs.
//!
//! - [`ExecutionRpc`]: the three RPCs (`ExecutePlan`, `ReattachExecute`, `ReleaseExecute`)
//!   as a small transport-agnostic trait; a gRPC adapter, an in-memory server or a test fake
//!   implements it.
//! - [`ReattachingStream`]: the results of a reattachable execution as a
//!   `Stream<Item = Result<ExecutePlanResponse, ClientError>>`, every response delivered
//!   exactly once and in order. [`ExecuteStream`]: the non-reattachable form, which has no
//!   reattach and no release API at all.
//! - [`ReattachCore`]: the algorithm as a sans-IO state machine (commands out, events in, no
//!   clock, no I/O), which the streams drive and the property tests drive directly.
//! - [`RetryPolicy`] / [`Retrying`]: Spark's `DefaultPolicy` and retry scopes, as pure values.
//! - [`RpcError`]: the client's view of a failed RPC (status [`Code`](crate::execution::Code) + Spark error condition
//!   such as `INVALID_CURSOR.DISCONNECTED`); [`ClientError`]: why a stream ended in error.
//!
//! ```text
//!  caller ◄── r1 r2 … ResultComplete ── ReattachingStream ── ExecutePlan(op id, reattachable)
//!                                            │   ▲        ── ReattachExecute(last_response_id)
//!            ReleaseUntil(r_n) per delivery ─┘   │           after a graceful end / retryable
//!            ReleaseAll once at the end/error    │           error (backoff) / deadline
//!                                                └─ OPERATION_NOT_FOUND, nothing delivered:
//!                                                   ExecutePlan again (same op id)
//! ```
//!
//! # Example
//!
//! A server that rotates its stream after every response; the client reattaches until
//! `ResultComplete`:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use futures::{StreamExt, future::BoxFuture, stream::{self, BoxStream}};
//! use tether::execution::client::{ClientConfig, ExecutionRpc, ReattachingStream, RpcError};
//! use tether::time::NoTimeouts;
//! use tether::wire::connect::*;
//!
//! /// Three responses; each RPC sends one and ends without ResultComplete.
//! struct Rotating(Mutex<Vec<String>>);
//!
//! impl Rotating {
//!     fn next_stream(&self, after: Option<String>) -> BoxStream<'static, Result<ExecutePlanResponse, RpcError>> {
//!         let next = match after.as_deref() { None => 1, Some(id) => id[1..].parse::<u32>().unwrap() + 1 };
//!         self.0.lock().unwrap().push(format!("attach after {after:?}"));
//!         let mut r = if next == 3 { ExecutePlanResponse::result_complete() }
//!                     else { ExecutePlanResponse::arrow_batch(1, vec![next as u8]) };
//!         r.response_id = format!("r{next}");
//!         stream::iter([Ok(r)]).boxed()
//!     }
//! }
//!
//! impl ExecutionRpc for Rotating {
//!     type Stream = BoxStream<'static, Result<ExecutePlanResponse, RpcError>>;
//!     fn execute_plan(&self, _: ExecutePlanRequest) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
//!         let s = self.next_stream(None);
//!         Box::pin(async move { Ok(s) })
//!     }
//!     fn reattach_execute(&self, r: ReattachExecuteRequest) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
//!         let s = self.next_stream(r.last_response_id);
//!         Box::pin(async move { Ok(s) })
//!     }
//!     fn release_execute(&self, _: ReleaseExecuteRequest) -> BoxFuture<'static, Result<ReleaseExecuteResponse, RpcError>> {
//!         Box::pin(async { Ok(ReleaseExecuteResponse::default()) })
//!     }
//! }
//!
//! # futures::executor::block_on(async {
//! let rpc = Arc::new(Rotating(Mutex::new(Vec::new())));
//! let request = ExecutePlanRequest { session_id: "6f1c3d2e-1111-4222-8333-444455556666".into(), ..Default::default() };
//! let config = ClientConfig::with_timer(Arc::new(NoTimeouts));
//! let mut results = ReattachingStream::new(rpc.clone(), request, config).unwrap();
//! let mut ids = Vec::new();
//! while let Some(response) = results.next().await {
//!     ids.push(response.unwrap().response_id);
//! }
//! assert_eq!(ids, ["r1", "r2", "r3"]);
//! assert_eq!(results.stats().reattaches, 2);
//! let releases = results.close().await;
//! assert_eq!((releases.until_calls, releases.all_calls), (2, 1));
//! # });
//! ```

mod config;
mod core;
mod error;
mod retry;
mod rpc;
mod stream;

pub use config::{ClientConfig, ReleaseMode};
pub use core::{ClientPhase, ClientStats, Command, ReattachCore, ResponseId};
pub use error::{ClientError, ReleaseError, RpcError, Violation};
/// The seeded SplitMix64 source of the retry jitter, shared with the fault plans of the
/// test-support crate (`tether-testing`). Not part of the API: hidden, not covered by semver.
#[doc(hidden)]
pub use retry::Jitter;
pub use retry::{RetryDecision, RetryPolicy, Retrying};
pub use rpc::ExecutionRpc;
pub use stream::{ExecuteStream, ReattachingStream, ReleaseStats};
