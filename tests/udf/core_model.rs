//! Model-based tests of the engine side of a worker session (udf §4.5, §4.11).
//!
//! - [`engine_core_matches_reference_model`] drives the sans-IO [`EngineCore`] with random
//!   schedules, as a proptest-state-machine test (the reference machine [`EngineReference`],
//!   the test [`EngineCoreTest`]; depth `TETHER_MODEL_CASES`, default 512):
//!   engine calls (`start_init` with 0..3 chunks, `send_data`, `finish`, `cancel`, timeouts,
//!   interrupts, connection errors, stream end), transmit-draining steps, and worker messages
//!   from two sources: arbitrary injected responses (any kind, malformed envelopes) and a
//!   scripted echo worker (udf §2.1) whose replies the schedule delivers late, drops,
//!   reorders or repeats. After every step the core is compared with [`Model`], a reference
//!   model written from the spec (udf §2, §4.5, §4.8, §5.3) and the core's documented contract,
//!   and the invariants below are checked.
//! - [`session_over_memory_pair`] runs the async [`Session`] typestates over
//!   [`connection::pair`] against a scripted worker (any reply to any request, duplicates,
//!   malformed envelopes, early stream close, long silences) under a paused tokio clock.
//!
//! Invariants (core): one terminal once settled, and the first one never changes; the wire
//! (what `poll_transmit` hands out) starts with `Init`, has at most one `Init`, `Finish` and
//! `Cancel`, nothing after `Cancel`, chunks only directly after `Init` (the final one marked
//! `last`), no `Data`/`Finish` before an `InitResponse` was accepted, nothing but the
//! timeout's best-effort `Cancel` after the terminal; an `ErrorResponse` or
//! `InitResponse.error` is answered by a `Cancel` before anything else; every `DataResponse`
//! accepted before the terminal comes out of `pop_output`, in order; and the outcome, phase,
//! init status and recorded error equal the model's.
//!
//! Invariants (session): the handle is released exactly once and marked invalid iff the
//! outcome is unsalvageable (`TransportFailed`, `Interrupted`); `close`, the handle, the watch,
//! every `Session<Terminated>` and every read error report the same outcome; the engine's
//! connection is recorded and [`Model`] is replayed over exactly what the session sent and
//! took from it (plus the harness's init/finish/cancel/close/drop calls): the outcome must be
//! the model's, or, when nothing received settles it, a timeout or (after a drop) an
//! interrupt; the requests obey the same wire rules as above; nothing is taken from the
//! connection after the terminal; the batches read are, in order, a prefix of the batches the
//! model accepted (all of them when a read reached the end); `init` succeeds iff the model
//! accepted the `InitResponse` at that point.
//!
//! The `regression_*` tests at the end pin down, with a minimal reproducer each, the places
//! where an earlier core departed from the spec (found by this model).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tether::connection::{self, Connection, ConnectionError, MemoryConnection};
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, InitResponse, RequestKind, RequestMessage,
    UdfControlResponse, UdfRequest, UdfResponse, udf_response,
};
use tether::worker::engine::{
    CountingHandle, EngineCore, EnginePhase, InitStatus, PeerViolation, Session, SessionConfig,
    SessionError, Termination, TerminationKind, TransportFailure, Wait, WorkerHandle,
};
use tether::worker::state;
use tether_testing::fixtures;
use tether_testing::script::{Reaction, WorkerConn, WorkerScript};
use tokio::task::JoinHandle;

use crate::model_support;

/// The engine core's output bounds in the core model (`SessionConfig::output_buffer` and
/// `output_buffer_bytes`): its batches are 5 to 7 bytes (`out-N`), so two of them reach
/// the byte bound before three batches reach the count.
const OUTPUT_BUFFER: usize = 3;
const OUTPUT_BUFFER_BYTES: usize = 8;

/// Distinct lengths for the three udf §7 deadlines, so that the model can tell them apart.
fn empty_envelope() -> UdfResponse {
    UdfResponse { response: None }
}

fn empty_control() -> UdfResponse {
    UdfResponse {
        response: Some(udf_response::Response::Control(UdfControlResponse {
            control: None,
        })),
    }
}

/// Mints unique payloads and errors so that order and identity can be checked.
#[derive(Debug, Clone, Default)]
struct Ids(u32);

impl Ids {
    fn next(&mut self, prefix: &str) -> String {
        self.0 += 1;
        format!("{prefix}{}", self.0)
    }

    fn bytes(&mut self, prefix: &str) -> Bytes {
        Bytes::from(self.next(prefix))
    }

    fn error(&mut self) -> ExecutionError {
        ExecutionError::user_with_class(self.next("error-"), "ModelError")
    }

    fn finish_response(&mut self, with_error: bool) -> FinishResponse {
        let mut r = FinishResponse::default();
        r.metrics.insert("id".into(), self.next("finish-"));
        r.error = with_error.then(|| self.error());
        r
    }

    fn cancel_response(&mut self, with_error: bool) -> CancelResponse {
        let mut r = CancelResponse::default();
        r.metrics.insert("id".into(), self.next("cancel-"));
        r.error = with_error.then(|| self.error());
        r
    }

    /// A fresh worker message of `kind`: what the core schedules inject and what the
    /// scripted worker of the session model sends.
    fn response(&mut self, kind: Inject) -> UdfResponse {
        match kind {
            Inject::InitOk => UdfResponse::init(InitResponse {
                data: Some(self.bytes("init-")),
                error: None,
            }),
            Inject::InitErr => UdfResponse::init(InitResponse {
                data: None,
                error: Some(self.error()),
            }),
            Inject::Data => UdfResponse::data(self.bytes("out-")),
            Inject::Error => UdfResponse::error(self.error()),
            Inject::FinishOk => UdfResponse::finish(self.finish_response(false)),
            Inject::FinishErr => UdfResponse::finish(self.finish_response(true)),
            Inject::CancelOk => UdfResponse::cancel(self.cancel_response(false)),
            Inject::CancelErr => UdfResponse::cancel(self.cancel_response(true)),
            Inject::EmptyEnvelope => empty_envelope(),
            Inject::EmptyControl => empty_control(),
        }
    }
}

// =============================================================================================
// Reference model of the engine core
// =============================================================================================

/// A request the model expects the core to hand to the transport.
#[derive(Debug, Clone, PartialEq)]
enum Req {
    Init { chunking: bool },
    Chunk { data: Bytes, last: bool },
    Data(Bytes),
    Finish,
    Cancel,
}

impl Req {
    fn of(request: &UdfRequest) -> Option<Req> {
        Some(match request.clone().into_message().ok()? {
            RequestMessage::Init(init) => Req::Init {
                chunking: init.is_chunking_payload == Some(true),
            },
            RequestMessage::PayloadChunk(c) => Req::Chunk {
                data: c.data,
                last: c.last == Some(true),
            },
            RequestMessage::Data(d) => Req::Data(d),
            RequestMessage::Finish(_) => Req::Finish,
            RequestMessage::Cancel(_) => Req::Cancel,
        })
    }
}

/// Why a session is expected to settle `TransportFailed`.
#[derive(Debug, Clone, PartialEq)]
enum Cause {
    Violation(PeerViolation),
    Connection,
    Timeout(Wait),
}

/// A [`Termination`] reduced to what the model predicts (payloads compared by value).
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Finished {
        response: FinishResponse,
        execution_error: Option<ExecutionError>,
    },
    Cancelled {
        response: CancelResponse,
        execution_error: Option<ExecutionError>,
    },
    TransportFailed(Cause),
    Interrupted,
}

impl Outcome {
    fn observed(t: &Termination) -> Outcome {
        match t {
            Termination::Finished {
                response,
                execution_error,
            } => Outcome::Finished {
                response: response.clone(),
                execution_error: execution_error.clone(),
            },
            Termination::Cancelled {
                response,
                execution_error,
            } => Outcome::Cancelled {
                response: response.clone(),
                execution_error: execution_error.clone(),
            },
            Termination::TransportFailed(TransportFailure::Protocol(v)) => {
                Outcome::TransportFailed(Cause::Violation(v.clone()))
            }
            Termination::TransportFailed(TransportFailure::Connection(_)) => {
                Outcome::TransportFailed(Cause::Connection)
            }
            Termination::TransportFailed(TransportFailure::Timeout { waiting_for, .. }) => {
                Outcome::TransportFailed(Cause::Timeout(*waiting_for))
            }
            Termination::Interrupted(_) => Outcome::Interrupted,
            other => panic!("the engine core never settles {other:?}"),
        }
    }
}

/// What the engine side must do, written from the spec rather than from `core.rs`:
///
/// - calls (udf §4.3, §4.10 and the core's documented contract): `start_init` only in
///   `Created`; data and `Finish` only while `Streaming` (skipped once a Cancel is out);
/// - the Cancel choke point (udf §4.8): one Cancel per session; in `Created` nothing is on the
///   wire, so cancelling settles the synthetic `Cancelled` (udf §5.3 first row); otherwise unsent
///   chunks, data and Finish are dropped, a queued `Init` stays ahead of the Cancel (Cancel
///   never precedes Init, udf §4.6 step 3);
/// - inbound messages (udf §4.5): `DataResponse` before the `InitResponse` is a violation,
///   otherwise queued for the reader; the first `InitResponse` either opens the data phase
///   or, with an error, records it and cancels (R4); later ones are ignored; `ErrorResponse`
///   records the first error and cancels (R4); `FinishResponse` is legitimate only once
///   `Finish` is on the wire; `CancelResponse` settles `Cancelled` at any time; malformed
///   envelopes, stream end and connection errors settle `TransportFailed`; after the terminal
///   everything is ignored (first wins, udf §4.2);
/// - a timeout queues a best-effort Cancel and settles `TransportFailed(Timeout)` (udf §4.6 step
///   4, §5.2 step 3); an interrupt settles `Interrupted` (udf §4.9).
#[derive(Debug, Clone)]
struct Model {
    phase: EnginePhase,
    terminal: Option<Outcome>,
    cancel_requested: bool,
    /// The accepted `InitResponse` without error.
    init_ok: Option<InitResponse>,
    /// Whether an `InitResponse` (ok or error) has been taken; later ones are duplicates.
    init_answered: bool,
    /// The worker reported an error before init was accepted (udf §4.6 step 5).
    init_failed: bool,
    first_error: Option<ExecutionError>,
    finish_on_wire: bool,
    /// Whether any request has been handed to the transport (the stream exists).
    stream_opened: bool,
    outbox: VecDeque<Req>,
    output: VecDeque<Bytes>,
    data_accepted: u64,
    ignored_after_terminal: u64,
    duplicate_init_responses: u64,
    /// The shutdown deadline after the terminal expired.
    requests_abandoned: bool,
}

impl Model {
    fn new() -> Self {
        Model {
            phase: EnginePhase::Created,
            terminal: None,
            cancel_requested: false,
            init_ok: None,
            init_answered: false,
            init_failed: false,
            first_error: None,
            finish_on_wire: false,
            stream_opened: false,
            outbox: VecDeque::new(),
            output: VecDeque::new(),
            data_accepted: 0,
            ignored_after_terminal: 0,
            duplicate_init_responses: 0,
            requests_abandoned: false,
        }
    }

    fn settle(&mut self, outcome: Outcome) {
        if self.terminal.is_none() {
            self.terminal = Some(outcome);
            self.phase = EnginePhase::Terminated;
            self.outbox.clear();
        }
    }

    fn record_error(&mut self, error: ExecutionError) {
        self.first_error.get_or_insert(error);
    }

    /// udf §4.8. Returns whether a Cancel was queued.
    fn cancel(&mut self) -> bool {
        if self.terminal.is_some() || self.cancel_requested {
            return false;
        }
        self.cancel_requested = true;
        if !self.stream_opened {
            // Nothing on the wire: no stream, synthetic Cancelled (udf §5.2 step 1, §5.3).
            self.settle(Outcome::Cancelled {
                response: CancelResponse::default(),
                execution_error: None,
            });
            return false;
        }
        // The Init is already out (it is always first), so nothing unsent survives.
        self.outbox.clear();
        self.outbox.push_back(Req::Cancel);
        self.phase = EnginePhase::Cancelling;
        true
    }

    /// `Ok(())` when the call is allowed.
    fn start_init(&mut self, chunks: &[Bytes]) -> Result<(), ()> {
        if self.phase != EnginePhase::Created {
            return Err(());
        }
        self.phase = EnginePhase::Initializing;
        self.outbox.push_back(Req::Init {
            chunking: !chunks.is_empty(),
        });
        for (i, c) in chunks.iter().enumerate() {
            self.outbox.push_back(Req::Chunk {
                data: c.clone(),
                last: i + 1 == chunks.len(),
            });
        }
        Ok(())
    }

    /// `Ok(queued)` when the call is allowed.
    fn send_data(&mut self, data: Bytes) -> Result<bool, ()> {
        match self.phase {
            EnginePhase::Streaming => {
                self.outbox.push_back(Req::Data(data));
                Ok(true)
            }
            EnginePhase::Cancelling | EnginePhase::Terminated => Ok(false),
            _ => Err(()),
        }
    }

    fn finish(&mut self) -> Result<bool, ()> {
        match self.phase {
            EnginePhase::Streaming => {
                self.phase = EnginePhase::Finishing;
                self.outbox.push_back(Req::Finish);
                Ok(true)
            }
            EnginePhase::Cancelling | EnginePhase::Terminated => Ok(false),
            _ => Err(()),
        }
    }

    fn transmit(&mut self) -> Option<Req> {
        let req = self.outbox.pop_front()?;
        self.stream_opened = true;
        if req == Req::Finish {
            self.finish_on_wire = true;
        }
        Some(req)
    }

    fn timeout(&mut self, waiting_for: Wait) {
        if self.terminal.is_some() {
            return;
        }
        if !self.stream_opened {
            // No stream: nothing to cancel, nothing queued survives.
            self.settle(Outcome::TransportFailed(Cause::Timeout(waiting_for)));
            return;
        }
        self.cancel();
        let best_effort = std::mem::take(&mut self.outbox);
        self.settle(Outcome::TransportFailed(Cause::Timeout(waiting_for)));
        self.outbox = best_effort;
    }

    fn interrupt(&mut self) {
        if self.terminal.is_some() {
            return;
        }
        // The worker has not ended the session: a queued Cancel stays as a farewell.
        let farewell: VecDeque<Req> = self
            .outbox
            .iter()
            .filter(|r| **r == Req::Cancel)
            .cloned()
            .collect();
        self.settle(Outcome::Interrupted);
        self.outbox = farewell;
    }

    /// The deadline table of udf §7 for the calls this model makes (no `close`, `interrupt`
    /// or `discard_output`): the length of the deadline a wait beginning now arms, and the `Wait` its
    /// expiry reports (`None`: the shutdown deadline after the terminal, which only drops
    /// the queued farewell).
    fn deadline(&self) -> Option<(Duration, Option<Wait>)> {
        let cfg = fixtures::session_config();
        if self.terminal.is_some() {
            return (!self.requests_abandoned).then_some((cfg.interrupt_cancel_timeout, None));
        }
        if self.init_failed {
            return Some((cfg.terminal_timeout, Some(Wait::Terminator)));
        }
        match self.phase {
            EnginePhase::Created | EnginePhase::Terminated => None,
            EnginePhase::Initializing => Some((cfg.init_timeout, Some(Wait::InitResponse))),
            EnginePhase::Cancelling => Some((cfg.terminal_timeout, Some(Wait::Terminator))),
            EnginePhase::Streaming | EnginePhase::Finishing => {
                Some((cfg.terminal_timeout, Some(Wait::Output)))
            }
        }
    }

    /// The shutdown deadline after the terminal expired: the farewell is dropped.
    fn abandon_requests(&mut self) {
        self.outbox.clear();
        self.requests_abandoned = true;
    }

    fn connection_error(&mut self) {
        self.settle(Outcome::TransportFailed(Cause::Connection));
    }

    fn stream_end(&mut self) {
        self.settle(Outcome::TransportFailed(Cause::Violation(
            PeerViolation::StreamEndedWithoutTerminator,
        )));
    }

    /// udf §4.5, one row per inbound message.
    fn receive(&mut self, response: &UdfResponse) {
        if self.terminal.is_some() {
            self.ignored_after_terminal += 1;
            return;
        }
        if !self.stream_opened {
            // A worker cannot answer a stream that does not exist yet.
            return self.settle(Outcome::TransportFailed(Cause::Violation(
                PeerViolation::ResponseBeforeInit,
            )));
        }
        let message = match response.clone().into_message() {
            Ok(m) => m,
            Err(e) => {
                return self.settle(Outcome::TransportFailed(Cause::Violation(
                    PeerViolation::Malformed(e),
                )));
            }
        };
        match message {
            tether::wire::ResponseMessage::Data(data) => {
                // R2, udf §4.10: in every phase, also once cancelling.
                if self.init_ok.is_none() {
                    self.settle(Outcome::TransportFailed(Cause::Violation(
                        PeerViolation::DataBeforeInitResponse,
                    )));
                } else {
                    self.data_accepted += 1;
                    self.output.push_back(data);
                }
            }
            tether::wire::ResponseMessage::Init(resp) => {
                if self.init_answered || self.init_failed {
                    self.duplicate_init_responses += 1;
                    return;
                }
                self.init_answered = true;
                match resp.error.clone() {
                    Some(error) => {
                        self.record_error(error);
                        self.init_failed = true;
                        self.cancel();
                    }
                    None => {
                        if self.phase == EnginePhase::Initializing {
                            self.phase = EnginePhase::Streaming;
                        }
                        self.init_ok = Some(*resp);
                    }
                }
            }
            tether::wire::ResponseMessage::Error(err) => {
                self.record_error(err.error.unwrap_or_default());
                if self.init_ok.is_none() {
                    self.init_failed = true;
                }
                self.cancel();
            }
            tether::wire::ResponseMessage::Finish(response) => {
                if self.finish_on_wire {
                    let execution_error = self.first_error.clone();
                    self.settle(Outcome::Finished {
                        response: *response,
                        execution_error,
                    });
                } else {
                    self.settle(Outcome::TransportFailed(Cause::Violation(
                        PeerViolation::FinishResponseBeforeFinish,
                    )));
                }
            }
            tether::wire::ResponseMessage::Cancel(response) => {
                let execution_error = self.first_error.clone();
                self.settle(Outcome::Cancelled {
                    response: *response,
                    execution_error,
                });
            }
        }
    }

    /// udf §4.6 step 5, as the driver needs it.
    fn init_status(&self) -> InitStatus {
        if self.init_failed || (self.init_ok.is_some() && self.first_error.is_some()) {
            InitStatus::Failed
        } else if self.terminal.is_some() {
            InitStatus::Terminated
        } else if self.init_ok.is_some() {
            InitStatus::Accepted
        } else {
            InitStatus::Pending
        }
    }
}

// =============================================================================================
// Scripted echo worker (udf §2.1) for the core schedules
// =============================================================================================

#[derive(Debug, Clone, Copy)]
struct Personality {
    /// Answer init with `InitResponse.error` (the reference worker's `INIT_ERROR` payload).
    init_fails: bool,
    /// Answer the n-th `DataRequest` with an `ErrorResponse` (its `"ERROR"` batch).
    fail_on_data: Option<u8>,
    /// Put an error into the terminator's callback-error field.
    callback_error: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum EchoState {
    AwaitingInit,
    AwaitingChunks,
    Data(u8),
    PostError,
    Done,
}

/// The reference worker of udf §2.1: its replies queue up in `pending`, and the schedule
/// decides when (and whether, and in which order) the engine receives them.
#[derive(Debug, Clone)]
struct EchoWorker {
    personality: Personality,
    state: EchoState,
    pending: VecDeque<UdfResponse>,
}

impl EchoWorker {
    fn new(personality: Personality) -> Self {
        EchoWorker {
            personality,
            state: EchoState::AwaitingInit,
            pending: VecDeque::new(),
        }
    }

    fn finalize_init(&mut self, ids: &mut Ids) {
        if self.personality.init_fails {
            self.state = EchoState::PostError;
            self.pending.push_back(UdfResponse::init(InitResponse {
                data: None,
                error: Some(ids.error()),
            }));
        } else {
            self.state = EchoState::Data(0);
            self.pending
                .push_back(UdfResponse::init(InitResponse::default()));
        }
    }

    /// Takes one request the engine transmitted (as the model predicted it: the test side
    /// checks that the core sent exactly that).
    fn receive(&mut self, request: &Req, ids: &mut Ids) {
        match (self.state, request) {
            (EchoState::Done, _) => {}
            (_, Req::Cancel) => {
                self.state = EchoState::Done;
                let r = ids.cancel_response(self.personality.callback_error);
                self.pending.push_back(UdfResponse::cancel(r));
            }
            (EchoState::AwaitingInit, Req::Init { chunking }) => {
                if *chunking {
                    self.state = EchoState::AwaitingChunks;
                } else {
                    self.finalize_init(ids);
                }
            }
            (EchoState::AwaitingChunks, Req::Chunk { last, .. }) => {
                if *last {
                    self.finalize_init(ids);
                }
            }
            (EchoState::Data(n), Req::Data(d)) => {
                if self.personality.fail_on_data == Some(n) {
                    self.state = EchoState::PostError;
                    self.pending.push_back(UdfResponse::error(ids.error()));
                } else {
                    self.state = EchoState::Data(n.saturating_add(1));
                    self.pending.push_back(UdfResponse::data(d.clone()));
                }
            }
            (EchoState::Data(_), Req::Finish) => {
                self.state = EchoState::Done;
                let r = ids.finish_response(self.personality.callback_error);
                self.pending.push_back(UdfResponse::finish(r));
            }
            (EchoState::PostError, Req::Finish) => {}
            _ => self.protocol_error_close(ids),
        }
    }

    fn protocol_error_close(&mut self, ids: &mut Ids) {
        self.state = EchoState::Done;
        let msg = ids.next("protocol-");
        self.pending
            .push_back(UdfResponse::error(ExecutionError::protocol(msg)));
        let r = ids.cancel_response(false);
        self.pending.push_back(UdfResponse::cancel(r));
    }
}

// =============================================================================================
// Core schedules
// =============================================================================================

/// An arbitrary worker message, injected straight into `handle_response`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Inject {
    InitOk,
    InitErr,
    Data,
    Error,
    FinishOk,
    FinishErr,
    CancelOk,
    CancelErr,
    EmptyEnvelope,
    EmptyControl,
}

#[derive(Debug, Clone)]
enum Op {
    /// `start_init` with this chunk size (`None`: the payload inline).
    StartInit(Option<usize>),
    SendData,
    Finish,
    Cancel,
    /// A wait begins, and time moves to its deadline (if the core armed one).
    Timeout,
    Interrupt,
    ConnectionError,
    StreamEnd,
    /// Hand up to n queued requests to the transport (the echo worker reads them).
    Transmit(usize),
    PopOutput,
    Inject(Inject),
    /// Deliver the echo worker's next reply.
    Deliver,
    /// Deliver the last delivered message again (a duplicate).
    Repeat,
    /// Lose the echo worker's next reply.
    DropReply,
    /// Swap the echo worker's next two replies.
    Reorder,
}

fn inject_strategy() -> impl Strategy<Value = Inject> {
    prop_oneof![
        3 => Just(Inject::InitOk),
        1 => Just(Inject::InitErr),
        3 => Just(Inject::Data),
        2 => Just(Inject::Error),
        1 => Just(Inject::FinishOk),
        1 => Just(Inject::FinishErr),
        1 => Just(Inject::CancelOk),
        1 => Just(Inject::CancelErr),
        1 => Just(Inject::EmptyEnvelope),
        1 => Just(Inject::EmptyControl),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => prop::option::weighted(0.6, 1usize..=4).prop_map(Op::StartInit),
        6 => Just(Op::SendData),
        3 => Just(Op::Finish),
        1 => Just(Op::Cancel),
        1 => Just(Op::Timeout),
        1 => Just(Op::Interrupt),
        1 => Just(Op::ConnectionError),
        1 => Just(Op::StreamEnd),
        8 => (1usize..=4).prop_map(Op::Transmit),
        4 => Just(Op::PopOutput),
        4 => inject_strategy().prop_map(Op::Inject),
        10 => Just(Op::Deliver),
        1 => Just(Op::Repeat),
        1 => Just(Op::DropReply),
        1 => Just(Op::Reorder),
    ]
}

fn personality_strategy() -> impl Strategy<Value = Personality> {
    (
        prop::bool::weighted(0.15),
        prop::option::weighted(0.3, 0u8..4),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(init_fails, fail_on_data, callback_error)| Personality {
            init_fails,
            fail_on_data,
            callback_error,
        })
}

/// The opening `start_init` most schedules begin with (`None`: none forced), and the worker.
fn initial_strategy() -> impl Strategy<Value = EngineRef> {
    (
        personality_strategy(),
        prop::option::weighted(0.85, prop::option::weighted(0.6, 1usize..=4)),
    )
        .prop_map(|(personality, first_init)| EngineRef {
            first_init,
            model: Model::new(),
            worker: EchoWorker::new(personality),
            ids: Ids::default(),
            last_delivered: None,
            accepted: Vec::new(),
            expect: Expect::Nothing,
        })
}

/// What the reference machine predicts for the transition it has just applied; the test
/// side compares the core's answer with it.
#[derive(Debug, Clone)]
enum Expect {
    /// No answer to compare (an event the core only absorbs, or nothing to deliver).
    Nothing,
    /// `start_init` is allowed.
    StartInit(bool),
    /// The batch handed to `send_data`, and its result.
    SendData(Bytes, Result<bool, ()>),
    Finish(Result<bool, ()>),
    Cancel(bool),
    /// The deadline a wait beginning now arms (udf §7), see [`Model::deadline`].
    Timeout(Option<(Duration, Option<Wait>)>),
    /// The requests the transport gets, in order (fewer than asked: then the core has none).
    Transmit(Vec<Req>),
    PopOutput(Option<Bytes>),
    /// A worker message delivered; whether it reports an error the engine must answer
    /// with a Cancel (udf §2 R4).
    Deliver {
        response: UdfResponse,
        reports_error: bool,
    },
}

/// The reference state: the model of the engine core, the echo worker that answers what the
/// model says the core transmits, the id source, and the prediction of the last step.
#[derive(Debug, Clone)]
struct EngineRef {
    /// The opening `start_init`, until the first transition.
    first_init: Option<Option<usize>>,
    model: Model,
    worker: EchoWorker,
    ids: Ids,
    last_delivered: Option<UdfResponse>,
    /// Every `DataResponse` the model accepted, in order: what must come out of the core's
    /// `pop_output`, each exactly once.
    accepted: Vec<Bytes>,
    expect: Expect,
}

impl EngineRef {
    fn deliver(&mut self, response: UdfResponse) {
        // The first InitResponse is taken; later ones are ignored (udf §10 gap 13).
        let first_init = !self.model.init_answered && !self.model.init_failed;
        let reports_error = match response.clone().into_message() {
            Ok(tether::wire::ResponseMessage::Error(_)) => true,
            Ok(tether::wire::ResponseMessage::Init(r)) => r.error.is_some() && first_init,
            _ => false,
        };
        let before = self.model.data_accepted;
        self.model.receive(&response);
        if self.model.data_accepted > before {
            self.accepted
                .push(self.model.output.back().cloned().unwrap_or_default());
        }
        self.last_delivered = Some(response.clone());
        self.expect = Expect::Deliver {
            response,
            reports_error,
        };
    }

    fn injected(&mut self, kind: Inject) -> UdfResponse {
        self.ids.response(kind)
    }
}

/// The reference state machine of [`EngineCore`] (udf §2, §4.5, §4.8, §5.3, §7).
struct EngineReference;

impl ReferenceStateMachine for EngineReference {
    type State = EngineRef;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<EngineRef> {
        initial_strategy().boxed()
    }

    fn transitions(state: &EngineRef) -> BoxedStrategy<Op> {
        match state.first_init {
            Some(chunk_size) => Just(Op::StartInit(chunk_size)).boxed(),
            None => op_strategy().boxed(),
        }
    }

    fn apply(mut r: EngineRef, op: &Op) -> EngineRef {
        r.first_init = None;
        r.expect = Expect::Nothing;
        match op {
            Op::StartInit(chunk_size) => {
                // The core cuts the payload (R1): pieces of at most `chunk_size` bytes.
                let payload = fixtures::init("udf")
                    .udf
                    .map(|u| u.payload)
                    .unwrap_or_default();
                let sent: Vec<Bytes> = match chunk_size {
                    Some(n) => payload.chunks(*n).map(Bytes::copy_from_slice).collect(),
                    None => Vec::new(),
                };
                r.expect = Expect::StartInit(r.model.start_init(&sent).is_ok());
            }
            Op::SendData => {
                let data = r.ids.bytes("in-");
                let result = r.model.send_data(data.clone());
                r.expect = Expect::SendData(data, result);
            }
            Op::Finish => r.expect = Expect::Finish(r.model.finish()),
            Op::Cancel => r.expect = Expect::Cancel(r.model.cancel()),
            Op::Timeout => {
                let expected = r.model.deadline();
                match expected {
                    Some((_, Some(waiting_for))) => r.model.timeout(waiting_for),
                    Some((_, None)) => r.model.abandon_requests(),
                    None => {}
                }
                r.expect = Expect::Timeout(expected);
            }
            Op::Interrupt => r.model.interrupt(),
            Op::ConnectionError => r.model.connection_error(),
            Op::StreamEnd => r.model.stream_end(),
            Op::Transmit(n) => {
                let mut sent = Vec::new();
                while sent.len() < *n {
                    let Some(req) = r.model.transmit() else { break };
                    r.worker.receive(&req, &mut r.ids);
                    sent.push(req);
                }
                r.expect = Expect::Transmit(sent);
            }
            Op::PopOutput => r.expect = Expect::PopOutput(r.model.output.pop_front()),
            Op::Inject(kind) => {
                let response = r.injected(*kind);
                r.deliver(response);
            }
            Op::Deliver => {
                if let Some(response) = r.worker.pending.pop_front() {
                    r.deliver(response);
                }
            }
            Op::Repeat => {
                if let Some(response) = r.last_delivered.clone() {
                    r.deliver(response);
                }
            }
            Op::DropReply => {
                r.worker.pending.pop_front();
            }
            Op::Reorder => {
                if r.worker.pending.len() >= 2 {
                    r.worker.pending.swap(0, 1);
                }
            }
        }
        r
    }
}

/// The system under test: the core, its manual clock, and what it transmitted and output.
struct EngineSut {
    core: EngineCore,
    /// The manual clock of the core's deadlines.
    now: std::time::Instant,
    wire: Vec<Req>,
    first_terminal: Option<Outcome>,
    /// Wire length when a worker error was taken: from there only `Cancel` (behind a
    /// still-queued `Init`) may go out.
    cancel_due_from: Option<usize>,
    /// Every batch `pop_output` handed out, in order.
    popped: Vec<Bytes>,
}

/// Turns a failed check into the panic the state-machine runner reports and shrinks.
fn or_panic(result: Result<(), TestCaseError>) {
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Counts, value by value, what `accepted` holds that `popped` lacks (lost) and what
/// `popped` holds beyond `accepted` (duplicated).
fn lost_and_duplicated(accepted: &[Bytes], popped: &[Bytes]) -> (u64, u64) {
    let mut balance: std::collections::HashMap<&Bytes, i64> = std::collections::HashMap::new();
    for b in accepted {
        *balance.entry(b).or_default() += 1;
    }
    for b in popped {
        *balance.entry(b).or_default() -= 1;
    }
    let lost = balance
        .values()
        .filter(|v| **v > 0)
        .map(|v| *v as u64)
        .sum();
    let duplicated = balance
        .values()
        .filter(|v| **v < 0)
        .map(|v| v.unsigned_abs())
        .sum();
    (lost, duplicated)
}

/// Every batch of every case of [`engine_core_matches_reference_model`].
static ENGINE_OUTPUT: model_support::Tally = model_support::Tally::new();

impl EngineSut {
    fn step(&mut self, r: &EngineRef, op: &Op) -> Result<(), TestCaseError> {
        match (op, &r.expect) {
            (Op::StartInit(chunk_size), Expect::StartInit(allowed)) => {
                let actual = self.core.start_init(fixtures::init("udf"), *chunk_size);
                prop_assert_eq!(actual.is_ok(), *allowed, "start_init allowed");
            }
            (Op::SendData, Expect::SendData(data, expected)) => {
                let actual = self.core.send_data(data.clone()).map_err(|_| ());
                prop_assert_eq!(actual, *expected, "send_data");
            }
            (Op::Finish, Expect::Finish(expected)) => {
                let actual = self.core.finish().map_err(|_| ());
                prop_assert_eq!(actual, *expected, "finish");
            }
            (Op::Cancel, Expect::Cancel(expected)) => {
                let actual = self.core.cancel(Some("model cancel".into()));
                prop_assert_eq!(actual, *expected, "cancel");
            }
            (Op::Timeout, Expect::Timeout(expected)) => {
                let now = self.now;
                self.core.begin_wait(now);
                let at = self.core.poll_timeout();
                prop_assert_eq!(
                    at.map(|at| at - now),
                    expected.map(|(after, _)| after),
                    "the deadline armed for a wait beginning now (udf §7)"
                );
                if let Some(at) = at {
                    let before = self.core.terminal().map(Outcome::observed);
                    self.core.handle_timeout(at - Duration::from_millis(1));
                    prop_assert_eq!(
                        self.core.terminal().map(Outcome::observed),
                        before,
                        "nothing expires a millisecond early"
                    );
                    prop_assert_eq!(self.core.poll_timeout(), Some(at));
                    self.now = at;
                    self.core.handle_timeout(at);
                }
            }
            (Op::Interrupt, Expect::Nothing) => {
                self.core
                    .handle_interrupt("model interrupt", Duration::ZERO);
            }
            (Op::ConnectionError, Expect::Nothing) => {
                self.core
                    .handle_connection_error(ConnectionError::transport("model connection error"));
            }
            (Op::StreamEnd, Expect::Nothing) => self.core.handle_stream_end(),
            (Op::Transmit(n), Expect::Transmit(expected)) => {
                for i in 0..*n {
                    if !self.transmit_one(r, expected.get(i).cloned())? {
                        break;
                    }
                }
            }
            (Op::PopOutput, Expect::PopOutput(expected)) => {
                let got = self.core.pop_output();
                self.popped.extend(got.clone());
                prop_assert_eq!(got, expected.clone(), "pop_output");
            }
            (
                Op::Inject(_) | Op::Deliver | Op::Repeat,
                Expect::Deliver {
                    response,
                    reports_error,
                },
            ) => self.deliver(r, response.clone(), *reports_error)?,
            (Op::Deliver | Op::Repeat | Op::DropReply | Op::Reorder, Expect::Nothing) => {}
            (op, expect) => panic!("the reference predicted {expect:?} for {op:?}"),
        }
        self.check(r)
    }

    /// Hands one request to the transport; checks it against the model's `expected` and
    /// the wire rules.
    fn transmit_one(
        &mut self,
        r: &EngineRef,
        expected: Option<Req>,
    ) -> Result<bool, TestCaseError> {
        let terminal_before = self.core.terminal().map(Outcome::observed);
        let Some(request) = self.core.poll_transmit() else {
            prop_assert_eq!(None, expected, "the core has nothing to transmit");
            return Ok(false);
        };
        let req = Req::of(&request);
        prop_assert!(req.is_some(), "the engine sent a malformed request");
        let req = req.unwrap_or(Req::Cancel);
        prop_assert_eq!(Some(req.clone()), expected, "transmitted request");
        // No Data/Finish before an InitResponse was accepted (R3).
        if matches!(req, Req::Data(_) | Req::Finish) {
            prop_assert!(
                r.model.init_ok.is_some(),
                "{:?} before the InitResponse",
                req
            );
        }
        // After the terminal only a timeout's or an interrupt's best-effort Cancel (behind its
        // Init) goes out.
        if let Some(t) = terminal_before {
            prop_assert!(
                matches!(
                    t,
                    Outcome::TransportFailed(Cause::Timeout(_)) | Outcome::Interrupted
                ) && matches!(req, Req::Init { .. } | Req::Cancel),
                "{:?} transmitted after the terminal {:?}",
                req,
                t
            );
        }
        if self.cancel_due_from.is_some() {
            prop_assert!(
                matches!(req, Req::Init { .. } | Req::Cancel),
                "{:?} transmitted after a worker error instead of Cancel",
                req
            );
        }
        self.wire.push(req);
        check_wire(&self.wire)?;
        Ok(true)
    }

    fn deliver(
        &mut self,
        r: &EngineRef,
        response: UdfResponse,
        reports_error: bool,
    ) -> Result<(), TestCaseError> {
        let live_stream = !self.core.is_terminal() && self.core.phase() != EnginePhase::Created;
        self.core.handle_response(response);
        // R4: a worker error is answered by a Cancel (unless the session ended on it).
        if reports_error && live_stream && !self.core.is_terminal() {
            prop_assert!(
                self.core.cancel_requested(),
                "no Cancel after a worker error"
            );
            let cancel_out =
                self.wire.contains(&Req::Cancel) || r.model.outbox.back() == Some(&Req::Cancel);
            prop_assert!(cancel_out, "no Cancel queued after a worker error");
            self.cancel_due_from.get_or_insert(self.wire.len());
        }
        Ok(())
    }

    /// Compares the core with the model; checks first-wins.
    fn check(&mut self, r: &EngineRef) -> Result<(), TestCaseError> {
        let core = &self.core;
        let model = &r.model;
        let terminal = core.terminal().map(Outcome::observed);
        prop_assert_eq!(&terminal, &model.terminal, "terminal");
        if let Some(first) = &self.first_terminal {
            prop_assert_eq!(terminal.as_ref(), Some(first), "the first terminal changed");
        } else {
            self.first_terminal = terminal;
        }
        prop_assert_eq!(core.is_terminal(), model.terminal.is_some());
        prop_assert_eq!(core.phase(), model.phase, "phase");
        prop_assert_eq!(core.cancel_requested(), model.cancel_requested, "cancel");
        prop_assert_eq!(core.finish_sent(), model.finish_on_wire, "finish sent");
        prop_assert_eq!(
            core.execution_error(),
            model.first_error.as_ref(),
            "recorded error"
        );
        prop_assert_eq!(core.init_response(), model.init_ok.as_ref(), "InitResponse");
        prop_assert_eq!(core.init_status(), model.init_status(), "init status");
        prop_assert_eq!(core.output_len(), model.output.len(), "output queue");
        let output_bytes: usize = model.output.iter().map(Bytes::len).sum();
        prop_assert_eq!(core.output_bytes(), output_bytes, "output bytes");
        prop_assert_eq!(
            core.wants_recv(),
            model.terminal.is_none()
                && (model.output.is_empty()
                    || (model.output.len() < OUTPUT_BUFFER && output_bytes < OUTPUT_BUFFER_BYTES)),
            "wants_recv (backpressure to the worker: batches and bytes)"
        );
        prop_assert_eq!(
            core.has_transmit(),
            !model.outbox.is_empty(),
            "queued requests"
        );
        let stats = core.stats();
        prop_assert_eq!(stats.data_received, model.data_accepted);
        prop_assert_eq!(stats.ignored_after_terminal, model.ignored_after_terminal);
        prop_assert_eq!(
            stats.duplicate_init_responses,
            model.duplicate_init_responses
        );
        let data_on_wire = self
            .wire
            .iter()
            .filter(|r| matches!(r, Req::Data(_)))
            .count();
        prop_assert_eq!(stats.data_sent, data_on_wire as u64);
        if core.init_status() == InitStatus::Accepted && !core.cancel_requested() {
            // What `Session::init` relies on when it hands out `Session<Streaming>`.
            prop_assert!(
                matches!(
                    core.phase(),
                    EnginePhase::Streaming | EnginePhase::Finishing
                ),
                "init accepted but phase {:?}",
                core.phase()
            );
        }
        Ok(())
    }

    /// Drains everything, then checks delivery (every accepted batch out of `pop_output`
    /// exactly once, in order) and that nothing can displace the terminal.
    fn finish_run(&mut self, mut r: EngineRef) -> Result<(), TestCaseError> {
        loop {
            let expected = r.model.transmit();
            if !self.transmit_one(&r, expected)? {
                break;
            }
        }
        let mut delivered = Vec::new();
        while let Some(b) = self.core.pop_output() {
            delivered.push(b);
        }
        self.popped.extend(delivered.iter().cloned());
        let expected: Vec<Bytes> = r.model.output.drain(..).collect();
        prop_assert_eq!(delivered, expected, "accepted output, in order");
        self.check(&r)?;
        if let Some(first) = self.first_terminal.clone() {
            self.core.handle_interrupt("late", Duration::ZERO);
            self.core.handle_connection_error(ConnectionError::Closed);
            self.core.handle_stream_end();
            self.core
                .handle_response(UdfResponse::cancel(CancelResponse::default()));
            self.core.begin_wait(self.now);
            self.core
                .handle_timeout(self.now + Duration::from_secs(3600));
            let now = self.core.terminal().map(Outcome::observed);
            prop_assert_eq!(now, Some(first), "late events displaced the terminal");
            prop_assert_eq!(self.core.poll_transmit(), None, "sent after the terminal");
            prop_assert_eq!(self.core.pop_output(), None, "output after the terminal");
        }
        let (lost, duplicated) = lost_and_duplicated(&r.accepted, &self.popped);
        ENGINE_OUTPUT.record("batches", self.popped.len() as u64, lost, duplicated);
        prop_assert_eq!(
            &self.popped,
            &r.accepted,
            "every accepted batch once, in order"
        );
        Ok(())
    }
}

/// The state-machine test of [`EngineCore`] against [`EngineReference`].
struct EngineCoreTest;

impl StateMachineTest for EngineCoreTest {
    type SystemUnderTest = EngineSut;
    type Reference = EngineReference;

    fn init_test(r: &EngineRef) -> EngineSut {
        let mut sut = EngineSut {
            core: EngineCore::new(&SessionConfig {
                output_buffer: OUTPUT_BUFFER,
                output_buffer_bytes: OUTPUT_BUFFER_BYTES,
                ..fixtures::session_config()
            }),
            now: std::time::Instant::now(),
            wire: Vec::new(),
            first_terminal: None,
            cancel_due_from: None,
            popped: Vec::new(),
        };
        or_panic(sut.check(r));
        sut
    }

    fn apply(mut sut: EngineSut, r: &EngineRef, op: Op) -> EngineSut {
        or_panic(sut.step(r, &op));
        sut
    }

    fn teardown(mut sut: EngineSut, r: EngineRef) {
        or_panic(sut.finish_run(r));
    }
}

#[test]
fn engine_core_matches_reference_model() {
    model_support::run::<EngineCoreTest>(
        "engine core (EngineCore)",
        "batches",
        512,
        1..49,
        &ENGINE_OUTPUT,
    );
}

/// Runs one generated schedule and returns the end states (for the coverage check).
fn replay(initial: EngineRef, ops: &[Op]) -> (EngineSut, EngineRef) {
    let mut r = initial;
    let mut sut = EngineCoreTest::init_test(&r);
    for op in ops {
        r = EngineReference::apply(r, op);
        sut = EngineCoreTest::apply(sut, &r, op.clone());
    }
    (sut, r)
}

/// The schedules reach the interesting outcomes (guards against a generator that only ever
/// produces early failures).
#[test]
fn core_schedules_cover_every_outcome() {
    let mut seen = std::collections::BTreeSet::new();
    let mut chunked_init_answered = false;
    let schedules = model_support::samples(EngineReference::sequential_strategy(1..49), 512);
    for (initial, ops, _) in schedules {
        let (sut, r) = replay(initial, &ops);
        if let Some(t) = sut.core.terminal() {
            seen.insert(format!("{:?}", t.kind()));
        }
        chunked_init_answered |= sut
            .wire
            .iter()
            .any(|r| matches!(r, Req::Chunk { last: true, .. }))
            && r.model.init_ok.is_some();
    }
    for kind in ["Finished", "Cancelled", "TransportFailed", "Interrupted"] {
        assert!(seen.contains(kind), "no schedule settled {kind}: {seen:?}");
    }
    assert!(chunked_init_answered, "no chunked init was ever accepted");
}

/// Rules on the transmitted sequence alone (udf §2, R1, R3, §4.8).
fn check_wire(wire: &[Req]) -> Result<(), TestCaseError> {
    let count = |f: fn(&Req) -> bool| wire.iter().filter(|r| f(r)).count();
    prop_assert!(
        matches!(wire.first(), None | Some(Req::Init { .. })),
        "the stream must open with Init: {:?}",
        wire
    );
    prop_assert!(count(|r| matches!(r, Req::Init { .. })) <= 1, "Init twice");
    prop_assert!(count(|r| *r == Req::Finish) <= 1, "Finish twice");
    prop_assert!(count(|r| *r == Req::Cancel) <= 1, "Cancel twice");
    if let Some(at) = wire.iter().position(|r| *r == Req::Cancel) {
        prop_assert_eq!(
            at + 1,
            wire.len(),
            "something sent after Cancel: {:?}",
            wire
        );
    }
    if let Some(at) = wire.iter().position(|r| *r == Req::Finish) {
        prop_assert!(
            !wire[at..].iter().any(|r| matches!(r, Req::Data(_))),
            "Data after Finish"
        );
    }
    // Chunks: a block right after a chunking Init, only the final one marked `last`.
    let chunking = matches!(wire.first(), Some(Req::Init { chunking: true }));
    let block = wire
        .iter()
        .skip(1)
        .take_while(|r| matches!(r, Req::Chunk { .. }))
        .count();
    prop_assert_eq!(
        count(|r| matches!(r, Req::Chunk { .. })),
        block,
        "chunk outside the block after Init: {:?}",
        wire
    );
    prop_assert!(chunking || block == 0, "chunks after a non-chunking Init");
    for (i, c) in wire.iter().skip(1).take(block).enumerate() {
        if let Req::Chunk { last, .. } = c {
            prop_assert!(!*last || i + 1 == block, "`last` on a non-final chunk");
        }
    }
    if let Some(next) = wire.get(1 + block)
        && chunking
        && *next != Req::Cancel
    {
        prop_assert!(
            matches!(wire.get(block), Some(Req::Chunk { last: true, .. })),
            "{:?} after an unfinished chunked payload",
            next
        );
    }
    Ok(())
}

// =============================================================================================
// The async Session over an in-memory pair, against a scripted worker
// =============================================================================================

/// What the engine side of the connection saw, in order, plus the harness's calls.
#[derive(Debug, Clone)]
enum Ev {
    /// A request the session handed to the connection.
    Sent(UdfRequest),
    /// A response the session took from the connection.
    Recv(UdfResponse),
    /// The worker's side of the stream ended.
    RecvEnd,
    /// The connection reported an error.
    ConnError,
    /// `init` / `init_chunked` was called.
    InitCalled,
    /// `init` returned: accepted or not.
    InitReturned(bool),
    FinishCalled,
    /// `cancel`, `close` or a drop (the drop-cleanup cancels): the core's Cancel choke point.
    CancelCalled,
    CloseCalled,
    Dropped,
}

type EvLog = Arc<Mutex<Vec<Ev>>>;

fn push(log: &EvLog, ev: Ev) {
    log.lock().expect("log").push(ev);
}

/// The engine's connection: a memory pair end that records what the session moves through
/// it (a `Sink` + `Stream`, so a `Connection` through the blanket impl).
#[derive(Debug)]
struct Recorded {
    inner: MemoryConnection<UdfRequest, UdfResponse>,
    log: EvLog,
}

impl Recorded {
    fn note<T>(&self, r: &std::task::Poll<Result<T, ConnectionError>>) {
        if let std::task::Poll::Ready(Err(_)) = r {
            push(&self.log, Ev::ConnError);
        }
    }
}

impl futures::Sink<UdfRequest> for Recorded {
    type Error = ConnectionError;

    fn poll_ready(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectionError>> {
        let this = self.get_mut();
        let r = Connection::poll_ready(&mut this.inner, cx);
        this.note(&r);
        r
    }

    fn start_send(self: std::pin::Pin<&mut Self>, item: UdfRequest) -> Result<(), ConnectionError> {
        let this = self.get_mut();
        let copy = item.clone();
        let r = Connection::start_send(&mut this.inner, item);
        push(
            &this.log,
            if r.is_ok() {
                Ev::Sent(copy)
            } else {
                Ev::ConnError
            },
        );
        r
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectionError>> {
        let this = self.get_mut();
        let r = Connection::poll_flush(&mut this.inner, cx);
        this.note(&r);
        r
    }

    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectionError>> {
        // The session ignores half-close errors; so does the replay.
        Connection::poll_close(&mut self.get_mut().inner, cx)
    }
}

impl futures::Stream for Recorded {
    type Item = Result<UdfResponse, ConnectionError>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        let r = Connection::poll_recv(&mut this.inner, cx);
        match &r {
            Poll::Ready(Some(Ok(m))) => push(&this.log, Ev::Recv(m.clone())),
            Poll::Ready(Some(Err(_))) => push(&this.log, Ev::ConnError),
            Poll::Ready(None) => push(&this.log, Ev::RecvEnd),
            Poll::Pending => {}
        }
        r
    }
}

type EngineConn = Recorded;

/// One thing the scripted worker does in reaction to a request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reply {
    /// Send a fresh message of this kind.
    Send(Inject),
    /// Echo the request's data (fresh data for other requests).
    Echo,
    /// Abort the connection (a crashed worker).
    Close,
    /// Stay silent this long (seconds of the paused clock).
    Pause(u64),
}

/// The worker's reactions: to `Init` (or to the last chunk), to each `DataRequest` (cycled),
/// to `Finish` and to `Cancel`.
#[derive(Debug, Clone)]
struct Script {
    on_init: Vec<Reply>,
    on_data: Vec<Vec<Reply>>,
    on_finish: Vec<Reply>,
    on_cancel: Vec<Reply>,
}

impl Script {
    fn echo() -> Self {
        Script {
            on_init: vec![Reply::Send(Inject::InitOk)],
            on_data: vec![vec![Reply::Echo]],
            on_finish: vec![Reply::Send(Inject::FinishOk)],
            on_cancel: vec![Reply::Send(Inject::CancelOk)],
        }
    }
}

/// Spawns the scripted worker on `worker`: each request's reactions from `script`, as a
/// [`WorkerScript`] reacting to it (fresh ids for every payload, error and metrics map).
fn run_worker(worker: WorkerConn, script: Script) -> JoinHandle<Vec<RequestKind>> {
    let mut ids = Ids::default();
    let mut data_index = 0usize;
    WorkerScript::new(worker).spawn_reacting(move |request| {
        let (replies, echo) = match request {
            RequestMessage::Init(init) if init.is_chunking_payload != Some(true) => {
                (script.on_init.clone(), None)
            }
            RequestMessage::PayloadChunk(c) if c.last == Some(true) => {
                (script.on_init.clone(), None)
            }
            RequestMessage::Data(d) => {
                let r = script.on_data[data_index % script.on_data.len()].clone();
                data_index += 1;
                (r, Some(d))
            }
            RequestMessage::Finish(_) => (script.on_finish.clone(), None),
            RequestMessage::Cancel(_) => (script.on_cancel.clone(), None),
            _ => (Vec::new(), None),
        };
        replies
            .into_iter()
            .map(|reply| match reply {
                Reply::Pause(secs) => Reaction::Pause(Duration::from_secs(secs)),
                Reply::Close => Reaction::Abort,
                Reply::Echo => Reaction::Send(match &echo {
                    Some(data) => UdfResponse::data(data.clone()),
                    None => ids.response(Inject::Data),
                }),
                Reply::Send(kind) => Reaction::Send(ids.response(kind)),
            })
            .collect()
    })
}

#[derive(Debug, Clone, Copy)]
enum InitPlan {
    /// Never call `init` (close or drop a `Session<Init>`).
    Skip,
    Plain,
    /// `init_chunked` with this chunk size.
    Chunked(usize),
    /// `init` under a short deadline: the future (and the session) is dropped mid-await.
    Abandoned,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Send,
    Recv,
    Finish,
    Cancel,
    Wait,
    Close,
    Drop,
    Sleep(u64),
    /// `recv` under a short deadline: the future (and the session) is dropped mid-await.
    Abandon,
    /// `send` under a short deadline, likewise.
    AbandonSend,
    /// `process` with this many input batches, read to the end, then `ProcessStream::close`.
    Process(u8),
}

#[derive(Debug, Clone)]
struct Plan {
    init: InitPlan,
    steps: Vec<Step>,
    /// `SessionConfig::output_buffer` and the pair's per-direction capacity (backpressure).
    bounds: (usize, usize),
}

fn reply_strategy() -> impl Strategy<Value = Reply> {
    prop_oneof![
        3 => Just(Reply::Send(Inject::InitOk)),
        1 => Just(Reply::Send(Inject::InitErr)),
        3 => Just(Reply::Echo),
        2 => Just(Reply::Send(Inject::Data)),
        2 => Just(Reply::Send(Inject::Error)),
        1 => Just(Reply::Send(Inject::FinishOk)),
        1 => Just(Reply::Send(Inject::FinishErr)),
        2 => Just(Reply::Send(Inject::CancelOk)),
        1 => Just(Reply::Send(Inject::CancelErr)),
        1 => Just(Reply::Send(Inject::EmptyEnvelope)),
        1 => Just(Reply::Send(Inject::EmptyControl)),
        1 => Just(Reply::Close),
        1 => prop_oneof![Just(1u64), Just(3), Just(45)].prop_map(Reply::Pause),
    ]
}

fn reactions(usual: Reply) -> impl Strategy<Value = Vec<Reply>> {
    prop_oneof![
        7 => Just(vec![usual]),
        3 => prop::collection::vec(reply_strategy(), 0..4),
    ]
}

fn script_strategy() -> impl Strategy<Value = Script> {
    let scripted = (
        reactions(Reply::Send(Inject::InitOk)),
        prop::collection::vec(reactions(Reply::Echo), 1..3),
        reactions(Reply::Send(Inject::FinishOk)),
        reactions(Reply::Send(Inject::CancelOk)),
    )
        .prop_map(|(on_init, on_data, on_finish, on_cancel)| Script {
            on_init,
            on_data,
            on_finish,
            on_cancel,
        });
    prop_oneof![1 => Just(Script::echo()), 2 => scripted]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => Just(Step::Send),
        5 => Just(Step::Recv),
        3 => Just(Step::Finish),
        1 => Just(Step::Cancel),
        1 => Just(Step::Wait),
        1 => Just(Step::Close),
        1 => Just(Step::Drop),
        1 => prop_oneof![Just(1u64), Just(40)].prop_map(Step::Sleep),
        1 => Just(Step::Abandon),
        1 => Just(Step::AbandonSend),
        2 => (0u8..4).prop_map(Step::Process),
    ]
}

fn plan_strategy() -> impl Strategy<Value = Plan> {
    let init = prop_oneof![
        1 => Just(InitPlan::Skip),
        6 => Just(InitPlan::Plain),
        2 => (1usize..5).prop_map(InitPlan::Chunked),
        1 => Just(InitPlan::Abandoned),
    ];
    let bound = prop_oneof![Just(1usize), Just(2), Just(64)];
    (
        init,
        prop::collection::vec(step_strategy(), 0..10),
        (bound.clone(), bound),
    )
        .prop_map(|(init, steps, bounds)| Plan {
            init,
            steps,
            bounds,
        })
}

/// What the harness observed through the typed API.
#[derive(Debug, Default)]
struct Observed {
    /// Batches handed out by `recv` / the `process` stream, in order.
    received: Vec<Bytes>,
    /// A read reached the end of the output (`Ok(None)` or an error).
    read_to_end: bool,
    /// Errors from `recv`, `process`, `finish`, `init` (Display), to compare with the outcome.
    end_errors: Vec<SessionError>,
    /// Errors from `send`.
    send_errors: Vec<SessionError>,
    /// What `init` failed with.
    init_error: Option<SessionError>,
    /// Outcomes read from `Session<Terminated>` values.
    terminated: Vec<Termination>,
    /// What `close` returned.
    closed: Option<Termination>,
}

impl Observed {
    fn read(&mut self, r: Result<Option<Bytes>, SessionError>) {
        match r {
            Ok(Some(b)) => self.received.push(b),
            Ok(None) => self.read_to_end = true,
            Err(e) => {
                self.read_to_end = true;
                self.end_errors.push(e);
            }
        }
    }
}

type Any = tether::worker::engine::AnySession<EngineConn>;

/// Runs `f` on the session under a short deadline; `None` (and a `Dropped` event) when the
/// deadline dropped the future and the session with it.
async fn abandonable<S, F>(log: &EvLog, session: S, f: F) -> Option<S>
where
    F: AsyncFnOnce(&mut S),
{
    let fut = async move {
        let mut session = session;
        f(&mut session).await;
        session
    };
    match tokio::time::timeout(Duration::from_millis(500), fut).await {
        Ok(session) => Some(session),
        Err(_) => {
            push(log, Ev::Dropped);
            None
        }
    }
}

async fn drive_session(
    plan: &Plan,
    session: Session<state::Init, EngineConn>,
    log: &EvLog,
    obs: &mut Observed,
) {
    let mut ids = Ids::default();
    let mut any: Option<Any> = None;
    let accepted = |obs: &mut Observed, log: &EvLog, r| -> Option<Any> {
        match r {
            Ok((s, _)) => {
                push(log, Ev::InitReturned(true));
                Some(Any::from(s))
            }
            Err(tether::worker::engine::SessionFailed { error, session }) => {
                push(log, Ev::InitReturned(false));
                obs.init_error = Some(error);
                obs.terminated.push(session.outcome().clone());
                Some(Any::from(session))
            }
        }
    };
    match plan.init {
        InitPlan::Skip => any = Some(Any::from(session)),
        InitPlan::Plain => {
            push(log, Ev::InitCalled);
            let r = session.init(fixtures::init("udf")).await;
            any = accepted(obs, log, r);
        }
        InitPlan::Chunked(n) => {
            push(log, Ev::InitCalled);
            let r = session.init_chunked(fixtures::init("0123456789"), n).await;
            any = accepted(obs, log, r);
        }
        InitPlan::Abandoned => {
            push(log, Ev::InitCalled);
            let fut = session.init(fixtures::init("udf"));
            match tokio::time::timeout(Duration::from_millis(500), fut).await {
                Ok(r) => any = accepted(obs, log, r),
                Err(_) => push(log, Ev::Dropped),
            }
        }
    }
    for step in &plan.steps {
        let Some(cur) = any.take() else { break };
        any = match (step, cur) {
            (Step::Send, Any::Streaming(mut s)) => {
                if let Err(e) = s.send(ids.bytes("in-")).await {
                    obs.send_errors.push(e);
                }
                Some(s.into())
            }
            (Step::Recv, Any::Streaming(mut s)) => {
                obs.read(s.recv().await);
                Some(s.into())
            }
            (Step::Recv, Any::Finishing(mut s)) => {
                obs.read(s.recv().await);
                Some(s.into())
            }
            (Step::Recv, Any::Cancelling(mut s)) => {
                obs.read(s.recv().await);
                Some(s.into())
            }
            (Step::Abandon, Any::Streaming(s)) => {
                let mut got = None;
                let s = abandonable(log, s, async |s| got = Some(s.recv().await)).await;
                got.into_iter().for_each(|r| obs.read(r));
                s.map(Any::from)
            }
            (Step::Abandon, Any::Finishing(s)) => {
                let mut got = None;
                let s = abandonable(log, s, async |s| got = Some(s.recv().await)).await;
                got.into_iter().for_each(|r| obs.read(r));
                s.map(Any::from)
            }
            (Step::AbandonSend, Any::Streaming(s)) => {
                let data = ids.bytes("in-");
                let mut got = None;
                let s = abandonable(log, s, async |s| got = Some(s.send(data).await)).await;
                obs.send_errors.extend(got.and_then(Result::err));
                s.map(Any::from)
            }
            (Step::Finish, Any::Streaming(s)) => {
                push(log, Ev::FinishCalled);
                match s.finish().await {
                    Ok(s) => Some(s.into()),
                    Err(failed) => {
                        obs.end_errors.push(failed.error);
                        obs.terminated.push(failed.session.outcome().clone());
                        Some(failed.session.into())
                    }
                }
            }
            (Step::Cancel, Any::Streaming(s)) => {
                push(log, Ev::CancelCalled);
                Some(s.cancel(Some("plan".into())).await.into())
            }
            (Step::Cancel, Any::Finishing(s)) => {
                push(log, Ev::CancelCalled);
                Some(s.cancel(Some("plan".into())).await.into())
            }
            (Step::Wait, Any::Finishing(s)) => {
                let t = s.wait().await;
                obs.terminated.push(t.outcome().clone());
                Some(t.into())
            }
            (Step::Wait, Any::Cancelling(s)) => {
                let t = s.wait().await;
                obs.terminated.push(t.outcome().clone());
                Some(t.into())
            }
            (Step::Process(n), Any::Streaming(s)) => {
                let input: Vec<Bytes> = (0..*n).map(|_| ids.bytes("in-")).collect();
                let mut p = s.process(futures::stream::iter(input));
                while let Some(item) = p.next().await {
                    match item {
                        Ok(b) => obs.received.push(b),
                        Err(e) => obs.end_errors.push(e),
                    }
                }
                obs.read_to_end = true;
                push(log, Ev::CloseCalled);
                obs.closed = Some(p.close().await);
                None
            }
            (Step::Close, cur) => {
                push(log, Ev::CloseCalled);
                obs.closed = Some(cur.close().await);
                None
            }
            (Step::Drop, cur) => {
                drop(cur);
                push(log, Ev::Dropped);
                None
            }
            (Step::Sleep(secs), cur) => {
                tokio::time::sleep(Duration::from_secs(*secs)).await;
                Some(cur)
            }
            (_, cur) => Some(cur),
        };
    }
    if let Some(cur) = any {
        push(log, Ev::CloseCalled);
        obs.closed = Some(cur.close().await);
    }
}

/// Replays the reference [`Model`] over what the engine saw and checks the session against
/// it. Everything the session reacts to is in the log except its timers: a timeout settles
/// `TransportFailed(Timeout)` and an unacknowledged drop-cleanup settles `Interrupted`,
/// after which the session takes nothing more from the connection.
fn check_session(
    log: &[Ev],
    obs: &Observed,
    handle: &CountingHandle,
    watch: &tether::worker::engine::TerminationWatch,
) -> Result<(), TestCaseError> {
    // The handle: released exactly once, invalid iff unsalvageable, one outcome.
    prop_assert_eq!(handle.releases(), 1, "released exactly once");
    prop_assert_eq!(handle.active_sessions(), 0);
    let outcomes = handle.outcomes();
    prop_assert_eq!(outcomes.len(), 1, "one outcome per session");
    let fin = outcomes[0].clone();
    prop_assert_ne!(fin.kind(), TerminationKind::Failed);
    prop_assert_eq!(
        handle.is_invalid(),
        !fin.is_salvageable(),
        "mark_invalid iff unsalvageable ({})",
        fin
    );
    prop_assert_eq!(
        handle.is_invalid(),
        matches!(
            fin.kind(),
            TerminationKind::TransportFailed | TerminationKind::Interrupted
        )
    );
    let fin_outcome = Outcome::observed(&fin);
    let same = |t: &Termination| Outcome::observed(t) == fin_outcome;
    prop_assert!(watch.get().as_ref().is_some_and(same), "watch disagrees");
    if let Some(c) = &obs.closed {
        prop_assert!(same(c), "close returned {} but the handle saw {}", c, fin);
    }
    for t in &obs.terminated {
        prop_assert!(
            same(t),
            "a Terminated session showed {} but the end was {}",
            t,
            fin
        );
    }
    // Compared in full (Debug): Display states an error without its cause.
    let fin_error = fin.to_error().map(|e| format!("{e:?}"));
    for e in &obs.end_errors {
        prop_assert_eq!(Some(format!("{e:?}")), fin_error.clone(), "read error");
    }

    // Replay.
    let mut m = Model::new();
    let mut wire: Vec<Req> = Vec::new();
    let mut settled_by: Option<&Ev> = None;
    let mut dropped = false;
    let mut after_worker_error = false;
    for ev in log {
        match ev {
            Ev::InitCalled => {
                let _ = m.start_init(&[]);
            }
            Ev::InitReturned(ok) => {
                prop_assert_eq!(
                    *ok,
                    m.init_status() == InitStatus::Accepted,
                    "init returned {} with the model at {:?}",
                    ok,
                    m.init_status()
                );
            }
            Ev::FinishCalled => {
                let _ = m.finish();
            }
            Ev::CancelCalled | Ev::CloseCalled => {
                m.cancel();
            }
            Ev::Dropped => {
                dropped = true;
                m.cancel();
            }
            Ev::Sent(request) => {
                prop_assert!(
                    settled_by.is_none(),
                    "{:?} sent after the terminal",
                    request.kind()
                );
                let req = Req::of(request);
                prop_assert!(req.is_some(), "malformed request");
                let req = req.unwrap_or(Req::Cancel);
                if matches!(req, Req::Data(_) | Req::Finish) {
                    prop_assert!(m.init_ok.is_some(), "{:?} before the InitResponse", req);
                }
                if after_worker_error {
                    prop_assert!(
                        matches!(req, Req::Init { .. } | Req::Cancel),
                        "{:?} sent after a worker error instead of Cancel",
                        req
                    );
                }
                m.stream_opened = true;
                if req == Req::Finish {
                    m.finish_on_wire = true;
                }
                wire.push(req);
                check_wire(&wire)?;
            }
            Ev::Recv(response) => {
                prop_assert!(settled_by.is_none(), "message taken after the terminal");
                let first_init = !m.init_answered && !m.init_failed;
                after_worker_error |= match response.clone().into_message() {
                    Ok(tether::wire::ResponseMessage::Error(_)) => true,
                    Ok(tether::wire::ResponseMessage::Init(r)) => r.error.is_some() && first_init,
                    _ => false,
                };
                m.receive(response);
            }
            Ev::RecvEnd => {
                prop_assert!(settled_by.is_none(), "stream end read after the terminal");
                m.stream_end();
            }
            Ev::ConnError => m.connection_error(),
        }
        if settled_by.is_none() && m.terminal.is_some() {
            settled_by = Some(ev);
        }
    }
    match (&m.terminal, settled_by) {
        // A timeout's best-effort Cancel can fail to send after the timeout settled.
        (Some(_), Some(Ev::ConnError))
            if matches!(fin_outcome, Outcome::TransportFailed(Cause::Timeout(_))) => {}
        (Some(expected), _) => prop_assert_eq!(&fin_outcome, expected, "outcome"),
        (None, _) => prop_assert!(
            matches!(fin_outcome, Outcome::TransportFailed(Cause::Timeout(_)))
                || (dropped && fin_outcome == Outcome::Interrupted),
            "the session settled {} on nothing it received",
            fin
        ),
    }
    if fin_outcome == Outcome::Interrupted {
        prop_assert!(dropped, "Interrupted without a drop");
    }

    // Output: what the engine read is, in order, the accepted batches (a prefix when the
    // rest was discarded by close/wait).
    let accepted: Vec<Bytes> = m.output.iter().cloned().collect();
    prop_assert!(
        accepted.starts_with(&obs.received),
        "read {:?}, accepted {:?}",
        obs.received,
        accepted
    );
    if obs.read_to_end {
        prop_assert_eq!(
            &obs.received,
            &accepted,
            "reading to the end delivers everything"
        );
    }

    // API errors agree with the model.
    if let Some(e) = &obs.init_error {
        match &m.first_error {
            Some(first) => prop_assert_eq!(e.execution_error(), Some(first), "init error"),
            None => prop_assert_eq!(Some(format!("{e:?}")), fin_error.clone(), "init error"),
        }
    }
    // A send fails with the worker's error while the session is not yet terminal, and with
    // the terminal's error after (`EngineCore::error`, udf §4.7).
    for e in &obs.send_errors {
        let ok = Some(format!("{e:?}")) == fin_error
            || match &m.first_error {
                Some(first) => e.execution_error() == Some(first),
                None => matches!(e, SessionError::Cancelled),
            };
        prop_assert!(ok, "send error {} (outcome {})", e, fin);
    }
    Ok(())
}

/// One run of the async session: what the engine saw and what the harness observed.
struct SessionRun {
    log: Vec<Ev>,
    obs: Observed,
    handle: Arc<CountingHandle>,
    watch: tether::worker::engine::TerminationWatch,
    /// The plan did not end within an hour of the paused clock.
    hung: bool,
    /// The worker task ended (it saw the engine's side of the stream go away).
    worker_done: bool,
}

fn run_session_case(script: Script, plan: &Plan) -> SessionRun {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let (output_buffer, capacity) = plan.bounds;
        let (engine, worker) = connection::pair::<UdfRequest, UdfResponse>(capacity);
        let log: EvLog = Arc::default();
        let engine = Recorded {
            inner: engine,
            log: log.clone(),
        };
        let handle = Arc::new(CountingHandle::for_one_session());
        let config = SessionConfig {
            output_buffer,
            ..SessionConfig::default()
        };
        let session = Session::new(engine, handle.clone(), config);
        let watch = session.watch();
        let worker = run_worker(worker, script);
        let mut obs = Observed::default();
        let plan_run = drive_session(plan, session, &log, &mut obs);
        let hung = tokio::time::timeout(Duration::from_secs(3600), plan_run)
            .await
            .is_err();
        // Drop cleanup (Cancel, up to 2 s for the ack, half-close) runs on its own task.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let worker_done = tokio::time::timeout(Duration::from_secs(600), worker)
            .await
            .is_ok();
        let log = log.lock().expect("log").clone();
        SessionRun {
            log,
            obs,
            handle,
            watch,
            hung,
            worker_done,
        }
    })
}

fn run_session(script: Script, plan: &Plan) -> Result<(), TestCaseError> {
    let run = run_session_case(script, plan);
    prop_assert!(!run.hung, "the plan hung");
    prop_assert!(run.worker_done, "the worker never saw the stream end");
    check_session(&run.log, &run.obs, &run.handle, &run.watch)
}

proptest! {
    #![proptest_config(model_support::config(192))]

    #[test]
    fn session_over_memory_pair(script in script_strategy(), plan in plan_strategy()) {
        run_session(script, &plan)?;
    }

    /// A conformant worker and a complete plan: `Finished`, every batch echoed in order,
    /// the worker kept.
    #[test]
    fn session_with_echo_worker_delivers_everything(
        batches in 0u8..8,
        chunk_size in prop::option::of(1usize..5),
        use_process in any::<bool>(),
    ) {
        let mut steps = Vec::new();
        if use_process {
            steps.push(Step::Process(batches));
        } else {
            for _ in 0..batches {
                steps.extend([Step::Send, Step::Recv]);
            }
            steps.extend([Step::Finish, Step::Recv, Step::Close]);
        }
        let plan = Plan {
            init: chunk_size.map_or(InitPlan::Plain, InitPlan::Chunked),
            steps,
            bounds: (64, 16),
        };
        let run = run_session_case(Script::echo(), &plan);
        check_session(&run.log, &run.obs, &run.handle, &run.watch)?;
        let expected: Vec<Bytes> = (1..=u32::from(batches))
            .map(|i| Bytes::from(format!("in-{i}")))
            .collect();
        prop_assert_eq!(&run.obs.received, &expected);
        prop_assert!(run.obs.end_errors.is_empty(), "{:?}", run.obs.end_errors);
        let outcome = run.obs.closed.expect("closed");
        prop_assert_eq!(outcome.kind(), TerminationKind::Finished);
        prop_assert!(outcome.to_error().is_none(), "{}", outcome);
        prop_assert!(!run.handle.is_invalid());
    }
}

/// The session schedules reach every outcome and deliver data (guards the generators).
#[test]
fn session_schedules_cover_every_outcome() {
    let mut seen = std::collections::BTreeSet::new();
    let mut read_everything = false;
    for (script, plan) in model_support::samples((script_strategy(), plan_strategy()), 192) {
        let run = run_session_case(script, &plan);
        if let Some(t) = run.handle.last_outcome() {
            seen.insert(format!("{:?}", t.kind()));
        }
        read_everything |= run.obs.read_to_end && !run.obs.received.is_empty();
    }
    for kind in ["Finished", "Cancelled", "TransportFailed", "Interrupted"] {
        assert!(seen.contains(kind), "no session settled {kind}: {seen:?}");
    }
    assert!(read_everything, "no session read data to the end");
}

// =============================================================================================
// Regressions: places where an earlier core departed from the spec, one minimal reproducer
// each (found by the model above; now fixed).
// =============================================================================================

/// (A) `EngineCore::handle_response`, `ResponseMessage::Data`: a `DataResponse` before any
/// `InitResponse` is a worker protocol violation (R2; udf §4.10: `TransportFailed`, worker
/// invalidated), but the core only rejects it in `Created`/`Initializing`. Once a Cancel is
/// queued (pre-init `ErrorResponse`, `InitResponse.error`, engine cancel or drop cleanup)
/// the batch is queued as output instead.
#[test]
fn regression_a_core_rejects_data_before_init_response() {
    let mut core = EngineCore::default();
    core.start_init(fixtures::init("udf"), None).expect("init");
    assert!(core.poll_transmit().is_some());
    core.handle_response(UdfResponse::error(ExecutionError::worker("pre-init")));
    core.handle_response(UdfResponse::data(Bytes::from_static(b"early")));
    assert_eq!(
        core.terminal().map(Outcome::observed),
        Some(Outcome::TransportFailed(Cause::Violation(
            PeerViolation::DataBeforeInitResponse
        ))),
        "output queue: {}",
        core.output_len()
    );
}

/// (A) through the public API: a worker that answers `Init` with `ErrorResponse` and then a
/// `DataResponse` (before any `InitResponse`) and acks the Cancel ends `Cancelled` and is
/// kept for reuse.
#[test]
fn regression_a_session_invalidates_a_worker_that_sent_data_before_init_response() {
    let script = Script {
        on_init: vec![Reply::Send(Inject::Error), Reply::Send(Inject::Data)],
        on_data: vec![vec![]],
        on_finish: vec![],
        on_cancel: vec![Reply::Send(Inject::CancelOk)],
    };
    let plan = Plan {
        init: InitPlan::Plain,
        steps: vec![],
        bounds: (64, 16),
    };
    let run = run_session_case(script, &plan);
    let outcome = run.handle.last_outcome().expect("finalized");
    assert_eq!(
        outcome.kind(),
        TerminationKind::TransportFailed,
        "{outcome}"
    );
    assert!(run.handle.is_invalid());
}

/// (B) A worker message before the engine sent anything (here an `ErrorResponse`) used to be
/// recorded and then lost in a synthetic `Cancelled`; a worker cannot answer a stream that
/// does not exist yet, so it is a violation: `TransportFailed`.
#[test]
fn regression_b_error_before_init_is_a_violation() {
    let mut core = EngineCore::default();
    core.handle_response(UdfResponse::error(ExecutionError::worker("unsolicited")));
    assert_eq!(
        core.terminal().map(Outcome::observed),
        Some(Outcome::TransportFailed(Cause::Violation(
            PeerViolation::ResponseBeforeInit
        )))
    );
}

/// (C) An `InitResponse` before the engine sent `Init` used to be stored, so `init_status`
/// later said `Accepted` while the data phase was closed. It is now a violation, and the core
/// refuses `start_init` afterwards.
#[test]
fn regression_c_init_response_before_init_is_a_violation() {
    let mut core = EngineCore::default();
    core.handle_response(UdfResponse::init(InitResponse::default()));
    assert_eq!(core.init_status(), InitStatus::Terminated);
    assert!(core.start_init(fixtures::init("udf"), None).is_err());
    assert_eq!(core.poll_transmit(), None, "nothing goes on the wire");
}

/// (D) `EngineCore::handle_timeout` is documented to settle `TransportFailed(Timeout)`; with
/// the `Init` still queued (no stream yet) its internal `cancel` used to settle the
/// synthetic `Cancelled` first.
#[test]
fn regression_d_timeout_before_init_settles_a_timeout() {
    let mut core = EngineCore::default();
    core.start_init(fixtures::init("udf"), None).expect("init");
    let now = std::time::Instant::now();
    core.begin_wait(now);
    core.handle_timeout(now + Duration::from_secs(30));
    assert_eq!(
        core.terminal().map(Outcome::observed),
        Some(Outcome::TransportFailed(Cause::Timeout(Wait::InitResponse)))
    );
}

/// (E) `session.rs` `cleanup_on_drop`: a session dropped inside a tokio runtime is finalized
/// by a spawned task; if that task never completes (the runtime shuts down first, or it is
/// cancelled while waiting for the Cancel ack) the boxed state is dropped without
/// `finalize`: the handle is never released (its session count stays 1), never marked
/// invalid, and no outcome is published. Dropping
/// must release the handle exactly once (udf §5.1).
#[test]
fn regression_e_drop_cleanup_survives_runtime_shutdown() {
    let handle = Arc::new(CountingHandle::for_one_session());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let session_handle = handle.clone();
    rt.block_on(async move {
        let (engine, worker) = connection::pair::<UdfRequest, UdfResponse>(16);
        run_worker(worker, Script::echo());
        let session = Session::new(engine, session_handle, SessionConfig::default());
        let (streaming, _) = session.init(fixtures::init("udf")).await.expect("init");
        drop(streaming);
    });
    drop(rt);
    assert_eq!(
        handle.releases(),
        1,
        "the dropped session was never released"
    );
    assert_eq!(handle.outcomes().len(), 1);
}

// ---------------------------------------------------------------------------------------
// udf §2 R9, §5.2 step 4: the request side is half-closed after a clean terminator and
// aborted after a failure, never both
// ---------------------------------------------------------------------------------------

/// How the core wants its request side ended once everything queued went out, and what
/// went out (udf §2 R9).
fn r9_request_end(core: &mut EngineCore) -> (&'static str, Vec<tether::wire::RequestKind>) {
    let mut sent = Vec::new();
    while let Some(request) = core.poll_transmit() {
        sent.extend(request.kind());
    }
    let end = match (core.wants_half_close(), core.wants_abort()) {
        (true, false) => "half-close",
        (false, true) => "abort",
        (false, false) => "neither",
        (true, true) => "both",
    };
    (end, sent)
}

/// An engine core that sent its `Init` and got the `InitResponse` (udf §4.6).
fn r9_streaming() -> EngineCore {
    let mut core = EngineCore::default();
    core.start_init(fixtures::init("udf"), None).expect("init");
    while core.poll_transmit().is_some() {}
    core.handle_response(fixtures::init_ok());
    assert_eq!(core.phase(), EnginePhase::Streaming);
    core
}

#[test]
fn r9_the_core_half_closes_after_a_clean_terminator_and_aborts_after_a_failure() {
    use tether::wire::RequestKind::{Cancel, Finish};
    let config = SessionConfig::default();
    let now = std::time::Instant::now();
    let mut seen = Vec::new();

    // Finished: half-close.
    let mut core = r9_streaming();
    assert!(core.finish().expect("finish"));
    assert_eq!(r9_request_end(&mut core), ("neither", vec![Finish]));
    core.handle_response(fixtures::finish_response_ok());
    seen.push((
        core.terminal().map(Termination::kind),
        r9_request_end(&mut core),
    ));

    // Cancelled: half-close.
    let mut core = r9_streaming();
    assert!(core.cancel(Some("stop".into())));
    assert_eq!(r9_request_end(&mut core), ("neither", vec![Cancel]));
    core.handle_response(fixtures::cancel_ok());
    seen.push((
        core.terminal().map(Termination::kind),
        r9_request_end(&mut core),
    ));

    // TransportFailed by a timeout: the farewell Cancel goes first, then abort.
    let mut core = r9_streaming();
    core.begin_wait(now);
    core.handle_timeout(now + config.terminal_timeout);
    assert!(!core.wants_abort(), "the farewell Cancel goes first");
    seen.push((
        core.terminal().map(Termination::kind),
        r9_request_end(&mut core),
    ));

    // Interrupted: the Cancel, then abort once its acknowledgement did not come.
    let mut core = r9_streaming();
    core.interrupt("reading output");
    assert_eq!(r9_request_end(&mut core), ("neither", vec![Cancel]));
    core.begin_wait(now);
    core.handle_timeout(now + config.interrupt_cancel_timeout);
    seen.push((
        core.terminal().map(Termination::kind),
        r9_request_end(&mut core),
    ));

    // TransportFailed by the worker's protocol violation (a FinishResponse before Finish).
    let mut core = r9_streaming();
    core.handle_response(fixtures::finish_response_ok());
    seen.push((
        core.terminal().map(Termination::kind),
        r9_request_end(&mut core),
    ));

    // TransportFailed by the stream ending without a terminator (udf §2 R10).
    let mut core = r9_streaming();
    core.handle_stream_end();
    seen.push((
        core.terminal().map(Termination::kind),
        r9_request_end(&mut core),
    ));

    // TransportFailed by a broken connection.
    let mut core = r9_streaming();
    core.handle_connection_error(ConnectionError::Closed);
    seen.push((
        core.terminal().map(Termination::kind),
        r9_request_end(&mut core),
    ));

    use TerminationKind::{Cancelled, Finished, Interrupted, TransportFailed};
    assert_eq!(
        seen,
        [
            (Some(Finished), ("half-close", vec![])),
            (Some(Cancelled), ("half-close", vec![])),
            (Some(TransportFailed), ("abort", vec![Cancel])),
            (Some(Interrupted), ("abort", vec![])),
            (Some(TransportFailed), ("abort", vec![])),
            (Some(TransportFailed), ("abort", vec![])),
            (Some(TransportFailed), ("abort", vec![])),
        ]
    );
}

/// A connection that records how the session ended its request side (udf §2 R9): a
/// `poll_close` is a half-close; dropped without one, it was given up unclosed, an abort
/// (what resets a gRPC stream, Spark's `onError`).
#[derive(Debug)]
struct R9Recording {
    inner: MemoryConnection<UdfRequest, UdfResponse>,
    half_closed: bool,
    log: Arc<Mutex<Vec<&'static str>>>,
}

impl Connection<UdfRequest, UdfResponse> for R9Recording {
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectionError>> {
        self.inner.poll_ready(cx)
    }
    fn start_send(&mut self, msg: UdfRequest) -> Result<(), ConnectionError> {
        self.inner.start_send(msg)
    }
    fn poll_flush(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectionError>> {
        self.inner.poll_flush(cx)
    }
    fn poll_close(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectionError>> {
        if !self.half_closed {
            self.half_closed = true;
            self.log.lock().unwrap().push("half-close");
        }
        self.inner.poll_close(cx)
    }
    fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<UdfResponse, ConnectionError>>> {
        self.inner.poll_recv(cx)
    }
}

impl Drop for R9Recording {
    fn drop(&mut self) {
        if !self.half_closed {
            self.log.lock().unwrap().push("abort");
        }
    }
}

/// A session over an [`R9Recording`] connection to the worker `worker` runs on its end
/// (spawned on a paused-clock runtime); returns how the request side ended and the
/// termination `run` returned (udf §2 R9).
fn r9_session<W, R>(
    worker: impl FnOnce(MemoryConnection<UdfResponse, UdfRequest>) -> W,
    run: impl FnOnce(Session<state::Init, R9Recording>) -> R,
) -> (Vec<&'static str>, Termination)
where
    W: std::future::Future<Output = ()> + Send + 'static,
    R: std::future::Future<Output = Termination>,
{
    let log = Arc::new(Mutex::new(Vec::new()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let (engine, worker_end) = connection::pair::<UdfRequest, UdfResponse>(16);
    let connection = R9Recording {
        inner: engine,
        half_closed: false,
        log: log.clone(),
    };
    let termination = rt.block_on(async move {
        tokio::spawn(worker(worker_end));
        let session = Session::new(
            connection,
            Arc::new(CountingHandle::for_one_session()),
            SessionConfig::default(),
        );
        run(session).await
    });
    drop(rt);
    let log = log.lock().unwrap().clone();
    (log, termination)
}

#[test]
fn r9_a_session_half_closes_after_finished_and_aborts_after_a_timeout() {
    use tether::worker::endpoint::serve;
    use tether_testing::echo::{EchoUdf, echo_config};
    // Finished: the echo worker answers; the session half-closes its request side.
    let (log, termination) = r9_session(
        |end| async move {
            let _ = serve(end, EchoUdf::default(), echo_config()).await;
        },
        |session| async move {
            let (streaming, _) = session.init(fixtures::init("udf")).await.expect("init");
            let mut finishing = streaming.finish().await.expect("finish");
            assert_eq!(finishing.recv().await.expect("recv"), None);
            finishing.close().await
        },
    );
    assert_eq!(termination.kind(), TerminationKind::Finished);
    assert_eq!(log, ["half-close"]);

    // A worker that never answers: the init times out, the farewell Cancel goes out, and
    // the session aborts its request side instead of half-closing it.
    let (log, termination) = r9_session(
        |end| async move {
            // Holds its end open, reading nothing.
            let _end = end;
            std::future::pending::<()>().await;
        },
        |session| async move {
            match session.init(fixtures::init("udf")).await {
                Ok(_) => panic!("a silent worker cannot accept the Init"),
                Err(failed) => failed.session.close().await,
            }
        },
    );
    assert!(
        matches!(
            termination,
            Termination::TransportFailed(TransportFailure::Timeout {
                waiting_for: Wait::InitResponse,
                ..
            })
        ),
        "{termination}"
    );
    assert_eq!(log, ["abort"]);
}
