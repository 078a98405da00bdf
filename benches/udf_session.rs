//! Throughput of worker sessions against raw baselines measured in the same run (a bare
//! channel, a bare socket, plain tonic).
//!
//! Every data case moves `N` × 64 KiB `Bytes` batches (`N` = 256 by default, 16 MiB) out to an
//! echo worker and back, and reports `Throughput::Bytes(N × 64 KiB)`: the payload that went
//! through the UDF per iteration (each byte travels out and back once). One iteration is one
//! whole session in both arms (connect/open, `Init` round trip, the data, `Finish`, `close`)
//! versus one whole bare exchange (connect/open, the data, end of stream), so per-session
//! costs are charged to tether, as a real engine pays them.
//!
//! - **(a) `udf_memory`**: `session` = [`Session::process`] over the in-memory
//!   [`pair`](tether::connection::pair) (capacity 16 each way) against an echo [`Udf`] run by
//!   [`endpoint::serve`](tether::worker::endpoint::serve) on a spawned task; `bare_channel` =
//!   two bounded `futures::channel::mpsc` channels of the same capacity and a spawned task
//!   that forwards each `Bytes` back. Both on one current-thread tokio runtime. Target ≥ 0.4
//!   (issue 12).
//! - **(a′) `udf_memory_observed`**: (a)'s `session` with its lifecycle events sent to a
//!   listener (`SessionConfig::events`, a thread draining the channel every millisecond)
//!   against the same `session` without: the cost of observability (issue 23, target ≥ 0.97).
//! - **(b) `udf_unix_socket`**: two processes. This binary re-executes itself as the worker
//!   (env `TETHER_BENCH_ROLE`; the worker exits when its parent goes away). `session` = the
//!   framed [`connect_unix`] connection (one socket connection per session) to a worker
//!   serving `endpoint::serve` on a [`FramedListener`]; `bare_stream` = a `UnixStream` per
//!   exchange to a worker running a plain length-prefixed copy loop (`read_exact` prefix and
//!   body into one reused buffer, one `write_all` back). The bare engine writes each frame
//!   with one `writev` (prefix + the `Bytes`, no copy) while it reads the echoed frames
//!   concurrently, each straight into an exactly sized `BytesMut` that becomes the output
//!   `Bytes` (no copy). Target ≥ 0.85.
//! - **(b′) `udf_unix_socket_observed`**: (b)'s `session` with its lifecycle events sent to
//!   the listener of (a′) against the same `session` without, on the same framed worker
//!   (target ≥ 0.97).
//! - **(c) `udf_grpc`** (feature `grpc`): two processes again. `session` = one `Execute`
//!   stream per session ([`GrpcChannel::open_session`] on one shared [`GrpcChannel`]) to a
//!   worker serving [`WorkerService::for_udf`] on a [`WorkerServer`]; `bare_tonic` = a plain
//!   `tonic::client::Grpc` bidi stream of the same `UdfRequest::data` messages on one shared
//!   `tonic::transport::Channel` to a plain `tonic::transport::Server` whose handler maps the
//!   request stream to `UdfResponse::data` (no queue, no protocol). Both ends of both arms
//!   use tether's default HTTP/2 settings (`GrpcConfig::default()`: 1 MiB stream window,
//!   64 MiB connection window, adaptive window off, 128 MiB message limit), so the ratio
//!   measures tether, not window tuning. Target ≥ 0.9.
//! - **(c′) `udf_grpc_observed`** (feature `grpc`): (c)'s `session` with its events sent to
//!   the listener of (a′) against the same `session` without, on the same channel and
//!   worker (target ≥ 0.97).
//! - **(d) `udf_setup_teardown`**: sessions per second through a [`Dispatcher`] with the
//!   framed transport, each iteration `create_session` → `init` → `finish` → `close` →
//!   `Dispatcher::settle` (so a stopped worker's SIGTERM, reap and socket removal count):
//!   `pooled` (opt-in pool, spec declares `supports_reuse`) vs `spawn_per_session` (no pool,
//!   default config: 50 ms readiness polls) and `spawn_per_session_1ms_poll` (no pool, 1 ms
//!   readiness polls, to show the process cost apart from the poll granularity). The worker is
//!   this binary in framed-worker mode. `Throughput::Elements(1)` (sessions). No target; the
//!   ratio printed is the pool's speed-up. Here prefer the criterion ratio: in the paired
//!   rounds a pooled chunk follows a spawn-and-stop, whose process exit and reaping still
//!   run in the background, so the pooled arm reads slower there.
//! - **(d′) `udf_setup_teardown_observed`**: (d)'s `pooled` dispatcher built with a
//!   Prometheus recorder installed (`metrics-exporter-prometheus`, rendering nothing) and its
//!   sessions' and workers' events sent to the listener of (a′), against the same pooled
//!   dispatcher without: the dispatcher records its metrics per event (target ≥ 0.97, judged
//!   on the ratio of criterion medians: each dispatcher has its own worker process, and in
//!   the paired rounds one of the two pairs ran about 4 times faster than the other, 31 µs
//!   against 120 µs per session, which of them from run to run, while criterion measured
//!   both at 120 µs: consistent with one worker landing on the engine's CPU, where a wake-up
//!   is a context switch rather than a cross-CPU wake-up of an idle virtual CPU).
//!
//! # Hops per batch round trip
//!
//! A hop is a queue a batch waits in. Since the cores own their deadlines, both tether
//! drivers run on one pump that holds no queue of its own: between the caller and the
//! `Connection` there is exactly one queue per direction, the core's (udf §7 deadlines are
//! read from the clock only when a wait begins).
//!
//! - (a) tether, 6: engine outbox (`EngineCore`) → the pair's bounded queue (a ring buffer
//!   behind a lock, no allocation per message) → worker input queue (`WorkerCore`) → the UDF
//!   → worker outbox → the pair's queue back → engine output queue. The two outboxes hold a
//!   message only between `poll_transmit` and `start_send` of one pump pass (the engine pulls
//!   the next input only when its outbox is empty, the worker hands each output over before
//!   it reads on). Bare, 2: one bounded `futures` channel each way (a node allocated per
//!   message). Wake-ups are alike in both arms: two tasks (the engine is the `block_on`
//!   future, the worker a spawned task), each woken at most once per wait, when a message,
//!   a free slot or the end arrives; the tether pump also asks a connection that answered
//!   `Pending` no second time in the same poll of a driver future.
//! - (b) tether, 2 plus the socket: engine outbox → socket (one `writev` of the frame head
//!   and the batch's `Bytes`, not copied) → the worker's reused read buffer, from which the
//!   batch is split off without a copy → worker input queue, and the same back (worker
//!   outbox, socket, read buffer, engine output queue). Bare: the socket each way, written
//!   with `writev` and read straight into the output buffer.
//! - (c) tether, 4 plus HTTP/2: engine outbox → the gRPC client's request channel (the body
//!   tonic sends) → HTTP/2 → worker input queue, and back: worker outbox → the gRPC
//!   server's response channel → HTTP/2 → engine output queue. Bare: the client's request
//!   stream → HTTP/2 → the handler's inline map → HTTP/2.
//!
//! # How the ratios are computed
//!
//! `ratio = baseline time per iteration / tether time per iteration`, i.e. tether's throughput
//! as a fraction of the baseline's (1.0 = as fast as the bare baseline). Two estimates are
//! printed at the end of each group, both from this run only:
//!
//! 1. **paired** (the headline, used for the target verdict): after criterion's measurement,
//!    `TETHER_BENCH_PAIRS` (default 30) rounds alternate the two arms ABBA-style, each arm
//!    timing a chunk of iterations (sized from a calibration run to last ≥ 20 ms); the ratio
//!    is the median of the per-round ratios, shown with its interquartile range. Both arms
//!    see the same machine load, which matters on a shared, busy machine: load that changes
//!    between criterion's back-to-back measurements cannot bias it.
//! 2. **criterion**: the ratio of the two criterion median estimates read from
//!    `<criterion home>/<group>/<bench>/new/estimates.json` (only files written by this
//!    process are used), with the conservative interval from their 95 % confidence bounds.
//!
//! The paired rounds also record, from `/proc/.../schedstat`, the CPU time of the engine
//! thread plus the arm's worker process, and how long the engine thread waited for a CPU.
//! For (a)–(c) the median **CPU-cost ratio** (baseline CPU / tether CPU per iteration) is
//! printed next to the throughput ratio: it is far less sensitive to other load than wall
//! time (not to hyperthread or frequency effects), and the wait share says how contended
//! the run was. Per-iteration wall and CPU medians of both arms are printed too.
//!
//! Before measuring, each arm runs once and its output is compared byte for byte with the
//! input, then once more to calibrate the paired chunk size (warm: the first run may start a
//! worker); timed iterations check the batch count and total length.
//!
//! # What limits the ratios (profiled with `perf record --call-graph dwarf`, 2 vCPUs)
//!
//! - (a) ≈ 0.48–0.50 (was ≈ 0.35 over `futures` channels): no payload byte is touched, so
//!   this compares per-message cost only: bare ≈ 165 ns per batch round trip, tether ≈ 335
//!   ns, ≈ +170 ns of overhead (the summary's column). Profile of the session arm (`perf
//!   record`, 2 vCPUs, flat): the pair 21 % (lock, moving the message into and out of the
//!   ring: `UdfRequest` is 312 bytes because of the inline `Init` variant, `UdfResponse`
//!   128; waker registration), the pump 16 %, the worker's `serve` loop and typed endpoint
//!   14 % (one `recv` and one `send` future per batch, each asking the connection once), the
//!   cores 14 % (building the `DataRequest`/`DataResponse`, the `VecDeque` moves of the four
//!   core queues, decoding the oneof), tokio's scheduler and its `epoll` ticks 10 %, the
//!   engine's `ProcessStream::poll_next` 5 %, clock reads 4.5 % (half of them tokio's own; tether
//!   reads it once per wait on the engine, never in the worker's data phase), malloc 1 %.
//!   What is left is the price of two protocol state machines and four more queues than
//!   the bare channel; ≥ 0.9 would need under ≈ 20 ns of overhead per batch round trip.
//! - (b) ≈ 0.48–0.78 and bimodal between runs: the bare arm is stable, tether's framed arm is
//!   not. The framed path copies every payload once more per hop in user space (the encoder
//!   copies the `Bytes` into the write buffer; the read buffer grows in ≤ 64 KiB `reserve`
//!   steps on a buffer still shared with the previous frame, so received bytes are copied
//!   again by `reserve`/`realloc`), and the regrown buffers cross glibc's 128 KiB dynamic
//!   mmap threshold, so some runs pay `mmap`/page faults/`munmap` per frame. With
//!   `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304` the run-to-run spread disappears
//!   (≈ 0.75 wall, 0.68 CPU); then the engine spends 16 % of its CPU in the encode copy,
//!   15 % in read-buffer copies and 10 % in page faults, the worker 11 % + 7 % + 10 %, and
//!   tether's own protocol code 3–4 %. Removing the two user copies projects to ≈ 0.9.
//! - (c) ≈ 1.1–1.2 on a quiet machine (tether's worker decouples reading from writing with a
//!   task and small queues, the plain echo handler maps the request stream inline), ≈ 0.87–0.9
//!   under heavy load; tether's own code is < 1 % of the profile.
//! - (d) spawn per session is dominated by the dispatcher's fixed 50 ms readiness poll: the
//!   worker listens ≈ 4 ms after the spawn, the first probe misses, the next comes 50 ms
//!   later; with 1 ms polls a process per session costs ≈ 4 ms.
//!
//! # Running
//!
//! ```text
//! cargo bench --bench udf_session                    # (a) (b) (d)
//! cargo bench --features grpc --bench udf_session    # + (c)
//! ```
//!
//! Criterion's options apply (`-- udf_memory` filters, `--measurement-time 5`,
//! `--sample-size 20`, `--profile-time 10` for `perf record`); the defaults here are short
//! (1 s warm-up, 4 s measurement, 10 samples) because the benchmarks may share a small
//! machine. `TETHER_BENCH_BATCHES` changes `N`. A summary table with the machine conditions
//! (cores, load average before and after, CPU, kernel) ends the run.
//!
//! Every process of the run (this one and the workers) uses glibc's malloc with the mmap
//! threshold pinned at 32 MiB and the trim threshold at 64 MiB (`GLIBC_TUNABLES`, set by
//! re-executing this binary; `TETHER_BENCH_MALLOC=default` or an explicit `GLIBC_TUNABLES`
//! overrides it; the summary prints the setting): glibc's dynamic threshold otherwise lets
//! one arm's allocations decide whether the other's 64 KiB buffers page-fault, which moved
//! the bare arm of (b) alone by 2×.
//!
//! Needs `[[bench]] name = "udf_session" harness = false` in Cargo.toml.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::future::Future;
use std::io::{self, IoSlice};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, SamplingMode, Throughput};
use futures::channel::mpsc;
use futures::future::{FutureExt, LocalBoxFuture};
use futures::{SinkExt, StreamExt};
use tether::connection::Connection;
use tether::connection::framed::{FramedConfig, connect_unix};
use tether::connection::pair;
use tether::wire::{ProcessCallable, UdfRequest, UdfResponse};
use tether::worker::dispatcher::{Dispatcher, DispatcherConfig, PoolConfig};
use tether::worker::endpoint::{EndpointConfig, OutcomeKind, serve};
use tether::worker::engine::FramedTransport;
use tether::worker::engine::{CountingHandle, Session, SessionConfig, TerminationKind};
use tether_testing::echo::EchoUdf;
use tether_testing::fixtures::{ScratchDir, direct_worker_spec, init, pattern};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::runtime::Runtime;

#[cfg(feature = "grpc")]
use tether::spark::udf_grpc::GrpcChannel;

/// Size of one batch: 64 KiB.
const BATCH_LEN: usize = 64 * 1024;
/// Default number of batches per iteration.
const DEFAULT_BATCHES: usize = 256;
/// Messages each direction of the in-memory connection (and of the bare channel) buffers.
const MEMORY_CAPACITY: usize = 16;
/// Default number of ABBA rounds of the paired ratio.
const DEFAULT_PAIRS: usize = 30;
/// Shortest timed chunk of the paired ratio.
const MIN_CHUNK: Duration = Duration::from_millis(20);

/// Env var that turns this binary into a worker process (its value is the role).
#[path = "common/child.rs"]
mod child_process;
#[path = "common/malloc.rs"]
mod malloc;
#[cfg(feature = "grpc")]
#[path = "common/plain_grpc.rs"]
mod plain_grpc;

use child_process::ChildProcess;

const ROLE_ENV: &str = "TETHER_BENCH_ROLE";
const ROLE_FRAMED: &str = "framed-echo";
const ROLE_RAW: &str = "raw-echo";
#[cfg(feature = "grpc")]
const ROLE_GRPC: &str = "grpc-echo";
#[cfg(feature = "grpc")]
const ROLE_TONIC: &str = "tonic-echo";

fn main() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        worker::main(&role);
        return;
    }
    let cli = Cli::parse();
    let cases = case_ids();
    let malloc = if cli.list {
        String::new()
    } else {
        malloc::pin()
    };
    if cli.list {
        for (_, benches) in &cases {
            for id in benches {
                println!("{id}: benchmark");
            }
        }
        return;
    }
    let machine_before = Machine::snapshot();
    println!("udf_session benchmarks; machine: {machine_before}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let scratch = ScratchDir::new("bench");
    let mut bench = Bench {
        c: Criterion::default()
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4))
            .sample_size(10)
            .configure_from_args(),
        rt,
        cli,
        input: batches(env_usize("TETHER_BENCH_BATCHES", DEFAULT_BATCHES)),
        pairs: env_usize("TETHER_BENCH_PAIRS", DEFAULT_PAIRS).max(1),
        rows: Vec::new(),
    };
    memory_case(&mut bench);
    memory_observed_case(&mut bench);
    socket_case(&mut bench, &scratch);
    #[cfg(feature = "grpc")]
    grpc::case(&mut bench, &scratch);
    #[cfg(not(feature = "grpc"))]
    println!("\n(c) udf_grpc skipped: build with `--features grpc`");
    setup_teardown_case(&mut bench, &scratch);
    setup_teardown_observed_case(&mut bench, &scratch);
    bench.c.final_summary();
    let machine_after = Machine::snapshot();
    print_summary(&bench, &machine_before, &machine_after, &malloc);
}

/// Every group and its benchmark ids, for `--list` and for filtering.
fn case_ids() -> Vec<(&'static str, Vec<String>)> {
    let mut cases = vec![
        ("udf_memory", vec!["session", "bare_channel"]),
        ("udf_memory_observed", vec!["session_observed", "session"]),
        ("udf_unix_socket", vec!["session", "bare_stream"]),
        (
            "udf_unix_socket_observed",
            vec!["session_observed", "session"],
        ),
    ];
    if cfg!(feature = "grpc") {
        cases.push(("udf_grpc", vec!["session", "bare_tonic"]));
        cases.push(("udf_grpc_observed", vec!["session_observed", "session"]));
    }
    cases.push((
        "udf_setup_teardown",
        vec!["pooled", "spawn_per_session", "spawn_per_session_1ms_poll"],
    ));
    cases.push((
        "udf_setup_teardown_observed",
        vec!["pooled_observed", "pooled"],
    ));
    cases
        .into_iter()
        .map(|(g, b)| (g, b.into_iter().map(|b| format!("{g}/{b}")).collect()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Command line (criterion parses it too; this reads only what decides what to set up).

struct Cli {
    filter: Option<String>,
    exact: bool,
    list: bool,
    /// `--test`, `--profile-time`: criterion does not analyse; no ratios.
    no_analysis: bool,
}

impl Cli {
    fn parse() -> Self {
        const WITH_VALUE: &[&str] = &[
            "--color",
            "--save-baseline",
            "--baseline",
            "--baseline-lenient",
            "--format",
            "--profile-time",
            "--load-baseline",
            "--sample-size",
            "--warm-up-time",
            "--measurement-time",
            "--nresamples",
            "--noise-threshold",
            "--confidence-level",
            "--significance-level",
            "--plotting-backend",
            "--output-format",
        ];
        let mut cli = Cli {
            filter: None,
            exact: false,
            list: false,
            no_analysis: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let flag = arg.split('=').next().unwrap_or_default();
            match flag {
                "--list" => cli.list = true,
                "--exact" => cli.exact = true,
                "--test" => cli.no_analysis = true,
                "--profile-time" => cli.no_analysis = true,
                _ => {}
            }
            if WITH_VALUE.contains(&flag) && !arg.contains('=') {
                args.next();
            } else if !arg.starts_with('-') {
                cli.filter = Some(arg);
            }
        }
        cli
    }

    /// Whether criterion will run benchmark `id` (its filter semantics).
    fn runs(&self, id: &str) -> bool {
        match &self.filter {
            None => true,
            Some(f) if self.exact => id == f,
            Some(f) => regex::Regex::new(f).map_or(true, |r| r.is_match(id)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The shared comparison driver.

struct Bench {
    c: Criterion,
    rt: Runtime,
    cli: Cli,
    input: Vec<Bytes>,
    pairs: usize,
    rows: Vec<Row>,
}

/// One measured comparison, for the final table.
struct Row {
    case: &'static str,
    tether: String,
    baseline: String,
    tether_rate: Option<f64>,
    baseline_rate: Option<f64>,
    unit: &'static str,
    /// How many messages (batch round trips) or sessions one iteration moves, and the name
    /// of one, for the overhead per message.
    per_iteration: (f64, &'static str),
    paired: Option<PairedRatios>,
    criterion: Option<(f64, f64, f64)>,
    target: Option<f64>,
    judge_by_criterion: bool,
}

/// The paired measurement of one comparison.
#[derive(Clone, Copy)]
struct PairedRatios {
    /// Wall-clock throughput ratios.
    wall: Paired,
    /// CPU-cost ratios (baseline CPU time / tether CPU time per iteration).
    cpu: Option<Paired>,
    /// Share of the paired phase the engine thread spent runnable but waiting for a CPU.
    waited_share: f64,
    /// Median cost per iteration of the subject and of the baseline.
    subject: Cost,
    baseline: Cost,
    /// Per-round differences of wall time per iteration, tether − baseline (seconds).
    overhead: Paired,
}

#[derive(Clone, Copy)]
struct Paired {
    median: f64,
    q1: f64,
    q3: f64,
    rounds: usize,
}

/// What a comparison measures: the subject arm against each baseline arm.
#[derive(Clone)]
struct Spec {
    group: &'static str,
    throughput: Throughput,
    flat: bool,
    /// Whether the CPU-time ratio is meaningful (every process doing the work is known).
    cpu: bool,
    /// Whether the target is judged on the ratio of criterion's medians rather than the
    /// paired one: for (d′), whose paired rounds are bimodal (see its case).
    judge_by_criterion: bool,
}

impl Spec {
    fn id(&self, bench: &str) -> String {
        format!("{}/{bench}", self.group)
    }
}

/// A routine running one iteration of an arm, returning the echoed batches.
type Routine<'a> = Box<dyn FnMut() -> LocalBoxFuture<'a, Vec<Bytes>> + 'a>;

/// One arm of a comparison: a criterion benchmark name and its routine.
struct Arm<'a> {
    name: &'static str,
    run: Routine<'a>,
    /// Worker processes whose CPU time counts for this arm (with the engine thread's).
    workers: Vec<u32>,
}

impl Arm<'_> {
    fn on(mut self, worker: &ChildProcess) -> Self {
        self.workers.push(worker.pid());
        self
    }
}

fn arm<'a, F, Fut>(name: &'static str, mut f: F) -> Arm<'a>
where
    F: FnMut() -> Fut + 'a,
    Fut: Future<Output = Vec<Bytes>> + 'a,
{
    Arm {
        name,
        run: Box::new(move || f().boxed_local()),
        workers: Vec::new(),
    }
}

/// A baseline arm with the label and target of its ratio.
struct Against<'a> {
    arm: Arm<'a>,
    label: &'static str,
    target: Option<f64>,
}

/// `(on-CPU, waiting for a CPU)` nanoseconds of a task so far (`/proc/.../schedstat`).
fn schedstat(path: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut fields = text
        .split_whitespace()
        .map(|f| f.parse::<u64>().unwrap_or(0));
    (fields.next().unwrap_or(0), fields.next().unwrap_or(0))
}

/// What one timed chunk of an arm cost, per iteration.
#[derive(Clone, Copy)]
struct Cost {
    /// Wall-clock seconds.
    wall: f64,
    /// CPU seconds of the engine thread plus the arm's worker processes.
    cpu: f64,
    /// Seconds the engine thread was runnable but waited for a CPU.
    waited: f64,
}

/// Runs `iters` iterations of `arm` and measures their [`Cost`] per iteration.
fn measure(rt: &Runtime, iters: u64, expected: &[Bytes], arm: &mut Arm<'_>) -> Cost {
    let workers: Vec<String> = arm
        .workers
        .iter()
        .map(|pid| format!("/proc/{pid}/schedstat"))
        .collect();
    let cpu_of_workers = || workers.iter().map(|p| schedstat(p).0).sum::<u64>();
    // The running thread's own counters are brought up to date by a scheduler call.
    let own = || {
        std::thread::yield_now();
        schedstat("/proc/thread-self/schedstat")
    };
    let (run0, wait0) = own();
    let workers0 = cpu_of_workers();
    let wall = time_iters(rt, iters, expected, &mut arm.run);
    let (run1, wait1) = own();
    let workers1 = cpu_of_workers();
    let per = |ns: u64| ns as f64 * 1e-9 / iters as f64;
    Cost {
        wall: wall.as_secs_f64() / iters as f64,
        cpu: per(run1.saturating_sub(run0) + workers1.saturating_sub(workers0)),
        waited: per(wait1.saturating_sub(wait0)),
    }
}

/// Times `iters` sequential runs of `run` on `rt`, checking each output's shape.
fn time_iters(rt: &Runtime, iters: u64, expected: &[Bytes], run: &mut Routine<'_>) -> Duration {
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let out = run().await;
            check_shape(&out, expected);
        }
        start.elapsed()
    })
}

fn check_shape(out: &[Bytes], expected: &[Bytes]) {
    let len = |v: &[Bytes]| v.iter().map(Bytes::len).sum::<usize>();
    assert!(
        out.len() == expected.len() && len(out) == len(expected),
        "echo returned {} batches / {} bytes, expected {} / {}",
        out.len(),
        len(out),
        expected.len(),
        len(expected)
    );
}

/// Iterations of a paired chunk for a routine that took `once`: at least [`MIN_CHUNK`].
fn chunk_len(once: Duration) -> u64 {
    let n = MIN_CHUNK.as_secs_f64() / once.as_secs_f64().max(1e-9);
    // Bounded to 1..=10 000, so the conversion is exact.
    n.ceil().clamp(1.0, 10_000.0) as u64
}

impl Bench {
    /// Whether any arm of `spec` is selected by the command line (else nothing is set up).
    fn enabled(&self, spec: &Spec, arms: &[&str]) -> bool {
        arms.iter().any(|a| self.cli.runs(&spec.id(a)))
    }

    /// An observed case (a′)–(c′): the session `session(config)` runs, with its events sent
    /// to the run's listener ([`observed_session`]) against the same without (target ≥ 0.97),
    /// the worker process `on` counted in both arms' CPU time.
    fn compare_observed<'a, F, Fut>(
        &mut self,
        spec: &Spec,
        expected: &[Bytes],
        session: impl Fn(SessionConfig) -> F,
        on: Option<&ChildProcess>,
        label: &'static str,
    ) where
        F: FnMut() -> Fut + 'a,
        Fut: Future<Output = Vec<Bytes>> + 'a,
    {
        let on = |a: Arm<'a>| match on {
            Some(worker) => a.on(worker),
            None => a,
        };
        self.compare(
            spec,
            expected,
            on(arm("session_observed", session(observed_session()))),
            vec![Against {
                arm: on(arm("session", session(SessionConfig::default()))),
                label,
                target: Some(0.97),
            }],
        );
    }

    /// Verifies every arm (output equal to `expected`), measures them with criterion in one
    /// group, then measures the paired ratio of the subject against each baseline, and prints
    /// and records each comparison.
    fn compare<'a>(
        &mut self,
        spec: &Spec,
        expected: &[Bytes],
        mut subject: Arm<'a>,
        mut baselines: Vec<Against<'a>>,
    ) {
        let started = SystemTime::now();
        let rt = &self.rt;
        // Verification, and calibration of the paired chunk sizes.
        let verify = |arm: &mut Arm<'_>| {
            let out = rt.block_on((arm.run)());
            assert!(
                out == expected,
                "{}/{}: echoed data differs",
                spec.group,
                arm.name
            );
            // Calibrate on a second, warm run (the first may start a worker).
            let start = Instant::now();
            check_shape(&rt.block_on((arm.run)()), expected);
            chunk_len(start.elapsed())
        };
        let subject_chunk = verify(&mut subject);
        let chunks: Vec<u64> = baselines.iter_mut().map(|b| verify(&mut b.arm)).collect();

        {
            let mut group = self.c.benchmark_group(spec.group);
            group.throughput(spec.throughput.clone());
            if spec.flat {
                group.sampling_mode(SamplingMode::Flat);
            }
            let arms =
                std::iter::once(&mut subject).chain(baselines.iter_mut().map(|b| &mut b.arm));
            for arm in arms {
                group.bench_function(arm.name, |b| {
                    b.iter_custom(|iters| time_iters(rt, iters, expected, &mut arm.run));
                });
            }
            group.finish();
        }

        let subject_estimate = read_estimate(spec.group, subject.name, started);
        for (against, chunk) in baselines.iter_mut().zip(chunks) {
            let measured =
                self.cli.runs(&spec.id(subject.name)) && self.cli.runs(&spec.id(against.arm.name));
            let paired = (measured && !self.cli.no_analysis).then(|| {
                let mut wall = Vec::with_capacity(self.pairs);
                let mut cpu = Vec::with_capacity(self.pairs);
                let mut overhead = Vec::with_capacity(self.pairs);
                let mut costs = (Vec::new(), Vec::new());
                let (mut waited, mut elapsed) = (0.0, 0.0);
                for round in 0..self.pairs {
                    let (s, b) = if round % 2 == 0 {
                        let s = measure(rt, subject_chunk, expected, &mut subject);
                        (s, measure(rt, chunk, expected, &mut against.arm))
                    } else {
                        let b = measure(rt, chunk, expected, &mut against.arm);
                        (measure(rt, subject_chunk, expected, &mut subject), b)
                    };
                    wall.push(b.wall / s.wall);
                    cpu.push(b.cpu / s.cpu);
                    overhead.push(s.wall - b.wall);
                    costs.0.push(s);
                    costs.1.push(b);
                    waited += s.waited * subject_chunk as f64 + b.waited * chunk as f64;
                    elapsed += s.wall * subject_chunk as f64 + b.wall * chunk as f64;
                }
                PairedRatios {
                    wall: paired_stats(wall),
                    cpu: spec.cpu.then(|| paired_stats(cpu)),
                    waited_share: waited / elapsed,
                    subject: median_cost(costs.0),
                    baseline: median_cost(costs.1),
                    overhead: paired_stats(overhead),
                }
            });
            let baseline_estimate = read_estimate(spec.group, against.arm.name, started);
            let row = Row::new(
                spec,
                against.label,
                (subject.name, subject_estimate),
                (against.arm.name, baseline_estimate),
                paired,
                against.target,
            );
            println!("{}", row.describe());
            self.rows.push(row);
        }
    }
}

fn median_cost(costs: Vec<Cost>) -> Cost {
    let median = |f: fn(&Cost) -> f64| paired_stats(costs.iter().map(f).collect()).median;
    Cost {
        wall: median(|c| c.wall),
        cpu: median(|c| c.cpu),
        waited: median(|c| c.waited),
    }
}

fn paired_stats(mut ratios: Vec<f64>) -> Paired {
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let pos = q * (ratios.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        ratios[lo] + (ratios[hi] - ratios[lo]) * (pos - lo as f64)
    };
    Paired {
        median: at(0.5),
        q1: at(0.25),
        q3: at(0.75),
        rounds: ratios.len(),
    }
}

impl Row {
    fn new(
        spec: &Spec,
        case: &'static str,
        (subject, subject_estimate): (&str, Option<Estimate>),
        (baseline, baseline_estimate): (&str, Option<Estimate>),
        paired: Option<PairedRatios>,
        target: Option<f64>,
    ) -> Self {
        let criterion = match (subject_estimate, baseline_estimate) {
            (Some(s), Some(b)) => Some((b.median / s.median, b.lower / s.upper, b.upper / s.lower)),
            _ => None,
        };
        let (per_iteration, unit) = match spec.throughput {
            Throughput::Bytes(n) => (n as f64 / f64::from(1u32 << 30), "GiB/s"),
            Throughput::Elements(n) => (n as f64, "sessions/s"),
            _ => (1.0, "iterations/s"),
        };
        let rate = |e: Option<Estimate>| e.map(|e| per_iteration / (e.median * 1e-9));
        let messages = match spec.throughput {
            // Each batch is one message out (`DataRequest`) and one back (`DataResponse`).
            Throughput::Bytes(n) => (n as f64 / BATCH_LEN as f64, "batch round trip"),
            Throughput::Elements(n) => (n as f64, "session"),
            _ => (1.0, "iteration"),
        };
        Row {
            case,
            tether: spec.id(subject),
            baseline: spec.id(baseline),
            tether_rate: rate(subject_estimate),
            baseline_rate: rate(baseline_estimate),
            unit,
            per_iteration: messages,
            paired,
            criterion,
            target,
            judge_by_criterion: spec.judge_by_criterion,
        }
    }

    fn verdict(&self) -> &'static str {
        let ratio = if self.judge_by_criterion {
            self.criterion.map(|(r, _, _)| r)
        } else {
            self.paired.map(|p| p.wall.median)
        };
        match (self.target, ratio) {
            (None, _) => "",
            (Some(_), None) => "not measured",
            (Some(t), Some(r)) if r >= t => "met",
            (Some(_), Some(_)) => "MISSED",
        }
    }

    fn describe(&self) -> String {
        let mut s = format!(
            "\n{} — ratio {} / {}:",
            self.case, self.tether, self.baseline
        );
        let fmt_rate =
            |r: Option<f64>| r.map_or_else(|| "n/a".into(), |r| format!("{r:.3} {}", self.unit));
        let _ = write!(
            s,
            "\n  criterion medians: {} vs {}",
            fmt_rate(self.tether_rate),
            fmt_rate(self.baseline_rate)
        );
        match self.criterion {
            Some((r, lo, hi)) => {
                let _ = write!(
                    s,
                    "\n  ratio of criterion medians: {r:.3} (95 % bounds {lo:.3}–{hi:.3})"
                );
            }
            None => {
                s.push_str("\n  ratio of criterion medians: n/a (not both measured in this run)")
            }
        }
        match self.paired {
            Some(p) => {
                let w = p.wall;
                let _ = write!(
                    s,
                    "\n  paired ratio: {:.3} (median of {} ABBA rounds, IQR {:.3}–{:.3}; the engine \
                     thread waited for a CPU {:.0} % of the time)",
                    w.median,
                    w.rounds,
                    w.q1,
                    w.q3,
                    100.0 * p.waited_share
                );
                let ms =
                    |c: &Cost| format!("{:.3} ms wall, {:.3} ms CPU", c.wall * 1e3, c.cpu * 1e3);
                let _ = write!(
                    s,
                    "\n  per iteration (paired medians): tether {}; baseline {}",
                    ms(&p.subject),
                    ms(&p.baseline)
                );
                let o = p.overhead;
                let (per, what) = self.per_iteration;
                let _ = write!(
                    s,
                    "\n  tether's overhead per {what} (paired median of tether − baseline wall time per \
                     iteration, / {per}): {} (IQR {}–{})",
                    duration(o.median / per),
                    duration(o.q1 / per),
                    duration(o.q3 / per)
                );
                if let Some(c) = p.cpu {
                    let _ = write!(
                        s,
                        "\n  paired CPU-cost ratio (baseline CPU / tether CPU per iteration, engine \
                         thread + worker process): {:.3} (IQR {:.3}–{:.3})",
                        c.median, c.q1, c.q3
                    );
                }
            }
            None => s.push_str("\n  paired ratio: n/a (filtered or not analysing)"),
        }
        if let Some(t) = self.target {
            let on = if self.judge_by_criterion {
                " (on the ratio of criterion medians)"
            } else {
                ""
            };
            let _ = write!(s, "\n  target ≥ {t:.2}{on}: {}", self.verdict());
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Criterion's estimates of this run.

#[derive(Clone, Copy)]
struct Estimate {
    /// Median time per iteration, ns.
    median: f64,
    lower: f64,
    upper: f64,
}

fn criterion_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    // <target>/<profile>/deps/<this binary>
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join("criterion")))
        .unwrap_or_else(|| PathBuf::from("target/criterion"))
}

/// The median estimate of `group/bench` if criterion wrote it at or after `since`.
fn read_estimate(group: &str, bench: &str, since: SystemTime) -> Option<Estimate> {
    let path = criterion_home()
        .join(group)
        .join(bench)
        .join("new")
        .join("estimates.json");
    let fresh = std::fs::metadata(&path).ok()?.modified().ok()? >= since;
    if !fresh {
        return None;
    }
    let json = std::fs::read_to_string(path).ok()?;
    let median = &json[json.find("\"median\"")?..];
    let number = |key: &str| -> Option<f64> {
        let rest = &median[median.find(key)? + key.len()..];
        let end = rest.find([',', '}'])?;
        rest[..end].trim().parse().ok()
    };
    Some(Estimate {
        median: number("\"point_estimate\":")?,
        lower: number("\"lower_bound\":")?,
        upper: number("\"upper_bound\":")?,
    })
}

// ---------------------------------------------------------------------------------------------
// Data, the echo UDF, a session run.

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `n` distinct 64 KiB batches.
fn batches(n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| pattern(BATCH_LEN, u8::try_from(i % 251).unwrap_or_default()))
        .collect()
}

/// One whole session on `conn` configured by `config`: `init`, `process(input)` collecting
/// the output, `close`.
async fn run_session_with<C>(conn: C, input: &[Bytes], config: SessionConfig) -> Vec<Bytes>
where
    C: Connection<UdfRequest, UdfResponse> + std::fmt::Debug + Send + Unpin + 'static,
{
    let handle = Arc::new(CountingHandle::for_one_session());
    let session = Session::new(conn, handle, config);
    let (session, _) = session.init(init("echo")).await.expect("init");
    let mut output = session.process(futures::stream::iter(input.iter().cloned()));
    let mut out = Vec::with_capacity(input.len());
    while let Some(batch) = output.next().await {
        out.push(batch.expect("echoed batch"));
    }
    let termination = output.close().await;
    assert_eq!(
        termination.kind(),
        TerminationKind::Finished,
        "{termination}"
    );
    out
}

// ---------------------------------------------------------------------------------------------
// (a) in-memory connection vs a bare bounded channel.

fn memory_case(bench: &mut Bench) {
    let spec = Spec {
        group: "udf_memory",
        throughput: Throughput::Bytes((bench.input.len() * BATCH_LEN) as u64),
        flat: false,
        cpu: true,
        judge_by_criterion: false,
    };
    if !bench.enabled(&spec, &["session", "bare_channel"]) {
        return;
    }
    let input = bench.input.clone();
    bench.compare(
        &spec,
        &input,
        arm("session", || memory_session(&input)),
        vec![Against {
            arm: arm("bare_channel", || memory_baseline(&input)),
            label: "(a) in-memory vs bare channel",
            target: Some(0.4),
        }],
    );
}

async fn memory_session(input: &[Bytes]) -> Vec<Bytes> {
    memory_session_with(input, SessionConfig::default()).await
}

async fn memory_session_with(input: &[Bytes], config: SessionConfig) -> Vec<Bytes> {
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(MEMORY_CAPACITY);
    let worker = tokio::spawn(serve(worker, EchoUdf::default(), EndpointConfig::default()));
    let out = run_session_with(engine, input, config).await;
    let outcome = worker.await.expect("worker task");
    assert_eq!(outcome.kind(), OutcomeKind::Finished, "{outcome}");
    out
}

/// The sending half of one event channel for every observed session of the run, read by a
/// thread that drains it once a millisecond (see `tether::observe`).
fn worker_events() -> tether::observe::EventSender<tether::worker::WorkerEvent> {
    static EVENTS: std::sync::OnceLock<tether::observe::EventSender<tether::worker::WorkerEvent>> =
        std::sync::OnceLock::new();
    EVENTS
        .get_or_init(|| {
            let (tx, mut rx) = tether::observe::event_channel(1 << 16);
            std::thread::spawn(move || {
                loop {
                    while let Some(e) = rx.try_recv() {
                        std::hint::black_box(&e);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            tx
        })
        .clone()
}

/// A session's configuration with its lifecycle events sent to the run's listener
/// ([`worker_events`]): the observed arms (a′), (b′), (c′).
fn observed_session() -> SessionConfig {
    SessionConfig {
        events: Some(worker_events()),
        ..SessionConfig::default()
    }
}

/// (a) with the session's lifecycle events sent to a listener (`SessionConfig::events`)
/// against the same without: issue 23's observability cost (target ≥ 0.97). A session made
/// with `Session::new` records no metrics (a dispatcher's do).
fn memory_observed_case(bench: &mut Bench) {
    let spec = Spec {
        group: "udf_memory_observed",
        throughput: Throughput::Bytes((bench.input.len() * BATCH_LEN) as u64),
        flat: false,
        cpu: true,
        judge_by_criterion: false,
    };
    if !bench.enabled(&spec, &["session_observed", "session"]) {
        return;
    }
    let input = bench.input.clone();
    let session = |config: SessionConfig| {
        let input = &input;
        move || memory_session_with(input, config.clone())
    };
    bench.compare_observed(
        &spec,
        &input,
        session,
        None,
        "(a) observed (events to a listener) vs not",
    );
}

async fn memory_baseline(input: &[Bytes]) -> Vec<Bytes> {
    // futures' bounded channel admits `buffer + senders` messages: CAPACITY each way, as the pair.
    let (mut to_worker, mut worker_rx) = mpsc::channel::<Bytes>(MEMORY_CAPACITY - 1);
    let (mut worker_tx, mut from_worker) = mpsc::channel::<Bytes>(MEMORY_CAPACITY - 1);
    let worker = tokio::spawn(async move {
        while let Some(batch) = worker_rx.next().await {
            if worker_tx.send(batch).await.is_err() {
                break;
            }
        }
    });
    let send = async {
        for batch in input {
            to_worker.send(batch.clone()).await.expect("send");
        }
        to_worker.close_channel();
    };
    let recv = async {
        let mut out = Vec::with_capacity(input.len());
        while let Some(batch) = from_worker.next().await {
            out.push(batch);
        }
        out
    };
    let ((), out) = futures::join!(send, recv);
    worker.await.expect("worker task");
    out
}

// ---------------------------------------------------------------------------------------------
// (b) framed Unix-socket connection vs a bare length-prefixed UnixStream, two processes.

fn socket_case(bench: &mut Bench, scratch: &ScratchDir) {
    let spec = Spec {
        group: "udf_unix_socket",
        throughput: Throughput::Bytes((bench.input.len() * BATCH_LEN) as u64),
        flat: true,
        cpu: true,
        judge_by_criterion: false,
    };
    let observed_spec = Spec {
        group: "udf_unix_socket_observed",
        ..spec.clone()
    };
    let plain = bench.enabled(&spec, &["session", "bare_stream"]);
    let observed = bench.enabled(&observed_spec, &["session_observed", "session"]);
    if !plain && !observed {
        return;
    }
    let framed = spawn_worker(ROLE_FRAMED, scratch);
    let raw = spawn_worker(ROLE_RAW, scratch);
    let input = bench.input.clone();
    let config = FramedConfig::default();
    let session = |session_config: SessionConfig| {
        let (input, config, path) = (&input, &config, &framed.path);
        move || {
            let session_config = session_config.clone();
            async move {
                let conn = connect_unix::<UdfRequest, UdfResponse>(path, config)
                    .await
                    .expect("connect to the framed worker");
                run_session_with(conn, input, session_config).await
            }
        }
    };
    if plain {
        bench.compare(
            &spec,
            &input,
            arm("session", session(SessionConfig::default())).on(&framed),
            vec![Against {
                arm: arm("bare_stream", || socket_baseline(&raw.path, &input)).on(&raw),
                label: "(b) Unix socket vs bare UnixStream",
                target: Some(0.85),
            }],
        );
    }
    if observed {
        bench.compare_observed(
            &observed_spec,
            &input,
            session,
            Some(&framed),
            "(b) observed (events to a listener) vs not",
        );
    }
}

async fn socket_baseline(path: &Path, input: &[Bytes]) -> Vec<Bytes> {
    let mut stream = UnixStream::connect(path)
        .await
        .expect("connect to the raw worker");
    let (mut rd, mut wr) = stream.split();
    let send = async {
        for batch in input {
            write_frame(&mut wr, batch).await?;
        }
        wr.shutdown().await
    };
    let recv = async {
        let mut out = Vec::with_capacity(input.len());
        for _ in 0..input.len() {
            out.push(read_frame(&mut rd).await?);
        }
        io::Result::Ok(out)
    };
    let (sent, received) = tokio::join!(send, recv);
    sent.expect("bare send");
    received.expect("bare receive")
}

/// Writes a 4-byte big-endian length and `body` with vectored writes (no copy of `body`).
async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let prefix = len.to_be_bytes();
    let total = prefix.len() + body.len();
    let mut written = 0;
    while written < total {
        let n = if written < prefix.len() {
            let parts = [IoSlice::new(&prefix[written..]), IoSlice::new(body)];
            w.write_vectored(&parts).await?
        } else {
            w.write(&body[written - prefix.len()..]).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        written += n;
    }
    Ok(())
}

/// Reads one length-prefixed frame into an exactly sized buffer (no copy afterwards).
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Bytes> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix).await?;
    let len =
        usize::try_from(u32::from_be_bytes(prefix)).map_err(|_| io::ErrorKind::InvalidData)?;
    let mut body = BytesMut::with_capacity(len);
    while body.len() < len {
        if r.read_buf(&mut body).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(body.freeze())
}

// ---------------------------------------------------------------------------------------------
// (c) gRPC transport vs plain tonic, two processes.

#[cfg(feature = "grpc")]
mod grpc {
    use criterion::Throughput;
    use tether::spark::udf_grpc::GrpcConfig;
    use tether::worker::engine::WorkerAddress;

    use super::plain_grpc::{plain_channel, plain_exchange};
    use super::{
        Against, BATCH_LEN, Bench, GrpcChannel, ROLE_GRPC, ROLE_TONIC, ScratchDir, SessionConfig,
        Spec, arm, run_session_with, spawn_worker,
    };

    pub(super) fn case(bench: &mut Bench, scratch: &ScratchDir) {
        let spec = Spec {
            group: "udf_grpc",
            throughput: Throughput::Bytes((bench.input.len() * BATCH_LEN) as u64),
            flat: true,
            cpu: true,
            judge_by_criterion: false,
        };
        let observed_spec = Spec {
            group: "udf_grpc_observed",
            ..spec.clone()
        };
        let plain = bench.enabled(&spec, &["session", "bare_tonic"]);
        let observed = bench.enabled(&observed_spec, &["session_observed", "session"]);
        if !plain && !observed {
            return;
        }
        let tether_worker = spawn_worker(ROLE_GRPC, scratch);
        let tonic_worker = spawn_worker(ROLE_TONIC, scratch);
        let config = GrpcConfig::default();
        let (channel, bare) = bench.rt.block_on(async {
            let endpoint = WorkerAddress::Unix(tether_worker.path.clone());
            let channel = GrpcChannel::connect(&endpoint, &config)
                .await
                .expect("connect to the tether gRPC worker");
            let bare = plain_channel(&tonic_worker.path, &config).await;
            (channel, bare)
        });
        let input = bench.input.clone();
        let session = |session_config: SessionConfig| {
            let (input, channel) = (&input, &channel);
            move || {
                let session_config = session_config.clone();
                async move {
                    let conn = channel.open_session().expect("open an Execute stream");
                    run_session_with(conn, input, session_config).await
                }
            }
        };
        if plain {
            bench.compare(
                &spec,
                &input,
                arm("session", session(SessionConfig::default())).on(&tether_worker),
                vec![Against {
                    arm: arm("bare_tonic", || {
                        plain_exchange(bare.clone(), &input, config.max_message_size)
                    })
                    .on(&tonic_worker),
                    label: "(c) gRPC vs plain tonic",
                    target: Some(0.9),
                }],
            );
        }
        if observed {
            bench.compare_observed(
                &observed_spec,
                &input,
                session,
                Some(&tether_worker),
                "(c) observed (events to a listener) vs not",
            );
        }
        bench.rt.block_on(async move {
            channel.close();
            drop(bare);
        });
    }
}

// ---------------------------------------------------------------------------------------------
// (d) session setup + teardown through the dispatcher: pooled vs a process per session.

fn setup_teardown_case(bench: &mut Bench, scratch: &ScratchDir) {
    let spec = Spec {
        group: "udf_setup_teardown",
        throughput: Throughput::Elements(1),
        flat: true,
        cpu: false,
        judge_by_criterion: false,
    };
    let names = ["pooled", "spawn_per_session", "spawn_per_session_1ms_poll"];
    if !bench.enabled(&spec, &names) {
        return;
    }
    let pooled = dispatcher(scratch, Some(PoolConfig::default()), None, false);
    let spawning = dispatcher(scratch, None, None, false);
    let spawning_fast = dispatcher(scratch, None, Some(Duration::from_millis(1)), false);
    bench.compare(
        &spec,
        &[],
        arm(names[0], || setup_teardown(&pooled)),
        vec![
            Against {
                arm: arm(names[1], || setup_teardown(&spawning)),
                label: "(d) pooled vs spawn per session",
                target: None,
            },
            Against {
                arm: arm(names[2], || setup_teardown(&spawning_fast)),
                label: "(d) pooled vs spawn, 1 ms polls",
                target: None,
            },
        ],
    );
    bench.rt.block_on(async {
        let stats = [pooled.stats(), spawning.stats(), spawning_fast.stats()];
        pooled.close().await;
        spawning.close().await;
        spawning_fast.close().await;
        println!(
            "\n(d) dispatcher stats: pooled: {} spawned, {} reused; per session: {} and {} spawned",
            stats[0].spawned, stats[0].reused, stats[1].spawned, stats[2].spawned
        );
    });
}

/// (d) with the pooled dispatcher observed: built with a Prometheus recorder installed (its
/// handles registered with it; nothing renders) and its sessions' and workers' events sent
/// to the run's listener, against the same pooled dispatcher without: issue 23's
/// observability cost where the dispatcher records its metrics per event (target ≥ 0.97).
fn setup_teardown_observed_case(bench: &mut Bench, scratch: &ScratchDir) {
    let spec = Spec {
        group: "udf_setup_teardown_observed",
        throughput: Throughput::Elements(1),
        flat: true,
        cpu: false,
        judge_by_criterion: true,
    };
    if !bench.enabled(&spec, &["pooled_observed", "pooled"]) {
        return;
    }
    let observed = dispatcher(scratch, Some(PoolConfig::default()), None, true);
    let pooled = dispatcher(scratch, Some(PoolConfig::default()), None, false);
    bench.compare(
        &spec,
        &[],
        arm("pooled_observed", || setup_teardown(&observed)),
        vec![Against {
            arm: arm("pooled", || setup_teardown(&pooled)),
            label: "(d) pooled, observed (recorder + listener) vs not",
            target: Some(0.97),
        }],
    );
    bench.rt.block_on(async {
        let stats = [observed.stats(), pooled.stats()];
        observed.close().await;
        pooled.close().await;
        println!(
            "\n(d′) dispatcher stats: observed: {} spawned, {} reused; plain: {} spawned, {} reused",
            stats[0].spawned, stats[0].reused, stats[1].spawned, stats[1].reused
        );
    });
}

/// A dispatcher of framed workers (this binary); `observed`: built under a Prometheus
/// recorder (leaked: it must outlive the handles) with its events sent to the run's listener.
fn dispatcher(
    scratch: &ScratchDir,
    pool: Option<PoolConfig>,
    poll: Option<Duration>,
    observed: bool,
) -> Dispatcher<FramedTransport> {
    let exe = std::env::current_exe().expect("bench binary path");
    let runner = ProcessCallable {
        command: vec![exe.to_str().expect("utf-8 path").to_owned()],
        arguments: Vec::new(),
        environment_variables: [(ROLE_ENV.to_owned(), ROLE_FRAMED.to_owned())].into(),
    };
    let spec = direct_worker_spec(runner, true);
    let mut config = DispatcherConfig {
        pool,
        socket_base_dir: Some(scratch.path().to_path_buf()),
        ..DispatcherConfig::default()
    };
    if let Some(poll) = poll {
        config.ready_poll_interval = poll;
    }
    if !observed {
        return Dispatcher::new(spec, FramedTransport::default(), config).expect("dispatcher");
    }
    config.session = observed_session();
    let recorder: &'static _ = Box::leak(Box::new(
        metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder(),
    ));
    metrics::with_local_recorder(recorder, || {
        Dispatcher::new(spec, FramedTransport::default(), config).expect("dispatcher")
    })
}

/// One session with no data: create (reuse or spawn), `Init`, `Finish`, `close`, and wait for
/// any worker stop it caused.
async fn setup_teardown(d: &Dispatcher<FramedTransport>) -> Vec<Bytes> {
    let session = d.create_session().await.expect("create_session");
    let (session, _) = session.init(init("echo")).await.expect("init");
    let mut finishing = session.finish().await.expect("finish");
    assert!(finishing.recv().await.expect("finished").is_none());
    let termination = finishing.close().await;
    assert_eq!(
        termination.kind(),
        TerminationKind::Finished,
        "{termination}"
    );
    d.settle().await;
    Vec::new()
}

// ---------------------------------------------------------------------------------------------
// Worker processes.

/// This binary re-executed as a worker in `role`, listening on `<role>.sock` in the scratch
/// directory (given as `--connection <path>`); killed and reaped on drop.
fn spawn_worker(role: &str, scratch: &ScratchDir) -> ChildProcess {
    let path = scratch.join(&format!("{role}.sock"));
    let arg = path.clone();
    ChildProcess::listening(
        ROLE_ENV,
        role,
        &[OsStr::new("--connection"), arg.as_os_str()],
        path,
    )
}

mod worker {
    use std::io;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use tether::connection::framed::{FramedConfig, FramedListener};
    use tether::wire::{UdfRequest, UdfResponse};
    use tether::worker::endpoint::{EndpointConfig, serve};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{UnixListener, UnixStream};

    use super::{EchoUdf, ROLE_FRAMED, ROLE_RAW};

    /// The worker process: serves `role` on the `--connection` path until killed, or until
    /// its parent (the benchmark, or the dispatcher's process) goes away.
    pub(super) fn main(role: &str) {
        let args: Vec<String> = std::env::args().collect();
        let path = args
            .windows(2)
            .find(|w| w[0] == "--connection")
            .map(|w| PathBuf::from(&w[1]))
            .expect("worker mode needs --connection PATH");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(async move {
            tokio::spawn(exit_with_parent());
            match role {
                ROLE_FRAMED => framed_echo(&path).await,
                ROLE_RAW => raw_echo(&path).await,
                #[cfg(feature = "grpc")]
                super::ROLE_GRPC => super::plain_grpc::tether_worker(&path).await,
                #[cfg(feature = "grpc")]
                super::ROLE_TONIC => super::plain_grpc::tonic_worker(&path).await,
                other => panic!("unknown worker role {other}"),
            }
        });
    }

    async fn exit_with_parent() {
        let parent = std::os::unix::process::parent_id();
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(0);
            }
        }
    }

    /// Role `framed-echo`: tether's worker side on the framed Unix-socket transport.
    async fn framed_echo(path: &Path) {
        let listener = FramedListener::bind_unix(path).expect("bind the framed worker");
        let config = FramedConfig::default();
        loop {
            let conn = listener
                .accept::<UdfResponse, UdfRequest>(&config)
                .await
                .expect("accept");
            tokio::spawn(serve(conn, EchoUdf::default(), EndpointConfig::default()));
        }
    }

    /// Role `raw-echo`: a bare length-prefixed copy loop.
    async fn raw_echo(path: &Path) {
        let listener = UnixListener::bind(path).expect("bind the raw worker");
        loop {
            let (stream, _) = listener.accept().await.expect("accept");
            tokio::spawn(async move {
                let _ = raw_echo_connection(stream).await;
            });
        }
    }

    async fn raw_echo_connection(mut stream: UnixStream) -> io::Result<()> {
        let mut frame = Vec::new();
        loop {
            let mut prefix = [0u8; 4];
            match stream.read_exact(&mut prefix).await {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
            let len = usize::try_from(u32::from_be_bytes(prefix))
                .map_err(|_| io::ErrorKind::InvalidData)?;
            frame.resize(prefix.len() + len, 0);
            frame[..prefix.len()].copy_from_slice(&prefix);
            stream.read_exact(&mut frame[prefix.len()..]).await?;
            stream.write_all(&frame).await?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Machine conditions and the final table.

struct Machine {
    cores: usize,
    load: String,
    cpu: String,
    kernel: String,
}

impl Machine {
    fn snapshot() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or_else(|| "unknown CPU".into(), |s| s.trim().to_owned());
        Machine {
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            load: read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            cpu,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
        }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cores ({}), Linux {}, load average {}",
            self.cores, self.cpu, self.kernel, self.load
        )
    }
}

/// Seconds as ns, µs or ms, signed (a negative overhead: tether was faster).
fn duration(seconds: f64) -> String {
    let ns = seconds * 1e9;
    match ns.abs() {
        a if a < 1e4 => format!("{ns:+.0} ns"),
        a if a < 1e7 => format!("{:+.1} µs", ns / 1e3),
        _ => format!("{:+.1} ms", ns / 1e6),
    }
}

fn print_summary(bench: &Bench, before: &Machine, after: &Machine, malloc: &str) {
    let batches = bench.input.len();
    println!(
        "\n==== udf_session summary: {batches} × 64 KiB per iteration ({} MiB), ratio = tether throughput / baseline throughput",
        batches * BATCH_LEN / (1 << 20)
    );
    println!(
        "{:<36} {:>11} {:>11} {:<11} {:>21} {:>16} {:>10} {:>28}  target",
        "case",
        "tether",
        "baseline",
        "unit",
        "paired ratio [IQR]",
        "criterion ratio",
        "CPU ratio",
        "tether overhead"
    );
    for row in &bench.rows {
        let rate = |r: Option<f64>| r.map_or_else(|| "n/a".into(), |r| format!("{r:.3}"));
        let paired = row.paired.map_or_else(
            || "n/a".into(),
            |p| format!("{:.3} [{:.3}–{:.3}]", p.wall.median, p.wall.q1, p.wall.q3),
        );
        let cpu = row
            .paired
            .and_then(|p| p.cpu)
            .map_or_else(|| "—".into(), |c| format!("{:.3}", c.median));
        let crit = row
            .criterion
            .map_or_else(|| "n/a".into(), |(r, _, _)| format!("{r:.3}"));
        let target = row
            .target
            .map_or_else(|| "—".into(), |t| format!("≥ {t:.2} {}", row.verdict()));
        let (per, what) = row.per_iteration;
        let overhead = row.paired.map_or_else(
            || "n/a".into(),
            |p| format!("{} / {what}", duration(p.overhead.median / per)),
        );
        println!(
            "{:<36} {:>11} {:>11} {:<11} {:>21} {:>16} {:>10} {:>28}  {}",
            row.case,
            rate(row.tether_rate),
            rate(row.baseline_rate),
            row.unit,
            paired,
            crit,
            cpu,
            overhead,
            target
        );
    }
    println!("machine before: {before}");
    println!("machine after:  {after}");
    println!("malloc: {malloc} (TETHER_BENCH_MALLOC=default for glibc's own)");
    println!(
        "runtime: one current-thread tokio runtime in the engine process (and in each worker process); paired rounds: {}",
        bench.pairs
    );
}
