//! Helpers shared by the integration suites: a raw "engine script" that speaks the
//! `Execute` stream message by message, message builders and assertions, and (in [`echo`])
//! the reference echo worker of udf §2.1.
#![allow(
    dead_code,
    reason = "each integration suite uses a different subset of the helpers"
)]

pub mod echo;

use std::time::Duration;

use bytes::Bytes;
use futures::future::poll_fn;
use tether::connection::framed::FramedError;
use tether::connection::{Connection, ConnectionError, MemoryConnection};
use tether::wire::{
    ExecutionError, Init, ResponseKind, ResponseMessage, UdfPayload, UdfRequest, UdfResponse,
    UdfWorkerDataFormat, execution_error,
};
use tether::worker::engine::{SessionError, TransportFailure};

/// How long a script waits for the next worker message before failing the test. Under
/// `start_paused` tokio skips idle time, so this costs nothing when the worker is silent.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(5);

/// The engine end of an in-memory `Execute` stream, driven by hand: send any `UdfRequest`
/// (including malformed ones), receive every `UdfResponse` exactly as the worker sent it.
pub struct EngineScript {
    conn: MemoryConnection<UdfRequest, UdfResponse>,
}

impl EngineScript {
    /// Wraps the engine end of a [`tether::connection::pair`].
    pub fn new(conn: MemoryConnection<UdfRequest, UdfResponse>) -> Self {
        EngineScript { conn }
    }

    /// Sends one request, waiting for capacity.
    pub async fn try_send(&mut self, request: UdfRequest) -> Result<(), ConnectionError> {
        poll_fn(|cx| self.conn.poll_ready(cx)).await?;
        self.conn.start_send(request)?;
        poll_fn(|cx| self.conn.poll_flush(cx)).await
    }

    /// Sends one request; panics if the connection is gone.
    pub async fn send(&mut self, request: UdfRequest) {
        let kind = request.kind();
        self.try_send(request)
            .await
            .unwrap_or_else(|e| panic!("engine could not send {kind:?}: {e}"));
    }

    /// Sends every request in order.
    pub async fn send_all(&mut self, requests: impl IntoIterator<Item = UdfRequest>) {
        for r in requests {
            self.send(r).await;
        }
    }

    /// The next worker message, or `None` when the worker ended its response stream. Panics
    /// after [`RECV_TIMEOUT`] of silence or on a transport error.
    pub async fn recv_opt(&mut self) -> Option<ResponseMessage> {
        let next = tokio::time::timeout(RECV_TIMEOUT, poll_fn(|cx| self.conn.poll_recv(cx)))
            .await
            .expect("timed out waiting for the worker");
        next.map(|r| {
            r.expect("transport error on the engine side")
                .into_message()
                .expect("the worker sent an empty oneof")
        })
    }

    /// The next worker message; panics if the stream ended.
    pub async fn recv(&mut self) -> ResponseMessage {
        self.recv_opt().await.expect("the worker ended its stream")
    }

    /// Every worker message up to the end of its response stream.
    pub async fn recv_to_end(&mut self) -> Vec<ResponseMessage> {
        let mut all = Vec::new();
        while let Some(m) = self.recv_opt().await {
            all.push(m);
        }
        all
    }

    /// Asserts the worker sends nothing (and keeps its stream open) for `quiet`.
    pub async fn expect_silence(&mut self, quiet: Duration) {
        if let Ok(next) = tokio::time::timeout(quiet, poll_fn(|cx| self.conn.poll_recv(cx))).await {
            panic!(
                "expected silence, the worker sent {:?}",
                next.map(|r| r.map(|m| m.kind()))
            );
        }
    }

    /// Half-closes the request side (the worker sees its request stream end).
    pub async fn close_requests(&mut self) {
        poll_fn(|cx| self.conn.poll_close(cx))
            .await
            .expect("half-close");
    }

    /// Drops both directions abruptly, like a crashed engine.
    pub fn abort(&mut self) {
        self.conn.abort();
    }
}

/// The framed transport's error behind an engine session error (the connection error's
/// source); panics on any other error.
pub fn framed_error(error: &SessionError) -> &FramedError {
    match error {
        SessionError::Transport(TransportFailure::Connection(ConnectionError::Transport(
            cause,
        ))) => cause
            .downcast_ref::<FramedError>()
            .unwrap_or_else(|| panic!("not a FramedError: {cause}")),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------------

/// `Bytes` from a string.
pub fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// An Arrow `Init` with `payload` inline (format tag `"echo"`), nothing else set.
pub fn init(payload: &str) -> Init {
    Init::new(
        UdfWorkerDataFormat::Arrow,
        UdfPayload::new(b(payload), "echo"),
    )
}

/// `Init` with an empty inline payload, `is_chunking_payload`, `payload_size` and
/// `payload_crc32` set, followed by `payload` split into `chunks` non-empty `PayloadChunk`s
/// (the last with `last = true`).
pub fn chunked_init(payload: &str, chunks: usize) -> Vec<UdfRequest> {
    assert!(chunks >= 1 && payload.len() >= chunks);
    let mut i = init("");
    i.is_chunking_payload = Some(true);
    let udf = i.udf.as_mut().unwrap();
    udf.payload_size = Some(payload.len() as i64);
    udf.payload_crc32 = Some(crc32fast::hash(payload.as_bytes()));
    let mut requests = vec![UdfRequest::init(i)];
    let size = payload.len().div_ceil(chunks);
    let pieces: Vec<&[u8]> = payload.as_bytes().chunks(size).collect();
    assert_eq!(
        pieces.len(),
        chunks,
        "choose a payload that splits into {chunks} chunks"
    );
    let n = pieces.len();
    for (k, piece) in pieces.into_iter().enumerate() {
        requests.push(UdfRequest::payload_chunk(
            Bytes::copy_from_slice(piece),
            k + 1 == n,
        ));
    }
    requests
}

// ---------------------------------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------------------------------

/// The kinds of `messages`, in order.
pub fn kinds(messages: &[ResponseMessage]) -> Vec<ResponseKind> {
    messages.iter().map(ResponseMessage::kind).collect()
}

/// The payloads of the `DataResponse`s among `messages`, as strings, in order.
pub fn data_strings(messages: &[ResponseMessage]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| match m {
            ResponseMessage::Data(d) => Some(String::from_utf8_lossy(d).into_owned()),
            _ => None,
        })
        .collect()
}

/// Asserts `msg` is an `InitResponse` without error.
pub fn assert_init_ok(msg: &ResponseMessage) {
    match msg {
        ResponseMessage::Init(r) => {
            assert!(r.error.is_none(), "InitResponse carries an error: {r:?}")
        }
        other => panic!("expected InitResponse, got {other:?}"),
    }
}

/// The error of an `InitResponse`; panics on anything else.
pub fn init_error(msg: &ResponseMessage) -> &ExecutionError {
    match msg {
        ResponseMessage::Init(r) => r.error.as_ref().expect("InitResponse without error"),
        other => panic!("expected InitResponse(error), got {other:?}"),
    }
}

/// The error of an `ErrorResponse`; panics on anything else.
pub fn error_response(msg: &ResponseMessage) -> &ExecutionError {
    match msg {
        ResponseMessage::Error(r) => r.error.as_ref().expect("ErrorResponse without error"),
        other => panic!("expected ErrorResponse, got {other:?}"),
    }
}

/// Asserts `msg` is a `CancelResponse` and returns it.
pub fn cancel_response(msg: &ResponseMessage) -> &tether::wire::CancelResponse {
    match msg {
        ResponseMessage::Cancel(r) => r,
        other => panic!("expected CancelResponse, got {other:?}"),
    }
}

/// Asserts `msg` is a `FinishResponse` and returns it.
pub fn finish_response(msg: &ResponseMessage) -> &tether::wire::FinishResponse {
    match msg {
        ResponseMessage::Finish(r) => r,
        other => panic!("expected FinishResponse, got {other:?}"),
    }
}

/// Asserts `e` is a `ProtocolError` with exactly `message` (what the engine receives: pass
/// `EngineViolation::wire_message()` or `InitRejection::wire_message()`).
pub fn assert_protocol_error(e: &ExecutionError, message: &str) {
    match &e.kind {
        Some(execution_error::Kind::Protocol(p)) => assert_eq!(p.message, message),
        _ => panic!("expected ProtocolError({message:?}), got {e}"),
    }
}

/// Asserts `e` is a `WorkerError` with exactly `message`.
pub fn assert_worker_error(e: &ExecutionError, message: &str) {
    match &e.kind {
        Some(execution_error::Kind::Worker(w)) => assert_eq!(w.message, message),
        _ => panic!("expected WorkerError({message:?}), got {e}"),
    }
}

/// Asserts `e` is a `UserError` with `error_class`.
pub fn assert_user_error(e: &ExecutionError, error_class: &str) {
    match &e.kind {
        Some(execution_error::Kind::User(u)) => {
            assert_eq!(u.error_class.as_deref(), Some(error_class))
        }
        _ => panic!("expected UserError[{error_class}], got {e}"),
    }
}
