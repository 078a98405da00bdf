//! The engine core × the worker core under simulated time (`tether_testing::pair`): scripted
//! sessions that read like quinn-proto's pair tests (connect, send, finish, drive, assert
//! both sides), the udf §8 scenarios that match (`udf_sNNN_…`), and random schedules over
//! message order, delays, Cancel at every point, cuts and the cores' own timers. Every step
//! of every test is checked by the pair's watchers (one terminal per side, first wins,
//! nothing after a terminal, the udf §2 order), and every settled session by
//! `Pair::assert_agreement` (the two outcomes agree).

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use tether::wire::{ExecutionError, RequestKind, ResponseKind};
use tether::worker::endpoint::{
    EndpointOutcome, EngineViolation, InitTimeout, OutcomeKind, WorkerPhase,
};
use tether::worker::engine::{
    EnginePhase, InitStatus, PeerViolation, Termination, TerminationKind, TransportFailure, Wait,
};
use tether_testing::fixtures::{init, tagged};
use tether_testing::model_cases;
use tether_testing::pair::{
    Pair, RequestEnd, UserAnswer, WorkerUser, engine_config, worker_config,
};

type Check = Result<(), Box<dyn std::error::Error>>;

fn engine_kind(pair: &Pair) -> TerminationKind {
    pair.termination()
        .expect("the engine settled a terminal")
        .kind()
}

fn worker_kind(pair: &Pair) -> OutcomeKind {
    pair.outcome()
        .expect("the worker settled an outcome")
        .kind()
}

fn requests(pair: &Pair) -> Vec<RequestKind> {
    pair.engine()
        .sent
        .iter()
        .map(|r| r.kind().unwrap())
        .collect()
}

fn responses(pair: &Pair) -> Vec<ResponseKind> {
    pair.worker()
        .sent
        .iter()
        .map(|r| r.kind().unwrap())
        .collect()
}

fn timed_out(pair: &Pair, wait: Wait) -> bool {
    matches!(
        pair.termination(),
        Some(Termination::TransportFailed(TransportFailure::Timeout { waiting_for, .. }))
            if *waiting_for == wait
    )
}

fn execution_error(pair: &Pair) -> Option<&ExecutionError> {
    match pair.termination()? {
        Termination::Finished {
            execution_error, ..
        }
        | Termination::Cancelled {
            execution_error, ..
        } => execution_error.as_ref(),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// The happy paths (udf §8.3)
// ---------------------------------------------------------------------------------------

#[test]
fn udf_s051_init_one_batch_finish() -> Check {
    let mut pair = Pair::default();
    pair.connect();
    assert!(pair.send("a")?);
    assert!(pair.finish()?);
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Finished);
    assert_eq!(worker_kind(&pair), OutcomeKind::Finished);
    assert_eq!(pair.output(), ["a"]);
    assert_eq!(execution_error(&pair), None);
    use RequestKind as Q;
    use ResponseKind as A;
    assert_eq!(requests(&pair), [Q::Init, Q::Data, Q::Finish]);
    assert_eq!(responses(&pair), [A::Init, A::Data, A::Finish]);
    assert_eq!(pair.in_flight(), (0, 0));
    // No deadline fired: a session that answers at once takes no simulated time.
    assert_eq!(pair.elapsed(), Duration::ZERO);
    Ok(())
}

#[test]
fn udf_s052_three_batches_echoed_in_order() -> Check {
    let mut pair = Pair::default();
    pair.connect();
    for b in ["a", "b", "c"] {
        pair.send(b)?;
    }
    pair.finish()?;
    pair.drive();
    assert_eq!(pair.output(), ["a", "b", "c"]);
    assert_eq!(pair.input(), ["a", "b", "c"]);
    assert_eq!(engine_kind(&pair), TerminationKind::Finished);
    assert_eq!(worker_kind(&pair), OutcomeKind::Finished);
    Ok(())
}

#[test]
fn udf_s053_batches_sent_while_responses_are_in_flight() -> Check {
    // Init + 5 Data + Finish queued before any answer is delivered.
    let mut pair = Pair::default();
    pair.start_init(init("udf"), None)?;
    pair.deliver_to_worker(1);
    pair.deliver_to_engine(1);
    for n in 0..5 {
        pair.send(tagged(n, 8))?;
    }
    pair.finish()?;
    assert_eq!(pair.in_flight().0, 6);
    pair.drive();
    assert_eq!(
        pair.output(),
        (0..5).map(|n| tagged(n, 8)).collect::<Vec<_>>()
    );
    assert_eq!(engine_kind(&pair), TerminationKind::Finished);
    Ok(())
}

#[test]
fn udf_s055_chunked_payload_assembles() -> Check {
    for chunk in [1, 3, 64] {
        let mut pair = Pair::default();
        pair.start_init(init("abcdefghi"), Some(chunk))?;
        let chunks = pair.engine().sent.len() - 1;
        assert_eq!(chunks, 9usize.div_ceil(chunk), "chunk size {chunk}");
        pair.drive();
        assert_eq!(pair.engine().core.phase(), EnginePhase::Streaming);
        pair.send("x")?;
        pair.finish()?;
        pair.drive();
        assert_eq!(pair.output(), ["x"]);
        assert_eq!(engine_kind(&pair), TerminationKind::Finished);
    }
    Ok(())
}

#[test]
fn udf_s056_generator_with_zero_inputs() -> Check {
    // Init then Finish, no data: FinishResponse, zero results.
    let mut pair = Pair::default();
    pair.connect();
    pair.finish()?;
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Finished);
    assert_eq!(worker_kind(&pair), OutcomeKind::Finished);
    assert!(pair.output().is_empty());

    // A generator worker emits its rows after Finish, before the FinishResponse.
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.start_init(init("udf"), None)?;
    pair.drive();
    pair.worker_accept_init()?;
    pair.drive();
    pair.finish()?;
    pair.drive();
    assert_eq!(pair.worker().core.phase(), WorkerPhase::Draining);
    for row in ["r1", "r2", "r3"] {
        assert!(pair.worker_send(row)?);
    }
    pair.worker_finish()?;
    pair.drive();
    assert_eq!(pair.output(), ["r1", "r2", "r3"]);
    assert_eq!(engine_kind(&pair), TerminationKind::Finished);
    assert_eq!(worker_kind(&pair), OutcomeKind::Finished);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Cancel in each phase (udf §4.8, §2 R5, R7)
// ---------------------------------------------------------------------------------------

#[test]
fn cancel_before_init_opens_no_stream() {
    let mut pair = Pair::default();
    assert!(!pair.cancel("never started"), "no Cancel goes on the wire");
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert!(pair.engine().sent.is_empty());
    assert!(pair.worker().sent.is_empty());
    assert_eq!(pair.worker().core.phase(), WorkerPhase::AwaitingInit);
    pair.assert_agreement();
}

#[test]
fn cancel_while_init_is_in_flight() -> Check {
    // The worker gets Init then Cancel before its user saw the Init: it answers itself.
    let mut pair = Pair::default();
    pair.start_init(init("udf"), None)?;
    assert!(pair.cancel("changed my mind"));
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    assert_eq!(requests(&pair), [RequestKind::Init, RequestKind::Cancel]);
    Ok(())
}

#[test]
fn udf_s065_cancel_after_a_non_final_chunk() -> Check {
    let mut pair = Pair::default();
    pair.start_init(init("abcdef"), Some(2))?;
    pair.deliver_to_worker(2); // Init and the first chunk
    assert_eq!(pair.worker().core.phase(), WorkerPhase::AwaitingChunks);
    // The engine's Cancel drops its unsent chunks... which the pair has already put on the
    // wire: they arrive before the Cancel, in order.
    assert!(pair.cancel("abort"));
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    assert_eq!(execution_error(&pair), None);
    Ok(())
}

#[test]
fn cancel_while_the_worker_user_holds_the_init() -> Check {
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.start_init(init("udf"), None)?;
    pair.drive();
    assert_eq!(pair.worker().core.phase(), WorkerPhase::InitPending);
    pair.worker_user(UserAnswer::TakeInit)?; // the user is now running the UDF's setup
    assert!(pair.cancel("abort"));
    pair.drive();
    // The user saw the Init: the Cancel waits for its answer; the engine waits too.
    assert_eq!(pair.worker().core.phase(), WorkerPhase::Cancelling);
    assert_eq!(pair.engine().core.phase(), EnginePhase::Cancelling);
    // The late accept sends nothing (udf §2 R7); the user answers the Cancel.
    pair.worker_accept_init()?;
    pair.worker_cancelled()?;
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    assert_eq!(responses(&pair), [ResponseKind::Cancel]);
    Ok(())
}

#[test]
fn udf_s057_cancel_while_streaming_with_data_in_flight() -> Check {
    let mut pair = Pair::default();
    pair.connect();
    pair.send("a")?;
    pair.send("b")?;
    assert!(pair.cancel("stop"));
    assert!(!pair.send("c")?, "nothing is sent after Cancel (udf §4.7)");
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    assert_eq!(execution_error(&pair), None);
    // The batches ahead of the Cancel were echoed; nothing follows the CancelResponse.
    assert_eq!(pair.output(), ["a", "b"]);
    assert_eq!(responses(&pair).last(), Some(&ResponseKind::Cancel));
    Ok(())
}

#[test]
fn udf_s058_cancel_after_finish_either_terminator() -> Check {
    // (c) of the terminator matrix: the Cancel reaches the worker before or after its
    // FinishResponse, and the engine accepts either.
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.connect_manually()?;
    pair.finish()?;
    pair.drive(); // Finish delivered: the user drains
    pair.cancel("late");
    pair.drive(); // the Cancel reaches the draining worker first
    pair.worker_cancelled()?;
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);

    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.connect_manually()?;
    pair.finish()?;
    pair.drive();
    pair.worker_finish()?; // the FinishResponse is in flight...
    pair.cancel("late"); // ...when the engine cancels
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Finished);
    assert_eq!(worker_kind(&pair), OutcomeKind::Finished);
    assert_eq!(pair.worker().core.stats().ignored_after_done, 1);
    Ok(())
}

/// The manual-worker form of `connect`.
trait ConnectManually {
    fn connect_manually(&mut self) -> Check;
}

impl ConnectManually for Pair {
    fn connect_manually(&mut self) -> Check {
        self.start_init(init("udf"), None)?;
        self.drive();
        self.worker_accept_init()?;
        self.drive();
        assert_eq!(self.engine().core.phase(), EnginePhase::Streaming);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Worker errors (udf §2 R4)
// ---------------------------------------------------------------------------------------

#[test]
fn udf_s059_user_error_mid_stream() -> Check {
    let mut pair = Pair::default();
    pair.connect();
    pair.send("a")?;
    pair.send("ERROR")?;
    pair.send("b")?;
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    let error = execution_error(&pair).expect("the UserError reaches the engine");
    assert_eq!(error.error_class(), Some("SimulatedError"));
    assert_eq!(pair.outcome().unwrap().reported_error(), Some(error));
    // The batch before the error was echoed; none after it.
    assert_eq!(pair.output(), ["a"]);
    use ResponseKind as A;
    assert_eq!(
        responses(&pair),
        [A::Init, A::Data, A::Error, A::Cancel],
        "after the ErrorResponse the terminator is a CancelResponse"
    );
    assert_eq!(requests(&pair).last(), Some(&RequestKind::Cancel));
    Ok(())
}

#[test]
fn user_error_at_finish_is_answered_by_cancel_after_finish() -> Check {
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.connect_manually()?;
    pair.send("a")?;
    pair.finish()?;
    pair.drive();
    assert_eq!(pair.worker_echo(), 1);
    pair.worker_fail(ExecutionError::user("finish callback failed"))?;
    pair.drive(); // the engine sends Cancel after Finish; the worker's user must answer
    assert_eq!(pair.worker().core.phase(), WorkerPhase::Cancelling);
    pair.worker_cancelled()?;
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    assert_eq!(
        execution_error(&pair).map(|e| e.message()),
        Some("finish callback failed")
    );
    assert_eq!(pair.output(), ["a"]);
    use RequestKind as Q;
    assert_eq!(requests(&pair), [Q::Init, Q::Data, Q::Finish, Q::Cancel]);
    Ok(())
}

#[test]
fn udf_s061_init_failure() -> Check {
    let mut pair = Pair::default();
    pair.start_init(init("INIT_ERROR"), None)?;
    pair.drive();
    assert_eq!(pair.engine().core.init_status(), InitStatus::Failed);
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    assert_eq!(
        execution_error(&pair).map(|e| e.message()),
        Some("simulated init failure")
    );
    assert_eq!(requests(&pair), [RequestKind::Init, RequestKind::Cancel]);
    assert_eq!(responses(&pair), [ResponseKind::Init, ResponseKind::Cancel]);
    Ok(())
}

#[test]
fn udf_s062_init_failure_from_a_chunked_payload() -> Check {
    for chunk in [10, 3] {
        let mut pair = Pair::default();
        pair.start_init(init("INIT_ERROR"), Some(chunk))?;
        pair.drive();
        assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
        assert_eq!(
            execution_error(&pair).map(|e| e.message()),
            Some("simulated init failure")
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Timeouts through the cores' own timers (udf §7)
// ---------------------------------------------------------------------------------------

#[test]
fn init_timeout() -> Check {
    let config = engine_config();
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.start_init(init("udf"), None)?;
    pair.drive();
    pair.worker_user(UserAnswer::TakeInit)?; // the user's setup never ends
    pair.drive();
    assert_eq!(pair.elapsed(), Duration::ZERO, "drive waits for the user");
    pair.advance(config.init_timeout - Duration::from_millis(1));
    assert!(pair.termination().is_none(), "not one millisecond early");
    pair.advance(Duration::from_millis(1));
    assert!(timed_out(&pair, Wait::InitResponse));
    // The best-effort Cancel reaches the worker, and the engine's abort follows it (a
    // failure terminator, udf §2 R9); the user's late answer is ignored by the engine.
    assert_eq!(requests(&pair), [RequestKind::Init, RequestKind::Cancel]);
    assert_eq!(pair.engine_request_end(), Some(RequestEnd::Aborted));
    assert_eq!(pair.deliver_to_worker(1), 1);
    assert_eq!(pair.worker().core.phase(), WorkerPhase::Cancelling);
    pair.worker_cancelled()?;
    pair.drive();
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    assert!(
        timed_out(&pair, Wait::InitResponse),
        "the first terminal wins"
    );
    assert_eq!(pair.engine().core.stats().ignored_after_terminal, 1);
    assert_eq!(pair.elapsed(), config.init_timeout);
    Ok(())
}

#[test]
fn udf_s034_worker_ignores_cancel_terminal_timeout() -> Check {
    let config = engine_config();
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.connect_manually()?;
    pair.close();
    pair.drive();
    assert_eq!(pair.worker().core.phase(), WorkerPhase::Cancelling);
    pair.advance(config.terminal_timeout);
    assert!(timed_out(&pair, Wait::Terminator));
    pair.complete(); // the user finally answers; the engine keeps its terminal
    assert!(timed_out(&pair, Wait::Terminator));
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    Ok(())
}

#[test]
fn udf_s046_worker_never_sends_the_terminator() -> Check {
    // The worker echoes but never answers Finish: the engine's per-poll wait ends it.
    let config = engine_config();
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.connect_manually()?;
    pair.send("a")?;
    pair.finish()?;
    pair.drive();
    pair.worker_echo();
    pair.drive(); // the user holds the turn: no time passes
    assert_eq!(pair.elapsed(), Duration::ZERO);
    pair.advance(config.terminal_timeout);
    assert!(timed_out(&pair, Wait::Output));
    assert_eq!(pair.output(), ["a"]);
    Ok(())
}

#[test]
fn worker_r4_cancel_timeout_when_the_cancel_never_arrives() -> Check {
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.connect_manually()?;
    pair.worker_fail(ExecutionError::user("boom"))?;
    // The ErrorResponse reaches the engine, whose Cancel stays in flight.
    pair.deliver_to_engine(usize::MAX);
    assert_eq!(pair.engine().core.phase(), EnginePhase::Cancelling);
    assert_eq!(pair.in_flight().0, 1);
    let r4 = worker_config().cancel_timeout.unwrap();
    pair.advance(r4 - Duration::from_millis(1));
    assert_eq!(pair.worker().core.phase(), WorkerPhase::PostError);
    pair.advance(Duration::from_millis(1));
    match pair.outcome() {
        Some(EndpointOutcome::ProtocolViolation(EngineViolation::NoCancelAfterError { after })) => {
            assert_eq!(*after, r4)
        }
        other => panic!("expected the R4 close, got {other:?}"),
    }
    // Now the Cancel arrives (ignored) and the worker's CancelResponse ends the engine.
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(pair.worker().core.stats().ignored_after_done, 1);
    Ok(())
}

#[test]
fn interrupt_acknowledged_ends_cancelled() {
    let mut pair = Pair::default();
    pair.connect();
    pair.interrupt("reading output");
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
}

#[test]
fn udf_s048_interrupt_of_a_silent_worker_ends_interrupted() -> Check {
    let config = engine_config();
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.start_init(init("udf"), None)?;
    pair.drive();
    pair.worker_user(UserAnswer::TakeInit)?;
    pair.interrupt("initializing");
    pair.drive();
    pair.advance(config.interrupt_cancel_timeout);
    assert_eq!(engine_kind(&pair), TerminationKind::Interrupted);
    assert_eq!(pair.elapsed(), config.interrupt_cancel_timeout);
    pair.complete();
    assert_eq!(engine_kind(&pair), TerminationKind::Interrupted);
    Ok(())
}

#[test]
fn a_cut_stream_fails_both_sides() -> Check {
    let mut pair = Pair::default();
    pair.connect();
    pair.send("a")?;
    pair.deliver_to_worker(1); // echoed; the echo is in flight
    pair.send("b")?;
    pair.cut();
    pair.drive();
    assert!(matches!(
        pair.termination(),
        Some(Termination::TransportFailed(TransportFailure::Connection(
            _
        )))
    ));
    assert_eq!(worker_kind(&pair), OutcomeKind::TransportFailed);
    assert!(pair.output().is_empty(), "the echo in flight was lost");
    assert_eq!(pair.in_flight(), (0, 0));
    // Nothing sent later arrives, and no side sends anything more.
    assert!(!pair.send("c")?);
    pair.drive();
    assert_eq!(pair.worker().sent.len(), 2);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The worker's wait for the Init (udf §4.6, §7)
// ---------------------------------------------------------------------------------------

/// The `InitTimeout` cause of the worker's `TransportFailed`, if that is how it ended.
fn init_timeout_cause(pair: &Pair) -> Option<InitTimeout> {
    match pair.outcome()? {
        EndpointOutcome::TransportFailed(e) => std::error::Error::source(e)?
            .downcast_ref::<InitTimeout>()
            .copied(),
        _ => None,
    }
}

#[test]
fn an_engine_that_connects_and_never_inits_loses_the_worker_session() -> Check {
    let wait = worker_config()
        .init_timeout
        .expect("the pair's worker waits for the Init");
    let mut pair = Pair::default();
    pair.drive();
    assert_eq!(
        pair.elapsed(),
        Duration::ZERO,
        "the engine's caller holds the turn"
    );
    pair.advance(wait - Duration::from_millis(1));
    assert_eq!(pair.worker().core.phase(), WorkerPhase::AwaitingInit);
    assert!(pair.outcome().is_none(), "not one millisecond early");
    pair.advance(Duration::from_millis(1));
    assert_eq!(init_timeout_cause(&pair), Some(InitTimeout { after: wait }));
    assert!(
        pair.worker().sent.is_empty(),
        "the worker sends nothing to a peer that never spoke (udf §2 R8)"
    );
    assert_eq!(
        pair.in_flight(),
        (0, 1),
        "only the worker's end of the stream"
    );
    // An engine that inits now finds the stream gone: its Init is ignored, and the end of
    // the stream without a terminator fails it (udf §2 R10); it aborts (R9).
    pair.start_init(init("too late"), None)?;
    pair.drive();
    assert!(matches!(
        pair.termination(),
        Some(Termination::TransportFailed(TransportFailure::Protocol(
            PeerViolation::StreamEndedWithoutTerminator
        )))
    ));
    assert_eq!(pair.worker().core.stats().ignored_after_done, 1);
    assert_eq!(pair.engine_request_end(), Some(RequestEnd::Aborted));
    assert_eq!(init_timeout_cause(&pair), Some(InitTimeout { after: wait }));
    Ok(())
}

#[test]
fn an_init_just_before_the_deadline_is_served() -> Check {
    let wait = worker_config()
        .init_timeout
        .expect("the pair's worker waits for the Init");
    let mut pair = Pair::default();
    pair.drive();
    pair.advance(wait - Duration::from_millis(1));
    pair.connect();
    pair.advance(wait);
    assert_eq!(
        pair.worker().core.phase(),
        WorkerPhase::Data,
        "no deadline once Init came"
    );
    pair.send("a")?;
    pair.finish()?;
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Finished);
    assert_eq!(worker_kind(&pair), OutcomeKind::Finished);
    assert_eq!(pair.output(), ["a"]);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Data the worker queued but did not write when the Cancel came (udf §2 R7)
// ---------------------------------------------------------------------------------------

#[test]
fn a_cancel_drops_the_worker_data_queued_but_not_written() -> Check {
    let mut pair = Pair::default();
    pair.connect();
    pair.hold_worker_writes();
    pair.send("a")?;
    pair.send("b")?;
    assert_eq!(pair.deliver_to_worker(2), 2);
    // Both echoes are queued in the worker, none written.
    assert_eq!(pair.worker().core.stats().data_sent, 2);
    assert!(pair.worker().core.has_transmit());
    assert_eq!(pair.in_flight(), (0, 0));
    assert!(pair.cancel("stop"));
    assert_eq!(pair.deliver_to_worker(1), 1);
    // The Cancel dropped the queued echoes; the echo worker answered it.
    assert_eq!(worker_kind(&pair), OutcomeKind::Cancelled);
    assert_eq!(pair.worker().core.stats().output_dropped, 2);
    pair.release_worker_writes();
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Cancelled);
    assert!(
        pair.output().is_empty(),
        "no batch crossed after the Cancel"
    );
    assert_eq!(responses(&pair), [ResponseKind::Init, ResponseKind::Cancel]);
    assert_eq!(pair.engine().core.stats().data_received, 0);
    Ok(())
}

#[test]
fn held_writes_that_are_not_cancelled_all_cross_in_order() -> Check {
    let mut pair = Pair::default();
    pair.connect();
    pair.hold_worker_writes();
    pair.send("a")?;
    pair.send("b")?;
    pair.finish()?;
    assert_eq!(pair.deliver_to_worker(3), 3);
    assert_eq!(worker_kind(&pair), OutcomeKind::Finished);
    assert_eq!(pair.in_flight(), (0, 0), "nothing written while held");
    pair.release_worker_writes();
    pair.drive();
    assert_eq!(engine_kind(&pair), TerminationKind::Finished);
    assert_eq!(pair.output(), ["a", "b"]);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// How the engine ends its request side (udf §2 R9, §5.2 step 4)
// ---------------------------------------------------------------------------------------

#[test]
fn the_engine_half_closes_after_a_clean_terminator_and_aborts_after_a_failure() -> Check {
    let config = engine_config();
    let mut seen = Vec::new();

    // Finished ⇒ half-close.
    let mut pair = Pair::default();
    pair.connect();
    pair.finish()?;
    pair.drive();
    seen.push((engine_kind(&pair), pair.engine_request_end()));

    // Cancelled ⇒ half-close.
    let mut pair = Pair::default();
    pair.connect();
    pair.cancel("stop");
    pair.drive();
    seen.push((engine_kind(&pair), pair.engine_request_end()));

    // TransportFailed (a timeout) ⇒ the farewell Cancel, then abort; the worker whose user
    // has not answered the Cancel yet sees the abort as a stream error (udf §2 R8).
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.connect_manually()?;
    pair.finish()?;
    pair.drive();
    pair.advance(config.terminal_timeout);
    assert!(timed_out(&pair, Wait::Output));
    assert_eq!(
        requests(&pair),
        [RequestKind::Init, RequestKind::Finish, RequestKind::Cancel]
    );
    seen.push((engine_kind(&pair), pair.engine_request_end()));
    pair.deliver_to_worker(usize::MAX);
    assert_eq!(worker_kind(&pair), OutcomeKind::TransportFailed);

    // Interrupted ⇒ the farewell Cancel, then abort.
    let mut pair = Pair::default().with_worker_user(WorkerUser::Manual);
    pair.connect_manually()?;
    pair.interrupt("reading output");
    pair.drive();
    pair.advance(config.interrupt_cancel_timeout);
    seen.push((engine_kind(&pair), pair.engine_request_end()));

    // TransportFailed (a cut stream) ⇒ abort (nothing reaches the worker any more).
    let mut pair = Pair::default();
    pair.connect();
    pair.cut();
    pair.drive();
    seen.push((engine_kind(&pair), pair.engine_request_end()));

    use TerminationKind::*;
    let aborted = Some(RequestEnd::Aborted);
    let half_closed = Some(RequestEnd::HalfClosed);
    assert_eq!(
        seen,
        [
            (Finished, half_closed),
            (Cancelled, half_closed),
            (TransportFailed, aborted),
            (Interrupted, aborted),
            (TransportFailed, aborted),
        ]
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Random schedules
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    StartInit { chunk: Option<usize>, len: usize },
    Send,
    Finish,
    Cancel,
    Close,
    Interrupt,
    EngineRead,
    User(UserAnswer),
    WorkerSend,
    WorkerRead,
    ToWorker(usize),
    ToEngine(usize),
    Advance(u64),
    Cut,
}

fn op() -> impl Strategy<Value = Op> {
    let answer = proptest::sample::select(UserAnswer::ALL.to_vec());
    prop_oneof![
        2 => (proptest::option::of(1usize..8), 0usize..12)
            .prop_map(|(chunk, len)| Op::StartInit { chunk, len }),
        4 => Just(Op::Send),
        2 => Just(Op::Finish),
        1 => Just(Op::Cancel),
        1 => Just(Op::Close),
        1 => Just(Op::Interrupt),
        2 => Just(Op::EngineRead),
        3 => answer.prop_map(Op::User),
        3 => Just(Op::WorkerSend),
        2 => Just(Op::WorkerRead),
        5 => (1usize..6).prop_map(Op::ToWorker),
        5 => (1usize..6).prop_map(Op::ToEngine),
        // Up to 40 s: past every deadline of the pair's configs.
        2 => (0u64..40_000).prop_map(Op::Advance),
        1 => Just(Op::Cut),
    ]
}

/// One random schedule: `ops` on a pair whose worker is echoing or answered by the ops,
/// then run to the end; every step and the final agreement are checked by the pair.
fn run_schedule(echo: bool, buffers: (usize, usize), ops: &[Op]) -> Pair {
    let engine = tether::worker::engine::SessionConfig {
        output_buffer: buffers.0,
        ..engine_config()
    };
    let worker = tether::worker::endpoint::EndpointConfig {
        input_buffer: buffers.1,
        ..worker_config()
    };
    let user = if echo {
        WorkerUser::Echo
    } else {
        WorkerUser::Manual
    };
    let mut pair = Pair::new(&engine, &worker).with_worker_user(user);
    // The pair's convention (tether_testing::pair::watch): the engine's tags below 2^31, the
    // worker's own from 2^31 up, so each source's order is checked apart.
    let (mut data, mut out) = (0u32, 1u32 << 31);
    for op in ops {
        match op {
            Op::StartInit { chunk, len } => {
                let _ = pair.start_init(init(vec![0x5a; *len]), *chunk);
            }
            Op::Send => {
                data += 1;
                let _ = pair.send(tagged(u64::from(data), 8));
            }
            Op::Finish => {
                let _ = pair.finish();
            }
            Op::Cancel => {
                pair.cancel("random");
            }
            Op::Close => pair.close(),
            Op::Interrupt => pair.interrupt("a random schedule"),
            Op::EngineRead => {
                pair.engine_read();
            }
            // The echo worker's user answers by itself.
            Op::User(_) | Op::WorkerSend | Op::WorkerRead if echo => {}
            Op::User(answer) => {
                let _ = pair.worker_user(*answer);
            }
            Op::WorkerSend => {
                out += 1;
                let _ = pair.worker_send(tagged(u64::from(out), 8));
            }
            Op::WorkerRead => {
                pair.worker_read();
            }
            Op::ToWorker(n) => {
                pair.deliver_to_worker(*n);
            }
            Op::ToEngine(n) => {
                pair.deliver_to_engine(*n);
            }
            Op::Advance(ms) => pair.advance(Duration::from_millis(*ms)),
            Op::Cut => pair.cut(),
        }
    }
    pair.complete();
    pair
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: model_cases(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_schedules_agree(
        echo in any::<bool>(),
        buffers in (1usize..5, 1usize..5),
        ops in proptest::collection::vec(op(), 0..64),
    ) {
        let pair = run_schedule(echo, buffers, &ops);
        prop_assert!(pair.is_settled());
    }
}

/// The schedule a random run once shrank to: a manual worker's own batch reaches the engine
/// before the engine's first batch, which the completing echo then returns. Each source's
/// batches are in order (udf §4.7); the worker's tags were once below 2^31 and were checked
/// as if they came from the engine.
#[test]
fn a_worker_batch_before_the_engines_first_then_its_echo_are_each_in_order() {
    let ops = [
        Op::StartInit {
            chunk: None,
            len: 0,
        },
        Op::ToWorker(1),
        Op::User(UserAnswer::Accept),
        Op::WorkerSend,
        Op::ToEngine(1),
        Op::Send,
    ];
    let pair = run_schedule(false, (1, 1), &ops);
    assert!(pair.is_settled());
}

/// Cancel at every point of a finishing echo session: after each prefix of a fixed
/// schedule, the engine cancels, and the pair settles with agreeing outcomes.
#[test]
fn cancel_at_every_point_of_a_session() {
    let script = [
        Op::StartInit {
            chunk: None,
            len: 3,
        },
        Op::ToWorker(1),
        Op::ToEngine(1),
        Op::Send,
        Op::Send,
        Op::ToWorker(1),
        Op::ToEngine(1),
        Op::Finish,
        Op::ToWorker(1),
        Op::ToWorker(1),
        Op::ToEngine(1),
        Op::ToEngine(1),
        Op::ToEngine(1),
    ];
    let mut kinds = std::collections::BTreeSet::new();
    for at in 0..=script.len() {
        let mut ops = script[..at].to_vec();
        ops.push(Op::Cancel);
        let pair = run_schedule(true, (4, 4), &ops);
        kinds.insert(format!("{:?}", engine_kind(&pair)));
    }
    // Early cancels end Cancelled; once the FinishResponse is in flight, Finished.
    assert!(
        kinds.contains("Cancelled") && kinds.contains("Finished"),
        "{kinds:?}"
    );
}

/// How fast the pair runs: 500 random schedules (each run to its end and checked),
/// reported as cases per second on stderr (`--nocapture`). The schedules are generated
/// first: in a debug build proptest's ChaCha generator costs more than the pair itself.
#[test]
fn schedules_per_second() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = (
        any::<bool>(),
        (1usize..5, 1usize..5),
        proptest::collection::vec(op(), 0..64),
    );
    let cases: Vec<_> = (0..500)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    let started = Instant::now();
    let mut ops = 0;
    for (echo, buffers, schedule) in &cases {
        let pair = run_schedule(*echo, *buffers, schedule);
        assert!(pair.is_settled());
        ops += schedule.len();
    }
    let per_case = started.elapsed() / cases.len() as u32;
    eprintln!(
        "pair: {} random schedules ({ops} ops), {per_case:?} per case ({:.0} cases/s)",
        cases.len(),
        1.0 / per_case.as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// answer_pending: the Udf mapping over a bare WorkerCore (what the pair's echo worker runs)
// ---------------------------------------------------------------------------------------------

mod answer_pending {
    use bytes::Bytes;
    use tether::wire::{ResponseKind, UdfRequest};
    use tether::worker::endpoint::{
        Delivery, OutcomeKind, WorkerCore, WorkerPhase, answer_pending,
    };
    use tether_testing::echo::{ERROR_BATCH, EchoUdf, INIT_ERROR_PAYLOAD};
    use tether_testing::fixtures::{
        self, USER_ERROR_CLASS, data_request, endpoint_config, init_request,
    };

    fn sent(core: &mut WorkerCore) -> Vec<ResponseKind> {
        std::iter::from_fn(|| core.poll_transmit())
            .map(|r| r.kind().expect("a response with its oneof set"))
            .collect()
    }

    #[test]
    fn a_whole_session_is_answered_in_order_with_finish_metrics() {
        let (mut udf, probe) = EchoUdf::with_probe();
        let mut core = WorkerCore::new(&endpoint_config());
        core.handle_request(init_request("udf"));
        let first = answer_pending(&mut core, &mut udf).unwrap();
        assert!(first.acted && first.queued.is_empty());
        core.handle_request(data_request("a"));
        core.handle_request(data_request("b"));
        core.handle_request(UdfRequest::finish());
        let second = answer_pending(&mut core, &mut udf).unwrap();
        assert_eq!(second.queued.len(), 2, "both batches echoed");
        assert!(
            second
                .queued
                .iter()
                .all(|t| core.delivery(*t) == Delivery::Queued)
        );
        let out: Vec<_> = std::iter::from_fn(|| core.poll_transmit())
            .map(|r| r.into_message().unwrap())
            .collect();
        assert_eq!(
            fixtures::kinds(&out),
            [
                ResponseKind::Init,
                ResponseKind::Data,
                ResponseKind::Data,
                ResponseKind::Finish
            ]
        );
        assert_eq!(fixtures::data_strings(&out), ["a", "b"]);
        assert_eq!(fixtures::finish_response(&out[3]), &fixtures::finish_ok());
        assert_eq!(
            core.outcome().map(|o| o.kind()),
            Some(OutcomeKind::Finished)
        );
        let calls = probe.lock().unwrap();
        assert_eq!((calls.batches, calls.finishes, calls.cancels), (2, 1, 0));
        // Nothing is pending any more.
        drop(calls);
        assert!(!answer_pending(&mut core, &mut udf).unwrap().acted);
    }

    #[test]
    fn a_failing_batch_sends_an_error_drops_the_rest_and_waits_for_the_cancel() {
        let (mut udf, probe) = EchoUdf::with_probe();
        let mut core = WorkerCore::new(&endpoint_config());
        core.handle_request(init_request("udf"));
        // Data only after the InitResponse (udf §2 R6).
        answer_pending(&mut core, &mut udf).unwrap();
        core.handle_request(data_request("a"));
        core.handle_request(data_request(ERROR_BATCH));
        core.handle_request(data_request("never read"));
        answer_pending(&mut core, &mut udf).unwrap();
        assert_eq!(core.phase(), WorkerPhase::PostError);
        assert_eq!(
            sent(&mut core),
            [ResponseKind::Init, ResponseKind::Data, ResponseKind::Error]
        );
        assert_eq!(
            core.reported_error().and_then(|e| e.error_class()),
            Some(USER_ERROR_CLASS)
        );
        core.handle_request(UdfRequest::cancel(None));
        answer_pending(&mut core, &mut udf).unwrap();
        assert_eq!(sent(&mut core), [ResponseKind::Cancel]);
        assert_eq!(
            core.outcome().map(|o| o.kind()),
            Some(OutcomeKind::Cancelled)
        );
        let calls = probe.lock().unwrap();
        assert_eq!(
            (calls.batches, calls.cancels),
            (2, 1),
            "the third batch was dropped"
        );
    }

    #[test]
    fn an_init_held_when_the_cancel_came_reaches_init_before_cancel() {
        let (mut udf, probe) = EchoUdf::with_probe();
        let mut core = WorkerCore::new(&endpoint_config());
        core.handle_request(init_request(INIT_ERROR_PAYLOAD));
        core.handle_request(UdfRequest::cancel(Some("stop".into())));
        assert_eq!(core.phase(), WorkerPhase::Cancelling);
        answer_pending(&mut core, &mut udf).unwrap();
        let out: Vec<_> = std::iter::from_fn(|| core.poll_transmit())
            .map(|r| r.into_message().unwrap())
            .collect();
        // Only the CancelResponse goes out, carrying the init's error (udf §2 R7).
        assert_eq!(fixtures::kinds(&out), [ResponseKind::Cancel]);
        assert_eq!(
            fixtures::cancel_response(&out[0])
                .error
                .as_ref()
                .map(|e| e.message().to_owned()),
            Some(fixtures::INIT_FAILURE.to_owned())
        );
        let calls = probe.lock().unwrap();
        assert_eq!(calls.init_payloads, [Bytes::from_static(b"INIT_ERROR")]);
        assert_eq!(calls.cancels, 1);
    }
}
