//! The lifecycle of sessions and executions as typed events (Spark Connect's listener
//! events, `ExecuteEventsManager` / `SessionEventsManager`, rx §2.1 item 4) plus those only
//! tether knows, and the metrics derived from them at the same place (see
//! [`observe`](crate::observe) for the channel and the metric table).
//!
//! The order of an operation's events is decided by its [`ExecutionCore`](super::ExecutionCore)
//! along Spark's status machine ([`OperationStatus`]); the drivers only forward what the
//! core queued, after each step, under the execution's lock, so that one execution's events
//! reach the channel in the order the core decided them.

use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram};
use smallvec::SmallVec;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use uuid::Uuid;

use super::error::ConnectError;
use super::keys::{ExecuteKey, SessionKey};
use crate::observe::EventSender;

/// Spark's operation status (`ExecuteStatus`, rx §2.1 item 4): the states of the listener
/// events an operation posts, in order `Pending → Started → Analyzed → ReadyForExecution →
/// Finished → Closed`, with `Failed` and `Canceled` as the other ends of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OperationStatus {
    /// Not yet registered.
    Pending,
    /// `SparkListenerConnectOperationStarted`: registered (rx §2.2 T1).
    Started,
    /// `SparkListenerConnectOperationAnalyzed`: the engine analyzed the plan.
    Analyzed,
    /// `SparkListenerConnectOperationReadyForExecution`: the engine is about to execute.
    ReadyForExecution,
    /// `SparkListenerConnectOperationFinished`: the producer finished (rx §2.2 T7), not
    /// when the results were sent (SPARK-45133).
    Finished,
    /// `SparkListenerConnectOperationFailed` (rx §2.2 T8, T15).
    Failed,
    /// `SparkListenerConnectOperationCanceled` (rx §2.2 T9, T12 while running).
    Canceled,
    /// `SparkListenerConnectOperationClosed`: left the registry (rx §2.2 T12).
    Closed,
}

impl OperationStatus {
    /// Whether Spark's status machine allows posting `next` in state `self`
    /// (`ExecuteEventsManager.assertStatus`; rx §2.1 item 4, scenarios rx §7.4 40–44):
    /// Started from Pending; Analyzed from Started or Analyzed; ReadyForExecution from
    /// Analyzed; Finished from Started or ReadyForExecution; Failed from Started, Analyzed,
    /// ReadyForExecution or Finished; Canceled from those and Failed, and from Pending
    /// (SPARK-53339: an execution interrupted or removed before it started); Closed from
    /// Finished, Failed or Canceled.
    pub fn allows(self, next: Self) -> bool {
        use OperationStatus::*;
        match next {
            Pending => false,
            Started => self == Pending,
            Analyzed => matches!(self, Started | Analyzed),
            ReadyForExecution => self == Analyzed,
            Finished => matches!(self, Started | ReadyForExecution),
            Failed => matches!(self, Started | Analyzed | ReadyForExecution | Finished),
            Canceled => matches!(
                self,
                Pending | Started | Analyzed | ReadyForExecution | Finished | Failed
            ),
            Closed => matches!(self, Finished | Failed | Canceled),
        }
    }

    /// Whether the run has ended: Finished, Failed, Canceled or Closed (rx §2.1 item 4).
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            Self::Finished | Self::Failed | Self::Canceled | Self::Closed
        )
    }
}

/// Why Spark's status machine refused an operation event (Spark throws
/// `IllegalStateException` from `ExecuteEventsManager.assertStatus`; rx §7.4 41–44).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("operation status {from:?} does not allow the event {to:?} (rx §2.1 item 4)")]
pub struct IllegalTransition {
    /// The status the operation is in.
    pub from: OperationStatus,
    /// The status the refused event would have moved it to.
    pub to: OperationStatus,
}

/// Why a response stream ended gracefully for rotation (rx §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RotationReason {
    /// The stream was attached for `senderMaxStreamDuration`.
    Duration,
    /// The stream sent more than `senderMaxStreamSize` bytes.
    Bytes,
}

impl RotationReason {
    fn label(self) -> &'static str {
        match self {
            Self::Duration => "duration",
            Self::Bytes => "bytes",
        }
    }
}

/// One lifecycle event of an [`ExecutionManager`](super::ExecutionManager): when, whose, and
/// what ([`ExecutionEventKind`]); the fields Spark's `ExecuteEventsManager` puts on its
/// listener events (rx §2.1 item 4). See [`observe`](crate::observe) for how to receive
/// them.
///
/// As in Spark, the user id travels only on the events that introduce a session or an
/// operation (`SessionStarted`, `SessionClosed`, `OperationStarted`); the others name the
/// session and operation by id, so that an event holds no shared pointer whose count the
/// producing and the listening thread would both write.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionEvent {
    /// When, on the manager's clock ([`ManagerConfig::timer`](super::ManagerConfig::timer);
    /// Spark's `eventTime` is wall-clock milliseconds).
    pub at: Instant,
    /// The session's id (Spark's `sessionId`; the session is `(user_id, session_id)`, rx
    /// §5.1, its user id is on its `SessionStarted` and its operations' `OperationStarted`).
    pub session_id: Uuid,
    /// The operation (Spark's `operationId`), for operation events; `None` for session
    /// events and tombstone hits on a session alone.
    pub operation_id: Option<Uuid>,
    /// What happened.
    pub kind: ExecutionEventKind,
}

impl ExecutionEvent {
    /// The operation's Spark job tag, `SparkConnect_OperationTag_User_<user>_Session_<session>_Operation_<operation>`
    /// (Spark's `ExecuteHolder.jobTag`, rx §2.1), for operation events; `user_id` is the
    /// one its `OperationStarted` carried.
    pub fn job_tag(&self, user_id: &str) -> Option<String> {
        self.operation_id.map(|op| {
            format!(
                "SparkConnect_OperationTag_User_{user_id}_Session_{}_Operation_{op}",
                self.session_id
            )
        })
    }

    /// The user id this event carries: on `SessionStarted`, `SessionClosed` and
    /// `OperationStarted` (Spark's `userId`, rx §2.1 item 4); `None` on the others.
    pub fn user_id(&self) -> Option<&str> {
        match &self.kind {
            ExecutionEventKind::SessionStarted { user_id }
            | ExecutionEventKind::SessionClosed { user_id }
            | ExecutionEventKind::OperationStarted { user_id, .. } => Some(user_id),
            _ => None,
        }
    }
}

/// What an [`ExecutionEvent`] reports (rx §2.1 item 4). The first nine are Spark Connect's
/// listener events, as Spark's `ExecuteEventsManager` and `SessionEventsManager` post them
/// (`SparkListenerConnectSessionStarted`, `…SessionClosed`,
/// `SparkListenerConnectOperationStarted`, `…Analyzed`, `…ReadyForExecution`, `…Finished`,
/// `…Failed`, `…Canceled`, `…Closed`); an operation posts them in the order its
/// [`OperationStatus`] allows, exactly one `OperationClosed` last. The others are tether's.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ExecutionEventKind {
    /// A session was created by the first RPC naming it (rx §5.5).
    SessionStarted {
        /// `UserContext.user_id` (Spark's `userId`).
        user_id: Arc<str>,
    },
    /// A session was released (ReleaseSession) or expired (rx §5.6); its executions were
    /// closed before.
    SessionClosed {
        /// `UserContext.user_id` (Spark's `userId`).
        user_id: Arc<str>,
    },
    /// An execution was registered (rx §2.2 T1).
    OperationStarted {
        /// `UserContext.user_id` (Spark's `userId`).
        user_id: Arc<str>,
        /// The operation's tags (`ExecutePlanRequest.tags`).
        tags: Vec<String>,
    },
    /// The engine analyzed the plan ([`Producer::analyzed`](super::Producer::analyzed)).
    OperationAnalyzed {
        /// The statement text, as the engine supplied it (Spark puts its rendering of the
        /// plan on `OperationStarted`; tether renders no plan).
        statement_text: Option<String>,
    },
    /// The engine is about to execute
    /// ([`Producer::ready_for_execution`](super::Producer::ready_for_execution)).
    OperationReadyForExecution,
    /// The producer finished (rx §2.2 T7).
    OperationFinished {
        /// The rows of the Arrow batches produced (Spark's `producedRowCount`); `None` when
        /// the execution produced no Arrow batch.
        produced_row_count: Option<u64>,
    },
    /// The producer failed, or vanished without finishing (rx §2.2 T8, T15).
    OperationFailed {
        /// The error's message (Spark's `errorMessage`).
        error_message: String,
    },
    /// The execution was interrupted, or released or abandoned while it ran (rx §2.2 T9,
    /// T12).
    OperationCanceled,
    /// The execution left the registry (rx §2.2 T12); the last event of an operation.
    OperationClosed,
    /// A stream attached to a running execution again: ReattachExecute, or an ExecutePlan
    /// repeating a live operation with the same plan (rx §5.2, §5.5).
    Reattached {
        /// The index of the first response the new stream sends (rx §3.1: responses are
        /// numbered from 1; the one after the client's `last_response_id`).
        resumed_at: u64,
        /// How many responses the new stream resends that an earlier stream had sent.
        replayed: u64,
    },
    /// A stream ended gracefully without `ResultComplete`, for the client to reattach
    /// (rx §4.2).
    StreamRotated {
        /// Which budget ran out.
        reason: RotationReason,
    },
    /// ReleaseExecute applied (rx §3.4, §5.5).
    Released {
        /// For `ReleaseUntil`, the index of its `response_id` (rx §3.1: every response up to
        /// it was freed); `None` for `ReleaseAll`.
        until: Option<u64>,
    },
    /// The execution was abandoned: detached too long, or its session closed (rx §5.3,
    /// §5.6); its `OperationClosed` follows.
    Abandoned,
    /// A request was refused by an abandoned-operation tombstone (`OPERATION_ABANDONED`,
    /// rx §5.4).
    TombstoneHit,
    /// The producer waits for the shared memory budget (tether's bound over rx §3.1).
    ProducerWaiting {
        /// The size of the response that does not fit, in bytes.
        bytes: u64,
    },
}

/// What a core step decided that the observer reports: queued by the
/// [`ExecutionCore`](super::ExecutionCore), drained by the driver after the step. 16 bytes
/// (the rare text payloads are thin boxes), so that the few a step queues stay inline.
#[derive(Debug, Clone, PartialEq)]
// The boxed strings are thin pointers (8 bytes, a `String` is 24): the rare texts keep every
// queued item at 16 bytes.
#[allow(clippy::box_collection)]
pub(crate) enum Lifecycle {
    Analyzed(Option<Box<String>>),
    ReadyForExecution,
    /// `producedRowCount`, or [`NO_ROWS`].
    Finished(u64),
    Failed(Box<String>),
    Canceled,
    Closed(super::Removal),
    /// A reattach; what it reported is the batch's [`Reattach`] (one per step).
    Reattached,
    Rotated(RotationReason),
    /// ReleaseUntil up to this index.
    ReleasedUntil(u64),
}

/// [`Lifecycle::Finished`] of an execution that produced no Arrow batch.
pub(crate) const NO_ROWS: u64 = u64::MAX;

impl Lifecycle {
    /// The operation status a status event moves to; `None` for tether's own events.
    pub(crate) fn status(&self) -> Option<OperationStatus> {
        Some(match self {
            Self::Analyzed(_) => OperationStatus::Analyzed,
            Self::ReadyForExecution => OperationStatus::ReadyForExecution,
            Self::Finished(_) => OperationStatus::Finished,
            Self::Failed(_) => OperationStatus::Failed,
            Self::Canceled => OperationStatus::Canceled,
            Self::Closed(_) => OperationStatus::Closed,
            Self::Reattached | Self::Rotated(_) | Self::ReleasedUntil(_) => return None,
        })
    }
}

/// A reattach's report (rx §5.5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reattach {
    /// The index of the first response the new stream sends.
    pub(crate) resumed_at: u64,
    pub(crate) replayed: u32,
    /// How long the execution was detached before it, in milliseconds (a gap beyond
    /// `u32::MAX - 1` ms, 49 days, saturates); `u32::MAX` when it was attached.
    pub(crate) detached_ms: u32,
}

/// What one execution's core decided since its driver last looked: the events, and the
/// details of its reattach if one of them is.
#[derive(Debug, Default)]
pub(crate) struct LifecycleBatch {
    pub(crate) events: SmallVec<[Lifecycle; 2]>,
    pub(crate) reattach: Reattach,
}

impl LifecycleBatch {
    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// A counter of the facade, counted here and handed to the recorder at each maintenance
/// pass ([`Metrics::publish`]): an increment is one relaxed atomic add on the manager's own
/// memory, not a call into the recorder (which, for a Prometheus recorder, is two atomics
/// behind a virtual call). Published as the increase since the last publication, so that the
/// counters of several managers in one process add up.
pub(crate) struct LocalCounter {
    handle: Counter,
    count: AtomicU64,
    published: AtomicU64,
}

impl LocalCounter {
    fn of(handle: Counter) -> Self {
        Self {
            handle,
            count: AtomicU64::new(0),
            published: AtomicU64::new(0),
        }
    }

    pub(crate) fn increment(&self, n: u64) {
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    fn publish(&self) {
        let now = self.count.load(Ordering::Relaxed);
        let before = self.published.swap(now, Ordering::Relaxed);
        if now > before {
            self.handle.increment(now - before);
        }
    }
}

/// A histogram of the facade recorded on the manager's own memory and handed to the
/// recorder at each maintenance pass ([`Metrics::publish`]), as [`LocalCounter`] does for
/// counters: a sample is one relaxed atomic add to a bucket, not a call into the recorder
/// (which, for `metrics-exporter-prometheus`, is a virtual call and a push into a growing
/// sample buffer: about 45 ns per sample in the registry benchmark, `docs/benchmarks.md`).
///
/// Samples are durations in nanoseconds, bucketed log-linearly: values below 32 ns each
/// have a bucket; above, each power of two is split into 32 equal buckets, so that a bucket
/// is at most 1/32 (3.1 %) of its values wide. A bucket is published as that many samples of
/// its midpoint, in seconds: a published value is within 1.6 % of the value recorded, which
/// is finer than the buckets or quantiles of any exporter built on it.
pub(crate) struct LocalHistogram {
    handle: Histogram,
    /// Samples since the last publication, by bucket ([`LocalHistogram::bucket`]).
    counts: Box<[AtomicU64]>,
}

/// Sub-buckets per power of two of a [`LocalHistogram`], as a shift (32).
const SUB_BITS: u32 = 5;
/// Buckets of a [`LocalHistogram`]: the 32 exact values below 32 ns, then 32 for each of the
/// 59 powers of two from 2^5 to 2^63 ns.
const BUCKETS: usize = (1 << SUB_BITS) * (64 - SUB_BITS as usize + 1);

impl LocalHistogram {
    fn of(handle: Histogram) -> Self {
        Self {
            handle,
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The bucket of a duration of `nanos` nanoseconds.
    fn bucket(nanos: u64) -> usize {
        let sub = 1u64 << SUB_BITS;
        if nanos < sub {
            return nanos as usize;
        }
        let power = 63 - nanos.leading_zeros(); // ≥ SUB_BITS
        let shift = power - SUB_BITS;
        let within = (nanos >> shift) - sub; // 0..32
        (sub as usize) * (shift as usize + 1) + within as usize
    }

    /// The midpoint of `bucket`, in seconds.
    fn midpoint_seconds(bucket: usize) -> f64 {
        let sub = 1usize << SUB_BITS;
        if bucket < sub {
            return bucket as f64 / 1e9;
        }
        let shift = (bucket / sub - 1) as i32;
        let within = (bucket % sub) as f64;
        let width = 2f64.powi(shift);
        ((sub as f64 + within) * width + width / 2.0) / 1e9
    }

    /// Records one duration.
    pub(crate) fn record(&self, d: std::time::Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[Self::bucket(nanos)].fetch_add(1, Ordering::Relaxed);
    }

    fn publish(&self) {
        for (bucket, count) in self.counts.iter().enumerate() {
            // Relaxed suffices: a sample counted after the load is published the next time.
            if count.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let n = count.swap(0, Ordering::Relaxed);
            self.handle.record_many(
                Self::midpoint_seconds(bucket),
                usize::try_from(n).unwrap_or(usize::MAX),
            );
        }
    }
}

/// A gauge of the facade set from a sample of one manager's state: published as the change
/// since its last sample, so that the gauges of several managers in one process add up.
pub(crate) struct LocalGauge {
    handle: Gauge,
    /// The last sample, as `f64` bits.
    last: AtomicU64,
}

impl LocalGauge {
    fn of(handle: Gauge) -> Self {
        Self {
            handle,
            last: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn set(&self, value: f64) {
        let before = f64::from_bits(self.last.swap(value.to_bits(), Ordering::Relaxed));
        let change = value - before;
        if change != 0.0 {
            self.handle.increment(change);
        }
    }
}

/// The metric handles of one manager, registered once with the recorder installed when it
/// was built (see [`observe`](crate::observe)).
pub(crate) struct Metrics {
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
    events_dropped: LocalCounter,
}

/// Every metric of the execution manager with its unit and description (the table of
/// [`observe`](crate::observe)), for the recorder's `# HELP` lines.
const DESCRIBED: &[(&str, metrics::Unit, &str)] = {
    use metrics::Unit::{Bytes, Count, Seconds};
    &[
        (
            "tether_connect_sessions",
            Count,
            "Live Spark Connect sessions (rx §5.6).",
        ),
        (
            "tether_connect_sessions_started_total",
            Count,
            "Sessions created.",
        ),
        (
            "tether_connect_sessions_closed_total",
            Count,
            "Sessions released or expired.",
        ),
        (
            "tether_connect_executions",
            Count,
            "Live (registered) executions (rx §5.1).",
        ),
        (
            "tether_connect_executions_started_total",
            Count,
            "Executions registered (OperationStarted).",
        ),
        (
            "tether_connect_executions_ended_total",
            Count,
            "Executions whose run ended, by status.",
        ),
        (
            "tether_connect_executions_closed_total",
            Count,
            "Executions that left the registry (OperationClosed), by removal.",
        ),
        (
            "tether_connect_attached_streams",
            Count,
            "Response streams attached (rx §4.4).",
        ),
        (
            "tether_connect_reattaches_total",
            Count,
            "Streams attached again to a running execution (rx §5.5).",
        ),
        (
            "tether_connect_replayed_responses_total",
            Count,
            "Responses a reattach resent that an earlier stream had sent.",
        ),
        (
            "tether_connect_stream_rotations_total",
            Count,
            "Streams ended gracefully for rotation, by reason (rx §4.2).",
        ),
        (
            "tether_connect_releases_total",
            Count,
            "ReleaseExecute applied, by kind (rx §3.4).",
        ),
        (
            "tether_connect_tombstone_hits_total",
            Count,
            "Requests refused by an abandoned-operation tombstone (rx §5.4).",
        ),
        (
            "tether_connect_errors_total",
            Count,
            "Errors answered to clients, by Spark condition (rx §1.8).",
        ),
        (
            "tether_connect_memory_budget_used_bytes",
            Bytes,
            "The shared memory budget in use.",
        ),
        (
            "tether_connect_memory_budget_waiting_producers",
            Count,
            "Producers waiting for the memory budget.",
        ),
        (
            "tether_connect_producer_waits_total",
            Count,
            "Times a producer waited for the memory budget.",
        ),
        (
            "tether_connect_unsent_bytes",
            Bytes,
            "Responses produced and not yet sent (rx §3.1).",
        ),
        (
            "tether_connect_retained_bytes",
            Bytes,
            "Responses sent and kept for a reattach (rx §3.1).",
        ),
        (
            "tether_connect_execution_seconds",
            Seconds,
            "From OperationStarted to the run's end.",
        ),
        (
            "tether_connect_reattach_gap_seconds",
            Seconds,
            "How long an execution was detached before a reattach resumed it.",
        ),
        (
            "tether_events_dropped_total",
            Count,
            "Events a full channel dropped, by side.",
        ),
    ]
};

impl Metrics {
    fn register() -> Self {
        crate::observe::describe(DESCRIBED);
        let ended = |status: &'static str| {
            LocalCounter::of(
                metrics::counter!("tether_connect_executions_ended_total", "status" => status),
            )
        };
        let closed = |removal: &'static str| {
            LocalCounter::of(
                metrics::counter!("tether_connect_executions_closed_total", "removal" => removal),
            )
        };
        let rotations = |reason: RotationReason| {
            LocalCounter::of(
                metrics::counter!("tether_connect_stream_rotations_total", "reason" => reason.label()),
            )
        };
        let releases = |kind: &'static str| {
            LocalCounter::of(metrics::counter!("tether_connect_releases_total", "kind" => kind))
        };
        Self {
            sessions: LocalGauge::of(metrics::gauge!("tether_connect_sessions")),
            sessions_started: LocalCounter::of(metrics::counter!(
                "tether_connect_sessions_started_total"
            )),
            sessions_closed: LocalCounter::of(metrics::counter!(
                "tether_connect_sessions_closed_total"
            )),
            executions: LocalGauge::of(metrics::gauge!("tether_connect_executions")),
            executions_started: LocalCounter::of(metrics::counter!(
                "tether_connect_executions_started_total"
            )),
            ended_finished: ended("finished"),
            ended_failed: ended("failed"),
            ended_canceled: ended("canceled"),
            closed_released: closed("released"),
            closed_abandoned: closed("abandoned"),
            attached_streams: LocalGauge::of(metrics::gauge!("tether_connect_attached_streams")),
            reattaches: LocalCounter::of(metrics::counter!("tether_connect_reattaches_total")),
            replayed: LocalCounter::of(metrics::counter!(
                "tether_connect_replayed_responses_total"
            )),
            rotations_duration: rotations(RotationReason::Duration),
            rotations_bytes: rotations(RotationReason::Bytes),
            releases_until: releases("until"),
            releases_all: releases("all"),
            tombstone_hits: LocalCounter::of(metrics::counter!(
                "tether_connect_tombstone_hits_total"
            )),
            errors: super::condition::ALL
                .iter()
                .map(|c| {
                    let name = c.name();
                    (
                        name,
                        LocalCounter::of(
                            metrics::counter!("tether_connect_errors_total", "condition" => name),
                        ),
                    )
                })
                .collect(),
            errors_other: LocalCounter::of(
                metrics::counter!("tether_connect_errors_total", "condition" => "OTHER"),
            ),
            budget_used: LocalGauge::of(metrics::gauge!("tether_connect_memory_budget_used_bytes")),
            budget_waiting: LocalGauge::of(metrics::gauge!(
                "tether_connect_memory_budget_waiting_producers"
            )),
            producer_waits: LocalCounter::of(metrics::counter!(
                "tether_connect_producer_waits_total"
            )),
            unsent_bytes: LocalGauge::of(metrics::gauge!("tether_connect_unsent_bytes")),
            retained_bytes: LocalGauge::of(metrics::gauge!("tether_connect_retained_bytes")),
            execution_seconds: LocalHistogram::of(metrics::histogram!(
                "tether_connect_execution_seconds"
            )),
            reattach_gap_seconds: LocalHistogram::of(metrics::histogram!(
                "tether_connect_reattach_gap_seconds"
            )),
            events_dropped: LocalCounter::of(
                metrics::counter!("tether_events_dropped_total", "side" => "connect"),
            ),
        }
    }
}

impl Metrics {
    /// Hands every counter's count and every histogram's samples to the recorder.
    fn publish(&self) {
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
            &self.events_dropped,
        ] {
            c.publish();
        }
        for (_, c) in &self.errors {
            c.publish();
        }
        self.execution_seconds.publish();
        self.reattach_gap_seconds.publish();
    }
}

/// Where a manager's lifecycle goes: its metrics, and the application's event channel if
/// it gave one. Shared by the manager and its executions.
pub(crate) struct Observer {
    metrics: Metrics,
    events: Option<EventSender<ExecutionEvent>>,
}

impl Observer {
    pub(crate) fn new(events: Option<EventSender<ExecutionEvent>>) -> Self {
        Self {
            metrics: Metrics::register(),
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
    pub(crate) fn operation_started(&self, at: Instant, key: &ExecuteKey, tags: &[String]) {
        self.metrics.executions_started.increment(1);
        if self.listened() {
            self.send(
                at,
                key.session_id,
                Some(key.operation_id),
                ExecutionEventKind::OperationStarted {
                    user_id: key.user_id.clone(),
                    tags: tags.to_vec(),
                },
            );
        }
    }

    /// A request was refused by a tombstone (rx §5.4).
    pub(crate) fn tombstone_hit(&self, at: Instant, session_id: Uuid, op: Uuid) {
        self.metrics.tombstone_hits.increment(1);
        self.send(at, session_id, Some(op), ExecutionEventKind::TombstoneHit);
    }

    /// An error answered to a client, by RPC or on a response stream (rx §1.8).
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
    pub(crate) fn sample_budget(&self, usage: &super::BudgetUsage) {
        self.metrics.budget_used.set(usage.used as f64);
        self.metrics.budget_waiting.set(usage.waiting as f64);
    }

    /// Samples the registry's gauges: live executions and sessions (rx §5.1, §5.6) and
    /// attached streams (rx §4.4).
    pub(crate) fn sample_registry(&self, executions: usize, sessions: usize, attached: usize) {
        self.metrics.executions.set(executions as f64);
        self.metrics.sessions.set(sessions as f64);
        self.metrics.attached_streams.set(attached as f64);
    }

    /// Samples the unsent and retained bytes of every execution (rx §3.1).
    pub(crate) fn sample_held(&self, unsent: u64, retained: u64) {
        self.metrics.unsent_bytes.set(unsent as f64);
        self.metrics.retained_bytes.set(retained as f64);
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
                        super::Removal::Released => m.closed_released.increment(1),
                        super::Removal::Abandoned => {
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
    use super::LocalHistogram;

    #[test]
    fn a_histogram_bucket_holds_values_within_its_midpoint_s_precision() {
        let mut last = 0;
        for nanos in (0..4096u64)
            .chain((12..64).flat_map(|p| [(1u64 << p) - 1, 1 << p, (1 << p) + 12345]))
            .chain([u64::MAX])
        {
            let b = LocalHistogram::bucket(nanos);
            assert!(b < super::BUCKETS, "{nanos} ns: bucket {b}");
            if nanos < 4096 {
                assert!(b >= last, "buckets grow with the value: {nanos} ns");
                last = b;
            }
            let mid = LocalHistogram::midpoint_seconds(b) * 1e9;
            let error = (mid - nanos as f64).abs() / (nanos as f64).max(1.0);
            assert!(error <= 1.0 / 64.0 + 1e-9, "{nanos} ns → {mid} ns: {error}");
        }
        // The exact buckets below 32 ns, the first split power of two, the last bucket.
        assert_eq!(LocalHistogram::bucket(31), 31);
        assert_eq!(LocalHistogram::bucket(32), 32);
        assert_eq!(LocalHistogram::bucket(64), 64);
        assert_eq!(LocalHistogram::bucket(u64::MAX), super::BUCKETS - 1);
    }

    /// Keeps what the recorder was handed.
    #[derive(Default)]
    struct Samples(std::sync::Mutex<Vec<f64>>);

    impl metrics::HistogramFn for Samples {
        fn record(&self, value: f64) {
            self.0.lock().unwrap().push(value);
        }
    }

    #[test]
    fn a_histogram_publishes_each_sample_once_near_its_value() {
        use std::time::Duration;
        let samples = std::sync::Arc::new(Samples::default());
        let h = LocalHistogram::of(metrics::Histogram::from_arc(samples.clone()));
        let recorded = [
            Duration::ZERO,
            Duration::from_nanos(700),
            Duration::from_micros(250),
            Duration::from_millis(3),
            Duration::from_millis(3),
            Duration::from_secs(90),
        ];
        for d in recorded {
            h.record(d);
        }
        h.publish();
        let mut seen = samples.0.lock().unwrap().clone();
        seen.sort_by(f64::total_cmp);
        assert_eq!(seen.len(), recorded.len());
        for (d, s) in recorded.iter().zip(&seen) {
            let want = d.as_secs_f64();
            assert!((s - want).abs() <= want / 64.0, "{d:?} published as {s} s");
        }
        // Published once: a second pass with nothing new hands over nothing.
        h.publish();
        assert_eq!(samples.0.lock().unwrap().len(), recorded.len());
        h.record(Duration::from_millis(1));
        h.publish();
        assert_eq!(samples.0.lock().unwrap().len(), recorded.len() + 1);
    }
}
