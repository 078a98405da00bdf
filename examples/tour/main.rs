//! The tether tour: a Rust engine running UDF worker sessions on real worker processes, over
//! real Unix sockets, on a real data set.
//!
//! Run: `cargo run --release --features grpc --example tour`. The sessions run over Spark's
//! own transport, the official `UdfWorker` gRPC service on each worker's Unix socket (one
//! HTTP/2 channel per worker, one `Execute` stream per session); with `-- --framed`, over
//! tether's framed transport instead (one socket connection per session). Exits non-zero
//! if any check fails. Runs in well under a second on a laptop.
//!
//! What it shows, with a summary table at the end (outcome, batches in → out, bytes, time,
//! worker reused or invalidated):
//!
//! 1. a finished session: `bill_length_mm / bill_depth_mm` over the 344 Palmer penguins
//!    (`examples/data/penguins.csv`, read into Arrow batches with arrow-csv's schema
//!    inference), with the worker's `FinishResponse` metrics;
//! 2. a session cancelled midway (`Cancel` after 4 of 11 batches, `CancelResponse` with
//!    partial metrics);
//! 3. a worker-reported user error: a division by zero (Spark ANSI semantics) reported as
//!    `UserError[DIVIDE_BY_ZERO]`, the session `Cancelled` carrying it, the worker still valid;
//! 4. a worker killed with SIGKILL mid-stream: `TransportFailed`, worker invalidated, its
//!    process reaped and its socket removed;
//! 5. a generator session with zero inputs (`Finish` right after `InitResponse`);
//! 6. several concurrent sessions, each on its own worker process;
//! 7. pool reuse: the second session runs on the first one's worker; a SIGKILLed pooled
//!    worker is never reused.
//!
//! Afterwards it closes the dispatchers and checks that no worker process and no socket file
//! is left, and how each worker ended (exit on SIGTERM, or killed).
//!
//! The worker is this same executable: the dispatcher starts it as
//! `tour --worker --id <uuid> --connection <socket>` (see `worker.rs`, a thin layer over
//! tether's `WorkerMain`), so nothing needs building beforehand. It decodes each
//! `DataRequest` as an Arrow IPC stream, applies the UDF named by the `Init` payload
//! (`udf.rs`), and answers with Arrow IPC (`ipc.rs` documents the encoding).

mod data;
mod ipc;
mod scenarios;
mod table;
mod udf;
mod worker;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tether::spark::udf_grpc::GrpcTransport;
use tether::wire::UdfWorkerSpecification;
use tether::worker::dispatcher::{Dispatcher, DispatcherConfig, PoolConfig};
use tether::worker::engine::{FramedTransport, WorkerTransport};

use scenarios::{Report, Tour, TourResult, process_exists};

/// Rows per input batch (344 penguins → 11 batches).
const BATCH_ROWS: usize = 32;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Worker mode first: this is how the dispatcher runs the executable.
    if args.iter().any(|a| a == "--worker") {
        return worker::main(&args);
    }
    let framed = match &args[..] {
        [] => false,
        [flag] if flag == "--framed" => true,
        _ => {
            eprintln!("usage: tour [--framed]");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(tour(framed)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("tour failed: {}", scenarios::chain(&*e));
            ExitCode::FAILURE
        }
    }
}

/// The worker specification: this executable in worker mode, Arrow, bidirectional
/// streaming, a Unix socket, reuse as given.
fn spec(exe: &Path, args: &[&str], journal: &Path, reuse: bool) -> UdfWorkerSpecification {
    UdfWorkerSpecification::direct_unix([exe.display().to_string()])
        .with_arguments(args.iter().copied())
        .with_env(worker::JOURNAL_ENV, journal.display().to_string())
        .with_concurrent_udfs(true)
        .with_reuse(reuse)
        .with_initialization_timeout(Duration::from_secs(10))
        .with_graceful_termination_timeout(Duration::from_secs(2))
}

async fn tour(framed: bool) -> TourResult<bool> {
    let started = Instant::now();
    println!("tether tour: UDF worker sessions on real worker processes");
    let path = data::default_path();
    let data = data::load(&path, BATCH_ROWS)?;
    let fields: Vec<String> = data
        .schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    println!(
        "data: {} rows in {} Arrow batches of ≤{BATCH_ROWS} rows from {}",
        data.rows(),
        data.batches.len(),
        path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(&path)
            .display()
    );
    println!("      inferred schema {{{}}}", fields.join(", "));

    // The workers write their lifecycle here (TETHER_TOUR_JOURNAL); removed at the end.
    let scratch = std::env::temp_dir().join(format!("tether-tour-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let journal = scratch.join("workers.log");
    let exe = std::env::current_exe()?;
    // The dispatchers' metrics (tether::observe), rendered as Prometheus text at the end; the
    // recorder is installed before they are built, so their handles record into it.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;

    let result = if framed {
        println!(
            "transport: tether framed (length-delimited protobuf), one socket connection per session"
        );
        let args = ["--worker", "--framed"];
        run(
            FramedTransport::default(),
            &exe,
            &args,
            &journal,
            &data,
            &metrics,
        )
        .await
    } else {
        println!(
            "transport: gRPC (Spark's UdfWorker service), one HTTP/2 channel per worker, \
             one Execute stream per session"
        );
        run(
            GrpcTransport::default(),
            &exe,
            &["--worker"],
            &journal,
            &data,
            &metrics,
        )
        .await
    };
    let _ = std::fs::remove_dir_all(&scratch);
    let (report, ends) = result?;

    println!();
    println!("summary");
    print!("{}", report.table());
    println!(
        "workers: {} started, {} exited on SIGTERM with status 0, {} SIGKILLed by the tour",
        ends.started, ends.clean, ends.killed
    );
    let (passed, total) = report.score();
    println!(
        "checks: {passed}/{total} passed; total time {}",
        table::duration(started.elapsed())
    );
    for failure in report.failures() {
        println!("  ✗ {failure}");
    }
    Ok(passed == total)
}

/// Runs the scenarios on two dispatchers (Spark's one-worker-per-session, and a reuse
/// pool), closes them, and checks for leftovers. Returns the report and whether nothing
/// was left behind.
async fn run<T: WorkerTransport + Clone>(
    transport: T,
    exe: &Path,
    args: &[&str],
    journal: &Path,
    data: &data::Dataset,
    metrics: &metrics_exporter_prometheus::PrometheusHandle,
) -> TourResult<(Report, WorkerEnds)> {
    let spark = Dispatcher::new(
        spec(exe, args, journal, false),
        transport.clone(),
        DispatcherConfig::default(),
    )?;
    let pooled = Dispatcher::new(
        spec(exe, args, journal, true),
        transport,
        DispatcherConfig {
            pool: Some(PoolConfig {
                max_idle: 2,
                idle_timeout: Duration::from_secs(30),
            }),
            ..DispatcherConfig::default()
        },
    )?;
    let dirs: Vec<PathBuf> = vec![
        spark.socket_dir().to_path_buf(),
        pooled.socket_dir().to_path_buf(),
    ];
    println!("worker command: {} {}", exe.display(), args.join(" "));
    println!(
        "socket directories (mode 0700): {}",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    println!(
        "dispatchers: 1–6 Spark's policy (a fresh worker per session, stopped when it ends); \
         7 a reuse pool (max 2 idle, 30 s idle timeout)"
    );

    let mut tour = Tour::new(&spark, &pooled, data)?;
    let outcome = tokio::select! {
        r = tour.run() => r,
        _ = tokio::signal::ctrl_c() => Err("interrupted (Ctrl-C); cleaning up".into()),
    };
    let report = std::mem::take(&mut tour.report);
    drop(tour);

    println!();
    println!(
        "[end] closing the dispatchers (SIGTERM to idle workers, sockets and directories removed)"
    );
    let closing = Instant::now();
    spark.close().await;
    pooled.close().await;
    println!("    closed in {}", table::duration(closing.elapsed()));
    let mut report = report;
    let ends = summarize_journal(&std::fs::read_to_string(journal).unwrap_or_default());
    check_leftovers(&mut report, &dirs, &ends.pids);
    report.check(
        format!(
            "{} workers started; the {} not SIGKILLed all exited on SIGTERM with status 0",
            ends.started,
            ends.started.saturating_sub(report.kills())
        ),
        ends.started == report.workers().len()
            && ends.killed == report.kills()
            && ends.clean + ends.killed == ends.started,
    );
    // The same figures from the dispatchers' own metrics: what they counted matches what
    // the workers wrote in their journal.
    let text = metrics.render();
    let figure = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    println!("    the dispatchers' metrics (tether::observe):");
    for line in text
        .lines()
        .filter(|l| l.starts_with("tether_udf_") && !l.contains("quantile"))
    {
        println!("      {line}");
    }
    report.check(
        format!(
            "the dispatchers' metrics count {} workers spawned and {} stopped, as the journal",
            figure("tether_udf_workers_spawned_total"),
            figure("tether_udf_workers_stopped_total")
        ),
        figure("tether_udf_workers_spawned_total") == ends.started as f64
            && figure("tether_udf_workers_stopped_total") == ends.started as f64
            && figure("tether_udf_workers ") == 0.0
            && figure("tether_udf_sessions ") == 0.0,
    );
    outcome?;
    Ok((report, ends))
}

/// Checks that no worker process (of those sessions ran on, and of those that wrote a
/// journal line), no socket file and no socket directory is left.
fn check_leftovers(report: &mut Report, dirs: &[PathBuf], journal_pids: &BTreeSet<u32>) {
    let pids: BTreeSet<u32> = report
        .workers()
        .keys()
        .chain(journal_pids)
        .copied()
        .collect();
    let alive: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|pid| process_exists(*pid))
        .collect();
    let sockets = report
        .workers()
        .values()
        .flatten()
        .filter(|p| p.exists())
        .count();
    let dirs_left: Vec<&PathBuf> = dirs.iter().filter(|d| d.exists()).collect();
    println!("    worker pids checked: {pids:?}");
    report.check(
        format!(
            "no worker process left ({} of {} still exist)",
            alive.len(),
            pids.len()
        ),
        alive.is_empty(),
    );
    report.check(
        format!(
            "no socket file or socket directory left ({} files, {} directories)",
            sockets,
            dirs_left.len()
        ),
        sockets == 0 && dirs_left.is_empty(),
    );
}

/// How the workers ended, from their journal lines (`<pid> <id> start` / `… exit reason=…`).
#[derive(Debug, Default)]
struct WorkerEnds {
    started: usize,
    clean: usize,
    killed: usize,
    /// Every pid that wrote a `start` line.
    pids: BTreeSet<u32>,
}

fn summarize_journal(text: &str) -> WorkerEnds {
    let mut started = BTreeSet::new();
    let mut exited = BTreeSet::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(Ok(pid)), Some(_id), Some(event)) = (
            parts.next().map(str::parse::<u32>),
            parts.next(),
            parts.next(),
        ) else {
            continue;
        };
        match event {
            "start" => {
                started.insert(pid);
            }
            "exit" if line.contains("reason=sigterm") => {
                exited.insert(pid);
            }
            _ => {}
        }
    }
    WorkerEnds {
        started: started.len(),
        clean: exited.len(),
        killed: started.difference(&exited).count(),
        pids: started,
    }
}
