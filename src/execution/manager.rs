//! The execution registry and the sessions (reattach rx §5): [`ExecutionManager`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::admission::{Admission, AdmissionConfig, AdmissionUsage, AdmissionWait};
use super::budget::{BudgetUsage, MemoryBudget};
use super::core::{ExecutionCore, ExecutionPhase, StreamLimits};
use super::correlation::Correlation;
use super::drain::{Drain, DrainReport, DrainStep, DrainView};
use super::error::ConnectError;
use super::events::ExecutionEvent;
use super::keys::{ExecuteKey, SessionKey, parse_uuid};
use super::log::{LogConfig, Stamp};
use super::observer::ExecutionObserver;
use super::registry::{
    Admit, Admitted, InterruptTarget, Leave, MaintenanceReport, ManagerStats, NewExecution,
    Registry, RegistryConfig, RegistryNote, Remembered,
};
use super::state;
use super::status::Removal;
use super::stream::{ExecEnv, ExecShared, RegistryEvent, RegistryEvents, ResponseStream, Wakes};
use super::typed::{Execution, NonReattachable, Reattachable};
use crate::observe::EventSender;
use crate::sync::{Mutex, MutexGuard};
use crate::time::Timer;
use crate::wire::connect::get_status_response::{OperationState, OperationStatus};
use crate::wire::connect::{
    CloneSessionRequest, CloneSessionResponse, ExecutePlanRequest, GetStatusRequest,
    GetStatusResponse, InterruptRequest, InterruptResponse, InterruptType, ReattachExecuteRequest,
    ReleaseExecuteRequest, ReleaseExecuteResponse, ReleaseSessionRequest, ReleaseSessionResponse,
    interrupt_request, release_execute_request,
};

/// Settings of an [`ExecutionManager`]. Defaults are Spark's (rx §4.5) plus tether's
/// bounds.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Per-execution log bounds for reattachable executions (retry budget 10 MiB,
    /// `observerRetryBufferSize`, rx §3.1; unsent 64 MiB / 100 000, tether's).
    /// Non-reattachable executions use the same unsent bounds with a retry budget of 0.
    pub log: LogConfig,
    /// Stream rotation budgets (2 min, 1 GiB: `senderMaxStreamDuration`,
    /// `senderMaxStreamSize`, rx §4.5).
    pub stream: StreamLimits,
    /// `spark.connect.execute.reattachable.enabled` (true): when false every execution is
    /// non-reattachable even if requested (rx §1.2).
    pub reattachable_enabled: bool,
    /// Detached executions are abandoned after this long
    /// (`spark.connect.execute.manager.detachedTimeout`, 5 min, rx §5.3).
    pub detached_timeout: Duration,
    /// Period of [`ExecutionManager::run_maintenance`]
    /// (`spark.connect.execute.manager.maintenanceInterval`, 30 s, rx §5.3). The same pass
    /// expires sessions (Spark's separate `spark.connect.session.manager.maintenanceInterval`
    /// is also 30 s, rx §4.5).
    pub maintenance_interval: Duration,
    /// Capacity of the abandoned-operation tombstones, LRU
    /// (`spark.connect.execute.manager.abandonedTombstonesSize`, 10 000, rx §5.4).
    pub abandoned_tombstones: usize,
    /// Idle expiry of sessions; every RPC naming the session refreshes it
    /// (`spark.connect.session.manager.defaultSessionTimeout`, 60 min, rx §5.6). `None` =
    /// never (Spark's −1).
    pub session_timeout: Option<Duration>,
    /// Capacity of the closed-session tombstones, LRU
    /// (`spark.connect.session.manager.closedSessionsTombstonesSize`, 1 000, rx §5.6).
    pub closed_session_tombstones: usize,
    /// Most live executions per session (tether's own bound, not in Spark; default 1 000).
    /// Beyond it ExecutePlan gets `EXECUTION_LIMIT_EXCEEDED` (status `RESOURCE_EXHAUSTED`).
    pub max_executions_per_session: usize,
    /// How long a session remembers the ids of its released, completed or abandoned
    /// operations, so that re-submitting one gets `OPERATION_ABANDONED` as in Spark 4.3.0
    /// (`spark.connect.session.inactiveOperations.cacheExpiration`, 30 min, rx §5.2,
    /// SPARK-53492).
    pub inactive_operation_expiry: Duration,
    /// Most remembered inactive operation ids per session (tether's bound on the cache of
    /// rx §5.2; 10 000). Beyond it the ids that became inactive first are forgotten, down
    /// to seven eighths of the bound at once; a forgotten id may be submitted again.
    pub inactive_operations_per_session: usize,
    /// Most errors each session keeps for FetchErrorDetails (connect §8.1): every error a
    /// client is sent with an `errorId` is stored in its session until fetched (once), or
    /// until this many newer ones evicted it (the oldest first), or
    /// [`error_details_expiry`](Self::error_details_expiry) passed, or the session closed.
    /// Default 20 (Spark's `SessionHolder` cache size). 0: no error is stored and none is
    /// sent with an `errorId`.
    pub error_details_per_session: usize,
    /// How long a stored error can be fetched with FetchErrorDetails (connect §8.1;
    /// Spark's 60 s).
    pub error_details_expiry: Duration,
    /// One byte budget over the unsent and retained responses (rx §3.1) of every
    /// execution of the manager: tether's own bound, default 1 GiB
    /// ([`MemoryBudget::DEFAULT_LIMIT`]); `None` = only the per-execution bounds of
    /// [`log`](Self::log). Producers past it wait in FIFO order, none is dropped, and an
    /// execution that holds nothing may always take one response (see [`MemoryBudget`]).
    pub memory_budget: Option<u64>,
    /// Where the manager's lifecycle events go (see [`observe`](crate::observe)): the
    /// sending half of an [`event_channel`](crate::observe::event_channel), or `None`
    /// (the default) for metrics alone.
    pub events: Option<EventSender<ExecutionEvent>>,
    /// The cap on executions running at once, server-wide and per user, with FIFO waiting
    /// ([`ExecutionManager::admit`]; tether's, SPARK-49580's proposal). The default has no
    /// cap, as Spark 4.3.0.
    pub admission: AdmissionConfig,
    /// The clock every timeout of rx §4.5, §5.3 and §5.6 is measured on:
    /// [`TokioTimer`](crate::time::TokioTimer) by default (monotonic, as Spark 4.0+ measures
    /// its timeouts), a [`ManualClock`](crate::time::ManualClock) in tests and simulations.
    pub timer: Arc<dyn Timer>,
}

impl ManagerConfig {
    /// Spark's defaults (rx §4.5, §5.2–§5.6) and tether's bounds, on `timer`.
    pub fn with_timer(timer: Arc<dyn Timer>) -> Self {
        Self {
            log: LogConfig::REATTACHABLE,
            stream: StreamLimits::default(),
            reattachable_enabled: true,
            detached_timeout: Duration::from_secs(5 * 60),
            maintenance_interval: Duration::from_secs(30),
            abandoned_tombstones: 10_000,
            session_timeout: Some(Duration::from_secs(60 * 60)),
            closed_session_tombstones: 1_000,
            max_executions_per_session: 1_000,
            inactive_operation_expiry: Duration::from_secs(30 * 60),
            inactive_operations_per_session: 10_000,
            error_details_per_session: 20,
            error_details_expiry: Duration::from_secs(60),
            memory_budget: Some(MemoryBudget::DEFAULT_LIMIT),
            admission: AdmissionConfig::default(),
            events: None,
            timer,
        }
    }
}

/// [`ManagerConfig::with_timer`] on tokio's clock (feature `tokio`; rx §4.5).
#[cfg(feature = "tokio")]
impl Default for ManagerConfig {
    fn default() -> Self {
        Self::with_timer(Arc::new(crate::time::TokioTimer))
    }
}

/// What [`ExecutionManager::execute_plan`] produced: a new execution, or a reattach for a
/// duplicate operation id with the same plan (rx §5.2).
#[derive(Debug)]
pub enum Submitted {
    /// A new reattachable execution, registered with its producer not started: call
    /// [`Execution::start`] to get the [`Producer`](super::Producer) and the initial
    /// stream. Dropping it unstarted removes it (rx §2.2 T2).
    Reattachable(Execution<state::Init, Reattachable>),
    /// A new non-reattachable execution (no reattach or release API), as above.
    NonReattachable(Execution<state::Init, NonReattachable>),
    /// The operation id names a live reattachable execution with the same plan: this is a
    /// reattach from the start (rx §5.2, SPARK-52397). Nothing new runs.
    Reattached(Box<ResponseStream>),
}

impl Submitted {
    /// Starts a new execution (rx §2.2 T1), or passes the reattached stream through: the
    /// producer to run the plan with (`None` for a reattach) and the response stream of
    /// this RPC.
    pub fn start(self) -> (Option<super::Producer>, ResponseStream) {
        match self {
            Self::Reattachable(e) => {
                let (_, p, s) = e.start();
                (Some(p), s)
            }
            Self::NonReattachable(e) => {
                let (_, p, s) = e.start();
                (Some(p), s)
            }
            Self::Reattached(s) => (None, *s),
        }
    }

    /// The canonical operation id: the request's `operation_id` in the re-serialised
    /// lower-case form, or the one the server generated when it had none (rx §1.9).
    pub fn operation_id(&self) -> &str {
        match self {
            Self::Reattachable(e) => e.operation_id(),
            Self::NonReattachable(e) => e.operation_id(),
            Self::Reattached(s) => s.operation_id(),
        }
    }
}

/// The registry as the manager holds it: the pure rules of rx §5 over shared executions.
type Reg = Registry<Arc<ExecShared>>;

/// An execution's GetStatus states, read under its own lock (connect §15.2). The registry
/// asks with its lock held, the order every path takes (registry, then execution).
impl Remembered for Arc<ExecShared> {
    fn state(&self) -> OperationState {
        self.lock().core.operation_state()
    }

    fn final_state(&self) -> OperationState {
        self.lock().core.final_state()
    }
}

pub(crate) struct ManagerInner {
    config: ManagerConfig,
    registry: Mutex<Reg>,
    /// The clock, and what executions report when they leave (applied at every lock of
    /// the registry); every execution holds it.
    env: Arc<ExecEnv>,
    /// The budget every execution's log is charged to ([`ManagerConfig::memory_budget`]).
    budget: Option<Arc<MemoryBudget>>,
    /// The cap on running executions ([`ManagerConfig::admission`]).
    admission: Arc<Admission>,
}

/// The server side of reattachable executions: Spark's `SparkConnectExecutionManager` and
/// session store (reattach rx §5) — sessions keyed by `(user_id, session_id)`, executions
/// keyed by `(user_id, session_id, operation_id)`, tombstones, interrupts and abandonment.
/// Cheap to clone (shared).
///
/// One lock guards the registry (sessions, their executions, tombstones); each execution has
/// its own lock (see [`ResponseStream`]). The registry lock is always taken before an
/// execution's lock, never after, and producers and consumers only take the execution's
/// lock, so streaming never contends on the registry. Executions hold no pointer back into
/// the manager: a handle or stream that removes one (rx §2.2 T2, T10, T14) closes it at
/// once and queues an event, which the registry applies the next time it is locked, before
/// it answers anything.
///
/// Executions live inside their session (`(user_id, session_id)` → session →
/// `operation_id` → execution), so registering and removing is one map operation each and
/// cannot leave an execution unreachable: registration is all-or-nothing (rx §5.1
/// caution).
///
/// The RPC methods ([`execute_plan`](Self::execute_plan),
/// [`reattach_execute`](Self::reattach_execute), [`release_execute`](Self::release_execute),
/// [`interrupt`](Self::interrupt), [`release_session`](Self::release_session)) take the wire
/// requests and apply Spark 4.3.0's rules, with these deliberate differences:
///
/// - Operation ids are normalised to canonical lower case in every lookup, so any UUID
///   spelling works end to end. As in Spark, a non-UUID id is `INVALID_HANDLE.FORMAT` in
///   ExecutePlan and names no execution elsewhere (`OPERATION_NOT_FOUND` on reattach, a
///   no-op release or interrupt).
/// - ReleaseAll after an interrupt or a rotation always succeeds.
/// - Unsent responses are bounded (the producer waits); Spark's are unbounded.
/// - A per-session cap on live executions (`EXECUTION_LIMIT_EXCEEDED`).
///
/// Time comes from the [`Timer`] given at construction ([`ManualClock`](crate::time::ManualClock)
/// in tests); [`maintain`](Self::maintain) is one abandonment + session-expiry pass, and
/// [`run_maintenance`](Self::run_maintenance) runs it every `maintenance_interval`.
#[derive(Clone)]
pub struct ExecutionManager {
    inner: Arc<ManagerInner>,
}

impl fmt::Debug for ExecutionManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutionManager")
            .field("stats", &self.stats())
            .finish()
    }
}

/// An id kept as `Arc<str>`, copied into a response's `String` field (rx §1.3): one
/// allocation of the exact length (`to_string` would go through `Display`).
fn owned(id: &Arc<str>) -> String {
    String::from(&**id)
}

/// The canonical (lower-case, hyphenated) spelling of `id` (rx §1.9): `raw`, the request's
/// own spelling of it, when that already is canonical (a handle that parsed is 8-4-4-4-12
/// hex digits, so lower case is all it takes; clients send lower case), else formatted.
fn canonical_arc(id: Uuid, raw: Option<&str>) -> Arc<str> {
    if let Some(raw) = raw
        && !raw.bytes().any(|b| b.is_ascii_uppercase())
    {
        debug_assert_eq!(super::keys::parse_uuid(raw), Some(id));
        return Arc::from(raw);
    }
    let mut buf = Uuid::encode_buffer();
    Arc::from(&*id.hyphenated().encode_lower(&mut buf))
}

impl From<&ManagerConfig> for RegistryConfig {
    fn from(c: &ManagerConfig) -> Self {
        Self {
            detached_timeout: c.detached_timeout,
            session_timeout: c.session_timeout,
            abandoned_tombstones: c.abandoned_tombstones,
            closed_session_tombstones: c.closed_session_tombstones,
            max_executions_per_session: c.max_executions_per_session,
            inactive_operation_expiry: c.inactive_operation_expiry,
            inactive_operations_per_session: c.inactive_operations_per_session,
            error_details_per_session: c.error_details_per_session,
            error_details_expiry: c.error_details_expiry,
        }
    }
}

/// Closes an execution the registry removed (rx §2.2 T12) and collects its wake-ups.
fn close(exec: &ExecShared, removal: Removal, wakes: &mut Wakes) {
    let mut st = exec.lock();
    let _ = st.core.close(removal);
    st.take_all(wakes);
}

/// The lock of the registry: on release, the registry's notes (sessions created and closed,
/// tombstone hits) go to the manager's observer, after the executions' own events of the
/// same step.
struct RegGuard<'a> {
    inner: &'a ManagerInner,
    reg: MutexGuard<'a, Reg>,
}

impl std::ops::Deref for RegGuard<'_> {
    type Target = Reg;

    fn deref(&self) -> &Reg {
        &self.reg
    }
}

impl std::ops::DerefMut for RegGuard<'_> {
    fn deref_mut(&mut self) -> &mut Reg {
        &mut self.reg
    }
}

impl Drop for RegGuard<'_> {
    fn drop(&mut self) {
        self.flush_notes();
    }
}

impl RegGuard<'_> {
    /// Forwards the registry's notes now, before what follows under the same lock.
    fn flush_notes(&mut self) {
        if !self.reg.has_notes() {
            return;
        }
        let observer = &self.inner.env.observer;
        let at = self.inner.env.clock.now();
        for note in self.reg.take_notes() {
            match note {
                RegistryNote::SessionStarted(key) => observer.session(at, &key, true),
                RegistryNote::SessionClosed(key) => observer.session(at, &key, false),
                RegistryNote::TombstoneHit(key) => {
                    observer.tombstone_hit(at, key.session_id, key.operation_id);
                }
            }
        }
    }
}

impl ManagerInner {
    /// Locks the registry, first applying what executions reported since the last lock
    /// (their removals, [`RegistryEvent`]): every answer reflects them.
    fn lock(&self) -> RegGuard<'_> {
        let mut reg = RegGuard {
            inner: self,
            reg: self.registry.lock(),
        };
        let events = self.env.events.take();
        if !events.is_empty() {
            let now = self.env.clock.now();
            let mut wakes = Wakes::default();
            for RegistryEvent { exec, removal } in events {
                if let Some(exec) = exec.upgrade() {
                    let how = Leave::Removed(removal);
                    if reg
                        .remove(&exec.key, how, now, |e| Arc::ptr_eq(e, &exec))
                        .is_some()
                    {
                        close(&exec, removal, &mut wakes);
                    }
                }
            }
            // The executions closed themselves and took their wake-ups already.
            wakes.wake();
        }
        reg
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Timer> {
        &self.env.clock
    }
}

impl ExecutionManager {
    /// A manager with `config`, its timeouts (rx §5.3, §5.6) on
    /// [`config.timer`](ManagerConfig::timer).
    pub fn new(config: ManagerConfig) -> Self {
        let clock = config.timer.clone();
        let observer = ExecutionObserver::new(config.events.clone());
        let env = Arc::new(ExecEnv {
            clock,
            events: RegistryEvents::default(),
            observer,
        });
        Self {
            inner: Arc::new(ManagerInner {
                registry: Mutex::new(Registry::new(RegistryConfig::from(&config))),
                budget: config.memory_budget.map(MemoryBudget::new),
                admission: Arc::new(Admission::new(config.admission, env.clone())),
                config,
                env,
            }),
        }
    }

    /// The configuration (defaults: rx §4.5).
    pub fn config(&self) -> &ManagerConfig {
        &self.inner.config
    }

    /// The clock the detached and idle timeouts are measured on (rx §5.3, §5.6).
    pub fn clock(&self) -> &Arc<dyn Timer> {
        self.inner.clock()
    }

    /// One RPC handler's frame: `handle` runs with the clock's `now` and collects the
    /// wake-ups of what it changed, which are woken once it returns (after every lock it
    /// took is released); an error it answers is counted here, the one place an RPC's
    /// errors reach the errors metric (rx §1.8; a response stream's are counted where it
    /// ends). Every RPC handler runs in it.
    #[inline]
    fn rpc<T>(
        &self,
        handle: impl FnOnce(Instant, &mut Wakes) -> Result<T, ConnectError>,
    ) -> Result<T, ConnectError> {
        let mut wakes = Wakes::default();
        let result = handle(self.now(), &mut wakes);
        wakes.wake();
        result.inspect_err(|e| self.inner.env.observer.error(e))
    }

    fn now(&self) -> Instant {
        self.inner.env.clock.now()
    }

    /// Counters and sizes ([`ManagerStats`]: registry, rx §5.1; tombstones, rx §5.4, §5.6).
    pub fn stats(&self) -> ManagerStats {
        self.inner.lock().stats()
    }

    /// The budget shared by every execution's unsent and retained responses (rx §3.1;
    /// tether's bound, [`ManagerConfig::memory_budget`]), if configured.
    pub fn memory_budget(&self) -> Option<&Arc<MemoryBudget>> {
        self.inner.budget.as_ref()
    }

    /// The budget's current usage (tether's bound over rx §3.1's unsent and retained
    /// responses), if one is configured: for soak and scaling runs.
    pub fn memory_usage(&self) -> Option<BudgetUsage> {
        self.inner.budget.as_ref().map(|b| b.usage())
    }

    /// Number of live (registered) executions (rx §2.1 dimension 1).
    pub fn execution_count(&self) -> usize {
        self.inner.lock().len()
    }

    /// Whether the abandoned-operation tombstones hold `key` (does not refresh it; Spark's
    /// `getAbandonedTombstone`, rx §5.4).
    pub fn is_abandoned(&self, key: &ExecuteKey) -> bool {
        self.inner.lock().is_abandoned(key)
    }

    /// Whether the closed-session tombstones hold `key` (does not refresh it; rx §5.6).
    pub fn is_session_closed(&self, key: &SessionKey) -> bool {
        self.inner.lock().is_session_closed(key)
    }

    /// The `server_side_session_id` of a live session: server-generated, carried by every
    /// response of the session (rx §1.3, connect §3).
    pub fn server_side_session_id(&self, key: &SessionKey) -> Option<String> {
        self.inner
            .lock()
            .session(key)
            .map(|s| owned(s.server_side()))
    }

    /// When a live session was last accessed by an RPC (every RPC that resolves the
    /// session counts, rx §5.6).
    pub fn session_last_access(&self, key: &SessionKey) -> Option<Instant> {
        self.inner.lock().session(key).map(|s| s.last_access())
    }

    /// How long ago, by the manager's clock, the most recently accessed live session was
    /// last accessed by an RPC (O(n) in the sessions; rx §5.6's last access), `None` when
    /// no session is live. A drain waits for its clients to go quiet with it.
    pub fn sessions_quiet_for(&self) -> Option<Duration> {
        let last = self.inner.lock().last_session_access()?;
        Some(self.now().saturating_duration_since(last))
    }

    /// The keys of every live execution (O(n); for tests and tooling; the registry of
    /// rx §5.1, as Spark's `listActiveExecutions` lists it).
    pub fn execution_keys(&self) -> Vec<ExecuteKey> {
        let reg = self.inner.lock();
        let mut keys = Vec::with_capacity(reg.len());
        keys.extend(reg.executions().map(|(key, _)| key));
        keys
    }

    /// Refuses new work, the first step of a graceful drain (tether's; Spark has none):
    /// from now on a request that would create a session or register an execution is
    /// refused with [`ConnectError::ServerDraining`] (`UNAVAILABLE`, which clients retry, so
    /// a load balancer can send the retry to another server); every live session and
    /// execution is served as before: its streams, ReattachExecute, ReleaseExecute,
    /// Interrupt, and an ExecutePlan repeating a live operation (rx §5.5). Idempotent and
    /// irreversible. [`begin_drain`](Self::begin_drain) calls it.
    pub fn refuse_new(&self) {
        self.inner.lock().set_draining();
        self.inner.admission.refuse_all();
    }

    /// Waits for a slot to run one execution of `user_id` under
    /// [`ManagerConfig::admission`] (tether's; SPARK-49580's proposal): at once while the
    /// server-wide and the user's caps have room and nobody waits, else in FIFO order as
    /// running executions end (a user at its own cap does not hold back others). Hold the
    /// [`AdmissionPermit`](super::AdmissionPermit) for as long as the execution runs; dropping it frees the slot.
    /// Ask before [`execute_plan`](Self::execute_plan), so that nothing is registered
    /// while it waits.
    ///
    /// # Errors
    /// The future resolves to `SERVER_BUSY` ([`ConnectError::ServerBusy`]) after
    /// [`AdmissionConfig::max_wait`] on the manager's clock, or `SERVER_DRAINING` once
    /// [`refuse_new`](Self::refuse_new) is called; both `UNAVAILABLE`, retried by clients.
    pub fn admit(&self, user_id: &str) -> AdmissionWait {
        self.inner.admission.admit(user_id)
    }

    /// Executions holding an admission slot and waiting for one now ([`admit`](Self::admit);
    /// connect §11); both 0 without a cap.
    pub fn admission_usage(&self) -> AdmissionUsage {
        self.inner.admission.usage()
    }

    /// Begins a graceful drain whose deadline is `deadline` from now on the manager's clock
    /// ([`Drain`], the rule): refuses new work ([`refuse_new`](Self::refuse_new)) and
    /// counts what is live (rx §5.1). Drive it with [`step_drain`](Self::step_drain).
    pub fn begin_drain(&self, deadline: Duration) -> Drain {
        self.refuse_new();
        Drain::begin(deadline, self.now(), self.execution_count())
    }

    /// Polls `drain` (with `handlers` RPC handlers running in the server, 0 without one)
    /// and carries out the steps that touch only this manager (rx §5.1): [`DrainStep::Abandon`]
    /// ([`abandon_detached`](Self::abandon_detached)) and [`DrainStep::CancelAll`]
    /// ([`cancel_all`](Self::cancel_all)), handing their keys to the drain. Returns
    /// [`DrainStep::CancelAll`] once it has canceled (a server closes its connections
    /// then), [`DrainStep::Wait`] (sleep until then on [`clock`](Self::clock), or until
    /// something changed, and step again) or [`DrainStep::Done`]
    /// ([`drain_report`](Self::drain_report)); never [`DrainStep::Abandon`].
    pub fn step_drain(&self, drain: &mut Drain, handlers: usize) -> DrainStep {
        loop {
            let view = DrainView {
                live: self.execution_count(),
                handlers,
                sessions_quiet_for: self.sessions_quiet_for(),
            };
            match drain.poll(view, self.now()) {
                DrainStep::Abandon {
                    detached_for,
                    delivered_too,
                } => drain.abandoned(self.abandon_detached_told(detached_for, delivered_too)),
                DrainStep::CancelAll => {
                    drain.canceled(self.cancel_all());
                    return DrainStep::CancelAll;
                }
                step => return step,
            }
        }
    }

    /// `drain`'s report now ([`Drain::report`]): the executions still registered are
    /// `left`, the live sessions `sessions_open` (rx §5.1, §5.6).
    pub fn drain_report(&self, drain: &Drain) -> DrainReport {
        drain.report(self.execution_keys(), self.stats().sessions, self.now())
    }

    /// Whether [`refuse_new`](Self::refuse_new) was called: the registry then creates no session
    /// (rx §5.6) and registers no execution (rx §5.1).
    pub fn is_draining(&self) -> bool {
        self.inner.lock().is_draining()
    }

    /// Cancels every live execution now, for a shutdown (tether's; Spark has no drain):
    /// each one's runner is interrupted if it still runs, every held response is dropped,
    /// and `OPERATION_CANCELED` (or the execution's own terminal error, if it had failed) is
    /// the next event of its attached consumer and of any consumer that reattaches, from
    /// any position ([`ExecutionCore::cancel_now`](super::ExecutionCore::cancel_now);
    /// rx §2.2 T9's error, without waiting for the unsent responses). Clients then release
    /// as after any failed stream (rx §6.2). Returns the keys of the executions it
    /// canceled (every live one not canceled already). What a drain's deadline does to what
    /// is left (`ConnectService::drain` also closes the server's connections, so that
    /// clients need not read what is in flight before the error).
    pub fn cancel_all(&self) -> Vec<ExecuteKey> {
        let mut wakes = Wakes::default();
        let mut canceled = Vec::new();
        {
            let reg = self.inner.lock();
            for (key, exec) in reg.executions() {
                let mut st = exec.lock();
                if st.core.cancel_now() {
                    canceled.push(key);
                    st.take_all(&mut wakes);
                }
            }
        }
        wakes.wake();
        canceled
    }

    /// Abandons every execution detached for at least `min_detached` now (rx §5.3's
    /// abandonment with this instead of its `detached_timeout`; `Duration::ZERO`: however
    /// briefly; tombstoned, closed, counted in
    /// [`ManagerStats::abandoned`]): for a shutdown, when no client is expected to
    /// reattach any more. Attached executions are left, and so, unless `delivered_too`,
    /// are those whose client was handed `ResultComplete` (it may still be reading its
    /// buffers, and will release). Returns the keys it abandoned.
    pub fn abandon_detached(&self, min_detached: Duration, delivered_too: bool) -> Vec<ExecuteKey> {
        self.abandon_detached_told(min_detached, delivered_too)
            .into_iter()
            .map(|(key, _)| key)
            .collect()
    }

    /// [`abandon_detached`](Self::abandon_detached), each key with whether its client had
    /// been handed the execution's terminal error ([`ExecutionCore::delivered_error`]).
    fn abandon_detached_told(
        &self,
        min_detached: Duration,
        delivered_too: bool,
    ) -> Vec<(ExecuteKey, bool)> {
        let now = self.now();
        let mut wakes = Wakes::default();
        let mut keys = Vec::new();
        {
            let mut reg = self.inner.lock();
            let gone = reg.abandon_detached(now, min_detached, |exec| {
                let st = exec.lock();
                if !delivered_too && st.core.delivered_result_complete() {
                    return None;
                }
                st.core.detached_since()
            });
            for exec in &gone {
                let told = exec.lock().core.delivered_error();
                keys.push((exec.key.clone(), told));
                close(exec, Removal::Abandoned, &mut wakes);
            }
        }
        wakes.wake();
        keys
    }

    /// The keys in the abandoned-operation tombstones (O(n); Spark's
    /// `listAbandonedExecutions`, rx §5.4).
    pub fn abandoned_keys(&self) -> Vec<ExecuteKey> {
        self.inner.lock().abandoned_keys().cloned().collect()
    }

    /// A handle on a live execution, in the typestate matching its current phase (rx §2.3;
    /// Spark's `getExecuteHolder`).
    pub fn lookup(&self, key: &ExecuteKey) -> Option<super::typed::Lookup> {
        let exec = self.inner.lock().get(key)?.clone();
        Some(super::typed::Lookup::from_shared(exec))
    }

    /// The coarse phase of a live execution (rx §2.3).
    pub fn phase(&self, key: &ExecuteKey) -> Option<ExecutionPhase> {
        let exec = self.inner.lock().get(key)?.clone();
        let p = exec.lock().core.phase();
        Some(p)
    }

    /// `ExecutePlan` (rx §5.5, §2.2 T1): gets or creates the session, validates the
    /// operation id and tags, applies the duplicate-id rules of Spark 4.3.0 (rx §5.2) and
    /// registers a new execution, or reattaches from the start for a duplicate with the
    /// same plan ([`Submitted::Reattached`], SPARK-52397): that reattach is a
    /// ReattachExecute without `last_response_id`, so it preempts the execution's attached
    /// consumer (which gets `INVALID_CURSOR.DISCONNECTED`, rx §4.4) as
    /// [`reattach_execute`](Self::reattach_execute) does.
    ///
    /// # Errors
    /// `INVALID_HANDLE.FORMAT` (session or operation id not a UUID), `SESSION_CLOSED`,
    /// `SESSION_CHANGED`, `SERVER_DRAINING` (a new session or execution while
    /// [draining](Self::refuse_new)), `OPERATION_ALREADY_EXISTS` (live, different plan),
    /// `OPERATION_ABANDONED` (tombstoned, or released/completed and still remembered),
    /// `NOT_REATTACHABLE` / orphan (same plan, but not reattachable), an invalid tag, or
    /// `EXECUTION_LIMIT_EXCEEDED`: on these nothing is registered. For a duplicate with the
    /// same plan, the reattach's own errors: `POSITION_NOT_AVAILABLE` once the client has
    /// released the first response with ReleaseUntil (the attached consumer is preempted
    /// all the same, as Spark's sender does, rx §5.5).
    pub fn execute_plan(&self, request: &ExecutePlanRequest) -> Result<Submitted, ConnectError> {
        self.execute_plan_correlated(request, &Correlation::default())
    }

    /// [`execute_plan`](Self::execute_plan), reporting the request's correlation ids
    /// (`x-request-id`, `traceparent`, connect §13) on the execution's `OperationStarted`
    /// event.
    ///
    /// # Errors
    /// As [`execute_plan`](Self::execute_plan).
    pub fn execute_plan_correlated(
        &self,
        request: &ExecutePlanRequest,
        correlation: &Correlation,
    ) -> Result<Submitted, ConnectError> {
        let config = &self.inner.config;
        self.rpc(|now, wakes| {
            let mut reg = self.inner.lock();
            let admit = Admit {
                user: request.user_id(),
                session_id: &request.session_id,
                observed: request.client_observed_server_side_session_id.as_deref(),
                operation_id: request.operation_id.as_deref(),
                tags: &request.tags,
            };
            let reattachable = config.reattachable_enabled && request.is_reattachable();
            let make = |new: NewExecution<'_>| {
                let stamp = Stamp {
                    session_id: new.session_id.clone(),
                    server_side_session_id: new.server_side.clone(),
                    operation_id: canonical_arc(
                        new.key.operation_id,
                        request.operation_id.as_deref(),
                    ),
                };
                let mut core = ExecutionCore::new(reattachable, config.log, config.stream, stamp);
                if let Some(budget) = &self.inner.budget {
                    core = core.with_budget(budget.clone());
                }
                Arc::new(ExecShared::new(
                    new.key,
                    core,
                    request.tags.clone().into_boxed_slice(),
                    request.plan.clone(),
                    self.inner.env.clone(),
                ))
            };
            let admitted = reg.admit(admit, now, |e| e.plan == request.plan, make);
            // The session this request created, if any, is reported before the execution.
            reg.flush_notes();
            match admitted {
                // A reattach from the start (rx §5.2, SPARK-52397), under the registry lock
                // as every attach.
                Ok(Admitted::Duplicate(existing)) => existing
                    .attach(None, now, wakes)
                    .map(|stream| Submitted::Reattached(Box::new(stream))),
                Ok(Admitted::New(exec)) => {
                    exec.observer().operation_started(
                        exec.started_at(),
                        &exec.key,
                        &exec.tags,
                        correlation,
                    );
                    Ok(if exec.reattachable {
                        Submitted::Reattachable(Execution::new_submitted(exec))
                    } else {
                        Submitted::NonReattachable(Execution::new_submitted(exec))
                    })
                }
                Err(e) => Err(e),
            }
        })
    }

    /// `ReattachExecute` (rx §5.5): resumes a reattachable execution after
    /// `last_response_id` (from index 1 when absent), preempting the attached consumer
    /// (which gets `INVALID_CURSOR.DISCONNECTED`).
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND` / `SESSION_CLOSED` / `SESSION_CHANGED`,
    /// `OPERATION_ABANDONED` (tombstoned) / `OPERATION_NOT_FOUND` (released, never
    /// existed, or not a UUID), `NOT_REATTACHABLE`, the orphan error (the orphan is removed, SPARK-50735),
    /// `POSITION_NOT_FOUND` (before anything is preempted), or `POSITION_NOT_AVAILABLE`
    /// (after preempting, as Spark's sender does).
    pub fn reattach_execute(
        &self,
        request: &ReattachExecuteRequest,
    ) -> Result<ResponseStream, ConnectError> {
        self.rpc(|now, wakes| {
            self.inner
                .lock()
                .find(
                    request.user_id(),
                    &request.session_id,
                    request.client_observed_server_side_session_id.as_deref(),
                    &request.operation_id,
                    now,
                )
                .and_then(|exec| exec.attach(request.last_response_id.as_deref(), now, wakes))
        })
    }

    /// `ReleaseExecute` (rx §5.5): `ReleaseUntil` frees responses (rx §3.4);
    /// `ReleaseAll` removes the execution (interrupting it if it still runs, disconnecting
    /// its consumer; no tombstone). An unknown operation in a live session succeeds with
    /// `operation_id` unset. `client_observed_server_side_session_id` is deliberately not
    /// checked (as Spark).
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND` / `SESSION_CLOSED`, `NOT_REATTACHABLE`,
    /// `POSITION_NOT_FOUND` (ReleaseUntil of an unknown id), or the unknown-release-type
    /// error.
    pub fn release_execute(
        &self,
        request: &ReleaseExecuteRequest,
    ) -> Result<ReleaseExecuteResponse, ConnectError> {
        self.rpc(|now, wakes| {
            // One session lookup and one execution lookup (`Registry::release`). Like Spark,
            // ReleaseExecute does not validate the observed server-side session id (rx §1.5),
            // so a release always reaches the execution.
            let mut reg = self.inner.lock();
            let released = reg.release(
                request.user_id(),
                &request.session_id,
                &request.operation_id,
                now,
                |server_side, exec| {
                    let mut response = ReleaseExecuteResponse {
                        session_id: request.session_id.clone(),
                        server_side_session_id: owned(server_side),
                        operation_id: None,
                    };
                    // An unknown id, or one that is no UUID, names no execution (Spark).
                    let Some(exec) = exec else {
                        return Ok((response, false));
                    };
                    if !exec.reattachable {
                        return Err(ConnectError::NotReattachable);
                    }
                    let release_all = match &request.release {
                        None => return Err(ConnectError::UnknownReleaseType),
                        Some(release_execute_request::Release::ReleaseAll(_)) => true,
                        Some(release_execute_request::Release::ReleaseUntil(until)) => {
                            let mut st = exec.lock();
                            st.core.release_until(&until.response_id)?;
                            wakes.push(st.take_producer());
                            false
                        }
                    };
                    // The execution's canonical id, already spelled (no formatting per call).
                    response.operation_id = Some(owned(&exec.operation_id));
                    Ok((response, release_all))
                },
            );
            // Closed under the registry lock, as every removal (rx §2.2 T12).
            released.map(|(response, removed)| {
                if let Some(exec) = removed {
                    exec.observer().released_all(now, &exec.key);
                    close(&exec, Removal::Released, wakes);
                }
                response
            })
        })
    }

    /// Gets or creates the session of `(user_id, session_id)` and returns its one
    /// `server_side_session_id`, refreshing its idle timer: what every non-execution RPC of
    /// a Spark Connect service (`Config`, `AnalyzePlan`, …) does before it answers, so that
    /// every response carries the same server-side id from the first call on (connect §3;
    /// Spark's `SparkConnectSessionManager.getOrCreateIsolatedSession`).
    ///
    /// # Errors
    /// `INVALID_HANDLE.FORMAT` if `session_id` is not a UUID, `SESSION_CLOSED` for a
    /// released session (rx §5.6), `SERVER_DRAINING` for a new session while
    /// [draining](Self::refuse_new), `SESSION_CHANGED` if `observed` is set and differs from
    /// the session's server-side id (rx §5.5).
    pub fn get_or_create_session(
        &self,
        user_id: &str,
        session_id: &str,
        observed: Option<&str>,
    ) -> Result<String, ConnectError> {
        self.rpc(|now, _| {
            let mut reg = self.inner.lock();
            reg.get_or_create_session(user_id, session_id, observed, now)
                .map(|session| owned(session.server_side()))
        })
    }

    /// Stores `error`, about to be sent to a client of the live session
    /// `(user_id, session_id)`, for FetchErrorDetails, and returns the `errorId` to send
    /// with it (connect §8.1): a fresh UUID, or, for the same error delivered again by the
    /// stream of `operation_id` (an execution's error after a reattach), the id it was sent
    /// with before while that one is still stored. `None` (send no `errorId`) when the
    /// session is not live (unknown, closed, an id that is no UUID: Spark sends none without
    /// a session) or [`ManagerConfig::error_details_per_session`] is 0. The session keeps at
    /// most that many, the oldest evicted first; its idle clock is not refreshed.
    pub fn record_error(
        &self,
        user_id: &str,
        session_id: &str,
        operation_id: Option<&str>,
        error: &ConnectError,
    ) -> Option<String> {
        let sid = parse_uuid(session_id)?;
        let operation = operation_id.and_then(parse_uuid);
        let now = self.now();
        let id = self
            .inner
            .lock()
            .record_error(user_id, sid, operation, error, now)?;
        Some(id.hyphenated().to_string())
    }

    /// `FetchErrorDetails` (connect §8.1): gets or creates the session of the request (as
    /// Spark's handler does; its idle clock is refreshed) and removes the error stored under
    /// `error_id`, returning the session's `server_side_session_id` and the error, or `None`
    /// for an id the session does not hold (unknown, no UUID, fetched before, evicted,
    /// expired, or another session's): each stored error is answered once.
    ///
    /// # Errors
    /// As [`get_or_create_session`](Self::get_or_create_session): `INVALID_HANDLE.FORMAT`,
    /// `SESSION_CLOSED`, `SERVER_DRAINING`, `SESSION_CHANGED`.
    pub fn take_error(
        &self,
        request: &crate::wire::connect::FetchErrorDetailsRequest,
    ) -> Result<(String, Option<ConnectError>), ConnectError> {
        self.rpc(|now, _| {
            let (server_side, error) = self.inner.lock().take_error(
                request.user_id(),
                &request.session_id,
                request.client_observed_server_side_session_id.as_deref(),
                &request.error_id,
                now,
            )?;
            Ok((owned(&server_side), error))
        })
    }

    /// How many errors the live session `key` keeps for FetchErrorDetails (connect §8.1);
    /// `None` when it is not live.
    pub fn stored_errors(&self, key: &SessionKey) -> Option<usize> {
        self.inner
            .lock()
            .stored_errors(&key.user_id, key.session_id)
    }

    /// `Interrupt` (rx §5.7, §2.2 T9): interrupts all, tagged, or one execution of the
    /// session. Each interrupted execution delivers `OPERATION_CANCELED` after its earlier
    /// responses and stays registered until ReleaseAll or abandonment. The response lists
    /// the operation ids whose runner changed state (sorted); an interrupt after completion
    /// started is a no-op. Like Spark's, it gets or creates its session (connect §3): an
    /// interrupt in a new session succeeds with empty `interrupted_ids`.
    ///
    /// # Errors
    /// `SESSION_CLOSED` / `SESSION_CHANGED`, `SERVER_DRAINING` (a new session while
    /// [draining](Self::refuse_new)),
    /// `INTERRUPT_TYPE_TAG_REQUIRES_TAG`, `INTERRUPT_TYPE_OPERATION_ID_REQUIRES_ID`,
    /// `INVALID_HANDLE.FORMAT` (a session id that is no UUID),
    /// `UNSUPPORTED_FEATURE.INTERRUPT_TYPE`.
    pub fn interrupt(&self, request: &InterruptRequest) -> Result<InterruptResponse, ConnectError> {
        self.rpc(|now, wakes| {
            let mut reg = self.inner.lock();
            // Spark's Interrupt gets or creates its session (connect §3): an interrupt in a
            // session that does not exist yet succeeds and interrupts nothing.
            let session = reg.get_or_create_session(
                request.user_id(),
                &request.session_id,
                request.client_observed_server_side_session_id.as_deref(),
                now,
            )?;
            let target = match (
                InterruptType::try_from(request.interrupt_type),
                &request.interrupt,
            ) {
                (Ok(InterruptType::All), _) => InterruptTarget::All,
                (Ok(InterruptType::Tag), Some(interrupt_request::Interrupt::OperationTag(tag))) => {
                    InterruptTarget::Tag(tag)
                }
                (Ok(InterruptType::Tag), _) => return Err(ConnectError::InterruptTagRequiresTag),
                (
                    Ok(InterruptType::OperationId),
                    Some(interrupt_request::Interrupt::OperationId(raw)),
                ) => InterruptTarget::Operation(raw),
                (Ok(InterruptType::OperationId), _) => {
                    return Err(ConnectError::InterruptOperationIdRequiresId);
                }
                _ => {
                    return Err(ConnectError::UnsupportedInterruptType {
                        interrupt_type: request.interrupt_type,
                    });
                }
            };
            let targets =
                session.interrupt_targets(target, |e, tag| e.tags.iter().any(|t| t == tag));
            let mut interrupted_ids = Vec::new();
            for exec in targets {
                let mut st = exec.lock();
                if st.core.interrupt() {
                    interrupted_ids.push(owned(&exec.operation_id));
                    st.take_all(wakes);
                }
            }
            interrupted_ids.sort();
            Ok(InterruptResponse {
                session_id: request.session_id.clone(),
                interrupted_ids,
                server_side_session_id: owned(session.server_side()),
            })
        })
    }

    /// `GetStatus` (connect §15; Spark's `SparkConnectGetStatusHandler`): the states of the
    /// session's operations, without creating the session (its idle clock is refreshed).
    /// `operation_status` unset: no states; its `operation_ids` empty: every live operation
    /// (sorted by id) then every inactive one of the last `inactive_operation_expiry`
    /// (sorted by id); else each distinct id asked, in order, as spelled. A live operation is
    /// `RUNNING` until its run ends, then `TERMINATING` (finished or failed, still
    /// registered) or `CANCELLED` (interrupted); a removed one is `SUCCEEDED`, `FAILED` or
    /// `CANCELLED` until its id expires; any other id is `UNKNOWN`. A state never returns
    /// to `RUNNING` (an id reused after its expiry names a new operation).
    ///
    /// # Errors
    /// `INVALID_HANDLE.SESSION_NOT_FOUND` (also for a session id that is no UUID),
    /// `SESSION_CLOSED`, `SESSION_CHANGED` (a non-empty observed id that differs).
    pub fn get_status(
        &self,
        request: &GetStatusRequest,
    ) -> Result<GetStatusResponse, ConnectError> {
        self.rpc(|now, _| {
            let mut reg = self.inner.lock();
            let observed = request
                .client_observed_server_side_session_id
                .as_deref()
                .filter(|o| !o.is_empty());
            let ids = request
                .operation_status
                .as_ref()
                .map(|o| o.operation_ids.as_slice());
            let (server_side, states) =
                reg.operation_states(request.user_id(), &request.session_id, observed, ids, now)?;
            Ok(GetStatusResponse {
                session_id: request.session_id.clone(),
                server_side_session_id: owned(&server_side),
                operation_statuses: states
                    .into_iter()
                    .map(|(id, state)| OperationStatus::new(id, state))
                    .collect(),
                extensions: Vec::new(),
            })
        })
    }

    /// `CloneSession` (connect §14; Spark's `SparkConnectSessionManager.cloneSession`): checks
    /// the source session and the target id and creates the target, a new session of the
    /// same user with its own `server_side_session_id` and no operations, all under one
    /// lock: nothing is created on an error, and a concurrent request cannot take the
    /// target in between. `new_session_id` unset or empty: a generated id. The service
    /// copies the configuration and the engine's state afterwards, and
    /// [`discard_session`](Self::discard_session)s the target if that fails.
    ///
    /// # Errors
    /// For the source: `INVALID_HANDLE.SESSION_NOT_FOUND` (also an id that is no UUID),
    /// `SESSION_CLOSED`, `SESSION_CHANGED` (a non-empty observed id that differs); for the
    /// target: `INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_FORMAT`,
    /// `…_ALREADY_CLOSED`, `…_ALREADY_EXISTS` (SQLSTATE 42K04); `SERVER_DRAINING` while
    /// [draining](Self::refuse_new).
    pub fn clone_session(
        &self,
        request: &CloneSessionRequest,
    ) -> Result<CloneSessionResponse, ConnectError> {
        self.rpc(|now, _| {
            let mut reg = self.inner.lock();
            let observed = request
                .client_observed_server_side_session_id
                .as_deref()
                .filter(|o| !o.is_empty());
            let cloned = reg.clone_session(
                request.user_id(),
                &request.session_id,
                observed,
                request.new_session_id.as_deref(),
                now,
            )?;
            Ok(CloneSessionResponse {
                session_id: request.session_id.clone(),
                server_side_session_id: owned(&cloned.source_server_side),
                new_session_id: owned(&cloned.session_id),
                new_server_side_session_id: owned(&cloned.server_side),
            })
        })
    }

    /// Removes the session `(user_id, session_id)` without a tombstone if its
    /// `server_side_session_id` is still `server_side_session_id`, abandoning its executions
    /// (connect §14: the undoing of a [`clone_session`](Self::clone_session) whose copy
    /// failed; the id may be used again). Returns whether it was removed.
    pub fn discard_session(
        &self,
        user_id: &str,
        session_id: &str,
        server_side_session_id: &str,
    ) -> bool {
        let Some(sid) = parse_uuid(session_id) else {
            return false;
        };
        let key = SessionKey {
            user_id: Arc::from(user_id),
            session_id: sid,
        };
        let mut wakes = Wakes::default();
        let removed = {
            let mut reg = self.inner.lock();
            let closed = reg.discard_session(&key, server_side_session_id);
            for exec in closed.iter().flat_map(|c| &c.abandoned) {
                close(exec, Removal::Abandoned, &mut wakes);
            }
            closed.is_some()
        };
        wakes.wake();
        removed
    }

    /// `ReleaseSession` (rx §5.6): closes the session if it exists — a closed-session
    /// tombstone first (unless `allow_reconnect`), then every execution removed as
    /// abandoned (their consumers get `DISCONNECTED`, producers are stopped). Always
    /// succeeds; a no-op for an unknown session.
    pub fn release_session(&self, request: &ReleaseSessionRequest) -> ReleaseSessionResponse {
        let mut wakes = Wakes::default();
        let user = request.user_id();
        let server_side = parse_uuid(&request.session_id).and_then(|sid| {
            let mut reg = self.inner.lock();
            let closed = reg.close_session(user, sid, !request.allow_reconnect)?;
            for exec in &closed.abandoned {
                close(exec, Removal::Abandoned, &mut wakes);
            }
            Some(owned(&closed.server_side))
        });
        wakes.wake();
        ReleaseSessionResponse {
            session_id: request.session_id.clone(),
            server_side_session_id: server_side.unwrap_or_default(),
        }
    }

    /// Forgets the execution `key` as a restarted server would (fault injection, for tests
    /// of clients' recovery): it is removed and closed like a release (its producer stops,
    /// an attached stream ends), but leaves no trace — no tombstone (rx §5.4) and no entry in
    /// the session's inactive-operation cache (rx §5.2). A later ReattachExecute therefore
    /// gets `OPERATION_NOT_FOUND`, and an ExecutePlan with the same `operation_id` starts it
    /// afresh: the path a Spark client takes when nothing of the execution had reached it
    /// (rx §6.3, `call_iter` step 3). Counted in [`ManagerStats::forgotten`]. Returns
    /// whether the execution was registered.
    pub fn forget_execution(&self, key: &ExecuteKey) -> bool {
        let now = self.now();
        let mut wakes = Wakes::default();
        let forgotten = {
            let mut reg = self.inner.lock();
            let forgotten = reg.remove(key, Leave::Forgotten, now, |_| true);
            if let Some(exec) = &forgotten {
                close(exec, Leave::Forgotten.closes_as(), &mut wakes);
            }
            forgotten.is_some()
        };
        wakes.wake();
        forgotten
    }

    /// Disconnects every attached stream of every execution with
    /// `INVALID_CURSOR.DISCONNECTED` (rx §4.4; Spark's `interruptAllRPCs` test hook, and
    /// what a server does before shutting its transport down). Executions stay registered
    /// and become detached; clients reattach. Returns how many streams were disconnected.
    pub fn disconnect_all_streams(&self) -> usize {
        let now = self.now();
        let mut wakes = Wakes::default();
        let mut n = 0;
        {
            let reg = self.inner.lock();
            for (_, exec) in reg.executions() {
                let mut st = exec.lock();
                if st.core.disconnect(now).is_some() {
                    n += 1;
                    wakes.push(st.take_consumer());
                }
            }
        }
        wakes.wake();
        n
    }

    /// One maintenance pass at the clock's `now` (rx §5.3, §5.6): closes sessions idle for
    /// `session_timeout` (tombstoned, their executions abandoned), then abandons every
    /// execution detached for `detached_timeout` (tombstoned, closed), and forgets expired
    /// inactive operation ids. Attached executions are never abandoned, however old.
    pub fn maintain(&self) -> MaintenanceReport {
        let now = self.now();
        let mut wakes = Wakes::default();
        let report = {
            let mut reg = self.inner.lock();
            // One lock per execution: its detached time, and the bytes it holds for the
            // sampled gauges.
            let (mut unsent, mut retained, mut attached) = (0u64, 0u64, 0usize);
            let done = reg.maintain(now, |exec| {
                let st = exec.lock();
                unsent = unsent.saturating_add(st.core.log().unsent_bytes());
                retained = retained.saturating_add(st.core.log().retained_bytes());
                attached += usize::from(st.core.is_attached());
                st.core.detached_since()
            });
            for exec in done.with_sessions.iter().chain(&done.detached) {
                close(exec, Removal::Abandoned, &mut wakes);
            }
            self.sample_and_publish(&reg, unsent, retained, attached);
            done.report
        };
        wakes.wake();
        report
    }

    /// Samples the manager's gauges and hands its counters to the metrics recorder now (see
    /// [`observe`](crate::observe)), as each [`maintain`](Self::maintain) pass does: call it
    /// on a timer shorter than `maintenance_interval` (rx §5.3) when scrapes must not lag by
    /// that much. It locks the registry and each execution once, as a maintenance pass does.
    pub fn publish_metrics(&self) {
        let reg = self.inner.lock();
        let (mut unsent, mut retained, mut attached) = (0u64, 0u64, 0usize);
        for (_, exec) in reg.executions() {
            let st = exec.lock();
            unsent = unsent.saturating_add(st.core.log().unsent_bytes());
            retained = retained.saturating_add(st.core.log().retained_bytes());
            attached += usize::from(st.core.is_attached());
        }
        self.sample_and_publish(&reg, unsent, retained, attached);
    }

    /// Samples the gauges (the registry's sizes, the held bytes, the budget) and hands the
    /// counters to the recorder.
    fn sample_and_publish(&self, reg: &Reg, unsent: u64, retained: u64, attached: usize) {
        let observer = &self.inner.env.observer;
        let usage = self.inner.admission.usage();
        observer.sample_admission(usage.running, usage.waiting);
        let stats = reg.stats();
        observer.sample_registry(stats.executions, stats.sessions, attached);
        observer.sample_held(unsent, retained);
        if let Some(budget) = &self.inner.budget {
            observer.sample_budget(&budget.usage());
        }
        observer.publish();
    }

    /// Runs [`maintain`](Self::maintain) every `maintenance_interval` on the manager's
    /// clock, forever (spawn it; drop the future to stop). The first pass runs one interval
    /// after the call, as Spark's scheduler does (initial delay one period, rx §5.3).
    pub async fn run_maintenance(self) {
        loop {
            let at = self.now() + self.inner.config.maintenance_interval;
            self.inner.env.clock.sleep_until(at).await;
            let report = self.maintain();
            if report != MaintenanceReport::default() {
                tracing::debug!(?report, "execution maintenance pass");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    // The typed handles (rx §2.3) driven through the manager: these tests live here so
    // that the typed layer never imports the manager.

    use super::*;
    use crate::execution::{AnyExecution, ExecutionOutcome, RunOutcome};
    use crate::time::ManualClock;
    use crate::wire::connect::execute_plan_request::RequestOption;
    use crate::wire::connect::{ExecutePlanRequest, ExecutePlanResponse, Plan, UserContext};

    fn manager() -> ExecutionManager {
        ExecutionManager::new(ManagerConfig::with_timer(Arc::new(ManualClock::new())))
    }

    fn submit(m: &ExecutionManager, reattachable: bool) -> Submitted {
        m.execute_plan(&ExecutePlanRequest {
            session_id: "6f1b7c4e-8a39-4d2c-9e51-0b3a2f7d8c91".into(),
            user_context: Some(UserContext::new("u")),
            plan: Some(Plan::root(Bytes::from_static(b"p"))),
            request_options: vec![RequestOption::reattach(reattachable)],
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn reattachable_lifecycle_through_typestates() {
        let m = manager();
        let Submitted::Reattachable(init) = submit(&m, true) else {
            panic!("reattachable")
        };
        assert_eq!(init.phase(), ExecutionPhase::Init);
        let (streaming, mut producer, mut stream) = init.start();
        producer
            .try_push(ExecutePlanResponse::arrow_batch(
                1,
                Bytes::from_static(b"x"),
            ))
            .unwrap();
        producer.finish().unwrap();
        assert!(matches!(
            stream.try_next(),
            crate::execution::ConsumerEvent::Response(_)
        ));
        let AnyExecution::Finishing(finishing) = streaming.into_any() else {
            panic!("finishing")
        };
        let terminated = finishing.release_all();
        assert_eq!(
            terminated.outcome(),
            ExecutionOutcome {
                run: RunOutcome::Completed,
                removal: Removal::Released
            }
        );
        assert_eq!(m.execution_count(), 0);
    }

    #[test]
    fn release_while_running_is_cancelling_until_producer_stops() {
        let m = manager();
        let Submitted::Reattachable(init) = submit(&m, true) else {
            panic!("reattachable")
        };
        let (streaming, producer, _stream) = init.start();
        let cancelling = streaming.release_all();
        assert_eq!(cancelling.phase(), ExecutionPhase::Cancelling);
        assert!(!cancelling.release_all());
        let cancelling = cancelling.try_terminated().unwrap_err();
        drop(producer);
        let terminated = futures::executor::block_on(cancelling.terminated());
        assert_eq!(terminated.outcome().run, RunOutcome::Cancelled);
    }

    #[test]
    fn interrupt_after_completion_returns_finishing() {
        let m = manager();
        let Submitted::NonReattachable(init) = submit(&m, false) else {
            panic!("non-reattachable")
        };
        let (streaming, producer, stream) = init.start();
        producer.finish().unwrap();
        let finishing = streaming.interrupt().unwrap_err();
        assert_eq!(finishing.phase(), ExecutionPhase::Finishing);
        let finishing = finishing.try_terminated().unwrap_err();
        drop(stream); // a non-reattachable execution is released when its stream ends
        let terminated = finishing.try_terminated().unwrap();
        assert_eq!(terminated.outcome().run, RunOutcome::Completed);
    }

    #[test]
    fn erased_round_trip_and_init_interrupt() {
        let m = manager();
        let Submitted::Reattachable(init) = submit(&m, true) else {
            panic!("reattachable")
        };
        let any = AnyExecution::from(init);
        assert_eq!(any.state_name(), "Init");
        let init = Execution::<state::Init, Reattachable>::try_from(any).unwrap();
        let terminated = init.interrupt();
        assert_eq!(terminated.outcome().run, RunOutcome::Cancelled);
        assert_eq!(m.execution_count(), 0);
    }

    /// Removals reach the registry as events (no pointer back into it): the registry
    /// applies them before it answers anything, so the counts are right at once.
    #[test]
    fn handle_removals_are_applied_before_the_registry_answers() {
        let m = manager();
        let Submitted::Reattachable(init) = submit(&m, true) else {
            panic!("reattachable")
        };
        let (streaming, producer, _stream) = init.start();
        assert_eq!(m.execution_count(), 1);
        let cancelling = streaming.release_all();
        assert_eq!(m.execution_count(), 0);
        let stats = m.stats();
        assert_eq!((stats.created, stats.released), (1, 1));
        // An unstarted handle dropped leaves as well (rx §2.2 T2).
        let again = submit(&m, true);
        assert_eq!(m.execution_count(), 1);
        drop(again);
        assert_eq!(m.execution_count(), 0);
        assert_eq!(m.stats().released, 2);
        drop((cancelling, producer));
    }

    /// Handles outliving their manager still work, and nothing keeps an execution alive
    /// once its handles are gone (the event queue holds executions weakly).
    #[test]
    fn handles_outlive_the_manager_without_keeping_executions_alive() {
        let m = manager();
        let Submitted::Reattachable(init) = submit(&m, true) else {
            panic!("reattachable")
        };
        let (streaming, producer, stream) = init.start();
        let exec = Arc::downgrade(streaming.shared());
        drop(m);
        let cancelling = streaming.release_all();
        assert!(!cancelling.release_all(), "already released");
        drop((cancelling, producer, stream));
        assert!(exec.upgrade().is_none(), "the execution was freed");
    }
}
