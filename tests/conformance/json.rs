//! What the gRPC round trips still compare through: a small JSON value (expected values
//! built by hand, Python's reports parsed), base64, and the protobuf JSON mapping of
//! tether's messages, written by hand from the official schema.

use std::collections::BTreeMap;
use std::fmt;

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

/// A JSON value. Numbers keep their literal text (the protobuf JSON mapping writes 64-bit
/// integers as strings, everything numeric here is an integer).
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

static NULL: Json = Json::Null;

impl Json {
    pub fn num(value: impl fmt::Display) -> Json {
        Json::Num(value.to_string())
    }

    pub fn str(value: &str) -> Json {
        Json::Str(value.to_owned())
    }

    /// `self[key]`, `Null` when absent or not an object.
    pub fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(map) => map.get(key).unwrap_or(&NULL),
            _ => &NULL,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_arr(&self) -> &[Json] {
        match self {
            Json::Arr(items) => items,
            _ => &[],
        }
    }

    pub fn parse(text: &str) -> Result<Json, String> {
        let mut parser = Parser {
            chars: text.chars().collect(),
            at: 0,
        };
        let value = parser.value()?;
        parser.skip_ws();
        if parser.at != parser.chars.len() {
            return Err(format!("trailing characters at {}", parser.at));
        }
        Ok(value)
    }
}

impl fmt::Display for Json {
    /// Compact JSON, ASCII only (non-ASCII as `\u` escapes), keys sorted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn string(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
            f.write_str("\"")?;
            for c in s.chars() {
                match c {
                    '"' => f.write_str("\\\"")?,
                    '\\' => f.write_str("\\\\")?,
                    ' '..='~' => write!(f, "{c}")?,
                    _ => {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            write!(f, "\\u{unit:04x}")?;
                        }
                    }
                }
            }
            f.write_str("\"")
        }
        match self {
            Json::Null => f.write_str("null"),
            Json::Bool(b) => write!(f, "{b}"),
            Json::Num(n) => f.write_str(n),
            Json::Str(s) => string(f, s),
            Json::Arr(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Json::Obj(map) => {
                f.write_str("{")?;
                for (i, (key, value)) in map.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    string(f, key)?;
                    write!(f, ":{value}")?;
                }
                f.write_str("}")
            }
        }
    }
}

struct Parser {
    chars: Vec<char>,
    at: usize,
}

impl Parser {
    fn skip_ws(&mut self) {
        while self
            .chars
            .get(self.at)
            .is_some_and(|c| c.is_ascii_whitespace())
        {
            self.at += 1;
        }
    }

    fn next(&mut self) -> Result<char, String> {
        let c = *self.chars.get(self.at).ok_or("unexpected end of JSON")?;
        self.at += 1;
        Ok(c)
    }

    fn literal(&mut self, word: &str, value: Json) -> Result<Json, String> {
        for expected in word.chars() {
            if self.next()? != expected {
                return Err(format!("bad literal at {}", self.at));
            }
        }
        Ok(value)
    }

    fn value(&mut self) -> Result<Json, String> {
        self.skip_ws();
        match self.chars.get(self.at).copied().ok_or("unexpected end")? {
            'n' => self.literal("null", Json::Null),
            't' => self.literal("true", Json::Bool(true)),
            'f' => self.literal("false", Json::Bool(false)),
            '"' => Ok(Json::Str(self.string()?)),
            '[' => {
                self.at += 1;
                let mut items = Vec::new();
                loop {
                    self.skip_ws();
                    if self.chars.get(self.at) == Some(&']') {
                        self.at += 1;
                        return Ok(Json::Arr(items));
                    }
                    if !items.is_empty() && self.next()? != ',' {
                        return Err(format!("expected ',' at {}", self.at));
                    }
                    items.push(self.value()?);
                }
            }
            '{' => {
                self.at += 1;
                let mut map = BTreeMap::new();
                loop {
                    self.skip_ws();
                    if self.chars.get(self.at) == Some(&'}') {
                        self.at += 1;
                        return Ok(Json::Obj(map));
                    }
                    if !map.is_empty() {
                        if self.next()? != ',' {
                            return Err(format!("expected ',' at {}", self.at));
                        }
                        self.skip_ws();
                    }
                    let key = self.string()?;
                    self.skip_ws();
                    if self.next()? != ':' {
                        return Err(format!("expected ':' at {}", self.at));
                    }
                    let value = self.value()?;
                    map.insert(key, value);
                }
            }
            c if c == '-' || c.is_ascii_digit() => {
                let start = self.at;
                while self
                    .chars
                    .get(self.at)
                    .is_some_and(|c| matches!(c, '0'..='9' | '-' | '+' | '.' | 'e' | 'E'))
                {
                    self.at += 1;
                }
                Ok(Json::Num(self.chars[start..self.at].iter().collect()))
            }
            c => Err(format!("unexpected {c:?} at {}", self.at)),
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let mut value = 0;
        for _ in 0..4 {
            let digit = self.next()?.to_digit(16).ok_or("bad \\u escape")?;
            value = value * 16 + digit;
        }
        Ok(value)
    }

    fn string(&mut self) -> Result<String, String> {
        if self.next()? != '"' {
            return Err(format!("expected a string at {}", self.at));
        }
        let mut out = String::new();
        loop {
            match self.next()? {
                '"' => return Ok(out),
                '\\' => match self.next()? {
                    '"' => out.push('"'),
                    '\\' => out.push('\\'),
                    '/' => out.push('/'),
                    'b' => out.push('\u{8}'),
                    'f' => out.push('\u{c}'),
                    'n' => out.push('\n'),
                    'r' => out.push('\r'),
                    't' => out.push('\t'),
                    'u' => {
                        let mut code = self.hex4()?;
                        if (0xD800..0xDC00).contains(&code) {
                            if self.next()? != '\\' || self.next()? != 'u' {
                                return Err("lone surrogate".into());
                            }
                            let low = self.hex4()?;
                            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                        }
                        out.push(char::from_u32(code).ok_or("bad code point")?);
                    }
                    c => return Err(format!("bad escape \\{c}")),
                },
                c => out.push(c),
            }
        }
    }
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

// =============================================================================================
// The protobuf JSON mapping of tether's messages, written by hand from the official schema
// =============================================================================================

/// Builds a JSON object field by field following the proto3 JSON mapping as
/// `json_format.MessageToDict(preserving_proto_field_name=True)` prints it: fields without
/// presence are left out at their default, fields with presence whenever set.
#[derive(Default)]
pub struct Obj(BTreeMap<String, Json>);

impl Obj {
    pub fn new() -> Self {
        Obj::default()
    }

    pub fn set(mut self, key: &str, value: Json) -> Self {
        self.0.insert(key.to_owned(), value);
        self
    }

    /// A field with presence (proto3 `optional`, messages, oneof branches).
    fn opt(self, key: &str, value: Option<Json>) -> Self {
        match value {
            Some(value) => self.set(key, value),
            None => self,
        }
    }

    /// An implicit-presence `string`.
    fn string(self, key: &str, value: &str) -> Self {
        self.opt(key, (!value.is_empty()).then(|| Json::str(value)))
    }

    /// An implicit-presence `bytes`.
    fn bytes(self, key: &str, value: &[u8]) -> Self {
        self.opt(key, (!value.is_empty()).then(|| bytes_json(value)))
    }

    /// An implicit-presence `bool`.
    fn boolean(self, key: &str, value: bool) -> Self {
        self.opt(key, value.then_some(Json::Bool(true)))
    }

    /// An implicit-presence enum field.
    fn enumeration(self, key: &str, value: i32, name: fn(i32) -> Json) -> Self {
        self.opt(key, (value != 0).then(|| name(value)))
    }

    /// A `map<string, string>`.
    fn map(self, key: &str, map: &BTreeMap<String, String>) -> Self {
        let entries = map.iter().map(|(k, v)| (k.clone(), Json::str(v))).collect();
        self.opt(key, (!map.is_empty()).then_some(Json::Obj(entries)))
    }

    /// A `repeated` field.
    fn list(self, key: &str, items: Vec<Json>) -> Self {
        self.opt(key, (!items.is_empty()).then_some(Json::Arr(items)))
    }

    pub fn done(self) -> Json {
        Json::Obj(self.0)
    }
}

/// `bytes`: standard base64 with padding.
fn bytes_json(value: &[u8]) -> Json {
    Json::Str(base64(value))
}

/// `int64`: a decimal string.
fn int64_json(value: i64) -> Json {
    Json::Str(value.to_string())
}

/// An enum value: its name when known, else the number (proto3 enums are open).
fn data_format_json(value: i32) -> Json {
    match UdfWorkerDataFormat::try_from(value) {
        Ok(format) => Json::str(format.as_str_name()),
        Err(_) => Json::num(value),
    }
}

fn pattern_json(value: i32) -> Json {
    match UdfProtoCommunicationPattern::try_from(value) {
        Ok(pattern) => Json::str(pattern.as_str_name()),
        Err(_) => Json::num(value),
    }
}

/// The protobuf JSON of a message.
pub trait ToJson {
    fn json(&self) -> Json;
}

/// A message field: `Some(json)` when set.
fn msg<T: ToJson>(value: &Option<T>) -> Option<Json> {
    value.as_ref().map(ToJson::json)
}

impl ToJson for UdfRequest {
    fn json(&self) -> Json {
        use udf_request::Request;
        match &self.request {
            None => Obj::new(),
            Some(Request::Control(c)) => Obj::new().set("control", c.json()),
            Some(Request::Data(d)) => Obj::new().set("data", d.json()),
        }
        .done()
    }
}

impl ToJson for UdfResponse {
    fn json(&self) -> Json {
        use udf_response::Response;
        match &self.response {
            None => Obj::new(),
            Some(Response::Control(c)) => Obj::new().set("control", c.json()),
            Some(Response::Data(d)) => Obj::new().set("data", d.json()),
        }
        .done()
    }
}

impl ToJson for UdfControlRequest {
    fn json(&self) -> Json {
        use udf_control_request::Control;
        match &self.control {
            None => Obj::new(),
            Some(Control::Init(m)) => Obj::new().set("init", m.json()),
            Some(Control::Payload(m)) => Obj::new().set("payload", m.json()),
            Some(Control::Finish(m)) => Obj::new().set("finish", m.json()),
            Some(Control::Cancel(m)) => Obj::new().set("cancel", m.json()),
        }
        .done()
    }
}

impl ToJson for UdfControlResponse {
    fn json(&self) -> Json {
        use udf_control_response::Control;
        match &self.control {
            None => Obj::new(),
            Some(Control::Init(m)) => Obj::new().set("init", m.json()),
            Some(Control::Finish(m)) => Obj::new().set("finish", m.json()),
            Some(Control::Cancel(m)) => Obj::new().set("cancel", m.json()),
            Some(Control::Error(m)) => Obj::new().set("error", m.json()),
        }
        .done()
    }
}

impl ToJson for Init {
    fn json(&self) -> Json {
        Obj::new()
            .opt("protocol_version", self.protocol_version.map(Json::num))
            .enumeration("data_format", self.data_format, data_format_json)
            .opt("udf", msg(&self.udf))
            .opt(
                "is_chunking_payload",
                self.is_chunking_payload.map(Json::Bool),
            )
            .opt("input_schema", self.input_schema.as_deref().map(bytes_json))
            .opt(
                "output_schema",
                self.output_schema.as_deref().map(bytes_json),
            )
            .map("task_context", &self.task_context)
            .map("session_conf", &self.session_conf)
            .opt("timezone", self.timezone.as_deref().map(Json::str))
            .opt("parameters", self.parameters.as_deref().map(bytes_json))
            .done()
    }
}

impl ToJson for UdfPayload {
    fn json(&self) -> Json {
        Obj::new()
            .bytes("payload", &self.payload)
            .string("format", &self.format)
            .opt("payload_size", self.payload_size.map(int64_json))
            .opt("payload_crc32", self.payload_crc32.map(Json::num))
            .opt("name", self.name.as_deref().map(Json::str))
            .opt("eval_type", self.eval_type.as_deref().map(Json::str))
            .done()
    }
}

impl ToJson for InitResponse {
    fn json(&self) -> Json {
        Obj::new()
            .opt("data", self.data.as_deref().map(bytes_json))
            .opt("error", msg(&self.error))
            .done()
    }
}

impl ToJson for PayloadChunk {
    fn json(&self) -> Json {
        Obj::new()
            .bytes("data", &self.data)
            .opt("last", self.last.map(Json::Bool))
            .done()
    }
}

impl ToJson for DataRequest {
    fn json(&self) -> Json {
        Obj::new().bytes("data", &self.data).done()
    }
}

impl ToJson for DataResponse {
    fn json(&self) -> Json {
        Obj::new().bytes("data", &self.data).done()
    }
}

impl ToJson for Finish {
    fn json(&self) -> Json {
        Obj::new().done()
    }
}

impl ToJson for FinishResponse {
    fn json(&self) -> Json {
        Obj::new()
            .map("metrics", &self.metrics)
            .opt("data", self.data.as_deref().map(bytes_json))
            .opt("error", msg(&self.error))
            .done()
    }
}

impl ToJson for Cancel {
    fn json(&self) -> Json {
        Obj::new()
            .opt("reason", self.reason.as_deref().map(Json::str))
            .done()
    }
}

impl ToJson for CancelResponse {
    fn json(&self) -> Json {
        Obj::new()
            .map("metrics", &self.metrics)
            .opt("error", msg(&self.error))
            .done()
    }
}

impl ToJson for ErrorResponse {
    fn json(&self) -> Json {
        Obj::new().opt("error", msg(&self.error)).done()
    }
}

impl ToJson for ExecutionError {
    fn json(&self) -> Json {
        use execution_error::Kind;
        match &self.kind {
            None => Obj::new(),
            Some(Kind::User(e)) => Obj::new().set("user", e.json()),
            Some(Kind::Worker(e)) => Obj::new().set("worker", e.json()),
            Some(Kind::Protocol(e)) => Obj::new().set("protocol", e.json()),
        }
        .done()
    }
}

impl ToJson for UserError {
    fn json(&self) -> Json {
        Obj::new()
            .string("message", &self.message)
            .opt("traceback", self.traceback.as_deref().map(Json::str))
            .opt("error_class", self.error_class.as_deref().map(Json::str))
            .done()
    }
}

impl ToJson for WorkerError {
    fn json(&self) -> Json {
        Obj::new()
            .string("message", &self.message)
            .opt("traceback", self.traceback.as_deref().map(Json::str))
            .done()
    }
}

impl ToJson for ProtocolError {
    fn json(&self) -> Json {
        Obj::new().string("message", &self.message).done()
    }
}

impl ToJson for WorkerRequest {
    fn json(&self) -> Json {
        use worker_request::Manage;
        match &self.manage {
            None => Obj::new(),
            Some(Manage::Heartbeat(m)) => Obj::new().set("heartbeat", m.json()),
            Some(Manage::Shutdown(m)) => Obj::new().set("shutdown", m.json()),
        }
        .done()
    }
}

impl ToJson for WorkerResponse {
    fn json(&self) -> Json {
        use worker_response::Manage;
        match &self.manage {
            None => Obj::new(),
            Some(Manage::Heartbeat(m)) => Obj::new().set("heartbeat", m.json()),
            Some(Manage::Shutdown(m)) => Obj::new().set("shutdown", m.json()),
        }
        .done()
    }
}

impl ToJson for Heartbeat {
    fn json(&self) -> Json {
        Obj::new().done()
    }
}

impl ToJson for HeartbeatResponse {
    fn json(&self) -> Json {
        Obj::new().map("metrics", &self.metrics).done()
    }
}

impl ToJson for ShutdownRequest {
    fn json(&self) -> Json {
        Obj::new()
            .opt("reason", self.reason.as_deref().map(Json::str))
            .opt("cancel_sessions", self.cancel_sessions.map(Json::Bool))
            .done()
    }
}

impl ToJson for ShutdownResponse {
    fn json(&self) -> Json {
        Obj::new()
            .boolean("sessions_settled", self.sessions_settled)
            .done()
    }
}

impl ToJson for UdfWorkerSpecification {
    fn json(&self) -> Json {
        use udf_worker_specification::Worker;
        let obj = Obj::new()
            .opt("environment", msg(&self.environment))
            .opt("capabilities", msg(&self.capabilities));
        match &self.worker {
            None => obj,
            Some(Worker::Direct(direct)) => obj.set("direct", direct.json()),
        }
        .done()
    }
}

impl ToJson for WorkerEnvironment {
    fn json(&self) -> Json {
        Obj::new()
            .opt("installation", msg(&self.installation))
            .opt(
                "environment_verification",
                msg(&self.environment_verification),
            )
            .opt("environment_cleanup", msg(&self.environment_cleanup))
            .done()
    }
}

impl ToJson for WorkerCapabilities {
    fn json(&self) -> Json {
        let formats = self
            .supported_data_formats
            .iter()
            .map(|v| data_format_json(*v));
        let patterns = self
            .supported_communication_patterns
            .iter()
            .map(|v| pattern_json(*v));
        Obj::new()
            .list("supported_data_formats", formats.collect())
            .list("supported_communication_patterns", patterns.collect())
            .opt(
                "supports_concurrent_udfs",
                self.supports_concurrent_udfs.map(Json::Bool),
            )
            .opt("supports_reuse", self.supports_reuse.map(Json::Bool))
            .done()
    }
}

impl ToJson for DirectWorker {
    fn json(&self) -> Json {
        Obj::new()
            .opt("runner", msg(&self.runner))
            .opt("properties", msg(&self.properties))
            .done()
    }
}

impl ToJson for UdfWorkerProperties {
    fn json(&self) -> Json {
        Obj::new()
            .opt(
                "initialization_timeout_ms",
                self.initialization_timeout_ms.map(Json::num),
            )
            .opt(
                "graceful_termination_timeout_ms",
                self.graceful_termination_timeout_ms.map(Json::num),
            )
            .opt("connection", msg(&self.connection))
            .done()
    }
}

impl ToJson for WorkerConnectionSpec {
    fn json(&self) -> Json {
        use worker_connection_spec::Transport;
        match &self.transport {
            None => Obj::new(),
            Some(Transport::UnixDomainSocket(m)) => Obj::new().set("unix_domain_socket", m.json()),
            Some(Transport::Tcp(m)) => Obj::new().set("tcp", m.json()),
        }
        .done()
    }
}

impl ToJson for UnixDomainSocket {
    fn json(&self) -> Json {
        Obj::new().done()
    }
}

impl ToJson for LocalTcpConnection {
    fn json(&self) -> Json {
        Obj::new().done()
    }
}

impl ToJson for ProcessCallable {
    fn json(&self) -> Json {
        let strings = |v: &[String]| v.iter().map(|s| Json::str(s)).collect();
        Obj::new()
            .list("command", strings(&self.command))
            .list("arguments", strings(&self.arguments))
            .map("environment_variables", &self.environment_variables)
            .done()
    }
}
