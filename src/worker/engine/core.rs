//! The engine side of a worker session as a sans-IO state machine (udf §4).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use smallvec::SmallVec;

use crate::connection::ConnectionError;
use crate::wire::{
    ExecutionError, Init, InitResponse, RequestKind, ResponseMessage, UdfRequest, UdfResponse,
};

use super::config::SessionConfig;
use super::events::SessionLifecycle;
use super::termination::{
    Interrupted, PeerViolation, SessionError, Termination, TransportFailure, Wait,
};

/// The runtime state of an engine session (udf §4.1). The typestates `state::Init`,
/// `state::Streaming`, `state::Finishing`, `state::Cancelling` and `state::Terminated` are
/// views over these phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EnginePhase {
    /// Constructed; `Init` not sent (udf §4.1 `Created`).
    Created,
    /// `Init` queued or sent, waiting for `InitResponse` (udf §4.1 `Initializing`).
    Initializing,
    /// `InitResponse` accepted without error; data may flow (udf §4.1 `Initialized`/`Streaming`).
    Streaming,
    /// `Finish` queued or sent; waiting for trailing output and the terminator (udf §4.1
    /// `Finishing`).
    Finishing,
    /// A Cancel was queued or sent; waiting for the terminator (udf §4.1 `Cancelling`).
    Cancelling,
    /// A [`Termination`] has been settled; nothing more is sent (udf §4.1 `Terminal`).
    Terminated,
}

/// Where the init handshake stands, as [`EngineCore::init_status`] reports it (udf §4.6).
#[derive(Debug, Clone, PartialEq)]
pub enum InitStatus {
    /// No `InitResponse` yet and no error.
    Pending,
    /// `InitResponse` without error arrived and no error was recorded.
    Accepted,
    /// The worker reported an error during init (`InitResponse.error` or a pre-init
    /// `ErrorResponse`); a Cancel has been queued and the terminal will follow.
    Failed,
    /// The session settled a terminal before init completed.
    Terminated,
}

/// Counters of events the core observed but ignored or discarded (udf §4.5: late messages
/// never change the outcome, but they are counted and logged).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// `DataRequest`s handed to the transport (udf §1.4).
    pub data_sent: u64,
    /// `DataResponse`s accepted into the output queue (udf §1.4).
    pub data_received: u64,
    /// Any message received after the terminal was settled (ignored, udf §4.5 last row).
    pub ignored_after_terminal: u64,
    /// `InitResponse`s after the first one (ignored, udf §10 gap 13).
    pub duplicate_init_responses: u64,
    /// `ErrorResponse`s after the first recorded execution error (logged, not kept; udf §10
    /// gap 12).
    pub additional_errors: u64,
    /// Data or Finish calls skipped because a Cancel had already been requested (nothing
    /// after Cancel, udf §4.7).
    pub skipped_after_cancel: u64,
}

/// Error for a call made in a phase that does not allow it: Spark's `IllegalStateException`
/// of udf §4.3 and §4.10. The typed [`Session`](super::Session) API makes these impossible;
/// the erased and sans-IO forms report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{call} is not allowed in phase {phase:?}")]
pub struct Misuse {
    /// The call that was made.
    pub call: &'static str,
    /// The phase the session was in.
    pub phase: EnginePhase,
}

/// The engine side of a worker session as a sans-IO state machine (udf §4).
///
/// [`EngineCore`] holds every protocol rule of the engine side once: call ordering, the
/// inbound message table of udf §4.5, the Cancel choke point of §4.8, first-wins terminal
/// settlement, payload chunking (R1), the error a caller sees, and the deadline table of
/// udf §7. It does no I/O and reads no clock: the caller passes `now` when a wait begins.
/// The async [`Session`](super::Session) is a thin driver over it; the property tests and
/// fuzzers drive it directly.
///
/// # When to call what
///
/// - Calls of the engine: [`start_init`](Self::start_init), [`send_data`](Self::send_data),
///   [`finish`](Self::finish), [`cancel`](Self::cancel), [`discard_output`](Self::discard_output),
///   [`close`](Self::close), [`interrupt`](Self::interrupt).
/// - Events: [`handle_response`](Self::handle_response) for each received `UdfResponse`,
///   [`handle_stream_end`](Self::handle_stream_end),
///   [`handle_connection_error`](Self::handle_connection_error),
///   [`handle_timeout`](Self::handle_timeout).
/// - [`poll_transmit`](Self::poll_transmit) should be polled (until `None`) after every
///   call and every event above: each of them may queue a request. Hand the requests to the
///   transport in that order.
/// - [`pop_output`](Self::pop_output) should be polled after `handle_response`.
/// - [`begin_wait`](Self::begin_wait) when the driver is about to block on the worker (its
///   poll is about to return `Pending`), with the current time: this is the only clock
///   reading the session needs. Then [`poll_timeout`](Self::poll_timeout) gives the instant
///   at which to call [`handle_timeout`](Self::handle_timeout); it may change after any call
///   or event, so re-read it before each wait. [`end_wait`](Self::end_wait) when the
///   caller's wait ended with what it waited for (a per-poll deadline restarts at the next
///   wait).
/// - [`wants_half_close`](Self::wants_half_close) tells when the request side may be
///   half-closed (udf §2 R9): a clean terminal (`Finished`, `Cancelled`) and nothing left to
///   send; [`wants_abort`](Self::wants_abort) when it must be aborted instead (a failure
///   terminal: `TransportFailed`, `Interrupted`, udf §5.2 step 4), after the farewell
///   `Cancel` of a timeout or an interrupt went out. Never both.
///
/// A driver of its own, in outline (tether's [`Session`](super::Session) is this loop over a
/// [`Connection`](crate::connection::Connection)):
///
/// ```
/// use std::time::Instant;
/// use bytes::Bytes;
/// use tether::wire::{Init, InitResponse, UdfPayload, UdfResponse, UdfWorkerDataFormat};
/// use tether::worker::engine::{EngineCore, EnginePhase, SessionConfig};
///
/// let config = SessionConfig::default();
/// let mut core = EngineCore::new(&config);
/// let udf = UdfPayload::new(Bytes::from_static(b"pickled"), "f");
/// core.start_init(Init::new(UdfWorkerDataFormat::Arrow, udf), None)?;
/// while let Some(request) = core.poll_transmit() {
///     // write `request` to the worker
/// #   let _ = request;
/// }
/// // Nothing to read yet: before blocking, tell the core the time and sleep until its
/// // deadline (or until the worker's next message, whichever comes first).
/// let now = Instant::now();
/// core.begin_wait(now);
/// assert_eq!(core.poll_timeout(), Some(now + config.init_timeout));
/// // The worker's answer arrives in time.
/// core.handle_response(UdfResponse::init(InitResponse::default()));
/// assert_eq!(core.phase(), EnginePhase::Streaming);
/// // Had it not, `core.handle_timeout(deadline)` would have settled
/// // `TransportFailed(Timeout(InitResponse))` and queued a best-effort Cancel.
/// # Ok::<(), tether::worker::engine::Misuse>(())
/// ```
///
/// # Deadlines (udf §7)
///
/// One deadline runs at a time; which one depends on the state, checked in this order:
///
/// | state                                   | deadline                  | kind     | expiry                                  |
/// |-----------------------------------------|---------------------------|----------|-----------------------------------------|
/// | terminal, requests still to shut down   | `interrupt_cancel_timeout`| total    | queued requests dropped, stop shutting down |
/// | [`interrupt`](Self::interrupt)ed        | `interrupt_cancel_timeout`| total    | `Interrupted` (udf §4.9)                |
/// | [`close`](Self::close)d, or init failed | `terminal_timeout`        | total    | `TransportFailed(Timeout(Terminator))` (udf §5.2 step 3, §4.6 step 5) |
/// | `Initializing`                          | `init_timeout`            | total    | `TransportFailed(Timeout(InitResponse))` (udf §4.6 step 4) |
/// | `Streaming`, `Finishing`, `Cancelling`  | `terminal_timeout`        | per poll | `TransportFailed(Timeout(Output))`, or `Timeout(Terminator)` when cancelling or discarding output (udf §4.7 step 4) |
/// | `Created`                               | none                      |          |                                         |
///
/// "Total" counts from the first wait of that state; "per poll" counts from the start of
/// each wait, and every worker event (a message received, a request taken by the
/// transport) ends the wait. A timeout on an open stream keeps a best-effort `Cancel`
/// queued so that the worker learns about it.
///
/// # Flags
///
/// Beside the phase, these flags survive; the combinations that occur:
///
/// | phase          | cancel_requested | finish_sent | stream_opened | init_failed | closing / interrupt |
/// |----------------|------------------|-------------|---------------|-------------|---------------------|
/// | `Created`      | false            | false       | false         | false       | false               |
/// | `Initializing` | false            | false       | any           | false       | false               |
/// | `Streaming`    | false            | false       | true          | false       | false               |
/// | `Finishing`    | false            | any         | true          | false       | false               |
/// | `Cancelling`   | true             | any         | true          | any         | any                 |
/// | `Terminated`   | any              | any         | any           | any         | any                 |
///
/// `init_failed` implies an execution error was recorded; `closing` and `interrupt` imply
/// `cancel_requested` (or a terminal).
#[derive(Debug)]
pub struct EngineCore {
    phase: EnginePhase,
    terminal: Option<Termination>,
    /// One-shot cancel intent (udf §4.4 `cancelRequested`): suppresses later Data/Finish.
    cancel_requested: bool,
    /// Set when the `Finish` request is handed to the transport (udf §4.4 `finishSendStarted`).
    finish_sent: bool,
    /// Whether any request has been handed to the transport (the stream exists).
    stream_opened: bool,
    init_response: Option<InitResponse>,
    init_failed: bool,
    execution_error: Option<ExecutionError>,
    /// `close()` began (udf §5.2): the terminator wait is total.
    closing: bool,
    /// The interrupt's context, once [`interrupt`](Self::interrupt) began (udf §4.9).
    interrupt: Option<&'static str>,
    /// The caller reads no more output: received batches are discarded (udf §5.2 step 2).
    discarding: bool,
    /// The request side's shutdown deadline expired: nothing more will be sent.
    requests_abandoned: bool,
    timeouts: Timeouts,
    /// The running deadline and the rule it was armed for.
    deadline: Option<(Rule, Instant)>,
    outbox: VecDeque<UdfRequest>,
    output: VecDeque<Bytes>,
    /// Payload bytes of the batches in `output`.
    output_bytes: usize,
    stats: CoreStats,
    /// The udf §4.1 states this core reached and the driver has not reported yet.
    lifecycle: SmallVec<[SessionLifecycle; 2]>,
}

/// The udf §7 durations and the output bound, copied from a [`SessionConfig`].
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    init: Duration,
    terminal: Duration,
    interrupt_cancel: Duration,
    output_buffer: usize,
    output_buffer_bytes: usize,
}

/// Which row of the deadline table governs the current wait (see [`EngineCore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Init,
    Poll,
    Terminator,
    InterruptAck,
    Shutdown,
}

/// The core of the default configuration: Spark's deadlines (udf §7), which the core only
/// reads as durations (its caller owns time, so the config's timer is not used).
impl Default for EngineCore {
    fn default() -> Self {
        Self::new(&SessionConfig::with_timer(std::sync::Arc::new(
            crate::time::NoTimeouts,
        )))
    }
}

impl EngineCore {
    /// A session in phase `Created` (udf §4.1) with the deadlines and the output bound of
    /// `config` (udf §7; its `timer` is the driver's business and is not used here).
    pub fn new(config: &SessionConfig) -> Self {
        Self {
            phase: EnginePhase::Created,
            terminal: None,
            cancel_requested: false,
            finish_sent: false,
            stream_opened: false,
            init_response: None,
            init_failed: false,
            execution_error: None,
            closing: false,
            interrupt: None,
            discarding: false,
            requests_abandoned: false,
            timeouts: Timeouts {
                init: config.init_timeout,
                terminal: config.terminal_timeout,
                interrupt_cancel: config.interrupt_cancel_timeout,
                output_buffer: config.output_buffer.max(1),
                output_buffer_bytes: config.output_buffer_bytes,
            },
            deadline: None,
            outbox: VecDeque::new(),
            output: VecDeque::new(),
            output_bytes: 0,
            stats: CoreStats::default(),
            // Constructed: Spark's `Created` (udf §4.1).
            lifecycle: smallvec::smallvec![SessionLifecycle::Created],
        }
    }

    /// Whether lifecycle steps wait to be reported ([`take_lifecycle`](Self::take_lifecycle)).
    pub(crate) fn has_lifecycle(&self) -> bool {
        !self.lifecycle.is_empty()
    }

    /// The udf §4.1 states reached since the last call, oldest first: `Created` (at
    /// construction), `Initialized` (an `InitResponse` moved `Initializing` to `Streaming`),
    /// `Terminated` (the one settlement).
    pub(crate) fn take_lifecycle(&mut self) -> SmallVec<[SessionLifecycle; 2]> {
        std::mem::take(&mut self.lifecycle)
    }

    /// The current phase (udf §4.1; Spark's `currentState`, udf §4.2).
    pub fn phase(&self) -> EnginePhase {
        self.phase
    }

    /// The settled terminal, if any (first wins, never changes; Spark's
    /// `settledTermination`, udf §4.2).
    pub fn terminal(&self) -> Option<&Termination> {
        self.terminal.as_ref()
    }

    /// Whether a terminal has been settled (udf §4.1 `Terminal`).
    pub fn is_terminal(&self) -> bool {
        self.terminal.is_some()
    }

    /// Whether a Cancel has been requested (queued or sent): the one-shot cancel intent of
    /// udf §4.4 `cancelRequested`.
    pub fn cancel_requested(&self) -> bool {
        self.cancel_requested
    }

    /// Whether `DataRequest`s and `Finish` may still be queued: `Streaming` and no Cancel
    /// requested. The one place of "nothing is sent after Cancel" (udf §4.7 request writes,
    /// §4.8).
    pub fn may_send(&self) -> bool {
        self.phase == EnginePhase::Streaming && !self.cancel_requested
    }

    /// Whether the `Finish` request has been handed to the transport (udf §4.4
    /// `finishSendStarted`: from then on a `FinishResponse` is legitimate).
    pub fn finish_sent(&self) -> bool {
        self.finish_sent
    }

    /// Whether any request has been handed to the transport: the stream exists, so a close
    /// must Cancel rather than settle the synthetic `Cancelled` (udf §5.2 step 1).
    pub fn stream_opened(&self) -> bool {
        self.stream_opened
    }

    /// The first execution error the worker reported, if any (udf §4.4 `executionError`:
    /// from `ErrorResponse` or `InitResponse.error`, first wins).
    pub fn execution_error(&self) -> Option<&ExecutionError> {
        self.execution_error.as_ref()
    }

    /// The accepted `InitResponse`, if any (udf §4.5: one without error; later ones are
    /// ignored).
    pub fn init_response(&self) -> Option<&InitResponse> {
        self.init_response.as_ref()
    }

    /// Ignored/discarded event counters (udf §4.5 late messages; udf §10 gaps 12–13).
    pub fn stats(&self) -> CoreStats {
        self.stats
    }

    /// Where the init handshake stands (the decision of udf §4.6 step 5).
    pub fn init_status(&self) -> InitStatus {
        // An ErrorResponse right behind an accepted InitResponse also fails init (udf §4.6).
        if self.init_failed || (self.init_response.is_some() && self.execution_error.is_some()) {
            InitStatus::Failed
        } else if self.terminal.is_some() {
            InitStatus::Terminated
        } else if self.init_response.is_some() {
            InitStatus::Accepted
        } else {
            InitStatus::Pending
        }
    }

    /// The error a caller of the session sees now (the one place of the error precedence,
    /// with [`init_error`](Self::init_error) for the init call):
    ///
    /// 1. terminal: [`Termination::to_error`] (udf §4.7 `throwIfTerminalError`: a recorded
    ///    execution error, then the callback error, `Cancelled`, the transport failure or
    ///    the interrupt; `None` for a clean `Finished`);
    /// 2. not terminal, a worker error recorded: that error (its Cancel is out, udf §4.5);
    /// 3. not terminal, a Cancel requested: [`SessionError::Cancelled`];
    /// 4. otherwise `None`: the session can go on.
    pub fn error(&self) -> Option<SessionError> {
        match &self.terminal {
            Some(t) => t.to_error(),
            None => self
                .recorded_error()
                .or(self.cancel_requested.then_some(SessionError::Cancelled)),
        }
    }

    /// The error a failed init reports (udf §4.6 step 5): the worker's recorded error if it
    /// reported one ("fail-with-error", whatever the wait for the Cancel's answer then gave),
    /// else [`error`](Self::error) ("fail-from-state").
    pub fn init_error(&self) -> Option<SessionError> {
        self.recorded_error().or_else(|| self.error())
    }

    fn recorded_error(&self) -> Option<SessionError> {
        self.execution_error.clone().map(SessionError::Execution)
    }

    /// Queues `Init` (udf §1.3) and `Created → Initializing`.
    ///
    /// With `chunk_size = Some(n)` and a non-empty `init.udf.payload`, the payload goes out
    /// as `PayloadChunk`s of at most `max(n, 1)` bytes after an `Init` whose inline payload
    /// is empty: `is_chunking_payload` is set, `udf.payload_size` is set to the total size
    /// in bytes if unset, and the final chunk carries `last = true` (udf §1.3, R1). An empty
    /// payload, or `chunk_size = None`, is sent inline.
    ///
    /// # Errors
    /// [`Misuse`] unless the phase is `Created`.
    pub fn start_init(&mut self, mut init: Init, chunk_size: Option<usize>) -> Result<(), Misuse> {
        if self.phase != EnginePhase::Created {
            return Err(Misuse {
                call: "init",
                phase: self.phase,
            });
        }
        let mut chunks = Vec::new();
        if let (Some(size), Some(udf)) = (chunk_size, init.udf.as_mut())
            && !udf.payload.is_empty()
        {
            let size = size.max(1);
            let payload = std::mem::take(&mut udf.payload);
            udf.payload_size.get_or_insert(payload.len() as i64);
            init.is_chunking_payload = Some(true);
            let mut offset = 0;
            while offset < payload.len() {
                let end = (offset + size).min(payload.len());
                chunks.push(payload.slice(offset..end));
                offset = end;
            }
        }
        self.phase = EnginePhase::Initializing;
        self.outbox.push_back(UdfRequest::init(init));
        let n = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            self.outbox
                .push_back(UdfRequest::payload_chunk(chunk, i + 1 == n));
        }
        Ok(())
    }

    /// Queues one `DataRequest` (udf §1.4). Returns `Ok(false)` without queueing unless
    /// [`may_send`](Self::may_send): nothing is sent after Cancel (udf §4.7).
    ///
    /// # Errors
    /// [`Misuse`] in `Created`, `Initializing` or `Finishing`.
    pub fn send_data(&mut self, data: Bytes) -> Result<bool, Misuse> {
        self.check_send("send")?;
        if !self.may_send() {
            self.stats.skipped_after_cancel += 1;
            return Ok(false);
        }
        self.outbox.push_back(UdfRequest::data(data));
        Ok(true)
    }

    /// Queues `Finish`: `Streaming → Finishing` (udf §4.4 `beginFinish`). Returns `Ok(false)`
    /// unless [`may_send`](Self::may_send) (the Finish is skipped).
    ///
    /// # Errors
    /// [`Misuse`] in `Created`, `Initializing` or `Finishing`.
    pub fn finish(&mut self) -> Result<bool, Misuse> {
        self.check_send("finish")?;
        if !self.may_send() {
            self.stats.skipped_after_cancel += 1;
            return Ok(false);
        }
        self.phase = EnginePhase::Finishing;
        self.outbox.push_back(UdfRequest::finish());
        Ok(true)
    }

    /// Data and Finish are calls of `Streaming` (where a Cancel or a terminal may already
    /// have overtaken them: they are skipped, not misuse; udf §4.10).
    fn check_send(&self, call: &'static str) -> Result<(), Misuse> {
        match self.phase {
            EnginePhase::Streaming | EnginePhase::Cancelling | EnginePhase::Terminated => Ok(()),
            phase => Err(Misuse { call, phase }),
        }
    }

    /// Requests a Cancel (udf §4.8, the single choke point). Idempotent: returns `true` only
    /// for the call that queued the Cancel.
    ///
    /// - Terminal: nothing happens.
    /// - Nothing handed to the transport yet (`Created`, or `Init` still queued): the queue is
    ///   dropped, no stream is opened, and the synthetic `Cancelled` settles (udf §5.3).
    /// - Otherwise unsent Data, Finish and PayloadChunks are dropped, `Cancel{reason}` is
    ///   queued and the phase becomes `Cancelling`.
    #[must_use]
    pub fn cancel(&mut self, reason: Option<String>) -> bool {
        if self.terminal.is_some() || self.cancel_requested {
            return false;
        }
        self.cancel_requested = true;
        if !self.stream_opened {
            // Nothing has reached the transport (not even a queued Init): the stream is never
            // opened and the outcome is the synthetic Cancelled (udf §5.2 step 1, §5.3).
            let _ = self.settle(Termination::cancelled_before_start());
            return false;
        }
        // The Init went out first, so dropping every unsent request keeps "Cancel never
        // precedes Init"; nothing but the Cancel follows (udf §4.7, §4.8).
        self.outbox.clear();
        self.outbox.push_back(UdfRequest::cancel(reason));
        self.phase = EnginePhase::Cancelling;
        true
    }

    /// The caller will read no more output (it waits for the terminator): queued and later
    /// `DataResponse`s are discarded (udf §5.2 step 2), and a per-poll timeout reports
    /// [`Wait::Terminator`]. Returns how many queued batches were dropped.
    pub fn discard_output(&mut self) -> usize {
        self.discarding = true;
        self.clear_output()
    }

    /// `close()` begins (udf §5.2): unless terminal, Cancel ("session closed", or the
    /// synthetic `Cancelled` if nothing is on the wire yet), discard output, and wait for the
    /// terminator at most `terminal_timeout` in total (udf §5.2 step 3).
    pub fn close(&mut self) {
        if self.terminal.is_some() {
            return;
        }
        self.closing = true;
        self.discard_output();
        let _ = self.cancel(Some("session closed".into()));
    }

    /// The session is interrupted (udf §4.9; in Rust: dropped mid-operation while `context`):
    /// unless terminal, Cancel ("interrupted while {context}"), discard output, and wait for
    /// the acknowledgement at most `interrupt_cancel_timeout` in total; expiry settles
    /// `Interrupted`.
    pub fn interrupt(&mut self, context: &'static str) {
        if self.terminal.is_some() {
            return;
        }
        self.interrupt = Some(context);
        self.discard_output();
        let _ = self.cancel(Some(format!("interrupted while {context}")));
    }

    /// The next request to hand to the transport, if any, in the order the udf §2 rules
    /// allow. Taking `Finish` sets the finish-sent flag, after which a `FinishResponse` is
    /// legitimate (udf §4.4 `finishSendStarted`). A worker event: it ends a per-poll wait.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<UdfRequest> {
        let req = self.outbox.pop_front()?;
        self.stream_opened = true;
        self.worker_event();
        match req.kind() {
            Some(RequestKind::Finish) => self.finish_sent = true,
            Some(RequestKind::Data) => self.stats.data_sent += 1,
            _ => {}
        }
        Some(req)
    }

    /// Whether requests are waiting for [`poll_transmit`](Self::poll_transmit) (the request
    /// writes of udf §4.7).
    pub fn has_transmit(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Whether the driver should take another message from the connection now: not
    /// terminal, and either the output queue is empty or fewer than `output_buffer` batches
    /// holding fewer than `output_buffer_bytes` payload bytes wait in it (tether's
    /// backpressure to the worker; Spark's queue is unbounded, udf §10 gap 2;
    /// [`SessionConfig::output_buffer_bytes`]).
    pub fn wants_recv(&self) -> bool {
        self.terminal.is_none()
            && (self.output.is_empty()
                || (self.output.len() < self.timeouts.output_buffer
                    && self.output_bytes < self.timeouts.output_buffer_bytes))
    }

    /// Whether the request side may be half-closed now (udf §2 R9: the engine half-closes
    /// once the outcome is known, and only after a clean terminator): `Finished` or
    /// `Cancelled`, nothing left to send, and the shutdown not abandoned. Never together
    /// with [`wants_abort`](Self::wants_abort).
    pub fn wants_half_close(&self) -> bool {
        self.request_side_over() && self.terminal.as_ref().is_some_and(is_clean_terminal)
    }

    /// Whether the request side must be aborted now instead of half-closed (udf §2 R9, §5.2
    /// step 4: after a failure terminator Spark's engine calls `onError`, never
    /// `onCompleted`): `TransportFailed` or `Interrupted` (or `Failed`), the farewell `Cancel`
    /// of a timeout or an interrupt handed over, and the shutdown not abandoned. A driver
    /// aborts by giving up the connection without closing it (dropping a gRPC stream resets
    /// it, `RST_STREAM(CANCEL)`, as Spark's `onError` does).
    pub fn wants_abort(&self) -> bool {
        self.request_side_over()
            && self
                .terminal
                .as_ref()
                .is_some_and(|t| !is_clean_terminal(t))
    }

    /// Terminal, nothing left to send, and the shutdown not abandoned (udf §2 R9).
    fn request_side_over(&self) -> bool {
        self.terminal.is_some() && self.outbox.is_empty() && !self.requests_abandoned
    }

    /// Whether the request side's shutdown deadline expired (`interrupt_cancel_timeout`
    /// after the terminal, udf §7): the driver stops trying to flush and half-close (udf §2
    /// R9).
    pub fn requests_abandoned(&self) -> bool {
        self.requests_abandoned
    }

    /// The next received `DataResponse` payload, in arrival order (udf §4.7 output queue).
    #[must_use]
    pub fn pop_output(&mut self) -> Option<Bytes> {
        let batch = self.output.pop_front()?;
        self.output_bytes -= batch.len();
        Some(batch)
    }

    /// How many received `DataResponse`s wait in the output queue (the depth Spark does not
    /// expose yet, udf §10 item 3).
    pub fn output_len(&self) -> usize {
        self.output.len()
    }

    /// The payload bytes of the queued output batches (udf §1.4 `DataResponse.data`): the
    /// sum of their lengths, what [`SessionConfig::output_buffer_bytes`] bounds.
    pub fn output_bytes(&self) -> usize {
        self.output_bytes
    }

    /// Drops every queued output batch and returns how many there were (output no consumer
    /// will read, udf §5.2 step 2).
    fn clear_output(&mut self) -> usize {
        let n = self.output.len();
        self.output.clear();
        self.output_bytes = 0;
        if n > 0 {
            tracing::debug!(
                dropped = n,
                "discarding UDF output while waiting for the terminator"
            );
        }
        n
    }

    /// A wait on the worker begins at `now` (udf §7): arms the deadline of the current row
    /// of the deadline table unless it is already armed. Call it when the driver is about to
    /// block (its poll returns `Pending`), not per message. A duration too long for an
    /// `Instant` (such as `Duration::MAX`, "never") saturates at about 100 years.
    pub fn begin_wait(&mut self, now: Instant) {
        self.begin_wait_with(|| now);
    }

    /// [`begin_wait`](Self::begin_wait) reading the clock (`now`) only when a deadline is
    /// armed: a wait whose deadline is already running, or that has none, costs no clock
    /// read (udf §7 deadlines are read from the clock only when a wait begins).
    pub(crate) fn begin_wait_with(&mut self, now: impl FnOnce() -> Instant) {
        match self.rule() {
            None => self.deadline = None,
            Some(rule) if self.deadline.is_some_and(|(armed, _)| armed == rule) => {}
            Some(rule) => {
                let at = crate::time::deadline_after(now(), self.duration(rule));
                self.deadline = Some((rule, at));
            }
        }
    }

    /// The caller's wait ended with what it waited for: a per-poll deadline restarts at the
    /// next [`begin_wait`](Self::begin_wait) (udf §4.7: per poll, not total). Total
    /// deadlines keep running.
    pub fn end_wait(&mut self) {
        self.worker_event();
    }

    /// The instant at which [`handle_timeout`](Self::handle_timeout) is due (udf §7): the
    /// armed deadline if it still belongs to the current row of the deadline table, else
    /// `None` (a wait that begins re-arms it). May change after any call or event.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let (rule, at) = self.deadline?;
        (Some(rule) == self.rule()).then_some(at)
    }

    /// Time has reached `now` (udf §7): if the armed deadline is due, applies its expiry
    /// (the last column of the deadline table); otherwise nothing happens.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_none_or(|at| now < at) {
            return;
        }
        let Some((rule, _)) = self.deadline.take() else {
            return;
        };
        match rule {
            Rule::Init => self.time_out(Wait::InitResponse, self.timeouts.init),
            Rule::Poll => {
                let waiting_for = if self.discarding || self.phase == EnginePhase::Cancelling {
                    Wait::Terminator
                } else {
                    Wait::Output
                };
                self.time_out(waiting_for, self.timeouts.terminal);
            }
            Rule::Terminator => self.time_out(Wait::Terminator, self.timeouts.terminal),
            Rule::InterruptAck => {
                let context = self.interrupt.unwrap_or("the session was dropped");
                let waited = self.timeouts.interrupt_cancel;
                self.handle_interrupt(context, waited);
            }
            Rule::Shutdown => {
                self.outbox.clear();
                self.requests_abandoned = true;
            }
        }
    }

    /// The row of the deadline table for the current state.
    fn rule(&self) -> Option<Rule> {
        if self.terminal.is_some() {
            return (!self.requests_abandoned).then_some(Rule::Shutdown);
        }
        if self.interrupt.is_some() {
            return Some(Rule::InterruptAck);
        }
        if self.closing || self.init_failed {
            return Some(Rule::Terminator);
        }
        match self.phase {
            EnginePhase::Created => None,
            EnginePhase::Initializing => Some(Rule::Init),
            _ => Some(Rule::Poll),
        }
    }

    fn duration(&self, rule: Rule) -> Duration {
        match rule {
            Rule::Init => self.timeouts.init,
            Rule::Poll | Rule::Terminator => self.timeouts.terminal,
            Rule::InterruptAck | Rule::Shutdown => self.timeouts.interrupt_cancel,
        }
    }

    /// A worker event (a message received, a request taken): ends a per-poll wait.
    fn worker_event(&mut self) {
        if matches!(self.deadline, Some((Rule::Poll, _))) {
            self.deadline = None;
        }
    }

    /// Settles `TransportFailed(Timeout)` (udf §4.6 step 4, §4.7 step 4, §5.2 step 3); if the
    /// stream is open, a Cancel stays queued so that the worker learns about it.
    fn time_out(&mut self, waiting_for: Wait, after: Duration) {
        let failure = TransportFailure::Timeout { waiting_for, after };
        if self.stream_opened {
            let _ = self.cancel(Some(format!("timed out waiting for {waiting_for}")));
        }
        self.fail(failure);
    }

    /// Feeds one message received from the worker (udf §4.5). A worker event: it ends a
    /// per-poll wait.
    pub fn handle_response(&mut self, response: UdfResponse) {
        if self.terminal.is_some() {
            self.stats.ignored_after_terminal += 1;
            tracing::warn!(kind = ?response.kind(), "ignoring a worker message after the terminal");
            return;
        }
        self.worker_event();
        if !self.stream_opened {
            // The worker cannot answer a stream the engine has not opened.
            return self.fail(PeerViolation::ResponseBeforeInit.into());
        }
        let msg = match response.into_message() {
            Ok(m) => m,
            Err(e) => return self.fail(PeerViolation::Malformed(e).into()),
        };
        match msg {
            ResponseMessage::Data(data) => {
                // R2: no DataResponse before an accepted InitResponse, whatever the phase
                // (also after an init error or while cancelling).
                if self.init_response.is_none() {
                    return self.fail(PeerViolation::DataBeforeInitResponse.into());
                }
                self.stats.data_received += 1;
                if !self.discarding {
                    self.output_bytes += data.len();
                    self.output.push_back(data);
                }
            }
            ResponseMessage::Init(resp) => {
                if self.init_response.is_some() || self.init_failed {
                    self.stats.duplicate_init_responses += 1;
                    tracing::warn!("ignoring a duplicate InitResponse");
                    return;
                }
                match resp.error.clone() {
                    Some(error) => {
                        self.record_error(error);
                        self.init_failed = true;
                        let _ = self.cancel(Some("init failed".into()));
                    }
                    None => {
                        if self.phase == EnginePhase::Initializing {
                            self.phase = EnginePhase::Streaming;
                            self.lifecycle.push(SessionLifecycle::Initialized);
                        }
                        self.init_response = Some(*resp);
                    }
                }
            }
            ResponseMessage::Error(err) => {
                let error = err.error.unwrap_or_default();
                self.record_error(error);
                if self.init_response.is_none() {
                    self.init_failed = true;
                }
                let _ = self.cancel(Some("aborting after ErrorResponse".into()));
            }
            ResponseMessage::Finish(resp) => {
                if self.finish_sent {
                    let execution_error = self.execution_error.clone();
                    let _ = self.settle(Termination::Finished {
                        response: *resp,
                        execution_error,
                    });
                } else {
                    self.fail(PeerViolation::FinishResponseBeforeFinish.into());
                }
            }
            ResponseMessage::Cancel(resp) => {
                let execution_error = self.execution_error.clone();
                let _ = self.settle(Termination::Cancelled {
                    response: *resp,
                    execution_error,
                });
            }
        }
    }

    /// The worker ended its response stream (udf §2 R10): `TransportFailed` unless terminal.
    pub fn handle_stream_end(&mut self) {
        if self.terminal.is_none() {
            self.fail(PeerViolation::StreamEndedWithoutTerminator.into());
        }
    }

    /// The connection failed (read or write): `TransportFailed` unless terminal (udf §4.5
    /// stream `onError`; a failed write, udf §4.7).
    pub fn handle_connection_error(&mut self, error: ConnectionError) {
        self.fail(TransportFailure::Connection(error));
    }

    /// Settles `Interrupted { context, waited }` at once, unless already terminal (udf §4.9):
    /// for a driver that cannot wait for the Cancel's acknowledgement (no runtime, no
    /// timer). [`interrupt`](Self::interrupt) is the waiting form.
    pub fn handle_interrupt(&mut self, context: &'static str, waited: Duration) {
        let _ = self.settle(Termination::Interrupted(Interrupted { context, waited }));
    }

    /// Settles `TransportFailed(failure)` unless already terminal (udf §4.4
    /// `transportFailed`).
    fn fail(&mut self, failure: TransportFailure) {
        let _ = self.settle(Termination::TransportFailed(failure));
    }

    /// First-wins settlement (udf §4.2 `completeTerminal`): returns `true` only for the call
    /// that settled. Queued requests are dropped, except a queued `Cancel` when the worker
    /// has not ended the session (a timeout or an interrupt): that one stays as a
    /// best-effort farewell. Private: every terminal is reached through an event
    /// (`handle_*`) or a call of the engine (`cancel`), so the rules that pick it live here.
    #[must_use]
    fn settle(&mut self, termination: Termination) -> bool {
        if self.terminal.is_some() {
            return false;
        }
        tracing::debug!(outcome = %termination, "worker session settled");
        let farewell = matches!(
            termination,
            Termination::Interrupted(_)
                | Termination::TransportFailed(TransportFailure::Timeout { .. })
        );
        if farewell {
            self.outbox
                .retain(|r| r.kind() == Some(RequestKind::Cancel));
        } else {
            self.outbox.clear();
        }
        self.terminal = Some(termination);
        self.phase = EnginePhase::Terminated;
        self.deadline = None;
        self.lifecycle.push(SessionLifecycle::Terminated);
        true
    }

    fn record_error(&mut self, error: ExecutionError) {
        if self.execution_error.is_none() {
            self.execution_error = Some(error);
        } else {
            self.stats.additional_errors += 1;
            tracing::warn!(error = %error, "worker reported a further error; keeping the first");
        }
    }
}

/// Whether `t` is a clean terminator, after which the request side is half-closed rather
/// than aborted (udf §2 R9, §5.2 step 4).
fn is_clean_terminal(t: &Termination) -> bool {
    matches!(
        t,
        Termination::Finished { .. } | Termination::Cancelled { .. }
    )
}

crate::worker::pump::forward_pump_core!(
    EngineCore,
    tx = UdfRequest,
    rx = UdfResponse,
    handle_recv = handle_response,
    is_settled = is_terminal,
    wants_abort = wants_abort,
);
