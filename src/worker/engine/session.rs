//! The engine side of a worker session as typestates: [`Session<S, C>`](Session).

use std::fmt;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use futures::future::poll_fn;

use crate::connection::{Connection, ConnectionError};
use crate::sync::{Mutex, MutexGuard};
use crate::wire::{Init, InitResponse, UdfRequest, UdfResponse};

use super::config::SessionConfig;
use super::core::{EngineCore, EnginePhase, InitStatus};
use super::events::SessionObserver;
use super::handle::{IntoWorkerHandle, WorkerHandle};
use super::termination::{SessionError, Termination};
use crate::worker::pump::{LossExplainer, Pump};

use crate::worker::state::{self, State as _};

/// A future-or-present view of a session's final [`Termination`], available after the
/// session is finalized by `close()` or by drop cleanup. Cheap to clone. It plays the part
/// of the completion listeners of Spark's earlier `WorkerSession` (udf §4.0 v2): resolved
/// exactly once, and at once for a watcher that arrives late.
#[derive(Clone, Default)]
pub struct TerminationWatch {
    shared: Arc<Mutex<WatchState>>,
}

#[derive(Default)]
struct WatchState {
    outcome: Option<Termination>,
    wakers: Vec<Waker>,
}

impl TerminationWatch {
    fn lock(&self) -> MutexGuard<'_, WatchState> {
        self.shared.lock()
    }

    fn publish(&self, termination: Termination) {
        let wakers = {
            let mut st = self.lock();
            if st.outcome.is_some() {
                return;
            }
            st.outcome = Some(termination);
            std::mem::take(&mut st.wakers)
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    /// The final outcome, if the session has been finalized (the value `close()` returned,
    /// udf §5.3).
    pub fn get(&self) -> Option<Termination> {
        self.lock().outcome.clone()
    }

    /// Waits until the session is finalized (by `close()` or drop cleanup) and returns the
    /// outcome (udf §5.3). Never resolves for a session leaked with `mem::forget`.
    pub async fn wait(self) -> Termination {
        poll_fn(|cx| {
            let mut st = self.lock();
            match &st.outcome {
                Some(t) => Poll::Ready(t.clone()),
                None => {
                    st.wakers.push(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }
}

impl fmt::Debug for TerminationWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TerminationWatch")
            .field("outcome", &self.get())
            .finish()
    }
}

/// What a session is doing, for the context of an `Interrupted` outcome.
#[derive(Debug, Clone, Copy)]
enum Activity {
    Idle,
    AwaitingInit,
    Sending,
    Receiving,
    AwaitingTerminator,
}

impl Activity {
    fn context(self) -> &'static str {
        match self {
            Self::Idle => "the session was dropped",
            Self::AwaitingInit => "waiting for InitResponse",
            Self::Sending => "sending UDF input",
            Self::Receiving => "reading UDF result",
            Self::AwaitingTerminator => "waiting for the stream terminator",
        }
    }
}

pub(crate) struct Inner<C> {
    id: uuid::Uuid,
    core: EngineCore,
    pump: Pump<C>,
    handle: Arc<dyn WorkerHandle>,
    watch: TerminationWatch,
    activity: Activity,
    finalized: bool,
    /// Where the core's lifecycle goes (a dispatcher's observer, or the config's channel).
    observer: Option<Arc<SessionObserver>>,
    /// The worker's id for events, built once when they are listened to.
    worker_tag: Option<Arc<str>>,
    /// The session's span (`udf_session`, with its id and its worker's): what the session
    /// and its pump log while driven sits inside it.
    span: tracing::Span,
}

impl<C> Inner<C> {
    /// Reports what the core decided since the last call (udf §4.1 states), in its order.
    fn forward(&mut self) {
        if !self.core.has_lifecycle() {
            return;
        }
        let steps = self.core.take_lifecycle();
        if let Some(observer) = &self.observer {
            for step in steps {
                observer.session(
                    self.worker_tag.as_ref(),
                    self.id,
                    step,
                    self.core.terminal(),
                );
            }
        }
    }
}

impl<C> fmt::Debug for Inner<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("worker", &self.handle.id())
            .field("phase", &self.core.phase())
            .field("terminal", &self.core.terminal())
            .finish_non_exhaustive()
    }
}

impl<C> Inner<C>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    /// Drives I/O and the core's deadline until `check` yields a value.
    async fn drive<T>(&mut self, check: impl FnMut(&mut EngineCore) -> Option<T>) -> T {
        let mut check = check;
        let span = self.span.clone();
        let driving = self.pump.drive(&mut self.core, |core, _| check(core));
        let out = tracing::Instrument::instrument(driving, span).await;
        self.forward();
        out
    }

    /// Drives until the core has settled a terminal, discarding output (the core bounds the
    /// wait: udf §5.2 step 3 in `close`, §4.9 for an interrupt, per poll otherwise).
    async fn await_terminal(&mut self) {
        self.activity = Activity::AwaitingTerminator;
        self.core.discard_output();
        self.drive(|core| core.is_terminal().then_some(())).await;
    }

    /// After the terminal: hands a still-queued farewell Cancel to the transport and
    /// half-closes the request side (udf §2 R9), within the core's shutdown deadline.
    async fn shutdown_request_side(&mut self) {
        self.pump
            .drive(&mut self.core, |core, pump| {
                (pump.send_done() || core.requests_abandoned()).then_some(())
            })
            .await;
    }

    /// `close()` (udf §5.2): cancel if needed, wait for the terminal, half-close, finalize.
    async fn close(&mut self) -> Termination {
        if !self.core.is_terminal() {
            self.core.close();
            self.await_terminal().await;
        }
        self.shutdown_request_side().await;
        self.finalize()
    }

    /// Bounded cleanup of a dropped, non-terminal session (the Rust form of an interrupt,
    /// udf §4.9): the core sends Cancel and bounds the wait for its acknowledgement.
    #[cfg(feature = "tokio")]
    async fn interrupt(&mut self) -> Termination {
        self.core.interrupt(self.activity.context());
        self.await_terminal().await;
        self.shutdown_request_side().await;
        self.finalize()
    }

    /// Runs the release protocol once (udf §5.1 step 5): observe, `mark_invalid` if
    /// unsalvageable, `release_session`, publish to watchers.
    fn finalize(&mut self) -> Termination {
        let span = self.span.clone();
        let _entered = span.enter();
        if !self.core.is_terminal() {
            // Defensive guard (udf §5.1 step 3): never finalize a non-terminal session.
            self.core
                .handle_interrupt(self.activity.context(), Duration::ZERO);
        }
        let termination = self
            .core
            .terminal()
            .cloned()
            .unwrap_or_else(Termination::cancelled_before_start);
        if !self.finalized {
            self.finalized = true;
            // The outcome is reported before the worker hears of it (its invalidation and
            // release follow).
            self.forward();
            self.handle.session_terminated(&termination);
            if !termination.is_salvageable() {
                self.handle.mark_invalid();
            }
            if let Err(e) = self.handle.release_session() {
                tracing::warn!(error = %e, "release_session failed");
            }
            self.watch.publish(termination.clone());
            tracing::debug!(session = %self.id, worker = self.handle.id(), outcome = %termination, "worker session finalized");
        }
        termination
    }

    /// The error the session reports now ([`EngineCore::error`]), `Cancelled` if none.
    fn error(&self) -> SessionError {
        self.core.error().unwrap_or(SessionError::Cancelled)
    }

    async fn recv(&mut self) -> Result<Option<Bytes>, SessionError> {
        self.activity = Activity::Receiving;
        let out = self
            .drive(|core| {
                if let Some(b) = core.pop_output() {
                    return Some(Ok(Some(b)));
                }
                core.is_terminal().then(|| match core.error() {
                    None => Ok(None),
                    Some(e) => Err(e),
                })
            })
            .await;
        self.activity = Activity::Idle;
        out
    }

    /// Drives until the outbox is empty (everything handed to the transport) or terminal.
    async fn flush(&mut self, activity: Activity) {
        self.activity = activity;
        self.drive(|core| (!core.has_transmit() || core.is_terminal()).then_some(()))
            .await;
        self.activity = Activity::Idle;
    }
}

/// How a dropped, unfinalized session is cleaned up; chosen where `C: Send + 'static` is
/// known so `Drop` needs no bounds.
type Cleanup<C> = fn(Box<Inner<C>>);

// With `tokio` the box moves into the spawned clean-up task; without, it is only finalized here.
#[cfg_attr(not(feature = "tokio"), allow(clippy::boxed_local))]
fn cleanup_on_drop<C>(mut inner: Box<Inner<C>>)
where
    C: Connection<UdfRequest, UdfResponse> + Send + 'static,
{
    if inner.finalized {
        return;
    }
    if inner.core.is_terminal() {
        let _ = inner.finalize();
        return;
    }
    #[cfg(feature = "tokio")]
    if inner.pump.has_timer()
        && let Ok(rt) = tokio::runtime::Handle::try_current()
    {
        // If the task never completes (the runtime shuts down, or aborts it mid-wait), the
        // guard still finalizes the session as `Interrupted`: the release is never lost.
        let mut guard = FinalizeGuard(Some(inner));
        rt.spawn(async move {
            if let Some(inner) = guard.0.as_mut() {
                let _ = inner.interrupt().await;
            }
            drop(guard);
        });
        return;
    }
    // No runtime or no timer to bound the wait: the worker cannot be proven healthy, so
    // invalidate it now.
    let context = inner.activity.context();
    inner.core.handle_interrupt(context, Duration::ZERO);
    let _ = inner.finalize();
}

/// Finalizes a session that drop cleanup could not finish (see [`cleanup_on_drop`]).
#[cfg(feature = "tokio")]
struct FinalizeGuard<C: Connection<UdfRequest, UdfResponse>>(Option<Box<Inner<C>>>);

#[cfg(feature = "tokio")]
impl<C: Connection<UdfRequest, UdfResponse>> Drop for FinalizeGuard<C> {
    fn drop(&mut self) {
        if let Some(inner) = self.0.as_mut()
            && !inner.finalized
        {
            let context = inner.activity.context();
            inner.core.handle_interrupt(context, Duration::ZERO);
            let _ = inner.finalize();
        }
    }
}

/// One UDF execution on a worker, from the engine's side, as a typestate (udf §4–§5).
///
#[doc = include_str!("../../../docs/diagrams/engine-session.md")]
///
/// - `S` is the typestate ([`state`]); `C` the [`Connection`] carrying `UdfRequest` out and
///   `UdfResponse` in.
/// - Methods exist only where the protocol allows them: no data before `init`, no `init`
///   twice, no `finish` before `init`, nothing but inspection and `close` on `Terminated`.
///   Transitions consume `self`; a failed transition hands back a
///   `Session<state::Terminated, C>` inside [`SessionFailed`], so the outcome is never lost
///   and the worker handle is always released.
/// - The runtime phase (a worker may end the session at any time, e.g. with an unsolicited
///   `CancelResponse`) is the source of truth: operations on a session the worker already
///   ended report the [`SessionError`] derived from its [`Termination`].
/// - [`close`](Session::close) is the single finalizer, from any state: it returns the
///   `Termination` (udf §5.3), calls [`WorkerHandle::mark_invalid`] before
///   [`WorkerHandle::release_session`] when the outcome is unsalvageable, and releases exactly
///   once.
///
/// # Drop and cancellation
///
/// Dropping a session that was not closed, including a transition future dropped mid-await
/// (the Rust form of Spark's thread interrupt), never blocks and releases the handle exactly
/// once:
///
/// - already terminal: it is finalized with that outcome at once;
/// - with the `tokio` feature inside a runtime: a cleanup task sends Cancel and waits up to
///   [`SessionConfig::interrupt_cancel_timeout`] (2 s) for the acknowledgement. An ack gives
///   `Cancelled` (the worker stays valid); silence gives `Interrupted` and the worker is
///   marked invalid before release;
/// - without a runtime: `Interrupted` at once, worker marked invalid.
///
/// The outcome is observable through [`watch`](Session::watch) and
/// [`WorkerHandle::session_terminated`]. Every `async` method is cancel-safe in this sense:
/// dropping its future (and with it the session) never loses the release.
#[must_use = "a session must be driven to its end and closed; dropping it cancels it"]
pub struct Session<S: state::State, C> {
    inner: Option<Box<Inner<C>>>,
    cleanup: Cleanup<C>,
    _state: PhantomData<S>,
}

impl<S: state::State, C> fmt::Debug for Session<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(i) => write!(f, "Session<{}> {:?}", S::NAME, i),
            None => write!(f, "Session<{}> (finalized)", S::NAME),
        }
    }
}

impl<S: state::State, C> Drop for Session<S, C> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            (self.cleanup)(inner);
        }
    }
}

/// A transition that ended the session: the error, and the session in `state::Terminated`
/// so it can still be inspected and closed (its outcome is never lost). Where Spark's `init`
/// or result iterator throws a `GrpcWorkerSessionException` (udf §4.6, §4.7), tether
/// returns this.
#[derive(Debug)]
pub struct SessionFailed<C> {
    /// What went wrong, derived from the session's [`Termination`] (the first recorded
    /// execution error when the worker reported one; udf §4.6 step 5).
    pub error: SessionError,
    /// The ended session; `close()` returns its full `Termination` (udf §5.3).
    pub session: Session<state::Terminated, C>,
}

impl<C> fmt::Display for SessionFailed<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<C: fmt::Debug> std::error::Error for SessionFailed<C> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<S: state::State, C> Session<S, C> {
    fn inner(&self) -> &Inner<C> {
        self.inner
            .as_deref()
            .expect("a live session always holds its state")
    }

    fn inner_mut(&mut self) -> &mut Inner<C> {
        self.inner
            .as_deref_mut()
            .expect("a live session always holds its state")
    }

    fn into_state<T: state::State>(mut self) -> Session<T, C> {
        Session {
            inner: self.inner.take(),
            cleanup: self.cleanup,
            _state: PhantomData,
        }
    }

    /// This session's id (UUID v4), for logs (Spark's `sessionId`, udf §4.0 v2).
    pub fn id(&self) -> uuid::Uuid {
        self.inner().id
    }

    /// The worker handle this session runs on (udf §3 `WorkerHandle`).
    pub fn worker(&self) -> &Arc<dyn WorkerHandle> {
        &self.inner().handle
    }

    /// The runtime phase (udf §4.1; the typestate is a static lower bound of it: a worker
    /// can end the session at any time, udf §4.5).
    pub fn phase(&self) -> EnginePhase {
        self.inner().core.phase()
    }

    /// The settled outcome, if the session has ended (it may end before `close`; Spark's
    /// `settledTermination`, udf §4.2, without the exception while non-terminal).
    pub fn termination(&self) -> Option<&Termination> {
        self.inner().core.terminal()
    }

    /// Counters of ignored or discarded events (late messages, duplicate `InitResponse`s…;
    /// udf §4.5, udf §10 gaps 12–13).
    pub fn stats(&self) -> super::core::CoreStats {
        self.inner().core.stats()
    }

    /// A handle on the final outcome, resolved when the session is finalized by `close()` or
    /// by drop cleanup (udf §5.1: once per session).
    pub fn watch(&self) -> TerminationWatch {
        self.inner().watch.clone()
    }
}

impl<S: state::State, C> Session<S, C>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    /// The single finalizer (udf §5): from any state, sends Cancel if the session is not yet
    /// terminal (nothing if `init` was never called), waits up to
    /// [`SessionConfig::terminal_timeout`] for the terminator, half-closes the request side,
    /// then finalizes the worker handle (mark invalid if unsalvageable, release once) and
    /// returns the [`Termination`] (udf §5.3 case table). Never fails.
    pub async fn close(mut self) -> Termination {
        // The state stays in the session until finalized: dropping this future mid-wait
        // runs the drop cleanup, so the release is never lost.
        let termination = self.inner_mut().close().await;
        self.inner.take();
        termination
    }

    fn fail(self) -> SessionFailed<C> {
        SessionFailed {
            error: self.inner().error(),
            session: self.into_state(),
        }
    }
}

impl<C> Session<state::Init, C>
where
    C: Connection<UdfRequest, UdfResponse> + Send + 'static,
{
    /// A new session on `connection` for the worker behind `handle` (the handle's session
    /// count must already include this session: it is released once when the session ends;
    /// udf §6.2 steps 5–6, `acquireSession` then `newSession`). Nothing is sent until
    /// [`init`](Self::init) (udf §4.3 `doInit` opens the conversation).
    ///
    /// `handle` is an `Arc` of a concrete handle or an `Arc<dyn WorkerHandle>`
    /// ([`IntoWorkerHandle`]): keep a clone of a typed handle to inspect it afterwards.
    ///
    /// The session's lifecycle events (udf §4.1) go to
    /// [`config.events`](SessionConfig::events), if set; metrics are recorded only for the
    /// sessions of a `worker::dispatcher::Dispatcher`, which registers their handles once
    /// (see [`observe`](crate::observe)).
    pub fn new(connection: C, handle: impl IntoWorkerHandle, config: SessionConfig) -> Self {
        let observer = SessionObserver::for_session(config.events.as_ref(), &config.timer);
        Self::observed(connection, handle.into_worker_handle(), config, observer)
    }

    /// [`new`](Self::new) reporting to `observer` (a dispatcher's, whose metrics are
    /// registered once) instead of an observer of the config's own.
    pub(crate) fn observed(
        connection: C,
        handle: Arc<dyn WorkerHandle>,
        config: SessionConfig,
        observer: Option<Arc<SessionObserver>>,
    ) -> Self {
        let worker_tag = observer
            .as_ref()
            .filter(|o| o.listened())
            .map(|_| Arc::from(handle.id()));
        let explainer: LossExplainer = {
            let handle = handle.clone();
            Arc::new(move |cause: Option<&ConnectionError>| handle.explain_connection_loss(cause))
        };
        let id = uuid::Uuid::new_v4();
        let span = tracing::info_span!("udf_session", session = %id, worker = handle.id());
        let inner = Inner {
            id,
            span,
            core: EngineCore::new(&config),
            pump: Pump::new(connection, config.timer.clone()).with_explainer(Some(explainer)),
            handle,
            watch: TerminationWatch::default(),
            activity: Activity::Idle,
            finalized: false,
            observer,
            worker_tag,
        };
        let mut session = Self {
            inner: Some(Box::new(inner)),
            cleanup: cleanup_on_drop::<C>,
            _state: PhantomData,
        };
        session.inner_mut().forward();
        session
    }
}

impl<C> Session<state::Init, C>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    /// Sends `Init` and waits for `InitResponse` (udf §4.6).
    ///
    /// Returns the streaming session and the worker's `InitResponse`. On failure returns
    /// [`SessionFailed`] with the session already `Terminated`:
    /// - the worker reported an error (`InitResponse.error`, or an `ErrorResponse` before or
    ///   right behind the `InitResponse`): Cancel is sent and the `CancelResponse` awaited
    ///   (up to the terminal timeout), giving `Cancelled` carrying the error; the error is
    ///   [`SessionError::Execution`];
    /// - no `InitResponse` within [`SessionConfig::init_timeout`]: Cancel is sent and the
    ///   session settles `TransportFailed(Timeout)`;
    /// - a worker protocol violation or transport failure: `TransportFailed`.
    pub async fn init(
        self,
        init: Init,
    ) -> Result<(Session<state::Streaming, C>, InitResponse), SessionFailed<C>> {
        self.start(init, None).await
    }

    /// Like [`init`](Self::init), but sends the UDF payload as `PayloadChunk`s of at most
    /// `chunk_size` bytes (at least 1) after an `Init` whose inline payload is empty and whose
    /// `is_chunking_payload` is set; the final chunk carries `last = true` (udf §1.3, R1).
    /// `udf.payload_size` is set to the total size if unset. An empty payload is sent inline.
    pub async fn init_chunked(
        self,
        init: Init,
        chunk_size: usize,
    ) -> Result<(Session<state::Streaming, C>, InitResponse), SessionFailed<C>> {
        self.start(init, Some(chunk_size)).await
    }

    async fn start(
        mut self,
        init: Init,
        chunk_size: Option<usize>,
    ) -> Result<(Session<state::Streaming, C>, InitResponse), SessionFailed<C>> {
        let inner = self.inner_mut();
        inner
            .core
            .start_init(init, chunk_size)
            .expect("the Init typestate is the Created phase");
        inner.activity = Activity::AwaitingInit;
        let status = inner
            .drive(|core| match core.init_status() {
                InitStatus::Pending => None,
                status => Some(status),
            })
            .await;
        if status == InitStatus::Failed {
            // The Cancel is out; the core bounds the wait for its answer (udf §4.6 step 5).
            inner.await_terminal().await;
        }
        inner.activity = Activity::Idle;
        if status == InitStatus::Accepted {
            let response = inner.core.init_response().cloned().unwrap_or_default();
            return Ok((self.into_state(), response));
        }
        let error = inner.core.init_error().unwrap_or(SessionError::Cancelled);
        Err(SessionFailed {
            error,
            session: self.into_state(),
        })
    }
}

impl<C> Session<state::Streaming, C>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    /// The `InitResponse` the worker accepted the session with (what Spark's `init` returns,
    /// udf §4.3).
    pub fn init_response(&self) -> &InitResponse {
        self.inner()
            .core
            .init_response()
            .expect("a streaming session has an InitResponse")
    }

    /// Sends one `DataRequest` (one batch in the session's data format, udf §1.4) and waits
    /// until the connection has taken it, reading worker output into the bounded output
    /// buffer meanwhile.
    ///
    /// Backpressure: when the worker does not read and the output buffer is full, nothing
    /// moves; after [`SessionConfig::terminal_timeout`] without any worker event the session
    /// settles `TransportFailed(Timeout)`. Interleave [`recv`](Self::recv), or use
    /// [`process`](Self::process), which never blocks that way.
    ///
    /// # Errors
    /// If the worker has reported an error or ended the session: the error derived from it
    /// (the data is not sent; nothing is sent after Cancel). Receiving stays possible.
    pub async fn send(&mut self, data: Bytes) -> Result<(), SessionError> {
        let inner = self.inner_mut();
        let queued = inner
            .core
            .send_data(data)
            .expect("the Streaming typestate allows data");
        if !queued {
            return Err(inner.error());
        }
        inner.flush(Activity::Sending).await;
        match inner.core.is_terminal() {
            true => Err(inner.error()),
            false => Ok(()),
        }
    }

    /// Receives the next `DataResponse` payload (udf §1.4); see
    /// [`Session<state::Finishing, C>::recv`](Session::recv) for the shared semantics.
    pub async fn recv(&mut self) -> Result<Option<Bytes>, SessionError> {
        self.inner_mut().recv().await
    }

    /// Sends `Finish` (all input sent; udf §1.5): `Streaming → Finishing`.
    ///
    /// If the worker already reported an error, the Finish is skipped (a Cancel is out) and
    /// the `Finishing` session reports the error at the end of its output.
    ///
    /// # Errors
    /// [`SessionFailed`] when the session ended badly before or while sending (transport
    /// failure, unsolicited `CancelResponse`…).
    pub async fn finish(mut self) -> Result<Session<state::Finishing, C>, SessionFailed<C>> {
        let inner = self.inner_mut();
        inner
            .core
            .finish()
            .expect("the Streaming typestate allows finish");
        inner.flush(Activity::Sending).await;
        if inner.core.is_terminal() && inner.core.error().is_some() {
            return Err(self.fail());
        }
        Ok(self.into_state())
    }

    /// Sends `Cancel { reason }` (udf §1.5, §4.8): `Streaming → Cancelling`. Idempotent with
    /// any Cancel already sent.
    pub async fn cancel(self, reason: Option<String>) -> Session<state::Cancelling, C> {
        cancel_session(self, reason).await
    }

    /// Runs the session Spark's iterator-to-iterator way (udf §4.7): returns a stream of the
    /// worker's output that pulls the next input batch only when no output is waiting, sends
    /// `Finish` once `input` ends, and ends after the terminator. A worker error or failure is
    /// the stream's last item. [`ProcessStream::close`] finalizes the session.
    ///
    /// Read-ahead: as in Spark, nothing but the connection's flow control bounds how far the
    /// input runs ahead of the worker (the protocol has no acknowledgements, udf §1.4); over
    /// gRPC that is the HTTP/2 stream window, so with small batches and a slow UDF thousands
    /// of batches can be in flight. A Cancel travels in order behind them (udf §1.1), so
    /// closing such a stream early waits until the worker has read them, up to
    /// [`SessionConfig::terminal_timeout`]. Bound the backlog with the transport's window
    /// (`GrpcConfig`) or by pacing the input stream.
    pub fn process<I>(self, input: I) -> ProcessStream<C, I>
    where
        I: Stream<Item = Bytes> + Unpin,
    {
        ProcessStream {
            session: self,
            input,
            input_done: false,
            done: false,
        }
    }
}

async fn cancel_session<S: state::State, C>(
    mut session: Session<S, C>,
    reason: Option<String>,
) -> Session<state::Cancelling, C>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    let inner = session.inner_mut();
    let _ = inner.core.cancel(reason);
    inner.flush(Activity::AwaitingTerminator).await;
    session.into_state()
}

/// Waits for the terminator, discarding any output not yet received.
async fn wait_terminated<S: state::State, C>(
    mut session: Session<S, C>,
) -> Session<state::Terminated, C>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    let inner = session.inner_mut();
    if !inner.core.is_terminal() {
        inner.await_terminal().await;
        inner.activity = Activity::Idle;
    }
    session.into_state()
}

impl<C> Session<state::Finishing, C>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    /// Receives the next `DataResponse` payload, in arrival order.
    ///
    /// - `Ok(Some(batch))`: the next batch (every batch received before the terminator is
    ///   delivered);
    /// - `Ok(None)`: the session finished cleanly (`FinishResponse` without error); stays
    ///   `None` on later calls;
    /// - `Err(e)`: the session ended otherwise; the error is derived from the
    ///   [`Termination`] (recorded worker error first, then the callback error, udf §4.7).
    ///
    /// Waits at most [`SessionConfig::terminal_timeout`] for each worker event (per-poll,
    /// udf §4.7): expiry settles `TransportFailed(Timeout)`.
    pub async fn recv(&mut self) -> Result<Option<Bytes>, SessionError> {
        self.inner_mut().recv().await
    }

    /// Sends Cancel after Finish (udf §2 R5 (c)): the worker answers `FinishResponse` if it
    /// already produced it, otherwise `CancelResponse`; both are accepted.
    pub async fn cancel(self, reason: Option<String>) -> Session<state::Cancelling, C> {
        cancel_session(self, reason).await
    }

    /// Waits for the terminator (per-poll terminal timeout, udf §4.7 step 4), discarding
    /// output not yet received, and returns the ended session.
    pub async fn wait(self) -> Session<state::Terminated, C> {
        wait_terminated(self).await
    }
}

impl<C> Session<state::Cancelling, C>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    /// Receives output the worker sent before it saw the Cancel; see
    /// [`Session<state::Finishing, C>::recv`](Session::recv). Ends with
    /// `Err(SessionError::Cancelled)` (or the worker's error) once the `CancelResponse`
    /// arrives, or `Ok(None)` if the worker had already finished (udf §2 R5 (c)).
    pub async fn recv(&mut self) -> Result<Option<Bytes>, SessionError> {
        self.inner_mut().recv().await
    }

    /// Waits for the terminator (per-poll terminal timeout), discarding output not yet
    /// received, and returns the ended session (udf §4.11 `Cancelling` rows).
    pub async fn wait(self) -> Session<state::Terminated, C> {
        wait_terminated(self).await
    }
}

impl<C> Session<state::Terminated, C> {
    /// The settled outcome (Spark's `settledTermination`, udf §4.2).
    pub fn outcome(&self) -> &Termination {
        self.inner()
            .core
            .terminal()
            .expect("a Terminated session has settled")
    }
}

/// The stream returned by [`Session::process`]: the worker's output batches, pulling input on
/// demand (udf §4.7).
///
/// Items are `Ok(batch)` in arrival order; the last item is `Err(e)` if the session ended
/// with an error (cancelled, worker error, transport failure, timeout); then the stream ends
/// and stays ended. Finalize with [`close`](Self::close) (dropping it drops the session, see
/// [`Session`]'s drop rule).
#[must_use = "streams do nothing unless polled"]
pub struct ProcessStream<C, I> {
    session: Session<state::Streaming, C>,
    input: I,
    input_done: bool,
    done: bool,
}

impl<C, I> fmt::Debug for ProcessStream<C, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessStream")
            .field("session", &self.session)
            .field("input_done", &self.input_done)
            .field("done", &self.done)
            .finish()
    }
}

impl<C, I> ProcessStream<C, I>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    /// The session's outcome if it has ended (udf §4.2 `settledTermination`).
    pub fn termination(&self) -> Option<&Termination> {
        self.session.termination()
    }

    /// Finalizes the session (see [`Session::close`]); cancels it if the output was not
    /// drained (udf §5.3: an iterator abandoned mid-stream gives `Cancelled`). If the input
    /// was exhausted and `Finish` already sent, the worker may answer with `FinishResponse`
    /// first (udf §2 R5 (c)): the session is then `Finished`, and output not read by then is
    /// discarded without being reported.
    pub async fn close(self) -> Termination {
        self.session.close().await
    }
}

impl<C, I> Stream for ProcessStream<C, I>
where
    C: Connection<UdfRequest, UdfResponse> + Unpin,
    I: Stream<Item = Bytes> + Unpin,
{
    type Item = Result<Bytes, SessionError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let inner = this
            .session
            .inner
            .as_deref_mut()
            .expect("a live session always holds its state");
        let span = inner.span.clone();
        let _entered = span.enter();
        inner.pump.begin_poll();
        let poll = loop {
            let progress = inner.pump.poll_io(&mut inner.core, cx);
            if let Some(batch) = inner.core.pop_output() {
                inner.core.end_wait();
                break Poll::Ready(Some(Ok(batch)));
            }
            if inner.core.is_terminal() {
                this.done = true;
                inner.activity = Activity::Idle;
                break Poll::Ready(inner.core.error().map(Err));
            }
            if progress {
                continue;
            }
            if inner.core.may_send() && !this.input_done && !inner.core.has_transmit() {
                // Waiting on the caller's input, not on the worker.
                inner.core.end_wait();
                inner.activity = Activity::Sending;
                match Pin::new(&mut this.input).poll_next(cx) {
                    Poll::Ready(Some(batch)) => {
                        let _ = inner.core.send_data(batch);
                        continue;
                    }
                    Poll::Ready(None) => {
                        this.input_done = true;
                        let _ = inner.core.finish();
                        continue;
                    }
                    Poll::Pending => break Poll::Pending,
                }
            }
            // Waiting on the worker (output, terminator or transport capacity): the core's
            // per-poll deadline runs.
            inner.activity = Activity::Receiving;
            if inner.pump.poll_timer(&mut inner.core, cx) {
                continue;
            }
            break Poll::Pending;
        };
        // What the core decided while polling (an `Initialized`, the terminal) is reported
        // before the caller sees its effect.
        inner.forward();
        poll
    }
}

/// A worker session in any state: the erased runtime form for keeping sessions in maps
/// (like rustls' `ConnectionState`), one value per udf §4.1 state as Spark's single
/// `SessionState` reference. Convert back with `TryFrom`.
#[derive(Debug)]
pub enum AnySession<C> {
    /// [`Session<state::Init, C>`](Session).
    Init(Session<state::Init, C>),
    /// [`Session<state::Streaming, C>`](Session).
    Streaming(Session<state::Streaming, C>),
    /// [`Session<state::Finishing, C>`](Session).
    Finishing(Session<state::Finishing, C>),
    /// [`Session<state::Cancelling, C>`](Session).
    Cancelling(Session<state::Cancelling, C>),
    /// [`Session<state::Terminated, C>`](Session).
    Terminated(Session<state::Terminated, C>),
}

any_state_conversions!(AnySession, Session<C: Sized>: Init, Streaming, Finishing, Cancelling, Terminated);

impl<C> AnySession<C>
where
    C: Connection<UdfRequest, UdfResponse>,
{
    /// The typestate's name (`"Init"`, `"Streaming"`, …; the markers of udf §4.1).
    pub fn state_name(&self) -> &'static str {
        match self {
            Self::Init(_) => state::Init::NAME,
            Self::Streaming(_) => state::Streaming::NAME,
            Self::Finishing(_) => state::Finishing::NAME,
            Self::Cancelling(_) => state::Cancelling::NAME,
            Self::Terminated(_) => state::Terminated::NAME,
        }
    }

    /// The runtime phase (udf §4.1).
    pub fn phase(&self) -> EnginePhase {
        match self {
            Self::Init(s) => s.phase(),
            Self::Streaming(s) => s.phase(),
            Self::Finishing(s) => s.phase(),
            Self::Cancelling(s) => s.phase(),
            Self::Terminated(s) => s.phase(),
        }
    }

    /// The settled outcome, if any (udf §4.2 `settledTermination`).
    pub fn termination(&self) -> Option<&Termination> {
        match self {
            Self::Init(s) => s.termination(),
            Self::Streaming(s) => s.termination(),
            Self::Finishing(s) => s.termination(),
            Self::Cancelling(s) => s.termination(),
            Self::Terminated(s) => s.termination(),
        }
    }

    /// Closes the session from whatever state it is in (see [`Session::close`]; udf §4.3:
    /// `close` is allowed in any state).
    pub async fn close(self) -> Termination {
        match self {
            Self::Init(s) => s.close().await,
            Self::Streaming(s) => s.close().await,
            Self::Finishing(s) => s.close().await,
            Self::Cancelling(s) => s.close().await,
            Self::Terminated(s) => s.close().await,
        }
    }
}
