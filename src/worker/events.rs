//! The lifecycle of worker sessions and worker processes as typed events (udf §4.1 for
//! sessions, udf §6.1–§6.6 for the processes a dispatcher runs), and the metrics derived from
//! them at the same place (see [`observe`](crate::observe) for the channel and the metric
//! table).
//!
//! A session's events are decided by its [`EngineCore`](super::engine::EngineCore) (created,
//! initialized, terminated: the udf §4.1 states it reaches); the async session only forwards
//! what the core queued, after each step. A worker process's events are decided by the
//! dispatcher's own state machine (spawned, ready, reused, invalidated, stopped: its spawn,
//! its readiness wait, the pool's acquire and release, its stop jobs). Both go to the same
//! channel, [`SessionConfig::events`](super::engine::SessionConfig::events),
//! so one listener sees a worker's and its sessions' events in the order they happened.

// Without `tokio` there is no dispatcher: nothing registers metrics or reports a process.
#![cfg_attr(not(feature = "tokio"), allow(dead_code))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram};
use uuid::Uuid;

use crate::observe::{EventSender, Metric};
use crate::time::Timer;
use crate::worker::engine::{SessionConfig, Termination, TerminationKind};

/// One lifecycle event of a worker session or of a worker process: when, whose, and what
/// ([`WorkerEventKind`]). The ids are those Spark's worker logs carry: the worker's
/// (`WorkerHandle.id`, udf §3) and, for session events, the session's (`sessionId`, udf §4.0
/// v2). See [`observe`](crate::observe) for how to receive them.
#[derive(Debug, Clone)]
pub struct WorkerEvent {
    /// When, on the sessions' clock ([`SessionConfig::timer`](super::engine::SessionConfig::timer)).
    pub at: Instant,
    /// The worker: [`WorkerHandle::id`](super::engine::WorkerHandle::id) (udf §3), the
    /// `--id` a dispatcher passed to its process (udf §6.2 step 4).
    pub worker: Arc<str>,
    /// The session ([`Session::id`](super::engine::Session::id)) for session events; `None`
    /// for events of the worker process.
    pub session: Option<Uuid>,
    /// What happened.
    pub kind: WorkerEventKind,
}

/// What a [`WorkerEvent`] reports. The first three are a session's (udf §4.1), in this order,
/// each at most once, `SessionTerminated` exactly once for every session finalized. The
/// others are a worker process's, as a `worker::dispatcher::Dispatcher` (feature `tokio`)
/// runs it (udf §6.1, §6.2, §6.6): `WorkerSpawned` first, then `WorkerReady` (unless it is
/// stopped before it became ready), its sessions, `WorkerReused` each time the pool hands
/// it out again, at most one `WorkerInvalidated` (none once the dispatcher decided to stop
/// the worker: a session that fails on a worker being stopped does not judge it), and
/// `WorkerStopped` last, but for the `SessionTerminated` of a session still running when
/// the dispatcher's close stopped its worker, which may come after it (its
/// `TransportFailed` outcome says so: the `WorkerLost` in it names the stop).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum WorkerEventKind {
    /// A session was created on the worker (udf §4.1 `Created`; udf §6.2 step 6
    /// `newSession`).
    SessionCreated,
    /// The worker accepted the session's `Init` (udf §4.1 `Initialized`: an `InitResponse`
    /// without error, udf §4.6).
    SessionInitialized,
    /// The session settled its one outcome (udf §4.1 `Terminal`, §4.2 `completeTerminal`).
    SessionTerminated {
        /// The outcome, as [`Session::close`](super::engine::Session::close) returns it
        /// (udf §5.3).
        termination: Termination,
    },
    /// A worker process was started (udf §6.2 step 4).
    WorkerSpawned {
        /// Its process id.
        pid: u32,
    },
    /// The transport reached the worker: it can serve sessions (udf §6.4 readiness).
    WorkerReady {
        /// From the spawn to readiness (the start-up time, bounded by the spec's
        /// `initialization_timeout_ms`, udf §7).
        startup: Duration,
    },
    /// An idle pooled worker was taken for a new session instead of a new process
    /// (udf §6.6).
    WorkerReused,
    /// The worker was judged unsafe to reuse; it is stopped, never recycled (udf §6.5).
    WorkerInvalidated {
        /// Why.
        reason: InvalidationReason,
    },
    /// The worker process was stopped and reaped, its socket removed (udf §6.1 `close`).
    WorkerStopped {
        /// Why it was stopped.
        reason: StopReason,
    },
}

/// Why a worker was invalidated (udf §6.5: invalid is sticky, never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum InvalidationReason {
    /// A session on it ended [`TransportFailed`](Termination::TransportFailed) (udf §4.1,
    /// §6.5: a transport error, a worker crash or kill, a protocol violation, a timeout).
    TransportFailed,
    /// A session on it ended [`Interrupted`](Termination::Interrupted) (udf §4.9, §6.5).
    Interrupted,
    /// No session connection could be opened on it (udf §6.2 step 6).
    OpenFailed,
    /// Its process had exited when the pool checked it for reuse (udf §6.1 `isAlive`,
    /// §6.6).
    Exited,
    /// Its transport channel was no longer active when the pool checked it for reuse
    /// (udf §6.1 `isAlive`: `connection.isActive`, §6.6).
    Inactive,
    /// [`WorkerHandle::mark_invalid`](super::engine::WorkerHandle::mark_invalid) was called
    /// outside a session's finalization (udf §6.1 `markInvalid`).
    Marked,
}

impl InvalidationReason {
    fn label(self) -> &'static str {
        match self {
            Self::TransportFailed => "transport_failed",
            Self::Interrupted => "interrupted",
            Self::OpenFailed => "open_failed",
            Self::Exited => "exited",
            Self::Inactive => "inactive",
            Self::Marked => "marked",
        }
    }

    const ALL: [Self; 6] = [
        Self::TransportFailed,
        Self::Interrupted,
        Self::OpenFailed,
        Self::Exited,
        Self::Inactive,
        Self::Marked,
    ];
}

/// Why a worker process was stopped (udf §6.1 `close`: SIGTERM, grace, SIGKILL, reap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// Its last session was released and it was not kept for reuse: no pool, a full pool,
    /// or a spec without `supports_reuse` (udf §6.2 `onLastSessionReleased`, the pool of
    /// size zero).
    Released,
    /// It was invalid or found unhealthy (udf §6.5; a [`WorkerInvalidated`](WorkerEventKind::WorkerInvalidated)
    /// came before).
    Invalid,
    /// It stayed idle in the pool past the idle timeout (udf §6.6 idle-timeout reaping).
    IdleTimeout,
    /// It never became ready, or the `create_session` that started it failed or was
    /// dropped (udf §6.2 step 4: SIGKILL and reap).
    StartFailed,
    /// The dispatcher closed (udf §6.2 `close`).
    DispatcherClosed,
}

impl StopReason {
    /// Its metric label (`tether_udf_workers_stopped_total{reason}`), also used in messages.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Invalid => "invalid",
            Self::IdleTimeout => "idle_timeout",
            Self::StartFailed => "start_failed",
            Self::DispatcherClosed => "closed",
        }
    }

    const ALL: [Self; 5] = [
        Self::Released,
        Self::Invalid,
        Self::IdleTimeout,
        Self::StartFailed,
        Self::DispatcherClosed,
    ];
}

/// The label of an outcome in `tether_udf_sessions_total`.
fn termination_label(kind: TerminationKind) -> &'static str {
    match kind {
        TerminationKind::Finished => "finished",
        TerminationKind::Cancelled => "cancelled",
        TerminationKind::Failed => "failed",
        TerminationKind::TransportFailed => "transport_failed",
        TerminationKind::Interrupted => "interrupted",
    }
}

const TERMINATIONS: [TerminationKind; 5] = [
    TerminationKind::Finished,
    TerminationKind::Cancelled,
    TerminationKind::Failed,
    TerminationKind::TransportFailed,
    TerminationKind::Interrupted,
];

/// What an [`EngineCore`](super::engine::EngineCore) step decided that the observer reports:
/// queued by the core, drained by the session after the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionLifecycle {
    Created,
    Initialized,
    /// The core's terminal was settled (the session reads it from the core).
    Terminated,
}

/// The metric handles of one dispatcher, registered once with the recorder installed when it
/// was built (see [`observe`](crate::observe)).
struct Metrics {
    sessions: Gauge,
    terminations: [Counter; 5],
    workers: Gauge,
    idle: Gauge,
    spawned: Counter,
    reused: Counter,
    invalidated: [Counter; 6],
    stopped: [Counter; 5],
    startup_seconds: Histogram,
    events_dropped: Counter,
}

/// Every metric of a dispatcher with its unit and description (the table of
/// [`observe`](crate::observe), udf §4.1, §6), for the recorder's `# HELP` lines.
const DESCRIBED: &[Metric] = {
    use metrics::Unit::{Count, Seconds};
    &[
        Metric::gauge(
            "tether_udf_sessions",
            Count,
            "Live worker sessions (udf §4.1).",
        ),
        Metric::counter(
            "tether_udf_sessions_total",
            Count,
            "Worker sessions ended, by termination (udf §4.1).",
        ),
        Metric::gauge(
            "tether_udf_workers",
            Count,
            "Worker processes spawned and not yet stopped (udf §6.1).",
        ),
        Metric::gauge(
            "tether_udf_idle_workers",
            Count,
            "Idle workers waiting for reuse (udf §6.6).",
        ),
        Metric::counter(
            "tether_udf_workers_spawned_total",
            Count,
            "Worker processes started (udf §6.2).",
        ),
        Metric::counter(
            "tether_udf_workers_reused_total",
            Count,
            "Sessions given an idle pooled worker (udf §6.6).",
        ),
        Metric::counter(
            "tether_udf_workers_invalidated_total",
            Count,
            "Workers judged unsafe to reuse, by reason (udf §6.5).",
        ),
        Metric::counter(
            "tether_udf_workers_stopped_total",
            Count,
            "Worker processes stopped and reaped, by reason (udf §6.1).",
        ),
        Metric::histogram(
            "tether_udf_worker_startup_seconds",
            Seconds,
            "From a worker's spawn to its readiness (udf §6.4).",
        ),
    ]
};

impl Metrics {
    fn register() -> Self {
        crate::observe::describe(DESCRIBED);
        Self {
            sessions: metrics::gauge!("tether_udf_sessions"),
            terminations: TERMINATIONS.map(|k| {
                metrics::counter!("tether_udf_sessions_total", "termination" => termination_label(k))
            }),
            workers: metrics::gauge!("tether_udf_workers"),
            idle: metrics::gauge!("tether_udf_idle_workers"),
            spawned: metrics::counter!("tether_udf_workers_spawned_total"),
            reused: metrics::counter!("tether_udf_workers_reused_total"),
            invalidated: InvalidationReason::ALL.map(|r| {
                metrics::counter!("tether_udf_workers_invalidated_total", "reason" => r.label())
            }),
            stopped: StopReason::ALL.map(|r| {
                metrics::counter!("tether_udf_workers_stopped_total", "reason" => r.label())
            }),
            startup_seconds: metrics::histogram!("tether_udf_worker_startup_seconds"),
            events_dropped: metrics::counter!("tether_events_dropped_total", "side" => "udf"),
        }
    }
}

/// Where worker-side lifecycle goes: a dispatcher's metrics (none for a session made with
/// `Session::new`), and the application's event channel if it gave one. Shared by a
/// dispatcher, its workers and its sessions.
pub(crate) struct Observer {
    metrics: Option<Metrics>,
    events: Option<EventSender<WorkerEvent>>,
    timer: Arc<dyn Timer>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("metrics", &self.metrics.is_some())
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// A dispatcher's observer: its metric handles registered now, events to
    /// `config.events`, stamped on `config.timer`.
    pub(crate) fn registered(config: &SessionConfig) -> Self {
        Self {
            metrics: Some(Metrics::register()),
            events: config.events.clone(),
            timer: config.timer.clone(),
        }
    }

    /// A session's own observer when no dispatcher made it: events only, if `config` has a
    /// sender.
    pub(crate) fn for_session(config: &SessionConfig) -> Option<Arc<Self>> {
        config.events.as_ref().map(|tx| {
            Arc::new(Self {
                metrics: None,
                events: Some(tx.clone()),
                timer: config.timer.clone(),
            })
        })
    }

    /// Whether events are sent (the ids and payloads are then worth building).
    pub(crate) fn listened(&self) -> bool {
        self.events.is_some()
    }

    fn send(&self, worker: &Arc<str>, session: Option<Uuid>, kind: WorkerEventKind) {
        if let Some(tx) = &self.events
            && !tx.send(WorkerEvent {
                at: self.timer.now(),
                worker: worker.clone(),
                session,
                kind,
            })
            && tx.is_listened()
            && let Some(m) = &self.metrics
        {
            m.events_dropped.increment(1);
        }
    }

    /// One step of a session's lifecycle, as its core queued it; `worker` is `Some` when
    /// [`listened`](Self::listened), `terminal` the core's settled outcome.
    pub(crate) fn session(
        &self,
        worker: Option<&Arc<str>>,
        session: Uuid,
        step: SessionLifecycle,
        terminal: Option<&Termination>,
    ) {
        let kind = match step {
            SessionLifecycle::Created => {
                if let Some(m) = &self.metrics {
                    m.sessions.increment(1.0);
                }
                WorkerEventKind::SessionCreated
            }
            SessionLifecycle::Initialized => WorkerEventKind::SessionInitialized,
            SessionLifecycle::Terminated => {
                let Some(termination) = terminal else {
                    return;
                };
                if let Some(m) = &self.metrics {
                    m.sessions.decrement(1.0);
                    let i = TERMINATIONS
                        .iter()
                        .position(|k| *k == termination.kind())
                        .unwrap_or(0);
                    m.terminations[i].increment(1);
                }
                if !self.listened() {
                    return;
                }
                WorkerEventKind::SessionTerminated {
                    termination: termination.clone(),
                }
            }
        };
        if let Some(worker) = worker {
            self.send(worker, Some(session), kind);
        }
    }

    /// A worker process was started.
    pub(crate) fn spawned(&self, worker: &Arc<str>, pid: u32) {
        if let Some(m) = &self.metrics {
            m.spawned.increment(1);
            m.workers.increment(1.0);
        }
        self.send(worker, None, WorkerEventKind::WorkerSpawned { pid });
    }

    /// A worker became reachable `startup` after its spawn.
    pub(crate) fn ready(&self, worker: &Arc<str>, startup: Duration) {
        if let Some(m) = &self.metrics {
            m.startup_seconds.record(startup.as_secs_f64());
        }
        self.send(worker, None, WorkerEventKind::WorkerReady { startup });
    }

    /// An idle worker was taken for a session.
    pub(crate) fn reused(&self, worker: &Arc<str>) {
        if let Some(m) = &self.metrics {
            m.reused.increment(1);
        }
        self.send(worker, None, WorkerEventKind::WorkerReused);
    }

    /// A worker was invalidated (once per worker: the caller checks).
    pub(crate) fn invalidated(&self, worker: &Arc<str>, reason: InvalidationReason) {
        if let Some(m) = &self.metrics {
            let i = InvalidationReason::ALL
                .iter()
                .position(|r| *r == reason)
                .unwrap_or(0);
            m.invalidated[i].increment(1);
        }
        self.send(worker, None, WorkerEventKind::WorkerInvalidated { reason });
    }

    /// A worker process was stopped and reaped.
    pub(crate) fn stopped(&self, worker: &Arc<str>, reason: StopReason) {
        if let Some(m) = &self.metrics {
            let i = StopReason::ALL
                .iter()
                .position(|r| *r == reason)
                .unwrap_or(0);
            m.stopped[i].increment(1);
            m.workers.decrement(1.0);
        }
        self.send(worker, None, WorkerEventKind::WorkerStopped { reason });
    }

    /// A worker entered (`true`) or left (`false`) the idle pool.
    pub(crate) fn idle(&self, entered: bool) {
        if let Some(m) = &self.metrics {
            if entered {
                m.idle.increment(1.0);
            } else {
                m.idle.decrement(1.0);
            }
        }
    }
}
