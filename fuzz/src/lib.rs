//! Shared pieces of tether's fuzz targets: watchers that wrap the two UDF session cores
//! and check the udf §2 / §4 invariants on every request or response they hand out, and
//! the structured inputs (`arbitrary`) the core targets share.
//!
//! A watcher never decides what the core should do; it only records what the core did and
//! panics (a fuzzer crash) when that breaks a rule of the protocol.

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use bytes::Bytes;
use tether::connection::ConnectionError;
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, Init, InitResponse, RequestKind,
    RequestMessage, ResponseKind, ResponseMessage, UdfPayload, UdfRequest, UdfResponse,
    UdfWorkerDataFormat,
};
use tether::worker::endpoint::{
    DataSent, DataTicket, Delivery, EndpointConfig, OutcomeKind, WorkerCore, WorkerPhase,
};
use tether::worker::engine::{
    EngineCore, EnginePhase, SessionConfig, Termination, TerminationKind, TransportFailure,
};

/// A batch whose bytes are its sequence number, so order and duplicates can be checked.
pub fn tagged(n: u32) -> Bytes {
    Bytes::copy_from_slice(&n.to_be_bytes())
}

/// The sequence number of a [`tagged`] batch.
pub fn tag_of(b: &Bytes) -> u32 {
    let a: [u8; 4] = b.as_ref().try_into().expect("a tagged batch has 4 bytes");
    u32::from_be_bytes(a)
}

/// The flattened view of a request the cores produced (they never send an empty oneof).
pub fn req_msg(r: &UdfRequest) -> RequestMessage {
    r.clone().into_message().expect("a well-formed request")
}

/// The flattened view of a response the cores produced.
pub fn resp_msg(r: &UdfResponse) -> ResponseMessage {
    r.clone().into_message().expect("a well-formed response")
}

/// A transport error for the `handle_connection_error` events.
pub fn conn_error() -> ConnectionError {
    ConnectionError::transport(std::io::Error::other("fuzzed transport failure"))
}

/// Session deadlines short enough that a fuzzed clock reaches them (udf §7).
pub fn engine_config(output_buffer: u8) -> SessionConfig {
    SessionConfig {
        init_timeout: Duration::from_secs(10),
        terminal_timeout: Duration::from_secs(30),
        interrupt_cancel_timeout: Duration::from_secs(2),
        output_buffer: usize::from(output_buffer % 8) + 1,
        timer: None,
    }
}

/// A worker config with the R4 cancel timeout on a fuzzed clock (udf §2 R4).
pub fn worker_config(input_buffer: u8) -> EndpointConfig {
    EndpointConfig {
        input_buffer: usize::from(input_buffer % 8) + 1,
        cancel_timeout: Some(Duration::from_secs(30)),
        timer: None,
        ..EndpointConfig::new()
    }
}

/// An `Init` whose payload is `len` bytes (chunked by the engine when asked).
pub fn init_message(len: u8) -> Init {
    let payload = Bytes::from(vec![0x5a; usize::from(len)]);
    Init::new(UdfWorkerDataFormat::Arrow, UdfPayload::new(payload, "fuzz"))
}

// -------------------------------------------------------------------------------------------
// Engine side
// -------------------------------------------------------------------------------------------

/// An [`EngineCore`] and everything it has transmitted, checked after each step.
pub struct EngineWatch {
    /// The core under test.
    pub core: EngineCore,
    /// Every request handed out by `poll_transmit`, in order.
    pub sent: Vec<UdfRequest>,
    /// The first settled terminal, as `Debug` text (first wins, never changes).
    first_terminal: Option<String>,
    /// Batches popped from the output queue, in order.
    pub output: Vec<Bytes>,
}

fn is_farewell(t: &Termination) -> bool {
    matches!(
        t,
        Termination::Interrupted(_)
            | Termination::TransportFailed(TransportFailure::Timeout { .. })
    )
}

impl EngineWatch {
    /// A fresh core with `config`.
    pub fn new(config: &SessionConfig) -> Self {
        Self {
            core: EngineCore::new(config),
            sent: Vec::new(),
            first_terminal: None,
            output: Vec::new(),
        }
    }

    fn count(&self, kind: RequestKind) -> usize {
        self.sent.iter().filter(|r| r.kind() == Some(kind)).count()
    }

    /// Takes every queued request, checking each against the udf §2 request rules.
    pub fn transmit(&mut self) -> Vec<UdfRequest> {
        let mut out = Vec::new();
        while let Some(req) = self.core.poll_transmit() {
            self.check_request(&req);
            self.sent.push(req.clone());
            out.push(req);
            self.check();
        }
        assert!(!self.core.has_transmit());
        out
    }

    fn check_request(&self, req: &UdfRequest) {
        assert!(
            !self.core.requests_abandoned(),
            "a request after the shutdown was abandoned"
        );
        let kind = req.kind().expect("the engine never sends an empty oneof");
        if let Some(t) = self.core.terminal() {
            // udf §4.2: nothing after the terminal but the best-effort Cancel of a timeout
            // or an interrupt (udf §4.9, §7).
            assert!(
                kind == RequestKind::Cancel && is_farewell(t),
                "{kind:?} transmitted after the terminal {t:?}"
            );
        }
        let cancelled = self.count(RequestKind::Cancel) > 0;
        let prev = self.sent.last();
        match kind {
            RequestKind::Init => assert!(self.sent.is_empty(), "Init is the first request, once"),
            RequestKind::PayloadChunk => {
                let ok = match prev.map(req_msg) {
                    Some(RequestMessage::Init(i)) => i.is_chunking_payload == Some(true),
                    Some(RequestMessage::PayloadChunk(c)) => c.last != Some(true),
                    _ => false,
                };
                assert!(ok, "PayloadChunk outside the chunk run (udf §2 R1)");
            }
            RequestKind::Data | RequestKind::Finish => {
                assert!(!cancelled, "{kind:?} after Cancel (udf §4.7)");
                assert_eq!(self.count(RequestKind::Finish), 0, "{kind:?} after Finish");
                assert!(self.count(RequestKind::Init) == 1, "{kind:?} before Init");
                match prev.map(req_msg) {
                    Some(RequestMessage::PayloadChunk(c)) => {
                        assert_eq!(c.last, Some(true), "{kind:?} inside the chunk run")
                    }
                    Some(RequestMessage::Init(i)) => {
                        assert_ne!(
                            i.is_chunking_payload,
                            Some(true),
                            "{kind:?} before the chunks"
                        )
                    }
                    _ => {}
                }
            }
            RequestKind::Cancel => {
                assert!(!cancelled, "a second Cancel (udf §4.8: one choke point)");
                assert!(self.count(RequestKind::Init) == 1, "Cancel before Init");
            }
        }
    }

    /// The invariants that hold between any two steps.
    pub fn check(&mut self) {
        let c = &self.core;
        assert_eq!(
            c.phase() == EnginePhase::Terminated,
            c.is_terminal(),
            "phase Terminated ⇔ a terminal"
        );
        match (&self.first_terminal, c.terminal()) {
            (Some(first), Some(now)) => {
                assert_eq!(first, &format!("{now:?}"), "first terminal wins (udf §4.2)")
            }
            (Some(first), None) => panic!("the terminal {first} was unset"),
            (None, Some(now)) => self.first_terminal = Some(format!("{now:?}")),
            (None, None) => {}
        }
        if let Some(t) = c.terminal() {
            assert_ne!(
                t.kind(),
                TerminationKind::Failed,
                "the engine never settles Failed"
            );
            if !is_farewell(t) {
                assert!(!c.has_transmit(), "requests queued after a clean terminal");
            }
        }
        if c.cancel_requested() {
            assert!(!c.may_send(), "may_send after Cancel");
        }
        assert_eq!(
            c.stats().data_sent,
            self.count(RequestKind::Data) as u64,
            "data_sent counts the transmitted DataRequests"
        );
        if c.requests_abandoned() {
            assert!(!c.has_transmit());
        }
    }

    /// Pops the output queue, checking that batches come out in the worker's order.
    pub fn pop_all(&mut self) {
        while let Some(b) = self.core.pop_output() {
            if let Some(prev) = self.output.last() {
                assert!(
                    tag_of(prev) < tag_of(&b),
                    "output out of order or duplicated"
                );
            }
            self.output.push(b);
        }
    }

    /// Blocks at `now` and sleeps until the armed deadline, if any (udf §7): returns the
    /// new time.
    pub fn wait_for_deadline(&mut self, now: Instant) -> Instant {
        self.core.begin_wait(now);
        match self.core.poll_timeout() {
            Some(at) => {
                self.wait(now, at);
                at
            }
            None => now,
        }
    }

    /// A wait at `now` ending at `until` (`until ≥ now`): `begin_wait`, then
    /// `handle_timeout(until)`. Checks the deadline table's promises (udf §7): a deadline
    /// is armed in every state that has one, nothing happens before it, and it never stays
    /// due after `handle_timeout`.
    pub fn wait(&mut self, now: Instant, until: Instant) {
        self.core.begin_wait(now);
        let c = &self.core;
        let expects_deadline = (!c.is_terminal() && c.phase() != EnginePhase::Created)
            || (c.is_terminal() && !c.requests_abandoned());
        let at = c.poll_timeout();
        assert_eq!(
            at.is_some(),
            expects_deadline,
            "deadline armed per udf §7's table"
        );
        if let Some(at) = at {
            assert!(at > now, "a fresh deadline is in the future");
            let before = format!("{:?}", c.terminal());
            let before_phase = c.phase();
            if until < at {
                self.core.handle_timeout(until);
                assert_eq!(
                    before,
                    format!("{:?}", self.core.terminal()),
                    "early expiry"
                );
                assert_eq!(before_phase, self.core.phase(), "early expiry");
                assert_eq!(
                    self.core.poll_timeout(),
                    Some(at),
                    "early handle_timeout disarmed"
                );
            } else {
                self.core.handle_timeout(until);
                assert!(
                    self.core.poll_timeout().is_none_or(|next| next > until),
                    "a deadline stays due after handle_timeout"
                );
            }
        }
        self.check();
    }
}

// -------------------------------------------------------------------------------------------
// Worker side
// -------------------------------------------------------------------------------------------

/// A [`WorkerCore`] and everything it has transmitted, checked after each step.
pub struct WorkerWatch {
    /// The core under test.
    pub core: WorkerCore,
    /// Every response handed out by `poll_transmit`, in order.
    pub sent: Vec<UdfResponse>,
    first_outcome: Option<OutcomeKind>,
    tickets: Vec<(DataTicket, Delivery)>,
    /// Batches popped from the input queue, in order.
    pub input: Vec<Bytes>,
}

fn is_terminator(r: &UdfResponse) -> bool {
    matches!(
        r.kind(),
        Some(ResponseKind::Finish) | Some(ResponseKind::Cancel)
    )
}

impl WorkerWatch {
    /// A fresh core with `config`.
    pub fn new(config: &EndpointConfig) -> Self {
        Self {
            core: WorkerCore::new(config),
            sent: Vec::new(),
            first_outcome: None,
            tickets: Vec::new(),
            input: Vec::new(),
        }
    }

    /// How many terminators were handed to the transport.
    pub fn terminators_sent(&self) -> usize {
        self.sent.iter().filter(|r| is_terminator(r)).count()
    }

    fn error_sent(&self) -> bool {
        self.sent.iter().any(|r| match resp_msg(r) {
            ResponseMessage::Error(_) => true,
            ResponseMessage::Init(i) => i.error.is_some(),
            _ => false,
        })
    }

    /// Takes every queued response, checking each against the udf §2 response rules.
    pub fn transmit(&mut self) -> Vec<UdfResponse> {
        let mut out = Vec::new();
        while let Some(resp) = self.core.poll_transmit() {
            self.check_response(&resp);
            self.sent.push(resp.clone());
            out.push(resp);
            self.check();
        }
        out
    }

    fn check_response(&self, resp: &UdfResponse) {
        let kind = resp.kind().expect("the worker never sends an empty oneof");
        assert_eq!(
            self.terminators_sent(),
            0,
            "{kind:?} after the terminator (udf §2 R5)"
        );
        let init_sent = self
            .sent
            .iter()
            .any(|r| r.kind() == Some(ResponseKind::Init));
        match kind {
            ResponseKind::Init => assert!(self.sent.is_empty(), "InitResponse first, once"),
            ResponseKind::Data => {
                assert!(init_sent, "DataResponse before InitResponse (udf §2 R2)");
                assert!(
                    !self.error_sent(),
                    "DataResponse after the error (udf §2 R4)"
                );
                assert!(
                    self.core.cancel_received().is_none(),
                    "DataResponse after Cancel (udf §2 R3)"
                );
            }
            ResponseKind::Error => {
                assert!(init_sent, "ErrorResponse before InitResponse");
                assert!(!self.error_sent(), "a second error (udf §2 R4)");
            }
            ResponseKind::Finish => {
                assert!(self.core.finish_received(), "FinishResponse without Finish");
                assert!(self.core.cancel_received().is_none() || self.core.finish_received());
            }
            ResponseKind::Cancel => {}
        }
    }

    /// The invariants that hold between any two steps.
    pub fn check(&mut self) {
        let c = &self.core;
        assert_eq!(c.is_done(), c.outcome().is_some(), "done ⇔ an outcome");
        assert_eq!(
            c.is_done(),
            c.phase() == WorkerPhase::Done,
            "done ⇔ phase Done"
        );
        let now = c.outcome().map(|o| o.kind());
        match (self.first_outcome, now) {
            (Some(first), Some(now)) if first != now => {
                // Only a transport failure before the terminator went out may replace it.
                assert_eq!(
                    now,
                    OutcomeKind::TransportFailed,
                    "outcome changed {first:?}"
                );
                assert_eq!(
                    self.terminators_sent(),
                    0,
                    "outcome changed after the terminator"
                );
                self.first_outcome = Some(now);
            }
            (Some(_), None) => panic!("the outcome was unset"),
            (None, Some(now)) => self.first_outcome = Some(now),
            _ => {}
        }
        if let Some(kind) = now {
            let last = self.sent.last();
            if self.terminators_sent() > 0 {
                let want = match kind {
                    OutcomeKind::Finished => ResponseKind::Finish,
                    OutcomeKind::Cancelled | OutcomeKind::ProtocolViolation => ResponseKind::Cancel,
                    OutcomeKind::TransportFailed => panic!("TransportFailed after the terminator"),
                };
                assert_eq!(
                    last.and_then(|r| r.kind()),
                    Some(want),
                    "terminator ⇔ outcome"
                );
            }
            if kind != OutcomeKind::TransportFailed && !c.has_transmit() {
                assert_eq!(
                    self.terminators_sent(),
                    1,
                    "exactly one terminator (udf §2 R5)"
                );
            }
        } else {
            assert_eq!(self.terminators_sent(), 0);
        }
        if c.wants_half_close() {
            assert!(c.is_done() && !c.has_transmit());
        }
        // Tickets move once, from Queued to Transmitted or Dropped.
        let data_sent = self
            .sent
            .iter()
            .filter(|r| r.kind() == Some(ResponseKind::Data))
            .count();
        let mut transmitted = 0;
        for (ticket, seen) in &mut self.tickets {
            let d = c.delivery(*ticket);
            if *seen != Delivery::Queued {
                assert_eq!(d, *seen, "a ticket's delivery changed twice");
            }
            *seen = d;
            transmitted += usize::from(d == Delivery::Transmitted);
        }
        assert_eq!(
            transmitted, data_sent,
            "Transmitted tickets ⇔ DataResponses sent"
        );
    }

    /// `send_data` with a tagged batch, tracking its ticket.
    pub fn send_data(&mut self, tag: u32) -> bool {
        let phase = self.core.phase();
        let had = self.core.has_transmit();
        match self.core.send_data(tagged(tag)) {
            Ok(DataSent::Queued(t)) => {
                self.tickets.push((t, Delivery::Queued));
                true
            }
            Ok(DataSent::Dropped) => false,
            Err(_) => {
                assert_eq!(phase, self.core.phase(), "a misuse changed the phase");
                assert_eq!(had, self.core.has_transmit(), "a misuse queued a response");
                false
            }
        }
    }

    /// Pops the input queue, checking the engine's order.
    pub fn pop_all(&mut self) {
        while let Some(b) = self.core.pop_input() {
            if let Some(prev) = self.input.last() {
                assert!(
                    tag_of(prev) < tag_of(&b),
                    "input out of order or duplicated"
                );
            }
            self.input.push(b);
        }
    }

    /// Runs one user answer; a misuse must leave the core as it was.
    pub fn user(&mut self, answer: UserAnswer) {
        let phase = self.core.phase();
        let had = self.core.has_transmit();
        let r = match answer {
            UserAnswer::TakeInit => {
                let _ = self.core.take_init();
                Ok(())
            }
            UserAnswer::Accept => self.core.accept_init(Some(Bytes::from_static(b"ok"))),
            UserAnswer::Reject => self.core.reject_init(ExecutionError::user("no")),
            UserAnswer::Fail => self.core.fail(ExecutionError::worker("failed")),
            UserAnswer::Finish => self.core.finish(FinishResponse::default()),
            UserAnswer::Cancelled => self.core.cancelled(CancelResponse::default()),
        };
        if r.is_err() {
            assert_eq!(phase, self.core.phase(), "a misuse changed the phase");
            assert_eq!(had, self.core.has_transmit(), "a misuse queued a response");
        }
        self.check();
    }

    /// Blocks at `now` and sleeps until the armed deadline, if any (udf §7): returns the
    /// new time.
    pub fn wait_for_deadline(&mut self, now: Instant) -> Instant {
        self.core.begin_wait(now);
        match self.core.poll_timeout() {
            Some(at) => {
                self.wait(now, at);
                at
            }
            None => now,
        }
    }

    /// A wait from `now` to `until`: the R4 cancel deadline is armed exactly in
    /// `PostError`, and nothing happens before it (udf §2 R4).
    pub fn wait(&mut self, now: Instant, until: Instant) {
        self.core.begin_wait(now);
        let at = self.core.poll_timeout();
        assert_eq!(
            at.is_some(),
            self.core.phase() == WorkerPhase::PostError,
            "the R4 deadline runs exactly in PostError"
        );
        if let Some(at) = at {
            let phase = self.core.phase();
            self.core.handle_timeout(until);
            if until < at {
                assert_eq!(phase, self.core.phase(), "early R4 expiry");
            } else {
                assert!(self.core.is_done(), "R4 expiry closes the stream");
            }
        } else {
            self.core.handle_timeout(until);
        }
        self.check();
    }
}

/// One answer of the worker's user code (udf §2.1).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum UserAnswer {
    /// `take_init`.
    TakeInit,
    /// `accept_init`.
    Accept,
    /// `reject_init`.
    Reject,
    /// `fail` (an `ErrorResponse`, udf §2 R4).
    Fail,
    /// `finish` (the `FinishResponse`).
    Finish,
    /// `cancelled` (the `CancelResponse`).
    Cancelled,
}

/// A response a (possibly hostile) worker sends to the engine.
#[derive(Arbitrary, Debug, Clone)]
pub enum FuzzResponse {
    /// `InitResponse`, with or without an error.
    Init { error: bool },
    /// A `DataResponse`.
    Data,
    /// An `ErrorResponse`.
    Error,
    /// `FinishResponse`.
    Finish,
    /// `CancelResponse`.
    Cancel,
    /// An envelope with no oneof set.
    Empty,
}

impl FuzzResponse {
    /// The wire message; data batches get the tag `tag`.
    pub fn message(&self, tag: u32) -> UdfResponse {
        match self {
            Self::Init { error: false } => UdfResponse::init(InitResponse::default()),
            Self::Init { error: true } => UdfResponse::init(InitResponse {
                error: Some(ExecutionError::user("init failed")),
                ..InitResponse::default()
            }),
            Self::Data => UdfResponse::data(tagged(tag)),
            Self::Error => UdfResponse::error(ExecutionError::user("boom")),
            Self::Finish => UdfResponse::finish(FinishResponse::default()),
            Self::Cancel => UdfResponse::cancel(CancelResponse::default()),
            Self::Empty => UdfResponse::default(),
        }
    }
}

/// A request a (possibly hostile) engine sends to the worker.
#[derive(Arbitrary, Debug, Clone)]
pub enum FuzzRequest {
    /// `Init`, inline or announcing chunks, with a good or a bad protocol version.
    Init {
        chunked: bool,
        bad_version: bool,
        len: u8,
    },
    /// A `PayloadChunk`.
    Chunk { last: bool, len: u8 },
    /// A `DataRequest`.
    Data,
    /// `Finish`.
    Finish,
    /// `Cancel`.
    Cancel,
    /// An envelope with no oneof set.
    Empty,
}

impl FuzzRequest {
    /// The wire message; data batches get the tag `tag`.
    pub fn message(&self, tag: u32) -> UdfRequest {
        match self {
            Self::Init {
                chunked,
                bad_version,
                len,
            } => {
                let mut init = init_message(*len);
                if *chunked {
                    init.is_chunking_payload = Some(true);
                }
                if *bad_version {
                    init.protocol_version = Some(99);
                }
                UdfRequest::init(init)
            }
            Self::Chunk { last, len } => {
                UdfRequest::payload_chunk(Bytes::from(vec![1; usize::from(*len)]), *last)
            }
            Self::Data => UdfRequest::data(tagged(tag)),
            Self::Finish => UdfRequest::finish(),
            Self::Cancel => UdfRequest::cancel(Some("fuzz".into())),
            Self::Empty => UdfRequest::default(),
        }
    }
}
