//! The hostile-input catalog (issue 11 item 7): one row per hostile input with its expected
//! outcome. Every row is a test of its own, generated from the one table below, so a row can
//! be ignored alone. None may panic, lose data or grow memory without bound: memory is
//! asserted through buffer capacities and the counters the API exposes, never process RSS.
//! Time is tokio's paused clock or a `ManualClock`; nothing sleeps for real.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use tether::connection::framed::{FramedConfig, FramedConnection, FramedError};
use tether::execution::{ConnectError, ExecutionManager, LogConfig, ManagerConfig, ProduceError};
use tether::wire::{
    FinishResponse, FrameCodec, FrameError, InitResponse, MalformedMessage, ResponseMessage,
    UdfRequest, UdfResponse,
};
use tether::worker::endpoint::{EndpointConfig, EndpointOutcome};
use tether::worker::engine::{
    CountingHandle, EngineCore, PeerViolation, Session, SessionConfig, SessionError,
    TerminationKind, TransportFailure, WorkerHandle,
};
use tether_testing::connect::{
    Caller, ManualManager, assert_batch, batch, condition, execute, next, op_id, reattach,
    release_all, start,
};
use tokio::io::AsyncWriteExt;

use tether_testing::fixtures::{assert_init_ok, b, data_strings, framed_error, init};
use tether_testing::script::{SplitEngine, spawn_echo_split};

/// One row of the catalog: the hostile input and the outcome it must have.
struct Row {
    test: &'static str,
    input: &'static str,
    expected: &'static str,
}

/// Declares the catalog: the `CATALOG` table and one test per row running its check.
macro_rules! catalog {
    ($( $(#[$attr:meta])* $test:ident: $input:literal => $expected:literal, $check:expr; )*) => {
        const CATALOG: &[Row] = &[$(Row { test: stringify!($test), input: $input, expected: $expected }),*];
        $(
            $(#[$attr])*
            #[tokio::test(start_paused = true)]
            async fn $test() {
                $check.await
            }
        )*
    };
}

catalog! {
    row_01_length_prefix_over_the_limit:
        "a length prefix over the limit"
        => "a typed error, without allocating the claimed size",
        oversize_length_prefix();
    row_02_truncated_invalid_or_empty_frames:
        "a truncated frame, invalid protobuf, an unknown or empty oneof"
        => "a typed error; the session is TransportFailed and the worker invalidated",
        malformed_frames();
    row_03_duplicate_init_response_or_data_after_a_terminal:
        "a duplicate InitResponse, or data after a terminal"
        => "ignored, counted and logged at WARN (udf §4.5); the outcome is unchanged",
        ignored_late_messages();
    row_04_finish_response_before_finish:
        "a FinishResponse before Finish"
        => "TransportFailed",
        finish_response_before_finish();
    row_05_non_uuid_operation_id:
        "a non-UUID operation id"
        => "INVALID_HANDLE.FORMAT",
        non_uuid_operation_id();
    row_06_upper_case_uuid:
        "an upper-case UUID"
        => "accepted and normalised; the reattach works",
        upper_case_uuid();
    row_07_empty_last_response_id:
        "an empty last_response_id"
        => "INVALID_CURSOR.POSITION_NOT_FOUND",
        empty_last_response_id();
    row_08_another_users_ids:
        "reattach or release with another user's ids"
        => "SESSION_NOT_FOUND (OPERATION_NOT_FOUND once that user has a session of the same \
            id); an interrupt succeeds with nothing interrupted; the owner is unaffected",
        another_users_ids();
    row_09_release_of_an_unknown_operation:
        "a release of an unknown operation in one's own session"
        => "success, operation_id unset",
        release_of_unknown_operation();
    row_10_ten_thousand_executions_from_one_session:
        "10 000 executions from one session"
        => "EXECUTION_LIMIT_EXCEEDED (max_executions_per_session), from the first one past the cap",
        ten_thousand_executions();
    row_11a_udf_engine_that_stops_reading_output:
        "a UDF engine that stops reading output"
        => "backpressure stops the worker within its configured bounds; nothing is lost",
        udf_engine_stops_reading();
    row_11b_connect_client_that_stops_reading:
        "a Spark Connect client that stops reading"
        => "backpressure stops the producer at max_unsent_responses; nothing is lost",
        connect_client_stops_reading();
    row_12_framed_peer_trickling_one_byte_per_second:
        "a framed peer that trickles one byte per second"
        => "FramedError::FrameTimeout after FramedConfig::frame_timeout (30 s)",
        trickling_peer();
    row_13_ten_thousand_concurrent_execute_streams_on_one_grpc_worker:
        "10 000 concurrent Execute streams opened on one gRPC worker"
        => "GrpcConfig::max_concurrent_streams (256 by default): a compliant engine's streams \
            wait, none is lost and Manage still answers; a raw HTTP/2 client past the limit \
            gets REFUSED_STREAM; the worker never serves more streams at once",
        default_stream_limit();
    row_14_ten_thousand_idle_connections_to_a_framed_worker:
        "10 000 idle connections to a framed worker (the worker in its own process)"
        => "WorkerMain::with_max_framed_sessions (1024 by default; 256 here): the worker holds \
            at most that many, the rest wait in the listen backlog or are refused; an existing \
            session finishes with all its output; new sessions are served once they go",
        idle_framed_connections();
}

#[test]
fn the_catalog_states_every_row() {
    assert_eq!(CATALOG.len(), 15);
    for row in CATALOG {
        assert!(row.test.starts_with("row_"), "{}", row.test);
        assert!(!row.input.is_empty() && !row.expected.is_empty());
    }
}

// ---------------------------------------------------------------------------------------------
// Framed transport (udf §1.1 over tether's framing)
// ---------------------------------------------------------------------------------------------

type EngineFramed = FramedConnection<tokio::io::DuplexStream, UdfRequest, UdfResponse>;

/// An engine session over a framed in-memory byte stream, and the raw worker end on which a
/// row writes its hostile bytes.
fn framed_session(
    config: &FramedConfig,
) -> (
    Session<tether::worker::state::Init, EngineFramed>,
    tokio::io::DuplexStream,
    Arc<CountingHandle>,
) {
    let (engine, worker) = tokio::io::duplex(256 * 1024);
    let handle = Arc::new(CountingHandle::for_one_session());
    let session_config = SessionConfig {
        init_timeout: Duration::from_secs(600),
        ..SessionConfig::default()
    };
    let session = Session::new(
        FramedConnection::new(engine, config),
        handle.clone(),
        session_config,
    );
    (session, worker, handle)
}

/// Runs `init` against a worker end that only writes `bytes` (then half-closes if `eof`),
/// and returns the session error after checking the session ended `TransportFailed` with
/// the worker invalidated and released once.
async fn init_against_raw(bytes: &'static [u8], eof: bool, config: FramedConfig) -> SessionError {
    let (session, mut worker, handle) = framed_session(&config);
    let hostile = tokio::spawn(async move {
        for byte in bytes {
            worker.write_all(&[*byte]).await.expect("write");
            if !eof {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        if eof {
            worker.shutdown().await.expect("shutdown");
        }
        worker
    });
    let failed = session.init(init("udf")).await.expect_err("init must fail");
    let t = failed.session.close().await;
    assert_eq!(t.kind(), TerminationKind::TransportFailed, "{t}");
    assert!(handle.is_invalid(), "the worker is invalidated");
    assert_eq!(handle.releases(), 1);
    hostile.abort();
    failed.error
}

async fn oversize_length_prefix() {
    // The codec alone: the claimed 4 GiB is refused and never reserved.
    let mut codec = FrameCodec::default();
    let mut buf = BytesMut::with_capacity(64);
    buf.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    let e = codec.decode::<UdfResponse>(&mut buf).expect_err("oversize");
    assert!(
        matches!(e, FrameError::Oversize { len, max } if len == u32::MAX as usize && max == codec.max_frame_len()),
        "{e:?}"
    );
    assert!(buf.capacity() <= 64, "capacity grew to {}", buf.capacity());
    // Over a framed connection: a typed error and a failed session.
    let error = init_against_raw(&[0xff, 0xff, 0xff, 0xff], true, FramedConfig::default()).await;
    assert!(
        matches!(
            framed_error(&error),
            FramedError::Frame(FrameError::Oversize { .. })
        ),
        "{error:?}"
    );
}

async fn malformed_frames() {
    // (what, bytes on the wire, the typed error expected)
    type Expect = fn(&SessionError) -> bool;
    let rows: [(&str, &'static [u8], Expect); 4] = [
        ("a truncated frame", &[0, 0, 0, 100, 0x0a, 0x00], |e| {
            matches!(
                framed_error(e),
                FramedError::Frame(FrameError::Truncated {
                    needed: 104,
                    available: 6
                })
            )
        }),
        ("invalid protobuf", &[0, 0, 0, 2, 0xff, 0xff], |e| {
            matches!(framed_error(e), FramedError::Frame(FrameError::Decode(_)))
        }),
        // Field 99 (varint 1) only: no oneof case prost knows, dropped as unknown.
        ("an unknown oneof", &[0, 0, 0, 3, 0x98, 0x06, 0x01], |e| {
            matches!(
                e,
                SessionError::Transport(TransportFailure::Protocol(PeerViolation::Malformed(
                    MalformedMessage::EmptyResponse
                )))
            )
        }),
        ("an empty oneof", &[0, 0, 0, 0], |e| {
            matches!(
                e,
                SessionError::Transport(TransportFailure::Protocol(PeerViolation::Malformed(
                    MalformedMessage::EmptyResponse
                )))
            )
        }),
    ];
    for (what, bytes, expected) in rows {
        let error = init_against_raw(bytes, true, FramedConfig::default()).await;
        assert!(expected(&error), "{what}: {error:?}");
    }
}

async fn trickling_peer() {
    // A 100-byte frame sent one byte a second: it would take 104 s, the limit is 30 s.
    static FRAME: [u8; 104] = {
        let mut f = [0u8; 104];
        f[3] = 100;
        f
    };
    let config = FramedConfig::default();
    let limit = config.frame_timeout;
    assert_eq!(limit, Duration::from_secs(30));
    let start = tokio::time::Instant::now();
    let error = init_against_raw(&FRAME, false, config).await;
    assert!(
        matches!(framed_error(&error), FramedError::FrameTimeout(after) if *after == limit),
        "{error:?}"
    );
    let took = start.elapsed();
    assert!(
        took >= limit && took < limit + Duration::from_secs(2),
        "{took:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Engine core (udf §4.5)
// ---------------------------------------------------------------------------------------------

/// Runs `f` with a WARN-level subscriber; returns what it logged.
fn warnings_of(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let text = sink.0.lock().unwrap().clone();
    String::from_utf8(text).expect("utf-8 log")
}

/// An engine core that has sent `Init` and accepted the worker's `InitResponse`.
fn streaming_core() -> EngineCore {
    let mut core = EngineCore::default();
    core.start_init(init("udf"), None).expect("init");
    while core.poll_transmit().is_some() {}
    core.handle_response(UdfResponse::init(InitResponse::default()));
    core
}

async fn ignored_late_messages() {
    // A duplicate InitResponse mid-stream.
    let mut core = streaming_core();
    let log = warnings_of(|| core.handle_response(UdfResponse::init(InitResponse::default())));
    assert_eq!(core.stats().duplicate_init_responses, 1);
    assert!(core.terminal().is_none(), "the outcome is unchanged");
    assert!(
        log.contains("WARN") && log.contains("duplicate InitResponse"),
        "{log}"
    );
    core.handle_response(UdfResponse::data(b("d")));
    assert_eq!(core.pop_output(), Some(b("d")), "the stream goes on");

    // Data after the terminal.
    assert!(core.finish().expect("finish"));
    while core.poll_transmit().is_some() {}
    core.handle_response(UdfResponse::finish(FinishResponse::default()));
    assert_eq!(
        core.terminal().map(|t| t.kind()),
        Some(TerminationKind::Finished)
    );
    let log = warnings_of(|| core.handle_response(UdfResponse::data(b("late"))));
    assert_eq!(core.stats().ignored_after_terminal, 1);
    assert_eq!(
        core.terminal().map(|t| t.kind()),
        Some(TerminationKind::Finished)
    );
    assert_eq!(core.pop_output(), None, "late data is not delivered");
    assert!(
        log.contains("WARN") && log.contains("after the terminal"),
        "{log}"
    );
}

async fn finish_response_before_finish() {
    let mut core = streaming_core();
    core.handle_response(UdfResponse::finish(FinishResponse::default()));
    assert_eq!(
        core.terminal().map(|t| t.kind()),
        Some(TerminationKind::TransportFailed)
    );
    assert!(matches!(
        core.error(),
        Some(SessionError::Transport(TransportFailure::Protocol(
            PeerViolation::FinishResponseBeforeFinish
        )))
    ));
}

// ---------------------------------------------------------------------------------------------
// Spark Connect executions (rx)
// ---------------------------------------------------------------------------------------------

fn manager(config: ManagerConfig) -> ExecutionManager {
    ManualManager::new(config).manager
}

async fn non_uuid_operation_id() {
    let m = manager(ManagerConfig::default());
    for bad in ["not-a-uuid", "", "{8c1f1ad6-0b5a-4c3a-9f39-5d0c1b0e7a11}"] {
        let e = m.execute_plan(&execute(bad)).expect_err(bad);
        assert_eq!(condition(&e), "INVALID_HANDLE.FORMAT", "{bad:?}");
    }
    assert_eq!(m.execution_count(), 0, "nothing registered");
}

async fn upper_case_uuid() {
    let m = manager(ManagerConfig::default());
    let lower = op_id();
    let upper = lower.to_uppercase();
    let (mut p, mut s) = start(&m, &execute(&upper));
    p.try_push(batch(1)).expect("push");
    p.try_push(batch(2)).expect("push");
    let first = next(&mut s);
    assert_eq!(first.operation_id, lower, "normalised to lower case");
    let mut again = m
        .reattach_execute(&reattach(&upper, Some(&first.response_id)))
        .expect("the reattach works");
    let second = next(&mut again);
    assert_eq!(second.operation_id, lower);
    assert_batch(&second, 2);
}

async fn empty_last_response_id() {
    let m = manager(ManagerConfig::default());
    let o = op_id();
    let (mut p, mut s) = start(&m, &execute(&o));
    p.try_push(batch(1)).expect("push");
    let e = m
        .reattach_execute(&reattach(&o, Some("")))
        .expect_err("empty cursor");
    assert_eq!(condition(&e), "INVALID_CURSOR.POSITION_NOT_FOUND");
    assert_batch(&next(&mut s), 1);
}

async fn another_users_ids() {
    let m = manager(ManagerConfig::default());
    let mallory = Caller::other_user();
    let o = op_id();
    let (mut p, mut s) = start(&m, &execute(&o));
    let no_session =
        |e: ConnectError| assert_eq!(condition(&e), "INVALID_HANDLE.SESSION_NOT_FOUND");
    no_session(m.reattach_execute(&mallory.reattach(&o, None)).unwrap_err());
    no_session(m.release_execute(&mallory.release_all(&o)).unwrap_err());
    // Interrupt gets or creates the other user's session and interrupts nothing.
    let r = m
        .interrupt(&mallory.interrupt_op(&o))
        .expect("interrupt succeeds");
    assert!(r.interrupted_ids.is_empty());
    // Now that user has a session of the same id: the operation is not found in it.
    let e = m.reattach_execute(&mallory.reattach(&o, None)).unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.OPERATION_NOT_FOUND");
    let r = m
        .release_execute(&mallory.release_all(&o))
        .expect("release succeeds");
    assert_eq!(r.operation_id, None, "nothing released");
    // The owner is unaffected.
    assert_eq!(m.execution_count(), 1);
    p.try_push(batch(7)).expect("the owner's producer runs");
    assert_batch(&next(&mut s), 7);
}

async fn release_of_unknown_operation() {
    let m = manager(ManagerConfig::default());
    let _own = start(&m, &execute(&op_id()));
    let r = m.release_execute(&release_all(&op_id())).expect("success");
    assert_eq!(r.operation_id, None);
    assert_eq!(m.execution_count(), 1);
}

async fn ten_thousand_executions() {
    let m = manager(ManagerConfig::default());
    let cap = m.config().max_executions_per_session;
    assert_eq!(cap, 1_000, "the documented default");
    let mut live = Vec::with_capacity(cap);
    for i in 0..10_000 {
        match m.execute_plan(&execute(&op_id())) {
            Ok(submitted) => {
                assert!(i < cap, "execution {i} accepted past the cap");
                live.push(submitted.start());
            }
            Err(e) => {
                assert!(i >= cap, "execution {i} refused below the cap: {e}");
                assert_eq!(condition(&e), "EXECUTION_LIMIT_EXCEEDED");
                assert_eq!(e.code(), tether::execution::Code::ResourceExhausted);
            }
        }
    }
    assert_eq!(live.len(), cap);
    assert_eq!(m.execution_count(), cap);
}

// ---------------------------------------------------------------------------------------------
// Peers that never read
// ---------------------------------------------------------------------------------------------

async fn udf_engine_stops_reading() {
    const CAPACITY: usize = 4;
    // What may sit unread: the worker's input buffer, both channels (futures' mpsc holds
    // one more message per sender), and the batch in the worker's hands.
    let input_buffer = EndpointConfig::default().input_buffer;
    let bound = input_buffer + 2 * (CAPACITY + 1) + 2;
    let (mut engine, worker) = spawn_echo_split(CAPACITY);
    SplitEngine::send(&mut engine.requests, UdfRequest::init(init("udf"))).await;
    let first = engine.responses.next().await.expect("InitResponse");
    assert_init_ok(&first.into_message().expect("a response"));
    let mut sent = Vec::new();
    for i in 0..10 * bound {
        let batch = format!("batch-{i}");
        let request = UdfRequest::data(b(&batch));
        // Wait for capacity only: a send whose capacity never comes is never started.
        let ready = futures::future::poll_fn(|cx| engine.requests.poll_ready(cx));
        match tokio::time::timeout(Duration::from_secs(5), ready).await {
            Ok(r) => r.expect("the worker went away"),
            Err(_) => break,
        }
        engine.requests.start_send(request).expect("capacity");
        sent.push(batch);
    }
    assert!(
        !sent.is_empty() && sent.len() <= bound,
        "{} batches accepted while nothing was read (bound {bound})",
        sent.len()
    );
    // The engine reads again: every accepted batch comes back once, in order.
    let mut requests = engine.requests;
    let finishing = tokio::spawn(async move {
        SplitEngine::send(&mut requests, UdfRequest::finish()).await;
        requests
    });
    let all = SplitEngine::recv_to_end(&mut engine.responses).await;
    assert_eq!(
        data_strings(&all),
        sent,
        "every batch echoed once, in order"
    );
    assert!(matches!(all.last(), Some(ResponseMessage::Finish(_))));
    drop(finishing.await.expect("finish sent"));
    assert!(matches!(
        worker.await.expect("worker task"),
        EndpointOutcome::Finished
    ));
}

async fn connect_client_stops_reading() {
    const MAX: usize = 4;
    let m = manager(ManagerConfig {
        log: LogConfig {
            max_unsent_responses: MAX,
            max_unsent_bytes: 1 << 20,
            ..LogConfig::REATTACHABLE
        },
        ..ManagerConfig::default()
    });
    let (mut p, mut s) = start(&m, &execute(&op_id()));
    let mut accepted = 0i64;
    for i in 0..100i64 {
        match p.try_push(batch(i)) {
            Ok(_) => accepted += 1,
            Err(ProduceError::WouldBlock(_)) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(accepted as usize, MAX, "the producer stops at the bound");
    let blocked = tokio::time::timeout(Duration::from_secs(60), p.push(batch(accepted))).await;
    assert!(
        blocked.is_err(),
        "push waits while the client reads nothing"
    );
    for i in 0..accepted {
        assert_batch(&next(&mut s), i);
    }
    p.try_push(batch(accepted))
        .expect("capacity is back once read");
}

// -------------------------------------------------------------------------------------------
// Rows on real sockets and the real clock (tests/faults/hostile_inputs/limits.rs)
// -------------------------------------------------------------------------------------------

#[path = "hostile_inputs/limits.rs"]
mod limits;

/// Without the `grpc` feature there is no gRPC worker: the row says so and checks nothing.
#[cfg(not(feature = "grpc"))]
async fn default_stream_limit() {
    eprintln!("row 13 needs the `grpc` feature (the README's test command enables it): not run");
}

#[cfg(feature = "grpc")]
async fn default_stream_limit() {
    limits::on_real_clock(limits::grpc::default_stream_limit).await;
}

/// Without the `grpc` feature there is no `WorkerMain`: the row says so and checks nothing.
#[cfg(not(feature = "grpc"))]
async fn idle_framed_connections() {
    eprintln!("row 14 needs the `grpc` feature (the README's test command enables it): not run");
}

#[cfg(feature = "grpc")]
async fn idle_framed_connections() {
    limits::on_real_clock(limits::framed::idle_connections).await;
}

/// Row 14's framed worker process: this test binary, re-executed by the row.
#[cfg(feature = "grpc")]
#[test]
#[ignore = "worker mode: row 14 runs this binary as a framed worker process"]
fn row_14_worker_process() {
    limits::framed::worker_process();
}
