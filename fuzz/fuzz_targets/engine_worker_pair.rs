//! The engine core × the worker core (udf §2, §4) over two FIFO channels with fuzzed
//! schedules: calls on either side, deliveries of any number of in-flight messages
//! (order within each direction preserved, arbitrary delays), Cancel / close / interrupt
//! at any point, a cut stream, and waits on a shared fuzzed clock so that timeouts come
//! from the cores' own timers. Each side is checked by its watcher (one terminal, nothing
//! after it, the udf §2 order); at the end the pair is driven to completion and the two
//! outcomes must agree:
//! - no side ever sees a protocol violation from the other, except the worker's R4
//!   timeout or an engine that itself timed out or was interrupted;
//! - engine Finished ⇒ worker Finished, and every batch crossed exactly once, in order;
//! - engine Cancelled on an opened stream ⇒ worker Cancelled (or its R4 close);
//! - unless the stream was cut: worker Finished ⇒ engine Finished, worker Cancelled ⇒
//!   engine Cancelled, each unless the engine's own deadline ended it first.
#![no_main]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tether::wire::{RequestMessage, ResponseKind, ResponseMessage, UdfRequest, UdfResponse};
use tether::worker::endpoint::{EndpointOutcome, EngineViolation, OutcomeKind, WorkerPhase};
use tether::worker::engine::{EnginePhase, Termination, TerminationKind, TransportFailure};
use tether_fuzz::{
    EngineWatch, UserAnswer, WorkerWatch, conn_error, engine_config, init_message, req_msg,
    resp_msg, tag_of, tagged, worker_config,
};

#[derive(Arbitrary, Debug)]
enum Op {
    StartInit { chunk: Option<u8>, len: u8 },
    SendData,
    Finish,
    Cancel,
    Close,
    Interrupt,
    EnginePop,
    User(UserAnswer),
    WorkerSend,
    WorkerPop,
    ToWorker(u8),
    ToEngine(u8),
    Tick(u16),
    Cut,
}

#[derive(Arbitrary, Debug)]
struct Input {
    output_buffer: u8,
    input_buffer: u8,
    ops: Vec<Op>,
}

enum Flow<T> {
    Msg(T),
    End,
}

struct Pair {
    e: EngineWatch,
    w: WorkerWatch,
    to_w: VecDeque<Flow<UdfRequest>>,
    to_e: VecDeque<Flow<UdfResponse>>,
    e_closed: bool,
    w_closed: bool,
    cut: bool,
    /// The engine discarded output (close, interrupt).
    drained: bool,
    now: Instant,
    data_tag: u32,
    out_tag: u32,
}

impl Pair {
    /// Hands everything both cores queued to the channels (dropped once the stream is cut),
    /// and half-closes each side once it says so (udf §2 R9).
    fn pump(&mut self) {
        for r in self.e.transmit() {
            if !self.cut {
                assert!(!self.e_closed, "a request after the engine half-closed");
                self.to_w.push_back(Flow::Msg(r));
            }
        }
        if self.e.core.wants_half_close() && self.e.core.stream_opened() && !self.e_closed {
            self.e_closed = true;
            if !self.cut {
                self.to_w.push_back(Flow::End);
            }
        }
        for r in self.w.transmit() {
            if !self.cut {
                assert!(!self.w_closed, "a response after the worker half-closed");
                self.to_e.push_back(Flow::Msg(r));
            }
        }
        if self.w.core.wants_half_close() && !self.w_closed {
            self.w_closed = true;
            if !self.cut {
                self.to_e.push_back(Flow::End);
            }
        }
        self.e.check();
        self.w.check();
    }

    fn to_worker(&mut self, n: usize) {
        for _ in 0..n {
            if !self.w.core.wants_recv() && !self.w.core.is_done() {
                break; // back-pressure: the worker's driver stops reading
            }
            match self.to_w.pop_front() {
                Some(Flow::Msg(r)) => self.w.core.handle_request(r),
                Some(Flow::End) => self.w.core.handle_stream_end(),
                None => break,
            }
            self.w.core.end_wait();
            self.pump();
        }
    }

    fn to_engine(&mut self, n: usize) {
        for _ in 0..n {
            if !self.e.core.wants_recv() && !self.e.core.is_terminal() {
                break; // back-pressure: the output queue is full
            }
            match self.to_e.pop_front() {
                Some(Flow::Msg(r)) => self.e.core.handle_response(r),
                Some(Flow::End) => self.e.core.handle_stream_end(),
                None => break,
            }
            self.pump();
        }
    }

    /// Both sides block; the clock moves to `until` (the cores' own deadlines fire).
    fn tick_to(&mut self, until: Instant) {
        let now = self.now;
        self.e.wait(now, until);
        self.w.wait(now, until);
        self.now = until;
        self.pump();
    }

    /// The earliest armed deadline of the two sides, once both are about to block.
    fn next_deadline(&mut self) -> Option<Instant> {
        self.e.core.begin_wait(self.now);
        self.w.core.begin_wait(self.now);
        match (self.e.core.poll_timeout(), self.w.core.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn cut(&mut self) {
        self.cut = true;
        self.to_w.clear();
        self.to_e.clear();
        self.e.core.handle_connection_error(conn_error());
        self.w.core.handle_connection_error(conn_error());
        self.pump();
    }

    /// A well-behaved user on the worker side.
    fn worker_user(&mut self) {
        self.w.pop_all();
        match self.w.core.phase() {
            WorkerPhase::InitPending => {
                self.w.user(UserAnswer::TakeInit);
                self.w.user(UserAnswer::Accept);
            }
            WorkerPhase::Draining => self.w.user(UserAnswer::Finish),
            WorkerPhase::Cancelling => self.w.user(UserAnswer::Cancelled),
            _ => {}
        }
        self.pump();
    }

    fn settled(&self) -> bool {
        self.e.core.is_terminal()
            && self.w.core.is_done()
            && self.to_w.is_empty()
            && self.to_e.is_empty()
    }

    /// Drives both sides to their outcomes: the engine finishes (or closes), the worker's
    /// user answers, every message is delivered, and time jumps to the next deadline when
    /// nothing else can move.
    fn complete(&mut self) {
        match self.e.core.phase() {
            EnginePhase::Streaming if self.e.core.may_send() => {
                let _ = self.e.core.finish();
            }
            EnginePhase::Created => {
                self.drained = true;
                self.e.core.close();
            }
            _ => {}
        }
        self.pump();
        let mut closed = false;
        for _ in 0..64 {
            self.worker_user();
            self.e.pop_all();
            self.to_worker(usize::MAX);
            self.to_engine(usize::MAX);
            self.e.pop_all();
            self.worker_user();
            if self.settled() {
                return;
            }
            if !self.to_w.is_empty() || !self.to_e.is_empty() {
                continue;
            }
            match self.next_deadline() {
                Some(at) => self.tick_to(at),
                None if !closed => {
                    closed = true;
                    self.drained = true;
                    self.e.core.close();
                    self.pump();
                }
                None => {}
            }
            if self.e.core.is_terminal() && !self.e.core.stream_opened() {
                // Nothing ever reached the worker: there is no stream to end.
                return;
            }
        }
        panic!(
            "the pair did not settle: engine {:?} {:?}, worker {:?}",
            self.e.core.phase(),
            self.e.core.terminal(),
            self.w.core.phase()
        );
    }
}

fn engine_gave_up(t: &Termination) -> bool {
    matches!(
        t,
        Termination::Interrupted(_)
            | Termination::TransportFailed(TransportFailure::Timeout { .. })
    )
}

fn tags<'a>(batches: impl IntoIterator<Item = &'a bytes::Bytes>) -> Vec<u32> {
    batches.into_iter().map(tag_of).collect()
}

fuzz_target!(|input: Input| {
    let mut p = Pair {
        e: EngineWatch::new(&engine_config(input.output_buffer)),
        w: WorkerWatch::new(&worker_config(input.input_buffer)),
        to_w: VecDeque::new(),
        to_e: VecDeque::new(),
        e_closed: false,
        w_closed: false,
        cut: false,
        drained: false,
        now: Instant::now(),
        data_tag: 0,
        out_tag: 0,
    };
    for op in input.ops.iter().take(256) {
        match op {
            Op::StartInit { chunk, len } => {
                let _ =
                    p.e.core
                        .start_init(init_message(*len), chunk.map(usize::from));
            }
            Op::SendData => {
                p.data_tag += 1;
                let _ = p.e.core.send_data(tagged(p.data_tag));
            }
            Op::Finish => {
                let _ = p.e.core.finish();
            }
            Op::Cancel => {
                let _ = p.e.core.cancel(Some("fuzz".into()));
            }
            Op::Close => {
                p.drained = true;
                p.e.core.close();
            }
            Op::Interrupt => {
                p.drained = true;
                p.e.core.interrupt("fuzzing");
            }
            Op::EnginePop => p.e.pop_all(),
            Op::User(a) => p.w.user(*a),
            Op::WorkerSend => {
                p.out_tag += 1;
                let _ = p.w.send_data(p.out_tag);
            }
            Op::WorkerPop => p.w.pop_all(),
            Op::ToWorker(n) => p.to_worker(usize::from(*n % 8) + 1),
            Op::ToEngine(n) => p.to_engine(usize::from(*n % 8) + 1),
            Op::Tick(ms) => {
                let until = p.now + Duration::from_millis(u64::from(*ms) * 8);
                p.tick_to(until);
            }
            Op::Cut => p.cut(),
        }
        p.pump();
    }
    p.complete();

    let t = p.e.core.terminal().expect("the engine settled").clone();
    let gave_up = engine_gave_up(&t);
    assert!(
        !matches!(
            t,
            Termination::TransportFailed(TransportFailure::Protocol(_))
        ),
        "the engine saw a protocol violation from tether's own worker: {t:?}"
    );
    if matches!(
        t,
        Termination::TransportFailed(TransportFailure::Connection(_))
    ) {
        assert!(p.cut, "a connection failure without a cut");
    }
    if !p.e.core.stream_opened() {
        // Nothing reached the worker: the synthetic Cancelled or an init timeout.
        assert!(p.w.sent.is_empty());
        return;
    }
    let outcome = p.w.core.outcome().expect("the worker settled").clone();
    let wk = outcome.kind();
    if let EndpointOutcome::ProtocolViolation(v) = &outcome {
        assert!(
            matches!(v, EngineViolation::NoCancelAfterError { .. }) || gave_up || p.cut,
            "the worker saw a violation from tether's own engine: {v:?} (engine {t:?})"
        );
    }
    if wk == OutcomeKind::TransportFailed {
        assert!(p.cut, "a worker transport failure without a cut");
    }
    match t.kind() {
        TerminationKind::Finished => {
            assert_eq!(
                wk,
                OutcomeKind::Finished,
                "engine Finished, worker {outcome:?}"
            );
            // Every batch crossed exactly once, in order, both ways.
            let sent_e: Vec<u32> =
                p.e.sent
                    .iter()
                    .filter_map(|r| match req_msg(r) {
                        RequestMessage::Data(d) => Some(tag_of(&d)),
                        _ => None,
                    })
                    .collect();
            // The worker read a prefix and dropped the rest unread (udf §2.1), nothing lost.
            let read = tags(&p.w.input);
            assert_eq!(
                read[..],
                sent_e[..read.len()],
                "the worker's input ≠ the engine's data"
            );
            assert_eq!(p.w.core.stats().data_received, sent_e.len() as u64);
            let sent_w: Vec<u32> =
                p.w.sent
                    .iter()
                    .filter_map(|r| match resp_msg(r) {
                        ResponseMessage::Data(d) => Some(tag_of(&d)),
                        _ => None,
                    })
                    .collect();
            assert_eq!(p.e.core.stats().data_received, sent_w.len() as u64);
            if !p.drained {
                assert_eq!(
                    tags(&p.e.output),
                    sent_w,
                    "the engine's output ≠ the worker's data"
                );
            }
        }
        TerminationKind::Cancelled => assert!(
            matches!(wk, OutcomeKind::Cancelled | OutcomeKind::ProtocolViolation),
            "engine Cancelled, worker {outcome:?}"
        ),
        _ => {}
    }
    if !p.cut && !gave_up {
        match wk {
            OutcomeKind::Finished => {
                assert_eq!(
                    t.kind(),
                    TerminationKind::Finished,
                    "worker Finished, engine {t:?}"
                )
            }
            OutcomeKind::Cancelled | OutcomeKind::ProtocolViolation => assert_eq!(
                t.kind(),
                TerminationKind::Cancelled,
                "worker {outcome:?}, engine {t:?}"
            ),
            OutcomeKind::TransportFailed => {}
        }
    }
    // One terminator crossed (unless the stream was cut before it).
    let terminators =
        p.w.sent
            .iter()
            .filter(|r| matches!(r.kind(), Some(ResponseKind::Finish | ResponseKind::Cancel)))
            .count();
    assert!(terminators <= 1);
    if !p.cut {
        assert_eq!(terminators, 1, "the worker sent no terminator");
    }
});
