//! An execution manager's observer: what its cores and registry decided, turned into the
//! metrics of its table ([`METRICS`]) and, when the application listens, into
//! [`ExecutionEvent`]s (see [`observe`](crate::observe) for the channel and the metric
//! table). Shared by the manager and its executions.
//!
//! Every series is local ([`LocalCounter`], [`LocalGauge`], [`LocalHistogram`]): a request
//! pays one relaxed atomic add per metric it moves and makes no call into the recorder. The
//! manager samples its gauges and hands everything to the recorder at each maintenance pass
//! ([`ExecutionObserver::publish`]).

use std::time::{Duration, Instant};

use metrics::Unit::{Bytes, Count, Seconds};
use uuid::Uuid;

use super::budget::BudgetUsage;
use super::condition;
use super::correlation::Correlation;
use super::error::ConnectError;
use super::events::{
    ExecutionEvent, ExecutionEventKind, Lifecycle, LifecycleBatch, NO_ROWS, RotationReason,
};
use super::keys::{ExecuteKey, SessionKey};
use super::status::Removal;
use crate::observe::{
    EVENTS_DROPPED, EventSender, LocalCounter, LocalGauge, LocalHistogram, Metric, PublishLock,
    describe,
};

const SESSIONS: Metric = Metric::gauge(
    "tether_connect_sessions",
    Count,
    "Live Spark Connect sessions (rx §5.6).",
);
const SESSIONS_STARTED: Metric = Metric::counter(
    "tether_connect_sessions_started_total",
    Count,
    "Sessions created.",
);
const SESSIONS_CLOSED: Metric = Metric::counter(
    "tether_connect_sessions_closed_total",
    Count,
    "Sessions released or expired.",
);
const EXECUTIONS: Metric = Metric::gauge(
    "tether_connect_executions",
    Count,
    "Live (registered) executions (rx §5.1).",
);
const EXECUTIONS_STARTED: Metric = Metric::counter(
    "tether_connect_executions_started_total",
    Count,
    "Executions registered (OperationStarted).",
);
const EXECUTIONS_ENDED: Metric = Metric::counter(
    "tether_connect_executions_ended_total",
    Count,
    "Executions whose run ended, by status.",
);
const EXECUTIONS_CLOSED: Metric = Metric::counter(
    "tether_connect_executions_closed_total",
    Count,
    "Executions that left the registry (OperationClosed), by removal.",
);
const ATTACHED_STREAMS: Metric = Metric::gauge(
    "tether_connect_attached_streams",
    Count,
    "Response streams attached (rx §4.4).",
);
const REATTACHES: Metric = Metric::counter(
    "tether_connect_reattaches_total",
    Count,
    "Streams attached again to a running execution (rx §5.5).",
);
const REPLAYED: Metric = Metric::counter(
    "tether_connect_replayed_responses_total",
    Count,
    "Responses a reattach resent that an earlier stream had sent.",
);
const ROTATIONS: Metric = Metric::counter(
    "tether_connect_stream_rotations_total",
    Count,
    "Streams ended gracefully for rotation, by reason (rx §4.2).",
);
const RELEASES: Metric = Metric::counter(
    "tether_connect_releases_total",
    Count,
    "ReleaseExecute applied, by kind (rx §3.4).",
);
const TOMBSTONE_HITS: Metric = Metric::counter(
    "tether_connect_tombstone_hits_total",
    Count,
    "Requests refused by an abandoned-operation tombstone (rx §5.4).",
);
const ERRORS: Metric = Metric::counter(
    "tether_connect_errors_total",
    Count,
    "Errors answered to clients, by Spark condition (rx §1.8).",
);
const BUDGET_USED: Metric = Metric::gauge(
    "tether_connect_memory_budget_used_bytes",
    Bytes,
    "The shared memory budget in use.",
);
const BUDGET_WAITING: Metric = Metric::gauge(
    "tether_connect_memory_budget_waiting_producers",
    Count,
    "Producers waiting for the memory budget.",
);
const PRODUCER_WAITS: Metric = Metric::counter(
    "tether_connect_producer_waits_total",
    Count,
    "Times a producer waited for the memory budget.",
);
const UNSENT_BYTES: Metric = Metric::gauge(
    "tether_connect_unsent_bytes",
    Bytes,
    "Responses produced and not yet sent (rx §3.1).",
);
const RETAINED_BYTES: Metric = Metric::gauge(
    "tether_connect_retained_bytes",
    Bytes,
    "Responses sent and kept for a reattach (rx §3.1).",
);
const EXECUTION_SECONDS: Metric = Metric::histogram(
    "tether_connect_execution_seconds",
    Seconds,
    "From OperationStarted to the run's end.",
);
const REATTACH_GAP_SECONDS: Metric = Metric::histogram(
    "tether_connect_reattach_gap_seconds",
    Seconds,
    "How long an execution was detached before a reattach resumed it.",
);

const ADMISSION_RUNNING: Metric = Metric::gauge(
    "tether_connect_admission_running",
    Count,
    "Executions holding an admission slot (running), when a cap is configured.",
);
const ADMISSION_WAITING: Metric = Metric::gauge(
    "tether_connect_admission_waiting",
    Count,
    "Executions waiting for an admission slot.",
);
const ADMISSION_WAITED: Metric = Metric::counter(
    "tether_connect_admission_waited_total",
    Count,
    "Executions that had to wait for an admission slot.",
);
const ADMISSION_REFUSED: Metric = Metric::counter(
    "tether_connect_admission_refused_total",
    Count,
    "Executions refused while waiting for a slot, by reason.",
);

/// Every metric of an execution manager (the rows of [`observe`](crate::observe)'s table
/// before the `tether_udf_` ones): the recorder's descriptions and the manager's series come
/// from it.
pub(crate) const METRICS: &[Metric] = &[
    SESSIONS,
    SESSIONS_STARTED,
    SESSIONS_CLOSED,
    EXECUTIONS,
    EXECUTIONS_STARTED,
    EXECUTIONS_ENDED,
    EXECUTIONS_CLOSED,
    ATTACHED_STREAMS,
    REATTACHES,
    REPLAYED,
    ROTATIONS,
    RELEASES,
    TOMBSTONE_HITS,
    ERRORS,
    BUDGET_USED,
    BUDGET_WAITING,
    PRODUCER_WAITS,
    UNSENT_BYTES,
    RETAINED_BYTES,
    EXECUTION_SECONDS,
    REATTACH_GAP_SECONDS,
    ADMISSION_RUNNING,
    ADMISSION_WAITING,
    ADMISSION_WAITED,
    ADMISSION_REFUSED,
    EVENTS_DROPPED,
];

/// The series of one manager, registered once with the recorder installed when it was built
/// (see [`observe`](crate::observe)).
struct ExecutionMetrics {
    sessions: LocalGauge,
    sessions_started: LocalCounter,
    sessions_closed: LocalCounter,
    executions: LocalGauge,
    executions_started: LocalCounter,
    ended_finished: LocalCounter,
    ended_failed: LocalCounter,
    ended_canceled: LocalCounter,
    closed_released: LocalCounter,
    closed_abandoned: LocalCounter,
    attached_streams: LocalGauge,
    reattaches: LocalCounter,
    replayed: LocalCounter,
    rotations_duration: LocalCounter,
    rotations_bytes: LocalCounter,
    releases_until: LocalCounter,
    releases_all: LocalCounter,
    tombstone_hits: LocalCounter,
    errors: Vec<(&'static str, LocalCounter)>,
    errors_other: LocalCounter,
    budget_used: LocalGauge,
    budget_waiting: LocalGauge,
    producer_waits: LocalCounter,
    unsent_bytes: LocalGauge,
    retained_bytes: LocalGauge,
    execution_seconds: LocalHistogram,
    reattach_gap_seconds: LocalHistogram,
    admission_running: LocalGauge,
    admission_waiting: LocalGauge,
    admission_waited: LocalCounter,
    admission_refused_timeout: LocalCounter,
    admission_refused_draining: LocalCounter,
    events_dropped: LocalCounter,
    /// Held while publishing: publications do not overlap (a maintenance pass and
    /// `publish_metrics`), so the recorder never falls behind a finished one.
    publishing: PublishLock,
}

impl ExecutionMetrics {
    fn register() -> Self {
        describe(METRICS);
        let ended = |status| EXECUTIONS_ENDED.local_counter(&[("status", status)]);
        let closed = |removal| EXECUTIONS_CLOSED.local_counter(&[("removal", removal)]);
        let rotations =
            |reason: RotationReason| ROTATIONS.local_counter(&[("reason", reason.label())]);
        let releases = |kind| RELEASES.local_counter(&[("kind", kind)]);
        Self {
            sessions: SESSIONS.local_gauge(&[]),
            sessions_started: SESSIONS_STARTED.local_counter(&[]),
            sessions_closed: SESSIONS_CLOSED.local_counter(&[]),
            executions: EXECUTIONS.local_gauge(&[]),
            executions_started: EXECUTIONS_STARTED.local_counter(&[]),
            ended_finished: ended("finished"),
            ended_failed: ended("failed"),
            ended_canceled: ended("canceled"),
            closed_released: closed("released"),
            closed_abandoned: closed("abandoned"),
            attached_streams: ATTACHED_STREAMS.local_gauge(&[]),
            reattaches: REATTACHES.local_counter(&[]),
            replayed: REPLAYED.local_counter(&[]),
            rotations_duration: rotations(RotationReason::Duration),
            rotations_bytes: rotations(RotationReason::Bytes),
            releases_until: releases("until"),
            releases_all: releases("all"),
            tombstone_hits: TOMBSTONE_HITS.local_counter(&[]),
            errors: condition::ALL
                .iter()
                .map(|c| (c.name(), ERRORS.local_counter(&[("condition", c.name())])))
                .collect(),
            errors_other: ERRORS.local_counter(&[("condition", "OTHER")]),
            budget_used: BUDGET_USED.local_gauge(&[]),
            budget_waiting: BUDGET_WAITING.local_gauge(&[]),
            producer_waits: PRODUCER_WAITS.local_counter(&[]),
            unsent_bytes: UNSENT_BYTES.local_gauge(&[]),
            retained_bytes: RETAINED_BYTES.local_gauge(&[]),
            execution_seconds: EXECUTION_SECONDS.local_histogram(&[]),
            reattach_gap_seconds: REATTACH_GAP_SECONDS.local_histogram(&[]),
            admission_running: ADMISSION_RUNNING.local_gauge(&[]),
            admission_waiting: ADMISSION_WAITING.local_gauge(&[]),
            admission_waited: ADMISSION_WAITED.local_counter(&[]),
            admission_refused_timeout: ADMISSION_REFUSED.local_counter(&[("reason", "timeout")]),
            admission_refused_draining: ADMISSION_REFUSED.local_counter(&[("reason", "draining")]),
            events_dropped: EVENTS_DROPPED.local_counter(&[("side", "connect")]),
            publishing: PublishLock::default(),
        }
    }

    /// Hands every series to the recorder.
    fn publish(&self) {
        let _publishing = self.publishing.hold();
        for c in [
            &self.sessions_started,
            &self.sessions_closed,
            &self.executions_started,
            &self.ended_finished,
            &self.ended_failed,
            &self.ended_canceled,
            &self.closed_released,
            &self.closed_abandoned,
            &self.reattaches,
            &self.replayed,
            &self.rotations_duration,
            &self.rotations_bytes,
            &self.releases_until,
            &self.releases_all,
            &self.tombstone_hits,
            &self.errors_other,
            &self.producer_waits,
            &self.admission_waited,
            &self.admission_refused_timeout,
            &self.admission_refused_draining,
            &self.events_dropped,
        ] {
            c.publish();
        }
        for (_, c) in &self.errors {
            c.publish();
        }
        for g in [
            &self.sessions,
            &self.executions,
            &self.attached_streams,
            &self.budget_used,
            &self.budget_waiting,
            &self.unsent_bytes,
            &self.retained_bytes,
            &self.admission_running,
            &self.admission_waiting,
        ] {
            g.publish();
        }
        self.execution_seconds.publish();
        self.reattach_gap_seconds.publish();
    }
}

/// Where a manager's lifecycle goes: its metrics, and the application's event channel if
/// it gave one. Shared by the manager and its executions.
pub(crate) struct ExecutionObserver {
    metrics: ExecutionMetrics,
    events: Option<EventSender<ExecutionEvent>>,
}

impl ExecutionObserver {
    pub(crate) fn new(events: Option<EventSender<ExecutionEvent>>) -> Self {
        Self {
            metrics: ExecutionMetrics::register(),
            events,
        }
    }

    fn send(&self, at: Instant, session_id: Uuid, op: Option<Uuid>, kind: ExecutionEventKind) {
        if let Some(tx) = &self.events
            && !tx.send(ExecutionEvent {
                at,
                session_id,
                operation_id: op,
                kind,
            })
            && tx.is_listened()
        {
            self.metrics.events_dropped.increment(1);
        }
    }

    fn listened(&self) -> bool {
        self.events.is_some()
    }

    /// A session was created (`true`) or closed (`false`).
    pub(crate) fn session(&self, at: Instant, session: &SessionKey, started: bool) {
        let m = &self.metrics;
        if started {
            m.sessions_started.increment(1);
        } else {
            m.sessions_closed.increment(1);
        }
        if self.listened() {
            let user_id = session.user_id.clone();
            let kind = if started {
                ExecutionEventKind::SessionStarted { user_id }
            } else {
                ExecutionEventKind::SessionClosed { user_id }
            };
            self.send(at, session.session_id, None, kind);
        }
    }

    /// An execution was registered (rx §2.2 T1): the registry's decision, reported once the
    /// registry's own notes (the session it may have created) are.
    pub(crate) fn operation_started(
        &self,
        at: Instant,
        key: &ExecuteKey,
        tags: &[String],
        correlation: &Correlation,
    ) {
        self.metrics.executions_started.increment(1);
        if self.listened() {
            self.send(
                at,
                key.session_id,
                Some(key.operation_id),
                ExecutionEventKind::OperationStarted {
                    user_id: key.user_id.clone(),
                    tags: tags.to_vec(),
                    correlation: correlation.clone(),
                },
            );
        }
    }

    /// A request was refused by a tombstone (rx §5.4).
    pub(crate) fn tombstone_hit(&self, at: Instant, session_id: Uuid, op: Uuid) {
        self.metrics.tombstone_hits.increment(1);
        self.send(at, session_id, Some(op), ExecutionEventKind::TombstoneHit);
    }

    /// An error answered to a client (rx §1.8): called by the manager's RPC frame
    /// (`ExecutionManager::rpc`, every RPC handler's) and where a response stream ends, the
    /// only two ways an error reaches a client.
    pub(crate) fn error(&self, error: &ConnectError) {
        let counter = error
            .condition()
            .and_then(|name| self.metrics.errors.iter().find(|(n, _)| *n == name))
            .map_or(&self.metrics.errors_other, |(_, c)| c);
        counter.increment(1);
    }

    /// A `ReleaseAll` (rx §5.5), before the execution's close.
    pub(crate) fn released_all(&self, at: Instant, key: &ExecuteKey) {
        self.metrics.releases_all.increment(1);
        if self.listened() {
            self.send(
                at,
                key.session_id,
                Some(key.operation_id),
                ExecutionEventKind::Released { until: None },
            );
        }
    }

    /// A producer starts waiting for the memory budget.
    pub(crate) fn producer_waiting(&self, at: Instant, key: &ExecuteKey, bytes: u64) {
        self.metrics.producer_waits.increment(1);
        if self.listened() {
            self.send(
                at,
                key.session_id,
                Some(key.operation_id),
                ExecutionEventKind::ProducerWaiting { bytes },
            );
        }
    }

    /// Hands the counters to the recorder (each maintenance pass, and on demand).
    pub(crate) fn publish(&self) {
        self.metrics.publish();
    }

    /// Samples the shared memory budget's gauges.
    pub(crate) fn sample_budget(&self, usage: &BudgetUsage) {
        let m = &self.metrics;
        m.budget_used.set(usage.used);
        m.budget_waiting.set(usage.waiting as u64);
        let _publishing = m.publishing.hold();
        m.budget_used.publish();
        m.budget_waiting.publish();
    }

    /// Samples the registry's gauges: live executions and sessions (rx §5.1, §5.6) and
    /// attached streams (rx §4.4).
    pub(crate) fn sample_registry(&self, executions: usize, sessions: usize, attached: usize) {
        self.metrics.executions.set(executions as u64);
        self.metrics.sessions.set(sessions as u64);
        self.metrics.attached_streams.set(attached as u64);
    }

    /// Samples the admission's gauges: executions holding a slot, and waiting for one.
    pub(crate) fn sample_admission(&self, running: usize, waiting: usize) {
        self.metrics.admission_running.set(running as u64);
        self.metrics.admission_waiting.set(waiting as u64);
    }

    /// An execution had to wait for an admission slot.
    pub(crate) fn admission_waited(&self) {
        self.metrics.admission_waited.increment(1);
    }

    /// A waiting execution was refused: it waited its longest (`timeout`), or the server
    /// began draining.
    pub(crate) fn admission_refused(&self, timeout: bool) {
        if timeout {
            self.metrics.admission_refused_timeout.increment(1);
        } else {
            self.metrics.admission_refused_draining.increment(1);
        }
    }

    /// Samples the unsent and retained bytes of every execution (rx §3.1).
    pub(crate) fn sample_held(&self, unsent: u64, retained: u64) {
        self.metrics.unsent_bytes.set(unsent);
        self.metrics.retained_bytes.set(retained);
    }

    /// What one execution's core decided: metrics, then the events (only built when
    /// someone listens). `started` is when the operation was registered (for the execution
    /// histogram); `now` reads the manager's clock.
    #[inline(never)]
    pub(crate) fn lifecycle(
        &self,
        now: impl FnOnce() -> Instant,
        key: &ExecuteKey,
        started: Instant,
        batch: LifecycleBatch,
    ) {
        let m = &self.metrics;
        let at = now();
        let listened = self.listened();
        let send = |kind: ExecutionEventKind| {
            if listened {
                self.send(at, key.session_id, Some(key.operation_id), kind);
            }
        };
        for event in batch.events {
            let ran_for = || at.saturating_duration_since(started);
            match event {
                Lifecycle::Reattached => {
                    let r = batch.reattach;
                    m.reattaches.increment(1);
                    m.replayed.increment(u64::from(r.replayed));
                    if r.detached_ms != u32::MAX {
                        m.reattach_gap_seconds
                            .record(Duration::from_millis(u64::from(r.detached_ms)));
                    }
                    send(ExecutionEventKind::Reattached {
                        resumed_at: r.resumed_at,
                        replayed: u64::from(r.replayed),
                    });
                }
                Lifecycle::Rotated(reason) => {
                    match reason {
                        RotationReason::Duration => m.rotations_duration.increment(1),
                        RotationReason::Bytes => m.rotations_bytes.increment(1),
                    }
                    send(ExecutionEventKind::StreamRotated { reason });
                }
                Lifecycle::ReleasedUntil(until) => {
                    m.releases_until.increment(1);
                    send(ExecutionEventKind::Released { until: Some(until) });
                }
                Lifecycle::Analyzed(statement_text) => {
                    send(ExecutionEventKind::OperationAnalyzed {
                        statement_text: statement_text.map(|t| *t),
                    });
                }
                Lifecycle::ReadyForExecution => {
                    send(ExecutionEventKind::OperationReadyForExecution);
                }
                Lifecycle::Finished(rows) => {
                    m.ended_finished.increment(1);
                    m.execution_seconds.record(ran_for());
                    send(ExecutionEventKind::OperationFinished {
                        produced_row_count: (rows != NO_ROWS).then_some(rows),
                    });
                }
                Lifecycle::Failed(error_message) => {
                    m.ended_failed.increment(1);
                    m.execution_seconds.record(ran_for());
                    send(ExecutionEventKind::OperationFailed {
                        error_message: *error_message,
                    });
                }
                Lifecycle::Canceled => {
                    m.ended_canceled.increment(1);
                    m.execution_seconds.record(ran_for());
                    send(ExecutionEventKind::OperationCanceled);
                }
                Lifecycle::Closed(removal) => {
                    match removal {
                        Removal::Released => m.closed_released.increment(1),
                        Removal::Abandoned => {
                            m.closed_abandoned.increment(1);
                            send(ExecutionEventKind::Abandoned);
                        }
                    }
                    send(ExecutionEventKind::OperationClosed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{ExecutionMetrics, METRICS};
    use crate::observe::described_and_registered;

    #[test]
    fn every_series_of_a_manager_is_of_a_metric_of_its_table() {
        let (described, registered) = described_and_registered(|| {
            ExecutionMetrics::register();
        });
        let table: BTreeSet<String> = METRICS.iter().map(|m| m.name.to_owned()).collect();
        assert_eq!(described, table, "every metric of the table is described");
        assert_eq!(
            registered, table,
            "every series is of a metric of the table, and back"
        );
    }
}
