//! Scripted peers of a UDF `Execute` stream (udf §1.2) over the in-memory
//! [`pair`]: a test plays one side by hand and puts the real other side under test.
//!
//! - [`WorkerScript`] is the worker end, for tests of the engine session (udf §8.1–§8.2):
//!   `worker.expect(RequestKind::Init).reply(fixtures::init_ok())`,
//!   `worker.expect_data().echo()`, `worker.expect_end()`, or a reactive
//!   [`spawn_echo`](WorkerScript::spawn_echo).
//! - [`EngineScript`] is the engine end, for tests of a worker (udf §8.3): it sends any
//!   request, also one no compliant engine sends, and `engine.expect(ResponseKind::Init)`
//!   checks what came back.
//!
//! Each expectation that fails panics with a readable message: the peer, the step of its
//! script, what it expected and what came (or that the stream ended or stayed silent).
//! Every receive is bounded by [`RECV_TIMEOUT`] (or the peer's `with_recv_timeout`, for a
//! test that waits out a longer udf §7 deadline), which costs nothing under tokio's paused
//! clock (`#[tokio::test(start_paused = true)]`).
//!
//! A session against a scripted worker, end to end:
//!
//! ```
//! use bytes::Bytes;
//! use tether_testing::{fixtures, script};
//! use tether::wire::RequestKind;
//! use tether::worker::engine::TerminationKind;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (session, mut worker, handle) = script::engine_session(fixtures::session_config());
//! let worker = tokio::spawn(async move {
//!     worker.expect(RequestKind::Init).reply(fixtures::init_ok()).await;
//!     worker.expect_data().echo().await;
//!     worker.expect(RequestKind::Finish).reply(fixtures::finish_response_ok()).await;
//!     worker.expect_end().await;
//! });
//! let (mut session, _) = session.init(fixtures::init("udf")).await.expect("init");
//! session.send(Bytes::from_static(b"row")).await.expect("sent");
//! let mut finishing = session.finish().await.map_err(|f| f.error).expect("finish");
//! assert_eq!(finishing.recv().await.unwrap().as_deref(), Some(&b"row"[..]));
//! assert_eq!(finishing.recv().await.unwrap(), None);
//! let termination = finishing.close().await;
//! assert_eq!(termination.kind(), TerminationKind::Finished);
//! worker.await.unwrap();
//! fixtures::assert_released_once(&handle, false);
//! # }
//! ```
//!
//! And the mirror, a worker under test against a scripted engine:
//!
//! ```
//! use tether_testing::{fixtures, script};
//! use tether::wire::{ResponseKind, UdfRequest};
//! use tether::worker::endpoint::OutcomeKind;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (mut engine, worker, _probe) = script::spawn_echo();
//! engine.send(fixtures::init_request("udf")).await;
//! engine.expect(ResponseKind::Init).await;
//! engine.send(fixtures::data_request("row")).await;
//! engine.expect(ResponseKind::Data).await;
//! engine.send(UdfRequest::finish()).await;
//! fixtures::assert_echo_finish(&engine.expect(ResponseKind::Finish).await);
//! engine.expect_end().await;
//! assert_eq!(worker.await.unwrap().kind(), OutcomeKind::Finished);
//! # }
//! ```

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::task::JoinHandle;

use super::echo::{EchoUdf, Probe, echo_config};
use super::fixtures::{cancel_ok, finish_response_ok, init_ok};
use tether::connection::{
    Connection, ConnectionError, ConnectionExt, MemoryConnection, Pair, pair,
};
use tether::time::ManualClock;
use tether::wire::{
    RequestKind, RequestMessage, ResponseKind, ResponseMessage, UdfRequest, UdfResponse,
};
use tether::worker::endpoint::{EndpointConfig, EndpointOutcome, Udf, serve};
use tether::worker::engine::{CountingHandle, Session, SessionConfig};
use tether::worker::state;

/// How long a scripted peer waits for the next message before it fails the test, unless set
/// with [`WorkerScript::with_recv_timeout`] / [`EngineScript::with_recv_timeout`] (a test that
/// waits out a deadline longer than this, such as the worker's 30 s R4 Cancel wait of
/// udf §2 R4, sets a longer one). Under tokio's paused clock the wait is skipped when the
/// other side is idle.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(5);

/// The capacity of each direction of the pairs this module makes (udf §4.7 backpressure).
pub const CAPACITY: usize = 16;

/// The engine end of an in-memory `Execute` stream (udf §1.2).
pub type EngineConn = MemoryConnection<UdfRequest, UdfResponse>;
/// The worker end of an in-memory `Execute` stream (udf §1.2).
pub type WorkerConn = MemoryConnection<UdfResponse, UdfRequest>;

/// What came instead of an expected message (udf §1.2 stream events).
enum Came<T> {
    Message(T),
    End,
    /// Nothing came within this bound.
    Silence(Duration),
}

/// What a peer saw where it expected something else, for its failure message.
fn came<T, E: fmt::Display>(came: Came<Result<T, E>>, show: impl FnOnce(T) -> String) -> String {
    match came {
        Came::Message(Ok(m)) => show(m),
        Came::Message(Err(e)) => format!("a transport error: {e}"),
        Came::End => "the end of the stream".to_owned(),
        Came::Silence(bound) => format!("nothing within {bound:?}"),
    }
}

/// Waits at most `bound` for the next message of `conn`; `Silence` when none came.
async fn next_of<C, O, I>(conn: &mut C, bound: Duration) -> Came<Result<I, ConnectionError>>
where
    C: Connection<O, I>,
{
    match tokio::time::timeout(bound, conn.recv_message()).await {
        Err(_) => Came::Silence(bound),
        Ok(None) => Came::End,
        Ok(Some(r)) => Came::Message(r),
    }
}

// ---------------------------------------------------------------------------------------------
// The worker end
// ---------------------------------------------------------------------------------------------

/// The worker end of an `Execute` stream, played by a script (udf §2): the engine side is
/// the code under test. Make one with [`engine_session`] or [`WorkerScript::new`].
#[derive(Debug)]
pub struct WorkerScript {
    conn: WorkerConn,
    step: usize,
    recv_timeout: Duration,
}

impl WorkerScript {
    /// Wraps the worker end of a [`pair`] (udf §1.2).
    pub fn new(conn: WorkerConn) -> Self {
        Self {
            conn,
            step: 0,
            recv_timeout: RECV_TIMEOUT,
        }
    }

    /// Waits up to `bound` instead of [`RECV_TIMEOUT`] for each expected request (to wait out
    /// a longer udf §7 deadline).
    pub fn with_recv_timeout(mut self, bound: Duration) -> Self {
        self.recv_timeout = bound;
        self
    }

    /// The next request, `None` when the engine ended its request stream (udf §1.2); waits
    /// without bound.
    ///
    /// # Panics
    ///
    /// On a transport error (the in-memory pair has none unless aborted).
    pub async fn recv(&mut self) -> Option<UdfRequest> {
        self.step += 1;
        self.conn
            .recv_message()
            .await
            .map(|r| r.expect("the in-memory connection failed"))
    }

    /// The kind of the next request, `None` at the end of the request stream (udf §1.2).
    ///
    /// # Panics
    ///
    /// When the engine sent an empty oneof.
    pub async fn recv_kind(&mut self) -> Option<RequestKind> {
        self.recv()
            .await
            .map(|r| r.kind().expect("the engine sent an empty oneof"))
    }

    /// Sends one response; `Err` when the engine is gone (udf §1.2).
    pub async fn try_send(&mut self, msg: UdfResponse) -> Result<(), ConnectionError> {
        self.conn.send_message(msg).await
    }

    /// Sends one response, ignoring an engine that is already gone: a scripted worker's
    /// answer to an engine that left is not what a test checks (udf §4.5 asks the engine to
    /// ignore what follows a terminal, and the engine's outcome says the rest).
    pub async fn send(&mut self, msg: UdfResponse) {
        let _ = self.try_send(msg).await;
    }

    /// The kinds of every request up to the end of the engine's request stream (udf §1.2).
    pub async fn drain(&mut self) -> Vec<RequestKind> {
        let mut kinds = Vec::new();
        while let Some(k) = self.recv_kind().await {
            kinds.push(k);
        }
        kinds
    }

    /// The kinds of the requests up to and including a `Cancel`, or to the end of the
    /// request stream (udf §4.8).
    pub async fn drain_until_cancel(&mut self) -> Vec<RequestKind> {
        let mut kinds = Vec::new();
        while let Some(k) = self.recv_kind().await {
            kinds.push(k);
            if k == RequestKind::Cancel {
                break;
            }
        }
        kinds
    }

    /// The next step: a request of `kind` must come next (udf §2). Await the step to get
    /// the request, or answer it with [`reply`](WorkerStep::reply) or
    /// [`echo`](WorkerStep::echo).
    pub fn expect(&mut self, kind: RequestKind) -> WorkerStep<'_> {
        WorkerStep { peer: self, kind }
    }

    /// The next step: a `DataRequest` must come next (udf §1.4).
    pub fn expect_data(&mut self) -> WorkerStep<'_> {
        self.expect(RequestKind::Data)
    }

    /// The engine must end its request stream next (udf §5.2: the engine half-closes after
    /// its terminal).
    ///
    /// # Panics
    ///
    /// With the step, when a request comes or nothing within the receive bound ([`RECV_TIMEOUT`] by default).
    pub async fn expect_end(&mut self) {
        self.step += 1;
        match next_of(&mut self.conn, self.recv_timeout).await {
            Came::End => {}
            other => panic!(
                "worker script step {}: expected the end of the request stream, got {}",
                self.step,
                came(other, |r| format!("{:?}", r.kind()))
            ),
        }
    }

    /// Half-closes the response side without a terminator: the engine sees the worker's
    /// stream end (udf §4.5: an end before the terminal is a transport failure).
    pub async fn close_responses(&mut self) {
        let _ = self.conn.close_send().await;
    }

    /// Drops both directions abruptly, like a crashed worker (udf §6.5: a transport failure).
    pub fn abort(&mut self) {
        self.conn.abort();
    }

    /// Spawns a reactive worker: `react` maps each request, in arrival order, to what the
    /// worker does in answer (udf §2), and the worker does it before it reads the next
    /// request. It ends at the end of the request stream, at a [`Reaction::Abort`], or when a
    /// send finds the engine gone (udf §1.2: nothing is left to answer). The task yields the
    /// kinds of every request it received.
    ///
    /// # Panics
    ///
    /// In the task, when the engine sends an empty oneof (no engine under test does).
    pub fn spawn_reacting<F>(mut self, mut react: F) -> JoinHandle<Vec<RequestKind>>
    where
        F: FnMut(RequestMessage) -> Vec<Reaction> + Send + 'static,
    {
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(request) = self.recv().await {
                let message = request.into_message().expect("a well-formed request");
                seen.push(message.kind());
                for reaction in react(message) {
                    match reaction {
                        Reaction::Send(msg) => {
                            if self.try_send(msg).await.is_err() {
                                return seen;
                            }
                        }
                        Reaction::Pause(quiet) => tokio::time::sleep(quiet).await,
                        Reaction::Abort => {
                            self.abort();
                            return seen;
                        }
                    }
                }
            }
            seen
        })
    }

    /// Spawns a reactive worker: it answers `Init` (and the last `PayloadChunk`) with
    /// [`init_ok`], echoes data until its terminal, answers the first `Finish` with
    /// [`finish_response_ok`] and the first `Cancel` with [`cancel_ok`] (udf §2.1 without the
    /// error payloads). The task yields the kinds of every request it received; see
    /// [`spawn_reacting`](Self::spawn_reacting).
    pub fn spawn_echo(self) -> JoinHandle<Vec<RequestKind>> {
        let mut terminated = false;
        self.spawn_reacting(move |message| {
            let reply = match message {
                RequestMessage::Init(_) => Some(init_ok()),
                RequestMessage::PayloadChunk(c) => (c.last == Some(true)).then(init_ok),
                RequestMessage::Data(d) => (!terminated).then(|| UdfResponse::data(d)),
                RequestMessage::Finish(_) => {
                    (!std::mem::replace(&mut terminated, true)).then(finish_response_ok)
                }
                RequestMessage::Cancel(_) => {
                    (!std::mem::replace(&mut terminated, true)).then(cancel_ok)
                }
            };
            reply.map(Reaction::Send).into_iter().collect()
        })
    }

    /// Spawns a worker that echoes data, never answers `Finish` and acknowledges every
    /// `Cancel` (udf §4.8: the engine's way out of a stuck finish). Unlike
    /// [`spawn_echo`](Self::spawn_echo) it does not answer `Init`: answer it first
    /// (`expect(RequestKind::Init)` then `reply(init_ok())`), then spawn. The task yields the
    /// kinds of every request it received; see [`spawn_reacting`](Self::spawn_reacting).
    pub fn spawn_ignores_finish(self) -> JoinHandle<Vec<RequestKind>> {
        self.spawn_reacting(|message| match message {
            RequestMessage::Data(d) => vec![Reaction::Send(UdfResponse::data(d))],
            RequestMessage::Cancel(_) => vec![Reaction::Send(cancel_ok())],
            _ => Vec::new(),
        })
    }
}

/// What a reactive [`WorkerScript`] does in answer to one request
/// ([`spawn_reacting`](WorkerScript::spawn_reacting)): the moves of a worker under udf §2,
/// compliant or not.
#[derive(Debug, Clone, PartialEq)]
pub enum Reaction {
    /// Sends this response (udf §1.2), any kind, malformed envelopes included.
    Send(UdfResponse),
    /// Stays silent this long on tokio's clock: a slow worker (udf §7 deadlines).
    Pause(Duration),
    /// Drops both directions abruptly, like a crashed worker (udf §6.5), and ends the
    /// script.
    Abort,
}

/// One expected request of a [`WorkerScript`] (udf §2): await it for the request, or answer it.
#[must_use = "a step does nothing until it is awaited"]
pub struct WorkerStep<'a> {
    peer: &'a mut WorkerScript,
    kind: RequestKind,
}

impl<'a> WorkerStep<'a> {
    /// Receives the expected request and returns it.
    ///
    /// # Panics
    ///
    /// With the step, what was expected and what came instead: another kind, the end of
    /// the request stream, an empty oneof, or nothing within the receive bound (udf §2).
    pub async fn get(self) -> RequestMessage {
        self.take().await.1
    }

    /// Receives the expected request and sends `response` (udf §2); returns the request.
    pub async fn reply(self, response: UdfResponse) -> RequestMessage {
        let (peer, request) = self.take().await;
        peer.send(response).await;
        request
    }

    /// Receives the expected `DataRequest` and sends its data back as a `DataResponse`
    /// (udf §2.1 echo); returns the data.
    ///
    /// # Panics
    ///
    /// When the step does not expect `Data`, and as [`get`](Self::get).
    pub async fn echo(self) -> Bytes {
        assert_eq!(self.kind, RequestKind::Data, "only a data step echoes");
        let (peer, request) = self.take().await;
        let RequestMessage::Data(data) = request else {
            unreachable!("take checked the kind")
        };
        peer.send(UdfResponse::data(data.clone())).await;
        data
    }

    async fn take(self) -> (&'a mut WorkerScript, RequestMessage) {
        let Self { peer, kind: want } = self;
        peer.step += 1;
        let step = peer.step;
        let message = match next_of(&mut peer.conn, peer.recv_timeout).await {
            Came::Message(Ok(request)) => match request.into_message() {
                Ok(m) if m.kind() == want => m,
                Ok(m) => panic!("worker script step {step}: expected {want:?}, got {m:?}"),
                Err(e) => panic!("worker script step {step}: expected {want:?}, got {e}"),
            },
            other => panic!(
                "worker script step {step}: expected {want:?}, got {}",
                came(other, |r: UdfRequest| format!("{r:?}"))
            ),
        };
        (peer, message)
    }
}

impl<'a> IntoFuture for WorkerStep<'a> {
    type Output = RequestMessage;
    type IntoFuture = Pin<Box<dyn Future<Output = RequestMessage> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.get())
    }
}

// ---------------------------------------------------------------------------------------------
// The engine end
// ---------------------------------------------------------------------------------------------

/// The engine end of an `Execute` stream, played by a script (udf §8.3): the worker side is
/// the code under test. It sends any `UdfRequest`, malformed ones included, and receives
/// every `UdfResponse` exactly as the worker sent it.
#[derive(Debug)]
pub struct EngineScript {
    conn: EngineConn,
    step: usize,
    recv_timeout: Duration,
}

impl EngineScript {
    /// Wraps the engine end of a [`pair`] (udf §1.2).
    pub fn new(conn: EngineConn) -> Self {
        Self {
            conn,
            step: 0,
            recv_timeout: RECV_TIMEOUT,
        }
    }

    /// Waits up to `bound` instead of [`RECV_TIMEOUT`] for each worker message (to wait out
    /// a longer deadline, such as the worker's R4 Cancel wait, udf §2 R4).
    pub fn with_recv_timeout(mut self, bound: Duration) -> Self {
        self.recv_timeout = bound;
        self
    }

    /// Sends one request, waiting for capacity (udf §4.7); `Err` when the worker is gone.
    pub async fn try_send(&mut self, request: UdfRequest) -> Result<(), ConnectionError> {
        self.conn.send_message(request).await
    }

    /// Sends one request (udf §1.2).
    ///
    /// # Panics
    ///
    /// When the worker is gone.
    pub async fn send(&mut self, request: UdfRequest) {
        let kind = request.kind();
        self.step += 1;
        let step = self.step;
        self.try_send(request)
            .await
            .unwrap_or_else(|e| panic!("engine script step {step}: could not send {kind:?}: {e}"));
    }

    /// Sends every request in order (udf §1.2).
    pub async fn send_all(&mut self, requests: impl IntoIterator<Item = UdfRequest>) {
        for r in requests {
            self.send(r).await;
        }
    }

    /// The next worker message, or `None` when the worker ended its response stream
    /// (udf §1.2).
    ///
    /// # Panics
    ///
    /// After the receive bound ([`RECV_TIMEOUT`] by default) of silence, on a transport error or an empty oneof.
    pub async fn recv_opt(&mut self) -> Option<ResponseMessage> {
        self.next_message("a worker message").await
    }

    /// The next message or the end of the stream; panics naming `want` on anything else.
    async fn next_message(&mut self, want: &str) -> Option<ResponseMessage> {
        self.step += 1;
        let step = self.step;
        match next_of(&mut self.conn, self.recv_timeout).await {
            Came::End => None,
            Came::Message(Ok(r)) => match r.into_message() {
                Ok(m) => Some(m),
                Err(e) => panic!("engine script step {step}: expected {want}, got {e}"),
            },
            other => panic!(
                "engine script step {step}: expected {want}, got {}",
                came(other, |r: UdfResponse| format!("{r:?}"))
            ),
        }
    }

    /// The next worker message (udf §1.2).
    ///
    /// # Panics
    ///
    /// When the worker ended its stream, and as [`recv_opt`](Self::recv_opt).
    pub async fn recv(&mut self) -> ResponseMessage {
        match self.recv_opt().await {
            Some(m) => m,
            None => panic!(
                "engine script step {}: expected a worker message, got the end of the stream",
                self.step
            ),
        }
    }

    /// The next worker message, which must be of `kind` (udf §2).
    ///
    /// # Panics
    ///
    /// With the step, what was expected and what came instead: another kind, the end of
    /// the response stream, an empty oneof, or nothing within the receive bound.
    pub async fn expect(&mut self, kind: ResponseKind) -> ResponseMessage {
        let want = format!("{kind:?}");
        match self.next_message(&want).await {
            Some(m) if m.kind() == kind => m,
            Some(m) => panic!(
                "engine script step {}: expected {want}, got {m:?}",
                self.step
            ),
            None => panic!(
                "engine script step {}: expected {want}, got the end of the stream",
                self.step
            ),
        }
    }

    /// The worker must end its response stream next (udf §2.1: it half-closes after its
    /// terminal).
    ///
    /// # Panics
    ///
    /// With the step, when a message comes or nothing within the receive bound ([`RECV_TIMEOUT`] by default).
    pub async fn expect_end(&mut self) {
        let want = "the end of the response stream";
        if let Some(m) = self.next_message(want).await {
            panic!(
                "engine script step {}: expected {want}, got {m:?}",
                self.step
            );
        }
    }

    /// Every worker message up to the end of its response stream (udf §1.2).
    pub async fn recv_to_end(&mut self) -> Vec<ResponseMessage> {
        let mut all = Vec::new();
        while let Some(m) = self.recv_opt().await {
            all.push(m);
        }
        all
    }

    /// Asserts the worker sends nothing and keeps its stream open for `quiet` (udf §2.1:
    /// after an error the worker waits for the Cancel).
    pub async fn expect_silence(&mut self, quiet: Duration) {
        self.step += 1;
        if let Ok(next) = tokio::time::timeout(quiet, self.conn.recv_message()).await {
            panic!(
                "engine script step {}: expected silence for {quiet:?}, the worker sent {:?}",
                self.step,
                next.map(|r| r.map(|m| m.kind()))
            );
        }
    }

    /// Half-closes the request side: the worker sees its request stream end (udf §2.1
    /// `onCompleted`).
    ///
    /// # Panics
    ///
    /// When the connection cannot be closed.
    pub async fn close_requests(&mut self) {
        self.conn.close_send().await.expect("half-close");
    }

    /// Drops both directions abruptly, like a crashed engine (udf §2.1 `onError`).
    pub fn abort(&mut self) {
        self.conn.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Set-ups
// ---------------------------------------------------------------------------------------------

/// An engine session on one end of a [`pair`] of [`CAPACITY`], its worker end as a
/// [`WorkerScript`], and the session's [`CountingHandle`] (udf §4.1, §6.1).
pub fn engine_session(
    config: SessionConfig,
) -> (
    Session<state::Init, EngineConn>,
    WorkerScript,
    Arc<CountingHandle>,
) {
    engine_session_with_capacity(config, CAPACITY)
}

/// [`engine_session`] over a pair of `capacity` messages each way (udf §4.7 backpressure).
pub fn engine_session_with_capacity(
    config: SessionConfig,
    capacity: usize,
) -> (
    Session<state::Init, EngineConn>,
    WorkerScript,
    Arc<CountingHandle>,
) {
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(capacity);
    let handle = Arc::new(CountingHandle::for_one_session());
    let session = Session::new(engine, handle.clone(), config);
    (session, WorkerScript::new(worker), handle)
}

/// Spawns `udf` served on one end of a [`pair`] of [`CAPACITY`] (udf §2); returns the
/// engine script for the other end and the task yielding the worker's outcome.
pub fn spawn_worker<U>(
    udf: U,
    config: EndpointConfig,
) -> (EngineScript, JoinHandle<EndpointOutcome>)
where
    U: Udf + Send + 'static,
{
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(CAPACITY);
    let task = tokio::spawn(serve(worker, udf, config));
    (EngineScript::new(engine), task)
}

/// Spawns the reference echo worker (udf §2.1) with [`echo_config`]; see [`spawn_worker`].
/// The probe records its callbacks.
pub fn spawn_echo() -> (EngineScript, JoinHandle<EndpointOutcome>, Probe) {
    let (udf, probe) = EchoUdf::with_probe();
    let (script, task) = spawn_worker(udf, echo_config());
    (script, task, probe)
}

/// The engine's halves of a split connection to a worker (udf §1.2): requests go into
/// `requests`, responses come out of `responses`, usable from two tasks at once.
#[derive(Debug)]
pub struct SplitEngine {
    /// Where the engine writes requests.
    pub requests: futures::channel::mpsc::Sender<UdfRequest>,
    /// Where the engine reads responses.
    pub responses: futures::channel::mpsc::Receiver<UdfResponse>,
}

impl SplitEngine {
    /// Sends one request on `requests` (udf §1.2): an associated function, so a task that
    /// holds only the request half can send.
    ///
    /// # Panics
    ///
    /// When the worker went away.
    pub async fn send(
        requests: &mut futures::channel::mpsc::Sender<UdfRequest>,
        request: UdfRequest,
    ) {
        requests.send(request).await.expect("the worker went away");
    }

    /// Every response up to the end of the worker's response stream (udf §1.2).
    ///
    /// # Panics
    ///
    /// On an empty oneof.
    pub async fn recv_to_end(
        responses: &mut futures::channel::mpsc::Receiver<UdfResponse>,
    ) -> Vec<ResponseMessage> {
        let mut all = Vec::new();
        while let Some(r) = responses.next().await {
            all.push(r.into_message().expect("the worker sent an empty oneof"));
        }
        all
    }
}

/// Spawns the reference echo worker (udf §2.1) on a connection joined from two channels
/// with [`Pair`], so the engine can send and receive from different tasks concurrently.
pub fn spawn_echo_split(capacity: usize) -> (SplitEngine, JoinHandle<EndpointOutcome>) {
    use futures::channel::mpsc;
    let (req_tx, req_rx) = mpsc::channel::<UdfRequest>(capacity);
    let (resp_tx, resp_rx) = mpsc::channel::<UdfResponse>(capacity);
    let to_engine = resp_tx.sink_map_err(closed as fn(mpsc::SendError) -> ConnectionError);
    let from_engine = req_rx.map(Ok as fn(UdfRequest) -> Result<UdfRequest, ConnectionError>);
    let task = tokio::spawn(serve(
        Pair::new(to_engine, from_engine),
        EchoUdf::default(),
        echo_config(),
    ));
    (
        SplitEngine {
            requests: req_tx,
            responses: resp_rx,
        },
        task,
    )
}

fn closed(_: futures::channel::mpsc::SendError) -> ConnectionError {
    ConnectionError::Closed
}

// ---------------------------------------------------------------------------------------------
// Manual clock
// ---------------------------------------------------------------------------------------------

/// Yields to the runtime until a driver has armed a sleep on `clock` (udf §7: the drivers
/// take their deadlines from the cores).
///
/// # Panics
///
/// When nothing armed a sleep within a thousand yields.
pub async fn until_armed(clock: &ManualClock) {
    for _ in 0..1000 {
        if clock.pending_sleeps() > 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the driver never armed its deadline");
}

/// Yields to the runtime fifty times: lets spawned drivers react to an event without moving
/// any clock (udf §7).
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{data_request, init_request};

    /// The panic message of `f`, which must panic.
    async fn panic_of<F: Future<Output = ()> + Send + 'static>(f: F) -> String {
        let error = tokio::spawn(f).await.expect_err("the script must fail");
        let payload = error.into_panic();
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default()
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_step_names_its_number_what_it_expected_and_what_came() {
        let (mut engine, worker) = pair::<UdfRequest, UdfResponse>(CAPACITY);
        let mut worker = WorkerScript::new(worker);
        engine.send_message(init_request("udf")).await.unwrap();
        engine.send_message(data_request("row")).await.unwrap();
        let message = panic_of(async move {
            worker.expect(RequestKind::Init).reply(init_ok()).await;
            worker.expect(RequestKind::Finish).await;
        })
        .await;
        assert!(
            message.starts_with("worker script step 2: expected Finish, got Data("),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_step_reports_the_end_and_silence() {
        let (engine, worker) = pair::<UdfRequest, UdfResponse>(CAPACITY);
        let mut ended = WorkerScript::new(worker);
        drop(engine);
        let message = panic_of(async move {
            ended.expect(RequestKind::Init).await;
        })
        .await;
        assert_eq!(
            message,
            "worker script step 1: expected Init, got the end of the stream"
        );
        let (_engine, worker) = pair::<UdfRequest, UdfResponse>(CAPACITY);
        let mut silent = WorkerScript::new(worker);
        let message = panic_of(async move { silent.expect_end().await }).await;
        assert_eq!(
            message,
            "worker script step 1: expected the end of the request stream, got nothing within 5s"
        );
    }

    /// A longer receive bound waits out the echo worker's 30 s R4 Cancel deadline (udf §2
    /// R4) that the default 5 s bound would report as silence; the silence message names
    /// the bound in force.
    #[tokio::test(start_paused = true)]
    async fn a_longer_receive_bound_waits_out_the_worker_r4_deadline() {
        let (engine, task) = spawn_worker(crate::echo::EchoUdf::default(), {
            crate::echo::echo_config()
        });
        let mut engine = engine.with_recv_timeout(Duration::from_secs(40));
        engine.send(init_request("udf")).await;
        engine.expect(ResponseKind::Init).await;
        engine.send(data_request(crate::echo::ERROR_BATCH)).await;
        engine.expect(ResponseKind::Error).await;
        // No Cancel: the worker gives up after its R4 deadline and closes with a
        // CancelResponse carrying the protocol error.
        let kinds: Vec<_> = engine
            .recv_to_end()
            .await
            .iter()
            .map(ResponseMessage::kind)
            .collect();
        assert_eq!(kinds, [ResponseKind::Cancel]);
        assert!(matches!(
            task.await.expect("the worker task"),
            EndpointOutcome::ProtocolViolation(_)
        ));

        let (_engine, worker) = pair::<UdfRequest, UdfResponse>(CAPACITY);
        let mut silent = WorkerScript::new(worker).with_recv_timeout(Duration::from_secs(7));
        let message = panic_of(async move { silent.expect_end().await }).await;
        assert!(message.ends_with("got nothing within 7s"), "{message}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_engine_step_names_its_number_what_it_expected_and_what_came() {
        let (mut engine, _probe) = {
            let (engine, task, probe) = spawn_echo();
            drop(task);
            (engine, probe)
        };
        engine.send(init_request("udf")).await;
        engine.expect(ResponseKind::Init).await;
        engine.send(UdfRequest::finish()).await;
        let message = panic_of(async move {
            engine.expect(ResponseKind::Data).await;
        })
        .await;
        assert!(
            message.starts_with("engine script step 4: expected Data, got Finish("),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_echo_worker_answers_a_script_and_ends_its_stream() {
        let (mut engine, task, probe) = spawn_echo();
        engine.send(init_request("udf")).await;
        crate::fixtures::assert_init_ok(&engine.expect(ResponseKind::Init).await);
        engine.send(data_request("a")).await;
        engine.send(data_request("b")).await;
        engine.send(UdfRequest::finish()).await;
        let rest = engine.recv_to_end().await;
        assert_eq!(
            crate::fixtures::data_strings(&rest),
            ["a", "b"],
            "echoed once, in order"
        );
        crate::fixtures::assert_echo_finish(rest.last().unwrap());
        assert_eq!(
            task.await.unwrap().kind(),
            tether::worker::endpoint::OutcomeKind::Finished
        );
        assert_eq!(probe.lock().unwrap().batches, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reacting_worker_pauses_and_crashes_on_cue() {
        let (engine, worker) = pair::<UdfRequest, UdfResponse>(CAPACITY);
        let task = WorkerScript::new(worker).spawn_reacting(|message| match message {
            RequestMessage::Init(_) => vec![
                Reaction::Pause(Duration::from_secs(3)),
                Reaction::Send(init_ok()),
            ],
            _ => vec![Reaction::Abort, Reaction::Send(finish_response_ok())],
        });
        let mut engine = EngineScript::new(engine);
        let start = tokio::time::Instant::now();
        engine.send(init_request("udf")).await;
        engine.expect(ResponseKind::Init).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3), "the pause");
        engine.send(data_request("row")).await;
        // The crash comes before the FinishResponse queued after it: only the stream's end.
        engine.expect_end().await;
        assert_eq!(task.await.unwrap(), [RequestKind::Init, RequestKind::Data]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reacting_worker_stops_when_the_engine_is_gone() {
        let (engine, worker) = pair::<UdfRequest, UdfResponse>(CAPACITY);
        let mut engine = EngineScript::new(engine);
        engine.send(init_request("udf")).await;
        engine.send(data_request("row")).await;
        engine.abort();
        // Its answer to Init finds no engine: the Data still buffered is never read.
        let task = WorkerScript::new(worker).spawn_echo();
        assert_eq!(task.await.unwrap(), [RequestKind::Init]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_reactive_echo_acknowledges_a_cancel_once() {
        use crate::fixtures::{assert_released_once, init, session_config};
        use tether::worker::engine::TerminationKind;
        let (session, worker, handle) = engine_session(session_config());
        let worker = worker.spawn_echo();
        let (streaming, _) = session.init(init("udf")).await.expect("init");
        let termination = streaming.close().await;
        assert_eq!(
            termination.kind(),
            TerminationKind::Cancelled,
            "{termination}"
        );
        assert_released_once(&handle, false);
        assert_eq!(
            worker.await.unwrap(),
            [RequestKind::Init, RequestKind::Cancel]
        );
    }
}
