//! How a dispatcher reaches a worker process and opens one connection per session.
//!
//! A worker listens on one address (udf §1.1, §6.4: a Unix socket path passed as
//! `--connection`, or a loopback TCP port). [`WorkerTransport`] says how to reach it: first a
//! per-worker [`Channel`](WorkerTransport::Channel) (nothing for the framed transport, an
//! HTTP/2 channel shared by all sessions for gRPC), then one
//! [`Connection`](WorkerTransport::Connection) per session.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use futures::future::BoxFuture;

use crate::connection::Connection;
use crate::wire::{UdfRequest, UdfResponse};

/// Where a worker listens (the value behind its `--connection` argument): one of the
/// transports of udf §1.9 `WorkerConnectionSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WorkerAddress {
    /// A Unix-domain socket path (udf §1.9 `UnixDomainSocket`, §6.4).
    Unix(PathBuf),
    /// A TCP address (loopback; udf §1.9 `LocalTcpConnection`).
    Tcp(SocketAddr),
}

impl WorkerAddress {
    /// The string passed to the worker as `--connection`: the socket path, or the port for
    /// TCP (udf §1.9 `ProcessCallable`).
    pub fn to_argument(&self) -> String {
        match self {
            Self::Unix(p) => p.display().to_string(),
            Self::Tcp(a) => a.port().to_string(),
        }
    }
}

impl std::fmt::Display for WorkerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
            Self::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// A way to reach workers: readiness, a shared per-worker channel, and one connection per
/// session: the transport hooks of Spark's `DirectWorkerDispatcher` (`connectWorker`,
/// `newSession`, implemented by `DirectGrpcDispatcher`; udf §6.2, §6.4), so the framed
/// transport and gRPC share one dispatcher.
pub trait WorkerTransport: Send + Sync + 'static {
    /// State shared by all sessions of one worker (e.g. a gRPC channel; `()` for framed):
    /// Spark's `WorkerConnection` (udf §3).
    type Channel: Send + Sync + 'static;
    /// One session's connection to the worker: its `Execute` stream (udf §1.1).
    type Connection: Connection<UdfRequest, UdfResponse> + Send + Unpin + 'static;

    /// Tries once to reach the worker at `address` (Spark's `connectWorker`, udf §6.2
    /// step 4). `Ok` means the worker serves sessions now (a socket file alone is not
    /// readiness, udf §6.4); dispatchers call it in a loop until their readiness deadline.
    fn connect<'a>(
        &'a self,
        address: &'a WorkerAddress,
    ) -> BoxFuture<'a, io::Result<Self::Channel>>;

    /// Opens the connection of a new session on `channel` (Spark's `newSession`, udf §6.4;
    /// each session opens its own `Execute` stream on the shared channel, udf §1.1).
    fn open_session<'a>(
        &'a self,
        channel: &'a Self::Channel,
        address: &'a WorkerAddress,
    ) -> BoxFuture<'a, io::Result<Self::Connection>>;

    /// Whether `channel` is still usable (udf §3 `WorkerConnection.isActive`).
    fn is_active(&self, channel: &Self::Channel) -> bool {
        let _ = channel;
        true
    }
}

/// The framed transport ([`crate::connection::framed`]): a fresh socket connection per
/// session; readiness is a successful connect (the probe connection is closed at once, which
/// a tether worker treats as a session that never started). tether's own, in place of
/// Spark's gRPC channel over the worker's socket (udf §6.4).
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Default)]
pub struct FramedTransport {
    /// Frame settings of every connection (default: 128 MiB frames, Spark's gRPC message
    /// limit, udf §6.4).
    pub config: crate::connection::framed::FramedConfig,
}

#[cfg(feature = "tokio")]
impl WorkerTransport for FramedTransport {
    type Channel = ();
    type Connection = FramedSessionConnection;

    fn connect<'a>(&'a self, address: &'a WorkerAddress) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            match address {
                WorkerAddress::Unix(p) => drop(tokio::net::UnixStream::connect(p).await?),
                WorkerAddress::Tcp(a) => drop(tokio::net::TcpStream::connect(a).await?),
            }
            Ok(())
        })
    }

    fn open_session<'a>(
        &'a self,
        _channel: &'a (),
        address: &'a WorkerAddress,
    ) -> BoxFuture<'a, io::Result<FramedSessionConnection>> {
        use crate::connection::framed::{connect_tcp, connect_unix};
        Box::pin(async move {
            Ok(match address {
                WorkerAddress::Unix(p) => {
                    FramedSessionConnection::Unix(connect_unix(p, &self.config).await?)
                }
                WorkerAddress::Tcp(a) => {
                    FramedSessionConnection::Tcp(connect_tcp(*a, &self.config).await?)
                }
            })
        })
    }
}

/// The engine side of a framed session connection: Unix or TCP (udf §1.9
/// `WorkerConnectionSpec`), carrying one `Execute` stream (udf §1.1).
#[cfg(feature = "tokio")]
pub type FramedSessionConnection =
    crate::connection::framed::SocketConnection<UdfRequest, UdfResponse>;
