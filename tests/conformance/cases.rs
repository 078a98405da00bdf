//! The message fixtures: every message type of the official schema, with no field set and
//! with every field set (each oneof branch, maps with entries, optional fields at their zero
//! values, unknown enum values).

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use prost::Message;
use serde_json::{Map, Value};
use tether::wire::{
    Cancel, CancelResponse, DataRequest, DataResponse, DirectWorker, ErrorResponse, ExecutionError,
    Finish, FinishResponse, Heartbeat, HeartbeatResponse, Init, InitResponse, LocalTcpConnection,
    PayloadChunk, ProcessCallable, ProtocolError, ShutdownRequest, ShutdownResponse,
    UdfControlRequest, UdfControlResponse, UdfPayload, UdfProtoCommunicationPattern, UdfRequest,
    UdfResponse, UdfWorkerDataFormat, UdfWorkerProperties, UdfWorkerSpecification,
    UnixDomainSocket, UserError, WorkerCapabilities, WorkerConnectionSpec, WorkerEnvironment,
    WorkerError, WorkerRequest, WorkerResponse, execution_error, udf_control_request,
    udf_control_response, udf_request, udf_response, udf_worker_specification,
    worker_connection_spec, worker_request, worker_response,
};
use tether_testing::fixtures;

use crate::fields::Fields;

type DecodeCheck = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// One value of one message type: tether's bytes, its fields by tether's names (for Python
/// to build the same message by name), and a check that bytes decode in tether to that same
/// value.
pub struct Case {
    pub proto: &'static str,
    pub name: String,
    pub bytes: Vec<u8>,
    pub fields: Map<String, Value>,
    pub decodes_to_value: DecodeCheck,
}

impl Case {
    /// `Type / case`, as failures name it.
    pub fn label(&self) -> String {
        format!("{} / {}", self.proto, self.name)
    }
}

fn case<M>(proto: &'static str, name: &str, value: M) -> Case
where
    M: Message + Default + PartialEq + fmt::Debug + Fields + 'static,
{
    let bytes = value.encode_to_vec();
    let fields = value.fields();
    let decodes_to_value = Box::new(move |bytes: &[u8]| {
        let decoded = M::decode(bytes).map_err(|e| format!("tether cannot decode: {e}"))?;
        if decoded == value {
            Ok(())
        } else {
            Err(format!("decoded {decoded:?}\n   expected {value:?}"))
        }
    });
    Case {
        proto,
        name: name.to_owned(),
        bytes,
        fields,
        decodes_to_value,
    }
}

/// A string exercising escapes and multi-byte UTF-8 (including a 4-byte character).
fn text(tag: &str) -> String {
    format!("{tag}: zoné 日本 🚀 \"q\" \\ \t/\n\u{1}")
}

/// `len` bytes covering all byte values (0x00 and 0xff included).
fn blob(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

/// A map with several entries, one with a non-ASCII key and value.
fn entries(tag: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (format!("{tag}.partition_id"), "42".to_owned()),
        (format!("{tag}.zone"), "Europe/Zürich".to_owned()),
        (format!("{tag}.日本"), text("value")),
        ("spark.sql.session.timeZone".to_owned(), "+08:00".to_owned()),
    ])
}

/// A map whose entries have an empty key or an empty value (map-entry fields at their
/// defaults, which encoders may leave out of the entry).
fn default_entries() -> BTreeMap<String, String> {
    BTreeMap::from([
        (String::new(), "empty key".to_owned()),
        ("empty value".to_owned(), String::new()),
    ])
}

fn full_payload() -> UdfPayload {
    UdfPayload {
        payload: blob(300, 1),
        format: "cloudpickle".into(),
        payload_size: Some(9_007_199_254_740_993), // 2^53 + 1: not exact as a double
        payload_crc32: Some(u32::MAX),
        name: Some(text("udf name")),
        eval_type: Some("SQL_SCALAR_PANDAS_UDF".into()),
    }
}

fn full_init() -> Init {
    Init {
        protocol_version: Some(7),
        data_format: UdfWorkerDataFormat::Arrow as i32,
        udf: Some(full_payload()),
        is_chunking_payload: Some(true),
        input_schema: Some(blob(40, 2)),
        output_schema: Some(blob(200, 3)),
        task_context: entries("task"),
        session_conf: entries("conf"),
        timezone: Some("America/Los_Angeles".into()),
        parameters: Some(blob(129, 4)),
    }
}

fn user_error() -> UserError {
    UserError {
        message: text("division by zero"),
        traceback: Some(text("Traceback (most recent call last)")),
        error_class: Some("ZeroDivisionError".into()),
    }
}

fn worker_error() -> WorkerError {
    WorkerError {
        message: text("worker crashed"),
        traceback: Some(text("at worker.rs:1")),
    }
}

/// The message of the full `ProtocolError`.
fn protocol_message() -> String {
    text("DataRequest before InitResponse")
}

fn protocol_error() -> ProtocolError {
    ProtocolError {
        message: protocol_message(),
    }
}

fn error(kind: execution_error::Kind) -> ExecutionError {
    ExecutionError { kind: Some(kind) }
}

fn full_finish_response() -> FinishResponse {
    FinishResponse {
        metrics: entries("metric"),
        data: Some(blob(17, 5)),
        error: Some(error(execution_error::Kind::Worker(worker_error()))),
    }
}

fn full_cancel_response() -> CancelResponse {
    CancelResponse {
        metrics: entries("metric"),
        error: Some(fixtures::protocol_error(&protocol_message())),
    }
}

fn callable(tag: &str) -> ProcessCallable {
    ProcessCallable {
        command: vec!["python3".into(), "-m".into(), text(tag)],
        arguments: vec![
            String::new(),
            "--max_concurrency".into(),
            "5".into(),
            text("arg"),
        ],
        environment_variables: entries("env"),
    }
}

fn full_capabilities() -> WorkerCapabilities {
    WorkerCapabilities {
        // An unknown value (9) and the zero value must survive.
        supported_data_formats: vec![UdfWorkerDataFormat::Arrow as i32, 0, 9],
        supported_communication_patterns: vec![
            UdfProtoCommunicationPattern::BidirectionalStreaming as i32,
            0,
        ],
        supports_concurrent_udfs: Some(true),
        supports_reuse: Some(true),
    }
}

fn full_properties() -> UdfWorkerProperties {
    UdfWorkerProperties {
        initialization_timeout_ms: Some(-1), // a negative int32 is a 10-byte varint
        graceful_termination_timeout_ms: Some(i32::MAX),
        connection: Some(WorkerConnectionSpec {
            transport: Some(worker_connection_spec::Transport::UnixDomainSocket(
                UnixDomainSocket {},
            )),
        }),
    }
}

fn full_direct() -> DirectWorker {
    DirectWorker {
        runner: Some(callable("runner")),
        properties: Some(full_properties()),
    }
}

fn control_request(control: udf_control_request::Control) -> UdfControlRequest {
    UdfControlRequest {
        control: Some(control),
    }
}

fn control_response(control: udf_control_response::Control) -> UdfControlResponse {
    UdfControlResponse {
        control: Some(control),
    }
}

/// Every case. A type's cases named `full…` together set every field and every oneof
/// branch (checked by the Python side against the official descriptors).
pub fn cases() -> Vec<Case> {
    use execution_error::Kind;
    use udf_control_request::Control as Req;
    use udf_control_response::Control as Resp;
    vec![
        // ---- udf_message.proto: Execute envelopes
        case("UdfRequest", "empty", fixtures::empty_request()),
        case(
            "UdfRequest",
            "full_control",
            UdfRequest {
                request: Some(udf_request::Request::Control(control_request(Req::Init(
                    Box::new(full_init()),
                )))),
            },
        ),
        case("UdfRequest", "full_data", UdfRequest::data(blob(1000, 6))),
        case(
            "UdfRequest",
            "empty_data_branch",
            UdfRequest {
                request: Some(udf_request::Request::Data(DataRequest::default())),
            },
        ),
        case("UdfResponse", "empty", UdfResponse::default()),
        case(
            "UdfResponse",
            "full_control",
            UdfResponse {
                response: Some(udf_response::Response::Control(control_response(
                    Resp::Finish(Box::new(full_finish_response())),
                ))),
            },
        ),
        case(
            "UdfResponse",
            "full_data",
            UdfResponse {
                response: Some(udf_response::Response::Data(DataResponse {
                    data: blob(70_000, 7),
                })),
            },
        ),
        case("UdfControlRequest", "empty", UdfControlRequest::default()),
        case(
            "UdfControlRequest",
            "full_init",
            control_request(Req::Init(Box::new(full_init()))),
        ),
        case(
            "UdfControlRequest",
            "full_payload",
            control_request(Req::Payload(PayloadChunk {
                data: blob(64, 8),
                last: Some(true),
            })),
        ),
        case(
            "UdfControlRequest",
            "full_finish",
            control_request(Req::Finish(Finish {})),
        ),
        case(
            "UdfControlRequest",
            "full_cancel",
            control_request(Req::Cancel(Cancel {
                reason: Some(text("reason")),
            })),
        ),
        case("UdfControlResponse", "empty", UdfControlResponse::default()),
        case(
            "UdfControlResponse",
            "full_init",
            control_response(Resp::Init(Box::new(InitResponse {
                data: Some(blob(9, 9)),
                error: None,
            }))),
        ),
        case(
            "UdfControlResponse",
            "full_finish",
            control_response(Resp::Finish(Box::new(full_finish_response()))),
        ),
        case(
            "UdfControlResponse",
            "full_cancel",
            control_response(Resp::Cancel(Box::new(full_cancel_response()))),
        ),
        case(
            "UdfControlResponse",
            "full_error",
            control_response(Resp::Error(Box::new(ErrorResponse {
                error: Some(error(Kind::User(user_error()))),
            }))),
        ),
        // ---- Init phase
        case("Init", "empty", Init::default()),
        case("Init", "full", full_init()),
        case(
            "Init",
            "explicit_zero_values",
            Init {
                protocol_version: Some(0),
                data_format: 0,
                udf: Some(UdfPayload::default()),
                is_chunking_payload: Some(false),
                input_schema: Some(Bytes::new()),
                output_schema: Some(Bytes::new()),
                task_context: default_entries(),
                session_conf: BTreeMap::new(),
                timezone: Some(String::new()),
                parameters: Some(Bytes::new()),
            },
        ),
        case(
            "Init",
            "unknown_data_format",
            Init {
                data_format: 7,
                ..Init::default()
            },
        ),
        case("UdfPayload", "empty", UdfPayload::default()),
        case("UdfPayload", "full", full_payload()),
        case(
            "UdfPayload",
            "explicit_zero_values",
            UdfPayload {
                payload: Bytes::new(),
                format: String::new(),
                payload_size: Some(0),
                payload_crc32: Some(0),
                name: Some(String::new()),
                eval_type: Some(String::new()),
            },
        ),
        case(
            "UdfPayload",
            "negative_size",
            UdfPayload {
                payload_size: Some(i64::MIN),
                ..UdfPayload::default()
            },
        ),
        case("InitResponse", "empty", InitResponse::default()),
        case(
            "InitResponse",
            "full",
            InitResponse {
                data: Some(blob(33, 10)),
                error: Some(fixtures::protocol_error(&protocol_message())),
            },
        ),
        case(
            "InitResponse",
            "explicit_zero_values",
            InitResponse {
                data: Some(Bytes::new()),
                error: Some(ExecutionError::default()),
            },
        ),
        case("PayloadChunk", "empty", PayloadChunk::default()),
        case(
            "PayloadChunk",
            "full",
            PayloadChunk {
                data: blob(4096, 11),
                last: Some(true),
            },
        ),
        case(
            "PayloadChunk",
            "explicit_zero_values",
            PayloadChunk {
                data: Bytes::new(),
                last: Some(false),
            },
        ),
        // ---- Data phase
        case("DataRequest", "empty", DataRequest::default()),
        case(
            "DataRequest",
            "full",
            DataRequest {
                data: blob(300, 12),
            },
        ),
        case("DataResponse", "empty", DataResponse::default()),
        case(
            "DataResponse",
            "full",
            DataResponse {
                data: blob(300, 13),
            },
        ),
        // ---- Finish / Cancel / errors
        case("Finish", "empty", Finish {}),
        case("Finish", "full", Finish {}),
        case("FinishResponse", "empty", FinishResponse::default()),
        case("FinishResponse", "full", full_finish_response()),
        case(
            "FinishResponse",
            "explicit_zero_values",
            FinishResponse {
                metrics: default_entries(),
                data: Some(Bytes::new()),
                error: Some(ExecutionError::default()),
            },
        ),
        case("Cancel", "empty", Cancel::default()),
        case(
            "Cancel",
            "full",
            Cancel {
                reason: Some(text("cancelled by the user")),
            },
        ),
        case(
            "Cancel",
            "explicit_zero_values",
            Cancel {
                reason: Some(String::new()),
            },
        ),
        case("CancelResponse", "empty", CancelResponse::default()),
        case("CancelResponse", "full", full_cancel_response()),
        case("ErrorResponse", "empty", ErrorResponse::default()),
        case(
            "ErrorResponse",
            "full",
            ErrorResponse {
                error: Some(error(Kind::User(user_error()))),
            },
        ),
        case("ExecutionError", "empty", ExecutionError::default()),
        case(
            "ExecutionError",
            "full_user",
            error(Kind::User(user_error())),
        ),
        case(
            "ExecutionError",
            "full_worker",
            error(Kind::Worker(worker_error())),
        ),
        case(
            "ExecutionError",
            "full_protocol",
            fixtures::protocol_error(&protocol_message()),
        ),
        case(
            "ExecutionError",
            "empty_user_branch",
            error(Kind::User(UserError::default())),
        ),
        case("UserError", "empty", UserError::default()),
        case("UserError", "full", user_error()),
        case(
            "UserError",
            "explicit_zero_values",
            UserError {
                message: String::new(),
                traceback: Some(String::new()),
                error_class: Some(String::new()),
            },
        ),
        case("WorkerError", "empty", WorkerError::default()),
        case("WorkerError", "full", worker_error()),
        case("ProtocolError", "empty", ProtocolError::default()),
        case("ProtocolError", "full", protocol_error()),
        // ---- Manage RPC
        case("WorkerRequest", "empty", WorkerRequest::default()),
        case(
            "WorkerRequest",
            "full_heartbeat",
            WorkerRequest {
                manage: Some(worker_request::Manage::Heartbeat(Heartbeat {})),
            },
        ),
        case(
            "WorkerRequest",
            "full_shutdown",
            WorkerRequest {
                manage: Some(worker_request::Manage::Shutdown(ShutdownRequest {
                    reason: Some(text("bye")),
                    cancel_sessions: Some(true),
                })),
            },
        ),
        case("WorkerResponse", "empty", WorkerResponse::default()),
        case(
            "WorkerResponse",
            "full_heartbeat",
            WorkerResponse {
                manage: Some(worker_response::Manage::Heartbeat(HeartbeatResponse {
                    metrics: entries("worker"),
                })),
            },
        ),
        case(
            "WorkerResponse",
            "full_shutdown",
            WorkerResponse {
                manage: Some(worker_response::Manage::Shutdown(ShutdownResponse {
                    sessions_settled: true,
                })),
            },
        ),
        case("Heartbeat", "empty", Heartbeat {}),
        case("Heartbeat", "full", Heartbeat {}),
        case("HeartbeatResponse", "empty", HeartbeatResponse::default()),
        case(
            "HeartbeatResponse",
            "full",
            HeartbeatResponse {
                metrics: entries("worker"),
            },
        ),
        case("ShutdownRequest", "empty", ShutdownRequest::default()),
        case(
            "ShutdownRequest",
            "full",
            ShutdownRequest {
                reason: Some(text("engine stopping")),
                cancel_sessions: Some(true),
            },
        ),
        case(
            "ShutdownRequest",
            "explicit_zero_values",
            ShutdownRequest {
                reason: Some(String::new()),
                cancel_sessions: Some(false),
            },
        ),
        case("ShutdownResponse", "empty", ShutdownResponse::default()),
        case(
            "ShutdownResponse",
            "full",
            ShutdownResponse {
                sessions_settled: true,
            },
        ),
        // ---- worker_spec.proto
        case(
            "UDFWorkerSpecification",
            "empty",
            UdfWorkerSpecification::default(),
        ),
        case(
            "UDFWorkerSpecification",
            "full",
            UdfWorkerSpecification {
                environment: Some(WorkerEnvironment {
                    installation: Some(callable("install")),
                    environment_verification: Some(callable("verify")),
                    environment_cleanup: Some(callable("cleanup")),
                }),
                capabilities: Some(full_capabilities()),
                worker: Some(udf_worker_specification::Worker::Direct(full_direct())),
            },
        ),
        case("WorkerEnvironment", "empty", WorkerEnvironment::default()),
        case(
            "WorkerEnvironment",
            "full",
            WorkerEnvironment {
                installation: Some(callable("install")),
                environment_verification: Some(callable("verify")),
                environment_cleanup: Some(ProcessCallable::default()),
            },
        ),
        case("WorkerCapabilities", "empty", WorkerCapabilities::default()),
        case("WorkerCapabilities", "full", full_capabilities()),
        case(
            "WorkerCapabilities",
            "explicit_zero_values",
            WorkerCapabilities {
                supported_data_formats: vec![0],
                supported_communication_patterns: vec![],
                supports_concurrent_udfs: Some(false),
                supports_reuse: Some(false),
            },
        ),
        case("DirectWorker", "empty", DirectWorker::default()),
        case("DirectWorker", "full", full_direct()),
        case(
            "UDFWorkerProperties",
            "empty",
            UdfWorkerProperties::default(),
        ),
        case("UDFWorkerProperties", "full", full_properties()),
        case(
            "UDFWorkerProperties",
            "explicit_zero_values",
            UdfWorkerProperties {
                initialization_timeout_ms: Some(0),
                graceful_termination_timeout_ms: Some(0),
                connection: Some(WorkerConnectionSpec::default()),
            },
        ),
        case(
            "WorkerConnectionSpec",
            "empty",
            WorkerConnectionSpec::default(),
        ),
        case(
            "WorkerConnectionSpec",
            "full_unix_domain_socket",
            WorkerConnectionSpec {
                transport: Some(worker_connection_spec::Transport::UnixDomainSocket(
                    UnixDomainSocket {},
                )),
            },
        ),
        case(
            "WorkerConnectionSpec",
            "full_tcp",
            WorkerConnectionSpec {
                transport: Some(worker_connection_spec::Transport::Tcp(
                    LocalTcpConnection {},
                )),
            },
        ),
        case("UnixDomainSocket", "empty", UnixDomainSocket {}),
        case("UnixDomainSocket", "full", UnixDomainSocket {}),
        case("LocalTcpConnection", "empty", LocalTcpConnection {}),
        case("LocalTcpConnection", "full", LocalTcpConnection {}),
        case("ProcessCallable", "empty", ProcessCallable::default()),
        case("ProcessCallable", "full", callable("worker")),
    ]
}

/// The message types of the four official files, as tether names them in its fixtures
/// (the Python side checks this list against the official descriptors).
pub const SCHEMA_TYPES: [&str; 34] = [
    "Cancel",
    "CancelResponse",
    "DataRequest",
    "DataResponse",
    "DirectWorker",
    "ErrorResponse",
    "ExecutionError",
    "Finish",
    "FinishResponse",
    "Heartbeat",
    "HeartbeatResponse",
    "Init",
    "InitResponse",
    "LocalTcpConnection",
    "PayloadChunk",
    "ProcessCallable",
    "ProtocolError",
    "ShutdownRequest",
    "ShutdownResponse",
    "UDFWorkerProperties",
    "UDFWorkerSpecification",
    "UdfControlRequest",
    "UdfControlResponse",
    "UdfPayload",
    "UdfRequest",
    "UdfResponse",
    "UnixDomainSocket",
    "UserError",
    "WorkerCapabilities",
    "WorkerConnectionSpec",
    "WorkerEnvironment",
    "WorkerError",
    "WorkerRequest",
    "WorkerResponse",
];

/// The cases whose maps hold an entry with an empty key or value. Both encodings are valid
/// and decode alike, but differ in bytes: prost leaves a map entry's default key/value out
/// of the entry, upb writes both (`0a00` / `1200`). Every other case must be byte-identical.
pub const MAP_ENTRY_DEFAULT_CASES: [&str; 2] = [
    "Init / explicit_zero_values",
    "FinishResponse / explicit_zero_values",
];
