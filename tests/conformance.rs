//! Wire conformance against Spark 4.3.0's official schema, checked by the official Python
//! implementation (udf §1).
//!
//! The `.proto` files are never copied here: `tests/python/udf_protos.py` locates them with
//! the oracle's extraction script and compiles them with grpcio-tools (pinned in
//! `tests/python/requirements.txt`) into `target/py-gen/`. The Python venv lives at
//! `target/py-venv`, set up by `scripts/python-env.sh` (which `scripts/test.sh` runs first);
//! `TETHER_PYTHON` overrides the interpreter. Without it these tests print a loud
//! `SKIPPED: …` line, and fail under `CI=true`.
//!
//! - [`every_message_type_matches_the_official_schema_both_ways`]: every message type of
//!   the four files, with no field set and with every field set (each oneof branch, maps
//!   with entries, optional fields at their zero values, unknown enum values): tether's bytes
//!   decode in Python to the same values (compared as protobuf JSON built here by hand), and
//!   the bytes Python encodes from those values decode in tether to the same values.
//! - `grpc::*` (feature `grpc`): a tether engine [`Session`](tether::worker::engine::Session)
//!   drives a Python grpcio worker, and a Python grpcio engine drives a tether worker
//!   ([`WorkerServer`](tether::spark::udf_grpc::WorkerServer) + `endpoint::serve`), over a
//!   Unix socket, through finish, cancel and error; messages of 3.9, 6 and 20 MiB cross in
//!   both directions.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use bytes::Bytes;
use prost::Message;
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

// =============================================================================================
// The Python environment
// =============================================================================================

/// The Python interpreter of the venv and the scripts directory.
struct PythonEnv {
    python: PathBuf,
    scripts: PathBuf,
}

/// Exit status of the Python helpers for an environment problem (see `udf_protos.py`).
const PY_ENV_ERROR: i32 = 3;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's Python, checked by a preflight that validates the pinned packages and
/// generates the classes; `None` (after a loud message) when it cannot run.
///
/// # Panics
/// Under `CI=true` instead of returning `None`.
fn python_env(test: &str) -> Option<PythonEnv> {
    let python = match std::env::var_os("TETHER_PYTHON") {
        Some(path) => repo().join(path),
        None => repo().join("target/py-venv/bin/python"),
    };
    if !python.exists() {
        return unavailable(
            test,
            &format!("no Python venv at {} (no python3?)", python.display()),
        );
    }
    let env = PythonEnv {
        python,
        scripts: repo().join("tests/python"),
    };
    let preflight = env
        .command("udf_protos.py")
        .arg("--generate")
        .output()
        .expect("the venv's python runs");
    match preflight.status.code() {
        Some(0) => Some(env),
        Some(PY_ENV_ERROR) => unavailable(test, String::from_utf8_lossy(&preflight.stderr).trim()),
        _ => panic!(
            "udf_protos.py --generate failed: {}",
            String::from_utf8_lossy(&preflight.stderr)
        ),
    }
}

fn unavailable<T>(test: &str, why: &str) -> Option<T> {
    let why = format!(
        "the Python conformance peer cannot run: {why}. Run scripts/test.sh (or `bash \
         scripts/python-env.sh` once) to set up target/py-venv"
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("FAILED (CI=true, no skipping): {test}: {why}");
    }
    // Straight to the process's stderr, past the test harness's capture, so it is seen.
    let _ = writeln!(std::io::stderr(), "\n!!!!! SKIPPED: {test}: {why} !!!!!\n");
    None
}

impl PythonEnv {
    fn command(&self, script: &str) -> Command {
        let mut command = Command::new(&self.python);
        command
            .arg(self.scripts.join(script))
            .env("PYTHONIOENCODING", "utf-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(repo());
        command
    }

    /// Runs `script` with `input` on stdin; its whole output.
    fn run(&self, script: &str, input: Vec<u8>) -> Output {
        let mut child = self
            .command(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the venv's python starts");
        let mut stdin = child.stdin.take().expect("piped stdin");
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let output = child.wait_with_output().expect("python ran");
        writer
            .join()
            .expect("writer thread")
            .expect("stdin written");
        output
    }
}

// =============================================================================================
// A small JSON value: expected values built by hand, Python's reports parsed
// =============================================================================================

/// A JSON value. Numbers keep their literal text (the protobuf JSON mapping writes 64-bit
/// integers as strings, everything numeric here is an integer).
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

static NULL: Json = Json::Null;

impl Json {
    fn num(value: impl fmt::Display) -> Json {
        Json::Num(value.to_string())
    }

    fn str(value: &str) -> Json {
        Json::Str(value.to_owned())
    }

    fn strs(values: &[&str]) -> Json {
        Json::Arr(values.iter().map(|v| Json::str(v)).collect())
    }

    /// `self[key]`, `Null` when absent or not an object.
    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(map) => map.get(key).unwrap_or(&NULL),
            _ => &NULL,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    fn as_arr(&self) -> &[Json] {
        match self {
            Json::Arr(items) => items,
            _ => &[],
        }
    }

    fn parse(text: &str) -> Result<Json, String> {
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digits"))
        .collect()
}

// =============================================================================================
// The protobuf JSON mapping of tether's messages, written by hand from the official schema
// =============================================================================================

/// Builds a JSON object field by field following the proto3 JSON mapping as
/// `json_format.MessageToDict(preserving_proto_field_name=True)` prints it: fields without
/// presence are left out at their default, fields with presence whenever set.
#[derive(Default)]
struct Obj(BTreeMap<String, Json>);

impl Obj {
    fn new() -> Self {
        Obj::default()
    }

    fn set(mut self, key: &str, value: Json) -> Self {
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

    fn done(self) -> Json {
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
trait ToJson {
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

// =============================================================================================
// Fixtures: every message type, empty and with every field set
// =============================================================================================

type DecodeCheck = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// One value of one message type: tether's bytes, the expected values as protobuf JSON, and
/// a check that bytes decode in tether to that same value.
struct Case {
    proto: &'static str,
    name: String,
    bytes: Vec<u8>,
    expected: Json,
    decodes_to_value: DecodeCheck,
}

fn case<M>(proto: &'static str, name: &str, value: M) -> Case
where
    M: Message + Default + PartialEq + fmt::Debug + ToJson + 'static,
{
    let bytes = value.encode_to_vec();
    let expected = value.json();
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
        expected,
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
        payload_size: Some(9_007_199_254_740_993), // 2^53 + 1: exact only as a JSON string
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

fn protocol_error() -> ProtocolError {
    ProtocolError {
        message: text("DataRequest before InitResponse"),
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
        error: Some(error(execution_error::Kind::Protocol(protocol_error()))),
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
        // An unknown value (9) and the zero value must survive as numbers/names.
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
fn cases() -> Vec<Case> {
    use execution_error::Kind;
    use udf_control_request::Control as Req;
    use udf_control_response::Control as Resp;
    vec![
        // ---- udf_message.proto: Execute envelopes
        case("UdfRequest", "empty", UdfRequest::default()),
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
                    Resp::Finish(full_finish_response()),
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
            control_response(Resp::Init(InitResponse {
                data: Some(blob(9, 9)),
                error: None,
            })),
        ),
        case(
            "UdfControlResponse",
            "full_finish",
            control_response(Resp::Finish(full_finish_response())),
        ),
        case(
            "UdfControlResponse",
            "full_cancel",
            control_response(Resp::Cancel(full_cancel_response())),
        ),
        case(
            "UdfControlResponse",
            "full_error",
            control_response(Resp::Error(ErrorResponse {
                error: Some(error(Kind::User(user_error()))),
            })),
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
                error: Some(error(Kind::Protocol(protocol_error()))),
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
            error(Kind::Protocol(protocol_error())),
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
const SCHEMA_TYPES: [&str; 34] = [
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
const MAP_ENTRY_DEFAULT_CASES: [&str; 2] = [
    "Init / explicit_zero_values",
    "FinishResponse / explicit_zero_values",
];

// =============================================================================================
// Part 1: message conformance
// =============================================================================================

#[test]
fn every_message_type_matches_the_official_schema_both_ways() {
    let Some(env) = python_env("every_message_type_matches_the_official_schema_both_ways") else {
        return;
    };
    let cases = cases();
    let request = Obj::new()
        .set(
            "cases",
            Json::Arr(
                cases
                    .iter()
                    .map(|c| {
                        Obj::new()
                            .set("type", Json::str(c.proto))
                            .set("case", Json::str(&c.name))
                            .set("hex", Json::Str(hex(&c.bytes)))
                            .set("expected", c.expected.clone())
                            .done()
                    })
                    .collect(),
            ),
        )
        .set(
            "enums",
            Json::strs(&["UDFWorkerDataFormat", "UDFProtoCommunicationPattern"]),
        )
        .done();

    let output = env.run("proto_check.py", request.to_string().into_bytes());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        matches!(output.status.code(), Some(0 | 1)),
        "proto_check.py failed ({}): {stderr}",
        output.status
    );
    let report = Json::parse(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));

    // Coverage, against the official descriptors: every type, every field, every branch.
    let official: Vec<&str> = report
        .get("schema_types")
        .as_arr()
        .iter()
        .filter_map(Json::as_str)
        .collect();
    assert_eq!(official, SCHEMA_TYPES, "the official message types");
    assert_eq!(
        report.get("missing_types"),
        &Json::Arr(vec![]),
        "types without an empty and a full case"
    );
    assert_eq!(
        report.get("unset_fields"),
        &Json::Obj(BTreeMap::new()),
        "fields no full case sets"
    );

    let results = report.get("results").as_arr();
    assert_eq!(results.len(), cases.len());
    let mut failures = Vec::new();
    let mut identical_bytes = 0;
    for (case, result) in cases.iter().zip(results) {
        let label = format!("{} / {}", case.proto, case.name);
        assert_eq!(result.get("type").as_str(), Some(case.proto));
        assert_eq!(result.get("case").as_str(), Some(case.name.as_str()));
        for error in result.get("errors").as_arr() {
            failures.push(format!(
                "{label}: python: {}",
                error.as_str().unwrap_or("?")
            ));
        }
        // tether -> Python: the official decoder saw exactly the values tether encoded.
        if result.get("decoded") != &case.expected {
            failures.push(format!(
                "{label}: official decode {} != expected {}",
                result.get("decoded"),
                case.expected
            ));
        }
        // Python -> tether: the official encoder's bytes decode in tether to the same value.
        let Some(python_hex) = result.get("python_hex").as_str() else {
            failures.push(format!("{label}: no bytes from Python"));
            continue;
        };
        let python_bytes = unhex(python_hex);
        if let Err(e) = (case.decodes_to_value)(&python_bytes) {
            failures.push(format!("{label}: Python's bytes in tether: {e}"));
        }
        if case.name == "empty" {
            assert!(
                case.bytes.is_empty(),
                "{label}: tether encodes an empty message"
            );
            assert!(
                python_bytes.is_empty(),
                "{label}: Python encodes an empty message"
            );
        }
        if python_bytes == case.bytes {
            identical_bytes += 1;
        } else if !MAP_ENTRY_DEFAULT_CASES.contains(&label.as_str()) {
            // Both sides encode fields in number order and maps sorted by key, so anything
            // but map entries at their default values must come out byte for byte the same.
            failures.push(format!(
                "{label}: encodings differ: tether {} python {}",
                hex(&case.bytes),
                python_hex
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!(output.status.code(), Some(0), "{stderr}");

    // The enums: every official name maps to tether's value and back.
    let enums = report.get("enums");
    let check_enum = |name: &str, tether: &dyn Fn(&str) -> Option<i32>, count: usize| {
        let Json::Obj(values) = enums.get(name) else {
            panic!("no enum {name} in the report");
        };
        assert_eq!(values.len(), count, "{name} values");
        for (value_name, number) in values {
            assert_eq!(
                tether(value_name).map(|v| v.to_string()),
                Some(number.to_string()),
                "{name}.{value_name}"
            );
        }
    };
    check_enum(
        "UDFWorkerDataFormat",
        &|n| UdfWorkerDataFormat::from_str_name(n).map(|v| v as i32),
        2,
    );
    check_enum(
        "UDFProtoCommunicationPattern",
        &|n| UdfProtoCommunicationPattern::from_str_name(n).map(|v| v as i32),
        2,
    );

    let versions = report.get("versions");
    eprintln!(
        "conformance: {} message types, {} cases ({} byte-identical both ways), protobuf {} ({}), grpcio-tools {}",
        SCHEMA_TYPES.len(),
        cases.len(),
        identical_bytes,
        versions.get("protobuf").as_str().unwrap_or("?"),
        versions.get("protobuf_backend").as_str().unwrap_or("?"),
        versions.get("grpcio-tools").as_str().unwrap_or("?"),
    );
}

// =============================================================================================
// Parts 2 and 3: cross-implementation gRPC round trips over a Unix socket
// =============================================================================================

#[cfg(feature = "grpc")]
mod grpc {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::process::Stdio;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use tether::spark::udf_grpc::{
        GrpcChannel, GrpcConfig, GrpcEngineConnection, WorkerServer, WorkerService,
    };
    use tether::wire::{
        CancelResponse, ExecutionError, FinishResponse, Init, ShutdownRequest, UdfPayload,
        UdfWorkerDataFormat, execution_error,
    };

    use tether::worker::endpoint::{EndpointConfig, EndpointOutcome, EngineViolation, Udf, serve};
    use tether::worker::engine::WorkerEndpoint;
    use tether::worker::engine::{
        CountingHandle, Session, SessionConfig, SessionError, TerminationKind, WorkerHandle,
    };
    use tether::worker::state;
    use tokio::io::{AsyncBufReadExt, BufReader, Lines};
    use tokio::process::{Child, ChildStdout};
    use tokio::sync::mpsc;

    use super::{Json, PythonEnv, ToJson, python_env};

    const MIB: usize = 1024 * 1024;
    /// The "Must show" sizes of issue 3: 3.9 MiB, 6 MiB and 20 MiB.
    const LARGE_SIZES: [usize; 3] = [39 * MIB / 10, 6 * MIB, 20 * MIB];
    /// Upper bound for anything that should happen promptly.
    const PROMPT: Duration = Duration::from_secs(30);

    /// A private socket directory (mode 0700), removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            use std::os::unix::fs::DirBuilderExt;
            let id = uuid::Uuid::new_v4().simple().to_string();
            let path = std::env::temp_dir().join(format!("tether-conf-{}", &id[..12]));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .expect("temp dir");
            TempDir(path)
        }

        fn socket(&self) -> PathBuf {
            self.0.join("w.sock")
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// `len` deterministic bytes that differ per `seed` (each side checks its own echo).
    fn pattern(len: usize, seed: u8) -> Bytes {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 13) as u8))
            .collect::<Vec<u8>>()
            .into()
    }

    fn strings(json: &Json) -> Vec<&str> {
        json.as_arr().iter().filter_map(Json::as_str).collect()
    }

    // -----------------------------------------------------------------------------------------
    // The Python worker, driven by a tether engine
    // -----------------------------------------------------------------------------------------

    /// `grpc_peer.py worker` on a Unix socket; its JSON event lines.
    struct PythonWorker {
        child: Child,
        events: Lines<BufReader<ChildStdout>>,
        /// Events read while waiting for another one.
        pending: Vec<Json>,
        endpoint: WorkerEndpoint,
        stderr: PathBuf,
        _dir: TempDir,
    }

    impl PythonWorker {
        async fn start(env: &PythonEnv) -> Self {
            let dir = TempDir::new();
            let stderr = dir.0.join("python-worker.stderr");
            let mut command = tokio::process::Command::from(env.command("grpc_peer.py"));
            let mut child = command
                .arg("worker")
                .arg("--socket")
                .arg(dir.socket())
                .stdin(Stdio::piped()) // kept open: the worker exits when it closes
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&stderr).expect("stderr file"))
                .kill_on_drop(true)
                .spawn()
                .expect("the Python worker starts");
            let stdout = child.stdout.take().expect("piped stdout");
            let mut worker = PythonWorker {
                child,
                events: BufReader::new(stdout).lines(),
                pending: Vec::new(),
                endpoint: WorkerEndpoint::Unix(dir.socket()),
                stderr,
                _dir: dir,
            };
            let ready = worker.event().await;
            assert_eq!(ready.get("event").as_str(), Some("ready"), "{ready}");
            worker
        }

        fn stderr(&self) -> String {
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        }

        /// The next event line.
        async fn event(&mut self) -> Json {
            let line = tokio::time::timeout(PROMPT, self.events.next_line())
                .await
                .unwrap_or_else(|_| panic!("no event from the Python worker: {}", self.stderr()))
                .expect("reading the Python worker's stdout");
            let Some(line) = line else {
                panic!("the Python worker exited: {}", self.stderr());
            };
            Json::parse(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
        }

        /// The first event (already read or still to come) for which `wanted` holds; the
        /// others stay pending. Sessions log when their handler ends, which need not be in
        /// the order the sessions ended.
        async fn event_where(&mut self, wanted: impl Fn(&Json) -> bool) -> Json {
            if let Some(at) = self.pending.iter().position(&wanted) {
                return self.pending.remove(at);
            }
            loop {
                let event = self.event().await;
                if wanted(&event) {
                    return event;
                }
                self.pending.push(event);
            }
        }

        /// What the Python worker saw of the `Execute` stream of the UDF named `name`.
        async fn session(&mut self, name: &str) -> Json {
            self.event_where(|e| {
                e.get("event").as_str() == Some("session")
                    && e.get("init").get("udf").get("name").as_str() == Some(name)
            })
            .await
        }

        async fn channel(&self) -> GrpcChannel {
            GrpcChannel::connect(&self.endpoint, &GrpcConfig::default())
                .await
                .unwrap_or_else(|e| panic!("the Python worker is ready: {e}: {}", self.stderr()))
        }
    }

    type GrpcSession = Session<state::Init, GrpcEngineConnection>;

    fn new_session(channel: &GrpcChannel) -> (GrpcSession, Arc<CountingHandle>) {
        let handle = Arc::new(CountingHandle::for_one_session());
        let connection = channel.open_session().expect("the channel is open");
        let session = Session::new(
            connection,
            handle.clone() as Arc<dyn WorkerHandle>,
            SessionConfig::default(),
        );
        (session, handle)
    }

    /// An `Init` with every field a real engine sets, its size and CRC matching `payload`.
    fn rich_init(payload: impl Into<Bytes>, name: &str) -> Init {
        let payload = payload.into();
        Init {
            protocol_version: Some(1),
            task_context: BTreeMap::from([
                ("partition_id".to_owned(), "7".to_owned()),
                ("stage_id".to_owned(), "3".to_owned()),
            ]),
            session_conf: BTreeMap::from([(
                "spark.sql.execution.arrow.maxRecordsPerBatch".to_owned(),
                "10000".to_owned(),
            )]),
            timezone: Some("Asia/Tokyo".to_owned()),
            parameters: Some(Bytes::from_static(b"\x00params\xff")),
            ..Init::new(
                UdfWorkerDataFormat::Arrow,
                UdfPayload {
                    payload_size: Some(payload.len() as i64),
                    payload_crc32: Some(crc32fast::hash(&payload)),
                    name: Some(name.to_owned()),
                    eval_type: Some("SQL_ARROW_BATCHED_UDF".to_owned()),
                    ..UdfPayload::new("echo", payload)
                },
            )
        }
    }

    /// The Init the Python worker logs: as sent, without the payload bytes.
    fn logged_init(init: &Init) -> Json {
        let mut shown = init.clone();
        if let Some(udf) = shown.udf.as_mut() {
            udf.payload = Bytes::new();
        }
        shown.json()
    }

    fn metrics(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Checks what the Python worker saw of one session.
    fn assert_python_saw(event: &Json, requests: &[&str], responses: &[&str], end: &str) {
        assert_eq!(
            strings(event.get("requests")),
            requests,
            "requests: {event}"
        );
        assert_eq!(
            strings(event.get("responses")),
            responses,
            "responses: {event}"
        );
        assert_eq!(event.get("end").as_str(), Some(end), "end: {event}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn tether_engine_drives_the_python_worker_through_finish_cancel_and_error() {
        let Some(env) =
            python_env("tether_engine_drives_the_python_worker_through_finish_cancel_and_error")
        else {
            return;
        };
        let started = Instant::now();
        let mut worker = PythonWorker::start(&env).await;
        let channel = worker.channel().await;

        // --- Finish: two batches echoed, FinishResponse with the Python worker's metrics.
        let init = rich_init(&b"finish-payload"[..], "finish");
        let (session, handle) = new_session(&channel);
        let (mut streaming, init_response) = session.init(init.clone()).await.expect("init");
        assert_eq!(init_response.data.as_deref(), Some(&b"python-worker"[..]));
        assert_eq!(init_response.error, None);
        for batch in [&b"alpha"[..], b"beta"] {
            streaming.send(Bytes::from(batch)).await.expect("send");
            assert_eq!(
                streaming.recv().await.expect("recv").as_deref(),
                Some(batch)
            );
        }
        let mut finishing = streaming.finish().await.expect("finish sent");
        assert_eq!(finishing.recv().await.expect("drained"), None);
        let termination = finishing.close().await;
        assert_eq!(
            termination.kind(),
            TerminationKind::Finished,
            "{termination}"
        );
        assert_eq!(
            termination.metrics(),
            Some(&metrics(&[
                ("status", "ok"),
                ("batches", "2"),
                ("bytes", "9")
            ]))
        );
        assert!(termination.execution_error().is_none());
        assert!(!handle.is_invalid());
        assert_eq!(handle.releases(), 1);
        let event = worker.session("finish").await;
        assert_python_saw(
            &event,
            &["init", "data", "data", "finish"],
            &["init", "data", "data", "finish"],
            "finish",
        );
        // The whole Init arrived with every value intact (official decoder's view).
        assert_eq!(event.get("init"), &logged_init(&init));
        assert_eq!(event.get("payload_len"), &Json::num(14));
        assert_eq!(
            event.get("payload_crc32"),
            &Json::num(crc32fast::hash(b"finish-payload"))
        );
        assert_eq!(
            event.get("data_sizes"),
            &Json::Arr(vec![Json::num(5), Json::num(4)])
        );

        // --- Cancel mid-stream: CancelResponse, the reason reaches Python.
        let (session, handle) = new_session(&channel);
        let (mut streaming, _) = session.init(rich_init(&b"c"[..], "cancel")).await.unwrap();
        streaming.send(Bytes::from_static(b"a")).await.unwrap();
        assert_eq!(streaming.recv().await.unwrap().as_deref(), Some(&b"a"[..]));
        let terminated = streaming
            .cancel(Some("tether cancel".into()))
            .await
            .wait()
            .await;
        assert_eq!(terminated.outcome().kind(), TerminationKind::Cancelled);
        let termination = terminated.close().await;
        assert_eq!(
            termination.kind(),
            TerminationKind::Cancelled,
            "{termination}"
        );
        assert_eq!(
            termination.metrics(),
            Some(&metrics(&[("status", "cancelled"), ("batches", "1")]))
        );
        assert!(termination.execution_error().is_none());
        assert!(!handle.is_invalid());
        let event = worker.session("cancel").await;
        assert_python_saw(
            &event,
            &["init", "data", "cancel"],
            &["init", "data", "cancel"],
            "cancel",
        );
        assert_eq!(event.get("cancel_reason").as_str(), Some("tether cancel"));

        // --- Error: the user error arrives in band, the engine answers with Cancel.
        let (session, handle) = new_session(&channel);
        let (mut streaming, _) = session.init(rich_init(&b"e"[..], "error")).await.unwrap();
        streaming.send(Bytes::from_static(b"ERROR")).await.ok();
        let error = streaming
            .recv()
            .await
            .expect_err("the worker reported an error");
        let SessionError::Execution(e) = &error else {
            panic!("expected an execution error, got {error}");
        };
        let Some(execution_error::Kind::User(user)) = &e.kind else {
            panic!("expected a user error, got {e:?}");
        };
        assert_eq!(user.message, "simulated user error");
        assert_eq!(user.error_class.as_deref(), Some("SimulatedError"));
        assert_eq!(
            user.traceback.as_deref(),
            Some("Traceback (most recent call last):\n  udf()")
        );
        let termination = streaming.close().await;
        assert_eq!(
            termination.kind(),
            TerminationKind::Cancelled,
            "{termination}"
        );
        assert_eq!(
            termination
                .execution_error()
                .and_then(ExecutionError::error_class),
            Some("SimulatedError")
        );
        assert!(!handle.is_invalid(), "a user error is not a worker fault");
        let event = worker.session("error").await;
        assert_python_saw(
            &event,
            &["init", "data", "cancel"],
            &["init", "error", "cancel"],
            "cancel",
        );

        // --- Init error: InitResponse.error, then Cancel / CancelResponse.
        let (session, _handle) = new_session(&channel);
        let failed = session
            .init(rich_init(&b"INIT_ERROR"[..], "init_error"))
            .await
            .expect_err("init must fail");
        let SessionError::Execution(e) = &failed.error else {
            panic!("expected an execution error, got {}", failed.error);
        };
        assert!(
            matches!(e.kind, Some(execution_error::Kind::Worker(_))),
            "{e:?}"
        );
        assert_eq!(e.message(), "python init failure");
        assert_eq!(
            failed.session.close().await.kind(),
            TerminationKind::Cancelled
        );
        let event = worker.session("init_error").await;
        assert_python_saw(&event, &["init", "cancel"], &["init", "cancel"], "cancel");

        // --- Chunked payload: the Python worker assembles the chunks and checks size + CRC.
        let payload = pattern(2 * MIB + 123, 9);
        let (session, _handle) = new_session(&channel);
        let mut init = rich_init(payload.clone(), "chunked");
        init.udf.as_mut().expect("udf").payload_size = None; // init_chunked sets it
        let (streaming, init_response) = session
            .init_chunked(init, MIB)
            .await
            .expect("chunked init accepted (size and CRC verified in Python)");
        assert_eq!(init_response.data.as_deref(), Some(&b"python-worker"[..]));
        let mut finishing = streaming.finish().await.unwrap();
        assert_eq!(finishing.recv().await.unwrap(), None);
        assert_eq!(finishing.close().await.kind(), TerminationKind::Finished);
        let event = worker.session("chunked").await;
        assert_python_saw(
            &event,
            &["init", "payload", "payload", "payload", "finish"],
            &["init", "finish"],
            "finish",
        );
        assert_eq!(event.get("payload_len"), &Json::num(payload.len()));
        assert_eq!(
            event.get("payload_crc32"),
            &Json::num(crc32fast::hash(&payload))
        );
        assert_eq!(
            event.get("init").get("is_chunking_payload"),
            &Json::Bool(true)
        );
        assert_eq!(
            event.get("init").get("udf").get("payload_size"),
            &Json::Str(payload.len().to_string())
        );

        // --- Manage: heartbeat metrics from Python, then shutdown; the worker exits 0.
        let heartbeat = channel.heartbeat().await.expect("heartbeat");
        assert_eq!(
            heartbeat.metrics,
            metrics(&[("worker", "python"), ("sessions", "5")])
        );
        let shutdown = channel
            .shutdown(ShutdownRequest {
                reason: Some("tether engine done".into()),
                cancel_sessions: Some(false),
            })
            .await
            .expect("shutdown");
        assert!(shutdown.sessions_settled);
        let event = worker
            .event_where(|e| e.get("event").as_str() == Some("shutdown"))
            .await;
        assert_eq!(event.get("reason").as_str(), Some("tether engine done"));
        assert_eq!(event.get("cancel_sessions"), &Json::Bool(false));
        let status = tokio::time::timeout(PROMPT, worker.child.wait())
            .await
            .expect("the Python worker exits after Shutdown")
            .expect("wait");
        assert!(status.success(), "{status}: {}", worker.stderr());
        eprintln!("tether engine -> Python worker: {:?}", started.elapsed());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn messages_of_3_9_6_and_20_mib_cross_between_tether_engine_and_python_worker() {
        let Some(env) = python_env(
            "messages_of_3_9_6_and_20_mib_cross_between_tether_engine_and_python_worker",
        ) else {
            return;
        };
        let started = Instant::now();
        let mut worker = PythonWorker::start(&env).await;
        let channel = worker.channel().await;
        let (session, handle) = new_session(&channel);

        // Engine -> worker: a 6 MiB inline UDF payload in Init (over gRPC's 4 MiB default).
        let payload = pattern(6 * MIB, 1);
        let (mut streaming, _) = session
            .init(rich_init(payload.clone(), "large"))
            .await
            .expect("6 MiB Init accepted");
        // Both directions: each batch goes to Python and comes back byte for byte.
        for (i, size) in LARGE_SIZES.into_iter().enumerate() {
            let batch = pattern(size, i as u8 + 2);
            streaming.send(batch.clone()).await.expect("send");
            let echoed = streaming
                .recv()
                .await
                .expect("recv")
                .expect("an echoed batch");
            assert_eq!(echoed.len(), size);
            assert!(echoed == batch, "the {size}-byte batch came back altered");
        }
        let mut finishing = streaming.finish().await.unwrap();
        assert_eq!(finishing.recv().await.unwrap(), None);
        let termination = finishing.close().await;
        assert_eq!(
            termination.kind(),
            TerminationKind::Finished,
            "{termination}"
        );
        let total: usize = LARGE_SIZES.iter().sum();
        assert_eq!(
            termination.metrics(),
            Some(&metrics(&[
                ("status", "ok"),
                ("batches", "3"),
                ("bytes", &total.to_string())
            ]))
        );
        assert!(!handle.is_invalid());

        let event = worker.session("large").await;
        assert_python_saw(
            &event,
            &["init", "data", "data", "data", "finish"],
            &["init", "data", "data", "data", "finish"],
            "finish",
        );
        assert_eq!(event.get("payload_len"), &Json::num(6 * MIB));
        assert_eq!(
            event.get("payload_crc32"),
            &Json::num(crc32fast::hash(&payload))
        );
        let sizes: Vec<Json> = LARGE_SIZES.iter().map(Json::num).collect();
        assert_eq!(event.get("data_sizes"), &Json::Arr(sizes));
        eprintln!(
            "large messages, tether engine <-> Python worker: {:?}",
            started.elapsed()
        );
    }

    // -----------------------------------------------------------------------------------------
    // A tether worker, driven by the Python engine
    // -----------------------------------------------------------------------------------------

    /// What the tether worker's UDF saw of one session.
    #[derive(Debug, Default)]
    struct Seen {
        name: Option<String>,
        payload_len: usize,
        batch_sizes: Vec<usize>,
        init: Option<Init>,
    }

    /// Echoes every batch; `"ERROR"` fails with a user error (`SimulatedError`), an
    /// `"INIT_ERROR"` payload fails init with a worker error.
    struct Echo {
        seen: Arc<Mutex<Seen>>,
        batches: usize,
    }

    impl Udf for Echo {
        fn init(&mut self, init: &Init) -> Result<Option<Bytes>, ExecutionError> {
            let udf = init.udf.clone().unwrap_or_default();
            let mut seen = self.seen.lock().unwrap();
            seen.name = udf.name.clone();
            seen.payload_len = udf.payload.len();
            seen.init = Some(init.clone());
            if udf.payload == "INIT_ERROR" {
                return Err(ExecutionError::worker("simulated init failure"));
            }
            Ok(None)
        }

        fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
            self.batches += 1;
            self.seen.lock().unwrap().batch_sizes.push(batch.len());
            if batch == "ERROR" {
                return Err(ExecutionError::user(
                    "simulated user error",
                    Some("SimulatedError".into()),
                ));
            }
            out.push(batch);
            Ok(())
        }

        fn finish(&mut self, _out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
            Ok(FinishResponse {
                metrics: metrics(&[("status", "ok"), ("batches", &self.batches.to_string())]),
                ..FinishResponse::default()
            })
        }

        fn cancel(&mut self) -> CancelResponse {
            CancelResponse {
                metrics: metrics(&[("status", "cancelled")]),
                error: None,
            }
        }
    }

    /// One session the tether worker served.
    struct Served {
        seen: Seen,
        outcome: EndpointOutcome,
        authority: Option<String>,
    }

    /// A tether worker (the gRPC server + `endpoint::serve` with [`Echo`]) on a Unix socket.
    struct TetherWorker {
        server: WorkerServer,
        served: mpsc::UnboundedReceiver<Served>,
        dir: TempDir,
    }

    impl TetherWorker {
        fn start() -> Self {
            let dir = TempDir::new();
            let (tx, served) = mpsc::unbounded_channel();
            let service = WorkerService::new(move |connection| {
                let authority = connection.authority().map(str::to_owned);
                let seen = Arc::new(Mutex::new(Seen::default()));
                let udf = Echo {
                    seen: seen.clone(),
                    batches: 0,
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let outcome = serve(connection, udf, EndpointConfig::default()).await;
                    let seen = std::mem::take(&mut *seen.lock().unwrap());
                    let _ = tx.send(Served {
                        seen,
                        outcome,
                        authority,
                    });
                });
            })
            .with_config(GrpcConfig::default());
            let server = WorkerServer::bind_unix(dir.socket(), service).expect("bind");
            TetherWorker {
                server,
                served,
                dir,
            }
        }

        /// Runs `grpc_peer.py engine` with `scenarios` against this worker: its report.
        async fn drive_from_python(&self, env: &PythonEnv, scenarios: &[&str]) -> Json {
            let mut command = tokio::process::Command::from(env.command("grpc_peer.py"));
            command
                .arg("engine")
                .arg("--socket")
                .arg(self.dir.socket())
                .arg("--scenarios")
                .arg(scenarios.join(","))
                .stdin(Stdio::null())
                .kill_on_drop(true);
            let output = tokio::time::timeout(Duration::from_secs(90), command.output())
                .await
                .expect("the Python engine finishes")
                .expect("the Python engine runs");
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            let report = Json::parse(stdout.trim())
                .unwrap_or_else(|e| panic!("{e}: {}: {stdout}\n{stderr}", output.status));
            let failed: Vec<String> = report
                .get("scenarios")
                .as_arr()
                .iter()
                .filter(|s| s.get("ok") != &Json::Bool(true))
                .map(|s| s.to_string())
                .collect();
            assert!(
                output.status.success() && failed.is_empty(),
                "the Python engine reported failures ({}):\n{}\n{stderr}",
                output.status,
                failed.join("\n")
            );
            assert_eq!(report.get("ok"), &Json::Bool(true));
            let names: Vec<&str> = report
                .get("scenarios")
                .as_arr()
                .iter()
                .filter_map(|s| s.get("name").as_str())
                .collect();
            assert_eq!(names, scenarios);
            report
        }

        /// The next `n` sessions the worker served, by UDF name.
        async fn served(&mut self, n: usize) -> BTreeMap<String, Served> {
            let mut all = BTreeMap::new();
            for _ in 0..n {
                let served = tokio::time::timeout(PROMPT, self.served.recv())
                    .await
                    .expect("a worker session ended in time")
                    .expect("the worker is running");
                let name = served
                    .seen
                    .name
                    .clone()
                    .expect("every session names its UDF");
                all.insert(name, served);
            }
            all
        }
    }

    /// The report of one scenario.
    fn scenario<'a>(report: &'a Json, name: &str) -> &'a Json {
        report
            .get("scenarios")
            .as_arr()
            .iter()
            .find(|s| s.get("name").as_str() == Some(name))
            .unwrap_or_else(|| panic!("no scenario {name}"))
    }

    fn assert_exchange(report: &Json, name: &str, requests: &[&str], responses: &[&str]) {
        let s = scenario(report, name);
        assert_eq!(strings(s.get("requests")), requests, "{name} requests: {s}");
        assert_eq!(
            strings(s.get("responses")),
            responses,
            "{name} responses: {s}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn python_engine_drives_the_tether_worker_through_finish_cancel_and_error() {
        let Some(env) =
            python_env("python_engine_drives_the_tether_worker_through_finish_cancel_and_error")
        else {
            return;
        };
        let started = Instant::now();
        let mut worker = TetherWorker::start();
        let report = worker
            .drive_from_python(
                &env,
                &[
                    "finish",
                    "cancel",
                    "error",
                    "init_error",
                    "half_close_is_not_finish",
                    "manage",
                    "shutdown",
                ],
            )
            .await;

        // The exact exchanges, as the Python engine recorded them ("end": the response
        // stream ended with status OK).
        assert_exchange(
            &report,
            "finish",
            &["init", "data", "data", "finish"],
            &["init", "data", "data", "finish", "end"],
        );
        assert_eq!(
            scenario(&report, "finish").get("details").get("metrics"),
            &Json::parse(r#"{"batches":"2","status":"ok"}"#).unwrap()
        );
        assert_exchange(
            &report,
            "cancel",
            &["init", "data", "cancel"],
            &["init", "data", "cancel", "end"],
        );
        assert_exchange(
            &report,
            "error",
            &["init", "data", "cancel"],
            &["init", "error", "cancel", "end"],
        );
        assert_eq!(
            scenario(&report, "error").get("details").get("error"),
            &ExecutionError::user("simulated user error", Some("SimulatedError".into())).json()
        );
        assert_exchange(
            &report,
            "init_error",
            &["init", "cancel"],
            &["init", "cancel", "end"],
        );
        assert_eq!(
            scenario(&report, "init_error").get("details").get("error"),
            &ExecutionError::worker("simulated init failure").json()
        );
        // An ended request stream is never taken for Finish.
        assert_exchange(
            &report,
            "half_close_is_not_finish",
            &["init", "data"],
            &["init", "data", "error", "cancel", "end"],
        );
        let protocol = scenario(&report, "half_close_is_not_finish")
            .get("details")
            .get("error");
        assert!(
            matches!(protocol.get("protocol"), Json::Obj(_)),
            "a ProtocolError: {protocol}"
        );
        let manage = scenario(&report, "manage").get("details");
        assert!(
            matches!(
                manage.get("heartbeat_metrics").get("active_sessions"),
                Json::Str(_)
            ),
            "{manage}"
        );
        assert_eq!(
            manage.get("empty_request_status").as_str(),
            Some("INVALID_ARGUMENT")
        );
        assert!(matches!(
            scenario(&report, "shutdown")
                .get("details")
                .get("sessions_settled"),
            Json::Bool(_)
        ));

        // What the tether worker saw of the same sessions.
        let served = worker.served(5).await;
        let finish = &served["finish"];
        assert!(
            matches!(finish.outcome, EndpointOutcome::Finished),
            "{}",
            finish.outcome
        );
        assert_eq!(finish.seen.batch_sizes, [5, 4]);
        assert_eq!(finish.authority.as_deref(), Some("localhost"));
        // Python's full Init arrived with every value (compared as protobuf JSON).
        let init = finish.seen.init.as_ref().expect("init");
        let expected = Json::parse(
            r#"{"data_format":"ARROW","protocol_version":1,
                "session_conf":{"spark.sql.execution.arrow.maxRecordsPerBatch":"10000"},
                "task_context":{"partition_id":"3","task_attempt_id":"41"},
                "timezone":"Europe/Amsterdam",
                "udf":{"eval_type":"SQL_SCALAR_PANDAS_UDF","format":"echo","name":"finish",
                       "payload":"ZmluaXNo","payload_crc32":550103832,"payload_size":"6"}}"#,
        )
        .unwrap();
        assert_eq!(init.json(), expected);
        assert_eq!(
            init.udf.as_ref().unwrap().payload_crc32,
            Some(crc32fast::hash(b"finish"))
        );
        match &served["cancel"].outcome {
            EndpointOutcome::Cancelled { reason, reported } => {
                assert_eq!(reason.as_deref(), Some("python cancel"));
                assert!(reported.is_none());
            }
            other => panic!("cancel: {other}"),
        }
        match &served["error"].outcome {
            EndpointOutcome::Cancelled { reason, reported } => {
                assert_eq!(reason.as_deref(), Some("python cancel after error"));
                assert_eq!(
                    reported.as_ref().and_then(ExecutionError::error_class),
                    Some("SimulatedError")
                );
            }
            other => panic!("error: {other}"),
        }
        match &served["init_error"].outcome {
            EndpointOutcome::Cancelled { reported, .. } => assert!(matches!(
                reported.as_ref().and_then(|e| e.kind.as_ref()),
                Some(execution_error::Kind::Worker(_))
            )),
            other => panic!("init_error: {other}"),
        }
        assert!(
            matches!(
                served["half_close"].outcome,
                EndpointOutcome::ProtocolViolation(EngineViolation::RequestStreamEnded)
            ),
            "{}",
            served["half_close"].outcome
        );

        // Manage Shutdown started the server's graceful shutdown.
        tokio::time::timeout(PROMPT, worker.server.wait())
            .await
            .expect("the tether worker stops after Manage Shutdown");
        eprintln!("Python engine -> tether worker: {:?}", started.elapsed());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn messages_of_3_9_6_and_20_mib_cross_between_python_engine_and_tether_worker() {
        let Some(env) = python_env(
            "messages_of_3_9_6_and_20_mib_cross_between_python_engine_and_tether_worker",
        ) else {
            return;
        };
        let started = Instant::now();
        let mut worker = TetherWorker::start();
        let report = worker.drive_from_python(&env, &["large"]).await;
        assert_exchange(
            &report,
            "large",
            &["init", "data", "data", "data", "finish"],
            &["init", "data", "data", "data", "finish", "end"],
        );
        let sizes: Vec<Json> = LARGE_SIZES.iter().map(Json::num).collect();
        assert_eq!(
            scenario(&report, "large").get("details").get("sizes"),
            &Json::Arr(sizes)
        );
        let served = worker.served(1).await;
        let large = &served["large"];
        assert!(
            matches!(large.outcome, EndpointOutcome::Finished),
            "{}",
            large.outcome
        );
        assert_eq!(large.seen.payload_len, 6 * MIB);
        assert_eq!(large.seen.batch_sizes, LARGE_SIZES);
        worker.server.shutdown().await;
        eprintln!(
            "large messages, Python engine <-> tether worker: {:?}",
            started.elapsed()
        );
    }
}
