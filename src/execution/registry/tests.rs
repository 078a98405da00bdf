//! The registry's rules on plain values (`E = u32`), time passed in. Scenario numbers are
//! those of reattach spec §7.

use std::collections::{HashMap, HashSet};

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
// Random sequences against a model
// -----------------------------------------------------------------------------------------

const USERS: [&str; 2] = ["alice", "bob"];
const SIDS: [&str; 2] = [SID, SID2];
const OPS: [&str; 4] = [
    OP,
    OP2,
    "11111111-2222-4333-8444-777777777777",
    "11111111-2222-4333-8444-888888888888",
];
const CAP: usize = 2;

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

/// What the model remembers of one live execution.
#[derive(Debug, Clone, Copy)]
struct Live {
    id: u32,
    plan: u32,
    /// `None` = attached; `Some(t)` = detached since `t`.
    detached: Option<Instant>,
}

#[derive(Default)]
struct Model {
    live: HashMap<ExecuteKey, Live>,
    /// Abandoned ids (tombstoned: the tombstone cache is large enough never to evict).
    abandoned: HashSet<ExecuteKey>,
    /// Released ids and when (refused on re-submit until the inactive-id expiry).
    released: HashMap<ExecuteKey, Instant>,
    /// Live sessions and their last access.
    sessions: HashMap<SessionKey, Instant>,
    /// Sessions closed with a tombstone.
    closed: HashSet<SessionKey>,
    /// Every id the registry ever handed out, to catch a resurrected value.
    retired: HashSet<u32>,
}

impl Model {
    fn retire(&mut self, key: &ExecuteKey, abandoned: bool, now: Instant) -> Live {
        let l = self
            .live
            .remove(key)
            .expect("the model knows the execution");
        self.retired.insert(l.id);
        if abandoned {
            self.abandoned.insert(key.clone());
        } else {
            self.released.insert(key.clone(), now);
        }
        l
    }
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let cfg = RegistryConfig {
        max_executions_per_session: CAP,
        session_timeout: Some(secs(2000)),
        inactive_operation_expiry: secs(900),
        ..config()
    };
    let start = Instant::now();
    let mut now = start;
    let mut r: Registry<u32> = Registry::new(cfg);
    let mut m = Model::default();
    let mut next_id = 0u32;
    for step in steps {
        match step {
            Step::Submit { s, op, plan } => {
                let (user, sid, raw) = names(s, op);
                let k = key(user, sid, raw);
                let live = m.live.clone();
                next_id += 1;
                let out = r.admit(
                    req(user, sid, raw),
                    now,
                    |e| live.values().any(|l| l.id == *e && l.plan == plan),
                    |new| {
                        assert_eq!(new.key, k);
                        next_id
                    },
                );
                let in_session = m.live.keys().filter(|x| x.session() == k.session()).count();
                if !m.closed.contains(&k.session()) {
                    m.sessions.insert(k.session(), now);
                }
                match (out, m.live.get(&k)) {
                    (Ok(Admitted::Duplicate(id)), Some(l)) => {
                        prop_assert_eq!((id, plan), (l.id, l.plan));
                    }
                    (Err(e), Some(l)) => {
                        prop_assert_ne!(plan, l.plan);
                        prop_assert_eq!(cond(&e), "INVALID_HANDLE.OPERATION_ALREADY_EXISTS");
                    }
                    (Err(e), None) if m.closed.contains(&k.session()) => {
                        prop_assert_eq!(cond(&e), "INVALID_HANDLE.SESSION_CLOSED");
                    }
                    (Err(e), None) if cond(&e) == "INVALID_HANDLE.OPERATION_ABANDONED" => {
                        let inactive = m.released.get(&k).is_some_and(|at| *at + secs(900) > now);
                        prop_assert!(m.abandoned.contains(&k) || inactive, "{k:?}");
                    }
                    (Err(e), None) => {
                        prop_assert_eq!(cond(&e), "EXECUTION_LIMIT_EXCEEDED");
                        prop_assert_eq!(in_session, CAP);
                    }
                    (Ok(Admitted::New(id)), None) => {
                        // Ids are never resurrected: not abandoned, not released recently.
                        prop_assert!(!m.abandoned.contains(&k), "abandoned {k:?} ran again");
                        prop_assert!(
                            m.released.get(&k).is_none_or(|at| *at + secs(900) <= now),
                            "released {k:?} ran again too early"
                        );
                        prop_assert!(in_session < CAP);
                        prop_assert!(!m.retired.contains(&id));
                        m.released.remove(&k);
                        m.live.insert(
                            k,
                            Live {
                                id,
                                plan,
                                detached: None,
                            },
                        );
                    }
                    (out, l) => prop_assert!(false, "unexpected {out:?} for {l:?}"),
                }
            }
            Step::Reattach { s, op } => {
                let (user, sid, raw) = names(s, op);
                let k = key(user, sid, raw);
                let out = r.find(user, sid, None, raw, now);
                let session_live = m.sessions.contains_key(&k.session());
                if session_live {
                    m.sessions.insert(k.session(), now);
                }
                match (out, m.live.get(&k)) {
                    (Ok(id), Some(l)) => prop_assert_eq!(id, l.id),
                    (Ok(id), None) => prop_assert!(false, "found {id} not in the model"),
                    (Err(e), _) if !session_live => {
                        let want = if m.closed.contains(&k.session()) {
                            "INVALID_HANDLE.SESSION_CLOSED"
                        } else {
                            "INVALID_HANDLE.SESSION_NOT_FOUND"
                        };
                        prop_assert_eq!(cond(&e), want);
                    }
                    (Err(e), None) => {
                        // An abandoned id is answered with its tombstone.
                        let want = if m.abandoned.contains(&k) {
                            "INVALID_HANDLE.OPERATION_ABANDONED"
                        } else {
                            "INVALID_HANDLE.OPERATION_NOT_FOUND"
                        };
                        prop_assert_eq!(cond(&e), want);
                    }
                    (Err(e), Some(_)) => prop_assert!(false, "live {k:?} not found: {e}"),
                }
            }
            Step::Release { s, op } => {
                let (user, sid, raw) = names(s, op);
                let k = key(user, sid, raw);
                let removed = r.remove(&k, Leave::Removed(Removal::Released), now, |_| true);
                match removed {
                    Some(id) => {
                        let l = m.retire(&k, false, now);
                        prop_assert_eq!(id, l.id);
                    }
                    None => prop_assert!(!m.live.contains_key(&k)),
                }
            }
            Step::Forget { s, op } => {
                let (user, sid, raw) = names(s, op);
                let k = key(user, sid, raw);
                let removed = r.remove(&k, Leave::Forgotten, now, |_| true);
                prop_assert_eq!(removed.is_some(), m.live.contains_key(&k));
                if let Some(l) = m.live.remove(&k) {
                    m.retired.insert(l.id);
                    m.released.remove(&k);
                }
            }
            Step::Attach { s, op, attached } => {
                let (user, sid, raw) = names(s, op);
                if let Some(l) = m.live.get_mut(&key(user, sid, raw)) {
                    l.detached = if attached {
                        None
                    } else {
                        Some(l.detached.unwrap_or(now))
                    };
                }
            }
            Step::CloseSession { s, reconnect } => {
                let (user, sid, _) = names(s, 0);
                let sk = key(user, sid, OP).session();
                let closed = r.close_session(user, sk.session_id, !reconnect);
                let closed_some = closed.is_some();
                let mine: Vec<ExecuteKey> = m
                    .live
                    .keys()
                    .filter(|k| k.session() == sk)
                    .cloned()
                    .collect();
                match closed {
                    Some(c) => {
                        prop_assert_eq!(c.abandoned.len(), mine.len());
                        for k in mine {
                            let l = m.retire(&k, true, now);
                            prop_assert!(c.abandoned.contains(&l.id));
                        }
                        if !reconnect {
                            m.closed.insert(sk.clone());
                        }
                    }
                    None => prop_assert!(!m.sessions.contains_key(&sk)),
                }
                prop_assert_eq!(closed_some, m.sessions.remove(&sk).is_some());
                // A reconnected session starts with no inactive ids.
                m.released.retain(|k, _| k.session() != sk);
            }
            Step::Advance(n) => now += secs(n),
            Step::Maintain => {
                let by_id: HashMap<u32, (ExecuteKey, Live)> = m
                    .live
                    .iter()
                    .map(|(k, l)| (l.id, (k.clone(), *l)))
                    .collect();
                let expired: HashSet<SessionKey> = m
                    .sessions
                    .iter()
                    .filter(|(_, at)| **at + secs(2000) <= now)
                    .map(|(sk, _)| sk.clone())
                    .collect();
                let mut want_with: Vec<u32> = by_id
                    .values()
                    .filter(|(k, _)| expired.contains(&k.session()))
                    .map(|(_, l)| l.id)
                    .collect();
                // Maintain abandons exactly the executions detached for the timeout, never
                // an attached one (rx §5.3).
                let mut want_detached: Vec<u32> = by_id
                    .values()
                    .filter(|(k, l)| {
                        !expired.contains(&k.session())
                            && l.detached.is_some_and(|t| t + secs(300) <= now)
                    })
                    .map(|(_, l)| l.id)
                    .collect();
                let done = r.maintain(now, |e| by_id[e].1.detached);
                let (mut with, mut detached) = (done.with_sessions, done.detached);
                for v in [&mut want_with, &mut want_detached, &mut with, &mut detached] {
                    v.sort_unstable();
                }
                prop_assert_eq!(&with, &want_with);
                prop_assert_eq!(&detached, &want_detached);
                prop_assert_eq!(done.report.sessions_expired, expired.len());
                prop_assert_eq!(done.report.abandoned_with_sessions, with.len());
                prop_assert_eq!(done.report.abandoned, detached.len());
                for id in with.iter().chain(&detached) {
                    m.retire(&by_id[id].0, true, now);
                }
                for sk in expired {
                    m.sessions.remove(&sk);
                    m.released.retain(|k, _| k.session() != sk);
                    m.closed.insert(sk);
                }
            }
        }
        // Invariants after every step.
        prop_assert_eq!(r.len(), m.live.len());
        for (k, l) in &m.live {
            prop_assert_eq!(r.get(k), Some(&l.id));
        }
        let mut per_session: HashMap<SessionKey, usize> = HashMap::new();
        for (k, _) in r.executions() {
            *per_session.entry(k.session()).or_default() += 1;
        }
        prop_assert!(per_session.values().all(|n| *n <= CAP));
        for k in &m.abandoned {
            prop_assert!(r.is_abandoned(k), "tombstone of {k:?} lost");
        }
        let stats = r.stats();
        prop_assert_eq!(
            stats.created,
            stats.executions as u64 + stats.released + stats.abandoned + stats.forgotten
        );
    }
    Ok(())
}

/// The model's depth: `TETHER_MODEL_CASES` when set (the variable of the crate's
/// `testing::model_cases`, read here directly because the layer order keeps `execution`
/// from importing `testing`), else `default`. A malformed value fails rather than running
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(model_cases(256)))]

    /// Random ExecutePlan / ReattachExecute / ReleaseAll / forget / attach-detach /
    /// ReleaseSession / maintenance sequences with random clock advances, against a model
    /// of rx §5: the live set matches, the per-session cap holds, maintenance abandons only
    /// executions detached for the timeout, an abandoned id is answered with its tombstone,
    /// and no id runs again while it is tombstoned or inactive.
    #[test]
    fn registry_matches_the_model(steps in prop::collection::vec(step(), 1..80)) {
        run(steps)?;
    }
}
