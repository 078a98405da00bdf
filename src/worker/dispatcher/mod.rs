//! The process dispatcher, engine side: runs UDF workers as child processes from a
//! [`UdfWorkerSpecification`] and opens one engine [`Session`] per UDF execution on them
//! (udf §3, udf §6). Feature `tokio`.
//!
//! ```text
//!   Dispatcher::new(spec, transport, config)   validate (udf §6.2, §6.4), private socket dir 0700
//!        │
//!   create_session() ── closed? ── idle pooled worker healthy? ──yes──► acquire ──┐
//!        │                                   │ no                                 │
//!        │                       environment ready? (once: verify → install, udf §6.3) │
//!        │                       spawn `command ++ arguments ++ --id ID            │
//!        │                              --connection ADDR`, output → log           │
//!        │                       poll transport.connect until ready (≤ init timeout;│
//!        │                              fail fast if the process exits)            │
//!        │                       acquire, publish (or stop it if closed meanwhile) │
//!        ▼                                                                         ▼
//!   transport.open_session ──► Session<state::Init, T::Connection> holding the worker handle
//!
//!   session ends ─► handle.release_session(): last release ─► idle pool (opt-in, healthy,
//!                   `supports_reuse`) or stop: SIGTERM → grace → SIGKILL → reap → rm socket
//!   close() ─► stop every worker, wait for stops and in-flight creations, run the cleanup
//!              callable, remove the socket directory (idempotent; Drop does the same)
//! ```
//!
//! - **Generic over the transport** ([`WorkerTransport`]): the framed transport
//!   ([`FramedTransport`](crate::worker::engine::FramedTransport)), the gRPC one, or a
//!   test double. The dispatcher owns processes, sockets and the pool; the transport only
//!   says how to reach a worker (readiness probe, per-worker channel, per-session
//!   connection).
//! - **Processes** are spawned with `std::process` in their own process group (configurable,
//!   [`DispatcherConfig::process_group`]), so SIGTERM/SIGKILL reach children the worker
//!   started; stdout and stderr go to a log file in the private directory, whose last lines
//!   errors quote. Stops run on short-lived background threads, so nothing here blocks an
//!   async task and a dropped runtime cannot leave a zombie.
//! - **Reuse** is opt-in ([`DispatcherConfig::pool`]) and only for specs that declare
//!   `supports_reuse`; invalid, dead or inactive workers are never reused (udf §6.5, §6.6).
//!
//! ```no_run
//! # async fn demo(spec: tether::wire::UdfWorkerSpecification) -> Result<(), Box<dyn std::error::Error>> {
//! use tether::worker::dispatcher::{Dispatcher, DispatcherConfig};
//! use tether::worker::engine::FramedTransport;
//!
//! let dispatcher = Dispatcher::new(spec, FramedTransport::default(), DispatcherConfig::default())?;
//! let session = dispatcher.create_session().await?;
//! // session.init(...) → send/recv → finish → close: the worker is released when it closes.
//! let _ = session.close().await;
//! dispatcher.close().await;
//! # Ok(()) }
//! ```

mod environment;
mod error;
mod events;
mod monitor;
mod process;
mod shared;
mod socket;
mod validate;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::observe::EventSender;
use crate::wire::UdfWorkerSpecification;
use crate::worker::Chain;
use crate::worker::engine::Session;
use crate::worker::engine::SessionConfig;
use crate::worker::engine::WorkerHandle;
use crate::worker::engine::{WorkerAddress, WorkerTransport};
use crate::worker::state;
use crate::worker::{InvalidationReason, StopReason, WorkerEvent};

pub use environment::EnvironmentState;
pub use error::{
    CallableStage, DispatchError, EnvironmentError, ExitReason, SpecError, WorkerLost,
};
pub use process::{MAX_OUTPUT_SCAN_BYTES, OUTPUT_TAIL_LINES};
pub use socket::MAX_SOCKET_PATH_BYTES;
pub use validate::validate_spec;

use shared::{Acquired, PoolPhase, Reservation, Shared, Worker};
use validate::EndpointKind;

/// The opt-in reuse pool (beyond Spark, whose pool has size zero; udf §6.6).
///
/// A worker whose last session ended is kept idle, instead of being stopped, when the spec
/// declares `capabilities.supports_reuse = true`, the session did not leave it invalid, its
/// process is alive, its transport channel is active and fewer than
/// [`max_idle`](Self::max_idle) workers are idle. `create_session` takes the most recently
/// idled healthy worker first. While idle (with a tokio runtime), a worker is checked every
/// 250 ms as it would be before a reuse: one whose process died or whose channel went
/// inactive is invalidated (`Exited`, `Inactive`) and stopped then, not when a session
/// would have taken it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Most idle workers kept per dispatcher (default 4). Zero disables reuse. tether's own
    /// bound (udf §6.6 leaves pool capacity open).
    pub max_idle: usize,
    /// How long a worker may stay idle before it is stopped (default 60 s; the idle-timeout
    /// reaping of udf §6.6, a tether default).
    pub idle_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_idle: 4,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Engine-side settings of a [`Dispatcher`]; the defaults are Spark's (udf §7).
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// Timeouts and buffers of every session created (udf §7: 30 s init, 30 s terminal,
    /// 2 s interrupt-cancel), and the clock their deadlines and the events run on. Its
    /// `events` is not used: the dispatcher's sessions report to [`events`](Self::events).
    pub session: SessionConfig,
    /// Where the lifecycle events go (see [`observe`](crate::observe)): those of the worker
    /// processes (udf §6: spawned, ready, reused, invalidated, stopped) and of every session
    /// created (udf §4.1), on one channel so that a listener sees a worker's and its
    /// sessions' events in the order they happened; `None` (the default) sends none. The
    /// metrics of both are recorded either way.
    pub events: Option<EventSender<WorkerEvent>>,
    /// Readiness deadline when the spec sets no `initialization_timeout_ms` (or ≤ 0):
    /// 10 s (udf §7 `DEFAULT_INIT_TIMEOUT_MS`): how long a started worker process may take
    /// to answer its transport. Not [`SessionConfig::init_timeout`](crate::worker::engine::SessionConfig::init_timeout),
    /// which bounds a session's wait for its `InitResponse` (Spark names both "init").
    pub default_init_timeout: Duration,
    /// SIGTERM→SIGKILL grace when the spec sets no `graceful_termination_timeout_ms`
    /// (or ≤ 0): 5 s (udf §7 `DEFAULT_GRACEFUL_TIMEOUT_MS`).
    pub default_graceful_timeout: Duration,
    /// Cap on spec-provided timeouts; larger values are clamped with a warning: 30 s
    /// (udf §7 `ENGINE_MAX_TIMEOUT_MS`; udf §8 scenarios 107–108).
    pub max_spec_timeout: Duration,
    /// Limit for each environment callable (verification, installation, cleanup); not
    /// clamped: 120 s (udf §6.3, §7 `DEFAULT_CALLABLE_TIMEOUT_MS`).
    pub callable_timeout: Duration,
    /// Longest pause between readiness probes (`transport.connect`): 50 ms, tether's bound
    /// for Spark's `READY_POLL_INTERVAL_MS` (udf §6.4, §7; 100 ms was observed for the older
    /// `SOCKET_POLL_INTERVAL_MS`). Probing starts 1 ms apart and doubles up to this bound, so
    /// a worker that listens a few milliseconds after spawn is found at once.
    pub ready_poll_interval: Duration,
    /// Wait for the kernel to reap a worker after SIGKILL before warning: 5 s
    /// (udf §6.1, §7 `SIGKILL_REAP_TIMEOUT_MS`).
    pub kill_reap_timeout: Duration,
    /// When a session's connection to a worker is lost, how long to wait for the worker
    /// process to end so that the error can name its exit status ([`WorkerLost`]): 500 ms
    /// (tether's bound; a killed process closes its sockets a moment before it can be
    /// reaped). Zero reports at once. The session waits this long at most, once, and only
    /// while the process is still running (udf §6.1 `isAlive`).
    pub exit_status_wait: Duration,
    /// The reuse pool; `None` (default) stops every worker after its session, as Spark does
    /// (its pool of size zero, udf §6.2 `onLastSessionReleased`).
    pub pool: Option<PoolConfig>,
    /// Where to create the private socket directory. `None` (default): the shortest
    /// writable of `$TMPDIR`, `$TEMP`, `$TMP`, `/tmp` (udf §6.4).
    pub socket_base_dir: Option<PathBuf>,
    /// Accept specs whose connection is local TCP (the engine picks a free loopback port and
    /// passes it as `--connection`, udf §1.9). Off by default: like Spark's gRPC dispatcher,
    /// a Unix domain socket is required (udf §6.4, §8 scenario 93); turn it on for a
    /// transport that can reach TCP endpoints (both of tether's can:
    /// [`FramedTransport`](crate::worker::engine::FramedTransport) and, with the `grpc`
    /// feature, `spark::udf_grpc::GrpcTransport`), for a worker that serves on loopback TCP.
    pub allow_tcp: bool,
    /// Start workers and callables in their own process group and signal the whole group
    /// (default `true`), so a worker's children (a shell wrapper's child, a launcher's
    /// worker: udf §8 scenarios 88–89) are stopped with it. A consequence: a Ctrl-C in the
    /// engine's terminal does not reach them; stopping the dispatcher (close or drop) does.
    pub process_group: bool,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            session: SessionConfig::default(),
            events: None,
            default_init_timeout: Duration::from_secs(10),
            default_graceful_timeout: Duration::from_secs(5),
            max_spec_timeout: Duration::from_secs(30),
            callable_timeout: Duration::from_secs(120),
            ready_poll_interval: Duration::from_millis(50),
            kill_reap_timeout: Duration::from_secs(5),
            exit_status_wait: Duration::from_millis(500),
            pool: None,
            socket_base_dir: None,
            allow_tcp: false,
            process_group: true,
        }
    }
}

/// A worker security scope: the pool-partition identity of udf §3 (`WorkerSecurityScope`).
/// Not supported yet: [`Dispatcher::create_session_in`] accepts only `None`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecurityScope(pub String);

/// A snapshot of one tracked worker (busy or idle; not one being stopped): the state of
/// Spark's `DirectWorkerProcess` (udf §6.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The worker's id (UUID v4, passed as `--id`; also [`WorkerHandle::id`]; udf §6.1).
    pub id: String,
    /// Its process id.
    pub pid: u32,
    /// Where it listens (passed as `--connection`, udf §1.9).
    pub address: WorkerAddress,
    /// Its merged stdout/stderr log (deleted when it stops; udf §6.1 artifacts).
    pub log_path: PathBuf,
    /// Sessions currently using it (udf §6.1 `activeSessions`, the ref-count).
    pub active_sessions: usize,
    /// Whether it waits in the reuse pool (udf §6.6).
    pub idle: bool,
    /// Whether a session marked it invalid (it will be stopped, never reused; udf §6.1
    /// `isInvalid`, §6.5).
    pub invalid: bool,
    /// Sessions finalized on it so far.
    pub sessions_served: u64,
}

/// Counters of a [`Dispatcher`] since it was created: workers spawned (udf §6.2), reused
/// (udf §6.6) and stopped (udf §6.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatcherStats {
    /// Worker processes started (udf §6.2 step 4), including ones that then failed to become
    /// ready.
    pub spawned: u64,
    /// Sessions served by a pooled worker instead of a new process (udf §6.6).
    pub reused: u64,
    /// Worker processes stopped and reaped (udf §6.1 `close`).
    pub stopped: u64,
}

/// Runs UDF workers as processes for one [`UdfWorkerSpecification`] and creates sessions on
/// them (udf §6.2 `DirectWorkerDispatcher`, §6.4 transport). See the [module
/// docs](self).
///
/// Share it behind an `Arc`: [`create_session`](Self::create_session) takes `&self` and may
/// run concurrently. Dropping it without [`close`](Self::close) starts the same shutdown in
/// the background (stop workers, cleanup callable, remove the directory) without waiting:
/// a process that exits right after the drop, or is killed, leaves its directory (sockets
/// and output logs) behind; its workers exit on their own once their parent is gone
/// (`WorkerMain`'s parent check). Close it on every path, errors included, as
/// `examples/echo_engine.rs` does; what is left is removed by the next dispatcher created
/// under the same base directory (its directory names its owner process, and one whose
/// owner no longer runs is removed).
///
/// - One session per worker at a time: `supports_concurrent_udfs` is not used (as in
///   Spark); each concurrent session gets its own process and socket.
/// - `create_session` needs a tokio runtime with the time driver (the readiness wait uses
///   tokio timers; run it on real time, not a paused test clock, since the processes are
///   real). Process stops, the environment callables and the shutdown run on short-lived
///   background threads, so none of them blocks a runtime thread.
pub struct Dispatcher<T: WorkerTransport> {
    shared: Arc<Shared<T>>,
}

impl<T: WorkerTransport> std::fmt::Debug for Dispatcher<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("socket_dir", &self.shared.dir)
            .field("closed", &self.is_closed())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<T: WorkerTransport> Dispatcher<T> {
    /// Validates `spec` ([`validate_spec`]), resolves its timeouts (unset or ≤ 0 → the
    /// config's defaults; above [`DispatcherConfig::max_spec_timeout`] → clamped) and creates
    /// the private socket directory (mode `0700`): the construction of udf §6.2, with
    /// `initialize` of udf §6.4, removing the directories that dispatchers of processes no
    /// longer running left in the same base directory. Spawns nothing and runs no callable.
    /// Registers the metric handles of its workers and sessions with the recorder installed
    /// now (see [`observe`](crate::observe)).
    ///
    /// # Errors
    /// [`DispatchError::InvalidSpec`]; [`DispatchError::SocketDirectory`] when no candidate
    /// directory is writable; [`DispatchError::SocketPathTooLong`] when the spec's workers
    /// listen on Unix sockets and no candidate directory is short enough for their paths
    /// (udf §6.4).
    pub fn new(
        spec: UdfWorkerSpecification,
        transport: T,
        config: DispatcherConfig,
    ) -> Result<Self, DispatchError> {
        let settings = validate::settings(&spec, &config)?;
        let sockets = matches!(settings.endpoint, validate::EndpointKind::Unix);
        let dir = socket::create_private_dir(config.socket_base_dir.as_deref(), sockets)?;
        socket::sweep_stale(&dir);
        if config.session.events.is_some() {
            tracing::warn!(
                "DispatcherConfig::session.events is not used by a dispatcher: its workers' and \
                 sessions' events go to DispatcherConfig::events"
            );
        }
        tracing::debug!(?dir, "dispatcher created");
        Ok(Self {
            shared: Arc::new(Shared::new(transport, spec, settings, config, dir)),
        })
    }

    /// [`create_session_in`](Self::create_session_in) without a security scope (the only
    /// scope Spark accepts, udf §3, §6.2 step 1).
    ///
    /// # Errors
    /// As [`create_session_in`](Self::create_session_in).
    pub async fn create_session(
        &self,
    ) -> Result<Session<state::Init, T::Connection>, DispatchError> {
        self.create_session_in(None).await
    }

    /// Creates a session on a worker (udf §6.2 `createSession`): a healthy pooled worker if
    /// there is one, else a new process (after the environment setup, once per dispatcher).
    /// The returned session holds the worker's handle; closing or dropping it releases the
    /// worker (back to the pool, or stopped).
    ///
    /// Cancel-safe: dropping the future kills a worker that was being started and releases a
    /// worker that was acquired; a running environment setup continues and is shared.
    ///
    /// # Errors
    /// - [`DispatchError::SecurityScopeNotSupported`] for `Some(scope)`;
    /// - [`DispatchError::Closed`] after (or during) [`close`](Self::close);
    /// - [`DispatchError::Environment`] / [`DispatchError::EnvironmentPreviouslyFailed`];
    /// - [`DispatchError::ExitedAtStart`], [`DispatchError::NotReachable`],
    ///   [`DispatchError::Spawn`], socket path errors: the worker could not be started (it
    ///   has been killed and reaped, its socket removed);
    /// - [`DispatchError::OpenSession`]: the session's connection could not be opened (the
    ///   worker was marked invalid and released).
    pub async fn create_session_in(
        &self,
        scope: Option<&SecurityScope>,
    ) -> Result<Session<state::Init, T::Connection>, DispatchError> {
        if scope.is_some() {
            return Err(DispatchError::SecurityScopeNotSupported);
        }
        let shared = &self.shared;
        loop {
            match shared.acquire_or_reserve()? {
                Acquired::Reused(worker) => match self.open(worker).await {
                    Ok(session) => return Ok(session),
                    Err(DispatchError::OpenSession { id, source, .. }) => {
                        tracing::warn!(worker = %id, error = %source, "pooled worker failed to open a session; trying another");
                    }
                    Err(e) => return Err(e),
                },
                Acquired::Spawn(mut reservation) => {
                    shared.env.ensure_ready(shared.closed_signal()).await?;
                    self.spawn_worker(&mut reservation).await?;
                    let worker = reservation.publish()?;
                    return self.open(worker).await;
                }
            }
        }
    }

    /// Opens the session connection on an acquired worker; on failure marks it invalid and
    /// releases it.
    async fn open(
        &self,
        worker: Arc<Worker<T>>,
    ) -> Result<Session<state::Init, T::Connection>, DispatchError> {
        struct Acquisition<T: WorkerTransport>(Option<Arc<Worker<T>>>);
        impl<T: WorkerTransport> Drop for Acquisition<T> {
            fn drop(&mut self) {
                if let Some(w) = self.0.take() {
                    w.invalidate(InvalidationReason::OpenFailed);
                    if let Err(e) = w.release_session() {
                        tracing::warn!(error = %e, "release after a failed session open");
                    }
                }
            }
        }
        let mut acquisition = Acquisition(Some(worker.clone()));
        let Some(channel) = worker.channel() else {
            // Stopped by a concurrent close between publish and here.
            drop(acquisition);
            return Err(DispatchError::Closed);
        };
        let shared = &self.shared;
        match shared
            .transport
            .open_session(&channel, &worker.address)
            .await
        {
            Ok(connection) => {
                acquisition.0 = None;
                Ok(Session::observed(
                    connection,
                    worker,
                    shared.config.session.clone(),
                    Some(shared.observer.sessions().clone()),
                ))
            }
            Err(source) => {
                drop(acquisition);
                if self.is_closed() {
                    return Err(DispatchError::Closed);
                }
                Err(DispatchError::OpenSession {
                    id: worker.id.clone(),
                    address: worker.address.clone(),
                    source,
                })
            }
        }
    }

    /// Starts a worker process and waits until the transport reaches it (udf §6.2 step 4,
    /// udf §6.4 readiness). On failure the process is killed and reaped before returning.
    async fn spawn_worker(&self, reservation: &mut Reservation<T>) -> Result<(), DispatchError> {
        let shared = &self.shared;
        let uuid = uuid::Uuid::new_v4();
        let id = uuid.to_string();
        let hex = uuid.simple().to_string();
        let (address, socket_path, log_path) = match shared.settings.endpoint {
            EndpointKind::Unix => {
                let (socket, log) = socket::allocate_leaf(&shared.dir, &hex[..16])?;
                (WorkerAddress::Unix(socket.clone()), Some(socket), log)
            }
            EndpointKind::Tcp => {
                let addr = socket::free_tcp_port().map_err(|source| DispatchError::Io {
                    what: "choosing a loopback TCP port for the worker".into(),
                    source,
                })?;
                let log = shared.dir.join(format!("w-{}.log", &hex[..16]));
                (WorkerAddress::Tcp(addr), None, log)
            }
        };
        let log = process::create_log(&log_path).map_err(|source| DispatchError::Io {
            what: format!("creating the worker output log {}", log_path.display()),
            source,
        })?;
        let runner = &shared.settings.runner;
        let extra = [
            "--id".to_string(),
            id.clone(),
            "--connection".to_string(),
            address.to_argument(),
        ];
        let spawned_at = std::time::Instant::now();
        let child = match process::spawn(runner, &extra, Some(&log), shared.config.process_group) {
            Ok(child) => child,
            Err(source) => {
                let _ = std::fs::remove_file(&log_path);
                return Err(DispatchError::Spawn {
                    command: process::command_line(runner, &extra),
                    source,
                });
            }
        };
        drop(log);
        tracing::debug!(worker = %id, pid = child.id(), %address, "worker spawned");
        let worker = Arc::new_cyclic(|this| {
            Worker::new(
                shared.clone(),
                this.clone(),
                id,
                address,
                socket_path,
                log_path,
                child,
            )
        });
        reservation.worker = Some(worker.clone());
        shared.state.update(|st| {
            st.stats.spawned += 1;
            shared.observer.spawned(&worker.tag, worker.pid);
        });

        let mut closed = shared.closed_signal();
        let failure = tokio::select! {
            ready = self.await_ready(&worker) => match ready {
                Ok(channel) => {
                    worker.set_channel(channel);
                    shared.observer.ready(&worker.tag, spawned_at.elapsed());
                    return Ok(());
                }
                Err(failure) => failure,
            },
            _ = closed.wait_for(|c| *c) => Failure::Closed,
        };
        let reason = match failure {
            Failure::Closed => StopReason::DispatcherClosed,
            _ => StopReason::StartFailed,
        };
        let output = reservation.kill_and_wait(reason).await;
        Err(match failure {
            Failure::Closed => DispatchError::Closed,
            Failure::Exited(reason) => DispatchError::ExitedAtStart {
                id: worker.id.clone(),
                address: worker.address.clone(),
                reason,
                output,
            },
            Failure::Timeout(detail) => DispatchError::NotReachable {
                id: worker.id.clone(),
                address: worker.address.clone(),
                waited: shared.settings.init_timeout,
                detail,
                output,
            },
        })
    }

    /// Polls `transport.connect` (1 ms apart, doubling up to
    /// [`DispatcherConfig::ready_poll_interval`]) until it succeeds, the process exits, or
    /// the initialization timeout passes.
    async fn await_ready(&self, worker: &Worker<T>) -> Result<T::Channel, Failure> {
        let shared = &self.shared;
        let deadline = tokio::time::Instant::from_std(crate::time::deadline_after(
            std::time::Instant::now(),
            shared.settings.init_timeout,
        ));
        let mut last_error = None;
        let max_pause = shared.config.ready_poll_interval;
        let mut pause = Duration::from_millis(1).min(max_pause);
        loop {
            if let Some(reason) = worker.peek_exit() {
                return Err(Failure::Exited(reason));
            }
            if tokio::time::Instant::now() >= deadline {
                let socket = match &worker.socket_path {
                    Some(p) if !p.exists() => "the worker never created its socket file; ",
                    Some(_) => "the socket file exists but the worker did not accept a session; ",
                    None => "",
                };
                let last = last_error.map_or_else(
                    || "no connection attempt completed".to_string(),
                    |e: std::io::Error| format!("last connection error: {}", Chain(&e)),
                );
                return Err(Failure::Timeout(format!("{socket}{last}")));
            }
            match tokio::time::timeout_at(deadline, shared.transport.connect(&worker.address)).await
            {
                Ok(Ok(channel)) => return Ok(channel),
                Ok(Err(e)) => last_error = Some(e),
                Err(_) => continue,
            }
            let next = (tokio::time::Instant::now() + pause).min(deadline);
            tokio::time::sleep_until(next).await;
            pause = (pause * 2).min(max_pause);
        }
    }

    /// Closes the dispatcher (udf §6.2 `close`): refuses new sessions, stops every worker
    /// (SIGTERM, graceful timeout, SIGKILL, reap, socket removed; including workers whose
    /// sessions are still open: a worker that drains on SIGTERM, as `WorkerMain` does for its
    /// shutdown grace, may still finish them, otherwise they fail; `close` waits for it up
    /// to the graceful timeout), waits for in-flight
    /// `create_session` calls to give up, runs the cleanup callable once, removes the socket
    /// directory. Idempotent: a second call waits for the first to finish. Cancel-safe: the
    /// shutdown runs on a background thread and completes even if this future is dropped.
    pub async fn close(&self) {
        self.shared.begin_close();
        self.shared
            .state
            .wait(|st| (st.phase == PoolPhase::Closed).then_some(()))
            .await;
    }

    /// Waits until every worker stop started so far has finished: processes reaped, socket
    /// files removed (udf §6.1 `close`). Stops begin when a worker's last session is released
    /// (without reuse), when an idle worker times out, and on close; they run in the
    /// background because [`WorkerHandle::release_session`] must not block (Spark's runs the
    /// stop on the releasing thread, udf §6.1).
    pub async fn settle(&self) {
        self.shared
            .state
            .wait(|st| (st.stopping == 0).then_some(()))
            .await;
    }

    /// Whether [`close`](Self::close) has begun (sessions are refused, udf §6.2 step 2).
    pub fn is_closed(&self) -> bool {
        self.shared.state.lock().phase != PoolPhase::Open
    }

    /// The specification this dispatcher runs (Spark's `WorkerDispatcher.workerSpec`,
    /// udf §3).
    pub fn spec(&self) -> &UdfWorkerSpecification {
        &self.shared.spec
    }

    /// The transport that reaches the workers (the part Spark's `DirectGrpcDispatcher` adds
    /// to the transport-agnostic dispatcher, udf §6.2, §6.4).
    pub fn transport(&self) -> &T {
        &self.shared.transport
    }

    /// The configuration (its defaults are Spark's, udf §7).
    pub fn config(&self) -> &DispatcherConfig {
        &self.shared.config
    }

    /// The private directory (mode `0700`) holding worker sockets and output logs; removed
    /// on close (udf §6.4 endpoint directory).
    pub fn socket_dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The readiness deadline in effect: the spec's `initialization_timeout_ms`, defaulted
    /// ([`DispatcherConfig::default_init_timeout`]) and clamped (udf §8 scenario 108). A
    /// worker process's start-up bound, not a session's `InitResponse` wait.
    pub fn init_timeout(&self) -> Duration {
        self.shared.settings.init_timeout
    }

    /// The SIGTERM→SIGKILL grace in effect: the spec's `graceful_termination_timeout_ms`,
    /// defaulted and clamped (udf §8 scenario 107).
    pub fn graceful_timeout(&self) -> Duration {
        self.shared.settings.graceful_timeout
    }

    /// Whether released workers may be reused: a [`DispatcherConfig::pool`] with
    /// `max_idle > 0` and a spec declaring `supports_reuse` (udf §1.9, §6.6).
    pub fn reuses_workers(&self) -> bool {
        self.shared.pool_enabled()
    }

    /// Where the environment setup stands (udf §6.3).
    pub fn environment(&self) -> EnvironmentState {
        self.shared.env.state()
    }

    /// Snapshots of the tracked workers (busy and idle), ordered by process id (the
    /// tracking map of udf §6.2).
    pub fn workers(&self) -> Vec<WorkerInfo> {
        let workers: Vec<_> = self.shared.state.lock().workers.values().cloned().collect();
        let mut infos: Vec<_> = workers.iter().map(|w| w.info()).collect();
        infos.sort_by_key(|i| i.pid);
        infos
    }

    /// The tracked worker with this id (e.g. `session.worker().id()`), if it is not stopping
    /// (the id is the map key, udf §3 `WorkerHandle.id`).
    pub fn worker(&self, id: &str) -> Option<WorkerInfo> {
        let worker = self.shared.state.lock().workers.get(id).cloned();
        worker.map(|w| w.info())
    }

    /// Counters since creation: spawns (udf §6.2 step 4), pool reuses (udf §6.6), stops.
    pub fn stats(&self) -> DispatcherStats {
        self.shared.state.lock().stats
    }
}

impl<T: WorkerTransport> Drop for Dispatcher<T> {
    fn drop(&mut self) {
        self.shared.begin_close();
    }
}

/// Why a worker did not become ready.
enum Failure {
    Closed,
    Exited(ExitReason),
    Timeout(String),
}
