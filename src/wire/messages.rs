//! Protocol messages of the `Execute` stream and the `Manage` RPC, plus the shared enums
//! (udf §1.2–§1.8).
//!
//! The engine (Spark, the gRPC client) sends [`UdfRequest`]s and receives [`UdfResponse`]s on
//! one bidirectional `Execute` stream per session; the worker-scoped `Manage` RPC exchanges a
//! [`WorkerRequest`] for a [`WorkerResponse`] (udf §1.1). The ordering rules for both
//! directions are in udf §2.
//!
//! The envelopes nest two oneofs deep (`UdfRequest.request` → `UdfControlRequest.control`), so
//! besides the raw prost types this module offers flattened views — [`RequestMessage`] and
//! [`ResponseMessage`] — obtained with [`UdfRequest::into_message`] /
//! [`UdfResponse::into_message`] and turned back with `From`, and cheap discriminants
//! ([`RequestKind`], [`ResponseKind`]) for logging and state-machine checks.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;

// ---------------------------------------------------------------------------------------------
// Shared enums (common.proto)
// ---------------------------------------------------------------------------------------------

/// Encoding of the data-plane payloads ([`DataRequest::data`], [`DataResponse::data`]) for
/// one session (udf §1.8). Stored in messages as a raw `i32`, so values unknown to this
/// build survive a decode/encode round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum UdfWorkerDataFormat {
    /// Proto3 zero value: no format chosen. A worker must reject an [`Init`] carrying it
    /// (udf §1.3, field 2).
    Unspecified = 0,
    /// Apache Arrow IPC stream batches (udf §1.8). Every worker must support it (udf §1.9).
    Arrow = 1,
}

impl UdfWorkerDataFormat {
    /// The enum value's name as spelled in the protobuf schema, e.g. `"ARROW"` (the
    /// `UDFWorkerDataFormat` names of udf §1.8).
    pub fn as_str_name(&self) -> &'static str {
        match self {
            Self::Unspecified => "UDF_WORKER_DATA_FORMAT_UNSPECIFIED",
            Self::Arrow => "ARROW",
        }
    }

    /// Parses a schema spelling produced by [`as_str_name`](Self::as_str_name) (the proto
    /// enum names of udf §1.8); `None` for anything else.
    pub fn from_str_name(value: &str) -> Option<Self> {
        match value {
            "UDF_WORKER_DATA_FORMAT_UNSPECIFIED" => Some(Self::Unspecified),
            "ARROW" => Some(Self::Arrow),
            _ => None,
        }
    }
}

/// How engine and worker exchange messages for one UDF execution (udf §1.8). Listed by a
/// worker in [`WorkerCapabilities::supported_communication_patterns`](crate::wire::WorkerCapabilities::supported_communication_patterns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum UdfProtoCommunicationPattern {
    /// Proto3 zero value: no pattern chosen (udf §1.8).
    Unspecified = 0,
    /// One bidirectional `Execute` stream per session — the only pattern the engine supports
    /// (udf §1.1, §1.8).
    BidirectionalStreaming = 1,
}

impl UdfProtoCommunicationPattern {
    /// The enum value's name as spelled in the protobuf schema, e.g.
    /// `"BIDIRECTIONAL_STREAMING"` (the `UDFProtoCommunicationPattern` names of udf §1.8).
    pub fn as_str_name(&self) -> &'static str {
        match self {
            Self::Unspecified => "UDF_PROTO_COMMUNICATION_PATTERN_UNSPECIFIED",
            Self::BidirectionalStreaming => "BIDIRECTIONAL_STREAMING",
        }
    }

    /// Parses a schema spelling produced by [`as_str_name`](Self::as_str_name) (the proto
    /// enum names of udf §1.8); `None` for anything else.
    pub fn from_str_name(value: &str) -> Option<Self> {
        match value {
            "UDF_PROTO_COMMUNICATION_PATTERN_UNSPECIFIED" => Some(Self::Unspecified),
            "BIDIRECTIONAL_STREAMING" => Some(Self::BidirectionalStreaming),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Execute stream envelopes
// ---------------------------------------------------------------------------------------------

/// Engine → worker envelope: every message the engine writes on an `Execute` stream
/// (udf §1.2). Exactly one branch must be set; an empty oneof is malformed.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UdfRequest {
    /// The carried message: a control message or a data batch (udf §1.2). `None` only for a
    /// malformed envelope.
    #[prost(oneof = "udf_request::Request", tags = "1, 2")]
    pub request: Option<udf_request::Request>,
}

/// Oneof types nested in [`UdfRequest`] (udf §1.2).
pub mod udf_request {
    /// The branches of [`UdfRequest::request`](super::UdfRequest::request) (udf §1.2).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Request {
        /// Field 1: a control message (`Init`, `PayloadChunk`, `Finish` or `Cancel`).
        #[prost(message, tag = "1")]
        Control(super::UdfControlRequest),
        /// Field 2: one input data batch (udf §1.4).
        #[prost(message, tag = "2")]
        Data(super::DataRequest),
    }
}

/// Worker → engine envelope: every message the worker writes on an `Execute` stream
/// (udf §1.2). Exactly one branch must be set; an empty oneof is malformed.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UdfResponse {
    /// The carried message: a control response or an output data batch (udf §1.2). `None`
    /// only for a malformed envelope.
    #[prost(oneof = "udf_response::Response", tags = "1, 2")]
    pub response: Option<udf_response::Response>,
}

/// Oneof types nested in [`UdfResponse`] (udf §1.2).
pub mod udf_response {
    /// The branches of [`UdfResponse::response`](super::UdfResponse::response) (udf §1.2).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Response {
        /// Field 1: a control response (`InitResponse`, `FinishResponse`, `CancelResponse` or
        /// `ErrorResponse`).
        #[prost(message, tag = "1")]
        Control(super::UdfControlResponse),
        /// Field 2: one output data batch (udf §1.4).
        #[prost(message, tag = "2")]
        Data(super::DataResponse),
    }
}

/// Engine → worker control messages (udf §1.2); the legal order is
/// `Init → PayloadChunk* → … → Finish [→ Cancel] | Cancel` (udf §2).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UdfControlRequest {
    /// The control message (udf §1.2). `None` only for a malformed message.
    #[prost(oneof = "udf_control_request::Control", tags = "1, 2, 3, 4")]
    pub control: Option<udf_control_request::Control>,
}

/// Oneof types nested in [`UdfControlRequest`] (udf §1.2).
pub mod udf_control_request {
    /// The branches of [`UdfControlRequest::control`](super::UdfControlRequest::control)
    /// (udf §1.2).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Control {
        /// Field 1: opens the session; first message of the stream (udf §1.3). Boxed, as
        /// prost-build's `boxed` option would: an `Init` is hundreds of bytes and sent once,
        /// while every other message of the stream moves through this enum by value.
        #[prost(message, tag = "1", boxed)]
        Init(::prost::alloc::boxed::Box<super::Init>),
        /// Field 2: one piece of a chunked UDF payload (udf §1.3).
        #[prost(message, tag = "2")]
        Payload(super::PayloadChunk),
        /// Field 3: all input has been sent (udf §1.5).
        #[prost(message, tag = "3")]
        Finish(super::Finish),
        /// Field 4: cooperative cancellation (udf §1.5).
        #[prost(message, tag = "4")]
        Cancel(super::Cancel),
    }
}

/// Worker → engine control responses (udf §1.2); the legal order is
/// `InitResponse → … → [ErrorResponse] → (FinishResponse | CancelResponse)` (udf §2).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UdfControlResponse {
    /// The control response (udf §1.2). `None` only for a malformed message.
    #[prost(oneof = "udf_control_response::Control", tags = "1, 2, 3, 4")]
    pub control: Option<udf_control_response::Control>,
}

/// Oneof types nested in [`UdfControlResponse`] (udf §1.2).
pub mod udf_control_response {
    /// The branches of [`UdfControlResponse::control`](super::UdfControlResponse::control)
    /// (udf §1.2). Every branch is boxed: each is sent at most once per session and is
    /// several times larger than a data batch, which moves through
    /// [`UdfResponse`](super::UdfResponse) by value on every message.
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Control {
        /// Field 1: acknowledgement of `Init`, sent exactly once (udf §1.3).
        #[prost(message, tag = "1", boxed)]
        Init(::prost::alloc::boxed::Box<super::InitResponse>),
        /// Field 2: clean terminator answering `Finish` (udf §1.5).
        #[prost(message, tag = "2", boxed)]
        Finish(::prost::alloc::boxed::Box<super::FinishResponse>),
        /// Field 3: terminator answering `Cancel`, and after any error (udf §1.5, §2 R4).
        #[prost(message, tag = "3", boxed)]
        Cancel(::prost::alloc::boxed::Box<super::CancelResponse>),
        /// Field 4: data-phase error, at most once per stream (udf §1.5, §2 R4).
        #[prost(message, tag = "4", boxed)]
        Error(::prost::alloc::boxed::Box<super::ErrorResponse>),
    }
}

// ---------------------------------------------------------------------------------------------
// Init phase
// ---------------------------------------------------------------------------------------------

/// Opens a session: the first message of an `Execute` stream, sent exactly once (udf §1.3).
/// Names the UDF to run, the data format and the per-session context. Field numbers 10–99 are
/// reserved upstream for fields promoted out of [`session_conf`](Self::session_conf); 100+ are
/// opaque escape hatches.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Init {
    /// Field 1: the engine's protocol revision; unset means the initial revision. A worker
    /// that does not support it answers with a `ProtocolError` (udf §1.3).
    #[prost(uint32, optional, tag = "1")]
    pub protocol_version: Option<u32>,
    /// Field 2: the [`UdfWorkerDataFormat`] of every data batch in this session, as its raw
    /// `i32`. Required; `Unspecified` or a format the worker did not declare must be
    /// rejected (udf §1.3).
    #[prost(enumeration = "UdfWorkerDataFormat", tag = "2")]
    pub data_format: i32,
    /// Field 3: the single UDF body to execute (required; udf §1.3).
    #[prost(message, optional, tag = "3")]
    pub udf: Option<UdfPayload>,
    /// Field 4: `Some(true)` when the payload bytes follow as [`PayloadChunk`]s (udf §1.3).
    #[prost(bool, optional, tag = "4")]
    pub is_chunking_payload: Option<bool>,
    /// Field 5: wire schema of the input batches in the session's data format (for Arrow, an
    /// encoded IPC schema); unset when the worker can derive it (udf §1.3).
    #[prost(bytes = "bytes", optional, tag = "5")]
    pub input_schema: Option<Bytes>,
    /// Field 6: wire schema of the output batches the engine expects, encoded like
    /// [`input_schema`](Self::input_schema) (udf §1.3).
    #[prost(bytes = "bytes", optional, tag = "6")]
    pub output_schema: Option<Bytes>,
    /// Field 7: per-task context, string keys to string values (e.g. partition id, task
    /// attempt id, stage id); empty by default (udf §1.3).
    #[prost(btree_map = "string, string", tag = "7")]
    pub task_context: BTreeMap<String, String>,
    /// Field 8: free-form worker configuration, string keys to string values; empty by
    /// default (udf §1.3).
    #[prost(btree_map = "string, string", tag = "8")]
    pub session_conf: BTreeMap<String, String>,
    /// Field 9: the session time zone exactly as Spark's `spark.sql.session.timeZone` holds it
    /// — an IANA id such as `"America/Los_Angeles"` or an offset such as `"+08:00"`
    /// (udf §1.3).
    #[prost(string, optional, tag = "9")]
    pub timezone: Option<String>,
    /// Field 100: opaque engine-packed bytes for a particular kind of UDF execution, answered
    /// by [`InitResponse::data`]; the protocol does not interpret them (udf §1.3).
    #[prost(bytes = "bytes", optional, tag = "100")]
    pub parameters: Option<Bytes>,
}

/// The UDF body carried in [`Init::udf`] (udf §1.3). Opaque to the engine, which forwards it
/// unchanged. Struct fields follow the schema's declaration order (field 6 sits between 3
/// and 4).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UdfPayload {
    /// Field 1: the serialized UDF bundle, encoded as [`format`](Self::format) says; may be
    /// empty when the bytes arrive as [`PayloadChunk`]s (udf §1.3).
    #[prost(bytes = "bytes", tag = "1")]
    pub payload: Bytes,
    /// Field 2: required, non-empty tag naming the encoding of
    /// [`payload`](Self::payload); agreed between client and worker (udf §1.3).
    #[prost(string, tag = "2")]
    pub format: String,
    /// Field 3: total size in bytes of the assembled payload (inline plus chunks); when set,
    /// receivers must verify it (udf §1.3).
    #[prost(int64, optional, tag = "3")]
    pub payload_size: Option<i64>,
    /// Field 6: CRC-32 (IEEE 802.3 polynomial, zlib-compatible) of the assembled payload
    /// bytes; when set the worker must verify it, a mismatch being a `ProtocolError`
    /// (udf §1.3).
    #[prost(uint32, optional, tag = "6")]
    pub payload_crc32: Option<u32>,
    /// Field 4: human-readable UDF name for diagnostics and metrics (udf §1.3).
    #[prost(string, optional, tag = "4")]
    pub name: Option<String>,
    /// Field 5: language-specific dispatch hint telling the worker which code path handles
    /// the payload; unset when derivable from the payload (udf §1.3).
    #[prost(string, optional, tag = "5")]
    pub eval_type: Option<String>,
}

/// Worker → engine acknowledgement of [`Init`] (and of all its chunks), sent exactly once
/// whether init succeeded or failed (udf §1.3).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct InitResponse {
    /// Field 1: opaque init-time result for the engine (e.g. "skip execution" or a derived
    /// schema), answering [`Init::parameters`] (udf §1.3).
    #[prost(bytes = "bytes", optional, tag = "1")]
    pub data: Option<Bytes>,
    /// Field 2: set when init failed; then no data follows and the engine must send
    /// [`Cancel`] (udf §1.3, §2 R4).
    #[prost(message, optional, tag = "2")]
    pub error: Option<ExecutionError>,
}

/// One piece of a UDF payload too large for a single message, sent between [`Init`] and
/// [`InitResponse`] when [`Init::is_chunking_payload`] is true (udf §1.3, §2 R1). The worker
/// appends chunks, in arrival order, to the inline [`UdfPayload::payload`].
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PayloadChunk {
    /// Field 1: the bytes to append; required and non-empty (udf §1.3).
    #[prost(bytes = "bytes", tag = "1")]
    pub data: Bytes,
    /// Field 2: `Some(true)` on the final chunk; non-final chunks leave it unset (udf §1.3).
    #[prost(bool, optional, tag = "2")]
    pub last: Option<bool>,
}

// ---------------------------------------------------------------------------------------------
// Data phase
// ---------------------------------------------------------------------------------------------

/// Engine → worker: one input batch (udf §1.4).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct DataRequest {
    /// Field 1: the batch, encoded in the session's [`Init::data_format`] (for Arrow, an IPC
    /// stream message; never empty, even for zero rows) (udf §1.4).
    #[prost(bytes = "bytes", tag = "1")]
    pub data: Bytes,
}

/// Worker → engine: one output batch (udf §1.4).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct DataResponse {
    /// Field 1: the batch, encoded in the session's [`Init::data_format`] (udf §1.4).
    #[prost(bytes = "bytes", tag = "1")]
    pub data: Bytes,
}

// ---------------------------------------------------------------------------------------------
// Finish / Cancel / errors
// ---------------------------------------------------------------------------------------------

/// Engine → worker: all input has been sent; the worker drains its output and answers with
/// [`FinishResponse`] (udf §1.5, §2 R5). Has no fields.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Finish {}

/// Worker → engine clean terminator answering [`Finish`] (udf §1.5).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct FinishResponse {
    /// Field 1: per-execution metrics, worker-defined names to string values (the "map"
    /// metrics revision, udf §1.6).
    #[prost(btree_map = "string, string", tag = "1")]
    pub metrics: BTreeMap<String, String>,
    /// Field 2: opaque finish-time result for the engine (udf §1.5).
    #[prost(bytes = "bytes", optional, tag = "2")]
    pub data: Option<Bytes>,
    /// Field 3: error raised by the worker's finish callback; the engine should raise it
    /// (udf §1.5).
    #[prost(message, optional, tag = "3")]
    pub error: Option<ExecutionError>,
}

/// Engine → worker cooperative cancellation: the worker stops emitting data, cleans up and
/// answers with [`CancelResponse`] (udf §1.5, §2 R7). Allowed at any point of the stream.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Cancel {
    /// Field 1: free-form reason, for diagnostics only (udf §1.5).
    #[prost(string, optional, tag = "1")]
    pub reason: Option<String>,
}

/// Worker → engine terminator answering [`Cancel`]; also the terminator after any error
/// (udf §1.5, §2 R4).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct CancelResponse {
    /// Field 1: metrics accumulated up to cancellation, worker-defined names to string values
    /// (udf §1.6).
    #[prost(btree_map = "string, string", tag = "1")]
    pub metrics: BTreeMap<String, String>,
    /// Field 2: error raised by the worker's cancel callback; the engine should surface it
    /// alongside any earlier error (udf §1.5).
    #[prost(message, optional, tag = "2")]
    pub error: Option<ExecutionError>,
}

/// Worker → engine application error from the data phase; at most one per stream, after all
/// output, followed by the engine's [`Cancel`] (udf §1.5, §2 R4).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ErrorResponse {
    /// Field 1: the error (required by the protocol; `None` only when a peer omitted it)
    /// (udf §1.5).
    #[prost(message, optional, tag = "1")]
    pub error: Option<ExecutionError>,
}

/// An in-band application error: raised by user code, by the worker itself, or a protocol
/// violation the worker detected (udf §1.5). Exactly one kind must be set.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ExecutionError {
    /// Which party failed, with its details (udf §1.5). `None` only for a malformed message.
    #[prost(oneof = "execution_error::Kind", tags = "1, 2, 3")]
    pub kind: Option<execution_error::Kind>,
}

/// Oneof types nested in [`ExecutionError`] (udf §1.5).
pub mod execution_error {
    /// The branches of [`ExecutionError::kind`](super::ExecutionError::kind) (udf §1.5).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Kind {
        /// Field 1: the user's UDF code raised.
        #[prost(message, tag = "1")]
        User(super::UserError),
        /// Field 2: the worker implementation failed.
        #[prost(message, tag = "2")]
        Worker(super::WorkerError),
        /// Field 3: the worker saw a protocol violation (udf §2 R6).
        #[prost(message, tag = "3")]
        Protocol(super::ProtocolError),
    }
}

/// An error raised by the user's UDF code (udf §1.5).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UserError {
    /// Field 1: human-readable message from the UDF (required; udf §1.5).
    #[prost(string, tag = "1")]
    pub message: String,
    /// Field 2: stack trace in the worker language's own format, forwarded as-is (udf §1.5).
    #[prost(string, optional, tag = "2")]
    pub traceback: Option<String>,
    /// Field 3: the language's error class name, e.g. `"ValueError"` (udf §1.5).
    #[prost(string, optional, tag = "3")]
    pub error_class: Option<String>,
}

/// An error of the worker implementation itself rather than user code (udf §1.5).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerError {
    /// Field 1: human-readable description (udf §1.5).
    #[prost(string, tag = "1")]
    pub message: String,
    /// Field 2: stack trace for diagnostics (udf §1.5).
    #[prost(string, optional, tag = "2")]
    pub traceback: Option<String>,
}

/// A protocol violation detected by the worker, e.g. out-of-order messages or an unsupported
/// protocol version (udf §1.5, §2 R6).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ProtocolError {
    /// Field 1: description of the violation (udf §1.5).
    #[prost(string, tag = "1")]
    pub message: String,
}

// ---------------------------------------------------------------------------------------------
// Manage RPC
// ---------------------------------------------------------------------------------------------

/// Engine → worker request of the unary `Manage` RPC; exactly one operation is set
/// (udf §1.7).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerRequest {
    /// The requested operation (udf §1.7). `None` only for a malformed request.
    #[prost(oneof = "worker_request::Manage", tags = "1, 2")]
    pub manage: Option<worker_request::Manage>,
}

/// Oneof types nested in [`WorkerRequest`] (udf §1.7).
pub mod worker_request {
    /// The branches of [`WorkerRequest::manage`](super::WorkerRequest::manage) (udf §1.7).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Manage {
        /// Field 1: liveness probe.
        #[prost(message, tag = "1")]
        Heartbeat(super::Heartbeat),
        /// Field 2: graceful shutdown request.
        #[prost(message, tag = "2")]
        Shutdown(super::ShutdownRequest),
    }
}

/// Worker → engine response of the `Manage` RPC; its branch must match the request's
/// (udf §1.7).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerResponse {
    /// The answered operation (udf §1.7). `None` only for a malformed response.
    #[prost(oneof = "worker_response::Manage", tags = "1, 2")]
    pub manage: Option<worker_response::Manage>,
}

/// Oneof types nested in [`WorkerResponse`] (udf §1.7).
pub mod worker_response {
    /// The branches of [`WorkerResponse::manage`](super::WorkerResponse::manage) (udf §1.7).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Manage {
        /// Field 1: answers a heartbeat.
        #[prost(message, tag = "1")]
        Heartbeat(super::HeartbeatResponse),
        /// Field 2: answers a shutdown request.
        #[prost(message, tag = "2")]
        Shutdown(super::ShutdownResponse),
    }
}

/// Application-level liveness probe: proves the worker's request handling is responsive
/// (udf §1.7). Has no fields (field 1 is reserved upstream).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Heartbeat {}

/// Answer to [`Heartbeat`] (udf §1.7).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct HeartbeatResponse {
    /// Field 1: worker-global metrics across all sessions, worker-defined names to string
    /// values (udf §1.6, §1.7).
    #[prost(btree_map = "string, string", tag = "1")]
    pub metrics: BTreeMap<String, String>,
}

/// Engine → worker graceful shutdown: no further `Execute` streams will be opened
/// (udf §1.7).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ShutdownRequest {
    /// Field 1: free-form reason, for diagnostics (udf §1.7).
    #[prost(string, optional, tag = "1")]
    pub reason: Option<String>,
    /// Field 2: `Some(true)` asks the worker to cancel every in-flight stream right away;
    /// unset or false lets them finish normally (udf §1.7).
    #[prost(bool, optional, tag = "2")]
    pub cancel_sessions: Option<bool>,
}

/// Answer to [`ShutdownRequest`] (udf §1.7).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ShutdownResponse {
    /// Field 1: true iff every `Execute` stream had settled before the worker replied
    /// (udf §1.7).
    #[prost(bool, tag = "1")]
    pub sessions_settled: bool,
}

// ---------------------------------------------------------------------------------------------
// Flattened views
// ---------------------------------------------------------------------------------------------

/// A [`UdfRequest`] with both oneof levels resolved: one variant per message the engine can
/// send (udf §1.2). Convert with [`UdfRequest::into_message`] and back with `From`.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestMessage {
    /// Opens the session (udf §1.3). Boxed like the wire oneof, so the per-message variants
    /// stay small.
    Init(Box<Init>),
    /// One piece of a chunked UDF payload (udf §1.3).
    PayloadChunk(PayloadChunk),
    /// One input batch: the bytes of [`DataRequest::data`] (udf §1.4).
    Data(Bytes),
    /// All input sent (udf §1.5).
    Finish(Finish),
    /// Cooperative cancellation (udf §1.5).
    Cancel(Cancel),
}

/// A [`UdfResponse`] with both oneof levels resolved: one variant per message the worker can
/// send (udf §1.2). Convert with [`UdfResponse::into_message`] and back with `From`.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseMessage {
    /// Init acknowledgement (udf §1.3). Boxed, as in the wire oneof: the once-per-session
    /// messages are boxed so that [`Data`](Self::Data) moves cheaply.
    Init(Box<InitResponse>),
    /// One output batch: the bytes of [`DataResponse::data`] (udf §1.4).
    Data(Bytes),
    /// Clean terminator (udf §1.5).
    Finish(Box<FinishResponse>),
    /// Cancel terminator (udf §1.5).
    Cancel(Box<CancelResponse>),
    /// Data-phase error (udf §1.5).
    Error(Box<ErrorResponse>),
}

/// Why an envelope has no message in it: one of its oneofs is unset, which the protocol
/// treats as malformed (udf §1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MalformedMessage {
    /// [`UdfRequest::request`] is unset.
    #[error("empty UdfRequest oneof")]
    EmptyRequest,
    /// [`UdfRequest::request`] holds a [`UdfControlRequest`] whose `control` is unset.
    #[error("empty UdfControlRequest oneof")]
    EmptyControlRequest,
    /// [`UdfResponse::response`] is unset.
    #[error("empty UdfResponse oneof")]
    EmptyResponse,
    /// [`UdfResponse::response`] holds a [`UdfControlResponse`] whose `control` is unset.
    #[error("empty UdfControlResponse oneof")]
    EmptyControlResponse,
}

/// Which message a [`UdfRequest`] carries, without its contents (udf §1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// An [`Init`].
    Init,
    /// A [`PayloadChunk`].
    PayloadChunk,
    /// A [`DataRequest`].
    Data,
    /// A [`Finish`].
    Finish,
    /// A [`Cancel`].
    Cancel,
}

/// Which message a [`UdfResponse`] carries, without its contents (udf §1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResponseKind {
    /// An [`InitResponse`].
    Init,
    /// A [`DataResponse`].
    Data,
    /// A [`FinishResponse`].
    Finish,
    /// A [`CancelResponse`].
    Cancel,
    /// An [`ErrorResponse`].
    Error,
}

impl RequestMessage {
    /// The discriminant of this message (which udf §1.2 branch it travels in).
    pub fn kind(&self) -> RequestKind {
        match self {
            Self::Init(_) => RequestKind::Init,
            Self::PayloadChunk(_) => RequestKind::PayloadChunk,
            Self::Data(_) => RequestKind::Data,
            Self::Finish(_) => RequestKind::Finish,
            Self::Cancel(_) => RequestKind::Cancel,
        }
    }
}

impl ResponseMessage {
    /// The discriminant of this message (which udf §1.2 branch it travels in).
    pub fn kind(&self) -> ResponseKind {
        match self {
            Self::Init(_) => ResponseKind::Init,
            Self::Data(_) => ResponseKind::Data,
            Self::Finish(_) => ResponseKind::Finish,
            Self::Cancel(_) => ResponseKind::Cancel,
            Self::Error(_) => ResponseKind::Error,
        }
    }
}

impl UdfRequest {
    /// Wraps a control message in both envelope levels.
    fn control(control: udf_control_request::Control) -> Self {
        Self {
            request: Some(udf_request::Request::Control(UdfControlRequest {
                control: Some(control),
            })),
        }
    }

    /// An envelope carrying `init` (udf §1.3).
    pub fn init(init: Init) -> Self {
        Self::control(udf_control_request::Control::Init(Box::new(init)))
    }

    /// An envelope carrying one [`PayloadChunk`] of `data`. `last = true` marks the final
    /// chunk (`Some(true)`); non-final chunks leave the field unset, as the protocol asks
    /// (udf §1.3).
    pub fn payload_chunk(data: Bytes, last: bool) -> Self {
        Self::control(udf_control_request::Control::Payload(PayloadChunk {
            data,
            last: last.then_some(true),
        }))
    }

    /// An envelope carrying one input batch (udf §1.4).
    pub fn data(data: Bytes) -> Self {
        Self {
            request: Some(udf_request::Request::Data(DataRequest { data })),
        }
    }

    /// An envelope carrying [`Finish`] (udf §1.5).
    pub fn finish() -> Self {
        Self::control(udf_control_request::Control::Finish(Finish {}))
    }

    /// An envelope carrying [`Cancel`] with an optional diagnostic reason (udf §1.5).
    pub fn cancel(reason: Option<String>) -> Self {
        Self::control(udf_control_request::Control::Cancel(Cancel { reason }))
    }

    /// Resolves both oneof levels into a [`RequestMessage`]; errors if either is unset (a
    /// malformed envelope, udf §1.2, which a worker answers with a `ProtocolError`, udf §2.1).
    pub fn into_message(self) -> Result<RequestMessage, MalformedMessage> {
        use udf_control_request::Control;
        match self.request {
            None => Err(MalformedMessage::EmptyRequest),
            Some(udf_request::Request::Data(DataRequest { data })) => {
                Ok(RequestMessage::Data(data))
            }
            Some(udf_request::Request::Control(UdfControlRequest { control })) => match control {
                None => Err(MalformedMessage::EmptyControlRequest),
                Some(Control::Init(m)) => Ok(RequestMessage::Init(m)),
                Some(Control::Payload(m)) => Ok(RequestMessage::PayloadChunk(m)),
                Some(Control::Finish(m)) => Ok(RequestMessage::Finish(m)),
                Some(Control::Cancel(m)) => Ok(RequestMessage::Cancel(m)),
            },
        }
    }

    /// Which message this envelope carries; `None` if either oneof level is unset (udf §1.2).
    pub fn kind(&self) -> Option<RequestKind> {
        use udf_control_request::Control;
        match self.request.as_ref()? {
            udf_request::Request::Data(_) => Some(RequestKind::Data),
            udf_request::Request::Control(c) => Some(match c.control.as_ref()? {
                Control::Init(_) => RequestKind::Init,
                Control::Payload(_) => RequestKind::PayloadChunk,
                Control::Finish(_) => RequestKind::Finish,
                Control::Cancel(_) => RequestKind::Cancel,
            }),
        }
    }
}

impl From<RequestMessage> for UdfRequest {
    fn from(message: RequestMessage) -> Self {
        use udf_control_request::Control;
        match message {
            RequestMessage::Init(m) => Self::control(Control::Init(m)),
            RequestMessage::PayloadChunk(m) => Self::control(Control::Payload(m)),
            RequestMessage::Data(data) => Self::data(data),
            RequestMessage::Finish(m) => Self::control(Control::Finish(m)),
            RequestMessage::Cancel(m) => Self::control(Control::Cancel(m)),
        }
    }
}

impl UdfResponse {
    /// Wraps a control response in both envelope levels.
    fn control(control: udf_control_response::Control) -> Self {
        Self {
            response: Some(udf_response::Response::Control(UdfControlResponse {
                control: Some(control),
            })),
        }
    }

    /// An envelope carrying an [`InitResponse`] (udf §1.3).
    pub fn init(init: InitResponse) -> Self {
        Self::control(udf_control_response::Control::Init(Box::new(init)))
    }

    /// An envelope carrying one output batch (udf §1.4).
    pub fn data(data: Bytes) -> Self {
        Self {
            response: Some(udf_response::Response::Data(DataResponse { data })),
        }
    }

    /// An envelope carrying a [`FinishResponse`] (udf §1.5).
    pub fn finish(finish: FinishResponse) -> Self {
        Self::control(udf_control_response::Control::Finish(Box::new(finish)))
    }

    /// An envelope carrying a [`CancelResponse`] (udf §1.5).
    pub fn cancel(cancel: CancelResponse) -> Self {
        Self::control(udf_control_response::Control::Cancel(Box::new(cancel)))
    }

    /// An envelope carrying an [`ErrorResponse`] wrapping `error` (udf §1.5).
    pub fn error(error: ExecutionError) -> Self {
        Self::control(udf_control_response::Control::Error(Box::new(
            ErrorResponse { error: Some(error) },
        )))
    }

    /// Resolves both oneof levels into a [`ResponseMessage`]; errors if either is unset (a
    /// malformed envelope, udf §1.2, on which the engine settles `TransportFailed`, udf §4.5).
    pub fn into_message(self) -> Result<ResponseMessage, MalformedMessage> {
        use udf_control_response::Control;
        match self.response {
            None => Err(MalformedMessage::EmptyResponse),
            Some(udf_response::Response::Data(DataResponse { data })) => {
                Ok(ResponseMessage::Data(data))
            }
            Some(udf_response::Response::Control(UdfControlResponse { control })) => {
                match control {
                    None => Err(MalformedMessage::EmptyControlResponse),
                    Some(Control::Init(m)) => Ok(ResponseMessage::Init(m)),
                    Some(Control::Finish(m)) => Ok(ResponseMessage::Finish(m)),
                    Some(Control::Cancel(m)) => Ok(ResponseMessage::Cancel(m)),
                    Some(Control::Error(m)) => Ok(ResponseMessage::Error(m)),
                }
            }
        }
    }

    /// Which message this envelope carries; `None` if either oneof level is unset (udf §1.2).
    pub fn kind(&self) -> Option<ResponseKind> {
        use udf_control_response::Control;
        match self.response.as_ref()? {
            udf_response::Response::Data(_) => Some(ResponseKind::Data),
            udf_response::Response::Control(c) => Some(match c.control.as_ref()? {
                Control::Init(_) => ResponseKind::Init,
                Control::Finish(_) => ResponseKind::Finish,
                Control::Cancel(_) => ResponseKind::Cancel,
                Control::Error(_) => ResponseKind::Error,
            }),
        }
    }
}

impl From<ResponseMessage> for UdfResponse {
    fn from(message: ResponseMessage) -> Self {
        use udf_control_response::Control;
        match message {
            ResponseMessage::Init(m) => Self::control(Control::Init(m)),
            ResponseMessage::Data(data) => Self::data(data),
            ResponseMessage::Finish(m) => Self::control(Control::Finish(m)),
            ResponseMessage::Cancel(m) => Self::control(Control::Cancel(m)),
            ResponseMessage::Error(m) => Self::control(Control::Error(m)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

impl UdfPayload {
    /// An inline payload: the `payload` bytes (field 1), encoded as the `format` tag says
    /// (field 2); size, checksum, name and eval type unset (udf §1.3). The arguments follow
    /// the proto field order, as every message constructor of this module does.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tether::wire::UdfPayload;
    ///
    /// let udf = UdfPayload::new(Bytes::from_static(b"pickled"), "cloudpickle");
    /// assert_eq!((&udf.payload[..], udf.format.as_str()), (&b"pickled"[..], "cloudpickle"));
    /// ```
    pub fn new(payload: impl Into<Bytes>, format: impl Into<String>) -> Self {
        Self {
            payload: payload.into(),
            format: format.into(),
            ..Self::default()
        }
    }
}

impl Init {
    /// An `Init` for `udf` in `data_format`; every optional field unset and both maps empty
    /// (udf §1.3). The arguments follow the proto field order (`data_format` is field 2,
    /// `udf` field 3).
    pub fn new(data_format: UdfWorkerDataFormat, udf: UdfPayload) -> Self {
        Self {
            data_format: data_format.into(),
            udf: Some(udf),
            ..Self::default()
        }
    }

    /// The UDF payload bytes, `udf.payload` (udf §1.3); empty when `udf` is unset. On the
    /// worker side, after the endpoint assembled a chunked payload, these are the whole
    /// payload: the inline part followed by every [`PayloadChunk`] in arrival order.
    pub fn payload(&self) -> &Bytes {
        static EMPTY: Bytes = Bytes::new();
        self.udf.as_ref().map_or(&EMPTY, |udf| &udf.payload)
    }
}

impl ExecutionError {
    /// A [`UserError`] with `message`; no traceback, no error class (udf §1.5).
    pub fn user(message: impl Into<String>) -> Self {
        Self {
            kind: Some(execution_error::Kind::User(UserError {
                message: message.into(),
                traceback: None,
                error_class: None,
            })),
        }
    }

    /// A [`UserError`] with `message` and the language's error class, e.g. `"ValueError"`
    /// (fields 1 and 3, in proto order); no traceback (udf §1.5).
    pub fn user_with_class(message: impl Into<String>, error_class: impl Into<String>) -> Self {
        Self {
            kind: Some(execution_error::Kind::User(UserError {
                message: message.into(),
                traceback: None,
                error_class: Some(error_class.into()),
            })),
        }
    }

    /// A [`WorkerError`] with `message`; no traceback (udf §1.5).
    pub fn worker(message: impl Into<String>) -> Self {
        Self {
            kind: Some(execution_error::Kind::Worker(WorkerError {
                message: message.into(),
                traceback: None,
            })),
        }
    }

    /// A [`ProtocolError`] with `message`: what a worker reports for an out-of-order or
    /// malformed engine message (udf §1.5, §2 R6).
    pub fn protocol(message: impl Into<String>) -> Self {
        Self {
            kind: Some(execution_error::Kind::Protocol(ProtocolError {
                message: message.into(),
            })),
        }
    }

    /// The human-readable message of whichever kind is set (field 1 of each, udf §1.5); `""`
    /// when none is.
    pub fn message(&self) -> &str {
        match &self.kind {
            Some(execution_error::Kind::User(e)) => &e.message,
            Some(execution_error::Kind::Worker(e)) => &e.message,
            Some(execution_error::Kind::Protocol(e)) => &e.message,
            None => "",
        }
    }

    /// The language error class; only user errors carry one (`UserError.error_class`,
    /// udf §1.5).
    pub fn error_class(&self) -> Option<&str> {
        match &self.kind {
            Some(execution_error::Kind::User(e)) => e.error_class.as_deref(),
            _ => None,
        }
    }

    /// The stack trace of a user or worker error, if the worker sent one (`traceback`,
    /// udf §1.5).
    pub fn traceback(&self) -> Option<&str> {
        match &self.kind {
            Some(execution_error::Kind::User(e)) => e.traceback.as_deref(),
            Some(execution_error::Kind::Worker(e)) => e.traceback.as_deref(),
            _ => None,
        }
    }
}

/// One line: `UserError[Class]: message` (`UserError: message` without a class),
/// `WorkerError: message`, `ProtocolError: message`, or `ExecutionError: <unset>`. The
/// alternate form (`{:#}`) appends the traceback, if any, on the following lines.
impl fmt::Display for ExecutionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Some(execution_error::Kind::User(e)) => match &e.error_class {
                Some(class) => write!(f, "UserError[{class}]: {}", e.message)?,
                None => write!(f, "UserError: {}", e.message)?,
            },
            Some(execution_error::Kind::Worker(e)) => write!(f, "WorkerError: {}", e.message)?,
            Some(execution_error::Kind::Protocol(e)) => write!(f, "ProtocolError: {}", e.message)?,
            None => f.write_str("ExecutionError: <unset>")?,
        }
        if let Some(traceback) = self.traceback().filter(|_| f.alternate()) {
            write!(f, "\n{traceback}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ExecutionError {}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Encodes, decodes, and checks the result equals the input; returns the encoding.
    fn roundtrip<M: Message + Default + PartialEq + std::fmt::Debug>(m: &M) -> Vec<u8> {
        let encoded = m.encode_to_vec();
        assert_eq!(encoded.len(), m.encoded_len());
        let decoded = M::decode(encoded.as_slice()).expect("decodes");
        assert_eq!(&decoded, m);
        encoded
    }

    /// A default message encodes to nothing and decodes back to the default.
    fn empty_roundtrip<M: Message + Default + PartialEq + std::fmt::Debug>() {
        let m = M::default();
        assert_eq!(roundtrip(&m), Vec::<u8>::new());
        assert_eq!(M::decode(&[][..]).expect("decodes"), m);
    }

    fn full_user_error() -> ExecutionError {
        ExecutionError {
            kind: Some(execution_error::Kind::User(UserError {
                message: "boom".into(),
                traceback: Some("Traceback (most recent call last): ...".into()),
                error_class: Some("ValueError".into()),
            })),
        }
    }

    fn full_worker_error() -> ExecutionError {
        ExecutionError {
            kind: Some(execution_error::Kind::Worker(WorkerError {
                message: "worker crashed".into(),
                traceback: Some("at Worker.run".into()),
            })),
        }
    }

    fn full_init() -> Init {
        Init {
            protocol_version: Some(1),
            data_format: UdfWorkerDataFormat::Arrow as i32,
            udf: Some(full_payload()),
            is_chunking_payload: Some(true),
            input_schema: Some(Bytes::from_static(b"in-schema")),
            output_schema: Some(Bytes::from_static(b"out-schema")),
            task_context: map(&[("partitionId", "3"), ("stageId", "7")]),
            session_conf: map(&[("spark.sql.ansi.enabled", "true")]),
            timezone: Some("America/Los_Angeles".into()),
            parameters: Some(Bytes::from_static(&[0, 1, 2, 255])),
        }
    }

    fn full_payload() -> UdfPayload {
        UdfPayload {
            payload: Bytes::from_static(b"pickled-callable"),
            format: "cloudpickle".into(),
            payload_size: Some(16),
            payload_crc32: Some(0xDEAD_BEEF),
            name: Some("my_udf".into()),
            eval_type: Some("SQL_BATCHED_UDF".into()),
        }
    }

    #[test]
    fn every_message_roundtrips_when_empty() {
        empty_roundtrip::<UdfRequest>();
        empty_roundtrip::<UdfResponse>();
        empty_roundtrip::<UdfControlRequest>();
        empty_roundtrip::<UdfControlResponse>();
        empty_roundtrip::<Init>();
        empty_roundtrip::<UdfPayload>();
        empty_roundtrip::<InitResponse>();
        empty_roundtrip::<PayloadChunk>();
        empty_roundtrip::<DataRequest>();
        empty_roundtrip::<DataResponse>();
        empty_roundtrip::<Finish>();
        empty_roundtrip::<FinishResponse>();
        empty_roundtrip::<Cancel>();
        empty_roundtrip::<CancelResponse>();
        empty_roundtrip::<ErrorResponse>();
        empty_roundtrip::<ExecutionError>();
        empty_roundtrip::<UserError>();
        empty_roundtrip::<WorkerError>();
        empty_roundtrip::<ProtocolError>();
        empty_roundtrip::<WorkerRequest>();
        empty_roundtrip::<WorkerResponse>();
        empty_roundtrip::<Heartbeat>();
        empty_roundtrip::<HeartbeatResponse>();
        empty_roundtrip::<ShutdownRequest>();
        empty_roundtrip::<ShutdownResponse>();
    }

    #[test]
    fn empty_messages_have_unset_fields() {
        let init = Init::default();
        assert_eq!(init.protocol_version, None);
        assert_eq!(init.data_format, 0);
        assert_eq!(init.data_format(), UdfWorkerDataFormat::Unspecified);
        assert_eq!(init.udf, None);
        assert!(init.task_context.is_empty());
        assert_eq!(init.parameters, None);
        assert_eq!(UdfRequest::default().kind(), None);
        assert_eq!(UdfResponse::default().kind(), None);
        assert_eq!(ExecutionError::default().message(), "");
        assert_eq!(ExecutionError::default().error_class(), None);
    }

    #[test]
    fn init_and_payload_roundtrip_with_all_fields() {
        let init = full_init();
        let bytes = roundtrip(&init);
        let decoded = Init::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.protocol_version(), 1);
        assert_eq!(decoded.data_format(), UdfWorkerDataFormat::Arrow);
        assert_eq!(decoded.timezone(), "America/Los_Angeles");
        assert_eq!(
            decoded.task_context.get("stageId").map(String::as_str),
            Some("7")
        );
        let udf = decoded.udf.unwrap();
        assert_eq!(udf.payload_crc32, Some(0xDEAD_BEEF));
        assert_eq!(udf.format, "cloudpickle");
        roundtrip(&full_payload());
        roundtrip(&UdfRequest::init(init));
    }

    #[test]
    fn response_side_messages_roundtrip_with_all_fields() {
        let init_response = InitResponse {
            data: Some(Bytes::from_static(b"skip")),
            error: Some(full_user_error()),
        };
        roundtrip(&init_response);
        let finish = FinishResponse {
            metrics: map(&[("status", "ok"), ("rows", "42")]),
            data: Some(Bytes::from_static(b"done")),
            error: Some(full_worker_error()),
        };
        roundtrip(&finish);
        let cancel = CancelResponse {
            metrics: map(&[("rows", "1")]),
            error: Some(ExecutionError::protocol("late")),
        };
        roundtrip(&cancel);
        let error = ErrorResponse {
            error: Some(full_user_error()),
        };
        roundtrip(&error);
        roundtrip(&full_user_error());
        roundtrip(&full_worker_error());
        roundtrip(&ExecutionError::protocol("out of order"));
        roundtrip(&UserError {
            message: "m".into(),
            traceback: Some("t".into()),
            error_class: Some("c".into()),
        });
        roundtrip(&WorkerError {
            message: "m".into(),
            traceback: Some("t".into()),
        });
        roundtrip(&ProtocolError {
            message: "m".into(),
        });
        roundtrip(&DataResponse {
            data: Bytes::from_static(b"batch"),
        });
        for response in [
            UdfResponse::init(init_response),
            UdfResponse::data(Bytes::from_static(b"out")),
            UdfResponse::finish(finish),
            UdfResponse::cancel(cancel),
            UdfResponse::error(full_user_error()),
        ] {
            let bytes = roundtrip(&response);
            let control = match &response.response {
                Some(udf_response::Response::Control(c)) => Some(c.clone()),
                _ => None,
            };
            if let Some(c) = control {
                roundtrip(&c);
            }
            assert_eq!(
                UdfResponse::decode(bytes.as_slice()).unwrap().kind(),
                response.kind()
            );
        }
    }

    #[test]
    fn request_side_messages_roundtrip_with_all_fields() {
        roundtrip(&PayloadChunk {
            data: Bytes::from_static(b"chunk"),
            last: Some(true),
        });
        roundtrip(&DataRequest {
            data: Bytes::from_static(b"batch"),
        });
        roundtrip(&Finish {});
        roundtrip(&Cancel {
            reason: Some("task killed".into()),
        });
        for request in [
            UdfRequest::init(full_init()),
            UdfRequest::payload_chunk(Bytes::from_static(b"c"), false),
            UdfRequest::payload_chunk(Bytes::from_static(b"d"), true),
            UdfRequest::data(Bytes::from_static(b"in")),
            UdfRequest::finish(),
            UdfRequest::cancel(Some("why".into())),
        ] {
            let bytes = roundtrip(&request);
            if let Some(udf_request::Request::Control(c)) = &request.request {
                roundtrip(c);
            }
            assert_eq!(
                UdfRequest::decode(bytes.as_slice()).unwrap().kind(),
                request.kind()
            );
        }
    }

    #[test]
    fn manage_messages_roundtrip_with_all_fields() {
        let shutdown = ShutdownRequest {
            reason: Some("engine done".into()),
            cancel_sessions: Some(true),
        };
        roundtrip(&shutdown);
        let heartbeat_response = HeartbeatResponse {
            metrics: map(&[("activeSessions", "2")]),
        };
        roundtrip(&heartbeat_response);
        let shutdown_response = ShutdownResponse {
            sessions_settled: true,
        };
        roundtrip(&shutdown_response);
        roundtrip(&Heartbeat {});
        let hb = WorkerRequest {
            manage: Some(worker_request::Manage::Heartbeat(Heartbeat {})),
        };
        assert_eq!(roundtrip(&hb), vec![0x0A, 0x00]);
        roundtrip(&WorkerRequest {
            manage: Some(worker_request::Manage::Shutdown(shutdown)),
        });
        roundtrip(&WorkerResponse {
            manage: Some(worker_response::Manage::Heartbeat(heartbeat_response)),
        });
        let bytes = roundtrip(&WorkerResponse {
            manage: Some(worker_response::Manage::Shutdown(shutdown_response)),
        });
        assert_eq!(bytes, vec![0x12, 0x02, 0x08, 0x01]);
    }

    #[test]
    fn init_parameters_is_field_100() {
        let init = Init {
            parameters: Some(Bytes::from_static(b"xy")),
            ..Init::default()
        };
        // key = (100 << 3) | 2 = 802 = varint 0xA2 0x06, then length 2.
        assert_eq!(init.encode_to_vec(), vec![0xA2, 0x06, 0x02, b'x', b'y']);
        let empty_but_present = Init {
            parameters: Some(Bytes::new()),
            ..Init::default()
        };
        assert_eq!(empty_but_present.encode_to_vec(), vec![0xA2, 0x06, 0x00]);
    }

    #[test]
    fn init_scalar_fields_have_the_schema_numbers_and_presence() {
        let init = Init {
            protocol_version: Some(0),
            data_format: UdfWorkerDataFormat::Arrow as i32,
            is_chunking_payload: Some(false),
            timezone: Some("UTC".into()),
            ..Init::default()
        };
        assert_eq!(
            init.encode_to_vec(),
            vec![
                0x08, 0x00, // 1: protocol_version = 0, present because optional
                0x10, 0x01, // 2: data_format = ARROW
                0x20, 0x00, // 4: is_chunking_payload = false, present because optional
                0x4A, 0x03, b'U', b'T', b'C', // 9: timezone
            ]
        );
        // The plain (non-optional) enum field is omitted at its zero value.
        let unspecified = Init {
            data_format: UdfWorkerDataFormat::Unspecified as i32,
            ..Init::default()
        };
        assert!(unspecified.encode_to_vec().is_empty());
    }

    #[test]
    fn init_maps_use_fields_7_and_8() {
        let init = Init {
            task_context: map(&[("a", "b")]),
            session_conf: map(&[("c", "d")]),
            ..Init::default()
        };
        assert_eq!(
            init.encode_to_vec(),
            vec![
                0x3A, 0x06, 0x0A, 0x01, b'a', 0x12, 0x01, b'b', // 7: task_context entry
                0x42, 0x06, 0x0A, 0x01, b'c', 0x12, 0x01, b'd', // 8: session_conf entry
            ]
        );
    }

    #[test]
    fn unknown_data_format_values_survive_a_roundtrip() {
        let init = Init {
            data_format: 7,
            ..Init::default()
        };
        let decoded = Init::decode(roundtrip(&init).as_slice()).unwrap();
        assert_eq!(decoded.data_format, 7);
        // The typed getter falls back to the zero value for unknown numbers.
        assert_eq!(decoded.data_format(), UdfWorkerDataFormat::Unspecified);
        assert!(!UdfWorkerDataFormat::is_valid(7));
        assert_eq!(
            UdfWorkerDataFormat::try_from(1),
            Ok(UdfWorkerDataFormat::Arrow)
        );
    }

    #[test]
    fn enum_names_match_the_schema_spelling() {
        assert_eq!(UdfWorkerDataFormat::Arrow.as_str_name(), "ARROW");
        assert_eq!(
            UdfWorkerDataFormat::from_str_name("UDF_WORKER_DATA_FORMAT_UNSPECIFIED"),
            Some(UdfWorkerDataFormat::Unspecified)
        );
        assert_eq!(UdfWorkerDataFormat::from_str_name("arrow"), None);
        assert_eq!(
            UdfProtoCommunicationPattern::BidirectionalStreaming.as_str_name(),
            "BIDIRECTIONAL_STREAMING"
        );
        assert_eq!(
            UdfProtoCommunicationPattern::from_str_name(
                "UDF_PROTO_COMMUNICATION_PATTERN_UNSPECIFIED"
            ),
            Some(UdfProtoCommunicationPattern::Unspecified)
        );
        assert_eq!(
            i32::from(UdfProtoCommunicationPattern::BidirectionalStreaming),
            1
        );
        assert_eq!(
            UdfWorkerDataFormat::default(),
            UdfWorkerDataFormat::Unspecified
        );
    }

    #[test]
    fn udf_payload_crc32_is_field_6_varint() {
        let payload = UdfPayload {
            payload_crc32: Some(300),
            ..UdfPayload::default()
        };
        // key = (6 << 3) | 0 = 0x30; 300 = varint 0xAC 0x02.
        assert_eq!(payload.encode_to_vec(), vec![0x30, 0xAC, 0x02]);
        let all = UdfPayload {
            payload: Bytes::from_static(b"p"),
            format: "f".into(),
            payload_size: Some(5),
            payload_crc32: Some(1),
            name: Some("n".into()),
            eval_type: Some("e".into()),
        };
        // Encoded in field-number order even though 6 is declared before 4 and 5.
        assert_eq!(
            all.encode_to_vec(),
            vec![
                0x0A, 0x01, b'p', // 1: payload
                0x12, 0x01, b'f', // 2: format
                0x18, 0x05, // 3: payload_size
                0x22, 0x01, b'n', // 4: name
                0x2A, 0x01, b'e', // 5: eval_type
                0x30, 0x01, // 6: payload_crc32
            ]
        );
        // A negative size is a ten-byte varint (int64, not sint64).
        let negative = UdfPayload {
            payload_size: Some(-1),
            ..UdfPayload::default()
        };
        let bytes = negative.encode_to_vec();
        assert_eq!(bytes.len(), 11);
        assert_eq!(bytes[0], 0x18);
        assert_eq!(
            UdfPayload::decode(bytes.as_slice()).unwrap().payload_size,
            Some(-1)
        );
    }

    #[test]
    fn finish_response_metrics_is_a_map_on_field_1() {
        let finish = FinishResponse {
            metrics: map(&[("status", "ok")]),
            ..FinishResponse::default()
        };
        let mut expected = vec![0x0A, 0x0C, 0x0A, 0x06];
        expected.extend_from_slice(b"status");
        expected.extend_from_slice(&[0x12, 0x02, b'o', b'k']);
        assert_eq!(finish.encode_to_vec(), expected);
        // Entries are encoded in key order, whatever the insertion order.
        let two = FinishResponse {
            metrics: [("b", "2"), ("a", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..FinishResponse::default()
        };
        assert_eq!(
            two.encode_to_vec(),
            vec![
                0x0A, 0x06, 0x0A, 0x01, b'a', 0x12, 0x01, b'1', //
                0x0A, 0x06, 0x0A, 0x01, b'b', 0x12, 0x01, b'2',
            ]
        );
    }

    #[test]
    fn cancel_reason_is_optional_string_field_1() {
        assert!(Cancel { reason: None }.encode_to_vec().is_empty());
        assert_eq!(
            Cancel {
                reason: Some(String::new())
            }
            .encode_to_vec(),
            vec![0x0A, 0x00]
        );
        assert_eq!(
            Cancel {
                reason: Some("hi".into())
            }
            .encode_to_vec(),
            vec![0x0A, 0x02, b'h', b'i']
        );
    }

    #[test]
    fn envelope_bytes_match_the_schema() {
        // UdfRequest.control(1) { UdfControlRequest.finish(3) {} }
        assert_eq!(
            UdfRequest::finish().encode_to_vec(),
            vec![0x0A, 0x02, 0x1A, 0x00]
        );
        // UdfRequest.data(2) { DataRequest.data(1) = "ab" }
        assert_eq!(
            UdfRequest::data(Bytes::from_static(b"ab")).encode_to_vec(),
            vec![0x12, 0x04, 0x0A, 0x02, b'a', b'b']
        );
        // UdfRequest.control(1) { payload(2) { data(1) = "z", last(2) = true } }
        assert_eq!(
            UdfRequest::payload_chunk(Bytes::from_static(b"z"), true).encode_to_vec(),
            vec![0x0A, 0x07, 0x12, 0x05, 0x0A, 0x01, b'z', 0x10, 0x01]
        );
        // UdfRequest.control(1) { cancel(4) {} }
        assert_eq!(
            UdfRequest::cancel(None).encode_to_vec(),
            vec![0x0A, 0x02, 0x22, 0x00]
        );
        // UdfResponse.control(1) { error(4) { error(1) { protocol(3) { message(1) = "x" } } } }
        assert_eq!(
            UdfResponse::error(ExecutionError::protocol("x")).encode_to_vec(),
            vec![
                0x0A, 0x09, 0x22, 0x07, 0x0A, 0x05, 0x1A, 0x03, 0x0A, 0x01, b'x'
            ]
        );
        // UdfResponse.control(1) { init(1) {} }
        assert_eq!(
            UdfResponse::init(InitResponse::default()).encode_to_vec(),
            vec![0x0A, 0x02, 0x0A, 0x00]
        );
        // UdfResponse.control(1) { cancel(3) {} }
        assert_eq!(
            UdfResponse::cancel(CancelResponse::default()).encode_to_vec(),
            vec![0x0A, 0x02, 0x1A, 0x00]
        );
    }

    #[test]
    fn unknown_fields_are_skipped() {
        // Heartbeat's reserved field 1 (a varint), then a stray field 15 string.
        let bytes = [0x08, 0x01, 0x7A, 0x01, b'q'];
        assert_eq!(Heartbeat::decode(&bytes[..]).unwrap(), Heartbeat {});
        // Cancel with an extra unknown field 2 keeps its reason.
        let bytes = [0x0A, 0x01, b'r', 0x10, 0x05];
        assert_eq!(
            Cancel::decode(&bytes[..]).unwrap().reason.as_deref(),
            Some("r")
        );
    }

    #[test]
    fn payload_chunk_constructor_sets_last_only_on_the_final_chunk() {
        let first = UdfRequest::payload_chunk(Bytes::from_static(b"a"), false);
        let last = UdfRequest::payload_chunk(Bytes::from_static(b"b"), true);
        match first.into_message() {
            Ok(RequestMessage::PayloadChunk(c)) => {
                assert_eq!(c.data, Bytes::from_static(b"a"));
                assert_eq!(c.last, None);
            }
            other => panic!("unexpected {other:?}"),
        }
        match last.into_message() {
            Ok(RequestMessage::PayloadChunk(c)) => {
                assert_eq!(c.data, Bytes::from_static(b"b"));
                assert_eq!(c.last, Some(true));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn request_flattening_roundtrips() {
        let cases = [
            (
                RequestMessage::Init(Box::new(full_init())),
                RequestKind::Init,
            ),
            (
                RequestMessage::PayloadChunk(PayloadChunk {
                    data: Bytes::from_static(b"c"),
                    last: Some(true),
                }),
                RequestKind::PayloadChunk,
            ),
            (
                RequestMessage::Data(Bytes::from_static(b"batch")),
                RequestKind::Data,
            ),
            (RequestMessage::Finish(Finish {}), RequestKind::Finish),
            (
                RequestMessage::Cancel(Cancel {
                    reason: Some("r".into()),
                }),
                RequestKind::Cancel,
            ),
        ];
        for (message, kind) in cases {
            assert_eq!(message.kind(), kind);
            let envelope = UdfRequest::from(message.clone());
            assert_eq!(envelope.kind(), Some(kind));
            let decoded = UdfRequest::decode(roundtrip(&envelope).as_slice()).unwrap();
            assert_eq!(decoded.into_message(), Ok(message));
        }
        // The constructors build the same envelopes as `From`.
        assert_eq!(
            UdfRequest::data(Bytes::from_static(b"x")),
            UdfRequest::from(RequestMessage::Data(Bytes::from_static(b"x")))
        );
        assert_eq!(
            UdfRequest::finish(),
            UdfRequest::from(RequestMessage::Finish(Finish {}))
        );
        assert_eq!(
            UdfRequest::cancel(None),
            UdfRequest::from(RequestMessage::Cancel(Cancel { reason: None }))
        );
        assert_eq!(
            UdfRequest::init(full_init()),
            UdfRequest::from(RequestMessage::Init(Box::new(full_init())))
        );
    }

    #[test]
    fn response_flattening_roundtrips() {
        let cases = [
            (
                ResponseMessage::Init(Box::new(InitResponse {
                    data: Some(Bytes::from_static(b"d")),
                    error: None,
                })),
                ResponseKind::Init,
            ),
            (
                ResponseMessage::Data(Bytes::from_static(b"out")),
                ResponseKind::Data,
            ),
            (
                ResponseMessage::Finish(Box::new(FinishResponse {
                    metrics: map(&[("status", "ok")]),
                    ..FinishResponse::default()
                })),
                ResponseKind::Finish,
            ),
            (
                ResponseMessage::Cancel(Box::default()),
                ResponseKind::Cancel,
            ),
            (
                ResponseMessage::Error(Box::new(ErrorResponse {
                    error: Some(full_user_error()),
                })),
                ResponseKind::Error,
            ),
        ];
        for (message, kind) in cases {
            assert_eq!(message.kind(), kind);
            let envelope = UdfResponse::from(message.clone());
            assert_eq!(envelope.kind(), Some(kind));
            let decoded = UdfResponse::decode(roundtrip(&envelope).as_slice()).unwrap();
            assert_eq!(decoded.into_message(), Ok(message));
        }
        assert_eq!(
            UdfResponse::error(ExecutionError::worker("w")),
            UdfResponse::from(ResponseMessage::Error(Box::new(ErrorResponse {
                error: Some(ExecutionError::worker("w"))
            })))
        );
        assert_eq!(
            UdfResponse::finish(FinishResponse::default()),
            UdfResponse::from(ResponseMessage::Finish(Box::default()))
        );
    }

    #[test]
    fn malformed_envelopes_are_reported() {
        assert_eq!(
            UdfRequest::default().into_message(),
            Err(MalformedMessage::EmptyRequest)
        );
        let empty_control = UdfRequest {
            request: Some(udf_request::Request::Control(UdfControlRequest::default())),
        };
        assert_eq!(empty_control.kind(), None);
        assert_eq!(
            empty_control.into_message(),
            Err(MalformedMessage::EmptyControlRequest)
        );
        assert_eq!(
            UdfResponse::default().into_message(),
            Err(MalformedMessage::EmptyResponse)
        );
        let empty_control = UdfResponse {
            response: Some(udf_response::Response::Control(
                UdfControlResponse::default(),
            )),
        };
        assert_eq!(empty_control.kind(), None);
        assert_eq!(
            empty_control.into_message(),
            Err(MalformedMessage::EmptyControlResponse)
        );
        // As they arrive off the wire: [0x0A, 0x00] is a present-but-empty control message.
        let decoded = UdfRequest::decode(&[0x0A, 0x00][..]).unwrap();
        assert_eq!(
            decoded.into_message(),
            Err(MalformedMessage::EmptyControlRequest)
        );
        let decoded = UdfResponse::decode(&[0x0A, 0x00][..]).unwrap();
        assert_eq!(
            decoded.into_message(),
            Err(MalformedMessage::EmptyControlResponse)
        );
        assert_eq!(
            MalformedMessage::EmptyRequest.to_string(),
            "empty UdfRequest oneof"
        );
        assert_eq!(
            MalformedMessage::EmptyControlRequest.to_string(),
            "empty UdfControlRequest oneof"
        );
        assert_eq!(
            MalformedMessage::EmptyResponse.to_string(),
            "empty UdfResponse oneof"
        );
        assert_eq!(
            MalformedMessage::EmptyControlResponse.to_string(),
            "empty UdfControlResponse oneof"
        );
    }

    #[test]
    fn execution_error_helpers_and_display() {
        let user = ExecutionError::user_with_class("boom", "SimulatedError");
        assert_eq!(user.message(), "boom");
        assert_eq!(user.error_class(), Some("SimulatedError"));
        assert_eq!(user.traceback(), None);
        assert_eq!(user.to_string(), "UserError[SimulatedError]: boom");
        let bare = ExecutionError::user(String::from("bad input"));
        assert_eq!(bare.error_class(), None);
        assert_eq!(bare.to_string(), "UserError: bad input");
        let worker = ExecutionError::worker("simulated init failure");
        assert_eq!(worker.message(), "simulated init failure");
        assert_eq!(worker.error_class(), None);
        assert_eq!(worker.to_string(), "WorkerError: simulated init failure");
        let protocol = ExecutionError::protocol("second Init");
        assert_eq!(protocol.message(), "second Init");
        assert_eq!(protocol.to_string(), "ProtocolError: second Init");
        assert_eq!(
            ExecutionError::default().to_string(),
            "ExecutionError: <unset>"
        );
        let traced = full_user_error();
        assert_eq!(
            traced.traceback(),
            Some("Traceback (most recent call last): ...")
        );
        assert_eq!(traced.to_string(), "UserError[ValueError]: boom");
        assert_eq!(
            format!("{traced:#}"),
            "UserError[ValueError]: boom\nTraceback (most recent call last): ..."
        );
        assert_eq!(full_worker_error().traceback(), Some("at Worker.run"));
        let as_dyn: Box<dyn std::error::Error> = Box::new(protocol);
        assert_eq!(as_dyn.to_string(), "ProtocolError: second Init");
    }

    #[test]
    fn constructors_fill_only_the_named_fields() {
        let payload = UdfPayload::new(Bytes::from_static(b"body"), "fmt");
        assert_eq!(payload.format, "fmt");
        assert_eq!(payload.payload, Bytes::from_static(b"body"));
        assert_eq!(payload.payload_size, None);
        assert_eq!(payload.payload_crc32, None);
        assert_eq!(payload.name, None);
        assert_eq!(payload.eval_type, None);
        let init = Init::new(UdfWorkerDataFormat::Arrow, payload.clone());
        assert_eq!(init.data_format(), UdfWorkerDataFormat::Arrow);
        assert_eq!(init.udf, Some(payload));
        assert_eq!(
            init,
            Init {
                data_format: 1,
                udf: init.udf.clone(),
                ..Init::default()
            }
        );
        assert_eq!(init.payload(), &Bytes::from_static(b"body"));
        assert!(Init::default().payload().is_empty(), "no udf: no bytes");
        // Any `Into<Bytes>` payload, any `Into<String>` format, in proto field order.
        let owned = UdfPayload::new(b"body".to_vec(), String::from("fmt"));
        assert_eq!(owned, UdfPayload::new(Bytes::from_static(b"body"), "fmt"));
        let classed = ExecutionError::user_with_class("bad row", String::from("ValueError"));
        assert_eq!(
            (classed.message(), classed.error_class()),
            ("bad row", Some("ValueError"))
        );
        assert_eq!(ExecutionError::user("bad row").error_class(), None);
        match UdfResponse::error(ExecutionError::worker("w")).into_message() {
            Ok(ResponseMessage::Error(response)) if response.error.is_some() => {
                let e = response.error.unwrap_or_default();
                assert_eq!(e.to_string(), "WorkerError: w");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Sizes of the message enums that move by value on every message of a stream.
#[cfg(test)]
mod size_tests {
    use std::mem::size_of;

    use super::*;
    use crate::wire::connect;

    /// `(name, size of the enum, size of the variant that travels most)`.
    fn sizes() -> Vec<(&'static str, usize, usize)> {
        vec![
            (
                "UdfRequest",
                size_of::<UdfRequest>(),
                size_of::<DataRequest>(),
            ),
            (
                "RequestMessage",
                size_of::<RequestMessage>(),
                size_of::<Bytes>(),
            ),
            (
                "UdfResponse",
                size_of::<UdfResponse>(),
                size_of::<DataResponse>(),
            ),
            (
                "ResponseMessage",
                size_of::<ResponseMessage>(),
                size_of::<Bytes>(),
            ),
            (
                "udf_control_response::Control",
                size_of::<udf_control_response::Control>(),
                size_of::<Box<FinishResponse>>(),
            ),
            (
                "udf_control_request::Control",
                size_of::<udf_control_request::Control>(),
                size_of::<Cancel>(),
            ),
            (
                "execute_plan_response::ResponseType",
                size_of::<connect::execute_plan_response::ResponseType>(),
                size_of::<connect::execute_plan_response::ArrowBatch>(),
            ),
        ]
    }

    /// No enum that moves per message is far larger than its common variant: `Init` (a few
    /// hundred bytes, once per session) is boxed in both places that held it inline, and so
    /// are the worker's once-per-session control responses, so a data message costs a move
    /// of a few words, not of the largest variant.
    #[test]
    fn per_message_enums_stay_close_to_their_common_variant() {
        for (name, size, common) in sizes() {
            println!("{name}: {size} bytes (common variant {common} bytes)");
        }
        for (name, size, common) in sizes() {
            assert!(
                size <= common.max(8) * 2 + 16,
                "{name} is {size} bytes, its common variant {common}: box the large variant"
            );
        }
        assert!(
            size_of::<Init>() > 4 * size_of::<Box<Init>>(),
            "Init is worth boxing"
        );
    }
}
