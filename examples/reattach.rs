//! Reattachable executions end to end, in one process: a server-side
//! [`ExecutionManager`] streams 1 000 000 rows to a client-side [`ReattachingStream`] over an
//! in-memory transport that keeps breaking things.
//!
//! What it shows (reattach rx §2–§6):
//!
//! - A producer pushes 2 000 batches of 500 rows through the manager's bounded response log
//!   (backpressure: it waits whenever 128 KiB are unsent).
//! - The transport cuts every other stream after a few responses, losing the response in
//!   flight (`UNAVAILABLE`); the server rotates the others by bytes (48 KiB per stream); and
//!   every tenth stream is preempted by a ghost `ReattachExecute` (`INVALID_CURSOR.DISCONNECTED`).
//!   The client retries with Spark's default policy, reattaches after the last response it
//!   delivered, releases each one (`ReleaseUntil`) and finally everything (`ReleaseAll`).
//! - A second client vanishes mid-result (its network is severed, so even its `ReleaseAll`
//!   cannot get through): on a manual clock the server keeps the detached execution for the
//!   5-minute `detached_timeout`, then a maintenance pass abandons it, and a late reattach gets
//!   `INVALID_HANDLE.OPERATION_ABANDONED`.
//!
//! It prints the rows received (exactly 1 000 000, in order, with a checksum), the reattach
//! count, the peak retained bytes (≤ the retry budget), the peak unsent bytes (≤ the producer
//! bound) and the executions left (0), and exits non-zero if any of those fails.
//!
//! ```text
//! cargo run --release --example reattach
//! ```
//!
//! The client's backoff waits run on a paused tokio clock (they complete at once in real
//! time); the server runs on a [`ManualClock`] that only the vanishing-client part moves.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, Stream};
use tether::execution::client::{ClientConfig, ExecutionRpc, ReattachingStream, RpcError};
use tether::execution::{
    ExecutionManager, LogConfig, ManagerConfig, Producer, Reattachable, ResponseStream,
    StreamLimits, Submitted, state,
};
use tether::time::ManualClock;
use tether::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, Plan, ReattachExecuteRequest, ReleaseExecuteRequest,
    ReleaseExecuteResponse, UserContext, execute_plan_response::ResponseType,
};

const ROWS: u64 = 1_000_000;
const BATCH_ROWS: u64 = 500;
const RETRY_BUDGET: u64 = 64 * 1024;
const MAX_UNSENT_BYTES: u64 = 128 * 1024;
const STREAM_MAX_BYTES: u64 = 48 * 1024;
const SESSION: &str = "3b241101-e2bb-4255-8caf-4136c566a962";

type Handle = Arc<tether::execution::Execution<state::Streaming, Reattachable>>;

/// What the transport did, and the server-side peaks it sampled.
#[derive(Default)]
struct Counters {
    streams: AtomicU64,
    cuts: AtomicU64,
    preemptions: AtomicU64,
    rotations: AtomicU64,
    peak_retained: AtomicU64,
    peak_unsent: AtomicU64,
}

impl Counters {
    fn sample(&self, exec: &Handle) {
        self.peak_retained
            .fetch_max(exec.retained_bytes(), Ordering::Relaxed);
        self.peak_unsent
            .fetch_max(exec.unsent_bytes(), Ordering::Relaxed);
    }
}

/// The in-memory transport: the client's three RPCs call straight into the manager, with
/// faults injected into the response streams.
struct MemoryRpc {
    manager: ExecutionManager,
    faults: bool,
    severed: AtomicBool,
    handles: Mutex<HashMap<String, Handle>>,
    counters: Arc<Counters>,
}

impl MemoryRpc {
    fn new(manager: ExecutionManager, faults: bool) -> Arc<Self> {
        Arc::new(MemoryRpc {
            manager,
            faults,
            severed: AtomicBool::new(false),
            handles: Mutex::new(HashMap::new()),
            counters: Arc::new(Counters::default()),
        })
    }

    /// The client's network goes away: every RPC fails from now on.
    fn sever(&self) {
        self.severed.store(true, Ordering::SeqCst);
    }

    fn check_link(&self) -> Result<(), RpcError> {
        if self.severed.load(Ordering::SeqCst) {
            Err(RpcError::unavailable("network unreachable"))
        } else {
            Ok(())
        }
    }

    /// Wraps one RPC's server stream with this transport's faults.
    fn wrap(&self, inner: ResponseStream, ghost: ReattachExecuteRequest) -> FaultyStream {
        let n = self.counters.streams.fetch_add(1, Ordering::Relaxed);
        let handle = self
            .handles
            .lock()
            .unwrap()
            .get(inner.operation_id())
            .cloned();
        let (cut_after, preempt_after) = match (self.faults, n % 10) {
            (false, _) => (None, None),
            (true, 3) => (None, Some(2)),
            (true, k) if k % 2 == 0 => (Some(4 + k / 2), None),
            _ => (None, None),
        };
        FaultyStream {
            inner: Some(inner),
            manager: self.manager.clone(),
            handle,
            counters: self.counters.clone(),
            ghost,
            sent: 0,
            cut_after,
            preempt_after,
            saw_complete: false,
        }
    }
}

/// A server response stream as the client sees it through a faulty network.
struct FaultyStream {
    inner: Option<ResponseStream>,
    manager: ExecutionManager,
    handle: Option<Handle>,
    counters: Arc<Counters>,
    ghost: ReattachExecuteRequest,
    sent: u64,
    /// Cut the connection when this response arrives (it is lost in flight).
    cut_after: Option<u64>,
    /// After this many responses, a ghost client attaches to the same operation.
    preempt_after: Option<u64>,
    saw_complete: bool,
}

impl Stream for FaultyStream {
    type Item = Result<ExecutePlanResponse, RpcError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.preempt_after == Some(this.sent) {
            this.preempt_after = None;
            this.counters.preemptions.fetch_add(1, Ordering::Relaxed);
            // The ghost preempts the client's stream and goes away at once.
            drop(this.manager.reattach_execute(&this.ghost));
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let item = match inner.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(item) => item,
        };
        if let Some(h) = &this.handle {
            this.counters.sample(h);
        }
        match item {
            Some(Ok(resp)) => {
                this.sent += 1;
                this.saw_complete |= resp.is_result_complete();
                if this.cut_after == Some(this.sent) && !resp.is_result_complete() {
                    this.counters.cuts.fetch_add(1, Ordering::Relaxed);
                    this.inner = None; // the server sees its RPC go away
                    return Poll::Ready(Some(Err(RpcError::unavailable(
                        "connection reset (response lost in flight)",
                    ))));
                }
                Poll::Ready(Some(Ok(resp)))
            }
            Some(Err(e)) => {
                this.inner = None;
                Poll::Ready(Some(Err(RpcError::from(e))))
            }
            None => {
                if !this.saw_complete {
                    this.counters.rotations.fetch_add(1, Ordering::Relaxed);
                }
                this.inner = None;
                Poll::Ready(None)
            }
        }
    }
}

impl ExecutionRpc for MemoryRpc {
    type Stream = BoxStream<'static, Result<ExecutePlanResponse, RpcError>>;

    fn execute_plan(
        &self,
        request: ExecutePlanRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
        let result = self.check_link().and_then(|()| {
            let ghost = ghost_request(&request);
            match self
                .manager
                .execute_plan(&request)
                .map_err(RpcError::from)?
            {
                Submitted::Reattachable(exec) => {
                    let (handle, producer, stream) = exec.start();
                    let handle = Arc::new(handle);
                    self.handles
                        .lock()
                        .unwrap()
                        .insert(stream.operation_id().to_owned(), handle.clone());
                    let (rows, batch) = decode_plan(request.plan.as_ref());
                    tokio::spawn(produce(
                        producer,
                        rows,
                        batch,
                        handle,
                        self.counters.clone(),
                    ));
                    Ok(self.wrap(stream, ghost).boxed())
                }
                Submitted::Reattached(stream) => Ok(self.wrap(*stream, ghost).boxed()),
                Submitted::NonReattachable(_) => Err(RpcError::new(
                    tether::execution::Code::Unimplemented,
                    "this example serves reattachable executions only",
                )),
            }
        });
        Box::pin(async move { result })
    }

    fn reattach_execute(
        &self,
        request: ReattachExecuteRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
        let result = self.check_link().and_then(|()| {
            let ghost = ReattachExecuteRequest {
                last_response_id: None,
                ..request.clone()
            };
            let stream = self
                .manager
                .reattach_execute(&request)
                .map_err(RpcError::from)?;
            Ok(self.wrap(stream, ghost).boxed())
        });
        Box::pin(async move { result })
    }

    fn release_execute(
        &self,
        request: ReleaseExecuteRequest,
    ) -> BoxFuture<'static, Result<ReleaseExecuteResponse, RpcError>> {
        let result = self.check_link().and_then(|()| {
            self.manager
                .release_execute(&request)
                .map_err(RpcError::from)
        });
        Box::pin(async move { result })
    }
}

fn ghost_request(request: &ExecutePlanRequest) -> ReattachExecuteRequest {
    ReattachExecuteRequest {
        session_id: request.session_id.clone(),
        user_context: request.user_context.clone(),
        operation_id: request.operation_id.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// The "query": `rows` consecutive row numbers as little-endian `u64`s, `batch` rows per
/// response. (A real server would run a plan and send Arrow IPC batches.)
fn plan(rows: u64, batch: u64) -> Plan {
    let mut bytes = rows.to_le_bytes().to_vec();
    bytes.extend(batch.to_le_bytes());
    Plan::root(bytes)
}

fn decode_plan(plan: Option<&Plan>) -> (u64, u64) {
    let Some(tether::wire::connect::plan::OpType::Root(b)) = plan.and_then(|p| p.op_type.as_ref())
    else {
        return (0, 1);
    };
    let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    (word(0), word(1).max(1))
}

/// The query runner: pushes the batches (waiting on backpressure), then finishes. Stops
/// when the execution is released or abandoned.
async fn produce(
    mut producer: Producer,
    rows: u64,
    batch: u64,
    handle: Handle,
    counters: Arc<Counters>,
) {
    let mut next = 0;
    while next < rows {
        let n = batch.min(rows - next);
        let data: Vec<u8> = (next..next + n).flat_map(u64::to_le_bytes).collect();
        if producer
            .push(ExecutePlanResponse::arrow_batch(n as i64, data))
            .await
            .is_err()
        {
            return; // released, abandoned or interrupted
        }
        counters.sample(&handle);
        next += n;
    }
    let _ = producer.finish();
}

fn request(rows: u64) -> ExecutePlanRequest {
    ExecutePlanRequest {
        session_id: SESSION.into(),
        user_context: Some(UserContext::new("example")),
        client_type: Some("tether-example".into()),
        plan: Some(plan(rows, BATCH_ROWS)),
        ..Default::default()
    }
}

fn rows_of(resp: &ExecutePlanResponse) -> impl Iterator<Item = u64> + '_ {
    let data: &[u8] = match &resp.response_type {
        Some(ResponseType::ArrowBatch(b)) => &b.data,
        _ => &[],
    };
    data.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
}

/// FNV-1a over the row numbers in delivery order.
fn checksum(acc: u64, row: u64) -> u64 {
    row.to_le_bytes().iter().fold(acc, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// A client that reads a little and vanishes; the server abandons its execution after the
/// detached timeout, on the manual clock.
async fn vanishing_client(manager: &ExecutionManager, clock: &ManualClock) {
    let rpc = MemoryRpc::new(manager.clone(), false);
    let mut stream = ReattachingStream::new(rpc.clone(), request(100_000), ClientConfig::default())
        .expect("valid request");
    for _ in 0..3 {
        stream.next().await.expect("a response").expect("no error");
    }
    let operation_id = stream.operation_id().to_owned();
    rpc.sever();
    drop(stream); // the process dies; its ReleaseAll cannot get through
    println!(
        "vanishing client: read 3 responses of {operation_id}, then vanished \
         ({} live executions)",
        manager.execution_count()
    );

    clock.advance(Duration::from_secs(4 * 60));
    let report = manager.maintain();
    println!(
        "  after 4 min detached: maintenance abandoned {} (still kept)",
        report.abandoned
    );
    assert_eq!(report.abandoned, 0);
    clock.advance(Duration::from_secs(60 + 30));
    let report = manager.maintain();
    println!(
        "  after 5.5 min detached: maintenance abandoned {}",
        report.abandoned
    );
    assert_eq!(report.abandoned, 1);
    let late = manager.reattach_execute(&ReattachExecuteRequest {
        session_id: SESSION.into(),
        user_context: Some(UserContext::new("example")),
        operation_id,
        ..Default::default()
    });
    let error = late.expect_err("the execution is gone");
    println!("  a late reattach gets: {error}");
    assert_eq!(
        error.condition(),
        Some("INVALID_HANDLE.OPERATION_ABANDONED")
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("tokio runtime");
    runtime.block_on(run());
}

async fn run() {
    let clock = ManualClock::new();
    let config = ManagerConfig {
        log: LogConfig {
            retry_budget: RETRY_BUDGET,
            max_unsent_bytes: MAX_UNSENT_BYTES,
            max_unsent_responses: 10_000,
        },
        stream: StreamLimits {
            max_duration: Some(Duration::from_secs(120)),
            max_bytes: Some(STREAM_MAX_BYTES),
        },
        ..ManagerConfig::default()
    };
    let manager = ExecutionManager::new(ManagerConfig {
        timer: Arc::new(clock.clone()),
        ..config
    });

    vanishing_client(&manager, &clock).await;

    let rpc = MemoryRpc::new(manager.clone(), true);
    let mut stream = ReattachingStream::new(rpc.clone(), request(ROWS), ClientConfig::default())
        .expect("valid request");
    let mut rows = 0u64;
    let mut in_order = true;
    let mut sum = FNV_OFFSET;
    let mut responses = 0u64;
    let mut complete = false;
    while let Some(item) = stream.next().await {
        let resp = match item {
            Ok(resp) => resp,
            Err(e) => panic!("the result stream failed: {e}"),
        };
        responses += 1;
        complete |= resp.is_result_complete();
        for row in rows_of(&resp) {
            in_order &= row == rows;
            sum = checksum(sum, row);
            rows += 1;
        }
        // Hand the batch on (a real consumer does work here); this lets the background
        // ReleaseUntil of the response run before the next one is read.
        tokio::task::yield_now().await;
    }
    let client = stream.stats();
    let releases = stream.close().await;
    rpc.handles.lock().unwrap().clear();
    let expected_sum = (0..ROWS).fold(FNV_OFFSET, checksum);
    let counters = &rpc.counters;
    let peak_retained = counters.peak_retained.load(Ordering::Relaxed);
    let peak_unsent = counters.peak_unsent.load(Ordering::Relaxed);
    let left = manager.execution_count();

    println!("main client:");
    println!(
        "  rows received:       {rows} (expected {ROWS}), in order: {in_order}, checksum \
         {sum:016x} (expected {expected_sum:016x})"
    );
    println!(
        "  responses:           {responses} ({} batches + ResultComplete: {complete})",
        responses - u64::from(complete)
    );
    println!(
        "  reattaches:          {} ({} server rotations, {} cuts, {} preemptions; {} retries)",
        client.reattaches,
        counters.rotations.load(Ordering::Relaxed),
        counters.cuts.load(Ordering::Relaxed),
        counters.preemptions.load(Ordering::Relaxed),
        client.retries
    );
    println!(
        "  releases:            {} ReleaseUntil, {} ReleaseAll ({} failed)",
        releases.until_calls, releases.all_calls, releases.failed
    );
    println!("  peak retained bytes: {peak_retained} (retry budget {RETRY_BUDGET})");
    println!("  peak unsent bytes:   {peak_unsent} (producer bound {MAX_UNSENT_BYTES})");
    println!("  executions left:     {left}");

    assert_eq!(rows, ROWS);
    assert!(
        in_order && sum == expected_sum,
        "rows out of order or corrupted"
    );
    assert!(complete);
    assert!(client.reattaches >= 100, "{} reattaches", client.reattaches);
    assert!(peak_retained <= RETRY_BUDGET, "retained {peak_retained}");
    assert!(peak_unsent <= MAX_UNSENT_BYTES, "unsent {peak_unsent}");
    assert_eq!(releases.all_calls, 1);
    assert_eq!(left, 0, "executions left");
}
