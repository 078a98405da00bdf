//! The dispatcher's shared state: tracked workers, the idle pool, in-flight creations,
//! workers being stopped; the worker handle sessions hold; stop jobs; close.
//!
//! Lock order: `Shared::state` → `Worker::life` → `Worker::child` / `Worker::channel`. The
//! session count, the idle pool and the "stopping" decision all change under `state`, which
//! is what arbitrates a pooled acquire against a concurrent last release (udf §6.6).

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::watch;

use super::events::DispatcherObserver;
use crate::connection::ConnectionError;
use crate::wire::UdfWorkerSpecification;
use crate::worker::engine::{HandleError, WorkerHandle};
use crate::worker::engine::{Termination, TerminationKind};
use crate::worker::engine::{WorkerAddress, WorkerTransport};
use crate::worker::{InvalidationReason, StopReason};

use super::environment::Environment;
use super::error::{DispatchError, ExitReason, WorkerLost};
use super::monitor::Monitor;
use super::process;
use super::validate::Settings;
use super::{DispatcherConfig, DispatcherStats, WorkerInfo};

fn lock<V>(m: &Mutex<V>) -> std::sync::MutexGuard<'_, V> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How often an idle pooled worker's health is checked while it waits for reuse (tether's
/// bound: a worker that died idle leaves the pool, and the `tether_udf_idle_workers` gauge,
/// within this).
pub(crate) const IDLE_HEALTH_INTERVAL: Duration = Duration::from_millis(250);

/// Open → Closing (workers being stopped, cleanup pending) → Closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolPhase {
    Open,
    Closing,
    Closed,
}

pub(crate) struct State<T: WorkerTransport> {
    pub(crate) phase: PoolPhase,
    /// Published workers that are not being stopped (busy or idle), by id.
    pub(crate) workers: HashMap<String, Arc<Worker<T>>>,
    /// Idle pooled workers (a subset of `workers`), most recently released last.
    pub(crate) idle: Vec<Arc<Worker<T>>>,
    /// `create_session` calls between reserving a spawn and publishing (or failing).
    pub(crate) in_flight: usize,
    /// Stop jobs started and not finished.
    pub(crate) stopping: usize,
    pub(crate) stats: DispatcherStats,
}

pub(crate) struct Shared<T: WorkerTransport> {
    pub(crate) transport: T,
    pub(crate) spec: UdfWorkerSpecification,
    pub(crate) settings: Settings,
    pub(crate) config: DispatcherConfig,
    pub(crate) dir: PathBuf,
    pub(crate) state: Monitor<State<T>>,
    pub(crate) env: Arc<Environment>,
    /// Where the workers' and sessions' lifecycle goes: metrics registered once, events to
    /// `config.events`.
    pub(crate) observer: Arc<DispatcherObserver>,
    closed: watch::Sender<bool>,
}

/// Per-worker bookkeeping, changed under the dispatcher's `state` lock.
#[derive(Debug, Default)]
pub(crate) struct Life {
    pub(crate) sessions: usize,
    pub(crate) stopping: bool,
    /// Why it is being stopped, once `stopping`.
    pub(crate) stop_reason: Option<StopReason>,
    pub(crate) stopped: bool,
    pub(crate) idle_since: Option<Instant>,
    pub(crate) served: u64,
    pub(crate) exit: Option<ExitReason>,
    pub(crate) final_output: Option<String>,
    /// The outcome of the session being finalized, between `session_terminated` and its
    /// release: what a `mark_invalid` in between reports as the reason.
    pub(crate) ended: Option<TerminationKind>,
}

/// One worker process: the [`WorkerHandle`] the sessions running on it hold.
pub(crate) struct Worker<T: WorkerTransport> {
    pub(crate) id: String,
    /// The id as events carry it.
    pub(crate) tag: Arc<str>,
    pub(crate) pid: u32,
    pub(crate) address: WorkerAddress,
    pub(crate) socket_path: Option<PathBuf>,
    pub(crate) log_path: PathBuf,
    child: Mutex<Option<Child>>,
    channel: Mutex<Option<Arc<T::Channel>>>,
    invalid: AtomicBool,
    pub(crate) life: Mutex<Life>,
    shared: Arc<Shared<T>>,
    /// This worker, for the futures that outlive a borrow of it (a connection loss
    /// explanation).
    this: Weak<Self>,
}

impl<T: WorkerTransport> fmt::Debug for Worker<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DispatchedWorker")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .field("address", &self.address)
            .field("invalid", &self.invalid.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

/// How a worker is stopped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StopMode {
    /// SIGTERM and the graceful timeout first (else SIGKILL at once).
    graceful: bool,
    /// Keep the output tail in `Life::final_output` for an error report.
    capture_output: bool,
}

impl StopMode {
    pub(crate) const GRACEFUL: Self = Self {
        graceful: true,
        capture_output: false,
    };
    pub(crate) const KILL: Self = Self {
        graceful: false,
        capture_output: false,
    };
    pub(crate) const KILL_CAPTURE: Self = Self {
        graceful: false,
        capture_output: true,
    };
}

/// A stop decided under the lock, run (on its own thread) after the lock is released.
#[must_use]
pub(crate) struct StopJob<T: WorkerTransport> {
    worker: Arc<Worker<T>>,
    mode: StopMode,
    reason: StopReason,
}

/// Whether a worker may serve another session (udf §6.1 `isAlive`, §6.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Health {
    Healthy,
    /// Marked invalid already.
    Invalid,
    /// Valid, but unusable: why it is invalidated now.
    Unusable(InvalidationReason),
}

impl<T: WorkerTransport> State<T> {
    /// Marks `w` stopping and untracks it; `None` if it already is.
    pub(crate) fn begin_stop(
        &mut self,
        w: &Arc<Worker<T>>,
        mode: StopMode,
        reason: StopReason,
    ) -> Option<StopJob<T>> {
        {
            let mut life = lock(&w.life);
            if life.stopping {
                return None;
            }
            life.stopping = true;
            life.stop_reason = Some(reason);
            life.idle_since = None;
        }
        if self
            .workers
            .get(&w.id)
            .is_some_and(|tracked| Arc::ptr_eq(tracked, w))
        {
            self.workers.remove(&w.id);
        }
        let idle = self.idle.len();
        self.idle.retain(|x| !Arc::ptr_eq(x, w));
        if self.idle.len() < idle {
            w.shared.observer.idle(false);
        }
        self.stopping += 1;
        Some(StopJob {
            worker: w.clone(),
            mode,
            reason,
        })
    }
}

impl<T: WorkerTransport> StopJob<T> {
    /// Runs the stop on a dedicated thread (inline if no thread can be started).
    pub(crate) fn start(self) {
        let job = Arc::new(Mutex::new(Some(self)));
        let for_thread = job.clone();
        let spawned = std::thread::Builder::new()
            .name("tether-udf-stop".into())
            .spawn(move || {
                if let Some(job) = lock(&for_thread).take() {
                    job.run();
                }
            });
        if spawned.is_err()
            && let Some(job) = lock(&job).take()
        {
            job.run();
        }
    }

    fn run(self) {
        let w = self.worker;
        let shared = &w.shared;
        // Close the transport first (udf §6.1 artifacts close order), then the process.
        drop(lock(&w.channel).take());
        let child = lock(&w.child).take();
        let grace = if self.mode.graceful {
            shared.settings.graceful_timeout
        } else {
            Duration::ZERO
        };
        let exit = child.and_then(|mut c| {
            process::stop(
                &mut c,
                shared.config.process_group,
                grace,
                shared.config.kill_reap_timeout,
            )
        });
        let output = self
            .mode
            .capture_output
            .then(|| process::output_tail(&w.log_path));
        if let Some(socket) = &w.socket_path
            && let Err(e) = std::fs::remove_file(socket)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(?socket, error = %e, "could not remove the worker socket");
        }
        let _ = std::fs::remove_file(&w.log_path);
        tracing::debug!(worker = %w.id, pid = w.pid, ?exit, "worker stopped");
        let reason = self.reason;
        shared.state.update(|st| {
            st.stopping -= 1;
            st.stats.stopped += 1;
            shared.observer.stopped(&w.tag, reason);
            let mut life = lock(&w.life);
            life.stopped = true;
            life.exit = exit;
            life.final_output = output;
        });
    }
}

fn start_all<T: WorkerTransport>(jobs: impl IntoIterator<Item = StopJob<T>>) {
    for job in jobs {
        job.start();
    }
}

impl<T: WorkerTransport> Worker<T> {
    pub(crate) fn new(
        shared: Arc<Shared<T>>,
        this: Weak<Self>,
        id: String,
        address: WorkerAddress,
        socket_path: Option<PathBuf>,
        log_path: PathBuf,
        child: Child,
    ) -> Self {
        Self {
            tag: Arc::from(id.as_str()),
            id,
            pid: child.id(),
            address,
            socket_path,
            log_path,
            child: Mutex::new(Some(child)),
            channel: Mutex::new(None),
            invalid: AtomicBool::new(false),
            life: Mutex::new(Life::default()),
            shared,
            this,
        }
    }

    /// How the process ended, if it has and that is known: peeked (not reaped, on Linux)
    /// while the dispatcher holds the child, else what its stop recorded.
    fn exit_status(&self) -> Option<ExitReason> {
        if let Some(child) = lock(&self.child).as_mut() {
            return process::peek_exit(child);
        }
        lock(&self.life).exit
    }

    /// How the process ended, if it has (without reaping it on Linux).
    pub(crate) fn peek_exit(&self) -> Option<ExitReason> {
        match lock(&self.child).as_mut() {
            Some(child) => process::peek_exit(child),
            None => lock(&self.life).exit.or(Some(ExitReason::Code(-1))),
        }
    }

    pub(crate) fn set_channel(&self, channel: T::Channel) {
        *lock(&self.channel) = Some(Arc::new(channel));
    }

    pub(crate) fn channel(&self) -> Option<Arc<T::Channel>> {
        lock(&self.channel).clone()
    }

    /// Valid, process alive, transport active (udf §6.1 `isAlive`, §6.6).
    pub(crate) fn health(&self) -> Health {
        if self.invalid.load(Ordering::SeqCst) {
            return Health::Invalid;
        }
        let alive = match lock(&self.child).as_mut() {
            Some(child) => process::peek_exit(child).is_none(),
            None => false,
        };
        if !alive {
            return Health::Unusable(InvalidationReason::Exited);
        }
        let active = lock(&self.channel)
            .as_deref()
            .is_some_and(|ch| self.shared.transport.is_active(ch));
        match active {
            true => Health::Healthy,
            false => Health::Unusable(InvalidationReason::Inactive),
        }
    }

    /// Marks the worker invalid for `reason` (udf §6.5); the first time reports it, unless
    /// the dispatcher already decided to stop it (then nothing is judged: a session that
    /// fails because its worker is being stopped, as at the dispatcher's close, says nothing
    /// about the worker).
    pub(crate) fn invalidate(&self, reason: InvalidationReason) {
        if self.invalid.swap(true, Ordering::SeqCst) {
            return;
        }
        if lock(&self.life).stopping {
            tracing::debug!(worker = %self.id, ?reason, "worker being stopped marked invalid");
            return;
        }
        tracing::debug!(worker = %self.id, ?reason, "worker marked invalid");
        self.shared.observer.invalidated(&self.tag, reason);
    }

    /// Judges a worker for reuse (udf §6.6): a valid one found dead or inactive is
    /// invalidated now. Returns whether it may serve another session.
    fn check_reusable(&self) -> bool {
        match self.health() {
            Health::Healthy => true,
            Health::Invalid => false,
            Health::Unusable(reason) => {
                self.invalidate(reason);
                false
            }
        }
    }

    pub(crate) fn info(&self) -> WorkerInfo {
        let life = lock(&self.life);
        WorkerInfo {
            id: self.id.clone(),
            pid: self.pid,
            address: self.address.clone(),
            log_path: self.log_path.clone(),
            active_sessions: life.sessions,
            idle: life.idle_since.is_some(),
            invalid: self.invalid.load(Ordering::SeqCst),
            sessions_served: life.served,
        }
    }
}

impl<T: WorkerTransport> WorkerHandle for Worker<T> {
    fn id(&self) -> &str {
        &self.id
    }

    /// Marks the worker invalid (udf §6.1 `markInvalid`): after `session_terminated` of an
    /// unsalvageable outcome, for that outcome (udf §6.5); otherwise
    /// [`InvalidationReason::Marked`].
    fn mark_invalid(&self) {
        let reason = match lock(&self.life).ended.take() {
            Some(TerminationKind::TransportFailed) => InvalidationReason::TransportFailed,
            Some(TerminationKind::Interrupted) => InvalidationReason::Interrupted,
            _ => InvalidationReason::Marked,
        };
        self.invalidate(reason);
    }

    fn is_invalid(&self) -> bool {
        self.invalid.load(Ordering::SeqCst)
    }

    /// Takes one session away. The last release of a published worker either parks it in
    /// the idle pool (pool enabled, spec `supports_reuse`, healthy, room left, dispatcher
    /// open) or starts its stop (SIGTERM, grace, SIGKILL, reap, socket removed) on a
    /// background thread; it never blocks. [`Dispatcher::settle`](super::Dispatcher::settle)
    /// waits for started stops.
    fn release_session(&self) -> Result<(), HandleError> {
        enum Next<T: WorkerTransport> {
            Nothing,
            Idle(Arc<Worker<T>>, Instant),
            Stop(StopJob<T>),
        }
        let shared = &self.shared;
        let next = shared.state.update(|st| {
            let me = st
                .workers
                .get(&self.id)
                .filter(|w| std::ptr::eq(Arc::as_ptr(w), self))
                .cloned();
            {
                let mut life = lock(&self.life);
                if life.sessions == 0 {
                    return Err(HandleError::Underflow {
                        id: self.id.clone(),
                    });
                }
                life.sessions -= 1;
                life.ended = None;
                if life.sessions > 0 || life.stopping {
                    return Ok(Next::Nothing);
                }
            }
            // Not published: the creating call still owns it and decides.
            let Some(me) = me else {
                return Ok(Next::Nothing);
            };
            let reason = if me.is_invalid() {
                StopReason::Invalid
            } else if !shared.may_pool(st) {
                StopReason::Released
            } else if !me.check_reusable() {
                StopReason::Invalid
            } else {
                let since = Instant::now();
                lock(&me.life).idle_since = Some(since);
                st.idle.push(me.clone());
                shared.observer.idle(true);
                return Ok(Next::Idle(me, since));
            };
            Ok(st
                .begin_stop(&me, StopMode::GRACEFUL, reason)
                .map_or(Next::Nothing, Next::Stop))
        })?;
        match next {
            Next::Nothing => {}
            Next::Idle(worker, since) => shared.schedule_idle_reap(&worker, since),
            Next::Stop(job) => job.start(),
        }
        Ok(())
    }

    fn session_terminated(&self, termination: &Termination) {
        {
            let mut life = lock(&self.life);
            life.served += 1;
            life.ended = Some(termination.kind());
        }
        tracing::debug!(worker = %self.id, outcome = %termination, "session on worker ended");
    }

    /// [`WorkerLost`] with the process's exit status, waiting for it up to
    /// [`DispatcherConfig::exit_status_wait`] (polled 1 ms apart, doubling up to 20 ms; no
    /// wait outside a tokio runtime).
    fn explain_connection_loss(
        &self,
        cause: Option<&ConnectionError>,
    ) -> Option<BoxFuture<'static, ConnectionError>> {
        let worker = self.this.upgrade()?;
        let cause = cause.cloned();
        let wait = if tokio::runtime::Handle::try_current().is_ok() {
            self.shared.config.exit_status_wait
        } else {
            Duration::ZERO
        };
        Some(Box::pin(async move {
            let deadline = tokio::time::Instant::from_std(crate::time::deadline_after(
                std::time::Instant::now(),
                wait,
            ));
            let mut pause = Duration::from_millis(1);
            let exit = loop {
                let exit = worker.exit_status();
                let now = tokio::time::Instant::now();
                if exit.is_some() || now >= deadline {
                    break exit;
                }
                tokio::time::sleep_until((now + pause).min(deadline)).await;
                pause = (pause * 2).min(Duration::from_millis(20));
            };
            tracing::debug!(worker = %worker.id, ?exit, "connection to the worker lost");
            let mut lost = WorkerLost::new(worker.id.clone(), worker.pid, exit, cause);
            lost.stopping = {
                let life = lock(&worker.life);
                life.stop_reason.filter(|_| life.stopping)
            };
            if lost.stopping.is_none() {
                lost.output = process::loss_output_tail(&worker.log_path);
            }
            ConnectionError::transport(lost)
        }))
    }
}

impl<T: WorkerTransport> Shared<T> {
    pub(crate) fn new(
        transport: T,
        spec: UdfWorkerSpecification,
        settings: Settings,
        config: DispatcherConfig,
        dir: PathBuf,
    ) -> Self {
        let env = Arc::new(Environment::new(
            settings.verification.clone(),
            settings.installation.clone(),
            settings.cleanup.clone(),
            config.callable_timeout,
            dir.clone(),
            config.process_group,
        ));
        let observer = Arc::new(DispatcherObserver::registered(
            config.events.clone(),
            config.session.timer.clone(),
        ));
        Self {
            transport,
            spec,
            settings,
            config,
            dir,
            observer,
            state: Monitor::new(State {
                phase: PoolPhase::Open,
                workers: HashMap::new(),
                idle: Vec::new(),
                in_flight: 0,
                stopping: 0,
                stats: DispatcherStats::default(),
            }),
            env,
            closed: watch::Sender::new(false),
        }
    }

    /// A receiver that turns `true` when close begins.
    pub(crate) fn closed_signal(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    pub(crate) fn pool_enabled(&self) -> bool {
        self.settings.supports_reuse && self.config.pool.is_some_and(|p| p.max_idle > 0)
    }

    /// Whether the pool takes a released worker, health aside: open, enabled, room left
    /// (udf §6.6).
    fn may_pool(&self, st: &State<T>) -> bool {
        st.phase == PoolPhase::Open
            && self.pool_enabled()
            && self.config.pool.is_some_and(|p| st.idle.len() < p.max_idle)
    }

    fn idle_timeout(&self) -> Duration {
        self.config.pool.map_or(Duration::ZERO, |p| p.idle_timeout)
    }

    /// Stops idle workers whose idle timeout has passed (called under the lock): for the
    /// timeout, or as invalid when one is found dead or inactive meanwhile (udf §6.6).
    fn reap_expired(&self, st: &mut State<T>) -> Vec<StopJob<T>> {
        let timeout = self.idle_timeout();
        let expired: Vec<_> = st
            .idle
            .iter()
            .filter(|w| {
                lock(&w.life)
                    .idle_since
                    .is_some_and(|s| s.elapsed() >= timeout)
            })
            .cloned()
            .collect();
        expired
            .iter()
            .filter_map(|w| {
                let reason = match w.check_reusable() {
                    true => StopReason::IdleTimeout,
                    false => StopReason::Invalid,
                };
                st.begin_stop(w, StopMode::GRACEFUL, reason)
            })
            .collect()
    }

    /// With a tokio runtime: a task that watches `worker` while it stays idle (since the same
    /// instant): every [`IDLE_HEALTH_INTERVAL`] it checks the worker as the pool would
    /// before a reuse (udf §6.6), so that one that died or whose channel went inactive is
    /// invalidated and stopped at once rather than counted as idle until then, and it stops
    /// the worker after the idle timeout. Without a runtime, both are noticed by the next
    /// `create_session` or by close.
    fn schedule_idle_reap(self: &Arc<Self>, worker: &Arc<Worker<T>>, since: Instant) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let timeout = self.idle_timeout();
        let shared: Weak<Self> = Arc::downgrade(self);
        let worker = Arc::downgrade(worker);
        rt.spawn(async move {
            let mut wait = timeout.min(IDLE_HEALTH_INTERVAL);
            loop {
                tokio::time::sleep(wait + Duration::from_millis(1)).await;
                let (Some(shared), Some(worker)) = (shared.upgrade(), worker.upgrade()) else {
                    return;
                };
                let step = shared.state.update(|st| {
                    if lock(&worker.life).idle_since != Some(since) {
                        return Ok(None);
                    }
                    if !worker.check_reusable() {
                        return Ok(st.begin_stop(&worker, StopMode::GRACEFUL, StopReason::Invalid));
                    }
                    let elapsed = since.elapsed();
                    if elapsed >= timeout {
                        Ok(st.begin_stop(&worker, StopMode::GRACEFUL, StopReason::IdleTimeout))
                    } else {
                        Err((timeout - elapsed).min(IDLE_HEALTH_INTERVAL))
                    }
                });
                match step {
                    Ok(job) => {
                        if let Some(job) = job {
                            tracing::debug!(worker = %worker.id, "idle worker stopped");
                            job.start();
                        }
                        return;
                    }
                    Err(remaining) => wait = remaining,
                }
            }
        });
    }

    /// Under one lock: fail if closed, reap expired idle workers, then take a healthy idle
    /// worker (acquiring its session) or reserve a spawn.
    pub(crate) fn acquire_or_reserve(self: &Arc<Self>) -> Result<Acquired<T>, DispatchError> {
        let (result, jobs) = self.state.update(|st| {
            if st.phase != PoolPhase::Open {
                return (Err(DispatchError::Closed), Vec::new());
            }
            let mut jobs = self.reap_expired(st);
            while let Some(w) = st.idle.pop() {
                self.observer.idle(false);
                if w.check_reusable() {
                    let mut life = lock(&w.life);
                    life.sessions += 1;
                    life.idle_since = None;
                    drop(life);
                    st.stats.reused += 1;
                    self.observer.reused(&w.tag);
                    return (Ok(Acquired::Reused(w)), jobs);
                }
                jobs.extend(st.begin_stop(&w, StopMode::GRACEFUL, StopReason::Invalid));
            }
            st.in_flight += 1;
            (
                Ok(Acquired::Spawn(Reservation {
                    shared: self.clone(),
                    worker: None,
                    done: false,
                })),
                jobs,
            )
        });
        start_all(jobs);
        result
    }

    /// Begins closing (once): stops every tracked worker, wakes in-flight creations, and
    /// hands the rest (waiting for creations and stops, cleanup callable, directory removal)
    /// to a closer thread. Never blocks.
    pub(crate) fn begin_close(self: &Arc<Self>) {
        let jobs = self.state.update(|st| {
            if st.phase != PoolPhase::Open {
                return None;
            }
            st.phase = PoolPhase::Closing;
            let all: Vec<_> = st.workers.values().cloned().collect();
            let jobs = all
                .iter()
                .filter_map(|w| st.begin_stop(w, StopMode::GRACEFUL, StopReason::DispatcherClosed))
                .collect::<Vec<_>>();
            let idle = jobs.is_empty() && st.in_flight == 0 && st.stopping == 0;
            Some((jobs, idle))
        });
        let Some((jobs, idle)) = jobs else {
            return;
        };
        self.closed.send_replace(true);
        if idle {
            // Nothing to wait for: clean up now, so that a dispatcher dropped just before
            // the process exits (an engine's `?` on an error) leaves no socket directory.
            self.finish_close();
            return;
        }
        start_all(jobs);
        let shared = self.clone();
        let closer = Arc::new(Mutex::new(Some(shared)));
        let for_thread = closer.clone();
        let spawned = std::thread::Builder::new()
            .name("tether-udf-close".into())
            .spawn(move || {
                if let Some(shared) = lock(&for_thread).take() {
                    shared.finish_close();
                }
            });
        if spawned.is_err()
            && let Some(shared) = lock(&closer).take()
        {
            shared.finish_close();
        }
    }

    fn finish_close(&self) {
        self.state
            .wait_blocking(|st| (st.in_flight == 0 && st.stopping == 0).then_some(()));
        self.env.cleanup_blocking();
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = ?self.dir, error = %e, "could not remove the socket directory");
        }
        self.state.update(|st| st.phase = PoolPhase::Closed);
        tracing::debug!(dir = ?self.dir, "dispatcher closed");
    }
}

/// What `acquire_or_reserve` gave.
pub(crate) enum Acquired<T: WorkerTransport> {
    /// A pooled worker, its session already acquired.
    Reused(Arc<Worker<T>>),
    /// Room to spawn a worker.
    Spawn(Reservation<T>),
}

/// An in-flight creation: counted so close waits for it; owns the worker until published.
/// Dropping it (error or cancelled `create_session`) kills an unpublished worker.
pub(crate) struct Reservation<T: WorkerTransport> {
    pub(crate) shared: Arc<Shared<T>>,
    pub(crate) worker: Option<Arc<Worker<T>>>,
    done: bool,
}

impl<T: WorkerTransport> Reservation<T> {
    /// Kills the unpublished worker (for `reason`) and waits until it is reaped and its
    /// socket removed; returns its output tail.
    pub(crate) async fn kill_and_wait(&mut self, reason: StopReason) -> String {
        let Some(w) = self.worker.clone() else {
            return String::new();
        };
        let job = self
            .shared
            .state
            .update(|st| st.begin_stop(&w, StopMode::KILL_CAPTURE, reason));
        start_all(job);
        self.shared
            .state
            .wait(|_| {
                let life = lock(&w.life);
                life.stopped
                    .then(|| life.final_output.clone().unwrap_or_default())
            })
            .await
    }

    /// Acquires the worker's first session and publishes it (udf §6.2 step 5), atomically
    /// with the closed check: a dispatcher that closed meanwhile gets the worker stopped and
    /// [`DispatchError::Closed`].
    pub(crate) fn publish(mut self) -> Result<Arc<Worker<T>>, DispatchError> {
        self.done = true;
        let Some(w) = self.worker.take() else {
            self.shared.state.update(|st| st.in_flight -= 1);
            return Err(DispatchError::Closed);
        };
        let (result, job) = self.shared.state.update(|st| {
            st.in_flight -= 1;
            if st.phase != PoolPhase::Open {
                return (
                    Err(DispatchError::Closed),
                    st.begin_stop(&w, StopMode::GRACEFUL, StopReason::DispatcherClosed),
                );
            }
            lock(&w.life).sessions = 1;
            st.workers.insert(w.id.clone(), w.clone());
            (Ok(w.clone()), None)
        });
        start_all(job);
        result
    }
}

impl<T: WorkerTransport> Drop for Reservation<T> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let worker = self.worker.take();
        let job = self.shared.state.update(|st| {
            st.in_flight -= 1;
            worker.and_then(|w| st.begin_stop(&w, StopMode::KILL, StopReason::StartFailed))
        });
        start_all(job);
    }
}
