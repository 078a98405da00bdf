//! A Spark Connect server on tether that real PySpark clients use: `spark.range(…)`,
//! `limit(n)` and `count()` (the engine in `range.rs`) with `collect()`, `toArrow()`,
//! `toLocalIterator()`; reattachable executions, stream rotation, releases and abandonment
//! are tether's. Copy it and put your engine in place of `RangeEngine`.
//!
//! ```text
//! cargo run --example connect_server --features spark-connect -- --port 15002
//! python -c 'from pyspark.sql import SparkSession
//! spark = SparkSession.builder.remote("sc://localhost:15002/;user_id=me").getOrCreate()
//! print(spark.range(10).limit(3).collect(), spark.range(200000).count())'
//! ```
//!
//! It prints `listening on ADDRESS` once bound. `--tls-cert`/`--tls-key` serve TLS
//! (`--tls-client-ca` mutual TLS), `--token` requires a token (PySpark sends one over TLS
//! only), `--metrics-addr` serves Prometheus text at `/metrics`; `grpc.health.v1` answers
//! on the same port. On SIGTERM or Ctrl-C it drains (docs/deployment.md §9): it prints
//! `draining …`, then the drain's report (`drained live_at_start=N canceled=N …`), and exits
//! 0, or 1 if the drain left executions with a client attached or gave up on a canceled one
//! whose client had not read its `OPERATION_CANCELED` (`left`, `untold`); a second signal
//! stops it at once (its clients then retry a closed port). stderr carries the log (`RUST_LOG`, default `info`).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use tether::execution::{ExecutionManager, ManagerConfig};
use tether::spark::connect::tls::ServerTls;
use tether::spark::connect::{ConnectService, check_token, error_chain};
use tokio::net::TcpListener;

mod range;
mod serve;

/// A Spark Connect server for `spark.range`, `limit` and `count()`, on tether.
#[derive(Debug, Parser)]
#[command(name = "connect_server")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port to listen on; 0 binds an ephemeral port (printed either way).
    #[arg(long, default_value_t = 15002)]
    port: u16,
    /// The token every RPC must carry as `authorization: Bearer <token>` (Spark's
    /// `spark.connect.authenticate.token`). Default: none.
    #[arg(long, value_parser = |t: &str| check_token(t).map(|()| t.to_owned()))]
    token: Option<String>,
    /// Serve TLS with this PEM certificate chain (the server's certificate first).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by a CA of this PEM file (mutual TLS).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve the metrics (`tether::observe`) as Prometheus text at `http://HOST:PORT/metrics`
    /// (port 0 takes a free port; the address is printed).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<SocketAddr>,
    /// On SIGTERM, how long running queries are served before what is left is canceled.
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
}

#[tokio::main]
async fn main() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // Start-up errors in words, with their causes, exit 1.
    match run(Args::parse()).await {
        Ok(clean) => std::process::exit(if clean { 0 } else { 1 }),
        Err(e) => {
            eprintln!("connect_server: {}", error_chain(e.as_ref()));
            std::process::exit(1);
        }
    }
}

/// Serves until a signal and the drain; whether nothing was left with a client attached.
async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    // The recorder first: the manager registers its metric handles when it is built.
    if let Some(mut addr) = args.metrics_addr {
        if addr.port() == 0 {
            addr = std::net::TcpListener::bind(addr)?.local_addr()?;
        }
        // Histograms with buckets (quantiles cannot be aggregated): 1 ms to 10 min.
        let buckets = [0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0];
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
                &buckets,
            )?
            .install()?;
        println!("metrics on http://{addr}/metrics");
    }
    let manager = ExecutionManager::new(ManagerConfig::default());
    let engine = range::RangeEngine {
        config: range::EngineConfig {
            max_records_per_batch: 10_000,
            default_parallelism: 2,
        },
    };
    // Read before the listener is bound: a bad certificate or key stops the server first.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            ServerTls::from_pem_files(cert, key, args.tls_client_ca.as_deref())
                .map_err(|e| format!("TLS: {}", error_chain(&e)))?,
        ),
        _ => None,
    };
    let listener = TcpListener::bind(SocketAddr::new(args.host, args.port)).await?;
    println!("listening on {}", listener.local_addr()?);
    let deadline = Duration::from_millis(args.drain_timeout_ms);
    let (signaled, second) = tokio::sync::oneshot::channel::<()>();
    let first = async move {
        shutdown_signal().await;
        println!("draining: new sessions and executions refused, deadline {deadline:?}");
        let _ = signaled.send(());
    };
    let serving = serve::serve(
        ConnectService::new(manager, engine),
        listener,
        tls,
        args.token,
        deadline,
        first,
    );
    tokio::select! {
        report = serving => {
            let report = report?;
            println!("{report}");
            Ok(report.left.is_empty() && report.untold.is_empty())
        }
        _ = async { if second.await.is_ok() { shutdown_signal().await } else { std::future::pending().await } } => {
            println!("a second signal: stopping now");
            Ok(false)
        }
    }
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
