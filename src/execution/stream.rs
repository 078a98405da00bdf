//! The async driver of one execution: the consumer side ([`ResponseStream`]) and the producer
//! side ([`Producer`]) over a shared, locked [`ExecutionCore`] (reattach rx §3, §4).
//!
//! Every call locks the execution, runs one core step with the clock's `now`, and wakes the
//! tasks the step may have unblocked after unlocking (a consumer when a response, a terminal
//! or a preemption arrives; the producer when unsent responses were consumed or it must
//! stop). Wake-ups are registered under the same lock as the check, so none is lost.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use futures::future::poll_fn;
use futures::{Sink, Stream};
use prost::Message as _;

use super::budget::Waiter;
use super::core::{ConsumerEvent, ConsumerId, ExecutionCore, ProduceError, StreamEnd};
use super::error::ConnectError;
use super::events::LifecycleBatch;
use super::keys::ExecuteKey;
use super::observer::ExecutionObserver;
use super::status::{IllegalTransition, Removal};
use crate::sync::{AtomicBool, Mutex, MutexGuard, Ordering};
use crate::time::Timer;
use crate::wire::connect::{ExecutePlanResponse, Plan};

type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What an execution tells its registry: it left (released, or removed by a rule of
/// rx §2.2 T2, T10, T14, or found an orphan, SPARK-50735). The execution has already
/// closed itself (its producer told to stop, its consumer disconnected); the registry
/// applies the event the next time it is locked, before it answers anything, so no
/// observer can tell the removal was deferred. As quinn's endpoint events, it replaces a
/// pointer from the execution back into the registry.
pub(crate) struct RegistryEvent {
    /// Weak, so a queue nobody drains (its registry gone) keeps nothing alive; while the
    /// execution is registered, the registry's own reference keeps it.
    pub(crate) exec: std::sync::Weak<ExecShared>,
    pub(crate) removal: Removal,
}

/// The queue of [`RegistryEvent`]s, shared by a registry and its executions.
#[derive(Default)]
pub(crate) struct RegistryEvents {
    pending: AtomicBool,
    queue: Mutex<Vec<RegistryEvent>>,
}

impl RegistryEvents {
    fn push(&self, event: RegistryEvent) {
        self.queue.lock().push(event);
        self.pending.store(true, Ordering::Release);
    }

    /// The events pushed so far, oldest first. Cheap when there are none: one atomic load,
    /// no write (it runs on every lock of the registry).
    pub(crate) fn take(&self) -> Vec<RegistryEvent> {
        if !self.pending.load(Ordering::Acquire) || !self.pending.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.queue.lock())
    }
}

/// What every execution of one manager shares: the clock its timeouts are measured on
/// (rx §4.5, §5.3) and the queue it reports leaving the registry through. One allocation,
/// so that creating an execution takes one reference to its manager, not two.
pub(crate) struct ExecEnv {
    pub(crate) clock: Arc<dyn Timer>,
    pub(crate) events: RegistryEvents,
    /// The manager's metrics and event channel.
    pub(crate) observer: ExecutionObserver,
}

/// State shared by everything that refers to one registered execution.
pub(crate) struct ExecShared {
    pub(crate) key: ExecuteKey,
    pub(crate) operation_id: Arc<str>,
    pub(crate) reattachable: bool,
    pub(crate) tags: Box<[String]>,
    pub(crate) plan: Option<Plan>,
    /// Its manager's clock, where it reports leaving the registry, and its observer.
    env: Arc<ExecEnv>,
    /// When it was registered (`OperationStarted`), on the manager's clock.
    started_at: Instant,
    state: Mutex<ExecState>,
}

/// The lock of one execution: its state, and on release the lifecycle events the core
/// decided under it, forwarded to the manager's observer in order before the lock is
/// released (so that one execution's events reach the channel in the order decided).
pub(crate) struct ExecGuard<'a> {
    exec: &'a ExecShared,
    state: MutexGuard<'a, ExecState>,
}

impl std::ops::Deref for ExecGuard<'_> {
    type Target = ExecState;

    fn deref(&self) -> &ExecState {
        &self.state
    }
}

impl std::ops::DerefMut for ExecGuard<'_> {
    fn deref_mut(&mut self) -> &mut ExecState {
        &mut self.state
    }
}

impl Drop for ExecGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.state.core.has_lifecycle() {
            let batch = self.state.core.take_lifecycle();
            self.exec.forward(batch);
        }
    }
}

pub(crate) struct ExecState {
    pub(crate) core: ExecutionCore,
    consumer_waker: Option<(ConsumerId, Waker)>,
    producer_waker: Option<Waker>,
    watchers: Vec<Waker>,
}

/// Wakers collected under a lock, woken after it is released.
#[derive(Default)]
pub(crate) struct Wakes(Vec<Waker>);

impl Wakes {
    pub(crate) fn push(&mut self, w: Option<Waker>) {
        if let Some(w) = w {
            self.0.push(w);
        }
    }

    /// Wakes what was collected. Inlined where the lock is released: nearly always nothing
    /// was collected, and then this is one comparison.
    #[inline]
    pub(crate) fn wake(self) {
        if !self.0.is_empty() {
            self.wake_all();
        }
    }

    fn wake_all(self) {
        self.0.into_iter().for_each(Waker::wake);
    }
}

impl ExecState {
    pub(crate) fn take_consumer(&mut self) -> Option<Waker> {
        self.consumer_waker.take().map(|(_, w)| w)
    }

    pub(crate) fn take_producer(&mut self) -> Option<Waker> {
        self.producer_waker.take()
    }

    /// Every registered waker: after a step that may change the phase.
    pub(crate) fn take_all(&mut self, wakes: &mut Wakes) {
        wakes.push(self.take_consumer());
        wakes.push(self.take_producer());
        wakes.0.append(&mut self.watchers);
    }

    pub(crate) fn watch(&mut self, waker: &Waker) {
        if !self.watchers.iter().any(|w| w.will_wake(waker)) {
            self.watchers.push(waker.clone());
        }
    }
}

impl ExecShared {
    /// A registered execution (its registration is reported by the manager, after the
    /// registry's own notes).
    pub(crate) fn new(
        key: ExecuteKey,
        core: ExecutionCore,
        tags: Box<[String]>,
        plan: Option<Plan>,
        env: Arc<ExecEnv>,
    ) -> Self {
        Self {
            operation_id: core.log().stamp().operation_id.clone(),
            reattachable: core.is_reattachable(),
            key,
            tags,
            plan,
            started_at: env.clock.now(),
            env,
            state: Mutex::new(ExecState {
                core,
                consumer_waker: None,
                producer_waker: None,
                watchers: Vec::new(),
            }),
        }
    }

    /// When it was registered, on the manager's clock.
    pub(crate) fn started_at(&self) -> Instant {
        self.started_at
    }

    pub(crate) fn lock(&self) -> ExecGuard<'_> {
        ExecGuard {
            exec: self,
            state: self.state.lock(),
        }
    }

    /// Hands what the core decided to the manager's observer (metrics, then the event
    /// channel). Out of line: the lock's release only checks whether there is anything.
    #[inline(never)]
    pub(crate) fn forward(&self, batch: LifecycleBatch) {
        self.env
            .observer
            .lifecycle(|| self.env.clock.now(), &self.key, self.started_at, batch);
    }

    /// The manager's observer (metrics and events).
    pub(crate) fn observer(&self) -> &ExecutionObserver {
        &self.env.observer
    }

    /// The producer starts waiting for the memory budget with a response of `bytes`.
    fn budget_wait(&self, bytes: u64, budget: Option<&Arc<super::MemoryBudget>>) {
        let observer = &self.env.observer;
        observer.producer_waiting(self.env.clock.now(), &self.key, bytes);
        if let Some(budget) = budget {
            observer.sample_budget(&budget.usage());
        }
    }

    pub(crate) fn now(&self) -> Instant {
        self.env.clock.now()
    }

    /// Removes a non-reattachable execution whose only consumer ended (rx §2.2 T14).
    fn release_non_reattachable(self: &Arc<Self>) {
        if !self.reattachable {
            self.leave(Removal::Released);
        }
    }

    /// Leaves the registry (rx §2.2 T12): closes the execution now (its producer is told
    /// to stop, its consumer disconnected, its responses dropped) and tells the registry.
    /// Returns whether this call closed it (false when it had already left).
    pub(crate) fn leave(self: &Arc<Self>, removal: Removal) -> bool {
        let mut wakes = Wakes::default();
        let closed = self.close_into(removal, &mut wakes);
        wakes.wake();
        closed
    }

    /// [`leave`](Self::leave), collecting the wake-ups into `wakes`.
    fn close_into(self: &Arc<Self>, removal: Removal, wakes: &mut Wakes) -> bool {
        let closed = {
            let mut st = self.lock();
            let open = st.core.removal().is_none();
            let _ = st.core.close(removal);
            st.take_all(wakes);
            open
        };
        self.env.events.push(RegistryEvent {
            exec: Arc::downgrade(self),
            removal,
        });
        closed
    }

    /// Attaches a new consumer resuming after `last_response_id` (rx §5.5 ReattachExecute
    /// steps 3–4), preempting the attached one (which gets `DISCONNECTED`).
    ///
    /// An orphan (its producer vanished without finishing, SPARK-50735) leaves the
    /// registry and answers the orphan error.
    pub(crate) fn attach(
        self: &Arc<Self>,
        last_response_id: Option<&str>,
        now: Instant,
        wakes: &mut Wakes,
    ) -> Result<ResponseStream, ConnectError> {
        let mut st = self.lock();
        let (attached, preempted) = st.core.reattach(last_response_id, now);
        if preempted.is_some() {
            wakes.push(st.take_consumer());
        }
        drop(st);
        match attached {
            Ok(id) => Ok(ResponseStream::new(self.clone(), id)),
            Err(e @ ConnectError::Orphaned { .. }) => {
                // The core closed the orphan; it leaves the registry (SPARK-50735).
                self.close_into(Removal::Released, wakes);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

impl fmt::Debug for ExecShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution")
            .field("key", &self.key)
            .field("reattachable", &self.reattachable)
            .field("phase", &self.lock().core.phase())
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------
// Consumer
// ---------------------------------------------------------------------------------------------

/// One attached consumer: the response stream of an `ExecutePlan` or `ReattachExecute` RPC
/// (Spark's `ExecuteGrpcResponseSender`, rx §4). Yields responses in index order; ends
/// (`None`) on completion or graceful rotation; yields one error and then ends on
/// preemption (`INVALID_CURSOR.DISCONNECTED`), a released position
/// (`POSITION_NOT_AVAILABLE`), the execution's terminal error (`OPERATION_CANCELED`, a
/// producer failure) or an orphan.
///
/// For a reattachable execution a stream that ends without a `ResultComplete` response
/// means "reattach" (rx §1.3); [`end`](Self::end) tells which kind of end it was.
///
/// Dropping the stream detaches it (rx §2.2 T4): a reattachable execution starts its
/// detached timeout, a non-reattachable one is released (T14). Cancel-safe: dropping a
/// `next()` future loses nothing (the response is only taken when it is returned).
///
/// The `Stream` impl notices preemption only when polled. A transport that can block
/// (a full HTTP/2 window) should use [`forward`](Self::forward), which also watches for
/// preemption and for the rotation deadline while the sink is not ready (SPARK-44855,
/// rx §4.3).
#[must_use = "a dropped ResponseStream detaches its consumer (rx §4): attach only to read"]
pub struct ResponseStream {
    exec: Arc<ExecShared>,
    id: ConsumerId,
    sleep: Option<(Instant, Sleep)>,
    /// How the stream ended, once it has. Kept as the end itself rather than the whole
    /// [`ConsumerEvent`] (whose `Response` variant is 248 bytes), so that the stream stays
    /// small to move: a create + attach moves it several times.
    terminal: Option<Result<StreamEnd, ConnectError>>,
    yielded_terminal: bool,
}

/// The end a terminal consumer event carries (`End` or `Error`), `None` for the others.
fn terminal_of(ev: &ConsumerEvent) -> Option<Result<StreamEnd, ConnectError>> {
    match ev {
        ConsumerEvent::End(e) => Some(Ok(*e)),
        ConsumerEvent::Error(e) => Some(Err(e.clone())),
        ConsumerEvent::Response(_) | ConsumerEvent::Pending { .. } => None,
    }
}

/// The consumer event that repeats an end.
fn terminal_event(end: Result<StreamEnd, ConnectError>) -> ConsumerEvent {
    match end {
        Ok(e) => ConsumerEvent::End(e),
        Err(e) => ConsumerEvent::Error(e),
    }
}

impl fmt::Debug for ResponseStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseStream")
            .field("operation_id", &self.exec.operation_id)
            .field("consumer", &self.id)
            .field("terminal", &self.terminal)
            .finish()
    }
}

/// Why [`ResponseStream::forward`] stopped with an error: the stream's own error (which
/// Spark's sender delivers with `onError`, rx §4.2) or the transport's (the sender exits,
/// rx §2.2 T4).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError<E> {
    /// The stream failed with a protocol error (send it as the RPC's status, rx §1.8).
    #[error(transparent)]
    Connect(ConnectError),
    /// The sink failed (the transport is gone); the consumer was detached. The sink's error
    /// is the source.
    #[error("the response sink failed")]
    Sink(#[source] E),
}

impl ResponseStream {
    pub(crate) fn new(exec: Arc<ExecShared>, id: ConsumerId) -> Self {
        Self {
            exec,
            id,
            sleep: None,
            terminal: None,
            yielded_terminal: false,
        }
    }

    /// The canonical (lower-case) operation id of the execution (rx §1.9), as on every
    /// response (rx §1.3).
    pub fn operation_id(&self) -> &str {
        &self.exec.operation_id
    }

    /// Which consumer this stream is (attach order within its execution; a later attach
    /// preempts it, rx §4.4).
    pub fn consumer_id(&self) -> ConsumerId {
        self.id
    }

    /// Whether the execution is reattachable (rx §1.2).
    pub fn is_reattachable(&self) -> bool {
        self.exec.reattachable
    }

    /// How the stream ended, once it has: `Some(Ok(end))` for a graceful end (complete or
    /// rotated, rx §4.2), `Some(Err)` for an error end, `None` while it is live.
    pub fn end(&self) -> Option<Result<StreamEnd, ConnectError>> {
        self.terminal.clone()
    }

    fn step(&mut self, cx: Option<&Waker>) -> ConsumerEvent {
        if let Some(t) = &self.terminal {
            return terminal_event(t.clone());
        }
        let now = self.exec.now();
        let mut wakes = Wakes::default();
        let ev = {
            let mut st = self.exec.lock();
            let ev = st.core.poll_consumer(self.id, now);
            match &ev {
                ConsumerEvent::Response(_) => wakes.push(st.take_producer()),
                ConsumerEvent::Pending { .. } => {
                    if let Some(w) = cx {
                        st.consumer_waker = Some((self.id, w.clone()));
                    }
                }
                ConsumerEvent::End(_) | ConsumerEvent::Error(_) => {
                    if st
                        .consumer_waker
                        .as_ref()
                        .is_some_and(|(i, _)| *i == self.id)
                    {
                        st.consumer_waker = None;
                    }
                    wakes.push(st.take_producer());
                    wakes.0.append(&mut st.watchers);
                }
            }
            ev
        };
        wakes.wake();
        if let Some(end) = terminal_of(&ev) {
            self.record_end(end);
        }
        ev
    }

    /// The stream ended with `end`: counted if it is an error (the errors metric, rx §1.8),
    /// kept for every later poll, and a non-reattachable execution released (rx §2.2 T14).
    fn record_end(&mut self, end: Result<StreamEnd, ConnectError>) {
        if let Err(e) = &end {
            self.exec.observer().error(e);
        }
        self.terminal = Some(end);
        self.sleep = None;
        self.exec.release_non_reattachable();
    }

    /// One synchronous step at the clock's current time (sans-IO style, for tests and
    /// custom drivers): one turn of the sender loop of rx §4.2 — the next response,
    /// `Pending`, or the end. After the end it keeps returning the same terminal event.
    pub fn try_next(&mut self) -> ConsumerEvent {
        self.step(None)
    }

    fn poll_deadline(&mut self, wake_at: Option<Instant>, cx: &mut Context<'_>) -> bool {
        let Some(at) = wake_at else {
            self.sleep = None;
            return false;
        };
        if self.sleep.as_ref().is_none_or(|(d, _)| *d != at) {
            self.sleep = Some((at, self.exec.env.clock.sleep_until(at)));
        }
        match &mut self.sleep {
            Some((_, s)) => s.as_mut().poll(cx).is_ready(),
            None => false,
        }
    }

    /// Drives the stream into `sink` until it ends (rx §4.2, §4.3): each response is
    /// handed to the sink only once it is ready; while it is not, preemption
    /// (`DISCONNECTED`) and the rotation deadline (a graceful end, nothing more sent) are
    /// still noticed promptly. Flushes the sink before returning a graceful end.
    ///
    /// # Errors
    /// [`ForwardError::Connect`] with the stream's error, or [`ForwardError::Sink`] if the
    /// sink failed (the consumer is then detached).
    pub async fn forward<Si>(mut self, sink: &mut Si) -> Result<StreamEnd, ForwardError<Si::Error>>
    where
        Si: Sink<ExecutePlanResponse> + Unpin,
    {
        loop {
            let ready = poll_fn(|cx| {
                // Preempted / rotated while the transport is blocked?
                let now = self.exec.now();
                let (interrupt, deadline) = {
                    let mut st = self.exec.lock();
                    let ev = st.core.poll_interrupt(self.id, now);
                    if ev.is_none() {
                        st.consumer_waker = Some((self.id, cx.waker().clone()));
                    }
                    (ev, st.core.deadline(self.id))
                };
                if let Some(ev) = interrupt {
                    return Poll::Ready(Err(ev));
                }
                if self.poll_deadline(deadline, cx) {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                match Pin::new(&mut *sink).poll_ready(cx) {
                    Poll::Ready(Ok(())) => Poll::Ready(Ok(Ok(()))),
                    Poll::Ready(Err(e)) => Poll::Ready(Ok(Err(e))),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await;
            match ready {
                Err(ev) => {
                    let end = terminal_of(&ev).unwrap_or(Ok(StreamEnd::Rotated));
                    self.finish_with(end.clone());
                    return end.map_err(ForwardError::Connect);
                }
                Ok(Err(e)) => return Err(ForwardError::Sink(e)),
                Ok(Ok(())) => {}
            }
            match futures::StreamExt::next(&mut self).await {
                Some(Ok(r)) => {
                    if let Err(e) = Pin::new(&mut *sink).start_send(r) {
                        return Err(ForwardError::Sink(e));
                    }
                }
                Some(Err(e)) => return Err(ForwardError::Connect(e)),
                None => {
                    poll_fn(|cx| Pin::new(&mut *sink).poll_flush(cx))
                        .await
                        .map_err(ForwardError::Sink)?;
                    return Ok(match self.end() {
                        Some(Ok(end)) => end,
                        _ => StreamEnd::Complete,
                    });
                }
            }
        }
    }

    fn finish_with(&mut self, end: Result<StreamEnd, ConnectError>) {
        {
            let mut wakes = Wakes::default();
            let mut st = self.exec.lock();
            if st
                .consumer_waker
                .as_ref()
                .is_some_and(|(i, _)| *i == self.id)
            {
                st.consumer_waker = None;
            }
            wakes.push(st.take_producer());
            wakes.0.append(&mut st.watchers);
            drop(st);
            wakes.wake();
        }
        self.yielded_terminal = true;
        self.record_end(end);
    }
}

impl Stream for ResponseStream {
    type Item = Result<ExecutePlanResponse, ConnectError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.yielded_terminal {
            return Poll::Ready(None);
        }
        loop {
            match this.step(Some(cx.waker())) {
                ConsumerEvent::Response(r) => return Poll::Ready(Some(Ok(r))),
                ConsumerEvent::End(_) => {
                    this.yielded_terminal = true;
                    return Poll::Ready(None);
                }
                ConsumerEvent::Error(e) => {
                    this.yielded_terminal = true;
                    return Poll::Ready(Some(Err(e)));
                }
                ConsumerEvent::Pending { wake_at } => {
                    if this.poll_deadline(wake_at, cx) {
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl Drop for ResponseStream {
    fn drop(&mut self) {
        if self.terminal.is_some() {
            return;
        }
        let now = self.exec.now();
        let mut wakes = Wakes::default();
        {
            let mut st = self.exec.lock();
            if st.core.detach(self.id, now) {
                st.consumer_waker = None;
                wakes.push(st.take_producer());
                wakes.0.append(&mut st.watchers);
            }
        }
        wakes.wake();
        self.exec.release_non_reattachable();
    }
}

// ---------------------------------------------------------------------------------------------
// Producer
// ---------------------------------------------------------------------------------------------

/// The producing side of one execution (the query runner, rx §2.2 T6–T8): appends
/// responses, then [`finish`](Self::finish)es or [`fail`](Self::fail)s exactly once.
///
/// Backpressure: [`push`](Self::push) waits while the unsent responses are at their bound
/// (64 MiB / 100 000 by default); [`try_push`](Self::try_push) hands the response back
/// instead. A producer is never dropped for being slow or fast.
///
/// Stop producing when a call returns [`ProduceError::Cancelled`] (interrupt) or
/// [`ProduceError::Closed`] (released, abandoned, session closed); [`cancelled`](Self::cancelled)
/// resolves at that moment too.
///
/// Dropping a producer that neither finished nor failed makes the execution an orphan
/// (rx §2.2 T15): consumers get an error at the end of the log instead of waiting
/// forever (SPARK-50735).
#[must_use = "a dropped Producer makes the execution an orphan (rx §2.2 T15)"]
pub struct Producer {
    exec: Arc<ExecShared>,
    done: bool,
}

impl fmt::Debug for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("operation_id", &self.exec.operation_id)
            .field("done", &self.done)
            .finish()
    }
}

impl Producer {
    pub(crate) fn new(exec: Arc<ExecShared>) -> Self {
        Self { exec, done: false }
    }

    /// The canonical (lower-case) operation id of the execution (rx §1.9).
    pub fn operation_id(&self) -> &str {
        &self.exec.operation_id
    }

    /// The execution's tags (rx §1.2).
    pub fn tags(&self) -> &[String] {
        &self.exec.tags
    }

    /// The `server_side_session_id` of the execution's session, stamped on every response
    /// (rx §3.2, connect §3).
    pub fn server_side_session_id(&self) -> Arc<str> {
        self.exec
            .lock()
            .core
            .log()
            .stamp()
            .server_side_session_id
            .clone()
    }

    /// The plan the execution was submitted with (`ExecutePlanRequest.plan`, rx §1.2).
    pub fn plan(&self) -> Option<&Plan> {
        self.exec.plan.as_ref()
    }

    /// The engine analyzed the plan: posts `SparkListenerConnectOperationAnalyzed` with the
    /// statement text the engine wants reported, if any (Spark's `postAnalyzed`, rx §2.1
    /// item 4; see [`ExecutionEvent`](super::ExecutionEvent)). Optional: an engine that
    /// never calls it goes from Started to Finished, as Spark allows.
    ///
    /// # Errors
    /// [`IllegalTransition`] when Spark's status machine refuses it (twice-analyzed is
    /// allowed; after readiness, an end or a cancel it is not): nothing is posted.
    pub fn analyzed(&self, statement_text: Option<String>) -> Result<(), IllegalTransition> {
        self.exec.lock().core.analyzed(statement_text)
    }

    /// The engine is about to execute: posts
    /// `SparkListenerConnectOperationReadyForExecution` (Spark's `postReadyForExecution`,
    /// rx §2.1 item 4). Only after [`analyzed`](Self::analyzed); an engine that reported
    /// the analysis and finishes without this is ready when it finishes.
    ///
    /// # Errors
    /// [`IllegalTransition`] unless the operation is Analyzed: nothing is posted.
    pub fn ready_for_execution(&self) -> Result<(), IllegalTransition> {
        self.exec.lock().core.ready_for_execution()
    }

    /// Whether a response of `size` encoded bytes would have to wait now (tether's unsent
    /// bound; Spark's producer never waits, rx §3.2).
    pub fn would_block(&self, size: u64) -> bool {
        self.exec.lock().core.would_block(size)
    }

    /// Appends a response without waiting (rx §2.2 T6). Returns its index (from 1,
    /// rx §3.1).
    ///
    /// # Errors
    /// [`ProduceError::WouldBlock`] (with the response) at the unsent bound,
    /// [`ProduceError::BudgetFull`] (with the response) when the manager's
    /// [`MemoryBudget`](super::MemoryBudget) does not admit it; `Cancelled` / `Closed` /
    /// `Finished` when production must stop.
    pub fn try_push(&mut self, response: ExecutePlanResponse) -> Result<u64, ProduceError> {
        let mut wakes = Wakes::default();
        let r = {
            let mut st = self.exec.lock();
            let r = st.core.push(response);
            if r.is_ok() {
                wakes.push(st.take_consumer());
            }
            r
        };
        wakes.wake();
        r
    }

    /// Appends a response (rx §2.2 T6), waiting while the unsent bound is reached or the
    /// manager's [`MemoryBudget`](super::MemoryBudget) is used up (tether's backpressure;
    /// Spark's producer never waits, rx §3.2). Producers waiting for the budget are
    /// admitted in FIFO order as bytes are returned; one whose execution holds nothing is
    /// admitted at once (the per-execution floor).
    /// Cancel-safe in the sense that dropping the future drops the response unsent (and
    /// gives up its place in the budget's queue).
    ///
    /// # Errors
    /// `Cancelled` / `Closed` / `Finished` / `NotStarted` when production must stop.
    pub async fn push(&mut self, response: ExecutePlanResponse) -> Result<u64, ProduceError> {
        let mut pending = Some(response);
        // Our place in the budget's FIFO queue; dropping it (with this future) gives it up.
        let mut waiter: Option<Waiter> = None;
        // Whether this push reported that it waits for the budget.
        let mut announced = false;
        poll_fn(|cx| {
            let Some(r) = pending.take() else {
                return Poll::Ready(Err(ProduceError::Finished));
            };
            let mut wakes = Wakes::default();
            let out = {
                let mut st = self.exec.lock();
                let pushed = match st.core.log().budget().cloned() {
                    Some(budget) => {
                        let w = waiter.get_or_insert_with(|| Waiter::new(budget));
                        w.set_waker(cx.waker());
                        st.core.push_waiting(r, w)
                    }
                    None => st.core.push(r),
                };
                match pushed {
                    Ok(i) => {
                        wakes.push(st.take_consumer());
                        Poll::Ready(Ok(i))
                    }
                    Err(ProduceError::BudgetFull(r)) => {
                        if !announced {
                            announced = true;
                            let bytes = r.encoded_len() as u64;
                            self.exec.budget_wait(bytes, st.core.log().budget());
                        }
                        st.producer_waker = Some(cx.waker().clone());
                        pending = Some(*r);
                        Poll::Pending
                    }
                    Err(ProduceError::WouldBlock(r)) => {
                        st.producer_waker = Some(cx.waker().clone());
                        pending = Some(*r);
                        Poll::Pending
                    }
                    Err(e) => Poll::Ready(Err(e)),
                }
            };
            wakes.wake();
            out
        })
        .await
    }

    /// Whether the execution was interrupted, released or abandoned: stop producing
    /// (rx §2.2 T9, T12).
    pub fn is_cancelled(&self) -> bool {
        self.exec.lock().core.producer_must_stop()
    }

    /// Resolves once the execution is interrupted, released or abandoned (rx §2.2 T9,
    /// T12).
    pub async fn cancelled(&self) {
        poll_fn(|cx| {
            let mut st = self.exec.lock();
            if st.core.producer_must_stop() {
                Poll::Ready(())
            } else {
                st.watch(cx.waker());
                Poll::Pending
            }
        })
        .await
    }

    fn end_with(
        &mut self,
        f: impl FnOnce(&mut ExecutionCore) -> Result<(), ProduceError>,
    ) -> Result<(), ProduceError> {
        self.done = true;
        let mut wakes = Wakes::default();
        let r = {
            let mut st = self.exec.lock();
            let r = f(&mut st.core);
            st.take_all(&mut wakes);
            r
        };
        wakes.wake();
        r
    }

    /// Finishes successfully (rx §2.2 T7): a reattachable execution gets `ResultComplete`
    /// appended atomically; nothing can follow. An interrupt arriving after this is a no-op.
    ///
    /// # Errors
    /// `Cancelled` / `Closed` if an interrupt or release came first (its outcome stands).
    pub fn finish(mut self) -> Result<(), ProduceError> {
        self.end_with(ExecutionCore::finish)
    }

    /// Fails the execution with `error` (rx §2.2 T8), delivered after every earlier
    /// response to every consumer that reaches the end.
    ///
    /// # Errors
    /// As [`finish`](Self::finish).
    pub fn fail(mut self, error: ConnectError) -> Result<(), ProduceError> {
        self.end_with(|c| c.fail(error))
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.end_with(|c| {
                c.producer_gone();
                Ok(())
            });
        }
    }
}
