//! The test server (`cargo run --example connect_test_server --features spark-connect`):
//! `examples/connect_server`'s engine (`range.rs`) and serving code (`serve.rs`, the code of
//! `ConnectServer`'s documentation) with what only the tests, scripts and benchmarks need:
//! the stream limits and timeouts as flags, `stats` lines, an events log, seeded faults and
//! the bare baselines. Not published (the package ships `examples/` only).
//!
//! # Output
//!
//! stdout carries two kinds of lines, for scripts and tests:
//!
//! - once, when the listener is bound: `listening on 127.0.0.1:PORT`;
//! - every `--stats-interval-ms` (and once on shutdown), the manager's counters:
//!   `stats live_executions=N sessions=N created=N released=N abandoned=N forgotten=N
//!   artifact_bytes=N` (the bytes of artifacts kept, all sessions), then
//!   with `--faults` the faults injected, `faults=N` in all and per kind
//!   (`fault_graceful`, `fault_disconnected`, `fault_dropped`, `fault_forgotten`)
//!   (space-separated `key=value` pairs after the word `stats`; more keys may be appended at
//!   the end).
//!
//! With `--metrics-addr HOST:PORT` it serves tether's metrics (the table in
//! `tether::observe`) as Prometheus text at `http://HOST:PORT/metrics` and prints
//! `metrics on http://HOST:PORT/metrics`; with `--events-log FILE` it appends every
//! lifecycle event of its execution manager to `FILE`, one JSON object per line, and
//! opens `FILE` again on SIGHUP (after a log rotation moved it away).
//!
//! # Drain
//!
//! On SIGTERM (or Ctrl-C) the server drains (`ConnectService::drain`, docs/deployment.md):
//! it prints `draining …`, its health goes `NOT_SERVING`, new sessions and executions get
//! the retryable `SERVER_DRAINING` (`UNAVAILABLE`), and running queries are streamed to
//! their clients until they release them (and their sessions have been quiet for
//! `SESSION_QUIET`, 1 s, so `spark.stop()` still reaches this server) or
//! `--drain-timeout-ms` passes. At the deadline every query still live is canceled: its
//! client gets `OPERATION_CANCELED` at once, what was not read is dropped, and the drain
//! waits up to `DRAIN_GRACE` (5 s) for those clients to release; a query no client has
//! been attached to for 5 s is abandoned (nobody to tell). It prints the drain's report
//! (`drained live_at_start=N canceled=N abandoned=N left=N sessions_open=N elapsed_ms=N`),
//! stops (waiting up to 5 s more for open streams; if those that are left reached no
//! handler, such as a request whose body never came, it closes their connections and waits
//! up to 2 s more), prints its last `stats` line and exits 0, or 1 if the stop cut
//! something short: executions `left` (a client still attached, not done), streams of the
//! service still open 5 s after the drain, or a second signal, which stops it at once. So a
//! SIGTERM ends the process within `--drain-timeout-ms` + 12 s (`DRAIN_GRACE` 5 s, `HARD_STOP`
//! 5 s, `CLOSE_WAIT` 2 s; 5 s more for a slow `--events-log` reader, `EVENTS_LOG_FLUSH`): give
//! an orchestrator's grace period (Kubernetes' `terminationGracePeriodSeconds`) at least
//! that. A client that already holds the rest of its result (in its own and the
//! transport's buffers) when the deadline passes reads it to the end and is not told:
//! nothing of its query was left to cancel.
//!
//! # TLS and health
//!
//! `--tls-cert PEM --tls-key PEM` serve TLS (`--tls-client-ca PEM` adds mutual TLS: clients
//! must present a certificate that CA signed); `--token` works over it unchanged. PySpark
//! connects with `sc://localhost:PORT/;use_ssl=true;token=…`, trusting the server's CA
//! through `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=ca.pem`; `examples/connect_client.rs` with
//! `--url https://localhost:PORT --tls-ca ca.pem`.
//!
//! The standard `grpc.health.v1.Health` service is served on the same port, without the
//! token: `SERVING` for `""` and for `spark.connect.SparkConnectService`.
//!
//! # Faults
//!
//! `--faults SEED` ends some response streams as a flaky network or a restarting server
//! would, so a client's recovery really runs (module `faults`).
//!
//! stderr carries the log (tracing; `RUST_LOG` overrides the default `info`: start, drain,
//! stop and errors). `RUST_LOG=info,tether::spark::connect=debug` adds one line per
//! ExecutePlan (with the interpreted plan), ReattachExecute, ReleaseExecute, Interrupt and
//! ReleaseSession: with stream rotation, several per query.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tether::execution::{
    AdmissionConfig, ExecutionEvent, ExecutionEventKind as EventKind, ExecutionManager,
    ManagerConfig, StreamLimits,
};
use tether::observe::{EventReceiver, event_channel};
use tether::spark::connect::tls::ServerTls;
use tether::spark::connect::{
    ArtifactLimits, ArtifactStore, ConnectService, MemoryArtifactStore, error_chain,
};
use tokio::net::TcpListener;

mod baseline;
mod faults;
mod harness;
mod paced;
#[path = "../../../examples/connect_server/range.rs"]
mod range;
#[path = "../../../examples/connect_server/serve.rs"]
mod serve;
use faults::Faults;
use paced::Paced;
use range::{EngineConfig, RangeEngine};

/// A Spark Connect server for `spark.range`, `limit` and `count()`, on tether.
#[derive(Debug, Parser)]
#[command(name = "connect_server")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port to listen on; 0 binds an ephemeral port (the bound address is printed on
    /// stdout either way).
    #[arg(long, default_value_t = 15002)]
    port: u16,
    /// The pre-shared token every RPC must carry as `authorization: Bearer <token>`
    /// (Spark's `spark.connect.authenticate.token`). Default: no authentication. Must not
    /// be empty, and must be printable ASCII (what a client can send in a header).
    #[arg(long, value_parser = parse_token)]
    token: Option<String>,
    /// Serve TLS with this PEM certificate chain (the server's certificate first) and
    /// `--tls-key`; PySpark connects with `sc://HOST:PORT/;use_ssl=true`, tether's client
    /// with an `https://` URL. A file that is not a usable certificate stops the server
    /// before it listens. Default: plaintext.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Require every client to present a certificate signed by a CA of this PEM file
    /// (mutual TLS; with `--tls-cert`). A client without one is answered `UNAUTHENTICATED`
    /// saying so. Not with `--faults` (whose connections carry no certificate information).
    #[arg(
        long,
        value_name = "PEM",
        requires = "tls_cert",
        conflicts_with = "faults"
    )]
    tls_client_ca: Option<std::path::PathBuf>,
    /// End each response stream after this many milliseconds, so the client reattaches
    /// (`spark.connect.execute.reattachable.senderMaxStreamDuration`; 0 = unlimited).
    #[arg(long, default_value_t = 120_000)]
    max_stream_duration_ms: u64,
    /// End each response stream once it has sent more than this many bytes
    /// (`spark.connect.execute.reattachable.senderMaxStreamSize`; 0 = unlimited).
    #[arg(long, default_value_t = 1 << 30)]
    max_stream_bytes: u64,
    /// Abandon an execution no client has been attached to for this long
    /// (`spark.connect.execute.manager.detachedTimeout`).
    #[arg(long, default_value_t = 300_000)]
    detached_timeout_ms: u64,
    /// Period of the maintenance pass that abandons detached executions and expires idle
    /// sessions (`spark.connect.execute.manager.maintenanceInterval`).
    #[arg(long, default_value_t = 30_000)]
    maintenance_interval_ms: u64,
    /// Period of the `stats …` line on stdout.
    #[arg(long, default_value_t = 5_000)]
    stats_interval_ms: u64,
    /// On SIGTERM, how long running queries are streamed to their clients before what
    /// was not sent yet is canceled (`ConnectService::drain`'s deadline); the process ends
    /// at most 12 s after it (17 s with a slow `--events-log` reader; see "Drain" above).
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// Most bytes of artifacts (`AddArtifacts`) one session keeps and has in flight
    /// (`tether::spark::connect::ArtifactLimits::session_bytes`).
    #[arg(long, default_value_t = 256 << 20)]
    artifact_session_bytes: u64,
    /// Most bytes of artifacts all sessions keep and have in flight together
    /// (`ArtifactLimits::total_bytes`).
    #[arg(long, default_value_t = 1 << 30)]
    artifact_total_bytes: u64,
    /// Most rows per Arrow batch (`spark.sql.execution.arrow.maxRecordsPerBatch`).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    max_records_per_batch: u32,
    /// Most executions running at once, server-wide (`ManagerConfig::admission`, connect
    /// §11); the rest wait in FIFO order. Default: no cap.
    #[arg(long)]
    max_running: Option<usize>,
    /// Most executions of one user running at once. Default: no cap.
    #[arg(long)]
    max_running_per_user: Option<usize>,
    /// Longest an execution waits for a slot before `SERVER_BUSY` (0 = no limit).
    #[arg(long, default_value_t = 60_000)]
    max_wait_ms: u64,
    /// Wait this long before each response the engine produces (a slow query: tests of
    /// admission). Default 0.
    #[arg(long, default_value_t = 0)]
    response_delay_ms: u64,
    /// Partitions of a `range` that does not ask for a number (Spark's default
    /// parallelism; `local[2]` has 2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    default_parallelism: u32,
    /// Seeded fault mode: end at most 10 % of the response streams (never two of one
    /// operation in a row) gracefully without `ResultComplete`, with
    /// `[INVALID_CURSOR.DISCONNECTED]`, by dropping the connection, or (an ExecutePlan
    /// before its first response) by forgetting the operation as a restarted server would.
    #[arg(long, value_name = "SEED")]
    faults: Option<u64>,
    /// Serve the metrics (tether's, `tether::observe`) as Prometheus text at
    /// `http://HOST:PORT/metrics`, through `metrics-exporter-prometheus`; the manager's
    /// counters and gauges are published every second (the `_seconds` metrics are
    /// histograms with buckets from 1 ms to 10 min). Port 0 takes a free port; the address
    /// is printed (`metrics on http://…/metrics`).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<SocketAddr>,
    /// Append every lifecycle event of the execution manager to this file (created if
    /// missing; the server does not start if it cannot be opened), one JSON object per line
    /// (`tether::execution::ExecutionEvent`): `at_ms` (milliseconds since the server
    /// started), `kind`, `user_id`, `session_id`, `operation_id` (null for session events),
    /// `job_tag`, and `fields`, the kind's own fields; a last line
    /// `{"kind":"Dropped","count":N,"unwritten":M}` counts the events a full channel dropped
    /// (also in `tether_events_dropped_total`) and those a failed write lost (also in
    /// `connect_server_events_unwritten_total`; the first failure of a streak is logged at
    /// once). Written by a thread of its own; a stopping server waits at most 5 s for it.
    /// On SIGHUP the file is opened again at this path (created if missing), as after a log
    /// rotation renamed it; if that fails, the old file is kept and the failure logged.
    /// The streams `--faults` ends are the example's own doing, not the manager's: they are
    /// neither events nor counted in `tether_connect_errors_total`; an operation the faults
    /// forget runs again under its id, so its id has two `OperationStarted` … `OperationClosed`
    /// runs.
    #[arg(long, value_name = "FILE")]
    events_log: Option<std::path::PathBuf>,
    /// Serve the same engine without tether (module `baseline`): the baseline of
    /// `scripts/bench-connect.sh`. Not a Spark Connect server to use.
    #[arg(long, value_enum, conflicts_with_all = ["faults", "token"])]
    baseline: Option<Baseline>,
}

/// The bare baselines (module `baseline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Baseline {
    /// Plain tonic: every response in one stream.
    Bare,
    /// Plain tonic, every stream ended after one response (as a 123-byte rotation does).
    BareRotating,
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

fn stats_line(
    manager: &ExecutionManager,
    artifacts: &MemoryArtifactStore,
    faults: Option<&Faults>,
) -> String {
    let s = manager.stats();
    let mut line = format!(
        "stats live_executions={} sessions={} created={} released={} abandoned={} forgotten={} \
         admission_running={} admission_waiting={} artifact_bytes={}",
        s.executions,
        s.sessions,
        s.created,
        s.released,
        s.abandoned,
        s.forgotten,
        manager.admission_usage().running,
        manager.admission_usage().waiting,
        artifacts.stored_bytes()
    );
    if let Some(faults) = faults {
        line.push(' ');
        line.push_str(&faults.stats());
    }
    line
}

/// The user of each live session and operation, as their `SessionStarted` and
/// `OperationStarted` events named it (the other events carry ids only), so that every
/// line of `--events-log` names its user and job tag.
#[derive(Default)]
struct Users {
    sessions: std::collections::HashMap<uuid::Uuid, std::sync::Arc<str>>,
    operations: std::collections::HashMap<uuid::Uuid, std::sync::Arc<str>>,
}

impl Users {
    /// The user of `e`, remembering or forgetting it as `e` opens or closes a session or
    /// an operation.
    fn of(&mut self, e: &ExecutionEvent) -> Option<std::sync::Arc<str>> {
        match (&e.kind, e.operation_id) {
            (EventKind::SessionStarted { user_id }, _) => {
                self.sessions.insert(e.session_id, user_id.clone());
                Some(user_id.clone())
            }
            (EventKind::SessionClosed { .. }, _) => self.sessions.remove(&e.session_id),
            (EventKind::OperationStarted { user_id, .. }, Some(op)) => {
                self.operations.insert(op, user_id.clone());
                Some(user_id.clone())
            }
            (EventKind::OperationClosed, Some(op)) => self.operations.remove(&op),
            (_, Some(op)) => self
                .operations
                .get(&op)
                .or_else(|| self.sessions.get(&e.session_id))
                .cloned(),
            (_, None) => self.sessions.get(&e.session_id).cloned(),
        }
    }
}

/// One lifecycle event as a JSON object (`--events-log`); `start` is the server's start.
fn event_json(
    e: &ExecutionEvent,
    users: &mut Users,
    start: std::time::Instant,
) -> serde_json::Value {
    use serde_json::json;
    let (kind, fields) = match &e.kind {
        EventKind::SessionStarted { .. } => ("SessionStarted", json!({})),
        EventKind::SessionClosed { .. } => ("SessionClosed", json!({})),
        EventKind::OperationStarted { tags, .. } => ("OperationStarted", json!({ "tags": tags })),
        EventKind::OperationAnalyzed { statement_text } => (
            "OperationAnalyzed",
            json!({ "statement_text": statement_text }),
        ),
        EventKind::OperationReadyForExecution => ("OperationReadyForExecution", json!({})),
        EventKind::OperationFinished { produced_row_count } => (
            "OperationFinished",
            json!({ "produced_row_count": produced_row_count }),
        ),
        EventKind::OperationFailed { error_message } => {
            ("OperationFailed", json!({ "error_message": error_message }))
        }
        EventKind::OperationCanceled => ("OperationCanceled", json!({})),
        EventKind::OperationClosed => ("OperationClosed", json!({})),
        EventKind::Reattached {
            resumed_at,
            replayed,
        } => (
            "Reattached",
            json!({ "resumed_at": resumed_at, "replayed": replayed }),
        ),
        EventKind::StreamRotated { reason } => {
            ("StreamRotated", json!({ "reason": format!("{reason:?}") }))
        }
        EventKind::Released { until } => ("Released", json!({ "until": until })),
        EventKind::Abandoned => ("Abandoned", json!({})),
        EventKind::TombstoneHit => ("TombstoneHit", json!({})),
        EventKind::ProducerWaiting { bytes } => ("ProducerWaiting", json!({ "bytes": bytes })),
        other => ("Other", json!({ "debug": format!("{other:?}") })),
    };
    let user_id = users.of(e);
    json!({
        "at_ms": e.at.saturating_duration_since(start).as_millis() as u64,
        "kind": kind,
        "user_id": user_id.as_deref(),
        "session_id": e.session_id.to_string(),
        "operation_id": e.operation_id.map(|o| o.to_string()),
        "job_tag": user_id.and_then(|u| e.job_tag(&u)),
        "fields": fields,
    })
}

/// The `--events-log` writer: a thread of its own (a file write blocks, and a slow reader
/// of a pipe would hold a runtime worker) that reads the manager's event channel in batches
/// every [`EVENTS_LOG_PERIOD`] (as `tether::observe` suggests at high event rates) and
/// appends them, one JSON line each. A failed write is logged at once (the first of a
/// streak) and its events counted as `unwritten`, in the metric
/// `connect_server_events_unwritten_total` and on the last line; the writer keeps reading,
/// so the channel never fills behind a broken file, and writes again once the file takes
/// them (a full disk freed). On SIGHUP it opens its path again before its next write (the
/// convention of log rotation: the old file was renamed, and its last events are in it).
struct EventsLog {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// How often the `--events-log` writer reads the channel.
const EVENTS_LOG_PERIOD: Duration = Duration::from_millis(10);

/// How long a stopping server waits for the `--events-log` writer to write what it read
/// and its last line; a reader of a pipe that slow loses the rest (said on stdout).
const EVENTS_LOG_FLUSH: Duration = Duration::from_secs(5);

impl EventsLog {
    fn start(
        mut events: EventReceiver<ExecutionEvent>,
        path: std::path::PathBuf,
        start: std::time::Instant,
    ) -> Result<Self, String> {
        use std::io::Write;
        let open = |path: &std::path::Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        };
        // Opened now: a path that cannot be written stops the server before it serves.
        let mut file = open(&path).map_err(|e| format!("--events-log {}: {e}", path.display()))?;
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| format!("a SIGHUP handler: {e}"))?;
        let reopen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reopening = reopen.clone();
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                reopening.store(true, std::sync::atomic::Ordering::Release);
            }
        });
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        metrics::describe_counter!(
            "connect_server_events_unwritten_total",
            metrics::Unit::Count,
            "Events the --events-log writer read but could not write."
        );
        let unwritten_total = metrics::counter!("connect_server_events_unwritten_total");
        let thread = std::thread::spawn(move || {
            let mut users = Users::default();
            let (mut unwritten, mut failing) = (0u64, false);
            let mut batch = Vec::new();
            loop {
                let last = stopping.load(std::sync::atomic::Ordering::Acquire);
                if reopen.swap(false, std::sync::atomic::Ordering::AcqRel) {
                    match open(&path) {
                        Ok(reopened) => {
                            file = reopened;
                            tracing::info!(path = %path.display(), "events log opened again (SIGHUP)");
                        }
                        Err(e) => tracing::error!(
                            path = %path.display(),
                            error = %e,
                            "opening the events log again failed (SIGHUP): writing on to the old file"
                        ),
                    }
                }
                let mut n = 0u64;
                while let Some(e) = events.try_recv() {
                    let _ = writeln!(batch, "{}", event_json(&e, &mut users, start));
                    n += 1;
                }
                if last {
                    let _ = writeln!(
                        batch,
                        "{}",
                        serde_json::json!({
                            "kind": "Dropped",
                            "count": events.dropped(),
                            "unwritten": unwritten + n,
                        })
                    );
                }
                if !batch.is_empty() {
                    match file.write_all(&batch).and_then(|()| file.flush()) {
                        Ok(()) => failing = false,
                        Err(e) => {
                            if !failing {
                                tracing::error!(
                                    error = %e,
                                    "writing the events log failed: its events are counted \
                                     as unwritten until a write succeeds"
                                );
                            }
                            failing = true;
                            unwritten += n;
                            unwritten_total.increment(n);
                        }
                    }
                    batch.clear();
                }
                if last {
                    if unwritten > 0 {
                        println!("events log: {unwritten} events could not be written");
                    }
                    return;
                }
                std::thread::sleep(EVENTS_LOG_PERIOD);
            }
        });
        Ok(Self { stop, thread })
    }

    /// Writes what is left and the last line, waiting at most [`EVENTS_LOG_FLUSH`].
    async fn finish(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        let waited = std::time::Instant::now();
        while !self.thread.is_finished() {
            if waited.elapsed() >= EVENTS_LOG_FLUSH {
                println!(
                    "events log: not written {} ms after the stop (its reader is too slow): \
                     the rest is lost",
                    EVENTS_LOG_FLUSH.as_millis()
                );
                return;
            }
            tokio::time::sleep(EVENTS_LOG_PERIOD).await;
        }
        if self.thread.join().is_err() {
            tracing::error!("the events log writer panicked");
        }
    }
}

/// `--token`: refuses what no client could send, or what would look like a token and
/// protect nothing (connect §4: the token travels in the `authorization` header).
fn parse_token(token: &str) -> Result<String, String> {
    tether::spark::connect::check_token(token).map(|()| token.to_owned())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

#[tokio::main]
async fn main() {
    // Start-up errors in words, with their causes (a missing file says why), exit 1.
    if let Err(e) = serve(Args::parse()).await {
        eprintln!("connect_server: {}", error_chain(e.as_ref()));
        std::process::exit(1);
    }
}

async fn serve(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    // The recorder first: the manager registers its metric handles when it is built.
    let start = std::time::Instant::now();
    if let Some(mut addr) = args.metrics_addr {
        if addr.port() == 0 {
            // The exporter binds its own listener and does not say its port: take a free one
            // now (another process could take it in between; then the exporter fails to bind).
            addr = std::net::TcpListener::bind(addr)
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
        }
        // Histograms with buckets (a summary's quantiles cannot be aggregated): 1 ms to 10 min.
        let buckets = [
            0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
        ];
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
                &buckets,
            )?
            .install()?;
        println!("metrics on http://{addr}/metrics");
    }
    let (events, events_task) = match &args.events_log {
        Some(path) => {
            let (tx, rx) = event_channel(1 << 16);
            (Some(tx), Some(EventsLog::start(rx, path.clone(), start)?))
        }
        None => (None, None),
    };
    let manager = ExecutionManager::new(ManagerConfig {
        stream: StreamLimits {
            // 0 is unlimited, as Spark's 0 (`StreamLimits`).
            max_duration: Some(Duration::from_millis(args.max_stream_duration_ms)),
            max_bytes: Some(args.max_stream_bytes),
        },
        detached_timeout: Duration::from_millis(args.detached_timeout_ms),
        maintenance_interval: Duration::from_millis(args.maintenance_interval_ms.max(1)),
        events,
        admission: AdmissionConfig {
            max_running: args.max_running,
            max_running_per_user: args.max_running_per_user,
            max_wait: (args.max_wait_ms > 0).then(|| Duration::from_millis(args.max_wait_ms)),
        },
        ..ManagerConfig::default()
    });
    let engine = Paced {
        engine: RangeEngine {
            config: EngineConfig {
                max_records_per_batch: args.max_records_per_batch,
                default_parallelism: args.default_parallelism,
            },
        },
        delay: Duration::from_millis(args.response_delay_ms),
    };
    // Read before the listener is bound: a bad certificate or key stops the server first.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            ServerTls::from_pem_files(cert, key, args.tls_client_ca.as_deref())
                .map_err(|e| format!("TLS: {}", error_chain(&e)))?,
        ),
        _ => None,
    };
    let drained = Arc::new(std::sync::OnceLock::new());

    let listener = TcpListener::bind(SocketAddr::new(args.host, args.port)).await?;
    let address = listener.local_addr()?;
    println!("listening on {address}");
    tracing::info!(
        %address,
        token = args.token.is_some(),
        tls = tls.is_some(),
        mutual_tls = tls.as_ref().is_some_and(ServerTls::requires_client_certificate),
        max_stream_duration_ms = args.max_stream_duration_ms,
        max_stream_bytes = args.max_stream_bytes,
        detached_timeout_ms = args.detached_timeout_ms,
        maintenance_interval_ms = args.maintenance_interval_ms,
        "Spark Connect server started"
    );

    let faults = args.faults.map(|seed| Faults::new(seed, manager.clone()));
    let artifacts = Arc::new(MemoryArtifactStore::new(ArtifactLimits {
        session_bytes: args.artifact_session_bytes,
        total_bytes: args.artifact_total_bytes,
    }));
    let stats = {
        let manager = manager.clone();
        let artifacts = artifacts.clone();
        let faults = faults.clone();
        let period = Duration::from_millis(args.stats_interval_ms.max(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                println!("{}", stats_line(&manager, &artifacts, faults.as_deref()));
            }
        })
    };

    let forced = if faults.is_some() || args.baseline.is_some() {
        // The test harnesses: faults injected into the service and its connections, or the
        // bare baseline without tether (module `harness`).
        let service =
            ConnectService::with_artifact_store(manager.clone(), engine, artifacts.clone());
        harness::serve(
            &args,
            engine,
            service,
            tls,
            listener,
            faults.clone(),
            drained.clone(),
        )
        .await?
    } else {
        // On the first signal the server drains; a second one stops it at once.
        let signaled = Arc::new(tokio::sync::Notify::new());
        let deadline = Duration::from_millis(args.drain_timeout_ms);
        let first = {
            let signaled = signaled.clone();
            async move {
                shutdown_signal().await;
                println!(
                    "draining: health NOT_SERVING, new sessions and executions refused, deadline {} ms",
                    deadline.as_millis()
                );
                signaled.notify_one();
            }
        };
        let service =
            ConnectService::with_artifact_store(manager.clone(), engine, artifacts.clone());
        let serving = serve::serve(service, listener, tls, args.token.clone(), deadline, first);
        tokio::select! {
            report = serving => {
                let report = report?;
                println!("{report}");
                let _ = drained.set(report);
                None
            }
            () = async { signaled.notified().await; shutdown_signal().await } => {
                println!("a second signal: stopping now");
                Some("a second signal")
            }
        }
    };
    stats.abort();
    println!("{}", stats_line(&manager, &artifacts, faults.as_deref()));
    if let Some(log) = events_task {
        log.finish().await;
    }
    // Exit 1 when the stop cut something short: a forced stop, or executions the drain left
    // with a client attached (its stream is cut). Canceled executions were told; abandoned
    // ones had nobody to tell.
    let left = drained.get().map_or(0, |r| r.left.len() + r.untold.len());
    if forced.is_some() || left > 0 {
        tracing::warn!(
            ?forced,
            left,
            "Spark Connect server stopped before everything ended"
        );
        std::process::exit(1);
    }
    tracing::info!("Spark Connect server stopped");
    Ok(())
}
