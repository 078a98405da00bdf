//! The hand-written prost types against Spark 4.3.0's official `.proto` files, field by
//! field (udf §1): every field's number, wire type and presence, and every enum value, read
//! from the schema by [`oracle`] and from tether's own encodings by the probes here.

use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message;
use tether::wire::*;

use crate::oracle::{self, Probe};

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every field of udf_message.proto / common.proto, each set alone, as (message, field,
/// encoding with a non-default value, encoding with the zero value when the field is a
/// scalar). Checked against the shipped schema by `udf_messages_match_the_official_schema`.
fn udf_message_probes() -> Vec<Probe> {
    fn p<M: Message>(message: &'static str, field: &'static str, set: M) -> Probe {
        Probe::new(message, field, set.encode_to_vec(), None)
    }
    fn z<M: Message>(message: &'static str, field: &'static str, set: M, zero: M) -> Probe {
        Probe::new(
            message,
            field,
            set.encode_to_vec(),
            Some(zero.encode_to_vec()),
        )
    }
    let b = Bytes::from_static(b"b");
    let s = || "s".to_string();
    let m = || map(&[("k", "v")]);
    let e = || Some(ExecutionError::protocol("x"));
    use execution_error::Kind;
    use udf_control_request::Control as Req;
    use udf_control_response::Control as Resp;
    vec![
        p("UdfRequest", "control", UdfRequest::finish()),
        p("UdfRequest", "data", UdfRequest::data(b.clone())),
        p(
            "UdfResponse",
            "control",
            UdfResponse::init(InitResponse::default()),
        ),
        p("UdfResponse", "data", UdfResponse::data(b.clone())),
        p(
            "UdfControlRequest",
            "init",
            UdfControlRequest {
                control: Some(Req::Init(Box::default())),
            },
        ),
        p(
            "UdfControlRequest",
            "payload",
            UdfControlRequest {
                control: Some(Req::Payload(PayloadChunk::default())),
            },
        ),
        p(
            "UdfControlRequest",
            "finish",
            UdfControlRequest {
                control: Some(Req::Finish(Finish {})),
            },
        ),
        p(
            "UdfControlRequest",
            "cancel",
            UdfControlRequest {
                control: Some(Req::Cancel(Cancel::default())),
            },
        ),
        p(
            "UdfControlResponse",
            "init",
            UdfControlResponse {
                control: Some(Resp::Init(Box::default())),
            },
        ),
        p(
            "UdfControlResponse",
            "finish",
            UdfControlResponse {
                control: Some(Resp::Finish(Box::default())),
            },
        ),
        p(
            "UdfControlResponse",
            "cancel",
            UdfControlResponse {
                control: Some(Resp::Cancel(Box::default())),
            },
        ),
        p(
            "UdfControlResponse",
            "error",
            UdfControlResponse {
                control: Some(Resp::Error(Box::default())),
            },
        ),
        z(
            "Init",
            "protocol_version",
            Init {
                protocol_version: Some(3),
                ..Init::default()
            },
            Init {
                protocol_version: Some(0),
                ..Init::default()
            },
        ),
        z(
            "Init",
            "data_format",
            Init {
                data_format: 1,
                ..Init::default()
            },
            Init {
                data_format: 0,
                ..Init::default()
            },
        ),
        p(
            "Init",
            "udf",
            Init {
                udf: Some(UdfPayload::default()),
                ..Init::default()
            },
        ),
        z(
            "Init",
            "is_chunking_payload",
            Init {
                is_chunking_payload: Some(true),
                ..Init::default()
            },
            Init {
                is_chunking_payload: Some(false),
                ..Init::default()
            },
        ),
        z(
            "Init",
            "input_schema",
            Init {
                input_schema: Some(b.clone()),
                ..Init::default()
            },
            Init {
                input_schema: Some(Bytes::new()),
                ..Init::default()
            },
        ),
        z(
            "Init",
            "output_schema",
            Init {
                output_schema: Some(b.clone()),
                ..Init::default()
            },
            Init {
                output_schema: Some(Bytes::new()),
                ..Init::default()
            },
        ),
        p(
            "Init",
            "task_context",
            Init {
                task_context: m(),
                ..Init::default()
            },
        ),
        p(
            "Init",
            "session_conf",
            Init {
                session_conf: m(),
                ..Init::default()
            },
        ),
        z(
            "Init",
            "timezone",
            Init {
                timezone: Some(s()),
                ..Init::default()
            },
            Init {
                timezone: Some(String::new()),
                ..Init::default()
            },
        ),
        z(
            "Init",
            "parameters",
            Init {
                parameters: Some(b.clone()),
                ..Init::default()
            },
            Init {
                parameters: Some(Bytes::new()),
                ..Init::default()
            },
        ),
        z(
            "InitResponse",
            "data",
            InitResponse {
                data: Some(b.clone()),
                error: None,
            },
            InitResponse {
                data: Some(Bytes::new()),
                error: None,
            },
        ),
        p(
            "InitResponse",
            "error",
            InitResponse {
                data: None,
                error: e(),
            },
        ),
        z(
            "PayloadChunk",
            "data",
            PayloadChunk {
                data: b.clone(),
                last: None,
            },
            PayloadChunk::default(),
        ),
        z(
            "PayloadChunk",
            "last",
            PayloadChunk {
                data: Bytes::new(),
                last: Some(true),
            },
            PayloadChunk {
                data: Bytes::new(),
                last: Some(false),
            },
        ),
        z(
            "DataRequest",
            "data",
            DataRequest { data: b.clone() },
            DataRequest::default(),
        ),
        z(
            "DataResponse",
            "data",
            DataResponse { data: b.clone() },
            DataResponse::default(),
        ),
        p(
            "FinishResponse",
            "metrics",
            FinishResponse {
                metrics: m(),
                ..FinishResponse::default()
            },
        ),
        z(
            "FinishResponse",
            "data",
            FinishResponse {
                data: Some(b.clone()),
                ..FinishResponse::default()
            },
            FinishResponse {
                data: Some(Bytes::new()),
                ..FinishResponse::default()
            },
        ),
        p(
            "FinishResponse",
            "error",
            FinishResponse {
                error: e(),
                ..FinishResponse::default()
            },
        ),
        z(
            "Cancel",
            "reason",
            Cancel { reason: Some(s()) },
            Cancel {
                reason: Some(String::new()),
            },
        ),
        p(
            "CancelResponse",
            "metrics",
            CancelResponse {
                metrics: m(),
                error: None,
            },
        ),
        p(
            "CancelResponse",
            "error",
            CancelResponse {
                metrics: BTreeMap::new(),
                error: e(),
            },
        ),
        p("ErrorResponse", "error", ErrorResponse { error: e() }),
        p(
            "ExecutionError",
            "user",
            ExecutionError {
                kind: Some(Kind::User(UserError::default())),
            },
        ),
        p(
            "ExecutionError",
            "worker",
            ExecutionError {
                kind: Some(Kind::Worker(WorkerError::default())),
            },
        ),
        p(
            "ExecutionError",
            "protocol",
            ExecutionError {
                kind: Some(Kind::Protocol(ProtocolError::default())),
            },
        ),
        z(
            "UserError",
            "message",
            UserError {
                message: s(),
                ..UserError::default()
            },
            UserError::default(),
        ),
        z(
            "UserError",
            "traceback",
            UserError {
                traceback: Some(s()),
                ..UserError::default()
            },
            UserError {
                traceback: Some(String::new()),
                ..UserError::default()
            },
        ),
        z(
            "UserError",
            "error_class",
            UserError {
                error_class: Some(s()),
                ..UserError::default()
            },
            UserError {
                error_class: Some(String::new()),
                ..UserError::default()
            },
        ),
        z(
            "WorkerError",
            "message",
            WorkerError {
                message: s(),
                traceback: None,
            },
            WorkerError::default(),
        ),
        z(
            "WorkerError",
            "traceback",
            WorkerError {
                message: String::new(),
                traceback: Some(s()),
            },
            WorkerError {
                message: String::new(),
                traceback: Some(String::new()),
            },
        ),
        z(
            "ProtocolError",
            "message",
            ProtocolError { message: s() },
            ProtocolError::default(),
        ),
        z(
            "UdfPayload",
            "payload",
            UdfPayload {
                payload: b.clone(),
                ..UdfPayload::default()
            },
            UdfPayload::default(),
        ),
        z(
            "UdfPayload",
            "format",
            UdfPayload {
                format: s(),
                ..UdfPayload::default()
            },
            UdfPayload::default(),
        ),
        z(
            "UdfPayload",
            "payload_size",
            UdfPayload {
                payload_size: Some(9),
                ..UdfPayload::default()
            },
            UdfPayload {
                payload_size: Some(0),
                ..UdfPayload::default()
            },
        ),
        z(
            "UdfPayload",
            "payload_crc32",
            UdfPayload {
                payload_crc32: Some(9),
                ..UdfPayload::default()
            },
            UdfPayload {
                payload_crc32: Some(0),
                ..UdfPayload::default()
            },
        ),
        z(
            "UdfPayload",
            "name",
            UdfPayload {
                name: Some(s()),
                ..UdfPayload::default()
            },
            UdfPayload {
                name: Some(String::new()),
                ..UdfPayload::default()
            },
        ),
        z(
            "UdfPayload",
            "eval_type",
            UdfPayload {
                eval_type: Some(s()),
                ..UdfPayload::default()
            },
            UdfPayload {
                eval_type: Some(String::new()),
                ..UdfPayload::default()
            },
        ),
        p(
            "WorkerRequest",
            "heartbeat",
            WorkerRequest {
                manage: Some(worker_request::Manage::Heartbeat(Heartbeat {})),
            },
        ),
        p(
            "WorkerRequest",
            "shutdown",
            WorkerRequest {
                manage: Some(worker_request::Manage::Shutdown(ShutdownRequest::default())),
            },
        ),
        p(
            "WorkerResponse",
            "heartbeat",
            WorkerResponse {
                manage: Some(worker_response::Manage::Heartbeat(
                    HeartbeatResponse::default(),
                )),
            },
        ),
        p(
            "WorkerResponse",
            "shutdown",
            WorkerResponse {
                manage: Some(worker_response::Manage::Shutdown(
                    ShutdownResponse::default(),
                )),
            },
        ),
        p(
            "HeartbeatResponse",
            "metrics",
            HeartbeatResponse { metrics: m() },
        ),
        z(
            "ShutdownRequest",
            "reason",
            ShutdownRequest {
                reason: Some(s()),
                cancel_sessions: None,
            },
            ShutdownRequest {
                reason: Some(String::new()),
                cancel_sessions: None,
            },
        ),
        z(
            "ShutdownRequest",
            "cancel_sessions",
            ShutdownRequest {
                reason: None,
                cancel_sessions: Some(true),
            },
            ShutdownRequest {
                reason: None,
                cancel_sessions: Some(false),
            },
        ),
        z(
            "ShutdownResponse",
            "sessions_settled",
            ShutdownResponse {
                sessions_settled: true,
            },
            ShutdownResponse {
                sessions_settled: false,
            },
        ),
    ]
}

#[test]
fn udf_messages_match_the_official_schema() {
    oracle::check(
        &["udf_message.proto", "common.proto"],
        &udf_message_probes(),
        &[
            (
                "UDFWorkerDataFormat",
                UdfWorkerDataFormat::Unspecified as i32,
                UdfWorkerDataFormat::Unspecified.as_str_name(),
            ),
            (
                "UDFWorkerDataFormat",
                UdfWorkerDataFormat::Arrow as i32,
                UdfWorkerDataFormat::Arrow.as_str_name(),
            ),
            (
                "UDFProtoCommunicationPattern",
                UdfProtoCommunicationPattern::Unspecified as i32,
                UdfProtoCommunicationPattern::Unspecified.as_str_name(),
            ),
            (
                "UDFProtoCommunicationPattern",
                UdfProtoCommunicationPattern::BidirectionalStreaming as i32,
                UdfProtoCommunicationPattern::BidirectionalStreaming.as_str_name(),
            ),
        ],
    );
}

fn worker_spec_probes() -> Vec<Probe> {
    fn p<M: Message>(message: &'static str, field: &'static str, set: M) -> Probe {
        Probe::new(message, field, set.encode_to_vec(), None)
    }
    fn z<M: Message>(message: &'static str, field: &'static str, set: M, zero: M) -> Probe {
        Probe::new(
            message,
            field,
            set.encode_to_vec(),
            Some(zero.encode_to_vec()),
        )
    }
    let pc = || Some(ProcessCallable::default());
    let s = || vec!["s".to_string()];
    use worker_connection_spec::Transport;
    vec![
        p(
            "UDFWorkerSpecification",
            "environment",
            UdfWorkerSpecification {
                environment: Some(WorkerEnvironment::default()),
                ..Default::default()
            },
        ),
        p(
            "UDFWorkerSpecification",
            "capabilities",
            UdfWorkerSpecification {
                capabilities: Some(WorkerCapabilities::default()),
                ..Default::default()
            },
        ),
        p(
            "UDFWorkerSpecification",
            "direct",
            UdfWorkerSpecification {
                worker: Some(udf_worker_specification::Worker::Direct(
                    DirectWorker::default(),
                )),
                ..Default::default()
            },
        ),
        p(
            "WorkerEnvironment",
            "installation",
            WorkerEnvironment {
                installation: pc(),
                ..Default::default()
            },
        ),
        p(
            "WorkerEnvironment",
            "environment_verification",
            WorkerEnvironment {
                environment_verification: pc(),
                ..Default::default()
            },
        ),
        p(
            "WorkerEnvironment",
            "environment_cleanup",
            WorkerEnvironment {
                environment_cleanup: pc(),
                ..Default::default()
            },
        ),
        p(
            "WorkerCapabilities",
            "supported_data_formats",
            WorkerCapabilities {
                supported_data_formats: vec![1],
                ..Default::default()
            },
        ),
        p(
            "WorkerCapabilities",
            "supported_communication_patterns",
            WorkerCapabilities {
                supported_communication_patterns: vec![1],
                ..Default::default()
            },
        ),
        z(
            "WorkerCapabilities",
            "supports_concurrent_udfs",
            WorkerCapabilities {
                supports_concurrent_udfs: Some(true),
                ..Default::default()
            },
            WorkerCapabilities {
                supports_concurrent_udfs: Some(false),
                ..Default::default()
            },
        ),
        z(
            "WorkerCapabilities",
            "supports_reuse",
            WorkerCapabilities {
                supports_reuse: Some(true),
                ..Default::default()
            },
            WorkerCapabilities {
                supports_reuse: Some(false),
                ..Default::default()
            },
        ),
        p(
            "DirectWorker",
            "runner",
            DirectWorker {
                runner: pc(),
                properties: None,
            },
        ),
        p(
            "DirectWorker",
            "properties",
            DirectWorker {
                runner: None,
                properties: Some(UdfWorkerProperties::default()),
            },
        ),
        z(
            "UDFWorkerProperties",
            "initialization_timeout_ms",
            UdfWorkerProperties {
                initialization_timeout_ms: Some(7),
                ..Default::default()
            },
            UdfWorkerProperties {
                initialization_timeout_ms: Some(0),
                ..Default::default()
            },
        ),
        z(
            "UDFWorkerProperties",
            "graceful_termination_timeout_ms",
            UdfWorkerProperties {
                graceful_termination_timeout_ms: Some(7),
                ..Default::default()
            },
            UdfWorkerProperties {
                graceful_termination_timeout_ms: Some(0),
                ..Default::default()
            },
        ),
        p(
            "UDFWorkerProperties",
            "connection",
            UdfWorkerProperties {
                connection: Some(WorkerConnectionSpec::default()),
                ..Default::default()
            },
        ),
        p(
            "WorkerConnectionSpec",
            "unix_domain_socket",
            WorkerConnectionSpec {
                transport: Some(Transport::UnixDomainSocket(UnixDomainSocket {})),
            },
        ),
        p(
            "WorkerConnectionSpec",
            "tcp",
            WorkerConnectionSpec {
                transport: Some(Transport::Tcp(LocalTcpConnection {})),
            },
        ),
        p(
            "ProcessCallable",
            "command",
            ProcessCallable {
                command: s(),
                ..Default::default()
            },
        ),
        p(
            "ProcessCallable",
            "arguments",
            ProcessCallable {
                arguments: s(),
                ..Default::default()
            },
        ),
        p(
            "ProcessCallable",
            "environment_variables",
            ProcessCallable {
                environment_variables: [("k".to_string(), "v".to_string())].into(),
                ..Default::default()
            },
        ),
    ]
}

#[test]
fn the_worker_specification_matches_the_official_schema() {
    oracle::check(&["worker_spec.proto"], &worker_spec_probes(), &[]);
}
