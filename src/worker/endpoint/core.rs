//! The worker side of a worker session as a sans-IO state machine: [`WorkerCore`].

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::connection::ConnectionError;
use crate::wire::{
    Cancel, CancelResponse, ExecutionError, FinishResponse, Init, InitResponse, RequestMessage,
    ResponseKind, UdfRequest, UdfResponse,
};
use crate::worker::Chain;

use super::config::EndpointConfig;
use super::violation::{EngineViolation, InitRejection, InitTimeout};

/// Where a worker-side session stands (the states of the reference worker, udf §2.1, plus
/// `InitPending` for the time the user code holds the `Init`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerPhase {
    /// Nothing received yet; waiting for `Init`.
    AwaitingInit,
    /// A chunked `Init` arrived; `PayloadChunk`s are being assembled until `last = true`.
    AwaitingChunks,
    /// The `Init` is assembled and verified; the user has not answered it yet (no
    /// `InitResponse` sent).
    InitPending,
    /// `InitResponse` sent without error: input may arrive, output may be sent.
    Data,
    /// The worker sent its own `ErrorResponse` or `InitResponse.error` and waits for the
    /// engine's `Cancel` (udf §2 R4). `Finish` is ignored here.
    PostError,
    /// `Finish` received: the user may still emit output, then answers with
    /// `FinishResponse`.
    Draining,
    /// `Cancel` received: nothing but the `CancelResponse` will be sent; the user produces
    /// it.
    Cancelling,
    /// The terminator was queued (or the transport failed): nothing more is sent or read.
    Done,
}

/// How a worker-side session ended (see [`WorkerCore::outcome`]): one of the terminators of
/// udf §2 R5, the protocol-error close of R6, or the silent end of R8 — the worker-side
/// counterpart of the engine's [`Termination`](crate::worker::engine::Termination)
/// (udf §4.1). Settled once, never changed, except that a transport failure before the
/// terminator was handed to the transport turns it into
/// [`TransportFailed`](Self::TransportFailed).
#[derive(Debug, Clone)]
#[must_use]
pub enum EndpointOutcome {
    /// `FinishResponse` sent after the engine's `Finish` (udf §2 R5 (a), or (c) when a
    /// `Cancel` arrived only after it).
    Finished,
    /// `CancelResponse` sent answering the engine's `Cancel` (udf §2 R5 (b)/(c), R4, R7).
    Cancelled {
        /// The `Cancel.reason` the engine gave.
        reason: Option<String>,
        /// The error the worker reported before the Cancel (its `ErrorResponse` or
        /// `InitResponse.error`), if any.
        reported: Option<ExecutionError>,
    },
    /// The engine broke the ordering rules (or went silent where a `Cancel` was due): the
    /// worker sent a `ProtocolError` ([`EngineViolation::wire_message`]) and a
    /// `CancelResponse` and closed (udf §2 R6).
    ProtocolViolation(EngineViolation),
    /// The connection failed; nothing more was sent (udf §2 R8).
    TransportFailed(ConnectionError),
}

/// The variant of an [`EndpointOutcome`], without payload: which of the endings of udf §2
/// (R5 terminators, R6 protocol-error close, R8 transport failure) the session took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// [`EndpointOutcome::Finished`].
    Finished,
    /// [`EndpointOutcome::Cancelled`].
    Cancelled,
    /// [`EndpointOutcome::ProtocolViolation`].
    ProtocolViolation,
    /// [`EndpointOutcome::TransportFailed`].
    TransportFailed,
}

impl EndpointOutcome {
    /// The variant, without payload (the udf §2 ending, see [`OutcomeKind`]).
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Self::Finished => OutcomeKind::Finished,
            Self::Cancelled { .. } => OutcomeKind::Cancelled,
            Self::ProtocolViolation(_) => OutcomeKind::ProtocolViolation,
            Self::TransportFailed(_) => OutcomeKind::TransportFailed,
        }
    }

    /// The error the worker reported before being cancelled (its `ErrorResponse` or
    /// `InitResponse.error`, answered by the engine's Cancel, udf §2 R4), if any; `None` for
    /// every outcome but [`Cancelled`](Self::Cancelled).
    pub fn reported_error(&self) -> Option<&ExecutionError> {
        match self {
            Self::Cancelled { reported, .. } => reported.as_ref(),
            _ => None,
        }
    }

    /// Whether the session ended by the protocol's rules with a terminator the engine
    /// asked for (`Finished` or `Cancelled`, udf §2 R5); `false` after a protocol-error
    /// close (R6) or a transport failure (R8).
    pub fn is_clean(&self) -> bool {
        matches!(self, Self::Finished | Self::Cancelled { .. })
    }
}

impl fmt::Display for EndpointOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Finished => f.write_str("Finished"),
            Self::Cancelled { reason, reported } => {
                f.write_str("Cancelled")?;
                if let Some(r) = reason {
                    write!(f, " ({r})")?;
                }
                if let Some(e) = reported {
                    write!(f, " after reporting {e}")?;
                }
                Ok(())
            }
            Self::ProtocolViolation(v) => write!(f, "ProtocolViolation ({})", v.wire_message()),
            Self::TransportFailed(e) => write!(f, "TransportFailed ({})", Chain(e)),
        }
    }
}

/// A call made in a phase that does not allow it: an answer that would break the worker's
/// side of the ordering rules (udf §2: R2 no output before the `InitResponse`, R4 at most
/// one error, R5 exactly one terminator). The typed [`Endpoint`](super::Endpoint) makes
/// these impossible; the sans-IO form reports them. `Display`: "`<call>` is not allowed
/// in worker phase `<phase>`".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{call} is not allowed in worker phase {phase:?}")]
pub struct EndpointMisuse {
    /// The call that was made.
    pub call: &'static str,
    /// The phase the session was in.
    pub phase: WorkerPhase,
}

/// Counters of events the core observed but ignored or discarded, as the reference worker
/// ignores them (udf §2.1 "ignored" rows) or drops them after a Cancel (udf §2 R7). All
/// counts are messages or batches since the session began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// `DataRequest`s accepted into the input queue.
    pub data_received: u64,
    /// `DataResponse`s queued for the engine.
    pub data_sent: u64,
    /// Input batches dropped unread (on Cancel, on error, or at the end of input).
    pub input_discarded: u64,
    /// Output batches dropped because a Cancel or error came first (nothing after Cancel).
    pub output_dropped: u64,
    /// `DataRequest`s and `Finish`es that raced with the worker's own `ErrorResponse`
    /// (ignored while waiting for the Cancel).
    pub ignored_after_error: u64,
    /// Requests received after the session was done (a late Cancel, udf §2 R5 (c)).
    pub ignored_after_done: u64,
    /// `Cancel`s after the first one.
    pub duplicate_cancels: u64,
}

/// What an armed deadline of [`WorkerCore`] waits for (udf §7, §2 R4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// The engine's `Init`, in `AwaitingInit`.
    Init,
    /// The engine's `Cancel` after the worker's own error, in `PostError` (R4).
    Cancel,
}

/// The internal state, with the data each phase owns.
#[derive(Debug)]
enum State {
    AwaitingInit,
    AwaitingChunks {
        init: Box<Init>,
        assembled: BytesMut,
        /// A validation error found at `Init`; answered once the last chunk arrived (an
        /// `InitResponse` never precedes the final chunk, udf §1.3).
        pending_error: Option<InitRejection>,
    },
    InitPending,
    Data,
    /// `after_init`: the error was an `InitResponse.error` (no data phase happened).
    PostError {
        after_init: bool,
    },
    Draining,
    Cancelling,
    Done,
}

/// What [`WorkerCore::send_data`] did with a batch (udf §1.4): queued as a `DataResponse`
/// (its [`DataTicket`] tells later whether it reached the transport), or dropped at once —
/// after the worker's own error, after a Cancel, or once done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum DataSent {
    /// Queued; ask [`WorkerCore::delivery`] what became of it.
    Queued(DataTicket),
    /// Not queued: nothing will be sent for it.
    Dropped,
}

/// Names one queued `DataResponse` (udf §1.4), for [`WorkerCore::delivery`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DataTicket(u64);

/// What became of a queued `DataResponse` (udf §1.4; [`WorkerCore::delivery`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Still queued for [`WorkerCore::poll_transmit`].
    Queued,
    /// Handed to the driver by [`WorkerCore::poll_transmit`], in order.
    Transmitted,
    /// Dropped before it was handed over: a Cancel arrived (udf §2 R7), the engine broke
    /// the protocol, or the connection failed (R8).
    Dropped,
}

/// The worker side of one worker session, without I/O (udf §2, §2.1).
///
/// # When to call what
///
/// - Events: [`handle_request`](Self::handle_request) for each received `UdfRequest`,
///   [`handle_stream_end`](Self::handle_stream_end),
///   [`handle_connection_error`](Self::handle_connection_error),
///   [`handle_timeout`](Self::handle_timeout).
/// - The user's answers: [`accept_init`](Self::accept_init),
///   [`reject_init`](Self::reject_init), [`send_data`](Self::send_data),
///   [`fail`](Self::fail), [`finish`](Self::finish), [`cancelled`](Self::cancelled).
/// - [`poll_transmit`](Self::poll_transmit) should be polled (until `None`) after every
///   event and every answer above: each may queue a response. Hand them to the transport in
///   that order; once [`wants_half_close`](Self::wants_half_close), half-close the response
///   side.
/// - [`pop_input`](Self::pop_input) should be polled after `handle_request`;
///   [`take_init`](Self::take_init) once the phase is
///   [`InitPending`](WorkerPhase::InitPending).
/// - [`begin_wait`](Self::begin_wait) when the driver is about to block (its poll returns
///   `Pending`), with the current time: the only clock reading the core needs. Then
///   [`poll_timeout`](Self::poll_timeout) gives the instant at which to call
///   [`handle_timeout`](Self::handle_timeout); re-read it before each wait.
///
/// Two deadlines, each total from the first wait of its phase:
///
/// | phase | deadline | expiry |
/// |---|---|---|
/// | [`AwaitingInit`](WorkerPhase::AwaitingInit) | `init_timeout` | `TransportFailed` with an [`InitTimeout`] cause; nothing is sent (the wait for the stream's first message, udf §4.6, §7) |
/// | [`PostError`](WorkerPhase::PostError) | `cancel_timeout` | the stream is closed as a protocol violation ([`EngineViolation::NoCancelAfterError`], udf §2 R4) |
///
/// Rules enforced:
/// - `Init` validation (udf §1.3): a `protocol_version` other than the configured one, a
///   data format not supported, a missing `udf`, an assembled payload whose `payload_size` or
///   `payload_crc32` does not match ⇒ `InitResponse(error = ProtocolError)` (an
///   [`InitRejection`], see [`init_rejection`](Self::init_rejection)), then wait for the
///   Cancel, answered automatically with `CancelResponse`.
/// - Chunk assembly (R1): inline payload followed by non-empty chunks until `last = true`;
///   no `InitResponse` before the last chunk.
/// - Engine protocol violations (R6; second `Init`, chunk outside chunking, data or `Finish`
///   before `InitResponse` or after `Finish`/`Cancel`, empty oneofs, request stream ended
///   early; each an [`EngineViolation`]) ⇒ the `ProtocolError` goes into the `InitResponse`
///   if none was sent yet, else into an `ErrorResponse` if none was sent and no Cancel
///   arrived, else into the `CancelResponse`; a `CancelResponse` always follows; then the
///   session is done and the stream is closed without waiting.
/// - Cancel at any time gets exactly one `CancelResponse` (automatic while the user has not
///   seen the `Init`, otherwise the user's [`cancelled`](Self::cancelled)); after a Cancel
///   no more `DataResponse`s are sent (queued ones are dropped). Cancel after `Finish`
///   before the `FinishResponse` is answered with `CancelResponse` (R5 (c)); a Cancel after
///   the terminator is ignored.
/// - `DataResponse`s only after the `InitResponse`, never after an error or a terminator;
///   at most one `InitResponse`, at most one error, exactly one terminator.
/// - A transport failure ends the session silently (R8).
#[derive(Debug)]
pub struct WorkerCore {
    state: State,
    supported_formats: Vec<i32>,
    protocol_version: u32,
    max_payload_size: u64,
    /// The assembled `Init`, until the user takes it.
    init: Option<Init>,
    /// Whether the user has been handed the `Init` (then the user answers a Cancel).
    user_involved: bool,
    input: VecDeque<Bytes>,
    outbox: VecDeque<UdfResponse>,
    init_response_sent: bool,
    error_sent: bool,
    /// The error sent in `InitResponse.error` / `ErrorResponse`.
    reported: Option<ExecutionError>,
    /// Why the worker rejected the `Init` on its own, if it did.
    rejection: Option<InitRejection>,
    /// An error the user raised after the Cancel arrived; goes into `CancelResponse.error`.
    deferred_error: Option<ExecutionError>,
    cancel: Option<Cancel>,
    finish_received: bool,
    outcome: Option<EndpointOutcome>,
    stats: WorkerStats,
    /// `DataResponse`s queued so far (the last ticket's number).
    data_queued: u64,
    /// `DataResponse`s handed over by `poll_transmit` (tickets up to this are transmitted).
    data_transmitted: u64,
    /// Set when queued data was dropped: every ticket after `data_transmitted` then is.
    data_dropped: bool,
    /// The wait for the `Init` (udf §4.6, §7); `None` waits indefinitely.
    init_timeout: Option<Duration>,
    /// The R4 cancel timeout (udf §2 R4); `None` waits indefinitely.
    cancel_timeout: Option<Duration>,
    /// The armed deadline and the wait it was armed for.
    deadline: Option<(Wait, Instant)>,
    /// Most input batches queued before the driver stops reading (at least 1).
    input_buffer: usize,
    /// Payload bytes of the queued input batches.
    input_bytes: usize,
    /// Most payload bytes queued before the driver stops reading (an empty queue always
    /// takes one more batch).
    input_buffer_bytes: usize,
}

/// The core of the default configuration: Spark's deadlines (udf §7), which the core only
/// reads as durations (its caller owns time, so the config's timer is not used).
impl Default for WorkerCore {
    fn default() -> Self {
        Self::new(&EndpointConfig::with_timer(std::sync::Arc::new(
            crate::time::NoTimeouts,
        )))
    }
}

impl WorkerCore {
    /// A session in phase [`AwaitingInit`](WorkerPhase::AwaitingInit) that validates `Init`s
    /// against `config`: the `protocol_version` and `data_format` checks of udf §1.3 (a data
    /// format the config lists but cannot accept, such as `UNSPECIFIED`, is dropped), and
    /// tether's bound on the payload size in bytes; with `config`'s R4 cancel timeout and
    /// input bound, and its `Init` wait (its `timer` is the driver's business).
    pub fn new(config: &EndpointConfig) -> Self {
        Self {
            state: State::AwaitingInit,
            supported_formats: config
                .supported_data_formats
                .iter()
                .map(|f| *f as i32)
                .filter(|f| config.accepts_data_format(*f))
                .collect(),
            protocol_version: config.protocol_version,
            max_payload_size: config.max_payload_size,
            init: None,
            user_involved: false,
            input: VecDeque::new(),
            outbox: VecDeque::new(),
            init_response_sent: false,
            error_sent: false,
            reported: None,
            rejection: None,
            deferred_error: None,
            cancel: None,
            finish_received: false,
            outcome: None,
            stats: WorkerStats::default(),
            data_queued: 0,
            data_transmitted: 0,
            data_dropped: false,
            init_timeout: config.init_timeout,
            cancel_timeout: config.cancel_timeout,
            deadline: None,
            input_buffer: config.input_buffer.max(1),
            input_bytes: 0,
            input_buffer_bytes: config.input_buffer_bytes,
        }
    }

    // -----------------------------------------------------------------------------------
    // Queries
    // -----------------------------------------------------------------------------------

    /// The current phase (the reference worker's states, udf §2.1; see [`WorkerPhase`]).
    pub fn phase(&self) -> WorkerPhase {
        match self.state {
            State::AwaitingInit => WorkerPhase::AwaitingInit,
            State::AwaitingChunks { .. } => WorkerPhase::AwaitingChunks,
            State::InitPending => WorkerPhase::InitPending,
            State::Data => WorkerPhase::Data,
            State::PostError { .. } => WorkerPhase::PostError,
            State::Draining => WorkerPhase::Draining,
            State::Cancelling => WorkerPhase::Cancelling,
            State::Done => WorkerPhase::Done,
        }
    }

    /// Whether the session is done (terminator queued or transport failed): udf §2.1
    /// `Done`, after which every request is ignored.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The outcome (udf §2 R5–R8, see [`EndpointOutcome`]), once
    /// [`Done`](WorkerPhase::Done); `None` before.
    pub fn outcome(&self) -> Option<&EndpointOutcome> {
        self.outcome.as_ref()
    }

    /// The assembled, verified `Init` while [`InitPending`](WorkerPhase::InitPending) (its
    /// `udf.payload` holds the whole payload, inline part and chunks joined in arrival
    /// order, udf §1.3), until taken.
    pub fn init(&self) -> Option<&Init> {
        self.init.as_ref()
    }

    /// Takes the assembled `Init` (see [`init`](Self::init); udf §1.3); `None` once taken
    /// or outside [`InitPending`](WorkerPhase::InitPending).
    #[must_use]
    pub fn take_init(&mut self) -> Option<Init> {
        self.init.take()
    }

    /// The engine's `Cancel` (with its optional `reason`, udf §1.5), if one arrived.
    pub fn cancel_received(&self) -> Option<&Cancel> {
        self.cancel.as_ref()
    }

    /// Whether the engine's `Finish` arrived (all input sent, udf §1.5), including one
    /// ignored while waiting for the Cancel after an error (udf §2.1).
    pub fn finish_received(&self) -> bool {
        self.finish_received
    }

    /// The error the worker reported (`InitResponse.error` or `ErrorResponse`; at most one
    /// per stream, udf §2 R4), if any.
    pub fn reported_error(&self) -> Option<&ExecutionError> {
        self.reported.as_ref()
    }

    /// Why the worker answered the `Init` with a `ProtocolError` on its own (unsupported
    /// version or format, missing `udf`, size or CRC mismatch: the checks of udf §1.3), if
    /// it did; the user never saw that `Init`.
    pub fn init_rejection(&self) -> Option<&InitRejection> {
        self.rejection.as_ref()
    }

    /// Whether an `InitResponse` has been queued (exactly one per stream, udf §1.3).
    pub fn init_response_sent(&self) -> bool {
        self.init_response_sent
    }

    /// Ignored/discarded event counters (see [`WorkerStats`]; udf §2.1, §2 R7).
    pub fn stats(&self) -> WorkerStats {
        self.stats
    }

    /// The next received input batch (`DataRequest.data`, udf §1.4), in arrival order.
    #[must_use]
    pub fn pop_input(&mut self) -> Option<Bytes> {
        let batch = self.input.pop_front()?;
        self.input_bytes -= batch.len();
        Some(batch)
    }

    /// How many received input batches (udf §1.4) wait to be read. The core does not bound
    /// the queue; a driver bounds it by reading no further requests while it is full, so the
    /// transport's flow control pushes back on the engine (the protocol's only
    /// back-pressure, udf §1.4).
    pub fn input_len(&self) -> usize {
        self.input.len()
    }

    /// The payload bytes of the queued input batches (udf §1.4 `DataRequest.data`): the sum
    /// of their lengths, what [`EndpointConfig::input_buffer_bytes`] bounds.
    pub fn input_bytes(&self) -> usize {
        self.input_bytes
    }

    /// Drops every queued input batch and returns how many there were (counted in
    /// [`WorkerStats::input_discarded`]): what the worker does with unread input on Cancel
    /// (udf §2 R7) or after its own error (R4).
    pub fn discard_input(&mut self) -> usize {
        let n = self.input.len();
        self.input.clear();
        self.input_bytes = 0;
        self.stats.input_discarded += n as u64;
        n
    }

    /// The next response to hand to the transport, if any, in the order udf §2 prescribes
    /// (`InitResponse`, `DataResponse`s, at most one error, one terminator).
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<UdfResponse> {
        let response = self.outbox.pop_front()?;
        if is_data(&response) {
            self.data_transmitted += 1;
        }
        Some(response)
    }

    /// What became of the `DataResponse` of `ticket` (from [`send_data`](Self::send_data)):
    /// still queued, handed over by [`poll_transmit`](Self::poll_transmit), or dropped by a
    /// Cancel, a violation or a failed connection (udf §2 R7, R6, R8).
    /// The answer changes only from `Queued` to one of the others, once.
    pub fn delivery(&self, ticket: DataTicket) -> Delivery {
        if ticket.0 <= self.data_transmitted {
            Delivery::Transmitted
        } else if self.data_dropped {
            Delivery::Dropped
        } else {
            Delivery::Queued
        }
    }

    /// Drops every queued `DataResponse` (udf §2 R7, R6, R8), counting them.
    fn drop_queued_data(&mut self) {
        let before = self.outbox.len();
        self.outbox.retain(|r| !is_data(r));
        let dropped = before - self.outbox.len();
        if dropped > 0 {
            self.data_dropped = true;
            self.stats.output_dropped += dropped as u64;
        }
    }

    /// Whether responses (udf §2 order) are waiting for
    /// [`poll_transmit`](Self::poll_transmit).
    pub fn has_transmit(&self) -> bool {
        !self.outbox.is_empty()
    }

    // -----------------------------------------------------------------------------------
    // Events from the engine / transport
    // -----------------------------------------------------------------------------------

    /// Feeds one request received from the engine (udf §2, §2.1).
    pub fn handle_request(&mut self, request: UdfRequest) {
        if self.is_done() {
            self.stats.ignored_after_done += 1;
            tracing::debug!(kind = ?request.kind(), "ignoring an engine message after the terminator");
            return;
        }
        let msg = match request.into_message() {
            Ok(m) => m,
            Err(e) => return self.violation(EngineViolation::Malformed(e)),
        };
        match msg {
            RequestMessage::Cancel(cancel) => self.on_cancel(cancel),
            RequestMessage::Init(init) => self.on_init(init),
            RequestMessage::PayloadChunk(chunk) => {
                self.on_chunk(chunk.data, chunk.last == Some(true))
            }
            RequestMessage::Data(data) => self.on_data(data),
            RequestMessage::Finish(_) => self.on_finish(),
        }
    }

    /// The engine ended its request stream (gRPC `onCompleted`). Fine once done; before that
    /// it is a protocol violation (udf §2.1 last row): the engine half-closes only once
    /// the outcome is known (R9).
    pub fn handle_stream_end(&mut self) {
        if !self.is_done() {
            self.violation(EngineViolation::RequestStreamEnded);
        }
    }

    /// The connection failed (gRPC `onError`, a failed write). Fine once done and the
    /// terminator was handed over; otherwise the session ends `TransportFailed` and nothing
    /// more is sent (udf §2 R8).
    pub fn handle_connection_error(&mut self, error: ConnectionError) {
        if self.is_done() && self.outbox.is_empty() {
            return;
        }
        tracing::debug!(%error, "worker session transport failed");
        self.drop_queued_data();
        self.outbox.clear();
        self.discard_input();
        self.init = None;
        self.state = State::Done;
        self.outcome = Some(EndpointOutcome::TransportFailed(error));
    }

    /// Whether the driver should take another request from the connection now: not done,
    /// and either no batch waits to be read or fewer than `input_buffer` batches holding
    /// fewer than `input_buffer_bytes` payload bytes do (the back-pressure of udf §1.4;
    /// [`EndpointConfig::input_buffer_bytes`]).
    pub fn wants_recv(&self) -> bool {
        !self.is_done()
            && (self.input.is_empty()
                || (self.input.len() < self.input_buffer
                    && self.input_bytes < self.input_buffer_bytes))
    }

    /// Whether the response side may be half-closed now: done and the terminator handed
    /// over (udf §2.1: the worker completes its stream after the terminator).
    pub fn wants_half_close(&self) -> bool {
        self.is_done() && self.outbox.is_empty()
    }

    /// The wait the current phase has a deadline for, and its duration (udf §4.6, §2 R4).
    fn wait_rule(&self) -> Option<(Wait, Duration)> {
        match self.state {
            State::AwaitingInit => self.init_timeout.map(|t| (Wait::Init, t)),
            State::PostError { .. } => self.cancel_timeout.map(|t| (Wait::Cancel, t)),
            _ => None,
        }
    }

    /// A wait begins at `now` (udf §7): in [`AwaitingInit`](WorkerPhase::AwaitingInit) arms
    /// the `Init` deadline (`init_timeout`), in [`PostError`](WorkerPhase::PostError) the R4
    /// cancel deadline (`cancel_timeout`, udf §2 R4), each counted from the first wait of its
    /// phase, unless it is armed. Call it when the driver is about to block, not per message.
    /// A timeout too long for an `Instant` (such as `Duration::MAX`, "never") saturates at
    /// about 100 years.
    pub fn begin_wait(&mut self, now: Instant) {
        self.begin_wait_with(|| now);
    }

    /// [`begin_wait`](Self::begin_wait) reading the clock (`now`) only when a deadline is
    /// armed: in the data phase (no deadline, udf §7) a wait costs no clock read.
    pub(crate) fn begin_wait_with(&mut self, now: impl FnOnce() -> Instant) {
        match self.wait_rule() {
            Some((wait, _)) if self.deadline.is_some_and(|(armed, _)| armed == wait) => {}
            Some((wait, timeout)) => {
                self.deadline = Some((wait, crate::time::deadline_after(now(), timeout)));
            }
            None => self.deadline = None,
        }
    }

    /// The caller's wait ended (udf §7): nothing to do, both deadlines are total.
    pub fn end_wait(&mut self) {}

    /// The instant at which [`handle_timeout`](Self::handle_timeout) is due (udf §7): the
    /// `Init` deadline while [`AwaitingInit`](WorkerPhase::AwaitingInit), the R4 cancel
    /// deadline while [`PostError`](WorkerPhase::PostError) (udf §2 R4), once a wait armed
    /// it; else `None`.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let (armed, at) = self.deadline?;
        (self.wait_rule().map(|(wait, _)| wait) == Some(armed)).then_some(at)
    }

    /// Time has reached `now` (udf §7): once the `Init` deadline has passed while
    /// [`AwaitingInit`](WorkerPhase::AwaitingInit), ends the session `TransportFailed` with
    /// an [`InitTimeout`] cause, sending nothing; once the R4 cancel deadline has passed
    /// while [`PostError`](WorkerPhase::PostError) (no Cancel came after the worker's own
    /// error, udf §2 R4), closes the stream as a protocol violation (`CancelResponse(error =
    /// ProtocolError)`). Otherwise nothing happens.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_none_or(|at| now < at) {
            return;
        }
        let Some((wait, _)) = self.deadline.take() else {
            return;
        };
        match wait {
            Wait::Init => {
                let after = self.init_timeout.unwrap_or_default();
                tracing::debug!(?after, "no Init arrived; ending the session");
                self.handle_connection_error(ConnectionError::transport(InitTimeout { after }));
            }
            Wait::Cancel => {
                let after = self.cancel_timeout.unwrap_or_default();
                self.violation(EngineViolation::NoCancelAfterError { after });
            }
        }
    }

    fn on_cancel(&mut self, cancel: Cancel) {
        match self.state {
            State::Cancelling => {
                self.stats.duplicate_cancels += 1;
            }
            State::Done => unreachable!("handled by handle_request"),
            _ if !self.user_involved => {
                // The user never saw the Init: answer on its behalf.
                let reason = cancel.reason.clone();
                self.cancel = Some(cancel);
                self.enter_cancelling();
                self.terminate_cancelled(CancelResponse::default(), reason);
            }
            _ => {
                self.cancel = Some(cancel);
                self.enter_cancelling();
            }
        }
    }

    fn enter_cancelling(&mut self) {
        self.discard_input();
        self.drop_queued_data();
        self.state = State::Cancelling;
    }

    fn on_init(&mut self, mut init: Box<Init>) {
        if !matches!(self.state, State::AwaitingInit) {
            return self.violation(EngineViolation::SecondInit {
                awaiting_chunks: matches!(self.state, State::AwaitingChunks { .. }),
            });
        }
        let mut error = self.validate_init(&init);
        let Some(udf) = init.udf.as_mut() else {
            return self.reject_automatically(error.unwrap_or(InitRejection::MissingUdf));
        };
        if udf.payload.len() as u64 > self.max_payload_size {
            return self.violation(EngineViolation::InlinePayloadTooLarge {
                size: udf.payload.len() as u64,
                limit: self.max_payload_size,
            });
        }
        if init.is_chunking_payload == Some(true) {
            let inline = std::mem::take(&mut udf.payload);
            self.state = State::AwaitingChunks {
                assembled: BytesMut::from(&inline[..]),
                init,
                pending_error: error,
            };
            return;
        }
        if error.is_none() {
            error = verify_payload(udf);
        }
        match error {
            Some(e) => self.reject_automatically(e),
            None => {
                self.init = Some(*init);
                self.user_involved = true;
                self.state = State::InitPending;
            }
        }
    }

    fn validate_init(&self, init: &Init) -> Option<InitRejection> {
        if let Some(v) = init
            .protocol_version
            .filter(|v| *v != self.protocol_version)
        {
            return Some(InitRejection::UnsupportedProtocolVersion {
                requested: v,
                supported: self.protocol_version,
            });
        }
        if !self.supported_formats.contains(&init.data_format) {
            return Some(InitRejection::UnsupportedDataFormat {
                requested: init.data_format,
                supported: self
                    .supported_formats
                    .iter()
                    .filter_map(|f| crate::wire::UdfWorkerDataFormat::try_from(*f).ok())
                    .collect(),
            });
        }
        None
    }

    fn on_chunk(&mut self, data: Bytes, last: bool) {
        let State::AwaitingChunks { assembled, .. } = &mut self.state else {
            let violation = match self.state {
                State::AwaitingInit => EngineViolation::ChunkBeforeInit,
                State::InitPending
                    if self
                        .init
                        .as_ref()
                        .is_some_and(|i| i.is_chunking_payload == Some(true)) =>
                {
                    EngineViolation::ChunkAfterLastChunk
                }
                State::InitPending => EngineViolation::ChunkWithoutChunking,
                State::Cancelling => EngineViolation::ChunkAfterCancel,
                _ => EngineViolation::ChunkAfterInitResponse,
            };
            return self.violation(violation);
        };
        if data.is_empty() {
            return self.violation(EngineViolation::EmptyChunk);
        }
        let size = (assembled.len() + data.len()) as u64;
        if size > self.max_payload_size {
            return self.violation(EngineViolation::ChunkedPayloadTooLarge {
                size,
                limit: self.max_payload_size,
            });
        }
        assembled.extend_from_slice(&data);
        if !last {
            return;
        }
        let State::AwaitingChunks {
            init,
            assembled,
            pending_error,
        } = std::mem::replace(&mut self.state, State::AwaitingInit)
        else {
            unreachable!("matched above");
        };
        let mut init = *init;
        let udf = init.udf.as_mut().expect("checked at Init");
        udf.payload = assembled.freeze();
        match pending_error.or_else(|| verify_payload(udf)) {
            Some(e) => self.reject_automatically(e),
            None => {
                self.init = Some(init);
                self.user_involved = true;
                self.state = State::InitPending;
            }
        }
    }

    fn on_data(&mut self, data: Bytes) {
        match self.state {
            State::Data => {
                self.stats.data_received += 1;
                self.input_bytes += data.len();
                self.input.push_back(data);
            }
            State::PostError { after_init: false } if !self.finish_received => {
                // Raced with our ErrorResponse: the engine had not seen it yet.
                self.stats.ignored_after_error += 1;
            }
            State::AwaitingInit | State::AwaitingChunks { .. } | State::InitPending => {
                self.violation(EngineViolation::DataBeforeInitResponse)
            }
            State::PostError { after_init: true } => {
                self.violation(EngineViolation::DataAfterFailedInit)
            }
            State::PostError { .. } | State::Draining => {
                self.violation(EngineViolation::DataAfterFinish)
            }
            State::Cancelling => self.violation(EngineViolation::DataAfterCancel),
            State::Done => unreachable!("handled by handle_request"),
        }
    }

    fn on_finish(&mut self) {
        match self.state {
            State::Data => {
                self.finish_received = true;
                self.state = State::Draining;
            }
            State::PostError { .. } => {
                // udf §2.1: ignored; the Cancel is still due.
                self.finish_received = true;
                self.stats.ignored_after_error += 1;
            }
            State::AwaitingInit | State::AwaitingChunks { .. } | State::InitPending => {
                self.violation(EngineViolation::FinishBeforeInitResponse)
            }
            State::Draining => self.violation(EngineViolation::SecondFinish),
            State::Cancelling => self.violation(EngineViolation::FinishAfterCancel),
            State::Done => unreachable!("handled by handle_request"),
        }
    }

    /// Answers a bad `Init` with `InitResponse(error)` and waits for the Cancel, which is
    /// answered automatically (the user never saw the Init).
    fn reject_automatically(&mut self, rejection: InitRejection) {
        tracing::debug!(%rejection, "rejecting Init");
        self.init = None;
        self.queue_init_error(rejection.to_execution_error());
        self.rejection = Some(rejection);
    }

    fn queue_init_error(&mut self, error: ExecutionError) {
        self.outbox.push_back(UdfResponse::init(InitResponse {
            data: None,
            error: Some(error.clone()),
        }));
        self.init_response_sent = true;
        self.error_sent = true;
        self.reported = Some(error);
        self.state = State::PostError { after_init: true };
    }

    /// Protocol-error close (udf §2 R6): report, terminate with `CancelResponse`, done.
    fn violation(&mut self, violation: EngineViolation) {
        if self.is_done() {
            return;
        }
        tracing::debug!(violation = %violation.wire_message(), "engine protocol violation");
        self.init = None;
        self.discard_input();
        self.drop_queued_data();
        let error = violation.to_execution_error();
        let mut cancel_response = CancelResponse::default();
        if self.cancel.is_some() {
            cancel_response.error = Some(error);
        } else if !self.init_response_sent {
            self.outbox.push_back(UdfResponse::init(InitResponse {
                data: None,
                error: Some(error),
            }));
            self.init_response_sent = true;
            self.error_sent = true;
        } else if !self.error_sent {
            self.outbox.push_back(UdfResponse::error(error));
            self.error_sent = true;
        } else {
            cancel_response.error = Some(error);
        }
        self.outbox.push_back(UdfResponse::cancel(cancel_response));
        self.state = State::Done;
        self.outcome = Some(EndpointOutcome::ProtocolViolation(violation));
    }

    fn terminate_cancelled(&mut self, mut response: CancelResponse, reason: Option<String>) {
        if response.error.is_none() {
            response.error = self.deferred_error.take();
        }
        let reported = self.reported.clone().or_else(|| response.error.clone());
        self.outbox.push_back(UdfResponse::cancel(response));
        self.state = State::Done;
        self.outcome = Some(EndpointOutcome::Cancelled { reason, reported });
    }

    // -----------------------------------------------------------------------------------
    // Calls from the user
    // -----------------------------------------------------------------------------------

    fn misuse(&self, call: &'static str) -> EndpointMisuse {
        EndpointMisuse {
            call,
            phase: self.phase(),
        }
    }

    /// Answers the pending `Init` with `InitResponse { data }` (opaque init result,
    /// udf §1.3): `InitPending → Data`. After a Cancel (or once done) nothing is sent: the
    /// session is cancelling (udf §2 R7).
    ///
    /// # Errors
    /// [`EndpointMisuse`] unless `InitPending`, `Cancelling` (with no `InitResponse` sent)
    /// or `Done`.
    pub fn accept_init(&mut self, data: Option<Bytes>) -> Result<(), EndpointMisuse> {
        match self.state {
            State::InitPending => {
                self.init = None;
                self.outbox
                    .push_back(UdfResponse::init(InitResponse { data, error: None }));
                self.init_response_sent = true;
                self.state = State::Data;
                Ok(())
            }
            State::Cancelling if !self.init_response_sent => Ok(()),
            State::Done => Ok(()),
            _ => Err(self.misuse("accept_init")),
        }
    }

    /// Answers the pending `Init` with `InitResponse { error }` (udf §1.3):
    /// `InitPending → PostError` (then the engine's Cancel is awaited, udf §2 R4). After a
    /// Cancel the error is kept for the `CancelResponse.error` instead (nothing but the
    /// `CancelResponse` is sent, R7).
    ///
    /// # Errors
    /// [`EndpointMisuse`] unless `InitPending`, `Cancelling` (with no `InitResponse` sent)
    /// or `Done`.
    pub fn reject_init(&mut self, error: ExecutionError) -> Result<(), EndpointMisuse> {
        match self.state {
            State::InitPending => {
                self.init = None;
                self.queue_init_error(error);
                Ok(())
            }
            State::Cancelling if !self.init_response_sent => {
                self.deferred_error.get_or_insert(error);
                Ok(())
            }
            State::Done => Ok(()),
            _ => Err(self.misuse("reject_init")),
        }
    }

    /// Queues one `DataResponse` (udf §1.4) and returns its ticket
    /// ([`delivery`](Self::delivery) then tells whether it reached the transport or was
    /// dropped); or [`DataSent::Dropped`], queueing nothing, after the worker's own error,
    /// after a Cancel, or once done.
    ///
    /// # Errors
    /// [`EndpointMisuse`] before the `InitResponse` (R2).
    pub fn send_data(&mut self, data: Bytes) -> Result<DataSent, EndpointMisuse> {
        match self.state {
            State::Data | State::Draining => {
                self.stats.data_sent += 1;
                self.outbox.push_back(UdfResponse::data(data));
                self.data_queued += 1;
                Ok(DataSent::Queued(DataTicket(self.data_queued)))
            }
            State::PostError { .. } | State::Cancelling | State::Done => {
                self.stats.output_dropped += 1;
                Ok(DataSent::Dropped)
            }
            State::AwaitingInit | State::AwaitingChunks { .. } | State::InitPending => {
                Err(self.misuse("send_data"))
            }
        }
    }

    /// Reports a user or worker error from the data phase: queues `ErrorResponse(error)`
    /// after the output already queued, drops unread input: `Data`/`Draining → PostError`
    /// (udf §2 R4). After a Cancel the error goes into the `CancelResponse.error` instead.
    ///
    /// # Errors
    /// [`EndpointMisuse`] before the `InitResponse` (use [`reject_init`](Self::reject_init))
    /// or when an error was already reported (at most one per stream).
    pub fn fail(&mut self, error: ExecutionError) -> Result<(), EndpointMisuse> {
        match self.state {
            State::Data | State::Draining => {
                self.discard_input();
                self.outbox.push_back(UdfResponse::error(error.clone()));
                self.error_sent = true;
                self.reported = Some(error);
                self.state = State::PostError { after_init: false };
                Ok(())
            }
            State::Cancelling => {
                self.deferred_error.get_or_insert(error);
                Ok(())
            }
            State::Done => Ok(()),
            _ => Err(self.misuse("fail")),
        }
    }

    /// Ends the session after `Finish`: queues `response` (udf §2 R5 (a)). `Draining →
    /// Done`. When a Cancel arrived after the `Finish` the phase is `Cancelling` and the
    /// answer is [`cancelled`](Self::cancelled) instead (R5 (c)); the typed
    /// [`Endpoint<Finishing>::finish`](super::Endpoint::finish) makes that choice.
    ///
    /// # Errors
    /// [`EndpointMisuse`] unless `Draining` or `Done` (`Cancelling` included: the Cancel
    /// must be answered with a `CancelResponse`).
    pub fn finish(&mut self, response: FinishResponse) -> Result<(), EndpointMisuse> {
        match self.state {
            State::Draining => {
                self.outbox.push_back(UdfResponse::finish(response));
                self.state = State::Done;
                self.outcome = Some(EndpointOutcome::Finished);
                Ok(())
            }
            State::Done => Ok(()),
            _ => Err(self.misuse("finish")),
        }
    }

    /// Answers the engine's Cancel with `response` (udf §2 R4, R7): `Cancelling → Done`.
    /// When `response.error` is unset, an error the user raised after the Cancel
    /// ([`fail`](Self::fail)/[`reject_init`](Self::reject_init)) is put there.
    ///
    /// # Errors
    /// [`EndpointMisuse`] unless `Cancelling` or `Done` (in `PostError` the Cancel has not
    /// arrived yet).
    pub fn cancelled(&mut self, response: CancelResponse) -> Result<(), EndpointMisuse> {
        match self.state {
            State::Cancelling => {
                let reason = self.cancel.as_ref().and_then(|c| c.reason.clone());
                self.terminate_cancelled(response, reason);
                Ok(())
            }
            State::Done => Ok(()),
            _ => Err(self.misuse("cancelled")),
        }
    }
}

fn is_data(response: &UdfResponse) -> bool {
    response.kind() == Some(ResponseKind::Data)
}

/// Checks `payload_size` and `payload_crc32` against the assembled payload (udf §1.3).
fn verify_payload(udf: &crate::wire::UdfPayload) -> Option<InitRejection> {
    let len = udf.payload.len() as u64;
    if let Some(size) = udf
        .payload_size
        .filter(|s| u64::try_from(*s).ok() != Some(len))
    {
        return Some(InitRejection::PayloadSizeMismatch {
            declared: size,
            assembled: len,
        });
    }
    if let Some(expected) = udf.payload_crc32 {
        let actual = crc32fast::hash(&udf.payload);
        if actual != expected {
            return Some(InitRejection::PayloadCrcMismatch {
                declared: expected,
                assembled: actual,
            });
        }
    }
    None
}

crate::worker::pump::forward_pump_core!(
    WorkerCore,
    tx = UdfResponse,
    rx = UdfRequest,
    handle_recv = handle_request,
    is_settled = is_done,
);

/// The one test of [`WorkerCore`] that needs a crate-private method, `begin_wait_with` (what
/// the pump calls with its timer's clock); the others are in `tests/udf/worker_core.rs`.
#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::wire::{UdfPayload, UdfWorkerDataFormat};

    /// A core in phase Data: Init accepted, InitResponse drained.
    fn data_core() -> WorkerCore {
        let mut c = WorkerCore::default();
        c.handle_request(UdfRequest::init(Init::new(
            UdfWorkerDataFormat::Arrow,
            UdfPayload::new(Bytes::from_static(b"udf"), "test"),
        )));
        c.accept_init(None).unwrap();
        let sent: Vec<_> = std::iter::from_fn(|| c.poll_transmit())
            .map(|r| r.kind())
            .collect();
        assert_eq!(sent, [Some(ResponseKind::Init)]);
        assert_eq!(c.phase(), WorkerPhase::Data);
        c
    }

    #[test]
    fn a_wait_reads_the_clock_only_when_it_arms_a_deadline() {
        let t0 = Instant::now();
        let reads = Cell::new(0);
        let clock = || {
            reads.set(reads.get() + 1);
            t0
        };
        // AwaitingInit: the first wait arms the Init deadline, later waits find it running.
        let mut c = WorkerCore::default();
        c.begin_wait_with(clock);
        c.begin_wait_with(clock);
        assert_eq!(reads.get(), 1);
        let config = EndpointConfig::with_timer(std::sync::Arc::new(crate::time::NoTimeouts));
        assert_eq!(c.poll_timeout(), config.init_timeout.map(|t| t0 + t));
        // The data phase has no deadline (udf §7): no clock read at all.
        let mut c = data_core();
        c.begin_wait_with(clock);
        assert_eq!(reads.get(), 1);
        assert_eq!(c.poll_timeout(), None);
        // PostError arms the R4 deadline once.
        let mut c = data_core();
        c.fail(ExecutionError::user("boom")).unwrap();
        c.begin_wait_with(clock);
        c.begin_wait_with(clock);
        assert_eq!(reads.get(), 2);
        assert!(c.poll_timeout().is_some());
    }
}
