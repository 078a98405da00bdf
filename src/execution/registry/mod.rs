//! The rules of the execution registry and its sessions (reattach rx §5) as a pure state
//! machine: [`Registry<E>`](Registry).
//!
//! Pure: it reads no clock (every call that depends on time takes `now`), takes no lock,
//! wakes nothing and never touches an execution. It stores one value `E` per registered
//! execution (the manager stores `Arc<ExecShared>`; the tests store plain numbers) and
//! hands back the values it removes: the caller closes them (rx §2.2 T12) and wakes
//! their tasks. Where a rule needs to know something about an execution (its plan, its
//! tags, since when it is detached) the call takes a closure that answers it.
//!
//! When to call what (the manager holds the registry under its lock):
//!
//! - ExecutePlan → [`admit`](Registry::admit) (rx §5.5, §5.2, §5.1): either a new
//!   execution, which `admit` registers with the value the caller builds, or a live
//!   duplicate with the same plan, which the caller reattaches from the start.
//! - ReattachExecute → [`find`](Registry::find) (rx §5.5 steps 1–2), then the execution's
//!   own reattach order (`ExecutionCore::reattach`).
//! - ReleaseExecute → [`release`](Registry::release): the session without the observed
//!   server-side id, the execution, and its removal for ReleaseAll, one lookup each.
//! - Interrupt, and every other RPC naming a session →
//!   [`get_or_create_session`](Registry::get_or_create_session), then
//!   [`Session::interrupt_targets`].
//! - ReleaseSession → [`close_session`](Registry::close_session) (rx §5.6).
//! - An execution that left by itself (its event: ReleaseAll through a handle, a dropped
//!   unstarted handle, the end of a non-reattachable stream, an orphan) →
//!   [`remove`](Registry::remove), before the registry answers anything else.
//! - Every `maintenanceInterval` → [`maintain`](Registry::maintain) (rx §5.3, §5.6):
//!   session expiry, detached-execution abandonment, inactive-id expiry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hashbrown::hash_map::{Entry, EntryRef};
use uuid::Uuid;

use super::error::{ConnectError, SparkError};
use super::error_store::ErrorStore;
use super::inactive::InactiveIds;
use super::keys::{ExecuteKey, FastMap, SessionKey, SessionRef, fast_map, parse_uuid, shown};
use super::lru::Lru;
use super::status::Removal;
use crate::wire::connect::get_status_response::OperationState;

/// What the registry reads of an execution for GetStatus (connect §15.2): its state while
/// registered, and the final state it is remembered with among the session's inactive ids
/// once removed (read as it leaves, before or after it is closed).
pub(crate) trait Remembered {
    /// The state while registered ([`ExecutionCore::operation_state`](super::ExecutionCore::operation_state)).
    fn state(&self) -> OperationState;
    /// The state once removed ([`ExecutionCore::final_state`](super::ExecutionCore::final_state)).
    fn final_state(&self) -> OperationState;
}

/// The states [`Registry::operation_states`] reports: each operation id with its state
/// (connect §15.2).
pub(crate) type OperationStates = Vec<(String, OperationState)>;

/// A session [`Registry::clone_session`] created (connect §14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cloned {
    /// The source's `server_side_session_id`.
    pub(crate) source_server_side: Arc<str>,
    /// The new session's id as given, or generated.
    pub(crate) session_id: Arc<str>,
    /// The new session's key.
    pub(crate) key: SessionKey,
    /// The new session's `server_side_session_id`.
    pub(crate) server_side: Arc<str>,
}

/// What one maintenance pass did ([`ExecutionManager::maintain`](super::ExecutionManager::maintain):
/// Spark's `SparkConnectExecutionManager.periodicMaintenance`, rx §5.3, plus session
/// expiry, rx §5.6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Executions abandoned because they were detached for `detached_timeout`.
    pub abandoned: usize,
    /// Sessions closed because they were idle for `session_timeout`.
    pub sessions_expired: usize,
    /// Executions abandoned because their session expired.
    pub abandoned_with_sessions: usize,
}

/// Counters of an [`ExecutionManager`](super::ExecutionManager): the sizes of the registry
/// (rx §5.1) and of the tombstone caches (rx §5.4, §5.6), and lifetime totals.
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
    /// Executions forgotten so far
    /// ([`ExecutionManager::forget_execution`](super::ExecutionManager::forget_execution)):
    /// fault injection only. `created = executions + released + abandoned + forgotten`.
    pub forgotten: u64,
}

/// The registry's bounds and timeouts: the rx §5 part of `ManagerConfig` (same meanings,
/// same defaults there).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegistryConfig {
    /// Detached executions are abandoned after this long (rx §5.3).
    pub(crate) detached_timeout: Duration,
    /// Idle sessions are closed after this long; `None` = never (rx §5.6).
    pub(crate) session_timeout: Option<Duration>,
    /// Capacity of the abandoned-operation tombstones, LRU (rx §5.4).
    pub(crate) abandoned_tombstones: usize,
    /// Capacity of the closed-session tombstones, LRU (rx §5.6).
    pub(crate) closed_session_tombstones: usize,
    /// Most live executions per session (tether's bound; `EXECUTION_LIMIT_EXCEEDED`).
    pub(crate) max_executions_per_session: usize,
    /// How long a released, completed or abandoned id is refused on re-submit (rx §5.2,
    /// SPARK-53492).
    pub(crate) inactive_operation_expiry: Duration,
    /// Most remembered inactive ids per session, the earliest forgotten first (tether's
    /// bound on rx §5.2's cache).
    pub(crate) inactive_operations_per_session: usize,
    /// Most errors stored per session for FetchErrorDetails, the oldest evicted first
    /// (connect §8.1); 0 = none.
    pub(crate) error_details_per_session: usize,
    /// How long a stored error can be fetched (connect §8.1).
    pub(crate) error_details_expiry: Duration,
}

/// One session (rx §5.6): its identities, idle clock, live executions and the ids of its
/// inactive operations (rx §5.2).
pub(crate) struct Session<E> {
    user: Arc<str>,
    echo_session_id: Arc<str>,
    server_side: Arc<str>,
    last_access: Instant,
    executions: FastMap<Uuid, E>,
    /// Inactive ids (rx §5.2): the UUID and when it became inactive, nothing else.
    inactive: InactiveIds,
    /// The errors sent with an `errorId`, for FetchErrorDetails (connect §8.1).
    errors: ErrorStore,
}

/// Which executions an Interrupt names (rx §5.7), once the manager has read the request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InterruptTarget<'a> {
    /// `INTERRUPT_TYPE_ALL`: every execution of the session.
    All,
    /// `INTERRUPT_TYPE_TAG`: the executions whose tags contain this one.
    Tag(&'a str),
    /// `INTERRUPT_TYPE_OPERATION_ID`: that execution; an id that is no UUID names none.
    Operation(&'a str),
}

impl<E> Session<E> {
    /// The `server_side_session_id`, generated at creation (rx §1.3, connect §3).
    pub(crate) fn server_side(&self) -> &Arc<str> {
        &self.server_side
    }

    /// When an RPC last resolved the session (rx §5.6 idle expiry).
    pub(crate) fn last_access(&self) -> Instant {
        self.last_access
    }

    /// The executions an Interrupt of `target` reaches (rx §5.7), cloned, in no particular
    /// order. `has_tag(e, tag)` tells whether execution `e` carries `tag`.
    pub(crate) fn interrupt_targets(
        &self,
        target: InterruptTarget<'_>,
        has_tag: impl Fn(&E, &str) -> bool,
    ) -> Vec<E>
    where
        E: Clone,
    {
        match target {
            InterruptTarget::All => self.executions.values().cloned().collect(),
            InterruptTarget::Tag(tag) => self
                .executions
                .values()
                .filter(|e| has_tag(e, tag))
                .cloned()
                .collect(),
            InterruptTarget::Operation(raw) => parse_uuid(raw)
                .and_then(|op| self.executions.get(&op).cloned())
                .into_iter()
                .collect(),
        }
    }

    /// `SESSION_CHANGED` if the client observed another server-side id (rx §5.5).
    fn check_observed(&self, observed: Option<&str>, raw: &str) -> Result<(), ConnectError> {
        match observed {
            Some(o) if o != &*self.server_side => Err(ConnectError::SessionChanged {
                handle: shown(raw).into_owned(),
            }),
            _ => Ok(()),
        }
    }
}

/// An ExecutePlan as the registry sees it (rx §1.2): the raw ids, as on the wire, and the
/// tags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admit<'a> {
    /// `UserContext.user_id`.
    pub(crate) user: &'a str,
    /// `session_id`, unparsed.
    pub(crate) session_id: &'a str,
    /// `client_observed_server_side_session_id`.
    pub(crate) observed: Option<&'a str>,
    /// `operation_id`, unparsed; `None` = the server generates one (rx §1.9).
    pub(crate) operation_id: Option<&'a str>,
    /// `tags` (validated, rx §1.2).
    pub(crate) tags: &'a [String],
}

/// What [`Registry::admit`] gives the caller to build a new execution's value with.
#[derive(Debug)]
pub(crate) struct NewExecution<'a> {
    /// Its key (rx §5.1).
    pub(crate) key: ExecuteKey,
    /// The session id as the client spelled it (echoed on every response, rx §1.3).
    pub(crate) session_id: &'a Arc<str>,
    /// The session's `server_side_session_id` (rx §1.3).
    pub(crate) server_side: &'a Arc<str>,
}

/// What an admitted ExecutePlan is (rx §5.2).
#[derive(Debug)]
pub(crate) enum Admitted<E> {
    /// A live execution with the same id and plan: reattach to it from the start
    /// (SPARK-52397). Nothing was registered.
    Duplicate(E),
    /// A new execution, registered.
    New(E),
}

/// How an execution leaves the registry: a removal of rx §2.1 dimension 1, or forgotten
/// as by a restarted server (no tombstone, no inactive id: fault injection, rx §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leave {
    /// Released (no tombstone, inactive id) or abandoned (tombstoned, inactive id).
    Removed(Removal),
    /// No trace at all.
    Forgotten,
}

impl Leave {
    /// The removal to close the execution with (a forgotten one closes as released).
    pub(crate) fn closes_as(self) -> Removal {
        match self {
            Self::Removed(r) => r,
            Self::Forgotten => Removal::Released,
        }
    }
}

/// A session [`Registry::close_session`] closed (rx §5.6).
#[derive(Debug)]
pub(crate) struct ClosedSession<E> {
    /// Its `server_side_session_id`.
    pub(crate) server_side: Arc<str>,
    /// Its executions, removed as abandoned (tombstoned), by operation id: close them.
    pub(crate) abandoned: Vec<E>,
}

/// What [`Registry::maintain`] removed (rx §5.3, §5.6); close every value as abandoned.
#[derive(Debug)]
pub(crate) struct Maintenance<E> {
    /// The counts.
    pub(crate) report: MaintenanceReport,
    /// Executions of the sessions that expired (attached or not), by session then id.
    pub(crate) with_sessions: Vec<E>,
    /// Executions detached for `detached_timeout`, by key.
    pub(crate) detached: Vec<E>,
}

/// The registry of sessions and executions (Spark's `SparkConnectExecutionManager` and
/// `SparkConnectSessionManager`, rx §5), pure (see the module docs).
///
/// Executions live inside their session (`(user_id, session_id)` → session →
/// `operation_id` → `E`), so registration and removal are one map operation each and
/// cannot leave an execution unreachable (rx §5.1 caution). Sessions are one flat map
/// keyed by `(user_id, session_id)` and looked up by a borrowed key
/// ([`SessionRef`]): resolving a request's session is one lookup, with no allocation.
pub(crate) struct Registry<E> {
    config: RegistryConfig,
    sessions: FastMap<SessionKey, Session<E>>,
    closed_sessions: Lru<SessionKey, ()>,
    abandoned: Lru<ExecuteKey, ()>,
    live: usize,
    created: u64,
    released: u64,
    abandoned_count: u64,
    forgotten: u64,
    /// What the manager reports to its observer after this lock (sessions created and
    /// closed, tombstone hits), oldest first.
    notes: Vec<RegistryNote>,
    /// Draining ([`set_draining`](Self::set_draining)): no session is created and no
    /// execution registered; what exists is served as before.
    draining: bool,
}

/// What a [`Registry`] step tells the manager's observer (rx §5.4, §5.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RegistryNote {
    /// A session was created.
    SessionStarted(SessionKey),
    /// A session was closed (released or expired); its executions were removed first.
    SessionClosed(SessionKey),
    /// A request named an abandoned operation's tombstone (`OPERATION_ABANDONED`).
    TombstoneHit(ExecuteKey),
}

/// `INVALID_TAG` unless `tag` is a valid user tag: not empty, no `,` (rx §1.2; Spark's
/// `ProtoUtils.throwIfInvalidTag`).
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

fn canonical(id: Uuid) -> String {
    id.hyphenated().to_string()
}

impl<E> Registry<E> {
    /// An empty registry.
    pub(crate) fn new(config: RegistryConfig) -> Self {
        Self {
            sessions: fast_map(),
            closed_sessions: Lru::new(config.closed_session_tombstones),
            abandoned: Lru::new(config.abandoned_tombstones),
            config,
            live: 0,
            created: 0,
            released: 0,
            abandoned_count: 0,
            forgotten: 0,
            notes: Vec::new(),
            draining: false,
        }
    }

    /// Whether notes wait to be taken.
    pub(crate) fn has_notes(&self) -> bool {
        !self.notes.is_empty()
    }

    /// The notes since the last call, oldest first.
    pub(crate) fn take_notes(&mut self) -> Vec<RegistryNote> {
        std::mem::take(&mut self.notes)
    }

    /// Counters and sizes (rx §5.1, §5.4, §5.6).
    pub(crate) fn stats(&self) -> ManagerStats {
        ManagerStats {
            executions: self.live,
            sessions: self.sessions.len(),
            abandoned_tombstones: self.abandoned.len(),
            closed_session_tombstones: self.closed_sessions.len(),
            created: self.created,
            released: self.released,
            abandoned: self.abandoned_count,
            forgotten: self.forgotten,
        }
    }

    /// Number of live executions (rx §5.1).
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// A live session, without refreshing it (rx §5.6).
    pub(crate) fn session(&self, key: &SessionKey) -> Option<&Session<E>> {
        self.sessions.get(key)
    }

    /// A live execution (Spark's `getExecuteHolder`, rx §5.1).
    pub(crate) fn get(&self, key: &ExecuteKey) -> Option<&E> {
        self.session(&key.session())?
            .executions
            .get(&key.operation_id)
    }

    /// Every live execution with its key (O(n), in no particular order; rx §5.1).
    pub(crate) fn executions(&self) -> impl Iterator<Item = (ExecuteKey, &E)> {
        self.sessions.iter().flat_map(|(sk, s)| {
            s.executions.iter().map(move |(op, e)| {
                let key = ExecuteKey {
                    user_id: sk.user_id.clone(),
                    session_id: sk.session_id,
                    operation_id: *op,
                };
                (key, e)
            })
        })
    }

    /// The latest last access of any live session (O(n); rx §5.6), `None` without one.
    pub(crate) fn last_session_access(&self) -> Option<Instant> {
        self.sessions.values().map(Session::last_access).max()
    }

    /// The keys in the abandoned-operation tombstones (rx §5.4).
    pub(crate) fn abandoned_keys(&self) -> impl Iterator<Item = &ExecuteKey> {
        self.abandoned.keys()
    }

    /// Whether `key` is tombstoned as abandoned, without refreshing it (rx §5.4).
    pub(crate) fn is_abandoned(&self, key: &ExecuteKey) -> bool {
        self.abandoned.peek(key).is_some()
    }

    /// Whether `key` is tombstoned as closed, without refreshing it (rx §5.6).
    pub(crate) fn is_session_closed(&self, key: &SessionKey) -> bool {
        self.closed_sessions.peek(key).is_some()
    }

    /// Stores `error` in the live session `(user, sid)` for FetchErrorDetails and returns
    /// its id (connect §8.1); `None` when the session is not live (Spark sends no `errorId`
    /// without a session) or the store holds nothing (`error_details_per_session` 0). Does
    /// not refresh the session's idle clock.
    pub(crate) fn record_error(
        &mut self,
        user: &str,
        sid: Uuid,
        operation: Option<Uuid>,
        error: &ConnectError,
        now: Instant,
    ) -> Option<Uuid> {
        let (capacity, expiry) = (
            self.config.error_details_per_session,
            self.config.error_details_expiry,
        );
        self.session_mut(user, sid)?
            .errors
            .record(error, operation, now, capacity, expiry)
    }

    /// FetchErrorDetails (connect §8.1): gets or creates the session as
    /// [`get_or_create_session`](Self::get_or_create_session) does, then removes and
    /// returns the error stored under `error_id`, if any.
    ///
    /// # Errors
    /// As [`get_or_create_session`](Self::get_or_create_session).
    pub(crate) fn take_error(
        &mut self,
        user: &str,
        raw_session_id: &str,
        observed: Option<&str>,
        error_id: &str,
        now: Instant,
    ) -> Result<(Arc<str>, Option<ConnectError>), ConnectError> {
        let expiry = self.config.error_details_expiry;
        let session = self.get_or_create_session(user, raw_session_id, observed, now)?;
        let error = session.errors.take(error_id, now, expiry);
        Ok((session.server_side.clone(), error))
    }

    /// How many errors the live session `(user, sid)` stores (connect §8.1).
    pub(crate) fn stored_errors(&self, user: &str, sid: Uuid) -> Option<usize> {
        self.sessions
            .get(&SessionRef {
                user_id: user,
                session_id: sid,
            })
            .map(|s| s.errors.len())
    }

    fn session_mut(&mut self, user: &str, sid: Uuid) -> Option<&mut Session<E>> {
        self.sessions.get_mut(&SessionRef {
            user_id: user,
            session_id: sid,
        })
    }

    /// Looks a session up without creating it (rx §5.5 ReattachExecute / ReleaseExecute
    /// step 1), checks the client's observed `server_side_session_id` and refreshes the
    /// idle clock to `now` (SPARK-46660). ReleaseExecute passes no `observed` (rx §1.5).
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND` (also for a session id that is no UUID), `SESSION_CLOSED` if
    /// tombstoned, `SESSION_CHANGED` (the idle clock is then not refreshed).
    ///
    /// The RPCs use it through [`find`](Self::find) and [`release`](Self::release); the
    /// registry's own tests call it directly.
    #[cfg(test)]
    pub(crate) fn lookup_session(
        &mut self,
        user: &str,
        raw_session_id: &str,
        observed: Option<&str>,
        now: Instant,
    ) -> Result<&mut Session<E>, ConnectError> {
        self.lookup(user, raw_session_id, observed, now)
            .map(|(_, session)| session)
    }

    /// [`lookup_session`](Self::lookup_session), also returning the parsed session id.
    fn lookup(
        &mut self,
        user: &str,
        raw_session_id: &str,
        observed: Option<&str>,
        now: Instant,
    ) -> Result<(Uuid, &mut Session<E>), ConnectError> {
        Self::find_session(
            &mut self.sessions,
            &mut self.closed_sessions,
            user,
            raw_session_id,
            observed,
            now,
        )
    }

    /// [`lookup`](Self::lookup) on the fields, so that the caller may use the other fields
    /// with the session.
    fn find_session<'a>(
        sessions: &'a mut FastMap<SessionKey, Session<E>>,
        closed_sessions: &mut Lru<SessionKey, ()>,
        user: &str,
        raw_session_id: &str,
        observed: Option<&str>,
        now: Instant,
    ) -> Result<(Uuid, &'a mut Session<E>), ConnectError> {
        let not_found = || ConnectError::SessionNotFound {
            handle: shown(raw_session_id).into_owned(),
        };
        let sid = parse_uuid(raw_session_id).ok_or_else(not_found)?;
        let key = SessionRef {
            user_id: user,
            session_id: sid,
        };
        let Some(session) = sessions.get_mut(&key) else {
            return Err(if closed_sessions.contains(&key) {
                ConnectError::SessionClosed {
                    handle: shown(raw_session_id).into_owned(),
                }
            } else {
                not_found()
            });
        };
        session.check_observed(observed, raw_session_id)?;
        session.last_access = now;
        Ok((sid, session))
    }

    /// Starts draining (tether's graceful shutdown): from now on no session is created and
    /// no execution is registered (`SERVER_DRAINING`); live sessions and executions are
    /// served as before. Irreversible.
    pub(crate) fn set_draining(&mut self) {
        self.draining = true;
    }

    /// Whether [`set_draining`](Self::set_draining) was called.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining
    }

    /// Gets or creates the session (Spark's `getOrCreateIsolatedSession`, rx §5.5
    /// ExecutePlan, §5.7 Interrupt), refreshes its idle clock to `now`, then checks the
    /// observed `server_side_session_id`.
    ///
    /// # Errors
    /// `INVALID_HANDLE.FORMAT` (a session id that is no UUID), `SESSION_CLOSED` if
    /// tombstoned, `SERVER_DRAINING` (a new session while draining), `SESSION_CHANGED`
    /// (the session exists and is refreshed all the same).
    pub(crate) fn get_or_create_session(
        &mut self,
        user: &str,
        raw_session_id: &str,
        observed: Option<&str>,
        now: Instant,
    ) -> Result<&mut Session<E>, ConnectError> {
        let (_, session) = Self::session_entry(
            &mut self.sessions,
            &mut self.closed_sessions,
            &mut self.notes,
            &self.config,
            self.draining,
            user,
            raw_session_id,
            now,
        )?;
        session.check_observed(observed, raw_session_id)?;
        Ok(session)
    }

    /// [`get_or_create_session`](Self::get_or_create_session) without the observed check,
    /// on the fields, so that the caller may use the other fields with the session; also
    /// returns the parsed session id. One lookup for a live session.
    // The registry's fields one by one, so that the caller keeps the others borrowed.
    #[allow(clippy::too_many_arguments)]
    fn session_entry<'a>(
        sessions: &'a mut FastMap<SessionKey, Session<E>>,
        closed_sessions: &mut Lru<SessionKey, ()>,
        notes: &mut Vec<RegistryNote>,
        config: &RegistryConfig,
        draining: bool,
        user: &str,
        raw_session_id: &str,
        now: Instant,
    ) -> Result<(Uuid, &'a mut Session<E>), ConnectError> {
        let Some(sid) = parse_uuid(raw_session_id) else {
            return Err(ConnectError::InvalidHandleFormat {
                handle: shown(raw_session_id).into_owned(),
            });
        };
        let key = SessionRef {
            user_id: user,
            session_id: sid,
        };
        let session = match sessions.entry_ref(&key) {
            EntryRef::Occupied(o) => o.into_mut(),
            EntryRef::Vacant(v) => {
                if closed_sessions.contains(&key) {
                    return Err(ConnectError::SessionClosed {
                        handle: shown(raw_session_id).into_owned(),
                    });
                }
                if draining {
                    return Err(ConnectError::ServerDraining);
                }
                let key = key.to_key();
                notes.push(RegistryNote::SessionStarted(key.clone()));
                let session = Session {
                    user: key.user_id.clone(),
                    echo_session_id: Arc::from(raw_session_id),
                    server_side: Arc::from(canonical(Uuid::new_v4())),
                    last_access: now,
                    executions: fast_map(),
                    inactive: InactiveIds::new(config.inactive_operations_per_session),
                    errors: ErrorStore::default(),
                };
                v.insert_with_key(key, session)
            }
        };
        session.last_access = now;
        Ok((sid, session))
    }

    /// ExecutePlan (rx §5.5): gets or creates the session, then Spark 4.3.0's rules in
    /// order — the operation id (generated when absent, rx §1.9); a live execution with
    /// that id (same plan per `same_plan`: [`Admitted::Duplicate`], SPARK-52397; else
    /// `OPERATION_ALREADY_EXISTS`, rx §5.2); the abandoned tombstones (rx §5.4); the
    /// session's inactive ids, refused for `inactive_operation_expiry` after the removal
    /// (rx §5.2, SPARK-53492); the tags (rx §1.2); the per-session cap. Then registers the
    /// value `make` builds ([`Admitted::New`]), all or nothing (rx §5.1).
    ///
    /// # Errors
    /// As [`get_or_create_session`](Self::get_or_create_session), then
    /// `INVALID_HANDLE.FORMAT` (an operation id that is no UUID),
    /// `OPERATION_ALREADY_EXISTS`, `OPERATION_ABANDONED`, an invalid tag, `SERVER_DRAINING`
    /// (a new execution while draining; a duplicate still reattaches),
    /// `EXECUTION_LIMIT_EXCEEDED`. Nothing is registered then (the session may have been
    /// created).
    pub(crate) fn admit(
        &mut self,
        request: Admit<'_>,
        now: Instant,
        same_plan: impl FnOnce(&E) -> bool,
        make: impl FnOnce(NewExecution<'_>) -> E,
    ) -> Result<Admitted<E>, ConnectError>
    where
        E: Clone,
    {
        let config = &self.config;
        let raw_sid = request.session_id;
        let (sid, session) = Self::session_entry(
            &mut self.sessions,
            &mut self.closed_sessions,
            &mut self.notes,
            config,
            self.draining,
            request.user,
            raw_sid,
            now,
        )?;
        session.check_observed(request.observed, raw_sid)?;
        let op = match request.operation_id {
            Some(raw) => parse_uuid(raw).ok_or_else(|| ConnectError::InvalidHandleFormat {
                handle: shown(raw).into_owned(),
            })?,
            None => Uuid::new_v4(),
        };
        // Asked first, reported in Spark's order below: a re-submitted id's record is
        // usually out of cache, and the checks in between then run while it loads. A live
        // id has no record, so asking before the duplicate check changes nothing; an
        // expired record it forgets is forgotten either way.
        let inactive = session
            .inactive
            .refuses(op, now, config.inactive_operation_expiry);
        // Read before the entry holds the map; reported last, in Spark's order.
        let full = session.executions.len() >= config.max_executions_per_session;
        // One lookup: the entry answers the duplicate check and takes the new execution.
        let slot = match session.executions.entry(op) {
            Entry::Occupied(existing) => {
                return if same_plan(existing.get()) {
                    Ok(Admitted::Duplicate(existing.get().clone()))
                } else {
                    Err(ConnectError::OperationAlreadyExists {
                        handle: canonical(op),
                    })
                };
            }
            Entry::Vacant(slot) => slot,
        };
        let key = ExecuteKey {
            user_id: session.user.clone(),
            session_id: sid,
            operation_id: op,
        };
        if self.abandoned.contains(&key) {
            self.notes.push(RegistryNote::TombstoneHit(key));
            return Err(ConnectError::OperationAbandoned {
                handle: canonical(op),
            });
        }
        if inactive {
            return Err(ConnectError::OperationAbandoned {
                handle: canonical(op),
            });
        }
        for tag in request.tags {
            validate_tag(tag)?;
        }
        if self.draining {
            return Err(ConnectError::ServerDraining);
        }
        if full {
            return Err(ConnectError::ExecutionLimitExceeded {
                session: shown(raw_sid).into_owned(),
                limit: config.max_executions_per_session,
            });
        }
        let exec = make(NewExecution {
            key,
            session_id: &session.echo_session_id,
            server_side: &session.server_side,
        });
        slot.insert(exec.clone());
        self.live += 1;
        self.created += 1;
        Ok(Admitted::New(exec))
    }

    /// GetStatus (connect §15; Spark's `SparkConnectGetStatusHandler`): looks the session up
    /// without creating it (as [`lookup_session`](Self::lookup_session): refreshed, the
    /// observed id checked), then reports, for `ids`:
    ///
    /// - `None` (no `operation_status` asked): nothing;
    /// - an empty list: every operation the session knows, the live ones (sorted by id)
    ///   then the inactive ones of the last `inactive_operation_expiry` (sorted by id), each
    ///   under its canonical id;
    /// - else each distinct id once, in the order asked, as spelled: an inactive id's final
    ///   state (it prevails, as in Spark), else a live one's [`Remembered::state`], else
    ///   `Unknown` (also for an id that is no UUID).
    ///
    /// Returns the session's `server_side_session_id` and the states.
    ///
    /// # Errors
    /// As [`lookup_session`](Self::lookup_session): `SESSION_NOT_FOUND` (also for a session
    /// id that is no UUID), `SESSION_CLOSED`, `SESSION_CHANGED`.
    pub(crate) fn operation_states(
        &mut self,
        user: &str,
        raw_session_id: &str,
        observed: Option<&str>,
        ids: Option<&[String]>,
        now: Instant,
    ) -> Result<(Arc<str>, OperationStates), ConnectError>
    where
        E: Remembered,
    {
        let expiry = self.config.inactive_operation_expiry;
        let (_, session) = self.lookup(user, raw_session_id, observed, now)?;
        let server_side = session.server_side.clone();
        let Some(ids) = ids else {
            return Ok((server_side, Vec::new()));
        };
        let states = if ids.is_empty() {
            let mut live: Vec<(Uuid, OperationState)> = session
                .executions
                .iter()
                .map(|(op, e)| (*op, e.state()))
                .collect();
            live.sort_unstable_by_key(|(op, _)| *op);
            let mut inactive: Vec<(Uuid, OperationState)> = session
                .inactive
                .states(now, expiry)
                .filter(|(op, _)| !session.executions.contains_key(op))
                .collect();
            inactive.sort_unstable_by_key(|(op, _)| *op);
            live.into_iter()
                .chain(inactive)
                .map(|(op, state)| (canonical(op), state))
                .collect()
        } else {
            let mut seen = std::collections::HashSet::with_capacity(ids.len());
            ids.iter()
                .filter(|raw| seen.insert(raw.as_str()))
                .map(|raw| {
                    let state = parse_uuid(raw)
                        .and_then(|op| {
                            session
                                .inactive
                                .state(op, now, expiry)
                                .or_else(|| session.executions.get(&op).map(Remembered::state))
                        })
                        .unwrap_or(OperationState::Unknown);
                    (raw.clone(), state)
                })
                .collect()
        };
        Ok((server_side, states))
    }

    /// CloneSession (connect §14; Spark's `SparkConnectSessionManager.cloneSession`): in one
    /// step, so that neither a concurrent clone nor a session created meanwhile can
    /// interleave, checks the source `(user, raw_source)` as
    /// [`lookup_session`](Self::lookup_session) does (refreshing it), then the target id
    /// (`raw_target`, or a generated one when `None` or empty) in Spark's order, then
    /// creates the target as a new session of the same user with a new
    /// `server_side_session_id`, no executions and no inactive ids. Nothing is created on
    /// an error.
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND` (also for a source id that is no UUID), `SESSION_CLOSED`,
    /// `SESSION_CHANGED` for the source; then
    /// `INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_FORMAT`,
    /// `…TARGET_SESSION_ID_ALREADY_CLOSED` (the target is in the closed-session tombstones),
    /// `…TARGET_SESSION_ID_ALREADY_EXISTS` (also the source itself); `SERVER_DRAINING`
    /// while draining.
    pub(crate) fn clone_session(
        &mut self,
        user: &str,
        raw_source: &str,
        observed: Option<&str>,
        raw_target: Option<&str>,
        now: Instant,
    ) -> Result<Cloned, ConnectError> {
        let (_, source) = self.lookup(user, raw_source, observed, now)?;
        let source_server_side = source.server_side.clone();
        let source_user = source.user.clone();
        let target: Arc<str> = match raw_target {
            Some(t) if !t.is_empty() => Arc::from(t),
            _ => Arc::from(canonical(Uuid::new_v4())),
        };
        let Some(tid) = parse_uuid(&target) else {
            return Err(SparkError::clone_target_format(&target).into());
        };
        let key = SessionRef {
            user_id: user,
            session_id: tid,
        };
        if self.closed_sessions.contains(&key) {
            return Err(SparkError::clone_target_closed(&target).into());
        }
        let EntryRef::Vacant(slot) = self.sessions.entry_ref(&key) else {
            return Err(SparkError::clone_target_exists(&target).into());
        };
        if self.draining {
            return Err(ConnectError::ServerDraining);
        }
        let key = SessionKey {
            user_id: source_user.clone(),
            session_id: tid,
        };
        let server_side: Arc<str> = Arc::from(canonical(Uuid::new_v4()));
        self.notes.push(RegistryNote::SessionStarted(key.clone()));
        slot.insert_with_key(
            key.clone(),
            Session {
                user: source_user,
                echo_session_id: target.clone(),
                server_side: server_side.clone(),
                last_access: now,
                executions: fast_map(),
                inactive: InactiveIds::new(self.config.inactive_operations_per_session),
                errors: ErrorStore::default(),
            },
        );
        Ok(Cloned {
            source_server_side,
            session_id: target,
            key,
            server_side,
        })
    }

    /// Removes the session `key` without a tombstone if its `server_side_session_id` is
    /// `server_side` (the undoing of a [`clone_session`](Self::clone_session) whose engine
    /// refused the copy, connect §14): as [`close_session`](Self::close_session) with
    /// `tombstone` false. `None` if there is no such session (or another one by now).
    pub(crate) fn discard_session(
        &mut self,
        key: &SessionKey,
        server_side: &str,
    ) -> Option<ClosedSession<E>> {
        if self.sessions.get(key)?.server_side.as_ref() != server_side {
            return None;
        }
        self.close_session(&key.user_id, key.session_id, false)
    }

    /// ReattachExecute steps 1–2 (rx §5.5): the session (as
    /// [`lookup_session`](Self::lookup_session)), then the execution.
    ///
    /// # Errors
    /// As [`lookup_session`](Self::lookup_session), then `OPERATION_ABANDONED` if the id is
    /// tombstoned (rx §5.4), else `OPERATION_NOT_FOUND` (released, forgotten, never
    /// existed, or no UUID).
    pub(crate) fn find(
        &mut self,
        user: &str,
        raw_session_id: &str,
        observed: Option<&str>,
        raw_operation_id: &str,
        now: Instant,
    ) -> Result<E, ConnectError>
    where
        E: Clone,
    {
        let (sid, session) = self.lookup(user, raw_session_id, observed, now)?;
        // Like Spark, an id that is no UUID names no execution (connect §2).
        let Some(op) = parse_uuid(raw_operation_id) else {
            return Err(ConnectError::OperationNotFound {
                handle: shown(raw_operation_id).into_owned(),
            });
        };
        if let Some(exec) = session.executions.get(&op) {
            return Ok(exec.clone());
        }
        let key = ExecuteKey {
            user_id: session.user.clone(),
            session_id: sid,
            operation_id: op,
        };
        Err(if self.abandoned.contains(&key) {
            self.notes.push(RegistryNote::TombstoneHit(key));
            ConnectError::OperationAbandoned {
                handle: canonical(op),
            }
        } else {
            ConnectError::OperationNotFound {
                handle: canonical(op),
            }
        })
    }

    /// ReleaseExecute (rx §5.5) with one session lookup and one execution lookup: resolves
    /// the session as [`lookup_session`](Self::lookup_session) does without an observed
    /// id (ReleaseExecute does not check it, rx §1.5), then asks `decide` with the
    /// session's `server_side_session_id` and the live execution `raw_operation_id` names
    /// (`None` for an unknown id or one that is no UUID: Spark answers those as released).
    /// When `decide` answers `true` the execution is removed as released (ReleaseAll: its
    /// id is remembered as inactive, no tombstone, rx §5.2) and returned with `decide`'s
    /// value, for the caller to close (rx §2.2 T12).
    ///
    /// # Errors
    /// As [`lookup_session`](Self::lookup_session), or `decide`'s error (nothing removed).
    pub(crate) fn release<R>(
        &mut self,
        user: &str,
        raw_session_id: &str,
        raw_operation_id: &str,
        now: Instant,
        decide: impl FnOnce(&Arc<str>, Option<&E>) -> Result<(R, bool), ConnectError>,
    ) -> Result<(R, Option<E>), ConnectError>
    where
        E: Remembered,
    {
        let (_, session) = Self::find_session(
            &mut self.sessions,
            &mut self.closed_sessions,
            user,
            raw_session_id,
            None,
            now,
        )?;
        let entry = match parse_uuid(raw_operation_id).map(|op| session.executions.entry(op)) {
            Some(Entry::Occupied(o)) => Some(o),
            _ => None,
        };
        let (answer, remove) = decide(&session.server_side, entry.as_ref().map(|o| o.get()))?;
        let removed = match entry {
            Some(o) if remove => {
                let (op, exec) = o.remove_entry();
                session.inactive.insert(op, now, exec.final_state());
                self.live -= 1;
                self.released += 1;
                Some(exec)
            }
            _ => None,
        };
        Ok((answer, removed))
    }

    /// Removes the execution `key` if `is(value)` (Spark's `removeExecuteHolder`, rx §5.1):
    /// an abandoned one is tombstoned (rx §5.4), a released or abandoned one's id becomes
    /// inactive at `now` (rx §5.2), a forgotten one leaves no trace. Returns the value to
    /// close (with [`Leave::closes_as`]), or `None` if `key` is not registered or `is`
    /// refused it (an event about an execution already replaced).
    pub(crate) fn remove(
        &mut self,
        key: &ExecuteKey,
        how: Leave,
        now: Instant,
        is: impl FnOnce(&E) -> bool,
    ) -> Option<E>
    where
        E: Remembered,
    {
        let session = self.session_mut(&key.user_id, key.session_id)?;
        let exec = match session.executions.entry(key.operation_id) {
            Entry::Occupied(o) if is(o.get()) => o.remove(),
            _ => return None,
        };
        // An abandoned execution is remembered as cancelled, whatever its run did (Spark
        // records the termination reason `Canceled` for an abandoned removal, rx §5.8).
        match how {
            Leave::Removed(Removal::Abandoned) => {
                session
                    .inactive
                    .insert(key.operation_id, now, OperationState::Cancelled);
            }
            Leave::Removed(Removal::Released) => {
                session
                    .inactive
                    .insert(key.operation_id, now, exec.final_state());
            }
            Leave::Forgotten => {}
        }
        self.live -= 1;
        match how {
            Leave::Removed(Removal::Abandoned) => {
                self.abandoned.insert(key.clone(), ());
                self.abandoned_count += 1;
            }
            Leave::Removed(Removal::Released) => self.released += 1,
            Leave::Forgotten => self.forgotten += 1,
        }
        Some(exec)
    }

    /// Closes a session (rx §5.6 ReleaseSession, idle expiry): a closed-session tombstone
    /// first unless `tombstone` is false (`allow_reconnect`, SPARK-50710), then every
    /// execution removed as abandoned (tombstoned, T13). `None` if there is no such session.
    pub(crate) fn close_session(
        &mut self,
        user: &str,
        sid: Uuid,
        tombstone: bool,
    ) -> Option<ClosedSession<E>> {
        let (key, session) = self.sessions.remove_entry(&SessionRef {
            user_id: user,
            session_id: sid,
        })?;
        self.notes.push(RegistryNote::SessionClosed(key.clone()));
        if tombstone {
            self.closed_sessions.insert(key, ());
        }
        // Sorted, so tombstone order (and so LRU eviction) is deterministic.
        let mut executions: Vec<_> = session.executions.into_iter().collect();
        executions.sort_unstable_by_key(|(op, _)| *op);
        let mut abandoned = Vec::with_capacity(executions.len());
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
            abandoned.push(exec);
        }
        Some(ClosedSession {
            server_side: session.server_side,
            abandoned,
        })
    }

    /// One maintenance pass at `now` (rx §5.3, §5.6), in this order: closes every session
    /// idle for `session_timeout` (`last_access + timeout <= now`) as
    /// [`close_session`](Self::close_session) with a tombstone; abandons every execution
    /// with `detached_since(e) + detached_timeout <= now` (tombstoned); forgets inactive
    /// ids older than `inactive_operation_expiry`. `detached_since` answers `None` for an
    /// attached execution, which is never abandoned for being old (rx §5.3).
    pub(crate) fn maintain(
        &mut self,
        now: Instant,
        detached_since: impl FnMut(&E) -> Option<Instant>,
    ) -> Maintenance<E>
    where
        E: Remembered,
    {
        let mut out = Maintenance {
            report: MaintenanceReport::default(),
            with_sessions: Vec::new(),
            detached: Vec::new(),
        };
        if let Some(timeout) = self.config.session_timeout {
            let mut expired: Vec<SessionKey> = self
                .sessions
                .iter()
                .filter(|(_, s)| crate::time::deadline_after(s.last_access, timeout) <= now)
                .map(|(key, _)| key.clone())
                .collect();
            expired.sort_unstable();
            for key in expired {
                if let Some(closed) = self.close_session(&key.user_id, key.session_id, true) {
                    out.report.sessions_expired += 1;
                    out.report.abandoned_with_sessions += closed.abandoned.len();
                    out.with_sessions.extend(closed.abandoned);
                }
            }
        }
        let (detached_timeout, expiry) = (
            self.config.detached_timeout,
            self.config.inactive_operation_expiry,
        );
        for s in self.sessions.values_mut() {
            s.inactive.forget_expired(now, expiry);
        }
        out.detached = self.abandon_detached(now, detached_timeout, detached_since);
        out.report.abandoned = out.detached.len();
        out
    }

    /// Abandons every execution detached for at least `timeout` at `now` (rx §5.3;
    /// tombstoned, removed), in key order so that tombstone order, and so LRU eviction, is
    /// deterministic. Returns them, to be closed outside the registry's lock.
    pub(crate) fn abandon_detached(
        &mut self,
        now: Instant,
        timeout: Duration,
        mut detached_since: impl FnMut(&E) -> Option<Instant>,
    ) -> Vec<E>
    where
        E: Remembered,
    {
        let mut due = Vec::new();
        for (key, s) in &self.sessions {
            for (op, exec) in &s.executions {
                if detached_since(exec)
                    .is_some_and(|t| crate::time::deadline_after(t, timeout) <= now)
                {
                    due.push(ExecuteKey {
                        user_id: key.user_id.clone(),
                        session_id: key.session_id,
                        operation_id: *op,
                    });
                }
            }
        }
        due.sort_unstable();
        due.into_iter()
            .filter_map(|key| self.remove(&key, Leave::Removed(Removal::Abandoned), now, |_| true))
            .collect()
    }
}

#[cfg(test)]
mod tests;
