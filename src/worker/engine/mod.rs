//! The engine side of a worker session (udf §3–§5): the engine opens the stream, sends
//! `Init`, streams data, then `Finish` or `Cancel`, and settles exactly one
//! [`Termination`].
//!
//! - [`Session`]: the typestate API over a [`Connection`](crate::connection::Connection),
//!   with [`ProcessStream`] for Spark's iterator-to-iterator style and [`AnySession`] for maps.
//! - [`EngineCore`]: the engine's protocol rules as a sans-IO state machine.
//! - [`Termination`], [`SessionError`]: the single terminal outcome and its errors.
//! - [`WorkerHandle`]: the worker a session runs on, released exactly once per session.
//! - [`WorkerTransport`]: how a dispatcher reaches a worker (framed here; gRPC in
//!   `spark::udf_grpc`).

mod config;
mod core;
pub(super) mod events;
mod handle;
mod session;
mod termination;
mod transport;

pub use self::config::SessionConfig;
pub use self::core::{CoreStats, EngineCore, EnginePhase, InitStatus, Misuse};
#[cfg(feature = "tokio")]
pub(crate) use self::events::SessionObserver;
pub use self::handle::{CountingHandle, HandleError, IntoWorkerHandle, WorkerHandle};
pub use self::session::{AnySession, ProcessStream, Session, SessionFailed, TerminationWatch};
pub use self::termination::{
    Interrupted, PeerViolation, SessionError, Termination, TerminationKind, TransportFailure, Wait,
};
#[cfg(feature = "tokio")]
pub use self::transport::{FramedSessionConnection, FramedTransport};
pub use self::transport::{WorkerAddress, WorkerTransport};
