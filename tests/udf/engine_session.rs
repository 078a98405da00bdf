//! Engine-side worker-session scenarios ported from udf §8.1–§8.2 (`udf_sNNN_…`), run
//! against scripted workers (`tether_testing::script::WorkerScript`) over the in-memory
//! connection under a paused tokio clock.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tether::connection::{Connection, ConnectionError, ConnectionExt, MemoryConnection, pair};
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, InitResponse, MalformedMessage, RequestKind,
    RequestMessage, UdfRequest, UdfResponse,
};
use tether::worker::engine::{
    CountingHandle, HandleError, PeerViolation, Session, SessionConfig, SessionError, Termination,
    TerminationKind, TransportFailure, Wait, WorkerHandle,
};
use tether::worker::state;

use tether_testing::fixtures::{
    assert_released_once, batches, huge_timeouts, init, init_ok, user_error,
};
use tether_testing::script::{
    EngineConn, WorkerScript, engine_session, engine_session_with_capacity,
};

async fn streaming(
    config: SessionConfig,
) -> (
    Session<state::Streaming, EngineConn>,
    WorkerScript,
    Arc<CountingHandle>,
) {
    let (s, mut w, h) = engine_session(config);
    let init = tokio::spawn(async move {
        s.init(init("udf"))
            .await
            .map(|(s, _)| s)
            .map_err(|e| e.error)
    });
    w.expect(RequestKind::Init).reply(init_ok()).await;
    let s = init.await.unwrap().expect("init accepted");
    (s, w, h)
}

// ---------------------------------------------------------------------------------------------
// udf §8.1 base state machine

#[tokio::test(start_paused = true)]
async fn udf_s001_init_returns_the_workers_init_response() {
    let (s, mut w, h) = engine_session(SessionConfig::default());
    let task = tokio::spawn(async move { s.init(init("udf")).await });
    assert_eq!(w.recv_kind().await, Some(RequestKind::Init));
    let resp = InitResponse {
        data: Some(Bytes::from_static(b"schema")),
        error: None,
    };
    w.send(UdfResponse::init(resp.clone())).await;
    let (session, got) = task.await.unwrap().expect("init ok");
    assert_eq!(got, resp);
    assert_eq!(session.init_response(), &resp);
    assert_eq!(
        session.phase(),
        tether::worker::engine::EnginePhase::Streaming
    );
    drop(w);
    let t = session.close().await;
    assert_eq!(
        t.kind(),
        TerminationKind::TransportFailed,
        "worker went away without a terminator"
    );
    assert_released_once(&h, true);
}

#[tokio::test(start_paused = true)]
async fn udf_s005_failed_init_leaves_a_terminal_that_close_returns() {
    let (s, mut w, h) = engine_session(SessionConfig::default());
    let task = tokio::spawn(async move { s.init(init("udf")).await });
    assert_eq!(w.recv_kind().await, Some(RequestKind::Init));
    w.send(UdfResponse::init(InitResponse {
        data: None,
        error: Some(ExecutionError::worker("nope")),
    }))
    .await;
    assert_eq!(w.recv_kind().await, Some(RequestKind::Cancel));
    w.send(UdfResponse::cancel(CancelResponse::default())).await;
    let failed = task.await.unwrap().expect_err("init must fail");
    assert_eq!(
        failed.error.execution_error().map(|e| e.message()),
        Some("nope")
    );
    assert_eq!(failed.session.outcome().kind(), TerminationKind::Cancelled);
    let t = failed.session.close().await;
    assert_eq!(t.kind(), TerminationKind::Cancelled);
    assert_eq!(t.execution_error().map(|e| e.message()), Some("nope"));
    assert_released_once(&h, false);
}

#[tokio::test(start_paused = true)]
async fn udf_s006_close_after_finish_response_returns_finished() {
    let (mut s, mut w, h) = streaming(SessionConfig::default()).await;
    let worker = tokio::spawn(async move {
        assert_eq!(w.recv_kind().await, Some(RequestKind::Data));
        assert_eq!(w.recv_kind().await, Some(RequestKind::Finish));
        let r = FinishResponse {
            data: Some(Bytes::from_static(b"done")),
            ..Default::default()
        };
        w.send(UdfResponse::finish(r)).await;
        w.drain().await
    });
    s.send(Bytes::from_static(b"x")).await.expect("data sent");
    let mut f = match s.finish().await {
        Ok(f) => f,
        Err(e) => panic!("finish failed: {}", e.error),
    };
    assert_eq!(f.recv().await.unwrap(), None);
    let t = f.close().await;
    match &t {
        Termination::Finished {
            response,
            execution_error,
        } => {
            assert_eq!(response.data.as_deref(), Some(&b"done"[..]));
            assert!(execution_error.is_none());
        }
        other => panic!("expected Finished, got {other}"),
    }
    assert_released_once(&h, false);
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn udf_s007_finished_session_is_released_once_and_never_invalidated() {
    let (s, w, h) = streaming(SessionConfig::default()).await;
    let worker = w.spawn_echo();
    let watch = s.watch();
    let f = s.finish().await.map_err(|e| e.error).unwrap();
    let f = f.wait().await;
    assert_eq!(f.outcome().kind(), TerminationKind::Finished);
    assert!(watch.get().is_none(), "not finalized before close");
    let t = f.close().await;
    assert_eq!(t.kind(), TerminationKind::Finished);
    assert_eq!(
        watch.get().map(|t| t.kind()),
        Some(TerminationKind::Finished)
    );
    assert_released_once(&h, false);
    assert_eq!(worker.await.unwrap(), vec![RequestKind::Finish]);
}

#[tokio::test(start_paused = true)]
async fn udf_s008_transport_failure_invalidates_once_and_releases_once() {
    let (s, mut w, h) = streaming(SessionConfig::default()).await;
    w.abort();
    let t = s.close().await;
    assert_eq!(t.kind(), TerminationKind::TransportFailed);
    assert!(!t.is_salvageable());
    assert_released_once(&h, true);
}

#[test]
fn udf_s009_failed_is_salvageable_and_carries_its_error() {
    let t = Termination::Failed(ExecutionError::user_with_class("bad row", "UdfError"));
    assert!(t.is_salvageable());
    assert_eq!(
        t.execution_error().and_then(|e| e.error_class()),
        Some("UdfError")
    );
    assert!(matches!(t.to_error(), Some(SessionError::Execution(_))));
}

/// A handle whose release fails: close still returns the outcome (udf §8.1 #11, #12).
#[derive(Debug, Default)]
struct FailingHandle {
    invalid: std::sync::atomic::AtomicBool,
    release_calls: std::sync::atomic::AtomicUsize,
}

impl WorkerHandle for FailingHandle {
    fn id(&self) -> &str {
        "failing"
    }
    fn mark_invalid(&self) {
        self.invalid
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
    fn is_invalid(&self) -> bool {
        self.invalid.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn release_session(&self) -> Result<(), HandleError> {
        self.release_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(HandleError::Underflow {
            id: "failing".into(),
        })
    }
}

#[tokio::test(start_paused = true)]
async fn udf_s011_close_swallows_handle_failures_and_returns_the_outcome() {
    let (engine, mut worker) = pair::<UdfRequest, UdfResponse>(4);
    let handle = Arc::new(FailingHandle::default());
    let s = Session::new(engine, handle.clone(), SessionConfig::default());
    worker.abort();
    let t = s
        .init(init("udf"))
        .await
        .expect_err("peer gone")
        .session
        .close()
        .await;
    assert_eq!(t.kind(), TerminationKind::TransportFailed);
    assert!(handle.is_invalid());
    assert_eq!(
        handle
            .release_calls
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

/// A typed handle stays inspectable: `Session::new` takes `Arc::clone(&handle)` as it is,
/// with no coercion to `Arc<dyn WorkerHandle>` written out.
#[tokio::test(start_paused = true)]
async fn a_typed_handle_passes_without_coercion_and_stays_inspectable() {
    let (engine, _worker) = pair::<UdfRequest, UdfResponse>(4);
    let handle = Arc::new(CountingHandle::for_one_session());
    let session = Session::new(engine, Arc::clone(&handle), SessionConfig::default());
    assert_eq!(session.worker().id(), handle.id());
    let t = session.close().await;
    assert_eq!(t.kind(), TerminationKind::Cancelled, "closed before init");
    assert_eq!((handle.releases(), handle.active_sessions()), (1, 0));
    assert_eq!(
        handle.last_outcome().map(|t| t.kind()),
        Some(TerminationKind::Cancelled)
    );
}

#[tokio::test(start_paused = true)]
async fn udf_s012_release_is_called_exactly_once_even_when_it_fails() {
    let (engine, _worker) = pair::<UdfRequest, UdfResponse>(4);
    let handle = Arc::new(FailingHandle::default());
    let s = Session::new(engine, handle.clone(), SessionConfig::default());
    let t = s.close().await;
    assert_eq!(
        t.kind(),
        TerminationKind::Cancelled,
        "closed before init: synthetic Cancelled"
    );
    assert!(!handle.is_invalid());
    assert_eq!(
        handle
            .release_calls
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[test]
fn udf_s013_first_terminal_wins() {
    // Reached through the core's events only: settling is the core's own business.
    let mut core = tether::worker::engine::EngineCore::default();
    core.start_init(init("udf"), None).unwrap();
    while core.poll_transmit().is_some() {}
    core.handle_response(init_ok());
    assert!(core.finish().unwrap());
    while core.poll_transmit().is_some() {}
    core.handle_response(UdfResponse::finish(FinishResponse::default()));
    assert_eq!(
        core.terminal().map(|t| t.kind()),
        Some(TerminationKind::Finished)
    );
    // Nothing later displaces it.
    core.handle_response(UdfResponse::cancel(CancelResponse::default()));
    core.handle_connection_error(ConnectionError::Closed);
    core.handle_interrupt("late", Duration::ZERO);
    let now = std::time::Instant::now();
    core.begin_wait(now);
    core.handle_timeout(now + Duration::from_secs(3600));
    core.handle_stream_end();
    assert_eq!(
        core.terminal().map(|t| t.kind()),
        Some(TerminationKind::Finished)
    );
    assert_eq!(core.stats().ignored_after_terminal, 1);
}

#[test]
fn udf_s015_each_terminal_kind_maps_one_to_one() {
    let cases = [
        (
            Termination::Finished {
                response: FinishResponse::default(),
                execution_error: None,
            },
            TerminationKind::Finished,
            true,
        ),
        (
            Termination::cancelled_before_start(),
            TerminationKind::Cancelled,
            true,
        ),
        (
            Termination::Failed(ExecutionError::worker("w")),
            TerminationKind::Failed,
            true,
        ),
        (
            Termination::TransportFailed(TransportFailure::Protocol(
                PeerViolation::StreamEndedWithoutTerminator,
            )),
            TerminationKind::TransportFailed,
            false,
        ),
        (
            Termination::Interrupted(tether::worker::engine::Interrupted {
                context: "x",
                waited: Duration::ZERO,
            }),
            TerminationKind::Interrupted,
            false,
        ),
    ];
    for (t, kind, salvageable) in cases {
        assert_eq!(t.kind(), kind);
        assert_eq!(t.is_salvageable(), salvageable, "{kind:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// udf §8.2 GrpcWorkerSessionConcurrencySuite, engine side over the in-memory connection

/// Runs `init` while `script` plays the worker; returns the init result and the worker.
async fn init_against<F, Fut>(
    config: SessionConfig,
    script: F,
) -> (
    Result<
        (Session<state::Streaming, EngineConn>, InitResponse),
        tether::worker::engine::SessionFailed<EngineConn>,
    >,
    Arc<CountingHandle>,
    tokio::task::JoinHandle<WorkerScript>,
)
where
    F: FnOnce(WorkerScript) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = WorkerScript> + Send + 'static,
{
    let (s, w, h) = engine_session(config);
    let worker = tokio::spawn(script(w));
    (s.init(init("udf")).await, h, worker)
}

fn elapsed_since(start: tokio::time::Instant) -> Duration {
    tokio::time::Instant::now() - start
}

#[tokio::test(start_paused = true)]
async fn udf_s017_pre_init_error_response_fails_init_fast() {
    let start = tokio::time::Instant::now();
    let (res, h, worker) = init_against(huge_timeouts(), |mut w| async move {
        assert_eq!(w.recv_kind().await, Some(RequestKind::Init));
        w.send(UdfResponse::error(ExecutionError::worker("not ready")))
            .await;
        assert_eq!(w.recv_kind().await, Some(RequestKind::Cancel));
        w.send(UdfResponse::cancel(CancelResponse::default())).await;
        w
    })
    .await;
    let failed = res.expect_err("init fails");
    assert!(
        elapsed_since(start) < Duration::from_secs(1),
        "no timeout stall"
    );
    assert_eq!(
        failed.error.execution_error().map(|e| e.message()),
        Some("not ready")
    );
    assert_eq!(
        failed.session.close().await.kind(),
        TerminationKind::Cancelled
    );
    assert_released_once(&h, false);
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn udf_s018_init_response_error_fails_init_fast() {
    let start = tokio::time::Instant::now();
    let (res, h, worker) = init_against(huge_timeouts(), |mut w| async move {
        w.recv_kind().await;
        w.send(UdfResponse::init(InitResponse {
            data: None,
            error: Some(ExecutionError::worker("bad init")),
        }))
        .await;
        assert_eq!(w.recv_kind().await, Some(RequestKind::Cancel));
        w.send(UdfResponse::cancel(CancelResponse::default())).await;
        w
    })
    .await;
    let failed = res.expect_err("init fails");
    assert!(elapsed_since(start) < Duration::from_secs(1));
    assert_eq!(
        failed.session.close().await.kind(),
        TerminationKind::Cancelled
    );
    assert_released_once(&h, false);
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn udf_s019_data_before_init_response_is_a_transport_failure_that_a_late_init_cannot_undo() {
    let (res, h, worker) = init_against(huge_timeouts(), |mut w| async move {
        w.recv_kind().await;
        w.send(UdfResponse::data(Bytes::from_static(b"early")))
            .await;
        w.send(init_ok()).await;
        w
    })
    .await;
    let failed = res.expect_err("init fails");
    assert!(matches!(
        failed.error,
        SessionError::Transport(TransportFailure::Protocol(
            PeerViolation::DataBeforeInitResponse
        ))
    ));
    let t = failed.session.close().await;
    assert_eq!(t.kind(), TerminationKind::TransportFailed);
    assert_released_once(&h, true);
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn udf_s020_error_right_behind_init_response_fails_init_and_cancels() {
    let (res, h, worker) = init_against(huge_timeouts(), |mut w| async move {
        w.recv_kind().await;
        w.send(init_ok()).await;
        w.send(UdfResponse::error(ExecutionError::user("generator failed")))
            .await;
        assert_eq!(
            w.recv_kind().await,
            Some(RequestKind::Cancel),
            "worker receives Cancel"
        );
        w.send(UdfResponse::cancel(CancelResponse::default())).await;
        w
    })
    .await;
    let failed = res.expect_err("init fails");
    match &failed.error {
        SessionError::Execution(e) => assert_eq!(e.message(), "generator failed"),
        other => panic!("expected the worker's error, got {other:?}"),
    }
    assert_eq!(
        failed.session.close().await.kind(),
        TerminationKind::Cancelled
    );
    assert_released_once(&h, false);
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn udf_s021_finish_response_to_the_first_data_request_fails_the_stream() {
    let (s, mut w, handle) = engine_session_with_capacity(SessionConfig::default(), 1);
    let worker = tokio::spawn(async move {
        w.recv_kind().await;
        w.send(init_ok()).await;
        assert_eq!(w.recv_kind().await, Some(RequestKind::Data));
        w.send(UdfResponse::finish(FinishResponse::default())).await;
        w.drain().await
    });
    let (s, _) = s.init(init("udf")).await.map_err(|e| e.error).unwrap();
    let input = futures::stream::iter(batches(&["a", "b", "c"]));
    let mut out = s.process(input);
    let err = out
        .next()
        .await
        .expect("an item")
        .expect_err("stream failed");
    assert!(matches!(
        err,
        SessionError::Transport(TransportFailure::Protocol(
            PeerViolation::FinishResponseBeforeFinish
        ))
    ));
    assert!(out.next().await.is_none());
    let t = out.close().await;
    assert_eq!(t.kind(), TerminationKind::TransportFailed);
    assert_released_once(&handle, true);
    assert_eq!(
        worker.await.unwrap(),
        Vec::<RequestKind>::new(),
        "exactly one DataRequest was sent"
    );
}

async fn init_fails_fast_with(
    first: UdfResponse,
) -> (SessionError, Termination, Arc<CountingHandle>) {
    let start = tokio::time::Instant::now();
    let (res, h, worker) = init_against(huge_timeouts(), move |mut w| async move {
        w.recv_kind().await;
        w.send(first).await;
        w
    })
    .await;
    let failed = res.expect_err("init must fail");
    assert!(
        elapsed_since(start) < Duration::from_secs(1),
        "init failed fast"
    );
    let t = failed.session.close().await;
    drop(worker.await.unwrap());
    (failed.error, t, h)
}

#[tokio::test(start_paused = true)]
async fn udf_s022_finish_response_before_init_response_fails_init_fast() {
    let (err, t, h) = init_fails_fast_with(UdfResponse::finish(FinishResponse::default())).await;
    assert!(matches!(
        err,
        SessionError::Transport(TransportFailure::Protocol(
            PeerViolation::FinishResponseBeforeFinish
        ))
    ));
    assert_eq!(t.kind(), TerminationKind::TransportFailed);
    assert_released_once(&h, true);
}

#[tokio::test(start_paused = true)]
async fn udf_s023_cancel_response_before_init_response_fails_init_fast() {
    let (err, t, h) = init_fails_fast_with(UdfResponse::cancel(CancelResponse::default())).await;
    assert!(matches!(err, SessionError::Cancelled), "{err}");
    assert_eq!(t.kind(), TerminationKind::Cancelled);
    assert_released_once(&h, false);
}

#[tokio::test(start_paused = true)]
async fn udf_s024_worker_half_close_before_init_response_fails_init_fast() {
    let start = tokio::time::Instant::now();
    let (res, h, worker) = init_against(huge_timeouts(), |mut w| async move {
        w.recv_kind().await;
        w.close_responses().await;
        w
    })
    .await;
    let failed = res.expect_err("init fails");
    assert!(elapsed_since(start) < Duration::from_secs(1));
    assert!(matches!(
        failed.error,
        SessionError::Transport(TransportFailure::Protocol(
            PeerViolation::StreamEndedWithoutTerminator
        ))
    ));
    assert_eq!(
        failed.session.close().await.kind(),
        TerminationKind::TransportFailed
    );
    assert_released_once(&h, true);
    drop(worker.await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn udf_s025_empty_response_before_init_response_fails_init_fast() {
    let (err, t, h) = init_fails_fast_with(UdfResponse::default()).await;
    assert!(
        matches!(
            err,
            SessionError::Transport(TransportFailure::Protocol(PeerViolation::Malformed(
                MalformedMessage::EmptyResponse
            )))
        ),
        "{err:?}"
    );
    assert_eq!(t.kind(), TerminationKind::TransportFailed);
    assert_released_once(&h, true);
}

#[tokio::test(start_paused = true)]
async fn udf_s026_exhausted_output_stays_exhausted_without_blocking() {
    let (s, w, h) = streaming(SessionConfig::default()).await;
    let worker = w.spawn_echo();
    let mut out = s.process(futures::stream::iter(batches(&["only"])));
    assert_eq!(
        out.next().await.unwrap().unwrap(),
        Bytes::from_static(b"only")
    );
    assert!(out.next().await.is_none());
    let start = tokio::time::Instant::now();
    for _ in 0..5 {
        assert!(out.next().await.is_none());
    }
    assert_eq!(elapsed_since(start), Duration::ZERO, "never re-blocks");
    assert_eq!(out.close().await.kind(), TerminationKind::Finished);
    assert_released_once(&h, false);
    assert_eq!(
        worker.await.unwrap(),
        vec![RequestKind::Data, RequestKind::Finish]
    );
}

#[tokio::test(start_paused = true)]
async fn udf_s027_abandoned_blocked_consumer_then_close_cancels() {
    let (s, w, h) = streaming(SessionConfig::default()).await;
    let worker = w.spawn_ignores_finish();
    let mut f = s.finish().await.map_err(|e| e.error).unwrap();
    // The consumer blocks waiting for output the worker never sends; it gives up.
    let blocked = tokio::time::timeout(Duration::from_secs(1), f.recv()).await;
    assert!(blocked.is_err(), "consumer was blocked");
    let t = f.close().await;
    assert_eq!(t.kind(), TerminationKind::Cancelled);
    assert_released_once(&h, false);
    assert_eq!(
        worker.await.unwrap(),
        vec![RequestKind::Finish, RequestKind::Cancel]
    );
}

#[tokio::test(start_paused = true)]
async fn udf_s028_close_of_a_blocked_session_is_bounded_with_huge_timeouts() {
    let (s, w, h) = streaming(huge_timeouts()).await;
    let worker = w.spawn_ignores_finish();
    let f = s.finish().await.map_err(|e| e.error).unwrap();
    let start = tokio::time::Instant::now();
    let t = f.close().await;
    assert!(
        elapsed_since(start) < Duration::from_secs(1),
        "close is prompt when the worker acks"
    );
    assert_eq!(t.kind(), TerminationKind::Cancelled);
    assert_released_once(&h, false);
    drop(worker.await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s029_pre_init_error_fails_fast_across_threads() {
    let start = std::time::Instant::now();
    let (res, h, worker) = init_against(huge_timeouts(), |mut w| async move {
        w.recv_kind().await;
        w.send(UdfResponse::error(ExecutionError::worker("pre-init")))
            .await;
        if w.recv_kind().await == Some(RequestKind::Cancel) {
            w.send(UdfResponse::cancel(CancelResponse::default())).await;
        }
        w
    })
    .await;
    let failed = res.expect_err("init fails");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(
        failed.session.close().await.kind(),
        TerminationKind::Cancelled
    );
    assert_released_once(&h, false);
    drop(worker.await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s030_init_response_error_fails_fast_across_threads() {
    let start = std::time::Instant::now();
    let (res, h, worker) = init_against(huge_timeouts(), |mut w| async move {
        w.recv_kind().await;
        w.send(UdfResponse::init(InitResponse {
            data: None,
            error: Some(ExecutionError::worker("x")),
        }))
        .await;
        if w.recv_kind().await == Some(RequestKind::Cancel) {
            w.send(UdfResponse::cancel(CancelResponse::default())).await;
        }
        w
    })
    .await;
    let failed = res.expect_err("init fails");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(
        failed.session.close().await.kind(),
        TerminationKind::Cancelled
    );
    assert_released_once(&h, false);
    drop(worker.await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s031_error_response_on_first_data_surfaces_with_its_class() {
    let (s, mut w, h) = streaming(SessionConfig::default()).await;
    let worker = tokio::spawn(async move {
        assert_eq!(w.recv_kind().await, Some(RequestKind::Data));
        w.send(UdfResponse::error(user_error("boom in UDF", "UdfError")))
            .await;
        let rest = w.drain_until_cancel().await;
        w.send(UdfResponse::cancel(CancelResponse::default())).await;
        rest
    });
    let mut out = s.process(futures::stream::iter(batches(&["x"])));
    let err = out.next().await.unwrap().expect_err("worker error");
    assert_eq!(
        err.execution_error().map(|e| e.message()),
        Some("boom in UDF")
    );
    assert_eq!(
        err.execution_error().and_then(|e| e.error_class()),
        Some("UdfError")
    );
    let t = out.close().await;
    assert_eq!(t.kind(), TerminationKind::Cancelled);
    assert_eq!(
        t.execution_error().map(|e| e.message()),
        Some("boom in UDF")
    );
    assert_released_once(&h, false);
    let rest = worker.await.unwrap();
    assert_eq!(rest.last(), Some(&RequestKind::Cancel));
    assert!(
        !rest.contains(&RequestKind::Data),
        "nothing but Finish/Cancel after the error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s032_echo_in_order_then_finished_and_released_clean() {
    let (s, w, h) = streaming(SessionConfig::default()).await;
    let worker = w.spawn_echo();
    let out: Vec<_> = s
        .process(futures::stream::iter(batches(&["a", "b", "c"])))
        .collect()
        .await;
    let out: Vec<Bytes> = out.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(
        out,
        ["a", "b", "c"].map(|s| Bytes::from_static(s.as_bytes()))
    );
    let kinds = worker.await.unwrap();
    assert_eq!(
        kinds,
        vec![
            RequestKind::Data,
            RequestKind::Data,
            RequestKind::Data,
            RequestKind::Finish
        ]
    );
    // `collect` consumed the ProcessStream; its drop finalized the already-terminal session.
    assert_eq!(
        h.last_outcome().map(|t| t.kind()),
        Some(TerminationKind::Finished)
    );
    assert_released_once(&h, false);
}

#[tokio::test(start_paused = true)]
async fn udf_s033_pre_init_error_carries_the_structured_error() {
    let (res, h, worker) = init_against(huge_timeouts(), |mut w| async move {
        w.recv_kind().await;
        w.send(UdfResponse::error(user_error("too early", "PreInitError")))
            .await;
        assert_eq!(w.recv_kind().await, Some(RequestKind::Cancel));
        w.send(UdfResponse::cancel(CancelResponse::default())).await;
        w
    })
    .await;
    let failed = res.expect_err("init fails");
    assert_eq!(
        failed.error.execution_error().and_then(|e| e.error_class()),
        Some("PreInitError")
    );
    let t = failed.session.close().await;
    assert_eq!(t.kind(), TerminationKind::Cancelled);
    assert_eq!(
        t.execution_error().and_then(|e| e.error_class()),
        Some("PreInitError")
    );
    assert_released_once(&h, false);
    drop(worker.await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn udf_s034_worker_ignoring_cancel_times_out_invalidated() {
    let cfg = SessionConfig {
        terminal_timeout: Duration::from_secs(1),
        ..SessionConfig::default()
    };
    let (s, mut w, h) = streaming(cfg).await;
    let start = tokio::time::Instant::now();
    let t = s.close().await;
    let waited = elapsed_since(start);
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    match &t {
        Termination::TransportFailed(TransportFailure::Timeout { waiting_for, after }) => {
            assert_eq!(*waiting_for, Wait::Terminator);
            assert_eq!(*after, Duration::from_secs(1));
        }
        other => panic!("expected a terminator timeout, got {other}"),
    }
    assert_released_once(&h, true);
    assert_eq!(w.drain().await, vec![RequestKind::Cancel]);
}

#[tokio::test(start_paused = true)]
async fn udf_s035_data_instead_of_init_response_fails_init() {
    let (err, t, h) = init_fails_fast_with(UdfResponse::data(Bytes::from_static(b"d"))).await;
    assert!(
        matches!(
            err,
            SessionError::Transport(TransportFailure::Protocol(
                PeerViolation::DataBeforeInitResponse
            ))
        ),
        "{err:?}"
    );
    assert_eq!(t.kind(), TerminationKind::TransportFailed);
    assert_released_once(&h, true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s036_init_error_is_structured_and_cancel_is_on_the_wire() {
    let (res, h, worker) = init_against(SessionConfig::default(), |mut w| async move {
        w.recv_kind().await;
        let err = ExecutionError::user_with_class("cannot load", "InitError");
        w.send(UdfResponse::init(InitResponse {
            data: None,
            error: Some(err),
        }))
        .await;
        assert_eq!(
            w.recv_kind().await,
            Some(RequestKind::Cancel),
            "a Cancel is on the wire"
        );
        w.send(UdfResponse::cancel(CancelResponse::default())).await;
        w
    })
    .await;
    let failed = res.expect_err("init fails");
    assert_eq!(
        failed.error.execution_error().and_then(|e| e.error_class()),
        Some("InitError")
    );
    assert_eq!(
        failed.session.close().await.kind(),
        TerminationKind::Cancelled
    );
    assert_released_once(&h, false);
    drop(worker.await.unwrap());
}

/// A connection whose every send fails (udf §8.2 #42).
struct FailingSend(MemoryConnection<UdfRequest, UdfResponse>);

impl Connection<UdfRequest, UdfResponse> for FailingSend {
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectionError>> {
        self.0.poll_ready(cx)
    }
    fn start_send(&mut self, _msg: UdfRequest) -> Result<(), ConnectionError> {
        Err(ConnectionError::transport("send boom"))
    }
    fn poll_flush(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectionError>> {
        self.0.poll_flush(cx)
    }
    fn poll_close(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ConnectionError>> {
        self.0.poll_close(cx)
    }
    fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<UdfResponse, ConnectionError>>> {
        self.0.poll_recv(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn udf_s042_failed_first_send_fails_init_with_the_cause() {
    let (engine, mut worker) = pair::<UdfRequest, UdfResponse>(4);
    let h = Arc::new(CountingHandle::for_one_session());
    let s = Session::new(FailingSend(engine), h.clone(), SessionConfig::default());
    let failed = s.init(init("udf")).await.expect_err("send fails");
    match &failed.error {
        SessionError::Transport(TransportFailure::Connection(ConnectionError::Transport(
            cause,
        ))) => assert_eq!(cause.to_string(), "send boom"),
        other => panic!("expected the transport's error, got {other:?}"),
    }
    let t = failed.session.close().await;
    assert_eq!(t.kind(), TerminationKind::TransportFailed);
    assert_released_once(&h, true);
    // Nothing reached the worker (no Init, no Cancel): it only sees the stream go away.
    assert!(worker.recv_message().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn udf_s043_silent_worker_init_abandoned_then_interrupted() {
    let (s, mut w, h) = engine_session(huge_timeouts());
    let watch = s.watch();
    // The caller gives up on init after 1 s (dropping the future is the interrupt).
    let abandoned = tokio::time::timeout(Duration::from_secs(1), s.init(init("udf"))).await;
    assert!(abandoned.is_err());
    let t = watch.wait().await;
    assert_eq!(t.kind(), TerminationKind::Interrupted);
    assert_released_once(&h, true);
    assert_eq!(
        w.drain().await,
        vec![RequestKind::Init, RequestKind::Cancel]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s044_finish_callback_error_surfaces_at_the_end_and_in_finished() {
    let (s, mut w, h) = streaming(SessionConfig::default()).await;
    let worker = tokio::spawn(async move {
        assert_eq!(w.recv_kind().await, Some(RequestKind::Finish));
        let resp = FinishResponse {
            error: Some(user_error("FinishCallbackError", "FinishCallbackError")),
            ..Default::default()
        };
        w.send(UdfResponse::finish(resp)).await;
        w.drain().await
    });
    let mut out = s.process(futures::stream::iter(batches(&[])));
    let err = out
        .next()
        .await
        .unwrap()
        .expect_err("finish callback error");
    assert_eq!(
        err.execution_error().map(|e| e.message()),
        Some("FinishCallbackError")
    );
    let t = out.close().await;
    assert_eq!(t.kind(), TerminationKind::Finished);
    assert_eq!(
        t.callback_error().map(|e| e.message()),
        Some("FinishCallbackError")
    );
    assert_released_once(&h, false);
    drop(worker.await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s045_data_phase_error_wins_and_the_cancel_callback_error_is_kept() {
    let (s, mut w, h) = streaming(SessionConfig::default()).await;
    let worker = tokio::spawn(async move {
        assert_eq!(w.recv_kind().await, Some(RequestKind::Data));
        w.send(UdfResponse::error(user_error(
            "DataPhaseError",
            "DataPhaseError",
        )))
        .await;
        w.drain_until_cancel().await;
        let resp = CancelResponse {
            error: Some(ExecutionError::worker("CancelCallbackError")),
            ..Default::default()
        };
        w.send(UdfResponse::cancel(resp)).await;
    });
    let mut out = s.process(futures::stream::iter(batches(&["x"])));
    let err = out.next().await.unwrap().expect_err("worker error");
    assert_eq!(
        err.execution_error().map(|e| e.message()),
        Some("DataPhaseError"),
        "precedence"
    );
    let t = out.close().await;
    assert_eq!(
        t.execution_error().map(|e| e.message()),
        Some("DataPhaseError")
    );
    assert_eq!(
        t.callback_error().map(|e| e.message()),
        Some("CancelCallbackError"),
        "both surfaced"
    );
    assert_released_once(&h, false);
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn udf_s046_missing_terminator_times_out_per_poll() {
    let cfg = SessionConfig {
        terminal_timeout: Duration::from_secs(1),
        ..SessionConfig::default()
    };
    let (s, w, h) = streaming(cfg).await;
    let worker = w.spawn_ignores_finish();
    let mut out = s.process(futures::stream::iter(batches(&["a"])));
    assert_eq!(out.next().await.unwrap().unwrap(), Bytes::from_static(b"a"));
    let start = tokio::time::Instant::now();
    let err = out.next().await.unwrap().expect_err("timed out");
    assert!(
        matches!(
            err,
            SessionError::Transport(TransportFailure::Timeout {
                waiting_for: Wait::Output,
                after,
            }) if after == Duration::from_secs(1)
        ),
        "{err:?}"
    );
    assert!(elapsed_since(start) < Duration::from_secs(3));
    assert_eq!(out.close().await.kind(), TerminationKind::TransportFailed);
    assert_released_once(&h, true);
    let kinds = worker.await.unwrap();
    assert_eq!(
        kinds.last(),
        Some(&RequestKind::Cancel),
        "best-effort Cancel after the timeout"
    );
}

#[tokio::test(start_paused = true)]
async fn udf_s047_interrupted_init_with_acking_worker_is_cancelled_and_valid() {
    let (s, mut w, h) = engine_session(huge_timeouts());
    let watch = s.watch();
    let worker = tokio::spawn(async move {
        assert_eq!(w.recv_kind().await, Some(RequestKind::Init));
        assert_eq!(w.recv_kind().await, Some(RequestKind::Cancel));
        w.send(UdfResponse::cancel(CancelResponse::default())).await;
        w.drain().await
    });
    let abandoned = tokio::time::timeout(Duration::from_millis(100), s.init(init("udf"))).await;
    assert!(abandoned.is_err());
    assert_eq!(watch.wait().await.kind(), TerminationKind::Cancelled);
    assert_released_once(&h, false);
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn udf_s048_interrupted_init_with_silent_worker_is_interrupted_and_invalid() {
    let mut cfg = huge_timeouts();
    cfg.interrupt_cancel_timeout = Duration::from_millis(500);
    let (s, mut w, h) = engine_session(cfg);
    let watch = s.watch();
    let abandoned = tokio::time::timeout(Duration::from_millis(100), s.init(init("udf"))).await;
    assert!(abandoned.is_err());
    let start = tokio::time::Instant::now();
    let t = watch.wait().await;
    assert!(elapsed_since(start) <= Duration::from_millis(600));
    match &t {
        Termination::Interrupted(i) => {
            assert_eq!(i.context, "waiting for InitResponse");
            assert_eq!(i.waited, Duration::from_millis(500));
        }
        other => panic!("expected Interrupted, got {other}"),
    }
    assert_released_once(&h, true);
    assert_eq!(
        w.drain().await,
        vec![RequestKind::Init, RequestKind::Cancel]
    );
}

#[tokio::test(start_paused = true)]
async fn udf_s049_interrupted_consumer_with_blocked_input_sends_cancel_and_is_interrupted() {
    let (s, mut w, h) = streaming(SessionConfig::default()).await;
    let watch = s.watch();
    let mut out = s.process(futures::stream::pending::<Bytes>());
    let blocked = tokio::time::timeout(Duration::from_secs(1), out.next()).await;
    assert!(blocked.is_err(), "input blocks");
    drop(out);
    let t = watch.wait().await;
    assert_eq!(t.kind(), TerminationKind::Interrupted);
    assert_released_once(&h, true);
    assert_eq!(w.drain().await, vec![RequestKind::Cancel]);
}

#[tokio::test(start_paused = true)]
async fn udf_s058_finish_then_cancel_accepts_either_terminator() {
    for worker_finishes_first in [true, false] {
        let (s, mut w, h) = streaming(SessionConfig::default()).await;
        let worker = tokio::spawn(async move {
            assert_eq!(w.recv_kind().await, Some(RequestKind::Finish));
            if worker_finishes_first {
                w.send(UdfResponse::finish(FinishResponse::default())).await;
            }
            assert_eq!(w.recv_kind().await, Some(RequestKind::Cancel));
            if !worker_finishes_first {
                w.send(UdfResponse::cancel(CancelResponse::default())).await;
            }
            w.drain().await
        });
        let f = s.finish().await.map_err(|e| e.error).unwrap();
        let c = f.cancel(Some("late".into())).await;
        let t = c.close().await;
        let expected = if worker_finishes_first {
            TerminationKind::Finished
        } else {
            TerminationKind::Cancelled
        };
        assert_eq!(t.kind(), expected);
        assert_released_once(&h, false);
        worker.await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// tether-specific rules beyond the numbered scenarios

#[test]
fn dropped_session_without_a_runtime_is_interrupted_and_invalidated_at_once() {
    let (s, mut w, h) = engine_session(SessionConfig::default());
    let watch = s.watch();
    let pending = futures::executor::block_on(async {
        // Start init, then abandon it mid-await: no tokio runtime is running here.
        let fut = s.init(init("udf"));
        futures::pin_mut!(fut);
        futures::poll!(fut.as_mut()).is_pending()
    });
    assert!(pending);
    let t = watch.get().expect("finalized synchronously on drop");
    assert_eq!(t.kind(), TerminationKind::Interrupted);
    assert_released_once(&h, true);
    let kinds = futures::executor::block_on(w.drain());
    assert_eq!(
        kinds,
        vec![RequestKind::Init],
        "no runtime: nothing sent after the Init"
    );
}

#[tokio::test(start_paused = true)]
async fn init_chunked_sends_payload_chunks_with_last_on_the_final_one() {
    let (s, mut w, h) = engine_session(SessionConfig::default());
    let worker = tokio::spawn(async move {
        let mut chunks = Vec::new();
        let init = match w.recv().await.unwrap().into_message().unwrap() {
            RequestMessage::Init(i) => i,
            other => panic!("expected Init, got {other:?}"),
        };
        loop {
            match w.recv().await.unwrap().into_message().unwrap() {
                RequestMessage::PayloadChunk(c) => {
                    let last = c.last == Some(true);
                    chunks.push((c.data, c.last));
                    if last {
                        break;
                    }
                }
                other => panic!("expected a chunk, got {other:?}"),
            }
        }
        w.send(init_ok()).await;
        (init, chunks, w)
    });
    let mut init = init("udf");
    init.udf.as_mut().unwrap().payload = Bytes::from_static(b"0123456789");
    let (session, _) = s.init_chunked(init, 4).await.map_err(|e| e.error).unwrap();
    let (init, chunks, mut w) = worker.await.unwrap();
    assert_eq!(init.is_chunking_payload, Some(true));
    let udf = init.udf.unwrap();
    assert!(
        udf.payload.is_empty(),
        "inline payload is empty when chunking"
    );
    assert_eq!(udf.payload_size, Some(10));
    assert_eq!(
        chunks,
        vec![
            (Bytes::from_static(b"0123"), None),
            (Bytes::from_static(b"4567"), None),
            (Bytes::from_static(b"89"), Some(true)),
        ]
    );
    let closing = tokio::spawn(session.close());
    assert_eq!(w.recv_kind().await, Some(RequestKind::Cancel));
    w.send(UdfResponse::cancel(CancelResponse::default())).await;
    assert_eq!(closing.await.unwrap().kind(), TerminationKind::Cancelled);
    assert_released_once(&h, false);
}

#[tokio::test(start_paused = true)]
async fn generator_with_zero_inputs_sends_finish_right_after_init() {
    let (s, mut w, h) = streaming(SessionConfig::default()).await;
    let worker = tokio::spawn(async move {
        assert_eq!(w.recv_kind().await, Some(RequestKind::Finish));
        for i in 0..3u8 {
            w.send(UdfResponse::data(Bytes::from(vec![i]))).await;
        }
        w.send(UdfResponse::finish(FinishResponse::default())).await;
        w.drain().await
    });
    let out: Vec<Bytes> = s
        .process(futures::stream::empty())
        .map(|r| r.unwrap())
        .collect()
        .await;
    assert_eq!(
        out,
        vec![
            Bytes::from(vec![0]),
            Bytes::from(vec![1]),
            Bytes::from(vec![2])
        ]
    );
    assert_eq!(
        h.last_outcome().map(|t| t.kind()),
        Some(TerminationKind::Finished)
    );
    assert_released_once(&h, false);
    assert!(worker.await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn duplicate_init_response_mid_stream_is_ignored_and_counted() {
    let (mut s, mut w, h) = streaming(SessionConfig::default()).await;
    w.send(init_ok()).await;
    w.send(UdfResponse::data(Bytes::from_static(b"d"))).await;
    assert_eq!(s.recv().await.unwrap(), Some(Bytes::from_static(b"d")));
    assert_eq!(s.stats().duplicate_init_responses, 1);
    assert!(s.termination().is_none(), "outcome unchanged");
    let closing = tokio::spawn(s.close());
    assert_eq!(w.recv_kind().await, Some(RequestKind::Cancel));
    w.send(UdfResponse::cancel(CancelResponse::default())).await;
    w.send(UdfResponse::data(Bytes::from_static(b"late"))).await;
    assert_eq!(closing.await.unwrap().kind(), TerminationKind::Cancelled);
    assert_released_once(&h, false);
}

#[tokio::test(start_paused = true)]
async fn send_after_a_worker_error_is_refused_and_nothing_follows_the_cancel() {
    let (mut s, mut w, h) = streaming(SessionConfig::default()).await;
    w.send(UdfResponse::error(user_error("bad", "E"))).await;
    // The first send may go out before the error is read; once it is read, sends are refused.
    let mut refused = None;
    for i in 0..3u8 {
        if let Err(e) = s.send(Bytes::from(vec![i])).await {
            refused = Some(e);
            break;
        }
    }
    let err = refused.expect("a send is refused after the ErrorResponse");
    assert_eq!(err.execution_error().map(|e| e.message()), Some("bad"));
    let kinds = w.drain_until_cancel().await;
    assert_eq!(kinds.last(), Some(&RequestKind::Cancel));
    w.send(UdfResponse::cancel(CancelResponse::default())).await;
    let t = s.close().await;
    assert_eq!(t.kind(), TerminationKind::Cancelled);
    assert_released_once(&h, false);
    assert!(w.drain().await.is_empty(), "nothing after Cancel");
}
