//! `--faults SEED`: a seeded fault mode that ends some response streams the way a flaky
//! network or a restarting server does, so a client's recovery (rx §6.3) really runs.
//!
//! # Which streams
//!
//! A stream (one ExecutePlan or ReattachExecute response stream) takes part once it carries
//! its first response; from that response's `operation_id` the schedule decides, with a
//! generator seeded by `SEED`, whether and before which of the stream's responses it ends:
//!
//! - at most 10 % of the streams so far are ever chosen (a stream is chosen with
//!   probability 1/10 while the count of chosen streams stays within a tenth of all);
//! - never two streams of one operation in a row: the stream after a faulted one always
//!   runs undisturbed, so a client's retry budget is never in danger;
//! - a chosen stream ends before its response number 0–3 (a stream that ends sooner is not
//!   disturbed).
//!
//! # How a chosen stream ends
//!
//! - An ExecutePlan stream, before its first response: the operation is **forgotten** as a
//!   restarted server would forget it ([`ExecutionManager::forget_execution`]: no tombstone,
//!   no inactive-id entry) and the connection is dropped. The client's reattach gets
//!   `OPERATION_NOT_FOUND`, and since nothing had reached it, it re-executes the plan under
//!   the same operation id.
//! - Any other chosen stream, one of three ways, uniformly:
//!   - **gracefully**, status OK without `ResultComplete`: the client reattaches;
//!   - with INTERNAL `[INVALID_CURSOR.DISCONNECTED]` (rx §1.8), which Spark clients retry;
//!   - by **dropping the connection** (TCP): the client sees UNAVAILABLE and retries on a new
//!     connection; every other RPC on that connection fails the same way.
//!
//! Responses the client did not receive stay in the execution's log, so a reattach from
//! its last response id gets each of them once (rx §3.5).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures::future::BoxFuture;
use http_body::Frame;
use prost::Message;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tether::execution::{ConnectError, ExecutionManager};
use tether::spark::connect::tls::AcceptedStream;
use tether::spark::connect::to_status;
use tether::wire::connect::ExecutePlanResponse;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;
use tonic::codegen::http;

/// How a chosen stream ends (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Status OK, no `ResultComplete`.
    EndGracefully,
    /// INTERNAL `[INVALID_CURSOR.DISCONNECTED]`.
    Disconnected,
    /// The TCP connection is dropped.
    DropConnection,
    /// Before an ExecutePlan's first response: the operation is forgotten and the
    /// connection dropped.
    Forget,
}

impl Fault {
    const ALL: [Self; 4] = [
        Self::EndGracefully,
        Self::Disconnected,
        Self::DropConnection,
        Self::Forget,
    ];
}

/// Most operations remembered as "last stream faulted" before the set is cleared (which at
/// worst allows one operation two faulted streams in a row, long after).
const REMEMBERED: usize = 65_536;

struct Schedule {
    rng: SmallRng,
    /// Streams that carried a response.
    streams: u64,
    /// Streams chosen for a fault.
    chosen: u64,
    /// Faults that happened, by kind ([`Fault::ALL`] order).
    fired: [u64; 4],
    /// Operations whose last stream was faulted.
    last_faulted: HashSet<String>,
}

/// The fault schedule of one server (module docs).
pub struct Faults {
    manager: ExecutionManager,
    schedule: Mutex<Schedule>,
}

impl Faults {
    pub fn new(seed: u64, manager: ExecutionManager) -> Arc<Self> {
        Arc::new(Self {
            manager,
            schedule: Mutex::new(Schedule {
                rng: SmallRng::seed_from_u64(seed),
                streams: 0,
                chosen: 0,
                fired: [0; 4],
                last_faulted: HashSet::new(),
            }),
        })
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The counters for the stats line: `faults=N` (all kinds) and one per kind.
    pub fn stats(&self) -> String {
        let s = self.schedule();
        format!(
            "faults={} fault_graceful={} fault_disconnected={} fault_dropped={} fault_forgotten={}",
            s.fired.iter().sum::<u64>(),
            s.fired[0],
            s.fired[1],
            s.fired[2],
            s.fired[3]
        )
    }

    /// Decides the fate of a stream of `operation_id` that just produced its first
    /// response: `Some((fault, k))` to end it before its response number `k`.
    fn decide(&self, operation_id: &str, execute_plan: bool) -> Option<(Fault, u32)> {
        let mut s = self.schedule();
        s.streams += 1;
        if s.last_faulted.remove(operation_id) {
            return None;
        }
        let streams = s.streams;
        if (s.chosen + 1) * 10 > streams || !s.rng.random_bool(0.1) {
            return None;
        }
        s.chosen += 1;
        Some(if execute_plan {
            (Fault::Forget, 0)
        } else {
            let kind = Fault::ALL[s.rng.random_range(0..3)];
            (kind, s.rng.random_range(0..4))
        })
    }

    fn fired(&self, operation_id: &str, fault: Fault) {
        let mut s = self.schedule();
        let i = Fault::ALL.iter().position(|f| *f == fault).unwrap_or(0);
        s.fired[i] += 1;
        if s.last_faulted.len() >= REMEMBERED {
            s.last_faulted.clear();
        }
        s.last_faulted.insert(operation_id.to_owned());
    }

    /// Forgets the execution of `response` (its session and operation id) as a restarted
    /// server would.
    fn forget(&self, response: &ExecutePlanResponse) -> bool {
        let (Ok(session), Ok(operation)) = (
            uuid::Uuid::parse_str(&response.session_id),
            uuid::Uuid::parse_str(&response.operation_id),
        ) else {
            return false;
        };
        // O(live executions): fault injection is for tests, not throughput.
        self.manager
            .execution_keys()
            .into_iter()
            .find(|k| k.session_id == session && k.operation_id == operation)
            .is_some_and(|key| self.manager.forget_execution(&key))
    }
}

// ---------------------------------------------------------------------------------------------
// The connection: a TCP stream that can be dropped from a request handler
// ---------------------------------------------------------------------------------------------

/// What a request learns of its connection (a request extension, through tonic's
/// `Connected`): the handle that drops it.
#[derive(Debug, Clone)]
pub struct Connection {
    /// The client's address.
    pub remote: Option<SocketAddr>,
    kill: CancellationToken,
}

/// An accepted TCP stream that fails every read and write once its [`Connection`] is
/// killed, so the server closes it: what the client sees as a lost connection.
pub struct KillableStream {
    io: AcceptedStream,
    info: Connection,
    killed: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl KillableStream {
    pub fn new(io: AcceptedStream) -> Self {
        let kill = CancellationToken::new();
        Self {
            info: Connection {
                remote: io.get_ref().peer_addr().ok(),
                kill: kill.clone(),
            },
            killed: Box::pin(kill.cancelled_owned()),
            io,
        }
    }

    fn dropped() -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection dropped by --faults",
        )
    }
}

impl tonic::transport::server::Connected for KillableStream {
    type ConnectInfo = Connection;

    fn connect_info(&self) -> Connection {
        self.info.clone()
    }
}

impl AsyncRead for KillableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Polled first, so a kill wakes a connection waiting to read.
        if self.killed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(Self::dropped()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.info.kill.is_cancelled() {
            return Poll::Ready(Err(Self::dropped()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.info.kill.is_cancelled() {
            return Poll::Ready(Err(Self::dropped()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------------------
// The service: response bodies of ExecutePlan and ReattachExecute, watched
// ---------------------------------------------------------------------------------------------

/// The gRPC service `S` with the response streams of ExecutePlan and ReattachExecute ended
/// as [`Faults`] decides.
#[derive(Clone)]
pub struct FaultService<S> {
    inner: S,
    faults: Arc<Faults>,
}

impl<S> FaultService<S> {
    pub fn new(inner: S, faults: Arc<Faults>) -> Self {
        Self { inner, faults }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for FaultService<S> {
    const NAME: &'static str = S::NAME;
}

type HttpRequest = http::Request<Body>;
type HttpResponse = http::Response<Body>;

impl<S> tower::Service<HttpRequest> for FaultService<S>
where
    S: tower::Service<HttpRequest, Response = HttpResponse, Error = std::convert::Infallible>,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<HttpResponse, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequest) -> Self::Future {
        let path = request.uri().path();
        let execute_plan = path.ends_with("/ExecutePlan");
        let watched = execute_plan || path.ends_with("/ReattachExecute");
        let connection = request.extensions().get::<Connection>().cloned();
        let call = self.inner.call(request);
        let faults = self.faults.clone();
        Box::pin(async move {
            let response = call.await?;
            if !watched {
                return Ok(response);
            }
            Ok(response.map(|body| {
                Body::new(FaultBody {
                    inner: body,
                    faults,
                    connection,
                    execute_plan,
                    pending: BytesMut::new(),
                    responses: 0,
                    fate: Fate::Undecided,
                })
            }))
        })
    }
}

/// What happens to a watched stream.
enum Fate {
    /// No response yet.
    Undecided,
    /// Runs undisturbed.
    Spared,
    /// Ends before response number `before`.
    Doomed { fault: Fault, before: u32 },
    /// This fault ends the stream at the next poll (the responses before it went out).
    Firing(Fault, Box<ExecutePlanResponse>),
    /// Ended by a fault (or by its service).
    Ended,
    /// Its connection is being dropped: never ready again (the connection task drops it).
    Dropped,
}

/// A response body whose gRPC messages (5-byte prefix, then an `ExecutePlanResponse`) are
/// counted, so the stream can end between two of them.
struct FaultBody {
    inner: Body,
    faults: Arc<Faults>,
    connection: Option<Connection>,
    execute_plan: bool,
    /// Bytes of the inner body not yet passed on: at most one incomplete message.
    pending: BytesMut,
    /// Responses passed on.
    responses: u32,
    fate: Fate,
}

/// The length of the gRPC message at the start of `buf`, prefix included, once it is
/// complete.
fn complete_message(buf: &[u8]) -> Option<usize> {
    let prefix: [u8; 5] = buf.get(..5)?.try_into().ok()?;
    let len = 5 + u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    (buf.len() >= len).then_some(len)
}

impl FaultBody {
    /// Ends the stream with `fault`; `response` is the first response it withholds.
    fn fire(
        &mut self,
        fault: Fault,
        response: &ExecutePlanResponse,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        self.fate = Fate::Ended;
        self.faults.fired(&response.operation_id, fault);
        tracing::info!(
            operation_id = %response.operation_id,
            before_response = self.responses,
            fault = ?fault,
            peer = ?self.connection.as_ref().and_then(|c| c.remote),
            "fault injected"
        );
        let trailers = |status: tonic::Status| {
            let mut map = http::HeaderMap::new();
            // A status that cannot be encoded as headers still ends the stream.
            let _ = status.add_header(&mut map);
            Poll::Ready(Some(Ok(Frame::trailers(map))))
        };
        if fault == Fault::Forget && !self.faults.forget(response) {
            tracing::warn!(operation_id = %response.operation_id, "nothing to forget");
        }
        match (fault, &self.connection) {
            (Fault::EndGracefully, _) => trailers(tonic::Status::ok("")),
            (Fault::Disconnected, _) => trailers(to_status(&ConnectError::Disconnected)),
            (Fault::DropConnection | Fault::Forget, Some(connection)) => {
                connection.kill.cancel();
                // The connection task fails its next read and closes the socket; this body
                // is dropped with it, and never answers again (no RST_STREAM, no trailers:
                // the client must see a lost connection).
                self.fate = Fate::Dropped;
                Poll::Pending
            }
            // Not on a killable connection: the nearest thing, UNAVAILABLE.
            (Fault::DropConnection | Fault::Forget, None) => {
                trailers(tonic::Status::unavailable("connection dropped by --faults"))
            }
        }
    }
}

impl http_body::Body for FaultBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        loop {
            match std::mem::replace(&mut this.fate, Fate::Ended) {
                Fate::Ended => return Poll::Ready(None),
                Fate::Dropped => {
                    this.fate = Fate::Dropped;
                    return Poll::Pending;
                }
                Fate::Firing(fault, response) => return this.fire(fault, &response),
                other => this.fate = other,
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => frame,
                other => return other,
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                // Trailers: the stream ends as its service ended it.
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            };
            this.pending.extend_from_slice(&data);
            let mut out = BytesMut::new();
            while let Some(len) = complete_message(&this.pending) {
                if !matches!(this.fate, Fate::Spared) {
                    let response =
                        ExecutePlanResponse::decode(&this.pending[5..len]).unwrap_or_default();
                    if matches!(this.fate, Fate::Undecided) {
                        this.fate = match this
                            .faults
                            .decide(&response.operation_id, this.execute_plan)
                        {
                            Some((fault, before)) => Fate::Doomed { fault, before },
                            None => Fate::Spared,
                        };
                    }
                    if let Fate::Doomed { fault, before } = this.fate
                        && before == this.responses
                    {
                        this.fate = Fate::Firing(fault, Box::new(response));
                        break;
                    }
                }
                out.extend_from_slice(&this.pending[..len]);
                this.pending.advance(len);
                this.responses += 1;
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
        }
    }

    /// As the inner body's until a fault: a trailers-only response (an error before any
    /// response) must stay one, with END_STREAM on its headers.
    fn is_end_stream(&self) -> bool {
        match self.fate {
            Fate::Ended => true,
            Fate::Firing(..) | Fate::Dropped => false,
            Fate::Undecided | Fate::Spared | Fate::Doomed { .. } => {
                self.pending.is_empty() && self.inner.is_end_stream()
            }
        }
    }
}
