//! tether's messages field by field, under tether's own field names: what `proto_check.py`
//! needs to build the same message with the official classes by name (udf §1).
//!
//! Building by name is what ties each Rust field to its official field: the bytes alone
//! cannot tell two fields of one wire type apart, for example two oneof branches whose
//! messages are both empty (`unix_domain_socket` and `tcp`), or an `int64` from a `sint64`.
//!
//! The JSON form of one field's value, `null` when it is not set:
//!
//! | tether's type                     | JSON                                         |
//! | --------------------------------- | -------------------------------------------- |
//! | integers, enums (`i32`)           | a number                                     |
//! | `bool`, `String`                  | a boolean, a string                          |
//! | `Bytes`                           | `{"bytes": "<base64>"}`                      |
//! | a message                         | `{"message": "<base64 of tether's bytes>"}`  |
//! | `Vec<T>`                          | an array                                     |
//! | `BTreeMap<String, String>`        | `{"map": {…}}`                               |
//! | a oneof (`Option` of its enum)    | `{"oneof": "<Variant>", "value": <value>}`   |
//!
//! A message's fields are listed once per type below, by exhaustive destructuring: a field
//! added to a prost type and not listed here does not compile.

use std::collections::BTreeMap;

use base64::prelude::{BASE64_STANDARD, Engine as _};
use bytes::Bytes;
use prost::Message;
use serde_json::{Map, Value, json};
use tether::wire::{
    Cancel, CancelResponse, DataRequest, DataResponse, DirectWorker, ErrorResponse, ExecutionError,
    Finish, FinishResponse, Heartbeat, HeartbeatResponse, Init, InitResponse, LocalTcpConnection,
    PayloadChunk, ProcessCallable, ProtocolError, ShutdownRequest, ShutdownResponse,
    UdfControlRequest, UdfControlResponse, UdfPayload, UdfRequest, UdfResponse,
    UdfWorkerProperties, UdfWorkerSpecification, UnixDomainSocket, UserError, WorkerCapabilities,
    WorkerConnectionSpec, WorkerEnvironment, WorkerError, WorkerRequest, WorkerResponse,
    execution_error, udf_control_request, udf_control_response, udf_request, udf_response,
    udf_worker_specification, worker_connection_spec, worker_request, worker_response,
};

/// One field's value in the JSON form of the module docs.
pub trait Field {
    fn value(&self) -> Value;
}

/// Every field of a message by tether's name (a oneof by the name of its `Option` field).
pub trait Fields {
    fn fields(&self) -> Map<String, Value>;
}

macro_rules! scalars {
    ($($ty:ty),*) => {$(
        impl Field for $ty {
            fn value(&self) -> Value {
                json!(self)
            }
        }
    )*};
}

scalars!(i32, i64, u32, bool, String);

impl Field for Bytes {
    fn value(&self) -> Value {
        json!({ "bytes": BASE64_STANDARD.encode(self) })
    }
}

impl Field for BTreeMap<String, String> {
    fn value(&self) -> Value {
        json!({ "map": self })
    }
}

impl<T: Field> Field for Option<T> {
    fn value(&self) -> Value {
        self.as_ref().map_or(Value::Null, Field::value)
    }
}

impl<T: Field> Field for Vec<T> {
    fn value(&self) -> Value {
        Value::Array(self.iter().map(Field::value).collect())
    }
}

impl<T: Field> Field for Box<T> {
    fn value(&self) -> Value {
        T::value(self)
    }
}

/// The message types: their fields, and their value as a field of another message.
macro_rules! messages {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {$(
        impl Fields for $ty {
            fn fields(&self) -> Map<String, Value> {
                let $ty { $($field),* } = self;
                Map::from_iter([$((stringify!($field).to_owned(), Field::value($field))),*])
            }
        }

        impl Field for $ty {
            fn value(&self) -> Value {
                json!({ "message": BASE64_STANDARD.encode(self.encode_to_vec()) })
            }
        }
    )*};
}

messages! {
    UdfRequest { request }
    UdfResponse { response }
    UdfControlRequest { control }
    UdfControlResponse { control }
    Init {
        protocol_version, data_format, udf, is_chunking_payload, input_schema, output_schema,
        task_context, session_conf, timezone, parameters,
    }
    UdfPayload { payload, format, payload_size, payload_crc32, name, eval_type }
    InitResponse { data, error }
    PayloadChunk { data, last }
    DataRequest { data }
    DataResponse { data }
    Finish {}
    FinishResponse { metrics, data, error }
    Cancel { reason }
    CancelResponse { metrics, error }
    ErrorResponse { error }
    ExecutionError { kind }
    UserError { message, traceback, error_class }
    WorkerError { message, traceback }
    ProtocolError { message }
    WorkerRequest { manage }
    WorkerResponse { manage }
    Heartbeat {}
    HeartbeatResponse { metrics }
    ShutdownRequest { reason, cancel_sessions }
    ShutdownResponse { sessions_settled }
    UdfWorkerSpecification { environment, capabilities, worker }
    WorkerEnvironment { installation, environment_verification, environment_cleanup }
    WorkerCapabilities {
        supported_data_formats, supported_communication_patterns, supports_concurrent_udfs,
        supports_reuse,
    }
    DirectWorker { runner, properties }
    UdfWorkerProperties { initialization_timeout_ms, graceful_termination_timeout_ms, connection }
    WorkerConnectionSpec { transport }
    UnixDomainSocket {}
    LocalTcpConnection {}
    ProcessCallable { command, arguments, environment_variables }
}

/// The oneof enums: the branch by its Rust variant name (prost names it after the official
/// field, in UpperCamelCase), and the branch's value. The `match` is exhaustive.
macro_rules! oneofs {
    ($($ty:path { $($variant:ident),* $(,)? })*) => {$(
        impl Field for $ty {
            fn value(&self) -> Value {
                match self {
                    $(Self::$variant(value) => {
                        json!({ "oneof": stringify!($variant), "value": value.value() })
                    })*
                }
            }
        }
    )*};
}

oneofs! {
    udf_request::Request { Control, Data }
    udf_response::Response { Control, Data }
    udf_control_request::Control { Init, Payload, Finish, Cancel }
    udf_control_response::Control { Init, Finish, Cancel, Error }
    execution_error::Kind { User, Worker, Protocol }
    worker_request::Manage { Heartbeat, Shutdown }
    worker_response::Manage { Heartbeat, Shutdown }
    udf_worker_specification::Worker { Direct }
    worker_connection_spec::Transport { UnixDomainSocket, Tcp }
}
