//! The lifecycle of sessions and executions as typed events (Spark Connect's listener
//! events, `ExecuteEventsManager` / `SessionEventsManager`, rx §2.1 item 4) plus those only
//! tether knows, and what a core step queues for them ([`Lifecycle`]); the manager's
//! observer (`observer.rs`) turns those into events and metrics (see
//! [`observe`](crate::observe) for the channel and the metric table).
//!
//! The order of an operation's events is decided by its [`ExecutionCore`](super::ExecutionCore)
//! along Spark's status machine ([`OperationStatus`]); the drivers only forward what the
//! core queued, after each step, under the execution's lock, so that one execution's events
//! reach the channel in the order the core decided them.

use std::sync::Arc;
use std::time::Instant;

use smallvec::SmallVec;
use uuid::Uuid;

use super::status::{OperationStatus, Removal};

/// Why a response stream ended gracefully for rotation (rx §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RotationReason {
    /// The stream was attached for `senderMaxStreamDuration`.
    Duration,
    /// The stream sent more than `senderMaxStreamSize` bytes.
    Bytes,
}

impl RotationReason {
    /// Its label in `tether_connect_stream_rotations_total{reason}`.
    pub(crate) fn label(self) -> &'static str {
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
        /// The ExecutePlan's `x-request-id` and `traceparent` (connect §13), when the server
        /// passed them ([`ExecutionManager::execute_plan_correlated`](super::ExecutionManager::execute_plan_correlated)).
        correlation: super::Correlation,
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
    Closed(Removal),
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
