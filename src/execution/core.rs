//! One execution's rules as a sans-IO state machine (reattach rx §2, §4).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::budget::{MemoryBudget, Waiter};
use super::error::ConnectError;
use super::events::{Lifecycle, LifecycleBatch, NO_ROWS, Reattach, RotationReason};
use super::log::{Consumed, LogConfig, PushError, ResponseLog, Stamp};
use super::status::{IllegalTransition, OperationStatus, Removal};
use crate::wire::connect::ExecutePlanResponse;
use crate::wire::connect::get_status_response::OperationState;

/// The runner (producer) state machine of rx §2.1 (Spark 4.0+, SPARK-49688).
///
/// Spark's `ExecuteThreadRunner` has one more state, `completing` (producing the final
/// outcome, no longer interruptible; rx §2.2 T7). tether completes atomically under the
/// execution's lock, `Started` → `Completed` in one step, so nothing could ever observe it
/// and it has no variant here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunnerState {
    /// Registered, producer not started. Next: `Started`, or `Interrupted`.
    NotStarted,
    /// Interrupted before it started — terminal; `OPERATION_CANCELED` is stored.
    Interrupted,
    /// Producing responses. Next: `StartedInterrupted`, or `Completed`.
    Started,
    /// Interrupted while running: `OPERATION_CANCELED` is stored, the producer is told to
    /// stop. Next: `Completed` once the producer has stopped.
    StartedInterrupted,
    /// Terminal: the producer finished, failed, stopped after an interrupt, or vanished.
    Completed,
}

impl RunnerState {
    /// Whether the producer may still append responses: runner `started` (rx §2.1).
    pub fn is_running(self) -> bool {
        matches!(self, Self::Started)
    }
}

/// Stream rotation budgets of a reattachable execution's consumer (rx §4.2, §4.5).
/// Non-reattachable executions ignore them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamLimits {
    /// End a stream gracefully (no `ResultComplete`) this long after it attached (Spark's
    /// `spark.connect.execute.reattachable.senderMaxStreamDuration`, default 2 min, rx §4.5).
    /// `None` = unlimited; so is `Some(Duration::ZERO)`, as Spark's 0 (rx §4.2: a deadline
    /// only for a positive duration), rather than a stream that ends before it sends.
    pub max_duration: Option<Duration>,
    /// End a stream gracefully once more than this many bytes were sent on it; the response
    /// that crosses the limit is still sent (Spark's
    /// `spark.connect.execute.reattachable.senderMaxStreamSize`, default 1 GiB, rx §4.2,
    /// §4.5). `None` = unlimited; so is `Some(0)`, as Spark's 0 (rx §4.2: a size limit only
    /// when positive).
    pub max_bytes: Option<u64>,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            max_duration: Some(Duration::from_secs(120)),
            max_bytes: Some(1024 * 1024 * 1024),
        }
    }
}

/// How an execution's producer ended (the runner, rx §2.1 dimension 3):
/// [`ExecutionCore::outcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// It finished successfully (`ResultComplete` for a reattachable execution, rx §2.2 T7).
    Completed,
    /// It failed with this terminal error (rx §2.2 T8).
    Failed(ConnectError),
    /// It was interrupted, or released/abandoned before finishing (`OPERATION_CANCELED`,
    /// rx §2.2 T9, T12).
    Cancelled,
    /// Its producer vanished without finishing (rx §2.2 T15).
    Orphaned,
}

/// The coarse state of an execution, which the [`Execution`](super::Execution) typestates
/// are views of (rx §2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecutionPhase {
    /// Registered; the producer has not started.
    Init,
    /// The producer is running; responses flow.
    Streaming,
    /// The final index is fixed (`ResultComplete` appended, or a terminal error stored, or
    /// the producer vanished); waiting for release.
    Finishing,
    /// Interrupted, or released while the producer was still running; waiting for the
    /// producer to stop and/or for the release.
    Cancelling,
    /// Removed from the registry and the producer stopped.
    Terminated,
}

/// Identifies one attached consumer (one ExecutePlan/ReattachExecute stream). Attaching a
/// new consumer makes every older id stale (rx §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerId(pub u64);

/// How a consumer's stream ended without error: the sender's `onCompleted` (rx §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamEnd {
    /// Every response up to the final index was delivered (for a reattachable execution the
    /// last one carried `ResultComplete`).
    Complete,
    /// Graceful rotation: the time or byte budget of this stream was used up (rx §4.2).
    /// The client must reattach.
    Rotated,
}

#[allow(
    clippy::large_enum_variant,
    reason = "the response is the hot path; boxing it would allocate once per response"
)]
/// What [`ExecutionCore::poll_consumer`] tells a consumer to do next (rx §4.2 main loop,
/// Spark's `ExecuteGrpcResponseSender.execute`).
#[derive(Debug, Clone, PartialEq)]
pub enum ConsumerEvent {
    /// Send this response.
    Response(ExecutePlanResponse),
    /// Nothing to send yet; poll again after a state change or at `wake_at` (the rotation
    /// deadline, if any).
    Pending {
        /// When the stream's time budget runs out, if it has one.
        wake_at: Option<Instant>,
    },
    /// End the stream without error. The consumer is detached.
    End(StreamEnd),
    /// Fail the stream with this error. The consumer is detached.
    Error(ConnectError),
}

/// Why a producer call was refused: the runner state (rx §2.1) or the log (rx §3.2) no
/// longer takes responses, or tether's unsent bound is reached.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProduceError {
    /// The unsent bound is reached; the response is handed back. Wait for the consumer.
    #[error("the unsent-response bound is reached; wait for the consumer")]
    WouldBlock(Box<ExecutePlanResponse>),
    /// The manager's [`MemoryBudget`] is used up (tether's bound over every execution's
    /// unsent and retained responses, rx §3.1); the response is handed back. Wait for other
    /// executions' consumers ([`Producer::push`](super::Producer::push) waits in FIFO
    /// order).
    #[error("the manager's memory budget is used up; wait for consumers to make room")]
    BudgetFull(Box<ExecutePlanResponse>),
    /// The execution was interrupted (rx §2.2 T9): stop producing.
    #[error("the execution was interrupted")]
    Cancelled,
    /// The execution was released or abandoned (rx §2.2 T12): stop producing.
    #[error("the execution was released or abandoned")]
    Closed,
    /// The producer already finished or failed the execution (rx §3.2: nothing may follow
    /// the final index).
    #[error("the execution already finished")]
    Finished,
    /// The execution was not started (runner `notStarted`, rx §2.1).
    #[error("the execution was not started")]
    NotStarted,
}

impl From<PushError> for ProduceError {
    fn from(e: PushError) -> Self {
        match e {
            PushError::WouldBlock(r) => Self::WouldBlock(r),
            PushError::BudgetFull(r) => Self::BudgetFull(r),
            PushError::Finished(_) => Self::Finished,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Cursor {
    id: ConsumerId,
    next: u64,
    deadline: Option<Instant>,
    bytes_sent: u64,
}

/// One execution's rules as a sans-IO state machine: Spark's `ExecuteHolder` with its
/// runner, response observer and senders (reattach rx §2, §4).
///
/// [`ExecutionCore`] holds the [`ResponseLog`], the runner state of rx §2.1, the single attached
/// consumer ("sender", rx §4) with its rotation budget, and the attachment bookkeeping the
/// abandonment pass reads (rx §5.3). It does no I/O, takes no locks and reads no clock: every
/// call that depends on time takes `now`. The async driver ([`ResponseStream`],
/// [`Producer`]) wraps it in a mutex and wakes tasks after each call; the property tests
/// drive it directly.
///
/// # When to call what
///
/// - The producer: [`start`](Self::start) once the registry admitted the execution, then
///   [`push`](Self::push) per response (after [`would_block`](Self::would_block) says there
///   is room), and [`finish`](Self::finish) or [`fail`](Self::fail); check
///   [`producer_must_stop`](Self::producer_must_stop) between responses, and call
///   [`producer_gone`](Self::producer_gone) if it vanishes without either.
/// - A consumer: [`attach`](Self::attach) for ExecutePlan,
///   [`reattach`](Self::reattach) for ReattachExecute (it applies Spark's error order);
///   then [`poll_consumer`](Self::poll_consumer) until it says to wait, and again after
///   each `push`, `finish`, `fail`, `interrupt`, `close` or a preemption (the driver wakes
///   the consumer then) and at the `wake_at` it returned (the rotation deadline, also
///   [`deadline`](Self::deadline)). While the consumer cannot take a response (its
///   transport is not writable), [`poll_interrupt`](Self::poll_interrupt) says whether it
///   must stop. [`detach`](Self::detach) when the consumer's stream goes away.
/// - ReleaseExecute: [`release_until`](Self::release_until); ReleaseAll, abandonment and
///   session close: [`close`](Self::close). Interrupt: [`interrupt`](Self::interrupt).
/// - After any of these, [`outcome`](Self::outcome) tells whether the run's result is
///   final, and [`detached_since`](Self::detached_since) feeds the registry's abandonment
///   pass (rx §5.3).
/// - Spark's operation status ([`status`](Self::status), rx §2.1 item 4) moves with these
///   calls: `Started` at construction, `Finished` / `Failed` / `Canceled` as the run ends,
///   `Closed` with [`close`](Self::close); the engine reports analysis and readiness with
///   [`analyzed`](Self::analyzed) and [`ready_for_execution`](Self::ready_for_execution).
///   Each step queues its lifecycle events (status changes, reattaches, rotations,
///   releases) for the driver, which forwards them to the manager's
///   observer ([`observe`](crate::observe)) when it releases the execution's lock.
///
/// [`ResponseStream`]: super::ResponseStream
/// [`Producer`]: super::Producer
#[derive(Debug)]
pub struct ExecutionCore {
    log: ResponseLog,
    reattachable: bool,
    limits: StreamLimits,
    runner: RunnerState,
    producer_alive: bool,
    orphaned: bool,
    removed: Option<Removal>,
    consumer: Option<Cursor>,
    generation: u64,
    detached_since: Option<Instant>,
    attaches: u64,
    delivered_result_complete: bool,
    /// Whether a consumer was handed the execution's terminal error.
    delivered_error: bool,
    /// Spark's operation status (rx §2.1 item 4): what the events posted so far say.
    status: OperationStatus,
    /// The last of Finished, Failed and Canceled posted (Spark's termination reason,
    /// connect §15.2), once one was.
    ended: Option<OperationStatus>,
    /// The lifecycle this core decided and the driver has not forwarded yet.
    lifecycle: LifecycleBatch,
    /// Rows of the Arrow batches produced (`producedRowCount`), once one was.
    rows: Option<u64>,
    /// The highest response index handed to any consumer (0: none).
    sent_high: u64,
}

impl ExecutionCore {
    /// A registered execution whose producer has not started (runner `NotStarted`). It
    /// counts as attached (the initial ExecutePlan RPC's grace period, rx §2.2 T1) until
    /// its first consumer detaches. A non-reattachable execution gets a retry budget of 0
    /// whatever `log` says (rx §3.1).
    // Inlined, so that a new execution's core is built where it lives rather than moved there.
    #[inline]
    pub fn new(reattachable: bool, log: LogConfig, limits: StreamLimits, stamp: Stamp) -> Self {
        let log = if reattachable {
            log
        } else {
            LogConfig {
                retry_budget: 0,
                ..log
            }
        };
        Self {
            log: ResponseLog::new(log, stamp),
            reattachable,
            limits,
            runner: RunnerState::NotStarted,
            producer_alive: false,
            orphaned: false,
            removed: None,
            consumer: None,
            generation: 0,
            detached_since: None,
            attaches: 0,
            delivered_result_complete: false,
            delivered_error: false,
            status: OperationStatus::Started,
            ended: None,
            // Registered: Spark posts Started with the holder (rx §2.2 T1).
            // Registered (Spark posts Started with the holder, rx §2.2 T1): the registry
            // reports it.
            lifecycle: LifecycleBatch::default(),
            rows: None,
            sent_high: 0,
        }
    }

    /// Spark's operation status (rx §2.1 item 4): the last operation event this core
    /// decided. A new core is [`Started`](OperationStatus::Started) (registered, T1).
    pub fn status(&self) -> OperationStatus {
        self.status
    }

    /// Posts the status event `event` if Spark's status machine allows it from the current
    /// status.
    fn post(&mut self, event: Lifecycle) -> Result<(), IllegalTransition> {
        let Some(to) = event.status() else {
            unreachable!("post takes status events only")
        };
        if !self.status.allows(to) {
            return Err(IllegalTransition {
                from: self.status,
                to,
            });
        }
        self.status = to;
        if matches!(
            to,
            OperationStatus::Finished | OperationStatus::Failed | OperationStatus::Canceled
        ) {
            self.ended = Some(to);
        }
        self.lifecycle.events.push(event);
        Ok(())
    }

    /// The state GetStatus reports for this execution while it is registered (connect §15.2,
    /// Spark's `SparkConnectGetStatusHandler`): `Running` until its run ends, `Terminating`
    /// once finished or failed (its results may still be read), `Cancelled` once interrupted
    /// (Spark reports an interrupted operation `Cancelled` once its runner stops; tether's
    /// stops at the interrupt), and once closed what [`final_state`](Self::final_state) says.
    pub fn operation_state(&self) -> OperationState {
        match self.status {
            OperationStatus::Pending
            | OperationStatus::Started
            | OperationStatus::Analyzed
            | OperationStatus::ReadyForExecution => OperationState::Running,
            OperationStatus::Finished | OperationStatus::Failed => OperationState::Terminating,
            OperationStatus::Canceled => OperationState::Cancelled,
            OperationStatus::Closed => self.final_state(),
        }
    }

    /// The state GetStatus reports once the execution left the registry (connect §15.2):
    /// `Succeeded` if its run finished, `Failed` if it failed, else `Cancelled` (interrupted,
    /// or removed before its run ended, which cancels it, rx §2.2 T12). Read before or after
    /// [`close`](Self::close), the answer is the same.
    pub fn final_state(&self) -> OperationState {
        match self.ended {
            Some(OperationStatus::Finished) => OperationState::Succeeded,
            Some(OperationStatus::Failed) => OperationState::Failed,
            _ => OperationState::Cancelled,
        }
    }

    /// The engine analyzed the plan (Spark's `postAnalyzed`, rx §2.1 item 4), with the
    /// statement text it wants reported, if any.
    ///
    /// # Errors
    /// [`IllegalTransition`] unless the status is `Started` or `Analyzed` (for example once
    /// the execution was canceled): nothing is posted.
    pub fn analyzed(&mut self, statement_text: Option<String>) -> Result<(), IllegalTransition> {
        self.post(Lifecycle::Analyzed(statement_text.map(Box::new)))
    }

    /// The engine is about to execute (Spark's `postReadyForExecution`, rx §2.1 item 4).
    ///
    /// # Errors
    /// [`IllegalTransition`] unless the status is `Analyzed`: nothing is posted.
    pub fn ready_for_execution(&mut self) -> Result<(), IllegalTransition> {
        self.post(Lifecycle::ReadyForExecution)
    }

    /// Whether lifecycle events wait to be forwarded ([`take_lifecycle`](Self::take_lifecycle)).
    pub(crate) fn has_lifecycle(&self) -> bool {
        !self.lifecycle.is_empty()
    }

    /// The lifecycle events decided since the last call, oldest first.
    pub(crate) fn take_lifecycle(&mut self) -> LifecycleBatch {
        std::mem::take(&mut self.lifecycle)
    }

    /// Sets the attached consumer, returning the one it replaces.
    fn set_consumer(&mut self, consumer: Option<Cursor>) -> Option<Cursor> {
        std::mem::replace(&mut self.consumer, consumer)
    }

    /// Charges this execution's held responses to a budget shared with other executions
    /// (tether's bound over rx §3.1's unsent and retained responses; see [`MemoryBudget`]).
    // Inlined, as `new`: the budget is set where the core is, not on a moved copy.
    #[inline]
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.log.set_budget(budget);
        self
    }

    /// The response log (rx §3; Spark's `ExecuteHolder.responseObserver`).
    pub fn log(&self) -> &ResponseLog {
        &self.log
    }

    /// Whether the execution is reattachable (rx §1.2).
    pub fn is_reattachable(&self) -> bool {
        self.reattachable
    }

    /// The runner state (rx §2.1).
    pub fn runner(&self) -> RunnerState {
        self.runner
    }

    /// How the execution left the registry, if it did (rx §2.1 dimension 1).
    pub fn removal(&self) -> Option<Removal> {
        self.removed
    }

    /// Whether the producer vanished without finishing (rx §2.2 T15, SPARK-50735).
    pub fn is_orphan(&self) -> bool {
        self.orphaned
    }

    /// Whether the producer must stop: the execution was interrupted (runner
    /// `Interrupted` / `StartedInterrupted`, rx §2.2 T9) or left the registry (released or
    /// abandoned, T12). What [`Producer::is_cancelled`](super::Producer::is_cancelled) and
    /// [`Producer::cancelled`](super::Producer::cancelled) report.
    pub fn producer_must_stop(&self) -> bool {
        self.removed.is_some()
            || matches!(
                self.runner,
                RunnerState::StartedInterrupted | RunnerState::Interrupted
            )
    }

    /// How the runner ended (rx §2.1 dimension 3), once it has: runner `Interrupted` or
    /// `Completed`, as in every execution in phase [`ExecutionPhase::Terminated`]. An
    /// orphan is [`RunOutcome::Orphaned`] (T15); a stored `OPERATION_CANCELED`, or an end
    /// with neither a terminal error nor a final index (released before it finished, T12),
    /// is [`RunOutcome::Cancelled`]; another terminal error is [`RunOutcome::Failed`]
    /// (T8); a fixed final index is [`RunOutcome::Completed`] (T7). `None` while the
    /// runner has not started or may still produce.
    pub fn outcome(&self) -> Option<RunOutcome> {
        if !matches!(
            self.runner,
            RunnerState::Interrupted | RunnerState::Completed
        ) {
            return None;
        }
        Some(if self.orphaned {
            RunOutcome::Orphaned
        } else {
            match self.log.terminal_error() {
                Some(ConnectError::OperationCanceled) => RunOutcome::Cancelled,
                Some(e) => RunOutcome::Failed(e.clone()),
                None if self.log.is_finished() => RunOutcome::Completed,
                None => RunOutcome::Cancelled,
            }
        })
    }

    /// How many consumers attached so far: the initial stream (rx §2.2 T1) and every
    /// reattach (T5).
    pub fn attach_count(&self) -> u64 {
        self.attaches
    }

    /// Whether a consumer is attached now (rx §2.1 dimension 2).
    pub fn is_attached(&self) -> bool {
        self.consumer.is_some()
    }

    /// Whether a consumer was handed the `ResultComplete` response (rx §1.3).
    pub fn delivered_result_complete(&self) -> bool {
        self.delivered_result_complete
    }

    /// Whether a consumer was handed the execution's terminal error (rx §2.2 T8–T9: its
    /// client was told how the execution ended, `OPERATION_CANCELED` among them).
    pub fn delivered_error(&self) -> bool {
        self.delivered_error
    }

    /// The coarse [`ExecutionPhase`] of the execution (rx §2.3).
    pub fn phase(&self) -> ExecutionPhase {
        match (self.removed.is_some(), self.runner) {
            (true, RunnerState::Started | RunnerState::StartedInterrupted)
                if self.producer_alive =>
            {
                ExecutionPhase::Cancelling
            }
            (true, _) => ExecutionPhase::Terminated,
            (false, RunnerState::NotStarted) => ExecutionPhase::Init,
            (false, RunnerState::Started) => ExecutionPhase::Streaming,
            (false, RunnerState::Interrupted | RunnerState::StartedInterrupted) => {
                ExecutionPhase::Cancelling
            }
            (false, RunnerState::Completed) => {
                if matches!(
                    self.log.terminal_error(),
                    Some(ConnectError::OperationCanceled)
                ) {
                    ExecutionPhase::Cancelling
                } else {
                    ExecutionPhase::Finishing
                }
            }
        }
    }

    /// Since when the execution counts as detached (no consumer, or a consumer whose time
    /// budget ran out — it rotates on its next poll, and a consumer nobody polls any more
    /// must not pin the execution), or `None` while attached or once removed. The
    /// abandonment pass removes it when this plus the detached timeout is `<= now`
    /// (rx §5.3).
    pub fn detached_since(&self) -> Option<Instant> {
        if self.removed.is_some() {
            return None;
        }
        match &self.consumer {
            Some(c) => c.deadline,
            None => self.detached_since,
        }
    }

    /// Starts the producer (runner `NotStarted → Started`, rx §2.1; Spark's
    /// `ExecuteHolder.start`). Returns `false` (and changes nothing) in any other state,
    /// e.g. after an interrupt before start.
    #[must_use]
    pub fn start(&mut self) -> bool {
        if self.runner == RunnerState::NotStarted && self.removed.is_none() {
            self.runner = RunnerState::Started;
            self.producer_alive = true;
            true
        } else {
            false
        }
    }

    /// Attaches a new consumer that will resume at `next_index` (rx §2.2 T5): the previous
    /// consumer, if any, is preempted and gets `INVALID_CURSOR.DISCONNECTED` on its next
    /// poll. Returns the new id and the preempted one. On a removed execution the new
    /// consumer is disconnected at once.
    #[must_use]
    pub fn attach(&mut self, next_index: u64, now: Instant) -> (ConsumerId, Option<ConsumerId>) {
        self.generation += 1;
        self.attaches += 1;
        let id = ConsumerId(self.generation);
        let preempted = self.set_consumer(None).map(|c| c.id);
        if self.removed.is_some() {
            return (id, preempted);
        }
        let deadline = if self.reattachable {
            self.limits
                .max_duration
                .filter(|d| !d.is_zero())
                .map(|d| crate::time::deadline_after(now, d))
        } else {
            None
        };
        self.set_consumer(Some(Cursor {
            id,
            next: next_index.max(1),
            deadline,
            bytes_sent: 0,
        }));
        self.detached_since = None;
        (id, preempted)
    }

    /// `ReattachExecute` on this execution (rx §5.5 steps 3–4), in Spark's order:
    ///
    /// 1. not reattachable, or its producer not started yet → `NOT_REATTACHABLE`, nothing
    ///    changes (SPARK-49492: no hang);
    /// 2. an orphan (its producer vanished, SPARK-50735) → the execution is closed as
    ///    [`Removal::Released`] and the orphan error returned: the caller must remove it
    ///    from its registry;
    /// 3. `last_response_id` unknown → `POSITION_NOT_FOUND` (rx §3.5), before anything is
    ///    preempted;
    /// 4. a new consumer attaches at the resolved index, preempting the attached one
    ///    (rx §2.2 T5, §4.4);
    /// 5. that index was already released → `POSITION_NOT_AVAILABLE` after preempting, as
    ///    Spark's sender fails on its first poll (rx §3.5); the new consumer is detached at
    ///    `now`.
    ///
    /// Returns the new consumer (or the error) and the consumer this call preempted or
    /// closed, if any: that one gets `DISCONNECTED` on its next poll, so wake it.
    pub fn reattach(
        &mut self,
        last_response_id: Option<&str>,
        now: Instant,
    ) -> (Result<ConsumerId, ConnectError>, Option<ConsumerId>) {
        if !self.reattachable || self.runner == RunnerState::NotStarted {
            return (Err(ConnectError::NotReattachable), None);
        }
        if self.orphaned {
            let preempted = self.close(Removal::Released);
            let handle = self.log.stamp().operation_id.to_string();
            return (Err(ConnectError::Orphaned { handle }), preempted);
        }
        let next = match self.position(last_response_id) {
            Ok(next) => next,
            Err(e) => return (Err(e), None),
        };
        let detached_for = match &self.consumer {
            None => self
                .detached_since
                .map(|t| now.saturating_duration_since(t)),
            Some(_) => None,
        };
        let (id, preempted) = self.attach(next, now);
        if !self.log.is_available(next) {
            let e = self.log.not_available(next);
            let _ = self.detach(id, now);
            return (Err(e), preempted);
        }
        let replayed = (self.sent_high + 1).saturating_sub(next.max(1));
        self.lifecycle.reattach = Reattach {
            resumed_at: next.max(1),
            replayed: u32::try_from(replayed).unwrap_or(u32::MAX),
            detached_ms: detached_for.map_or(u32::MAX, |d| {
                u32::try_from(d.as_millis()).unwrap_or(u32::MAX - 1)
            }),
        };
        self.lifecycle.events.push(Lifecycle::Reattached);
        (Ok(id), preempted)
    }

    /// The index the consumer `id` will ask for next, if it is the attached one (the
    /// sender's `nextIndex`, rx §4.2).
    pub fn next_index(&self, id: ConsumerId) -> Option<u64> {
        self.consumer.filter(|c| c.id == id).map(|c| c.next)
    }

    /// Whether `id` is the attached consumer (one at a time, rx §4.4).
    pub fn is_current(&self, id: ConsumerId) -> bool {
        self.consumer.is_some_and(|c| c.id == id)
    }

    /// The attached consumer's next step (rx §4.2), in Spark's order: preempted or closed
    /// → `DISCONNECTED`; end of a finished log → complete or the stored terminal error;
    /// rotation budget used up → graceful end; otherwise the next response, a wait, or
    /// `POSITION_NOT_AVAILABLE`. A consumer at the end of an orphan's log gets the orphan
    /// error instead of waiting forever (SPARK-50735).
    #[must_use]
    pub fn poll_consumer(&mut self, id: ConsumerId, now: Instant) -> ConsumerEvent {
        let Some(mut cursor) = self.consumer.filter(|c| c.id == id) else {
            return ConsumerEvent::Error(ConnectError::Disconnected);
        };
        if let Some(last) = self.log.final_index()
            && cursor.next > last
        {
            self.end_consumer(now);
            return match self.log.terminal_error() {
                Some(e) => {
                    self.delivered_error = true;
                    ConsumerEvent::Error(e.clone())
                }
                None => ConsumerEvent::End(StreamEnd::Complete),
            };
        }
        if self.reattachable {
            let over_bytes = self
                .limits
                .max_bytes
                .is_some_and(|m| m > 0 && cursor.bytes_sent > m);
            let over_time = cursor.deadline.is_some_and(|d| now >= d);
            if over_bytes || over_time {
                self.end_consumer(now);
                let reason = if over_time {
                    RotationReason::Duration
                } else {
                    RotationReason::Bytes
                };
                self.lifecycle.events.push(Lifecycle::Rotated(reason));
                return ConsumerEvent::End(StreamEnd::Rotated);
            }
        }
        match self.log.consume(cursor.next) {
            Ok(Consumed::Response(r, size)) => {
                self.sent_high = self.sent_high.max(cursor.next);
                cursor.next += 1;
                cursor.bytes_sent = cursor.bytes_sent.saturating_add(size);
                self.consumer = Some(cursor);
                if r.is_result_complete() {
                    self.delivered_result_complete = true;
                }
                ConsumerEvent::Response(r)
            }
            Ok(Consumed::Pending) => {
                if self.orphaned {
                    self.end_consumer(now);
                    ConsumerEvent::Error(ConnectError::Orphaned {
                        handle: self.log.stamp().operation_id.to_string(),
                    })
                } else {
                    ConsumerEvent::Pending {
                        wake_at: cursor.deadline,
                    }
                }
            }
            Ok(Consumed::End(e)) => {
                self.end_consumer(now);
                match e {
                    Some(e) => {
                        self.delivered_error = true;
                        ConsumerEvent::Error(e)
                    }
                    None => ConsumerEvent::End(StreamEnd::Complete),
                }
            }
            Err(e) => {
                self.end_consumer(now);
                ConsumerEvent::Error(e)
            }
        }
    }

    fn end_consumer(&mut self, now: Instant) {
        self.set_consumer(None);
        if self.removed.is_none() {
            self.detached_since = Some(now);
        }
    }

    /// The consumer `id` went away (stream dropped, transport failed) (rx §2.2 T4). If it
    /// was the attached one the execution becomes detached at `now`. Returns whether it was.
    #[must_use]
    pub fn detach(&mut self, id: ConsumerId, now: Instant) -> bool {
        if self.is_current(id) {
            self.end_consumer(now);
            true
        } else {
            false
        }
    }

    /// `ReleaseUntil(response_id)` on the log (rx §3.4). Returns the released index.
    ///
    /// # Errors
    /// `INVALID_CURSOR.POSITION_NOT_FOUND` for an id this execution never handed out.
    pub fn release_until(&mut self, response_id: &str) -> Result<u64, ConnectError> {
        let index = self.log.release_until(response_id)?;
        self.lifecycle.events.push(Lifecycle::ReleasedUntil(index));
        Ok(index)
    }

    /// Where a reattach with `last_response_id` resumes (rx §3.5), see
    /// [`ResponseLog::position`].
    ///
    /// # Errors
    /// `INVALID_CURSOR.POSITION_NOT_FOUND` for an unknown or empty id.
    pub fn position(&self, last_response_id: Option<&str>) -> Result<u64, ConnectError> {
        self.log.position(last_response_id)
    }

    /// For a consumer that is not asking for a response (e.g. waiting for its transport to
    /// become writable): `DISCONNECTED` if it was preempted or the execution closed, a
    /// graceful rotation if its time budget ran out (rx §4.3: nothing is sent then), or
    /// `None` to keep waiting. A returned event ends the consumer.
    #[must_use]
    pub fn poll_interrupt(&mut self, id: ConsumerId, now: Instant) -> Option<ConsumerEvent> {
        let Some(cursor) = self.consumer.filter(|c| c.id == id) else {
            return Some(ConsumerEvent::Error(ConnectError::Disconnected));
        };
        if self.reattachable && cursor.deadline.is_some_and(|d| now >= d) {
            self.end_consumer(now);
            self.lifecycle
                .events
                .push(Lifecycle::Rotated(RotationReason::Duration));
            return Some(ConsumerEvent::End(StreamEnd::Rotated));
        }
        None
    }

    /// The attached consumer's rotation deadline, if it has one: attach time plus
    /// [`StreamLimits::max_duration`], reattachable executions only (rx §4.2).
    pub fn deadline(&self, id: ConsumerId) -> Option<Instant> {
        self.consumer
            .filter(|c| c.id == id)
            .and_then(|c| c.deadline)
    }

    /// Disconnects the attached consumer without attaching another (its next poll gets
    /// `DISCONNECTED`; rx §4.4, Spark's `interruptGrpcResponseSenders`). The execution
    /// becomes detached at `now`. Returns the disconnected consumer.
    #[must_use]
    pub fn disconnect(&mut self, now: Instant) -> Option<ConsumerId> {
        let id = self.consumer.map(|c| c.id)?;
        self.end_consumer(now);
        Some(id)
    }

    /// Whether appending a response of `size` bytes would have to wait (tether's unsent
    /// bound, see [`ResponseLog::would_block`]; Spark's producer never waits, rx §3.2).
    pub fn would_block(&self, size: u64) -> bool {
        self.log.would_block(size)
    }

    fn check_producer(&self) -> Result<(), ProduceError> {
        if self.removed.is_some() {
            return Err(ProduceError::Closed);
        }
        match self.runner {
            RunnerState::Started => Ok(()),
            RunnerState::NotStarted => Err(ProduceError::NotStarted),
            RunnerState::Interrupted | RunnerState::StartedInterrupted => {
                Err(ProduceError::Cancelled)
            }
            RunnerState::Completed => Err(ProduceError::Finished),
        }
    }

    /// Appends a produced response (rx §2.2 T6). Returns its index.
    ///
    /// # Errors
    /// [`ProduceError::WouldBlock`] (response handed back) at the unsent bound;
    /// `Cancelled`/`Closed`/`Finished`/`NotStarted` when the producer must stop.
    pub fn push(&mut self, response: ExecutePlanResponse) -> Result<u64, ProduceError> {
        self.check_producer()?;
        let rows = response.row_count();
        let index = self.log.push(response).map_err(ProduceError::from)?;
        self.count_rows(rows);
        Ok(index)
    }

    /// Adds a pushed Arrow batch's rows to `producedRowCount`.
    fn count_rows(&mut self, rows: Option<u64>) {
        if let Some(n) = rows {
            self.rows = Some(self.rows.unwrap_or(0).saturating_add(n));
        }
    }

    /// [`push`](Self::push), queueing `waiter` in the budget's FIFO when it does not fit.
    pub(crate) fn push_waiting(
        &mut self,
        response: ExecutePlanResponse,
        waiter: &mut Waiter,
    ) -> Result<u64, ProduceError> {
        self.check_producer()?;
        let rows = response.row_count();
        let index = self
            .log
            .push_waiting(response, waiter)
            .map_err(ProduceError::from)?;
        self.count_rows(rows);
        Ok(index)
    }

    /// The producer finished successfully (rx §2.2 T7): a reattachable execution gets its
    /// `ResultComplete` appended atomically with fixing the final index; a non-reattachable
    /// one just fixes it. Runner `Started → Completed` in one step (Spark's `completing`
    /// state, rx §2.2 T7, lasts no longer than this call), so an interrupt can never land
    /// after it.
    ///
    /// # Errors
    /// `Cancelled`/`Closed` if an interrupt or release won the race (the stored
    /// `OPERATION_CANCELED` stands); `Finished`/`NotStarted` on misuse.
    pub fn finish(&mut self) -> Result<(), ProduceError> {
        let r = self.check_producer();
        self.producer_stopped();
        r?;
        // Cannot fail: the log is only finished through the runner, which was `Started`.
        let _ = self.log.finish(self.reattachable);
        self.runner = RunnerState::Completed;
        // An engine that reported the analysis but not readiness was ready when it
        // finished: Spark allows Finished only from Started or ReadyForExecution.
        if self.status == OperationStatus::Analyzed {
            let _ = self.post(Lifecycle::ReadyForExecution);
        }
        let _ = self.post(Lifecycle::Finished(self.rows.unwrap_or(NO_ROWS)));
        Ok(())
    }

    /// The producer failed (rx §2.2 T8): `error` becomes the terminal error, delivered
    /// after every earlier response.
    ///
    /// # Errors
    /// As [`finish`](Self::finish).
    pub fn fail(&mut self, error: ConnectError) -> Result<(), ProduceError> {
        let r = self.check_producer();
        self.producer_stopped();
        r?;
        let message = Box::new(error.to_string());
        let _ = self.log.fail(error);
        self.runner = RunnerState::Completed;
        let _ = self.post(Lifecycle::Failed(message));
        Ok(())
    }

    fn producer_stopped(&mut self) {
        if self.producer_alive {
            self.producer_alive = false;
            if self.runner == RunnerState::StartedInterrupted {
                self.runner = RunnerState::Completed;
            }
        }
    }

    /// The producer went away. If it had not finished, the execution is an orphan
    /// (rx §2.2 T15). Idempotent.
    pub fn producer_gone(&mut self) {
        if !self.producer_alive {
            return;
        }
        let was_running = self.runner == RunnerState::Started;
        self.producer_stopped();
        if was_running {
            self.runner = RunnerState::Completed;
            if self.removed.is_none() {
                self.orphaned = true;
                let message = ConnectError::Orphaned {
                    handle: self.log.stamp().operation_id.to_string(),
                }
                .to_string();
                let _ = self.post(Lifecycle::Failed(Box::new(message)));
            }
        }
    }

    /// Whether the producer is still expected to produce or acknowledge an interrupt
    /// (Spark: the runner thread is alive, rx §2.2 T9, T15).
    pub fn producer_alive(&self) -> bool {
        self.producer_alive
    }

    /// Interrupt (rx §2.2 T9, §5.7): `NotStarted → Interrupted` or
    /// `Started → StartedInterrupted`, storing `OPERATION_CANCELED` as the terminal error
    /// right away so every consumer gets it after the earlier responses. Returns `true`
    /// only if this call changed the runner state; a no-op once completion started.
    #[must_use]
    pub fn interrupt(&mut self) -> bool {
        if self.removed.is_some() {
            return false;
        }
        match self.runner {
            RunnerState::NotStarted => {
                self.runner = RunnerState::Interrupted;
                let _ = self.log.fail(ConnectError::OperationCanceled);
                let _ = self.post(Lifecycle::Canceled);
                true
            }
            RunnerState::Started => {
                self.runner = RunnerState::StartedInterrupted;
                let _ = self.log.fail(ConnectError::OperationCanceled);
                let _ = self.post(Lifecycle::Canceled);
                true
            }
            _ => false,
        }
    }

    /// Cancels the execution now, for a shutdown (tether's; Spark's server has no drain and
    /// closes what runs when it stops, rx §2.2 T12): interrupts the runner if it still runs
    /// (as [`interrupt`](Self::interrupt)), drops every held response
    /// ([`ResponseLog::cut`]) and makes `OPERATION_CANCELED`, or the execution's own
    /// terminal error if it had failed, the next event of every consumer: the attached one
    /// at its next poll, and any that reattaches, from any position. A client is told at
    /// once rather than after up to [`LogConfig::max_unsent_bytes`] of unsent responses, or
    /// the retained ones again. The execution stays registered until its client releases
    /// it. Returns `false`, changing nothing, for an execution removed or canceled already.
    /// An execution whose every response was handed to a consumer is canceled too: handed
    /// out is not read (a slow client may hold its whole result in its transport's buffers),
    /// and a drain closes those buffers with the connection.
    #[must_use]
    pub fn cancel_now(&mut self) -> bool {
        if self.removed.is_some() || self.log.is_cut() {
            return false;
        }
        match self.runner {
            RunnerState::NotStarted => self.runner = RunnerState::Interrupted,
            RunnerState::Started => self.runner = RunnerState::StartedInterrupted,
            _ => {}
        }
        let failed = self.log.terminal_error().is_some();
        self.log.cut(ConnectError::OperationCanceled);
        if !failed {
            // From Started or Finished: Spark's status machine allows both (rx §2.1 item 4).
            let _ = self.post(Lifecycle::Canceled);
        }
        true
    }

    /// Closes the execution as it leaves the registry (rx §2.2 T12): interrupts the
    /// runner if it still runs, disconnects the attached consumer (its next poll gets
    /// `DISCONNECTED`), and drops every buffered response. Returns the preempted consumer,
    /// if any. Idempotent: later calls change nothing.
    #[must_use]
    pub fn close(&mut self, removal: Removal) -> Option<ConsumerId> {
        if self.removed.is_some() {
            return None;
        }
        match self.runner {
            RunnerState::NotStarted => {
                self.runner = RunnerState::Interrupted;
                let _ = self.log.fail(ConnectError::OperationCanceled);
            }
            RunnerState::Started => {
                self.runner = if self.producer_alive {
                    RunnerState::StartedInterrupted
                } else {
                    RunnerState::Completed
                };
                let _ = self.log.fail(ConnectError::OperationCanceled);
            }
            _ => {}
        }
        self.removed = Some(removal);
        self.detached_since = None;
        self.log.clear();
        // A run that had not ended is canceled by its removal (rx §2.2 T12); then the
        // operation is closed, its last event.
        if !self.status.is_ended() {
            let _ = self.post(Lifecycle::Canceled);
        }
        let _ = self.post(Lifecycle::Closed(removal));
        self.set_consumer(None).map(|c| c.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn batch(n: usize) -> ExecutePlanResponse {
        ExecutePlanResponse::arrow_batch(1, Bytes::from(vec![1u8; n]))
    }

    fn core(reattachable: bool, limits: StreamLimits) -> ExecutionCore {
        ExecutionCore::new(
            reattachable,
            LogConfig::REATTACHABLE,
            limits,
            Stamp::default(),
        )
    }

    fn next(c: &mut ExecutionCore, id: ConsumerId, now: Instant) -> ExecutePlanResponse {
        match c.poll_consumer(id, now) {
            ConsumerEvent::Response(r) => r,
            other => panic!("expected a response, got {other:?}"),
        }
    }

    #[test]
    fn preemption_disconnects_previous() {
        let t = Instant::now();
        let mut c = core(true, StreamLimits::default());
        assert!(c.start());
        let (a, _) = c.attach(1, t);
        let (b, pre) = c.attach(1, t);
        assert_eq!(pre, Some(a));
        assert_eq!(
            c.poll_consumer(a, t),
            ConsumerEvent::Error(ConnectError::Disconnected)
        );
        assert!(matches!(
            c.poll_consumer(b, t),
            ConsumerEvent::Pending { .. }
        ));
    }

    #[test]
    fn rotation_by_time_and_bytes() {
        let t = Instant::now();
        let mut c = core(
            true,
            StreamLimits {
                max_duration: Some(Duration::from_secs(10)),
                max_bytes: Some(15),
            },
        );
        let _ = c.start();
        let (a, _) = c.attach(1, t);
        c.push(batch(10)).unwrap();
        c.push(batch(10)).unwrap();
        // the crossing response is still sent
        next(&mut c, a, t);
        assert_eq!(
            c.poll_consumer(a, t),
            ConsumerEvent::End(StreamEnd::Rotated)
        );
        assert_eq!(c.detached_since(), Some(t));
        let (b, _) = c.attach(2, t);
        let late = t + Duration::from_secs(10);
        assert_eq!(
            c.poll_consumer(b, late),
            ConsumerEvent::End(StreamEnd::Rotated)
        );
    }

    #[test]
    fn completion_then_interrupt_is_noop() {
        let t = Instant::now();
        let mut c = core(true, StreamLimits::default());
        let _ = c.start();
        let (a, _) = c.attach(1, t);
        c.push(batch(1)).unwrap();
        c.finish().unwrap();
        assert!(!c.interrupt());
        next(&mut c, a, t);
        assert!(next(&mut c, a, t).is_result_complete());
        assert_eq!(
            c.poll_consumer(a, t),
            ConsumerEvent::End(StreamEnd::Complete)
        );
        assert_eq!(c.phase(), ExecutionPhase::Finishing);
    }

    #[test]
    fn interrupt_delivers_after_earlier_responses() {
        let t = Instant::now();
        let mut c = core(true, StreamLimits::default());
        let _ = c.start();
        c.push(batch(1)).unwrap();
        assert!(c.interrupt());
        assert!(!c.interrupt());
        assert_eq!(c.push(batch(1)), Err(ProduceError::Cancelled));
        let (a, _) = c.attach(1, t);
        next(&mut c, a, t);
        assert_eq!(
            c.poll_consumer(a, t),
            ConsumerEvent::Error(ConnectError::OperationCanceled)
        );
        assert_eq!(c.phase(), ExecutionPhase::Cancelling);
        assert_eq!(c.finish(), Err(ProduceError::Cancelled));
        assert_eq!(c.runner(), RunnerState::Completed);
    }

    #[test]
    fn orphan_errors_at_end_of_log() {
        let t = Instant::now();
        let mut c = core(true, StreamLimits::default());
        let _ = c.start();
        let (a, _) = c.attach(1, t);
        c.push(batch(1)).unwrap();
        c.producer_gone();
        assert!(c.is_orphan());
        next(&mut c, a, t);
        assert!(matches!(
            c.poll_consumer(a, t),
            ConsumerEvent::Error(ConnectError::Orphaned { .. })
        ));
    }

    #[test]
    fn close_disconnects_and_stops_producer() {
        let t = Instant::now();
        let mut c = core(true, StreamLimits::default());
        let _ = c.start();
        let (a, _) = c.attach(1, t);
        assert_eq!(c.close(Removal::Released), Some(a));
        assert_eq!(
            c.poll_consumer(a, t),
            ConsumerEvent::Error(ConnectError::Disconnected)
        );
        assert_eq!(c.push(batch(1)), Err(ProduceError::Closed));
        assert_eq!(c.phase(), ExecutionPhase::Cancelling);
        c.producer_gone();
        assert_eq!(c.phase(), ExecutionPhase::Terminated);
        assert!(!c.is_orphan());
        assert_eq!(c.close(Removal::Abandoned), None);
        assert_eq!(c.removal(), Some(Removal::Released));
    }

    #[test]
    fn non_reattachable_never_rotates() {
        let t = Instant::now();
        let mut c = core(
            false,
            StreamLimits {
                max_duration: Some(Duration::from_secs(1)),
                max_bytes: Some(1),
            },
        );
        let _ = c.start();
        let (a, _) = c.attach(1, t);
        c.push(batch(10)).unwrap();
        c.push(batch(10)).unwrap();
        c.finish().unwrap();
        let late = t + Duration::from_secs(100);
        next(&mut c, a, late);
        let last = next(&mut c, a, late);
        assert!(!last.is_result_complete());
        assert_eq!(
            c.poll_consumer(a, late),
            ConsumerEvent::End(StreamEnd::Complete)
        );
        assert_eq!(c.log().final_index(), Some(2));
    }

    /// rx §4.2: zero limits are Spark's 0, unlimited: a zero duration does not end every
    /// stream before it sends (a reattach livelock), a zero size does not rotate after each
    /// response.
    #[test]
    fn zero_limits_are_unlimited() {
        let t = Instant::now();
        let mut c = core(
            true,
            StreamLimits {
                max_duration: Some(Duration::ZERO),
                max_bytes: Some(0),
            },
        );
        let _ = c.start();
        let (a, _) = c.attach(1, t);
        assert_eq!(c.deadline(a), None);
        for _ in 0..3 {
            c.push(batch(10)).unwrap();
        }
        c.finish().unwrap();
        let late = t + Duration::from_secs(1_000_000);
        for _ in 0..3 {
            next(&mut c, a, late);
        }
        assert!(next(&mut c, a, late).is_result_complete());
        assert_eq!(
            c.poll_consumer(a, late),
            ConsumerEvent::End(StreamEnd::Complete)
        );
    }

    /// rx §5.5 ReattachExecute step 3 and SPARK-49492 (scenario 17): refused before start,
    /// and for a non-reattachable execution, with nothing preempted.
    #[test]
    fn reattach_refuses_unstarted_and_non_reattachable_first() {
        let t = Instant::now();
        let mut c = core(true, StreamLimits::default());
        assert_eq!(
            c.reattach(Some("not-an-id"), t),
            (Err(ConnectError::NotReattachable), None)
        );
        assert_eq!(c.attach_count(), 0);
        let mut n = core(false, StreamLimits::default());
        let _ = n.start();
        let (a, _) = n.attach(1, t);
        assert_eq!(
            n.reattach(None, t),
            (Err(ConnectError::NotReattachable), None)
        );
        assert!(n.is_current(a));
    }

    /// SPARK-50735: an orphan is closed as released (its consumer disconnected) before
    /// its position is even looked at.
    #[test]
    fn reattach_closes_an_orphan_before_resolving_the_position() {
        let t = Instant::now();
        let mut c = core(true, StreamLimits::default());
        let _ = c.start();
        let (a, _) = c.attach(1, t);
        c.producer_gone();
        let (r, preempted) = c.reattach(Some("unknown"), t);
        assert!(matches!(r, Err(ConnectError::Orphaned { .. })), "{r:?}");
        assert_eq!(preempted, Some(a));
        assert_eq!(c.removal(), Some(Removal::Released));
        assert_eq!(c.outcome(), Some(RunOutcome::Orphaned));
    }

    /// rx §3.5: an unknown position fails before preempting; a released one after.
    #[test]
    fn reattach_position_not_found_before_and_not_available_after_preempting() {
        let t = Instant::now();
        let mut c = core(true, StreamLimits::default());
        let _ = c.start();
        let (a, _) = c.attach(1, t);
        c.push(batch(1)).unwrap();
        c.push(batch(1)).unwrap();
        next(&mut c, a, t);
        let second = next(&mut c, a, t).response_id;
        let (r, preempted) = c.reattach(Some("unknown"), t);
        assert!(
            matches!(r, Err(ConnectError::PositionNotFound { .. })),
            "{r:?}"
        );
        assert_eq!(preempted, None);
        assert!(c.is_current(a), "nothing preempted");
        c.release_until(&second).unwrap();
        let later = t + Duration::from_secs(1);
        let (r, preempted) = c.reattach(None, later);
        assert!(
            matches!(r, Err(ConnectError::PositionNotAvailable { .. })),
            "{r:?}"
        );
        assert_eq!(preempted, Some(a));
        assert!(!c.is_attached());
        assert_eq!(c.detached_since(), Some(later));
        let (r, preempted) = c.reattach(Some(&second), later);
        assert!(r.is_ok() && preempted.is_none(), "{r:?}");
    }

    /// rx §2.2 T7–T9, T12, T15: the run outcome, and when the producer must stop.
    #[test]
    fn outcome_and_producer_must_stop() {
        let t = Instant::now();
        let mut c = core(true, StreamLimits::default());
        assert_eq!((c.outcome(), c.producer_must_stop()), (None, false));
        let _ = c.start();
        assert_eq!((c.outcome(), c.producer_must_stop()), (None, false));
        let mut done = core(true, StreamLimits::default());
        let _ = done.start();
        done.finish().unwrap();
        assert_eq!(done.outcome(), Some(RunOutcome::Completed));
        assert!(!done.producer_must_stop());
        let mut failed = core(true, StreamLimits::default());
        let _ = failed.start();
        failed.fail(ConnectError::NotReattachable).unwrap();
        assert_eq!(
            failed.outcome(),
            Some(RunOutcome::Failed(ConnectError::NotReattachable))
        );
        assert!(c.interrupt());
        assert!(c.producer_must_stop());
        assert_eq!(c.outcome(), None, "the producer has not stopped yet");
        c.producer_gone();
        assert_eq!(c.outcome(), Some(RunOutcome::Cancelled));
        let mut released = core(true, StreamLimits::default());
        let _ = released.start();
        let _ = released.attach(1, t);
        let _ = released.close(Removal::Abandoned);
        assert!(released.producer_must_stop());
        released.producer_gone();
        assert_eq!(released.outcome(), Some(RunOutcome::Cancelled));
        assert_eq!(released.phase(), ExecutionPhase::Terminated);
    }
}
