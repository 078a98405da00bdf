//! The deadline table of udf §7, checked by behaviour under a manual clock (no real sleeps).
//!
//! Each engine deadline (init total, per poll while streaming, the total terminator wait of
//! `close`, the total wait after an init error, the interrupt's Cancel acknowledgement, the
//! request side's shutdown after the terminal) and the worker's R4 cancel deadline is
//! checked on the sans-IO cores: nothing at the deadline − 1 ms, the timeout at the
//! deadline, and, where total and per-poll differ, a worker event in between that moves a
//! per-poll deadline and leaves a total one where it is. Every length is distinct, so a
//! change to any one policy in a core (its length, its kind or what its expiry settles)
//! fails a test here. The last tests run the async drivers over the in-memory connection
//! on a [`ManualClock`]: they show that the drivers take their deadlines from the cores.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tether::time::ManualClock;
use tether::wire::{ExecutionError, InitResponse, RequestKind, UdfRequest, UdfResponse};
use tether::worker::endpoint::{EndpointOutcome, EngineViolation, WorkerCore, WorkerPhase};
use tether::worker::engine::{
    EngineCore, EnginePhase, SessionError, Termination, TransportFailure, Wait,
};
use tether_testing::fixtures::{
    MS, TEST_CANCEL, TEST_INIT, TEST_INTERRUPT, TEST_TERMINAL, data, endpoint_config, init,
    init_ok, session_config, session_config_on,
};
use tether_testing::script::{engine_session, settle, until_armed};

fn drain_requests(core: &mut EngineCore) -> Vec<RequestKind> {
    std::iter::from_fn(|| core.poll_transmit())
        .map(|r| r.kind().expect("a request"))
        .collect()
}

/// A core whose `Init` is on the wire, waiting for the `InitResponse`.
fn initializing() -> EngineCore {
    let mut core = EngineCore::new(&session_config());
    core.start_init(init("udf"), None).expect("init");
    assert_eq!(drain_requests(&mut core), [RequestKind::Init]);
    core
}

/// A core in `Streaming`.
fn streaming() -> EngineCore {
    let mut core = initializing();
    core.handle_response(UdfResponse::init(InitResponse::default()));
    assert_eq!(core.phase(), EnginePhase::Streaming);
    core
}

fn timeout_of(core: &EngineCore) -> Option<(Wait, Duration)> {
    match core.terminal() {
        Some(Termination::TransportFailed(TransportFailure::Timeout { waiting_for, after })) => {
            Some((*waiting_for, *after))
        }
        _ => None,
    }
}

/// `handle_timeout` a millisecond before `at` changes nothing; at `at` the core settles.
fn expires_exactly_at(core: &mut EngineCore, at: Instant) {
    assert_eq!(core.poll_timeout(), Some(at), "the armed deadline");
    core.handle_timeout(at - MS);
    assert!(!core.is_terminal(), "nothing at the deadline - 1 ms");
    assert_eq!(core.poll_timeout(), Some(at));
    core.handle_timeout(at);
    assert!(core.is_terminal(), "settled at the deadline");
}

#[test]
fn init_deadline_is_total_from_the_first_wait() {
    let mut core = initializing();
    let t0 = Instant::now();
    core.begin_wait(t0);
    // A worker event (a duplicate answer would do; here an ignored chunk of time passes and
    // a new wait begins) does not move a total deadline.
    core.begin_wait(t0 + Duration::from_secs(10));
    expires_exactly_at(&mut core, t0 + TEST_INIT);
    assert_eq!(timeout_of(&core), Some((Wait::InitResponse, TEST_INIT)));
    // The worker learns about it: a best-effort Cancel stays queued behind the terminal.
    assert_eq!(drain_requests(&mut core), [RequestKind::Cancel]);
}

#[test]
fn init_deadline_ignores_worker_events() {
    let mut core = EngineCore::new(&session_config());
    core.start_init(init("udf"), Some(1)).expect("init");
    let t0 = Instant::now();
    core.begin_wait(t0);
    // Taking the chunks is a worker event; a per-poll deadline would restart, this one not.
    let _ = drain_requests(&mut core);
    core.begin_wait(t0 + Duration::from_secs(29));
    expires_exactly_at(&mut core, t0 + TEST_INIT);
    assert_eq!(timeout_of(&core), Some((Wait::InitResponse, TEST_INIT)));
}

#[test]
fn streaming_deadline_is_per_poll() {
    let mut core = streaming();
    let t0 = Instant::now();
    core.begin_wait(t0);
    assert_eq!(core.poll_timeout(), Some(t0 + TEST_TERMINAL));
    // A DataResponse at t0 + 15 s ends that wait; the next one starts its own.
    let t1 = t0 + Duration::from_secs(15);
    core.handle_response(data("a"));
    assert_eq!(core.poll_timeout(), None, "the event ended the wait");
    core.begin_wait(t1);
    core.handle_timeout(t0 + TEST_TERMINAL);
    assert!(
        !core.is_terminal(),
        "a total deadline would have expired here"
    );
    expires_exactly_at(&mut core, t1 + TEST_TERMINAL);
    assert_eq!(timeout_of(&core), Some((Wait::Output, TEST_TERMINAL)));
    assert_eq!(drain_requests(&mut core), [RequestKind::Cancel]);
}

#[test]
fn streaming_deadline_restarts_with_each_call() {
    let mut core = streaming();
    let t0 = Instant::now();
    core.begin_wait(t0);
    // The caller got what it waited for (a queued batch): the next call waits afresh.
    core.end_wait();
    let t1 = t0 + Duration::from_secs(19);
    core.begin_wait(t1);
    expires_exactly_at(&mut core, t1 + TEST_TERMINAL);
}

#[test]
fn streaming_deadline_counts_transport_progress_as_an_event() {
    let mut core = streaming();
    assert!(
        core.send_data(Bytes::from_static(b"in"))
            .expect("streaming")
    );
    let t0 = Instant::now();
    core.begin_wait(t0);
    let t1 = t0 + Duration::from_secs(5);
    assert_eq!(drain_requests(&mut core), [RequestKind::Data]);
    core.begin_wait(t1);
    expires_exactly_at(&mut core, t1 + TEST_TERMINAL);
}

#[test]
fn finishing_deadline_is_per_poll_and_reports_output() {
    let mut core = streaming();
    assert!(core.finish().expect("streaming"));
    let _ = drain_requests(&mut core);
    let t0 = Instant::now();
    core.begin_wait(t0);
    core.handle_response(data("trailing"));
    let t1 = t0 + Duration::from_secs(7);
    core.begin_wait(t1);
    expires_exactly_at(&mut core, t1 + TEST_TERMINAL);
    assert_eq!(timeout_of(&core), Some((Wait::Output, TEST_TERMINAL)));
}

#[test]
fn cancelling_wait_is_per_poll_and_reports_the_terminator() {
    let mut core = streaming();
    assert!(core.cancel(Some("user".into())));
    let _ = drain_requests(&mut core);
    let t0 = Instant::now();
    core.begin_wait(t0);
    core.handle_response(data("late"));
    let t1 = t0 + Duration::from_secs(3);
    core.begin_wait(t1);
    expires_exactly_at(&mut core, t1 + TEST_TERMINAL);
    assert_eq!(timeout_of(&core), Some((Wait::Terminator, TEST_TERMINAL)));
    assert!(
        drain_requests(&mut core).is_empty(),
        "the Cancel is already out: no second one"
    );
}

#[test]
fn close_waits_for_the_terminator_in_total() {
    let mut core = streaming();
    let t0 = Instant::now();
    core.begin_wait(t0);
    core.close();
    assert_eq!(drain_requests(&mut core), [RequestKind::Cancel]);
    core.begin_wait(t0);
    // Output keeps arriving (and is discarded): a per-poll wait would never end.
    for s in 1..20 {
        core.handle_response(data("ignored"));
        core.begin_wait(t0 + Duration::from_secs(s));
    }
    assert_eq!(core.output_len(), 0, "close discards output");
    expires_exactly_at(&mut core, t0 + TEST_TERMINAL);
    assert_eq!(timeout_of(&core), Some((Wait::Terminator, TEST_TERMINAL)));
}

#[test]
fn an_init_error_waits_for_the_cancel_answer_in_total() {
    let mut core = initializing();
    let t0 = Instant::now();
    core.begin_wait(t0);
    core.handle_response(UdfResponse::init(InitResponse {
        error: Some(ExecutionError::user("bad udf")),
        ..InitResponse::default()
    }));
    assert_eq!(drain_requests(&mut core), [RequestKind::Cancel]);
    // The init deadline is over; the terminator wait (total) begins with the next wait.
    let t1 = t0 + Duration::from_secs(1);
    core.begin_wait(t1);
    core.begin_wait(t1 + Duration::from_secs(10));
    expires_exactly_at(&mut core, t1 + TEST_TERMINAL);
    assert_eq!(timeout_of(&core), Some((Wait::Terminator, TEST_TERMINAL)));
    // A failed init still reports the worker's error (udf §4.6 step 5), the data phase the
    // terminal's.
    assert!(
        core.init_error()
            .and_then(|e| e.execution_error().cloned())
            .is_some()
    );
    assert!(matches!(core.error(), Some(SessionError::Transport(_))));
}

#[test]
fn an_interrupt_waits_for_the_acknowledgement_in_total() {
    let mut core = streaming();
    let t0 = Instant::now();
    core.interrupt("reading UDF result");
    assert_eq!(drain_requests(&mut core), [RequestKind::Cancel]);
    core.begin_wait(t0);
    core.handle_response(data("ignored"));
    core.begin_wait(t0 + Duration::from_secs(1));
    expires_exactly_at(&mut core, t0 + TEST_INTERRUPT);
    match core.terminal() {
        Some(Termination::Interrupted(i)) => {
            assert_eq!(i.context, "reading UDF result");
            assert_eq!(i.waited, TEST_INTERRUPT);
        }
        other => panic!("expected Interrupted, got {other:?}"),
    }
}

#[test]
fn an_acknowledged_interrupt_is_cancelled_not_interrupted() {
    let mut core = streaming();
    let t0 = Instant::now();
    core.interrupt("sending UDF input");
    let _ = drain_requests(&mut core);
    core.begin_wait(t0);
    core.handle_response(UdfResponse::cancel(Default::default()));
    core.handle_timeout(t0 + TEST_INTERRUPT);
    assert!(matches!(
        core.terminal(),
        Some(Termination::Cancelled { .. })
    ));
}

#[test]
fn the_request_side_shutdown_is_bounded_after_the_terminal() {
    let mut core = streaming();
    let t0 = Instant::now();
    core.begin_wait(t0);
    core.handle_timeout(t0 + TEST_TERMINAL);
    assert!(core.has_transmit(), "the farewell Cancel is queued");
    assert!(!core.wants_half_close(), "the farewell goes first");
    // The transport never takes it.
    let t1 = t0 + TEST_TERMINAL + Duration::from_secs(1);
    core.begin_wait(t1);
    assert_eq!(core.poll_timeout(), Some(t1 + TEST_INTERRUPT));
    core.handle_timeout(t1 + TEST_INTERRUPT - MS);
    assert!(!core.requests_abandoned(), "nothing at the deadline - 1 ms");
    core.handle_timeout(t1 + TEST_INTERRUPT);
    assert!(core.requests_abandoned());
    assert!(!core.has_transmit(), "the farewell is dropped");
    assert_eq!(core.poll_timeout(), None, "no deadline after the shutdown");
}

#[test]
fn no_deadline_before_init() {
    let mut core = EngineCore::new(&session_config());
    let t0 = Instant::now();
    core.begin_wait(t0);
    assert_eq!(core.poll_timeout(), None);
    core.handle_timeout(t0 + Duration::from_secs(3600));
    assert_eq!(core.phase(), EnginePhase::Created);
}

// --- the worker's R4 cancel deadline -------------------------------------------------------

/// A worker core that reported a data-phase error and waits for the engine's Cancel.
fn post_error() -> WorkerCore {
    let mut core = WorkerCore::new(&endpoint_config());
    core.handle_request(UdfRequest::init(init("udf")));
    let _ = core.take_init();
    core.accept_init(None).expect("accept");
    core.fail(ExecutionError::user("boom")).expect("fail");
    while core.poll_transmit().is_some() {}
    assert_eq!(core.phase(), WorkerPhase::PostError);
    core
}

#[test]
fn worker_r4_cancel_deadline_is_total() {
    let mut core = post_error();
    let t0 = Instant::now();
    core.begin_wait(t0);
    // The engine's late data and Finish are ignored, and do not move the deadline.
    core.handle_request(UdfRequest::data(Bytes::from_static(b"late")));
    core.begin_wait(t0 + Duration::from_secs(20));
    assert_eq!(core.poll_timeout(), Some(t0 + TEST_CANCEL));
    core.handle_timeout(t0 + TEST_CANCEL - MS);
    assert_eq!(core.phase(), WorkerPhase::PostError, "nothing at - 1 ms");
    core.handle_timeout(t0 + TEST_CANCEL);
    match core.outcome() {
        Some(EndpointOutcome::ProtocolViolation(v)) => {
            assert_eq!(
                *v,
                EngineViolation::NoCancelAfterError { after: TEST_CANCEL }
            );
        }
        other => panic!("expected the R4 violation, got {other:?}"),
    }
}

#[test]
fn worker_r4_deadline_ends_with_the_cancel() {
    let mut core = post_error();
    let t0 = Instant::now();
    core.begin_wait(t0);
    core.handle_request(UdfRequest::cancel(Some("after your error".into())));
    assert_eq!(core.poll_timeout(), None);
    core.handle_timeout(t0 + TEST_CANCEL);
    assert_eq!(core.phase(), WorkerPhase::Cancelling);
}

// --- the drivers take their deadlines from the cores ---------------------------------------

#[tokio::test]
async fn session_init_times_out_exactly_at_the_core_deadline() {
    let clock = ManualClock::new();
    let (session, _worker, _handle) = engine_session(session_config_on(&clock));
    let task = tokio::spawn(session.init(init("udf")));
    until_armed(&clock).await;
    clock.advance(TEST_INIT - MS);
    settle().await;
    assert!(!task.is_finished(), "nothing at the deadline - 1 ms");
    clock.advance(MS);
    let failed = match task.await.expect("task") {
        Ok(_) => panic!("init cannot succeed against a silent worker"),
        Err(failed) => failed,
    };
    let outcome = failed.session.close().await;
    assert!(
        matches!(
            outcome,
            Termination::TransportFailed(TransportFailure::Timeout {
                waiting_for: Wait::InitResponse,
                after: TEST_INIT
            })
        ),
        "{outcome}"
    );
}

#[tokio::test]
async fn session_recv_deadline_is_per_poll() {
    let clock = ManualClock::new();
    let (session, mut worker, _handle) = engine_session(session_config_on(&clock));
    let init = tokio::spawn(session.init(init("udf")));
    worker.expect(RequestKind::Init).await;
    worker.try_send(init_ok()).await.expect("send");
    let (mut session, _) = init.await.expect("task").expect("init ok");
    let t0 = clock.now();
    let task = tokio::spawn(async move {
        let first = session.recv().await;
        let second = session.recv().await;
        (first, second, session)
    });
    until_armed(&clock).await;
    clock.advance(Duration::from_secs(15));
    worker.try_send(data("a")).await.expect("send");
    settle().await;
    // The second recv waits from t0 + 15 s: a total deadline would fire at t0 + 20 s.
    clock.set(t0 + TEST_TERMINAL);
    settle().await;
    assert!(
        !task.is_finished(),
        "per poll: the event moved the deadline"
    );
    clock.set(t0 + Duration::from_secs(15) + TEST_TERMINAL - MS);
    settle().await;
    assert!(!task.is_finished(), "nothing at the deadline - 1 ms");
    clock.set(t0 + Duration::from_secs(15) + TEST_TERMINAL);
    let (first, second, session) = task.await.expect("task");
    assert_eq!(first.expect("a batch"), Some(Bytes::from_static(b"a")));
    assert!(second.is_err(), "the second read timed out");
    let outcome = session.close().await;
    assert!(
        matches!(
            outcome,
            Termination::TransportFailed(TransportFailure::Timeout {
                waiting_for: Wait::Output,
                ..
            })
        ),
        "{outcome}"
    );
}

// --- `Duration::MAX` as "never" --------------------------------------------------------

/// A deadline of `Duration::MAX` (a user's "never time out") cannot be added to an
/// `Instant`: the cores saturate it (about 100 years) instead of panicking, on every row of
/// the udf §7 table (a new user found `begin_wait` panicking with "overflow when adding
/// duration to instant").
#[test]
fn duration_max_timeouts_never_fire_and_never_panic() {
    let mut config = session_config();
    config.init_timeout = Duration::MAX;
    config.terminal_timeout = Duration::MAX;
    config.interrupt_cancel_timeout = Duration::MAX;
    let mut core = EngineCore::new(&config);
    core.start_init(init("udf"), None).expect("init");
    assert_eq!(drain_requests(&mut core), [RequestKind::Init]);
    let t0 = Instant::now();
    core.begin_wait(t0);
    let at = core.poll_timeout().expect("a deadline, saturated");
    assert!(
        at >= t0 + Duration::from_secs(99 * 365 * 24 * 3600),
        "{at:?}"
    );
    core.handle_timeout(t0 + Duration::from_secs(365 * 24 * 3600));
    assert_eq!(
        core.phase(),
        EnginePhase::Initializing,
        "nothing after a year"
    );
    core.handle_response(init_ok());
    core.begin_wait(t0);
    assert!(core.poll_timeout().is_some_and(|at| at > t0));

    let mut worker_config = endpoint_config();
    worker_config.init_timeout = Some(Duration::MAX);
    worker_config.cancel_timeout = Some(Duration::MAX);
    let mut worker = WorkerCore::new(&worker_config);
    worker.begin_wait(t0);
    worker.handle_timeout(t0 + Duration::from_secs(365 * 24 * 3600));
    assert_eq!(
        worker.phase(),
        WorkerPhase::AwaitingInit,
        "nothing after a year"
    );
    worker.handle_request(UdfRequest::init(init("udf")));
    let _ = worker.take_init();
    worker.accept_init(None).expect("accept");
    worker.fail(ExecutionError::user("boom")).expect("fail");
    while worker.poll_transmit().is_some() {}
    worker.begin_wait(t0);
    worker.handle_timeout(t0 + Duration::from_secs(365 * 24 * 3600));
    assert_eq!(worker.phase(), WorkerPhase::PostError, "R4 never fires");
}
