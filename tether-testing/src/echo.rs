//! The reference echo worker of udf §2.1 (Spark's `EchoWorkerService`) as a [`Udf`], with a
//! probe that records its callbacks, and its `Manage` side as a [`WorkerControl`]. Any
//! transport serves it: the in-memory pair (see [`script`](super::script)), the framed
//! connection and gRPC.
//!
//! Behaviour: an assembled payload equal to `"INIT_ERROR"` fails init with
//! `WorkerError(`[`INIT_FAILURE`]`)`; a data batch equal to `"ERROR"` fails with
//! `UserError { error_class: `[`USER_ERROR_CLASS`](super::fixtures::USER_ERROR_CLASS)` }`; a batch equal to `"PANIC"`
//! panics with [`PANIC_MESSAGE`] (a UDF bug: the endpoint does not catch it); every other batch is echoed
//! unchanged; `Finish` is answered with `FinishResponse { metrics: {status = ok} }`, `Cancel`
//! with an empty `CancelResponse`. The rules of udf §2 (an `InitResponse` first, one
//! terminal, the R4 cancel wait) are the endpoint's, not the UDF's.
//!
//! ```
//! use bytes::Bytes;
//! use tether_testing::echo::EchoUdf;
//! use tether_testing::fixtures;
//! use tether::worker::endpoint::Udf;
//!
//! let (mut udf, probe) = EchoUdf::with_probe();
//! udf.init(&fixtures::init("udf")).unwrap();
//! let mut out = Vec::new();
//! udf.process(Bytes::from_static(b"row"), &mut out).unwrap();
//! assert_eq!(out, [Bytes::from_static(b"row")]);
//! let err = udf.process(Bytes::from_static(b"ERROR"), &mut out).unwrap_err();
//! assert_eq!(err.error_class(), Some(fixtures::USER_ERROR_CLASS));
//! assert_eq!(probe.lock().unwrap().batches, 2);
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::fixtures::INIT_FAILURE;
use super::fixtures::{finish_ok, simulated_user_error};
use tether::wire::{CancelResponse, ExecutionError, FinishResponse, Init, ShutdownRequest};
use tether::worker::endpoint::{EndpointConfig, Udf, WorkerControl};

/// The payload that makes the echo worker fail init (udf §2.1).
pub const INIT_ERROR_PAYLOAD: &str = "INIT_ERROR";
/// The batch that makes the echo worker fail with a user error (udf §2.1).
pub const ERROR_BATCH: &str = "ERROR";
/// The batch that makes the echo worker's `process` panic (a bug in a UDF, udf §2 R10).
pub const PANIC_BATCH: &str = "PANIC";
/// What the echo worker's `process` panics with on [`PANIC_BATCH`] (udf §2 R10).
pub const PANIC_MESSAGE: &str = "the echo UDF was told to panic";

/// What an [`EchoUdf`] saw, shared with the test (udf §2.1 callbacks).
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

/// A shared view of an [`EchoUdf`]'s [`Calls`] (udf §2.1).
pub type Probe = Arc<Mutex<Calls>>;

/// The reference echo UDF (udf §2.1). Clones share one probe.
#[derive(Debug, Default, Clone)]
pub struct EchoUdf {
    probe: Probe,
}

impl EchoUdf {
    /// An echo UDF and the probe recording its callbacks (udf §2.1).
    pub fn with_probe() -> (Self, Probe) {
        let udf = Self::default();
        let probe = udf.probe.clone();
        (udf, probe)
    }

    /// The probe recording this UDF's callbacks (udf §2.1).
    pub fn probe(&self) -> Probe {
        self.probe.clone()
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        // A test that panicked while holding the probe must not hide its own failure.
        self.probe
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Udf for EchoUdf {
    fn init(&mut self, init: &Init) -> Result<Option<Bytes>, ExecutionError> {
        let payload = init.payload().clone();
        self.calls().init_payloads.push(payload.clone());
        if payload == INIT_ERROR_PAYLOAD {
            return Err(ExecutionError::worker(INIT_FAILURE));
        }
        Ok(None)
    }

    fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
        self.calls().batches += 1;
        if batch == ERROR_BATCH {
            return Err(simulated_user_error());
        }
        if batch == PANIC_BATCH {
            panic!("{PANIC_MESSAGE}");
        }
        out.push(batch);
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
        self.calls().finishes += 1;
        Ok(finish_ok())
    }

    fn cancel(&mut self) -> CancelResponse {
        self.calls().cancels += 1;
        CancelResponse::default()
    }
}

/// The echo worker's `Manage` side (udf §1.7): heartbeats report `{worker = echo}`, and a
/// shutdown is always settled, since the echo worker keeps no session across streams.
#[derive(Debug, Default, Clone, Copy)]
pub struct EchoControl;

impl WorkerControl for EchoControl {
    fn heartbeat_metrics(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("worker".to_owned(), "echo".to_owned())])
    }

    fn shutdown(&self, _request: &ShutdownRequest) -> bool {
        true
    }
}

/// The configuration the suites run the echo worker with: the defaults (Arrow, protocol 1,
/// the 30 s cancel timeout of udf §7 on tokio's clock).
pub fn echo_config() -> EndpointConfig {
    EndpointConfig::default()
}
