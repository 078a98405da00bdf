use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::prelude::{BASE64_STANDARD, Engine as _};
use bytes::Bytes;
use serde_json::{Value, json};
use tether::spark::udf_grpc::{
    GrpcChannel, GrpcConfig, GrpcEngineConnection, WorkerServer, WorkerService,
};
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, Init, ShutdownRequest, UdfPayload,
    UdfWorkerDataFormat, execution_error,
};

use tether::worker::endpoint::{EndpointConfig, EndpointOutcome, EngineViolation, Udf, serve};
use tether::worker::engine::WorkerAddress;
use tether::worker::engine::{
    CountingHandle, Session, SessionConfig, SessionError, TerminationKind, WorkerHandle,
};
use tether::worker::state;
use tether_testing::fixtures::{ScratchDir, pattern};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};
use tokio::sync::mpsc;

use crate::python::{PythonEnv, python_env};

const MIB: usize = 1024 * 1024;
/// The "Must show" sizes of issue 3: 3.9 MiB, 6 MiB and 20 MiB.
const LARGE_SIZES: [usize; 3] = [39 * MIB / 10, 6 * MIB, 20 * MIB];
/// Upper bound for anything that should happen promptly.
const PROMPT: Duration = Duration::from_secs(30);

/// The elements of a JSON array; none for anything else.
fn items(json: &Value) -> &[Value] {
    json.as_array().map_or(&[], Vec::as_slice)
}

fn strings(json: &Value) -> Vec<&str> {
    items(json).iter().filter_map(Value::as_str).collect()
}

// -----------------------------------------------------------------------------------------
// The Python worker, driven by a tether engine
// -----------------------------------------------------------------------------------------

/// `grpc_peer.py worker` on a Unix socket; its JSON event lines.
struct PythonWorker {
    child: Child,
    events: Lines<BufReader<ChildStdout>>,
    /// Events read while waiting for another one.
    pending: Vec<Value>,
    endpoint: WorkerAddress,
    stderr: PathBuf,
    _dir: ScratchDir,
}

impl PythonWorker {
    async fn start(env: &PythonEnv) -> Self {
        let dir = ScratchDir::new("conf");
        let stderr = dir.join("python-worker.stderr");
        let mut command = tokio::process::Command::from(env.command("grpc_peer.py"));
        let mut child = command
            .arg("worker")
            .arg("--socket")
            .arg(dir.join("w.sock"))
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
            endpoint: WorkerAddress::Unix(dir.join("w.sock")),
            stderr,
            _dir: dir,
        };
        let ready = worker.event().await;
        assert_eq!(ready["event"].as_str(), Some("ready"), "{ready}");
        worker
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The next event line.
    async fn event(&mut self) -> Value {
        let line = tokio::time::timeout(PROMPT, self.events.next_line())
            .await
            .unwrap_or_else(|_| panic!("no event from the Python worker: {}", self.stderr()))
            .expect("reading the Python worker's stdout");
        let Some(line) = line else {
            panic!("the Python worker exited: {}", self.stderr());
        };
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// The first event (already read or still to come) for which `wanted` holds; the
    /// others stay pending. Sessions log when their handler ends, which need not be in
    /// the order the sessions ended.
    async fn event_where(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
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
    async fn session(&mut self, name: &str) -> Value {
        self.event_where(|e| {
            e["event"].as_str() == Some("session")
                && e["init"]["udf"]["name"].as_str() == Some(name)
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
    let session = Session::new(connection, handle.clone(), SessionConfig::default());
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
                ..UdfPayload::new(payload, "echo")
            },
        )
    }
}

/// [`rich_init`] as the Python worker logs it: the official decoder's protobuf JSON
/// (`MessageToDict`, the official field names), without the payload bytes.
fn rich_init_as_logged(payload: &[u8], name: &str) -> Value {
    json!({
        "protocol_version": 1,
        "data_format": "ARROW",
        "udf": {
            "format": "echo",
            "payload_size": payload.len().to_string(),
            "payload_crc32": crc32fast::hash(payload),
            "name": name,
            "eval_type": "SQL_ARROW_BATCHED_UDF",
        },
        "task_context": {"partition_id": "7", "stage_id": "3"},
        "session_conf": {"spark.sql.execution.arrow.maxRecordsPerBatch": "10000"},
        "timezone": "Asia/Tokyo",
        "parameters": BASE64_STANDARD.encode(b"\x00params\xff"),
    })
}

fn metrics(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Checks what the Python worker saw of one session.
fn assert_python_saw(event: &Value, requests: &[&str], responses: &[&str], end: &str) {
    assert_eq!(strings(&event["requests"]), requests, "requests: {event}");
    assert_eq!(
        strings(&event["responses"]),
        responses,
        "responses: {event}"
    );
    assert_eq!(event["end"].as_str(), Some(end), "end: {event}");
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
    // The whole Init arrived with every value intact, under the official field names.
    assert_eq!(
        event["init"],
        rich_init_as_logged(b"finish-payload", "finish")
    );
    assert_eq!(event["payload_len"], 14);
    assert_eq!(event["payload_crc32"], crc32fast::hash(b"finish-payload"));
    assert_eq!(event["data_sizes"], json!([5, 4]));

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
    assert_eq!(event["cancel_reason"].as_str(), Some("tether cancel"));

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
    assert_eq!(event["payload_len"], payload.len());
    assert_eq!(event["payload_crc32"], crc32fast::hash(&payload));
    assert_eq!(event["init"]["is_chunking_payload"], true);
    assert_eq!(
        event["init"]["udf"]["payload_size"],
        payload.len().to_string()
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
        .event_where(|e| e["event"].as_str() == Some("shutdown"))
        .await;
    assert_eq!(event["reason"].as_str(), Some("tether engine done"));
    assert_eq!(event["cancel_sessions"], false);
    let status = tokio::time::timeout(PROMPT, worker.child.wait())
        .await
        .expect("the Python worker exits after Shutdown")
        .expect("wait");
    assert!(status.success(), "{status}: {}", worker.stderr());
    eprintln!("tether engine -> Python worker: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_of_3_9_6_and_20_mib_cross_between_tether_engine_and_python_worker() {
    let Some(env) =
        python_env("messages_of_3_9_6_and_20_mib_cross_between_tether_engine_and_python_worker")
    else {
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
    assert_eq!(event["payload_len"], 6 * MIB);
    assert_eq!(event["payload_crc32"], crc32fast::hash(&payload));
    assert_eq!(event["data_sizes"], json!(LARGE_SIZES));
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
            return Err(ExecutionError::user_with_class(
                "simulated user error",
                "SimulatedError",
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
    dir: ScratchDir,
}

impl TetherWorker {
    fn start() -> Self {
        let dir = ScratchDir::new("conf");
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
        let server = WorkerServer::bind_unix(dir.join("w.sock"), service).expect("bind");
        TetherWorker {
            server,
            served,
            dir,
        }
    }

    /// Runs `grpc_peer.py engine` with `scenarios` against this worker: its report.
    async fn drive_from_python(&self, env: &PythonEnv, scenarios: &[&str]) -> Value {
        let mut command = tokio::process::Command::from(env.command("grpc_peer.py"));
        command
            .arg("engine")
            .arg("--socket")
            .arg(self.dir.join("w.sock"))
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
        let report: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{e}: {}: {stdout}\n{stderr}", output.status));
        let failed: Vec<String> = items(&report["scenarios"])
            .iter()
            .filter(|s| s["ok"] != true)
            .map(|s| s.to_string())
            .collect();
        assert!(
            output.status.success() && failed.is_empty(),
            "the Python engine reported failures ({}):\n{}\n{stderr}",
            output.status,
            failed.join("\n")
        );
        assert_eq!(report["ok"], true);
        let names: Vec<&str> = items(&report["scenarios"])
            .iter()
            .filter_map(|s| s["name"].as_str())
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
fn scenario<'a>(report: &'a Value, name: &str) -> &'a Value {
    items(&report["scenarios"])
        .iter()
        .find(|s| s["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no scenario {name}"))
}

fn assert_exchange(report: &Value, name: &str, requests: &[&str], responses: &[&str]) {
    let s = scenario(report, name);
    assert_eq!(strings(&s["requests"]), requests, "{name} requests: {s}");
    assert_eq!(strings(&s["responses"]), responses, "{name} responses: {s}");
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
        scenario(&report, "finish")["details"]["metrics"],
        json!({"batches": "2", "status": "ok"})
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
        scenario(&report, "error")["details"]["error"],
        json!({"user": {"message": "simulated user error", "error_class": "SimulatedError"}})
    );
    assert_exchange(
        &report,
        "init_error",
        &["init", "cancel"],
        &["init", "cancel", "end"],
    );
    assert_eq!(
        scenario(&report, "init_error")["details"]["error"],
        json!({"worker": {"message": "simulated init failure"}})
    );
    // An ended request stream is never taken for Finish.
    assert_exchange(
        &report,
        "half_close_is_not_finish",
        &["init", "data"],
        &["init", "data", "error", "cancel", "end"],
    );
    let protocol = &scenario(&report, "half_close_is_not_finish")["details"]["error"];
    assert!(
        protocol["protocol"].is_object(),
        "a ProtocolError: {protocol}"
    );
    let manage = &scenario(&report, "manage")["details"];
    assert!(
        manage["heartbeat_metrics"]["active_sessions"].is_string(),
        "{manage}"
    );
    assert_eq!(
        manage["empty_request_status"].as_str(),
        Some("INVALID_ARGUMENT")
    );
    assert!(scenario(&report, "shutdown")["details"]["sessions_settled"].is_boolean());

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
    // Python's full Init (`init_request` in grpc_peer.py, set by the official field names)
    // arrived with every value in tether's fields of the same names, and nothing else.
    let init = finish.seen.init.as_ref().expect("init");
    let expected = Init {
        protocol_version: Some(1),
        data_format: UdfWorkerDataFormat::Arrow as i32,
        udf: Some(UdfPayload {
            payload: Bytes::from_static(b"finish"),
            format: "echo".into(),
            payload_size: Some(6),
            payload_crc32: Some(550_103_832),
            name: Some("finish".into()),
            eval_type: Some("SQL_SCALAR_PANDAS_UDF".into()),
        }),
        is_chunking_payload: None,
        input_schema: None,
        output_schema: None,
        task_context: BTreeMap::from([
            ("partition_id".into(), "3".into()),
            ("task_attempt_id".into(), "41".into()),
        ]),
        session_conf: BTreeMap::from([(
            "spark.sql.execution.arrow.maxRecordsPerBatch".into(),
            "10000".into(),
        )]),
        timezone: Some("Europe/Amsterdam".into()),
        parameters: None,
    };
    assert_eq!(init, &expected);
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
    let Some(env) =
        python_env("messages_of_3_9_6_and_20_mib_cross_between_python_engine_and_tether_worker")
    else {
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
    assert_eq!(
        scenario(&report, "large")["details"]["sizes"],
        json!(LARGE_SIZES)
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
