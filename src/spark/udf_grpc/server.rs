//! Worker side: the `UdfWorker` service, its `Execute` streams as connections, and a Unix
//! socket server with graceful shutdown.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::future::{BoxFuture, Ready, ready};
use futures::{Sink, Stream};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tonic::server::{Grpc, NamedService, StreamingService, UnaryService};
use tonic::{Status, Streaming};
use tonic_prost::ProstCodec;

use super::{EXECUTE_PATH, GrpcConfig, MANAGE_PATH, SERVICE_NAME, StatusError};
use crate::connection::framed::socket_path_error;
use crate::connection::{Connection, ConnectionError};
use crate::wire::{ShutdownRequest, UdfRequest, UdfResponse, WorkerRequest, WorkerResponse};
use crate::worker::endpoint::{
    EndpointConfig, ManageError, Udf, WorkerControl, handle_manage, serve,
};

type ExecuteHandler = dyn Fn(GrpcWorkerConnection) + Send + Sync;
type ManageHandler = dyn Fn(WorkerRequest) -> Result<WorkerResponse, Status> + Send + Sync;

/// State shared by a service and the server running it: open streams, the shutdown signal.
#[derive(Debug)]
struct ServerState {
    active: AtomicUsize,
    shutdown: watch::Sender<bool>,
}

impl ServerState {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            active: AtomicUsize::new(0),
            shutdown: watch::Sender::new(false),
        })
    }
}

/// The `UdfWorker` service (udf §1.1, §1.7): `Execute` streams go to a callback as
/// [`GrpcWorkerConnection`]s, `Manage` to a handler.
///
/// It is a `tower::Service` over HTTP requests with
/// [`NamedService::NAME`] = [`SERVICE_NAME`], so besides [`WorkerServer`] it also mounts on
/// `tonic::transport::Server::builder().add_service(..)` next to other services. Cheap to
/// clone.
///
/// `Manage` default: [`handle_manage`] with a built-in [`WorkerControl`] whose heartbeat
/// reports `active_sessions` (open `Execute` streams) and whose shutdown answers
/// `sessions_settled = (no stream open)` and starts the graceful shutdown of the
/// [`WorkerServer`] running the service (in-flight streams finish normally; it does not
/// cancel them even when `cancel_sessions` is set — supply your own control for that).
/// An empty `WorkerRequest` is answered with the status `INVALID_ARGUMENT`.
#[derive(Clone)]
pub struct WorkerService {
    execute: Arc<ExecuteHandler>,
    manage: Option<Arc<ManageHandler>>,
    config: Arc<GrpcConfig>,
    state: Arc<ServerState>,
}

impl fmt::Debug for WorkerService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerService")
            .field("active_sessions", &self.active_sessions())
            .field("custom_manage", &self.manage.is_some())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl NamedService for WorkerService {
    const NAME: &'static str = SERVICE_NAME;
}

impl WorkerService {
    /// A service that hands every `Execute` stream (one session, udf §1.1) to `on_execute`,
    /// which must not block: typically it spawns
    /// [`endpoint::serve`](crate::worker::endpoint::serve) on the connection. The stream's
    /// response side starts at once; what the callback does with the connection decides the
    /// rest.
    pub fn new<F>(on_execute: F) -> Self
    where
        F: Fn(GrpcWorkerConnection) + Send + Sync + 'static,
    {
        Self {
            execute: Arc::new(on_execute),
            manage: None,
            config: Arc::new(GrpcConfig::default()),
            state: ServerState::new(),
        }
    }

    /// A service that runs `make_udf()` under [`serve`] with `endpoint_config` on a new
    /// tokio task for every `Execute` stream (per-stream state lives with the stream,
    /// udf §1.1).
    pub fn for_udf<U, F>(make_udf: F, endpoint_config: EndpointConfig) -> Self
    where
        F: Fn() -> U + Send + Sync + 'static,
        U: Udf + Send + 'static,
    {
        Self::new(move |connection| {
            let udf = make_udf();
            let config = endpoint_config.clone();
            tokio::spawn(async move {
                let outcome = serve(connection, udf, config).await;
                tracing::debug!(%outcome, "UDF session ended");
            });
        })
    }

    /// Answers `Manage` with [`handle_manage`] over `control` (heartbeat metrics, shutdown;
    /// udf §1.7) instead of the built-in control.
    pub fn with_control<W>(self, control: W) -> Self
    where
        W: WorkerControl + Send + Sync + 'static,
    {
        self.with_manage(move |request| {
            handle_manage(request, &control).map_err(|e| manage_status(&e))
        })
    }

    /// Answers `Manage` with `handler`: its `Err` status is the RPC's status. It runs on the
    /// connection's task and must answer quickly (udf §1.7: heartbeats are answered within
    /// a small bound).
    pub fn with_manage<F>(mut self, handler: F) -> Self
    where
        F: Fn(WorkerRequest) -> Result<WorkerResponse, Status> + Send + Sync + 'static,
    {
        self.manage = Some(Arc::new(handler));
        self
    }

    /// Uses `config` (message size limit, udf §6.4; response buffer; the server reads its
    /// HTTP/2 settings from it too).
    pub fn with_config(mut self, config: GrpcConfig) -> Self {
        self.config = Arc::new(config);
        self
    }

    /// The settings in use ([`GrpcConfig`]; Spark's values per udf §6.4).
    pub fn config(&self) -> &GrpcConfig {
        &self.config
    }

    /// `Execute` streams currently open (connections not yet dropped): the sessions of
    /// udf §1.1, one per stream.
    pub fn active_sessions(&self) -> usize {
        self.state.active.load(Ordering::SeqCst)
    }

    /// A handle that starts the graceful shutdown of the server running this service (what
    /// a `Manage` `ShutdownRequest` does, udf §1.7).
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            state: self.state.clone(),
        }
    }

    fn manage(&self, request: WorkerRequest) -> Result<WorkerResponse, Status> {
        match &self.manage {
            Some(handler) => handler(request),
            None => handle_manage(request, &BuiltinControl { state: &self.state })
                .map_err(|e| manage_status(&e)),
        }
    }
}

/// The gRPC status for a `Manage` request that cannot be answered.
fn manage_status(error: &ManageError) -> Status {
    match error.grpc_code() {
        "INVALID_ARGUMENT" => Status::invalid_argument(error.to_string()),
        _ => Status::internal(error.to_string()),
    }
}

struct BuiltinControl<'a> {
    state: &'a ServerState,
}

impl WorkerControl for BuiltinControl<'_> {
    fn heartbeat_metrics(&self) -> BTreeMap<String, String> {
        let active = self.state.active.load(Ordering::SeqCst);
        BTreeMap::from([("active_sessions".to_owned(), active.to_string())])
    }

    fn shutdown(&self, request: &ShutdownRequest) -> bool {
        let settled = self.state.active.load(Ordering::SeqCst) == 0;
        tracing::info!(reason = ?request.reason, settled, "Manage shutdown requested");
        self.state.shutdown.send_replace(true);
        settled
    }
}

impl<B> tower::Service<http::Request<B>> for WorkerService
where
    B: tonic::codegen::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service = self.clone();
        let max = self.config.max_message_size;
        match request.uri().path() {
            EXECUTE_PATH => {
                let authority = request.uri().authority().map(|a| a.as_str().to_owned());
                Box::pin(async move {
                    let mut grpc = Grpc::new(ProstCodec::<UdfResponse, UdfRequest>::default())
                        .apply_max_message_size_config(Some(max), Some(max));
                    let call = ExecuteCall { service, authority };
                    Ok(grpc.streaming(call, request).await)
                })
            }
            MANAGE_PATH => Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::<WorkerResponse, WorkerRequest>::default())
                    .apply_max_message_size_config(Some(max), Some(max));
                Ok(grpc.unary(ManageCall { service }, request).await)
            }),
            path => {
                let status = Status::unimplemented(format!("no method {path} in {SERVICE_NAME}"));
                Box::pin(ready(Ok(status.into_http())))
            }
        }
    }
}

struct ExecuteCall {
    service: WorkerService,
    authority: Option<String>,
}

impl StreamingService<UdfRequest> for ExecuteCall {
    type Response = UdfResponse;
    type ResponseStream = ResponseStream;
    type Future = Ready<Result<tonic::Response<ResponseStream>, Status>>;

    fn call(&mut self, request: tonic::Request<Streaming<UdfRequest>>) -> Self::Future {
        let (connection, responses) =
            GrpcWorkerConnection::new(request.into_inner(), self.authority.take(), &self.service);
        (self.service.execute)(connection);
        ready(Ok(tonic::Response::new(responses)))
    }
}

struct ManageCall {
    service: WorkerService,
}

impl UnaryService<WorkerRequest> for ManageCall {
    type Response = WorkerResponse;
    type Future = Ready<Result<tonic::Response<WorkerResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<WorkerRequest>) -> Self::Future {
        ready(
            self.service
                .manage(request.into_inner())
                .map(tonic::Response::new),
        )
    }
}

/// The response body of one `Execute` stream: the worker connection's queue. A queue whose
/// sender was dropped without `poll_close` ends with `ABORTED`, never with a clean end.
struct ResponseStream {
    queue: mpsc::Receiver<UdfResponse>,
    closed: Arc<AtomicBool>,
    done: bool,
}

impl Stream for ResponseStream {
    type Item = Result<UdfResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.queue).poll_next(cx) {
            Poll::Ready(Some(msg)) => Poll::Ready(Some(Ok(msg))),
            Poll::Ready(None) => {
                self.done = true;
                if self.closed.load(Ordering::SeqCst) {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(Err(Status::aborted(
                        "the worker dropped the Execute stream without closing it",
                    ))))
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Counts an open `Execute` stream for as long as its connection lives.
struct ActiveGuard(Arc<ServerState>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The worker side of one `Execute` stream: a
/// [`Connection<UdfResponse, UdfRequest>`](Connection) for
/// [`endpoint::serve`](crate::worker::endpoint::serve) or an
/// [`Endpoint`](crate::worker::endpoint::Endpoint).
///
/// - Receiving: the engine's requests. A gRPC error on the request stream (the engine reset
///   it, the connection broke) is a transport failure; a clean end of the request stream is
///   `Ready(None)` — which the endpoint never takes for `Finish` (udf §2: only an explicit
///   `Finish` finishes; an end before the session is done is a protocol violation).
/// - Sending: responses go through a bounded queue ([`GrpcConfig::response_buffer`]
///   messages) into the response stream; beyond it `poll_ready` waits for HTTP/2 flow
///   control (the engine's stream window). Sending after the engine reset the stream
///   fails with [`ConnectionError::Closed`].
/// - `poll_close` ends the response stream cleanly (status OK) once the queued responses are
///   out: the half-close after the worker's terminator. Dropping the connection without
///   closing it ends the response stream with the status `ABORTED` instead.
/// - Dropping a connection closed cleanly before the engine's request side ended lets the
///   call complete: a background task on the current tokio runtime reads the request
///   stream to its end (at most 5 s; the engine half-closes once it has the terminator,
///   udf §2 R9). Dropping it at once would make the worker reset a stream the engine is
///   about to end, and, under many concurrent sessions, fail every session on the engine's
///   HTTP/2 connection (h2's limit on locally reset streams; hostile-input catalog row 13).
pub struct GrpcWorkerConnection {
    /// `None` only once dropped.
    requests: Option<Streaming<UdfRequest>>,
    responses: mpsc::Sender<UdfResponse>,
    closed: Arc<AtomicBool>,
    authority: Option<String>,
    send_closed: bool,
    recv_ended: bool,
    _active: ActiveGuard,
}

impl fmt::Debug for GrpcWorkerConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcWorkerConnection")
            .field("authority", &self.authority)
            .field("send_closed", &self.send_closed)
            .field("recv_ended", &self.recv_ended)
            .finish_non_exhaustive()
    }
}

impl GrpcWorkerConnection {
    fn new(
        requests: Streaming<UdfRequest>,
        authority: Option<String>,
        service: &WorkerService,
    ) -> (Self, ResponseStream) {
        // futures' bounded channel admits `buffer + senders` messages; one sender.
        let (responses, queue) = mpsc::channel(service.config.response_buffer.max(1) - 1);
        let closed = Arc::new(AtomicBool::new(false));
        service.state.active.fetch_add(1, Ordering::SeqCst);
        let connection = Self {
            requests: Some(requests),
            responses,
            closed: closed.clone(),
            authority,
            send_closed: false,
            recv_ended: false,
            _active: ActiveGuard(service.state.clone()),
        };
        let stream = ResponseStream {
            queue,
            closed,
            done: false,
        };
        (connection, stream)
    }

    /// The HTTP/2 `:authority` the engine sent (`localhost` for Spark's engine and for
    /// [`GrpcChannel`](super::GrpcChannel), udf §6.4), if any.
    pub fn authority(&self) -> Option<&str> {
        self.authority.as_deref()
    }
}

impl Connection<UdfResponse, UdfRequest> for GrpcWorkerConnection {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        if self.send_closed {
            return Poll::Ready(Err(ConnectionError::Closed));
        }
        Sink::poll_ready(Pin::new(&mut self.responses), cx).map_err(|_| ConnectionError::Closed)
    }

    fn start_send(&mut self, msg: UdfResponse) -> Result<(), ConnectionError> {
        if self.send_closed {
            return Err(ConnectionError::Closed);
        }
        Sink::start_send(Pin::new(&mut self.responses), msg).map_err(|_| ConnectionError::Closed)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        Sink::poll_flush(Pin::new(&mut self.responses), cx).map_err(|_| ConnectionError::Closed)
    }

    fn poll_close(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        // Queued responses still go out, then the OK trailers.
        self.closed.store(true, Ordering::SeqCst);
        self.send_closed = true;
        self.responses.close_channel();
        Poll::Ready(Ok(()))
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<UdfRequest, ConnectionError>>> {
        let Some(requests) = self.requests.as_mut().filter(|_| !self.recv_ended) else {
            return Poll::Ready(None);
        };
        match Pin::new(requests).poll_next(cx) {
            Poll::Ready(Some(Ok(msg))) => Poll::Ready(Some(Ok(msg))),
            Poll::Ready(Some(Err(status))) => {
                self.recv_ended = true;
                Poll::Ready(Some(Err(ConnectionError::from(StatusError::from(status)))))
            }
            Poll::Ready(None) => {
                self.recv_ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_active(&self) -> bool {
        let both_ended = self.recv_ended && self.send_closed;
        !(self.responses.is_closed() || both_ended)
    }
}

impl Drop for GrpcWorkerConnection {
    fn drop(&mut self) {
        if self.send_closed
            && !self.recv_ended
            && let Some(requests) = self.requests.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(read_requests_to_end(requests));
        }
    }
}

/// How long a dropped [`GrpcWorkerConnection`] that ended its response stream cleanly keeps
/// reading the engine's request stream in the background, waiting for its end.
const REQUEST_END_BOUND: Duration = Duration::from_secs(5);

/// Reads a finished session's request stream to its end (the engine's half-close after the
/// terminator, udf §2 R9) within [`REQUEST_END_BOUND`], so that the stream closes from both
/// sides instead of with the worker's `RST_STREAM(NO_ERROR)`. That reset races the engine's
/// half-close: once more than a few dozen reset streams are pending, the worker's HTTP/2
/// connection forgets the oldest, answers their late `END_STREAM` with
/// `RST_STREAM(STREAM_CLOSED)`, and past h2's limit of 1024 such local resets tears the
/// connection down with `ENHANCE_YOUR_CALM` (`RESOURCE_EXHAUSTED` for every session on it).
/// A request arriving now (a farewell `Cancel` after `Finish`, udf §2 R9) is ignored.
async fn read_requests_to_end(mut requests: Streaming<UdfRequest>) {
    let drain = async {
        loop {
            match requests.message().await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(%status, "the request stream of a finished session failed");
                    break;
                }
            }
        }
    };
    if tokio::time::timeout(REQUEST_END_BOUND, drain)
        .await
        .is_err()
    {
        tracing::debug!(
            bound = ?REQUEST_END_BOUND,
            "the engine did not end a finished session's request stream in time; resetting it"
        );
    }
}

/// Starts the graceful shutdown of a [`WorkerServer`] (or of the server running a
/// [`WorkerService`]): in-flight streams finish normally, then the worker can exit, as
/// udf §1.7 asks of a `ShutdownRequest` without `cancel_sessions`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    state: Arc<ServerState>,
}

impl ShutdownHandle {
    /// Requests the graceful shutdown: stop accepting connections, let open streams finish
    /// (up to [`GrpcConfig::shutdown_grace`]; udf §1.7). Idempotent.
    pub fn shutdown(&self) {
        self.state.shutdown.send_replace(true);
    }

    /// Whether a shutdown was requested (by a handle or by a `Manage` shutdown, udf §1.7).
    pub fn is_shutdown_requested(&self) -> bool {
        *self.state.shutdown.borrow()
    }

    /// Waits until a shutdown is requested (by a handle or by a `Manage` shutdown,
    /// udf §1.7).
    pub async fn requested(&self) {
        let mut rx = self.state.shutdown.subscribe();
        // The sender lives in `state`, which `self` keeps alive: `wait_for` cannot fail.
        let _ = rx.wait_for(|requested| *requested).await;
    }
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// Serves a [`WorkerService`] on a Unix socket (the worker's `--connection` path, udf §1.9)
/// or a loopback TCP port: plaintext HTTP/2 only (udf §6.4), with the windows, frame size
/// and stream limit of the service's [`GrpcConfig`]. The worker-side counterpart of Spark's
/// test worker `EchoGrpcWorkerMain` (udf §9).
///
/// - [`shutdown`](Self::shutdown) (or a [`ShutdownHandle`], or the built-in `Manage`
///   shutdown) is graceful: the listener closes and the socket file is removed at once,
///   every connection gets a `GOAWAY`, open streams may finish within
///   [`GrpcConfig::shutdown_grace`], then the remaining connections are closed.
/// - Dropping the server (or [`abort`](Self::abort)) closes every connection at once, as a
///   killed worker process would: open sessions see a transport failure. The socket file is
///   left behind, as a killed process leaves it.
/// - Clients must send a valid `:authority` (Spark's engine sends `localhost`, udf §6.4). A
///   client that sends the socket path instead has every stream reset by the HTTP/2 layer
///   (hyperium/h2#487): set `grpc.default_authority` (grpcio), `overrideAuthority`
///   (grpc-java) or `-authority` (grpcurl) to `localhost`, or reach the worker on loopback
///   TCP ([`bind_tcp`](Self::bind_tcp)). See the [module docs](super#worker-side).
#[derive(Debug)]
pub struct WorkerServer {
    path: Option<PathBuf>,
    tcp_addr: Option<std::net::SocketAddr>,
    state: Arc<ServerState>,
    task: Option<JoinHandle<()>>,
}

impl WorkerServer {
    /// Binds `path` and serves `service` on a new tokio task. The socket file must not
    /// exist (a fresh path per worker, udf §6.4); the path must fit the platform limit
    /// (107 bytes on Linux). Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The bind error (`AddrInUse` when the file exists, path too long, permissions…), of
    /// the OS error's kind; its text names the path ("could not bind the Unix socket
    /// /tmp/w.sock") and the OS error is its source.
    pub fn bind_unix(path: impl AsRef<Path>, service: WorkerService) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let listener =
            UnixListener::bind(&path).map_err(|e| socket_path_error("bind", &path, e))?;
        Ok(Self::start(
            Listener::Unix(listener),
            Some(path),
            None,
            service,
        ))
    }

    /// Binds TCP on `addr` (use a loopback address; port 0 picks a free one) and serves
    /// `service` on a new tokio task. For Spark's `LocalTcpConnection` the engine passes a
    /// port and the worker binds 127.0.0.1 and ::1 (udf §1.9): one server per address.
    ///
    /// # Errors
    /// The bind error.
    pub async fn bind_tcp(addr: std::net::SocketAddr, service: WorkerService) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        Ok(Self::start(
            Listener::Tcp(listener),
            None,
            Some(local),
            service,
        ))
    }

    fn start(
        listener: Listener,
        path: Option<PathBuf>,
        tcp_addr: Option<std::net::SocketAddr>,
        service: WorkerService,
    ) -> Self {
        let state = service.state.clone();
        let task = tokio::spawn(run(listener, service, path.clone()));
        Self {
            path,
            tcp_addr,
            state,
            task: Some(task),
        }
    }

    /// The socket path, for a Unix server (the `--connection` path, udf §1.9).
    pub fn socket_path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The bound address, for a TCP server (udf §1.9 `LocalTcpConnection`).
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp_addr
    }

    /// `Execute` streams currently open (one per session, udf §1.1).
    pub fn active_sessions(&self) -> usize {
        self.state.active.load(Ordering::SeqCst)
    }

    /// A handle that starts the graceful shutdown (udf §1.7).
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            state: self.state.clone(),
        }
    }

    /// Shuts down gracefully (see [`WorkerServer`]) and waits until done: at most
    /// [`GrpcConfig::shutdown_grace`] after open streams were told to finish (Spark's engine
    /// allows 5 s between SIGTERM and SIGKILL by default, udf §6.1, §7).
    pub async fn shutdown(mut self) {
        self.state.shutdown.send_replace(true);
        self.join().await;
    }

    /// Waits until the server has stopped after a shutdown was requested (by a
    /// [`ShutdownHandle`] or a `Manage` shutdown): what a worker's `main` awaits ("worker
    /// should exit once all streams ended", udf §1.7).
    pub async fn wait(mut self) {
        self.join().await;
    }

    /// Closes every connection at once, like a killed worker process (same as dropping):
    /// the engine's sessions settle `TransportFailed` (udf §4.1).
    pub fn abort(self) {
        drop(self);
    }

    async fn join(&mut self) {
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
            && e.is_panic()
        {
            tracing::warn!(error = %e, "the worker server task panicked");
        }
    }
}

impl Drop for WorkerServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            // Aborting the accept loop drops its connection set, which aborts every
            // connection task: their sockets close at once.
            task.abort();
        }
    }
}

fn http2_builder(config: &GrpcConfig) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new()).http2_only();
    builder
        .http2()
        .initial_stream_window_size(config.stream_window)
        .initial_connection_window_size(config.connection_window)
        .adaptive_window(false)
        .max_concurrent_streams(config.max_concurrent_streams)
        .max_frame_size(config.max_frame_size);
    builder
}

/// The accept loop: one task per connection; on shutdown, drain with a bounded grace.
async fn run(listener: Listener, service: WorkerService, path: Option<PathBuf>) {
    let builder = http2_builder(&service.config);
    let grace = service.config.shutdown_grace;
    let mut shutdown = service.state.shutdown.subscribe();
    let (drain, draining) = watch::channel(false);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = requested(&mut shutdown) => break,
            accepted = accept(&listener) => match accepted {
                Ok(io) => {
                    connections.spawn(serve_connection(
                        io,
                        builder.clone(),
                        service.clone(),
                        draining.clone(),
                    ));
                }
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    if let Some(path) = &path
        && let Err(e) = std::fs::remove_file(path)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "removing the socket file failed");
    }
    drain.send_replace(true);
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            ?grace,
            "streams still open after the shutdown grace; closing their connections"
        );
        connections.shutdown().await;
    }
}

/// Waits until the watched flag is set (or its sender is gone), holding no borrow after.
async fn requested(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}

/// A Unix or TCP stream, accepted.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Io for T {}

async fn accept(listener: &Listener) -> io::Result<Box<dyn Io>> {
    Ok(match listener {
        Listener::Unix(l) => Box::new(l.accept().await?.0),
        Listener::Tcp(l) => {
            let (stream, _) = l.accept().await?;
            stream.set_nodelay(true)?;
            Box::new(stream)
        }
    })
}

async fn serve_connection(
    io: Box<dyn Io>,
    builder: auto::Builder<TokioExecutor>,
    service: WorkerService,
    mut draining: watch::Receiver<bool>,
) {
    let mut connection =
        pin!(builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service)));
    let mut told = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "worker connection ended with an error");
                }
                break;
            }
            _ = requested(&mut draining), if !told => {
                told = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}
