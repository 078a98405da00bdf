//! Worker sessions: one UDF execution on an external worker process (spec
//! `udf-worker-protocol.md`).
//!
//! - [`Session`]: the engine side as typestates over a [`Connection`](crate::connection::Connection).
//! - [`EngineCore`]: the engine side's rules as a sans-IO state machine.
//! - [`Termination`]: the single terminal outcome; [`WorkerHandle`]: the worker a session
//!   runs on, released exactly once per session.

pub mod config;
pub mod core;
#[cfg(feature = "tokio")]
pub mod dispatcher;
pub mod endpoint;
pub mod handle;
pub mod session;
pub mod termination;
pub mod transport;

pub use config::SessionConfig;
pub use config::Timer;
#[cfg(feature = "tokio")]
pub use config::TokioTimer;
pub use core::{CoreStats, EngineCore, InitStatus, Misuse, Phase};
pub use handle::{CountingHandle, HandleError, WorkerHandle};
pub use session::{AnySession, Process, Session, SessionFailed, TerminationWatch, state};
pub use termination::{
    Interrupted, PeerViolation, SessionError, Termination, TerminationKind, TransportFailure, Wait,
};
