//! The memory-budget run (issue 12 item 5): many executions streamed through the Spark
//! Connect service over loopback gRPC to consumers that stall after their first response,
//! multiplexed on a few HTTP/2 channels. It samples this process's resident memory
//! (`VmRSS`) while they stall and prints it beside the stated total: the manager's memory
//! budget (tether's bound over rx §3.1's unsent and retained responses) + the transport's
//! bound (`TransportLimits::bound`, server and client side) + the base measured before the
//! first execution. Then the consumers drain and every response is checked (in order, none
//! lost, each once).
//!
//! ```text
//! cargo run --release --features spark-connect --example memory_budget -- --executions 10000
//! ```
//!
//! Stream rotation (rx §4.2) is off here: the consumers read raw ExecutePlan streams.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use tether::execution::client::ExecutionRpc;
use tether::execution::{
    ConnectError, ExecutionManager, ManagerConfig, MemoryBudget, StreamLimits,
};
use tether::spark::connect::{
    ConnectClient, ConnectServer, ConnectService, QueryEngine, ResponseSource, SessionContext,
    TransportLimits,
};
use tether::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, Plan, UserContext,
    execute_plan_request::RequestOption, execute_plan_response::ResponseType,
};
use tonic::transport::Endpoint;

#[derive(Parser, Debug)]
struct Args {
    /// Concurrent executions.
    #[arg(long, default_value_t = 10_000)]
    executions: usize,
    /// HTTP/2 channels the consumers share.
    #[arg(long, default_value_t = 4)]
    channels: usize,
    /// Responses per execution.
    #[arg(long, default_value_t = 32)]
    responses: i64,
    /// Arrow payload bytes per response.
    #[arg(long, default_value_t = 16 * 1024)]
    payload: usize,
    /// The manager's memory budget in MiB.
    #[arg(long, default_value_t = 64)]
    budget_mib: u64,
    /// How long the consumers stall after their first response, in seconds.
    #[arg(long, default_value_t = 3)]
    stall_secs: u64,
}

/// Each execution: `responses` batches of `payload` bytes, row count = sequence number.
struct Batches {
    responses: i64,
    payload: Bytes,
}

impl QueryEngine for Batches {
    fn execute(
        &self,
        _session: &SessionContext,
        _request: &ExecutePlanRequest,
    ) -> Result<ResponseSource, ConnectError> {
        let payload = self.payload.clone();
        Ok(futures::stream::iter(1..=self.responses)
            .map(move |i| Ok(ExecutePlanResponse::arrow_batch(i, payload.clone())))
            .boxed())
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// The client's stream window: what each stalled stream may buffer unread. Each channel's
/// connection window is its streams' windows plus 1 MiB: a smaller one would let the
/// unread data of stalled streams pin it, and streams behind them would never get their
/// first response (HTTP/2 flow control, not the budget).
const CLIENT_STREAM_WINDOW: u32 = 8 * 1024;
/// tonic's per-stream decode buffer on the client.
const CLIENT_DECODE_BUFFER: u64 = 8 * 1024;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let n = args.executions;
    let budget_bytes = args.budget_mib * 1024 * 1024;
    let manager = ExecutionManager::new(ManagerConfig {
        memory_budget: Some(budget_bytes),
        max_executions_per_session: n.max(1),
        stream: StreamLimits {
            max_duration: None,
            max_bytes: None,
        },
        ..ManagerConfig::default()
    });
    let engine = Batches {
        responses: args.responses,
        payload: Bytes::from(vec![7u8; args.payload]),
    };
    let service = ConnectService::new(manager.clone(), engine);
    let limits = TransportLimits {
        max_concurrent_streams: u32::try_from(n.div_ceil(args.channels) + 64)?,
        ..TransportLimits::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(ConnectServer::new(service).limits(limits).serve(
        listener,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let per_channel = n.div_ceil(args.channels) as u64;
    let client_connection_window =
        u32::try_from(per_channel * u64::from(CLIENT_STREAM_WINDOW) + 1024 * 1024)?;
    let mut clients = Vec::new();
    for _ in 0..args.channels {
        let channel = Endpoint::from_shared(address.clone())?
            .initial_stream_window_size(CLIENT_STREAM_WINDOW)
            .initial_connection_window_size(client_connection_window)
            .tcp_nodelay(true)
            .connect()
            .await?;
        clients.push(ConnectClient::with_channel(channel, None)?);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let base = rss_bytes();

    let started = Instant::now();
    let first_seen = Arc::new(AtomicUsize::new(0));
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let mut consumers = Vec::with_capacity(n);
    for i in 0..n {
        let client = clients[i % clients.len()].clone();
        let session = format!("6f1b7c4e-8a39-4d2c-9e51-{:012}", i % 16);
        // A reattachable ExecutePlan (rx §1.2); this server's engine ignores the plan.
        let request = ExecutePlanRequest {
            session_id: session,
            user_context: Some(UserContext::new("u")),
            operation_id: Some(uuid::Uuid::new_v4().to_string()),
            plan: Some(Plan::root(Bytes::from_static(b"relation"))),
            request_options: vec![RequestOption::reattach(true)],
            ..Default::default()
        };
        let first_seen = first_seen.clone();
        let mut drain = drain_rx.clone();
        let expected = args.responses;
        consumers.push(tokio::spawn(async move {
            let mut stream = client.execute_plan(request).await?;
            let mut rows = Vec::new();
            let mut ids = Vec::new();
            let mut complete = false;
            let mut take = |r: ExecutePlanResponse| {
                complete |= r.is_result_complete();
                if let Some(ResponseType::ArrowBatch(batch)) = &r.response_type {
                    rows.push(batch.row_count);
                }
                ids.push(r.response_id);
            };
            if let Some(r) = stream.next().await {
                take(r.map_err(|e| format!("{e:?}"))?);
            }
            first_seen.fetch_add(1, Ordering::Relaxed);
            let _ = drain.wait_for(|d| *d).await;
            while let Some(r) = stream.next().await {
                take(r.map_err(|e| format!("{e:?}"))?);
            }
            if rows != (1..=expected).collect::<Vec<_>>() || !complete {
                return Err(format!("responses out of order or lost: {rows:?}").into());
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(ids)
        }));
    }
    while first_seen.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "only {} of {n} first responses after 120 s",
                first_seen.load(Ordering::Relaxed)
            )
            .into());
        }
    }
    let all_started = started.elapsed();
    // The consumers stall: sample while the producers press against the budget.
    let mut peak_rss = 0;
    let stall = Instant::now();
    while stall.elapsed() < Duration::from_secs(args.stall_secs) {
        peak_rss = peak_rss.max(rss_bytes());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stalled = manager.memory_usage().expect("a budget is configured");
    let largest = {
        let r = ExecutePlanResponse::arrow_batch(i64::MAX, Bytes::from(vec![7u8; args.payload]));
        prost::Message::encoded_len(&r) as u64 + 4 * 40
    };
    let budget = MemoryBudget::new(budget_bytes);
    let budget_bound = budget.bound(n as u64, largest);
    let channels = args.channels as u64;
    let server_transport = limits.bound(n as u64, channels, largest);
    let client_transport = channels * u64::from(client_connection_window)
        + n as u64 * (CLIENT_DECODE_BUFFER + largest);
    let stated = budget_bound + server_transport + client_transport + base;

    drain_tx.send(true)?;
    let drain_start = Instant::now();
    let mut seen = std::collections::HashSet::new();
    for c in consumers {
        for id in c.await?.map_err(|e| e.to_string())? {
            assert!(seen.insert(id), "a response arrived twice");
        }
    }
    let drained = drain_start.elapsed();
    let responses = n as u64 * (args.responses as u64 + 1);
    assert_eq!(seen.len() as u64, responses, "every response once");
    let _ = stop_tx.send(());
    server.await??;

    println!("memory-budget run: {n} executions on {channels} HTTP/2 channels over loopback gRPC");
    println!(
        "  each: {} responses of {} B payload ({} B encoded, largest); consumers stall {} s after the first",
        args.responses, args.payload, largest, args.stall_secs
    );
    println!("  all first responses after   {all_started:.2?}");
    println!(
        "  budget usage while stalled: used {} (peak {}), {} producers waiting, {} floor admissions",
        mib(stalled.used),
        mib(stalled.peak),
        stalled.waiting,
        stalled.floor_admits
    );
    println!(
        "  resident memory (VmRSS):    base {} → peak while stalled {}",
        mib(base),
        mib(peak_rss)
    );
    println!(
        "  stated total:               {} = budget {} + n × floor {} + server transport {} + client transport {} + base {}",
        mib(stated),
        mib(budget_bytes),
        mib(budget_bound - budget_bytes),
        mib(server_transport),
        mib(client_transport),
        mib(base)
    );
    println!(
        "  peak RSS / stated total:    {:.2}",
        peak_rss as f64 / stated as f64
    );
    println!(
        "  drained {} responses in {drained:.2?} ({:.0} responses/s, {:.1} MiB/s of payload)",
        responses,
        responses as f64 / drained.as_secs_f64(),
        (n as u64 * args.responses as u64 * args.payload as u64) as f64
            / (1024.0 * 1024.0)
            / drained.as_secs_f64()
    );
    assert!(peak_rss <= stated, "resident memory above the stated total");
    Ok(())
}
