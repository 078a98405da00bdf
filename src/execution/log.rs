//! The per-execution response log and retry buffer (reattach rx §3).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use uuid::Uuid;

use super::budget::{MemoryBudget, Waiter};
use super::error::ConnectError;
use crate::wire::connect::ExecutePlanResponse;

/// Spark's placeholder for an unknown response id in `POSITION_NOT_AVAILABLE`.
const UNKNOWN_ID: &str = "<UNKNOWN>";

/// Bounds of one [`ResponseLog`] (rx §3.1, §3.4). Sizes are encoded protobuf sizes in
/// bytes (`ExecutePlanResponse::encoded_len` after the ids are stamped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogConfig {
    /// Retry budget in bytes: how much of the already-consumed responses is kept for
    /// backtracking (Spark's `spark.connect.execute.reattachable.observerRetryBufferSize`,
    /// default 10 MiB, rx §3.1, §4.5; 0 for non-reattachable executions). See
    /// [`ResponseLog::consume`] for the exact policy (rx §3.4).
    pub retry_budget: u64,
    /// Most bytes of produced-but-unsent responses before the producer must wait (default
    /// 64 MiB). A single response larger than this is admitted once nothing else is unsent,
    /// so a producer never deadlocks. tether's own bound: Spark's `ExecuteResponseObserver`
    /// appends without limit (rx §3.2) and only the sender's flow control holds responses
    /// back (rx §4.3).
    pub max_unsent_bytes: u64,
    /// Most produced-but-unsent responses before the producer must wait (default 100 000;
    /// values below 1 act as 1). tether's own bound, as
    /// [`max_unsent_bytes`](Self::max_unsent_bytes) (Spark has none, rx §3.2).
    pub max_unsent_responses: usize,
}

impl LogConfig {
    /// The defaults for a reattachable execution: 10 MiB retry budget (Spark's
    /// `observerRetryBufferSize` default, rx §4.5), 64 MiB / 100 000 unsent responses
    /// (tether's bound).
    pub const REATTACHABLE: Self = Self {
        retry_budget: 10 * 1024 * 1024,
        max_unsent_bytes: 64 * 1024 * 1024,
        max_unsent_responses: 100_000,
    };

    /// The defaults for a non-reattachable execution: budget 0 ("ack on send": a response
    /// is released when the next one is consumed; Spark's `retryBufferSize` is 0 when not
    /// reattachable, rx §3.1, §3.4), 64 MiB / 100 000 unsent responses.
    pub const NON_REATTACHABLE: Self = Self {
        retry_budget: 0,
        ..Self::REATTACHABLE
    };
}

impl Default for LogConfig {
    fn default() -> Self {
        Self::REATTACHABLE
    }
}

/// The identifiers stamped on every response of one execution (rx §3.2). Shared
/// strings, so the executions of one session share their session ids.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// The client's session id, echoed as sent in the ExecutePlan.
    pub session_id: Arc<str>,
    /// The session's server-generated id.
    pub server_side_session_id: Arc<str>,
    /// The canonical (lower-case) operation id.
    pub operation_id: Arc<str>,
}

impl Default for Stamp {
    fn default() -> Self {
        let empty: Arc<str> = Arc::from("");
        Self {
            session_id: empty.clone(),
            server_side_session_id: empty.clone(),
            operation_id: empty,
        }
    }
}

/// Why [`ResponseLog::push`] refused a response (Spark's `ExecuteResponseObserver.tryOnNext`
/// returns false after the end, rx §3.2; the unsent bound is tether's). The response is
/// handed back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PushError {
    /// The unsent bound is reached; retry after the consumer made progress (backpressure).
    #[error("the unsent-response bound is reached; wait for the consumer")]
    WouldBlock(Box<ExecutePlanResponse>),
    /// The shared [`MemoryBudget`] is used up (tether's bound over every execution's
    /// unsent and retained responses, rx §3.1) and this log holds something, so the floor
    /// does not apply; retry once other executions returned bytes. The response is handed
    /// back as with [`WouldBlock`](Self::WouldBlock).
    #[error("the manager's memory budget is used up; wait for consumers to make room")]
    BudgetFull(Box<ExecutePlanResponse>),
    /// The log is finished (completed or failed): nothing may follow the final index
    /// (rx §3.2).
    #[error("the response log is finished; nothing can be appended after the final index")]
    Finished(Box<ExecutePlanResponse>),
}

/// [`ResponseLog::finish`] or [`ResponseLog::fail`] on a log that is already finished
/// (Spark: completing twice is an illegal state, rx §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the response log is already finished")]
pub struct AlreadyFinished;

#[allow(
    clippy::large_enum_variant,
    reason = "the response is the hot path; boxing it would allocate once per response"
)]
/// What a consumer gets for the index it asks for ([`ResponseLog::consume`], rx §3.3;
/// Spark's `ExecuteResponseObserver.consumeResponse`).
#[derive(Debug, Clone, PartialEq)]
pub enum Consumed {
    /// The response at that index, and its encoded size in bytes.
    Response(ExecutePlanResponse, u64),
    /// Not produced yet: wait for the producer.
    Pending,
    /// The log is finished and every response was consumed: end the stream, with the
    /// stored terminal error if the execution failed (rx §3.3 case 3).
    End(Option<ConnectError>),
}

#[derive(Debug, Clone)]
struct Entry {
    response: ExecutePlanResponse,
    size: u64,
    /// Bytes of every response with an index ≤ this one (over the log's lifetime).
    cumulative: u64,
}

/// The per-execution response log and retry buffer: Spark's `ExecuteResponseObserver`
/// (reattach rx §3).
///
/// [`ResponseLog`] is pure data: no locks, no clock, no I/O. The execution core
/// ([`ExecutionCore`](super::ExecutionCore)) drives it; property tests drive it directly.
///
/// ```text
///   index:   1 … first-1 │ first … highest_consumed │ highest_consumed+1 … last_produced │ final?
///            released    │ retained (retry buffer)   │ unsent (bounded, producer waits)   │
/// ```
///
/// - Indexes start at 1 and are consecutive. Every response gets a fresh UUID v4
///   `response_id`; the id → index map (and index → id) is kept for the execution's lifetime,
///   only payloads are released (rx §3.1).
/// - Responses are always released as a prefix (automatic policy on consume, `ReleaseUntil`),
///   so the retained responses are one contiguous range and every lookup is O(1): an index
///   is an offset into a ring buffer, an id is one hash lookup. Nothing scans.
/// - Automatic release (rx §3.4) uses running byte totals, so it costs O(1) amortised per
///   released response instead of Spark's walk over the whole budget.
#[derive(Debug)]
pub struct ResponseLog {
    config: LogConfig,
    stamp: Stamp,
    /// `ids[i - 1]` is the id of index `i`, for every produced response.
    ids: Vec<Uuid>,
    index_of: HashMap<Uuid, u64>,
    /// Indexes `first ..= last_produced`.
    entries: VecDeque<Entry>,
    first: u64,
    /// Cumulative bytes of every response before `first`.
    cumulative_before_first: u64,
    highest_consumed: u64,
    final_index: Option<u64>,
    error: Option<ConnectError>,
    /// [`cut`](Self::cut) ended the log: every consume gets the terminal error.
    cut: bool,
    peak_retained: u64,
    peak_unsent: u64,
    /// The budget every held byte is charged to, if any (tether's bound).
    budget: Option<Arc<MemoryBudget>>,
}

impl ResponseLog {
    /// An empty log stamping `stamp` on every response: nothing produced, the first
    /// response gets index 1 (rx §3.1).
    // Inlined, so that a new execution's log is built where it lives rather than moved there.
    #[inline]
    pub fn new(config: LogConfig, stamp: Stamp) -> Self {
        Self {
            config,
            stamp,
            ids: Vec::new(),
            index_of: HashMap::new(),
            entries: VecDeque::new(),
            first: 1,
            cumulative_before_first: 0,
            highest_consumed: 0,
            final_index: None,
            error: None,
            cut: false,
            peak_retained: 0,
            peak_unsent: 0,
            budget: None,
        }
    }

    /// Charges every held response of this log to `budget` from now on (tether's bound over
    /// every execution's unsent and retained responses, rx §3.1): appends wait for it as
    /// [`push`](Self::push) describes, and every response that leaves the log returns its
    /// bytes. What is already held is charged at once.
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.set_budget(budget);
        self
    }

    /// [`with_budget`](Self::with_budget) in place. A log that holds nothing (every new
    /// execution's) charges nothing, so the budget's lock is not taken.
    #[inline]
    pub(crate) fn set_budget(&mut self, budget: Arc<MemoryBudget>) {
        let held = self.held_bytes();
        if let Some(old) = self.budget.take() {
            old.release(held);
        }
        if held > 0 {
            budget.charge(held);
        }
        self.budget = Some(budget);
    }

    /// The shared budget this log is charged to, if any (tether's bound, rx §3.1 ranges).
    pub fn budget(&self) -> Option<&Arc<MemoryBudget>> {
        self.budget.as_ref()
    }

    /// Bytes of every held response, retained and unsent (rx §3.1): what this log has
    /// charged to its [`budget`](Self::budget).
    pub fn held_bytes(&self) -> u64 {
        self.cumulative_through(self.last_produced()) - self.cumulative_before_first
    }

    /// The log's bounds (retry budget, rx §3.1; unsent bound, tether's).
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// The ids stamped on each response (rx §3.2).
    pub fn stamp(&self) -> &Stamp {
        &self.stamp
    }

    /// Index of the last produced response, 0 before the first (Spark's
    /// `lastProducedIndex`, rx §3.1).
    pub fn last_produced(&self) -> u64 {
        self.ids.len() as u64
    }

    /// Highest index handed to any consumer, 0 before the first (Spark's
    /// `highestConsumedIndex`, rx §3.1). It may be ahead of what the client read (rx §3.5).
    pub fn highest_consumed(&self) -> u64 {
        self.highest_consumed
    }

    /// The lowest index still held; `last_produced() + 1` when nothing is held. Every index
    /// below it was released (releases always remove a prefix, rx §3.4).
    pub fn first_retained(&self) -> u64 {
        self.first
    }

    /// The final index once the log is finished (completed or failed), else `None`
    /// (Spark's `finalProducedIndex`, rx §3.1).
    pub fn final_index(&self) -> Option<u64> {
        self.final_index
    }

    /// Whether the log is finished: nothing more will be appended (Spark's
    /// `ExecuteResponseObserver.completed`, rx §3.2).
    pub fn is_finished(&self) -> bool {
        self.final_index.is_some()
    }

    /// The stored terminal error, if the execution failed or was interrupted (Spark's
    /// `ExecuteResponseObserver.getError`, stored by `onError`, rx §3.2).
    pub fn terminal_error(&self) -> Option<&ConnectError> {
        self.error.as_ref()
    }

    fn unsent_start(&self) -> u64 {
        self.first.max(self.highest_consumed + 1)
    }

    fn cumulative_through(&self, index: u64) -> u64 {
        if index < self.first {
            self.cumulative_before_first
        } else {
            self.entries[(index - self.first) as usize].cumulative
        }
    }

    /// Bytes of the held responses that were already handed to a consumer: the retry
    /// buffer that [`LogConfig::retry_budget`] bounds (rx §3.4; Spark's observer counts it
    /// as `cachedSizeUntilHighestConsumed`).
    pub fn retained_bytes(&self) -> u64 {
        let end = self.highest_consumed.min(self.last_produced());
        if end < self.first {
            return 0;
        }
        self.cumulative_through(end) - self.cumulative_before_first
    }

    /// Number of held responses already handed to a consumer (the retry buffer, rx §3.4).
    pub fn retained_len(&self) -> usize {
        (self.unsent_start() - self.first) as usize
    }

    /// Bytes of the produced responses not yet handed to any consumer: what
    /// [`LogConfig::max_unsent_bytes`] bounds (tether's bound; Spark's are unbounded,
    /// rx §3.2).
    pub fn unsent_bytes(&self) -> u64 {
        let start = self.unsent_start();
        let last = self.last_produced();
        if start > last {
            return 0;
        }
        self.cumulative_through(last) - self.cumulative_through(start - 1)
    }

    /// Number of produced responses not yet handed to any consumer: what
    /// [`LogConfig::max_unsent_responses`] bounds (tether's bound, rx §3.2).
    pub fn unsent_len(&self) -> usize {
        (self.last_produced() + 1 - self.unsent_start()) as usize
    }

    /// Highest [`retained_bytes`](Self::retained_bytes) seen after any operation: the retry
    /// buffer's high-water mark against [`LogConfig::retry_budget`] (rx §3.4).
    pub fn peak_retained_bytes(&self) -> u64 {
        self.peak_retained
    }

    /// Highest [`unsent_bytes`](Self::unsent_bytes) seen after any operation: how close the
    /// producer came to tether's unsent bound (which Spark's observer lacks, rx §3.2).
    pub fn peak_unsent_bytes(&self) -> u64 {
        self.peak_unsent
    }

    /// Every response id produced so far and its index, in order (for tests and tooling;
    /// O(n)). Ids are kept for the execution's lifetime (Spark's `responseIndexToId`,
    /// rx §3.1).
    pub fn produced_ids(&self) -> impl Iterator<Item = (u64, Uuid)> + '_ {
        self.ids
            .iter()
            .enumerate()
            .map(|(i, id)| (i as u64 + 1, *id))
    }

    /// The index of a produced response id; `None` if this log never produced it (Spark's
    /// `getResponseIndexById`, rx §3.1). Accepts the id in either case (tether normalises ids;
    /// Spark looks them up verbatim, rx §1.9).
    pub fn index_of(&self, response_id: &str) -> Option<u64> {
        let id = super::keys::parse_uuid(response_id)?;
        self.index_of.get(&id).copied()
    }

    /// The id of a produced index, released or not (Spark's `responseIndexToId`, rx §3.1).
    pub fn id_at(&self, index: u64) -> Option<Uuid> {
        let i = usize::try_from(index.checked_sub(1)?).ok()?;
        self.ids.get(i).copied()
    }

    /// Whether a response of `size` bytes would have to wait for the consumer: tether's
    /// unsent bound ([`LogConfig::max_unsent_bytes`], [`LogConfig::max_unsent_responses`];
    /// Spark's producer never waits, rx §3.2). Always `false` when nothing is unsent.
    pub fn would_block(&self, size: u64) -> bool {
        let unsent = self.unsent_len();
        unsent > 0
            && (unsent >= self.config.max_unsent_responses.max(1)
                || self.unsent_bytes().saturating_add(size) > self.config.max_unsent_bytes)
    }

    /// The size `response` will have once stamped (what [`would_block`](Self::would_block)
    /// and the budgets count; Spark's `serializedByteSize`, rx §3.1).
    pub fn stamped_len(&self, response: &ExecutePlanResponse) -> u64 {
        let mut r = response.clone();
        self.stamp_into(&mut r, Uuid::nil());
        prost::Message::encoded_len(&r) as u64
    }

    fn stamp_into(&self, response: &mut ExecutePlanResponse, id: Uuid) {
        fn set(field: &mut String, value: &str) {
            field.clear();
            field.push_str(value);
        }
        set(&mut response.session_id, &self.stamp.session_id);
        set(
            &mut response.server_side_session_id,
            &self.stamp.server_side_session_id,
        );
        set(&mut response.operation_id, &self.stamp.operation_id);
        let mut buf = uuid::Uuid::encode_buffer();
        set(
            &mut response.response_id,
            id.hyphenated().encode_lower(&mut buf),
        );
    }

    /// Appends a response (rx §3.2): stamps `session_id`, `server_side_session_id`,
    /// `operation_id` and a fresh UUID v4 `response_id`, and gives it the next index.
    /// Returns that index.
    ///
    /// # Errors
    /// [`PushError::Finished`] after [`finish`](Self::finish)/[`fail`](Self::fail), with the
    /// response unchanged (Spark: `tryOnNext` returns false); [`PushError::WouldBlock`] when
    /// the unsent bound is reached, with the response already carrying the session and
    /// operation ids but an empty `response_id` (pushing it again stamps it anew);
    /// [`PushError::BudgetFull`] likewise when the log has a [`MemoryBudget`] that does not
    /// admit it (see its rules: a log that holds nothing is always admitted, and one with
    /// no unsent response evicts its retained responses rather than wait).
    pub fn push(&mut self, response: ExecutePlanResponse) -> Result<u64, PushError> {
        self.push_inner(response, None)
    }

    /// [`push`](Self::push), queueing `waiter` in the budget's FIFO when it does not fit.
    pub(crate) fn push_waiting(
        &mut self,
        response: ExecutePlanResponse,
        waiter: &mut Waiter,
    ) -> Result<u64, PushError> {
        self.push_inner(response, Some(waiter))
    }

    fn push_inner(
        &mut self,
        response: ExecutePlanResponse,
        waiter: Option<&mut Waiter>,
    ) -> Result<u64, PushError> {
        if self.is_finished() {
            return Err(PushError::Finished(Box::new(response)));
        }
        let id = Uuid::new_v4();
        let mut stamped = response;
        self.stamp_into(&mut stamped, id);
        let size = prost::Message::encoded_len(&stamped) as u64;
        if self.would_block(size) {
            stamped.response_id.clear();
            return Err(PushError::WouldBlock(Box::new(stamped)));
        }
        // Taken out for the call (`admit` needs the log mutably), put back at once: no
        // reference-count traffic per push.
        if let Some(budget) = self.budget.take() {
            let admitted = self.admit(&budget, size, waiter);
            self.budget = Some(budget);
            if !admitted {
                stamped.response_id.clear();
                return Err(PushError::BudgetFull(Box::new(stamped)));
            }
        }
        Ok(self.append(stamped, id, size))
    }

    /// Charges `size` to `budget` under its rules (see [`MemoryBudget`]): the floor when
    /// nothing is held; eviction of the retained responses when nothing is unsent.
    fn admit(&mut self, budget: &MemoryBudget, size: u64, waiter: Option<&mut Waiter>) -> bool {
        let held = self.held_bytes();
        let can_evict = held > 0 && self.unsent_len() == 0;
        if can_evict {
            if budget.admit(size, false, None) {
                return true;
            }
            let freed = self.pop_until(self.unsent_start());
            budget.release(freed);
            if let Some(w) = waiter {
                // Leaves the queue, if it was in it.
                return budget.admit(size, true, Some(w));
            }
            return budget.admit(size, true, None);
        }
        budget.admit(size, held == 0, waiter)
    }

    /// Pops the held responses below `end`; returns their bytes (not yet given back).
    fn pop_until(&mut self, end: u64) -> u64 {
        let before = self.cumulative_before_first;
        while self.first < end && !self.entries.is_empty() {
            self.pop_front();
        }
        self.cumulative_before_first - before
    }

    fn credit(&self, bytes: u64) {
        if let Some(b) = &self.budget {
            b.release(bytes);
        }
    }

    fn append(&mut self, response: ExecutePlanResponse, id: Uuid, size: u64) -> u64 {
        let index = self.last_produced() + 1;
        let cumulative = self.cumulative_through(index - 1) + size;
        self.ids.push(id);
        self.index_of.insert(id, index);
        self.entries.push_back(Entry {
            response,
            size,
            cumulative,
        });
        self.peak_unsent = self.peak_unsent.max(self.unsent_bytes());
        index
    }

    /// Finishes the log successfully (rx §2.2 T7). With `result_complete` (reattachable
    /// executions) a `ResultComplete` response is appended in the same step, bypassing the
    /// unsent bound, and is the final index; without it the last produced index is final.
    ///
    /// # Errors
    /// [`AlreadyFinished`] if the log was already finished.
    pub fn finish(&mut self, result_complete: bool) -> Result<(), AlreadyFinished> {
        if self.is_finished() {
            return Err(AlreadyFinished);
        }
        if result_complete {
            let id = Uuid::new_v4();
            let mut r = ExecutePlanResponse::result_complete();
            self.stamp_into(&mut r, id);
            let size = prost::Message::encoded_len(&r) as u64;
            if let Some(b) = &self.budget {
                b.charge(size);
            }
            self.append(r, id, size);
        }
        self.final_index = Some(self.last_produced());
        Ok(())
    }

    /// Finishes the log with a terminal error (rx §3.2 `onError`): the last produced index
    /// becomes final and `error` is delivered after it to every consumer that reaches the
    /// end.
    ///
    /// # Errors
    /// [`AlreadyFinished`] if the log was already finished.
    pub fn fail(&mut self, error: ConnectError) -> Result<(), AlreadyFinished> {
        if self.is_finished() {
            return Err(AlreadyFinished);
        }
        self.error = Some(error);
        self.final_index = Some(self.last_produced());
        Ok(())
    }

    /// Ends the log now for a shutdown (tether's; Spark has no drain; rx §3.2's terminal
    /// error, delivered ahead of what is held): every held response
    /// is dropped, retained and unsent alike (their bytes go back to the budget; the ids of
    /// the unsent are forgotten: no client can know them), and from now on every consumer,
    /// at any position, gets the stored terminal error, or `error` when there was none (a
    /// running or successfully finished log), as its next event. So a client is told at
    /// once instead of after everything still unsent, or re-sent on a reattach. Returns how
    /// many responses were dropped; cutting a cut log changes nothing.
    pub fn cut(&mut self, error: ConnectError) -> usize {
        if self.cut {
            return 0;
        }
        self.cut = true;
        let held = self.entries.len();
        self.clear();
        while self.last_produced() > self.highest_consumed {
            if let Some(id) = self.ids.pop() {
                self.index_of.remove(&id);
            }
        }
        // Nothing held: `first` is one past the last index that still has an id.
        self.first = self.last_produced() + 1;
        if self.error.is_none() {
            self.error = Some(error);
        }
        self.final_index = Some(self.last_produced());
        held
    }

    /// Whether [`cut`](Self::cut) ended the log: every consumer gets its terminal error
    /// next (rx §3.2).
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// The error for a consumer asking for a released `index` (rx §3.3 case 2).
    pub fn not_available(&self, index: u64) -> ConnectError {
        ConnectError::PositionNotAvailable {
            response_id: self
                .id_at(index)
                .map(|id| id.hyphenated().to_string())
                .unwrap_or_else(|| UNKNOWN_ID.to_owned()),
            index,
        }
    }

    /// Hands the response at `index` to a consumer (rx §3.3) and applies the automatic
    /// release policy (rx §3.4): walking back from `index - 1`, responses are kept while
    /// the kept bytes are below the retry budget; everything older is released. So with a
    /// budget > 0 the previously consumed response is always kept (and at most one kept
    /// response straddles the budget); with budget 0 everything before `index` is released.
    /// `index` itself is never released by consuming it.
    ///
    /// # Errors
    /// `INVALID_CURSOR.POSITION_NOT_AVAILABLE` if `index` was released.
    pub fn consume(&mut self, index: u64) -> Result<Consumed, ConnectError> {
        if self.cut {
            return Ok(Consumed::End(self.error.clone()));
        }
        let index = index.max(1);
        let last = self.last_produced();
        if index > last {
            return Ok(match self.final_index {
                Some(_) => Consumed::End(self.error.clone()),
                None => Consumed::Pending,
            });
        }
        if index < self.first {
            return Err(self.not_available(index));
        }
        let entry = &self.entries[(index - self.first) as usize];
        let out = Consumed::Response(entry.response.clone(), entry.size);
        if index > self.highest_consumed {
            self.highest_consumed = index;
        }
        // Automatic release: drop the front while the kept responses strictly after it
        // (up to index - 1) still reach the budget.
        let through = self.cumulative_through(index - 1);
        let before = self.cumulative_before_first;
        while self.first < index {
            let front_cumulative = self.entries[0].cumulative;
            if through - front_cumulative >= self.config.retry_budget {
                self.pop_front();
            } else {
                break;
            }
        }
        self.credit(self.cumulative_before_first - before);
        self.peak_retained = self.peak_retained.max(self.retained_bytes());
        Ok(out)
    }

    fn pop_front(&mut self) {
        if let Some(e) = self.entries.pop_front() {
            self.cumulative_before_first = e.cumulative;
            self.first += 1;
        }
    }

    /// `ReleaseUntil(response_id)` (rx §3.4): releases that response and everything before
    /// it. Releasing an already released position is a no-op.
    ///
    /// # Errors
    /// `INVALID_CURSOR.POSITION_NOT_FOUND` if the id was never produced, or was produced but
    /// never handed to any consumer (a client cannot know such an id; tether refuses it so
    /// that an unsent response is never released).
    pub fn release_until(&mut self, response_id: &str) -> Result<u64, ConnectError> {
        let index = self.known_consumed(response_id)?;
        let freed = self.pop_until(index + 1);
        self.credit(freed);
        Ok(index)
    }

    fn known_consumed(&self, response_id: &str) -> Result<u64, ConnectError> {
        match self.index_of(response_id) {
            Some(i) if i <= self.highest_consumed => Ok(i),
            _ => Err(ConnectError::PositionNotFound {
                response_id: response_id.to_owned(),
            }),
        }
    }

    /// Where a reattach resumes (rx §3.5): `None` → index 1; a known id → the next index.
    /// Whether that index is still available is decided when it is consumed
    /// ([`consume`](Self::consume) → `POSITION_NOT_AVAILABLE`); past the final index the
    /// consumer ends at once (complete, or the stored terminal error).
    ///
    /// # Errors
    /// `INVALID_CURSOR.POSITION_NOT_FOUND` for an unknown id, an empty string, an id of
    /// another execution, or an id never handed to a consumer.
    pub fn position(&self, last_response_id: Option<&str>) -> Result<u64, ConnectError> {
        match last_response_id {
            None => Ok(1),
            Some(id) => Ok(self.known_consumed(id)? + 1),
        }
    }

    /// Whether `index` can still be consumed (not released), i.e. whether
    /// [`consume`](Self::consume) would not fail with `POSITION_NOT_AVAILABLE` (rx §3.5:
    /// a reattach needs only the next index to be held). Always, once [cut](Self::cut):
    /// every position then gets the terminal error.
    pub fn is_available(&self, index: u64) -> bool {
        self.cut || index >= self.first || index > self.last_produced()
    }

    /// Drops every held response (execution closed, rx §2.2 T12; Spark's
    /// `ExecuteResponseObserver.removeAll`). Ids stay known.
    pub fn clear(&mut self) {
        let freed = self.pop_until(u64::MAX);
        self.credit(freed);
    }
}

impl Drop for ResponseLog {
    /// Returns every held byte to the budget (tether's bound, rx §3.1 ranges).
    fn drop(&mut self) {
        self.credit(self.held_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn batch(n: usize) -> ExecutePlanResponse {
        ExecutePlanResponse::arrow_batch(1, Bytes::from(vec![7u8; n]))
    }

    fn log(budget: u64) -> ResponseLog {
        ResponseLog::new(
            LogConfig {
                retry_budget: budget,
                max_unsent_bytes: 1 << 20,
                max_unsent_responses: 1000,
            },
            Stamp {
                session_id: Arc::from("s"),
                server_side_session_id: Arc::from("ss"),
                operation_id: Arc::from("op"),
            },
        )
    }

    fn take(l: &mut ResponseLog, i: u64) -> ExecutePlanResponse {
        match l.consume(i).unwrap() {
            Consumed::Response(r, _) => r,
            other => panic!("expected response at {i}, got {other:?}"),
        }
    }

    #[test]
    fn indexes_ids_and_stamps() {
        let mut l = log(0);
        assert_eq!(l.push(batch(10)).unwrap(), 1);
        assert_eq!(l.push(batch(10)).unwrap(), 2);
        let r = take(&mut l, 1);
        assert_eq!(r.operation_id, "op");
        assert_eq!(r.session_id, "s");
        assert_eq!(r.server_side_session_id, "ss");
        let id = Uuid::parse_str(&r.response_id).unwrap();
        assert_eq!(id.get_version_num(), 4);
        assert_eq!(l.index_of(&r.response_id), Some(1));
        assert_eq!(l.index_of(&r.response_id.to_uppercase()), Some(1));
        assert_ne!(l.id_at(1), l.id_at(2));
    }

    #[test]
    fn budget_zero_is_ack_on_send() {
        let mut l = log(0);
        for _ in 0..3 {
            l.push(batch(10)).unwrap();
        }
        take(&mut l, 1);
        assert_eq!(l.first_retained(), 1);
        take(&mut l, 2);
        assert_eq!(l.first_retained(), 2);
        assert!(matches!(
            l.consume(1),
            Err(ConnectError::PositionNotAvailable { index: 1, .. })
        ));
    }

    #[test]
    fn budget_keeps_previous_and_straddler() {
        let mut l = log(25);
        for _ in 0..6 {
            l.push(batch(10)).unwrap();
        }
        let size = l.entries[0].size;
        assert!(size > 10);
        for i in 1..=6 {
            take(&mut l, i);
        }
        // keep the minimal suffix before 6 whose total reaches the budget
        let kept = 5 - l.first_retained() + 1;
        let kept_bytes = kept * size;
        assert!(kept_bytes >= 25);
        assert!(kept_bytes - size < 25);
        // a budget smaller than one response still keeps the previous one
        let mut l = log(1);
        for _ in 0..3 {
            l.push(batch(10)).unwrap();
        }
        for i in 1..=3 {
            take(&mut l, i);
        }
        assert_eq!(l.first_retained(), 2);
    }

    #[test]
    fn budget_boundary_matches_spark_walk() {
        // Spark walks back from index - 1 while the running total is below the budget and
        // releases everything from the first index where it was already reached: with a
        // budget of exactly two responses, consuming 4 keeps 2 and 3.
        let mut l = log(0);
        l.push(batch(10)).unwrap();
        let size = l.entries[0].size;
        let mut l = log(2 * size);
        for _ in 0..5 {
            l.push(batch(10)).unwrap();
        }
        for i in 1..=3 {
            take(&mut l, i);
        }
        assert_eq!(l.first_retained(), 1);
        take(&mut l, 4);
        assert_eq!(l.first_retained(), 2);
        assert_eq!(l.retained_bytes(), 3 * size);
        let mut l = log(2 * size + 1);
        for _ in 0..5 {
            l.push(batch(10)).unwrap();
        }
        for i in 1..=4 {
            take(&mut l, i);
        }
        assert_eq!(l.first_retained(), 1);
    }

    #[test]
    fn release_until_and_positions() {
        let mut l = log(1 << 20);
        for _ in 0..5 {
            l.push(batch(10)).unwrap();
        }
        let r1 = take(&mut l, 1).response_id;
        let r2 = take(&mut l, 2).response_id;
        assert_eq!(l.position(None).unwrap(), 1);
        assert_eq!(l.position(Some(&r1)).unwrap(), 2);
        assert!(matches!(
            l.position(Some("")),
            Err(ConnectError::PositionNotFound { .. })
        ));
        // an id produced but never consumed is unknown to any client
        let r4 = l.id_at(4).unwrap().to_string();
        assert!(l.position(Some(&r4)).is_err());
        assert!(l.release_until(&r4).is_err());
        assert_eq!(l.release_until(&r1).unwrap(), 1);
        assert_eq!(l.first_retained(), 2);
        assert!(l.release_until(&r1).is_ok());
        // reattach after r1 works (only the next index must be held)
        assert_eq!(take(&mut l, 2).response_id, r2);
        l.release_until(&r2).unwrap();
        let e = l.consume(2).unwrap_err();
        assert_eq!(
            e,
            ConnectError::PositionNotAvailable {
                response_id: r2.clone(),
                index: 2
            }
        );
        assert!(matches!(
            l.release_until("nope"),
            Err(ConnectError::PositionNotFound { .. })
        ));
    }

    #[test]
    fn finish_appends_result_complete_atomically() {
        let mut l = log(0);
        l.push(batch(1)).unwrap();
        l.finish(true).unwrap();
        assert_eq!(l.final_index(), Some(2));
        assert!(matches!(l.push(batch(1)), Err(PushError::Finished(_))));
        assert_eq!(l.finish(true), Err(AlreadyFinished));
        take(&mut l, 1);
        assert!(take(&mut l, 2).is_result_complete());
        assert_eq!(l.consume(3).unwrap(), Consumed::End(None));
    }

    #[test]
    fn fail_redelivers_error_at_end() {
        let mut l = log(100);
        l.push(batch(1)).unwrap();
        l.fail(ConnectError::OperationCanceled).unwrap();
        take(&mut l, 1);
        assert_eq!(
            l.consume(2).unwrap(),
            Consumed::End(Some(ConnectError::OperationCanceled))
        );
        assert_eq!(
            l.consume(2).unwrap(),
            Consumed::End(Some(ConnectError::OperationCanceled))
        );
    }

    #[test]
    fn cut_drops_everything_held_and_ends_every_position_with_the_error() {
        let budget = MemoryBudget::new(1 << 20);
        let mut l = log(1 << 20).with_budget(budget.clone());
        for i in 1..=4 {
            l.push(batch(i)).unwrap();
        }
        take(&mut l, 1);
        let sent = take(&mut l, 2).response_id;
        let unsent = l.id_at(3).unwrap().hyphenated().to_string();
        assert!(budget.usage().used > 0);
        assert_eq!(
            l.cut(ConnectError::OperationCanceled),
            4,
            "2 retained + 2 unsent"
        );
        assert_eq!(budget.usage().used, 0, "every held byte returned");
        assert_eq!((l.retained_bytes(), l.unsent_bytes()), (0, 0));
        assert_eq!(l.final_index(), Some(2), "the last index handed out");
        // Every position, before or after what was sent, ends with the error.
        for i in [1, 2, 3, 9] {
            assert!(l.is_available(i));
            assert_eq!(
                l.consume(i).unwrap(),
                Consumed::End(Some(ConnectError::OperationCanceled)),
                "index {i}"
            );
        }
        // An id that was handed out still resolves; an unsent one was never known.
        assert_eq!(l.position(Some(&sent)).unwrap(), 3);
        assert!(matches!(
            l.position(Some(&unsent)),
            Err(ConnectError::PositionNotFound { .. })
        ));
        assert_eq!(l.cut(ConnectError::OperationCanceled), 0, "idempotent");
        assert!(l.is_cut());
    }

    #[test]
    fn cut_keeps_a_stored_error_and_overrides_a_success() {
        let failed = ConnectError::Failed {
            message: "boom".into(),
            code: crate::execution::Code::Internal,
        };
        let mut l = log(100);
        l.push(batch(1)).unwrap();
        l.fail(failed.clone()).unwrap();
        l.cut(ConnectError::OperationCanceled);
        assert_eq!(l.consume(1).unwrap(), Consumed::End(Some(failed)));
        let mut done = log(100);
        done.push(batch(1)).unwrap();
        done.finish(true).unwrap();
        done.cut(ConnectError::OperationCanceled);
        assert_eq!(
            done.consume(1).unwrap(),
            Consumed::End(Some(ConnectError::OperationCanceled)),
            "a finished log not read to its end is canceled"
        );
    }

    #[test]
    fn unsent_bound_blocks_and_large_response_passes_alone() {
        let mut l = ResponseLog::new(
            LogConfig {
                retry_budget: 0,
                max_unsent_bytes: 1000,
                max_unsent_responses: 3,
            },
            Stamp::default(),
        );
        assert_eq!(l.push(batch(2000)).unwrap(), 1); // alone: admitted
        assert!(matches!(l.push(batch(1)), Err(PushError::WouldBlock(_))));
        take(&mut l, 1);
        for _ in 0..3 {
            l.push(batch(1)).unwrap();
        }
        assert!(l.would_block(1));
        assert!(matches!(l.push(batch(1)), Err(PushError::WouldBlock(_))));
        assert_eq!(l.unsent_len(), 3);
        take(&mut l, 2);
        assert!(!l.would_block(1));
    }

    #[test]
    fn clear_keeps_ids() {
        let mut l = log(100);
        l.push(batch(1)).unwrap();
        let r = take(&mut l, 1).response_id;
        l.clear();
        assert_eq!(l.index_of(&r), Some(1));
        assert!(l.consume(1).is_err());
    }
}
