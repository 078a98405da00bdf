//! An [`EngineCore`](tether::worker::engine::EngineCore) ×
//! [`WorkerCore`](tether::worker::endpoint::WorkerCore) pair under simulated time, after quinn-proto's test
//! `Pair`: both sides of one worker session (udf §2, §4) connected by two FIFO queues of
//! in-flight messages, with no I/O and no real clock, so that both sides' rules are checked
//! against each other in microseconds.
//!
//! - The engine side is driven by the test: [`Pair::start_init`] (or [`Pair::connect`],
//!   which also drives the handshake), [`Pair::send`], [`Pair::finish`],
//!   [`Pair::cancel`], [`Pair::close`], [`Pair::interrupt`]. Its reader pops the output
//!   during [`Pair::drive`] ([`Pair::output`]).
//! - The worker side's user code is the reference echo worker of udf §2.1 by default
//!   ([`WorkerUser::Echo`]): [`EchoUdf`], run by the library's
//!   [`answer_pending`], the same `Udf` mapping
//!   `serve` runs. It accepts the `Init` (rejects it with a `WorkerError` when the payload is
//!   `INIT_ERROR`), echoes every batch (answers the batch `ERROR` with a `UserError` of class
//!   `SimulatedError`), answers `Finish` with `FinishResponse { metrics: {status = ok} }`
//!   and `Cancel` with `CancelResponse`. With [`WorkerUser::Manual`] the test answers instead:
//!   [`Pair::worker_accept_init`], [`Pair::worker_echo`], [`Pair::worker_fail`],
//!   [`Pair::worker_finish`], [`Pair::worker_cancelled`], …
//! - [`Pair::drive`] delivers every in-flight message and, when nothing is in flight and no
//!   side's user holds the turn, moves the clock to the earliest deadline of a side that
//!   waits for its peer and fires it (the cores own their deadlines: `begin_wait`,
//!   `poll_timeout`, `handle_timeout`, udf §7), until both sides are quiescent. Finer steps
//!   build schedules: [`Pair::deliver_to_worker`], [`Pair::deliver_to_engine`],
//!   [`Pair::advance`] (time passes, messages stay in flight), [`Pair::cut`] (the stream
//!   breaks).
//! - Every step is checked ([`EngineWatch`], [`WorkerWatch`]): one terminal per side, the
//!   first terminal wins, nothing sent after a terminal, the udf §2 message order, every
//!   batch crossing at most once and in order. Once both sides settled, the two outcomes
//!   must agree ([`Pair::assert_agreement`]). A broken rule panics with a message naming
//!   it.
//!
//! ```
//! use std::time::Duration;
//! use tether_testing::pair::{Pair, WorkerUser};
//! use tether::worker::endpoint::OutcomeKind;
//! use tether::worker::engine::{Termination, TerminationKind, TransportFailure, Wait};
//!
//! // Connect, send, finish, drive: both sides end Finished, every batch echoed in order.
//! let mut pair = Pair::default();
//! pair.connect();
//! pair.send("a")?;
//! pair.send("b")?;
//! pair.finish()?;
//! pair.drive();
//! assert_eq!(pair.termination().unwrap().kind(), TerminationKind::Finished);
//! assert_eq!(pair.outcome().unwrap().kind(), OutcomeKind::Finished);
//! assert_eq!(pair.output(), ["a", "b"]);
//!
//! // A worker whose user never answers the Init: the engine's own init deadline fires.
//! let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
//! pair.start_init(tether_testing::fixtures::init("udf"), None)?;
//! pair.drive(); // the Init is delivered; the worker's user now holds the turn
//! pair.advance(Duration::from_secs(10));
//! assert!(matches!(
//!     pair.termination(),
//!     Some(Termination::TransportFailed(TransportFailure::Timeout {
//!         waiting_for: Wait::InitResponse,
//!         ..
//!     }))
//! ));
//! # Ok::<(), tether::worker::engine::Misuse>(())
//! ```

mod watch;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use tether::connection::ConnectionError;
use tether::time::NoTimeouts;
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, Init, RequestMessage, ResponseKind,
    ResponseMessage, UdfRequest, UdfResponse,
};
use tether::worker::endpoint::{
    EndpointConfig, EndpointMisuse, EndpointOutcome, EngineViolation, InitTimeout, OutcomeKind,
    Udf, WorkerPhase, answer_pending,
};

use crate::echo::EchoUdf;
use tether::worker::engine::{
    EnginePhase, Misuse, SessionConfig, Termination, TerminationKind, TransportFailure,
};

pub use watch::{CoreWatch, EngineWatch, UserAnswer, WorkerWatch, engine_gave_up};

/// The flattened view of a request the engine core produced; it never sends an empty
/// oneof (udf §1.2).
pub fn req_msg(r: &UdfRequest) -> RequestMessage {
    r.clone()
        .into_message()
        .expect("udf §1.2: the engine sent an empty oneof")
}

/// The flattened view of a response the worker core produced; it never sends an empty
/// oneof (udf §1.2).
pub fn resp_msg(r: &UdfResponse) -> ResponseMessage {
    r.clone()
        .into_message()
        .expect("udf §1.2: the worker sent an empty oneof")
}

/// A transport failure, as a broken stream reports it to either side (udf §2 R8, §4.5).
pub fn conn_error() -> ConnectionError {
    ConnectionError::transport(std::io::Error::other("the pair's stream was cut"))
}

/// The engine config of a [`Pair`] (udf §7): a 10 s init timeout, 30 s terminal timeout,
/// 2 s interrupt-cancel timeout, 64 output batches, and `NoTimeouts` (the pair is the clock).
pub fn engine_config() -> SessionConfig {
    SessionConfig {
        init_timeout: Duration::from_secs(10),
        terminal_timeout: Duration::from_secs(30),
        interrupt_cancel_timeout: Duration::from_secs(2),
        output_buffer: 64,
        output_buffer_bytes: 64 * 1024,
        timer: Arc::new(NoTimeouts),
        events: None,
    }
}

/// The worker config of a [`Pair`]: the reference worker's defaults (udf §2.1) with the
/// R4 cancel timeout at 15 s (udf §2 R4), half the engine's terminal timeout so that the
/// two never expire at the same instant, the wait for the `Init` at 20 s (udf §4.6), twice
/// the engine's init timeout so that an engine whose `Init` is merely late gives up first,
/// and `NoTimeouts` (the pair is the clock).
pub fn worker_config() -> EndpointConfig {
    EndpointConfig {
        init_timeout: Some(Duration::from_secs(20)),
        cancel_timeout: Some(Duration::from_secs(15)),
        ..EndpointConfig::with_timer(Arc::new(NoTimeouts))
    }
}

/// Who answers for the worker's user code (udf §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerUser {
    /// The reference echo worker of udf §2.1, answering at once after every step.
    Echo,
    /// The test answers ([`Pair::worker_accept_init`], [`Pair::worker_fail`], …); while the
    /// user holds the turn, [`Pair::drive`] does not move the clock.
    Manual,
}

/// One direction's in-flight item: a message, the half-close after the last one (udf §2
/// R9, R10), or the engine's abort of its request side (gRPC `onError`, udf §2 R9, which
/// the worker sees as a stream error, R8).
#[derive(Debug)]
enum Flow<T> {
    Msg(T),
    End,
    Abort,
}

/// How the engine ended its request side (udf §2 R9, §5.2 step 4), as
/// [`Pair::engine_request_end`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestEnd {
    /// Half-closed (gRPC `onCompleted`): after a clean terminator, `Finished` or `Cancelled`.
    HalfClosed,
    /// Aborted (gRPC `onError`): after a failure terminator, `TransportFailed` or
    /// `Interrupted`.
    Aborted,
}

/// The error the worker sees when the engine aborts its request side (udf §2 R8, R9).
pub fn abort_error() -> ConnectionError {
    ConnectionError::transport(std::io::Error::other("the engine aborted its request side"))
}

/// Whether the worker's session ended because no `Init` came within its init timeout
/// (udf §4.6; the [`InitTimeout`] cause of a `TransportFailed`).
fn init_timed_out(outcome: &EndpointOutcome) -> bool {
    match outcome {
        EndpointOutcome::TransportFailed(e) => std::error::Error::source(e)
            .is_some_and(|cause| cause.downcast_ref::<InitTimeout>().is_some()),
        _ => false,
    }
}

/// The most steps [`Pair::drive`] takes before it reports a pair that never settles.
const MAX_STEPS: usize = 100_000;

/// An [`EngineCore`](tether::worker::engine::EngineCore) and a
/// [`WorkerCore`](tether::worker::endpoint::WorkerCore) connected by two FIFO in-flight queues under a
/// simulated clock (udf §2, §4, §7): see the [module docs](self).
#[derive(Debug)]
pub struct Pair {
    engine: EngineWatch,
    worker: WorkerWatch,
    to_worker: VecDeque<Flow<UdfRequest>>,
    to_engine: VecDeque<Flow<UdfResponse>>,
    user: WorkerUser,
    epoch: Instant,
    now: Instant,
    engine_end: Option<RequestEnd>,
    worker_half_closed: bool,
    /// The worker's writes are held in its core's outbox ([`Pair::hold_worker_writes`]).
    worker_held: bool,
    cut: bool,
    /// The engine discarded output (close, interrupt: udf §5.2 step 2).
    drained: bool,
    /// How many batches of the worker's input and of the engine's output were checked.
    checked_in: usize,
    checked_out: usize,
    /// The worker's user code under [`WorkerUser::Echo`].
    echo: RecordingEcho,
}

/// The reference echo worker ([`EchoUdf`], udf §2.1) as the pair runs it: every batch
/// handed to [`Udf::process`] is also kept, for the worker watcher's order checks.
#[derive(Debug, Default)]
struct RecordingEcho {
    udf: EchoUdf,
    read: Vec<Bytes>,
}

impl Udf for RecordingEcho {
    fn init(&mut self, init: &Init) -> Result<Option<Bytes>, ExecutionError> {
        self.udf.init(init)
    }

    fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
        self.read.push(batch.clone());
        self.udf.process(batch, out)
    }

    fn finish(&mut self, out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
        self.udf.finish(out)
    }

    fn cancel(&mut self) -> CancelResponse {
        self.udf.cancel()
    }
}

impl Default for Pair {
    /// [`engine_config`] × [`worker_config`], with the echo worker of udf §2.1.
    fn default() -> Self {
        Self::new(&engine_config(), &worker_config())
    }
}

impl Pair {
    /// A pair of fresh cores (udf §4.1 `Created`, udf §2.1 `AwaitingInit`) with these
    /// configs and the echo worker (udf §2.1). The configs' timers are not used: the pair
    /// is the clock.
    pub fn new(engine: &SessionConfig, worker: &EndpointConfig) -> Self {
        let now = Instant::now();
        Self {
            engine: EngineWatch::new(engine),
            worker: WorkerWatch::new(worker),
            to_worker: VecDeque::new(),
            to_engine: VecDeque::new(),
            user: WorkerUser::Echo,
            epoch: now,
            now,
            engine_end: None,
            worker_half_closed: false,
            worker_held: false,
            cut: false,
            drained: false,
            checked_in: 0,
            checked_out: 0,
            echo: RecordingEcho::default(),
        }
    }

    /// The same pair with `user` answering for the worker (udf §2.1).
    #[must_use]
    pub fn with_worker_user(mut self, user: WorkerUser) -> Self {
        self.user = user;
        self
    }

    /// From now on, `user` answers for the worker (udf §2.1).
    pub fn set_worker_user(&mut self, user: WorkerUser) {
        self.user = user;
        self.run_echo();
    }

    // ---------------------------------------------------------------------------------
    // Observation
    // ---------------------------------------------------------------------------------

    /// The engine side and its wire log (udf §4).
    pub fn engine(&self) -> &EngineWatch {
        &self.engine
    }

    /// The worker side and its wire log (udf §2).
    pub fn worker(&self) -> &WorkerWatch {
        &self.worker
    }

    /// The engine's terminal, once settled (udf §4.1).
    pub fn termination(&self) -> Option<&Termination> {
        self.engine.core.terminal()
    }

    /// The worker's outcome, once done (udf §2 R5, R6, R8).
    pub fn outcome(&self) -> Option<&EndpointOutcome> {
        self.worker.core.outcome()
    }

    /// The batches the engine's reader popped, in order (udf §4.7).
    pub fn output(&self) -> &[Bytes] {
        &self.engine.output
    }

    /// The batches the worker's user read, in order (udf §1.4).
    pub fn input(&self) -> &[Bytes] {
        &self.worker.input
    }

    /// The simulated time (udf §7 deadlines run on it).
    pub fn now(&self) -> Instant {
        self.now
    }

    /// How much simulated time passed since the pair was made (udf §7).
    pub fn elapsed(&self) -> Duration {
        self.now - self.epoch
    }

    /// Messages in flight: (engine → worker, worker → engine), a half-close counting as
    /// one (udf §2 R9).
    pub fn in_flight(&self) -> (usize, usize) {
        (self.to_worker.len(), self.to_engine.len())
    }

    /// Whether the stream was [`cut`](Self::cut) (udf §2 R8).
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// How the engine ended its request side, once it did (udf §2 R9: half-closed after a
    /// clean terminator, aborted after a failure terminator; never both, never twice).
    pub fn engine_request_end(&self) -> Option<RequestEnd> {
        self.engine_end
    }

    /// Holds the worker's writes: from now on, what the worker core queues stays in its
    /// outbox, as responses a worker has queued but not yet written, until
    /// [`release_worker_writes`](Self::release_worker_writes). This is how a test reaches the
    /// rule that a `Cancel` drops queued data (udf §2 R7: after a Cancel the worker stops
    /// emitting data; the core's [`Delivery::Dropped`](tether::worker::endpoint::Delivery)).
    /// The half-close after the terminator waits too. While they are held, [`drive`](Self::drive)
    /// may still run the engine's deadlines.
    pub fn hold_worker_writes(&mut self) {
        self.worker_held = true;
    }

    /// Hands the worker's held responses to the stream, in order, and stops holding them
    /// (udf §2 R7; see [`hold_worker_writes`](Self::hold_worker_writes)).
    pub fn release_worker_writes(&mut self) {
        self.worker_held = false;
        self.pump();
    }

    /// Whether the worker's writes are held ([`hold_worker_writes`](Self::hold_worker_writes),
    /// udf §2 R7).
    pub fn worker_writes_held(&self) -> bool {
        self.worker_held
    }

    /// Both sides have settled: the engine is terminal, nothing is in flight, and the
    /// worker is done or never saw a stream (udf §4.1, §2 R5).
    pub fn is_settled(&self) -> bool {
        self.engine.core.is_terminal()
            && self.to_worker.is_empty()
            && self.to_engine.is_empty()
            && (self.worker.core.is_done() || !self.engine.core.stream_opened())
    }

    // ---------------------------------------------------------------------------------
    // The engine's calls (udf §4.3)
    // ---------------------------------------------------------------------------------

    /// The engine's `init`: queues `Init` (and its chunks with `chunk_size`, udf §2 R1) and
    /// hands it to the stream (udf §4.6).
    ///
    /// # Errors
    /// The core's [`Misuse`] unless the engine is `Created`.
    pub fn start_init(&mut self, init: Init, chunk_size: Option<usize>) -> Result<(), Misuse> {
        let r = self.engine.core.start_init(init, chunk_size);
        self.pump();
        r
    }

    /// Connects, as quinn's `Pair::connect`: `Init` with a small payload, driven until the
    /// handshake is done (udf §4.6).
    ///
    /// # Panics
    /// Unless the engine then streams (a manual worker must have accepted in between: use
    /// [`start_init`](Self::start_init) for it).
    pub fn connect(&mut self) {
        if let Err(e) = self.start_init(crate::fixtures::init("udf"), None) {
            panic!("pair: connect: {e}");
        }
        self.drive();
        assert_eq!(
            self.engine.core.phase(),
            EnginePhase::Streaming,
            "pair: connect did not reach Streaming (terminal {:?}, worker {:?})",
            self.termination(),
            self.worker.core.phase()
        );
    }

    /// The engine sends one batch (udf §1.4): `Ok(false)` when skipped after a Cancel
    /// (udf §4.7).
    ///
    /// The watchers check each batch crosses once and in order by its tag
    /// ([`fixtures::tagged`](crate::fixtures::tagged)): send tagged batches with
    /// increasing tags below 2^31 (tags from 2^31 up mark a worker's own output, checked
    /// apart). Untagged batches are not order-checked.
    ///
    /// # Errors
    /// The core's [`Misuse`] outside `Streaming` (and its cancelled/terminal views).
    pub fn send(&mut self, data: impl Into<Bytes>) -> Result<bool, Misuse> {
        let r = self.engine.core.send_data(data.into());
        self.pump();
        r
    }

    /// The engine sends `Finish` (udf §4.4 `beginFinish`): `Ok(false)` when skipped after
    /// a Cancel.
    ///
    /// # Errors
    /// The core's [`Misuse`] outside `Streaming`.
    pub fn finish(&mut self) -> Result<bool, Misuse> {
        let r = self.engine.core.finish();
        self.pump();
        r
    }

    /// The engine cancels (udf §4.8): `true` for the call that queued the Cancel.
    pub fn cancel(&mut self, reason: &str) -> bool {
        let queued = self.engine.core.cancel(Some(reason.into()));
        self.pump();
        queued
    }

    /// The engine's `close()` (udf §5.2): Cancel unless terminal, discard output, wait for
    /// the terminator at most `terminal_timeout` in total.
    pub fn close(&mut self) {
        self.drained = true;
        self.engine.core.close();
        self.pump();
    }

    /// The engine session is interrupted (udf §4.9; in Rust, dropped mid-operation): Cancel,
    /// then `Interrupted` unless acknowledged within `interrupt_cancel_timeout`.
    pub fn interrupt(&mut self, context: &'static str) {
        self.drained = true;
        self.engine.core.interrupt(context);
        self.pump();
    }

    /// The engine's reader pops every queued output batch into [`output`](Self::output)
    /// (udf §4.7); returns how many.
    pub fn engine_read(&mut self) -> usize {
        let before = self.engine.output.len();
        self.engine.pop_all();
        self.pump();
        self.engine.output.len() - before
    }

    // ---------------------------------------------------------------------------------
    // The worker's user answers (udf §2.1)
    // ---------------------------------------------------------------------------------

    /// The user takes the `Init` and accepts it: `InitResponse` (udf §1.3).
    ///
    /// # Errors
    /// The core's [`EndpointMisuse`] unless the `Init` is pending (or cancelled, or done).
    pub fn worker_accept_init(&mut self) -> Result<(), EndpointMisuse> {
        self.worker_call(|w| {
            let _ = w.core.take_init();
            w.core.accept_init(None)
        })
    }

    /// The user takes the `Init` and rejects it: `InitResponse.error` (udf §1.3, §2 R4).
    ///
    /// # Errors
    /// The core's [`EndpointMisuse`] unless the `Init` is pending (or cancelled, or done).
    pub fn worker_reject_init(&mut self, error: ExecutionError) -> Result<(), EndpointMisuse> {
        self.worker_call(|w| {
            let _ = w.core.take_init();
            w.core.reject_init(error)
        })
    }

    /// The user reads every queued input batch and echoes it (the reference worker's `Data`
    /// row, udf §2.1); returns how many batches were queued as output.
    pub fn worker_echo(&mut self) -> usize {
        let read = self.worker.pop_all();
        let mut echoed = 0;
        for batch in read {
            if self.worker.send_data(batch) == Ok(true) {
                echoed += 1;
            }
        }
        self.pump();
        echoed
    }

    /// The user reads every queued input batch without answering (udf §1.4); returns them.
    pub fn worker_read(&mut self) -> Vec<Bytes> {
        let read = self.worker.pop_all();
        self.pump();
        read
    }

    /// The user emits one batch (udf §1.4): `Ok(false)` when dropped (after an error, a
    /// Cancel, or once done).
    ///
    /// # Errors
    /// The core's [`EndpointMisuse`] before the `InitResponse` (udf §2 R2).
    pub fn worker_send(&mut self, data: impl Into<Bytes>) -> Result<bool, EndpointMisuse> {
        let r = self.worker.send_data(data.into());
        self.pump();
        r
    }

    /// The user reports an error from the data phase: `ErrorResponse` (udf §2 R4).
    ///
    /// # Errors
    /// The core's [`EndpointMisuse`] before the `InitResponse` or after an error.
    pub fn worker_fail(&mut self, error: ExecutionError) -> Result<(), EndpointMisuse> {
        self.worker_call(|w| w.core.fail(error))
    }

    /// The user answers `Finish`: `FinishResponse` (udf §2 R5 (a)).
    ///
    /// # Errors
    /// The core's [`EndpointMisuse`] unless `Draining` (or done).
    pub fn worker_finish(&mut self) -> Result<(), EndpointMisuse> {
        self.worker_call(|w| w.core.finish(FinishResponse::default()))
    }

    /// The user answers `Cancel`: `CancelResponse` (udf §2 R5 (b), R7).
    ///
    /// # Errors
    /// The core's [`EndpointMisuse`] unless `Cancelling` (or done).
    pub fn worker_cancelled(&mut self) -> Result<(), EndpointMisuse> {
        self.worker_call(|w| w.core.cancelled(CancelResponse::default()))
    }

    /// One of the user's answers by name (udf §2.1), as the random schedules pick them.
    ///
    /// # Errors
    /// The core's [`EndpointMisuse`] when the answer does not fit the phase.
    pub fn worker_user(&mut self, answer: UserAnswer) -> Result<(), EndpointMisuse> {
        let r = self.worker.user(answer);
        self.pump();
        r
    }

    fn worker_call(
        &mut self,
        call: impl FnOnce(&mut WorkerWatch) -> Result<(), EndpointMisuse>,
    ) -> Result<(), EndpointMisuse> {
        let phase = self.worker.core.phase();
        let had = self.worker.core.has_transmit();
        let r = call(&mut self.worker);
        self.worker.after_user(phase, had, &r);
        self.pump();
        r
    }

    /// The reference echo worker's answer to whatever is pending (udf §2.1): the library's
    /// [`answer_pending`] (the mapping `serve` runs) over [`EchoUdf`]; whether it did
    /// anything.
    fn echo_step(&mut self) -> bool {
        let w = &mut self.worker;
        let phase = w.core.phase();
        let had = w.core.has_transmit();
        let r = answer_pending(&mut w.core, &mut self.echo);
        for batch in self.echo.read.drain(..) {
            w.record_input(batch);
        }
        if let Ok(answered) = &r {
            for ticket in &answered.queued {
                w.track(*ticket);
            }
        }
        w.after_user(phase, had, &r);
        match r {
            Ok(answered) => answered.acted,
            Err(misuse) => panic!("the echo worker answered out of turn: {misuse}"),
        }
    }

    fn run_echo(&mut self) -> bool {
        if self.user != WorkerUser::Echo {
            return false;
        }
        let acted = self.echo_step();
        if acted {
            self.pump();
        }
        acted
    }

    // ---------------------------------------------------------------------------------
    // Schedules
    // ---------------------------------------------------------------------------------

    /// Delivers up to `n` in-flight messages to the worker, in order (udf §2), stopping
    /// early when the worker stops reading (its input is full, udf §1.4). Returns how many
    /// were delivered.
    pub fn deliver_to_worker(&mut self, n: usize) -> usize {
        let mut delivered = 0;
        while delivered < n {
            if !self.worker.core.wants_recv() && !self.worker.core.is_done() {
                break; // back-pressure: the worker's driver stops reading
            }
            match self.to_worker.pop_front() {
                Some(Flow::Msg(r)) => self.worker.core.handle_request(r),
                Some(Flow::End) => self.worker.core.handle_stream_end(),
                Some(Flow::Abort) => self.worker.core.handle_connection_error(abort_error()),
                None => break,
            }
            self.worker.core.end_wait();
            delivered += 1;
            self.pump();
            self.run_echo();
        }
        delivered
    }

    /// Delivers up to `n` in-flight messages to the engine, in order (udf §2), stopping
    /// early when the engine stops reading (its output queue is full; see
    /// [`engine_read`](Self::engine_read)). Returns how many were delivered.
    pub fn deliver_to_engine(&mut self, n: usize) -> usize {
        let mut delivered = 0;
        while delivered < n {
            if !self.engine.core.wants_recv() && !self.engine.core.is_terminal() {
                break; // back-pressure: the output queue is full
            }
            match self.to_engine.pop_front() {
                Some(Flow::Msg(r)) => self.engine.core.handle_response(r),
                Some(Flow::End) => self.engine.core.handle_stream_end(),
                Some(Flow::Abort) => unreachable!("the worker never aborts (udf §2.1)"),
                None => break,
            }
            delivered += 1;
            self.pump();
            self.run_echo();
        }
        delivered
    }

    /// Lets `d` of simulated time pass with every message staying in flight (a delay):
    /// each deadline of either core that falls inside fires at its instant, in order
    /// (udf §7, udf §2 R4).
    pub fn advance(&mut self, d: Duration) {
        let target = self.now + d;
        loop {
            match self.earliest_deadline() {
                Some(at) if at <= target => self.tick_to(at),
                _ => break,
            }
        }
        self.tick_to(target);
    }

    /// The stream breaks (udf §2 R8, §4.5 `onError`): everything in flight is lost, both
    /// sides see a transport failure, and nothing sent later arrives.
    pub fn cut(&mut self) {
        self.cut = true;
        self.to_worker.clear();
        self.to_engine.clear();
        self.engine.core.handle_connection_error(conn_error());
        self.worker.core.handle_connection_error(conn_error());
        self.pump();
    }

    /// One step of [`drive`](Self::drive): the engine reads its output, the echo worker
    /// answers, one message is delivered each way; if nothing moved and no side's user
    /// holds the turn, the clock moves to the earliest deadline of a side that waits for
    /// its peer and fires it (udf §7). Returns whether anything happened.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        if self.engine.core.output_len() > 0 {
            self.engine.pop_all();
            self.pump();
            moved = true;
        }
        moved |= self.run_echo();
        moved |= self.deliver_to_worker(1) > 0;
        moved |= self.deliver_to_engine(1) > 0;
        if moved {
            return true;
        }
        if self.user_holds_turn() {
            return false;
        }
        match self.blocked_deadline() {
            Some(at) => {
                self.tick_to(at);
                true
            }
            None => false,
        }
    }

    /// Steps until both sides are quiescent: nothing in flight and nothing due, or a user
    /// holds the turn (udf §2, §7). Once both sides settled, checks that their outcomes
    /// agree ([`assert_agreement`](Self::assert_agreement)).
    ///
    /// # Panics
    /// On any broken rule, or when the pair never becomes quiescent.
    pub fn drive(&mut self) {
        for _ in 0..MAX_STEPS {
            if !self.step() {
                if self.is_settled() {
                    self.assert_agreement();
                }
                return;
            }
        }
        panic!(
            "pair: not quiescent after {MAX_STEPS} steps: {}",
            self.describe()
        );
    }

    /// Runs the session to its end as a well-behaved engine and worker would: the engine
    /// finishes (or closes, if it never started), the echo worker answers (udf §2.1), and
    /// if that does not settle, the engine closes and the clock runs through every
    /// remaining deadline (udf §5.2, §7). Then checks that the outcomes agree.
    ///
    /// # Panics
    /// On any broken rule, or when the pair never settles.
    pub fn complete(&mut self) {
        self.user = WorkerUser::Echo;
        match self.engine.core.phase() {
            EnginePhase::Streaming if self.engine.core.may_send() => {
                let _ = self.finish();
            }
            EnginePhase::Created => self.close(),
            _ => {}
        }
        for _ in 0..64 {
            self.drive();
            if self.is_settled() {
                self.assert_agreement();
                return;
            }
            if !self.engine.core.is_terminal() && !self.engine.core.cancel_requested() {
                self.close();
                continue;
            }
            match self.earliest_deadline() {
                Some(at) => self.tick_to(at),
                None => break,
            }
        }
        panic!("pair: the session did not settle: {}", self.describe());
    }

    // ---------------------------------------------------------------------------------
    // Internals
    // ---------------------------------------------------------------------------------

    /// Whether a user holds the turn: the engine's caller (`Created`, `Streaming`: it
    /// decides what to send next) or a manual worker user with something to answer.
    fn user_holds_turn(&self) -> bool {
        let e = &self.engine.core;
        let engine_turn =
            !e.is_terminal() && matches!(e.phase(), EnginePhase::Created | EnginePhase::Streaming);
        let w = &self.worker.core;
        let worker_turn = self.user == WorkerUser::Manual
            && !w.is_done()
            && (matches!(
                w.phase(),
                WorkerPhase::InitPending | WorkerPhase::Draining | WorkerPhase::Cancelling
            ) || w.input_len() > 0);
        engine_turn || worker_turn
    }

    /// The earliest deadline of a side that waits for its peer: a non-terminal engine, a
    /// worker in `AwaitingInit` or `PostError` on a stream the engine opened (udf §7, §4.6,
    /// §2 R4; [`advance`](Self::advance) also runs the worker's wait for an `Init` that
    /// never comes).
    fn blocked_deadline(&mut self) -> Option<Instant> {
        let now = self.now;
        let e = if self.engine.core.is_terminal() {
            None
        } else {
            self.engine.deadline_from(now)
        };
        let w = if self.engine.core.stream_opened() {
            self.worker.deadline_from(now)
        } else {
            None
        };
        e.into_iter().chain(w).min()
    }

    /// The earliest deadline of either core, whatever it waits for (udf §7).
    fn earliest_deadline(&mut self) -> Option<Instant> {
        let now = self.now;
        let e = self.engine.deadline_from(now);
        let w = self.worker.deadline_from(now);
        e.into_iter().chain(w).min()
    }

    /// Both sides block from now until `until`; their own deadlines fire (udf §7).
    fn tick_to(&mut self, until: Instant) {
        let now = self.now;
        self.engine.wait(now, until);
        self.worker.wait(now, until);
        self.now = until;
        self.pump();
        self.run_echo();
    }

    /// Hands everything both cores queued to the in-flight queues (dropped once the stream
    /// is cut), half-closes each side once it says so (udf §2 R9), and checks both sides.
    fn pump(&mut self) {
        for r in self.engine.transmit() {
            if !self.cut {
                assert!(
                    self.engine_end.is_none(),
                    "pair (udf §2 R9): the engine sent {:?} after it {:?} its request side",
                    r.kind(),
                    self.engine_end
                );
                self.to_worker.push_back(Flow::Msg(r));
            }
        }
        let (half_close, abort) = (
            self.engine.core.wants_half_close(),
            self.engine.core.wants_abort(),
        );
        assert!(
            !(half_close && abort),
            "pair (udf §2 R9): the engine wants to half-close and abort at once"
        );
        if (half_close || abort) && self.engine.core.stream_opened() && self.engine_end.is_none() {
            let (end, flow) = if half_close {
                (RequestEnd::HalfClosed, Flow::End)
            } else {
                (RequestEnd::Aborted, Flow::Abort)
            };
            self.engine_end = Some(end);
            if !self.cut {
                self.to_worker.push_back(flow);
            }
        }
        if let Some(end) = self.engine_end {
            let clean = self.engine.core.terminal().is_some_and(|t| {
                matches!(
                    t.kind(),
                    TerminationKind::Finished | TerminationKind::Cancelled
                )
            });
            assert_eq!(
                end == RequestEnd::HalfClosed,
                clean,
                "pair (udf §2 R9, §5.2 step 4): the engine {end:?} its request side after {}",
                self.describe()
            );
        }
        if self.worker_held {
            self.engine.check();
            self.worker.check();
            self.check_crossing();
            return;
        }
        for r in self.worker.transmit() {
            if !self.cut {
                assert!(
                    !self.worker_half_closed,
                    "pair (udf §2.1): the worker sent {:?} after it half-closed",
                    r.kind()
                );
                self.to_engine.push_back(Flow::Msg(r));
            }
        }
        if self.worker.core.wants_half_close() && !self.worker_half_closed {
            self.worker_half_closed = true;
            if !self.cut {
                self.to_engine.push_back(Flow::End);
            }
        }
        self.engine.check();
        self.worker.check();
        self.check_crossing();
    }

    /// Every batch crosses at most once and in order, both ways (udf §1.4): what the worker
    /// read is a prefix of what the engine sent, and what the engine read is a prefix of
    /// what the worker sent. The logs only grow, so each batch is compared once.
    fn check_crossing(&mut self) {
        let (sent, read) = (self.engine.data_sent(), &self.worker.input);
        assert!(
            read.len() <= sent.len()
                && read[self.checked_in..] == sent[self.checked_in..read.len()],
            "pair (udf §1.4): the worker read {} batches that are not the first of the {} the \
             engine sent, in order",
            read.len(),
            sent.len()
        );
        self.checked_in = read.len();
        let (sent, read) = (self.worker.data_sent(), &self.engine.output);
        assert!(
            read.len() <= sent.len()
                && read[self.checked_out..] == sent[self.checked_out..read.len()],
            "pair (udf §1.4): the engine read {} batches that are not the first of the {} the \
             worker sent, in order",
            read.len(),
            sent.len()
        );
        self.checked_out = read.len();
    }

    /// Checks that the two settled sides' outcomes agree (udf §2 R5, §4.1, §5.3):
    ///
    /// - neither side saw a protocol violation from the other, except the worker's R4
    ///   close, or when the engine itself gave up (timeout, interrupt) or the stream was cut;
    /// - a worker that waited for the `Init` in vain (its init deadline, udf §4.6) sent
    ///   nothing, and the engine, if it opened the stream, ended `TransportFailed` (its own
    ///   timeout, or the stream ended without a terminator, udf §2 R10) or `Interrupted`;
    /// - a connection failure on the engine's side only after a cut; on the worker's only
    ///   after a cut or the engine's abort (udf §2 R8, R9);
    /// - engine `Finished` ⇔ worker `Finished`, with every batch delivered exactly once and
    ///   in order both ways (unless the engine discarded its output);
    /// - engine `Cancelled` on an opened stream ⇒ worker `Cancelled` or its R4 close, and
    ///   the converse unless the engine gave up or the stream was cut;
    /// - exactly one terminator crossed unless the stream was cut.
    ///
    /// # Panics
    /// When they do not, or when the pair has not settled ([`is_settled`](Self::is_settled)).
    pub fn assert_agreement(&mut self) {
        assert!(
            self.is_settled(),
            "pair: assert_agreement before both sides settled: {}",
            self.describe()
        );
        self.engine.pop_all();
        self.check_crossing();
        let t = self.engine.core.terminal().expect("settled").clone();
        let gave_up = engine_gave_up(&t);
        let who = self.describe();
        if self.worker.core.outcome().is_some_and(init_timed_out) {
            assert!(
                self.worker.sent.is_empty(),
                "pair (udf §4.6): the worker sent something while it waited for the Init: {who}"
            );
            assert!(
                !self.engine.core.stream_opened()
                    || matches!(
                        t.kind(),
                        TerminationKind::TransportFailed | TerminationKind::Interrupted
                    ),
                "pair (udf §2 R10): the worker gave up waiting for the Init, engine {t}: {who}"
            );
            return;
        }
        assert!(
            !matches!(
                t,
                Termination::TransportFailed(TransportFailure::Protocol(_))
            ),
            "pair: the engine saw a protocol violation from tether's own worker: {who}"
        );
        if matches!(
            t,
            Termination::TransportFailed(TransportFailure::Connection(_))
        ) {
            assert!(
                self.cut,
                "pair (udf §4.5): a connection failure without a cut: {who}"
            );
        }
        if !self.engine.core.stream_opened() {
            assert!(
                self.worker.sent.is_empty() && self.to_worker.is_empty(),
                "pair (udf §5.3): the worker answered a stream that never opened: {who}"
            );
            return;
        }
        let outcome = self.worker.core.outcome().expect("settled").clone();
        let wk = outcome.kind();
        if let EndpointOutcome::ProtocolViolation(v) = &outcome {
            assert!(
                matches!(v, EngineViolation::NoCancelAfterError { .. }) || gave_up || self.cut,
                "pair (udf §2 R6): the worker saw a violation from tether's own engine ({v:?}): \
                 {who}"
            );
        }
        if wk == OutcomeKind::TransportFailed {
            assert!(
                self.cut || self.engine_end == Some(RequestEnd::Aborted),
                "pair (udf §2 R8): a worker transport failure without a cut or an abort: {who}"
            );
        }
        match t.kind() {
            TerminationKind::Finished => {
                assert_eq!(
                    wk,
                    OutcomeKind::Finished,
                    "pair (udf §2 R5): engine Finished, worker not: {who}"
                );
                let sent = self.engine.data_sent();
                assert_eq!(
                    self.worker.core.stats().data_received,
                    sent.len() as u64,
                    "pair (udf §1.4): engine Finished, but the worker did not receive every \
                     batch once: {who}"
                );
                let sent = self.worker.data_sent();
                assert_eq!(
                    self.engine.core.stats().data_received,
                    sent.len() as u64,
                    "pair (udf §1.4): engine Finished, but not every worker batch arrived \
                     once: {who}"
                );
                if !self.drained {
                    assert_eq!(
                        self.engine.output[..],
                        sent[..],
                        "pair (udf §1.4): engine Finished, but its output is not the worker's \
                         batches in order: {who}"
                    );
                }
            }
            TerminationKind::Cancelled => assert!(
                matches!(wk, OutcomeKind::Cancelled | OutcomeKind::ProtocolViolation),
                "pair (udf §2 R5): engine Cancelled on an opened stream, worker {outcome}: {who}"
            ),
            _ => {}
        }
        if !self.cut && !gave_up {
            let want = match wk {
                OutcomeKind::Finished => Some(TerminationKind::Finished),
                OutcomeKind::Cancelled | OutcomeKind::ProtocolViolation => {
                    Some(TerminationKind::Cancelled)
                }
                OutcomeKind::TransportFailed => None,
            };
            if let Some(want) = want {
                assert_eq!(
                    t.kind(),
                    want,
                    "pair (udf §2 R5): worker {outcome}, engine {t}: {who}"
                );
            }
        }
        let terminators = self
            .worker
            .sent
            .iter()
            .filter(|r| matches!(r.kind(), Some(ResponseKind::Finish | ResponseKind::Cancel)))
            .count();
        assert!(
            terminators <= 1,
            "pair (udf §2 R5): {terminators} terminators"
        );
        if !self.cut && wk != OutcomeKind::TransportFailed {
            assert_eq!(
                terminators, 1,
                "pair (udf §2 R5): the worker sent no terminator: {who}"
            );
        }
    }

    /// Both sides' state in one line, for panic messages.
    fn describe(&self) -> String {
        let e = &self.engine.core;
        let w = &self.worker.core;
        format!(
            "engine {:?} {}, worker {:?} {}, in flight {:?}, t+{:?}{}",
            e.phase(),
            e.terminal()
                .map_or("(no terminal)".to_string(), |t| t.to_string()),
            w.phase(),
            w.outcome()
                .map_or("(no outcome)".to_string(), |o| o.to_string()),
            self.in_flight(),
            self.elapsed(),
            if self.cut { ", cut" } else { "" }
        )
    }
}
