//! The registry's rules on plain values (`E = u32`), time passed in. Scenario numbers are
//! those of reattach spec §7.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

const SID: &str = "6f1b7c4e-8a39-4d2c-9e51-0b3a2f7d8c91";
const SID2: &str = "00112233-4455-6677-8899-aabbccddeeff";
const OP: &str = "11111111-2222-4333-8444-555555555555";
const OP2: &str = "11111111-2222-4333-8444-666666666666";

fn config() -> RegistryConfig {
    RegistryConfig {
        detached_timeout: Duration::from_secs(300),
        session_timeout: Some(Duration::from_secs(3600)),
        abandoned_tombstones: 10_000,
        closed_session_tombstones: 1_000,
        max_executions_per_session: 1_000,
        inactive_operation_expiry: Duration::from_secs(1800),
        inactive_operations_per_session: 10_000,
        error_details_per_session: 20,
        error_details_expiry: Duration::from_secs(60),
    }
}

/// Test values report their state by their value (connect §15.2): `n % 10` 0 running, 1
/// terminating, 2 cancelled while live; removed, `n % 3` 0 succeeded, 1 failed, 2 cancelled.
impl Remembered for u32 {
    fn state(&self) -> OperationState {
        match self % 10 {
            0 => OperationState::Running,
            1 => OperationState::Terminating,
            _ => OperationState::Cancelled,
        }
    }

    fn final_state(&self) -> OperationState {
        match self % 3 {
            0 => OperationState::Succeeded,
            1 => OperationState::Failed,
            _ => OperationState::Cancelled,
        }
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn req<'a>(user: &'a str, sid: &'a str, op: &'a str) -> Admit<'a> {
    Admit {
        user,
        session_id: sid,
        observed: None,
        operation_id: Some(op),
        tags: &[],
    }
}

/// Admits `request` with plan `plan`; plans of live values are looked up in `plans`, the
/// new value is `id`.
fn admit(
    r: &mut Registry<u32>,
    plans: &mut HashMap<u32, u32>,
    request: Admit<'_>,
    plan: u32,
    id: u32,
    now: Instant,
) -> Result<Admitted<u32>, ConnectError> {
    let out = r.admit(request, now, |e| plans[e] == plan, |_| id);
    if let Ok(Admitted::New(id)) = out {
        plans.insert(id, plan);
    }
    out
}

fn key(user: &str, sid: &str, op: &str) -> ExecuteKey {
    ExecuteKey {
        user_id: Arc::from(user),
        session_id: parse_uuid(sid).unwrap(),
        operation_id: parse_uuid(op).unwrap(),
    }
}

fn cond(e: &ConnectError) -> &'static str {
    e.condition().unwrap_or("(no condition)")
}

fn code<T>(r: Result<T, ConnectError>) -> &'static str {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => cond(&e),
    }
}

#[test]
fn rx_s06_detached_execution_is_abandoned_then_tombstoned() {
    let t = Instant::now();
    let mut r = Registry::new(config());
    let mut plans = HashMap::new();
    assert!(matches!(
        admit(&mut r, &mut plans, req("u", SID, OP), 1, 7, t),
        Ok(Admitted::New(7))
    ));
    // Detached at t: not yet due one nanosecond before the timeout.
    let early = r.maintain(t + secs(300) - Duration::from_nanos(1), |_| Some(t));
    assert_eq!(early.report, MaintenanceReport::default());
    let done = r.maintain(t + secs(300), |_| Some(t));
    assert_eq!(done.detached, vec![7]);
    assert_eq!(done.report.abandoned, 1);
    assert!(r.is_abandoned(&key("u", SID, OP)));
    let later = t + secs(301);
    assert_eq!(
        code(r.find("u", SID, None, OP, later)),
        "INVALID_HANDLE.OPERATION_ABANDONED"
    );
    assert_eq!(
        code(admit(&mut r, &mut plans, req("u", SID, OP), 1, 8, later)),
        "INVALID_HANDLE.OPERATION_ABANDONED"
    );
    // Long after the inactive-id expiry the tombstone still answers (rx §5.4: no TTL).
    let much_later = t + secs(100_000);
    let _ = r.get_or_create_session("u", SID, None, much_later);
    let _ = r.maintain(much_later, |_| None);
    assert_eq!(
        code(admit(
            &mut r,
            &mut plans,
            req("u", SID, OP),
            1,
            9,
            much_later
        )),
        "INVALID_HANDLE.OPERATION_ABANDONED"
    );
    assert_eq!(r.stats().abandoned, 1);
}

/// rx §5.3: an attached execution is never abandoned, however old.
#[test]
fn maintain_never_abandons_an_attached_execution() {
    let t = Instant::now();
    let mut r = Registry::new(RegistryConfig {
        session_timeout: None,
        ..config()
    });
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 7, t).unwrap();
    let done = r.maintain(t + secs(1_000_000), |_| None);
    assert!(done.detached.is_empty() && done.with_sessions.is_empty());
    assert_eq!(r.get(&key("u", SID, OP)), Some(&7));
}

/// Scenarios 16 and 35 (SPARK-47249), and rx §5.2 in Spark 4.3.0: a released id is not
/// tombstoned (reattach: NOT_FOUND) but refused on re-submit until the inactive-id expiry.
#[test]
fn rx_s16_released_execution_is_not_tombstoned_but_its_id_stays_inactive() {
    let t = Instant::now();
    let mut r = Registry::new(config());
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 7, t).unwrap();
    let k = key("u", SID, OP);
    assert_eq!(
        r.remove(&k, Leave::Removed(Removal::Released), t, |_| true),
        Some(7)
    );
    assert!(!r.is_abandoned(&k));
    assert_eq!(
        code(r.find("u", SID, None, OP, t)),
        "INVALID_HANDLE.OPERATION_NOT_FOUND"
    );
    let almost = t + secs(1800) - Duration::from_nanos(1);
    assert_eq!(
        code(admit(&mut r, &mut plans, req("u", SID, OP), 1, 8, almost)),
        "INVALID_HANDLE.OPERATION_ABANDONED"
    );
    assert!(matches!(
        admit(&mut r, &mut plans, req("u", SID, OP), 1, 9, t + secs(1800)),
        Ok(Admitted::New(9))
    ));
    assert_eq!(r.stats().released, 1);
}

/// Scenario 31 and SPARK-52397: a live id with another plan is ALREADY_EXISTS; with the
/// same plan it is the live execution again, and nothing new is registered.
#[test]
fn rx_s31_live_id_same_plan_is_a_duplicate_other_plan_already_exists() {
    let t = Instant::now();
    let mut r = Registry::new(config());
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 7, t).unwrap();
    assert_eq!(
        code(admit(&mut r, &mut plans, req("u", SID, OP), 2, 8, t)),
        "INVALID_HANDLE.OPERATION_ALREADY_EXISTS"
    );
    assert!(matches!(
        admit(&mut r, &mut plans, req("u", SID, OP), 1, 9, t),
        Ok(Admitted::Duplicate(7))
    ));
    assert_eq!((r.len(), r.stats().created), (1, 1));
}

/// Scenarios 20–25 (rx §5.6): a released session is tombstoned, its executions abandoned;
/// another user's identical session id, and another session id, are unaffected.
#[test]
fn rx_s22_release_session_isolated_by_user_and_session() {
    let t = Instant::now();
    let mut r = Registry::new(config());
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u1", SID, OP), 1, 1, t).unwrap();
    admit(&mut r, &mut plans, req("u1", SID, OP2), 1, 2, t).unwrap();
    admit(&mut r, &mut plans, req("u2", SID, OP), 1, 3, t).unwrap();
    admit(&mut r, &mut plans, req("u1", SID2, OP), 1, 4, t).unwrap();
    let closed = r
        .close_session("u1", parse_uuid(SID).unwrap(), true)
        .unwrap();
    assert_eq!(closed.abandoned.len(), 2);
    assert!(
        r.close_session("u1", parse_uuid(SID).unwrap(), true)
            .is_none()
    );
    assert_eq!(r.len(), 2);
    assert!(r.is_abandoned(&key("u1", SID, OP)));
    // Scenario 24: any new call in the released session is SESSION_CLOSED.
    assert_eq!(
        code(admit(&mut r, &mut plans, req("u1", SID, OP2), 1, 5, t)),
        "INVALID_HANDLE.SESSION_CLOSED"
    );
    assert_eq!(
        code(r.find("u1", SID, None, OP, t)),
        "INVALID_HANDLE.SESSION_CLOSED"
    );
    // Scenario 25: another user or another session id works.
    assert_eq!(r.find("u2", SID, None, OP, t).unwrap(), 3);
    assert_eq!(r.find("u1", SID2, None, OP, t).unwrap(), 4);
}

/// Scenario 29 (SPARK-50710): `allow_reconnect` leaves no session tombstone: a fresh
/// session with a new server-side id, but the abandoned ids stay tombstoned.
#[test]
fn rx_s29_reconnect_after_release_gets_a_fresh_session() {
    let t = Instant::now();
    let mut r = Registry::new(config());
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 1, t).unwrap();
    let before = r
        .get_or_create_session("u", SID, None, t)
        .unwrap()
        .server_side()
        .clone();
    let closed = r
        .close_session("u", parse_uuid(SID).unwrap(), false)
        .unwrap();
    assert_eq!(closed.server_side, before);
    assert!(matches!(
        admit(&mut r, &mut plans, req("u", SID, OP2), 1, 2, t),
        Ok(Admitted::New(2))
    ));
    let after = r.get_or_create_session("u", SID, None, t).unwrap();
    assert_ne!(after.server_side(), &before);
    assert_eq!(
        code(admit(&mut r, &mut plans, req("u", SID, OP), 1, 3, t)),
        "INVALID_HANDLE.OPERATION_ABANDONED"
    );
}

/// Scenario 28 and rx §5.5: an observed server-side id that differs is SESSION_CHANGED;
/// ExecutePlan's get-or-create refreshes the session all the same, a lookup does not.
#[test]
fn rx_s28_observed_server_side_id_must_match() {
    let t = Instant::now();
    let mut r = Registry::<u32>::new(config());
    let _ = r.get_or_create_session("u", SID, None, t).unwrap();
    let t1 = t + secs(10);
    assert_eq!(
        code(r.get_or_create_session("u", SID, Some("other"), t1)),
        "INVALID_HANDLE.SESSION_CHANGED"
    );
    let sk = key("u", SID, OP).session();
    assert_eq!(r.session(&sk).unwrap().last_access(), t1);
    assert_eq!(
        code(r.lookup_session("u", SID, Some("other"), t + secs(20))),
        "INVALID_HANDLE.SESSION_CHANGED"
    );
    assert_eq!(r.session(&sk).unwrap().last_access(), t1);
    let real = r.session(&sk).unwrap().server_side().clone();
    assert!(
        r.lookup_session("u", SID, Some(&real), t + secs(30))
            .is_ok()
    );
}

/// Scenario 15 (SPARK-46660) and rx §5.6: every RPC resolving the session refreshes it;
/// an idle one expires with its executions abandoned, attached or not.
#[test]
fn rx_s15_session_access_refreshes_and_idle_sessions_expire() {
    let t = Instant::now();
    let mut r = Registry::new(config());
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 1, t).unwrap();
    assert_eq!(r.find("u", SID, None, OP, t + secs(3000)).unwrap(), 1);
    let kept = r.maintain(t + secs(3600), |_| None);
    assert_eq!(kept.report, MaintenanceReport::default());
    let expired = r.maintain(t + secs(6600), |_| None);
    assert_eq!(
        expired.report,
        MaintenanceReport {
            abandoned: 0,
            sessions_expired: 1,
            abandoned_with_sessions: 1
        }
    );
    assert_eq!(expired.with_sessions, vec![1]);
    assert!(r.is_abandoned(&key("u", SID, OP)));
    assert_eq!(
        code(r.lookup_session("u", SID, None, t + secs(6601))),
        "INVALID_HANDLE.SESSION_CLOSED"
    );
}

/// rx §5.5, §1.9: unknown and malformed session ids per RPC kind.
#[test]
fn session_lookup_errors() {
    let t = Instant::now();
    let mut r = Registry::<u32>::new(config());
    assert_eq!(
        code(r.lookup_session("u", SID, None, t)),
        "INVALID_HANDLE.SESSION_NOT_FOUND"
    );
    assert_eq!(
        code(r.lookup_session("u", "nope", None, t)),
        "INVALID_HANDLE.SESSION_NOT_FOUND"
    );
    assert_eq!(
        code(r.get_or_create_session("u", "nope", None, t)),
        "INVALID_HANDLE.FORMAT"
    );
    let mut plans = HashMap::new();
    assert_eq!(
        code(admit(
            &mut r,
            &mut plans,
            req("u", SID, "not-a-uuid"),
            1,
            1,
            t
        )),
        "INVALID_HANDLE.FORMAT"
    );
    assert_eq!(r.len(), 0);
    assert_eq!(
        code(r.find("u", SID, None, "not-a-uuid", t)),
        "INVALID_HANDLE.OPERATION_NOT_FOUND"
    );
}

/// tether's per-session cap (`EXECUTION_LIMIT_EXCEEDED`), counted per session.
#[test]
fn per_session_cap_counts_live_executions() {
    let t = Instant::now();
    let mut r = Registry::new(RegistryConfig {
        max_executions_per_session: 1,
        ..config()
    });
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 1, t).unwrap();
    assert_eq!(
        code(admit(&mut r, &mut plans, req("u", SID, OP2), 1, 2, t)),
        "EXECUTION_LIMIT_EXCEEDED"
    );
    admit(&mut r, &mut plans, req("u", SID2, OP2), 1, 3, t).unwrap();
    r.remove(
        &key("u", SID, OP),
        Leave::Removed(Removal::Released),
        t,
        |_| true,
    );
    admit(&mut r, &mut plans, req("u", SID, OP2), 1, 4, t).unwrap();
    assert_eq!(r.len(), 2);
}

/// rx §1.2: tags are not empty and hold no `,`; nothing is registered otherwise.
#[test]
fn invalid_tags_are_refused_before_registration() {
    let t = Instant::now();
    let mut r = Registry::new(config());
    for bad in ["", "a,b"] {
        let tags = [String::from("ok"), String::from(bad)];
        let out = r.admit(
            Admit {
                tags: &tags,
                ..req("u", SID, OP)
            },
            t,
            |_: &u32| true,
            |_| 1,
        );
        assert!(
            matches!(out, Err(ConnectError::InvalidTag { .. })),
            "{out:?}"
        );
    }
    assert_eq!(r.len(), 0);
}

/// rx §5.7: which executions an interrupt reaches.
#[test]
fn interrupt_targets_by_all_tag_and_id() {
    let t = Instant::now();
    let mut r = Registry::new(config());
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 1, t).unwrap();
    admit(&mut r, &mut plans, req("u", SID, OP2), 1, 2, t).unwrap();
    let s = r.get_or_create_session("u", SID, None, t).unwrap();
    let tagged = |e: &u32, tag: &str| *e == 2 && tag == "x";
    let mut all = s.interrupt_targets(InterruptTarget::All, tagged);
    all.sort();
    assert_eq!(all, vec![1, 2]);
    assert_eq!(
        s.interrupt_targets(InterruptTarget::Tag("x"), tagged),
        vec![2]
    );
    assert!(
        s.interrupt_targets(InterruptTarget::Tag("y"), tagged)
            .is_empty()
    );
    assert_eq!(
        s.interrupt_targets(InterruptTarget::Operation(OP), tagged),
        vec![1]
    );
    assert!(
        s.interrupt_targets(InterruptTarget::Operation("nope"), tagged)
            .is_empty()
    );
}

/// A forgotten execution leaves no trace (rx §6.3 fault injection); a removal that names
/// another value than the registered one (a stale event) removes nothing.
#[test]
fn forgotten_leaves_no_trace_and_stale_removals_are_ignored() {
    let t = Instant::now();
    let mut r = Registry::new(config());
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 1, t).unwrap();
    let k = key("u", SID, OP);
    assert_eq!(
        r.remove(&k, Leave::Removed(Removal::Released), t, |e| *e == 99),
        None
    );
    assert_eq!(r.remove(&k, Leave::Forgotten, t, |e| *e == 1), Some(1));
    assert_eq!(r.remove(&k, Leave::Forgotten, t, |_| true), None);
    assert_eq!(
        code(r.find("u", SID, None, OP, t)),
        "INVALID_HANDLE.OPERATION_NOT_FOUND"
    );
    assert!(matches!(
        admit(&mut r, &mut plans, req("u", SID, OP), 1, 2, t),
        Ok(Admitted::New(2))
    ));
    let stats = r.stats();
    assert_eq!(
        (stats.created, stats.forgotten, stats.executions),
        (2, 1, 1)
    );
}

/// rx §5.4: the tombstones are an LRU; once evicted, a re-submit runs again (the accepted
/// risk).
#[test]
fn evicted_tombstone_lets_the_id_run_again() {
    let t = Instant::now();
    let mut r = Registry::new(RegistryConfig {
        abandoned_tombstones: 1,
        inactive_operations_per_session: 0,
        ..config()
    });
    let mut plans = HashMap::new();
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 1, t).unwrap();
    admit(&mut r, &mut plans, req("u", SID, OP2), 1, 2, t).unwrap();
    let done = r.maintain(t + secs(300), |_| Some(t));
    assert_eq!(done.detached, vec![1, 2], "by key");
    assert!(!r.is_abandoned(&key("u", SID, OP)));
    assert!(matches!(
        admit(&mut r, &mut plans, req("u", SID, OP), 1, 3, t + secs(300)),
        Ok(Admitted::New(3))
    ));
    assert_eq!(
        code(admit(
            &mut r,
            &mut plans,
            req("u", SID, OP2),
            1,
            4,
            t + secs(300)
        )),
        "INVALID_HANDLE.OPERATION_ABANDONED"
    );
}

// -----------------------------------------------------------------------------------------
// The registry's model on proptest-state-machine
// -----------------------------------------------------------------------------------------
//
// `RegistryReference` is rx §5 written as a state machine over session and operation
// indexes and whole seconds: it predicts the answer of every step (the `expect` of its
// state). `RegistryTest` runs the same steps on a `Registry<u32>` and asserts the answer and
// the invariants after every step: the live set matches; the per-session cap holds;
// maintenance abandons only executions detached for the timeout and the executions of
// expired sessions; an abandoned id is answered with its tombstone, which is never lost; no
// id runs again while it is tombstoned or inactive; the counters add up.

use std::collections::{BTreeMap, BTreeSet};

use proptest::test_runner::{Config, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

const USERS: [&str; 2] = ["alice", "bob"];
const SIDS: [&str; 2] = [SID, SID2];
const OPS: [&str; 4] = [
    OP,
    OP2,
    "11111111-2222-4333-8444-777777777777",
    "11111111-2222-4333-8444-888888888888",
];
const CAP: usize = 2;
/// The model's timeouts, in seconds (see [`model_config`]).
const DETACHED: u64 = 300;
const SESSION_IDLE: u64 = 2000;
const INACTIVE: u64 = 900;

fn model_config() -> RegistryConfig {
    RegistryConfig {
        max_executions_per_session: CAP,
        detached_timeout: secs(DETACHED),
        session_timeout: Some(secs(SESSION_IDLE)),
        inactive_operation_expiry: secs(INACTIVE),
        ..config()
    }
}

#[derive(Debug, Clone)]
enum Step {
    Submit { s: usize, op: usize, plan: u32 },
    Reattach { s: usize, op: usize },
    Release { s: usize, op: usize },
    Forget { s: usize, op: usize },
    Attach { s: usize, op: usize, attached: bool },
    CloseSession { s: usize, reconnect: bool },
    Advance(u64),
    Maintain,
}

fn step() -> impl Strategy<Value = Step> {
    let s = 0..USERS.len() * SIDS.len();
    let op = 0..OPS.len();
    prop_oneof![
        4 => (s.clone(), op.clone(), 0..2u32).prop_map(|(s, op, plan)| Step::Submit { s, op, plan }),
        2 => (s.clone(), op.clone()).prop_map(|(s, op)| Step::Reattach { s, op }),
        2 => (s.clone(), op.clone()).prop_map(|(s, op)| Step::Release { s, op }),
        1 => (s.clone(), op.clone()).prop_map(|(s, op)| Step::Forget { s, op }),
        3 => (s.clone(), op.clone(), any::<bool>())
            .prop_map(|(s, op, attached)| Step::Attach { s, op, attached }),
        1 => (s, any::<bool>()).prop_map(|(s, reconnect)| Step::CloseSession { s, reconnect }),
        3 => (0..700u64).prop_map(Step::Advance),
        2 => Just(Step::Maintain),
    ]
}

fn names(s: usize, op: usize) -> (&'static str, &'static str, &'static str) {
    (USERS[s / SIDS.len()], SIDS[s % SIDS.len()], OPS[op])
}

/// An execution in the model: (session index, operation index).
type Key = (usize, usize);

fn execute_key((s, op): Key) -> ExecuteKey {
    let (user, sid, raw) = names(s, op);
    key(user, sid, raw)
}

/// What the model remembers of one live execution.
#[derive(Debug, Clone, Copy)]
struct Live {
    id: u32,
    plan: u32,
    /// `None` = attached; `Some(t)` = detached since second `t`.
    detached: Option<u64>,
}

/// An admitted ExecutePlan, in the model's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Admission {
    New(u32),
    Duplicate(u32),
}

/// The answer the reference predicts for a step (rx §5.5 per RPC; error conditions by name).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum Expect {
    /// No call on the registry (a clock advance, an attach or detach).
    #[default]
    Nothing,
    Admit(Result<Admission, &'static str>),
    Find(Result<u32, &'static str>),
    Removed(Option<u32>),
    /// The abandoned values, sorted; `None`: no such session.
    Closed(Option<Vec<u32>>),
    /// The values abandoned with expired sessions and for being detached, sorted, and the
    /// sessions expired.
    Maintained {
        with_sessions: Vec<u32>,
        detached: Vec<u32>,
        sessions_expired: usize,
    },
}

/// The reference state: rx §5 from the spec.
#[derive(Debug, Clone, Default)]
struct RegistryState {
    /// Seconds since the start.
    now: u64,
    /// The value of the latest Submit (each Submit takes the next).
    next_id: u32,
    live: BTreeMap<Key, Live>,
    /// Abandoned ids (tombstoned: the tombstone cache is large enough never to evict).
    abandoned: BTreeSet<Key>,
    /// Released ids and when (refused on re-submit until the inactive-id expiry).
    released: BTreeMap<Key, u64>,
    /// Live sessions and their last access.
    sessions: BTreeMap<usize, u64>,
    /// Sessions closed with a tombstone.
    closed: BTreeSet<usize>,
    /// The answer to the last step.
    expect: Expect,
}

impl RegistryState {
    fn retire(&mut self, key: Key, abandoned: bool) -> u32 {
        let l = self
            .live
            .remove(&key)
            .expect("the model knows the execution");
        if abandoned {
            self.abandoned.insert(key);
        } else {
            self.released.insert(key, self.now);
        }
        l.id
    }

    /// rx §5.5 ExecutePlan in Spark 4.3.0's order: session, live id (same plan or not),
    /// tombstone, inactive id, per-session cap.
    fn submit(&mut self, key: Key, plan: u32) -> Result<Admission, &'static str> {
        let (s, _) = key;
        if self.closed.contains(&s) {
            return Err("INVALID_HANDLE.SESSION_CLOSED");
        }
        self.sessions.insert(s, self.now);
        if let Some(l) = self.live.get(&key) {
            return if l.plan == plan {
                Ok(Admission::Duplicate(l.id))
            } else {
                Err("INVALID_HANDLE.OPERATION_ALREADY_EXISTS")
            };
        }
        if self.abandoned.contains(&key) {
            return Err("INVALID_HANDLE.OPERATION_ABANDONED");
        }
        if let Some(at) = self.released.get(&key).copied() {
            if at + INACTIVE > self.now {
                return Err("INVALID_HANDLE.OPERATION_ABANDONED");
            }
            self.released.remove(&key);
        }
        if self.live.keys().filter(|(x, _)| *x == s).count() >= CAP {
            return Err("EXECUTION_LIMIT_EXCEEDED");
        }
        let id = self.next_id;
        let detached = None;
        self.live.insert(key, Live { id, plan, detached });
        Ok(Admission::New(id))
    }

    /// rx §5.5 ReattachExecute steps 1–2.
    fn find(&mut self, key: Key) -> Result<u32, &'static str> {
        let (s, _) = key;
        let Some(access) = self.sessions.get_mut(&s) else {
            return Err(if self.closed.contains(&s) {
                "INVALID_HANDLE.SESSION_CLOSED"
            } else {
                "INVALID_HANDLE.SESSION_NOT_FOUND"
            });
        };
        *access = self.now;
        match self.live.get(&key) {
            Some(l) => Ok(l.id),
            None if self.abandoned.contains(&key) => Err("INVALID_HANDLE.OPERATION_ABANDONED"),
            None => Err("INVALID_HANDLE.OPERATION_NOT_FOUND"),
        }
    }

    /// rx §5.6 ReleaseSession: every execution abandoned; a tombstone unless reconnecting.
    fn close(&mut self, s: usize, reconnect: bool) -> Option<Vec<u32>> {
        self.sessions.remove(&s)?;
        let mine: Vec<Key> = self.live.keys().filter(|(x, _)| *x == s).copied().collect();
        let mut ids: Vec<u32> = mine.into_iter().map(|k| self.retire(k, true)).collect();
        ids.sort_unstable();
        if !reconnect {
            self.closed.insert(s);
        }
        // A reconnected session starts with no inactive ids.
        self.released.retain(|(x, _), _| *x != s);
        Some(ids)
    }

    /// rx §5.3, §5.6 maintenance: idle sessions expire (their executions abandoned), then
    /// executions detached for the timeout are abandoned; never an attached one.
    fn maintain(&mut self) -> Expect {
        let now = self.now;
        let expired: BTreeSet<usize> = self
            .sessions
            .iter()
            .filter(|(_, at)| **at + SESSION_IDLE <= now)
            .map(|(s, _)| *s)
            .collect();
        let mut with_sessions = Vec::new();
        for s in &expired {
            with_sessions.extend(self.close(*s, false).expect("a live session"));
        }
        with_sessions.sort_unstable();
        let due: Vec<Key> = self
            .live
            .iter()
            .filter(|(_, l)| l.detached.is_some_and(|t| t + DETACHED <= now))
            .map(|(k, _)| *k)
            .collect();
        let mut detached: Vec<u32> = due.into_iter().map(|k| self.retire(k, true)).collect();
        detached.sort_unstable();
        Expect::Maintained {
            with_sessions,
            detached,
            sessions_expired: expired.len(),
        }
    }
}

struct RegistryReference;

impl ReferenceStateMachine for RegistryReference {
    type State = RegistryState;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<RegistryState> {
        Just(RegistryState::default()).boxed()
    }

    fn transitions(_: &RegistryState) -> BoxedStrategy<Step> {
        step().boxed()
    }

    fn apply(mut m: RegistryState, step: &Step) -> RegistryState {
        m.expect = match *step {
            Step::Submit { s, op, plan } => {
                m.next_id += 1;
                Expect::Admit(m.submit((s, op), plan))
            }
            Step::Reattach { s, op } => Expect::Find(m.find((s, op))),
            Step::Release { s, op } => {
                let live = m.live.contains_key(&(s, op));
                Expect::Removed(live.then(|| m.retire((s, op), false)))
            }
            // A forgotten execution leaves no trace (a live id has no inactive entry).
            Step::Forget { s, op } => Expect::Removed(m.live.remove(&(s, op)).map(|l| l.id)),
            Step::Attach { s, op, attached } => {
                let now = m.now;
                if let Some(l) = m.live.get_mut(&(s, op)) {
                    l.detached = if attached {
                        None
                    } else {
                        Some(l.detached.unwrap_or(now))
                    };
                }
                Expect::Nothing
            }
            Step::CloseSession { s, reconnect } => Expect::Closed(m.close(s, reconnect)),
            Step::Advance(n) => {
                m.now += n;
                Expect::Nothing
            }
            Step::Maintain => m.maintain(),
        };
        m
    }
}

/// The registry under test, with what its owner (the manager) keeps beside it: the plan and
/// the attachment of every value.
struct RegistrySut {
    r: Registry<u32>,
    start: Instant,
    now: Instant,
    next_id: u32,
    plans: HashMap<u32, u32>,
    /// `None` = attached; `Some(t)` = detached since `t`.
    detached: HashMap<u32, Option<Instant>>,
}

impl RegistrySut {
    fn run(&mut self, step: &Step) -> Expect {
        let now = self.now;
        match *step {
            Step::Submit { s, op, plan } => {
                let (user, sid, raw) = names(s, op);
                let k = key(user, sid, raw);
                self.next_id += 1;
                let id = self.next_id;
                let plans = &self.plans;
                let out = self.r.admit(
                    req(user, sid, raw),
                    now,
                    |e| plans[e] == plan,
                    |new| {
                        assert_eq!(new.key, k);
                        id
                    },
                );
                if let Ok(Admitted::New(id)) = out {
                    self.plans.insert(id, plan);
                    self.detached.insert(id, None);
                }
                Expect::Admit(match out {
                    Ok(Admitted::New(id)) => Ok(Admission::New(id)),
                    Ok(Admitted::Duplicate(id)) => Ok(Admission::Duplicate(id)),
                    Err(e) => Err(cond(&e)),
                })
            }
            Step::Reattach { s, op } => {
                let (user, sid, raw) = names(s, op);
                Expect::Find(self.r.find(user, sid, None, raw, now).map_err(|e| cond(&e)))
            }
            Step::Release { s, op } => {
                let k = execute_key((s, op));
                let how = Leave::Removed(Removal::Released);
                Expect::Removed(self.r.remove(&k, how, now, |_| true))
            }
            Step::Forget { s, op } => {
                let k = execute_key((s, op));
                Expect::Removed(self.r.remove(&k, Leave::Forgotten, now, |_| true))
            }
            Step::Attach { s, op, attached } => {
                if let Some(id) = self.r.get(&execute_key((s, op))).copied() {
                    let since = self.detached.entry(id).or_default();
                    *since = if attached {
                        None
                    } else {
                        Some(since.unwrap_or(now))
                    };
                }
                Expect::Nothing
            }
            Step::CloseSession { s, reconnect } => {
                let sk = execute_key((s, 0)).session();
                let closed = self.r.close_session(&sk.user_id, sk.session_id, !reconnect);
                Expect::Closed(closed.map(|c| {
                    let mut ids = c.abandoned;
                    ids.sort_unstable();
                    ids
                }))
            }
            Step::Advance(n) => {
                self.now += secs(n);
                Expect::Nothing
            }
            Step::Maintain => {
                let detached = &self.detached;
                let done = self.r.maintain(now, |e| detached[e]);
                let (mut with_sessions, mut detached) = (done.with_sessions, done.detached);
                with_sessions.sort_unstable();
                detached.sort_unstable();
                assert_eq!(done.report.abandoned_with_sessions, with_sessions.len());
                assert_eq!(done.report.abandoned, detached.len());
                Expect::Maintained {
                    with_sessions,
                    detached,
                    sessions_expired: done.report.sessions_expired,
                }
            }
        }
    }

    /// The invariants after every step, against the reference.
    fn check(&self, m: &RegistryState) {
        assert_eq!(self.now, self.start + secs(m.now), "the clocks agree");
        assert_eq!(self.r.len(), m.live.len(), "the live set");
        for (k, l) in &m.live {
            assert_eq!(self.r.get(&execute_key(*k)), Some(&l.id), "{k:?}");
        }
        let mut per_session: HashMap<SessionKey, usize> = HashMap::new();
        for (k, _) in self.r.executions() {
            *per_session.entry(k.session()).or_default() += 1;
        }
        assert!(
            per_session.values().all(|n| *n <= CAP),
            "the per-session cap"
        );
        for k in &m.abandoned {
            assert!(
                self.r.is_abandoned(&execute_key(*k)),
                "tombstone of {k:?} lost"
            );
        }
        let stats = self.r.stats();
        assert_eq!(
            stats.created,
            stats.executions as u64 + stats.released + stats.abandoned + stats.forgotten
        );
    }
}

struct RegistryTest;

impl StateMachineTest for RegistryTest {
    type SystemUnderTest = RegistrySut;
    type Reference = RegistryReference;

    fn init_test(_: &RegistryState) -> RegistrySut {
        let start = Instant::now();
        RegistrySut {
            r: Registry::new(model_config()),
            start,
            now: start,
            next_id: 0,
            plans: HashMap::new(),
            detached: HashMap::new(),
        }
    }

    fn apply(mut sut: RegistrySut, m: &RegistryState, step: Step) -> RegistrySut {
        let got = sut.run(&step);
        assert_eq!(got, m.expect, "the answer to {step:?}");
        sut.check(m);
        sut
    }
}

/// The model's depth: `TETHER_MODEL_CASES` when set (the variable of
/// `tether_testing::model_cases`, read here directly: a unit test inside the crate cannot
/// use the test-support crate without a second copy of tether's types), else `default`. A malformed value fails rather than running
/// at the default depth.
fn model_cases(default: u32) -> u32 {
    match std::env::var("TETHER_MODEL_CASES") {
        Err(_) => default,
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(n) if n > 0 => n,
            _ => panic!("TETHER_MODEL_CASES={text:?} is not a positive number of cases"),
        },
    }
}

/// Random ExecutePlan / ReattachExecute / ReleaseAll / forget / attach-detach /
/// ReleaseSession / maintenance sequences with random clock advances, against the reference
/// of rx §5 (256 cases, or `TETHER_MODEL_CASES`).
#[test]
fn registry_matches_the_model() {
    let config = Config {
        cases: model_cases(256),
        max_shrink_iters: 4096,
        failure_persistence: None,
        ..Config::default()
    };
    let cases = config.cases;
    let started = Instant::now();
    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(
        &RegistryReference::sequential_strategy(1..80),
        |(initial, steps, seen)| {
            RegistryTest::test_sequential(config.clone(), initial, steps, seen);
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("model registry failed: {e}");
    }
    eprintln!(
        "model registry: {cases} cases in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The steps reach every answer the reference predicts (a generator that never filled a
/// session to its cap or never let an id expire would leave those rules untested).
#[test]
fn registry_steps_reach_every_answer() {
    use proptest::strategy::ValueTree;
    let mut runner = TestRunner::deterministic();
    let mut seen = BTreeSet::new();
    for _ in 0..512 {
        let (initial, steps, _) = RegistryReference::sequential_strategy(1..80)
            .new_tree(&mut runner)
            .expect("strategy")
            .current();
        let mut m = initial;
        for step in &steps {
            m = RegistryReference::apply(m, step);
            let answer = match &m.expect {
                Expect::Admit(Ok(Admission::New(_))) => "new",
                Expect::Admit(Ok(Admission::Duplicate(_))) => "duplicate",
                Expect::Admit(Err(e)) | Expect::Find(Err(e)) => e,
                Expect::Maintained { detached, .. } if !detached.is_empty() => "detached",
                Expect::Maintained { with_sessions, .. } if !with_sessions.is_empty() => "expired",
                _ => continue,
            };
            seen.insert(answer);
        }
    }
    for answer in [
        "new",
        "duplicate",
        "detached",
        "expired",
        "INVALID_HANDLE.OPERATION_ALREADY_EXISTS",
        "INVALID_HANDLE.OPERATION_ABANDONED",
        "INVALID_HANDLE.OPERATION_NOT_FOUND",
        "INVALID_HANDLE.SESSION_CLOSED",
        "INVALID_HANDLE.SESSION_NOT_FOUND",
        "EXECUTION_LIMIT_EXCEEDED",
    ] {
        assert!(seen.contains(answer), "no step answered {answer}: {seen:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// CloneSession and GetStatus (connect §14, §15)
// ---------------------------------------------------------------------------------------------

fn condition_of(e: &ConnectError) -> String {
    match e {
        ConnectError::Spark(s) => s.condition.clone().unwrap_or_default(),
        other => other.condition().unwrap_or_default().to_owned(),
    }
}

/// connect §14.2: the source is checked first (not found, closed, changed), then the target
/// (format, closed, taken); a refusal creates nothing; a success creates one session of the
/// same user with its own server-side id and the id as given.
#[test]
fn clone_checks_in_sparks_order_and_creates_nothing_on_refusal() {
    let t = Instant::now();
    let mut r: Registry<u32> = Registry::new(config());
    let unknown = "22222222-2222-4222-8222-222222222222";
    let refused = |r: &mut Registry<u32>, source: &str, observed, target| {
        let before = r.stats().sessions;
        let e = r
            .clone_session("u", source, observed, target, t)
            .unwrap_err();
        assert_eq!(r.stats().sessions, before, "nothing created");
        condition_of(&e)
    };
    assert_eq!(
        refused(&mut r, SID, None, Some(SID2)),
        "INVALID_HANDLE.SESSION_NOT_FOUND"
    );
    assert_eq!(
        refused(&mut r, "nope", None, None),
        "INVALID_HANDLE.SESSION_NOT_FOUND"
    );
    let source = r
        .get_or_create_session("u", SID, None, t)
        .unwrap()
        .server_side()
        .clone();
    assert_eq!(
        refused(&mut r, SID, Some(unknown), Some("bad")),
        "INVALID_HANDLE.SESSION_CHANGED"
    );
    assert_eq!(
        refused(&mut r, SID, None, Some("bad")),
        "INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_FORMAT"
    );
    assert_eq!(
        refused(&mut r, SID, None, Some(SID)),
        "INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_ALREADY_EXISTS"
    );
    r.get_or_create_session("u", unknown, None, t).unwrap();
    r.close_session("u", parse_uuid(unknown).unwrap(), true);
    assert_eq!(
        refused(&mut r, SID, None, Some(unknown)),
        "INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_ALREADY_CLOSED"
    );
    assert_eq!(
        refused(&mut r, unknown, None, Some(SID2)),
        "INVALID_HANDLE.SESSION_CLOSED"
    );
    // Another user's session of the same id is no source, and no obstacle.
    let e = r.clone_session("v", SID, None, Some(SID2), t).unwrap_err();
    assert_eq!(condition_of(&e), "INVALID_HANDLE.SESSION_NOT_FOUND");

    let cloned = r
        .clone_session("u", SID, Some(&source), Some(SID2), t + secs(1))
        .unwrap();
    assert_eq!(cloned.source_server_side, source);
    assert_eq!(&*cloned.session_id, SID2);
    assert_ne!(cloned.server_side, source);
    let target = r.session(&cloned.key).unwrap();
    assert_eq!(target.server_side(), &cloned.server_side);
    assert_eq!(target.last_access(), t + secs(1));
    assert!(
        r.take_notes()
            .contains(&RegistryNote::SessionStarted(cloned.key.clone()))
    );
    // Generated when unset or empty; the source is refreshed.
    for target in [None, Some("")] {
        let c = r
            .clone_session("u", SID, None, target, t + secs(2))
            .unwrap();
        assert!(parse_uuid(&c.session_id).is_some());
    }
    assert_eq!(r.stats().sessions, 4);
    // Draining: no new session, the checks before it still answer.
    r.set_draining();
    let e = r.clone_session("u", SID, None, None, t).unwrap_err();
    assert_eq!(e, ConnectError::ServerDraining);
    assert_eq!(
        refused(&mut r, SID, None, Some(SID2)),
        "INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_ALREADY_EXISTS"
    );
}

/// connect §14: undoing a clone removes the session only while it is the same one, and
/// leaves no tombstone.
#[test]
fn discard_removes_only_the_same_session() {
    let t = Instant::now();
    let mut r: Registry<u32> = Registry::new(config());
    r.get_or_create_session("u", SID, None, t).unwrap();
    let c = r.clone_session("u", SID, None, Some(SID2), t).unwrap();
    assert!(r.discard_session(&c.key, "other").is_none());
    assert!(r.discard_session(&c.key, &c.server_side).is_some());
    assert!(r.session(&c.key).is_none());
    assert!(!r.is_session_closed(&c.key));
    assert!(r.discard_session(&c.key, &c.server_side).is_none());
    r.clone_session("u", SID, None, Some(SID2), t).unwrap();
}

/// connect §15: GetStatus never creates a session; reports nothing without
/// `operation_status`, every live then inactive operation for an empty list, and each
/// distinct id asked in order otherwise (`UNKNOWN` for ids it does not know).
#[test]
fn operation_states_of_live_and_inactive_operations() {
    let t = Instant::now();
    let mut r: Registry<u32> = Registry::new(config());
    let mut plans = HashMap::new();
    let e = r
        .operation_states("u", SID, None, Some(&[]), t)
        .unwrap_err();
    assert_eq!(condition_of(&e), "INVALID_HANDLE.SESSION_NOT_FOUND");
    let e = r.operation_states("u", "x", None, None, t).unwrap_err();
    assert_eq!(condition_of(&e), "INVALID_HANDLE.SESSION_NOT_FOUND");
    assert_eq!(r.stats().sessions, 0, "never creates a session");

    let op3 = "11111111-2222-4333-8444-777777777777";
    // Live: OP running (value 10), OP2 terminating (value 11).
    admit(&mut r, &mut plans, req("u", SID, OP), 1, 10, t).unwrap();
    admit(&mut r, &mut plans, req("u", SID, OP2), 1, 11, t).unwrap();
    // Removed: op3 as value 4 (final state: failed).
    admit(&mut r, &mut plans, req("u", SID, op3), 1, 4, t).unwrap();
    r.remove(
        &key("u", SID, op3),
        Leave::Removed(Removal::Released),
        t,
        |_| true,
    )
    .unwrap();
    let (server_side, none) = r.operation_states("u", SID, None, None, t).unwrap();
    assert!(none.is_empty());
    assert_eq!(
        Some(&server_side),
        r.session(&key("u", SID, OP).session())
            .map(|s| s.server_side())
    );
    let (_, all) = r.operation_states("u", SID, None, Some(&[]), t).unwrap();
    assert_eq!(
        all,
        vec![
            (OP.to_owned(), OperationState::Running),
            (OP2.to_owned(), OperationState::Terminating),
            (op3.to_owned(), OperationState::Failed),
        ]
    );
    let asked: Vec<String> = [op3, "nope", OP, op3, SID2]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let (_, some) = r.operation_states("u", SID, None, Some(&asked), t).unwrap();
    assert_eq!(
        some,
        vec![
            (op3.to_owned(), OperationState::Failed),
            ("nope".to_owned(), OperationState::Unknown),
            (OP.to_owned(), OperationState::Running),
            (SID2.to_owned(), OperationState::Unknown),
        ]
    );
    // An abandoned execution is remembered as cancelled, whatever its run did (rx §5.8):
    // value 13 would be failed if released.
    let op4 = "11111111-2222-4333-8444-888888888888";
    admit(&mut r, &mut plans, req("u", SID, op4), 1, 13, t).unwrap();
    r.remove(
        &key("u", SID, op4),
        Leave::Removed(Removal::Abandoned),
        t,
        |_| true,
    )
    .unwrap();
    let (_, four) = r
        .operation_states("u", SID, None, Some(&[op4.to_owned()]), t)
        .unwrap();
    assert_eq!(four, vec![(op4.to_owned(), OperationState::Cancelled)]);
    // The observed id is checked; another user sees nothing of this session.
    let e = r
        .operation_states("u", SID, Some(SID2), None, t)
        .unwrap_err();
    assert_eq!(condition_of(&e), "INVALID_HANDLE.SESSION_CHANGED");
    assert!(r.operation_states("v", SID, None, None, t).is_err());
    // An inactive id is forgotten after the expiry: UNKNOWN, and no longer listed.
    let later = t + config().inactive_operation_expiry;
    let (_, all) = r
        .operation_states("u", SID, None, Some(&[]), later)
        .unwrap();
    assert_eq!(all.len(), 2);
    let (_, one) = r
        .operation_states("u", SID, None, Some(&[op3.to_owned()]), later)
        .unwrap();
    assert_eq!(one, vec![(op3.to_owned(), OperationState::Unknown)]);
    // A closed session answers SESSION_CLOSED.
    r.close_session("u", parse_uuid(SID).unwrap(), true);
    let e = r.operation_states("u", SID, None, None, t).unwrap_err();
    assert_eq!(condition_of(&e), "INVALID_HANDLE.SESSION_CLOSED");
}
