//! A dispatcher's observer: its worker processes' lifecycle (udf §6.1–§6.6: spawned, ready,
//! reused, invalidated, stopped, and the idle pool) turned into the metrics of its table
//! ([`METRICS`]) and, when the application listens, into
//! [`WorkerEvent`](crate::worker::WorkerEvent)s on
//! [`DispatcherConfig::events`](super::DispatcherConfig::events), the channel its sessions
//! report to as well (see [`observe`](crate::observe)).
//!
//! Its series are local, as the execution manager's are, and published right after each
//! event: a dispatcher's events are per process and per session, so the recorder sees each
//! at once.

use std::sync::Arc;
use std::time::Duration;

use metrics::Unit::{Count, Seconds};

use crate::observe::EventSender;
use crate::observe::{LocalCounter, LocalGauge, LocalHistogram, Metric, PublishLock, describe};
use crate::time::Timer;
use crate::worker::engine::SessionObserver;
use crate::worker::{InvalidationReason, StopReason, WorkerEvent, WorkerEventKind};

const WORKERS: Metric = Metric::gauge(
    "tether_udf_workers",
    Count,
    "Worker processes spawned and not yet stopped (udf §6.1).",
);
const IDLE_WORKERS: Metric = Metric::gauge(
    "tether_udf_idle_workers",
    Count,
    "Idle workers waiting for reuse (udf §6.6).",
);
const SPAWNED: Metric = Metric::counter(
    "tether_udf_workers_spawned_total",
    Count,
    "Worker processes started (udf §6.2).",
);
const REUSED: Metric = Metric::counter(
    "tether_udf_workers_reused_total",
    Count,
    "Sessions given an idle pooled worker (udf §6.6).",
);
const INVALIDATED: Metric = Metric::counter(
    "tether_udf_workers_invalidated_total",
    Count,
    "Workers judged unsafe to reuse, by reason (udf §6.5).",
);
const STOPPED: Metric = Metric::counter(
    "tether_udf_workers_stopped_total",
    Count,
    "Worker processes stopped and reaped, by reason (udf §6.1).",
);
const STARTUP_SECONDS: Metric = Metric::histogram(
    "tether_udf_worker_startup_seconds",
    Seconds,
    "From a worker's spawn to its readiness (udf §6.4).",
);

/// Every metric of a dispatcher's worker processes (udf §6): the recorder's descriptions and
/// the dispatcher's series come from it. Its sessions' are the engine side's
/// (`worker/engine/events.rs`).
pub(crate) const METRICS: &[Metric] = &[
    WORKERS,
    IDLE_WORKERS,
    SPAWNED,
    REUSED,
    INVALIDATED,
    STOPPED,
    STARTUP_SECONDS,
];

/// The series of one dispatcher's worker processes, registered once with the recorder
/// installed when it was built (see [`observe`](crate::observe)).
struct DispatcherMetrics {
    workers: LocalGauge,
    idle: LocalGauge,
    spawned: LocalCounter,
    reused: LocalCounter,
    invalidated: [LocalCounter; 6],
    stopped: [LocalCounter; 5],
    startup_seconds: LocalHistogram,
    /// Held while publishing (see `LocalGauge::publish`).
    publishing: PublishLock,
}

impl DispatcherMetrics {
    fn register() -> Self {
        describe(METRICS);
        Self {
            workers: WORKERS.local_gauge(&[]),
            idle: IDLE_WORKERS.local_gauge(&[]),
            spawned: SPAWNED.local_counter(&[]),
            reused: REUSED.local_counter(&[]),
            invalidated: InvalidationReason::ALL
                .map(|r| INVALIDATED.local_counter(&[("reason", r.label())])),
            stopped: StopReason::ALL.map(|r| STOPPED.local_counter(&[("reason", r.label())])),
            startup_seconds: STARTUP_SECONDS.local_histogram(&[]),
            publishing: PublishLock::default(),
        }
    }

    /// Hands the counters and gauges to the recorder (after each event; the start-up
    /// histogram is published where it is recorded).
    fn publish(&self) {
        let _publishing = self.publishing.hold();
        self.workers.publish();
        self.idle.publish();
        self.spawned.publish();
        self.reused.publish();
        for c in self.invalidated.iter().chain(&self.stopped) {
            c.publish();
        }
    }
}

/// Where a dispatcher's lifecycle goes: its worker processes' metrics, and the events of its
/// workers and sessions through one [`SessionObserver`] (the sessions' metrics, the event
/// channel). Shared by a dispatcher and its workers.
pub(crate) struct DispatcherObserver {
    metrics: DispatcherMetrics,
    sessions: Arc<SessionObserver>,
}

impl std::fmt::Debug for DispatcherObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatcherObserver")
            .field("sessions", &self.sessions)
            .finish_non_exhaustive()
    }
}

impl DispatcherObserver {
    /// A dispatcher's observer: its and its sessions' series registered now, events to
    /// `events`, stamped on `timer` (the sessions' clock).
    pub(crate) fn registered(
        events: Option<EventSender<WorkerEvent>>,
        timer: Arc<dyn Timer>,
    ) -> Self {
        Self {
            metrics: DispatcherMetrics::register(),
            sessions: Arc::new(SessionObserver::registered(events, timer)),
        }
    }

    /// The observer the dispatcher's sessions report to.
    pub(crate) fn sessions(&self) -> &Arc<SessionObserver> {
        &self.sessions
    }

    fn send(&self, worker: &Arc<str>, kind: WorkerEventKind) {
        self.sessions.send(worker, None, kind);
    }

    /// A worker process was started.
    pub(crate) fn spawned(&self, worker: &Arc<str>, pid: u32) {
        let m = &self.metrics;
        m.spawned.increment(1);
        m.workers.add(1);
        m.publish();
        self.send(worker, WorkerEventKind::WorkerSpawned { pid });
    }

    /// A worker became reachable `startup` after its spawn.
    pub(crate) fn ready(&self, worker: &Arc<str>, startup: Duration) {
        let m = &self.metrics;
        m.startup_seconds.record(startup);
        {
            let _publishing = m.publishing.hold();
            m.startup_seconds.publish();
        }
        self.send(worker, WorkerEventKind::WorkerReady { startup });
    }

    /// An idle worker was taken for a session.
    pub(crate) fn reused(&self, worker: &Arc<str>) {
        self.metrics.reused.increment(1);
        self.metrics.publish();
        self.send(worker, WorkerEventKind::WorkerReused);
    }

    /// A worker was invalidated (once per worker: the caller checks).
    pub(crate) fn invalidated(&self, worker: &Arc<str>, reason: InvalidationReason) {
        let i = InvalidationReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.metrics.invalidated[i].increment(1);
        self.metrics.publish();
        self.send(worker, WorkerEventKind::WorkerInvalidated { reason });
    }

    /// A worker process was stopped and reaped.
    pub(crate) fn stopped(&self, worker: &Arc<str>, reason: StopReason) {
        let m = &self.metrics;
        let i = StopReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        m.stopped[i].increment(1);
        m.workers.add(-1);
        m.publish();
        self.send(worker, WorkerEventKind::WorkerStopped { reason });
    }

    /// A worker entered (`true`) or left (`false`) the idle pool.
    pub(crate) fn idle(&self, entered: bool) {
        self.metrics.idle.add(if entered { 1 } else { -1 });
        self.metrics.publish();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::{DispatcherObserver, METRICS};
    use crate::observe::described_and_registered;
    use crate::time::ManualClock;

    #[test]
    fn every_series_of_a_dispatcher_is_of_a_metric_of_its_tables() {
        let (described, registered) = described_and_registered(|| {
            DispatcherObserver::registered(None, Arc::new(ManualClock::new()));
        });
        let tables: BTreeSet<String> = METRICS
            .iter()
            .chain(crate::worker::engine::events::METRICS)
            .map(|m| m.name.to_owned())
            .collect();
        assert_eq!(described, tables, "every metric of the tables is described");
        assert_eq!(
            registered, tables,
            "every series is of a metric of the tables, and back"
        );
    }
}
