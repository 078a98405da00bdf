//! The client's reattach algorithm as a sans-IO state machine (rx §6).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, ReattachExecuteRequest, ReleaseExecuteRequest,
    execute_plan_request::{RequestOption, request_option},
    release_execute_request::{Release, ReleaseAll, ReleaseUntil},
};

use super::config::{ClientConfig, ReleaseMode};
use super::error::{ClientError, ReleaseError, RpcError, Violation};
use super::retry::{Jitter, RetryDecision, RetryPolicy, Retrying};
use crate::execution::Code;

/// The id of a response this client delivered: the only thing
/// [`ReattachingStream::release_until`](super::ReattachingStream::release_until) accepts.
///
/// It cannot be built from a string: only a reattaching stream creates one, for a response it
/// received and delivered, so a release can never name a response the client did not see
/// (rx §6.4). It remembers its operation and its delivery position (1-based), so a release
/// on the wrong stream is refused and a release older than one already sent is skipped.
///
/// ```compile_fail
/// // Not constructible outside tether:
/// let id = tether::execution::client::ResponseId { id: "r1".into() };
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ResponseId {
    operation_id: Arc<str>,
    id: Arc<str>,
    index: u64,
}

impl ResponseId {
    /// The server's `response_id` string (a random UUID for Spark servers, rx §1.3; never
    /// empty).
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The operation that delivered it (canonical lower-case UUID, rx §1.9).
    pub fn operation_id(&self) -> &str {
        &self.operation_id
    }

    /// Its 1-based position among the responses this client delivered for the operation
    /// (the latest is what rx §6.2 calls `lastReturnedResponseId`).
    pub fn index(&self) -> u64 {
        self.index
    }
}

impl fmt::Debug for ResponseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResponseId({} #{})", self.id, self.index)
    }
}

impl fmt::Display for ResponseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// Where a [`ReattachCore`] stands (the iterator state of rx §6.2: an RPC open or unset,
/// `resultComplete`, plus the retry backoff of rx §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientPhase {
    /// No RPC open; [`poll_command`](ReattachCore::poll_command) gives the next
    /// `ExecutePlan` or `ReattachExecute`.
    Idle,
    /// An RPC was issued; its responses, end or error are expected.
    Attached,
    /// Waiting out a retry backoff; then [`handle_timeout`](ReattachCore::handle_timeout).
    Backoff,
    /// The result is complete: `ResultComplete` was delivered (reattachable), or the stream
    /// ended (non-reattachable).
    Complete,
    /// Failed; the error is handed out once by `poll_command`.
    Failed,
    /// Closed by the caller before the end ([`close`](ReattachCore::close)).
    Closed,
}

/// What the driver must do next (from [`ReattachCore::poll_command`]): the RPCs and waits
/// of rx §6.3.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Call `ExecutePlan` with this request (the initial one, or a re-execute with the same
    /// operation id), then report its stream's events.
    ExecutePlan(ExecutePlanRequest),
    /// Call `ReattachExecute` with this request, then report its stream's events.
    ReattachExecute(ReattachExecuteRequest),
    /// Keep reading the open RPC's stream.
    Read,
    /// Wait until this instant (a retry backoff, also [`ReattachCore::poll_timeout`]), then
    /// call [`handle_timeout`](ReattachCore::handle_timeout).
    Sleep(Instant),
    /// Yield this error to the caller; every later call gives [`Command::Done`].
    Fail(ClientError),
    /// The stream has ended; nothing more to do.
    Done,
}

/// Counters of what a client stream did (all since construction): the calls and outcomes
/// of rx §6.3.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ClientStats {
    /// `ExecutePlan` calls (the initial one plus re-executes).
    pub execute_plans: u64,
    /// `ReattachExecute` calls (graceful, after retryable errors, after deadlines).
    pub reattaches: u64,
    /// Streams that ended gracefully without delivering anything (normal rotations).
    pub empty_rotations: u64,
    /// Retries granted by the retry policy (each followed by a backoff wait).
    pub retries: u64,
    /// Re-executes after `OPERATION_NOT_FOUND`/`SESSION_NOT_FOUND` with nothing delivered.
    pub reexecutions: u64,
    /// Reattaches because the client-side stream deadline expired.
    pub deadline_reattaches: u64,
    /// Responses delivered to the caller.
    pub delivered: u64,
    /// `ReleaseUntil` requests queued.
    pub release_until: u64,
    /// `ReleaseAll` requests queued (at most 1).
    pub release_all: u64,
    /// Events ignored because no RPC was attached (late responses after completion, …).
    pub ignored: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Execute,
    Reattach,
}

/// The client's reattach algorithm as a sans-IO state machine: Spark's
/// `ExecutePlanResponseReattachableIterator` (Scala and Python), rx §6.
///
/// [`ReattachCore`] holds every client rule once: the operation id and reattach option on the
/// initial request, the graceful reattach loop, the retry scope around each wait for a
/// response, re-execute on `OPERATION_NOT_FOUND` / `SESSION_NOT_FOUND` only while nothing was
/// delivered, `ReleaseUntil` per delivered response, exactly one `ReleaseAll`, the
/// `server_side_session_id` check, and both of its deadlines (the RPC deadline, the retry
/// backoff). It does no I/O and reads no clock: the caller asks it what to do next
/// ([`poll_command`](ReattachCore::poll_command)), performs that RPC, reports back (`on_*`),
/// sleeps until [`poll_timeout`](ReattachCore::poll_timeout) and then calls
/// [`handle_timeout`](ReattachCore::handle_timeout); release RPCs to send come out of
/// [`poll_release`](ReattachCore::poll_release). The async
/// [`ReattachingStream`](super::ReattachingStream) is a thin driver over it; property tests
/// drive it directly.
///
/// ```text
///                 ExecutePlan / ReattachExecute
///        ┌──────┐ ─────────────────────────────► ┌──────────┐  response: deliver,
///        │ Idle │                                │ Attached │  queue ReleaseUntil
///        └──────┘ ◄───────────────────────────── └──────────┘ ◄──────┐
///          ▲  ▲    end without ResultComplete      │ │ │  │ ────────┘
///          │  │    (graceful reattach; an empty    │ │ │  │ ResultComplete: queue ReleaseAll
///          │  │    rotation is normal)             │ │ │  ▼
///          │  └─ not found, nothing delivered:     │ │ │ Complete
///          │     re-execute at once ───────────────┘ │ │
///          │                         retryable error │ │ fatal error, retries used up,
///   wait   │    ┌─────────┐ ◄────────────────────────┘ │ not found after delivery,
///   over   └─── │ Backoff │                            │ session changed, violation:
///               └─────────┘                            ▼ queue ReleaseAll
///                                                    Failed ─ error yielded once ─► done
/// ```
///
/// Construct it with [`ReattachCore::reattachable`] (Spark's reattachable iterator) or
/// [`ReattachCore::non_reattachable`] (plain `ExecutePlan`: retried only before the first
/// response, never reattached or released).
#[derive(Debug)]
pub struct ReattachCore {
    reattachable: bool,
    release_mode: ReleaseMode,
    initial: ExecutePlanRequest,
    operation_id: Arc<str>,
    phase: ClientPhase,
    next: Open,
    backoff_until: Option<Instant>,
    /// [`ClientConfig::stream_deadline`]: how long one RPC may stay attached.
    stream_deadline: Option<Duration>,
    /// When the attached RPC's deadline expires (armed as the RPC is issued).
    rpc_deadline: Option<Instant>,
    /// Responses delivered on the RPC currently attached.
    stream_delivered: u64,
    last: Option<ResponseId>,
    /// Highest delivery index a `ReleaseUntil` was queued for.
    released_index: u64,
    release_all_queued: bool,
    expected_server_session: Option<String>,
    retrying: Retrying,
    jitter: Jitter,
    immediate: u32,
    immediate_since: Option<Instant>,
    max_immediate: u32,
    max_immediate_elapsed: Duration,
    empty_rotations: u32,
    max_empty_rotations: Option<u32>,
    releases: VecDeque<ReleaseExecuteRequest>,
    error: Option<ClientError>,
    stats: ClientStats,
}

impl ReattachCore {
    /// A reattachable execution of `request` (rx §6.2): the `operation_id` is kept (in
    /// canonical lower case) if set and non-empty, else a fresh UUID v4; any reattach option
    /// is replaced by `reattach_options { reattachable: true }`.
    ///
    /// # Errors
    /// [`ClientError::InvalidOperationId`] when the request's `operation_id` is not a UUID.
    pub fn reattachable(
        request: ExecutePlanRequest,
        config: &ClientConfig,
    ) -> Result<Self, ClientError> {
        Self::new(request, true, config)
    }

    /// A non-reattachable execution of `request`: same operation-id rules, any reattach
    /// option removed. The stream's plain end is the result's end; errors are retried (by
    /// re-sending `ExecutePlan`) only before the first response (rx §6.3, "for contrast").
    ///
    /// # Errors
    /// [`ClientError::InvalidOperationId`] when the request's `operation_id` is not a UUID.
    pub fn non_reattachable(
        request: ExecutePlanRequest,
        config: &ClientConfig,
    ) -> Result<Self, ClientError> {
        Self::new(request, false, config)
    }

    fn new(
        mut request: ExecutePlanRequest,
        reattachable: bool,
        config: &ClientConfig,
    ) -> Result<Self, ClientError> {
        let operation_id = match request.operation_id.as_deref() {
            Some(id) if !id.is_empty() => crate::wire::connect::parse_uuid(id)
                .ok_or_else(|| ClientError::InvalidOperationId(id.to_owned()))?
                .hyphenated()
                .to_string(),
            _ => uuid::Uuid::new_v4().hyphenated().to_string(),
        };
        request.operation_id = Some(operation_id.clone());
        request.request_options.retain(|o| {
            !matches!(
                o.request_option,
                Some(request_option::RequestOption::ReattachOptions(_))
            )
        });
        if reattachable {
            request.request_options.push(RequestOption::reattach(true));
        }
        let policies: Arc<[RetryPolicy]> = Arc::from(config.retry_policies.clone());
        Ok(Self {
            reattachable,
            release_mode: config.release_mode,
            expected_server_session: request
                .client_observed_server_side_session_id
                .clone()
                .filter(|s| !s.is_empty()),
            initial: request,
            operation_id: Arc::from(operation_id),
            phase: ClientPhase::Idle,
            next: Open::Execute,
            backoff_until: None,
            stream_deadline: config.stream_deadline,
            rpc_deadline: None,
            stream_delivered: 0,
            last: None,
            released_index: 0,
            release_all_queued: false,
            retrying: Retrying::new(policies),
            jitter: Jitter::new(config.jitter_seed),
            immediate: 0,
            immediate_since: None,
            max_immediate: config.max_immediate_retries,
            max_immediate_elapsed: config.max_immediate_retry_elapsed,
            empty_rotations: 0,
            max_empty_rotations: config.max_empty_rotations,
            releases: VecDeque::new(),
            error: None,
            stats: ClientStats::default(),
        })
    }

    /// Whether this is the reattachable form (rx §6.2), not the plain `ExecutePlan` path
    /// (rx §6.3, "for contrast").
    pub fn is_reattachable(&self) -> bool {
        self.reattachable
    }

    /// The operation id sent on every request (canonical lower-case UUID: the request's,
    /// else a fresh UUID v4, rx §6.2).
    pub fn operation_id(&self) -> &str {
        &self.operation_id
    }

    /// The `ExecutePlan` request as sent, with operation id and reattach option (rx §6.2
    /// `initialRequest`).
    pub fn request(&self) -> &ExecutePlanRequest {
        &self.initial
    }

    /// The current phase (rx §6.2 iterator state).
    pub fn phase(&self) -> ClientPhase {
        self.phase
    }

    /// Counters of the calls of rx §6.3 ([`ClientStats`]).
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// The id of the last delivered response (reattachable form only): what the next
    /// `ReattachExecute` names as `last_response_id` (rx §6.2 `lastReturnedResponseId`).
    pub fn last_response_id(&self) -> Option<&ResponseId> {
        self.last.as_ref()
    }

    /// The `server_side_session_id` every response must carry (the first one seen, or the
    /// one the request said it observed; rx §6.2 `serverSideSessionId`).
    pub fn server_side_session_id(&self) -> Option<&str> {
        self.expected_server_session.as_deref()
    }

    /// Whether `ReleaseAll` has been queued (at most once: Spark's `release_all` sets
    /// `resultComplete`, rx §6.3).
    pub fn release_all_queued(&self) -> bool {
        self.release_all_queued
    }

    /// Whether the stream has ended (complete, failed or closed) — nothing more will be
    /// delivered (rx §6.3 `has_next()` is false).
    pub fn is_finished(&self) -> bool {
        matches!(
            self.phase,
            ClientPhase::Complete | ClientPhase::Failed | ClientPhase::Closed
        )
    }

    /// Whether nothing more will come out of [`poll_command`](Self::poll_command) but
    /// [`Command::Done`] (finished, and any error already handed out; rx §6.3).
    pub fn is_terminated(&self) -> bool {
        match self.phase {
            ClientPhase::Complete | ClientPhase::Closed => true,
            ClientPhase::Failed => self.error.is_none(),
            _ => false,
        }
    }

    /// What to do next at `now` (rx §6.3 `call_iter`: `ExecutePlan` first, `ReattachExecute`
    /// once the RPC is unset). Issuing an RPC moves `Idle → Attached` and arms its deadline
    /// ([`ClientConfig::stream_deadline`] from `now`, see [`poll_timeout`](Self::poll_timeout));
    /// the error of a failed stream is handed out once, then [`Command::Done`] forever.
    #[must_use]
    pub fn poll_command(&mut self, now: Instant) -> Command {
        match self.phase {
            ClientPhase::Idle => {
                self.phase = ClientPhase::Attached;
                self.stream_delivered = 0;
                self.rpc_deadline = self
                    .stream_deadline
                    .map(|d| crate::time::deadline_after(now, d));
                match self.next {
                    Open::Execute => {
                        self.stats.execute_plans += 1;
                        Command::ExecutePlan(self.initial.clone())
                    }
                    Open::Reattach => {
                        self.stats.reattaches += 1;
                        Command::ReattachExecute(self.reattach_request())
                    }
                }
            }
            ClientPhase::Attached => Command::Read,
            ClientPhase::Backoff => match self.backoff_until {
                Some(until) => Command::Sleep(until),
                None => {
                    self.phase = ClientPhase::Idle;
                    self.poll_command(now)
                }
            },
            ClientPhase::Failed => match self.error.take() {
                Some(e) => Command::Fail(e),
                None => Command::Done,
            },
            ClientPhase::Complete | ClientPhase::Closed => Command::Done,
        }
    }

    /// A response arrived on the attached RPC (rx §6.3 `next()` steps 3–5: session-id
    /// check, `lastReturnedResponseId`, `ReleaseUntil` or `ReleaseAll`). Returns it when it
    /// is to be delivered to the caller; `None` when it was ignored (nothing attached) or
    /// broke the protocol (the core is then `Failed`).
    #[must_use]
    pub fn on_response(&mut self, response: ExecutePlanResponse) -> Option<ExecutePlanResponse> {
        if self.phase != ClientPhase::Attached {
            self.stats.ignored += 1;
            return None;
        }
        if self.reattachable {
            if response.response_id.is_empty() {
                self.fail(Violation::MissingResponseId.into());
                return None;
            }
            if self
                .last
                .as_ref()
                .is_some_and(|l| *l.id == *response.response_id)
            {
                self.fail(
                    Violation::DuplicateResponse {
                        response_id: response.response_id,
                    }
                    .into(),
                );
                return None;
            }
        }
        if !response.operation_id.is_empty()
            && !response
                .operation_id
                .eq_ignore_ascii_case(&self.operation_id)
        {
            self.fail(
                Violation::WrongOperation {
                    expected: self.operation_id.to_string(),
                    actual: response.operation_id,
                }
                .into(),
            );
            return None;
        }
        if !response.server_side_session_id.is_empty() {
            match &self.expected_server_session {
                None => {
                    self.expected_server_session = Some(response.server_side_session_id.clone())
                }
                Some(expected) if *expected != response.server_side_session_id => {
                    let expected = expected.clone();
                    self.fail(ClientError::SessionChanged {
                        expected,
                        actual: response.server_side_session_id,
                    });
                    return None;
                }
                Some(_) => {}
            }
        }
        // Delivered: a new retry scope starts with the next wait (rx §6.3).
        self.retrying.reset();
        self.immediate = 0;
        self.immediate_since = None;
        self.empty_rotations = 0;
        self.stream_delivered += 1;
        self.stats.delivered += 1;
        if self.reattachable {
            let id = ResponseId {
                operation_id: self.operation_id.clone(),
                id: Arc::from(response.response_id.as_str()),
                index: self.stats.delivered,
            };
            if response.is_result_complete() {
                self.phase = ClientPhase::Complete;
                self.queue_release_all();
            } else if self.release_mode == ReleaseMode::AfterDelivery {
                self.queue_release_until(&id);
            }
            self.last = Some(id);
        }
        Some(response)
    }

    /// The attached RPC's stream ended without error. Reattachable: without `ResultComplete`
    /// this means "more to come — reattach" (rx §1.3, §6.3 step 2b); an empty rotation is
    /// normal and costs no retry. Non-reattachable: the result is complete.
    pub fn on_stream_end(&mut self) {
        if self.phase != ClientPhase::Attached {
            self.stats.ignored += 1;
            return;
        }
        if !self.reattachable {
            self.phase = ClientPhase::Complete;
            return;
        }
        if self.stream_delivered == 0 {
            self.empty_rotations += 1;
            self.stats.empty_rotations += 1;
            if self
                .max_empty_rotations
                .is_some_and(|max| self.empty_rotations > max)
            {
                let count = self.empty_rotations;
                self.fail(Violation::EndlessRotation { count }.into());
                return;
            }
        }
        self.phase = ClientPhase::Idle;
        self.next = Open::Reattach;
    }

    /// The attached RPC failed (at the call or while streaming) at `now` (rx §6.3 steps
    /// 3 and 5):
    ///
    /// - reattachable and `OPERATION_NOT_FOUND`/`SESSION_NOT_FOUND`: with nothing delivered
    ///   the `ExecutePlan` never reached the server, so it is re-sent at once with the same
    ///   operation id (no backoff, no policy retry; bounded by
    ///   [`ClientConfig::max_immediate_retries`] and
    ///   [`ClientConfig::max_immediate_retry_elapsed`]); after a delivery it is the fatal
    ///   [`ClientError::ResponseAlreadyReceived`];
    /// - non-reattachable after a delivery: fatal (it cannot resume);
    /// - otherwise the retry scope decides: a backoff then a reattach (or a re-sent
    ///   `ExecutePlan` when not reattachable), or the error is final.
    pub fn on_error(&mut self, error: RpcError, now: Instant) {
        if self.phase != ClientPhase::Attached {
            self.stats.ignored += 1;
            return;
        }
        if self.reattachable && error.is_not_found() {
            if self.stats.delivered > 0 {
                let delivered = self.stats.delivered;
                self.fail(ClientError::ResponseAlreadyReceived { error, delivered });
            } else {
                self.immediate_retry(Open::Execute, error, now);
            }
            return;
        }
        if !self.reattachable && self.stats.delivered > 0 {
            self.fail(ClientError::Rpc(error));
            return;
        }
        match self.retrying.on_error(&error, self.jitter.unit()) {
            RetryDecision::Retry(wait) => {
                tracing::debug!(
                    operation_id = %self.operation_id,
                    %error,
                    ?wait,
                    "retrying after a retryable error"
                );
                self.stats.retries += 1;
                self.phase = ClientPhase::Backoff;
                self.backoff_until = Some(crate::time::deadline_after(now, wait));
                self.next = if self.reattachable {
                    Open::Reattach
                } else {
                    Open::Execute
                };
            }
            RetryDecision::NotRetryable => self.fail(ClientError::Rpc(error)),
            RetryDecision::Exhausted => {
                let retries = self.retrying.retries();
                self.fail(ClientError::RetriesExceeded { error, retries });
            }
        }
    }

    /// The next instant at which [`handle_timeout`](Self::handle_timeout) has work: the
    /// attached RPC's deadline ([`ClientConfig::stream_deadline`]) or the end of a retry
    /// backoff (rx §6.1); `None` when nothing is timed. The core owns both deadlines, as the
    /// UDF cores own theirs (udf §7): a driver sleeps until this instant and never picks one.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            ClientPhase::Attached => self.rpc_deadline,
            ClientPhase::Backoff => self.backoff_until,
            _ => None,
        }
    }

    /// Time has reached `now`: a backoff that is over lets the next command open an RPC
    /// (rx §6.1); an attached RPC whose deadline passed is given up (the driver drops it, as
    /// the phase is no longer `Attached`). Reattachable: the server keeps the execution, so
    /// it reattaches at once (no retry consumed, bounded like a re-execute; SPARK-56538).
    /// Non-reattachable: fatal `DEADLINE_EXCEEDED`. Before the deadline it does nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            ClientPhase::Backoff if self.backoff_until.is_none_or(|at| at <= now) => {
                self.phase = ClientPhase::Idle;
                self.backoff_until = None;
            }
            ClientPhase::Attached if self.rpc_deadline.is_some_and(|at| at <= now) => {
                self.rpc_deadline = None;
                let error = RpcError::new(
                    Code::DeadlineExceeded,
                    "the client-side deadline of the RPC expired",
                );
                if self.reattachable {
                    self.immediate_retry(Open::Reattach, error, now);
                } else {
                    self.fail(ClientError::Rpc(error));
                }
            }
            _ => {}
        }
    }

    /// The caller is done with the stream before its end (drop, `close`): queue the one
    /// `ReleaseAll` if it was not queued yet (reattachable form; Spark's `close()` ⇒
    /// `release_all()`, rx §6.3) and stop. No-op once finished; a pending error is
    /// discarded.
    pub fn close(&mut self) {
        if matches!(self.phase, ClientPhase::Complete | ClientPhase::Closed) {
            return;
        }
        self.error = None;
        self.phase = ClientPhase::Closed;
        if self.reattachable {
            self.queue_release_all();
        }
    }

    /// The next `ReleaseExecute` request to send, if any. Requests come out in the order
    /// they were queued; queuing `ReleaseAll` drops any `ReleaseUntil` not yet taken (it
    /// frees all of it), and nothing is queued after it. Send them without blocking delivery
    /// (rx §6.3); their failures are not the stream's (the server's abandonment cleans up).
    #[must_use]
    pub fn poll_release(&mut self) -> Option<ReleaseExecuteRequest> {
        self.releases.pop_front()
    }

    /// Queues `ReleaseUntil(id)` for a response the caller is done with (manual mode,
    /// rx §6.3). Ids at or before one already released, or any id after `ReleaseAll`, are
    /// skipped.
    ///
    /// # Errors
    /// [`ReleaseError::ForeignResponseId`] for an id of another operation;
    /// [`ReleaseError::AutomaticMode`] unless the mode is [`ReleaseMode::Manual`].
    pub fn release_until(&mut self, id: &ResponseId) -> Result<(), ReleaseError> {
        if *id.operation_id != *self.operation_id {
            return Err(ReleaseError::ForeignResponseId {
                id_operation: id.operation_id.to_string(),
                stream_operation: self.operation_id.to_string(),
            });
        }
        if self.release_mode != ReleaseMode::Manual {
            return Err(ReleaseError::AutomaticMode);
        }
        self.queue_release_until(id);
        Ok(())
    }

    fn immediate_retry(&mut self, next: Open, error: RpcError, now: Instant) {
        let since = *self.immediate_since.get_or_insert(now);
        if self.immediate >= self.max_immediate
            || now.saturating_duration_since(since) >= self.max_immediate_elapsed
        {
            self.fail(ClientError::Rpc(error));
            return;
        }
        tracing::debug!(
            operation_id = %self.operation_id,
            %error,
            ?next,
            "immediate retry"
        );
        self.immediate += 1;
        match next {
            Open::Execute => self.stats.reexecutions += 1,
            Open::Reattach => self.stats.deadline_reattaches += 1,
        }
        self.phase = ClientPhase::Idle;
        self.next = next;
    }

    fn fail(&mut self, error: ClientError) {
        tracing::debug!(operation_id = %self.operation_id, %error, "stream failed");
        self.error = Some(error);
        self.phase = ClientPhase::Failed;
        if self.reattachable {
            self.queue_release_all();
        }
    }

    fn queue_release_all(&mut self) {
        if self.release_all_queued {
            return;
        }
        self.release_all_queued = true;
        // ReleaseAll frees everything a queued ReleaseUntil would.
        self.releases.clear();
        self.releases
            .push_back(self.release_request(Release::ReleaseAll(ReleaseAll {})));
        self.stats.release_all += 1;
    }

    fn queue_release_until(&mut self, id: &ResponseId) {
        if self.release_all_queued || id.index <= self.released_index {
            return;
        }
        self.released_index = id.index;
        self.releases
            .push_back(self.release_request(Release::ReleaseUntil(ReleaseUntil {
                response_id: id.id.to_string(),
            })));
        self.stats.release_until += 1;
    }

    /// The reattach request (rx §6.3 `call_iter` 1): `last_response_id` only when something
    /// was delivered, never empty; the observed server session id only when the initial
    /// request carried one (SPARK-49458).
    fn reattach_request(&self) -> ReattachExecuteRequest {
        ReattachExecuteRequest {
            session_id: self.initial.session_id.clone(),
            user_context: self.initial.user_context.clone(),
            operation_id: self.operation_id.to_string(),
            client_type: self.initial.client_type.clone(),
            last_response_id: self.last.as_ref().map(|l| l.id.to_string()),
            client_observed_server_side_session_id: self
                .initial
                .client_observed_server_side_session_id
                .clone(),
        }
    }

    fn release_request(&self, release: Release) -> ReleaseExecuteRequest {
        ReleaseExecuteRequest {
            session_id: self.initial.session_id.clone(),
            user_context: self.initial.user_context.clone(),
            operation_id: self.operation_id.to_string(),
            client_type: self.initial.client_type.clone(),
            release: Some(release),
            client_observed_server_side_session_id: self
                .initial
                .client_observed_server_side_session_id
                .clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::condition;
    use crate::wire::connect::UserContext;

    fn request() -> ExecutePlanRequest {
        ExecutePlanRequest {
            session_id: "00000000-0000-4000-8000-000000000001".into(),
            user_context: Some(UserContext::new("u")),
            ..Default::default()
        }
    }

    fn config() -> ClientConfig {
        ClientConfig {
            jitter_seed: Some(1),
            ..ClientConfig::with_timer(Arc::new(crate::time::NoTimeouts))
        }
    }

    fn resp(id: &str) -> ExecutePlanResponse {
        ExecutePlanResponse {
            response_id: id.into(),
            ..ExecutePlanResponse::arrow_batch(1, &b"x"[..])
        }
    }

    fn complete(id: &str) -> ExecutePlanResponse {
        ExecutePlanResponse {
            response_id: id.into(),
            ..ExecutePlanResponse::result_complete()
        }
    }

    fn drain(core: &mut ReattachCore) -> Vec<Release> {
        std::iter::from_fn(|| core.poll_release())
            .map(|r| r.release.expect("release set"))
            .collect()
    }

    fn until(id: &str) -> Release {
        Release::ReleaseUntil(ReleaseUntil {
            response_id: id.into(),
        })
    }

    #[test]
    fn initial_request_gets_uuid_and_reattach_option() {
        let mut req = request();
        req.request_options.push(RequestOption::reattach(false));
        let core = ReattachCore::reattachable(req, &config()).unwrap();
        let id = core.request().operation_id.clone().unwrap();
        let parsed = uuid::Uuid::parse_str(&id).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(core.request().request_options.len(), 1);
        assert!(core.request().is_reattachable());
    }

    #[test]
    fn operation_id_is_canonicalised_or_rejected() {
        let mut req = request();
        req.operation_id = Some("ABCDEF01-2345-4678-9ABC-DEF012345678".into());
        let core = ReattachCore::reattachable(req, &config()).unwrap();
        assert_eq!(core.operation_id(), "abcdef01-2345-4678-9abc-def012345678");
        let mut bad = request();
        bad.operation_id = Some("not-a-uuid".into());
        assert_eq!(
            ReattachCore::reattachable(bad, &config()).unwrap_err(),
            ClientError::InvalidOperationId("not-a-uuid".into())
        );
    }

    #[test]
    fn graceful_reattach_names_last_delivered() {
        let mut core = ReattachCore::reattachable(request(), &config()).unwrap();
        assert!(matches!(
            core.poll_command(Instant::now()),
            Command::ExecutePlan(_)
        ));
        assert!(core.on_response(resp("r1")).is_some());
        assert_eq!(drain(&mut core), vec![until("r1")]);
        core.on_stream_end();
        let Command::ReattachExecute(r) = core.poll_command(Instant::now()) else {
            panic!("expected reattach")
        };
        assert_eq!(r.last_response_id.as_deref(), Some("r1"));
        core.on_stream_end(); // an empty rotation
        let Command::ReattachExecute(r) = core.poll_command(Instant::now()) else {
            panic!("expected reattach")
        };
        assert_eq!(r.last_response_id.as_deref(), Some("r1"));
        assert!(core.on_response(complete("r2")).is_some());
        assert_eq!(drain(&mut core), vec![Release::ReleaseAll(ReleaseAll {})]);
        assert_eq!(core.poll_command(Instant::now()), Command::Done);
        assert_eq!(core.stats().empty_rotations, 1);
    }

    #[test]
    fn reattach_without_delivery_omits_last_response_id() {
        let mut core = ReattachCore::reattachable(request(), &config()).unwrap();
        let _ = core.poll_command(Instant::now());
        core.on_stream_end();
        let Command::ReattachExecute(r) = core.poll_command(Instant::now()) else {
            panic!("expected reattach")
        };
        assert_eq!(r.last_response_id, None);
    }

    #[test]
    fn not_found_before_and_after_delivery() {
        let nf = RpcError::spark(
            Code::Internal,
            condition::INVALID_HANDLE_OPERATION_NOT_FOUND,
            "gone",
        );
        let now = Instant::now();
        let mut core = ReattachCore::reattachable(request(), &config()).unwrap();
        let _ = core.poll_command(Instant::now());
        core.on_error(nf.clone(), now);
        let Command::ExecutePlan(again) = core.poll_command(Instant::now()) else {
            panic!("expected re-execute")
        };
        assert_eq!(again.operation_id.as_deref(), Some(core.operation_id()));
        let _ = core.on_response(resp("r1"));
        assert_eq!(drain(&mut core), vec![until("r1")]);
        core.on_stream_end();
        let _ = core.poll_command(Instant::now());
        core.on_error(nf, now);
        let Command::Fail(e) = core.poll_command(Instant::now()) else {
            panic!("expected failure")
        };
        assert!(e.has_condition(condition::RESPONSE_ALREADY_RECEIVED));
        assert_eq!(drain(&mut core), vec![Release::ReleaseAll(ReleaseAll {})]);
    }

    #[test]
    fn retryable_error_backs_off_then_reattaches() {
        let now = Instant::now();
        let mut core = ReattachCore::reattachable(request(), &config()).unwrap();
        let _ = core.poll_command(Instant::now());
        core.on_error(RpcError::unavailable("down"), now);
        let until = now + Duration::from_millis(50);
        assert_eq!(core.poll_command(now), Command::Sleep(until));
        assert_eq!(core.poll_timeout(), Some(until));
        core.handle_timeout(until - Duration::from_millis(1));
        assert_eq!(
            core.poll_command(now),
            Command::Sleep(until),
            "not yet over"
        );
        core.handle_timeout(until);
        assert!(matches!(
            core.poll_command(until),
            Command::ReattachExecute(_)
        ));
    }

    /// The RPC deadline is the core's (ClientConfig::stream_deadline, SPARK-56538): armed when
    /// the RPC is issued, reported by poll_timeout, and on expiry a reattachable execution
    /// reattaches at once while a non-reattachable one fails with DEADLINE_EXCEEDED.
    #[test]
    fn the_rpc_deadline_is_armed_by_the_core_and_expires_in_it() {
        let config = ClientConfig {
            stream_deadline: Some(Duration::from_secs(5)),
            ..config()
        };
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(5);
        let mut core = ReattachCore::reattachable(request(), &config).unwrap();
        assert_eq!(core.poll_timeout(), None, "nothing attached, nothing timed");
        assert!(matches!(core.poll_command(t0), Command::ExecutePlan(_)));
        assert_eq!(core.poll_timeout(), Some(deadline));
        core.handle_timeout(deadline - Duration::from_millis(1));
        assert_eq!(
            core.phase(),
            ClientPhase::Attached,
            "before the deadline: nothing"
        );
        core.handle_timeout(deadline);
        assert_ne!(core.phase(), ClientPhase::Attached, "the RPC is given up");
        assert!(matches!(
            core.poll_command(deadline),
            Command::ReattachExecute(_)
        ));
        assert_eq!(core.poll_timeout(), Some(deadline + Duration::from_secs(5)));

        let mut plain = ReattachCore::non_reattachable(request(), &config).unwrap();
        let _ = plain.poll_command(t0);
        plain.handle_timeout(deadline);
        let Command::Fail(ClientError::Rpc(e)) = plain.poll_command(deadline) else {
            panic!("a non-reattachable RPC past its deadline fails");
        };
        assert_eq!(e.code(), Code::DeadlineExceeded);
    }

    #[test]
    fn session_id_change_is_fatal() {
        let mut core = ReattachCore::reattachable(request(), &config()).unwrap();
        let _ = core.poll_command(Instant::now());
        let mut a = resp("r1");
        a.server_side_session_id = "s1".into();
        assert!(core.on_response(a).is_some());
        let mut b = resp("r2");
        b.server_side_session_id = "s2".into();
        assert!(core.on_response(b).is_none());
        assert!(matches!(
            core.poll_command(Instant::now()),
            Command::Fail(ClientError::SessionChanged { .. })
        ));
    }

    #[test]
    fn non_reattachable_never_releases_or_reattaches() {
        let mut core = ReattachCore::non_reattachable(request(), &config()).unwrap();
        assert!(!core.request().is_reattachable());
        let _ = core.poll_command(Instant::now());
        let _ = core.on_response(ExecutePlanResponse::arrow_batch(1, &b"x"[..]));
        core.on_stream_end();
        assert_eq!(core.poll_command(Instant::now()), Command::Done);
        assert!(core.poll_release().is_none());
        assert_eq!(core.stats().reattaches, 0);
    }

    #[test]
    fn manual_release_rules() {
        let cfg = ClientConfig {
            release_mode: ReleaseMode::Manual,
            ..config()
        };
        let mut core = ReattachCore::reattachable(request(), &cfg).unwrap();
        let mut other = ReattachCore::reattachable(request(), &cfg).unwrap();
        let _ = core.poll_command(Instant::now());
        let _ = other.poll_command(Instant::now());
        let _ = core.on_response(resp("r1"));
        let r1 = core.last_response_id().unwrap().clone();
        let _ = core.on_response(resp("r2"));
        let r2 = core.last_response_id().unwrap().clone();
        assert!(drain(&mut core).is_empty());
        core.release_until(&r2).unwrap();
        core.release_until(&r1).unwrap(); // older: skipped
        assert_eq!(drain(&mut core), vec![until("r2")]);
        assert!(matches!(
            other.release_until(&r1),
            Err(ReleaseError::ForeignResponseId { .. })
        ));
    }
}
