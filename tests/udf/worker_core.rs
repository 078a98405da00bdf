//! Unit and property tests of the sans-IO [`WorkerCore`] through its public API: `Init`
//! validation and chunk assembly (udf §1.3), every protocol-violation row (udf §2 R6, §2.1
//! "any other combination"), Cancel handling (R3, R5 (c) included, R7), the two deadlines
//! (udf §7), transport failures (R8), and invariants over arbitrary request sequences.
//! Messages and configurations come from [`tether_testing::fixtures`]; what is here is
//! specific to these tests: cores in a given phase, the carrier of a violation's
//! `ProtocolError`, the proptest harness.
//!
//! One test of the core stays beside it in `src/worker/endpoint/core.rs`
//! (`a_wait_reads_the_clock_only_when_it_arms_a_deadline`): it counts the clock reads of
//! `begin_wait_with`, which is crate-private (the public `begin_wait` takes the instant).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use tether::connection::ConnectionError;
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, MalformedMessage, ResponseKind,
    ResponseMessage, UdfRequest, UdfWorkerDataFormat, execution_error,
};
use tether::worker::endpoint::{
    DataSent, Delivery, EndpointConfig, EndpointOutcome, EngineViolation, InitRejection,
    InitTimeout, OutcomeKind, WorkerCore, WorkerPhase,
};
use tether_testing::fixtures::{
    MS, b, chunked_init, chunking_init, data_request, default_endpoint_config, drain_responses,
    empty_control_request, empty_request, init, init_request, kinds, status_ok, user_error,
    worker_error,
};

use EngineViolation as V;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn is_protocol(e: &ExecutionError) -> bool {
    matches!(e.kind, Some(execution_error::Kind::Protocol(_)))
}

/// The message of the ProtocolError carried by `msg` (InitResponse.error, ErrorResponse,
/// CancelResponse.error, FinishResponse.error), if it carries one.
fn protocol_message(msg: &ResponseMessage) -> Option<&str> {
    let e = match msg {
        ResponseMessage::Init(r) => r.error.as_ref(),
        ResponseMessage::Error(r) => r.error.as_ref(),
        ResponseMessage::Cancel(r) => r.error.as_ref(),
        ResponseMessage::Finish(r) => r.error.as_ref(),
        ResponseMessage::Data(_) => None,
    }?;
    is_protocol(e).then(|| e.message())
}

/// A core in phase Data: Init accepted, InitResponse drained.
fn data_core() -> WorkerCore {
    let mut c = WorkerCore::default();
    c.handle_request(init_request("udf"));
    c.accept_init(None).unwrap();
    assert_eq!(kinds(&drain_responses(&mut c)), [ResponseKind::Init]);
    assert_eq!(c.phase(), WorkerPhase::Data);
    c
}

fn assert_violation(c: &WorkerCore, expected: &EngineViolation) {
    match c.outcome() {
        Some(EndpointOutcome::ProtocolViolation(v)) => assert_eq!(v, expected),
        other => panic!("expected the protocol violation {expected:?}, got {other:?}"),
    }
    assert_eq!(c.phase(), WorkerPhase::Done);
}

// ---------------------------------------------------------------------------------------------
// Init, chunk assembly, validation
// ---------------------------------------------------------------------------------------------

#[test]
fn plain_init_waits_for_the_user_then_accept_sends_init_response() {
    let mut c = WorkerCore::default();
    c.handle_request(init_request("udf"));
    assert_eq!(c.phase(), WorkerPhase::InitPending);
    assert!(!c.has_transmit(), "no InitResponse before the user answers");
    assert_eq!(c.init().unwrap().udf.as_ref().unwrap().payload, b("udf"));
    c.accept_init(Some(b("schema"))).unwrap();
    let out = drain_responses(&mut c);
    assert!(
        matches!(&out[..], [ResponseMessage::Init(r)] if r.data == Some(b("schema")) && r.error.is_none())
    );
    assert_eq!(c.phase(), WorkerPhase::Data);
    // Output before the first input is allowed (udf §1.4).
    assert!(matches!(c.send_data(b("gen")), Ok(DataSent::Queued(_))));
    assert_eq!(drain_responses(&mut c), [ResponseMessage::Data(b("gen"))]);
}

#[test]
fn chunks_are_appended_to_the_inline_payload_and_verified() {
    let mut c = WorkerCore::default();
    c.handle_request(UdfRequest::init(chunking_init("ab", b"abcdef")));
    assert_eq!(c.phase(), WorkerPhase::AwaitingChunks);
    c.handle_request(UdfRequest::payload_chunk(b("cd"), false));
    assert_eq!(c.phase(), WorkerPhase::AwaitingChunks);
    assert!(!c.has_transmit(), "no InitResponse before the last chunk");
    c.handle_request(UdfRequest::payload_chunk(b("ef"), true));
    assert_eq!(c.phase(), WorkerPhase::InitPending);
    let assembled = c.take_init().unwrap();
    assert_eq!(assembled.udf.unwrap().payload, b("abcdef"));
}

#[test]
fn chunked_init_with_empty_inline_payload_and_one_last_chunk() {
    let mut c = WorkerCore::default();
    // The Init (nothing inline) and one chunk, "whole", the last.
    for request in chunked_init("whole", 1) {
        c.handle_request(request);
    }
    assert_eq!(c.phase(), WorkerPhase::InitPending);
    assert_eq!(c.init().unwrap().udf.as_ref().unwrap().payload, b("whole"));
}

fn assert_init_rejected(c: &mut WorkerCore, expected: InitRejection) {
    let out = drain_responses(c);
    assert_eq!(kinds(&out), [ResponseKind::Init], "{out:?}");
    assert_eq!(c.init_rejection(), Some(&expected));
    let msg = protocol_message(&out[0]).expect("a ProtocolError in the InitResponse");
    assert_eq!(msg, expected.wire_message());
    assert_eq!(c.phase(), WorkerPhase::PostError);
    // Finish is ignored while the Cancel is due (udf §2.1).
    c.handle_request(UdfRequest::finish());
    assert_eq!(c.phase(), WorkerPhase::PostError);
    assert!(!c.has_transmit());
    // The Cancel is answered automatically: the user never saw the Init.
    c.handle_request(UdfRequest::cancel(Some("init failed".into())));
    let out = drain_responses(c);
    assert!(
        matches!(&out[..], [ResponseMessage::Cancel(r)] if r.error.is_none()),
        "{out:?}"
    );
    match c.outcome() {
        Some(EndpointOutcome::Cancelled {
            reason,
            reported: Some(e),
        }) => {
            assert_eq!(reason.as_deref(), Some("init failed"));
            assert!(is_protocol(e));
        }
        other => panic!("unexpected outcome {other:?}"),
    }
}

#[test]
fn crc_mismatch_is_a_protocol_error_in_the_init_response() {
    let mut c = WorkerCore::default();
    let mut i = chunking_init("", b"abc");
    i.udf.as_mut().unwrap().payload_crc32 = Some(crc32fast::hash(b"abd"));
    c.handle_request(UdfRequest::init(i));
    c.handle_request(UdfRequest::payload_chunk(b("abc"), true));
    assert_init_rejected(
        &mut c,
        InitRejection::PayloadCrcMismatch {
            declared: crc32fast::hash(b"abd"),
            assembled: crc32fast::hash(b"abc"),
        },
    );

    let mut c = WorkerCore::default();
    let mut i = init("inline");
    i.udf.as_mut().unwrap().payload_crc32 = Some(0xdead_beef);
    c.handle_request(UdfRequest::init(i));
    assert_init_rejected(
        &mut c,
        InitRejection::PayloadCrcMismatch {
            declared: 0xdead_beef,
            assembled: crc32fast::hash(b"inline"),
        },
    );
}

#[test]
fn size_mismatch_is_a_protocol_error_in_the_init_response() {
    let mut c = WorkerCore::default();
    let mut i = chunking_init("a", b"abc");
    i.udf.as_mut().unwrap().payload_crc32 = None;
    i.udf.as_mut().unwrap().payload_size = Some(4);
    c.handle_request(UdfRequest::init(i));
    c.handle_request(UdfRequest::payload_chunk(b("bc"), true));
    assert_init_rejected(
        &mut c,
        InitRejection::PayloadSizeMismatch {
            declared: 4,
            assembled: 3,
        },
    );

    let mut c = WorkerCore::default();
    let mut i = init("abc");
    i.udf.as_mut().unwrap().payload_size = Some(-1);
    c.handle_request(UdfRequest::init(i));
    assert_init_rejected(
        &mut c,
        InitRejection::PayloadSizeMismatch {
            declared: -1,
            assembled: 3,
        },
    );
}

#[test]
fn matching_size_and_crc_on_an_inline_payload_are_accepted() {
    let mut c = WorkerCore::default();
    let mut i = init("abc");
    i.udf.as_mut().unwrap().payload_size = Some(3);
    i.udf.as_mut().unwrap().payload_crc32 = Some(crc32fast::hash(b"abc"));
    c.handle_request(UdfRequest::init(i));
    assert_eq!(c.phase(), WorkerPhase::InitPending);
}

#[test]
fn protocol_version_is_checked_only_when_set() {
    for (version, ok) in [
        (None, true),
        (Some(1), true),
        (Some(0), false),
        (Some(1000), false),
    ] {
        let mut c = WorkerCore::default();
        let mut i = init("udf");
        i.protocol_version = version;
        c.handle_request(UdfRequest::init(i));
        match version {
            Some(requested) if !ok => assert_init_rejected(
                &mut c,
                InitRejection::UnsupportedProtocolVersion {
                    requested,
                    supported: 1,
                },
            ),
            _ => assert_eq!(c.phase(), WorkerPhase::InitPending, "{version:?}"),
        }
    }
}

#[test]
fn data_format_must_be_declared_and_specified() {
    for (format, ok) in [(1, true), (0, false), (42, false), (-3, false)] {
        let mut c = WorkerCore::default();
        let mut i = init("udf");
        i.data_format = format;
        c.handle_request(UdfRequest::init(i));
        if ok {
            assert_eq!(c.phase(), WorkerPhase::InitPending, "{format}");
        } else {
            assert_init_rejected(
                &mut c,
                InitRejection::UnsupportedDataFormat {
                    requested: format,
                    supported: vec![UdfWorkerDataFormat::Arrow],
                },
            );
        }
    }
    // A worker declaring no formats accepts none; declaring UNSPECIFIED does not help.
    let cfg = EndpointConfig {
        supported_data_formats: vec![UdfWorkerDataFormat::Unspecified],
        ..default_endpoint_config()
    };
    for format in [0, 1] {
        let mut c = WorkerCore::new(&cfg);
        let mut i = init("udf");
        i.data_format = format;
        c.handle_request(UdfRequest::init(i));
        assert_init_rejected(
            &mut c,
            InitRejection::UnsupportedDataFormat {
                requested: format,
                supported: vec![],
            },
        );
    }
}

#[test]
fn init_without_udf_is_rejected() {
    let mut c = WorkerCore::default();
    let mut i = init("x");
    i.udf = None;
    c.handle_request(UdfRequest::init(i));
    assert_init_rejected(&mut c, InitRejection::MissingUdf);
}

#[test]
fn a_bad_chunked_init_is_answered_only_after_the_last_chunk() {
    let mut c = WorkerCore::default();
    let mut i = chunking_init("", b"abc");
    i.protocol_version = Some(7);
    c.handle_request(UdfRequest::init(i));
    assert_eq!(c.phase(), WorkerPhase::AwaitingChunks);
    c.handle_request(UdfRequest::payload_chunk(b("ab"), false));
    assert!(
        !c.has_transmit(),
        "InitResponse must not precede the last chunk (udf §1.3)"
    );
    c.handle_request(UdfRequest::payload_chunk(b("c"), true));
    assert_init_rejected(
        &mut c,
        InitRejection::UnsupportedProtocolVersion {
            requested: 7,
            supported: 1,
        },
    );
}

#[test]
fn an_oversized_payload_is_a_violation() {
    let cfg = EndpointConfig {
        max_payload_size: 4,
        ..default_endpoint_config()
    };
    let mut c = WorkerCore::new(&cfg);
    c.handle_request(UdfRequest::init(chunking_init("ab", b"abcdef")));
    c.handle_request(UdfRequest::payload_chunk(b("cdef"), true));
    assert_violation(&c, &V::ChunkedPayloadTooLarge { size: 6, limit: 4 });
    assert_eq!(
        kinds(&drain_responses(&mut c)),
        [ResponseKind::Init, ResponseKind::Cancel]
    );

    let mut c = WorkerCore::new(&cfg);
    c.handle_request(init_request("abcdef"));
    assert_violation(&c, &V::InlinePayloadTooLarge { size: 6, limit: 4 });
}

#[test]
fn user_rejection_sends_the_error_in_the_init_response_then_waits_for_cancel() {
    let mut c = WorkerCore::default();
    c.handle_request(init_request("udf"));
    c.reject_init(worker_error("no such function")).unwrap();
    let out = drain_responses(&mut c);
    assert!(
        matches!(&out[..], [ResponseMessage::Init(r)] if r.error.as_ref().unwrap().message() == "no such function")
    );
    assert_eq!(c.phase(), WorkerPhase::PostError);
    assert!(
        c.cancelled(CancelResponse::default()).is_err(),
        "the Cancel has not arrived"
    );
    c.handle_request(UdfRequest::cancel(None));
    assert_eq!(
        c.phase(),
        WorkerPhase::Cancelling,
        "the user answers: it saw the Init"
    );
    let mut metrics = BTreeMap::new();
    metrics.insert("cleanup".to_string(), "done".to_string());
    c.cancelled(CancelResponse {
        metrics: metrics.clone(),
        error: None,
    })
    .unwrap();
    let out = drain_responses(&mut c);
    assert!(matches!(&out[..], [ResponseMessage::Cancel(r)] if r.metrics == metrics));
    assert_eq!(
        c.outcome().unwrap().reported_error().unwrap().message(),
        "no such function"
    );
}

// ---------------------------------------------------------------------------------------------
// Protocol violations (udf §2 R6, §2.1 "any other combination")
// ---------------------------------------------------------------------------------------------

/// Where the ProtocolError of a violation goes.
#[derive(Debug, Clone, Copy)]
enum Carrier {
    /// `[InitResponse(error), CancelResponse]`.
    Init,
    /// `[ErrorResponse(error), CancelResponse]`.
    Error,
    /// `[CancelResponse(error)]`.
    Cancel,
}

fn check_violation(
    mut c: WorkerCore,
    trigger: impl FnOnce(&mut WorkerCore),
    carrier: Carrier,
    expected: EngineViolation,
) {
    drain_responses(&mut c);
    trigger(&mut c);
    assert_violation(&c, &expected);
    let out = drain_responses(&mut c);
    let text = expected.wire_message();
    match carrier {
        Carrier::Init => {
            assert_eq!(
                kinds(&out),
                [ResponseKind::Init, ResponseKind::Cancel],
                "{expected:?}"
            );
            assert_eq!(protocol_message(&out[0]), Some(text.as_str()));
            assert!(protocol_message(&out[1]).is_none());
        }
        Carrier::Error => {
            assert_eq!(
                kinds(&out),
                [ResponseKind::Error, ResponseKind::Cancel],
                "{expected:?}"
            );
            assert_eq!(protocol_message(&out[0]), Some(text.as_str()));
            assert!(protocol_message(&out[1]).is_none());
        }
        Carrier::Cancel => {
            assert_eq!(kinds(&out), [ResponseKind::Cancel], "{expected:?}");
            assert_eq!(protocol_message(&out[0]), Some(text.as_str()));
        }
    }
    // Nothing after the terminator, whatever comes next.
    c.handle_request(UdfRequest::cancel(None));
    c.handle_request(data_request("late"));
    c.handle_stream_end();
    assert_eq!(c.send_data(b("late")), Ok(DataSent::Dropped));
    assert!(!c.has_transmit());
    assert_violation(&c, &expected);
}

fn awaiting_chunks() -> WorkerCore {
    let mut c = WorkerCore::default();
    c.handle_request(UdfRequest::init(chunking_init("", b"abc")));
    c
}

fn init_pending() -> WorkerCore {
    let mut c = WorkerCore::default();
    c.handle_request(init_request("udf"));
    c
}

fn draining() -> WorkerCore {
    let mut c = data_core();
    c.handle_request(UdfRequest::finish());
    assert_eq!(c.phase(), WorkerPhase::Draining);
    c
}

fn cancelling() -> WorkerCore {
    let mut c = data_core();
    c.handle_request(UdfRequest::cancel(None));
    assert_eq!(c.phase(), WorkerPhase::Cancelling);
    c
}

fn post_init_error() -> WorkerCore {
    let mut c = init_pending();
    c.reject_init(worker_error("init failed")).unwrap();
    c
}

fn post_data_error() -> WorkerCore {
    let mut c = data_core();
    c.fail(ExecutionError::user("boom")).unwrap();
    c
}

fn send(req: UdfRequest) -> impl FnOnce(&mut WorkerCore) {
    move |c| c.handle_request(req)
}

#[test]
fn violations_before_any_init_response_go_into_the_init_response() {
    use Carrier::Init as I;
    check_violation(
        WorkerCore::default(),
        send(data_request("x")),
        I,
        V::DataBeforeInitResponse,
    );
    check_violation(
        WorkerCore::default(),
        send(UdfRequest::finish()),
        I,
        V::FinishBeforeInitResponse,
    );
    check_violation(
        WorkerCore::default(),
        send(UdfRequest::payload_chunk(b("x"), true)),
        I,
        V::ChunkBeforeInit,
    );
    check_violation(
        WorkerCore::default(),
        send(empty_request()),
        I,
        V::Malformed(MalformedMessage::EmptyRequest),
    );
    check_violation(
        WorkerCore::default(),
        send(empty_control_request()),
        I,
        V::Malformed(MalformedMessage::EmptyControlRequest),
    );
    check_violation(
        WorkerCore::default(),
        |c| c.handle_stream_end(),
        I,
        V::RequestStreamEnded,
    );

    check_violation(
        awaiting_chunks(),
        send(init_request("x")),
        I,
        V::SecondInit {
            awaiting_chunks: true,
        },
    );
    check_violation(
        awaiting_chunks(),
        send(data_request("x")),
        I,
        V::DataBeforeInitResponse,
    );
    check_violation(
        awaiting_chunks(),
        send(UdfRequest::finish()),
        I,
        V::FinishBeforeInitResponse,
    );
    check_violation(
        awaiting_chunks(),
        send(UdfRequest::payload_chunk(Bytes::new(), false)),
        I,
        V::EmptyChunk,
    );
    check_violation(
        awaiting_chunks(),
        send(UdfRequest::payload_chunk(Bytes::new(), true)),
        I,
        V::EmptyChunk,
    );
    check_violation(
        awaiting_chunks(),
        |c| c.handle_stream_end(),
        I,
        V::RequestStreamEnded,
    );

    // The user holds the Init but has not answered: still the init phase.
    check_violation(
        init_pending(),
        send(init_request("x")),
        I,
        V::SecondInit {
            awaiting_chunks: false,
        },
    );
    check_violation(
        init_pending(),
        send(data_request("x")),
        I,
        V::DataBeforeInitResponse,
    );
    check_violation(
        init_pending(),
        send(UdfRequest::finish()),
        I,
        V::FinishBeforeInitResponse,
    );
    check_violation(
        init_pending(),
        send(UdfRequest::payload_chunk(b("x"), true)),
        I,
        V::ChunkWithoutChunking,
    );
    let mut after_last = awaiting_chunks();
    after_last.handle_request(UdfRequest::payload_chunk(b("abc"), true));
    check_violation(
        after_last,
        send(UdfRequest::payload_chunk(b("x"), true)),
        I,
        V::ChunkAfterLastChunk,
    );
}

#[test]
fn violations_in_the_data_phase_go_into_an_error_response() {
    use Carrier::Error as E;
    check_violation(
        data_core(),
        send(init_request("x")),
        E,
        V::SecondInit {
            awaiting_chunks: false,
        },
    );
    check_violation(
        data_core(),
        send(UdfRequest::payload_chunk(b("x"), true)),
        E,
        V::ChunkAfterInitResponse,
    );
    check_violation(
        data_core(),
        send(empty_request()),
        E,
        V::Malformed(MalformedMessage::EmptyRequest),
    );
    check_violation(
        data_core(),
        send(empty_control_request()),
        E,
        V::Malformed(MalformedMessage::EmptyControlRequest),
    );
    check_violation(
        data_core(),
        |c| c.handle_stream_end(),
        E,
        V::RequestStreamEnded,
    );
    check_violation(draining(), send(data_request("x")), E, V::DataAfterFinish);
    check_violation(draining(), send(UdfRequest::finish()), E, V::SecondFinish);
    check_violation(
        draining(),
        send(init_request("x")),
        E,
        V::SecondInit {
            awaiting_chunks: false,
        },
    );
}

#[test]
fn violations_after_an_error_or_a_cancel_go_into_the_cancel_response() {
    use Carrier::Cancel as C;
    check_violation(cancelling(), send(data_request("x")), C, V::DataAfterCancel);
    check_violation(
        cancelling(),
        send(UdfRequest::finish()),
        C,
        V::FinishAfterCancel,
    );
    check_violation(
        cancelling(),
        send(UdfRequest::payload_chunk(b("x"), true)),
        C,
        V::ChunkAfterCancel,
    );
    check_violation(
        cancelling(),
        send(init_request("x")),
        C,
        V::SecondInit {
            awaiting_chunks: false,
        },
    );
    check_violation(
        cancelling(),
        |c| c.handle_stream_end(),
        C,
        V::RequestStreamEnded,
    );
    check_violation(
        post_init_error(),
        send(data_request("x")),
        C,
        V::DataAfterFailedInit,
    );
    check_violation(
        post_init_error(),
        send(init_request("x")),
        C,
        V::SecondInit {
            awaiting_chunks: false,
        },
    );
    check_violation(
        post_data_error(),
        send(UdfRequest::payload_chunk(b("x"), false)),
        C,
        V::ChunkAfterInitResponse,
    );
    check_violation(
        post_data_error(),
        |c| c.handle_stream_end(),
        C,
        V::RequestStreamEnded,
    );
    let mut finished_then_failed = draining();
    finished_then_failed
        .fail(ExecutionError::user("late"))
        .unwrap();
    check_violation(
        finished_then_failed,
        send(data_request("x")),
        C,
        V::DataAfterFinish,
    );
}

#[test]
fn a_violation_during_a_user_cancel_drops_queued_output() {
    let mut c = data_core();
    assert!(matches!(c.send_data(b("queued")), Ok(DataSent::Queued(_))));
    c.handle_request(init_request("again"));
    let out = drain_responses(&mut c);
    assert_eq!(kinds(&out), [ResponseKind::Error, ResponseKind::Cancel]);
    assert_eq!(c.stats().output_dropped, 1);
}

#[test]
fn cancel_timeout_closes_a_post_error_session() {
    let mut c = post_data_error();
    drain_responses(&mut c);
    let t0 = std::time::Instant::now();
    let timeout = Duration::from_secs(30);
    c.begin_wait(t0);
    let at = c.poll_timeout().expect("the R4 deadline runs in PostError");
    assert_eq!(at, t0 + timeout);
    // Total, not per wait: a later wait does not move it.
    c.begin_wait(t0 + Duration::from_secs(10));
    assert_eq!(c.poll_timeout(), Some(at));
    c.handle_timeout(at - MS);
    assert_eq!(c.phase(), WorkerPhase::PostError, "not yet due");
    c.handle_timeout(at);
    let expected = V::NoCancelAfterError { after: timeout };
    assert_violation(&c, &expected);
    let out = drain_responses(&mut c);
    assert_eq!(kinds(&out), [ResponseKind::Cancel]);
    assert_eq!(
        protocol_message(&out[0]),
        Some(expected.wire_message().as_str())
    );

    // Elsewhere (but AwaitingInit, see below) no deadline runs.
    let mut c = data_core();
    c.begin_wait(t0);
    assert_eq!(c.poll_timeout(), None);
    c.handle_timeout(t0 + Duration::from_secs(3600));
    assert_eq!(c.phase(), WorkerPhase::Data);
}

#[test]
fn init_timeout_ends_a_session_that_never_gets_its_init() {
    let timeout = default_endpoint_config()
        .init_timeout
        .expect("the default waits for the Init");
    assert_eq!(
        timeout,
        Duration::from_secs(30),
        "Spark's initResponseTimeoutMs (udf §7)"
    );
    let t0 = std::time::Instant::now();
    let mut c = WorkerCore::default();
    c.begin_wait(t0);
    let at = c
        .poll_timeout()
        .expect("the Init deadline runs in AwaitingInit");
    assert_eq!(at, t0 + timeout);
    c.begin_wait(t0 + Duration::from_secs(10));
    assert_eq!(c.poll_timeout(), Some(at), "total, not per wait");
    c.handle_timeout(at - MS);
    assert_eq!(c.phase(), WorkerPhase::AwaitingInit, "not yet due");
    c.handle_timeout(at);
    match c.outcome() {
        Some(EndpointOutcome::TransportFailed(e)) => assert_eq!(
            std::error::Error::source(e).and_then(|s| s.downcast_ref::<InitTimeout>()),
            Some(&InitTimeout { after: timeout })
        ),
        other => panic!("expected TransportFailed(InitTimeout), got {other:?}"),
    }
    assert!(drain_responses(&mut c).is_empty(), "nothing is sent");
    assert!(c.wants_half_close());
    assert_eq!(c.poll_timeout(), None);

    // An Init in time disarms it; so does a Cancel; and None never arms it.
    let mut c = WorkerCore::default();
    c.begin_wait(t0);
    c.handle_request(init_request("udf"));
    assert_eq!(c.phase(), WorkerPhase::InitPending);
    c.begin_wait(t0 + timeout);
    assert_eq!(c.poll_timeout(), None);
    c.handle_timeout(t0 + timeout * 2);
    assert_eq!(c.phase(), WorkerPhase::InitPending);
    let mut c = WorkerCore::default();
    c.begin_wait(t0);
    c.handle_request(UdfRequest::cancel(None));
    assert_eq!(c.outcome().map(|o| o.kind()), Some(OutcomeKind::Cancelled));
    assert_eq!(c.poll_timeout(), None);
    let mut c = WorkerCore::new(&EndpointConfig {
        init_timeout: None,
        ..default_endpoint_config()
    });
    c.begin_wait(t0);
    assert_eq!(c.poll_timeout(), None);
}

// ---------------------------------------------------------------------------------------------
// Cancel (R3, R5, R7)
// ---------------------------------------------------------------------------------------------

#[test]
fn cancel_before_init_and_after_a_non_final_chunk_is_answered_automatically() {
    let mut c = WorkerCore::default();
    c.handle_request(UdfRequest::cancel(Some("early".into())));
    let out = drain_responses(&mut c);
    assert!(
        matches!(&out[..], [ResponseMessage::Cancel(r)] if r.error.is_none() && r.metrics.is_empty())
    );
    assert!(
        matches!(c.outcome(), Some(EndpointOutcome::Cancelled { reason: Some(r), reported: None }) if r == "early")
    );

    let mut c = awaiting_chunks();
    c.handle_request(UdfRequest::payload_chunk(b("a"), false));
    c.handle_request(UdfRequest::cancel(None));
    assert_eq!(kinds(&drain_responses(&mut c)), [ResponseKind::Cancel]);
    assert_eq!(c.outcome().unwrap().kind(), OutcomeKind::Cancelled);
    // A late Cancel is ignored.
    c.handle_request(UdfRequest::cancel(None));
    assert!(!c.has_transmit());
    assert_eq!(c.stats().ignored_after_done, 1);
}

#[test]
fn cancel_while_the_user_holds_the_init_sends_nothing_but_the_cancel_response() {
    let mut c = init_pending();
    c.handle_request(UdfRequest::cancel(None));
    assert_eq!(c.phase(), WorkerPhase::Cancelling);
    c.accept_init(Some(b("ignored"))).unwrap();
    assert_eq!(c.send_data(b("x")), Ok(DataSent::Dropped));
    assert!(!c.has_transmit(), "no InitResponse after Cancel");
    c.cancelled(CancelResponse::default()).unwrap();
    assert_eq!(kinds(&drain_responses(&mut c)), [ResponseKind::Cancel]);

    // A rejection after the Cancel ends up in the CancelResponse.
    let mut c = init_pending();
    c.handle_request(UdfRequest::cancel(None));
    c.reject_init(worker_error("bad udf")).unwrap();
    c.cancelled(CancelResponse::default()).unwrap();
    let out = drain_responses(&mut c);
    assert!(
        matches!(&out[..], [ResponseMessage::Cancel(r)] if r.error.as_ref().unwrap().message() == "bad udf")
    );
}

/// Whether a batch reached the transport is the core's typed answer (its ticket), never
/// a counter the driver compares.
#[test]
fn each_batch_is_transmitted_or_dropped_by_its_ticket() {
    let mut c = data_core();
    let DataSent::Queued(first) = c.send_data(b("out1")).unwrap() else {
        panic!("queued")
    };
    let DataSent::Queued(second) = c.send_data(b("out2")).unwrap() else {
        panic!("queued")
    };
    assert_eq!(c.delivery(first), Delivery::Queued);
    assert!(c.poll_transmit().is_some());
    assert_eq!(c.delivery(first), Delivery::Transmitted);
    assert_eq!(c.delivery(second), Delivery::Queued);
    c.handle_request(UdfRequest::cancel(None));
    assert_eq!(
        c.delivery(first),
        Delivery::Transmitted,
        "already handed over"
    );
    assert_eq!(
        c.delivery(second),
        Delivery::Dropped,
        "R7: dropped by the Cancel"
    );

    // A failed connection drops what is still queued (R8).
    let mut c = data_core();
    let DataSent::Queued(ticket) = c.send_data(b("out")).unwrap() else {
        panic!("queued")
    };
    c.handle_connection_error(ConnectionError::Closed);
    assert_eq!(c.delivery(ticket), Delivery::Dropped);
}

#[test]
fn cancel_in_the_data_phase_drops_queued_output_and_unread_input() {
    let mut c = data_core();
    c.handle_request(data_request("in1"));
    c.handle_request(data_request("in2"));
    assert!(matches!(c.send_data(b("out1")), Ok(DataSent::Queued(_))));
    c.handle_request(UdfRequest::cancel(Some("stop".into())));
    assert_eq!(c.phase(), WorkerPhase::Cancelling);
    assert_eq!(c.pop_input(), None);
    assert!(!c.has_transmit(), "queued DataResponse dropped");
    assert_eq!(c.send_data(b("out2")), Ok(DataSent::Dropped));
    c.handle_request(UdfRequest::cancel(None));
    assert_eq!(c.stats().duplicate_cancels, 1);
    c.fail(ExecutionError::user("while cancelling")).unwrap();
    c.cancelled(CancelResponse::default()).unwrap();
    let out = drain_responses(&mut c);
    assert!(
        matches!(&out[..], [ResponseMessage::Cancel(r)] if r.error.as_ref().unwrap().message() == "while cancelling")
    );
    assert!(
        matches!(c.outcome(), Some(EndpointOutcome::Cancelled { reason: Some(r), .. }) if r == "stop")
    );
    let stats = c.stats();
    assert_eq!((stats.input_discarded, stats.output_dropped), (2, 2));
}

#[test]
fn r5c_cancel_after_finish_before_the_finish_response_gets_a_cancel_response() {
    let mut c = draining();
    assert!(matches!(
        c.send_data(b("trailing")),
        Ok(DataSent::Queued(_))
    ));
    c.handle_request(UdfRequest::cancel(None));
    assert_eq!(c.phase(), WorkerPhase::Cancelling);
    let metrics = status_ok();
    // The Cancel is answered with a CancelResponse, never a FinishResponse.
    assert_eq!(
        c.finish(FinishResponse::default()).unwrap_err().call,
        "finish"
    );
    c.cancelled(CancelResponse {
        metrics: metrics.clone(),
        ..Default::default()
    })
    .unwrap();
    let out = drain_responses(&mut c);
    assert!(
        matches!(&out[..], [ResponseMessage::Cancel(r)] if r.metrics == metrics),
        "{out:?}"
    );
    assert_eq!(c.outcome().unwrap().kind(), OutcomeKind::Cancelled);
}

#[test]
fn r5c_cancel_after_the_finish_response_is_ignored() {
    let mut c = draining();
    c.finish(FinishResponse::default()).unwrap();
    c.handle_request(UdfRequest::cancel(None));
    assert_eq!(kinds(&drain_responses(&mut c)), [ResponseKind::Finish]);
    assert_eq!(c.outcome().unwrap().kind(), OutcomeKind::Finished);
    assert_eq!(c.stats().ignored_after_done, 1);
}

#[test]
fn post_error_ignores_racing_data_and_finish_until_the_cancel() {
    let mut c = data_core();
    c.handle_request(data_request("unread"));
    assert!(matches!(
        c.send_data(b("before error")),
        Ok(DataSent::Queued(_))
    ));
    c.fail(user_error("boom", "ValueError")).unwrap();
    assert_eq!(c.send_data(b("after error")), Ok(DataSent::Dropped));
    assert_eq!(
        c.fail(ExecutionError::user("second")).unwrap_err().call,
        "fail"
    );
    assert_eq!(c.pop_input(), None, "unread input dropped");
    assert_eq!(
        kinds(&drain_responses(&mut c)),
        [ResponseKind::Data, ResponseKind::Error],
        "output before the error"
    );
    c.handle_request(data_request("in flight"));
    c.handle_request(UdfRequest::finish());
    assert_eq!(c.phase(), WorkerPhase::PostError);
    assert_eq!(c.stats().ignored_after_error, 2);
    c.handle_request(UdfRequest::cancel(None));
    c.cancelled(CancelResponse::default()).unwrap();
    assert_eq!(kinds(&drain_responses(&mut c)), [ResponseKind::Cancel]);
    assert_eq!(
        c.outcome().unwrap().reported_error().unwrap().error_class(),
        Some("ValueError")
    );
}

#[test]
fn user_calls_out_of_phase_are_misuse() {
    let mut c = WorkerCore::default();
    assert_eq!(c.send_data(b("x")).unwrap_err().call, "send_data");
    assert!(c.accept_init(None).is_err());
    assert!(c.reject_init(worker_error("x")).is_err());
    assert!(c.fail(worker_error("x")).is_err());
    assert!(c.finish(FinishResponse::default()).is_err());
    assert!(c.cancelled(CancelResponse::default()).is_err());
    let mut c = init_pending();
    assert!(
        c.send_data(b("x")).is_err(),
        "no DataResponse before InitResponse (R2)"
    );
    assert!(c.fail(worker_error("x")).is_err());
    let mut c = data_core();
    assert!(c.accept_init(None).is_err(), "one InitResponse");
    assert!(
        c.finish(FinishResponse::default()).is_err(),
        "Finish not received"
    );
    assert!(!c.has_transmit());
}

// ---------------------------------------------------------------------------------------------
// Transport (R8)
// ---------------------------------------------------------------------------------------------

#[test]
fn transport_failure_ends_the_session_silently() {
    let mut c = data_core();
    assert!(matches!(c.send_data(b("unsent")), Ok(DataSent::Queued(_))));
    c.handle_connection_error(ConnectionError::Closed);
    assert!(!c.has_transmit());
    assert_eq!(c.outcome().unwrap().kind(), OutcomeKind::TransportFailed);
    c.handle_request(UdfRequest::cancel(None));
    assert!(!c.has_transmit());

    // Once the terminator was handed over, a failure changes nothing.
    let mut c = draining();
    c.finish(FinishResponse::default()).unwrap();
    drain_responses(&mut c);
    c.handle_connection_error(ConnectionError::Closed);
    c.handle_stream_end();
    assert_eq!(c.outcome().unwrap().kind(), OutcomeKind::Finished);

    // A terminator still queued is lost: the outcome says so.
    let mut c = draining();
    c.finish(FinishResponse::default()).unwrap();
    c.handle_connection_error(ConnectionError::Closed);
    assert_eq!(c.outcome().unwrap().kind(), OutcomeKind::TransportFailed);
}

// ---------------------------------------------------------------------------------------------
// Property test: arbitrary request sequences and user calls
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Init {
        version: Option<u32>,
        format: i32,
        chunking: bool,
        payload: Vec<u8>,
        size: Option<i64>,
        crc: Option<bool>,
    },
    Chunk {
        data: Vec<u8>,
        last: bool,
    },
    Data(Vec<u8>),
    Finish,
    Cancel,
    EmptyRequest,
    EmptyControl,
    StreamEnd,
    ConnectionError,
    CancelTimeout,
    /// Hands everything queued to the "transport".
    Transmit,
    Accept,
    Reject,
    Send(Vec<u8>),
    Fail,
    UserFinish,
    UserCancelled,
}

fn step() -> impl Strategy<Value = Step> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..3);
    prop_oneof![
        1 => (
            prop_oneof![3 => Just(None), 2 => Just(Some(1)), 1 => (0u32..3).prop_map(Some)],
            prop_oneof![6 => Just(1), 1 => Just(0), 1 => Just(9)],
            any::<bool>(),
            bytes(),
            prop_oneof![3 => Just(None), 1 => (-1i64..4).prop_map(Some)],
            prop_oneof![3 => Just(None), 2 => Just(Some(true)), 1 => Just(Some(false))],
        )
            .prop_map(|(version, format, chunking, payload, size, crc)| Step::Init {
                version, format, chunking, payload, size, crc
            }),
        2 => (bytes(), any::<bool>()).prop_map(|(data, last)| Step::Chunk { data, last }),
        6 => bytes().prop_map(Step::Data),
        2 => Just(Step::Finish),
        2 => Just(Step::Cancel),
        1 => prop_oneof![Just(Step::EmptyRequest), Just(Step::EmptyControl)],
        1 => Just(Step::StreamEnd),
        1 => Just(Step::ConnectionError),
        1 => Just(Step::CancelTimeout),
        4 => Just(Step::Transmit),
        3 => Just(Step::Accept),
        1 => Just(Step::Reject),
        6 => bytes().prop_map(Step::Send),
        1 => Just(Step::Fail),
        2 => Just(Step::UserFinish),
        2 => Just(Step::UserCancelled),
    ]
}

/// A step sequence; most start like a correct engine (a valid Init, chunked or not, and the
/// user's answer) so the later phases are explored too.
fn session() -> impl Strategy<Value = Vec<Step>> {
    let good_start = (
        any::<bool>(),
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..3), 1..3),
    )
        .prop_map(|(chunked, chunks)| {
            let total = chunks.concat();
            let mut steps = vec![Step::Init {
                version: None,
                format: 1,
                chunking: chunked,
                payload: if chunked { Vec::new() } else { total.clone() },
                size: Some(total.len() as i64),
                crc: Some(true),
            }];
            if chunked {
                let n = chunks.len();
                steps.extend(chunks.into_iter().enumerate().map(|(i, data)| Step::Chunk {
                    data,
                    last: i + 1 == n,
                }));
            }
            steps.push(Step::Accept);
            steps
        });
    let prefix = prop_oneof![1 => Just(Vec::new()), 4 => good_start];
    (prefix, proptest::collection::vec(step(), 0..40)).prop_map(|(mut p, rest)| {
        p.extend(rest);
        p
    })
}

/// A test driver: applies steps, records what the transport got, and notes where the first
/// Cancel arrived (in the transmitted log) while the session was still live.
struct Harness {
    core: WorkerCore,
    log: Vec<ResponseMessage>,
    /// `Some(n)`: a Cancel arrived when `n` messages had been handed over.
    cancel_at: Option<usize>,
    connection_failed: bool,
}

impl Harness {
    fn transmit(&mut self) {
        if self.connection_failed {
            return;
        }
        while let Some(r) = self.core.poll_transmit() {
            self.log.push(
                r.into_message()
                    .expect("the worker never sends an empty oneof"),
            );
        }
    }

    fn apply(&mut self, step: Step) {
        let c = &mut self.core;
        match step {
            Step::Init {
                version,
                format,
                chunking,
                payload,
                size,
                crc,
            } => {
                let crc32 = crc32fast::hash(&payload);
                let mut i = init(payload);
                let udf = i.udf.as_mut().expect("the fixture sets udf");
                udf.payload_size = size;
                udf.payload_crc32 = crc.map(|ok| if ok { crc32 } else { crc32 ^ 1 });
                i.protocol_version = version;
                i.data_format = format;
                i.is_chunking_payload = chunking.then_some(true);
                c.handle_request(UdfRequest::init(i));
            }
            Step::Chunk { data, last } => {
                c.handle_request(UdfRequest::payload_chunk(Bytes::from(data), last))
            }
            Step::Data(d) => c.handle_request(UdfRequest::data(Bytes::from(d))),
            Step::Finish => c.handle_request(UdfRequest::finish()),
            Step::Cancel => {
                if !c.is_done() && c.cancel_received().is_none() {
                    self.cancel_at = Some(self.log.len());
                }
                c.handle_request(UdfRequest::cancel(None));
            }
            Step::EmptyRequest => c.handle_request(empty_request()),
            Step::EmptyControl => c.handle_request(empty_control_request()),
            Step::StreamEnd => c.handle_stream_end(),
            Step::ConnectionError => {
                c.handle_connection_error(ConnectionError::Closed);
                if c.outcome()
                    .is_some_and(|o| o.kind() == OutcomeKind::TransportFailed)
                {
                    self.connection_failed = true;
                }
            }
            Step::CancelTimeout => {
                // Let the deadline (if one runs) expire: the R4 Cancel wait, or the wait
                // for the Init, which ends the session like a dead connection.
                let now = std::time::Instant::now();
                c.begin_wait(now);
                if let Some(at) = c.poll_timeout() {
                    c.handle_timeout(at);
                }
                if c.outcome()
                    .is_some_and(|o| o.kind() == OutcomeKind::TransportFailed)
                {
                    self.connection_failed = true;
                }
            }
            Step::Transmit => self.transmit(),
            Step::Accept => drop(c.accept_init(Some(Bytes::from_static(b"i")))),
            Step::Reject => drop(c.reject_init(worker_error("reject"))),
            Step::Send(d) => drop(c.send_data(Bytes::from(d))),
            Step::Fail => drop(c.fail(ExecutionError::user("fail"))),
            Step::UserFinish => drop(c.finish(FinishResponse::default())),
            Step::UserCancelled => drop(c.cancelled(CancelResponse::default())),
        }
        assert_eq!(
            self.core.is_done(),
            self.core.outcome().is_some(),
            "Done iff an outcome"
        );
    }
}

fn is_terminator(m: &ResponseMessage) -> bool {
    matches!(m, ResponseMessage::Finish(_) | ResponseMessage::Cancel(_))
}

fn carries_error(m: &ResponseMessage) -> bool {
    matches!(m, ResponseMessage::Error(_))
        || matches!(m, ResponseMessage::Init(r) if r.error.is_some())
}

fn check_invariants(h: &Harness) {
    let log = &h.log;
    let inits: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, ResponseMessage::Init(_)))
        .map(|(i, _)| i)
        .collect();
    assert!(inits.len() <= 1, "at most one InitResponse: {log:?}");
    assert!(
        log.iter().filter(|m| carries_error(m)).count() <= 1,
        "at most one reported error: {log:?}"
    );
    let terminators: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, m)| is_terminator(m))
        .map(|(i, _)| i)
        .collect();
    assert!(terminators.len() <= 1, "at most one terminator: {log:?}");
    if let Some(&t) = terminators.first() {
        assert_eq!(t, log.len() - 1, "nothing after the terminator: {log:?}");
    }
    let mut init_ok = false;
    let mut errored = false;
    for (i, m) in log.iter().enumerate() {
        match m {
            ResponseMessage::Init(r) => {
                init_ok = r.error.is_none();
                errored |= r.error.is_some();
            }
            ResponseMessage::Data(_) => {
                assert!(
                    init_ok,
                    "DataResponse only after a successful InitResponse: {log:?}"
                );
                assert!(!errored, "no DataResponse after an error: {log:?}");
                if let Some(at) = h.cancel_at {
                    assert!(i < at, "no DataResponse after the Cancel: {log:?}");
                }
            }
            ResponseMessage::Error(_) => {
                assert!(
                    inits.first().is_some_and(|&first| first < i),
                    "ErrorResponse after InitResponse: {log:?}"
                );
                errored = true;
            }
            ResponseMessage::Finish(_) => {
                assert!(
                    h.cancel_at.is_none_or(|at| i < at),
                    "after a live Cancel the terminator is CancelResponse: {log:?}"
                );
                assert!(!errored, "no FinishResponse after an error: {log:?}");
            }
            ResponseMessage::Cancel(_) => {}
        }
    }
    match h.core.outcome() {
        Some(EndpointOutcome::TransportFailed(_)) => {}
        Some(outcome) => {
            let last = log.last().expect("a settled session sent its terminator");
            assert!(is_terminator(last), "ends with a terminator: {log:?}");
            match outcome {
                EndpointOutcome::Finished => assert!(matches!(last, ResponseMessage::Finish(_))),
                _ => assert!(
                    matches!(last, ResponseMessage::Cancel(_)),
                    "{outcome} ends with CancelResponse: {log:?}"
                ),
            }
            if let EndpointOutcome::ProtocolViolation(v) = outcome {
                let text = v.wire_message();
                assert!(
                    log.iter()
                        .any(|m| protocol_message(m) == Some(text.as_str())),
                    "a violation reports its ProtocolError {text:?}: {log:?}"
                );
            }
        }
        None => assert!(terminators.is_empty(), "no terminator while live: {log:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_sequences_keep_the_invariants(steps in session()) {
        let mut h = Harness { core: WorkerCore::default(), log: Vec::new(), cancel_at: None, connection_failed: false };
        for s in steps {
            h.apply(s);
        }
        h.transmit();
        check_invariants(&h);
    }

    #[test]
    fn well_formed_sessions_finish(batches in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..4), 0..8),
                                   chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..4), 0..4)) {
        // A correct engine with an echoing user: always Finished, output = input.
        let mut h = Harness { core: WorkerCore::default(), log: Vec::new(), cancel_at: None, connection_failed: false };
        let total: Vec<u8> = chunks.concat();
        let i = if chunks.is_empty() { init("") } else { chunking_init("", &total) };
        h.core.handle_request(UdfRequest::init(i));
        for (n, chunk) in chunks.iter().enumerate() {
            h.core.handle_request(UdfRequest::payload_chunk(Bytes::from(chunk.clone()), n + 1 == chunks.len()));
        }
        prop_assert_eq!(h.core.phase(), WorkerPhase::InitPending);
        prop_assert_eq!(&h.core.init().unwrap().udf.as_ref().unwrap().payload[..], &total[..]);
        h.core.accept_init(None).unwrap();
        for batch in &batches {
            h.core.handle_request(UdfRequest::data(Bytes::from(batch.clone())));
            let input = h.core.pop_input().unwrap();
            assert!(matches!(h.core.send_data(input), Ok(DataSent::Queued(_))));
        }
        h.core.handle_request(UdfRequest::finish());
        h.core.finish(FinishResponse::default()).unwrap();
        h.transmit();
        check_invariants(&h);
        prop_assert_eq!(h.core.outcome().map(EndpointOutcome::kind), Some(OutcomeKind::Finished));
        let echoed: Vec<Vec<u8>> = h.log.iter().filter_map(|m| match m {
            ResponseMessage::Data(d) => Some(d.to_vec()),
            _ => None,
        }).collect();
        prop_assert_eq!(echoed, batches);
    }
}
