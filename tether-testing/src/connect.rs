//! Spark Connect request builders and execution-manager fixtures, written once for every
//! suite (rx §1): `ExecutePlan` with or without the reattachable option,
//! `ReattachExecute`, `ReleaseExecute` (until / all), `Interrupt` and `ReleaseSession`, each
//! for a [`Caller`] (a user and a session); a manager on a [`ManualClock`]; and the helpers
//! that read its response streams.
//!
//! ```
//! use tether::execution::{ConsumerEvent, ManagerConfig};
//! use tether_testing::connect::{self, Caller, ManualManager};
//!
//! let fx = ManualManager::new(ManagerConfig::default());
//! let op = connect::op_id();
//! let (mut producer, mut stream) = connect::start(&fx.manager, &connect::execute(&op));
//! producer.try_push(connect::batch(1)).unwrap();
//! let first = connect::next(&mut stream);
//! assert_eq!(connect::rows(&first), Some(1));
//!
//! // Another user cannot reattach to alice's operation (rx §5.5).
//! let mallory = Caller::other_user();
//! let refused = fx.manager.reattach_execute(&mallory.reattach(&op, None)).unwrap_err();
//! assert_eq!(connect::condition(&refused), "INVALID_HANDLE.SESSION_NOT_FOUND");
//! ```

use std::sync::Arc;

use bytes::Bytes;
use uuid::Uuid;

use tether::execution::client::ClientConfig;
use tether::execution::{
    ConnectError, ConsumerEvent, ExecuteKey, ExecutionManager, ManagerConfig, Producer,
    ResponseStream, SessionKey,
};
use tether::time::ManualClock;
use tether::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, InterruptRequest, InterruptType, Plan,
    ReattachExecuteRequest, ReleaseExecuteRequest, ReleaseSessionRequest, UserContext,
    execute_plan_request::RequestOption, execute_plan_response, interrupt_request,
};

/// The session id of the default [`Caller`] (rx §1.9: a client-chosen UUID).
pub const SESSION_ID: &str = "8c1f1ad6-0b5a-4c3a-9f39-5d0c1b0e7a11";
/// A second session id, for isolation between sessions of one user (rx §1.9).
pub const OTHER_SESSION_ID: &str = "5e0c6b7e-2d57-4cc5-8d8e-9b1ad2a8d0f3";
/// The user of the default [`Caller`] (rx §1.9 `UserContext.user_id`).
pub const USER: &str = "alice";
/// Another user, for isolation between users (rx §5.1: executions are keyed by user and
/// session).
pub const OTHER_USER: &str = "mallory";
/// The relation bytes of every fixture plan (rx §1.2 `ExecutePlanRequest.plan`).
pub const RELATION: &[u8] = b"relation";

/// A client configuration whose retry jitter is seeded (7), so a client test's backoff is
/// the same on every run (rx §6.3).
pub fn client_config() -> ClientConfig {
    ClientConfig {
        jitter_seed: Some(7),
        ..ClientConfig::default()
    }
}

/// A fresh operation id: a random lower-case UUID (rx §1.9).
pub fn op_id() -> String {
    Uuid::new_v4().to_string()
}

/// Who sends a request: a user and a session id (rx §1.9). Every builder fills in its
/// `session_id` and `user_context`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `UserContext.user_id` (rx §1.9).
    pub user: String,
    /// `session_id` (rx §1.9).
    pub session: String,
}

impl Default for Caller {
    /// [`USER`] in [`SESSION_ID`] (rx §1.9).
    fn default() -> Self {
        Self::new(USER, SESSION_ID)
    }
}

impl Caller {
    /// `user` in `session` (rx §1.9).
    pub fn new(user: &str, session: &str) -> Self {
        Self {
            user: user.to_owned(),
            session: session.to_owned(),
        }
    }

    /// [`OTHER_USER`] in [`SESSION_ID`]: the same session id under another user (rx §5.1).
    pub fn other_user() -> Self {
        Self::new(OTHER_USER, SESSION_ID)
    }

    /// The caller's `UserContext` (rx §1.9).
    pub fn user_context(&self) -> Option<UserContext> {
        Some(UserContext::new(self.user.as_str()))
    }

    /// An `ExecutePlan` of `plan` with no operation id and no request option: what a client
    /// sends before it chooses (rx §1.2; the client adds the reattachable option, rx §6.3).
    /// The `ExecutePlan` a client test starts a
    /// [`ReattachingStream`](tether::execution::client::ReattachingStream) with: this caller's
    /// session and user, `client_type` set, no plan (the tests' fake servers never read it;
    /// rx §6.1).
    pub fn client_request(&self, client_type: &str) -> ExecutePlanRequest {
        ExecutePlanRequest {
            session_id: self.session.clone(),
            user_context: self.user_context(),
            client_type: Some(client_type.into()),
            ..ExecutePlanRequest::default()
        }
    }

    /// A plain `ExecutePlan` of `plan` (rx §1.2).
    pub fn plan(&self, plan: impl Into<Bytes>) -> ExecutePlanRequest {
        ExecutePlanRequest {
            session_id: self.session.clone(),
            user_context: self.user_context(),
            plan: Some(Plan::root(plan)),
            ..ExecutePlanRequest::default()
        }
    }

    /// A reattachable `ExecutePlan` of [`RELATION`] with operation id `op` (rx §1.2).
    pub fn execute(&self, op: &str) -> ExecutePlanRequest {
        self.execute_with(op, true)
    }

    /// An `ExecutePlan` of [`RELATION`] with operation id `op`, its reattachable option set
    /// to `reattachable` (rx §1.2, connect §1.17).
    pub fn execute_with(&self, op: &str, reattachable: bool) -> ExecutePlanRequest {
        ExecutePlanRequest {
            request_options: vec![RequestOption::reattach(reattachable)],
            operation_id: Some(op.to_owned()),
            ..self.plan(RELATION)
        }
    }

    /// A `ReattachExecute` of `op` after `last` (`last_response_id`; `None` from the start;
    /// rx §1.4, §3.5).
    pub fn reattach(&self, op: &str, last: Option<&str>) -> ReattachExecuteRequest {
        ReattachExecuteRequest::new(&*self.session, &*self.user, op, last.map(str::to_owned))
    }

    /// A `ReleaseExecute(ReleaseAll)` of `op` (rx §1.5).
    pub fn release_all(&self, op: &str) -> ReleaseExecuteRequest {
        ReleaseExecuteRequest::release_all(&*self.session, &*self.user, op)
    }

    /// A `ReleaseExecute(ReleaseUntil(response_id))` of `op` (rx §1.5, §3.4).
    pub fn release_until(&self, op: &str, response_id: &str) -> ReleaseExecuteRequest {
        ReleaseExecuteRequest::release_until(&*self.session, &*self.user, op, response_id)
    }

    /// An `Interrupt` of type `ty` with target `which` (rx §5.7).
    pub fn interrupt(
        &self,
        ty: InterruptType,
        which: Option<interrupt_request::Interrupt>,
    ) -> InterruptRequest {
        InterruptRequest {
            session_id: self.session.clone(),
            user_context: self.user_context(),
            interrupt_type: ty as i32,
            interrupt: which,
            ..InterruptRequest::default()
        }
    }

    /// An `Interrupt` of the operation `op` (`INTERRUPT_TYPE_OPERATION_ID`; rx §5.7).
    pub fn interrupt_op(&self, op: &str) -> InterruptRequest {
        InterruptRequest::operation(&*self.session, &*self.user, op)
    }

    /// A `ReleaseSession` of the caller's session (rx §5.6).
    pub fn release_session(&self, allow_reconnect: bool) -> ReleaseSessionRequest {
        ReleaseSessionRequest::new(&*self.session, &*self.user, allow_reconnect)
    }

    /// The manager's key of the caller's operation `op` (rx §5.1).
    ///
    /// # Panics
    ///
    /// When the session id or `op` is not a UUID.
    pub fn key(&self, op: &str) -> ExecuteKey {
        ExecuteKey {
            user_id: Arc::from(self.user.as_str()),
            session_id: Uuid::parse_str(&self.session).expect("a UUID session id"),
            operation_id: Uuid::parse_str(op).expect("a UUID operation id"),
        }
    }

    /// The manager's key of the caller's session (rx §5.1).
    ///
    /// # Panics
    ///
    /// When the session id is not a UUID.
    pub fn session_key(&self) -> SessionKey {
        SessionKey {
            user_id: Arc::from(self.user.as_str()),
            session_id: Uuid::parse_str(&self.session).expect("a UUID session id"),
        }
    }
}

/// [`Caller::execute`] for the default caller (rx §1.2).
pub fn execute(op: &str) -> ExecutePlanRequest {
    Caller::default().execute(op)
}

/// [`Caller::reattach`] for the default caller (rx §1.4).
pub fn reattach(op: &str, last: Option<&str>) -> ReattachExecuteRequest {
    Caller::default().reattach(op, last)
}

/// [`Caller::release_all`] for the default caller (rx §1.5).
pub fn release_all(op: &str) -> ReleaseExecuteRequest {
    Caller::default().release_all(op)
}

/// [`Caller::release_until`] for the default caller (rx §1.5).
pub fn release_until(op: &str, response_id: &str) -> ReleaseExecuteRequest {
    Caller::default().release_until(op, response_id)
}

/// [`Caller::interrupt_op`] for the default caller (rx §5.7).
pub fn interrupt_op(op: &str) -> InterruptRequest {
    Caller::default().interrupt_op(op)
}

/// [`Caller::key`] for the default caller (rx §5.1).
pub fn key(op: &str) -> ExecuteKey {
    Caller::default().key(op)
}

// ---------------------------------------------------------------------------------------------
// Responses and streams
// ---------------------------------------------------------------------------------------------

/// Arrow batch `i`: row count `i`, 32 bytes of `i as u8` (connect §1.20 `ArrowBatch`).
pub fn batch(i: i64) -> ExecutePlanResponse {
    batch_of_len(i, 32)
}

/// Arrow batch `i` with `len` bytes of `i as u8` (connect §1.20 `ArrowBatch`): its encoded
/// size depends on `len` alone, for tests of the byte bounds (rx §3.4 retry budget and
/// unsent bytes, rx §4.3 stream rotation).
pub fn batch_of_len(i: i64, len: usize) -> ExecutePlanResponse {
    ExecutePlanResponse::arrow_batch(i, Bytes::from(vec![i as u8; len]))
}

/// The row count of an Arrow batch response; `None` for any other response (connect §1.20).
pub fn rows(r: &ExecutePlanResponse) -> Option<i64> {
    match &r.response_type {
        Some(execute_plan_response::ResponseType::ArrowBatch(b)) => Some(b.row_count),
        _ => None,
    }
}

/// Asserts `r` is [`batch`] `i` apart from the ids the manager stamps on it: nothing lost,
/// nothing altered (rx §3.2).
pub fn assert_batch(r: &ExecutePlanResponse, i: i64) {
    let want = ExecutePlanResponse {
        session_id: r.session_id.clone(),
        server_side_session_id: r.server_side_session_id.clone(),
        operation_id: r.operation_id.clone(),
        response_id: r.response_id.clone(),
        ..batch(i)
    };
    assert_eq!(*r, want);
}

/// Submits `request` and attaches its first stream; panics unless it starts a new execution
/// (rx §2.2).
pub fn start(m: &ExecutionManager, request: &ExecutePlanRequest) -> (Producer, ResponseStream) {
    let (p, s) = m.execute_plan(request).expect("execute_plan").start();
    (p.expect("a new execution"), s)
}

/// Pushes batches `from .. from + n` (rx §3.2); panics if one is refused.
pub fn push_n(p: &mut Producer, from: i64, n: i64) {
    for i in from..from + n {
        p.try_push(batch(i)).expect("push");
    }
}

/// The next response available now; panics on anything else (rx §3.3).
pub fn next(s: &mut ResponseStream) -> ExecutePlanResponse {
    match s.try_next() {
        ConsumerEvent::Response(r) => r,
        other => panic!("expected a response, got {other:?}"),
    }
}

/// The error available now; panics on anything else (rx §3.3).
pub fn expect_err(s: &mut ResponseStream) -> ConnectError {
    match s.try_next() {
        ConsumerEvent::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Everything available now: the responses and what stopped the read (rx §3.3).
pub fn drain(s: &mut ResponseStream) -> (Vec<ExecutePlanResponse>, ConsumerEvent) {
    let mut out = Vec::new();
    loop {
        match s.try_next() {
            ConsumerEvent::Response(r) => out.push(r),
            other => return (out, other),
        }
    }
}

/// Spark's error condition of `e`, or `"<none>"` (rx §1.8, connect §2).
pub fn condition(e: &ConnectError) -> &'static str {
    e.condition().unwrap_or("<none>")
}

// ---------------------------------------------------------------------------------------------
// Manual clock
// ---------------------------------------------------------------------------------------------

/// An execution manager whose time is a [`ManualClock`]: a test moves time by hand, nothing
/// sleeps for real (rx §5.3 abandonment, rx §5.6 session expiry).
#[derive(Debug, Clone)]
pub struct ManualManager {
    /// The manager's clock.
    pub clock: ManualClock,
    /// The manager (rx §5).
    pub manager: ExecutionManager,
}

impl ManualManager {
    /// A manager with `config` on a new [`ManualClock`] (rx §5.3).
    pub fn new(config: ManagerConfig) -> Self {
        let clock = ManualClock::new();
        let manager = ExecutionManager::new(ManagerConfig {
            timer: Arc::new(clock.clone()),
            ..config
        });
        Self { clock, manager }
    }
}

impl Default for ManualManager {
    /// [`ManualManager::new`] with the default configuration (rx §4.5 defaults).
    fn default() -> Self {
        Self::new(ManagerConfig::default())
    }
}
