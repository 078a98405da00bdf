//! The official `UdfWorker` gRPC service over a Unix socket (udf §1.1, §1.7, §6.4), both
//! sides, written by hand against tonic's codegen API.
//!
//! ```text
//! service org.apache.spark.udf.worker.UdfWorker {
//!   rpc Execute(stream UdfRequest) returns (stream UdfResponse);   // one stream = one session
//!   rpc Manage(WorkerRequest)      returns (WorkerResponse);       // unary, worker-scoped
//! }
//! ```
//!
//! # Engine side
//!
//! [`GrpcChannel::connect`] opens one HTTP/2 channel to a worker's socket (plaintext,
//! `:authority` `localhost` — a socket path is not a valid HTTP authority, udf §6.4) and
//! proves the worker serves before returning. Every session then opens its own `Execute`
//! stream on that shared channel with [`GrpcChannel::open_session`], which gives a
//! [`GrpcEngineConnection`]: a [`Connection<UdfRequest, UdfResponse>`](crate::connection::Connection)
//! for [`Session::new`](crate::worker::engine::Session::new). [`GrpcTransport`] packages this as a
//! [`WorkerTransport`](crate::worker::engine::WorkerTransport) for dispatchers.
//! [`GrpcChannel::heartbeat`] and [`GrpcChannel::shutdown`] call `Manage`, on a second
//! connection of the channel, so they never wait behind the worker's concurrent-stream
//! limit ([`GrpcConfig::max_concurrent_streams`], 256 by default; past it, further
//! sessions' streams wait in the channel until one ends).
//!
//! # Worker side
//!
//! [`WorkerMain`] is a whole worker process: `WorkerMain::new(|| MyUdf).run()` in `main`
//! parses the dispatcher's `--id` / `--connection` arguments ([`WorkerArgs`], udf §1.9),
//! serves this service on the socket with one fresh [`Udf`](crate::worker::endpoint::Udf)
//! per session, and stops gracefully on SIGTERM, on a `Manage` shutdown or when the engine
//! that started it is gone. The rest of this section is what it is built from.
//!
//! Clients of a tether worker must send a valid `:authority` such as `localhost`, as
//! Spark's engine and [`GrpcChannel`] do (udf §6.4). A stock gRPC client whose `:authority`
//! is the socket path cannot reach a tonic server on a Unix socket: hyper's HTTP/2 layer
//! rejects it as malformed before the service sees the request, resetting every stream with
//! `PROTOCOL_ERROR` (hyperium/h2#487). grpcio, for one, sends the percent-encoded path for a
//! `unix:` target. The one-line overrides:
//!
//! - grpcio (Python): the channel option `("grpc.default_authority", "localhost")`;
//! - grpc-java: `overrideAuthority("localhost")` on the channel builder;
//! - grpcurl: `-authority localhost` (with `-unix`).
//!
//! For tools that cannot set it, serve the service on loopback TCP as well
//! ([`WorkerServer::bind_tcp`] on `127.0.0.1:0`).
//!
//! [`WorkerService`] is the service (a `tower::Service` with
//! [`NamedService::NAME`](tonic::server::NamedService::NAME) = [`SERVICE_NAME`], so it also
//! mounts on a `tonic::transport::Server`); each `Execute` stream reaches a callback as a
//! [`GrpcWorkerConnection`] (a `Connection<UdfResponse, UdfRequest>`, typically handed to
//! [`endpoint::serve`](crate::worker::endpoint::serve)), and `Manage` is answered by
//! [`handle_manage`](crate::worker::endpoint::handle_manage) or a handler of your own.
//! [`WorkerServer::bind_unix`] serves it on the worker's `--connection` path, with a
//! graceful [`shutdown`](WorkerServer::shutdown).
//!
//! # Stream ends are never a Finish
//!
//! Over gRPC an aborted request stream can look like a clean half-close — literally so with
//! hyper and tonic, which hand a client's `RST_STREAM(CANCEL)` to the server as a clean end of
//! the request stream. So only an explicit `Finish` message finishes a session (udf §2):
//!
//! - the worker endpoint treats a request stream that ends before the session is done as a
//!   protocol violation (`ErrorResponse(ProtocolError)` + `CancelResponse`), never as Finish;
//! - an engine [`Session`](crate::worker::engine::Session) sends an explicit `Cancel` before it lets
//!   go of its stream (`close`, and the drop cleanup), then half-closes;
//! - a [`GrpcEngineConnection`] dropped without being closed cancels its stream
//!   (`RST_STREAM(CANCEL)`, gRPC's cancellation), so the worker stops sending to it; a
//!   [`GrpcWorkerConnection`] dropped without being closed ends the response stream with the
//!   gRPC status `ABORTED`, which the engine reports as a transport failure, never as a clean
//!   end.
//!
//! # Flow control and isolation
//!
//! HTTP/2 has two windows: one per stream and one for the whole connection. A receiver that
//! stops reading one stream keeps that stream's unread bytes — at most one stream window —
//! charged to the connection window until it reads them. hyper's server defaults both
//! windows to 1 MiB and its adaptive (BDP) mode sets both to the same estimate, so a single
//! session whose consumer stops reading would use up the whole connection window and stall
//! every other session on the worker. tether therefore sizes them deliberately on both ends
//! (the engine's windows govern worker output, the worker's govern engine input):
//! [`GrpcConfig::stream_window`] `W` = 1 MiB and [`GrpcConfig::connection_window`] = 64 × W,
//! adaptive windows off. Up to 63 sessions of one worker can stall with full windows while
//! the others keep their full throughput; memory stays bounded by `W` per stream and by the
//! connection window per worker connection. Backpressure inside one session is HTTP/2 flow
//! control plus small bounded queues ([`GrpcConfig::request_buffer`],
//! [`GrpcConfig::response_buffer`]); nothing is queued without bound.

mod client;
mod server;
mod worker_main;

use std::time::Duration;

pub use client::{GrpcChannel, GrpcEngineConnection, GrpcTransport, ManageCallError};
pub use server::{GrpcWorkerConnection, ShutdownHandle, WorkerServer, WorkerService};
pub use worker_main::{StopReason, USAGE, UsageError, WorkerArgs, WorkerMain, WorkerMainError};

/// The fully qualified service name, `org.apache.spark.udf.worker.UdfWorker` (udf §1.1).
pub const SERVICE_NAME: &str = "org.apache.spark.udf.worker.UdfWorker";

/// The HTTP/2 path of the bidirectional `Execute` RPC (udf §1.1; gRPC's
/// `/<service>/<method>`).
pub const EXECUTE_PATH: &str = "/org.apache.spark.udf.worker.UdfWorker/Execute";

/// The HTTP/2 path of the unary `Manage` RPC (udf §1.1, §1.7).
pub const MANAGE_PATH: &str = "/org.apache.spark.udf.worker.UdfWorker/Manage";

/// The `:authority` every request carries: `localhost` (udf §6.4; a Unix socket path is
/// not a valid HTTP authority and strict HTTP/2 servers reject it).
pub const AUTHORITY: &str = "localhost";

/// A gRPC status that ended an `Execute` stream (a non-OK trailer, a reset stream, a broken
/// connection): the transport error inside the [`ConnectionError`](crate::connection::ConnectionError)
/// both sides' connections report, so a session settles `TransportFailed` (udf §4.5) or ends
/// (udf §2 R8).
///
/// Its text is the status code and the worker's or engine's message, "gRPC status Aborted:
/// the worker dropped the Execute stream without closing it". When the status came from the
/// HTTP/2 layer, the underlying error (hyper's, h2's, the socket's) is the
/// [`source`](std::error::Error::source) and the message repeating it is left out.
#[derive(Debug, Clone)]
pub struct StatusError(tonic::Status);

impl StatusError {
    /// The gRPC status as tonic reported it (udf §1.1 `Execute`).
    pub fn status(&self) -> &tonic::Status {
        &self.0
    }

    /// The status's code (udf §1.1 `Execute`; the codes of gRPC's status model).
    pub fn code(&self) -> tonic::Code {
        self.0.code()
    }
}

impl From<tonic::Status> for StatusError {
    fn from(status: tonic::Status) -> Self {
        Self(status)
    }
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gRPC status {:?}", self.0.code())?;
        let message = self.0.message();
        let repeats_source =
            std::iter::successors(std::error::Error::source(&self.0), |e| e.source()).any(
                |source| {
                    let text = source.to_string();
                    !text.is_empty() && (message.contains(&text) || text.contains(message))
                },
            );
        if !message.is_empty() && !repeats_source {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

impl std::error::Error for StatusError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // Not the status itself: its own text repeats its source as a debug dump.
        std::error::Error::source(&self.0)
    }
}

impl From<StatusError> for crate::connection::ConnectionError {
    fn from(error: StatusError) -> Self {
        Self::transport(error)
    }
}

/// Settings of the gRPC transport, shared by the engine channel and the worker server. The
/// [`Default`] is what Spark's engine (`GrpcWorkerChannel`, udf §6.4) uses where Spark
/// defines a value (128 MiB messages, 5 s shutdown grace) and tether's isolation-preserving
/// windows elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcConfig {
    /// Largest encoded message, in bytes, either side sends or accepts (both the encoding
    /// and the decoding limit; udf §6.4 "max inbound message 128 MiB"). tonic's own default
    /// is 4 MiB, too small for Spark (udf §8.4 scenario 87 sends 5 MiB). A larger message
    /// fails the stream with a gRPC status (`RESOURCE_EXHAUSTED` / `OUT_OF_RANGE`), which the
    /// session reports as a transport failure. Default 128 MiB.
    pub max_message_size: usize,
    /// HTTP/2 initial stream window (`SETTINGS_INITIAL_WINDOW_SIZE`), in bytes: the most
    /// unread data one stream may hold at the receiver. Default 1 MiB (tether's; Spark
    /// relies on HTTP/2 flow control alone, udf §1.4). See the module docs.
    pub stream_window: u32,
    /// HTTP/2 connection window, in bytes: the most unread data all streams of one
    /// connection may hold together. Keep it several times
    /// [`stream_window`](Self::stream_window) so a stalled session cannot starve the others
    /// (all sessions of a worker share one connection, udf §1.1). Default 64 MiB (64 × the
    /// stream window). See the module docs.
    pub connection_window: u32,
    /// HTTP/2 `SETTINGS_MAX_FRAME_SIZE` this side accepts, in bytes (16 KiB ..= 16 MiB − 1);
    /// `None` keeps the protocol default of 16 KiB (udf §6.4 lists no frame-size setting
    /// for Spark's channel).
    pub max_frame_size: Option<u32>,
    /// Engine side: requests one session may queue before `poll_ready` waits for the
    /// HTTP/2 stream to take them (at least 1). Default 2 messages (tether's bound; Spark
    /// has no application-level flow control yet, udf §10 item 2).
    pub request_buffer: usize,
    /// Worker side: responses one session may queue before `poll_ready` waits for the
    /// HTTP/2 stream to take them (at least 1). Default 2 messages (back-pressure is HTTP/2
    /// flow control only, udf §1.4).
    pub response_buffer: usize,
    /// Worker side: most concurrent streams per HTTP/2 connection
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`), which bounds the sessions, and so the memory, one
    /// engine connection can open at once. A compliant engine's further streams wait in its
    /// channel until a session ends (none is lost; each still counts against its session's
    /// init timeout, udf §7); a client that ignores the setting gets `REFUSED_STREAM` for
    /// each stream past it. tether's [`GrpcChannel`] sends `Manage` on a connection of its
    /// own, so heartbeats never queue behind `Execute` streams (udf §1.7). `None` removes the
    /// limit (Spark's worker sets none, udf §1.1). Default 256 (tether's bound).
    pub max_concurrent_streams: Option<u32>,
    /// Engine side: bound of one readiness attempt in [`GrpcChannel::connect`] (socket
    /// connect plus the readiness heartbeat). Default 2 s (tether's; the dispatcher retries
    /// attempts until its readiness deadline, `initialization_timeout_ms`, udf §6.4, §7).
    pub connect_timeout: Duration,
    /// Engine side: whether [`GrpcChannel::connect`] proves readiness with a `Manage`
    /// heartbeat round trip (a socket that accepts but never speaks gRPC is not ready;
    /// udf §6.4 "a socket file alone is not readiness"). A worker that answers
    /// `UNIMPLEMENTED` for `Manage` still counts as ready. Default `true`.
    pub readiness_heartbeat: bool,
    /// Engine side: bound of one `Manage` call made through [`GrpcChannel::heartbeat`] or
    /// [`GrpcChannel::shutdown`]. Default 10 s (tether's; udf §1.7 asks only for "a small
    /// bound").
    pub manage_timeout: Duration,
    /// Worker side: how long a graceful [`WorkerServer::shutdown`] waits for open streams to
    /// end before closing their connections. Default 5 s: what Spark's engine waits in a
    /// channel `close()` (udf §6.4) and between SIGTERM and SIGKILL
    /// (`DEFAULT_GRACEFUL_TIMEOUT_MS`, udf §7).
    pub shutdown_grace: Duration,
}

impl GrpcConfig {
    /// The defaults listed on each field (Spark's values where udf §6.4 and §7 define one).
    pub fn new() -> Self {
        const MIB: u32 = 1024 * 1024;
        Self {
            max_message_size: 128 * 1024 * 1024,
            stream_window: MIB,
            connection_window: 64 * MIB,
            max_frame_size: None,
            request_buffer: 2,
            response_buffer: 2,
            max_concurrent_streams: Some(256),
            connect_timeout: Duration::from_secs(2),
            readiness_heartbeat: true,
            manage_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_derived_from_the_service_name() {
        assert_eq!(EXECUTE_PATH, format!("/{SERVICE_NAME}/Execute"));
        assert_eq!(MANAGE_PATH, format!("/{SERVICE_NAME}/Manage"));
    }

    #[test]
    fn default_windows_isolate_stalled_streams() {
        let c = GrpcConfig::default();
        assert_eq!(c.max_message_size, 128 << 20);
        assert!(c.connection_window >= 16 * c.stream_window);
    }
}
