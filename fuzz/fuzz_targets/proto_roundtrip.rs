//! Protobuf decode → encode → decode for every message type of the UDF protocol (udf §1,
//! the worker specification of udf §1.9) and of the Spark Connect subset (rx §1): a value
//! decoded from any bytes re-encodes to exactly `encoded_len` bytes, decodes back to an
//! equal value, and re-encodes to the same bytes (prost drops unknown fields and merges
//! repeated singular fields, so the comparison is on values, never on the input bytes).
//! The flattened views must agree with the envelopes: `kind()` is `Some` exactly when
//! `into_message` succeeds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tether::wire::connect::{self, execute_plan_request, execute_plan_response};
use tether::wire::{self as w};

fn roundtrip<M: Message + Default + PartialEq + Clone>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    let enc = m.encode_to_vec();
    assert_eq!(
        enc.len(),
        m.encoded_len(),
        "encoded_len disagrees with encode"
    );
    let back = M::decode(enc.as_slice()).expect("a re-encoded message decodes");
    assert!(back == m, "decode(encode(m)) != m");
    assert_eq!(back.encode_to_vec(), enc, "encoding is not stable");
    // The length-delimited form carries the same value.
    let delimited = m.encode_length_delimited_to_vec();
    assert!(M::decode_length_delimited(delimited.as_slice()).expect("delimited") == m);
    Some(m)
}

macro_rules! all {
    ($sel:expr, $bytes:expr; $($t:ty),* $(,)?) => {{
        let types: &[fn(&[u8])] = &[$(|b| { let _ = roundtrip::<$t>(b); }),*];
        types[usize::from($sel) % types.len()]($bytes);
    }};
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    // The two envelopes also check their flattened views.
    match sel {
        0 => {
            if let Some(r) = roundtrip::<w::UdfRequest>(bytes) {
                assert_eq!(
                    r.kind().is_some(),
                    r.into_message().is_ok(),
                    "kind ⇔ into_message"
                );
            }
        }
        1 => {
            if let Some(r) = roundtrip::<w::UdfResponse>(bytes) {
                assert_eq!(
                    r.kind().is_some(),
                    r.into_message().is_ok(),
                    "kind ⇔ into_message"
                );
            }
        }
        _ => all_types(sel, bytes),
    }
});

fn all_types(sel: u8, bytes: &[u8]) {
    all!(sel, bytes;
        // udf §1.2–§1.8
        w::UdfRequest, w::UdfResponse, w::UdfControlRequest, w::UdfControlResponse,
        w::Init, w::UdfPayload, w::InitResponse, w::PayloadChunk, w::DataRequest,
        w::DataResponse, w::Finish, w::FinishResponse, w::Cancel, w::CancelResponse,
        w::ErrorResponse, w::ExecutionError, w::UserError, w::WorkerError, w::ProtocolError,
        w::WorkerRequest, w::WorkerResponse, w::Heartbeat, w::HeartbeatResponse,
        w::ShutdownRequest, w::ShutdownResponse,
        // udf §1.9
        w::UdfWorkerSpecification, w::WorkerEnvironment, w::WorkerCapabilities,
        w::DirectWorker, w::UdfWorkerProperties, w::WorkerConnectionSpec,
        w::UnixDomainSocket, w::LocalTcpConnection, w::ProcessCallable,
        // Spark Connect (rx §1)
        connect::Any, connect::UserContext, connect::Plan, connect::ReattachOptions,
        connect::ExecutePlanRequest, execute_plan_request::RequestOption,
        connect::ExecutePlanResponse, execute_plan_response::ArrowBatch,
        execute_plan_response::ResultComplete, execute_plan_response::ExecutionProgress,
        execute_plan_response::StageInfo, connect::ReattachExecuteRequest,
        connect::ReleaseExecuteRequest, connect::release_execute_request::ReleaseAll,
        connect::release_execute_request::ReleaseUntil, connect::ReleaseExecuteResponse,
        connect::InterruptRequest, connect::InterruptResponse,
        connect::ReleaseSessionRequest, connect::ReleaseSessionResponse,
    );
}
