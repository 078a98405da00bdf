//! Process-dispatcher scenarios of udf §8.4–§8.6 ported as `udf_sNNN_…`, plus the reuse
//! pool (`udf_pool_…`, beyond Spark), all with real processes:
//!
//! - lifecycle, validation and environment tests run bash stub workers
//!   (`tests/support/stub-worker.sh`) behind [`FileTransport`], a test transport whose
//!   readiness is "the socket file exists" (like upstream's core suite) and whose sessions
//!   are in-memory;
//! - protocol tests run a real tether worker over the framed Unix-socket transport: this test
//!   binary re-executed in worker mode (`tests/support/tether-worker.sh` → the ignored
//!   `worker_mode` test, which serves the reference echo UDF with `endpoint::serve`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use tether::connection::framed::{FramedConfig, FramedListener};
use tether::connection::{MemoryConnection, pair};
use tether::wire::{
    DirectWorker, LocalTcpConnection, ProcessCallable, UdfProtoCommunicationPattern, UdfRequest,
    UdfResponse, UdfWorkerDataFormat, UdfWorkerProperties, UdfWorkerSpecification,
    WorkerConnectionSpec, WorkerEnvironment, udf_worker_specification, worker_connection_spec,
};
use tether::worker::dispatcher::{
    DispatchError, Dispatcher, DispatcherConfig, EnvironmentError, EnvironmentState, ExitReason,
    PoolConfig, SecurityScope, SpecError, WorkerInfo, WorkerLost, validate_spec,
};
use tether::worker::endpoint::serve;
use tether::worker::engine::{FramedTransport, WorkerAddress, WorkerTransport};
use tether::worker::engine::{
    HandleError, SessionConfig, SessionError, TerminationKind, WorkerHandle,
};
use tokio::sync::{Notify, Semaphore};

use tether_testing::echo::{EchoUdf, echo_config};
use tether_testing::fixtures::{INIT_FAILURE, USER_ERROR_CLASS};
use tether_testing::fixtures::{ScratchDir, direct_worker_spec, error_chain, init};

// ---------------------------------------------------------------------------------------
// Worker mode: this binary as a real tether worker.

/// Not a test: the body of the worker process the protocol tests spawn (through
/// `tests/support/tether-worker.sh`). Serves the reference echo UDF on the socket path (or,
/// for a bare port number, loopback TCP port) passed as `--connection`, one session per
/// accepted connection, until SIGTERM.
#[test]
#[ignore = "worker mode: the dispatcher tests run this binary as a UDF worker process"]
fn worker_mode() {
    let path = std::env::var("TETHER_TEST_WORKER_CONNECTION")
        .expect("worker_mode runs only as a worker spawned by the dispatcher tests");
    let id = std::env::var("TETHER_TEST_WORKER_ID").unwrap_or_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        #[cfg(feature = "grpc")]
        if std::env::var_os("TETHER_TEST_WORKER_GRPC").is_some() {
            use tether::spark::udf_grpc::{WorkerServer, WorkerService};
            let service = WorkerService::for_udf(EchoUdf::default, echo_config());
            let server = WorkerServer::bind_unix(&path, service).expect("bind the worker socket");
            eprintln!("tether test worker {id} serving gRPC on {path}");
            server.wait().await;
            return;
        }
        let listener = match path.parse::<u16>() {
            Ok(port) => FramedListener::bind_tcp(([127, 0, 0, 1], port).into()).await,
            Err(_) => FramedListener::bind_unix(&path),
        }
        .expect("bind the worker endpoint");
        eprintln!("tether test worker {id} listening on {path}");
        loop {
            let conn = listener
                .accept::<UdfResponse, UdfRequest>(&FramedConfig::default())
                .await
                .expect("accept");
            tokio::spawn(serve(conn, EchoUdf::default(), echo_config()));
        }
    });
}

/// Not a test: an engine that dies without closing its dispatcher. Builds a dispatcher under
/// `TETHER_TEST_ENGINE_BASE`, starts one worker, prints the socket directory and the
/// worker's pid, then aborts (as a SIGKILL or `panic = "abort"` would end it).
#[test]
#[ignore = "engine mode: a dispatcher test runs this binary as an engine that dies"]
fn dying_engine_mode() {
    let base = std::env::var("TETHER_TEST_ENGINE_BASE")
        .expect("dying_engine_mode runs only as the engine of a dispatcher test");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let config = DispatcherConfig {
            socket_base_dir: Some(PathBuf::from(base)),
            ..config()
        };
        let d = framed_dispatcher(tether_spec(), config);
        let s = d.create_session().await.expect("a session");
        println!("dir {}", d.socket_dir().display());
        println!(
            "worker {}",
            d.worker(s.worker().id()).expect("its worker").pid
        );
        std::mem::forget((s, d));
        std::process::abort();
    });
}

/// A dispatcher whose process died without closing it leaves its socket directory (its
/// worker's socket and output log); the next dispatcher created under the same base removes
/// it, since its owner no longer runs (udf §6.4), and keeps its own.
#[test]
fn a_directory_left_by_a_dead_engine_is_removed_by_the_next_dispatcher() {
    let base = ScratchDir::new("left");
    let run = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "dispatcher::dying_engine_mode",
            "--nocapture",
        ])
        .env("TETHER_TEST_ENGINE_BASE", base.path())
        .output()
        .expect("the engine runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let left = stdout
        .lines()
        .find_map(|l| l.strip_prefix("dir "))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "no directory printed: {stdout}{}",
                String::from_utf8_lossy(&run.stderr)
            )
        });
    // The orphaned worker (this binary's worker mode has no parent check) goes too.
    let orphan: i32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("worker "))
        .and_then(|p| p.parse().ok())
        .expect("the worker's pid");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(orphan),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(!run.status.success(), "the engine aborted");
    assert!(left.is_dir(), "the dead engine left {left:?}");
    let config = DispatcherConfig {
        socket_base_dir: Some(base.path().to_path_buf()),
        ..config()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let d = framed_dispatcher(tether_spec(), config);
        assert!(!left.exists(), "the next dispatcher removed {left:?}");
        assert!(d.socket_dir().is_dir(), "and kept its own");
        d.close().await;
    });
}

// ---------------------------------------------------------------------------------------
// Helpers.

fn support(file: &str) -> String {
    format!("{}/tests/support/{file}", env!("CARGO_MANIFEST_DIR"))
}

fn callable(command: &[&str], env: &[(&str, &str)]) -> ProcessCallable {
    ProcessCallable {
        command: command.iter().map(|s| s.to_string()).collect(),
        arguments: Vec::new(),
        environment_variables: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// A shell snippet as a callable: `bash -c SCRIPT` with `env`.
fn sh(script: &str, env: &[(&str, &str)]) -> ProcessCallable {
    callable(&["bash", "-c", script], env)
}

fn direct_mut(spec: &mut UdfWorkerSpecification) -> &mut DirectWorker {
    match spec.worker.as_mut() {
        Some(udf_worker_specification::Worker::Direct(d)) => d,
        None => panic!("direct worker expected"),
    }
}

fn props_mut(spec: &mut UdfWorkerSpecification) -> &mut UdfWorkerProperties {
    direct_mut(spec)
        .properties
        .get_or_insert_with(Default::default)
}

fn env_mut(spec: &mut UdfWorkerSpecification) -> &mut WorkerEnvironment {
    spec.environment.get_or_insert_with(Default::default)
}

/// A bash stub worker in `mode` (see `tests/support/stub-worker.sh`) with extra env vars.
fn stub_spec(mode: &str, env: &[(&str, &str)]) -> UdfWorkerSpecification {
    let mut vars = vec![("STUB_MODE", mode)];
    vars.extend_from_slice(env);
    direct_worker_spec(
        callable(&["bash", &support("stub-worker.sh")], &vars),
        false,
    )
}

/// This test binary as a real tether echo worker.
pub(crate) fn tether_spec() -> UdfWorkerSpecification {
    tether_spec_with(&[])
}

/// [`tether_spec`] with environment variables for the worker (`TETHER_TEST_WORKER_GRPC=1`:
/// serve gRPC instead of frames).
pub(crate) fn tether_spec_with(env: &[(&str, &str)]) -> UdfWorkerSpecification {
    let exe = std::env::current_exe().expect("test binary path");
    direct_worker_spec(
        callable(
            &[
                "bash",
                &support("tether-worker.sh"),
                exe.to_str().expect("utf-8 path"),
            ],
            env,
        ),
        false,
    )
}

/// Short timeouts so that failures show quickly; real processes need real time.
pub(crate) fn config() -> DispatcherConfig {
    DispatcherConfig {
        session: SessionConfig {
            init_timeout: Duration::from_secs(10),
            terminal_timeout: Duration::from_secs(10),
            interrupt_cancel_timeout: Duration::from_secs(2),
            ..SessionConfig::default()
        },
        default_init_timeout: Duration::from_secs(10),
        default_graceful_timeout: Duration::from_secs(2),
        callable_timeout: Duration::from_secs(10),
        ..DispatcherConfig::default()
    }
}

pub(crate) fn pooled() -> DispatcherConfig {
    DispatcherConfig {
        pool: Some(PoolConfig::default()),
        ..config()
    }
}

pub(crate) fn reusable(mut spec: UdfWorkerSpecification) -> UdfWorkerSpecification {
    spec.capabilities.as_mut().unwrap().supports_reuse = Some(true);
    spec
}

/// Lines in a marker file (0 when it does not exist).
fn lines(path: &str) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// Whether the process exists at all (a zombie counts: it was not reaped).
pub(crate) fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether the process runs: one of its threads is neither a zombie nor dead. Every thread
/// counts: after a SIGKILL the main thread can be a zombie while others still exit, and
/// until the last one has, the process's sockets still accept connections (and `waitid`
/// does not report it exited).
pub(crate) fn running(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).any(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
    })
}

pub(crate) async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The files of workers left in a dispatcher's private directory: everything but the
/// directory's `owner` record (which names the dispatcher's process, udf §6.4).
fn worker_files<T: WorkerTransport>(d: &Dispatcher<T>) -> Vec<PathBuf> {
    std::fs::read_dir(d.socket_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.ends_with("owner"))
        .collect()
}

pub(crate) fn socket_of(endpoint: &WorkerAddress) -> PathBuf {
    match endpoint {
        WorkerAddress::Unix(p) => p.clone(),
        WorkerAddress::Tcp(a) => panic!("unix endpoint expected, got {a}"),
    }
}

fn err_text<T: std::fmt::Debug>(r: Result<T, DispatchError>) -> (DispatchError, String) {
    let e = r.expect_err("an error");
    let text = e.to_string();
    (e, text)
}

/// The worker end of a [`FileTransport`] session, kept so the engine end stays open.
type Peer = MemoryConnection<UdfResponse, UdfRequest>;

/// A transport for stub workers: ready when the socket *file* exists; sessions are in-memory
/// pairs. Knobs: fail `connect`, fail or block `open_session`, report the channel inactive.
#[derive(Default)]
struct FileTransport {
    refuse_connect: AtomicBool,
    fail_open: AtomicBool,
    inactive: AtomicBool,
    /// When set, `open_session` signals `opening` and waits for a permit.
    gate: Option<(Arc<Notify>, Arc<Semaphore>)>,
    peers: Mutex<Vec<Peer>>,
}

impl WorkerTransport for FileTransport {
    type Channel = ();
    type Connection = MemoryConnection<UdfRequest, UdfResponse>;

    fn connect<'a>(&'a self, endpoint: &'a WorkerAddress) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            if self.refuse_connect.load(Ordering::SeqCst) {
                return Err(io::Error::other("connection creation refused by the test"));
            }
            match endpoint {
                WorkerAddress::Unix(p) if p.exists() => Ok(()),
                _ => Err(io::Error::from(io::ErrorKind::NotFound)),
            }
        })
    }

    fn open_session<'a>(
        &'a self,
        _channel: &'a (),
        _endpoint: &'a WorkerAddress,
    ) -> BoxFuture<'a, io::Result<Self::Connection>> {
        Box::pin(async move {
            if let Some((opening, permits)) = &self.gate {
                opening.notify_one();
                permits.acquire().await.expect("gate open").forget();
            }
            if self.fail_open.load(Ordering::SeqCst) {
                return Err(io::Error::other("session construction failed"));
            }
            let (engine, worker) = pair::<UdfRequest, UdfResponse>(8);
            self.peers.lock().unwrap().push(worker);
            Ok(engine)
        })
    }

    fn is_active(&self, _channel: &()) -> bool {
        !self.inactive.load(Ordering::SeqCst)
    }
}

fn stub_dispatcher(spec: UdfWorkerSpecification) -> Dispatcher<FileTransport> {
    Dispatcher::new(spec, FileTransport::default(), config()).expect("dispatcher")
}

pub(crate) fn framed_dispatcher(
    spec: UdfWorkerSpecification,
    config: DispatcherConfig,
) -> Dispatcher<FramedTransport> {
    Dispatcher::new(spec, FramedTransport::default(), config).expect("dispatcher")
}

fn spec_error(spec: &UdfWorkerSpecification) -> String {
    let e = validate_spec(spec, &DispatcherConfig::default()).expect_err("invalid spec");
    // The constructor reports the same error (and creates nothing).
    let ctor = Dispatcher::new(spec.clone(), FileTransport::default(), config())
        .expect_err("the constructor rejects it too");
    assert!(
        matches!(ctor, DispatchError::InvalidSpec(ref c) if *c == e),
        "{ctor}"
    );
    e.to_string()
}

pub(crate) type FramedSession = tether::worker::engine::Session<
    tether::worker::state::Init,
    <FramedTransport as WorkerTransport>::Connection,
>;

/// Init, send `batches`, finish, collect the echoed output; returns output and outcome.
pub(crate) async fn echo_round(
    session: FramedSession,
    batches: &[&[u8]],
) -> (Vec<Bytes>, TerminationKind) {
    let (mut s, _resp) = session.init(init("udf")).await.expect("init");
    let mut out = Vec::new();
    for b in batches {
        s.send(Bytes::copy_from_slice(b)).await.expect("send");
    }
    let mut f = s.finish().await.expect("finish");
    while let Some(b) = f.recv().await.expect("recv") {
        out.push(b);
    }
    let t = f.wait().await.outcome().kind();
    (out, t)
}

// ---------------------------------------------------------------------------------------
// udf §8.4 DirectGrpcDispatcherIntegrationSuite — against a real tether worker (framed UDS).

#[tokio::test]
async fn udf_s069_s096_dispatcher_is_constructed_from_a_direct_spec() {
    let d = framed_dispatcher(tether_spec(), config());
    assert!(d.socket_dir().is_dir());
    assert!(!d.is_closed());
    assert_eq!(d.init_timeout(), Duration::from_secs(10));
    assert_eq!(d.graceful_timeout(), Duration::from_secs(2));
    assert!(d.workers().is_empty(), "construction spawns nothing");
    assert!(matches!(d.environment(), EnvironmentState::Pending));
    d.close().await;
}

#[tokio::test]
async fn udf_s070_echo_hello() {
    let d = framed_dispatcher(tether_spec(), config());
    let s = d.create_session().await.expect("session");
    let (out, t) = echo_round(s, &[b"hello"]).await;
    assert_eq!(out, vec![Bytes::from_static(b"hello")]);
    assert_eq!(t, TerminationKind::Finished);
    d.close().await;
}

#[tokio::test]
async fn udf_s071_four_batches_echo_in_order() {
    let d = framed_dispatcher(tether_spec(), config());
    let s = d.create_session().await.expect("session");
    let (out, t) = echo_round(s, &[b"a", b"b", b"c", b"d"]).await;
    assert_eq!(out, ["a", "b", "c", "d"].map(|x| Bytes::from(x.as_bytes())));
    assert_eq!(t, TerminationKind::Finished);
    d.close().await;
}

#[tokio::test]
async fn udf_s072_sequential_sessions_each_spawn_and_clean_their_own_worker() {
    let d = framed_dispatcher(tether_spec(), config());
    let mut seen = Vec::new();
    for round in 0..2 {
        let s = d.create_session().await.expect("session");
        let info = d.worker(s.worker().id()).expect("tracked");
        let (out, _) = echo_round(s, &[b"x"]).await;
        assert_eq!(out.len(), 1, "round {round}");
        d.settle().await;
        assert!(!exists(info.pid), "worker of round {round} reaped");
        assert!(!socket_of(&info.address).exists());
        seen.push((info.pid, info.address));
    }
    assert_ne!(seen[0], seen[1], "a fresh process and socket per session");
    assert_eq!(d.stats().spawned, 2);
    d.close().await;
}

#[tokio::test]
async fn udf_s073_session_close_kills_the_worker_and_removes_its_socket() {
    let d = framed_dispatcher(tether_spec(), config());
    let s = d.create_session().await.expect("session");
    let info = d.worker(s.worker().id()).expect("tracked");
    let socket = socket_of(&info.address);
    assert!(running(info.pid) && socket.exists());
    let (s, _) = s.init(init("udf")).await.expect("init");
    assert_eq!(s.close().await.kind(), TerminationKind::Cancelled);
    d.settle().await;
    assert!(!exists(info.pid), "killed and reaped");
    assert!(!socket.exists(), "socket file removed");
    assert!(d.workers().is_empty());
    d.close().await;
}

#[tokio::test]
async fn udf_s074_dispatcher_close_terminates_the_worker_of_an_open_session() {
    let d = framed_dispatcher(tether_spec(), config());
    let s = d.create_session().await.expect("session");
    let pid = d.worker(s.worker().id()).expect("tracked").pid;
    let (mut s, _) = s.init(init("udf")).await.expect("init");
    d.close().await;
    assert!(
        !exists(pid),
        "terminated and reaped while its session was open"
    );
    // The open session now fails on the transport and leaves the worker invalid.
    let _ = s.send(Bytes::from_static(b"late")).await;
    let t = s.close().await;
    assert_ne!(t.kind(), TerminationKind::Finished);
}

#[tokio::test]
async fn udf_s075_user_error_surfaces_with_its_class() {
    let d = framed_dispatcher(tether_spec(), config());
    let (mut s, _) = d
        .create_session()
        .await
        .unwrap()
        .init(init("udf"))
        .await
        .unwrap();
    s.send(Bytes::from_static(b"ERROR")).await.expect("send");
    let err = recv_error(&mut s, "the session ended without the user error").await;
    let exec = err.execution_error().expect("worker-reported error");
    assert_eq!(exec.error_class(), Some(USER_ERROR_CLASS));
    let handle = s.worker().clone();
    assert_eq!(s.close().await.kind(), TerminationKind::Cancelled);
    assert!(!handle.is_invalid(), "a user error is not a worker fault");
    d.close().await;
}

#[tokio::test]
async fn udf_s076_init_error_surfaces_as_worker_error() {
    let d = framed_dispatcher(tether_spec(), config());
    let s = d.create_session().await.unwrap();
    let failed = s.init(init("INIT_ERROR")).await.expect_err("init fails");
    let exec = failed
        .error
        .execution_error()
        .expect("worker-reported error");
    assert!(exec.to_string().contains(INIT_FAILURE), "{exec}");
    assert_eq!(
        failed.session.close().await.kind(),
        TerminationKind::Cancelled
    );
    d.close().await;
}

#[tokio::test]
async fn udf_s077_close_after_init_is_cancelled_quickly() {
    let d = framed_dispatcher(tether_spec(), config());
    let (s, _) = d
        .create_session()
        .await
        .unwrap()
        .init(init("udf"))
        .await
        .unwrap();
    let start = Instant::now();
    assert_eq!(s.close().await.kind(), TerminationKind::Cancelled);
    assert!(start.elapsed() < Duration::from_secs(10));
    d.close().await;
}

#[tokio::test]
async fn udf_s078_close_before_init_terminates_the_worker() {
    let d = framed_dispatcher(tether_spec(), config());
    let s = d.create_session().await.unwrap();
    let pid = d.worker(s.worker().id()).unwrap().pid;
    assert_eq!(s.close().await.kind(), TerminationKind::Cancelled);
    d.settle().await;
    assert!(!exists(pid));
    d.close().await;
}

#[test]
fn udf_s079_capabilities_without_bidirectional_streaming_are_rejected() {
    let mut spec = tether_spec();
    spec.capabilities
        .as_mut()
        .unwrap()
        .supported_communication_patterns
        .clear();
    assert!(spec_error(&spec).contains("BIDIRECTIONAL_STREAMING"));
}

#[test]
fn udf_s080_s094_s099_missing_capabilities_are_rejected() {
    let mut spec = tether_spec();
    spec.capabilities = None;
    let msg = spec_error(&spec);
    assert!(msg.contains("BIDIRECTIONAL_STREAMING"), "{msg}");
    assert!(msg.contains("requires WorkerCapabilities"), "{msg}");
    assert!(
        msg.contains("supported_data_formats must contain at least ARROW"),
        "{msg}"
    );
}

#[tokio::test]
async fn udf_s081_socket_directory_is_removed_after_session_and_dispatcher_close() {
    let d = framed_dispatcher(tether_spec(), config());
    let dir = d.socket_dir().to_path_buf();
    let (out, _) = echo_round(d.create_session().await.unwrap(), &[b"x"]).await;
    assert_eq!(out.len(), 1);
    assert!(dir.is_dir());
    d.close().await;
    assert!(!dir.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s082_concurrent_sessions_run_on_distinct_workers() {
    let d = Arc::new(framed_dispatcher(tether_spec(), config()));
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let d = d.clone();
            tokio::spawn(async move {
                let s = d.create_session().await.expect("session");
                let pid = d.worker(s.worker().id()).unwrap().pid;
                let msg = format!("batch-{i}");
                let (out, t) = echo_round(s, &[msg.as_bytes()]).await;
                assert_eq!(out, vec![Bytes::from(msg)]);
                assert_eq!(t, TerminationKind::Finished);
                pid
            })
        })
        .collect();
    let mut pids = Vec::new();
    for t in tasks {
        pids.push(t.await.unwrap());
    }
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 4, "one worker per concurrent session");
    d.close().await;
    assert!(pids.iter().all(|p| !exists(*p)));
}

/// Kills the worker of an open streaming session with SIGKILL and returns the error the
/// session then reports, with the worker's pid.
async fn kill_mid_stream<C>(
    d: &Dispatcher<impl WorkerTransport<Connection = C>>,
    session: tether::worker::engine::Session<tether::worker::state::Init, C>,
) -> (
    SessionError,
    WorkerInfo,
    tether::worker::engine::Termination,
    Arc<dyn WorkerHandle>,
)
where
    C: tether::connection::Connection<UdfRequest, UdfResponse> + Send + Unpin + 'static,
{
    let Ok((mut s, _)) = session.init(init("udf")).await else {
        panic!("init failed");
    };
    let info = d.worker(s.worker().id()).unwrap();
    s.send(Bytes::from_static(b"first")).await.unwrap();
    assert_eq!(s.recv().await.unwrap(), Some(Bytes::from_static(b"first")));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(info.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let err = loop {
        let _ = s.send(Bytes::from_static(b"more")).await;
        match s.recv().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a killed worker cannot finish"),
            Err(e) => break e,
        }
    };
    let handle = s.worker().clone();
    let termination = s.close().await;
    (err, info, termination, handle)
}

/// The texts of a session error for a worker killed with SIGKILL: what the session, the
/// connection and the dispatcher say, then the transport's own errors (returned whole).
fn killed_chain(error: &SessionError, pid: u32) -> Vec<String> {
    let texts = error_chain(error);
    assert_eq!(
        texts[..2],
        ["UDF worker stream failed", "transport error"],
        "{texts:?}"
    );
    // Then the worker's last output (its start-up line here).
    let lost = format!("the worker connection was lost (worker pid {pid} exited: SIGKILL); output");
    assert!(texts[2].starts_with(&lost), "{texts:?}");
    texts
}

/// Reads a streaming session's output until it fails: the error (output before it is
/// dropped); panics with `ended` if the session ends without one.
pub(crate) async fn recv_error<C>(
    s: &mut tether::worker::engine::Session<tether::worker::state::Streaming, C>,
    ended: &str,
) -> SessionError
where
    C: tether::connection::Connection<UdfRequest, UdfResponse> + Send + Unpin + 'static,
{
    loop {
        match s.recv().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("{ended}"),
            Err(e) => return e,
        }
    }
}

/// The [`WorkerLost`] inside a session's transport failure.
pub(crate) fn worker_lost(error: &SessionError) -> &WorkerLost {
    std::iter::successors(Some(error as &(dyn std::error::Error + 'static)), |e| {
        e.source()
    })
    .find_map(|e| e.downcast_ref::<WorkerLost>())
    .unwrap_or_else(|| panic!("no WorkerLost in {:?}", error_chain(error)))
}

#[tokio::test]
async fn udf_s083_killed_worker_fails_the_stream_and_is_invalidated() {
    let d = framed_dispatcher(tether_spec(), config());
    let session = d.create_session().await.unwrap();
    let (err, info, termination, handle) = kill_mid_stream(&d, session).await;
    let pid = info.pid;
    assert!(matches!(err, SessionError::Transport(_)), "{err}");
    // The dispatcher names the process and how it ended; the socket's own error (a reset,
    // a broken pipe), if the loss surfaced as one rather than as the stream's end, follows.
    let texts = killed_chain(&err, pid);
    assert!(
        texts.len() == 3 || (texts.len() == 5 && texts[3] == "I/O error"),
        "only the socket error may follow: {texts:?}"
    );
    let lost = worker_lost(&err);
    assert_eq!((lost.pid, lost.exit), (pid, Some(ExitReason::Signal(9))));
    assert_eq!(termination.kind(), TerminationKind::TransportFailed);
    assert!(termination.to_string().contains(&texts[2]), "{termination}");
    assert!(handle.is_invalid());
    d.settle().await;
    assert!(!exists(pid), "reaped");
    assert!(!socket_of(&info.address).exists());
    d.close().await;
}

/// A UDF callback that panics in a worker that keeps running (udf §2 R10: the connection
/// drops without a terminator): `TransportFailed`, the worker invalidated, and the outcome
/// says the process still runs and quotes its last output, where the panic's message is.
#[tokio::test]
async fn a_panicking_udf_callback_is_quoted_in_the_outcome_from_the_worker_s_output() {
    use tether_testing::echo::{PANIC_BATCH, PANIC_MESSAGE};
    let d = framed_dispatcher(tether_spec(), config());
    let session = d.create_session().await.unwrap();
    let (mut s, _) = session.init(init("udf")).await.expect("init");
    let info = d.worker(s.worker().id()).unwrap();
    s.send(Bytes::from_static(PANIC_BATCH.as_bytes()))
        .await
        .expect("send");
    let err = recv_error(&mut s, "a panicked session cannot finish").await;
    let handle = s.worker().clone();
    let termination = s.close().await;
    assert_eq!(termination.kind(), TerminationKind::TransportFailed);
    let lost = worker_lost(&err);
    assert_eq!((lost.pid, lost.exit, lost.stopping), (info.pid, None, None));
    assert!(lost.output.contains(PANIC_MESSAGE), "{:?}", lost.output);
    let text = lost.to_string();
    assert!(
        text.starts_with(&format!(
            "the worker connection was lost (worker pid {} still running); output (last lines):",
            info.pid
        )),
        "{text}"
    );
    assert!(
        termination.to_string().contains(PANIC_MESSAGE),
        "{termination}"
    );
    assert!(
        handle.is_invalid(),
        "a worker whose UDF panicked is not reused"
    );
    d.close().await;
    assert!(!exists(info.pid), "reaped");
}

/// The same over Spark's transport: gRPC over the worker's Unix socket. The HTTP/2 layer's
/// error is the source, never a debug dump inside a message.
#[cfg(feature = "grpc")]
#[tokio::test]
async fn udf_s083_grpc_killed_worker_reads_its_exit_status() {
    use tether::spark::udf_grpc::{GrpcTransport, StatusError};
    let spec = tether_spec_with(&[("TETHER_TEST_WORKER_GRPC", "1")]);
    let d = Dispatcher::new(spec, GrpcTransport::default(), config()).expect("dispatcher");
    let session = d.create_session().await.unwrap();
    let (err, info, termination, handle) = kill_mid_stream(&d, session).await;
    let pid = info.pid;
    let texts = killed_chain(&err, pid);
    // Then the gRPC status (its code, without the message that repeats its source), then
    // hyper's and the socket's errors.
    assert!(texts[3].starts_with("gRPC status "), "{texts:?}");
    for (text, cause) in texts.iter().zip(texts.iter().skip(1)) {
        assert!(!text.contains(cause.as_str()), "{text:?} repeats {cause:?}");
        assert!(
            !text.contains("hyper::Error") && !text.contains("kind:"),
            "{texts:?}"
        );
    }
    let status = std::iter::successors(Some(&err as &(dyn std::error::Error + 'static)), |e| {
        e.source()
    })
    .find_map(|e| e.downcast_ref::<StatusError>());
    assert!(status.is_some(), "{texts:?}");
    assert_eq!(worker_lost(&err).exit, Some(ExitReason::Signal(9)));
    assert_eq!(termination.kind(), TerminationKind::TransportFailed);
    assert!(handle.is_invalid());
    d.close().await;
    assert!(!exists(pid), "reaped");
}

#[tokio::test]
async fn udf_s084_spec_bytes_to_dispatcher_to_echo() {
    use prost::Message;
    let bytes = tether_spec().encode_to_vec();
    let spec = UdfWorkerSpecification::decode(bytes.as_slice()).expect("decodes");
    let d = framed_dispatcher(spec, config());
    let (out, t) = echo_round(d.create_session().await.unwrap(), &[b"smoke"]).await;
    assert_eq!(
        (out, t),
        (
            vec![Bytes::from_static(b"smoke")],
            TerminationKind::Finished
        )
    );
    d.close().await;
}

#[tokio::test]
async fn udf_s085_clean_session_leaves_the_worker_valid() {
    let d = framed_dispatcher(tether_spec(), config());
    let s = d.create_session().await.unwrap();
    let handle = s.worker().clone();
    let (_, t) = echo_round(s, &[b"x"]).await;
    assert_eq!(t, TerminationKind::Finished);
    assert!(!handle.is_invalid());
    d.close().await;
}

#[tokio::test]
async fn udf_s087_five_mib_payload_round_trip_then_cleanup() {
    let d = framed_dispatcher(tether_spec(), config());
    let dir = d.socket_dir().to_path_buf();
    let s = d.create_session().await.unwrap();
    let info = d.worker(s.worker().id()).unwrap();
    let big: Vec<u8> = (0..5 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let (out, t) = echo_round(s, &[&big]).await;
    assert_eq!(t, TerminationKind::Finished);
    assert_eq!(out.concat(), big);
    d.settle().await;
    assert!(!exists(info.pid));
    assert!(!socket_of(&info.address).exists());
    d.close().await;
    assert!(!dir.exists());
}

/// A launcher that forwards `--id`/`--connection` to the real tether worker running as its
/// child (not `exec`), writing the child's pid to `child_pid`.
fn launcher_spec(child_pid: &str) -> UdfWorkerSpecification {
    let exe = std::env::current_exe().expect("test binary path");
    let script = r#"bash "$WORKER_SCRIPT" "$TEST_EXE" "$@" & echo $! > "$CHILD_PID"; wait"#;
    direct_worker_spec(
        callable(
            &["bash", "-c", script, "launcher"],
            &[
                ("WORKER_SCRIPT", &support("tether-worker.sh")),
                ("TEST_EXE", exe.to_str().expect("utf-8 path")),
                ("CHILD_PID", child_pid),
            ],
        ),
        false,
    )
}

fn read_pid(path: &str) -> u32 {
    std::fs::read_to_string(path)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid")
}

#[tokio::test]
async fn udf_s088_launcher_forwarding_connection_serves_and_stops_with_its_child() {
    let scratch = ScratchDir::new("dispatch");
    let d = framed_dispatcher(launcher_spec(&scratch.file("child-a")), config());
    let big: Vec<u8> = (0..5 * 1024 * 1024).map(|i| (i % 241) as u8).collect();
    let s1 = d.create_session().await.unwrap();
    let launcher = d.worker(s1.worker().id()).unwrap().pid;
    let child = read_pid(&scratch.file("child-a"));
    let (out, t) = echo_round(s1, &[&big]).await;
    assert_eq!((out.concat(), t), (big, TerminationKind::Finished));
    d.settle().await;
    assert!(!exists(launcher));
    eventually("the forwarded worker stopped", || !running(child)).await;
    // A second session gets its own launcher and child.
    let s2 = d.create_session().await.unwrap();
    let (out, _) = echo_round(s2, &[b"small"]).await;
    assert_eq!(out, vec![Bytes::from_static(b"small")]);
    d.close().await;
}

#[tokio::test]
async fn udf_s089_sigkilled_launcher_does_not_leak_its_worker() {
    let scratch = ScratchDir::new("dispatch");
    let d = framed_dispatcher(launcher_spec(&scratch.file("child")), config());
    let s = d.create_session().await.unwrap();
    let launcher = d.worker(s.worker().id()).unwrap().pid;
    let child = read_pid(&scratch.file("child"));
    assert!(running(child));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(launcher as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = s.close().await;
    d.settle().await;
    assert!(!exists(launcher), "launcher reaped");
    eventually("the inner worker stopped", || !running(child)).await;
    d.close().await;
}

#[tokio::test]
async fn udf_s091_socket_file_without_a_server_is_not_readiness() {
    let mut spec = stub_spec("ready", &[]);
    props_mut(&mut spec).initialization_timeout_ms = Some(400);
    let d = framed_dispatcher(spec, config());
    let (e, msg) = err_text(d.create_session().await);
    assert!(matches!(e, DispatchError::NotReachable { .. }), "{msg}");
    assert!(msg.contains("did not become reachable"), "{msg}");
    assert!(msg.contains("within 400ms"), "{msg}");
    assert!(
        msg.contains("stub worker"),
        "includes the worker output: {msg}"
    );
    assert!(msg.contains("socket file exists"), "{msg}");
    d.settle().await;
    assert_eq!(d.stats().spawned, 1);
    assert_eq!(d.stats().stopped, 1, "killed and reaped");
    let leftovers = worker_files(&d);
    assert!(
        leftovers.is_empty(),
        "socket file and log removed: {leftovers:?}"
    );
    d.close().await;
}

// ---------------------------------------------------------------------------------------
// udf §8.5 DirectGrpcDispatcherSuite — spec validation.

#[test]
fn udf_s092_missing_connection_is_rejected() {
    let mut spec = tether_spec();
    direct_mut(&mut spec).properties = None;
    assert!(spec_error(&spec).contains("connection must be set"));
}

#[tokio::test]
async fn udf_s093_tcp_transport_requires_opting_in() {
    let mut spec = stub_spec("ready", &[]);
    props_mut(&mut spec).connection = Some(WorkerConnectionSpec {
        transport: Some(worker_connection_spec::Transport::Tcp(
            LocalTcpConnection {},
        )),
    });
    assert!(spec_error(&spec).contains("requires UNIX domain socket transport"));
    // A transport that can reach TCP opts in: the worker gets a loopback port.
    let allow = DispatcherConfig {
        allow_tcp: true,
        ..config()
    };
    assert!(validate_spec(&spec, &allow).is_ok());
}

#[test]
fn udf_s095_only_unspecified_pattern_is_rejected() {
    let mut spec = tether_spec();
    spec.capabilities
        .as_mut()
        .unwrap()
        .supported_communication_patterns = vec![UdfProtoCommunicationPattern::Unspecified as i32];
    assert!(spec_error(&spec).contains("requires BIDIRECTIONAL_STREAMING"));
}

// ---------------------------------------------------------------------------------------
// udf §8.6 DirectWorkerDispatcherSuite — bash stub workers.

#[tokio::test]
async fn udf_s098_session_holds_a_live_worker_until_closed() {
    let d = stub_dispatcher(stub_spec("ready", &[]));
    let s = d.create_session().await.expect("session");
    let info = d.worker(s.worker().id()).expect("tracked");
    assert!(running(info.pid));
    assert_eq!(info.active_sessions, 1);
    assert!(socket_of(&info.address).exists());
    let handle = s.worker().clone();
    let _ = s.close().await;
    assert!(
        d.worker(handle.id()).is_none(),
        "released: no longer tracked"
    );
    d.settle().await;
    assert!(!exists(info.pid));
    // The ref-count is back at zero: one more release is an underflow, not a wrap.
    assert!(matches!(
        handle.release_session(),
        Err(HandleError::Underflow { .. })
    ));
    d.close().await;
}

#[test]
fn udf_s100_unspecified_format_or_pattern_is_rejected() {
    let mut spec = tether_spec();
    spec.capabilities.as_mut().unwrap().supported_data_formats = vec![
        UdfWorkerDataFormat::Unspecified as i32,
        UdfWorkerDataFormat::Arrow as i32,
    ];
    assert!(spec_error(&spec).contains("must not contain UNSPECIFIED"));
    let mut spec = tether_spec();
    spec.capabilities
        .as_mut()
        .unwrap()
        .supported_communication_patterns
        .push(UdfProtoCommunicationPattern::Unspecified as i32);
    assert!(spec_error(&spec).contains("must not contain UNSPECIFIED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s101_concurrent_sessions_get_distinct_workers_and_sockets() {
    let d = Arc::new(stub_dispatcher(stub_spec("ready", &[])));
    let sessions = futures::future::join_all((0..8).map(|_| d.create_session())).await;
    let sessions: Vec<_> = sessions.into_iter().map(|s| s.expect("session")).collect();
    let infos = d.workers();
    assert_eq!(infos.len(), 8);
    let mut sockets: Vec<_> = infos.iter().map(|i| socket_of(&i.address)).collect();
    sockets.sort();
    sockets.dedup();
    assert_eq!(sockets.len(), 8);
    assert!(
        infos
            .iter()
            .all(|i| i.active_sessions == 1 && running(i.pid))
    );
    for s in sessions {
        let _ = s.close().await;
    }
    d.close().await;
    assert!(infos.iter().all(|i| !exists(i.pid)));
}

#[tokio::test]
async fn udf_s102_closing_sessions_and_dispatcher_terminates_every_worker() {
    let d = stub_dispatcher(stub_spec("ready", &[]));
    let a = d.create_session().await.unwrap();
    let b = d.create_session().await.unwrap();
    let pids: Vec<u32> = d.workers().iter().map(|i| i.pid).collect();
    assert_eq!(pids.len(), 2);
    let _ = a.close().await;
    let _ = b.close().await;
    d.close().await;
    assert!(pids.iter().all(|p| !exists(*p)), "SIGTERM'd and reaped");
    assert_eq!(d.stats().stopped, 2);
}

#[tokio::test]
async fn udf_s103_worker_ignoring_sigterm_is_killed_after_the_grace_period() {
    let mut spec = stub_spec("ignore-term", &[]);
    props_mut(&mut spec).graceful_termination_timeout_ms = Some(500);
    let d = stub_dispatcher(spec);
    assert_eq!(d.graceful_timeout(), Duration::from_millis(500));
    let s = d.create_session().await.unwrap();
    let pid = d.worker(s.worker().id()).unwrap().pid;
    let start = Instant::now();
    d.close().await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(500),
        "waited the grace period: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "then SIGKILL: {took:?}");
    assert!(!exists(pid));
    drop(s);
}

#[tokio::test]
async fn udf_s104_session_close_stops_the_worker_and_removes_the_socket() {
    let d = stub_dispatcher(stub_spec("ready", &[]));
    let s = d.create_session().await.unwrap();
    let info = d.worker(s.worker().id()).unwrap();
    let _ = s.close().await;
    // release_session never blocks: the stop runs in the background; settle() awaits it.
    d.settle().await;
    assert!(!exists(info.pid));
    assert!(!socket_of(&info.address).exists());
    assert!(!info.log_path.exists(), "output log deleted");
    d.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s105_session_closes_racing_dispatcher_close() {
    let d = Arc::new(stub_dispatcher(stub_spec("ready", &[])));
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(d.create_session().await.unwrap());
    }
    let pids: Vec<u32> = d.workers().iter().map(|i| i.pid).collect();
    let closes: Vec<_> = sessions
        .into_iter()
        .map(|s| tokio::spawn(async move { s.close().await.kind() }))
        .collect();
    let d2 = d.clone();
    let closer = tokio::spawn(async move { d2.close().await });
    for c in closes {
        c.await.expect("no panic");
    }
    closer.await.expect("no panic");
    d.close().await;
    assert!(pids.iter().all(|p| !exists(*p)));
    assert_eq!(d.stats().stopped, 4, "each worker stopped exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s106_close_while_create_session_is_constructing_the_session() {
    let opening = Arc::new(Notify::new());
    let permits = Arc::new(Semaphore::new(0));
    let transport = FileTransport {
        gate: Some((opening.clone(), permits.clone())),
        ..FileTransport::default()
    };
    let d = Arc::new(Dispatcher::new(stub_spec("ready", &[]), transport, config()).unwrap());
    let d2 = d.clone();
    let create = tokio::spawn(async move { d2.create_session().await });
    opening.notified().await;
    let pid = d.workers()[0].pid;
    let dir = d.socket_dir().to_path_buf();
    let d3 = d.clone();
    let closer = tokio::spawn(async move { d3.close().await });
    eventually("the worker was stopped by close", || !exists(pid)).await;
    permits.add_permits(1);
    match create.await.unwrap() {
        Err(DispatchError::Closed) => {}
        Err(e) => panic!("unexpected error: {e}"),
        // A session whose worker is already torn down.
        Ok(s) => {
            assert!(d.worker(s.worker().id()).is_none());
            let _ = s.close().await;
        }
    }
    closer.await.unwrap();
    assert_eq!(d.stats().spawned, 1, "exactly one worker spawned");
    assert!(!exists(pid));
    assert!(!dir.exists(), "no socket left");
}

#[tokio::test]
async fn udf_s107_graceful_timeout_is_clamped_to_30s() {
    let mut spec = stub_spec("ready", &[]);
    props_mut(&mut spec).graceful_termination_timeout_ms = Some(60_000);
    let d = Dispatcher::new(spec, FileTransport::default(), DispatcherConfig::default()).unwrap();
    assert_eq!(d.graceful_timeout(), Duration::from_secs(30));
    d.close().await;
}

#[tokio::test]
async fn udf_s108_init_timeout_is_clamped_to_30s() {
    let mut spec = stub_spec("ready", &[]);
    props_mut(&mut spec).initialization_timeout_ms = Some(60_000);
    let d = Dispatcher::new(spec, FileTransport::default(), DispatcherConfig::default()).unwrap();
    assert_eq!(d.init_timeout(), Duration::from_secs(30));
    // Unset: the engine defaults (10 s readiness, 5 s grace).
    let d2 = Dispatcher::new(
        stub_spec("ready", &[]),
        FileTransport::default(),
        DispatcherConfig::default(),
    )
    .unwrap();
    assert_eq!(d2.init_timeout(), Duration::from_secs(10));
    assert_eq!(d2.graceful_timeout(), Duration::from_secs(5));
    d.close().await;
    d2.close().await;
}

#[tokio::test]
async fn udf_s109_create_session_after_close_fails_mentioning_closed() {
    let d = stub_dispatcher(stub_spec("ready", &[]));
    d.close().await;
    d.close().await; // idempotent
    let (e, msg) = err_text(d.create_session().await);
    assert!(matches!(e, DispatchError::Closed));
    assert!(msg.contains("closed"), "{msg}");
    assert_eq!(d.stats().spawned, 0);
}

#[tokio::test]
async fn udf_s110_socket_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let d = stub_dispatcher(stub_spec("ready", &[]));
    let mode = std::fs::metadata(d.socket_dir())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "rwx------");
    let s = d.create_session().await.unwrap();
    let socket = socket_of(&d.worker(s.worker().id()).unwrap().address);
    assert_eq!(socket.parent(), Some(d.socket_dir()));
    let leaf = socket.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        leaf.len() == "w-0123456789abcdef.sock".len()
            && leaf.starts_with("w-")
            && leaf.ends_with(".sock"),
        "{leaf}"
    );
    let _ = s.close().await;
    d.close().await;
}

#[tokio::test]
async fn udf_s111_socket_directory_is_removed_on_close() {
    let d = stub_dispatcher(stub_spec("ready", &[]));
    let dir = d.socket_dir().to_path_buf();
    let _s = d.create_session().await.unwrap();
    d.close().await;
    assert!(!dir.exists());
}

#[tokio::test]
async fn udf_s112_failed_session_construction_stops_the_worker() {
    let transport = FileTransport::default();
    transport.fail_open.store(true, Ordering::SeqCst);
    let d = Dispatcher::new(stub_spec("ready", &[]), transport, config()).unwrap();
    let (e, msg) = err_text(d.create_session().await);
    match &e {
        // The transport's error is the source, not part of the message.
        DispatchError::OpenSession { source, .. } => {
            assert_eq!(source.to_string(), "session construction failed");
            assert!(!msg.contains("session construction failed"), "{msg}");
        }
        other => panic!("expected OpenSession, got {other}"),
    }
    d.settle().await;
    assert!(
        d.workers().is_empty(),
        "ref-count back to zero, worker untracked"
    );
    assert_eq!((d.stats().spawned, d.stats().stopped), (1, 1));
    let leftovers = worker_files(&d);
    assert!(leftovers.is_empty(), "{leftovers:?}");
    d.close().await;
}

#[test]
fn udf_s113_direct_worker_without_connection_is_rejected() {
    let mut spec = tether_spec();
    props_mut(&mut spec).connection = None;
    assert!(spec_error(&spec).contains("connection must be set"));
    props_mut(&mut spec).connection = Some(WorkerConnectionSpec { transport: None });
    assert!(spec_error(&spec).contains("connection must be set"));
}

#[test]
fn udf_s114_non_uds_transport_is_rejected() {
    let mut spec = tether_spec();
    props_mut(&mut spec).connection = Some(WorkerConnectionSpec {
        transport: Some(worker_connection_spec::Transport::Tcp(
            LocalTcpConnection {},
        )),
    });
    let msg = spec_error(&spec);
    assert!(msg.contains("UNIX domain socket"), "{msg}");
}

#[tokio::test]
async fn udf_s115_failing_connection_creation_cleans_up_the_socket_file() {
    let mut spec = stub_spec("ready", &[]);
    props_mut(&mut spec).initialization_timeout_ms = Some(300);
    let transport = FileTransport::default();
    transport.refuse_connect.store(true, Ordering::SeqCst);
    let d = Dispatcher::new(spec, transport, config()).unwrap();
    let (e, msg) = err_text(d.create_session().await);
    assert!(matches!(e, DispatchError::NotReachable { .. }), "{msg}");
    assert!(
        msg.contains("refused by the test"),
        "last error reported: {msg}"
    );
    let leftovers = worker_files(&d);
    assert!(leftovers.is_empty(), "socket file removed: {leftovers:?}");
    d.close().await;
}

#[test]
fn udf_s116_empty_runner_command_is_rejected() {
    let spec = direct_worker_spec(callable(&[], &[]), false);
    assert!(spec_error(&spec).contains("at least one entry"));
    assert_eq!(
        validate_spec(&spec, &DispatcherConfig::default()),
        Err(SpecError::EmptyCommand { callable: "runner" })
    );
}

#[tokio::test]
async fn udf_s117_worker_exiting_at_start_reports_code_and_output() {
    let d = stub_dispatcher(stub_spec("exit", &[]));
    let start = Instant::now();
    let (e, msg) = err_text(d.create_session().await);
    assert!(
        matches!(
            e,
            DispatchError::ExitedAtStart {
                reason: ExitReason::Code(42),
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("exited with code 42"), "{msg}");
    assert!(msg.contains("fatal: bad config"), "{msg}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "fails fast, not at the deadline"
    );
    d.close().await;
}

#[tokio::test]
async fn udf_s118_worker_that_never_creates_its_socket_times_out() {
    let mut spec = stub_spec("silent", &[]);
    props_mut(&mut spec).initialization_timeout_ms = Some(500);
    let d = stub_dispatcher(spec);
    let start = Instant::now();
    let (e, msg) = err_text(d.create_session().await);
    let took = start.elapsed();
    assert!(matches!(e, DispatchError::NotReachable { .. }), "{msg}");
    assert!(msg.contains("500ms"), "{msg}");
    assert!(msg.contains("never created its socket file"), "{msg}");
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(
        d.stats().stopped,
        1,
        "killed and reaped before the error returned"
    );
    d.close().await;
}

/// A spec whose environment callables append to marker files in `scratch`.
fn env_spec(
    scratch: &ScratchDir,
    verification: Option<&str>,
    installation: Option<&str>,
    cleanup: Option<&str>,
) -> UdfWorkerSpecification {
    let mut spec = stub_spec("ready", &[]);
    let vars = [
        ("VERIFY_MARK", scratch.file("verify")),
        ("INSTALL_MARK", scratch.file("install")),
        ("CLEANUP_MARK", scratch.file("cleanup")),
    ];
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let env = env_mut(&mut spec);
    env.environment_verification = verification.map(|s| sh(s, &vars));
    env.installation = installation.map(|s| sh(s, &vars));
    env.environment_cleanup = cleanup.map(|s| sh(s, &vars));
    spec
}

const INSTALL_OK: &str = r#"echo run >> "$INSTALL_MARK""#;

#[tokio::test]
async fn udf_s119_passing_verification_skips_installation() {
    let scratch = ScratchDir::new("dispatch");
    let d = stub_dispatcher(env_spec(
        &scratch,
        Some(r#"echo run >> "$VERIFY_MARK"; exit 0"#),
        Some(INSTALL_OK),
        None,
    ));
    let _ = d.create_session().await.unwrap().close().await;
    assert_eq!(lines(&scratch.file("verify")), 1);
    assert_eq!(lines(&scratch.file("install")), 0);
    assert!(matches!(d.environment(), EnvironmentState::Ready));
    d.close().await;
}

#[tokio::test]
async fn udf_s120_failing_verification_runs_installation() {
    let scratch = ScratchDir::new("dispatch");
    let d = stub_dispatcher(env_spec(
        &scratch,
        Some(r#"echo run >> "$VERIFY_MARK"; exit 1"#),
        Some(INSTALL_OK),
        None,
    ));
    let _ = d.create_session().await.unwrap().close().await;
    assert_eq!(lines(&scratch.file("verify")), 1);
    assert_eq!(lines(&scratch.file("install")), 1);
    d.close().await;
}

#[tokio::test]
async fn udf_s121_without_verification_installation_runs() {
    let scratch = ScratchDir::new("dispatch");
    let d = stub_dispatcher(env_spec(&scratch, None, Some(INSTALL_OK), None));
    let _ = d.create_session().await.unwrap().close().await;
    assert_eq!(lines(&scratch.file("install")), 1);
    d.close().await;
}

#[tokio::test]
async fn udf_s122_failing_installation_reports_exit_code_and_output() {
    let scratch = ScratchDir::new("dispatch");
    let d = stub_dispatcher(env_spec(
        &scratch,
        None,
        Some(r#"echo "pip: no matching distribution" >&2; exit 7"#),
        None,
    ));
    let (e, msg) = err_text(d.create_session().await);
    assert!(
        matches!(
            e,
            DispatchError::Environment(EnvironmentError::Failed {
                reason: ExitReason::Code(7),
                ..
            })
        ),
        "{msg}"
    );
    assert!(msg.contains("exit code 7"), "{msg}");
    assert!(msg.contains("pip: no matching distribution"), "{msg}");
    assert_eq!(d.stats().spawned, 0, "no worker without an environment");
    d.close().await;
}

#[tokio::test]
async fn udf_s123_installation_past_the_callable_timeout_is_killed() {
    let scratch = ScratchDir::new("dispatch");
    let spec = env_spec(&scratch, None, Some(r#"echo started; sleep 30"#), None);
    let cfg = DispatcherConfig {
        callable_timeout: Duration::from_millis(500),
        ..config()
    };
    let d = Dispatcher::new(spec, FileTransport::default(), cfg).unwrap();
    let start = Instant::now();
    let (e, msg) = err_text(d.create_session().await);
    assert!(
        matches!(
            e,
            DispatchError::Environment(EnvironmentError::TimedOut { .. })
        ),
        "{msg}"
    );
    assert!(msg.contains("callable timed out"), "{msg}");
    assert!(msg.contains("500ms"), "{msg}");
    assert!(msg.contains("started"), "output tail: {msg}");
    assert!(start.elapsed() < Duration::from_secs(5));
    d.close().await;
}

#[tokio::test]
async fn udf_s124_sequential_sessions_install_once() {
    let scratch = ScratchDir::new("dispatch");
    let d = stub_dispatcher(env_spec(&scratch, None, Some(INSTALL_OK), None));
    for _ in 0..2 {
        let _ = d.create_session().await.unwrap().close().await;
    }
    assert_eq!(lines(&scratch.file("install")), 1);
    d.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_s125_concurrent_first_sessions_install_once() {
    let scratch = ScratchDir::new("dispatch");
    let d = stub_dispatcher(env_spec(
        &scratch,
        None,
        Some(r#"echo run >> "$INSTALL_MARK"; sleep 0.5"#),
        None,
    ));
    let sessions = futures::future::join_all((0..4).map(|_| d.create_session())).await;
    assert_eq!(lines(&scratch.file("install")), 1);
    for s in sessions {
        let _ = s
            .expect("session after the shared installation")
            .close()
            .await;
    }
    d.close().await;
}

#[tokio::test]
async fn udf_s126_failed_installation_is_permanent() {
    let scratch = ScratchDir::new("dispatch");
    let d = stub_dispatcher(env_spec(
        &scratch,
        None,
        Some(r#"echo run >> "$INSTALL_MARK"; exit 3"#),
        None,
    ));
    let (e1, m1) = err_text(d.create_session().await);
    assert!(matches!(e1, DispatchError::Environment(_)), "{m1}");
    assert!(m1.contains("installation failed"), "{m1}");
    let (e2, m2) = err_text(d.create_session().await);
    assert!(
        matches!(e2, DispatchError::EnvironmentPreviouslyFailed(_)),
        "{m2}"
    );
    assert!(m2.contains("previously failed"), "{m2}");
    assert_eq!(lines(&scratch.file("install")), 1);
    assert!(matches!(d.environment(), EnvironmentState::Failed(_)));
    d.close().await;
}

#[tokio::test]
async fn udf_s127_installation_timeout_is_permanent() {
    let scratch = ScratchDir::new("dispatch");
    let spec = env_spec(
        &scratch,
        None,
        Some(r#"echo run >> "$INSTALL_MARK"; sleep 30"#),
        None,
    );
    let cfg = DispatcherConfig {
        callable_timeout: Duration::from_millis(300),
        ..config()
    };
    let d = Dispatcher::new(spec, FileTransport::default(), cfg).unwrap();
    let (e1, m1) = err_text(d.create_session().await);
    assert!(
        matches!(
            e1,
            DispatchError::Environment(EnvironmentError::TimedOut { .. })
        ),
        "{m1}"
    );
    let (_, m2) = err_text(d.create_session().await);
    assert!(m2.contains("previously failed"), "{m2}");
    assert_eq!(lines(&scratch.file("install")), 1);
    d.close().await;
}

#[tokio::test]
async fn udf_s128_security_scope_is_not_supported_yet() {
    let d = stub_dispatcher(stub_spec("ready", &[]));
    let scope = SecurityScope("tenant-a".into());
    let (e, msg) = err_text(d.create_session_in(Some(&scope)).await);
    assert!(matches!(e, DispatchError::SecurityScopeNotSupported));
    assert!(msg.contains("not supported yet"), "{msg}");
    assert_eq!(d.stats().spawned, 0);
    d.close().await;
}

#[test]
fn udf_s129_verification_requires_installation() {
    let scratch = ScratchDir::new("dispatch");
    let spec = env_spec(&scratch, Some("exit 0"), None, None);
    assert!(spec_error(&spec).contains("installation"));
}

#[tokio::test]
async fn udf_s130_cleanup_runs_once_on_dispatcher_close_only() {
    let scratch = ScratchDir::new("dispatch");
    let d = stub_dispatcher(env_spec(
        &scratch,
        None,
        Some(INSTALL_OK),
        Some(r#"echo run >> "$CLEANUP_MARK""#),
    ));
    let _ = d.create_session().await.unwrap().close().await;
    d.settle().await;
    assert_eq!(lines(&scratch.file("cleanup")), 0, "not on session close");
    d.close().await;
    assert_eq!(lines(&scratch.file("cleanup")), 1);
    d.close().await;
    assert_eq!(lines(&scratch.file("cleanup")), 1, "once");
    assert!(matches!(d.environment(), EnvironmentState::CleanedUp));
}

// ---------------------------------------------------------------------------------------
// Spawning details (udf §1.9 ProcessCallable, §6.2 step 4).

#[tokio::test]
async fn udf_spawn_appends_id_and_connection_and_passes_runner_env() {
    let scratch = ScratchDir::new("dispatch");
    let args_file = scratch.file("args");
    let mut spec = stub_spec("ready", &[("STUB_ARGS", &args_file)]);
    direct_mut(&mut spec).runner.as_mut().unwrap().arguments = vec!["--flag".into(), "v".into()];
    let d = stub_dispatcher(spec);
    let s = d.create_session().await.unwrap();
    let info = d.worker(s.worker().id()).unwrap();
    let args: Vec<String> = std::fs::read_to_string(&args_file)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let socket = socket_of(&info.address);
    assert_eq!(
        args,
        vec![
            "--flag".to_string(),
            "v".into(),
            "--id".into(),
            s.worker().id().to_string(),
            "--connection".into(),
            socket.to_str().unwrap().into(),
        ],
        "command ++ arguments ++ [--id, uuid, --connection, path]; STUB_ARGS came from the runner env"
    );
    assert!(uuid::Uuid::parse_str(s.worker().id()).is_ok());
    let _ = s.close().await;
    d.close().await;
}

#[test]
fn udf_spawn_rejects_reserved_runner_arguments() {
    let mut spec = stub_spec("ready", &[]);
    direct_mut(&mut spec).runner.as_mut().unwrap().arguments = vec!["--connection".into()];
    assert!(spec_error(&spec).contains("--connection"));
}

#[tokio::test]
async fn udf_stop_reaches_children_that_ignore_sigterm() {
    let scratch = ScratchDir::new("dispatch");
    let child_pid_file = scratch.file("child");
    let d = stub_dispatcher(stub_spec("child", &[("STUB_CHILD_PID", &child_pid_file)]));
    let s = d.create_session().await.unwrap();
    let pid = d.worker(s.worker().id()).unwrap().pid;
    let child: u32 = std::fs::read_to_string(&child_pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(running(child));
    let _ = s.close().await;
    d.settle().await;
    assert!(!exists(pid));
    // The orphaned child is reaped by init; it must at least not run any more.
    eventually("the worker's child is gone", || !running(child)).await;
    d.close().await;
}

#[tokio::test]
async fn udf_socket_path_over_the_limit_is_an_error() {
    let scratch = ScratchDir::new("dispatch");
    let deep = scratch.path().join("d".repeat(90));
    std::fs::create_dir_all(&deep).unwrap();
    let cfg = DispatcherConfig {
        socket_base_dir: Some(deep),
        ..config()
    };
    // Refused when the dispatcher is built, before any worker is started (udf §6.4).
    let e = Dispatcher::new(stub_spec("ready", &[]), FileTransport::default(), cfg)
        .expect_err("no socket path fits");
    assert!(matches!(e, DispatchError::SocketPathTooLong { .. }), "{e}");
    assert!(
        std::fs::read_dir(scratch.path().join("d".repeat(90)))
            .unwrap()
            .next()
            .is_none(),
        "no directory made"
    );
}

#[tokio::test]
async fn udf_dropping_the_dispatcher_stops_workers_and_removes_the_directory() {
    let d = stub_dispatcher(stub_spec("ready", &[]));
    let s = d.create_session().await.unwrap();
    let pid = d.worker(s.worker().id()).unwrap().pid;
    let dir = d.socket_dir().to_path_buf();
    drop(d);
    eventually("the worker is reaped", || !exists(pid)).await;
    eventually("the directory is removed", || !dir.exists()).await;
    let _ = s.close().await;
}

#[tokio::test]
async fn udf_tcp_endpoint_when_allowed() {
    let mut spec = tether_spec();
    props_mut(&mut spec).connection = Some(WorkerConnectionSpec {
        transport: Some(worker_connection_spec::Transport::Tcp(
            LocalTcpConnection {},
        )),
    });
    let cfg = DispatcherConfig {
        allow_tcp: true,
        ..config()
    };
    let d = framed_dispatcher(spec, cfg);
    let s = d.create_session().await.expect("session over loopback TCP");
    let info = d.worker(s.worker().id()).unwrap();
    assert!(matches!(info.address, WorkerAddress::Tcp(a) if a.ip().is_loopback()));
    let (out, t) = echo_round(s, &[b"tcp"]).await;
    assert_eq!(
        (out, t),
        (vec![Bytes::from_static(b"tcp")], TerminationKind::Finished)
    );
    d.close().await;
    assert!(!exists(info.pid));
}

// ---------------------------------------------------------------------------------------
// Reuse pool (beyond Spark; udf §6.6 rules).

#[tokio::test]
async fn udf_pool_reuses_a_healthy_worker_for_the_next_session() {
    let d = framed_dispatcher(reusable(tether_spec()), pooled());
    assert!(d.reuses_workers());
    let s1 = d.create_session().await.unwrap();
    let id = s1.worker().id().to_string();
    let pid = d.worker(&id).unwrap().pid;
    assert_eq!(echo_round(s1, &[b"one"]).await.1, TerminationKind::Finished);
    let idle = d.worker(&id).expect("kept idle");
    assert!(idle.idle && idle.active_sessions == 0 && running(pid));
    let s2 = d.create_session().await.unwrap();
    assert_eq!(s2.worker().id(), id, "same worker");
    assert_eq!(
        echo_round(s2, &[b"two"]).await.0,
        vec![Bytes::from_static(b"two")]
    );
    let stats = d.stats();
    assert_eq!((stats.spawned, stats.reused), (1, 1));
    assert_eq!(d.worker(&id).unwrap().sessions_served, 2);
    d.close().await;
    assert!(!exists(pid));
}

#[tokio::test]
async fn udf_pool_never_reuses_an_invalidated_worker() {
    let d = stub_dispatcher_with(reusable(stub_spec("ready", &[])), pooled());
    let s = d.create_session().await.unwrap();
    let pid = d.worker(s.worker().id()).unwrap().pid;
    s.worker().mark_invalid();
    let _ = s.close().await;
    d.settle().await;
    assert!(!exists(pid), "invalid: stopped, not pooled");
    let s2 = d.create_session().await.unwrap();
    assert_ne!(d.worker(s2.worker().id()).unwrap().pid, pid);
    assert_eq!(d.stats().reused, 0);
    let _ = s2.close().await;
    d.close().await;
}

#[tokio::test]
async fn udf_pool_skips_dead_or_inactive_idle_workers() {
    let d = stub_dispatcher_with(reusable(stub_spec("ready", &[])), pooled());
    let a = d.create_session().await.unwrap();
    let b = d.create_session().await.unwrap();
    let (pa, pb) = (
        d.worker(a.worker().id()).unwrap().pid,
        d.worker(b.worker().id()).unwrap().pid,
    );
    let _ = a.close().await;
    let _ = b.close().await;
    assert_eq!(d.workers().iter().filter(|w| w.idle).count(), 2);
    // One idle worker dies behind the dispatcher's back.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pb as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually("the killed worker exited", || !running(pb)).await;
    let s = d.create_session().await.unwrap();
    assert_eq!(
        d.worker(s.worker().id()).unwrap().pid,
        pa,
        "the live one is reused"
    );
    let _ = s.close().await;
    // An inactive transport channel disqualifies too.
    d.transport().inactive.store(true, Ordering::SeqCst);
    let s = d.create_session().await.unwrap();
    let fresh = d.worker(s.worker().id()).unwrap().pid;
    assert!(fresh != pa && fresh != pb);
    let _ = s.close().await;
    d.close().await;
    assert!(![pa, pb, fresh].iter().any(|p| exists(*p)));
}

#[tokio::test]
async fn udf_pool_keeps_at_most_max_idle_workers() {
    let cfg = DispatcherConfig {
        pool: Some(PoolConfig {
            max_idle: 1,
            ..PoolConfig::default()
        }),
        ..config()
    };
    let d = stub_dispatcher_with(reusable(stub_spec("ready", &[])), cfg);
    let a = d.create_session().await.unwrap();
    let b = d.create_session().await.unwrap();
    let _ = a.close().await;
    let _ = b.close().await;
    d.settle().await;
    assert_eq!(d.workers().len(), 1);
    assert!(d.workers()[0].idle);
    assert_eq!(d.stats().stopped, 1);
    d.close().await;
}

#[tokio::test]
async fn udf_pool_stops_workers_idle_past_the_timeout() {
    let cfg = DispatcherConfig {
        pool: Some(PoolConfig {
            max_idle: 4,
            idle_timeout: Duration::from_millis(200),
        }),
        ..config()
    };
    let d = stub_dispatcher_with(reusable(stub_spec("ready", &[])), cfg);
    let s = d.create_session().await.unwrap();
    let pid = d.worker(s.worker().id()).unwrap().pid;
    let _ = s.close().await;
    assert!(d.workers()[0].idle);
    eventually("the idle worker is stopped", || d.workers().is_empty()).await;
    d.settle().await;
    assert!(!exists(pid));
    d.close().await;
}

#[tokio::test]
async fn udf_pool_requires_the_spec_to_declare_reuse() {
    let d = stub_dispatcher_with(stub_spec("ready", &[]), pooled());
    assert!(!d.reuses_workers());
    let s = d.create_session().await.unwrap();
    let pid = d.worker(s.worker().id()).unwrap().pid;
    let _ = s.close().await;
    d.settle().await;
    assert!(
        !exists(pid),
        "supports_reuse unset: terminated after the invocation"
    );
    d.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udf_pool_acquire_and_release_race_keeps_counts_balanced() {
    let d = Arc::new(stub_dispatcher_with(
        reusable(stub_spec("ready", &[])),
        pooled(),
    ));
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let d = d.clone();
            tokio::spawn(async move {
                for _ in 0..5 {
                    let s = d.create_session().await.expect("session");
                    let _ = s.close().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let infos = d.workers();
    assert!(
        infos.iter().all(|i| i.idle && i.active_sessions == 0),
        "{infos:?}"
    );
    assert!(infos.len() <= 4);
    let stats = d.stats();
    assert_eq!(
        stats.spawned + stats.reused,
        30,
        "every session acquired exactly one worker"
    );
    assert!(stats.reused > 0);
    let pids: Vec<u32> = infos.iter().map(|i| i.pid).collect();
    d.close().await;
    assert!(pids.iter().all(|p| !exists(*p)));
    assert_eq!(d.stats().stopped, d.stats().spawned);
}

fn stub_dispatcher_with(
    spec: UdfWorkerSpecification,
    config: DispatcherConfig,
) -> Dispatcher<FileTransport> {
    Dispatcher::new(spec, FileTransport::default(), config).expect("dispatcher")
}
