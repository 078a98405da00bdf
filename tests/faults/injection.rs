//! Fault injection end to end (issue 11 item 4): an engine `Session` against the worker
//! `Endpoint` (`serve` with the echo UDF of udf §2.1), with `tether_testing::fault`
//! wrapping the typed connection (in-memory pair, framed) or the bytes under a framed
//! connection (a Unix socket in a temp dir, a socket pair).
//!
//! Each test asserts the protocol outcome of its fault: the engine's `Termination` (a
//! `TransportFailed` invalidates the worker, udf §6.5; a dropped session whose worker went
//! silent is `Interrupted`, udf §4.9), the worker's `EndpointOutcome` (udf §2 R6, R8), and
//! that every batch delivered before the fault arrives exactly once and in order. Schedules
//! that only reshape the flow (delays under the timeouts, split writes, `Pending`) must not
//! change the outcome: the session still finishes with all its data. The property test at the
//! end draws random plans (`TETHER_MODEL_CASES` sets its depth).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use proptest::prelude::*;
use tether::connection::framed::{FramedConfig, FramedConnection, FramedError};
use tether::connection::{Connection, pair};
use tether::time::ManualClock;
use tether::wire::{FrameError, InitResponse, UdfRequest, UdfResponse};
use tether::worker::endpoint::{
    EndpointConfig, EndpointOutcome, EngineViolation, OutcomeKind, serve,
};
use tether::worker::engine::{
    CountingHandle, PeerViolation, Session, SessionConfig, Termination, TerminationKind,
    TransportFailure, Wait, WorkerHandle,
};
use tether_testing::fault::{
    Direction, FaultCounters, FaultPlan, FaultReport, FaultyConnection, FaultyIo, InjectedFault,
    IoCounters, IoPlan, IoReport, RandomFaults, RandomIo, ReadEnd, WriteStep, injected,
};
use tether_testing::model_cases;
use tokio::task::JoinHandle;

use tether_testing::echo::EchoUdf;
use tether_testing::fixtures::{framed_error, init};

/// The input of every session: six batches of different sizes.
fn batches() -> Vec<Bytes> {
    (0..6)
        .map(|i| Bytes::from(format!("batch-{i}-{}", "x".repeat(i * 7))))
        .collect()
}

/// Messages each side sends in a clean session: Init (or InitResponse), six batches, the
/// Finish (or FinishResponse).
const MESSAGES: u64 = 8;

/// What one session did.
struct Run {
    outcome: Termination,
    /// The batches the engine received, in arrival order.
    delivered: Vec<Bytes>,
    handle: Arc<CountingHandle>,
    /// The worker's outcome, `None` if it never ended (a stalled worker side).
    worker: Option<EndpointOutcome>,
}

impl Run {
    /// The invariants every session keeps, whatever the fault: one release; batches
    /// delivered exactly once and in order up to the fault; `Finished` means everything
    /// arrived; an unsalvageable outcome invalidated the worker (udf §5.1, §6.5).
    fn check_invariants(&self) {
        let expected = batches();
        assert_eq!(self.handle.releases(), 1, "released once");
        assert!(
            self.delivered.len() <= expected.len()
                && self.delivered[..] == expected[..self.delivered.len()],
            "delivered {:?} is not a prefix of the input",
            self.delivered
        );
        if matches!(self.outcome, Termination::Finished { .. }) {
            assert_eq!(self.delivered, expected, "Finished with missing batches");
        }
        assert_eq!(
            self.handle.is_invalid(),
            !self.outcome.is_salvageable(),
            "worker validity vs outcome {}",
            self.outcome
        );
    }

    /// Asserts a clean session: `Finished` on both sides, every batch, the worker valid.
    fn assert_finished(&self) {
        self.check_invariants();
        assert!(
            matches!(self.outcome, Termination::Finished { .. }),
            "expected Finished, got {}",
            self.outcome
        );
        assert_eq!(self.delivered, batches());
        assert!(
            matches!(self.worker, Some(EndpointOutcome::Finished)),
            "worker: {:?}",
            self.worker
        );
    }

    /// Asserts the engine saw the worker's stream end without a terminator (udf §2 R10: a
    /// transport failure) and invalidated the worker.
    fn assert_ended_without_terminator(&self) {
        assert!(
            matches!(
                self.transport_failure(),
                TransportFailure::Protocol(PeerViolation::StreamEndedWithoutTerminator)
            ),
            "{}",
            self.outcome
        );
        assert!(self.handle.is_invalid());
    }

    /// Asserts the engine failed on a frame cut short: the framed transport's typed
    /// `Truncated` error (a transport failure, udf §6.5), not a panic or a silent end.
    fn assert_truncated_frame(&self) {
        let error = self.outcome.to_error().expect("an error");
        assert!(
            matches!(
                framed_error(&error),
                FramedError::Frame(FrameError::Truncated { .. })
            ),
            "{error:?}"
        );
    }

    /// The kind of the worker's outcome (`None`: it never ended).
    fn worker_kind(&self) -> Option<OutcomeKind> {
        self.worker.as_ref().map(EndpointOutcome::kind)
    }

    /// The injected fault behind a `TransportFailed(Connection(_))`, or panics.
    fn injected_cause(&self) -> InjectedFault {
        let TransportFailure::Connection(error) = self.transport_failure() else {
            panic!("expected a connection failure, got {}", self.outcome);
        };
        injected(error).unwrap_or_else(|| panic!("not an injected fault: {error:?}"))
    }

    /// The connection error behind a `TransportFailed`, or panics.
    fn transport_failure(&self) -> &TransportFailure {
        match &self.outcome {
            Termination::TransportFailed(f) => f,
            other => panic!("expected TransportFailed, got {other}"),
        }
    }
}

/// Runs the echo worker on `worker`, the engine on `engine` (Spark's iterator style, udf
/// §4.7: all six batches in, output read to the end, then `close`).
async fn run<E, W>(engine: E, worker: W) -> Run
where
    E: Connection<UdfRequest, UdfResponse> + Send + Unpin + 'static,
    W: Connection<UdfResponse, UdfRequest> + Send + 'static,
{
    let worker = tokio::spawn(serve(worker, EchoUdf::default(), EndpointConfig::default()));
    let handle = Arc::new(CountingHandle::for_one_session());
    let session = Session::new(engine, handle.clone(), SessionConfig::default());
    let (outcome, delivered) = match session.init(init("echo")).await {
        Err(failed) => (failed.session.close().await, Vec::new()),
        Ok((session, _)) => {
            let mut output = session.process(futures::stream::iter(batches()));
            let mut delivered = Vec::new();
            while let Some(Ok(batch)) = output.next().await {
                delivered.push(batch);
            }
            (output.close().await, delivered)
        }
    };
    // The session and its connection are gone: a worker that can still hear anything
    // hears the end of its request stream.
    let worker = join(worker).await;
    Run {
        outcome,
        delivered,
        handle,
        worker,
    }
}

/// The worker's outcome, or `None` if it has not ended within ten (virtual) minutes.
async fn join(worker: JoinHandle<EndpointOutcome>) -> Option<EndpointOutcome> {
    let abort = worker.abort_handle();
    match tokio::time::timeout(Duration::from_secs(600), worker).await {
        Ok(outcome) => Some(outcome.expect("the worker task panicked")),
        Err(_) => {
            abort.abort();
            None
        }
    }
}

/// Runs a session over the in-memory pair with `engine_plan` on the engine's connection and
/// `worker_plan` on the worker's; returns the run and both sides' counters.
async fn run_memory(
    engine_plan: FaultPlan,
    worker_plan: FaultPlan,
) -> (Run, FaultReport, FaultReport) {
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(4);
    let engine = FaultyConnection::new(engine, engine_plan);
    let worker = FaultyConnection::new(worker, worker_plan);
    let (ec, wc): (FaultCounters, FaultCounters) = (engine.counters(), worker.counters());
    let run = run(engine, worker).await;
    (run, ec.report(), wc.report())
}

fn none() -> FaultPlan {
    FaultPlan::new()
}

// ---------------------------------------------------------------------------------------------
// Typed messages over the in-memory pair
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_empty_plan_passes_every_message_and_counts_it() {
    let (run, engine, worker) = run_memory(none(), none()).await;
    run.assert_finished();
    let clean = FaultReport {
        sent: MESSAGES,
        received: MESSAGES,
        ..FaultReport::default()
    };
    assert_eq!(engine, clean);
    assert_eq!(worker, clean);
}

#[tokio::test(start_paused = true)]
async fn a_cut_at_an_engine_send_fails_the_session_and_the_worker_hears_the_stream_end() {
    // Init and three batches leave; the fourth batch (message 4) cuts the connection.
    let (run, engine, _) = run_memory(none().drop_at(Direction::Send, 4), none()).await;
    run.check_invariants();
    assert_eq!(engine.dropped, 1);
    assert_eq!(engine.sent, 4);
    assert_eq!(run.injected_cause(), InjectedFault::ConnectionDropped);
    assert!(run.handle.is_invalid());
    assert!(run.delivered.len() <= 3, "only three batches were sent");
    assert!(
        matches!(
            run.worker,
            Some(EndpointOutcome::ProtocolViolation(
                EngineViolation::RequestStreamEnded
            )) | Some(EndpointOutcome::TransportFailed(_))
        ),
        "worker: {:?}",
        run.worker
    );
}

#[tokio::test(start_paused = true)]
async fn a_cut_at_an_engine_receive_keeps_the_batches_before_it_exactly_once() {
    // InitResponse and two batches arrive; the third batch (message 3) is lost in the cut.
    let (run, engine, _) = run_memory(none().drop_at(Direction::Recv, 3), none()).await;
    run.check_invariants();
    assert_eq!((engine.dropped, engine.received), (1, 3));
    assert_eq!(run.delivered, batches()[..2]);
    assert_eq!(run.outcome.kind(), TerminationKind::TransportFailed);
    assert!(run.handle.is_invalid());
    // The worker's next send finds the connection gone (udf §2 R8).
    assert_eq!(run.worker_kind(), Some(OutcomeKind::TransportFailed));
}

#[tokio::test(start_paused = true)]
async fn a_worker_killed_mid_output_is_a_stream_end_without_terminator() {
    // The worker's InitResponse and three batches leave; its fourth batch cuts (udf §8.4).
    let (run, _, worker) = run_memory(none(), none().drop_at(Direction::Send, 4)).await;
    run.check_invariants();
    assert_eq!(worker.dropped, 1);
    assert_eq!(run.delivered, batches()[..3]);
    run.assert_ended_without_terminator();
    assert_eq!(run.worker_kind(), Some(OutcomeKind::TransportFailed));
}

#[tokio::test(start_paused = true)]
async fn an_engine_receive_stall_ends_at_the_terminal_timeout() {
    let start = tokio::time::Instant::now();
    let (run, engine, _) = run_memory(none().stall(Direction::Recv, 3), none()).await;
    run.check_invariants();
    assert_eq!(engine.stalled, 1);
    assert_eq!(run.delivered, batches()[..2]);
    assert!(
        matches!(
            run.transport_failure(),
            TransportFailure::Timeout {
                waiting_for: Wait::Output | Wait::Terminator,
                ..
            }
        ),
        "{}",
        run.outcome
    );
    assert!(run.handle.is_invalid());
    assert!(start.elapsed() >= SessionConfig::default().terminal_timeout);
}

#[tokio::test(start_paused = true)]
async fn a_worker_whose_sends_stall_times_the_engine_out() {
    let (run, _, worker) = run_memory(none(), none().stall(Direction::Send, 2)).await;
    run.check_invariants();
    assert_eq!(worker.stalled, 1);
    assert_eq!(run.delivered, batches()[..1]);
    assert!(
        matches!(run.transport_failure(), TransportFailure::Timeout { .. }),
        "{}",
        run.outcome
    );
    assert!(run.handle.is_invalid());
}

#[tokio::test(start_paused = true)]
async fn dropping_a_session_whose_worker_went_silent_ends_interrupted() {
    // The engine hears InitResponse and one batch, then nothing: the Cancel that drop
    // cleanup sends is never acknowledged as far as the engine can tell (udf §4.9).
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(4);
    let engine = FaultyConnection::new(engine, none().stall(Direction::Recv, 2));
    let counters = engine.counters();
    let (udf, probe) = EchoUdf::with_probe();
    let worker = tokio::spawn(serve(worker, udf, EndpointConfig::default()));
    let handle = Arc::new(CountingHandle::for_one_session());
    let session = Session::new(engine, handle.clone(), SessionConfig::default());
    let (session, _) = session.init(init("echo")).await.expect("init");
    let watch = session.watch();
    let mut output = session.process(futures::stream::iter(batches()));
    let first = output.next().await.expect("one batch").expect("no error");
    assert_eq!(first, batches()[0]);
    let dropped_at = tokio::time::Instant::now();
    drop(output);
    let outcome = watch.wait().await;
    let Termination::Interrupted(interrupted) = &outcome else {
        panic!("expected Interrupted, got {outcome}");
    };
    assert_eq!(
        interrupted.waited,
        SessionConfig::default().interrupt_cancel_timeout
    );
    assert!(dropped_at.elapsed() >= interrupted.waited);
    assert!(handle.is_invalid());
    assert_eq!(handle.releases(), 1);
    assert_eq!(counters.report().stalled, 1);
    // The worker got the Cancel and ran its cancel callback, but its CancelResponse sat
    // behind output the engine no longer read, until the engine's side closed (udf §2 R8).
    let worker = join(worker).await;
    assert_eq!(
        probe.lock().unwrap().cancels,
        1,
        "the worker saw the Cancel"
    );
    assert!(
        matches!(worker, Some(EndpointOutcome::TransportFailed(_))),
        "worker: {worker:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn delays_under_the_timeouts_change_nothing() {
    let by = Duration::from_secs(5);
    let engine = none()
        .delay(Direction::Send, 0, by)
        .delay(Direction::Send, 3, by)
        .delay(Direction::Recv, 1, by)
        .delay(Direction::Recv, 7, by);
    let worker = none()
        .delay(Direction::Recv, 7, by)
        .delay(Direction::Send, 4, by);
    let start = tokio::time::Instant::now();
    let (run, engine, worker) = run_memory(engine, worker).await;
    run.assert_finished();
    assert_eq!((engine.delayed, worker.delayed), (4, 2));
    assert_eq!(engine.destructive() + worker.destructive(), 0);
    // At least the delays on the critical path (the Init, the FinishResponse) elapsed.
    assert!(start.elapsed() >= 2 * by, "{:?}", start.elapsed());
}

#[test]
fn a_delay_runs_on_a_manual_clock() {
    let clock = ManualClock::new();
    let (a, mut b) = pair::<u32, u32>(4);
    let mut a = FaultyConnection::new(
        a,
        none()
            .delay(Direction::Recv, 0, Duration::from_secs(10))
            .delay(Direction::Send, 0, Duration::from_secs(3)),
    )
    .with_timer(Arc::new(clock.clone()));
    let counters = a.counters();
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(b.poll_ready(&mut cx).is_ready());
    b.start_send(7).unwrap();
    // Held back until the clock has moved 10 s, although the message is there.
    assert!(a.poll_recv(&mut cx).is_pending());
    assert!(a.poll_ready(&mut cx).is_pending());
    clock.advance(Duration::from_secs(3));
    assert!(matches!(
        a.poll_ready(&mut cx),
        std::task::Poll::Ready(Ok(()))
    ));
    a.start_send(1).unwrap();
    assert!(matches!(
        b.poll_recv(&mut cx),
        std::task::Poll::Ready(Some(Ok(1)))
    ));
    clock.advance(Duration::from_secs(6));
    assert!(a.poll_recv(&mut cx).is_pending());
    clock.advance(Duration::from_secs(1));
    assert!(matches!(
        a.poll_recv(&mut cx),
        std::task::Poll::Ready(Some(Ok(7)))
    ));
    assert_eq!(counters.report().delayed, 2);
}

#[tokio::test(start_paused = true)]
async fn a_failed_start_send_fails_the_session_with_the_write_error() {
    let (run, engine, _) = run_memory(none().fail_write(3, WriteStep::StartSend), none()).await;
    run.check_invariants();
    assert_eq!((engine.failed_writes, engine.sent), (1, 3));
    assert_eq!(run.injected_cause(), InjectedFault::WriteFailed);
    assert!(run.handle.is_invalid());
    assert!(run.delivered.len() <= 2);
    // The engine side stays open until the session is gone; then the worker, still
    // sending output, finds the connection closed (udf §2 R8).
    assert_eq!(run.worker_kind(), Some(OutcomeKind::TransportFailed));
}

#[tokio::test(start_paused = true)]
async fn a_failed_flush_fails_the_session_after_the_message_left() {
    let (run, engine, worker) = run_memory(none().fail_write(3, WriteStep::Flush), none()).await;
    run.check_invariants();
    assert_eq!((engine.failed_writes, engine.sent), (1, 4));
    assert_eq!(run.injected_cause(), InjectedFault::WriteFailed);
    assert!(run.handle.is_invalid());
    assert!(
        worker.received >= 4,
        "the message before the failed flush arrived"
    );
}

#[tokio::test(start_paused = true)]
async fn an_engine_half_close_in_place_of_finish_is_a_violation_for_the_worker() {
    // Every batch is sent; the Finish (message 7) is swallowed by the half-close.
    let (run, engine, worker) = run_memory(none().half_close(7), none()).await;
    run.check_invariants();
    assert_eq!((engine.half_closed, engine.swallowed), (1, 1));
    assert_eq!(worker.received, 7, "the worker got Init and six batches");
    assert!(
        matches!(
            run.worker,
            Some(EndpointOutcome::ProtocolViolation(
                EngineViolation::RequestStreamEnded
            ))
        ),
        "worker: {:?}",
        run.worker
    );
    // The worker drops its queued output and closes with a ProtocolError and a
    // CancelResponse (udf §2 R6): the engine ends Cancelled with that error, the worker
    // having stayed healthy enough to say so.
    let Termination::Cancelled {
        execution_error: Some(error),
        ..
    } = &run.outcome
    else {
        panic!(
            "expected Cancelled with the worker's error, got {}",
            run.outcome
        );
    };
    assert!(
        error.to_string().contains("request stream ended"),
        "{error}"
    );
    assert!(!run.handle.is_invalid());
}

#[tokio::test(start_paused = true)]
async fn a_worker_half_close_without_finish_response_fails_the_engine() {
    // The worker's FinishResponse (message 7) is swallowed: the engine sees its response
    // stream end without a terminator (udf §2 R10).
    let (run, _, worker) = run_memory(none(), none().half_close(7)).await;
    run.check_invariants();
    assert_eq!((worker.half_closed, worker.swallowed), (1, 1));
    run.assert_ended_without_terminator();
    assert_eq!(
        run.delivered,
        batches(),
        "every batch before the half-close, once"
    );
}

// ---------------------------------------------------------------------------------------------
// The framed transport on a Unix socket
// ---------------------------------------------------------------------------------------------

/// A private temporary directory, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!("tether-fault-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&path).expect("temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A connected pair of Unix streams through a listener on a socket in a temp dir.
async fn unix_socket_pair() -> (TempDir, tokio::net::UnixStream, tokio::net::UnixStream) {
    let dir = TempDir::new();
    let path = dir.0.join("w.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let (accepted, connected) =
        tokio::join!(listener.accept(), tokio::net::UnixStream::connect(&path));
    (
        dir,
        connected.expect("connect"),
        accepted.expect("accept").0,
    )
}

/// Runs a session over the framed transport on `engine_io` / `worker_io`, each wrapped in a
/// [`FaultyIo`] with its plan.
async fn run_framed<T>(
    engine_io: T,
    engine_plan: IoPlan,
    worker_io: T,
    worker_plan: IoPlan,
) -> (Run, IoReport, IoReport)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let config = FramedConfig::default();
    let engine = FaultyIo::new(engine_io, engine_plan);
    let worker = FaultyIo::new(worker_io, worker_plan);
    let (ec, wc): (IoCounters, IoCounters) = (engine.counters(), worker.counters());
    let engine = FramedConnection::<_, UdfRequest, UdfResponse>::new(engine, &config);
    let worker = FramedConnection::<_, UdfResponse, UdfRequest>::new(worker, &config);
    let run = run(engine, worker).await;
    (run, ec.report(), wc.report())
}

/// Bytes on the wire of one frame carrying `message` (4-byte length prefix + body).
fn frame_len(message: &impl prost::Message) -> u64 {
    4 + message.encoded_len() as u64
}

/// Where the `n`-th data batch's response frame starts in the engine's read stream, and its
/// length: after the `InitResponse` frame and the batches before it.
fn data_response_frame(n: usize) -> (u64, u64) {
    let init = frame_len(&UdfResponse::init(InitResponse::default()));
    let frames: Vec<u64> = batches()
        .into_iter()
        .map(|b| frame_len(&UdfResponse::data(b)))
        .collect();
    (init + frames[..n].iter().sum::<u64>(), frames[n])
}

/// Where the `n`-th data batch's request frame starts in the engine's write stream.
fn data_request_frame(n: usize) -> (u64, u64) {
    let init = frame_len(&UdfRequest::init(init("echo")));
    let frames: Vec<u64> = batches()
        .into_iter()
        .map(|b| frame_len(&UdfRequest::data(b)))
        .collect();
    (init + frames[..n].iter().sum::<u64>(), frames[n])
}

#[tokio::test(start_paused = true)]
async fn split_writes_and_pendings_on_a_unix_socket_change_nothing() {
    let (_dir, engine, worker) = unix_socket_pair().await;
    let plan = IoPlan::new()
        .split_writes(1)
        .split_reads(3)
        .pending_every(2);
    let (run, engine, worker) = run_framed(engine, plan.clone(), worker, plan).await;
    run.assert_finished();
    for report in [engine, worker] {
        assert!(!report.destructive());
        assert!(report.split_writes > 0 && report.split_reads > 0 && report.pendings > 0);
        // split_writes(1): one byte per write.
        assert!(report.split_writes < report.bytes_written, "{report:?}");
    }
    assert_eq!(engine.bytes_written, worker.bytes_read);
    assert_eq!(worker.bytes_written, engine.bytes_read);
}

#[tokio::test(start_paused = true)]
async fn a_read_truncated_mid_frame_is_a_typed_truncation_after_the_whole_frames() {
    let (_dir, engine, worker) = unix_socket_pair().await;
    let (start, len) = data_response_frame(3);
    let plan = IoPlan::new().truncate_read(start + len / 2, ReadEnd::Eof);
    let (run, engine, _) = run_framed(engine, plan, worker, IoPlan::new()).await;
    run.check_invariants();
    assert!(engine.read_truncated);
    assert_eq!(
        run.delivered,
        batches()[..3],
        "the three whole frames, once"
    );
    run.assert_truncated_frame();
    assert!(run.handle.is_invalid());
}

#[tokio::test(start_paused = true)]
async fn a_read_error_mid_frame_carries_the_injected_fault() {
    let (_dir, engine, worker) = unix_socket_pair().await;
    let (start, _) = data_response_frame(1);
    let plan = IoPlan::new().truncate_read(start + 2, ReadEnd::Error);
    let (run, engine, _) = run_framed(engine, plan, worker, IoPlan::new()).await;
    run.check_invariants();
    assert!(engine.read_truncated);
    assert_eq!(run.delivered, batches()[..1]);
    assert_eq!(run.injected_cause(), InjectedFault::ReadTruncated);
}

#[tokio::test(start_paused = true)]
async fn a_worker_cut_mid_frame_truncates_the_engine_stream() {
    let (_dir, engine, worker) = unix_socket_pair().await;
    let (start, len) = data_response_frame(2);
    let plan = IoPlan::new().cut_after(Direction::Send, start + len - 1);
    let (run, _, worker) = run_framed(engine, IoPlan::new(), worker, plan).await;
    run.check_invariants();
    assert!(worker.cut);
    assert_eq!(worker.bytes_written, start + len - 1);
    assert_eq!(run.delivered, batches()[..2]);
    run.assert_truncated_frame();
    assert_eq!(run.worker_kind(), Some(OutcomeKind::TransportFailed));
}

#[tokio::test(start_paused = true)]
async fn an_engine_write_truncated_mid_frame_fails_both_sides() {
    let (_dir, engine, worker) = unix_socket_pair().await;
    let (start, len) = data_request_frame(4);
    let plan = IoPlan::new().truncate_write(start + len / 2);
    let (run, engine, _) = run_framed(engine, plan, worker, IoPlan::new()).await;
    run.check_invariants();
    assert!(engine.write_truncated);
    assert!(run.delivered.len() <= 4);
    assert_eq!(run.outcome.kind(), TerminationKind::TransportFailed);
    assert!(run.handle.is_invalid());
    // The worker reads the half frame, then the end: a typed truncation, not a panic.
    let Some(EndpointOutcome::TransportFailed(error)) = &run.worker else {
        panic!("worker: {:?}", run.worker);
    };
    let framed = std::error::Error::source(error)
        .and_then(|e| e.downcast_ref::<FramedError>())
        .expect("a framed error");
    assert!(
        matches!(framed, FramedError::Frame(FrameError::Truncated { .. })),
        "{framed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_typed_cut_over_the_framed_transport_ends_the_worker_on_a_frame_boundary() {
    let (_dir, engine, worker) = unix_socket_pair().await;
    let config = FramedConfig::default();
    let engine = FramedConnection::<_, UdfRequest, UdfResponse>::new(engine, &config);
    let engine = FaultyConnection::new(engine, none().drop_at(Direction::Send, 3));
    let counters = engine.counters();
    let worker = FramedConnection::<_, UdfResponse, UdfRequest>::new(worker, &config);
    let run = run(engine, worker).await;
    run.check_invariants();
    assert_eq!(counters.report().dropped, 1);
    assert_eq!(run.outcome.kind(), TerminationKind::TransportFailed);
    assert!(run.handle.is_invalid());
    assert!(
        matches!(
            run.worker,
            Some(EndpointOutcome::ProtocolViolation(
                EngineViolation::RequestStreamEnded
            ))
        ),
        "a clean EOF between frames: worker {:?}",
        run.worker
    );
}

// ---------------------------------------------------------------------------------------------
// Random plans
// ---------------------------------------------------------------------------------------------

/// One random case: message plans on both sides of the in-memory pair, or byte plans on
/// both sides of a socket pair.
fn random_case(seed: u64, framed: bool) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (run, destructive) = if framed {
            let settings = RandomIo {
                horizon: 160,
                ..RandomIo::default()
            };
            let (engine, worker) = tokio::net::UnixStream::pair().expect("socket pair");
            let (run, e, w) = run_framed(
                engine,
                IoPlan::random(seed, &settings),
                worker,
                IoPlan::random(seed ^ 0x5555, &settings),
            )
            .await;
            (run, e.destructive() || w.destructive())
        } else {
            let settings = RandomFaults {
                horizon: MESSAGES + 1,
                ..RandomFaults::default()
            };
            let (run, e, w) = run_memory(
                FaultPlan::random(seed, &settings),
                FaultPlan::random(seed ^ 0x5555, &settings),
            )
            .await;
            (run, e.destructive() + w.destructive() > 0)
        };
        run.check_invariants();
        assert_ne!(
            run.outcome.kind(),
            TerminationKind::Interrupted,
            "nothing was dropped"
        );
        if !destructive {
            run.assert_finished();
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: model_cases(128),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random plans: every session ends with a typed outcome, releases its worker once,
    /// delivers a prefix of its batches exactly once and in order, invalidates the worker
    /// when the outcome is unsalvageable, and finishes with everything when no destructive
    /// fault fired.
    #[test]
    fn random_plans_end_typed_and_lose_nothing_before_the_fault(seed in any::<u64>(), framed in any::<bool>()) {
        random_case(seed, framed);
    }
}

// ---------------------------------------------------------------------------------------------
// Reattach RPCs: a reattaching client over `FaultyRpc`
// ---------------------------------------------------------------------------------------------

/// A current-thread runtime on tokio's paused clock, for the property tests below (the
/// udf §7 timeouts and the rx §6.1 backoff elapse at once).
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// The Reattach side (rx §6.3): `ReattachingStream` over `FaultyRpc` around a
/// `ResultServer`, under tokio's paused clock (the client's backoff really sleeps).
mod reattach {
    use super::*;
    use tether::execution::ConnectError;
    use tether::execution::client::{ClientConfig, ClientError, ReattachingStream, RpcError};
    use tether::wire::connect::release_execute_request::Release;
    use tether_testing::connect::Caller;
    use tether_testing::fault::{
        FaultyRpc, RandomRpcFaults, ResultServer, RpcFault, RpcPlan, RpcReport, ServerCall,
    };

    const SESSION: &str = "6f1c3d2e-1111-4222-8333-444455556666";

    /// What one client run did.
    struct Outcome {
        delivered: Vec<String>,
        error: Option<ClientError>,
        report: RpcReport,
        calls: Vec<ServerCall>,
        violations: Vec<String>,
        retries: u64,
    }

    async fn run_client(n: u64, plan: RpcPlan) -> Outcome {
        let server = ResultServer::new(n);
        let rpc = FaultyRpc::new(server.clone(), plan);
        let counters = rpc.counters();
        let request = Caller::new("alice", SESSION).plan("p");
        let mut stream = ReattachingStream::new(Arc::new(rpc), request, ClientConfig::default())
            .expect("a valid request");
        let mut delivered = Vec::new();
        let mut error = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(response) => delivered.push(response.response_id),
                Err(e) => error = Some(e),
            }
        }
        let retries = stream.stats().retries;
        stream.close().await;
        Outcome {
            delivered,
            error,
            report: counters.report(),
            calls: server.calls(),
            violations: server.violations(),
            retries,
        }
    }

    fn ids(n: u64) -> Vec<String> {
        (1..=n).map(|i| format!("r{i}")).collect()
    }

    /// Releases through the wrapper (rx §6.3): each `ReleaseUntil` names a delivered
    /// response, and `ReleaseAll` reached the server (failed releases are retried, in the
    /// background, so their order at the server is not checked).
    fn check_releases(o: &Outcome) {
        let mut all = 0;
        for call in &o.calls {
            if let ServerCall::Release(r) = call {
                match &r.release {
                    Some(Release::ReleaseUntil(u)) => {
                        assert!(o.delivered.contains(&u.response_id), "released undelivered");
                    }
                    Some(Release::ReleaseAll(_)) => all += 1,
                    None => panic!("release without type"),
                }
            }
        }
        assert!(all >= 1, "ReleaseAll reached the server");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_execute_plan_is_sent_again_and_a_break_reattaches_from_the_last_response() {
        // Call 0 (ExecutePlan) never arrives; call 1 (a reattach) bounces with
        // OPERATION_NOT_FOUND; call 2 (ExecutePlan again, rx §6.3 step 3) breaks after r2
        // with r3 lost in flight; call 3 reattaches after r2 and finishes.
        let plan = RpcPlan::new()
            .lose(0)
            .break_after(2, 2, Some(RpcFault::retryable(true)));
        let o = run_client(6, plan).await;
        assert_eq!(o.delivered, ids(6));
        assert!(o.error.is_none(), "{:?}", o.error);
        assert_eq!((o.report.refused, o.report.broken), (1, 1));
        assert_eq!((o.report.executes, o.report.reattaches), (2, 2));
        let reattached_after: Vec<Option<String>> = o
            .calls
            .iter()
            .filter_map(|c| match c {
                ServerCall::Reattach(r) => Some(r.last_response_id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(reattached_after, [None, Some("r2".to_owned())]);
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        check_releases(&o);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fatal_status_ends_the_stream_after_the_responses_before_it() {
        let fatal = RpcError::from(ConnectError::OperationCanceled);
        let o = run_client(5, RpcPlan::new().break_after(0, 3, Some(fatal))).await;
        assert_eq!(o.delivered, ids(3));
        let error = o.error.as_ref().expect("the stream failed");
        assert!(
            error.has_condition(tether::execution::condition::OPERATION_CANCELED),
            "{error}"
        );
        assert_eq!(o.retries, 0, "not retried (rx §6.1)");
        check_releases(&o);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_releases_are_retried_and_change_no_delivery() {
        let plan = RpcPlan::new()
            .fail_release(0, RpcFault::retryable(false))
            .fail_release(2, RpcFault::retryable(true));
        let o = run_client(4, plan).await;
        assert_eq!(o.delivered, ids(4));
        assert_eq!(o.report.failed_releases, 2);
        assert!(o.report.releases > 2, "{:?}", o.report);
        check_releases(&o);
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: model_cases(128),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Random retryable plans (at most 3 faults, under Spark's 15 retries): the client
        /// delivers every response exactly once and in order, each response passed the
        /// wrapper once, never retries more often than faults fired, and releases right
        /// (rx §6.3, §6.4).
        #[test]
        fn random_rpc_plans_deliver_every_response_once(seed in any::<u64>(), n in 1u64..12) {
            let runtime = paused_runtime();
            let plan = RpcPlan::random(seed, &RandomRpcFaults::default());
            let o = runtime.block_on(run_client(n, plan.clone()));
            prop_assert!(o.error.is_none(), "{:?} under {:?}", o.error, plan);
            prop_assert_eq!(&o.delivered, &ids(n));
            prop_assert_eq!(o.report.responses, n);
            prop_assert!(o.retries <= o.report.fired(), "{} retries, {:?}", o.retries, o.report);
            prop_assert!(o.violations.is_empty(), "{:?}", o.violations);
            check_releases(&o);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One fault per plan, its outcome predicted
// ---------------------------------------------------------------------------------------------

/// A model-style property over `FaultyConnection`: one fault of any kind, on either side,
/// at any of the eight messages of a direction, and a reference that predicts the protocol
/// outcome of that plan (the engine's termination kind, how many batches arrive) from the
/// udf spec. A clean session moves eight messages each way: Init (InitResponse), six
/// batches, Finish (FinishResponse).
mod per_plan {
    use super::*;
    use tether_testing::fault::MessageFault;

    /// Which side's connection carries the fault.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Side {
        Engine,
        Worker,
    }

    /// How many of the six batches arrive at the engine, in order.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Batches {
        Exactly(usize),
        AtMost(usize),
    }

    /// The reference: the engine's outcome for `fault` on `side` (udf §4.5, §6.5, §7, §2 R6
    /// / R10).
    fn expect(side: Side, fault: &MessageFault) -> (TerminationKind, Batches) {
        use Batches::{AtMost, Exactly};
        use TerminationKind::{Cancelled, Finished, TransportFailed};
        // Message k of a direction is batch k (1..=6); batches before message k: k - 1.
        let before = |at: u64| (at.saturating_sub(1) as usize).min(6);
        match (side, fault) {
            // Delays under the udf §7 timeouts change nothing (udf §1.4).
            (_, MessageFault::Delay { .. }) => (Finished, Exactly(6)),
            // What the engine received before its receive side broke arrived, nothing after.
            (
                Side::Engine,
                MessageFault::Drop {
                    direction: Direction::Recv,
                    at,
                }
                | MessageFault::Stall {
                    direction: Direction::Recv,
                    at,
                },
            ) => (TransportFailed, Exactly(before(*at))),
            // The worker's output up to message `at` left; then its stream was cut, went
            // silent (udf §7) or ended without a terminator (udf §2 R10).
            (
                Side::Worker,
                MessageFault::Drop {
                    direction: Direction::Send,
                    at,
                }
                | MessageFault::Stall {
                    direction: Direction::Send,
                    at,
                }
                | MessageFault::HalfClose { at },
            ) => (TransportFailed, Exactly(before(*at))),
            // The worker heard Init and `at - 1` batches, echoed at most those.
            (
                Side::Worker,
                MessageFault::Drop {
                    direction: Direction::Recv,
                    at,
                }
                | MessageFault::Stall {
                    direction: Direction::Recv,
                    at,
                },
            ) => (TransportFailed, AtMost(before(*at))),
            // The engine's half-close in place of a message: the worker, still healthy,
            // reports the ended request stream with a ProtocolError and closes with a
            // CancelResponse (udf §2 R6), so the session is Cancelled, whatever the phase.
            (Side::Engine, MessageFault::HalfClose { at }) => (Cancelled, AtMost(before(*at))),
            // The engine's own sends failed, were cut or stalled: its session fails (udf §4.7).
            (Side::Engine, _) => (TransportFailed, AtMost(before(*fault_at(fault) + 1))),
            // The worker's FinishResponse was handed over before its flush failed: the
            // engine has its terminator (udf §2 R5 a).
            (
                Side::Worker,
                MessageFault::FailWrite {
                    at: 7,
                    step: WriteStep::Flush,
                },
            ) => (Finished, Exactly(6)),
            // The worker's writes failed: its output ends without a terminator.
            (Side::Worker, _) => (TransportFailed, AtMost(before(*fault_at(fault) + 1))),
        }
    }

    fn fault_at(fault: &MessageFault) -> &u64 {
        match fault {
            MessageFault::Drop { at, .. }
            | MessageFault::Stall { at, .. }
            | MessageFault::Delay { at, .. }
            | MessageFault::FailWrite { at, .. }
            | MessageFault::HalfClose { at } => at,
            other => panic!("no position in {other:?}"),
        }
    }

    fn fault() -> impl Strategy<Value = MessageFault> {
        let at = 0..MESSAGES;
        let direction = prop_oneof![Just(Direction::Send), Just(Direction::Recv)];
        let step = prop_oneof![Just(WriteStep::StartSend), Just(WriteStep::Flush)];
        prop_oneof![
            (direction.clone(), at.clone())
                .prop_map(|(direction, at)| MessageFault::Drop { direction, at }),
            (direction.clone(), at.clone())
                .prop_map(|(direction, at)| MessageFault::Stall { direction, at }),
            (direction, at.clone(), 1u64..5_000).prop_map(|(direction, at, ms)| {
                MessageFault::Delay {
                    direction,
                    at,
                    by: Duration::from_millis(ms),
                }
            }),
            (at.clone(), step).prop_map(|(at, step)| MessageFault::FailWrite { at, step }),
            at.prop_map(|at| MessageFault::HalfClose { at }),
        ]
    }

    fn case(side: Side, fault: MessageFault) {
        let runtime = paused_runtime();
        let plan = FaultPlan::new().with(fault.clone());
        let (engine_plan, worker_plan) = match side {
            Side::Engine => (plan, none()),
            Side::Worker => (none(), plan),
        };
        let (run, engine, worker) = runtime.block_on(run_memory(engine_plan, worker_plan));
        run.check_invariants();
        let (kind, batches) = expect(side, &fault);
        let report = if side == Side::Engine { engine } else { worker };
        assert_eq!(report.fired(), 1, "the fault fired: {report:?}");
        assert_eq!(
            run.outcome.kind(),
            kind,
            "{side:?} {fault:?}: {}",
            run.outcome
        );
        match batches {
            Batches::Exactly(n) => assert_eq!(run.delivered.len(), n, "{side:?} {fault:?}"),
            Batches::AtMost(n) => assert!(run.delivered.len() <= n, "{side:?} {fault:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: model_cases(192),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Every single-fault plan ends as the reference predicts, on top of the invariants of
        /// every run (one release, a prefix of the batches once and in order, the worker
        /// invalidated exactly when the outcome is unsalvageable).
        #[test]
        fn each_single_fault_plan_ends_as_predicted(worker in any::<bool>(), fault in fault()) {
            case(if worker { Side::Worker } else { Side::Engine }, fault);
        }
    }

    /// Every plan of the space once, so no prediction goes unchecked at the default depth.
    #[test]
    fn every_single_fault_plan_once() {
        let by = Duration::from_secs(1);
        for side in [Side::Engine, Side::Worker] {
            for at in 0..MESSAGES {
                for direction in [Direction::Send, Direction::Recv] {
                    case(side, MessageFault::Drop { direction, at });
                    case(side, MessageFault::Stall { direction, at });
                    case(side, MessageFault::Delay { direction, at, by });
                }
                for step in [WriteStep::StartSend, WriteStep::Flush] {
                    case(side, MessageFault::FailWrite { at, step });
                }
                case(side, MessageFault::HalfClose { at });
            }
        }
    }
}

/// A delay on a [`FaultyConnection`] created outside any tokio runtime has no timer that
/// could end it: it is skipped (as documented for "no timer") instead of stalling the
/// connection forever (a new user's report: a benign 1 ms delay became a permanent stall
/// under `futures::executor::block_on`).
#[test]
fn a_delay_outside_a_tokio_runtime_is_skipped_not_a_stall() {
    use tether::connection::ConnectionExt;
    let (a, mut b) = pair::<UdfRequest, UdfResponse>(8);
    let plan = FaultPlan::new().delay(Direction::Send, 0, Duration::from_millis(1));
    let mut a = FaultyConnection::new(a, plan);
    let counters = a.counters();
    let got = futures::executor::block_on(async {
        a.send_message(UdfRequest::finish()).await.expect("send");
        b.recv_message().await
    });
    let got = got.expect("the message arrives").expect("no error");
    assert_eq!(got.kind(), Some(tether::wire::RequestKind::Finish));
    assert_eq!(
        counters.report().delayed,
        0,
        "a skipped delay is not counted"
    );
}
