//! udf §8.3 scenarios 51–68 (`EchoProtocolSuite` / `UdfWorkerProtocolSuite`): the raw
//! `Execute` protocol against the reference echo worker, here built on tether's worker side
//! (`serve` → `Endpoint` → `WorkerCore`). Each test drives the engine end by hand and asserts
//! the exact messages the worker sends, in order, up to the end of its response stream,
//! plus the worker's own outcome. `udf_x_*` tests cover further rules of udf §2 against the
//! same worker or against a hand-written `Endpoint` worker.

use std::time::Duration;

use bytes::Bytes;
use tether::connection::pair;
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, Heartbeat, ResponseKind, ResponseMessage,
    ShutdownRequest, UdfRequest, UdfResponse, WorkerRequest, worker_request, worker_response,
};
use tether::worker::endpoint::{
    Endpoint, EndpointConfig, EndpointError, EndpointOutcome, EngineViolation, InitRejection,
    InputEnd, ManageError, OutcomeKind, handle_manage,
};
use tether_testing::echo::EchoControl;
use tether_testing::fixtures::*;
use tether_testing::fixtures::{INIT_FAILURE, USER_ERROR_CLASS};
use tether_testing::script::{
    EngineScript, RECV_TIMEOUT, SplitEngine, spawn_echo, spawn_echo_split, spawn_worker,
};

use ResponseKind as K;

/// Asserts the worker's outcome is the protocol violation `expected`.
fn assert_violation(outcome: EndpointOutcome, expected: EngineViolation) {
    match outcome {
        EndpointOutcome::ProtocolViolation(v) => assert_eq!(v, expected),
        other => panic!("expected the protocol violation {expected:?}, got {other}"),
    }
}

async fn outcome(task: tokio::task::JoinHandle<EndpointOutcome>) -> EndpointOutcome {
    tokio::time::timeout(RECV_TIMEOUT, task)
        .await
        .expect("worker task hung")
        .expect("worker task panicked")
}

// ---------------------------------------------------------------------------------------------
// 51–56: the happy paths
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn udf_s051_init_one_batch_finish_echoes_and_finishes() {
    let (mut engine, task, probe) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine
        .send_all([UdfRequest::data(b("batch-1")), UdfRequest::finish()])
        .await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Data, K::Finish]);
    assert_eq!(data_strings(&rest), ["batch-1"]);
    assert_echo_finish(&rest[1]);
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Finished);
    let calls = probe.lock().unwrap();
    assert_eq!((calls.batches, calls.finishes, calls.cancels), (1, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn udf_s052_three_batches_echo_in_order() {
    let (mut engine, task, _) = spawn_echo();
    engine
        .send_all([
            UdfRequest::init(init("udf")),
            // The engine waits for InitResponse before data (R3): a script may not pipeline.
        ])
        .await;
    assert_init_ok(&engine.recv().await);
    engine
        .send_all([
            UdfRequest::data(b("a")),
            UdfRequest::data(b("b")),
            UdfRequest::data(b("c")),
            UdfRequest::finish(),
        ])
        .await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Data, K::Data, K::Data, K::Finish]);
    assert_eq!(data_strings(&rest), ["a", "b", "c"]);
    assert_echo_finish(&rest[3]);
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Finished);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s053_producer_and_consumer_on_separate_tasks() {
    let (
        SplitEngine {
            mut requests,
            mut responses,
        },
        task,
    ) = spawn_echo_split(2);
    let (init_seen_tx, init_seen_rx) = tokio::sync::oneshot::channel::<()>();
    let producer = tokio::spawn(async move {
        SplitEngine::send(&mut requests, UdfRequest::init(init("udf"))).await;
        init_seen_rx.await.expect("consumer saw the InitResponse");
        for i in 0..5 {
            SplitEngine::send(
                &mut requests,
                UdfRequest::data(Bytes::from(format!("row-{i}"))),
            )
            .await;
        }
        SplitEngine::send(&mut requests, UdfRequest::finish()).await;
        requests
    });
    let consumer = tokio::spawn(async move {
        use futures::StreamExt;
        let first = responses
            .next()
            .await
            .expect("InitResponse")
            .into_message()
            .unwrap();
        assert_init_ok(&first);
        init_seen_tx.send(()).unwrap();
        SplitEngine::recv_to_end(&mut responses).await
    });
    let rest = tokio::time::timeout(RECV_TIMEOUT, consumer)
        .await
        .expect("consumer hung")
        .unwrap();
    let _requests = producer.await.unwrap();
    assert_eq!(
        kinds(&rest),
        [K::Data, K::Data, K::Data, K::Data, K::Data, K::Finish]
    );
    assert_eq!(
        data_strings(&rest),
        ["row-0", "row-1", "row-2", "row-3", "row-4"]
    );
    assert_echo_finish(&rest[5]);
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Finished);
}

#[tokio::test(start_paused = true)]
async fn udf_s054_chunked_init_then_data_echoes() {
    let (mut engine, task, probe) = spawn_echo();
    // Empty inline payload, one chunk with last = true.
    engine.send_all(chunked_init("chunked-udf", 1)).await;
    assert_init_ok(&engine.recv().await);
    engine
        .send_all([UdfRequest::data(b("x")), UdfRequest::finish()])
        .await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Data, K::Finish]);
    assert_eq!(data_strings(&rest), ["x"]);
    assert_eq!(probe.lock().unwrap().init_payloads, [b("chunked-udf")]);
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Finished);
}

#[tokio::test(start_paused = true)]
async fn udf_s055_payload_split_into_one_or_three_chunks_is_assembled() {
    for chunks in [1, 3] {
        let (mut engine, task, probe) = spawn_echo();
        let requests = chunked_init("abcdefghi", chunks);
        assert_eq!(requests.len(), 1 + chunks);
        engine.send_all(requests).await;
        assert_init_ok(&engine.recv().await);
        engine
            .send_all([UdfRequest::data(b("payload works")), UdfRequest::finish()])
            .await;
        let rest = engine.recv_to_end().await;
        assert_eq!(kinds(&rest), [K::Data, K::Finish], "{chunks} chunks");
        assert_eq!(data_strings(&rest), ["payload works"]);
        // Assembled in order, and size + CRC-32 verified (a mismatch would fail the init).
        assert_eq!(
            probe.lock().unwrap().init_payloads,
            [b("abcdefghi")],
            "{chunks} chunks"
        );
        assert_eq!(outcome(task).await.kind(), OutcomeKind::Finished);
    }
}

#[tokio::test(start_paused = true)]
async fn udf_s056_generator_init_then_finish_gives_only_the_finish_response() {
    let (mut engine, task, probe) = spawn_echo();
    engine.send(UdfRequest::init(init("generator"))).await;
    assert_init_ok(&engine.recv().await);
    engine.send(UdfRequest::finish()).await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Finish], "zero results");
    assert_echo_finish(&rest[0]);
    assert_eq!(probe.lock().unwrap().batches, 0);
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Finished);
}

// ---------------------------------------------------------------------------------------------
// 57–59: Cancel and user errors
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn udf_s057_init_data_cancel_terminates_cleanly() {
    // Deterministic order: the echo has been received before the Cancel goes out.
    let (mut engine, task, probe) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine.send(UdfRequest::data(b("a"))).await;
    assert_eq!(engine.recv().await, ResponseMessage::Data(b("a")));
    engine
        .send(UdfRequest::cancel(Some("query killed".into())))
        .await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Cancel]);
    let c = cancel_response(&rest[0]);
    assert!(c.error.is_none() && c.metrics.is_empty(), "{c:?}");
    match outcome(task).await {
        EndpointOutcome::Cancelled {
            reason,
            reported: None,
        } => assert_eq!(reason.as_deref(), Some("query killed")),
        other => panic!("unexpected outcome {other}"),
    }
    assert_eq!(
        probe.lock().unwrap().cancels,
        1,
        "the UDF's cancel callback ran"
    );

    // Pipelined: Data and Cancel back to back; the echo may or may not get out first, but
    // nothing follows the CancelResponse and no error is reported.
    let (mut engine, task, _) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine
        .send_all([UdfRequest::data(b("a")), UdfRequest::cancel(None)])
        .await;
    let rest = engine.recv_to_end().await;
    assert!(
        kinds(&rest) == [K::Cancel] || kinds(&rest) == [K::Data, K::Cancel],
        "unexpected {rest:?}"
    );
    assert!(cancel_response(rest.last().unwrap()).error.is_none());
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn udf_s058_finish_then_cancel_gets_either_terminator() {
    let (mut engine, task, _) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine
        .send_all([
            UdfRequest::data(b("a")),
            UdfRequest::finish(),
            UdfRequest::cancel(None),
        ])
        .await;
    let rest = engine.recv_to_end().await;
    let (last, before) = rest.split_last().expect("a terminator");
    assert!(
        before.iter().all(|m| m.kind() == K::Data) && before.len() <= 1,
        "{rest:?}"
    );
    match last {
        ResponseMessage::Finish(f) => {
            assert_eq!(before.len(), 1, "FinishResponse comes after the echo");
            assert_eq!(f.metrics, status_ok());
            assert_eq!(outcome(task).await.kind(), OutcomeKind::Finished);
        }
        ResponseMessage::Cancel(c) => {
            assert!(c.error.is_none());
            assert_eq!(outcome(task).await.kind(), OutcomeKind::Cancelled);
        }
        other => panic!("expected a terminator, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn udf_s059_user_error_then_cancel_gets_cancel_response() {
    let (mut engine, task, probe) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine
        .send_all([UdfRequest::data(b("ok")), UdfRequest::data(b("ERROR"))])
        .await;
    assert_eq!(engine.recv().await, ResponseMessage::Data(b("ok")));
    let err = engine.recv().await;
    assert_user_error(error_response(&err), USER_ERROR_CLASS);
    // After its ErrorResponse the worker waits for the engine's Cancel (R4); a racing
    // Finish is ignored.
    engine.send(UdfRequest::finish()).await;
    engine.expect_silence(Duration::from_secs(1)).await;
    engine.send(UdfRequest::cancel(None)).await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Cancel]);
    assert!(cancel_response(&rest[0]).error.is_none());
    let outcome = outcome(task).await;
    assert_eq!(outcome.kind(), OutcomeKind::Cancelled);
    assert_eq!(
        outcome.reported_error().and_then(|e| e.error_class()),
        Some(USER_ERROR_CLASS)
    );
    let calls = probe.lock().unwrap();
    assert_eq!((calls.batches, calls.finishes, calls.cancels), (2, 0, 1));
}

// ---------------------------------------------------------------------------------------------
// 60–66: init errors and protocol violations
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn udf_s060_second_init_is_a_protocol_error_then_cancel_response() {
    let (mut engine, task, _) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine.send(UdfRequest::init(init("udf"))).await;
    let rest = engine.recv_to_end().await;
    assert_eq!(
        kinds(&rest),
        [K::Error, K::Cancel],
        "closed without waiting for a Cancel"
    );
    let violation = EngineViolation::SecondInit {
        awaiting_chunks: false,
    };
    assert_protocol_error(error_response(&rest[0]), &violation.wire_message());
    assert!(cancel_response(&rest[1]).error.is_none());
    assert_violation(outcome(task).await, violation);
}

/// The init-failure round trip: `[InitResponse(error)]`, silence until the Cancel, then
/// `[CancelResponse]` and the end of the stream.
async fn expect_init_failure_round_trip(engine: &mut EngineScript) -> ExecutionError {
    let first = engine.recv().await;
    let error = init_error(&first).clone();
    engine.expect_silence(Duration::from_secs(1)).await;
    engine
        .send(UdfRequest::cancel(Some("init failed".into())))
        .await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Cancel]);
    assert!(cancel_response(&rest[0]).error.is_none());
    error
}

#[tokio::test(start_paused = true)]
async fn udf_s061_init_error_payload_reports_the_worker_error() {
    let (mut engine, task, probe) = spawn_echo();
    engine.send(UdfRequest::init(init("INIT_ERROR"))).await;
    let error = expect_init_failure_round_trip(&mut engine).await;
    assert_worker_error(&error, INIT_FAILURE);
    let outcome = outcome(task).await;
    assert_eq!(outcome.kind(), OutcomeKind::Cancelled);
    assert_eq!(
        outcome.reported_error().map(|e| e.message()),
        Some(INIT_FAILURE)
    );
    assert_eq!(
        probe.lock().unwrap().cancels,
        1,
        "the UDF saw the Init, so it answers the Cancel"
    );
}

#[tokio::test(start_paused = true)]
async fn udf_s062_init_error_assembled_from_one_or_three_chunks() {
    for chunks in [1, 3] {
        let (mut engine, task, probe) = spawn_echo();
        engine.send_all(chunked_init("INIT_ERROR", chunks)).await;
        let error = expect_init_failure_round_trip(&mut engine).await;
        assert_worker_error(&error, INIT_FAILURE);
        assert_eq!(
            probe.lock().unwrap().init_payloads,
            [b("INIT_ERROR")],
            "{chunks} chunks"
        );
        assert_eq!(outcome(task).await.kind(), OutcomeKind::Cancelled);
    }
}

#[tokio::test(start_paused = true)]
async fn udf_s063_unsupported_protocol_version_is_rejected_at_init() {
    let (mut engine, task, probe) = spawn_echo();
    let mut i = init("udf");
    i.protocol_version = Some(1 + 999);
    engine.send(UdfRequest::init(i)).await;
    let error = expect_init_failure_round_trip(&mut engine).await;
    let rejection = InitRejection::UnsupportedProtocolVersion {
        requested: 1000,
        supported: 1,
    };
    assert_protocol_error(&error, &rejection.wire_message());
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Cancelled);
    let calls = probe.lock().unwrap();
    assert!(
        calls.init_payloads.is_empty(),
        "the UDF never sees a rejected Init"
    );
    assert_eq!(calls.cancels, 0, "the Cancel was answered automatically");
}

#[tokio::test(start_paused = true)]
async fn udf_s064_cancel_before_init_completes_cleanly() {
    let (mut engine, task, probe) = spawn_echo();
    engine.send(UdfRequest::cancel(None)).await;
    let all = engine.recv_to_end().await;
    assert_eq!(kinds(&all), [K::Cancel]);
    let c = cancel_response(&all[0]);
    assert!(c.error.is_none() && c.metrics.is_empty());
    assert!(matches!(
        outcome(task).await,
        EndpointOutcome::Cancelled { reported: None, .. }
    ));
    assert!(probe.lock().unwrap().init_payloads.is_empty());
}

#[tokio::test(start_paused = true)]
async fn udf_s065_cancel_after_a_non_final_chunk_completes_cleanly() {
    let (mut engine, task, probe) = spawn_echo();
    let requests = chunked_init("abcdefghi", 3);
    engine.send_all(requests.into_iter().take(2)).await; // Init + first chunk (not last)
    engine.expect_silence(Duration::from_secs(1)).await; // no InitResponse before the last chunk
    engine.send(UdfRequest::cancel(None)).await;
    let all = engine.recv_to_end().await;
    assert_eq!(kinds(&all), [K::Cancel]);
    assert!(cancel_response(&all[0]).error.is_none());
    assert!(matches!(
        outcome(task).await,
        EndpointOutcome::Cancelled { reported: None, .. }
    ));
    assert!(probe.lock().unwrap().init_payloads.is_empty());
}

#[tokio::test(start_paused = true)]
async fn udf_s066_payload_chunk_after_a_non_chunked_init_is_a_protocol_error() {
    let (mut engine, task, _) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine
        .send(UdfRequest::payload_chunk(b("stray"), true))
        .await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Error, K::Cancel]);
    let violation = EngineViolation::ChunkAfterInitResponse;
    assert_protocol_error(error_response(&rest[0]), &violation.wire_message());
    assert_violation(outcome(task).await, violation);
}

// ---------------------------------------------------------------------------------------------
// 67–68: the Manage RPC
// ---------------------------------------------------------------------------------------------

#[test]
fn udf_s067_manage_heartbeat_gets_a_heartbeat_response() {
    let request = WorkerRequest {
        manage: Some(worker_request::Manage::Heartbeat(Heartbeat {})),
    };
    let response = handle_manage(request, &EchoControl).expect("heartbeat answered");
    match response.manage {
        Some(worker_response::Manage::Heartbeat(h)) => {
            assert_eq!(h.metrics.get("worker").map(String::as_str), Some("echo"))
        }
        other => panic!("expected HeartbeatResponse, got {other:?}"),
    }
    // An empty WorkerRequest is INVALID_ARGUMENT.
    let err = handle_manage(WorkerRequest { manage: None }, &EchoControl).unwrap_err();
    assert_eq!(err, ManageError::EmptyRequest);
    assert_eq!(err.grpc_code(), "INVALID_ARGUMENT");
    assert!(err.to_string().starts_with("INVALID_ARGUMENT"));
}

#[test]
fn udf_s068_manage_shutdown_reports_sessions_settled() {
    let shutdown = ShutdownRequest {
        reason: Some("executor exiting".into()),
        cancel_sessions: Some(false),
    };
    let request = WorkerRequest {
        manage: Some(worker_request::Manage::Shutdown(shutdown)),
    };
    let response = handle_manage(request, &EchoControl).expect("shutdown answered");
    match response.manage {
        Some(worker_response::Manage::Shutdown(s)) => assert!(s.sessions_settled),
        other => panic!("expected ShutdownResponse, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Further rules of udf §2 (R2–R10) against the same worker
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn udf_x_data_before_init_is_a_protocol_error_in_the_init_response() {
    let (mut engine, task, _) = spawn_echo();
    engine.send(UdfRequest::data(b("too early"))).await;
    let all = engine.recv_to_end().await;
    assert_eq!(kinds(&all), [K::Init, K::Cancel]);
    let violation = EngineViolation::DataBeforeInitResponse;
    assert_protocol_error(init_error(&all[0]), &violation.wire_message());
    assert_violation(outcome(task).await, violation);
}

#[tokio::test(start_paused = true)]
async fn udf_x_crc_mismatch_and_unsupported_format_are_rejected_in_the_init_response() {
    let mut requests = chunked_init("abcdef", 2);
    let Ok(tether::wire::RequestMessage::Init(mut i)) = requests[0].clone().into_message() else {
        panic!("chunked_init starts with an Init");
    };
    i.udf.as_mut().unwrap().payload_crc32 = Some(0x1234_5678);
    requests[0] = UdfRequest::init(*i);
    let (mut engine, task, _) = spawn_echo();
    engine.send_all(requests).await;
    let rejection = InitRejection::PayloadCrcMismatch {
        declared: 0x1234_5678,
        assembled: crc32fast::hash(b"abcdef"),
    };
    assert_protocol_error(
        &expect_init_failure_round_trip(&mut engine).await,
        &rejection.wire_message(),
    );
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Cancelled);

    let (mut engine, task, _) = spawn_echo();
    let mut i = init("udf");
    i.data_format = 0;
    engine.send(UdfRequest::init(i)).await;
    let rejection = InitRejection::UnsupportedDataFormat {
        requested: 0,
        supported: vec![tether::wire::UdfWorkerDataFormat::Arrow],
    };
    assert_protocol_error(
        &expect_init_failure_round_trip(&mut engine).await,
        &rejection.wire_message(),
    );
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn udf_x_engine_that_never_cancels_after_an_error_is_closed_after_the_cancel_timeout() {
    let (mut engine, task, _) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine.send(UdfRequest::data(b("ERROR"))).await;
    assert_user_error(error_response(&engine.recv().await), USER_ERROR_CLASS);
    engine.expect_silence(Duration::from_secs(29)).await;
    // 30 s (the default cancel timeout) without a Cancel: the worker closes the stream.
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Cancel]);
    let violation = EngineViolation::NoCancelAfterError {
        after: Duration::from_secs(30),
    };
    assert_protocol_error(
        cancel_response(&rest[0]).error.as_ref().unwrap(),
        &violation.wire_message(),
    );
    assert_violation(outcome(task).await, violation);
}

#[tokio::test(start_paused = true)]
async fn udf_x_request_stream_ending_early_is_a_protocol_error() {
    let (mut engine, task, _) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine.close_requests().await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Error, K::Cancel]);
    let violation = EngineViolation::RequestStreamEnded;
    assert_protocol_error(error_response(&rest[0]), &violation.wire_message());
    assert_violation(outcome(task).await, violation);
}

#[tokio::test(start_paused = true)]
async fn udf_x_transport_failure_ends_the_worker_session_silently() {
    let (mut engine, task, probe) = spawn_echo();
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine.abort();
    let outcome = outcome(task).await;
    // The aborted stream ends: with the memory pair that is an end of stream (a violation
    // the worker cannot report any more) — either way nothing was delivered and it ended.
    assert!(
        matches!(
            outcome,
            EndpointOutcome::TransportFailed(_)
                | EndpointOutcome::ProtocolViolation(EngineViolation::RequestStreamEnded)
        ),
        "{outcome}"
    );
    assert_eq!(probe.lock().unwrap().finishes, 0);
}

#[tokio::test(start_paused = true)]
async fn udf_x_finish_callback_error_goes_into_the_finish_response() {
    struct FailingFinish;
    impl tether::worker::endpoint::Udf for FailingFinish {
        fn init(&mut self, init: &tether::wire::Init) -> Result<Option<Bytes>, ExecutionError> {
            Ok(init.parameters.clone())
        }
        fn process(&mut self, _batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
            out.push(b("one"));
            out.push(b("two"));
            Ok(())
        }
        fn finish(&mut self, out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
            out.push(b("trailing"));
            Err(ExecutionError::user_with_class("flush failed", "IOError"))
        }
    }
    let (mut engine, task) = spawn_worker(FailingFinish, EndpointConfig::default());
    let mut i = init("udf");
    i.parameters = Some(b("echo me back"));
    engine.send(UdfRequest::init(i)).await;
    match engine.recv().await {
        ResponseMessage::Init(r) => assert_eq!(r.data, Some(b("echo me back"))),
        other => panic!("{other:?}"),
    }
    engine
        .send_all([UdfRequest::data(b("in")), UdfRequest::finish()])
        .await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Data, K::Data, K::Data, K::Finish]);
    assert_eq!(data_strings(&rest), ["one", "two", "trailing"]);
    let f = finish_response(&rest[3]);
    assert_eq!(
        f.error.as_ref().and_then(|e| e.error_class()),
        Some("IOError")
    );
    assert_eq!(outcome(task).await.kind(), OutcomeKind::Finished);
}

// ---------------------------------------------------------------------------------------------
// The Endpoint typestates directly
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn udf_x_r5c_cancel_before_the_finish_response_is_answered_with_cancel_response() {
    let (engine_end, worker_end) = pair::<UdfRequest, UdfResponse>(16);
    let mut engine = EngineScript::new(engine_end);
    let (finishing_tx, finishing_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(async move {
        let request = Endpoint::new(worker_end, EndpointConfig::default())
            .recv_init()
            .await
            .expect("init");
        let streaming = request.accept(None).await;
        let InputEnd::Finish(finishing) = streaming.end_of_input().await else {
            panic!("expected Finish")
        };
        finishing_tx.send(()).unwrap();
        go_rx.await.unwrap();
        // R5 (c): finish hands back the Cancelling endpoint, answered with the metrics.
        let cancelling = finishing
            .finish(FinishResponse::default())
            .await
            .expect_err("the Cancel arrived after the Finish");
        cancelling
            .cancelled(CancelResponse {
                metrics: status_ok(),
                ..Default::default()
            })
            .await
            .close()
    });
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine.send(UdfRequest::finish()).await;
    finishing_rx.await.unwrap();
    engine.send(UdfRequest::cancel(Some("late".into()))).await;
    go_tx.send(()).unwrap();
    let rest = engine.recv_to_end().await;
    assert_eq!(
        kinds(&rest),
        [K::Cancel],
        "R5 (c): no FinishResponse was sent yet"
    );
    assert_eq!(cancel_response(&rest[0]).metrics, status_ok());
    assert!(
        matches!(outcome(worker).await, EndpointOutcome::Cancelled { reason: Some(r), .. } if r == "late")
    );
}

#[tokio::test(start_paused = true)]
async fn udf_x_cancel_is_noticed_while_send_is_backpressured() {
    let (engine_end, worker_end) = pair::<UdfRequest, UdfResponse>(2);
    let mut engine = EngineScript::new(engine_end);
    let worker = tokio::spawn(async move {
        let request = Endpoint::new(worker_end, EndpointConfig::default())
            .recv_init()
            .await
            .expect("init");
        let mut streaming = request.accept(None).await;
        // A generator that never stops: only the Cancel ends it.
        let mut sent = 0u32;
        let error = loop {
            match streaming.send(Bytes::from(sent.to_string())).await {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(error, EndpointError::Cancelled { .. }), "{error}");
        assert_eq!(
            streaming.recv().await.unwrap(),
            None,
            "input ended by the Cancel"
        );
        let InputEnd::Cancel(cancelling) = streaming.end_of_input().await else {
            panic!("expected Cancel")
        };
        let metrics =
            std::collections::BTreeMap::from([("batches_out".to_string(), sent.to_string())]);
        (
            sent,
            cancelling
                .cancelled(CancelResponse {
                    metrics,
                    error: None,
                })
                .await
                .close(),
        )
    });
    engine.send(UdfRequest::init(init("generator"))).await;
    // The engine does not read: the worker's sends fill the pair and block.
    tokio::time::sleep(Duration::from_millis(10)).await;
    engine.send(UdfRequest::cancel(None)).await;
    let all = engine.recv_to_end().await;
    let (sent, worker_outcome) = tokio::time::timeout(RECV_TIMEOUT, worker)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(worker_outcome.kind(), OutcomeKind::Cancelled);
    let (last, before) = all.split_last().unwrap();
    assert_init_ok(&before[0]);
    assert!(before[1..].iter().all(|m| m.kind() == K::Data));
    assert_eq!(
        before.len() - 1,
        sent as usize,
        "every accepted send was delivered, nothing after Cancel"
    );
    assert!(sent >= 1, "the worker was producing before the Cancel");
    assert_eq!(
        cancel_response(last).metrics.get("batches_out"),
        Some(&sent.to_string())
    );
}

#[tokio::test(start_paused = true)]
async fn udf_x_dropping_a_live_endpoint_ends_the_engine_stream_without_terminator() {
    let (engine_end, worker_end) = pair::<UdfRequest, UdfResponse>(4);
    let mut engine = EngineScript::new(engine_end);
    engine.send(UdfRequest::init(init("udf"))).await;
    let request = Endpoint::new(worker_end, EndpointConfig::default())
        .recv_init()
        .await
        .expect("init");
    let streaming = request.accept(None).await;
    drop(streaming);
    let all = engine.recv_to_end().await;
    assert_eq!(
        kinds(&all),
        [K::Init],
        "stream ended after the InitResponse, no terminator"
    );
}

#[tokio::test(start_paused = true)]
async fn udf_x_fail_after_finish_sends_error_response_then_waits_for_cancel() {
    let (engine_end, worker_end) = pair::<UdfRequest, UdfResponse>(8);
    let mut engine = EngineScript::new(engine_end);
    let worker = tokio::spawn(async move {
        let request = Endpoint::new(worker_end, EndpointConfig::default())
            .recv_init()
            .await
            .expect("init");
        let mut streaming = request.accept(None).await;
        while let Some(batch) = streaming.recv().await.unwrap() {
            streaming.send(batch).await.unwrap();
        }
        let InputEnd::Finish(mut finishing) = streaming.end_of_input().await else {
            panic!()
        };
        finishing.send(b("partial")).await.unwrap();
        let mut cancelling = finishing.fail(ExecutionError::worker("spill failed")).await;
        cancelling.wait_cancel().await.unwrap();
        assert_eq!(cancelling.cancel_reason(), Some("after error"));
        cancelling
            .cancelled(CancelResponse::default())
            .await
            .close()
    });
    engine.send(UdfRequest::init(init("udf"))).await;
    assert_init_ok(&engine.recv().await);
    engine
        .send_all([UdfRequest::data(b("a")), UdfRequest::finish()])
        .await;
    assert_eq!(engine.recv().await, ResponseMessage::Data(b("a")));
    assert_eq!(engine.recv().await, ResponseMessage::Data(b("partial")));
    assert_worker_error(error_response(&engine.recv().await), "spill failed");
    engine.expect_silence(Duration::from_secs(1)).await;
    engine
        .send(UdfRequest::cancel(Some("after error".into())))
        .await;
    let rest = engine.recv_to_end().await;
    assert_eq!(kinds(&rest), [K::Cancel]);
    let outcome = outcome(worker).await;
    assert_eq!(
        outcome.reported_error().map(|e| e.message()),
        Some("spill failed")
    );
}
