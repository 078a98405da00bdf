//! The UDF-protocol message fixtures and the assertions on them, written once for every
//! suite (udf §1): an `Init` with its payload (inline or chunked, udf §1.3), the malformed
//! envelopes (udf §1.2), the worker's answers (`InitResponse`, `DataResponse`, the terminal
//! responses, udf §1.4–§1.5), tagged batches whose tag survives a round trip, the three kinds
//! of `ExecutionError`, session and endpoint configurations with test timeouts (udf §7), and
//! manual-clock helpers.
//!
//! The Spark Connect request builders live beside them in
//! [`connect`](super::connect).
//!
//! ```
//! use tether_testing::fixtures::{self, TEST_INIT, TEST_TERMINAL};
//! use tether::wire::{RequestKind, ResponseKind};
//!
//! let init = fixtures::init_request("udf");
//! assert_eq!(init.kind(), Some(RequestKind::Init));
//! assert_eq!(fixtures::init_ok().kind(), Some(ResponseKind::Init));
//!
//! let batch = fixtures::tagged(7, 1024);
//! assert_eq!(fixtures::tag_of(&batch), Some(7));
//!
//! let config = fixtures::session_config();
//! assert_eq!((config.init_timeout, config.terminal_timeout), (TEST_INIT, TEST_TERMINAL));
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use tether::time::{ManualClock, NoTimeouts};
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, Init, InitResponse, ResponseKind,
    ResponseMessage, UdfControlRequest, UdfPayload, UdfRequest, UdfResponse, UdfWorkerDataFormat,
    execution_error, udf_request,
};
use tether::worker::endpoint::{EndpointConfig, WorkerCore};
use tether::worker::engine::{CountingHandle, SessionConfig, WorkerHandle};

// ---------------------------------------------------------------------------------------------
// Requests (engine → worker)
// ---------------------------------------------------------------------------------------------

/// The format tag of every fixture `Init`'s `UdfPayload` (udf §1.3 `UdfPayload.format`).
pub const INIT_FORMAT: &str = "echo";

/// `Bytes` from a string: the payload of a data batch or an `Init` (udf §1.4).
pub fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// An Arrow `Init` with `payload` inline (format tag [`INIT_FORMAT`]), nothing else set
/// (udf §1.3).
pub fn init(payload: impl Into<Bytes>) -> Init {
    Init::new(
        UdfWorkerDataFormat::Arrow,
        UdfPayload::new(payload, INIT_FORMAT),
    )
}

/// [`init`] in its request envelope (udf §1.2).
pub fn init_request(payload: impl Into<Bytes>) -> UdfRequest {
    UdfRequest::init(init(payload))
}

/// An `Init` that announces a chunked payload (udf §1.3: `is_chunking_payload`,
/// `payload_size`, `payload_crc32` set, the inline payload empty), followed by `payload`
/// split into `chunks` non-empty `PayloadChunk`s, the last with `last = true`.
///
/// # Panics
///
/// When `payload` does not split into exactly `chunks` non-empty pieces.
pub fn chunked_init(payload: &str, chunks: usize) -> Vec<UdfRequest> {
    assert!(
        chunks >= 1 && payload.len() >= chunks,
        "choose a payload of at least {chunks} bytes"
    );
    let init = chunking_init(Bytes::new(), payload.as_bytes());
    let size = payload.len().div_ceil(chunks);
    let pieces: Vec<&[u8]> = payload.as_bytes().chunks(size).collect();
    assert_eq!(
        pieces.len(),
        chunks,
        "choose a payload that splits into {chunks} chunks"
    );
    let last = pieces.len() - 1;
    std::iter::once(UdfRequest::init(init))
        .chain(
            pieces.into_iter().enumerate().map(|(k, piece)| {
                UdfRequest::payload_chunk(Bytes::copy_from_slice(piece), k == last)
            }),
        )
        .collect()
}

/// The `Init` of a chunked payload `total` whose first part, `inline`, travels inline: an
/// Arrow [`init`] with `is_chunking_payload` set and `payload_size` and `payload_crc32` of
/// the whole of `total` (udf §1.3: the worker appends each `PayloadChunk` to the inline
/// payload and verifies size and CRC once the last chunk arrived). The chunks are the
/// caller's to send; [`chunked_init`] sends them for an empty inline part.
pub fn chunking_init(inline: impl Into<Bytes>, total: &[u8]) -> Init {
    let mut init = init(inline);
    init.is_chunking_payload = Some(true);
    if let Some(udf) = init.udf.as_mut() {
        udf.payload_size = Some(total.len() as i64);
        udf.payload_crc32 = Some(crc32fast::hash(total));
    }
    init
}

/// A `DataRequest` carrying `s` (udf §1.4).
pub fn data_request(s: &str) -> UdfRequest {
    UdfRequest::data(b(s))
}

/// The batches `items` as `Bytes`, in order (udf §1.4 `DataRequest.data`).
pub fn batches(items: &[&str]) -> Vec<Bytes> {
    items.iter().map(|s| b(s)).collect()
}

/// A request envelope with no branch set: malformed (udf §1.2: exactly one branch must be
/// set), a protocol-error close at the worker (udf §2.1 "empty oneofs").
pub fn empty_request() -> UdfRequest {
    UdfRequest { request: None }
}

/// A control request with no control message set: malformed like [`empty_request`], one
/// level down (udf §1.2, §2.1 "empty oneofs").
pub fn empty_control_request() -> UdfRequest {
    UdfRequest {
        request: Some(udf_request::Request::Control(UdfControlRequest {
            control: None,
        })),
    }
}

// ---------------------------------------------------------------------------------------------
// Tagged batches
// ---------------------------------------------------------------------------------------------

/// `len` deterministic bytes that differ per `seed`: large messages whose corruption,
/// truncation or reordering a comparison sees (udf §1.4 batches of any size).
pub fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 13) as u8))
        .collect::<Vec<u8>>()
        .into()
}

/// A batch of `len` bytes (at least 8) that carries `tag` in its first eight bytes
/// (big-endian) and a [`pattern`] after them: an echo's output names the input it came from,
/// so a test sees a batch lost, duplicated or reordered (udf §2.1 echo order).
///
/// # Panics
///
/// When `len` is below 8.
pub fn tagged(tag: u64, len: usize) -> Bytes {
    assert!(len >= 8, "a tagged batch needs 8 bytes for its tag");
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&tag.to_be_bytes());
    out.extend_from_slice(&pattern(len - 8, tag as u8));
    out.into()
}

/// The tag of a [`tagged`] batch: `None` when it is shorter than a tag or its body is not the
/// tag's pattern (udf §2.1: the echo returns each batch unchanged).
pub fn tag_of(batch: &[u8]) -> Option<u64> {
    let (head, body) = batch.split_at_checked(8)?;
    let tag = u64::from_be_bytes(head.try_into().ok()?);
    (body == pattern(body.len(), tag as u8)).then_some(tag)
}

/// The tags of `batches`, in order; panics on a batch that is not [`tagged`] (udf §2.1).
pub fn tags(batches: &[Bytes]) -> Vec<u64> {
    batches
        .iter()
        .map(|b| tag_of(b).unwrap_or_else(|| panic!("not a tagged batch: {} bytes", b.len())))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Responses (worker → engine) and errors
// ---------------------------------------------------------------------------------------------

/// An `InitResponse` without error or data: the worker accepted `Init` (udf §1.3).
pub fn init_ok() -> UdfResponse {
    UdfResponse::init(InitResponse::default())
}

/// An `InitResponse` that rejects `Init` with `error` (udf §1.3, §4.6).
pub fn init_failed(error: ExecutionError) -> UdfResponse {
    UdfResponse::init(InitResponse {
        data: None,
        error: Some(error),
    })
}

/// A `DataResponse` carrying `s` (udf §1.4).
pub fn data(s: &str) -> UdfResponse {
    UdfResponse::data(b(s))
}

/// `{status = ok}`: the metrics of the reference echo worker's `FinishResponse` (udf §2.1).
pub fn status_ok() -> BTreeMap<String, String> {
    BTreeMap::from([("status".to_owned(), "ok".to_owned())])
}

/// The reference echo worker's `FinishResponse`: no data, metrics [`status_ok`] (udf §2.1).
pub fn finish_ok() -> FinishResponse {
    FinishResponse {
        metrics: status_ok(),
        ..FinishResponse::default()
    }
}

/// [`finish_ok`] in its response envelope (udf §1.5).
pub fn finish_response_ok() -> UdfResponse {
    UdfResponse::finish(finish_ok())
}

/// An empty `CancelResponse` in its envelope: the acknowledgement of a `Cancel` (udf §1.5).
pub fn cancel_ok() -> UdfResponse {
    UdfResponse::cancel(CancelResponse::default())
}

/// An `ErrorResponse` carrying `error` (udf §1.5).
pub fn error_response_of(error: ExecutionError) -> UdfResponse {
    UdfResponse::error(error)
}

/// The message of the reference echo worker's init failure (udf §2.1, payload `"INIT_ERROR"`).
pub const INIT_FAILURE: &str = "simulated init failure";
/// The error class of the reference echo worker's data failure (udf §2.1, batch `"ERROR"`).
pub const USER_ERROR_CLASS: &str = "SimulatedError";
/// The message of the reference echo worker's data failure (udf §2.1).
pub const USER_ERROR_MESSAGE: &str = "simulated user error";

/// A `UserError` with `message` and `error_class` (udf §1.5: a failure of the user's code).
pub fn user_error(message: &str, error_class: &str) -> ExecutionError {
    ExecutionError::user_with_class(message, error_class)
}

/// The reference echo worker's data failure: [`USER_ERROR_MESSAGE`] of class
/// [`USER_ERROR_CLASS`] (udf §2.1).
pub fn simulated_user_error() -> ExecutionError {
    user_error(USER_ERROR_MESSAGE, USER_ERROR_CLASS)
}

/// A `WorkerError` with `message` (udf §1.5: a failure of the worker itself).
pub fn worker_error(message: &str) -> ExecutionError {
    ExecutionError::worker(message)
}

/// A `ProtocolError` with `message` (udf §1.5: the peer broke a rule of udf §2).
pub fn protocol_error(message: &str) -> ExecutionError {
    ExecutionError::protocol(message)
}

// ---------------------------------------------------------------------------------------------
// Configurations and clocks
// ---------------------------------------------------------------------------------------------

/// The init deadline of [`session_config`] (udf §7 `initTimeout`), distinct from the others.
pub const TEST_INIT: Duration = Duration::from_secs(30);
/// The terminal deadline of [`session_config`] (udf §7, `close`'s terminator wait).
pub const TEST_TERMINAL: Duration = Duration::from_secs(20);
/// The interrupt's Cancel acknowledgement deadline of [`session_config`] (udf §4.9, §7).
pub const TEST_INTERRUPT: Duration = Duration::from_secs(2);
/// The worker's R4 cancel deadline of [`endpoint_config`] (udf §7: after its error the
/// worker waits this long for the engine's Cancel).
pub const TEST_CANCEL: Duration = Duration::from_secs(25);

/// A session configuration whose udf §7 deadlines ([`TEST_INIT`], [`TEST_TERMINAL`],
/// [`TEST_INTERRUPT`]) all differ, so a test can tell which one fired; everything else the
/// default.
pub fn session_config() -> SessionConfig {
    SessionConfig {
        init_timeout: TEST_INIT,
        terminal_timeout: TEST_TERMINAL,
        interrupt_cancel_timeout: TEST_INTERRUPT,
        ..SessionConfig::default()
    }
}

/// A valid direct worker specification (udf §1.9, §6.2): `runner` over a Unix domain
/// socket, Arrow data, bidirectional streaming; `reuse` declares `supports_reuse` (udf §6.6),
/// so a dispatcher with a pool may keep the worker for further sessions.
pub fn direct_worker_spec(
    runner: tether::wire::ProcessCallable,
    reuse: bool,
) -> tether::wire::UdfWorkerSpecification {
    use tether::wire::{
        DirectWorker, UdfProtoCommunicationPattern, UdfWorkerProperties, UnixDomainSocket,
        WorkerCapabilities, WorkerConnectionSpec, WorkerEnvironment, udf_worker_specification,
        worker_connection_spec,
    };
    tether::wire::UdfWorkerSpecification {
        environment: Some(WorkerEnvironment::default()),
        capabilities: Some(WorkerCapabilities {
            supported_data_formats: vec![UdfWorkerDataFormat::Arrow as i32],
            supported_communication_patterns: vec![
                UdfProtoCommunicationPattern::BidirectionalStreaming as i32,
            ],
            supports_concurrent_udfs: None,
            supports_reuse: reuse.then_some(true),
        }),
        worker: Some(udf_worker_specification::Worker::Direct(DirectWorker {
            runner: Some(runner),
            properties: Some(UdfWorkerProperties {
                initialization_timeout_ms: None,
                graceful_termination_timeout_ms: None,
                connection: Some(WorkerConnectionSpec {
                    transport: Some(worker_connection_spec::Transport::UnixDomainSocket(
                        UnixDomainSocket {},
                    )),
                }),
            }),
        })),
    }
}

/// A session configuration whose init and terminal deadlines (udf §7) are ten minutes: for
/// tests whose peer is slow on purpose and must not be cut short.
pub fn huge_timeouts() -> SessionConfig {
    SessionConfig {
        init_timeout: Duration::from_secs(600),
        terminal_timeout: Duration::from_secs(600),
        ..SessionConfig::default()
    }
}

/// [`session_config`] with its deadlines on `clock` instead of tokio's (udf §7 timers).
pub fn session_config_on(clock: &ManualClock) -> SessionConfig {
    SessionConfig {
        timer: Arc::new(clock.clone()),
        ..session_config()
    }
}

/// An endpoint configuration with the R4 cancel deadline [`TEST_CANCEL`] on `NoTimeouts`: for
/// the sans-IO [`WorkerCore`], whose caller drives time (udf §7). Under
/// [`serve`](tether::worker::endpoint::serve) or an `Endpoint` its deadlines never fire
/// (`NoTimeouts`); use [`echo_config`](crate::echo::echo_config) or set `timer` there.
pub fn endpoint_config() -> EndpointConfig {
    EndpointConfig {
        cancel_timeout: Some(TEST_CANCEL),
        ..default_endpoint_config()
    }
}

/// The default endpoint configuration on `NoTimeouts`: Spark's deadlines (udf §7: 30 s for
/// the `Init`, `initResponseTimeoutMs`, and 30 s for the R4 Cancel, the terminal timeout) as
/// durations the sans-IO [`WorkerCore`] reads, the reference worker's version and ARROW
/// format (udf §2.1, §1.9). The configuration of `WorkerCore::default()`, for tests that pin
/// those defaults or change one field of them.
pub fn default_endpoint_config() -> EndpointConfig {
    EndpointConfig::with_timer(Arc::new(NoTimeouts))
}

/// A millisecond: the step before and at a deadline (udf §7).
pub const MS: Duration = Duration::from_millis(1);

/// A private scratch directory (mode 0700) under the system's temporary directory, removed
/// with everything in it on drop: where a test puts a worker's Unix socket (udf §6.4: the
/// socket lives in a directory only the engine's user can enter) or a stub worker's marker
/// files. Its name is short, so a socket path in it stays far below the 108-byte limit.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `tether-<prefix>-<16 hex digits>` (udf §6.4).
    ///
    /// # Panics
    ///
    /// When the directory cannot be created.
    pub fn new(prefix: &str) -> Self {
        use std::os::unix::fs::DirBuilderExt;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = std::env::temp_dir().join(format!("tether-{prefix}-{}", &id[..16]));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .unwrap_or_else(|e| panic!("scratch directory {}: {e}", path.display()));
        Self(path)
    }

    /// The directory (udf §6.4).
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The path of `name` inside the directory (udf §6.4).
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// [`join`](Self::join) as a string, for a stub worker's environment (udf §8.6).
    ///
    /// # Panics
    ///
    /// When the path is not UTF-8.
    pub fn file(&self, name: &str) -> String {
        self.join(name)
            .to_str()
            .expect("a UTF-8 temporary directory")
            .to_owned()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------------------------------

/// The kinds of `messages`, in order (udf §1.2).
pub fn kinds(messages: &[ResponseMessage]) -> Vec<ResponseKind> {
    messages.iter().map(ResponseMessage::kind).collect()
}

/// Everything the sans-IO worker `core` has queued for the engine, handed over
/// (`poll_transmit`) and unwrapped, in order (udf §1.2; the worker never sends an envelope
/// without its branch).
///
/// # Panics
///
/// When a queued response has no branch set.
pub fn drain_responses(core: &mut WorkerCore) -> Vec<ResponseMessage> {
    std::iter::from_fn(|| core.poll_transmit())
        .map(|r| {
            r.into_message()
                .expect("the worker never sends an empty oneof")
        })
        .collect()
}

/// The payloads of the `DataResponse`s among `messages`, as strings, in order (udf §1.4).
pub fn data_strings(messages: &[ResponseMessage]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| match m {
            ResponseMessage::Data(d) => Some(String::from_utf8_lossy(d).into_owned()),
            _ => None,
        })
        .collect()
}

/// Asserts `msg` is an `InitResponse` without error (udf §1.3).
pub fn assert_init_ok(msg: &ResponseMessage) {
    match msg {
        ResponseMessage::Init(r) => {
            assert!(r.error.is_none(), "InitResponse carries an error: {r:?}")
        }
        other => panic!("expected InitResponse, got {other:?}"),
    }
}

/// The error of an `InitResponse`; panics on anything else (udf §1.3).
pub fn init_error(msg: &ResponseMessage) -> &ExecutionError {
    match msg {
        ResponseMessage::Init(r) => r.error.as_ref().expect("InitResponse without error"),
        other => panic!("expected InitResponse(error), got {other:?}"),
    }
}

/// The error of an `ErrorResponse`; panics on anything else (udf §1.5).
pub fn error_response(msg: &ResponseMessage) -> &ExecutionError {
    match msg {
        ResponseMessage::Error(r) => r.error.as_ref().expect("ErrorResponse without error"),
        other => panic!("expected ErrorResponse, got {other:?}"),
    }
}

/// Asserts `msg` is a `CancelResponse` and returns it (udf §1.5).
pub fn cancel_response(msg: &ResponseMessage) -> &CancelResponse {
    match msg {
        ResponseMessage::Cancel(r) => r,
        other => panic!("expected CancelResponse, got {other:?}"),
    }
}

/// Asserts `msg` is a `FinishResponse` and returns it (udf §1.5).
pub fn finish_response(msg: &ResponseMessage) -> &FinishResponse {
    match msg {
        ResponseMessage::Finish(r) => r,
        other => panic!("expected FinishResponse, got {other:?}"),
    }
}

/// Asserts `msg` is the reference echo worker's `FinishResponse`: metrics [`status_ok`], no
/// error (udf §2.1).
pub fn assert_echo_finish(msg: &ResponseMessage) {
    let finish = finish_response(msg);
    assert_eq!(finish.metrics, status_ok(), "{finish:?}");
    assert!(finish.error.is_none(), "{finish:?}");
}

/// Asserts `e` is a `ProtocolError` with exactly `message` (udf §1.5; what the engine
/// receives: pass `EngineViolation::wire_message()` or `InitRejection::wire_message()`).
pub fn assert_protocol_error(e: &ExecutionError, message: &str) {
    match &e.kind {
        Some(execution_error::Kind::Protocol(p)) => assert_eq!(p.message, message),
        _ => panic!("expected ProtocolError({message:?}), got {e}"),
    }
}

/// Asserts `e` is a `WorkerError` with exactly `message` (udf §1.5).
pub fn assert_worker_error(e: &ExecutionError, message: &str) {
    match &e.kind {
        Some(execution_error::Kind::Worker(w)) => assert_eq!(w.message, message),
        _ => panic!("expected WorkerError({message:?}), got {e}"),
    }
}

/// Asserts `e` is a `UserError` with `error_class` (udf §1.5).
pub fn assert_user_error(e: &ExecutionError, error_class: &str) {
    match &e.kind {
        Some(execution_error::Kind::User(u)) => {
            assert_eq!(u.error_class.as_deref(), Some(error_class))
        }
        _ => panic!("expected UserError[{error_class}], got {e}"),
    }
}

/// The `Display` text of `error` and of each of its sources, outermost first: what a
/// person reads of a failure (udf §4.10 error kinds; each layer keeps its cause as the
/// source).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    std::iter::successors(Some(error), |e| e.source())
        .map(ToString::to_string)
        .collect()
}

/// Asserts the session's handle was released exactly once, with one outcome observed and
/// no session left open, and marked invalid exactly when `invalid` (udf §5.1, §6.5: the
/// single finalizer releases once; a worker is invalidated iff it is unsafe to reuse).
pub fn assert_released_once(handle: &CountingHandle, invalid: bool) {
    assert_eq!(handle.releases(), 1, "handle released exactly once");
    assert_eq!(handle.active_sessions(), 0, "no session left on the handle");
    assert_eq!(
        handle.is_invalid(),
        invalid,
        "mark_invalid iff unsalvageable"
    );
    assert_eq!(handle.outcomes().len(), 1, "one outcome observed");
}

pub use self::framed::framed_error;

mod framed {
    use tether::connection::ConnectionError;
    use tether::connection::framed::FramedError;
    use tether::worker::engine::{SessionError, TransportFailure};

    /// The framed transport's error behind an engine session error (the connection error's
    /// source; udf §4.10 transport failures); panics on any other error.
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_survives_and_a_damaged_batch_loses_it() {
        let batch = tagged(300, 64);
        assert_eq!(tag_of(&batch), Some(300));
        let mut damaged = batch.to_vec();
        damaged[40] ^= 1;
        assert_eq!(tag_of(&damaged), None);
        assert_eq!(tag_of(&batch[..7]), None);
        assert_eq!(tags(&[tagged(1, 8), tagged(2, 9)]), [1, 2]);
    }

    #[test]
    fn chunked_init_announces_the_assembled_payload() {
        let requests = chunked_init("abcdefg", 3);
        assert_eq!(requests.len(), 4);
        let tether::wire::RequestMessage::Init(init) = requests[0].clone().into_message().unwrap()
        else {
            panic!("Init first");
        };
        assert_eq!(init.is_chunking_payload, Some(true));
        let udf = init.udf.unwrap();
        assert_eq!(udf.payload_size, Some(7));
        assert_eq!(udf.payload_crc32, Some(crc32fast::hash(b"abcdefg")));
        let lasts: Vec<_> = requests[1..]
            .iter()
            .map(|r| match r.clone().into_message().unwrap() {
                tether::wire::RequestMessage::PayloadChunk(c) => c.last == Some(true),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(lasts, [false, false, true]);
    }
}
