//! The opt-in soak of issue 11: worker sessions on real worker processes over both of the
//! dispatcher's transports (tether's framed one and Spark's gRPC one, udf §6.4) and
//! reattachable executions through the Spark Connect service (rx §3–§6, connect §1), for
//! `TETHER_SOAK_SECS` seconds (default 600) under random faults, then a report and its pass
//! criteria:
//!
//! ```sh
//! cargo test --release --all-features --test faults -- --ignored --exact soak::soak --nocapture
//! ```
//!
//! (or `bash scripts/soak.sh [SECONDS]`; `--exact`, because `soak::udf_worker_process` is the
//! worker mode of this same binary.) `TETHER_SOAK_SEED` repeats a run's random choices (the processes' timing does not
//! repeat).
//!
//! - **Worker sessions**: two dispatchers (udf §6.2) with the reuse pool on, whose workers
//!   are this test binary re-executed as a [`WorkerMain`] serving the echo UDF (udf §2.1):
//!   one over the framed transport, one over gRPC. Every session sends tagged batches and
//!   reads each echo back. Faults: a session cancels (udf §4.8), is dropped (udf §4.9),
//!   sends the echo's error batch (udf §2.1) or SIGKILLs its own worker (udf §8.4) at a
//!   random batch; a session's connection carries a seeded [`FaultPlan`] (cut, stall, delay,
//!   failed write, half-close: udf §6.5); a framed session's socket carries a seeded
//!   [`IoPlan`] (split reads and writes, `Pending`, truncated frames, a cut mid-frame:
//!   udf §1.4, §4.5, §6.5; a gRPC session shares its worker's HTTP/2 connection, so one that
//!   draws byte faults gets message faults instead); and a killer SIGKILLs a random busy
//!   worker at random moments.
//! - **Executions**: a [`ConnectService`] on loopback whose streams rotate every 2 KiB or
//!   500 ms (rx §4.5) and whose response streams are cut at random by the connect server
//!   example's fault mode (ended without `ResultComplete`, `INVALID_CURSOR.DISCONNECTED`, a
//!   dropped connection, a forgotten operation: rx §6.3); [`ReattachingStream`]s read them,
//!   a quarter of them through a [`FaultyRpc`] with a seeded [`RpcPlan`] on the client side
//!   (calls refused before or after the server, streams broken with a response lost in
//!   flight, delays, failed releases: rx §6.3).
//!
//! Pass criteria: every session that ends `Finished` delivered all its batches exactly once
//! and in order, every other one delivered a prefix of them and ended with the outcome its
//! fault explains (udf §4.1); every execution delivered every response exactly once and in
//! order, `ResultComplete` last; no hung session or execution; after the run no worker
//! process, socket file, file descriptor, dispatcher handle or execution is left (counted
//! from `/proc` and the dispatchers' and manager's counters); the resident set at the end is
//! within 10 % of the level after the warm-up (the system allocator: glibc malloc).
#![cfg(all(feature = "grpc", feature = "spark-connect"))]

#[path = "../support/test_server/faults.rs"]
mod connect_faults;

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tether::connection::Connection;
use tether::connection::framed::{FramedConfig, FramedConnection};
use tether::execution::client::{ClientConfig, ExecutionRpc, ReattachingStream};
use tether::execution::{ConnectError, ExecutionManager, ManagerConfig, StreamLimits};
use tether::spark::connect::{
    ConnectClient, ConnectConfig, ConnectService, QueryEngine, ResponseSource, SessionContext,
};
use tether::spark::udf_grpc::{GrpcTransport, WorkerArgs, WorkerMain};
use tether::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, Plan, UserContext, execute_plan_response,
};
use tether::wire::{ProcessCallable, UdfRequest, UdfResponse, UdfWorkerSpecification};
use tether::worker::dispatcher::{Dispatcher, DispatcherConfig, PoolConfig};
use tether::worker::engine::{
    SessionConfig, Termination, TerminationKind, WorkerAddress, WorkerTransport,
};
use tether::worker::state;
use tether_testing::echo::{ERROR_BATCH, EchoUdf};
use tether_testing::fault::{
    FaultCounters, FaultPlan, FaultReport, FaultyConnection, FaultyIo, FaultyRpc, IoCounters,
    IoPlan, IoReport, RandomFaults, RandomIo, RandomRpcFaults, RpcPlan, RpcReport,
};
use tether_testing::fixtures;
use tokio::net::{TcpListener, UnixStream};

use connect_faults::{FaultService, Faults, KillableStream};

/// Seconds the run lasts (after the warm-up); 600 unless set.
const SECS_VAR: &str = "TETHER_SOAK_SECS";
/// The seed of every random choice; from the clock unless set.
const SEED_VAR: &str = "TETHER_SOAK_SEED";
/// Worker sessions in a full 600-second run (both transports together).
const FULL_SESSIONS: u64 = 10_000;
/// Reattachable executions in a full 600-second run.
const FULL_EXECUTIONS: u64 = 1_000;
/// Concurrent session loops per transport.
const LANES_PER_TRANSPORT: usize = 4;
/// Concurrent execution loops.
const EXECUTION_LANES: usize = 3;
/// The worker sessions' udf §7 timeouts: short, so a stall ends soon.
const SESSION_TIMEOUT: Duration = Duration::from_secs(3);
/// A session or an execution that takes longer is hung: a failure of the soak.
const HUNG: Duration = Duration::from_secs(60);
/// Most of the violations kept in full for the report.
const KEPT: usize = 20;

// ---------------------------------------------------------------------------------------
// The worker process: this binary re-executed by the dispatchers.

/// The worker's command line as the dispatcher appends it (`--id ID --connection PATH`,
/// udf §1.9), passed through the environment because the test harness owns argv.
const WORKER_ARGS_VAR: &str = "TETHER_SOAK_WORKER_ARGS";
/// Set (to anything) for a worker that serves the framed transport instead of gRPC.
const WORKER_FRAMED_VAR: &str = "TETHER_SOAK_WORKER_FRAMED";

/// Not a test: the body of the worker processes the soak's dispatchers spawn. Serves the
/// echo UDF (udf §2.1) with `WorkerMain` on the endpoint the dispatcher named, over gRPC or
/// (with [`WORKER_FRAMED_VAR`]) the framed transport, until SIGTERM.
#[test]
#[ignore = "worker mode: the soak runs this binary as its UDF worker processes"]
fn udf_worker_process() {
    let line = std::env::var(WORKER_ARGS_VAR).expect("run by the soak's dispatchers only");
    let args = WorkerArgs::parse(line.split_whitespace()).expect("the dispatcher's arguments");
    let main = WorkerMain::new(EchoUdf::default).with_shutdown_grace(Duration::from_millis(500));
    let main = match std::env::var_os(WORKER_FRAMED_VAR) {
        Some(_) => main.with_framed(FramedConfig::default()),
        None => main,
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(main.serve(&args))
        .expect("the worker serves");
}

/// A spec (udf §1.9) whose runner is this binary in worker mode (framed or gRPC), declaring
/// reuse (udf §6.6).
fn worker_spec(framed: bool) -> UdfWorkerSpecification {
    let exe = std::env::current_exe().expect("the test binary");
    // bash -c SCRIPT EXE --id ID --connection PATH: `$0` is the binary, `$*` the arguments.
    let script = format!(
        "export {WORKER_ARGS_VAR}=\"$*\"; \
         exec \"$0\" soak::udf_worker_process --exact --ignored --nocapture --test-threads=1"
    );
    let runner = ProcessCallable {
        command: vec![
            "bash".into(),
            "-c".into(),
            script,
            exe.display().to_string(),
        ],
        arguments: Vec::new(),
        environment_variables: framed
            .then(|| (WORKER_FRAMED_VAR.to_owned(), "1".to_owned()))
            .into_iter()
            .collect(),
    };
    fixtures::direct_worker_spec(runner, true)
}

/// A dispatcher of this binary's workers (framed or gRPC) over `transport` with message
/// faults, sockets below `socket_base`, short udf §7 timeouts and the reuse pool (udf §6.6).
fn dispatcher<T: WorkerTransport>(
    framed: bool,
    transport: T,
    socket_base: &Path,
) -> Arc<Dispatcher<Faulty<T>>> {
    let config = DispatcherConfig {
        session: SessionConfig {
            init_timeout: SESSION_TIMEOUT,
            terminal_timeout: SESSION_TIMEOUT,
            interrupt_cancel_timeout: Duration::from_secs(2),
            ..SessionConfig::default()
        },
        default_init_timeout: Duration::from_secs(10),
        default_graceful_timeout: Duration::from_secs(2),
        pool: Some(PoolConfig {
            max_idle: LANES_PER_TRANSPORT,
            idle_timeout: Duration::from_secs(30),
        }),
        socket_base_dir: Some(socket_base.to_owned()),
        ..DispatcherConfig::default()
    };
    let d = Dispatcher::new(worker_spec(framed), Faulty(transport), config);
    Arc::new(d.expect("a dispatcher"))
}

// ---------------------------------------------------------------------------------------
// Message faults on the dispatcher's connections.

/// What a session asks of the transport that opens its connection: the plans to wrap it
/// with (messages; bytes on the framed transport), and where to leave the wrappers'
/// counters.
#[derive(Default)]
struct Slot {
    plan: FaultPlan,
    counters: Option<FaultCounters>,
    io_plan: IoPlan,
    io_counters: Option<IoCounters>,
}

tokio::task_local! {
    /// The [`Slot`] of the session being created on this task (the dispatcher opens the
    /// connection inside `create_session`, on the caller's task).
    static SLOT: Arc<Mutex<Slot>>;
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A dispatcher transport whose session connections are [`FaultyConnection`]s with the plan
/// of the creating task's [`Slot`] (none outside one): the udf §6.5 failures on both real
/// transports.
struct Faulty<T>(T);

impl<T: WorkerTransport> WorkerTransport for Faulty<T> {
    type Channel = T::Channel;
    type Connection = FaultyConnection<T::Connection>;

    fn connect<'a>(&'a self, endpoint: &'a WorkerAddress) -> BoxFuture<'a, io::Result<T::Channel>> {
        self.0.connect(endpoint)
    }

    fn open_session<'a>(
        &'a self,
        channel: &'a T::Channel,
        endpoint: &'a WorkerAddress,
    ) -> BoxFuture<'a, io::Result<Self::Connection>> {
        let slot = SLOT.try_with(Arc::clone).ok();
        Box::pin(async move {
            let inner = self.0.open_session(channel, endpoint).await?;
            let plan = slot
                .as_ref()
                .map(|s| lock(s).plan.clone())
                .unwrap_or_default();
            let connection = FaultyConnection::new(inner, plan);
            if let Some(slot) = slot {
                lock(&slot).counters = Some(connection.counters());
            }
            Ok(connection)
        })
    }

    fn is_active(&self, channel: &T::Channel) -> bool {
        self.0.is_active(channel)
    }
}

/// The framed transport (one socket per session, udf §1.1, §6.4) with each session's socket
/// under a [`FaultyIo`] carrying the creating task's [`Slot`] I/O plan (a pass-through plan
/// outside one): byte-level faults under the framed codec (udf §1.4, §4.5, §6.5).
#[derive(Default)]
struct ByteFaulty {
    config: FramedConfig,
}

impl WorkerTransport for ByteFaulty {
    type Channel = ();
    type Connection = FramedConnection<FaultyIo<UnixStream>, UdfRequest, UdfResponse>;

    fn connect<'a>(&'a self, endpoint: &'a WorkerAddress) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            drop(UnixStream::connect(unix_path(endpoint)?).await?);
            Ok(())
        })
    }

    fn open_session<'a>(
        &'a self,
        _channel: &'a (),
        endpoint: &'a WorkerAddress,
    ) -> BoxFuture<'a, io::Result<Self::Connection>> {
        let slot = SLOT.try_with(Arc::clone).ok();
        Box::pin(async move {
            let socket = UnixStream::connect(unix_path(endpoint)?).await?;
            let plan = slot
                .as_ref()
                .map(|s| lock(s).io_plan.clone())
                .unwrap_or_default();
            let io = FaultyIo::new(socket, plan);
            if let Some(slot) = slot {
                lock(&slot).io_counters = Some(io.counters());
            }
            Ok(FramedConnection::new(io, &self.config))
        })
    }
}

/// The soak's framed workers listen on Unix sockets below its scratch directory.
fn unix_path(endpoint: &WorkerAddress) -> io::Result<&Path> {
    match endpoint {
        WorkerAddress::Unix(path) => Ok(path),
        WorkerAddress::Tcp(addr) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the soak's framed workers listen on Unix sockets, not {addr}"),
        )),
    }
}

// ---------------------------------------------------------------------------------------
// Pacing and tallies.

/// Hands out `total` tickets spread evenly over `span` from `start`, so a run reaches its
/// count in its duration; a late ticket starts at once.
struct Pacer {
    start: tokio::time::Instant,
    span: Duration,
    total: u64,
    next: AtomicU64,
}

impl Pacer {
    fn new(span: Duration, total: u64) -> Self {
        Self {
            start: tokio::time::Instant::now(),
            span,
            total,
            next: AtomicU64::new(0),
        }
    }

    async fn ticket(&self) -> Option<u64> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i >= self.total {
            return None;
        }
        let at = self.start + self.span.mul_f64(i as f64 / self.total as f64);
        tokio::time::sleep_until(at).await;
        Some(i)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Transport {
    Framed,
    Grpc,
}

/// The fault a session plans for itself (the killer's come on top).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Planned {
    None,
    /// `cancel()` before batch k (udf §4.8).
    Cancel,
    /// The session dropped before batch k: drop cleanup's Cancel (udf §4.9).
    Drop,
    /// The echo's error batch as batch k (udf §2.1): the worker reports a user error.
    UserError,
    /// SIGKILL of the session's own worker before batch k (udf §8.4).
    Kill,
    /// A seeded [`FaultPlan`] on the connection (udf §6.5).
    Messages,
    /// A seeded [`IoPlan`] on the framed session's socket (udf §1.4, §4.5, §6.5).
    Bytes,
}

impl Planned {
    fn draw(rng: &mut SmallRng, transport: Transport) -> Self {
        match rng.random_range(0..100) {
            0..70 => Self::None,
            70..76 => Self::Cancel,
            76..82 => Self::Drop,
            82..86 => Self::UserError,
            86..90 => Self::Kill,
            90..95 => Self::Messages,
            // A gRPC session's stream shares its worker's HTTP/2 connection: no socket of
            // its own to fault.
            _ if transport == Transport::Grpc => Self::Messages,
            _ => Self::Bytes,
        }
    }
}

/// How one worker session went.
struct SessionRecord {
    transport: Transport,
    planned: Planned,
    /// `Err`: `create_session` failed, with the error's variant (udf §6.2).
    outcome: Result<Termination, String>,
    /// Tagged batches the session sent.
    sent: Vec<u64>,
    /// Tags of the echoes it received, in order.
    echoed: Vec<Option<u64>>,
    /// Whether the killer hit the session's worker.
    killed: bool,
    /// What the connection's fault plan did.
    faults: FaultReport,
    /// What the socket's I/O plan did (framed sessions).
    io: IoReport,
    took: Duration,
}

/// Byte faults summed over sessions.
#[derive(Debug, Default)]
struct IoTally {
    split_reads: u64,
    split_writes: u64,
    pendings: u64,
    read_truncated: u64,
    write_truncated: u64,
    cut: u64,
}

#[derive(Default)]
struct UdfTally {
    /// (transport, outcome) → sessions.
    outcomes: BTreeMap<(Transport, String), u64>,
    /// Planned fault → sessions.
    planned: BTreeMap<Planned, u64>,
    /// Sessions whose worker the killer hit.
    hit_by_killer: u64,
    /// Summed counters of the message faults.
    faults: FaultReport,
    /// Summed counters of the byte faults (booleans counted as sessions).
    io: IoTally,
    /// Batches sent, echoes checked.
    batches_sent: u64,
    echoes_checked: u64,
    lost: u64,
    duplicated: u64,
    violations: u64,
    kept: Vec<String>,
    slowest: Duration,
}

impl UdfTally {
    fn add(&mut self, r: SessionRecord) {
        let outcome = match &r.outcome {
            Ok(t) => format!("{:?}", t.kind()),
            Err(e) => format!("create error: {e}"),
        };
        *self.outcomes.entry((r.transport, outcome)).or_default() += 1;
        *self.planned.entry(r.planned).or_default() += 1;
        self.hit_by_killer += u64::from(r.killed);
        let f = &mut self.faults;
        let g = r.faults;
        f.dropped += g.dropped;
        f.stalled += g.stalled;
        f.delayed += g.delayed;
        f.failed_writes += g.failed_writes;
        f.half_closed += g.half_closed;
        f.swallowed += g.swallowed;
        let (t, io) = (&mut self.io, r.io);
        t.split_reads += io.split_reads;
        t.split_writes += io.split_writes;
        t.pendings += io.pendings;
        t.read_truncated += u64::from(io.read_truncated);
        t.write_truncated += u64::from(io.write_truncated);
        t.cut += u64::from(io.cut);
        self.batches_sent += r.sent.len() as u64;
        self.echoes_checked += r.echoed.len() as u64;
        self.slowest = self.slowest.max(r.took);
        for problem in check_session(&r, &mut self.lost, &mut self.duplicated) {
            self.violations += 1;
            if self.kept.len() < KEPT {
                self.kept.push(format!(
                    "{:?} {:?} session: {problem} (outcome {:?}, faults {:?}, io {:?})",
                    r.transport, r.planned, r.outcome, r.faults, r.io
                ));
            }
        }
    }
}

/// The pass criteria of one session: what it received is a prefix of what it sent (every
/// batch once, in order), all of it when it `Finished`; and its outcome is the one its
/// fault explains (udf §4.1, §4.8, §4.9, §6.5).
fn check_session(r: &SessionRecord, lost: &mut u64, duplicated: &mut u64) -> Vec<String> {
    let mut problems = Vec::new();
    let prefix_ok = r.echoed.len() <= r.sent.len()
        && r.echoed
            .iter()
            .zip(&r.sent)
            .all(|(got, sent)| *got == Some(*sent));
    if !prefix_ok {
        let distinct: HashSet<_> = r.echoed.iter().collect();
        *duplicated += (r.echoed.len() - distinct.len()) as u64;
        problems.push(format!(
            "echoes {:?} are not a prefix of the batches sent {:?}",
            r.echoed, r.sent
        ));
    }
    let kind = match &r.outcome {
        Ok(t) => t.kind(),
        // A session that was never created has no outcome to check; the count is reported.
        Err(_) => return problems,
    };
    if kind == TerminationKind::Finished && r.echoed.len() != r.sent.len() {
        *lost += r.sent.len().saturating_sub(r.echoed.len()) as u64;
        problems.push(format!(
            "Finished with {} of {} batches echoed",
            r.echoed.len(),
            r.sent.len()
        ));
    }
    // The killer or a destructive message or byte fault may end any session any typed way.
    if r.killed || r.faults.destructive() > 0 || r.io.destructive() {
        return problems;
    }
    use TerminationKind::*;
    let expected: &[TerminationKind] = match r.planned {
        // Benign faults (delays; split reads and writes, `Pending`) change no outcome.
        Planned::None | Planned::Messages | Planned::Bytes => &[Finished],
        Planned::Cancel => &[Cancelled],
        Planned::Drop => &[Cancelled, Interrupted],
        Planned::UserError => &[Cancelled],
        Planned::Kill => &[TransportFailed],
    };
    if !expected.contains(&kind) {
        problems.push(format!("ended {kind:?}, expected one of {expected:?}"));
    }
    if r.planned == Planned::UserError
        && let Ok(Termination::Cancelled {
            execution_error, ..
        }) = &r.outcome
    {
        let class = execution_error.as_ref().and_then(|e| e.error_class());
        if class != Some(fixtures::USER_ERROR_CLASS) {
            problems.push(format!("the user error is not kept: {execution_error:?}"));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------
// One worker session.

/// Worker ids the killer has SIGKILLed.
type Killed = Arc<Mutex<HashSet<String>>>;

fn sigkill(pid: u32) {
    // The process may have ended already; that is no error here.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Runs one session on `d` as `seed` decides and returns its record.
async fn udf_session<T: WorkerTransport>(
    d: &Dispatcher<Faulty<T>>,
    transport: Transport,
    seed: u64,
    killed: &Killed,
) -> SessionRecord {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let planned = Planned::draw(&mut rng, transport);
    let batches = rng.random_range(1..=12u64);
    let at = rng.random_range(0..batches);
    let sent: Vec<Bytes> = (0..batches)
        .map(|i| fixtures::tagged((seed << 8) | i, rng.random_range(8..=2048)))
        .collect();
    let slot = Arc::new(Mutex::new(Slot::default()));
    if planned == Planned::Messages {
        let settings = RandomFaults {
            horizon: batches + 3,
            max_faults: 2,
            max_delay: Duration::from_millis(300),
            destructive: true,
        };
        lock(&slot).plan = FaultPlan::random(seed, &settings);
    }
    if planned == Planned::Bytes {
        let settings = RandomIo {
            // Init, the batches and Finish: a cut or truncation anywhere in the session.
            horizon: 64 + sent.iter().map(|b| b.len() as u64 + 16).sum::<u64>(),
            max_piece: 64,
            max_pending_every: 5,
            destructive: true,
        };
        lock(&slot).io_plan = IoPlan::random(seed, &settings);
    }
    let mut record = SessionRecord {
        transport,
        planned,
        outcome: Err(String::new()),
        sent: Vec::new(),
        echoed: Vec::new(),
        killed: false,
        faults: FaultReport::default(),
        io: IoReport::default(),
        took: Duration::ZERO,
    };
    match SLOT.scope(slot.clone(), d.create_session()).await {
        Err(e) => {
            let debug = format!("{e:?}");
            let variant = debug.split([' ', '(', '{']).next().unwrap_or_default();
            record.outcome = Err(variant.to_owned());
        }
        Ok(session) => {
            let id = session.worker().id().to_owned();
            let pid = d.worker(&id).map(|w| w.pid);
            let outcome = drive(session, planned, at, &sent, pid, &mut record).await;
            record.outcome = Ok(outcome);
            record.killed = lock(killed).contains(&id);
        }
    }
    if let Some(counters) = &lock(&slot).counters {
        record.faults = counters.report();
    }
    if let Some(counters) = &lock(&slot).io_counters {
        record.io = counters.report();
    }
    record.took = started.elapsed();
    record
}

/// Init, then batch by batch: send, read its echo; the planned fault strikes before batch
/// `at`; then finish and read to the end. Returns the session's outcome.
async fn drive<C>(
    session: tether::worker::engine::Session<state::Init, C>,
    planned: Planned,
    at: u64,
    batches: &[Bytes],
    pid: Option<u32>,
    record: &mut SessionRecord,
) -> Termination
where
    C: Connection<UdfRequest, UdfResponse> + Send + Unpin + 'static,
{
    let watch = session.watch();
    let mut s = match session.init(fixtures::init("soak")).await {
        Ok((s, _)) => s,
        Err(failed) => return failed.session.close().await,
    };
    for (i, batch) in (0u64..).zip(batches) {
        let mut batch = batch.clone();
        if i == at {
            match planned {
                Planned::Cancel => {
                    let cancelling = s.cancel(Some("soak".into())).await;
                    return cancelling.wait().await.close().await;
                }
                Planned::Drop => {
                    drop(s);
                    return watch.wait().await;
                }
                Planned::UserError => batch = Bytes::from_static(ERROR_BATCH.as_bytes()),
                Planned::Kill => {
                    if let Some(pid) = pid {
                        sigkill(pid);
                    }
                }
                Planned::None | Planned::Messages | Planned::Bytes => {}
            }
        }
        if batch != ERROR_BATCH.as_bytes() {
            record
                .sent
                .push(fixtures::tag_of(&batch).expect("a tagged batch"));
        }
        if s.send(batch).await.is_err() {
            return s.close().await;
        }
        match s.recv().await {
            Ok(Some(echo)) => record.echoed.push(fixtures::tag_of(&echo)),
            Ok(None) | Err(_) => return s.close().await,
        }
    }
    let mut finishing = match s.finish().await {
        Ok(f) => f,
        Err(failed) => return failed.session.close().await,
    };
    while let Ok(Some(echo)) = finishing.recv().await {
        record.echoed.push(fixtures::tag_of(&echo));
    }
    finishing.wait().await.close().await
}

/// A session loop: tickets from `pacer`, one session each, into `tally`.
async fn udf_lane<T: WorkerTransport>(
    d: Arc<Dispatcher<Faulty<T>>>,
    transport: Transport,
    pacer: Arc<Pacer>,
    seed: u64,
    killed: Killed,
    tally: Arc<Mutex<UdfTally>>,
) {
    while let Some(ticket) = pacer.ticket().await {
        let seed = seed ^ ticket.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ transport as u64;
        match tokio::time::timeout(HUNG, udf_session(&d, transport, seed, &killed)).await {
            Ok(record) => lock(&tally).add(record),
            Err(_) => {
                let mut t = lock(&tally);
                t.violations += 1;
                t.kept.push(format!(
                    "{transport:?} session seed {seed}: hung for {HUNG:?}"
                ));
            }
        }
    }
}

/// Workers of `d` that serve a session now: (id, pid).
fn busy<T: WorkerTransport>(d: &Dispatcher<T>) -> Vec<(String, u32)> {
    d.workers()
        .into_iter()
        .filter(|w| w.active_sessions > 0)
        .map(|w| (w.id, w.pid))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Executions through the Spark Connect service.

/// Runs a plan whose root is a decimal count `n`: `n` Arrow-batch responses whose data is
/// a tagged batch (tag = its index), so the client sees any loss, duplicate or reorder.
struct TaggedRows;

impl QueryEngine for TaggedRows {
    fn execute(
        &self,
        _session: &SessionContext,
        request: &ExecutePlanRequest,
    ) -> Result<ResponseSource, ConnectError> {
        let rows = match &request.plan {
            Some(Plan {
                op_type: Some(tether::wire::connect::plan::OpType::Root(root)),
            }) => std::str::from_utf8(root)
                .ok()
                .and_then(|t| t.parse::<u64>().ok()),
            _ => None,
        };
        let Some(rows) = rows else {
            return Err(ConnectError::Failed {
                message: "[CONNECT_INVALID_PLAN] the soak's plans are row counts".into(),
                code: tether::execution::Code::InvalidArgument,
            });
        };
        Ok(futures::stream::iter(0..rows)
            .map(|i| Ok(ExecutePlanResponse::arrow_batch(1, fixtures::tagged(i, 96))))
            .boxed())
    }
}

#[derive(Default)]
struct ExecutionTally {
    executions: u64,
    responses_checked: u64,
    reattaches: u64,
    reexecutions: u64,
    retries: u64,
    lost: u64,
    duplicated: u64,
    violations: u64,
    kept: Vec<String>,
    slowest: Duration,
    /// Executions read through a [`FaultyRpc`], and what its plans did.
    rpc_faulted: u64,
    rpc: RpcReport,
}

/// Reads one execution of `rows` responses and checks them: each index once and in order,
/// then `ResultComplete` last (rx §3.5, §6.3).
async fn execution<R: ExecutionRpc + ?Sized>(
    client: Arc<R>,
    session_id: &str,
    rows: u64,
    tally: &Mutex<ExecutionTally>,
) {
    let started = Instant::now();
    let request = ExecutePlanRequest {
        session_id: session_id.to_owned(),
        user_context: Some(UserContext::new("soak")),
        plan: Some(Plan::root(rows.to_string().into_bytes())),
        ..Default::default()
    };
    let mut problems = Vec::new();
    let mut next = 0u64;
    let mut seen = HashSet::new();
    let mut complete = false;
    let mut stream = match ReattachingStream::new(client, request, ClientConfig::default()) {
        Ok(s) => s,
        Err(e) => {
            problems.push(format!("the stream could not start: {e}"));
            return record_execution(tally, problems, 0, None, started, 0, 0);
        }
    };
    while let Some(item) = stream.next().await {
        match item {
            Ok(r) if complete => problems.push(format!("a response after ResultComplete: {r:?}")),
            Ok(r) if r.is_result_complete() => complete = true,
            Ok(ExecutePlanResponse {
                response_type: Some(execute_plan_response::ResponseType::ArrowBatch(b)),
                ..
            }) => {
                let tag = fixtures::tag_of(&b.data);
                if tag != Some(next) && problems.len() < 3 {
                    problems.push(format!("response {tag:?} where {next} was due"));
                }
                if let Some(tag) = tag
                    && !seen.insert(tag)
                {
                    tally_dup(tally);
                }
                next += 1;
            }
            Ok(_) => {}
            Err(e) => {
                problems.push(format!("the stream failed: {e}"));
                break;
            }
        }
    }
    if !complete {
        problems.push("no ResultComplete".into());
    }
    if next != rows {
        problems.push(format!("{next} of {rows} responses delivered"));
    }
    let lost = rows.saturating_sub(seen.len() as u64);
    let stats = stream.stats();
    let _ = stream.close().await;
    record_execution(tally, problems, next, Some(stats), started, lost, rows);
}

fn tally_dup(tally: &Mutex<ExecutionTally>) {
    lock(tally).duplicated += 1;
}

fn record_execution(
    tally: &Mutex<ExecutionTally>,
    problems: Vec<String>,
    checked: u64,
    stats: Option<tether::execution::client::ClientStats>,
    started: Instant,
    lost: u64,
    rows: u64,
) {
    let mut t = lock(tally);
    t.executions += 1;
    t.responses_checked += checked;
    t.lost += lost;
    t.slowest = t.slowest.max(started.elapsed());
    if let Some(s) = stats {
        t.reattaches += s.reattaches;
        t.reexecutions += s.reexecutions;
        t.retries += s.retries;
    }
    if !problems.is_empty() {
        t.violations += 1;
        if t.kept.len() < KEPT {
            t.kept
                .push(format!("execution of {rows} rows: {problems:?}"));
        }
    }
}

/// An execution loop: its own client connection and Spark Connect session.
async fn execution_lane(
    address: String,
    pacer: Arc<Pacer>,
    seed: u64,
    tally: Arc<Mutex<ExecutionTally>>,
) {
    let client = Arc::new(
        ConnectClient::connect(&address, None)
            .await
            .expect("the soak's Connect server is up"),
    );
    let session_id = uuid::Uuid::new_v4().to_string();
    while let Some(ticket) = pacer.ticket().await {
        let mut rng = SmallRng::seed_from_u64(seed ^ ticket.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let rows = rng.random_range(50..=500u64);
        let run = if rng.random_range(0..4) == 0 {
            // Retryable faults only, at most 3: the client must still deliver everything.
            let settings = RandomRpcFaults {
                max_delay: Duration::from_millis(300),
                ..RandomRpcFaults::default()
            };
            let faulty =
                FaultyRpc::new((*client).clone(), RpcPlan::random(rng.random(), &settings));
            let counters = faulty.counters();
            let tally = tally.clone();
            let session_id = session_id.clone();
            Box::pin(async move {
                execution(Arc::new(faulty), &session_id, rows, &tally).await;
                let (mut t, r) = (lock(&tally), counters.report());
                t.rpc_faulted += 1;
                let sum = &mut t.rpc;
                sum.refused += r.refused;
                sum.broken += r.broken;
                sum.delayed += r.delayed;
                sum.failed_releases += r.failed_releases;
            }) as BoxFuture<'_, ()>
        } else {
            Box::pin(execution(client.clone(), &session_id, rows, &tally))
        };
        if tokio::time::timeout(HUNG, run).await.is_err() {
            let mut t = lock(&tally);
            t.violations += 1;
            t.kept
                .push(format!("execution of {rows} rows: hung for {HUNG:?}"));
        }
    }
}

/// The Connect server: tether's service over `manager`, behind the example's fault mode
/// on connections it can drop; returns its address and the sender that stops it.
async fn connect_server(
    manager: &ExecutionManager,
    faults: &Arc<Faults>,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let service = ConnectService::new(manager.clone(), TaggedRows)
        .into_service(&ConnectConfig { token: None });
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = format!("http://{}", listener.local_addr().expect("its address"));
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(io, _)| {
            let _ = io.set_nodelay(true);
            KillableStream::new(tether::spark::connect::tls::AcceptedStream::new(io))
        });
        Some((accepted, listener))
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .add_service(FaultService::new(service, faults.clone()))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
    let task = tokio::spawn(async move {
        server.await.expect("the Connect server runs");
    });
    (address, stop, task)
}

// ---------------------------------------------------------------------------------------
// What /proc says.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Resources {
    fds: usize,
    children: usize,
    threads: usize,
    rss_kib: u64,
}

fn status_field(name: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
}

/// Processes whose parent is this one, from `/proc/*/stat` (zombies count: not reaped).
fn children() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid …: the comm may hold spaces and parentheses.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after.split_whitespace().nth(1) == Some(me.as_str())
        })
        .count()
}

fn resources() -> Resources {
    Resources {
        fds: std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .count(),
        children: children(),
        threads: status_field("Threads:") as usize,
        rss_kib: status_field("VmRSS:"),
    }
}

/// Unix socket files anywhere below `dir`.
fn socket_files(dir: &Path) -> usize {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => socket_files(&e.path()),
            Ok(t) if t.is_socket() => 1,
            _ => 0,
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// The soak.

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// Sessions and executions of one phase.
struct Phase {
    span: Duration,
    sessions: u64,
    executions: u64,
}

#[test]
#[ignore = "the soak: minutes long; run with `--ignored --exact soak::soak` (TETHER_SOAK_SECS, default 600)"]
fn soak() {
    let secs = env_u64(SECS_VAR).unwrap_or(600).max(1);
    let seed = env_u64(SEED_VAR).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let scale = |full: u64, secs: u64| (full * secs).div_ceil(600).max(1);
    let warm_secs = (secs / 10).clamp(5, 30);
    let run = Phase {
        span: Duration::from_secs(secs),
        sessions: scale(FULL_SESSIONS, secs),
        executions: scale(FULL_EXECUTIONS, secs),
    };
    let warm_up = Phase {
        span: Duration::from_secs(warm_secs),
        sessions: scale(FULL_SESSIONS, warm_secs),
        executions: scale(FULL_EXECUTIONS, warm_secs),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let before = resources();
    runtime.block_on(soak_run(seed, secs, warm_up, run, before));
}

async fn soak_run(seed: u64, secs: u64, warm_up: Phase, run: Phase, before: Resources) {
    let scratch = std::env::temp_dir().join(format!("tether-soak-{:08x}", seed as u32));
    std::fs::create_dir_all(&scratch).expect("a scratch directory");
    let framed = dispatcher(true, ByteFaulty::default(), &scratch);
    let grpc = dispatcher(false, GrpcTransport::default(), &scratch);
    let manager = ExecutionManager::new(ManagerConfig {
        stream: StreamLimits {
            max_duration: Some(Duration::from_millis(500)),
            max_bytes: Some(2048),
        },
        ..ManagerConfig::default()
    });
    let maintenance = tokio::spawn(manager.clone().run_maintenance());
    let faults = Faults::new(seed, manager.clone());
    let (address, stop_server, server) = connect_server(&manager, &faults).await;
    let killed: Killed = Arc::default();
    let kills = Arc::new(AtomicU64::new(0));
    let udf = Arc::new(Mutex::new(UdfTally::default()));
    let executions = Arc::new(Mutex::new(ExecutionTally::default()));

    // The killer: a random busy worker, SIGKILLed at random moments (udf §8.4).
    let killer = {
        let (framed, grpc, killed, kills) =
            (framed.clone(), grpc.clone(), killed.clone(), kills.clone());
        tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0x6b69_6c6c);
            loop {
                let pause = rng.random_range(500..2500);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let mut targets = busy(&framed);
                targets.extend(busy(&grpc));
                if targets.is_empty() {
                    continue;
                }
                let (id, pid) = targets.swap_remove(rng.random_range(0..targets.len()));
                lock(&killed).insert(id);
                sigkill(pid);
                kills.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let phase = |p: &Phase, salt: u64| {
        let sessions = Arc::new(Pacer::new(p.span, p.sessions));
        let execs = Arc::new(Pacer::new(p.span, p.executions));
        let mut lanes = tokio::task::JoinSet::new();
        for lane in 0..LANES_PER_TRANSPORT as u64 {
            let s = seed ^ salt ^ (lane << 48);
            lanes.spawn(udf_lane(
                framed.clone(),
                Transport::Framed,
                sessions.clone(),
                s,
                killed.clone(),
                udf.clone(),
            ));
            lanes.spawn(udf_lane(
                grpc.clone(),
                Transport::Grpc,
                sessions.clone(),
                s,
                killed.clone(),
                udf.clone(),
            ));
        }
        for lane in 0..EXECUTION_LANES as u64 {
            lanes.spawn(execution_lane(
                address.clone(),
                execs.clone(),
                seed ^ salt ^ (lane << 40),
                executions.clone(),
            ));
        }
        lanes
    };

    let t0 = Instant::now();
    phase(&warm_up, 0x7761_726d).join_all().await;
    let warm_took = t0.elapsed();
    // The warm-up's numbers are reported apart; the run starts from zero.
    let warm_udf = std::mem::take(&mut *lock(&udf));
    let warm_exec = std::mem::take(&mut *lock(&executions));
    let warm_kills = kills.swap(0, Ordering::Relaxed);
    let after_warm_up = resources();

    let t1 = Instant::now();
    // The resident set every tenth of the run, for the report.
    let sampler = tokio::spawn({
        let every = run.span / 10;
        async move {
            let mut samples = Vec::new();
            loop {
                tokio::time::sleep(every).await;
                samples.push(status_field("VmRSS:"));
                if samples.len() >= 10 {
                    return samples;
                }
            }
        }
    });
    phase(&run, 0x7275_6e00).join_all().await;
    let run_took = t1.elapsed();
    let samples = match tokio::time::timeout(Duration::from_secs(1), sampler).await {
        Ok(Ok(samples)) => samples,
        _ => Vec::new(),
    };
    killer.abort();
    let _ = killer.await;
    let at_end = resources();

    // Handles, sockets and processes while the dispatchers are still open: every session's
    // handle released, every stopped worker's socket removed.
    framed.settle().await;
    grpc.settle().await;
    let open_workers = framed.workers().len() + grpc.workers().len();
    let active_sessions: usize = framed
        .workers()
        .iter()
        .chain(grpc.workers().iter())
        .map(|w| w.active_sessions)
        .sum();
    let sockets_open = socket_files(&scratch);
    let dispatch_stats = [framed.stats(), grpc.stats()];

    // Teardown, then the leak counts.
    framed.close().await;
    grpc.close().await;
    let released = eventually(Duration::from_secs(10), || manager.execution_count() == 0).await;
    let manager_stats = manager.stats();
    let _ = stop_server.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    maintenance.abort();
    let _ = maintenance.await;
    let closed_stats = [framed.stats(), grpc.stats()];
    drop((framed, grpc));
    let settled = eventually(Duration::from_secs(10), || {
        let now = resources();
        now.fds <= before.fds && now.children == 0
    })
    .await;
    let after = resources();
    let sockets_after = socket_files(&scratch);
    let _ = std::fs::remove_dir_all(&scratch);

    let udf = std::mem::take(&mut *lock(&udf));
    let exec = std::mem::take(&mut *lock(&executions));
    let kills = kills.load(Ordering::Relaxed);
    let rss_ratio = at_end.rss_kib as f64 / after_warm_up.rss_kib as f64;

    // The report.
    println!("\n=== tether soak (issue 11) ===");
    println!(
        "seed {seed} ({SEED_VAR}); {SECS_VAR}={secs}; warm-up {:.1} s ({} sessions, {} executions); \
         run {:.1} s",
        warm_took.as_secs_f64(),
        warm_up.sessions,
        warm_up.executions,
        run_took.as_secs_f64()
    );
    println!(
        "warm-up: {} sessions, {} violations; {} executions, {} violations; {warm_kills} kills",
        warm_udf.outcomes.values().sum::<u64>(),
        warm_udf.violations,
        warm_exec.executions,
        warm_exec.violations
    );
    println!(
        "\nworker sessions (run): {} in all",
        udf.outcomes.values().sum::<u64>()
    );
    println!("  {:<8} {:<48} {:>7}", "transport", "outcome", "sessions");
    for ((transport, outcome), n) in &udf.outcomes {
        println!("  {:<8} {outcome:<48} {n:>7}", format!("{transport:?}"));
    }
    println!("faults injected (run):");
    for (planned, n) in &udf.planned {
        println!("  planned {planned:?}: {n} sessions");
    }
    let f = udf.faults;
    println!(
        "  killer SIGKILLs: {kills} (sessions hit: {}); message faults fired: {} cut, {} stalled, \
         {} delayed, {} failed writes, {} half-closed ({} messages swallowed)",
        udf.hit_by_killer,
        f.dropped,
        f.stalled,
        f.delayed,
        f.failed_writes,
        f.half_closed,
        f.swallowed
    );
    let io = &udf.io;
    println!(
        "  byte faults fired (framed): {} split reads, {} split writes, {} Pendings; \
         sessions with a truncated read {}, a truncated write {}, a cut {}",
        io.split_reads, io.split_writes, io.pendings, io.read_truncated, io.write_truncated, io.cut
    );
    println!(
        "  batches sent {}, echoes checked {}, lost {}, duplicated {}; slowest session {:.2} s",
        udf.batches_sent,
        udf.echoes_checked,
        udf.lost,
        udf.duplicated,
        udf.slowest.as_secs_f64()
    );
    for (name, s, c) in [
        ("framed", dispatch_stats[0], closed_stats[0]),
        ("gRPC", dispatch_stats[1], closed_stats[1]),
    ] {
        println!(
            "  {name} dispatcher: {} workers spawned, {} sessions on pooled workers, {} stopped \
             (after close: {} spawned, {} stopped)",
            s.spawned, s.reused, s.stopped, c.spawned, c.stopped
        );
    }
    println!(
        "\nexecutions (run): {}; responses checked {}; lost {}; duplicated {}; reattaches {}, \
         re-executions {}, retries {}; slowest {:.2} s",
        exec.executions,
        exec.responses_checked,
        exec.lost,
        exec.duplicated,
        exec.reattaches,
        exec.reexecutions,
        exec.retries,
        exec.slowest.as_secs_f64()
    );
    println!("  stream faults (warm-up and run): {}", faults.stats());
    println!(
        "  client-side faults (run): {} executions through a FaultyRpc; {} calls refused, {} \
         streams broken, {} delayed, {} releases failed",
        exec.rpc_faulted,
        exec.rpc.refused,
        exec.rpc.broken,
        exec.rpc.delayed,
        exec.rpc.failed_releases
    );
    println!(
        "  manager: {} created, {} released, {} abandoned, {} forgotten; {} left",
        manager_stats.created,
        manager_stats.released,
        manager_stats.abandoned,
        manager_stats.forgotten,
        manager_stats.executions
    );
    println!("\nresources (from /proc):");
    println!(
        "  {:<26} {:>10} {:>16} {:>10} {:>10}",
        "", "start", "after warm-up", "run end", "teardown"
    );
    for (name, f) in [
        (
            "file descriptors",
            (|r: &Resources| r.fds as u64) as fn(&Resources) -> u64,
        ),
        ("child processes", |r| r.children as u64),
        ("threads", |r| r.threads as u64),
        ("VmRSS KiB", |r| r.rss_kib),
    ] {
        println!(
            "  {name:<26} {:>10} {:>16} {:>10} {:>10}",
            f(&before),
            f(&after_warm_up),
            f(&at_end),
            f(&after)
        );
    }
    println!(
        "  at run end: {open_workers} workers tracked, {active_sessions} sessions holding a \
         handle, {sockets_open} socket files; after close: {sockets_after} socket files"
    );
    println!(
        "  resident set: {} KiB at run end / {} KiB after warm-up = {:.3} (allocator: the \
         system allocator, glibc malloc)",
        at_end.rss_kib, after_warm_up.rss_kib, rss_ratio
    );
    println!("  VmRSS KiB every tenth of the run: {samples:?}");
    for v in udf.kept.iter().chain(&exec.kept) {
        println!("  VIOLATION {v}");
    }

    // The pass criteria.
    let sessions_run: u64 = udf.outcomes.values().sum();
    assert_eq!(sessions_run, run.sessions, "every ticketed session ran");
    assert!(
        udf.outcomes.keys().any(|(t, _)| *t == Transport::Framed)
            && udf.outcomes.keys().any(|(t, _)| *t == Transport::Grpc),
        "both transports served sessions"
    );
    assert_eq!(
        udf.violations, 0,
        "worker-session violations: {:#?}",
        udf.kept
    );
    assert_eq!(
        (udf.lost, udf.duplicated),
        (0, 0),
        "UDF batches lost / duplicated"
    );
    assert_eq!(
        exec.executions, run.executions,
        "every ticketed execution ran"
    );
    assert_eq!(exec.violations, 0, "execution violations: {:#?}", exec.kept);
    assert_eq!(
        (exec.lost, exec.duplicated),
        (0, 0),
        "responses lost / duplicated"
    );
    assert!(exec.responses_checked > 0, "responses were checked");
    assert_eq!(
        active_sessions, 0,
        "every session released its worker handle"
    );
    assert_eq!(
        sockets_open, open_workers,
        "one socket file per live worker, none of a stopped one"
    );
    for c in closed_stats {
        assert_eq!(
            c.spawned, c.stopped,
            "every worker spawned was stopped and reaped"
        );
    }
    assert!(released, "every execution released: {manager_stats:?}");
    assert!(
        settled,
        "descriptors and processes back to the start: {before:?} → {after:?}"
    );
    assert_eq!(after.children, 0, "no worker process left");
    assert!(
        after.fds <= before.fds,
        "no descriptor leaked: {before:?} → {after:?}"
    );
    assert_eq!(sockets_after, 0, "no socket file left");
    assert!(
        (rss_ratio - 1.0).abs() <= 0.10,
        "resident set at the end within 10 % of the level after the warm-up: {rss_ratio:.3}"
    );
}

/// Polls `check` every 50 ms until it holds or `limit` passes; whether it held.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
