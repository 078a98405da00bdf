//! Model-based test of the worker side of a worker session: the sans-IO [`WorkerCore`]
//! (udf §2 rules R1–R8, the reference worker of udf §2.1, the messages of §1 and the
//! worker's answers of §4), as a proptest-state-machine test: [`WorkerReference`] (a
//! reference model written from the spec and the core's documented contract) and
//! [`WorkerCoreTest`]. Depth: `TETHER_MODEL_CASES` (default 512).
//!
//! Transitions: engine requests (`Init` inline or chunked, good or rejected for its version
//! or its CRC, chunks, empty chunks, data, `Finish`, `Cancel`, malformed envelopes, the
//! request stream ending, connection errors), the user's answers (`take_init`,
//! `accept_init`, `reject_init`, `send_data`, `fail`, `finish`, `cancelled`), the driver's
//! steps (`poll_transmit`, `pop_input`, `discard_input`) and time: waits that advance the
//! manual clock and a jump to the deadline the core arms itself, the wait for the `Init`
//! (udf §4.6, §7) or the R4 cancel deadline (`begin_wait`, `poll_timeout`,
//! `handle_timeout`).
//!
//! The reference predicts the protocol-error close of R6 from the phase the worker is in
//! (udf §2.1's states), not from the core's bookkeeping: see [`Model::violation`].
//!
//! Invariants after every step: phase, outcome (the exact [`EngineViolation`] of a R6
//! close), the responses handed to the transport (equal to the model's, message for
//! message), every call's result, the input queue, the counters, `wants_recv`,
//! `wants_half_close`, the armed deadline and every data ticket's delivery equal the
//! model's. On the wire: the first response is the `InitResponse` and there is one (R2);
//! no `DataResponse` before an `InitResponse` without error, nor after an error or a
//! terminator; at most one error (R4); exactly one terminator at the end and nothing after
//! it (R5). At the end of a case: every batch the user queued crossed exactly once, in
//! order, when the session `Finished` (a prefix, never a duplicate, otherwise: R3 drops
//! the rest on a Cancel).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tether::connection::ConnectionError;
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, Init, InitResponse, ResponseMessage,
    UdfPayload, UdfRequest, UdfResponse, UdfWorkerDataFormat,
};
use tether::worker::endpoint::{
    DataSent, DataTicket, Delivery, EndpointConfig, EndpointOutcome, EngineViolation,
    InitRejection, InitTimeout, WorkerCore, WorkerPhase, WorkerStats,
};

use crate::model_support;

const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);
/// The wait for the `Init` (udf §4.6): distinct from [`CANCEL_TIMEOUT`] so that a mix-up of
/// the two deadlines shows.
const INIT_TIMEOUT: Duration = Duration::from_secs(7);
const INPUT_BUFFER: usize = 3;
/// The byte bound beside [`INPUT_BUFFER`]: the model's batches are 4–6 bytes (`in-N`), so
/// sometimes two of them reach it before three batches do.
const INPUT_BUFFER_BYTES: usize = 10;
const INLINE: &[u8] = b"udf-";

fn config() -> EndpointConfig {
    EndpointConfig {
        input_buffer: INPUT_BUFFER,
        input_buffer_bytes: INPUT_BUFFER_BYTES,
        init_timeout: Some(INIT_TIMEOUT),
        cancel_timeout: Some(CANCEL_TIMEOUT),
        ..EndpointConfig::new()
    }
}

/// How the engine's `Init` is wrong, if it is (udf §1.3).
#[derive(Debug, Clone, Copy, PartialEq)]
enum BadInit {
    No,
    /// `protocol_version` 2 (the worker speaks 1): rejected at `Init`, answered once the
    /// payload is complete.
    Version,
    /// A `payload_crc32` that does not match the assembled payload.
    Crc,
}

/// The declared CRC of a `BadInit::Crc` init: one no test payload has.
const WRONG_CRC: u32 = 0x0bad_c0de;

#[derive(Debug, Clone)]
enum Op {
    // The engine's requests (udf §1.2–§1.5).
    Init {
        chunking: bool,
        bad: BadInit,
    },
    Chunk {
        last: bool,
    },
    EmptyChunk,
    Data,
    Finish,
    Cancel,
    Malformed,
    StreamEnd,
    ConnectionError,
    // The user's answers.
    TakeInit,
    AcceptInit,
    RejectInit,
    SendData,
    Fail,
    FinishUser,
    Cancelled,
    // The driver.
    Transmit(usize),
    PopInput,
    DiscardInput,
    /// A wait begins and the clock moves on this many seconds (`handle_timeout` then).
    Wait(u8),
    /// A wait begins, and time jumps to the deadline the core armed (if any).
    Timeout,
}

/// What the model expects the core to have done or answered in the last step.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Nothing,
    /// A call's result: `true` when allowed.
    Allowed(bool),
    /// `take_init`: the assembled payload, if an `Init` was there to take.
    TakeInit(Option<Bytes>),
    /// `send_data`: `Some(ticket number)` when queued, `None` when dropped, `Err` on misuse.
    SendData(Bytes, Result<Option<u64>, ()>),
    Transmit(Vec<UdfResponse>),
    PopInput(Option<Bytes>),
    DiscardInput(usize),
    /// The deadline armed by the wait, in ms of the manual clock (`None`: none).
    Deadline(Option<u64>),
}

/// The outcome as the model predicts it (udf §2 R5–R8).
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Finished,
    Cancelled {
        reason: Option<String>,
        reported: Option<ExecutionError>,
    },
    Violation(EngineViolation),
    TransportFailed,
    /// `TransportFailed` because no `Init` came in time (udf §4.6): its cause is an
    /// [`InitTimeout`] naming the timeout.
    InitTimedOut(Duration),
}

impl Outcome {
    fn observed(o: &EndpointOutcome) -> Outcome {
        match o {
            EndpointOutcome::Finished => Outcome::Finished,
            EndpointOutcome::Cancelled { reason, reported } => Outcome::Cancelled {
                reason: reason.clone(),
                reported: reported.clone(),
            },
            EndpointOutcome::ProtocolViolation(v) => Outcome::Violation(v.clone()),
            EndpointOutcome::TransportFailed(e) => match std::error::Error::source(e)
                .and_then(|cause| cause.downcast_ref::<InitTimeout>())
            {
                Some(InitTimeout { after }) => Outcome::InitTimedOut(*after),
                None => Outcome::TransportFailed,
            },
        }
    }
}

/// Where R6 puts the `ProtocolError` of a protocol-error close ([`Model::violation`]): the
/// `InitResponse`, an `ErrorResponse` or the `CancelResponse`.
#[derive(Debug, Clone, Copy)]
enum ReportIn {
    Init,
    Error,
    Cancel,
}

/// The reference model of the worker side, written from udf §2 (R1–R8), §2.1's table and
/// the core's documented contract.
#[derive(Debug, Clone)]
struct Model {
    phase: WorkerPhase,
    /// While `AwaitingChunks`: the error found at `Init` (answered after the last chunk)
    /// and the payload assembled so far (R1).
    pending_error: Option<InitRejection>,
    assembled: Vec<u8>,
    declared_crc: Option<u32>,
    /// Whether the `Init` was chunking (for the chunk-after-last-chunk violation).
    chunked: bool,
    /// The assembled payload the user has not taken yet.
    init: Option<Bytes>,
    user_involved: bool,
    /// `PostError` entered by `InitResponse.error` (no data phase).
    after_init_error: bool,
    init_response_sent: bool,
    reported: Option<ExecutionError>,
    rejection: Option<InitRejection>,
    deferred: Option<ExecutionError>,
    cancel: Option<Option<String>>,
    finish_received: bool,
    outcome: Option<Outcome>,
    outbox: VecDeque<UdfResponse>,
    input: VecDeque<Bytes>,
    stats: WorkerStats,
    data_queued: u64,
    data_transmitted: u64,
    data_dropped: bool,
    /// The manual clock, in ms, and the armed deadline: the phase it was armed in
    /// (`AwaitingInit` or `PostError`) and its instant in ms.
    now: u64,
    deadline: Option<(WorkerPhase, u64)>,
}

impl Model {
    fn new() -> Self {
        Model {
            phase: WorkerPhase::AwaitingInit,
            pending_error: None,
            assembled: Vec::new(),
            declared_crc: None,
            chunked: false,
            init: None,
            user_involved: false,
            after_init_error: false,
            init_response_sent: false,
            reported: None,
            rejection: None,
            deferred: None,
            cancel: None,
            finish_received: false,
            outcome: None,
            outbox: VecDeque::new(),
            input: VecDeque::new(),
            stats: WorkerStats::default(),
            data_queued: 0,
            data_transmitted: 0,
            data_dropped: false,
            now: 0,
            deadline: None,
        }
    }

    fn done(&self) -> bool {
        self.phase == WorkerPhase::Done
    }

    fn discard_input(&mut self) -> usize {
        let n = self.input.len();
        self.input.clear();
        self.stats.input_discarded += n as u64;
        n
    }

    /// R3, R6, R8: queued `DataResponse`s never go out.
    fn drop_queued_data(&mut self) {
        let before = self.outbox.len();
        self.outbox.retain(|r| !is_data(r));
        let dropped = (before - self.outbox.len()) as u64;
        if dropped > 0 {
            self.data_dropped = true;
            self.stats.output_dropped += dropped;
        }
    }

    /// R6 and §2.1's "any other combination" row: the protocol-error close, predicted from
    /// the phase (udf §2.1's states). R6 puts the `ProtocolError` "in `InitResponse.error` if
    /// still in init phase, in `FinishResponse.error`/`CancelResponse.error` while producing a
    /// terminator, else in `ErrorResponse.error`; then closes with `CancelResponse`":
    ///
    /// | phase | the error goes | then |
    /// |---|---|---|
    /// | `AwaitingInit`, `AwaitingChunks`, `InitPending` (init phase: no `InitResponse` yet) | `InitResponse.error` | `CancelResponse {}` |
    /// | `Data`, `Draining` (data phase, no error reported yet) | an `ErrorResponse` | `CancelResponse {}` |
    /// | `PostError` (an error is out: R4 allows one per stream; the Cancel it awaits is answered now) | `CancelResponse.error` | — |
    /// | `Cancelling` (the worker is producing the terminator that answers the Cancel) | `CancelResponse.error` | — |
    /// | `Done` | nothing: the stream is over (§2.1 "ignored") | — |
    ///
    /// The close is the worker's own end of the stream, so what a Cancel drops (R3, R7) is
    /// dropped: queued `DataResponse`s never go out and unread input is discarded. The
    /// assembled `Init` is no longer offered to the user.
    fn violation(&mut self, v: EngineViolation) {
        let place = match self.phase {
            WorkerPhase::Done => return,
            WorkerPhase::AwaitingInit | WorkerPhase::AwaitingChunks | WorkerPhase::InitPending => {
                ReportIn::Init
            }
            WorkerPhase::Data | WorkerPhase::Draining => ReportIn::Error,
            WorkerPhase::PostError | WorkerPhase::Cancelling => ReportIn::Cancel,
        };
        self.init = None;
        self.discard_input();
        self.drop_queued_data();
        let error = v.to_execution_error();
        let mut terminator = CancelResponse::default();
        match place {
            ReportIn::Init => {
                self.init_response_sent = true;
                self.outbox.push_back(UdfResponse::init(InitResponse {
                    data: None,
                    error: Some(error),
                }));
            }
            ReportIn::Error => self.outbox.push_back(UdfResponse::error(error)),
            ReportIn::Cancel => terminator.error = Some(error),
        }
        self.outbox.push_back(UdfResponse::cancel(terminator));
        self.phase = WorkerPhase::Done;
        self.outcome = Some(Outcome::Violation(v));
    }

    fn queue_init_error(&mut self, error: ExecutionError) {
        self.outbox.push_back(UdfResponse::init(InitResponse {
            data: None,
            error: Some(error.clone()),
        }));
        self.init_response_sent = true;
        self.reported = Some(error);
        self.after_init_error = true;
        self.phase = WorkerPhase::PostError;
    }

    fn reject_automatically(&mut self, rejection: InitRejection) {
        self.init = None;
        self.queue_init_error(rejection.to_execution_error());
        self.rejection = Some(rejection);
    }

    fn terminate_cancelled(&mut self, mut response: CancelResponse) {
        if response.error.is_none() {
            response.error = self.deferred.take();
        }
        let reported = self.reported.clone().or_else(|| response.error.clone());
        let reason = self.cancel.clone().flatten();
        self.outbox.push_back(UdfResponse::cancel(response));
        self.phase = WorkerPhase::Done;
        self.outcome = Some(Outcome::Cancelled { reason, reported });
    }

    /// udf §1.3: the assembled payload against the declared CRC.
    fn verify(&self) -> Option<InitRejection> {
        let actual = crc32fast::hash(&self.assembled);
        self.declared_crc
            .filter(|declared| *declared != actual)
            .map(|declared| InitRejection::PayloadCrcMismatch {
                declared,
                assembled: actual,
            })
    }

    fn init_complete(&mut self, error: Option<InitRejection>) {
        match error.or_else(|| self.verify()) {
            Some(e) => self.reject_automatically(e),
            None => {
                self.init = Some(Bytes::from(self.assembled.clone()));
                self.user_involved = true;
                self.phase = WorkerPhase::InitPending;
            }
        }
    }

    // --- the engine's requests (udf §2.1, one row each) ---

    fn request(&mut self, op: &Op, data: Option<Bytes>) {
        if self.done() {
            self.stats.ignored_after_done += 1;
            return;
        }
        match op {
            Op::Malformed => {
                let e = UdfRequest { request: None }
                    .into_message()
                    .expect_err("an empty envelope is malformed");
                self.violation(EngineViolation::Malformed(e));
            }
            Op::Cancel => self.on_cancel(),
            Op::Init { chunking, bad } => self.on_init(*chunking, *bad),
            Op::Chunk { last } => self.on_chunk(data.unwrap_or_default(), *last),
            Op::EmptyChunk => self.on_chunk(Bytes::new(), false),
            Op::Data => self.on_data(data.unwrap_or_default()),
            Op::Finish => self.on_finish(),
            other => unreachable!("{other:?} is not a request"),
        }
    }

    fn on_cancel(&mut self) {
        match self.phase {
            WorkerPhase::Cancelling => self.stats.duplicate_cancels += 1,
            _ => {
                self.cancel = Some(Some("model cancel".into()));
                self.discard_input();
                self.drop_queued_data();
                self.phase = WorkerPhase::Cancelling;
                if !self.user_involved {
                    // The user never saw the Init: answered on its behalf.
                    self.terminate_cancelled(CancelResponse::default());
                }
            }
        }
    }

    fn on_init(&mut self, chunking: bool, bad: BadInit) {
        if self.phase != WorkerPhase::AwaitingInit {
            return self.violation(EngineViolation::SecondInit {
                awaiting_chunks: self.phase == WorkerPhase::AwaitingChunks,
            });
        }
        let error =
            (bad == BadInit::Version).then_some(InitRejection::UnsupportedProtocolVersion {
                requested: 2,
                supported: 1,
            });
        self.assembled = INLINE.to_vec();
        self.declared_crc = (bad == BadInit::Crc).then_some(WRONG_CRC);
        self.chunked = chunking;
        if chunking {
            self.pending_error = error;
            self.phase = WorkerPhase::AwaitingChunks;
        } else {
            self.init_complete(error);
        }
    }

    fn on_chunk(&mut self, data: Bytes, last: bool) {
        if self.phase != WorkerPhase::AwaitingChunks {
            let v = match self.phase {
                WorkerPhase::AwaitingInit => EngineViolation::ChunkBeforeInit,
                WorkerPhase::InitPending if self.chunked && self.init.is_some() => {
                    EngineViolation::ChunkAfterLastChunk
                }
                WorkerPhase::InitPending => EngineViolation::ChunkWithoutChunking,
                WorkerPhase::Cancelling => EngineViolation::ChunkAfterCancel,
                _ => EngineViolation::ChunkAfterInitResponse,
            };
            return self.violation(v);
        }
        if data.is_empty() {
            return self.violation(EngineViolation::EmptyChunk);
        }
        self.assembled.extend_from_slice(&data);
        if last {
            let error = self.pending_error.take();
            self.init_complete(error);
        }
    }

    fn on_data(&mut self, data: Bytes) {
        match self.phase {
            WorkerPhase::Data => {
                self.stats.data_received += 1;
                self.input.push_back(data);
            }
            WorkerPhase::PostError if !self.after_init_error && !self.finish_received => {
                // Raced with the worker's ErrorResponse (udf §2.1).
                self.stats.ignored_after_error += 1;
            }
            WorkerPhase::AwaitingInit | WorkerPhase::AwaitingChunks | WorkerPhase::InitPending => {
                self.violation(EngineViolation::DataBeforeInitResponse)
            }
            WorkerPhase::PostError if self.after_init_error => {
                self.violation(EngineViolation::DataAfterFailedInit)
            }
            WorkerPhase::PostError | WorkerPhase::Draining => {
                self.violation(EngineViolation::DataAfterFinish)
            }
            WorkerPhase::Cancelling => self.violation(EngineViolation::DataAfterCancel),
            WorkerPhase::Done => unreachable!("handled in request"),
        }
    }

    fn on_finish(&mut self) {
        match self.phase {
            WorkerPhase::Data => {
                self.finish_received = true;
                self.phase = WorkerPhase::Draining;
            }
            WorkerPhase::PostError => {
                // udf §2.1: ignored; the Cancel is still due (R4).
                self.finish_received = true;
                self.stats.ignored_after_error += 1;
            }
            WorkerPhase::AwaitingInit | WorkerPhase::AwaitingChunks | WorkerPhase::InitPending => {
                self.violation(EngineViolation::FinishBeforeInitResponse)
            }
            WorkerPhase::Draining => self.violation(EngineViolation::SecondFinish),
            WorkerPhase::Cancelling => self.violation(EngineViolation::FinishAfterCancel),
            WorkerPhase::Done => unreachable!("handled in request"),
        }
    }

    fn stream_end(&mut self) {
        if !self.done() {
            self.violation(EngineViolation::RequestStreamEnded);
        }
    }

    /// R8: a transport failure ends the session silently (unless the terminator is out).
    fn connection_error(&mut self) {
        if self.done() && self.outbox.is_empty() {
            return;
        }
        self.drop_queued_data();
        self.outbox.clear();
        self.discard_input();
        self.init = None;
        self.phase = WorkerPhase::Done;
        self.outcome = Some(Outcome::TransportFailed);
    }

    // --- the user's answers ---

    fn accept_init(&mut self) -> bool {
        match self.phase {
            WorkerPhase::InitPending => {
                self.init = None;
                self.outbox.push_back(UdfResponse::init(InitResponse {
                    data: Some(Bytes::from_static(b"init-result")),
                    error: None,
                }));
                self.init_response_sent = true;
                self.phase = WorkerPhase::Data;
                true
            }
            WorkerPhase::Cancelling => !self.init_response_sent,
            WorkerPhase::Done => true,
            _ => false,
        }
    }

    fn reject_init(&mut self, error: ExecutionError) -> bool {
        match self.phase {
            WorkerPhase::InitPending => {
                self.init = None;
                self.queue_init_error(error);
                true
            }
            WorkerPhase::Cancelling if !self.init_response_sent => {
                self.deferred.get_or_insert(error);
                true
            }
            WorkerPhase::Done => true,
            _ => false,
        }
    }

    fn send_data(&mut self, data: Bytes) -> Result<Option<u64>, ()> {
        match self.phase {
            WorkerPhase::Data | WorkerPhase::Draining => {
                self.stats.data_sent += 1;
                self.outbox.push_back(UdfResponse::data(data));
                self.data_queued += 1;
                Ok(Some(self.data_queued))
            }
            WorkerPhase::PostError | WorkerPhase::Cancelling | WorkerPhase::Done => {
                self.stats.output_dropped += 1;
                Ok(None)
            }
            _ => Err(()),
        }
    }

    fn fail(&mut self, error: ExecutionError) -> bool {
        match self.phase {
            WorkerPhase::Data | WorkerPhase::Draining => {
                self.discard_input();
                self.outbox.push_back(UdfResponse::error(error.clone()));
                self.reported = Some(error);
                self.after_init_error = false;
                self.phase = WorkerPhase::PostError;
                true
            }
            WorkerPhase::Cancelling => {
                self.deferred.get_or_insert(error);
                true
            }
            WorkerPhase::Done => true,
            _ => false,
        }
    }

    fn finish(&mut self, response: FinishResponse) -> bool {
        match self.phase {
            WorkerPhase::Draining => {
                self.outbox.push_back(UdfResponse::finish(response));
                self.phase = WorkerPhase::Done;
                self.outcome = Some(Outcome::Finished);
                true
            }
            WorkerPhase::Done => true,
            _ => false,
        }
    }

    fn cancelled(&mut self, response: CancelResponse) -> bool {
        match self.phase {
            WorkerPhase::Cancelling => {
                self.terminate_cancelled(response);
                true
            }
            WorkerPhase::Done => true,
            _ => false,
        }
    }

    // --- the driver and time ---

    fn transmit(&mut self) -> Option<UdfResponse> {
        let r = self.outbox.pop_front()?;
        if is_data(&r) {
            self.data_transmitted += 1;
        }
        Some(r)
    }

    /// udf §7: a wait in `AwaitingInit` arms the wait for the `Init` (udf §4.6), a wait in
    /// `PostError` the R4 cancel deadline, each once per phase (the timeout counts from the
    /// first wait of that phase); a wait anywhere else disarms it.
    fn begin_wait(&mut self) {
        let timeout = match self.phase {
            WorkerPhase::AwaitingInit => INIT_TIMEOUT,
            WorkerPhase::PostError => CANCEL_TIMEOUT,
            _ => {
                self.deadline = None;
                return;
            }
        };
        if self.deadline.is_none_or(|(phase, _)| phase != self.phase) {
            self.deadline = Some((self.phase, self.now + timeout.as_millis() as u64));
        }
    }

    fn armed(&self) -> Option<u64> {
        self.deadline
            .filter(|(phase, _)| *phase == self.phase)
            .map(|(_, at)| at)
    }

    /// Time reaches `now`: an expired wait for the `Init` ends the session `TransportFailed`
    /// with nothing sent (udf §4.6, as a dead stream, R8); an expired R4 deadline is a
    /// protocol-violation close.
    fn advance(&mut self, now: u64) {
        self.now = now;
        if self.armed().is_some_and(|at| now >= at) {
            self.deadline = None;
            if self.phase == WorkerPhase::AwaitingInit {
                self.connection_error();
                self.outcome = Some(Outcome::InitTimedOut(INIT_TIMEOUT));
            } else {
                self.violation(EngineViolation::NoCancelAfterError {
                    after: CANCEL_TIMEOUT,
                });
            }
        }
    }

    fn delivery(&self, ticket: u64) -> Delivery {
        if ticket <= self.data_transmitted {
            Delivery::Transmitted
        } else if self.data_dropped {
            Delivery::Dropped
        } else {
            Delivery::Queued
        }
    }
}

fn is_data(r: &UdfResponse) -> bool {
    matches!(r.clone().into_message(), Ok(ResponseMessage::Data(_)))
}

/// The reference state: the model, the id counter and the prediction of the last step.
#[derive(Debug, Clone)]
struct WorkerRef {
    model: Model,
    next_id: u32,
    expect: Expect,
    /// Every batch the user queued (`send_data` → `Queued`), in order.
    queued: Vec<Bytes>,
}

impl WorkerRef {
    fn fresh(&mut self, prefix: &str) -> Bytes {
        self.next_id += 1;
        Bytes::from(format!("{prefix}{}", self.next_id))
    }

    fn error(&mut self) -> ExecutionError {
        self.next_id += 1;
        ExecutionError::user_with_class(format!("user-error-{}", self.next_id), "ModelError")
    }

    fn finish_response(&mut self) -> FinishResponse {
        let mut r = FinishResponse::default();
        r.metrics
            .insert("id".into(), format!("finish-{}", self.next_id));
        r
    }
}

fn base_ops() -> impl Strategy<Value = Op> {
    let bad =
        prop_oneof![8 => Just(BadInit::No), 1 => Just(BadInit::Version), 1 => Just(BadInit::Crc)];
    prop_oneof![
        2 => (prop::bool::weighted(0.4), bad).prop_map(|(chunking, bad)| Op::Init { chunking, bad }),
        2 => prop::bool::weighted(0.5).prop_map(|last| Op::Chunk { last }),
        1 => Just(Op::EmptyChunk),
        4 => Just(Op::Data),
        2 => Just(Op::Finish),
        1 => Just(Op::Cancel),
        1 => Just(Op::Malformed),
        1 => Just(Op::StreamEnd),
        1 => Just(Op::ConnectionError),
        2 => Just(Op::TakeInit),
        2 => Just(Op::AcceptInit),
        1 => Just(Op::RejectInit),
        4 => Just(Op::SendData),
        1 => Just(Op::Fail),
        2 => Just(Op::FinishUser),
        2 => Just(Op::Cancelled),
        5 => (1usize..=4).prop_map(Op::Transmit),
        3 => Just(Op::PopInput),
        1 => Just(Op::DiscardInput),
        1 => (0u8..4).prop_map(Op::Wait),
        1 => Just(Op::Timeout),
    ]
}

/// The step a well-behaved engine or user takes next in `phase` (so that schedules reach
/// every ending, not only early violations).
fn natural_ops(phase: WorkerPhase) -> BoxedStrategy<Op> {
    let ops: Vec<Op> = match phase {
        WorkerPhase::AwaitingInit => vec![
            Op::Init {
                chunking: false,
                bad: BadInit::No,
            },
            Op::Init {
                chunking: true,
                bad: BadInit::No,
            },
        ],
        WorkerPhase::AwaitingChunks => vec![Op::Chunk { last: false }, Op::Chunk { last: true }],
        WorkerPhase::InitPending => vec![Op::TakeInit, Op::AcceptInit],
        WorkerPhase::Data => vec![
            Op::Data,
            Op::SendData,
            Op::PopInput,
            Op::Transmit(2),
            Op::Finish,
        ],
        WorkerPhase::PostError => vec![Op::Cancel, Op::Transmit(2)],
        WorkerPhase::Draining => vec![Op::SendData, Op::Transmit(2), Op::FinishUser],
        WorkerPhase::Cancelling => vec![Op::Cancelled],
        WorkerPhase::Done => vec![Op::Transmit(4), Op::Cancel],
    };
    prop::sample::select(ops).boxed()
}

/// The reference state machine of [`WorkerCore`] (udf §2, §2.1, §7).
struct WorkerReference;

impl ReferenceStateMachine for WorkerReference {
    type State = WorkerRef;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<WorkerRef> {
        Just(WorkerRef {
            model: Model::new(),
            next_id: 0,
            expect: Expect::Nothing,
            queued: Vec::new(),
        })
        .boxed()
    }

    fn transitions(state: &WorkerRef) -> BoxedStrategy<Op> {
        prop_oneof![3 => base_ops(), 2 => natural_ops(state.model.phase)].boxed()
    }

    fn apply(mut r: WorkerRef, op: &Op) -> WorkerRef {
        r.expect = Expect::Nothing;
        match op {
            Op::Init { .. } | Op::EmptyChunk | Op::Cancel | Op::Malformed | Op::Finish => {
                r.model.request(op, None)
            }
            Op::Chunk { .. } => {
                let data = r.fresh("chunk-");
                r.model.request(op, Some(data));
            }
            Op::Data => {
                let data = r.fresh("in-");
                r.model.request(op, Some(data));
            }
            Op::StreamEnd => r.model.stream_end(),
            Op::ConnectionError => r.model.connection_error(),
            Op::TakeInit => {
                let init = r.model.init.take();
                r.expect = Expect::TakeInit(init);
            }
            Op::AcceptInit => r.expect = Expect::Allowed(r.model.accept_init()),
            Op::RejectInit => {
                let e = r.error();
                r.expect = Expect::Allowed(r.model.reject_init(e));
            }
            Op::SendData => {
                let data = r.fresh("out-");
                let result = r.model.send_data(data.clone());
                if let Ok(Some(_)) = result {
                    r.queued.push(data.clone());
                }
                r.expect = Expect::SendData(data, result);
            }
            Op::Fail => {
                let e = r.error();
                r.expect = Expect::Allowed(r.model.fail(e));
            }
            Op::FinishUser => {
                let response = r.finish_response();
                r.expect = Expect::Allowed(r.model.finish(response));
            }
            Op::Cancelled => {
                r.expect = Expect::Allowed(r.model.cancelled(CancelResponse::default()))
            }
            Op::Transmit(n) => {
                let sent: Vec<UdfResponse> =
                    std::iter::from_fn(|| r.model.transmit()).take(*n).collect();
                r.expect = Expect::Transmit(sent);
            }
            Op::PopInput => r.expect = Expect::PopInput(r.model.input.pop_front()),
            Op::DiscardInput => r.expect = Expect::DiscardInput(r.model.discard_input()),
            Op::Wait(secs) => {
                r.model.begin_wait();
                let armed = r.model.armed();
                let now = r.model.now + u64::from(*secs) * 1000;
                r.model.advance(now);
                r.expect = Expect::Deadline(armed);
            }
            Op::Timeout => {
                r.model.begin_wait();
                let armed = r.model.armed();
                if let Some(at) = armed {
                    r.model.advance(at);
                }
                r.expect = Expect::Deadline(armed);
            }
        }
        r
    }
}

/// The system under test: the core, the manual clock's origin and what went out.
struct WorkerSut {
    core: WorkerCore,
    origin: Instant,
    now: u64,
    wire: Vec<UdfResponse>,
    /// Every ticket `send_data` handed out, with the last delivery seen for it.
    tickets: Vec<(u64, DataTicket, Delivery)>,
}

fn or_panic(result: Result<(), TestCaseError>) {
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn request_for(op: &Op, data: Option<Bytes>) -> Option<UdfRequest> {
    Some(match op {
        Op::Init { chunking, bad } => {
            let mut udf = UdfPayload::new(Bytes::from_static(INLINE), "model");
            if *bad == BadInit::Crc {
                udf.payload_crc32 = Some(WRONG_CRC);
            }
            let mut init = Init::new(UdfWorkerDataFormat::Arrow, udf);
            if *bad == BadInit::Version {
                init.protocol_version = Some(2);
            }
            if *chunking {
                init.is_chunking_payload = Some(true);
            }
            UdfRequest::init(init)
        }
        Op::Chunk { last } => UdfRequest::payload_chunk(data.unwrap_or_default(), *last),
        Op::EmptyChunk => UdfRequest::payload_chunk(Bytes::new(), false),
        Op::Data => UdfRequest::data(data.unwrap_or_default()),
        Op::Finish => UdfRequest::finish(),
        Op::Cancel => UdfRequest::cancel(Some("model cancel".into())),
        Op::Malformed => UdfRequest { request: None },
        _ => return None,
    })
}

/// The data a request op carried in the reference (the id it minted).
fn minted(r: &WorkerRef, op: &Op) -> Option<Bytes> {
    match op {
        Op::Chunk { .. } => Some(Bytes::from(format!("chunk-{}", r.next_id))),
        Op::Data => Some(Bytes::from(format!("in-{}", r.next_id))),
        _ => None,
    }
}

/// Every batch of every case of [`worker_core_matches_reference_model`].
static WORKER_OUTPUT: model_support::Tally = model_support::Tally::new();

impl WorkerSut {
    fn step(&mut self, r: &WorkerRef, op: &Op) -> Result<(), TestCaseError> {
        if let Some(request) = request_for(op, minted(r, op)) {
            self.core.handle_request(request);
            return self.check(r);
        }
        match (op, &r.expect) {
            (Op::StreamEnd, Expect::Nothing) => self.core.handle_stream_end(),
            (Op::ConnectionError, Expect::Nothing) => self
                .core
                .handle_connection_error(ConnectionError::transport("model connection error")),
            (Op::TakeInit, Expect::TakeInit(expected)) => {
                let got = self.core.take_init();
                prop_assert_eq!(
                    got.and_then(|i| i.udf).map(|u| u.payload),
                    expected.clone(),
                    "take_init: the assembled payload (R1)"
                );
            }
            (Op::AcceptInit, Expect::Allowed(ok)) => {
                let got = self
                    .core
                    .accept_init(Some(Bytes::from_static(b"init-result")));
                prop_assert_eq!(got.is_ok(), *ok, "accept_init");
            }
            (Op::RejectInit, Expect::Allowed(ok)) => {
                let e = ExecutionError::user_with_class(
                    format!("user-error-{}", r.next_id),
                    "ModelError",
                );
                prop_assert_eq!(self.core.reject_init(e).is_ok(), *ok, "reject_init");
            }
            (Op::Fail, Expect::Allowed(ok)) => {
                let e = ExecutionError::user_with_class(
                    format!("user-error-{}", r.next_id),
                    "ModelError",
                );
                prop_assert_eq!(self.core.fail(e).is_ok(), *ok, "fail");
            }
            (Op::FinishUser, Expect::Allowed(ok)) => {
                let mut response = FinishResponse::default();
                response
                    .metrics
                    .insert("id".into(), format!("finish-{}", r.next_id));
                prop_assert_eq!(self.core.finish(response).is_ok(), *ok, "finish");
            }
            (Op::Cancelled, Expect::Allowed(ok)) => {
                let got = self.core.cancelled(CancelResponse::default());
                prop_assert_eq!(got.is_ok(), *ok, "cancelled");
            }
            (Op::SendData, Expect::SendData(data, expected)) => {
                let got = self.core.send_data(data.clone());
                match (got, expected) {
                    (Ok(DataSent::Queued(ticket)), Ok(Some(n))) => {
                        self.tickets.push((*n, ticket, Delivery::Queued));
                    }
                    (Ok(DataSent::Dropped), Ok(None)) | (Err(_), Err(())) => {}
                    (got, expected) => {
                        prop_assert!(
                            false,
                            "send_data: got {:?}, the model says {:?}",
                            got,
                            expected
                        )
                    }
                }
            }
            (Op::Transmit(n), Expect::Transmit(expected)) => {
                for i in 0..*n {
                    let got = self.core.poll_transmit();
                    prop_assert_eq!(got.as_ref(), expected.get(i), "transmitted response");
                    let Some(response) = got else { break };
                    self.wire.push(response);
                    check_wire(&self.wire)?;
                }
            }
            (Op::PopInput, Expect::PopInput(expected)) => {
                prop_assert_eq!(self.core.pop_input(), expected.clone(), "pop_input");
            }
            (Op::DiscardInput, Expect::DiscardInput(expected)) => {
                prop_assert_eq!(self.core.discard_input(), *expected, "discard_input");
            }
            (Op::Wait(secs), Expect::Deadline(expected)) => {
                self.core.begin_wait(self.at(self.now));
                prop_assert_eq!(
                    self.core.poll_timeout(),
                    expected.map(|ms| self.at(ms)),
                    "armed deadline (udf §4.6, §2 R4)"
                );
                self.now += u64::from(*secs) * 1000;
                self.core.handle_timeout(self.at(self.now));
            }
            (Op::Timeout, Expect::Deadline(expected)) => {
                self.core.begin_wait(self.at(self.now));
                let at = self.core.poll_timeout();
                prop_assert_eq!(
                    at,
                    expected.map(|ms| self.at(ms)),
                    "armed deadline (udf §4.6, §2 R4)"
                );
                if let Some(ms) = *expected {
                    let phase = self.core.phase();
                    self.core
                        .handle_timeout(self.at(ms) - Duration::from_millis(1));
                    prop_assert_eq!(
                        self.core.phase(),
                        phase,
                        "nothing expires a millisecond early"
                    );
                    self.now = ms;
                    self.core.handle_timeout(self.at(ms));
                }
            }
            (op, expect) => panic!("the reference predicted {expect:?} for {op:?}"),
        }
        self.check(r)
    }

    fn at(&self, ms: u64) -> Instant {
        self.origin + Duration::from_millis(ms)
    }

    fn check(&mut self, r: &WorkerRef) -> Result<(), TestCaseError> {
        let core = &self.core;
        let m = &r.model;
        prop_assert_eq!(core.phase(), m.phase, "phase");
        prop_assert_eq!(core.is_done(), m.done(), "done");
        prop_assert_eq!(
            core.outcome().map(Outcome::observed),
            m.outcome.clone(),
            "outcome"
        );
        prop_assert_eq!(
            core.init()
                .and_then(|i| i.udf.as_ref())
                .map(|u| u.payload.clone()),
            m.init.clone(),
            "the Init waiting for the user"
        );
        prop_assert_eq!(
            core.cancel_received().map(|c| c.reason.clone()),
            m.cancel.clone(),
            "Cancel received"
        );
        prop_assert_eq!(core.finish_received(), m.finish_received, "Finish received");
        prop_assert_eq!(core.reported_error(), m.reported.as_ref(), "reported error");
        prop_assert_eq!(
            core.init_rejection(),
            m.rejection.as_ref(),
            "init rejection"
        );
        prop_assert_eq!(
            core.init_response_sent(),
            m.init_response_sent,
            "InitResponse sent"
        );
        prop_assert_eq!(core.stats(), m.stats, "counters");
        prop_assert_eq!(core.input_len(), m.input.len(), "input queue");
        let input_bytes: usize = m.input.iter().map(Bytes::len).sum();
        prop_assert_eq!(core.input_bytes(), input_bytes, "input bytes");
        prop_assert_eq!(
            core.has_transmit(),
            !m.outbox.is_empty(),
            "queued responses"
        );
        prop_assert_eq!(
            core.wants_recv(),
            !m.done()
                && (m.input.is_empty()
                    || (m.input.len() < INPUT_BUFFER && input_bytes < INPUT_BUFFER_BYTES)),
            "wants_recv (udf §1.4 back-pressure: batches and bytes)"
        );
        prop_assert_eq!(
            core.wants_half_close(),
            m.done() && m.outbox.is_empty(),
            "half-close"
        );
        prop_assert_eq!(
            core.poll_timeout(),
            m.armed().map(|ms| self.at(ms)),
            "armed deadline"
        );
        for (n, ticket, seen) in &mut self.tickets {
            let now = core.delivery(*ticket);
            prop_assert_eq!(now, m.delivery(*n), "delivery of ticket {}", n);
            prop_assert!(
                *seen == Delivery::Queued || now == *seen,
                "ticket {} went from {:?} to {:?}",
                n,
                seen,
                now
            );
            *seen = now;
        }
        Ok(())
    }

    /// Drains the responses, checks the wire once more, and tallies the batches: every
    /// queued one crossed exactly once and in order when `Finished`; a prefix otherwise.
    fn finish_run(&mut self, mut r: WorkerRef) -> Result<(), TestCaseError> {
        while let Some(got) = self.core.poll_transmit() {
            let expected = r.model.transmit();
            prop_assert_eq!(Some(&got), expected.as_ref(), "transmitted response");
            self.wire.push(got);
            check_wire(&self.wire)?;
        }
        prop_assert_eq!(r.model.transmit(), None, "the core held back a response");
        self.check(&r)?;
        let crossed: Vec<Bytes> = self
            .wire
            .iter()
            .filter_map(|w| match w.clone().into_message() {
                Ok(ResponseMessage::Data(d)) => Some(d),
                _ => None,
            })
            .collect();
        let finished = r.model.outcome == Some(Outcome::Finished);
        if finished {
            // R5 (a): the terminator follows the last batch.
            prop_assert!(
                matches!(
                    self.wire.last().map(|w| w.clone().into_message()),
                    Some(Ok(ResponseMessage::Finish(_)))
                ),
                "a Finished session must end with FinishResponse"
            );
        }
        let prefix = crossed.len().min(r.queued.len());
        let duplicated = crossed.len().saturating_sub(r.queued.len()) as u64
            + crossed[..prefix]
                .iter()
                .zip(&r.queued)
                .filter(|(a, b)| a != b)
                .count() as u64;
        let lost = if finished {
            r.queued.len().saturating_sub(crossed.len()) as u64
        } else {
            0
        };
        WORKER_OUTPUT.record("batches", crossed.len() as u64, lost, duplicated);
        Ok(())
    }
}

/// Rules on the responses the worker handed to the transport (udf §2 R2, R4, R5).
fn check_wire(wire: &[UdfResponse]) -> Result<(), TestCaseError> {
    let messages: Vec<ResponseMessage> = wire
        .iter()
        .map(|w| w.clone().into_message())
        .collect::<Result<_, _>>()
        .map_err(|e| TestCaseError::fail(format!("the worker sent a malformed response: {e}")))?;
    let mut init_ok = false;
    let mut init_seen = false;
    let mut errors = 0;
    let mut terminators = 0;
    for (i, m) in messages.iter().enumerate() {
        prop_assert_eq!(terminators, 0, "{:?} sent after the terminator", m);
        match m {
            ResponseMessage::Init(r) => {
                prop_assert!(!init_seen, "a second InitResponse");
                prop_assert_eq!(i, 0, "InitResponse not first");
                init_seen = true;
                init_ok = r.error.is_none();
                errors += usize::from(r.error.is_some());
            }
            ResponseMessage::Data(_) => {
                prop_assert!(
                    init_ok,
                    "DataResponse without an accepted InitResponse (R2)"
                );
                prop_assert_eq!(errors, 0, "DataResponse after an error (R4)");
            }
            ResponseMessage::Error(_) => {
                prop_assert!(init_seen, "ErrorResponse before the InitResponse");
                errors += 1;
            }
            ResponseMessage::Finish(_) | ResponseMessage::Cancel(_) => terminators += 1,
        }
        prop_assert!(errors <= 1, "more than one error (R4)");
    }
    Ok(())
}

/// The state-machine test of [`WorkerCore`] against [`WorkerReference`].
struct WorkerCoreTest;

impl StateMachineTest for WorkerCoreTest {
    type SystemUnderTest = WorkerSut;
    type Reference = WorkerReference;

    fn init_test(r: &WorkerRef) -> WorkerSut {
        let mut sut = WorkerSut {
            core: WorkerCore::new(&config()),
            origin: Instant::now(),
            now: 0,
            wire: Vec::new(),
            tickets: Vec::new(),
        };
        or_panic(sut.check(r));
        sut
    }

    fn apply(mut sut: WorkerSut, r: &WorkerRef, op: Op) -> WorkerSut {
        or_panic(sut.step(r, &op));
        sut
    }

    fn teardown(mut sut: WorkerSut, r: WorkerRef) {
        or_panic(sut.finish_run(r));
    }
}

#[test]
fn worker_core_matches_reference_model() {
    model_support::run::<WorkerCoreTest>(
        "worker core (WorkerCore)",
        "batches",
        512,
        1..60,
        &WORKER_OUTPUT,
    );
}

/// The schedules reach every ending (guards against a generator that only ever produces
/// early violations), including the R4 timeout and the wait for the `Init` through the
/// core's own deadlines.
#[test]
fn worker_schedules_cover_every_outcome() {
    let mut seen = std::collections::BTreeSet::new();
    let mut finished_with_batches = false;
    let schedules = model_support::samples(WorkerReference::sequential_strategy(1..60), 512);
    for (initial, ops, _) in schedules {
        let mut r = initial;
        for op in &ops {
            r = WorkerReference::apply(r, op);
        }
        match &r.model.outcome {
            Some(Outcome::Violation(EngineViolation::NoCancelAfterError { .. })) => {
                seen.insert("R4 timeout".to_string());
            }
            Some(Outcome::InitTimedOut(_)) => {
                seen.insert("Init timeout".to_string());
            }
            Some(o) => {
                seen.insert(
                    format!("{o:?}")
                        .split([' ', '(', '{'])
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                );
            }
            None => {}
        }
        finished_with_batches |=
            r.model.outcome == Some(Outcome::Finished) && r.model.data_queued > 0;
    }
    for kind in [
        "Finished",
        "Cancelled",
        "Violation",
        "TransportFailed",
        "R4 timeout",
        "Init timeout",
    ] {
        assert!(seen.contains(kind), "no schedule ended {kind}: {seen:?}");
    }
    assert!(finished_with_batches, "no session finished with output");
}
