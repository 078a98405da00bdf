//! The worker side of a worker session: write a UDF worker in Rust (udf §2, §2.1).
//!
//! Three levels, each built on the one below:
//!
//! - [`serve()`] with a [`Udf`]: implement four callbacks (`init`, `process`, `finish`,
//!   `cancel`) and run one session per `Execute` stream; every ordering rule is handled.
//!   [`handle_manage`] answers the `Manage` RPC (udf §1.7).
//! - [`Endpoint<S, C>`](Endpoint): the session as typestates over any
//!   [`Connection<UdfResponse, UdfRequest>`](crate::connection::Connection), reusing the
//!   engine's markers ([`state`](crate::worker::state)): `recv_init` → [`InitRequest`] →
//!   `accept`/`reject` → `recv`/`send` → [`InputEnd`] → `finish`/`cancelled` →
//!   `Terminated` with an [`EndpointOutcome`].
//! - [`WorkerCore`]: the rules as a sans-IO state machine (events in, `UdfResponse`s out),
//!   for property tests, fuzzing and custom drivers.
//!
#![doc = include_str!("../../../docs/diagrams/worker-session.md")]
//!
//! A minimal worker:
//!
//! ```
//! use bytes::Bytes;
//! use tether::wire::{ExecutionError, FinishResponse, Init, UdfRequest, UdfResponse};
//! use tether::worker::endpoint::{EndpointConfig, Udf, serve};
//!
//! struct Upper;
//! impl Udf for Upper {
//!     fn init(&mut self, _init: &Init) -> Result<Option<Bytes>, ExecutionError> {
//!         Ok(None)
//!     }
//!     fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
//!         out.push(Bytes::from(batch.to_ascii_uppercase()));
//!         Ok(())
//!     }
//!     fn finish(&mut self, _out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
//!         Ok(FinishResponse::default())
//!     }
//! }
//!
//! # futures::executor::block_on(async {
//! let (_engine, worker) = tether::connection::pair::<UdfRequest, UdfResponse>(8);
//! # drop(_engine);
//! let outcome = serve(worker, Upper, EndpointConfig::default()).await;
//! # let _ = outcome;
//! # });
//! ```

mod config;
mod core;
mod serve;
mod typed;
mod violation;

pub use self::core::{
    DataSent, DataTicket, Delivery, EndpointMisuse, EndpointOutcome, OutcomeKind, WorkerCore,
    WorkerPhase, WorkerStats,
};
pub use config::EndpointConfig;
pub use serve::{Answered, ManageError, Udf, WorkerControl, answer_pending, handle_manage, serve};
pub use typed::{Endpoint, EndpointError, InitRequest, InputEnd};
pub use violation::{EngineViolation, InitRejection, InitTimeout};
