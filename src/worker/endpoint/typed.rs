//! The worker side of a worker session as typestates: [`Endpoint<S, C>`](Endpoint).

use std::fmt;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::poll_fn;

use crate::connection::{Connection, ConnectionError};
use crate::wire::{CancelResponse, ExecutionError, FinishResponse, Init};
use crate::wire::{UdfRequest, UdfResponse};
use crate::worker::pump::Pump;
use crate::worker::state;

use super::config::EndpointConfig;
use super::core::{DataSent, Delivery, EndpointOutcome, WorkerCore, WorkerPhase, WorkerStats};
use super::violation::{EngineViolation, InitRejection};

/// Why an [`Endpoint`] operation could not go on: the engine cancelled (udf §2 R7), or the
/// session ended (R5, R6, R8). The endpoint itself still holds the full
/// [`EndpointOutcome`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The engine sent `Cancel` (udf §1.5): stop producing output; the next transition
    /// leads to the `CancelResponse`.
    #[error("the engine cancelled the UDF execution{}", reason_suffix(.reason))]
    Cancelled {
        /// The `Cancel.reason` the engine gave.
        reason: Option<String>,
    },
    /// The engine broke the protocol; the worker already answered with a `ProtocolError`
    /// and a `CancelResponse` and closed the stream (udf §2 R6). The violation is the
    /// [`source`](std::error::Error::source).
    #[error("protocol violation by the engine")]
    ProtocolViolation(#[source] EngineViolation),
    /// The connection failed; nothing more can be sent (udf §2 R8).
    #[error(transparent)]
    Transport(ConnectionError),
    /// The session already ended normally (its terminator was sent, udf §2 R5).
    #[error("the worker session has already ended")]
    Ended,
}

fn reason_suffix(reason: &Option<String>) -> String {
    reason
        .as_ref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default()
}

impl EndpointError {
    fn from_outcome(outcome: &EndpointOutcome) -> Self {
        match outcome {
            EndpointOutcome::Finished => Self::Ended,
            EndpointOutcome::Cancelled { reason, .. } => Self::Cancelled {
                reason: reason.clone(),
            },
            EndpointOutcome::ProtocolViolation(v) => Self::ProtocolViolation(v.clone()),
            EndpointOutcome::TransportFailed(e) => Self::Transport(e.clone()),
        }
    }
}

struct Inner<C> {
    core: WorkerCore,
    pump: Pump<C>,
    config: EndpointConfig,
    /// Best-effort, non-blocking close for `Drop` (chosen where the `Connection` bound is
    /// known, so `Drop` needs none).
    close_now: fn(&mut C),
}

impl<C> Drop for Inner<C> {
    fn drop(&mut self) {
        if !self.pump.send_done() {
            if !self.core.is_done() {
                tracing::debug!(phase = ?self.core.phase(), "worker endpoint dropped before its terminator; closing the stream");
            }
            (self.close_now)(self.pump.connection_mut());
        }
    }
}

fn close_now<C: Connection<UdfResponse, UdfRequest>>(conn: &mut C) {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let _ = conn.poll_close(&mut cx);
}

impl<C> Inner<C>
where
    C: Connection<UdfResponse, UdfRequest>,
{
    /// Done, and the terminator handed over and the stream half-closed (or the transport
    /// gone): nothing is left to drive.
    fn settled(core: &WorkerCore, pump: &Pump<C>) -> bool {
        core.is_done() && !core.has_transmit() && pump.send_done()
    }

    /// Drives I/O and the core's deadlines (the wait for the `Init`, the R4 Cancel wait)
    /// until `check` yields a value.
    async fn drive<T>(&mut self, check: impl FnMut(&mut WorkerCore, &Pump<C>) -> Option<T>) -> T {
        self.pump.drive(&mut self.core, check).await
    }

    /// Drives until every queued response is handed to the transport (or the session is
    /// settled).
    async fn flush(&mut self) {
        self.drive(|core, pump| (!core.has_transmit() || Self::settled(core, pump)).then_some(()))
            .await
    }

    /// Drives until settled.
    async fn settle(&mut self) {
        self.drive(|core, pump| Self::settled(core, pump).then_some(()))
            .await
    }

    /// The error for an operation that cannot go on (Cancel received or session ended).
    fn stop_error(core: &WorkerCore) -> Option<EndpointError> {
        if let Some(outcome) = core.outcome() {
            return Some(EndpointError::from_outcome(outcome));
        }
        core.cancel_received().map(|c| EndpointError::Cancelled {
            reason: c.reason.clone(),
        })
    }

    async fn send(&mut self, data: Bytes) -> Result<(), EndpointError> {
        let ticket = match self.core.send_data(data) {
            Ok(DataSent::Queued(ticket)) => ticket,
            Ok(DataSent::Dropped) | Err(_) => {
                return Err(Self::stop_error(&self.core).unwrap_or(EndpointError::Ended));
            }
        };
        self.drive(|core, pump| match core.delivery(ticket) {
            // Handed to the transport before any Cancel or failure was seen.
            Delivery::Transmitted => Some(Ok(())),
            Delivery::Queued => None,
            // Cancelled or ended (once a violation's answer is out): the batch is dropped.
            Delivery::Dropped if !core.is_done() || Self::settled(core, pump) => {
                Self::stop_error(core).map(Err)
            }
            Delivery::Dropped => None,
        })
        .await
    }
}

/// One UDF execution on the worker side, as a typestate (udf §2, §2.1): the protocol a UDF
/// worker written in Rust speaks on one `Execute` stream.
///
/// ```text
///   Endpoint<state::Init> ── recv_init ──► InitRequest ── accept ──► Endpoint<state::Streaming>
///     │ bad Init, Cancel:                    │ reject                   │ recv()* send()*
///     │ answered automatically               ▼                          │ end_of_input()
///     │                         Endpoint<state::Cancelling> ◄── fail ───┼── InputEnd::Cancel
///     │                             │ cancelled(resp) ▲                 ▼ InputEnd::Finish
///     │                             │                 └─ fail ─ Endpoint<state::Finishing>
///     ▼                             ▼                                   │ send()* finish(resp)
///   Endpoint<state::Terminated> ◄───┴───────────────────────────────────┘
///      outcome(): Finished | Cancelled | ProtocolViolation | TransportFailed
/// ```
///
/// - `S` is one of the worker-session typestate markers ([`state`](crate::worker::state),
///   shared with the engine's [`Session`](crate::worker::engine::Session)); `C` is the
///   [`Connection`] carrying `UdfResponse` out and `UdfRequest` in.
/// - Methods exist only where the protocol allows them: no output before the
///   `InitResponse` (R2), no second error, no output after an error or a terminator.
///   Transitions consume `self` and always hand back an endpoint that leads to
///   `Terminated`, so the outcome is never lost.
/// - The rules live in [`WorkerCore`], which the endpoint drives; it reads requests while
///   it sends, so a `Cancel` is noticed promptly (unless the bounded input buffer is full:
///   a Cancel is in order with the data before it, udf §1.1). Engine protocol violations
///   are answered by the core on its own (R6); the runtime phase is the source of truth, so
///   after one every operation reports [`EndpointError::ProtocolViolation`] and
///   `end_of_input` leads to `Terminated`.
///
/// # Drop
///
/// Dropping a non-terminal endpoint (or a transition future mid-await) never blocks: it
/// closes the response side at once, without a terminator, so the engine sees the stream
/// end (R10: it settles a transport failure). Dropping a `Terminated` endpoint is the same
/// as [`close`](Endpoint::close).
#[must_use = "an endpoint must be driven to Terminated; dropping it closes the stream without a terminator"]
pub struct Endpoint<S: state::State, C> {
    inner: Box<Inner<C>>,
    _state: PhantomData<S>,
}

impl<S: state::State, C> fmt::Debug for Endpoint<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("state", &S::NAME)
            .field("phase", &self.inner.core.phase())
            .field("outcome", &self.inner.core.outcome())
            .finish_non_exhaustive()
    }
}

impl<S: state::State, C> Endpoint<S, C> {
    fn into_state<T: state::State>(self) -> Endpoint<T, C> {
        Endpoint {
            inner: self.inner,
            _state: PhantomData,
        }
    }

    /// The runtime phase (udf §2.1 states). The typestate is a static lower bound of it: the
    /// engine can cancel (udf §2 R3) or break the protocol at any time.
    pub fn phase(&self) -> WorkerPhase {
        self.inner.core.phase()
    }

    /// Whether the engine has sent `Cancel` (output is no longer sent, udf §2 R7).
    pub fn cancel_requested(&self) -> bool {
        self.inner.core.cancel_received().is_some()
    }

    /// The engine's `Cancel.reason` (udf §1.5), if a Cancel with a reason arrived.
    pub fn cancel_reason(&self) -> Option<&str> {
        self.inner
            .core
            .cancel_received()
            .and_then(|c| c.reason.as_deref())
    }

    /// The outcome (udf §2 R5–R8, see [`EndpointOutcome`]), if the session has already
    /// ended; `None` before.
    pub fn outcome_if_ended(&self) -> Option<&EndpointOutcome> {
        self.inner.core.outcome()
    }

    /// Why the worker rejected the engine's `Init` on its own (the checks of udf §1.3; see
    /// [`WorkerCore::init_rejection`]), if it did.
    pub fn init_rejection(&self) -> Option<&InitRejection> {
        self.inner.core.init_rejection()
    }

    /// Counters of ignored or discarded events (see [`WorkerStats`]; udf §2.1, §2 R7).
    pub fn stats(&self) -> WorkerStats {
        self.inner.core.stats()
    }

    /// The configuration this endpoint runs with (the udf §1.3 `Init` checks, the udf §2 R4
    /// cancel timeout, the input buffer).
    pub fn config(&self) -> &EndpointConfig {
        &self.inner.config
    }
}

impl<C> Endpoint<state::Init, C>
where
    C: Connection<UdfResponse, UdfRequest>,
{
    /// A worker-side session on `connection` (one `Execute` stream == one session,
    /// udf §1.1). Nothing is read until [`recv_init`](Self::recv_init).
    pub fn new(connection: C, config: EndpointConfig) -> Self {
        let inner = Inner {
            core: WorkerCore::new(&config),
            pump: Pump::new(connection, config.timer.clone()),
            config,
            close_now: close_now::<C>,
        };
        Self {
            inner: Box::new(inner),
            _state: PhantomData,
        }
    }

    /// Waits for the engine's `Init` (and, when it declares chunking, every `PayloadChunk`
    /// up to `last = true`), assembled and verified (udf §1.3, R1).
    ///
    /// Returns an [`InitRequest`] holding the `Init`, to [`accept`](InitRequest::accept) or
    /// [`reject`](InitRequest::reject). Everything else is answered here, without the user,
    /// and gives `Err(Endpoint<state::Terminated>)`:
    /// - `Cancel` before the Init is complete: `CancelResponse`, outcome `Cancelled`;
    /// - an unsupported `protocol_version` or `data_format`, a missing `udf`, a
    ///   `payload_size`/`payload_crc32` mismatch: `InitResponse(error = ProtocolError)`, then
    ///   the engine's Cancel is awaited (up to [`EndpointConfig::cancel_timeout`]) and
    ///   answered, outcome `Cancelled` with the reported error
    ///   ([`init_rejection`](Endpoint::init_rejection) tells which [`InitRejection`]);
    /// - any other message out of order, an empty chunk or an empty oneof:
    ///   `InitResponse(error = ProtocolError)` and `CancelResponse`, then close, outcome
    ///   `ProtocolViolation`;
    /// - a transport failure: outcome `TransportFailed`;
    /// - no `Init` within [`EndpointConfig::init_timeout`]: nothing is sent, outcome
    ///   `TransportFailed` with an [`InitTimeout`](super::InitTimeout) cause (udf §4.6).
    ///
    /// Cancel-safe in the sense of [`Endpoint`]'s drop rule.
    pub async fn recv_init(mut self) -> Result<InitRequest<C>, Endpoint<state::Terminated, C>> {
        let ready = self
            .inner
            .drive(|core, pump| {
                if core.phase() == WorkerPhase::InitPending {
                    Some(true)
                } else {
                    Inner::settled(core, pump).then_some(false)
                }
            })
            .await;
        if !ready {
            return Err(self.into_state());
        }
        let init = self
            .inner
            .core
            .take_init()
            .expect("InitPending holds the assembled Init");
        Ok(InitRequest {
            init,
            endpoint: self,
        })
    }
}

/// An assembled, verified `Init` waiting for the user's answer (phase
/// [`InitPending`](WorkerPhase::InitPending)); returned by [`Endpoint::recv_init`].
///
/// Exactly one `InitResponse` answers it (udf §1.3): [`accept`](Self::accept) or
/// [`reject`](Self::reject). Dropping it drops the endpoint (see [`Endpoint`]'s drop rule).
#[must_use = "an Init must be accepted or rejected"]
pub struct InitRequest<C> {
    init: Init,
    endpoint: Endpoint<state::Init, C>,
}

impl<C> fmt::Debug for InitRequest<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InitRequest")
            .field("init", &self.init)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl<C> InitRequest<C>
where
    C: Connection<UdfResponse, UdfRequest>,
{
    /// The engine's `Init`. When the payload came in chunks, `udf.payload` holds the whole
    /// assembled payload (inline part first, udf §1.3) and `is_chunking_payload` is as sent.
    pub fn init(&self) -> &Init {
        &self.init
    }

    /// The assembled UDF payload bytes (`init().udf.payload`: the inline part followed by
    /// the chunks, udf §1.3); [`Init::payload`].
    pub fn payload(&self) -> &Bytes {
        self.init.payload()
    }

    /// Whether the engine has already cancelled (then `accept` and `reject` send nothing and
    /// lead to the `CancelResponse`, udf §2 R7).
    pub fn cancel_requested(&self) -> bool {
        self.endpoint.cancel_requested()
    }

    /// Answers with `InitResponse { data }` (udf §1.3) and waits until the transport took
    /// it: the data phase begins.
    ///
    /// If the engine cancelled meanwhile, nothing is sent and the returned endpoint's
    /// [`end_of_input`](Endpoint::end_of_input) gives [`InputEnd::Cancel`]; if it broke the
    /// protocol, the session has already ended (`end_of_input` gives [`InputEnd::Ended`]).
    pub async fn accept(mut self, data: Option<Bytes>) -> Endpoint<state::Streaming, C> {
        let inner = &mut self.endpoint.inner;
        inner
            .core
            .accept_init(data)
            .expect("InitRequest holds an unanswered Init");
        inner.flush().await;
        self.endpoint.into_state()
    }

    /// Answers with `InitResponse { error }` (init failed, udf §1.3, R4): no data follows;
    /// the returned endpoint waits for the engine's mandatory Cancel and answers it with
    /// [`cancelled`](Endpoint::cancelled).
    ///
    /// If the engine cancelled meanwhile, the error is not sent on its own but put into the
    /// `CancelResponse.error` (unless the user's response has one).
    pub async fn reject(mut self, error: ExecutionError) -> Endpoint<state::Cancelling, C> {
        let inner = &mut self.endpoint.inner;
        inner
            .core
            .reject_init(error)
            .expect("InitRequest holds an unanswered Init");
        inner.flush().await;
        self.endpoint.into_state()
    }
}

/// How the input of a streaming [`Endpoint`] ended (the engine's `Finish` or `Cancel`,
/// udf §2 R5, or the session's end); returned by [`Endpoint::end_of_input`].
#[derive(Debug)]
#[must_use]
pub enum InputEnd<C> {
    /// The engine sent `Finish`: emit trailing output, then
    /// [`finish`](Endpoint::finish) (udf §2 R5 (a)).
    Finish(Endpoint<state::Finishing, C>),
    /// The engine sent `Cancel`: produce the `CancelResponse` with
    /// [`cancelled`](Endpoint::cancelled) (udf §2 R5 (b), R7).
    Cancel(Endpoint<state::Cancelling, C>),
    /// The session already ended (engine protocol violation, transport failure); nothing
    /// more is sent.
    Ended(Endpoint<state::Terminated, C>),
}

impl<C> Endpoint<state::Streaming, C>
where
    C: Connection<UdfResponse, UdfRequest>,
{
    /// Receives the next input batch (`DataRequest.data`, udf §1.4), in arrival order.
    ///
    /// - `Ok(Some(batch))`: the next batch;
    /// - `Ok(None)`: the input ended — the engine sent `Finish` (every batch before it has
    ///   been delivered) or `Cancel` (unread batches are dropped); call
    ///   [`end_of_input`](Self::end_of_input);
    /// - `Err(e)`: the session ended otherwise (protocol violation, transport failure);
    ///   `end_of_input` gives [`InputEnd::Ended`].
    ///
    /// Cancel-safe: a batch is only taken out of the buffer when it is returned.
    pub async fn recv(&mut self) -> Result<Option<Bytes>, EndpointError> {
        self.inner
            .drive(|core, pump| {
                if let Some(batch) = core.pop_input() {
                    return Some(Ok(Some(batch)));
                }
                match core.phase() {
                    WorkerPhase::Data => None,
                    WorkerPhase::Done => Inner::settled(core, pump).then(|| match core.outcome() {
                        Some(EndpointOutcome::Cancelled { .. }) | None => Ok(None),
                        Some(o) => Err(EndpointError::from_outcome(o)),
                    }),
                    _ => Some(Ok(None)),
                }
            })
            .await
    }

    /// Sends one output batch as a `DataResponse` (udf §1.4) and waits until the
    /// connection has taken it (backpressure), reading requests meanwhile.
    ///
    /// # Errors
    /// [`EndpointError::Cancelled`] if the engine's `Cancel` arrived before or while
    /// sending (the batch is dropped: nothing but the `CancelResponse` follows a Cancel);
    /// another [`EndpointError`] if the session ended. Either way, continue with
    /// [`end_of_input`](Self::end_of_input).
    pub async fn send(&mut self, data: Bytes) -> Result<(), EndpointError> {
        self.inner.send(data).await
    }

    /// Reports a data-phase error (a user error, a worker error): sends
    /// `ErrorResponse(error)` after every batch already sent, drops unread input, and
    /// returns the endpoint waiting for the engine's Cancel (udf §2 R4). If the engine
    /// already cancelled, the error goes into the `CancelResponse.error` instead.
    pub async fn fail(mut self, error: ExecutionError) -> Endpoint<state::Cancelling, C> {
        fail_endpoint(&mut self.inner, error).await;
        self.into_state()
    }

    /// Waits until the input has ended and returns how: `Finish` (udf §2 R5 (a)), `Cancel`
    /// (R5 (b), R7), or the session ended otherwise (R6, R8). Input batches not yet
    /// received are dropped.
    pub async fn end_of_input(mut self) -> InputEnd<C> {
        let phase = self
            .inner
            .drive(|core, pump| {
                core.discard_input();
                match core.phase() {
                    WorkerPhase::Data => None,
                    WorkerPhase::Done => Inner::settled(core, pump).then_some(WorkerPhase::Done),
                    phase => Some(phase),
                }
            })
            .await;
        match phase {
            WorkerPhase::Draining => InputEnd::Finish(self.into_state()),
            WorkerPhase::Done => InputEnd::Ended(self.into_state()),
            _ => InputEnd::Cancel(self.into_state()),
        }
    }
}

async fn fail_endpoint<C>(inner: &mut Inner<C>, error: ExecutionError)
where
    C: Connection<UdfResponse, UdfRequest>,
{
    if let Err(misuse) = inner.core.fail(error) {
        // Only reachable if the runtime phase cannot take an error (typestates prevent it).
        tracing::warn!(%misuse, "ignoring a second worker error");
    }
    inner.flush().await;
}

impl<C> Endpoint<state::Finishing, C>
where
    C: Connection<UdfResponse, UdfRequest>,
{
    /// Sends trailing output after `Finish`; see [`Endpoint<state::Streaming, C>::send`]. A
    /// `Cancel` after the `Finish` makes it fail with [`EndpointError::Cancelled`] (then
    /// [`finish`](Self::finish) hands back the [`state::Cancelling`] endpoint, udf §2 R5 (c)).
    pub async fn send(&mut self, data: Bytes) -> Result<(), EndpointError> {
        self.inner.send(data).await
    }

    /// Ends the session with `response` (udf §2 R5 (a)) and waits until the terminator is
    /// handed to the transport and the response side is half-closed.
    ///
    /// # Errors
    /// The engine's `Cancel` arrived after its `Finish` (a Cancel the transport already
    /// delivered counts as arrived): nothing is sent and the [`state::Cancelling`] endpoint
    /// comes back, to be answered with [`cancelled`](Endpoint::cancelled) — a
    /// `CancelResponse`, into which the finish callback's metrics and error belong
    /// (udf §2 R5 (c)). This is the one place that rule is decided.
    #[allow(clippy::result_large_err)]
    pub async fn finish(
        mut self,
        response: FinishResponse,
    ) -> Result<Endpoint<state::Terminated, C>, Endpoint<state::Cancelling, C>> {
        // One non-blocking I/O pass first, so a Cancel already delivered is honoured.
        poll_fn(|cx| {
            let inner = &mut *self.inner;
            inner.pump.begin_poll();
            inner.pump.poll_io(&mut inner.core, cx);
            Poll::Ready(())
        })
        .await;
        if self.inner.core.phase() == WorkerPhase::Cancelling {
            return Err(self.into_state());
        }
        if let Err(misuse) = self.inner.core.finish(response) {
            tracing::warn!(%misuse, "finish in an unexpected phase");
        }
        self.inner.settle().await;
        Ok(self.into_state())
    }

    /// Reports an error after `Finish` as an `ErrorResponse` (udf §2 R4; the engine then
    /// sends Cancel-after-Finish). A finish-callback error should rather go into
    /// `FinishResponse.error` via [`finish`](Self::finish) (udf §1.5).
    pub async fn fail(mut self, error: ExecutionError) -> Endpoint<state::Cancelling, C> {
        fail_endpoint(&mut self.inner, error).await;
        self.into_state()
    }
}

impl<C> Endpoint<state::Cancelling, C>
where
    C: Connection<UdfResponse, UdfRequest>,
{
    /// Waits for the engine's `Cancel` (it is due after the worker's error, udf §2 R4),
    /// up to [`EndpointConfig::cancel_timeout`].
    ///
    /// # Errors
    /// The session ended without a Cancel (timeout, protocol violation, transport failure):
    /// the error derived from the outcome; [`cancelled`](Self::cancelled) then just returns
    /// the ended endpoint.
    pub async fn wait_cancel(&mut self) -> Result<(), EndpointError> {
        self.inner
            .drive(|core, pump| match core.phase() {
                WorkerPhase::Cancelling => Some(Ok(())),
                WorkerPhase::Done if Inner::settled(core, pump) => Some(Err(core
                    .outcome()
                    .map(EndpointError::from_outcome)
                    .unwrap_or(EndpointError::Ended))),
                _ => None,
            })
            .await
    }

    /// Answers the engine's `Cancel` with `response` (partial metrics, cancel-callback
    /// error; udf §1.5, R7), waiting for the Cancel first if it has not arrived; then
    /// half-closes. If `response.error` is unset, an error reported after the Cancel
    /// arrived is put there. If the session ended without a Cancel, nothing is sent.
    pub async fn cancelled(mut self, response: CancelResponse) -> Endpoint<state::Terminated, C> {
        if self.wait_cancel().await.is_ok()
            && let Err(misuse) = self.inner.core.cancelled(response)
        {
            tracing::warn!(%misuse, "cancelled in an unexpected phase");
        }
        self.inner.settle().await;
        self.into_state()
    }
}

impl<C> Endpoint<state::Terminated, C> {
    /// How the session ended (udf §2 R5–R8, see [`EndpointOutcome`]).
    pub fn outcome(&self) -> &EndpointOutcome {
        self.inner
            .core
            .outcome()
            .expect("a Terminated endpoint has an outcome")
    }

    /// Releases the connection (the response side is already half-closed after the
    /// terminator, udf §2.1) and returns the outcome (udf §2 R5–R8).
    pub fn close(self) -> EndpointOutcome {
        self.outcome().clone()
    }
}
