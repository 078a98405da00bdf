//! The scaling curve (issue 12, item 4): how tether's cost grows with concurrency, each
//! point measured in the same run as its baseline.
//!
//! - **`grpc`** (feature `grpc`): 1, 4, 16 and 64 concurrent worker sessions
//!   ([`GrpcChannel::open_session`], one `Execute` stream each, udf §2) over ONE shared
//!   [`GrpcChannel`] to ONE worker process serving [`WorkerService::for_udf`] with the echo
//!   UDF, against the same number of plain tonic bidi streams of `UdfRequest::data` on one
//!   `tonic::transport::Channel` to one plain tonic server whose handler maps each request to
//!   its echo. Both use tether's default HTTP/2 settings (`GrpcConfig::default()`). Target
//!   ≥ 0.9 at every point.
//! - **`framed`**: 1, 4, 16 and 64 concurrent sessions over the framed Unix-socket transport
//!   ([`connect_unix`], one socket connection per session) to a pool of 8 worker processes
//!   (session `i` goes to worker `i mod 8`), each serving [`serve`] with the echo UDF on a
//!   [`FramedListener`], against the same number of bare length-prefixed `UnixStream` echo
//!   connections to 8 bare echo processes (connection `i` to process `i mod 8`; the bare
//!   engine writes prefix + payload with one vectored write and reads each echoed body
//!   straight into an exactly sized buffer). Target ≥ 0.85 at every point.
//! - **`executions`** (feature `spark-connect`): 1 000 and 10 000 concurrent executions, each
//!   read by its own [`ReattachingStream`] over a [`ConnectClient`], through
//!   [`ConnectService`] (rx §4, §6) in a server process of its own, over loopback TCP. The
//!   consumers share 8 HTTP/2 channels (one connection each would pass the 20 000-descriptor
//!   limit). The stream limits are small ([`scaled_manager_config`]: 2 KiB per stream) so
//!   every execution's stream rotates and its client reattaches several times (rx §4.2,
//!   §6.3). No bare baseline: the criterion is that the cost per execution at 10 000 is
//!   within 1.5× of that at 1 000. Rows/s, reattaches, and the resident memory (VmHWM) of
//!   the server process and of the consumer process are reported; both processes are
//!   started afresh for every round, so each high-water mark is that round's peak.
//!
//! Every iteration of a session point is `n` whole sessions run concurrently (connect/open,
//! `Init` round trip, `B` × 64 KiB out and back, `Finish`, `close`; `B` = 64 by default, so
//! 4 MiB each way per session) against `n` whole bare exchanges of the same batches.
//! Throughput is payload bytes echoed per second. The session's own round trips (`Init`,
//! `Finish`) are in every tether iteration and in no bare one, so the less data per session,
//! the more they weigh: on 3f859b6, framed, `B` = 1 (64 KiB per session) measured 0.53 at 1
//! session and 0.61 at 16, `B` = 16 (1 MiB) 0.81–0.96 at 1 to 64 sessions, `B` = 64 0.88–1.02
//! (and once 0.61 [0.50–0.92] at 16 sessions).
//! `B` = 64 measures the transport's streaming cost, with the round trips a few per cent.
//!
//! # How the ratios are computed
//!
//! Paired ABBA, as `benches/udf_session.rs` does: each point first runs both arms once and
//! compares every echoed byte with the input, then runs each arm once more to size a timed
//! chunk (≥ `TETHER_SCALING_CHUNK_MS`, 100 ms by default), then `TETHER_SCALING_ROUNDS`
//! rounds (default 12) alternate the order of the arms (AB, BA, AB, …), each arm timing one
//! chunk. The ratio is the median over the
//! rounds of `baseline time per iteration / tether time per iteration` (tether's throughput
//! as a fraction of the baseline's), with its interquartile range; both arms of a round see
//! the same machine load. Timed iterations check every session's batch count and bytes.
//!
//! The executions point pairs the two sizes the same way: each round runs 1 000 and 10 000
//! executions in alternating order, and the ratio is the median of
//! `cost per execution at 10 000 / cost per execution at 1 000` (wall time of the round
//! divided by its executions; the CPU time of both processes per execution is printed too).
//! Every execution checks that its batches arrive exactly once and in order.
//!
//! # Running
//!
//! ```text
//! cargo bench --features grpc,spark-connect --bench scaling
//! TETHER_SCALING_QUICK=1 cargo bench --features grpc,spark-connect --bench scaling
//! ```
//!
//! `TETHER_SCALING_QUICK=1`: 4 rounds, 50 ms chunks, executions 3 rounds. Other knobs:
//! `TETHER_SCALING_ROUNDS`, `TETHER_SCALING_EXECUTION_ROUNDS` (default 5),
//! `TETHER_SCALING_CHUNK_MS` (the least time one arm is timed per round; default 100),
//! `TETHER_SCALING_BATCHES` (`B`), `TETHER_SCALING_SESSIONS` (the
//! session counts, e.g. `4,64`), `TETHER_SCALING_ONLY`
//! (`grpc`, `framed` or `executions`, comma-separated), `TETHER_SCALING_OUT` (the directory
//! of the plots; default `<target>/scaling`). The run writes `scaling.svg` there: the ratio
//! against concurrency (log scale) for both transports with their targets, the executions'
//! cost per execution and their resident memory. Without `--bench` (as `cargo test
//! --benches` runs it) the binary measures nothing; `--list` lists the cases.
//!
//! Every process of the run uses glibc's malloc with the mmap and trim thresholds pinned, as
//! `benches/udf_session.rs` explains (`benches/common/malloc.rs`;
//! `TETHER_BENCH_MALLOC=default` keeps glibc's own).
//!
//! Needs `[[bench]] name = "scaling" harness = false` in Cargo.toml.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use futures::future::{LocalBoxFuture, join_all};
use tether::connection::Connection;
use tether::connection::framed::{FramedConfig, connect_unix};
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::engine::{CountingHandle, Session, SessionConfig, TerminationKind};
use tether_testing::echo::EchoUdf;
use tether_testing::fixtures::{ScratchDir, init, pattern};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::runtime::Runtime;

/// One batch: 64 KiB.
const BATCH: usize = 64 * 1024;
/// Concurrent sessions of each transport point.
const SESSION_POINTS: [usize; 4] = [1, 4, 16, 64];
/// Worker processes of the framed pool (and bare echo processes).
const POOL: usize = 8;
/// Concurrent executions of each executions point.
const EXECUTION_POINTS: [usize; 2] = [1_000, 10_000];

/// Env var that turns this binary into a child process of the given role.
const ROLE_ENV: &str = "TETHER_SCALING_ROLE";
const ROLE_FRAMED: &str = "framed";
const ROLE_BARE: &str = "bare";
#[cfg(feature = "grpc")]
const ROLE_GRPC: &str = "grpc";
#[cfg(feature = "grpc")]
const ROLE_TONIC: &str = "tonic";
#[cfg(feature = "spark-connect")]
const ROLE_CONNECT: &str = "connect";
#[cfg(feature = "spark-connect")]
const ROLE_CONSUMERS: &str = "consumers";

const CASES: [&str; 3] = ["scaling/grpc", "scaling/framed", "scaling/executions"];

#[path = "common/child.rs"]
mod child_process;
#[path = "common/malloc.rs"]
mod malloc;
#[cfg(feature = "grpc")]
#[path = "common/plain_grpc.rs"]
mod plain_grpc;

use child_process::ChildProcess;

fn main() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        child::main(&role);
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for case in CASES {
            println!("{case}: benchmark");
        }
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        println!("scaling: nothing measured outside `cargo bench --bench scaling`");
        return;
    }
    let malloc = malloc::pin();
    let knobs = Knobs::from_env();
    let load_before = loadavg();
    println!(
        "scaling: load average before {load_before}; {} rounds, chunks ≥ {} ms, {} × 64 KiB per session; malloc: {}",
        knobs.rounds,
        knobs.chunk.as_millis(),
        knobs.batches,
        malloc
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let scratch = ScratchDir::new("scaling");
    let input: Vec<Bytes> = (0..knobs.batches)
        .map(|i| pattern(BATCH, u8::try_from(i % 241).unwrap_or(0)))
        .collect();
    let mut curve = Curve::default();
    #[cfg(feature = "grpc")]
    if knobs.runs("grpc") {
        curve
            .points
            .extend(grpc::points(&rt, &knobs, &scratch, &input));
    }
    #[cfg(not(feature = "grpc"))]
    println!("grpc points skipped: build with `--features grpc`");
    if knobs.runs("framed") {
        curve
            .points
            .extend(framed_points(&rt, &knobs, &scratch, &input));
    }
    #[cfg(feature = "spark-connect")]
    if knobs.runs("executions") {
        curve.executions = executions::points(&knobs);
    }
    #[cfg(not(feature = "spark-connect"))]
    println!("executions points skipped: build with `--features spark-connect`");
    let load_after = loadavg();
    curve.print(&knobs, &load_before, &load_after);
    match plot::write(&knobs.out, &curve) {
        Ok(path) => println!("plot: {}", path.display()),
        Err(e) => println!("plot not written: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Settings.

struct Knobs {
    rounds: usize,
    execution_rounds: usize,
    chunk: Duration,
    batches: usize,
    only: Option<String>,
    /// The session counts measured (`TETHER_SCALING_SESSIONS`, comma-separated).
    sessions: Vec<usize>,
    out: PathBuf,
}

impl Knobs {
    fn from_env() -> Self {
        let quick = std::env::var("TETHER_SCALING_QUICK").is_ok_and(|v| v != "0");
        let number = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let out = std::env::var_os("TETHER_SCALING_OUT")
            .map_or_else(|| target_dir().join("scaling"), PathBuf::from);
        Knobs {
            rounds: number("TETHER_SCALING_ROUNDS", if quick { 4 } else { 12 }).max(1),
            execution_rounds: number("TETHER_SCALING_EXECUTION_ROUNDS", if quick { 3 } else { 5 })
                .max(1),
            chunk: Duration::from_millis(number(
                "TETHER_SCALING_CHUNK_MS",
                if quick { 50 } else { 100 },
            ) as u64),
            batches: number("TETHER_SCALING_BATCHES", 64).max(1),
            only: std::env::var("TETHER_SCALING_ONLY").ok(),
            sessions: std::env::var("TETHER_SCALING_SESSIONS").map_or_else(
                |_| SESSION_POINTS.to_vec(),
                |v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
            ),
            out,
        }
    }

    fn runs(&self, case: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|only| only.split(',').any(|c| c.trim() == case))
    }
}

/// User + system CPU seconds of process `pid` (`/proc/<pid>/stat`, clock ticks of 10 ms).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

/// Cargo's target directory: `CARGO_TARGET_DIR`, else three levels above this binary
/// (`<target>/release/deps/<bench>`).
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------------------------------------
// Results.

/// Median and quartiles of a sample.
#[derive(Clone, Copy, Debug)]
struct Spread {
    median: f64,
    q1: f64,
    q3: f64,
}

impl Spread {
    fn of(mut sample: Vec<f64>) -> Self {
        assert!(!sample.is_empty(), "an empty sample has no median");
        sample.sort_by(f64::total_cmp);
        let last = (sample.len() - 1) as f64;
        let quantile = |q: f64| {
            let at = q * last;
            let below = sample[at.floor() as usize];
            below + (sample[at.ceil() as usize] - below) * at.fract()
        };
        Spread {
            median: quantile(0.5),
            q1: quantile(0.25),
            q3: quantile(0.75),
        }
    }
}

/// One session point of the curve.
struct SessionPoint {
    transport: &'static str,
    sessions: usize,
    /// Median throughput of each arm, GiB/s of payload echoed.
    tether: f64,
    baseline: f64,
    ratio: Spread,
    target: f64,
}

/// One executions point: its own cost and memory, and the paired ratio against the
/// smallest point.
#[derive(Clone, Debug)]
struct ExecutionPoint {
    executions: usize,
    /// Median wall seconds per execution.
    wall_per_execution: f64,
    /// Median CPU seconds (client + server process) per execution.
    cpu_per_execution: f64,
    rows_per_second: f64,
    reattaches_per_execution: f64,
    /// Medians over the rounds of the VmHWM, bytes, of the server and of the consumer
    /// process (both fresh each round).
    server_rss: u64,
    client_rss: u64,
    /// Cost per execution of this point over the smallest point's, paired per round.
    ratio: Option<Spread>,
}

#[derive(Default)]
struct Curve {
    points: Vec<SessionPoint>,
    executions: Vec<ExecutionPoint>,
}

/// Most the per-execution cost may grow from the smallest to the largest executions point.
const EXECUTION_TARGET: f64 = 1.5;

impl Curve {
    fn print(&self, knobs: &Knobs, before: &str, after: &str) {
        println!(
            "\n==== scaling: ratio = tether throughput / baseline throughput (paired ABBA, {} rounds), {} × 64 KiB each way per session",
            knobs.rounds, knobs.batches
        );
        println!(
            "{:<10} {:>8} {:>14} {:>14} {:>24} {:>8}  met",
            "transport", "sessions", "tether GiB/s", "bare GiB/s", "ratio [IQR]", "target"
        );
        for p in &self.points {
            println!(
                "{:<10} {:>8} {:>14.3} {:>14.3} {:>24} {:>8}  {}",
                p.transport,
                p.sessions,
                p.tether,
                p.baseline,
                format!(
                    "{:.3} [{:.3}–{:.3}]",
                    p.ratio.median, p.ratio.q1, p.ratio.q3
                ),
                format!("≥ {:.2}", p.target),
                if p.ratio.median >= p.target {
                    "yes"
                } else {
                    "NO"
                }
            );
        }
        if !self.executions.is_empty() {
            println!(
                "\nexecutions (paired ABBA, {} rounds): cost ratio = cost per execution / cost per execution at {}",
                knobs.execution_rounds, EXECUTION_POINTS[0]
            );
            println!(
                "{:>10} {:>12} {:>12} {:>12} {:>10} {:>13} {:>13} {:>24}  met",
                "executions",
                "µs/exec",
                "CPU µs/exec",
                "rows/s",
                "reattach",
                "server HWM",
                "client HWM",
                "cost ratio [IQR]"
            );
            for e in &self.executions {
                let ratio = e.ratio.map_or_else(
                    || "(reference)".into(),
                    |r| format!("{:.3} [{:.3}–{:.3}]", r.median, r.q1, r.q3),
                );
                let met = e.ratio.map_or("", |r| {
                    if r.median <= EXECUTION_TARGET {
                        "yes (≤ 1.5)"
                    } else {
                        "NO (≤ 1.5)"
                    }
                });
                println!(
                    "{:>10} {:>12.1} {:>12.1} {:>12.0} {:>10.1} {:>10.1} MiB {:>10.1} MiB {:>24}  {}",
                    e.executions,
                    e.wall_per_execution * 1e6,
                    e.cpu_per_execution * 1e6,
                    e.rows_per_second,
                    e.reattaches_per_execution,
                    mib(e.server_rss),
                    mib(e.client_rss),
                    ratio,
                    met
                );
            }
        }
        println!(
            "machine: {} cores; load average before {before}, after {after}",
            std::thread::available_parallelism().map_or(0, usize::from)
        );
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

// ---------------------------------------------------------------------------------------------
// The paired driver of the session points.

/// One arm of a point: runs one iteration (its sessions concurrently) and returns every
/// session's echoed batches.
type Arm<'a> = Box<dyn FnMut() -> LocalBoxFuture<'a, Vec<Vec<Bytes>>> + 'a>;

/// Verifies both arms, then measures `rounds` ABBA rounds and returns the point.
fn pair_point(
    rt: &Runtime,
    knobs: &Knobs,
    (transport, sessions, target): (&'static str, usize, f64),
    input: &[Bytes],
    (mut tether, mut baseline): (Arm<'_>, Arm<'_>),
    workers: &[u32],
) -> SessionPoint {
    let check = |out: &[Vec<Bytes>], exact: bool| {
        assert_eq!(out.len(), sessions, "{transport}: sessions returned");
        for session in out {
            if exact {
                assert!(session == input, "{transport}: echoed data differs");
            } else {
                let bytes: usize = session.iter().map(Bytes::len).sum();
                assert!(
                    session.len() == input.len() && bytes == input.len() * BATCH,
                    "{transport}: {} batches / {bytes} bytes echoed",
                    session.len()
                );
            }
        }
    };
    let calibrate = |arm: &mut Arm<'_>| {
        check(&rt.block_on(arm()), true);
        let start = Instant::now();
        check(&rt.block_on(arm()), false);
        let once = start.elapsed().as_secs_f64().max(1e-6);
        (knobs.chunk.as_secs_f64() / once).ceil().clamp(1.0, 1000.0) as u32
    };
    let chunks = (calibrate(&mut tether), calibrate(&mut baseline));
    // Seconds per iteration, and the CPU seconds per wall second of the engine process and
    // of every worker process (both arms' workers: the idle arm's add nothing).
    let workers_cpu = || workers.iter().map(|&pid| cpu_seconds(pid)).sum::<f64>();
    let me = std::process::id();
    let time = |arm: &mut Arm<'_>, iterations: u32| {
        rt.block_on(async {
            let (cpu, others) = (cpu_seconds(me), workers_cpu());
            let start = Instant::now();
            for _ in 0..iterations {
                check(&arm().await, false);
            }
            let wall = start.elapsed().as_secs_f64().max(1e-6);
            let busy = (cpu_seconds(me) - cpu) / wall;
            let worker_busy = (workers_cpu() - others) / wall;
            (wall / f64::from(iterations), (busy, worker_busy))
        })
    };
    let (mut ratios, mut tether_s, mut baseline_s) = (Vec::new(), Vec::new(), Vec::new());
    let (mut tether_cpu, mut baseline_cpu) = (Vec::new(), Vec::new());
    let (mut tether_workers, mut baseline_workers) = (Vec::new(), Vec::new());
    for round in 0..knobs.rounds {
        let ((t, t_cpu), (b, b_cpu)) = if round % 2 == 0 {
            let t = time(&mut tether, chunks.0);
            (t, time(&mut baseline, chunks.1))
        } else {
            let b = time(&mut baseline, chunks.1);
            (time(&mut tether, chunks.0), b)
        };
        ratios.push(b / t);
        tether_s.push(t);
        baseline_s.push(b);
        tether_cpu.push(t_cpu.0);
        baseline_cpu.push(b_cpu.0);
        tether_workers.push(t_cpu.1);
        baseline_workers.push(b_cpu.1);
    }
    let bytes = (sessions * input.len() * BATCH) as f64 / f64::from(1u32 << 30);
    let point = SessionPoint {
        transport,
        sessions,
        tether: bytes / Spread::of(tether_s).median,
        baseline: bytes / Spread::of(baseline_s).median,
        ratio: Spread::of(ratios),
        target,
    };
    println!(
        "{transport} × {sessions}: tether {:.3} GiB/s, bare {:.3} GiB/s, ratio {:.3} [{:.3}–{:.3}] (chunks {} / {} iterations; CPU of the engine {:.0} % / {:.0} %, of the workers {:.0} % / {:.0} %; load {})",
        point.tether,
        point.baseline,
        point.ratio.median,
        point.ratio.q1,
        point.ratio.q3,
        chunks.0,
        chunks.1,
        Spread::of(tether_cpu).median * 100.0,
        Spread::of(baseline_cpu).median * 100.0,
        Spread::of(tether_workers).median * 100.0,
        Spread::of(baseline_workers).median * 100.0,
        loadavg()
    );
    point
}

/// One whole worker session on `conn`: `init`, the batches through `process`, `close`.
async fn session<C>(conn: C, input: &[Bytes]) -> Vec<Bytes>
where
    C: Connection<UdfRequest, UdfResponse> + std::fmt::Debug + Send + Unpin + 'static,
{
    let handle = Arc::new(CountingHandle::for_one_session());
    let (ready, _) = Session::new(conn, handle, SessionConfig::default())
        .init(init("echo"))
        .await
        .expect("Init answered");
    let mut output = ready.process(futures::stream::iter(input.to_vec()));
    let mut echoed = Vec::with_capacity(input.len());
    while let Some(batch) = output.next().await {
        echoed.push(batch.expect("an echoed batch"));
    }
    let end = output.close().await;
    assert_eq!(end.kind(), TerminationKind::Finished, "{end}");
    echoed
}

// ---------------------------------------------------------------------------------------------
// Child processes.

/// This binary re-executed in `role`, serving on `path` (the path is its one argument).
fn serving(role: &str, path: PathBuf) -> ChildProcess {
    let arg = path.clone();
    ChildProcess::listening(ROLE_ENV, role, &[arg.as_os_str()], path)
}

mod child {
    use std::io;
    use std::path::PathBuf;
    use std::time::Duration;

    use bytes::{Buf, BytesMut};
    use tether::connection::framed::{FramedConfig, FramedListener};
    use tether::wire::{UdfRequest, UdfResponse};
    use tether::worker::endpoint::{EndpointConfig, serve};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{UnixListener, UnixStream};

    use super::{EchoUdf, ROLE_BARE, ROLE_FRAMED};

    /// A child process: serves `role` on the path given as its argument until killed or
    /// orphaned.
    pub(super) fn main(role: &str) {
        #[cfg(feature = "spark-connect")]
        if role == super::ROLE_CONSUMERS {
            return super::executions::consumers();
        }
        let path = PathBuf::from(std::env::args().nth(1).expect("child needs a path"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(async move {
            let parent = std::os::unix::process::parent_id();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if std::os::unix::process::parent_id() != parent {
                        std::process::exit(0);
                    }
                }
            });
            match role {
                ROLE_FRAMED => {
                    let listener = FramedListener::bind_unix(&path).expect("bind");
                    let config = FramedConfig::default();
                    loop {
                        let conn = listener
                            .accept::<UdfResponse, UdfRequest>(&config)
                            .await
                            .expect("accept");
                        tokio::spawn(serve(conn, EchoUdf::default(), EndpointConfig::default()));
                    }
                }
                ROLE_BARE => {
                    let listener = UnixListener::bind(&path).expect("bind");
                    loop {
                        let (stream, _) = listener.accept().await.expect("accept");
                        tokio::spawn(bare_echo(stream));
                    }
                }
                #[cfg(feature = "grpc")]
                super::ROLE_GRPC => super::plain_grpc::tether_worker(&path).await,
                #[cfg(feature = "grpc")]
                super::ROLE_TONIC => super::plain_grpc::tonic_worker(&path).await,
                #[cfg(feature = "spark-connect")]
                super::ROLE_CONNECT => super::executions::server().await,
                other => panic!("unknown role {other}"),
            }
        });
    }

    /// Echoes length-prefixed frames: the prefix and body land in one reused buffer, which
    /// goes back in one write.
    async fn bare_echo(mut stream: UnixStream) -> io::Result<()> {
        let mut frame = BytesMut::new();
        loop {
            frame.clear();
            frame.resize(4, 0);
            if let Err(e) = stream.read_exact(&mut frame[..4]).await {
                return if e.kind() == io::ErrorKind::UnexpectedEof {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            let len = (&frame[..4]).get_u32() as usize;
            frame.resize(4 + len, 0);
            stream.read_exact(&mut frame[4..]).await?;
            stream.write_all(&frame).await?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// framed: sessions over framed Unix sockets to 8 workers vs bare echo connections to 8 bare
// processes.

fn framed_points(
    rt: &Runtime,
    knobs: &Knobs,
    scratch: &ScratchDir,
    input: &[Bytes],
) -> Vec<SessionPoint> {
    let workers: Vec<ChildProcess> = (0..POOL)
        .map(|i| serving(ROLE_FRAMED, scratch.join(&format!("framed-{i}.sock"))))
        .collect();
    let bare: Vec<ChildProcess> = (0..POOL)
        .map(|i| serving(ROLE_BARE, scratch.join(&format!("bare-{i}.sock"))))
        .collect();
    // For reading a system-wide profile (`perf record -a`) by process.
    let pids = |ps: &[ChildProcess]| ps.iter().map(ChildProcess::pid).collect::<Vec<_>>();
    let worker_pids: Vec<u32> = workers.iter().chain(&bare).map(ChildProcess::pid).collect();
    println!(
        "framed: engine pid {}, tether worker pids {:?}, bare echo pids {:?}",
        std::process::id(),
        pids(&workers),
        pids(&bare)
    );
    let config = FramedConfig::default();
    knobs
        .sessions
        .iter()
        .map(|&n| {
            let (workers, bare, config, worker_pids) = (&workers, &bare, &config, &worker_pids);
            let tether: Arm<'_> = Box::new(move || {
                Box::pin(join_all((0..n).map(move |i| async move {
                    let conn =
                        connect_unix::<UdfRequest, UdfResponse>(&workers[i % POOL].path, config)
                            .await
                            .expect("connect to a framed worker");
                    session(conn, input).await
                })))
            });
            let baseline: Arm<'_> = Box::new(move || {
                Box::pin(join_all(
                    (0..n).map(move |i| bare_exchange(&bare[i % POOL].path, input)),
                ))
            });
            pair_point(
                rt,
                knobs,
                ("framed", n, 0.85),
                input,
                (tether, baseline),
                worker_pids,
            )
        })
        .collect()
}

/// One bare exchange: every batch out as a length-prefixed frame (one vectored write of
/// prefix and payload, no copy) while the echoes are read concurrently, each body into an
/// exactly sized buffer.
async fn bare_exchange(path: &Path, input: &[Bytes]) -> Vec<Bytes> {
    let mut stream = UnixStream::connect(path)
        .await
        .expect("connect a bare echo");
    let (mut rd, mut wr) = stream.split();
    let send = async {
        for batch in input {
            let len = u32::try_from(batch.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
            let mut frame = Bytes::copy_from_slice(&len.to_be_bytes()).chain(batch.clone());
            wr.write_all_buf(&mut frame).await?;
        }
        wr.shutdown().await
    };
    let receive = async {
        let mut echoed = Vec::with_capacity(input.len());
        for _ in input {
            let len = rd.read_u32().await? as usize;
            let mut body = BytesMut::with_capacity(len);
            while body.len() < len {
                if rd.read_buf(&mut body).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            }
            echoed.push(body.freeze());
        }
        io::Result::Ok(echoed)
    };
    let (sent, received) = tokio::join!(send, receive);
    sent.expect("bare send");
    received.expect("bare receive")
}

// ---------------------------------------------------------------------------------------------
// grpc: sessions on one GrpcChannel to one worker vs plain tonic streams on one channel.

#[cfg(feature = "grpc")]
mod grpc {
    use bytes::Bytes;
    use futures::future::join_all;
    use tether::spark::udf_grpc::{GrpcChannel, GrpcConfig};
    use tether::worker::engine::WorkerAddress;
    use tokio::runtime::Runtime;

    use super::plain_grpc::{plain_channel, plain_exchange};
    use super::{
        Arm, Knobs, ROLE_GRPC, ROLE_TONIC, ScratchDir, SessionPoint, pair_point, serving, session,
    };

    pub(super) fn points(
        rt: &Runtime,
        knobs: &Knobs,
        scratch: &ScratchDir,
        input: &[Bytes],
    ) -> Vec<SessionPoint> {
        let worker = serving(ROLE_GRPC, scratch.join("grpc.sock"));
        let plain = serving(ROLE_TONIC, scratch.join("tonic.sock"));
        let worker_pids = [worker.pid(), plain.pid()];
        let config = GrpcConfig::default();
        let (channel, bare) = rt.block_on(async {
            let channel = GrpcChannel::connect(&WorkerAddress::Unix(worker.path.clone()), &config)
                .await
                .expect("connect to the gRPC worker");
            (channel, plain_channel(&plain.path, &config).await)
        });
        let max = config.max_message_size;
        let points = knobs
            .sessions
            .iter()
            .map(|&n| {
                let (channel, bare) = (&channel, &bare);
                let tether: Arm<'_> = Box::new(move || {
                    Box::pin(join_all((0..n).map(move |_| async move {
                        let conn = channel.open_session().expect("open an Execute stream");
                        session(conn, input).await
                    })))
                });
                let baseline: Arm<'_> = Box::new(move || {
                    Box::pin(join_all(
                        (0..n).map(move |_| plain_exchange(bare.clone(), input, max)),
                    ))
                });
                pair_point(
                    rt,
                    knobs,
                    ("grpc", n, 0.9),
                    input,
                    (tether, baseline),
                    &worker_pids,
                )
            })
            .collect();
        channel.close();
        points
    }
}

// ---------------------------------------------------------------------------------------------
// executions: 1 000 and 10 000 concurrent executions through the Spark Connect service.

#[cfg(feature = "spark-connect")]
mod executions {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use futures::StreamExt;
    use futures::future::join_all;
    use tether::execution::client::{ClientConfig, ReattachingStream};
    use tether::execution::{ConnectError, ExecutionManager, ManagerConfig, StreamLimits};
    use tether::spark::connect::{
        ConnectClient, ConnectConfig, ConnectService, QueryEngine, ResponseSource, SessionContext,
    };
    use tether::wire::connect::{
        ExecutePlanRequest, ExecutePlanResponse, execute_plan_response::ResponseType, plan::OpType,
    };
    use tether_testing::connect::Caller;
    use tokio::net::TcpListener;
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::{Channel, Endpoint};

    use super::{EXECUTION_POINTS, ExecutionPoint, Knobs, ROLE_ENV, Spread, cpu_seconds, loadavg};

    /// Arrow-batch responses per execution.
    const BATCHES: u64 = 16;
    /// Rows each batch claims (`row_count`).
    const ROWS_PER_BATCH: i64 = 100;
    /// Bytes of each batch's data.
    const BATCH_BYTES: usize = 512;
    /// HTTP/2 channels the consumers share.
    const CHANNELS: usize = 8;
    /// Executions per Spark Connect session (under the default 1 000 per session).
    const PER_SESSION: usize = 250;

    /// The manager's settings for these points, in one place: Spark's defaults except
    /// small stream limits, so that every stream rotates. (A manager-wide memory budget,
    /// when the manager has one, is set here.)
    pub(super) fn scaled_manager_config() -> ManagerConfig {
        ManagerConfig {
            stream: StreamLimits {
                max_duration: Some(Duration::from_secs(120)),
                max_bytes: Some(2 * 1024),
            },
            ..ManagerConfig::default()
        }
    }

    /// Answers a plan whose root is a decimal batch count with that many batches, batch
    /// `i` carrying `i` in its first 8 bytes.
    struct Batches;

    impl QueryEngine for Batches {
        fn execute(
            &self,
            _: &SessionContext,
            request: &ExecutePlanRequest,
        ) -> Result<ResponseSource, ConnectError> {
            let count = match request.plan.as_ref().and_then(|p| p.op_type.as_ref()) {
                Some(OpType::Root(root)) => std::str::from_utf8(root)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok()),
                _ => None,
            };
            let Some(count) = count else {
                return Err(ConnectError::Failed {
                    message: "[CONNECT_INVALID_PLAN] not a batch count".into(),
                    code: tether::execution::Code::Internal,
                });
            };
            Ok(futures::stream::iter((0..count).map(|i| {
                let mut data = vec![0u8; BATCH_BYTES];
                data[..8].copy_from_slice(&i.to_be_bytes());
                Ok(ExecutePlanResponse::arrow_batch(ROWS_PER_BATCH, data))
            }))
            .boxed())
        }
    }

    /// Role `connect`: the Spark Connect service on loopback TCP; prints its address on
    /// stdout once it listens.
    pub(super) async fn server() {
        let manager = ExecutionManager::new(scaled_manager_config());
        let service = ConnectService::new(manager, Batches).into_service(&ConnectConfig::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        println!("http://{address}");
        tonic::transport::Server::builder()
            .max_concurrent_streams(Some(1 << 16))
            .add_service(service)
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
            .await
            .expect("serve");
    }

    /// The server child process, its pid and address.
    struct ServerProcess {
        child: std::process::Child,
        address: String,
    }

    impl ServerProcess {
        fn spawn() -> Self {
            let mut child = Command::new(std::env::current_exe().expect("this binary"))
                .env(ROLE_ENV, super::ROLE_CONNECT)
                .arg("-")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn the Spark Connect server");
            let mut line = String::new();
            BufReader::new(child.stdout.take().expect("stdout"))
                .read_line(&mut line)
                .expect("the server's address");
            ServerProcess {
                child,
                address: line.trim().to_owned(),
            }
        }
    }

    impl Drop for ServerProcess {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// What one round of `n` executions cost.
    struct Round {
        wall: f64,
        cpu: f64,
        rows: u64,
        reattaches: u64,
        server_rss: u64,
        client_rss: u64,
    }

    /// Connects the consumers' [`CHANNELS`] channels to `address`.
    async fn clients(address: &str) -> Vec<Arc<ConnectClient>> {
        let mut clients = Vec::new();
        for _ in 0..CHANNELS {
            let channel: Channel = Endpoint::from_shared(address.to_owned())
                .expect("address")
                .tcp_nodelay(true)
                .connect()
                .await
                .expect("connect to the Spark Connect server");
            clients.push(Arc::new(
                ConnectClient::with_channel(channel, None).expect("client"),
            ));
        }
        clients
    }

    /// Measures every executions point, paired ABBA over the rounds.
    pub(super) fn points(knobs: &Knobs) -> Vec<ExecutionPoint> {
        // Warm-up: one small round (code paths, the client's allocator).
        round(EXECUTION_POINTS[0]);
        let mut rounds: Vec<Vec<Round>> = EXECUTION_POINTS.iter().map(|_| Vec::new()).collect();
        for r in 0..knobs.execution_rounds {
            let order: Vec<usize> = if r % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
            for i in order {
                let measured = round(EXECUTION_POINTS[i]);
                println!(
                    "executions × {}: {:.2} s, {:.1} µs/execution, server VmHWM {:.1} MiB, client VmHWM {:.1} MiB (load {})",
                    EXECUTION_POINTS[i],
                    measured.wall,
                    measured.wall / EXECUTION_POINTS[i] as f64 * 1e6,
                    super::mib(measured.server_rss),
                    super::mib(measured.client_rss),
                    loadavg()
                );
                rounds[i].push(measured);
            }
        }
        let per = |r: &Round, n: usize| r.wall / n as f64;
        let reference: Vec<f64> = rounds[0]
            .iter()
            .map(|r| per(r, EXECUTION_POINTS[0]))
            .collect();
        EXECUTION_POINTS
            .iter()
            .zip(&rounds)
            .enumerate()
            .map(|(i, (&n, rs))| {
                let median =
                    |f: &dyn Fn(&Round) -> f64| Spread::of(rs.iter().map(f).collect()).median;
                ExecutionPoint {
                    executions: n,
                    wall_per_execution: median(&|r| per(r, n)),
                    cpu_per_execution: median(&|r| r.cpu / n as f64),
                    rows_per_second: median(&|r| r.rows as f64 / r.wall),
                    reattaches_per_execution: median(&|r| r.reattaches as f64 / n as f64),
                    server_rss: median(&|r| r.server_rss as f64) as u64,
                    client_rss: median(&|r| r.client_rss as f64) as u64,
                    ratio: (i > 0).then(|| {
                        Spread::of(
                            rs.iter()
                                .zip(&reference)
                                .map(|(r, base)| per(r, n) / base)
                                .collect(),
                        )
                    }),
                }
            })
            .collect()
    }

    /// `n` concurrent executions against a fresh server process, read by a fresh consumer
    /// process (so each one's VmHWM is this round's peak).
    fn round(n: usize) -> Round {
        let server = ServerProcess::spawn();
        let pid = server.child.id();
        let server_cpu = cpu_seconds(pid);
        let consumers = Command::new(std::env::current_exe().expect("this binary"))
            .env(ROLE_ENV, super::ROLE_CONSUMERS)
            .arg(&server.address)
            .arg(n.to_string())
            .stdin(Stdio::null())
            .output()
            .expect("run the consumer process");
        assert!(
            consumers.status.success(),
            "consumers: {}",
            consumers.status
        );
        let report = String::from_utf8_lossy(&consumers.stdout);
        let fields: Vec<f64> = report
            .split_whitespace()
            .map(|f| f.parse().expect("a number"))
            .collect();
        let [wall, cpu, rows, reattaches, client_hwm] = fields[..] else {
            panic!("consumer report {report:?}");
        };
        Round {
            wall,
            cpu: cpu + cpu_seconds(pid) - server_cpu,
            rows: rows as u64,
            reattaches: reattaches as u64,
            server_rss: status_bytes(pid, "VmHWM:"),
            client_rss: client_hwm as u64,
        }
    }

    /// Role `consumers` (arguments: the server's address, `n`): runs `n` concurrent
    /// executions, each read to its end by a reattaching stream that checks every batch
    /// arrives once and in order, timed from the first ExecutePlan to the last close; prints
    /// `wall-seconds cpu-seconds rows reattaches vmhwm-bytes`.
    pub(super) fn consumers() {
        let args: Vec<String> = std::env::args().collect();
        let (address, n) = (&args[1], args[2].parse::<usize>().expect("n"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (wall, done) = rt.block_on(async {
            let clients = clients(address).await;
            let sessions: Vec<String> = (0..n.div_ceil(PER_SESSION))
                .map(|_| uuid::Uuid::new_v4().to_string())
                .collect();
            let start = Instant::now();
            let done = join_all((0..n).map(|i| {
                let client = clients[i % clients.len()].clone();
                consume(client, Caller::new("scaling", &sessions[i / PER_SESSION]))
            }))
            .await;
            (start.elapsed().as_secs_f64(), done)
        });
        let me = std::process::id();
        println!(
            "{wall} {} {} {} {}",
            cpu_seconds(me),
            done.iter().map(|d| d.0).sum::<u64>(),
            done.iter().map(|d| d.1).sum::<u64>(),
            status_bytes(me, "VmHWM:")
        );
    }

    /// Reads one execution to its end: `(rows, reattaches)`.
    async fn consume(client: Arc<ConnectClient>, caller: Caller) -> (u64, u64) {
        let request = caller.plan(BATCHES.to_string().into_bytes());
        let mut stream = ReattachingStream::new(client, request, ClientConfig::default())
            .expect("a reattaching stream");
        let (mut next, mut rows) = (0u64, 0u64);
        while let Some(item) = stream.next().await {
            let response = item.expect("a response");
            if let Some(ResponseType::ArrowBatch(batch)) = response.response_type {
                let index = u64::from_be_bytes(batch.data[..8].try_into().expect("8 bytes"));
                assert_eq!(index, next, "batches once and in order");
                next += 1;
                rows += u64::try_from(batch.row_count).expect("rows");
            }
        }
        assert_eq!(next, BATCHES, "every batch arrived");
        let reattaches = stream.stats().reattaches;
        let _ = stream.close().await;
        (rows, reattaches)
    }

    /// A `/proc/<pid>/status` field in bytes (its value is in kB).
    fn status_bytes(pid: u32, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    }
}

// ---------------------------------------------------------------------------------------------
// The plot.

mod plot {
    use std::path::{Path, PathBuf};

    use plotters::coord::Shift;
    use plotters::prelude::*;

    use super::{Curve, EXECUTION_TARGET, mib};

    type Error = Box<dyn std::error::Error>;

    /// One line of a panel: measured points (with optional quartile whiskers), or a
    /// target drawn thin.
    struct Line {
        label: String,
        color: RGBColor,
        points: Vec<(f64, f64)>,
        /// `(x, q1, q3)` of each point.
        whiskers: Vec<(f64, f64, f64)>,
        target: bool,
    }

    impl Line {
        fn measured(label: &str, color: RGBColor, points: Vec<(f64, f64)>) -> Self {
            Line {
                label: label.to_owned(),
                color,
                points,
                whiskers: Vec::new(),
                target: false,
            }
        }

        fn target(label: String, color: RGBColor, (from, to): (f64, f64), y: f64) -> Self {
            Line {
                label,
                color,
                points: vec![(from, y), (to, y)],
                whiskers: Vec::new(),
                target: true,
            }
        }
    }

    /// Writes `scaling.svg` in `dir`: the session ratios against concurrency with their
    /// targets, the executions' cost per execution, and their resident memory.
    pub(super) fn write(dir: &Path, curve: &Curve) -> Result<PathBuf, Error> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("scaling.svg");
        {
            let root = SVGBackend::new(&path, (1260, 420)).into_drawing_area();
            root.fill(&WHITE)?;
            let panels = root.split_evenly((1, 3));
            let sessions_x = (0.8, 80.0);
            let mut ratios = Vec::new();
            for (transport, target, color) in [("grpc", 0.9, BLUE), ("framed", 0.85, RED)] {
                let points: Vec<_> = curve
                    .points
                    .iter()
                    .filter(|p| p.transport == transport)
                    .collect();
                if points.is_empty() {
                    continue;
                }
                let mut line = Line::measured(
                    transport,
                    color,
                    points
                        .iter()
                        .map(|p| (p.sessions as f64, p.ratio.median))
                        .collect(),
                );
                line.whiskers = points
                    .iter()
                    .map(|p| (p.sessions as f64, p.ratio.q1, p.ratio.q3))
                    .collect();
                ratios.push(line);
                ratios.push(Line::target(
                    format!("{transport} target {target}"),
                    color,
                    sessions_x,
                    target,
                ));
            }
            let top = curve.points.iter().map(|p| p.ratio.q3).fold(1.2, f64::max);
            panel(
                &panels[0],
                "sessions: tether / bare throughput",
                (sessions_x, "concurrent sessions (log)"),
                (top * 1.1, "ratio (median, IQR)"),
                &ratios,
            )?;
            let e = &curve.executions;
            if let Some(first) = e.first() {
                let x = (500.0, 20_000.0);
                let at = |f: &dyn Fn(&super::ExecutionPoint) -> f64| {
                    e.iter().map(|p| (p.executions as f64, f(p))).collect()
                };
                let cost = [
                    Line::measured("wall", BLUE, at(&|p| p.wall_per_execution * 1e6)),
                    Line::measured(
                        "CPU, both processes",
                        GREEN,
                        at(&|p| p.cpu_per_execution * 1e6),
                    ),
                    Line::target(
                        "1.5 × wall at 1 000".into(),
                        RED,
                        x,
                        first.wall_per_execution * 1e6 * EXECUTION_TARGET,
                    ),
                ];
                let memory = [
                    Line::measured("server", BLUE, at(&|p| mib(p.server_rss))),
                    Line::measured("consumers", MAGENTA, at(&|p| mib(p.client_rss))),
                ];
                for (area, caption, y, lines) in [
                    (
                        &panels[1],
                        "executions: cost per execution",
                        "µs per execution",
                        &cost[..],
                    ),
                    (
                        &panels[2],
                        "executions: resident memory (VmHWM)",
                        "MiB",
                        &memory[..],
                    ),
                ] {
                    let top = lines
                        .iter()
                        .flat_map(|l| l.points.iter().map(|p| p.1))
                        .fold(1.0, f64::max);
                    panel(
                        area,
                        caption,
                        (x, "concurrent executions (log)"),
                        (top * 1.15, y),
                        lines,
                    )?;
                }
            }
            root.present()?;
        }
        Ok(path)
    }

    /// One panel: a log-scale x axis, a linear y axis from 0, the lines and a legend.
    fn panel<DB: DrawingBackend>(
        area: &DrawingArea<DB, Shift>,
        caption: &str,
        ((from, to), x_desc): ((f64, f64), &str),
        (top, y_desc): (f64, &str),
        lines: &[Line],
    ) -> Result<(), Error>
    where
        DB::ErrorType: 'static,
    {
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d((from..to).log_scale(), 0.0f64..top)?;
        chart
            .configure_mesh()
            .x_labels(6)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()?;
        for line in lines {
            let color = line.color;
            let style = if line.target {
                color.mix(0.45).stroke_width(1)
            } else {
                color.stroke_width(2)
            };
            chart
                .draw_series(LineSeries::new(line.points.clone(), style))?
                .label(line.label.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], style));
            if !line.target {
                let dots = line
                    .points
                    .iter()
                    .map(|&p| Circle::new(p, 3, color.filled()));
                chart.draw_series(dots)?;
            }
            let whiskers = line
                .whiskers
                .iter()
                .map(|&(x, q1, q3)| PathElement::new([(x, q1), (x, q3)], color));
            chart.draw_series(whiskers)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
        Ok(())
    }
}
