//! The lifecycle of the engine side as typed events: a worker session's (udf §4.1) and, for
//! a `worker::dispatcher::Dispatcher` (feature `tokio`), its worker processes' (udf §6.1–§6.6),
//! in one [`WorkerEvent`] type so that one listener sees a worker's and its sessions'
//! events in the order they happened; and the session's observer, which turns what a
//! session's core decided into those events and, for a dispatcher's sessions, into the
//! metrics of [`METRICS`] (see [`observe`](crate::observe) for the channel and the metric
//! table).
//!
//! A session's events are decided by its [`EngineCore`](super::EngineCore) (created,
//! initialized, terminated: the udf §4.1 states it reaches); the async session only forwards
//! what the core queued, after each step. A worker process's events are decided by the
//! dispatcher's own state machine (its `events.rs`), which sends them through the observer
//! of its sessions.

// Without `tokio` there is no dispatcher: nothing registers metrics or reports a process.
#![cfg_attr(not(feature = "tokio"), allow(dead_code))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::Unit::Count;
use uuid::Uuid;

use super::termination::{Termination, TerminationKind};
use crate::observe::{
    EVENTS_DROPPED, EventSender, LocalCounter, LocalGauge, Metric, PublishLock, describe,
};
use crate::time::Timer;

/// One lifecycle event of a worker session or of a worker process: when, whose, and what
/// ([`WorkerEventKind`]). The ids are those Spark's worker logs carry: the worker's
/// (`WorkerHandle.id`, udf §3) and, for session events, the session's (`sessionId`, udf §4.0
/// v2). See [`observe`](crate::observe) for how to receive them.
#[derive(Debug, Clone)]
pub struct WorkerEvent {
    /// When, on the sessions' clock ([`SessionConfig::timer`](super::SessionConfig::timer)).
    pub at: Instant,
    /// The worker: [`WorkerHandle::id`](super::WorkerHandle::id) (udf §3), the
    /// `--id` a dispatcher passed to its process (udf §6.2 step 4).
    pub worker: Arc<str>,
    /// The session ([`Session::id`](super::Session::id)) for session events; `None`
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
        /// The outcome, as [`Session::close`](super::Session::close) returns it
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
    /// [`WorkerHandle::mark_invalid`](super::WorkerHandle::mark_invalid) was called
    /// outside a session's finalization (udf §6.1 `markInvalid`).
    Marked,
}

impl InvalidationReason {
    /// Its label in `tether_udf_workers_invalidated_total{reason}`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::TransportFailed => "transport_failed",
            Self::Interrupted => "interrupted",
            Self::OpenFailed => "open_failed",
            Self::Exited => "exited",
            Self::Inactive => "inactive",
            Self::Marked => "marked",
        }
    }

    /// Every reason, in the order of a dispatcher's series.
    pub(crate) const ALL: [Self; 6] = [
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

    /// Every reason, in the order of a dispatcher's series.
    pub(crate) const ALL: [Self; 5] = [
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

/// What an [`EngineCore`](super::EngineCore) step decided that the observer reports:
/// queued by the core, drained by the session after the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionLifecycle {
    Created,
    Initialized,
    /// The core's terminal was settled (the session reads it from the core).
    Terminated,
}

const SESSIONS: Metric = Metric::gauge(
    "tether_udf_sessions",
    Count,
    "Live worker sessions (udf §4.1).",
);
const SESSIONS_ENDED: Metric = Metric::counter(
    "tether_udf_sessions_total",
    Count,
    "Worker sessions ended, by termination (udf §4.1).",
);

/// Every metric of a dispatcher's sessions (udf §4.1), and of its event channel: the
/// recorder's descriptions and the sessions' series come from it. The dispatcher's own
/// (its worker processes') are in its `events.rs`.
pub(crate) const METRICS: &[Metric] = &[SESSIONS, SESSIONS_ENDED, EVENTS_DROPPED];

/// The series of a dispatcher's sessions, registered once with the recorder installed when
/// the dispatcher was built (see [`observe`](crate::observe)).
struct SessionMetrics {
    sessions: LocalGauge,
    terminations: [LocalCounter; 5],
    events_dropped: LocalCounter,
    /// Held while publishing (see [`LocalGauge::publish`]).
    publishing: PublishLock,
}

impl SessionMetrics {
    fn register() -> Self {
        describe(METRICS);
        Self {
            sessions: SESSIONS.local_gauge(&[]),
            terminations: TERMINATIONS
                .map(|k| SESSIONS_ENDED.local_counter(&[("termination", termination_label(k))])),
            events_dropped: EVENTS_DROPPED.local_counter(&[("side", "udf")]),
            publishing: PublishLock::default(),
        }
    }

    /// Hands every series to the recorder: after each event (a session's are few, so the
    /// recorder sees them at once).
    fn publish(&self) {
        let _publishing = self.publishing.hold();
        self.sessions.publish();
        for c in &self.terminations {
            c.publish();
        }
        self.events_dropped.publish();
    }
}

/// Where a session's lifecycle goes: the application's event channel if it gave one, and,
/// for a dispatcher's sessions, the dispatcher's session metrics. One per dispatcher (shared
/// by its sessions, and the channel its own events go through), or one per session made with
/// `Session::new` that has a channel.
pub(crate) struct SessionObserver {
    metrics: Option<SessionMetrics>,
    events: Option<EventSender<WorkerEvent>>,
    timer: Arc<dyn Timer>,
}

impl std::fmt::Debug for SessionObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionObserver")
            .field("metrics", &self.metrics.is_some())
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl SessionObserver {
    /// A dispatcher's: its session metrics registered now, events to `events`, stamped on
    /// `timer`.
    pub(crate) fn registered(
        events: Option<EventSender<WorkerEvent>>,
        timer: Arc<dyn Timer>,
    ) -> Self {
        Self {
            metrics: Some(SessionMetrics::register()),
            events,
            timer,
        }
    }

    /// A session's own when no dispatcher made it: events only, if there is a channel.
    pub(crate) fn for_session(
        events: Option<&EventSender<WorkerEvent>>,
        timer: &Arc<dyn Timer>,
    ) -> Option<Arc<Self>> {
        events.map(|tx| {
            Arc::new(Self {
                metrics: None,
                events: Some(tx.clone()),
                timer: timer.clone(),
            })
        })
    }

    /// Whether events are sent (the ids and payloads are then worth building).
    pub(crate) fn listened(&self) -> bool {
        self.events.is_some()
    }

    /// Sends one event of `worker` (of its `session`, for session events), counting it in
    /// `tether_events_dropped_total` if a full channel dropped it.
    pub(crate) fn send(&self, worker: &Arc<str>, session: Option<Uuid>, kind: WorkerEventKind) {
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
            m.publish();
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
                    m.sessions.add(1);
                    m.publish();
                }
                WorkerEventKind::SessionCreated
            }
            SessionLifecycle::Initialized => WorkerEventKind::SessionInitialized,
            SessionLifecycle::Terminated => {
                let Some(termination) = terminal else {
                    return;
                };
                if let Some(m) = &self.metrics {
                    m.sessions.add(-1);
                    let i = TERMINATIONS
                        .iter()
                        .position(|k| *k == termination.kind())
                        .unwrap_or(0);
                    m.terminations[i].increment(1);
                    m.publish();
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
}
