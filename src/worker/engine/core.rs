//! The engine side of a worker session as a sans-IO state machine (udf §4).

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;

use crate::connection::ConnectionError;
use crate::wire::{
    ExecutionError, Init, InitResponse, RequestKind, ResponseMessage, UdfRequest, UdfResponse,
};

use super::termination::{Interrupted, PeerViolation, Termination, TransportFailure, Wait};

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
/// inbound message table of udf §4.5, the Cancel choke point of §4.8 and first-wins terminal
/// settlement. It does no I/O and reads no clock: callers feed it calls and received messages,
/// take the requests it queues with [`poll_transmit`](EngineCore::poll_transmit), and tell it
/// when a deadline expired. The async [`Session`](super::Session) is a thin driver over it; the
/// property tests and fuzzers drive it directly.
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
    outbox: VecDeque<UdfRequest>,
    output: VecDeque<Bytes>,
    stats: CoreStats,
}

impl Default for EngineCore {
    fn default() -> Self {
        Self::new()
    }
}

impl EngineCore {
    /// A session in phase `Created` (udf §4.1).
    pub fn new() -> Self {
        Self {
            phase: EnginePhase::Created,
            terminal: None,
            cancel_requested: false,
            finish_sent: false,
            stream_opened: false,
            init_response: None,
            init_failed: false,
            execution_error: None,
            outbox: VecDeque::new(),
            output: VecDeque::new(),
            stats: CoreStats::default(),
        }
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

    /// Queues `Init` followed by `chunks` as `PayloadChunk`s, the final one with `last`
    /// (udf §1.3, R1). With chunks, `init.is_chunking_payload` is set to `true`.
    /// `Created → Initializing`.
    ///
    /// # Errors
    /// [`Misuse`] unless the phase is `Created`.
    pub fn start_init(
        &mut self,
        mut init: Init,
        chunks: impl IntoIterator<Item = Bytes>,
    ) -> Result<(), Misuse> {
        if self.phase != EnginePhase::Created {
            return Err(Misuse {
                call: "init",
                phase: self.phase,
            });
        }
        let chunks: Vec<Bytes> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
        if !chunks.is_empty() {
            init.is_chunking_payload = Some(true);
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

    /// Queues one `DataRequest`. Returns `Ok(false)` without queueing if a Cancel was already
    /// requested (nothing is sent after Cancel, udf §4.7).
    ///
    /// # Errors
    /// [`Misuse`] unless the phase is `Streaming` (or `Cancelling`/`Terminated`, which skip).
    pub fn send_data(&mut self, data: Bytes) -> Result<bool, Misuse> {
        match self.phase {
            EnginePhase::Streaming if !self.cancel_requested => {
                self.outbox.push_back(UdfRequest::data(data));
                Ok(true)
            }
            EnginePhase::Streaming | EnginePhase::Cancelling | EnginePhase::Terminated => {
                self.stats.skipped_after_cancel += 1;
                Ok(false)
            }
            phase => Err(Misuse {
                call: "send",
                phase,
            }),
        }
    }

    /// Queues `Finish`: `Streaming → Finishing` (udf §4.4 `beginFinish`). Returns `Ok(false)`
    /// if a Cancel was already requested or the session is terminal (the Finish is skipped).
    ///
    /// # Errors
    /// [`Misuse`] in `Created`, `Initializing` or `Finishing`.
    pub fn finish(&mut self) -> Result<bool, Misuse> {
        match self.phase {
            EnginePhase::Streaming if !self.cancel_requested => {
                self.phase = EnginePhase::Finishing;
                self.outbox.push_back(UdfRequest::finish());
                Ok(true)
            }
            EnginePhase::Streaming | EnginePhase::Cancelling | EnginePhase::Terminated => {
                self.stats.skipped_after_cancel += 1;
                Ok(false)
            }
            phase => Err(Misuse {
                call: "finish",
                phase,
            }),
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

    /// The next request to hand to the transport, if any, in the order the udf §2 rules
    /// allow. Taking `Finish` sets the finish-sent flag, after which a `FinishResponse` is
    /// legitimate (udf §4.4 `finishSendStarted`).
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<UdfRequest> {
        let req = self.outbox.pop_front()?;
        self.stream_opened = true;
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

    /// The next received `DataResponse` payload, in arrival order (udf §4.7 output queue).
    #[must_use]
    pub fn pop_output(&mut self) -> Option<Bytes> {
        self.output.pop_front()
    }

    /// How many received `DataResponse`s wait in the output queue (the depth Spark does not
    /// expose yet, udf §10 item 3).
    pub fn output_len(&self) -> usize {
        self.output.len()
    }

    /// Drops every queued output batch and returns how many there were (output no consumer
    /// will read: a close or drain waiting for the terminator, udf §5.2 step 2).
    pub fn discard_output(&mut self) -> usize {
        let n = self.output.len();
        self.output.clear();
        n
    }

    /// Feeds one message received from the worker (udf §4.5).
    pub fn handle_response(&mut self, response: UdfResponse) {
        if self.terminal.is_some() {
            self.stats.ignored_after_terminal += 1;
            tracing::debug!(kind = ?response.kind(), "ignoring a worker message after the terminal");
            return;
        }
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
                self.output.push_back(data);
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

    /// A deadline expired while waiting for `waiting_for`: settles `TransportFailed(Timeout)`
    /// (udf §4.6 step 4, §4.7, §5.2 step 3) and, if the stream is open, leaves a best-effort
    /// Cancel queued so the worker learns about it.
    pub fn handle_timeout(&mut self, waiting_for: Wait, after: Duration) {
        if self.terminal.is_some() {
            return;
        }
        let failure = TransportFailure::Timeout { waiting_for, after };
        if !self.stream_opened {
            // Nothing on the wire: no stream is opened just to cancel it.
            return self.fail(failure);
        }
        let _ = self.cancel(Some(format!("timed out waiting for {waiting_for}")));
        // Keep the queued Cancel: the driver flushes it best-effort after the terminal.
        let pending = std::mem::take(&mut self.outbox);
        self.fail(failure);
        self.outbox = pending;
    }

    /// Settles `Interrupted` (udf §4.9) unless already terminal.
    pub fn handle_interrupt(&mut self, context: &'static str, waited: Duration) {
        let _ = self.settle(Termination::Interrupted(Interrupted { context, waited }));
    }

    /// Settles `TransportFailed(failure)` unless already terminal (udf §4.4
    /// `transportFailed`).
    fn fail(&mut self, failure: TransportFailure) {
        let _ = self.settle(Termination::TransportFailed(failure));
    }

    /// First-wins settlement (udf §4.2 `completeTerminal`): returns `true` only for the call
    /// that settled. Clears queued requests. Private: every terminal is reached through an
    /// event (`handle_*`) or a call of the engine (`cancel`), so the rules that pick it live
    /// here.
    #[must_use]
    fn settle(&mut self, termination: Termination) -> bool {
        if self.terminal.is_some() {
            return false;
        }
        tracing::debug!(outcome = %termination, "worker session settled");
        self.terminal = Some(termination);
        self.phase = EnginePhase::Terminated;
        self.outbox.clear();
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
