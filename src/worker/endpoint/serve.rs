//! The high-level worker API: implement [`Udf`] and run sessions with [`serve`]; answer the
//! `Manage` RPC with [`handle_manage`].

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::connection::Connection;
use crate::wire::{
    CancelResponse, ExecutionError, FinishResponse, HeartbeatResponse, Init, ShutdownRequest,
    ShutdownResponse, UdfRequest, UdfResponse, WorkerRequest, WorkerResponse, worker_request,
    worker_response,
};
use crate::worker::state;

use super::config::EndpointConfig;
use super::core::{DataSent, DataTicket, EndpointMisuse, EndpointOutcome, WorkerCore, WorkerPhase};
use super::typed::{Endpoint, InputEnd};

/// One UDF as the worker runs it, one instance per session: the callbacks [`serve`] calls as
/// the protocol unfolds (udf §1.3–§1.5), over an [`Endpoint`] and any
/// [`Connection`]; [`answer_pending`] makes the same calls, synchronously, over a
/// [`WorkerCore`] its caller drives.
///
/// Output goes into the `out` vector and is sent, in order, as `DataResponse`s right after
/// the callback returns. Errors become the protocol's error messages: see each method.
///
/// A callback that panics is not caught: the session's connection drops without a
/// terminator, the engine settles `TransportFailed` and invalidates the worker (udf §2 R10),
/// and the panic's message goes to the worker's stderr (under a dispatcher, its log file,
/// which the engine's outcome quotes: `worker::dispatcher::WorkerLost`). To report a failure
/// to the engine as the user's, return an [`ExecutionError`] instead (catch panics inside
/// the callback with `std::panic::catch_unwind` if the code may panic).
pub trait Udf {
    /// Called once with the assembled, verified `Init` (its `udf.payload` is the whole
    /// payload, chunks joined; udf §1.3). `Ok(data)` answers `InitResponse { data }`; `Err(e)`
    /// answers `InitResponse { error: e }`, after which only [`cancel`](Self::cancel) is
    /// called (udf §2 R4).
    fn init(&mut self, init: &Init) -> Result<Option<Bytes>, ExecutionError>;

    /// Called for each input batch, in order. `Err(e)` sends whatever was pushed to `out`,
    /// then `ErrorResponse(e)`; the session then waits for the engine's Cancel and calls
    /// [`cancel`](Self::cancel) (udf §2 R4).
    fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError>;

    /// Called once after the engine's `Finish` (all input processed): push trailing output
    /// to `out` and return the `FinishResponse` (metrics, opaque data). `Err(e)` sends the
    /// trailing output, then `FinishResponse { error: e }` (udf §1.5).
    fn finish(&mut self, out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError>;

    /// Called when the engine's `Cancel` arrived after the user code was involved (after
    /// `init` was called): clean up and return the `CancelResponse` (partial metrics, a
    /// cleanup error; udf §1.5, §2 R7). Not called for a Cancel before the Init was complete
    /// (answered automatically). The default returns an empty response.
    fn cancel(&mut self) -> CancelResponse {
        CancelResponse::default()
    }
}

/// Runs one worker-side session of `udf` on `connection` to its end and returns the outcome
/// (udf §2, §2.1).
///
/// `Init` → [`Udf::init`] → `InitResponse`; each `DataRequest` → [`Udf::process`] → its
/// output as `DataResponse`s; `Finish` → [`Udf::finish`] → trailing output and
/// `FinishResponse`; `Cancel` (at any time) → [`Udf::cancel`] → `CancelResponse`. User
/// errors from `init`/`process` are reported (`InitResponse.error` / `ErrorResponse`), then
/// the engine's Cancel is awaited and answered; `finish` errors go into
/// `FinishResponse.error`. Engine protocol violations and transport failures end the
/// session as [`Endpoint`] describes.
///
/// The callbacks run on the task polling this future; a callback that blocks delays the
/// noticing of a Cancel (udf §1.1: hanging user code is out of the protocol's scope). A
/// callback that panics is not caught: the panic unwinds out of this future (a spawned
/// task ends with a panicked `JoinError`), the connection is dropped without a terminator,
/// and the engine settles `TransportFailed` and invalidates the worker (udf §2 R10). Catch
/// panics inside the callback and return an error to report them as a user error instead.
pub async fn serve<C, U>(connection: C, mut udf: U, config: EndpointConfig) -> EndpointOutcome
where
    C: Connection<UdfResponse, UdfRequest>,
    U: Udf,
{
    let request = match Endpoint::new(connection, config).recv_init().await {
        Ok(request) => request,
        Err(ended) => return ended.close(),
    };
    let mut endpoint = match udf.init(request.init()) {
        Ok(data) => request.accept(data).await,
        Err(error) => return answer_cancel(request.reject(error).await, &mut udf).await,
    };
    let mut out = Vec::new();
    // Some(error) when process failed.
    let mut failure = None;
    'input: while let Ok(Some(batch)) = endpoint.recv().await {
        let result = udf.process(batch, &mut out);
        for output in out.drain(..) {
            if endpoint.send(output).await.is_err() {
                // Cancelled or ended: nothing more is sent (the drain drops the rest);
                // end_of_input tells which.
                break 'input;
            }
        }
        if let Err(error) = result {
            failure = Some(error);
            break;
        }
    }
    if let Some(error) = failure {
        return answer_cancel(endpoint.fail(error).await, &mut udf).await;
    }
    match endpoint.end_of_input().await {
        InputEnd::Finish(finishing) => run_finish(finishing, &mut udf).await,
        InputEnd::Cancel(cancelling) => answer_cancel(cancelling, &mut udf).await,
        InputEnd::Ended(ended) => ended.close(),
    }
}

async fn run_finish<C, U>(
    mut endpoint: Endpoint<state::Finishing, C>,
    udf: &mut U,
) -> EndpointOutcome
where
    C: Connection<UdfResponse, UdfRequest>,
    U: Udf,
{
    let mut out = Vec::new();
    let response = finish_response(udf, &mut out);
    for output in out {
        if endpoint.send(output).await.is_err() {
            break;
        }
    }
    let (metrics, error) = (response.metrics.clone(), response.error.clone());
    match endpoint.finish(response).await {
        Ok(done) => done.close(),
        // R5 (c): a Cancel after the Finish is answered with a CancelResponse; the UDF
        // cleans up and its finish metrics and error go along.
        Err(cancelling) => {
            let mut cancel = udf.cancel();
            cancel.metrics.extend(metrics);
            cancel.error = cancel.error.or(error);
            cancelling.cancelled(cancel).await.close()
        }
    }
}

async fn answer_cancel<C, U>(
    mut endpoint: Endpoint<state::Cancelling, C>,
    udf: &mut U,
) -> EndpointOutcome
where
    C: Connection<UdfResponse, UdfRequest>,
    U: Udf,
{
    let response = match endpoint.wait_cancel().await {
        Ok(()) => udf.cancel(),
        Err(_) => CancelResponse::default(),
    };
    endpoint.cancelled(response).await.close()
}

/// [`Udf::finish`]'s answer as the `FinishResponse` to send: its error, if it failed, goes
/// into `FinishResponse.error` (udf §1.5). Trailing output is pushed to `out`.
fn finish_response<U: Udf + ?Sized>(udf: &mut U, out: &mut Vec<Bytes>) -> FinishResponse {
    udf.finish(out).unwrap_or_else(|error| FinishResponse {
        error: Some(error),
        ..FinishResponse::default()
    })
}

/// What one [`answer_pending`] call did (udf §2.1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Answered {
    /// Whether any [`Udf`] callback ran (so the core may hold new responses to
    /// [`poll_transmit`](WorkerCore::poll_transmit)).
    pub acted: bool,
    /// The `DataResponse`s queued, in order, each named for
    /// [`WorkerCore::delivery`] (udf §1.4).
    pub queued: Vec<DataTicket>,
}

/// Answers whatever `core` holds for `udf`, synchronously: the [`Udf`] mapping of [`serve`]
/// for a caller that drives a sans-I/O [`WorkerCore`] itself (udf §2.1).
///
/// In order: a pending `Init` is handed to [`Udf::init`] (`Ok` ⇒
/// [`accept_init`](WorkerCore::accept_init), `Err` ⇒ [`reject_init`](WorkerCore::reject_init));
/// each queued input batch, while the phase is `Data` or `Draining`, to [`Udf::process`],
/// whose output is queued as `DataResponse`s (the rest is not sent once the core drops one:
/// after a Cancel) and whose error goes to [`fail`](WorkerCore::fail), which drops the
/// unread input (udf §2 R4); once `Finish` arrived and the input is read, [`Udf::finish`]
/// with its trailing output and `FinishResponse` (its error in `FinishResponse.error`,
/// udf §1.5); in `Cancelling`, [`Udf::cancel`]'s `CancelResponse` (udf §2 R7). An `Init`
/// still held when a Cancel arrived is handed to [`Udf::init`] first, as [`serve`] does, so
/// `cancel` is only ever called after `init`. Nothing else is waited for: call it again after
/// the next event ([`handle_request`](WorkerCore::handle_request) and the like), then drain
/// [`poll_transmit`](WorkerCore::poll_transmit).
///
/// # Errors
/// [`EndpointMisuse`] if the core was answered outside this function in a way that leaves
/// one of these answers out of turn (for example a `finish` already given by hand); the
/// answers before it stand.
pub fn answer_pending<U: Udf + ?Sized>(
    core: &mut WorkerCore,
    udf: &mut U,
) -> Result<Answered, EndpointMisuse> {
    let mut answered = Answered::default();
    if let Some(init) = core.take_init() {
        answered.acted = true;
        match udf.init(&init) {
            Ok(data) => core.accept_init(data)?,
            Err(error) => core.reject_init(error)?,
        }
    }
    let mut out = Vec::new();
    while matches!(core.phase(), WorkerPhase::Data | WorkerPhase::Draining) {
        let Some(batch) = core.pop_input() else {
            break;
        };
        answered.acted = true;
        let result = udf.process(batch, &mut out);
        queue_output(core, &mut out, &mut answered.queued)?;
        if let Err(error) = result {
            core.fail(error)?;
        }
    }
    match core.phase() {
        WorkerPhase::Draining if core.input_len() == 0 => {
            answered.acted = true;
            let response = finish_response(udf, &mut out);
            queue_output(core, &mut out, &mut answered.queued)?;
            core.finish(response)?;
        }
        WorkerPhase::Cancelling => {
            answered.acted = true;
            core.cancelled(udf.cancel())?;
        }
        _ => {}
    }
    Ok(answered)
}

/// Queues `out` as `DataResponse`s, in order, until the core drops one (udf §1.4, §2 R7).
fn queue_output(
    core: &mut WorkerCore,
    out: &mut Vec<Bytes>,
    queued: &mut Vec<DataTicket>,
) -> Result<(), EndpointMisuse> {
    for output in out.drain(..) {
        match core.send_data(output)? {
            DataSent::Queued(ticket) => queued.push(ticket),
            DataSent::Dropped => break,
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Manage RPC
// ---------------------------------------------------------------------------------------------

/// Why a `Manage` request could not be answered (udf §1.7). Its `Display` starts with the
/// gRPC status code a server should answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManageError {
    /// The `WorkerRequest` has no operation set (an empty oneof): gRPC `INVALID_ARGUMENT`.
    #[error("INVALID_ARGUMENT: WorkerRequest has no operation set")]
    EmptyRequest,
}

impl ManageError {
    /// The gRPC status code name for this error (`"INVALID_ARGUMENT"`, what the reference
    /// worker answers to an empty `WorkerRequest`, udf §1.7).
    pub fn grpc_code(&self) -> &'static str {
        match self {
            Self::EmptyRequest => "INVALID_ARGUMENT",
        }
    }
}

/// What a worker knows to answer the `Manage` RPC with (udf §1.7).
pub trait WorkerControl {
    /// Worker-global metrics for a `HeartbeatResponse` (free-form, udf §1.7). Default: none.
    fn heartbeat_metrics(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Starts a graceful shutdown as `request` asks (with `cancel_sessions`, in-flight
    /// streams are to be cancelled by sending `ErrorResponse(WorkerError)` then
    /// `CancelResponse`) and returns whether every `Execute` stream had settled before
    /// replying (`ShutdownResponse.sessions_settled`, udf §1.7).
    fn shutdown(&self, request: &ShutdownRequest) -> bool;
}

/// Answers one `Manage` request (udf §1.7): a heartbeat with a `HeartbeatResponse`
/// carrying [`WorkerControl::heartbeat_metrics`], a shutdown with a `ShutdownResponse` from
/// [`WorkerControl::shutdown`]. The response branch always matches the request's.
///
/// # Errors
/// [`ManageError::EmptyRequest`] (gRPC `INVALID_ARGUMENT`) when no operation is set.
pub fn handle_manage<W>(request: WorkerRequest, control: &W) -> Result<WorkerResponse, ManageError>
where
    W: WorkerControl + ?Sized,
{
    let manage = match request.manage.ok_or(ManageError::EmptyRequest)? {
        worker_request::Manage::Heartbeat(_) => {
            worker_response::Manage::Heartbeat(HeartbeatResponse {
                metrics: control.heartbeat_metrics(),
            })
        }
        worker_request::Manage::Shutdown(shutdown) => {
            worker_response::Manage::Shutdown(ShutdownResponse {
                sessions_settled: control.shutdown(&shutdown),
            })
        }
    };
    Ok(WorkerResponse {
        manage: Some(manage),
    })
}
