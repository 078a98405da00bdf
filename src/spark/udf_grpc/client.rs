//! Engine side: the per-worker channel, one `Execute` stream per session, `Manage` calls.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::channel::mpsc;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Sink, Stream, StreamExt};
use http::Uri;
use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tonic::client::Grpc;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};
use tonic_prost::ProstCodec;

use super::{EXECUTE_PATH, GrpcConfig, MANAGE_PATH, StatusError};
use crate::connection::framed::{SocketPathError, socket_path_error};
use crate::connection::{Connection, ConnectionError};
use crate::wire::{
    Heartbeat, HeartbeatResponse, ShutdownRequest, ShutdownResponse, UdfRequest, UdfResponse,
    WorkerRequest, WorkerResponse, worker_request, worker_response,
};
use crate::worker::engine::{WorkerAddress, WorkerTransport};

/// Why a typed `Manage` call ([`GrpcChannel::heartbeat`], [`GrpcChannel::shutdown`]) failed
/// (udf §1.7).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ManageCallError {
    /// The RPC failed: the worker answered a non-OK status (e.g. `INVALID_ARGUMENT`,
    /// `UNIMPLEMENTED`) or the channel failed (`UNAVAILABLE`, …). The status is the source.
    #[error("Manage RPC failed")]
    Status(#[from] Status),
    /// The worker did not answer within [`GrpcConfig::manage_timeout`].
    #[error("Manage RPC not answered within {0:?}")]
    Timeout(Duration),
    /// The response's branch does not match the request's (or is unset): a protocol error
    /// (udf §1.7 "branch MUST match the request").
    #[error("Manage response branch {got} does not match the {expected} request")]
    MismatchedResponse {
        /// The branch the request set (`"heartbeat"` or `"shutdown"`).
        expected: &'static str,
        /// The branch the response set (`"heartbeat"`, `"shutdown"` or `"none"`).
        got: &'static str,
    },
}

/// The engine's channel to one worker (udf §6.4 `GrpcWorkerChannel`): one HTTP/2 connection
/// over the worker's Unix socket (or loopback TCP port), shared by all of the worker's
/// sessions' `Execute` streams, and a second one for `Manage` calls. Cheap to clone (clones
/// share the connections).
///
/// `Manage` has its own connection because a worker limits its concurrent streams per
/// connection ([`GrpcConfig::max_concurrent_streams`], 256 by default): once that many
/// sessions are open, a further `Execute` stream waits in the channel for one to end, and a
/// heartbeat sharing their connection would wait behind it and time out although the worker
/// is alive (udf §1.7: heartbeats prove liveness). Spark's engine uses one connection
/// against a worker without a limit (udf §1.1); the split keeps its behaviour and adds the
/// bound. The `Manage` connection is made on the first `Manage` call.
///
/// Requests carry `:authority` `localhost`; messages up to [`GrpcConfig::max_message_size`]
/// pass both ways; the HTTP/2 windows are [`GrpcConfig::stream_window`] and
/// [`GrpcConfig::connection_window`] (see the [module docs](super) for why). A broken
/// connection is re-established on the next call (tonic reconnects), so, as in Spark,
/// transient failures leave the channel [active](Self::is_active); only [`close`](Self::close)
/// deactivates it.
#[derive(Clone)]
pub struct GrpcChannel {
    inner: Arc<ChannelInner>,
}

struct ChannelInner {
    /// `None` once closed.
    channels: Mutex<Option<Channels>>,
    address: WorkerAddress,
    config: GrpcConfig,
}

/// The two HTTP/2 connections of a [`GrpcChannel`]: `Execute` streams on one, `Manage` calls
/// on the other (so they never queue behind the worker's concurrent-stream limit).
#[derive(Clone)]
struct Channels {
    execute: Channel,
    manage: Channel,
}

impl fmt::Debug for GrpcChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcChannel")
            .field("address", &self.inner.address)
            .field("active", &self.is_active())
            .finish()
    }
}

impl GrpcChannel {
    /// Connects to the worker at `address` and checks once that it serves (udf §6.4
    /// readiness): the socket connects, the HTTP/2 connection is set up, and — with
    /// [`GrpcConfig::readiness_heartbeat`] — a `Manage` heartbeat is answered (any answer
    /// from the worker, including `UNIMPLEMENTED`, proves it serves gRPC). The whole
    /// attempt is bounded by [`GrpcConfig::connect_timeout`]. Dispatchers call it in a loop
    /// until their readiness deadline. Must run inside a tokio runtime.
    ///
    /// # Errors
    /// The socket error (its kind kept: `NotFound`, `ConnectionRefused`, …), `TimedOut`
    /// when the attempt exceeded its bound, or another error when the worker answered the
    /// heartbeat with a transport failure.
    pub async fn connect(address: &WorkerAddress, config: &GrpcConfig) -> io::Result<Self> {
        let bound = config.connect_timeout;
        let attempt = async {
            let channel = tonic_endpoint(config)
                .connect_with_connector(connector(address.clone()))
                .await
                .map_err(|e| {
                    io_error(e, format!("could not connect to the worker at {address}"))
                })?;
            let channel = Self::from_channel(channel, address.clone(), config.clone());
            if config.readiness_heartbeat {
                channel.probe().await?;
            }
            Ok(channel)
        };
        tokio::time::timeout(bound, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the worker at {address} did not become reachable within {bound:?}"),
                ))
            })
    }

    /// A channel that connects on first use, without the readiness check of udf §6.4 (a
    /// missing worker then surfaces as a transport failure of the first session). Must be
    /// called inside a tokio runtime. Without the check, sessions opened in a burst before
    /// the worker's HTTP/2 settings arrive may exceed its concurrent-stream limit; the
    /// streams past it are refused (`REFUSED_STREAM`: never seen by the worker, safe to run
    /// again) and those sessions fail as transport failures. [`connect`](Self::connect)
    /// waits for the settings.
    pub fn connect_lazy(address: &WorkerAddress, config: &GrpcConfig) -> Self {
        let channel =
            tonic_endpoint(config).connect_with_connector_lazy(connector(address.clone()));
        Self::from_channel(channel, address.clone(), config.clone())
    }

    fn from_channel(execute: Channel, address: WorkerAddress, config: GrpcConfig) -> Self {
        let manage =
            tonic_endpoint(&config).connect_with_connector_lazy(connector(address.clone()));
        Self {
            inner: Arc::new(ChannelInner {
                channels: Mutex::new(Some(Channels { execute, manage })),
                address,
                config,
            }),
        }
    }

    /// One readiness round trip: any answer from the worker is readiness. It runs on the
    /// `Execute` connection, so that the worker's HTTP/2 `SETTINGS` (its concurrent-stream
    /// limit among them) have arrived before the first session opens a stream: a burst of
    /// streams sent before them could exceed the limit and be refused.
    async fn probe(&self) -> io::Result<()> {
        let heartbeat = WorkerRequest {
            manage: Some(worker_request::Manage::Heartbeat(Heartbeat {})),
        };
        match self.call_manage(|c| &c.execute, heartbeat).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::Unimplemented => Ok(()),
            Err(status) => Err(io_error(
                StatusError::from(status),
                format!(
                    "the worker at {} did not answer the readiness heartbeat",
                    self.inner.address
                ),
            )),
        }
    }

    /// Where the worker listens (the `--connection` address, udf §1.9).
    pub fn address(&self) -> &WorkerAddress {
        &self.inner.address
    }

    /// The settings this channel was built with ([`GrpcConfig`], udf §6.4).
    pub fn config(&self) -> &GrpcConfig {
        &self.inner.config
    }

    /// Whether the channel is usable: true until [`close`](Self::close) (udf §6.4
    /// `isActive`: transient connection failures count as usable, the next call reconnects).
    pub fn is_active(&self) -> bool {
        self.lock().is_some()
    }

    /// Closes the channel: no new session or `Manage` call can use it. Idempotent. Sessions
    /// already open keep their streams until they end; each HTTP/2 connection closes when the
    /// last call on it is gone. This is the first step of Spark's `GrpcWorkerChannel.close()`
    /// (gRPC `shutdown`, udf §6.4), without its forced `shutdownNow`.
    pub fn close(&self) {
        self.lock().take();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Channels>> {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A gRPC client on the `Execute` or the `Manage` connection.
    fn grpc(&self, pick: fn(&Channels) -> &Channel) -> Result<Grpc<Channel>, Status> {
        let channel = self
            .lock()
            .as_ref()
            .map(|channels| pick(channels).clone())
            .ok_or_else(|| Status::unavailable("the worker channel is closed"))?;
        let max = self.inner.config.max_message_size;
        Ok(Grpc::new(channel)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max))
    }

    /// Opens a new session's `Execute` stream on this channel (udf §1.1: one stream per
    /// session). Nothing is awaited: the stream is set up as the session first sends or
    /// receives, and a failure to set it up surfaces there as a transport error (gRPC
    /// status), bounded by the session's init timeout.
    ///
    /// # Errors
    /// `NotConnected` after [`close`](Self::close).
    pub fn open_session(&self) -> io::Result<GrpcEngineConnection> {
        let grpc = self
            .grpc(|c| &c.execute)
            .map_err(|s| io::Error::new(io::ErrorKind::NotConnected, s.message().to_owned()))?;
        Ok(GrpcEngineConnection::open(grpc, &self.inner.config))
    }

    /// Calls `Manage` once with `request` as given (udf §1.7), on the channel's `Manage`
    /// connection, without a deadline and without checking the response branch; see [`heartbeat`](Self::heartbeat) and
    /// [`shutdown`](Self::shutdown) for the checked forms.
    ///
    /// # Errors
    /// The gRPC status: the worker's (an empty `WorkerRequest` gives `INVALID_ARGUMENT`) or
    /// the channel's (`UNAVAILABLE` when the worker cannot be reached; closed channel).
    pub async fn manage(&self, request: WorkerRequest) -> Result<WorkerResponse, Status> {
        self.call_manage(|c| &c.manage, request).await
    }

    /// One `Manage` call on the connection `pick` chooses.
    async fn call_manage(
        &self,
        pick: fn(&Channels) -> &Channel,
        request: WorkerRequest,
    ) -> Result<WorkerResponse, Status> {
        let mut grpc = self.grpc(pick)?;
        grpc.ready()
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?;
        let codec = ProstCodec::<WorkerRequest, WorkerResponse>::default();
        let response = grpc
            .unary(
                tonic::Request::new(request),
                PathAndQuery::from_static(MANAGE_PATH),
                codec,
            )
            .await?;
        Ok(response.into_inner())
    }

    /// [`manage`](Self::manage) within [`GrpcConfig::manage_timeout`].
    async fn manage_bounded(
        &self,
        request: WorkerRequest,
    ) -> Result<WorkerResponse, ManageCallError> {
        let limit = self.inner.config.manage_timeout;
        Ok(tokio::time::timeout(limit, self.manage(request))
            .await
            .map_err(|_| ManageCallError::Timeout(limit))??)
    }

    /// Sends a `Heartbeat` and returns the worker's `HeartbeatResponse` (worker-global
    /// metrics), within [`GrpcConfig::manage_timeout`] (udf §1.7: application liveness).
    ///
    /// # Errors
    /// See [`ManageCallError`].
    pub async fn heartbeat(&self) -> Result<HeartbeatResponse, ManageCallError> {
        let request = WorkerRequest {
            manage: Some(worker_request::Manage::Heartbeat(Heartbeat {})),
        };
        match self.manage_bounded(request).await?.manage {
            Some(worker_response::Manage::Heartbeat(h)) => Ok(h),
            other => Err(mismatch("heartbeat", &other)),
        }
    }

    /// Sends a `ShutdownRequest` and returns the `ShutdownResponse`
    /// (`sessions_settled`), within [`GrpcConfig::manage_timeout`] (udf §1.7). Do not send
    /// it while sessions are still to be opened on this worker.
    ///
    /// # Errors
    /// See [`ManageCallError`].
    pub async fn shutdown(
        &self,
        request: ShutdownRequest,
    ) -> Result<ShutdownResponse, ManageCallError> {
        let request = WorkerRequest {
            manage: Some(worker_request::Manage::Shutdown(request)),
        };
        match self.manage_bounded(request).await?.manage {
            Some(worker_response::Manage::Shutdown(s)) => Ok(s),
            other => Err(mismatch("shutdown", &other)),
        }
    }
}

/// The error for a `Manage` response whose branch is not the `expected` one.
fn mismatch(expected: &'static str, got: &Option<worker_response::Manage>) -> ManageCallError {
    let got = match got {
        Some(worker_response::Manage::Heartbeat(_)) => "heartbeat",
        Some(worker_response::Manage::Shutdown(_)) => "shutdown",
        None => "none",
    };
    ManageCallError::MismatchedResponse { expected, got }
}

/// The tonic endpoint: `http://localhost` (the `:authority`), plaintext, deliberate windows.
fn tonic_endpoint(config: &GrpcConfig) -> Endpoint {
    Endpoint::from_static("http://localhost")
        .connect_timeout(config.connect_timeout)
        .initial_stream_window_size(config.stream_window)
        .initial_connection_window_size(config.connection_window)
        .http2_adaptive_window(false)
        .max_frame_size(config.max_frame_size)
}

/// A boxed byte stream to the worker: a Unix or a TCP socket.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// A connected socket, as hyper reads and writes it.
type Socket = TokioIo<Box<dyn Io>>;

/// Connects every (re)connection of the channel to the worker's socket; the URI (always
/// `http://localhost`) is ignored.
fn connector(
    address: WorkerAddress,
) -> impl tower::Service<
    Uri,
    Response = Socket,
    Error = io::Error,
    Future = BoxFuture<'static, io::Result<Socket>>,
> + Send
+ 'static {
    tower::service_fn(move |_: Uri| {
        let address = address.clone();
        let connect: BoxFuture<'static, io::Result<Socket>> = Box::pin(async move {
            let io: Box<dyn Io> = match &address {
                WorkerAddress::Unix(path) => Box::new(
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map_err(|e| socket_path_error("connect to", path, e))?,
                ),
                WorkerAddress::Tcp(addr) => {
                    let stream = tokio::net::TcpStream::connect(addr).await?;
                    stream.set_nodelay(true)?;
                    Box::new(stream)
                }
            };
            Ok(TokioIo::new(io))
        });
        connect
    })
}

/// An `io::Error` for `error`, of the kind of the first `io::Error` in its source chain:
/// that socket error itself when it names the socket, else `context` with `error` as its
/// source.
fn io_error(error: impl Into<Box<dyn StdError + Send + Sync>>, context: String) -> io::Error {
    let error = error.into();
    let mut kind = io::ErrorKind::Other;
    let mut cause: Option<&(dyn StdError + 'static)> = Some(&*error);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            let named = io
                .get_ref()
                .and_then(|e| e.downcast_ref::<SocketPathError>());
            if let Some(named) = named {
                return socket_path_error(named.action(), named.path(), named.os_error());
            }
            kind = io.kind();
            break;
        }
        cause = e.source();
    }
    io::Error::new(
        kind,
        ContextError {
            context,
            source: error,
        },
    )
}

/// What was being done, with the error that stopped it as the source.
#[derive(Debug)]
struct ContextError {
    context: String,
    source: Box<dyn StdError + Send + Sync>,
}

impl fmt::Display for ContextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)
    }
}

impl StdError for ContextError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

type ExecuteCall = BoxFuture<'static, Result<Streaming<UdfResponse>, Status>>;

enum Responses {
    /// The call is being set up (request headers out, response headers awaited).
    Opening(ExecuteCall),
    /// The response headers arrived: messages stream in.
    Open(Box<Streaming<UdfResponse>>),
    /// The response stream ended (cleanly or not).
    Ended,
}

/// The engine side of one session's `Execute` stream (udf §1.1: one stream per
/// session; the request observer and response stream of Spark's `GrpcWorkerSession`): a
/// [`Connection<UdfRequest, UdfResponse>`](Connection) for
/// [`Session::new`](crate::worker::engine::Session::new). Obtained from
/// [`GrpcChannel::open_session`].
///
/// - Sending: requests go through a bounded queue ([`GrpcConfig::request_buffer`] messages)
///   into the streaming request body; beyond it `poll_ready` waits for HTTP/2 flow control
///   (the worker's stream window).
/// - Receiving: responses come from the gRPC response stream. A gRPC status error (non-OK
///   trailers, a reset stream, a broken connection) is a transport failure
///   ([`ConnectionError::Transport`] holding the [`Status`]); a clean end of the response
///   stream (OK trailers) is `Ready(None)`, the stream end.
/// - A stream the worker refuses (`REFUSED_STREAM`, which it sends for a stream past its
///   concurrent-stream limit, [`GrpcConfig::max_concurrent_streams`]) was not processed at
///   all (RFC 9113 §8.7), so it is opened again with the requests sent so far, as gRPC's own
///   clients retry such streams transparently (up to 64 times per session; then the
///   refusal is the session's transport failure). The requests are kept only until the
///   worker's response headers arrive.
/// - `poll_close` half-closes the request side cleanly (`END_STREAM`, udf §2 R9). Dropping the
///   connection without closing it cancels the stream (`RST_STREAM(CANCEL)`), so the worker
///   stops sending to it. A tonic worker sees that reset as a plain end of the request
///   stream, which is why only an explicit `Finish` message finishes a session and a
///   [`Session`](crate::worker::engine::Session) sends `Cancel` before it lets go of the stream.
/// - Dropping a connection whose request side was closed cleanly lets the call complete: if
///   the worker's trailers have not arrived yet, a background task on the current tokio
///   runtime reads the response stream to its end (at most 5 s), as grpc-java lets Spark's
///   engine's half-closed calls run to `onCompleted`. Resetting instead would, under many
///   concurrent sessions, make the engine's HTTP/2 connection fail every session on it
///   (h2's limit on locally reset streams; hostile-input catalog row 13).
pub struct GrpcEngineConnection {
    grpc: Grpc<Channel>,
    requests: mpsc::Sender<UdfRequest>,
    responses: Responses,
    /// Every request sent while the call is being set up: what a refused stream's new
    /// attempt sends again. Emptied once the response headers arrive.
    replay: Vec<UdfRequest>,
    /// Streams of this session the worker refused so far.
    refusals: u32,
    request_buffer: usize,
    failure: Option<Status>,
    cancel: Option<tonic::CancellationHandle>,
    aborted: bool,
    send_closed: bool,
    recv_ended: bool,
}

/// The most times one session's `Execute` stream is opened again after the worker refused it
/// (`REFUSED_STREAM`); the next refusal fails the session as a transport failure.
const MAX_REFUSALS: u32 = 64;

impl fmt::Debug for GrpcEngineConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.responses {
            Responses::Opening(_) => "opening",
            Responses::Open(_) => "open",
            Responses::Ended => "ended",
        };
        f.debug_struct("GrpcEngineConnection")
            .field("responses", &state)
            .field("refusals", &self.refusals)
            .field("failure", &self.failure)
            .field("send_closed", &self.send_closed)
            .field("recv_ended", &self.recv_ended)
            .finish()
    }
}

impl GrpcEngineConnection {
    fn open(grpc: Grpc<Channel>, config: &GrpcConfig) -> Self {
        let request_buffer = config.request_buffer.max(1);
        let (requests, body) = mpsc::channel(request_buffer - 1);
        let (call, cancel) = Self::call(grpc.clone(), body.boxed());
        Self {
            grpc,
            requests,
            responses: Responses::Opening(call),
            replay: Vec::new(),
            refusals: 0,
            request_buffer,
            failure: None,
            cancel: Some(cancel),
            aborted: false,
            send_closed: false,
            recv_ended: false,
        }
    }

    /// Starts one `Execute` call whose request body is `body`.
    fn call(
        mut grpc: Grpc<Channel>,
        body: BoxStream<'static, UdfRequest>,
    ) -> (ExecuteCall, tonic::CancellationHandle) {
        let mut request = tonic::Request::new(body);
        let cancel = request.cancellation_handle();
        let call: ExecuteCall = Box::pin(async move {
            grpc.ready()
                .await
                .map_err(|e| Status::from_error(Box::new(e)))?;
            let codec = ProstCodec::<UdfRequest, UdfResponse>::default();
            let response = grpc
                .streaming(request, PathAndQuery::from_static(EXECUTE_PATH), codec)
                .await?;
            Ok(response.into_inner())
        });
        (call, cancel)
    }

    /// Opens the stream again after the worker refused it: a new call whose body first
    /// sends every request sent so far, then whatever the session sends next.
    fn reopen(&mut self) {
        let (requests, body) = mpsc::channel(self.request_buffer - 1);
        let body = futures::stream::iter(self.replay.clone())
            .chain(body)
            .boxed();
        let (call, cancel) = Self::call(self.grpc.clone(), body);
        self.requests = requests;
        if self.send_closed {
            self.requests.close_channel();
            self.cancel = None;
        } else {
            self.cancel = Some(cancel);
        }
        self.responses = Responses::Opening(call);
    }

    /// Cancels the stream at once (`RST_STREAM(CANCEL)`) unless the request side was already
    /// closed cleanly; nothing more can be sent. Dropping an unclosed connection does the
    /// same. Spark's engine aborts the request side this way after a failure terminator
    /// (udf §2 R9, §5.2 step 4). It is no substitute for the protocol's `Cancel` message: a
    /// tonic worker sees the reset as a plain end of the request stream.
    pub fn abort(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            cancel.cancel();
        }
        self.aborted = true;
        self.send_closed = true;
    }

    /// Drives the call set-up; records a set-up failure. A stream the worker refused
    /// (`REFUSED_STREAM`: it processed nothing of it, RFC 9113 §8.7) is opened again with the
    /// requests sent so far, up to [`MAX_REFUSALS`] times: a worker at its concurrent-stream
    /// limit ([`GrpcConfig::max_concurrent_streams`]) may count a stream the engine already
    /// saw end, and refuse the next one.
    fn drive_call(&mut self, cx: &mut Context<'_>) {
        while let Responses::Opening(call) = &mut self.responses {
            match call.as_mut().poll(cx) {
                Poll::Ready(Ok(stream)) => {
                    self.responses = Responses::Open(Box::new(stream));
                    self.replay = Vec::new();
                }
                Poll::Ready(Err(status))
                    if is_refused(&status) && !self.aborted && self.refusals < MAX_REFUSALS =>
                {
                    self.refusals += 1;
                    tracing::debug!(
                        refusals = self.refusals,
                        "the worker refused the Execute stream; opening it again"
                    );
                    self.reopen();
                }
                Poll::Ready(Err(status)) => {
                    tracing::debug!(%status, "Execute call failed");
                    self.failure = Some(status);
                    self.responses = Responses::Ended;
                    self.replay = Vec::new();
                }
                Poll::Pending => return,
            }
        }
    }

    fn send_error(&self) -> ConnectionError {
        match &self.failure {
            Some(status) => ConnectionError::from(StatusError::from(status.clone())),
            None => ConnectionError::Closed,
        }
    }
}

impl Connection<UdfRequest, UdfResponse> for GrpcEngineConnection {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        self.drive_call(cx);
        if self.failure.is_some() || self.send_closed {
            return Poll::Ready(Err(self.send_error()));
        }
        match Sink::poll_ready(Pin::new(&mut self.requests), cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(_)) => Poll::Ready(Err(self.send_error())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn start_send(&mut self, msg: UdfRequest) -> Result<(), ConnectionError> {
        if self.send_closed {
            return Err(self.send_error());
        }
        if matches!(self.responses, Responses::Opening(_)) {
            // Cheap: a request's payloads are reference-counted `Bytes`.
            self.replay.push(msg.clone());
        }
        Sink::start_send(Pin::new(&mut self.requests), msg).map_err(|_| self.send_error())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        self.drive_call(cx);
        if let Some(status) = &self.failure {
            return Poll::Ready(Err(ConnectionError::from(StatusError::from(
                status.clone(),
            ))));
        }
        Sink::poll_flush(Pin::new(&mut self.requests), cx).map_err(|_| self.send_error())
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        self.drive_call(cx);
        // A clean half-close: queued requests still go out, then END_STREAM.
        self.send_closed = true;
        self.cancel = None;
        self.requests.close_channel();
        Poll::Ready(Ok(()))
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<UdfResponse, ConnectionError>>> {
        self.drive_call(cx);
        if self.recv_ended {
            return Poll::Ready(None);
        }
        if let Some(status) = &self.failure {
            self.recv_ended = true;
            return Poll::Ready(Some(Err(ConnectionError::from(StatusError::from(
                status.clone(),
            )))));
        }
        let Responses::Open(stream) = &mut self.responses else {
            return Poll::Pending;
        };
        match Pin::new(&mut **stream).poll_next(cx) {
            Poll::Ready(Some(Ok(msg))) => Poll::Ready(Some(Ok(msg))),
            Poll::Ready(Some(Err(status))) => {
                self.recv_ended = true;
                self.responses = Responses::Ended;
                self.failure = Some(status.clone());
                Poll::Ready(Some(Err(ConnectionError::from(StatusError::from(status)))))
            }
            Poll::Ready(None) => {
                self.recv_ended = true;
                self.responses = Responses::Ended;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_active(&self) -> bool {
        self.failure.is_none() && !(self.recv_ended && self.send_closed)
    }
}

impl Drop for GrpcEngineConnection {
    fn drop(&mut self) {
        // Not closed cleanly: reset the stream so the worker sees an abort.
        if let Some(cancel) = self.cancel.take() {
            cancel.cancel();
            return;
        }
        // Closed cleanly but the worker's trailers are still on their way: let the call
        // complete instead of resetting it.
        if !self.aborted
            && let Responses::Open(stream) =
                std::mem::replace(&mut self.responses, Responses::Ended)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(read_to_end(stream));
        }
    }
}

/// How long a dropped [`GrpcEngineConnection`] whose request side was closed cleanly keeps
/// reading its response stream in the background, waiting for the worker's trailers.
const TRAILERS_BOUND: Duration = Duration::from_secs(5);

/// Reads a cleanly half-closed session's response stream to its end (the worker's trailers,
/// udf §1.1), within [`TRAILERS_BOUND`], so that the call completes as in Spark's engine
/// (grpc-java lets a half-closed call run to `onCompleted`) rather than ending with
/// `RST_STREAM(CANCEL)`. Dropping it early would also make the engine's HTTP/2 connection
/// forget the stream once more than a few dozen such resets are pending, answer the
/// trailers with `RST_STREAM(STREAM_CLOSED)`, and, past h2's limit of 1024 such local
/// resets per connection, tear the whole connection down with `ENHANCE_YOUR_CALM`, failing
/// every session on it (`RESOURCE_EXHAUSTED`). Messages still arriving are ignored and
/// logged, as the engine core does with messages after a terminal (udf §4.5).
async fn read_to_end(mut stream: Box<Streaming<UdfResponse>>) {
    let drain = async {
        let mut late = 0_usize;
        while let Some(item) = stream.next().await {
            match item {
                Ok(_) => late += 1,
                Err(status) => {
                    tracing::debug!(%status, "the response stream of a closed session failed");
                    break;
                }
            }
        }
        if late > 0 {
            tracing::warn!(
                messages = late,
                "ignored messages the worker sent on a closed session's stream after it was dropped (udf §4.5)"
            );
        }
    };
    if tokio::time::timeout(TRAILERS_BOUND, drain).await.is_err() {
        tracing::debug!(
            bound = ?TRAILERS_BOUND,
            "the worker did not end a closed session's response stream in time; resetting it"
        );
    }
}

/// Whether `status` is the worker's refusal of a stream it did not process
/// (`RST_STREAM(REFUSED_STREAM)`, RFC 9113 §8.7), found in its chain of sources.
fn is_refused(status: &Status) -> bool {
    let mut source: Option<&(dyn StdError + 'static)> = StdError::source(status);
    while let Some(error) = source {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        source = error.source();
    }
    false
}

/// The gRPC transport for dispatchers (udf §6.4): one [`GrpcChannel`] per worker, one
/// `Execute` stream per session on it.
#[derive(Debug, Clone, Default)]
pub struct GrpcTransport {
    /// Settings of every channel this transport opens (udf §6.4).
    pub config: GrpcConfig,
}

impl GrpcTransport {
    /// A transport with the given settings ([`GrpcConfig::default`] holds the values of
    /// Spark's `DirectGrpcDispatcher` channels, udf §6.4).
    pub fn new(config: GrpcConfig) -> Self {
        Self { config }
    }
}

impl WorkerTransport for GrpcTransport {
    type Channel = GrpcChannel;
    type Connection = GrpcEngineConnection;

    /// [`GrpcChannel::connect`]: one bounded readiness attempt.
    fn connect<'a>(&'a self, address: &'a WorkerAddress) -> BoxFuture<'a, io::Result<GrpcChannel>> {
        Box::pin(GrpcChannel::connect(address, &self.config))
    }

    /// [`GrpcChannel::open_session`]: a new `Execute` stream on the shared channel.
    fn open_session<'a>(
        &'a self,
        channel: &'a GrpcChannel,
        _endpoint: &'a WorkerAddress,
    ) -> BoxFuture<'a, io::Result<GrpcEngineConnection>> {
        Box::pin(std::future::ready(channel.open_session()))
    }

    /// [`GrpcChannel::is_active`].
    fn is_active(&self, channel: &GrpcChannel) -> bool {
        channel.is_active()
    }
}
