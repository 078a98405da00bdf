//! The execution registry and the sessions (reattach rx §5): [`ExecutionManager`].

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::core::{ExecutionCore, ExecutionPhase, Removal, StreamLimits};
use super::error::ConnectError;
use super::keys::{ExecuteKey, SessionKey, parse_uuid, shown};
use super::log::{LogConfig, Stamp};
use super::lru::Lru;
use super::state;
use super::stream::{ExecShared, RegistryEvent, RegistryEvents, ResponseStream, Wakes};
use super::typed::{Execution, NonReattachable, Reattachable};
use crate::time::Timer;
use crate::wire::connect::{
    ExecutePlanRequest, InterruptRequest, InterruptResponse, InterruptType, ReattachExecuteRequest,
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
    /// Most remembered inactive operation ids per session, LRU (tether's bound on the
    /// cache of rx §5.2; 10 000).
    pub inactive_operations_per_session: usize,
}

impl Default for ManagerConfig {
    fn default() -> Self {
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
        }
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

/// What one maintenance pass did ([`ExecutionManager::maintain`]: Spark's
/// `SparkConnectExecutionManager.periodicMaintenance`, rx §5.3, plus session expiry, rx §5.6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Executions abandoned because they were detached for `detached_timeout`.
    pub abandoned: usize,
    /// Sessions closed because they were idle for `session_timeout`.
    pub sessions_expired: usize,
    /// Executions abandoned because their session expired.
    pub abandoned_with_sessions: usize,
}

/// Counters of an [`ExecutionManager`]: the sizes of the registry (rx §5.1) and of the
/// tombstone caches (rx §5.4, §5.6), and lifetime totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ManagerStats {
    /// Live (registered) executions.
    pub executions: usize,
    /// Live sessions.
    pub sessions: usize,
    /// Entries in the abandoned-operation tombstones.
    pub abandoned_tombstones: usize,
    /// Entries in the closed-session tombstones.
    pub closed_session_tombstones: usize,
    /// Executions created so far.
    pub created: u64,
    /// Executions released so far.
    pub released: u64,
    /// Executions abandoned so far.
    pub abandoned: u64,
    /// Executions forgotten so far ([`ExecutionManager::forget_execution`]): fault
    /// injection only. `created = executions + released + abandoned + forgotten`.
    pub forgotten: u64,
}

struct Session {
    user: Arc<str>,
    echo_session_id: Arc<str>,
    server_side: Arc<str>,
    last_access: Instant,
    executions: HashMap<Uuid, Arc<ExecShared>>,
    inactive: Lru<Uuid, Instant>,
}

pub(crate) struct Registry {
    users: HashMap<Arc<str>, HashMap<Uuid, Session>>,
    closed_sessions: Lru<SessionKey, ()>,
    abandoned: Lru<ExecuteKey, ()>,
    live: usize,
    sessions: usize,
    created: u64,
    released: u64,
    abandoned_count: u64,
    forgotten: u64,
}

/// How an execution leaves the registry: the core's [`Removal`], or forgotten as by a
/// restarted server (no trace at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    Removed(Removal),
    Forgotten,
}

pub(crate) struct ManagerInner {
    config: ManagerConfig,
    clock: Arc<dyn Timer>,
    registry: Mutex<Registry>,
    /// What executions report when they leave (applied at every lock of the registry).
    events: Arc<RegistryEvents>,
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

fn canonical(id: Uuid) -> String {
    id.hyphenated().to_string()
}

fn canonical_arc(id: Uuid) -> Arc<str> {
    let mut buf = Uuid::encode_buffer();
    Arc::from(&*id.hyphenated().encode_lower(&mut buf))
}

impl Registry {
    fn session_mut(&mut self, user: &str, sid: Uuid) -> Option<&mut Session> {
        self.users.get_mut(user)?.get_mut(&sid)
    }

    /// Looks a session up without creating it (rx §5.5), checks the client's observed
    /// `server_side_session_id` (`SESSION_CHANGED` on a mismatch) and refreshes the idle
    /// timer. ReattachExecute, ReleaseExecute (which passes no observed id, rx §1.5) and
    /// Interrupt all go through here.
    fn lookup_session(
        &mut self,
        user: &str,
        raw_session_id: &str,
        observed: Option<&str>,
        now: Instant,
    ) -> Result<&mut Session, ConnectError> {
        let not_found = || ConnectError::SessionNotFound {
            handle: shown(raw_session_id).into_owned(),
        };
        let sid = parse_uuid(raw_session_id).ok_or_else(not_found)?;
        if self.session_mut(user, sid).is_none() {
            let key = SessionKey {
                user_id: Arc::from(user),
                session_id: sid,
            };
            return Err(if self.closed_sessions.contains(&key) {
                ConnectError::SessionClosed {
                    handle: shown(raw_session_id).into_owned(),
                }
            } else {
                not_found()
            });
        }
        let session = self.session_mut(user, sid).ok_or_else(not_found)?;
        check_observed(session, observed, raw_session_id)?;
        session.last_access = now;
        Ok(session)
    }

    fn get_or_create_session(
        &mut self,
        config: &ManagerConfig,
        user: &str,
        raw_session_id: &str,
        now: Instant,
    ) -> Result<&mut Session, ConnectError> {
        let Some(sid) = parse_uuid(raw_session_id) else {
            return Err(ConnectError::InvalidHandleFormat {
                handle: shown(raw_session_id).into_owned(),
            });
        };
        let exists = self
            .users
            .get(user)
            .is_some_and(|sessions| sessions.contains_key(&sid));
        if !exists {
            let user_arc: Arc<str> = match self.users.get_key_value(user) {
                Some((k, _)) => k.clone(),
                None => Arc::from(user),
            };
            let key = SessionKey {
                user_id: user_arc.clone(),
                session_id: sid,
            };
            if self.closed_sessions.contains(&key) {
                return Err(ConnectError::SessionClosed {
                    handle: shown(raw_session_id).into_owned(),
                });
            }
            let session = Session {
                user: user_arc.clone(),
                echo_session_id: Arc::from(raw_session_id),
                server_side: Arc::from(canonical(Uuid::new_v4())),
                last_access: now,
                executions: HashMap::new(),
                inactive: Lru::new(config.inactive_operations_per_session),
            };
            self.users.entry(user_arc).or_default().insert(sid, session);
            self.sessions += 1;
        }
        let s = self
            .session_mut(user, sid)
            .ok_or_else(|| ConnectError::SessionNotFound {
                handle: shown(raw_session_id).into_owned(),
            })?;
        s.last_access = now;
        Ok(s)
    }

    /// Removes an execution (rx §5.1 `removeExecuteHolder`) and closes it. With `expect`,
    /// only if the registered execution is that one. Returns whether it was removed.
    fn remove_execution(
        &mut self,
        key: &ExecuteKey,
        expect: Option<&Arc<ExecShared>>,
        removal: Removal,
        now: Instant,
        wakes: &mut Wakes,
    ) -> bool {
        self.leave(key, expect, Leave::Removed(removal), now, wakes)
    }

    fn leave(
        &mut self,
        key: &ExecuteKey,
        expect: Option<&Arc<ExecShared>>,
        how: Leave,
        now: Instant,
        wakes: &mut Wakes,
    ) -> bool {
        let Some(session) = self.session_mut(&key.user_id, key.session_id) else {
            return false;
        };
        match (session.executions.get(&key.operation_id), expect) {
            (Some(found), Some(e)) if !Arc::ptr_eq(found, e) => return false,
            (None, _) => return false,
            _ => {}
        }
        let Some(exec) = session.executions.remove(&key.operation_id) else {
            return false;
        };
        if matches!(how, Leave::Removed(_)) {
            session.inactive.insert(key.operation_id, now);
        }
        self.live -= 1;
        let removal = match how {
            Leave::Removed(removal) => {
                match removal {
                    Removal::Abandoned => {
                        self.abandoned.insert(key.clone(), ());
                        self.abandoned_count += 1;
                    }
                    Removal::Released => self.released += 1,
                }
                removal
            }
            Leave::Forgotten => {
                self.forgotten += 1;
                Removal::Released
            }
        };
        let mut st = exec.lock();
        let _ = st.core.close(removal);
        st.take_all(wakes);
        true
    }

    /// Closes a session (rx §5.6): tombstone first (unless reconnect is allowed), then
    /// every execution removed as abandoned. Returns its server-side id if it existed.
    fn close_session(
        &mut self,
        user: &str,
        sid: Uuid,
        tombstone: bool,
        wakes: &mut Wakes,
    ) -> Option<(Arc<str>, usize)> {
        let sessions = self.users.get_mut(user)?;
        let session = sessions.remove(&sid)?;
        if sessions.is_empty() {
            self.users.remove(user);
        }
        self.sessions -= 1;
        if tombstone {
            self.closed_sessions.insert(
                SessionKey {
                    user_id: session.user.clone(),
                    session_id: sid,
                },
                (),
            );
        }
        let n = session.executions.len();
        // Sorted, so tombstone order (and so LRU eviction) is deterministic.
        let mut executions: Vec<_> = session.executions.into_iter().collect();
        executions.sort_unstable_by_key(|(op, _)| *op);
        for (op, exec) in executions {
            self.live -= 1;
            self.abandoned_count += 1;
            self.abandoned.insert(
                ExecuteKey {
                    user_id: session.user.clone(),
                    session_id: sid,
                    operation_id: op,
                },
                (),
            );
            let mut st = exec.lock();
            let _ = st.core.close(Removal::Abandoned);
            st.take_all(wakes);
        }
        Some((session.server_side, n))
    }
}

/// What an admitted ExecutePlan is (rx §5.2): a duplicate of a live execution with the
/// same plan, reattached from the start, or a new registered execution.
enum Admitted {
    Duplicate(Box<ResponseStream>),
    New {
        exec: Arc<ExecShared>,
        reattachable: bool,
    },
}

fn check_observed(
    session: &Session,
    observed: Option<&str>,
    raw: &str,
) -> Result<(), ConnectError> {
    match observed {
        Some(o) if o != &*session.server_side => Err(ConnectError::SessionChanged {
            handle: shown(raw).into_owned(),
        }),
        _ => Ok(()),
    }
}

fn parse_operation(raw: &str) -> Result<Uuid, ConnectError> {
    parse_uuid(raw).ok_or_else(|| ConnectError::InvalidHandleFormat {
        handle: shown(raw).into_owned(),
    })
}

fn validate_tag(tag: &str) -> Result<(), ConnectError> {
    let reason = if tag.is_empty() {
        "a tag cannot be an empty string"
    } else if tag.contains(',') {
        "a tag cannot contain ','"
    } else {
        return Ok(());
    };
    Err(ConnectError::InvalidTag {
        tag: tag.to_owned(),
        reason,
    })
}

impl ManagerInner {
    /// Locks the registry, first applying what executions reported since the last lock
    /// (their removals, [`RegistryEvent`]): every answer reflects them.
    fn lock(&self) -> MutexGuard<'_, Registry> {
        let mut reg = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let events = self.events.take();
        if !events.is_empty() {
            let now = self.clock.now();
            let mut wakes = Wakes::default();
            for RegistryEvent { exec, removal } in events {
                if let Some(exec) = exec.upgrade() {
                    reg.remove_execution(&exec.key, Some(&exec), removal, now, &mut wakes);
                }
            }
            // The executions closed themselves and took their wake-ups already.
            wakes.wake();
        }
        reg
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Timer> {
        &self.clock
    }
}

impl ExecutionManager {
    /// A manager on tokio's clock ([`TokioTimer`](crate::time::TokioTimer)): monotonic, as
    /// Spark 4.0+ measures its timeouts (rx §5.3).
    #[cfg(feature = "tokio")]
    pub fn new(config: ManagerConfig) -> Self {
        Self::with_clock(config, Arc::new(crate::time::TokioTimer))
    }

    /// A manager on the given clock (e.g. a [`ManualClock`](crate::time::ManualClock)),
    /// which every timeout of rx §5.3 and §5.6 is measured on.
    pub fn with_clock(config: ManagerConfig, clock: Arc<dyn Timer>) -> Self {
        Self {
            inner: Arc::new(ManagerInner {
                registry: Mutex::new(Registry {
                    users: HashMap::new(),
                    closed_sessions: Lru::new(config.closed_session_tombstones),
                    abandoned: Lru::new(config.abandoned_tombstones),
                    live: 0,
                    sessions: 0,
                    created: 0,
                    released: 0,
                    abandoned_count: 0,
                    forgotten: 0,
                }),
                config,
                clock,
                events: Arc::default(),
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

    fn now(&self) -> Instant {
        self.inner.clock.now()
    }

    /// Counters and sizes ([`ManagerStats`]: registry, rx §5.1; tombstones, rx §5.4, §5.6).
    pub fn stats(&self) -> ManagerStats {
        let reg = self.inner.lock();
        ManagerStats {
            executions: reg.live,
            sessions: reg.sessions,
            abandoned_tombstones: reg.abandoned.len(),
            closed_session_tombstones: reg.closed_sessions.len(),
            created: reg.created,
            released: reg.released,
            abandoned: reg.abandoned_count,
            forgotten: reg.forgotten,
        }
    }

    /// Number of live (registered) executions (rx §2.1 dimension 1).
    pub fn execution_count(&self) -> usize {
        self.inner.lock().live
    }

    /// Whether the abandoned-operation tombstones hold `key` (does not refresh it; Spark's
    /// `getAbandonedTombstone`, rx §5.4).
    pub fn is_abandoned(&self, key: &ExecuteKey) -> bool {
        self.inner.lock().abandoned.peek(key).is_some()
    }

    /// Whether the closed-session tombstones hold `key` (does not refresh it; rx §5.6).
    pub fn is_session_closed(&self, key: &SessionKey) -> bool {
        self.inner.lock().closed_sessions.peek(key).is_some()
    }

    /// The `server_side_session_id` of a live session: server-generated, carried by every
    /// response of the session (rx §1.3, connect §3).
    pub fn server_side_session_id(&self, key: &SessionKey) -> Option<String> {
        let mut reg = self.inner.lock();
        reg.session_mut(&key.user_id, key.session_id)
            .map(|s| s.server_side.to_string())
    }

    /// When a live session was last accessed by an RPC (every RPC that resolves the
    /// session counts, rx §5.6).
    pub fn session_last_access(&self, key: &SessionKey) -> Option<Instant> {
        let mut reg = self.inner.lock();
        reg.session_mut(&key.user_id, key.session_id)
            .map(|s| s.last_access)
    }

    /// The keys of every live execution (O(n); for tests and tooling; the registry of
    /// rx §5.1, as Spark's `listActiveExecutions` lists it).
    pub fn execution_keys(&self) -> Vec<ExecuteKey> {
        let reg = self.inner.lock();
        let mut keys = Vec::with_capacity(reg.live);
        for sessions in reg.users.values() {
            for (sid, s) in sessions {
                for op in s.executions.keys() {
                    keys.push(ExecuteKey {
                        user_id: s.user.clone(),
                        session_id: *sid,
                        operation_id: *op,
                    });
                }
            }
        }
        keys
    }

    /// The keys in the abandoned-operation tombstones (O(n); Spark's
    /// `listAbandonedExecutions`, rx §5.4).
    pub fn abandoned_keys(&self) -> Vec<ExecuteKey> {
        self.inner.lock().abandoned.keys().cloned().collect()
    }

    /// A handle on a live execution, in the typestate matching its current phase (rx §2.3;
    /// Spark's `getExecuteHolder`).
    pub fn lookup(&self, key: &ExecuteKey) -> Option<super::typed::Lookup> {
        let exec = {
            let mut reg = self.inner.lock();
            reg.session_mut(&key.user_id, key.session_id)?
                .executions
                .get(&key.operation_id)?
                .clone()
        };
        Some(super::typed::Lookup::from_shared(exec))
    }

    /// The coarse phase of a live execution (rx §2.3).
    pub fn phase(&self, key: &ExecuteKey) -> Option<ExecutionPhase> {
        let exec = {
            let mut reg = self.inner.lock();
            reg.session_mut(&key.user_id, key.session_id)?
                .executions
                .get(&key.operation_id)?
                .clone()
        };
        let p = exec.lock().core.phase();
        Some(p)
    }

    /// `ExecutePlan` (rx §5.5, §2.2 T1): gets or creates the session, validates the
    /// operation id and tags, applies the duplicate-id rules of Spark 4.3.0 (rx §5.2) and
    /// registers a new execution, or reattaches from the start for a duplicate with the
    /// same plan.
    ///
    /// # Errors
    /// `INVALID_HANDLE.FORMAT` (session or operation id not a UUID), `SESSION_CLOSED`,
    /// `SESSION_CHANGED`, `OPERATION_ALREADY_EXISTS` (live, different plan),
    /// `OPERATION_ABANDONED` (tombstoned, or released/completed and still remembered),
    /// `NOT_REATTACHABLE` / orphan (same plan, but not reattachable), an invalid tag, or
    /// `EXECUTION_LIMIT_EXCEEDED`. On any error nothing is registered.
    pub fn execute_plan(&self, request: &ExecutePlanRequest) -> Result<Submitted, ConnectError> {
        let now = self.now();
        let mut wakes = Wakes::default();
        let result = {
            let mut guard = self.inner.lock();
            let reg = &mut *guard;
            self.execute_plan_locked(reg, request, now, &mut wakes)
        };
        wakes.wake();
        Ok(match result? {
            Admitted::Duplicate(stream) => Submitted::Reattached(stream),
            Admitted::New {
                exec,
                reattachable: true,
            } => Submitted::Reattachable(Execution::new_submitted(exec)),
            Admitted::New {
                exec,
                reattachable: false,
            } => Submitted::NonReattachable(Execution::new_submitted(exec)),
        })
    }

    fn execute_plan_locked(
        &self,
        reg: &mut Registry,
        request: &ExecutePlanRequest,
        now: Instant,
        wakes: &mut Wakes,
    ) -> Result<Admitted, ConnectError> {
        let config = &self.inner.config;
        let user = request.user_id();
        let raw_sid = request.session_id.as_str();
        let session = reg.get_or_create_session(config, user, raw_sid, now)?;
        check_observed(
            session,
            request.client_observed_server_side_session_id.as_deref(),
            raw_sid,
        )?;
        let op = match &request.operation_id {
            Some(raw) => parse_operation(raw)?,
            None => Uuid::new_v4(),
        };
        let sid = parse_uuid(raw_sid).ok_or_else(|| ConnectError::InvalidHandleFormat {
            handle: shown(raw_sid).into_owned(),
        })?;
        let key = ExecuteKey {
            user_id: session.user.clone(),
            session_id: sid,
            operation_id: op,
        };
        if let Some(existing) = session.executions.get(&op).cloned() {
            if existing.plan != request.plan {
                return Err(ConnectError::OperationAlreadyExists {
                    handle: canonical(op),
                });
            }
            return existing
                .attach(None, now, wakes)
                .map(|stream| Admitted::Duplicate(Box::new(stream)));
        }
        if reg.abandoned.contains(&key) {
            return Err(ConnectError::OperationAbandoned {
                handle: canonical(op),
            });
        }
        let session = reg
            .session_mut(user, sid)
            .ok_or_else(|| ConnectError::SessionNotFound {
                handle: shown(raw_sid).into_owned(),
            })?;
        if let Some(at) = session.inactive.get(&op).copied() {
            if at + config.inactive_operation_expiry > now {
                return Err(ConnectError::OperationAbandoned {
                    handle: canonical(op),
                });
            }
            session.inactive.remove(&op);
        }
        for tag in &request.tags {
            validate_tag(tag)?;
        }
        if session.executions.len() >= config.max_executions_per_session {
            return Err(ConnectError::ExecutionLimitExceeded {
                session: shown(raw_sid).into_owned(),
                limit: config.max_executions_per_session,
            });
        }
        let reattachable = config.reattachable_enabled && request.is_reattachable();
        let stamp = Stamp {
            session_id: session.echo_session_id.clone(),
            server_side_session_id: session.server_side.clone(),
            operation_id: canonical_arc(op),
        };
        let core = ExecutionCore::new(reattachable, config.log, config.stream, stamp);
        let exec = Arc::new(ExecShared::new(
            key,
            core,
            request.tags.clone().into_boxed_slice(),
            request.plan.clone(),
            self.inner.clock.clone(),
            self.inner.events.clone(),
        ));
        session.executions.insert(op, exec.clone());
        reg.live += 1;
        reg.created += 1;
        Ok(Admitted::New { exec, reattachable })
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
        let now = self.now();
        let mut wakes = Wakes::default();
        let r = {
            let mut guard = self.inner.lock();
            let reg = &mut *guard;
            (|| {
                let raw_sid = request.session_id.as_str();
                let session = reg.lookup_session(
                    request.user_id(),
                    raw_sid,
                    request.client_observed_server_side_session_id.as_deref(),
                    now,
                )?;
                // Like Spark, an id that is no UUID names no execution (connect §2).
                let Some(op) = parse_uuid(&request.operation_id) else {
                    return Err(ConnectError::OperationNotFound {
                        handle: shown(&request.operation_id).into_owned(),
                    });
                };
                let found = session.executions.get(&op).cloned();
                let key = ExecuteKey {
                    user_id: session.user.clone(),
                    session_id: parse_uuid(raw_sid).unwrap_or_default(),
                    operation_id: op,
                };
                let Some(exec) = found else {
                    return Err(if reg.abandoned.contains(&key) {
                        ConnectError::OperationAbandoned {
                            handle: canonical(op),
                        }
                    } else {
                        ConnectError::OperationNotFound {
                            handle: canonical(op),
                        }
                    });
                };
                exec.attach(request.last_response_id.as_deref(), now, &mut wakes)
            })()
        };
        wakes.wake();
        r
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
        let now = self.now();
        let mut wakes = Wakes::default();
        let r = {
            let mut guard = self.inner.lock();
            let reg = &mut *guard;
            (|| {
                let raw_sid = request.session_id.as_str();
                // Like Spark, ReleaseExecute does not validate the observed server-side
                // session id (rx §1.5), so a release always reaches the execution.
                let session = reg.lookup_session(request.user_id(), raw_sid, None, now)?;
                let mut response = ReleaseExecuteResponse {
                    session_id: request.session_id.clone(),
                    server_side_session_id: session.server_side.to_string(),
                    operation_id: None,
                };
                // An id that is no UUID names no execution, as an unknown one (Spark).
                let Some((op, exec)) = parse_uuid(&request.operation_id)
                    .and_then(|op| Some((op, session.executions.get(&op).cloned()?)))
                else {
                    return Ok(response);
                };
                if !exec.reattachable {
                    return Err(ConnectError::NotReattachable);
                }
                match &request.release {
                    None => return Err(ConnectError::UnknownReleaseType),
                    Some(release_execute_request::Release::ReleaseAll(_)) => {
                        reg.remove_execution(
                            &exec.key,
                            Some(&exec),
                            Removal::Released,
                            now,
                            &mut wakes,
                        );
                    }
                    Some(release_execute_request::Release::ReleaseUntil(until)) => {
                        let mut st = exec.lock();
                        st.core.release_until(&until.response_id)?;
                        wakes.push(st.take_producer());
                    }
                }
                response.operation_id = Some(canonical(op));
                Ok(response)
            })()
        };
        wakes.wake();
        r
    }

    /// Gets or creates the session of `(user_id, session_id)` and returns its one
    /// `server_side_session_id`, refreshing its idle timer: what every non-execution RPC of
    /// a Spark Connect service (`Config`, `AnalyzePlan`, …) does before it answers, so that
    /// every response carries the same server-side id from the first call on (connect §3;
    /// Spark's `SparkConnectSessionManager.getOrCreateIsolatedSession`).
    ///
    /// # Errors
    /// `INVALID_HANDLE.FORMAT` if `session_id` is not a UUID, `SESSION_CLOSED` for a
    /// released session (rx §5.6), `SESSION_CHANGED` if `observed` is set and differs from
    /// the session's server-side id (rx §5.5).
    pub fn get_or_create_session(
        &self,
        user_id: &str,
        session_id: &str,
        observed: Option<&str>,
    ) -> Result<String, ConnectError> {
        let now = self.now();
        let mut reg = self.inner.lock();
        let session = reg.get_or_create_session(&self.inner.config, user_id, session_id, now)?;
        check_observed(session, observed, session_id)?;
        Ok(session.server_side.to_string())
    }

    /// `Interrupt` (rx §5.7, §2.2 T9): interrupts all, tagged, or one execution of the
    /// session. Each interrupted execution delivers `OPERATION_CANCELED` after its earlier
    /// responses and stays registered until ReleaseAll or abandonment. The response lists
    /// the operation ids whose runner changed state (sorted); an interrupt after completion
    /// started is a no-op. Like Spark's, it gets or creates its session (connect §3): an
    /// interrupt in a new session succeeds with empty `interrupted_ids`.
    ///
    /// # Errors
    /// `SESSION_CLOSED` / `SESSION_CHANGED`,
    /// `INTERRUPT_TYPE_TAG_REQUIRES_TAG`, `INTERRUPT_TYPE_OPERATION_ID_REQUIRES_ID`,
    /// `INVALID_HANDLE.FORMAT` (a session id that is no UUID),
    /// `UNSUPPORTED_FEATURE.INTERRUPT_TYPE`.
    pub fn interrupt(&self, request: &InterruptRequest) -> Result<InterruptResponse, ConnectError> {
        let now = self.now();
        let mut wakes = Wakes::default();
        let r = {
            let mut guard = self.inner.lock();
            let reg = &mut *guard;
            (|| {
                let raw_sid = request.session_id.as_str();
                // Spark's Interrupt gets or creates its session (connect §3): an interrupt in
                // a session that does not exist yet succeeds and interrupts nothing.
                let session =
                    reg.get_or_create_session(&self.inner.config, request.user_id(), raw_sid, now)?;
                check_observed(
                    session,
                    request.client_observed_server_side_session_id.as_deref(),
                    raw_sid,
                )?;
                let targets: Vec<Arc<ExecShared>> =
                    match InterruptType::try_from(request.interrupt_type) {
                        Ok(InterruptType::All) => session.executions.values().cloned().collect(),
                        Ok(InterruptType::Tag) => {
                            let Some(interrupt_request::Interrupt::OperationTag(tag)) =
                                &request.interrupt
                            else {
                                return Err(ConnectError::InterruptTagRequiresTag);
                            };
                            session
                                .executions
                                .values()
                                .filter(|e| e.tags.iter().any(|t| t == tag))
                                .cloned()
                                .collect()
                        }
                        Ok(InterruptType::OperationId) => {
                            let Some(interrupt_request::Interrupt::OperationId(raw)) =
                                &request.interrupt
                            else {
                                return Err(ConnectError::InterruptOperationIdRequiresId);
                            };
                            // An id that is no UUID interrupts nothing (Spark).
                            parse_uuid(raw)
                                .and_then(|op| session.executions.get(&op).cloned())
                                .into_iter()
                                .collect()
                        }
                        _ => {
                            return Err(ConnectError::UnsupportedInterruptType {
                                interrupt_type: request.interrupt_type,
                            });
                        }
                    };
                let mut interrupted_ids = Vec::new();
                for exec in targets {
                    let mut st = exec.lock();
                    if st.core.interrupt() {
                        interrupted_ids.push(exec.operation_id.to_string());
                        st.take_all(&mut wakes);
                    }
                }
                interrupted_ids.sort();
                Ok(InterruptResponse {
                    session_id: request.session_id.clone(),
                    interrupted_ids,
                    server_side_session_id: session.server_side.to_string(),
                })
            })()
        };
        wakes.wake();
        r
    }

    /// `ReleaseSession` (rx §5.6): closes the session if it exists — a closed-session
    /// tombstone first (unless `allow_reconnect`), then every execution removed as
    /// abandoned (their consumers get `DISCONNECTED`, producers are stopped). Always
    /// succeeds; a no-op for an unknown session.
    pub fn release_session(&self, request: &ReleaseSessionRequest) -> ReleaseSessionResponse {
        let mut wakes = Wakes::default();
        let user = request
            .user_context
            .as_ref()
            .map(|u| u.user_id.as_str())
            .unwrap_or("");
        let server_side = parse_uuid(&request.session_id).and_then(|sid| {
            self.inner
                .lock()
                .close_session(user, sid, !request.allow_reconnect, &mut wakes)
        });
        wakes.wake();
        ReleaseSessionResponse {
            session_id: request.session_id.clone(),
            server_side_session_id: server_side.map(|(s, _)| s.to_string()).unwrap_or_default(),
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
        let forgotten = self
            .inner
            .lock()
            .leave(key, None, Leave::Forgotten, now, &mut wakes);
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
            for sessions in reg.users.values() {
                for s in sessions.values() {
                    for exec in s.executions.values() {
                        let mut st = exec.lock();
                        if st.core.disconnect(now).is_some() {
                            n += 1;
                            wakes.push(st.take_consumer());
                        }
                    }
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
        let config = &self.inner.config;
        let mut report = MaintenanceReport::default();
        let mut wakes = Wakes::default();
        {
            let mut guard = self.inner.lock();
            let reg = &mut *guard;
            if let Some(timeout) = config.session_timeout {
                let mut expired: Vec<(Arc<str>, Uuid)> = reg
                    .users
                    .iter()
                    .flat_map(|(u, sessions)| {
                        sessions
                            .iter()
                            .filter(|(_, s)| s.last_access + timeout <= now)
                            .map(|(sid, _)| (u.clone(), *sid))
                    })
                    .collect();
                expired.sort_unstable();
                for (user, sid) in expired {
                    if let Some((_, n)) = reg.close_session(&user, sid, true, &mut wakes) {
                        report.sessions_expired += 1;
                        report.abandoned_with_sessions += n;
                    }
                }
            }
            let mut due = Vec::new();
            for sessions in reg.users.values_mut() {
                for s in sessions.values_mut() {
                    for exec in s.executions.values() {
                        let since = exec.lock().core.detached_since();
                        if since.is_some_and(|t| t + config.detached_timeout <= now) {
                            due.push(exec.clone());
                        }
                    }
                    let expiry = config.inactive_operation_expiry;
                    s.inactive.retain(|_, at| *at + expiry > now);
                }
            }
            // Sorted, so tombstone order (and so LRU eviction) is deterministic.
            due.sort_unstable_by(|a: &Arc<ExecShared>, b| a.key.cmp(&b.key));
            for exec in due {
                if reg.remove_execution(&exec.key, Some(&exec), Removal::Abandoned, now, &mut wakes)
                {
                    report.abandoned += 1;
                }
            }
        }
        wakes.wake();
        report
    }

    /// Runs [`maintain`](Self::maintain) every `maintenance_interval` on the manager's
    /// clock, forever (spawn it; drop the future to stop). The first pass runs one interval
    /// after the call, as Spark's scheduler does (initial delay one period, rx §5.3).
    pub async fn run_maintenance(self) {
        loop {
            let at = self.now() + self.inner.config.maintenance_interval;
            self.inner.clock.sleep_until(at).await;
            let report = self.maintain();
            if report != MaintenanceReport::default() {
                tracing::debug!(?report, "execution maintenance pass");
            }
        }
    }
}
