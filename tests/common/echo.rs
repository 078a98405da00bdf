//! The reference echo worker of udf §2.1 as a [`Udf`], and helpers to run it against an
//! [`EngineScript`](super::EngineScript) inside a tokio test.
//!
//! Behaviour: an assembled payload equal to `"INIT_ERROR"` fails init with
//! `WorkerError("simulated init failure")`; a data batch equal to `"ERROR"` fails with
//! `UserError { error_class: "SimulatedError" }`; every other batch is echoed unchanged;
//! `Finish` is answered with `FinishResponse { metrics: {status = ok} }`; `Cancel` with an
//! empty `CancelResponse`. The `Manage` RPC answers heartbeats and reports
//! `sessions_settled = true` on shutdown.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tether::connection::{ConnectionError, Pair, pair};
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, Init, ShutdownRequest, UdfRequest, UdfResponse,
};
use tether::worker::endpoint::{EndpointConfig, EndpointOutcome, Udf, WorkerControl, serve};
use tokio::task::JoinHandle;

use super::EngineScript;

/// The message of the echo worker's init failure.
pub const INIT_FAILURE: &str = "simulated init failure";
/// The error class of the echo worker's data failure.
pub const USER_ERROR_CLASS: &str = "SimulatedError";

/// What an [`EchoUdf`] saw, shared with the test.
#[derive(Debug, Default)]
pub struct Calls {
    /// The assembled payload of every `init` call.
    pub init_payloads: Vec<Bytes>,
    /// Number of `process` calls.
    pub batches: usize,
    /// Number of `finish` calls.
    pub finishes: usize,
    /// Number of `cancel` calls.
    pub cancels: usize,
}

/// A shared view of an [`EchoUdf`]'s [`Calls`].
pub type Probe = Arc<Mutex<Calls>>;

/// The reference echo UDF (udf §2.1).
#[derive(Debug, Default, Clone)]
pub struct EchoUdf {
    probe: Probe,
}

impl EchoUdf {
    /// An echo UDF and the probe recording its callbacks.
    pub fn with_probe() -> (Self, Probe) {
        let udf = EchoUdf::default();
        let probe = udf.probe.clone();
        (udf, probe)
    }
}

impl Udf for EchoUdf {
    fn init(&mut self, init: &Init) -> Result<Option<Bytes>, ExecutionError> {
        let payload = init
            .udf
            .as_ref()
            .map(|u| u.payload.clone())
            .unwrap_or_default();
        self.probe
            .lock()
            .unwrap()
            .init_payloads
            .push(payload.clone());
        if payload == "INIT_ERROR" {
            return Err(ExecutionError::worker(INIT_FAILURE));
        }
        Ok(None)
    }

    fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
        self.probe.lock().unwrap().batches += 1;
        if batch == "ERROR" {
            return Err(ExecutionError::user_with_class(
                "simulated user error",
                USER_ERROR_CLASS,
            ));
        }
        out.push(batch);
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
        self.probe.lock().unwrap().finishes += 1;
        Ok(FinishResponse {
            metrics: status_ok(),
            ..FinishResponse::default()
        })
    }

    fn cancel(&mut self) -> CancelResponse {
        self.probe.lock().unwrap().cancels += 1;
        CancelResponse::default()
    }
}

/// `{status = ok}`, the echo worker's finish metrics.
pub fn status_ok() -> BTreeMap<String, String> {
    BTreeMap::from([("status".to_string(), "ok".to_string())])
}

/// The echo worker's `Manage` side.
#[derive(Debug, Default)]
pub struct EchoControl;

impl WorkerControl for EchoControl {
    fn heartbeat_metrics(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("worker".to_string(), "echo".to_string())])
    }

    fn shutdown(&self, _request: &ShutdownRequest) -> bool {
        // The echo worker keeps no sessions across streams: always settled.
        true
    }
}

/// The configuration the suite runs the echo worker with: the defaults (Arrow, protocol 1,
/// 30 s cancel timeout on tokio's clock).
pub fn echo_config() -> EndpointConfig {
    EndpointConfig::default()
}

/// Spawns `udf` served on one end of a [`pair`] (capacity 16 each way); returns the engine
/// script for the other end and the task yielding the worker's outcome.
pub fn spawn_worker<U>(
    udf: U,
    config: EndpointConfig,
) -> (EngineScript, JoinHandle<EndpointOutcome>)
where
    U: Udf + Send + 'static,
{
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(16);
    let task = tokio::spawn(serve(worker, udf, config));
    (EngineScript::new(engine), task)
}

/// Spawns the echo worker with [`echo_config`]; see [`spawn_worker`].
pub fn spawn_echo() -> (EngineScript, JoinHandle<EndpointOutcome>, Probe) {
    let (udf, probe) = EchoUdf::with_probe();
    let (script, task) = spawn_worker(udf, echo_config());
    (script, task, probe)
}

/// The engine's halves of a split connection: requests go into `requests`, responses come
/// out of `responses`, usable from two tasks at once.
pub struct SplitEngine {
    /// Where the engine writes requests.
    pub requests: futures::channel::mpsc::Sender<UdfRequest>,
    /// Where the engine reads responses.
    pub responses: futures::channel::mpsc::Receiver<UdfResponse>,
}

impl SplitEngine {
    /// Sends one request.
    pub async fn send(requests: &mut futures::channel::mpsc::Sender<UdfRequest>, r: UdfRequest) {
        requests.send(r).await.expect("the worker went away");
    }

    /// Receives everything up to the end of the worker's response stream.
    pub async fn recv_to_end(
        responses: &mut futures::channel::mpsc::Receiver<UdfResponse>,
    ) -> Vec<tether::wire::ResponseMessage> {
        let mut all = Vec::new();
        while let Some(r) = responses.next().await {
            all.push(r.into_message().expect("the worker sent an empty oneof"));
        }
        all
    }
}

/// Spawns the echo worker on a connection joined from two channels with
/// [`Pair`] (the `Sink + Stream` blanket impl), so the engine can send and receive from
/// different tasks concurrently.
pub fn spawn_echo_split(capacity: usize) -> (SplitEngine, JoinHandle<EndpointOutcome>) {
    use futures::channel::mpsc;
    let (req_tx, req_rx) = mpsc::channel::<UdfRequest>(capacity);
    let (resp_tx, resp_rx) = mpsc::channel::<UdfResponse>(capacity);
    let to_engine = resp_tx.sink_map_err(closed as fn(mpsc::SendError) -> ConnectionError);
    let from_engine = req_rx.map(Ok as fn(UdfRequest) -> Result<UdfRequest, ConnectionError>);
    let task = tokio::spawn(serve(
        Pair::new(to_engine, from_engine),
        EchoUdf::default(),
        echo_config(),
    ));
    (
        SplitEngine {
            requests: req_tx,
            responses: resp_rx,
        },
        task,
    )
}

fn closed(_: futures::channel::mpsc::SendError) -> ConnectionError {
    ConnectionError::Closed
}
