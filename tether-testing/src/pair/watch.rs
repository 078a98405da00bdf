//! Watchers: an [`EngineCore`] or a [`WorkerCore`] wrapped so that every request or
//! response it hands out, and its state between any two steps, is checked against the
//! udf §2 / §4 rules. A watcher never decides what the core should do; it records what the
//! core did and panics, naming the rule, when that breaks the protocol.

use std::time::Instant;

use bytes::Bytes;

use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, RequestKind, RequestMessage, ResponseKind,
    ResponseMessage, UdfRequest, UdfResponse,
};
use tether::worker::endpoint::{
    DataSent, DataTicket, Delivery, EndpointConfig, EndpointMisuse, OutcomeKind, WorkerCore,
    WorkerPhase,
};
use tether::worker::engine::{
    EngineCore, EnginePhase, SessionConfig, Termination, TerminationKind, TransportFailure,
};

use super::{req_msg, resp_msg};
use crate::fixtures::tag_of;

/// What both watchers share: the wait of udf §7 on a simulated clock. A driver about to
/// block calls `begin_wait(now)`, sleeps until `poll_timeout()` (or until a message comes)
/// and then calls `handle_timeout`: [`wait`](Self::wait) checks each core's deadline
/// promises around that, [`wait_for_deadline`](Self::wait_for_deadline) sleeps exactly
/// until the armed deadline.
pub trait CoreWatch {
    /// The watched core's `begin_wait(now)` then `poll_timeout()`: the deadline a wait that
    /// begins at `now` ends at, if any (udf §7; udf §2 R4 on the worker side).
    fn deadline_from(&mut self, now: Instant) -> Option<Instant>;

    /// A wait from `now` until `until` (`until ≥ now`), checking the core's deadline
    /// promises: nothing happens before the deadline, and it never stays due after
    /// `handle_timeout` (udf §7).
    fn wait(&mut self, now: Instant, until: Instant);

    /// Blocks at `now` and sleeps until the armed deadline, if any (udf §7): returns the
    /// new time (`now` when no deadline is armed).
    fn wait_for_deadline(&mut self, now: Instant) -> Instant {
        match self.deadline_from(now) {
            Some(at) => {
                self.wait(now, at);
                at
            }
            None => now,
        }
    }
}

// -------------------------------------------------------------------------------------------
// Engine side
// -------------------------------------------------------------------------------------------

/// An [`EngineCore`] and everything it has transmitted, checked after each step (udf §2
/// request order, udf §4.2 first terminal wins, udf §4.7 nothing after Cancel, udf §7
/// deadlines).
#[derive(Debug)]
pub struct EngineWatch {
    /// The core under test.
    pub core: EngineCore,
    /// Every request handed out by `poll_transmit`, in order (the wire, udf §2).
    pub sent: Vec<UdfRequest>,
    /// The first settled terminal, as `Debug` text (first wins, never changes).
    first_terminal: Option<String>,
    /// Batches popped from the output queue, in order (udf §4.7).
    pub output: Vec<Bytes>,
    /// The payloads of the transmitted `DataRequest`s, in order.
    data: Vec<Bytes>,
    /// Transmitted `Init`, `Finish` and `Cancel` requests.
    inits: usize,
    finishes: usize,
    cancels: usize,
}

/// Whether `t` is a terminal after which the engine still sends its best-effort Cancel: a
/// timeout or an interrupt (udf §4.9, §7).
pub fn engine_gave_up(t: &Termination) -> bool {
    matches!(
        t,
        Termination::Interrupted(_)
            | Termination::TransportFailed(TransportFailure::Timeout { .. })
    )
}

impl EngineWatch {
    /// A fresh core with `config` (udf §4.1 `Created`).
    pub fn new(config: &SessionConfig) -> Self {
        Self {
            core: EngineCore::new(config),
            sent: Vec::new(),
            first_terminal: None,
            output: Vec::new(),
            data: Vec::new(),
            inits: 0,
            finishes: 0,
            cancels: 0,
        }
    }

    /// The payloads of every `DataRequest` transmitted, in order (udf §1.4).
    pub fn data_sent(&self) -> &[Bytes] {
        &self.data
    }

    /// Takes every queued request, checking each against the udf §2 request rules.
    pub fn transmit(&mut self) -> Vec<UdfRequest> {
        let mut out = Vec::new();
        while let Some(req) = self.core.poll_transmit() {
            self.check_request(&req);
            match req_msg(&req) {
                RequestMessage::Init(_) => self.inits += 1,
                RequestMessage::Data(d) => self.data.push(d),
                RequestMessage::Finish(_) => self.finishes += 1,
                RequestMessage::Cancel(_) => self.cancels += 1,
                RequestMessage::PayloadChunk(_) => {}
            }
            self.sent.push(req.clone());
            out.push(req);
            self.check();
        }
        assert!(
            !self.core.has_transmit(),
            "engine: requests still queued after poll_transmit returned None"
        );
        out
    }

    fn check_request(&self, req: &UdfRequest) {
        assert!(
            !self.core.requests_abandoned(),
            "engine (udf §7): a request after the shutdown was abandoned"
        );
        let kind = req
            .kind()
            .expect("engine (udf §1.2): the engine never sends an empty oneof");
        if let Some(t) = self.core.terminal() {
            assert!(
                kind == RequestKind::Cancel && engine_gave_up(t),
                "engine (udf §4.2): {kind:?} transmitted after the terminal {t:?}; only the \
                 best-effort Cancel of a timeout or an interrupt may follow it"
            );
        }
        let cancelled = self.cancels > 0;
        let prev = self.sent.last();
        match kind {
            RequestKind::Init => assert!(
                self.sent.is_empty(),
                "engine (udf §2): Init is the first request, once"
            ),
            RequestKind::PayloadChunk => {
                let ok = match prev.map(req_msg) {
                    Some(RequestMessage::Init(i)) => i.is_chunking_payload == Some(true),
                    Some(RequestMessage::PayloadChunk(c)) => c.last != Some(true),
                    _ => false,
                };
                assert!(ok, "engine (udf §2 R1): PayloadChunk outside the chunk run");
            }
            RequestKind::Data | RequestKind::Finish => {
                assert!(!cancelled, "engine (udf §4.7): {kind:?} after Cancel");
                assert_eq!(self.finishes, 0, "engine (udf §2): {kind:?} after Finish");
                assert_eq!(self.inits, 1, "engine (udf §2 R3): {kind:?} before Init");
                match prev.map(req_msg) {
                    Some(RequestMessage::PayloadChunk(c)) => assert_eq!(
                        c.last,
                        Some(true),
                        "engine (udf §2 R1): {kind:?} inside the chunk run"
                    ),
                    Some(RequestMessage::Init(i)) => assert_ne!(
                        i.is_chunking_payload,
                        Some(true),
                        "engine (udf §2 R1): {kind:?} before the chunks"
                    ),
                    _ => {}
                }
            }
            RequestKind::Cancel => {
                assert!(
                    !cancelled,
                    "engine (udf §4.8): a second Cancel (one choke point)"
                );
                assert_eq!(self.inits, 1, "engine (udf §2 R3): Cancel before Init");
            }
        }
    }

    /// The invariants that hold between any two steps (udf §4.1, §4.2, §4.7).
    pub fn check(&mut self) {
        let c = &self.core;
        assert_eq!(
            c.phase() == EnginePhase::Terminated,
            c.is_terminal(),
            "engine (udf §4.1): phase Terminated ⇔ a terminal"
        );
        match (&self.first_terminal, c.terminal()) {
            (Some(first), Some(now)) => assert_eq!(
                first,
                &format!("{now:?}"),
                "engine (udf §4.2): the first terminal wins"
            ),
            (Some(first), None) => panic!("engine (udf §4.2): the terminal {first} was unset"),
            (None, Some(now)) => self.first_terminal = Some(format!("{now:?}")),
            (None, None) => {}
        }
        if let Some(t) = c.terminal() {
            assert_ne!(
                t.kind(),
                TerminationKind::Failed,
                "engine (udf §4.1): the engine session never settles Failed"
            );
            if !engine_gave_up(t) {
                assert!(
                    !c.has_transmit(),
                    "engine (udf §4.2): requests queued after the clean terminal {t:?}"
                );
            }
        }
        if c.cancel_requested() {
            assert!(!c.may_send(), "engine (udf §4.7): may_send after Cancel");
        }
        assert_eq!(
            c.stats().data_sent,
            self.data.len() as u64,
            "engine (udf §1.4): data_sent counts the transmitted DataRequests"
        );
        if c.requests_abandoned() {
            assert!(
                !c.has_transmit(),
                "engine (udf §7): requests queued after the shutdown was abandoned"
            );
        }
    }

    /// Pops the output queue into [`output`](Self::output): the engine's reader of
    /// udf §4.7. Batches made by [`tagged`](crate::fixtures::tagged) must come out
    /// in increasing order within each source: the engine's batches carry tags below 2^31,
    /// the worker's own from 2^31 up (the pair's convention).
    pub fn pop_all(&mut self) {
        while let Some(b) = self.core.pop_output() {
            if let (Some(next), Some(prev)) = (tag_of(&b), last_of_source(&self.output, &b)) {
                assert!(
                    prev < next,
                    "engine (udf §4.7): output out of order or duplicated: {prev} then {next}"
                );
            }
            self.output.push(b);
        }
    }
}

impl CoreWatch for EngineWatch {
    fn deadline_from(&mut self, now: Instant) -> Option<Instant> {
        self.core.begin_wait(now);
        self.core.poll_timeout()
    }

    /// Checks the deadline table's promises (udf §7): a deadline is armed in every state
    /// that has one, nothing happens before it, and it never stays due after
    /// `handle_timeout`.
    fn wait(&mut self, now: Instant, until: Instant) {
        self.core.begin_wait(now);
        let c = &self.core;
        let expects_deadline = (!c.is_terminal() && c.phase() != EnginePhase::Created)
            || (c.is_terminal() && !c.requests_abandoned());
        let at = c.poll_timeout();
        assert_eq!(
            at.is_some(),
            expects_deadline,
            "engine (udf §7): a deadline is armed exactly in the states of the deadline table \
             (phase {:?}, terminal {:?})",
            c.phase(),
            c.terminal()
        );
        if let Some(at) = at {
            assert!(
                at > now,
                "engine (udf §7): a fresh deadline is in the future"
            );
            let before = format!("{:?}", c.terminal());
            let before_phase = c.phase();
            self.core.handle_timeout(until);
            if until < at {
                assert_eq!(
                    before,
                    format!("{:?}", self.core.terminal()),
                    "engine (udf §7): a deadline fired early"
                );
                assert_eq!(
                    before_phase,
                    self.core.phase(),
                    "engine (udf §7): a deadline fired early"
                );
                assert_eq!(
                    self.core.poll_timeout(),
                    Some(at),
                    "engine (udf §7): an early handle_timeout disarmed the deadline"
                );
            } else {
                assert!(
                    self.core.poll_timeout().is_none_or(|next| next > until),
                    "engine (udf §7): a deadline stays due after handle_timeout"
                );
            }
        }
        self.check();
    }
}

// -------------------------------------------------------------------------------------------
// Worker side
// -------------------------------------------------------------------------------------------

/// A [`WorkerCore`] and everything it has transmitted, checked after each step (udf §2
/// response order, R4 at most one error, R5 exactly one terminator, nothing after it).
#[derive(Debug)]
pub struct WorkerWatch {
    /// The core under test.
    pub core: WorkerCore,
    /// Every response handed out by `poll_transmit`, in order (the wire, udf §2).
    pub sent: Vec<UdfResponse>,
    first_outcome: Option<OutcomeKind>,
    tickets: Vec<(DataTicket, Delivery)>,
    /// Batches popped from the input queue, in order (udf §1.4).
    pub input: Vec<Bytes>,
    /// Whether the config arms the R4 cancel deadline at all (udf §2 R4).
    r4_deadline: bool,
    /// Whether the config arms the wait for the `Init` at all (udf §4.6).
    init_deadline: bool,
    /// The payloads of the transmitted `DataResponse`s, in order.
    data: Vec<Bytes>,
    /// Transmitted terminators, and whether an `InitResponse` / an error went out.
    terminators: usize,
    init_sent: bool,
    error_sent: bool,
}

/// One answer of the worker's user code to its session (udf §2.1), as the worker fuzzer and
/// the random schedules pick them; [`WorkerWatch::user`] runs one and checks that a misuse
/// changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserAnswer {
    /// `take_init`: the user takes the assembled `Init`.
    TakeInit,
    /// `accept_init`: `InitResponse` without error.
    Accept,
    /// `reject_init`: `InitResponse.error` (udf §2 R4).
    Reject,
    /// `fail`: an `ErrorResponse` (udf §2 R4).
    Fail,
    /// `finish`: the `FinishResponse` (udf §2 R5 (a)).
    Finish,
    /// `cancelled`: the `CancelResponse` (udf §2 R5 (b)).
    Cancelled,
}

impl UserAnswer {
    /// Every answer, for a fuzzer or a strategy to pick from by index (udf §2.1).
    pub const ALL: [Self; 6] = [
        Self::TakeInit,
        Self::Accept,
        Self::Reject,
        Self::Fail,
        Self::Finish,
        Self::Cancelled,
    ];
}

impl WorkerWatch {
    /// A fresh core with `config` (the reference worker's `AwaitingInit`, udf §2.1).
    pub fn new(config: &EndpointConfig) -> Self {
        Self {
            core: WorkerCore::new(config),
            sent: Vec::new(),
            first_outcome: None,
            tickets: Vec::new(),
            input: Vec::new(),
            r4_deadline: config.cancel_timeout.is_some(),
            init_deadline: config.init_timeout.is_some(),
            data: Vec::new(),
            terminators: 0,
            init_sent: false,
            error_sent: false,
        }
    }

    /// How many terminators were handed to the transport (udf §2 R5: one at most).
    pub fn terminators_sent(&self) -> usize {
        self.terminators
    }

    /// The payloads of every `DataResponse` transmitted, in order (udf §1.4).
    pub fn data_sent(&self) -> &[Bytes] {
        &self.data
    }

    /// Takes every queued response, checking each against the udf §2 response rules.
    pub fn transmit(&mut self) -> Vec<UdfResponse> {
        let mut out = Vec::new();
        while let Some(resp) = self.core.poll_transmit() {
            self.check_response(&resp);
            match resp_msg(&resp) {
                ResponseMessage::Init(i) => {
                    self.init_sent = true;
                    self.error_sent |= i.error.is_some();
                }
                ResponseMessage::Data(d) => self.data.push(d),
                ResponseMessage::Error(_) => self.error_sent = true,
                ResponseMessage::Finish(_) | ResponseMessage::Cancel(_) => self.terminators += 1,
            }
            self.sent.push(resp.clone());
            out.push(resp);
            self.check();
        }
        out
    }

    fn check_response(&self, resp: &UdfResponse) {
        let kind = resp
            .kind()
            .expect("worker (udf §1.2): the worker never sends an empty oneof");
        assert_eq!(
            self.terminators_sent(),
            0,
            "worker (udf §2 R5): {kind:?} after the terminator"
        );
        let init_sent = self.init_sent;
        match kind {
            ResponseKind::Init => assert!(
                self.sent.is_empty(),
                "worker (udf §2): InitResponse is the first response, once"
            ),
            ResponseKind::Data => {
                assert!(
                    init_sent,
                    "worker (udf §2 R2): DataResponse before InitResponse"
                );
                assert!(
                    !self.error_sent,
                    "worker (udf §2 R4): DataResponse after the error"
                );
                assert!(
                    self.core.cancel_received().is_none(),
                    "worker (udf §2 R7): DataResponse after Cancel"
                );
            }
            ResponseKind::Error => {
                assert!(
                    init_sent,
                    "worker (udf §2 R4): ErrorResponse before InitResponse"
                );
                assert!(!self.error_sent, "worker (udf §2 R4): a second error");
            }
            ResponseKind::Finish => assert!(
                self.core.finish_received(),
                "worker (udf §2 R5): FinishResponse without Finish"
            ),
            ResponseKind::Cancel => {}
        }
    }

    /// The invariants that hold between any two steps (udf §2 R5, R8).
    pub fn check(&mut self) {
        let c = &self.core;
        assert_eq!(
            c.is_done(),
            c.outcome().is_some(),
            "worker (udf §2 R5): done ⇔ an outcome"
        );
        assert_eq!(
            c.is_done(),
            c.phase() == WorkerPhase::Done,
            "worker (udf §2.1): done ⇔ phase Done"
        );
        let now = c.outcome().map(|o| o.kind());
        match (self.first_outcome, now) {
            (Some(first), Some(now)) if first != now => {
                // Only a transport failure before the terminator went out may replace it.
                assert_eq!(
                    now,
                    OutcomeKind::TransportFailed,
                    "worker (udf §2 R5): the outcome changed from {first:?}"
                );
                assert_eq!(
                    self.terminators_sent(),
                    0,
                    "worker (udf §2 R8): the outcome changed after the terminator"
                );
                self.first_outcome = Some(now);
            }
            (Some(_), None) => panic!("worker (udf §2 R5): the outcome was unset"),
            (None, Some(now)) => self.first_outcome = Some(now),
            _ => {}
        }
        if let Some(kind) = now {
            if self.terminators_sent() > 0 {
                let want = match kind {
                    OutcomeKind::Finished => ResponseKind::Finish,
                    OutcomeKind::Cancelled | OutcomeKind::ProtocolViolation => ResponseKind::Cancel,
                    OutcomeKind::TransportFailed => {
                        panic!("worker (udf §2 R8): TransportFailed after the terminator")
                    }
                };
                assert_eq!(
                    self.sent.last().and_then(|r| r.kind()),
                    Some(want),
                    "worker (udf §2 R5): the terminator matches the outcome {kind:?}"
                );
            }
            if kind != OutcomeKind::TransportFailed && !c.has_transmit() {
                assert_eq!(
                    self.terminators_sent(),
                    1,
                    "worker (udf §2 R5): exactly one terminator"
                );
            }
        } else {
            assert_eq!(
                self.terminators_sent(),
                0,
                "worker (udf §2 R5): a terminator without an outcome"
            );
        }
        if c.wants_half_close() {
            assert!(
                c.is_done() && !c.has_transmit(),
                "worker (udf §2.1): half-close before the terminator went out"
            );
        }
        // Tickets move once, from Queued to Transmitted or Dropped.
        let data_sent = self.data.len();
        let mut transmitted = 0;
        for (ticket, seen) in &mut self.tickets {
            let d = c.delivery(*ticket);
            if *seen != Delivery::Queued {
                assert_eq!(
                    d, *seen,
                    "worker (udf §1.4): a ticket's delivery changed twice"
                );
            }
            *seen = d;
            transmitted += usize::from(d == Delivery::Transmitted);
        }
        assert_eq!(
            transmitted, data_sent,
            "worker (udf §1.4): Transmitted tickets ⇔ DataResponses sent"
        );
    }

    /// `send_data(data)`, tracking its ticket (udf §1.4); `Ok(true)` when queued. A misuse
    /// must leave the core as it was.
    pub fn send_data(&mut self, data: Bytes) -> Result<bool, EndpointMisuse> {
        let phase = self.core.phase();
        let had = self.core.has_transmit();
        let r = match self.core.send_data(data) {
            Ok(DataSent::Queued(t)) => {
                self.tickets.push((t, Delivery::Queued));
                Ok(true)
            }
            Ok(DataSent::Dropped) => Ok(false),
            Err(e) => {
                assert_eq!(
                    phase,
                    self.core.phase(),
                    "worker: a misuse changed the phase"
                );
                assert_eq!(
                    had,
                    self.core.has_transmit(),
                    "worker: a misuse queued a response"
                );
                Err(e)
            }
        };
        self.check();
        r
    }

    /// Pops the input queue into [`input`](Self::input) (the user reads, udf §1.4). Batches
    /// made by [`tagged`](crate::fixtures::tagged) must come out in increasing order
    /// within each source: the engine's batches carry tags below 2^31, the worker's own from
    /// 2^31 up (the pair's convention).
    pub fn pop_all(&mut self) -> Vec<Bytes> {
        let mut read = Vec::new();
        while let Some(b) = self.core.pop_input() {
            self.record_input(b.clone());
            read.push(b);
        }
        read
    }

    /// Records one input batch the user read from the core by other means (the echo
    /// worker's [`answer_pending`](tether::worker::endpoint::answer_pending)), checked as
    /// [`pop_all`](Self::pop_all) checks it (udf §1.4).
    pub fn record_input(&mut self, b: Bytes) {
        if let (Some(next), Some(prev)) = (tag_of(&b), last_of_source(&self.input, &b)) {
            assert!(
                prev < next,
                "worker (udf §1.4): input out of order or duplicated: {prev} then {next}"
            );
        }
        self.input.push(b);
    }

    /// Tracks a `DataResponse` queued by other means (the echo worker's
    /// [`answer_pending`](tether::worker::endpoint::answer_pending)), as
    /// [`send_data`](Self::send_data) tracks its own (udf §1.4).
    pub fn track(&mut self, ticket: DataTicket) {
        self.tickets.push((ticket, Delivery::Queued));
    }

    /// Runs one user answer (udf §2.1); a misuse must leave the core as it was.
    pub fn user(&mut self, answer: UserAnswer) -> Result<(), EndpointMisuse> {
        let phase = self.core.phase();
        let had = self.core.has_transmit();
        let r = match answer {
            UserAnswer::TakeInit => {
                let _ = self.core.take_init();
                Ok(())
            }
            UserAnswer::Accept => self.core.accept_init(Some(Bytes::from_static(b"ok"))),
            UserAnswer::Reject => self.core.reject_init(ExecutionError::user("init rejected")),
            UserAnswer::Fail => self.core.fail(ExecutionError::worker("failed")),
            UserAnswer::Finish => self.core.finish(FinishResponse::default()),
            UserAnswer::Cancelled => self.core.cancelled(CancelResponse::default()),
        };
        self.after_user(phase, had, &r);
        r
    }

    /// Checks a user call's result: a misuse changes neither the phase nor the queue.
    pub(super) fn after_user<T>(
        &mut self,
        phase: WorkerPhase,
        had: bool,
        r: &Result<T, EndpointMisuse>,
    ) {
        if r.is_err() {
            assert_eq!(
                phase,
                self.core.phase(),
                "worker: a misuse changed the phase"
            );
            assert_eq!(
                had,
                self.core.has_transmit(),
                "worker: a misuse queued a response"
            );
        }
        self.check();
    }
}

impl CoreWatch for WorkerWatch {
    fn deadline_from(&mut self, now: Instant) -> Option<Instant> {
        self.core.begin_wait(now);
        self.core.poll_timeout()
    }

    /// The `Init` deadline is armed exactly in `AwaitingInit` and the R4 cancel deadline
    /// exactly in `PostError`, nothing happens before either, the first's expiry ends the
    /// session `TransportFailed` with nothing sent (udf §4.6) and the second's closes the
    /// stream (udf §2 R4).
    fn wait(&mut self, now: Instant, until: Instant) {
        self.core.begin_wait(now);
        let at = self.core.poll_timeout();
        let phase = self.core.phase();
        assert_eq!(
            at.is_some(),
            (self.r4_deadline && phase == WorkerPhase::PostError)
                || (self.init_deadline && phase == WorkerPhase::AwaitingInit),
            "worker (udf §4.6, §2 R4): a deadline runs exactly in AwaitingInit and PostError"
        );
        let had = self.core.has_transmit();
        self.core.handle_timeout(until);
        if let Some(at) = at {
            if until < at {
                assert_eq!(
                    phase,
                    self.core.phase(),
                    "worker (udf §4.6, §2 R4): a deadline fired early"
                );
            } else if phase == WorkerPhase::AwaitingInit {
                assert_eq!(
                    self.core.outcome().map(|o| o.kind()),
                    Some(OutcomeKind::TransportFailed),
                    "worker (udf §4.6): no Init in time ends the session TransportFailed"
                );
                assert!(
                    !had && !self.core.has_transmit(),
                    "worker (udf §4.6): nothing is sent when no Init came"
                );
            } else {
                assert!(
                    self.core.is_done(),
                    "worker (udf §2 R4): the cancel deadline's expiry closes the stream"
                );
            }
        }
        self.check();
    }
}

/// The tag of the last batch in `seen` from the same source as `batch` (udf §1.4, §4.7:
/// each side's batches keep their order). The pair's convention: the engine's batches carry
/// tags below 2^31 and the worker's own batches tags from 2^31 up, so a worker that echoes
/// some inputs and sends batches of its own interleaves two increasing sequences, and
/// only batches of one source are compared.
fn last_of_source(seen: &[Bytes], batch: &Bytes) -> Option<u64> {
    let source = tag_of(batch)? >> 31;
    seen.iter()
        .rev()
        .filter_map(|b| tag_of(b))
        .find(|tag| tag >> 31 == source)
}
