//! Model-based test of the server side of reattachable executions (rx §3, §4: random
//! sequences against a reference model).
//!
//! proptest-state-machine drives random sequences of produce, consume (with in-flight
//! loss), disconnect, reattach (last id, an older received id, an evicted id, an unknown id,
//! an empty id), release-until, release-all, interrupt (one / all), duplicate ExecutePlan,
//! producer finish / failure / death, clock advance, maintenance and session close against
//! a real [`ExecutionManager`] on a [`ManualClock`], and checks every outcome against a
//! small reference model written independently (plain vectors, linear scans).
//!
//! Invariants:
//! - every response reaches the client exactly once and in order: each stream delivers
//!   consecutive indexes from its position, the client never sees a gap, duplicates only
//!   follow a deliberate reattach to an older id;
//! - every RPC and every stream step yields exactly the outcome (response index, error
//!   condition and parameters) the model predicts;
//! - retained and unsent bytes of every live execution equal the model's, and stay within
//!   the retry budget and the unsent bound; the manager's memory budget counts exactly
//!   their sum (0 once no execution is live);
//! - the abandoned-operation and closed-session tombstones equal the model's LRU caches;
//! - the registry holds exactly the executions the model says are live: none after
//!   release-all, abandonment or session close.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tether::execution::{
    AnyExecution, ConnectError, ConsumerEvent, ExecuteKey, ExecutionManager, LogConfig, Lookup,
    ManagerConfig, ProduceError, Producer, ResponseStream, StreamEnd, StreamLimits, Submitted,
};
use tether::time::ManualClock;
use tether::wire::connect::{ExecutePlanResponse, InterruptType, interrupt_request};
use tether_testing::connect::{self, Caller};

use crate::events::{EventLaw, Observed};
use crate::model_support;

// ---------------------------------------------------------------------------------------------
// World
// ---------------------------------------------------------------------------------------------

const USER: &str = "model-user";
const SESSIONS: [&str; 2] = [
    "10000000-0000-4000-8000-000000000001",
    "20000000-0000-4000-8000-000000000002",
];
/// Operation slots: ops 0 and 1 live in session 0, op 2 in session 1.
const OPS: [&str; 3] = [
    "a0000000-0000-4000-8000-00000000000a",
    "b0000000-0000-4000-8000-00000000000b",
    "c0000000-0000-4000-8000-00000000000c",
];
const OP_SESSION: [usize; 3] = [0, 0, 1];

/// Exactly `2 × size(10) + size(100)`, so the budget boundary (kept bytes == budget) is
/// reachable.
const BUDGET: u64 = 594;
const MAX_UNSENT_BYTES: u64 = 1500;
const MAX_UNSENT: usize = 6;
const ROTATE_SECS: u64 = 10;
const ROTATE_BYTES: u64 = 1000;
const DETACHED_SECS: u64 = 60;
const SESSION_SECS: u64 = 600;
const INACTIVE_SECS: u64 = 300;
const TOMBSTONES: usize = 2;
const CLOSED_TOMBSTONES: usize = 1;
const LENS: [usize; 3] = [10, 100, 300];

fn config() -> ManagerConfig {
    ManagerConfig {
        log: LogConfig {
            retry_budget: BUDGET,
            max_unsent_bytes: MAX_UNSENT_BYTES,
            max_unsent_responses: MAX_UNSENT,
        },
        stream: StreamLimits {
            max_duration: Some(Duration::from_secs(ROTATE_SECS)),
            max_bytes: Some(ROTATE_BYTES),
        },
        detached_timeout: Duration::from_secs(DETACHED_SECS),
        session_timeout: Some(Duration::from_secs(SESSION_SECS)),
        inactive_operation_expiry: Duration::from_secs(INACTIVE_SECS),
        abandoned_tombstones: TOMBSTONES,
        closed_session_tombstones: CLOSED_TOMBSTONES,
        ..ManagerConfig::default()
    }
}

/// A response of `len` payload bytes (row count 1): its encoded size depends on `len` alone.
fn batch(len: usize) -> ExecutePlanResponse {
    connect::batch_of_len(1, len)
}

/// Encoded size of a stamped response (all ids are 36-character UUIDs).
fn stamped_size(mut r: ExecutePlanResponse) -> u64 {
    let id = "00000000-0000-4000-8000-000000000000".to_owned();
    r.session_id = id.clone();
    r.server_side_session_id = id.clone();
    r.operation_id = id.clone();
    r.response_id = id;
    prost::Message::encoded_len(&r) as u64
}

fn size_of_len(len: usize) -> u64 {
    stamped_size(batch(len))
}

fn result_complete_size() -> u64 {
    stamped_size(ExecutePlanResponse::result_complete())
}

// ---------------------------------------------------------------------------------------------
// Transitions
// ---------------------------------------------------------------------------------------------

/// Which response id a reattach or release names.
#[derive(Debug, Clone, Copy)]
enum Pos {
    /// The client's last processed response (omitted when there is none).
    Last,
    /// An older response the client processed, chosen by the selector.
    Older(u8),
    /// A response whose successor was released (falls back to `Last` if none).
    Evicted,
    /// A random id this execution never produced.
    Unknown,
    /// An explicitly empty id.
    Empty,
    /// No id at all (reattach from the start).
    Start,
}

#[derive(Debug, Clone)]
enum Action {
    Submit(usize),
    Produce(usize, usize),
    Finish(usize),
    Fail(usize),
    DropProducer(usize),
    Consume { op: usize, steps: u8, lose: u8 },
    Disconnect(usize),
    Reattach(usize, Pos),
    ReleaseUntil(usize, Pos),
    ReleaseAll(usize),
    Interrupt(usize),
    InterruptAll(usize),
    Advance(u16),
    Maintain,
    CloseSession(usize),
}

// ---------------------------------------------------------------------------------------------
// Reference model
// ---------------------------------------------------------------------------------------------

/// A model error: the condition plus what the harness needs to build the exact value.
#[derive(Debug, Clone, PartialEq)]
enum E {
    SessionNotFound(usize),
    SessionClosed(usize),
    OpNotFound(usize),
    OpAbandoned(usize),
    NotAvailable(u64),
    NotFound(Target),
    Disconnected,
    Canceled,
    Failed,
    Orphaned(usize),
}

/// A resolved position target.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    None,
    Index(u64),
    Unknown,
    Empty,
}

#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Resp(u64),
    Pending,
    Rotated,
    Complete,
    Err(E),
}

#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Nothing,
    Submitted {
        new: bool,
    },
    SubmitErr(E),
    /// A reattach (or duplicate ExecutePlan) preempted `old` (if the harness had a live
    /// stream) and either attached or failed.
    Attach {
        target: Target,
        result: Result<(), E>,
        preempted: bool,
    },
    Produce(Result<(), ProduceErr>),
    Events {
        events: Vec<Ev>,
        lose: u8,
    },
    Release {
        target: Target,
        result: Result<bool, E>,
    },
    Interrupt(Result<Vec<usize>, E>),
    Maintain,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ProduceErr {
    WouldBlock,
    Cancelled,
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Runner {
    Started,
    StartedInterrupted,
    Completed,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Cursor {
    next: u64,
    deadline: u64,
    bytes: u64,
}

#[derive(Debug, Clone)]
struct OpModel {
    live: bool,
    inactive_since: Option<u64>,
    sizes: Vec<u64>,
    first: u64,
    highest: u64,
    final_index: Option<u64>,
    error: Option<E>,
    runner: Runner,
    producer: bool,
    orphan: bool,
    /// The server's attached consumer.
    consumer: Option<Cursor>,
    detached_since: Option<u64>,
    /// Whether the harness holds a stream object for this op (possibly already cut off by
    /// the server: then `consumer` is `None` and its next poll is `DISCONNECTED`).
    stream: bool,
    client_last: u64,
}

impl OpModel {
    fn new() -> Self {
        OpModel {
            live: false,
            inactive_since: None,
            sizes: Vec::new(),
            first: 1,
            highest: 0,
            final_index: None,
            error: None,
            runner: Runner::Completed,
            producer: false,
            orphan: false,
            consumer: None,
            detached_since: None,
            stream: false,
            client_last: 0,
        }
    }

    fn produced(&self) -> u64 {
        self.sizes.len() as u64
    }

    fn sum(&self, from: u64, to: u64) -> u64 {
        (from.max(1)..=to)
            .map(|i| self.sizes[(i - 1) as usize])
            .sum()
    }

    fn unsent_start(&self) -> u64 {
        self.first.max(self.highest + 1)
    }

    fn unsent_len(&self) -> u64 {
        self.produced() + 1 - self.unsent_start()
    }

    fn unsent_bytes(&self) -> u64 {
        self.sum(self.unsent_start(), self.produced())
    }

    fn retained_bytes(&self) -> u64 {
        self.sum(self.first, self.highest.min(self.produced()))
    }

    fn would_block(&self, size: u64) -> bool {
        let n = self.unsent_len();
        n > 0 && (n >= MAX_UNSENT as u64 || self.unsent_bytes() + size > MAX_UNSENT_BYTES)
    }

    fn detached_since_effective(&self) -> Option<u64> {
        if !self.live {
            return None;
        }
        match self.consumer {
            Some(c) => Some(c.deadline),
            None => self.detached_since,
        }
    }

    fn end_consumer(&mut self, now: u64) {
        self.consumer = None;
        if self.live {
            self.detached_since = Some(now);
        }
    }

    /// The core's `close` (rx §2.2 T12).
    fn close(&mut self) {
        if self.runner == Runner::Started {
            self.runner = if self.producer {
                Runner::StartedInterrupted
            } else {
                Runner::Completed
            };
            if self.final_index.is_none() {
                self.error = Some(E::Canceled);
                self.final_index = Some(self.produced());
            }
        }
        self.live = false;
        self.consumer = None;
        self.detached_since = None;
        self.first = self.produced() + 1;
    }

    /// One consumer step, in the order of rx §4.2.
    fn poll(&mut self, now: u64) -> Ev {
        let Some(mut c) = self.consumer else {
            return Ev::Err(E::Disconnected);
        };
        if let Some(f) = self.final_index
            && c.next > f
        {
            self.end_consumer(now);
            return match &self.error {
                Some(e) => Ev::Err(e.clone()),
                None => Ev::Complete,
            };
        }
        if c.bytes > ROTATE_BYTES || now >= c.deadline {
            self.end_consumer(now);
            return Ev::Rotated;
        }
        let k = c.next;
        if k > self.produced() {
            if self.orphan {
                self.end_consumer(now);
                return Ev::Err(E::Orphaned(usize::MAX));
            }
            return Ev::Pending;
        }
        if k < self.first {
            self.end_consumer(now);
            return Ev::Err(E::NotAvailable(k));
        }
        c.next += 1;
        c.bytes += self.sizes[(k - 1) as usize];
        self.consumer = Some(c);
        self.highest = self.highest.max(k);
        while self.first < k && self.sum(self.first + 1, k - 1) >= BUDGET {
            self.first += 1;
        }
        Ev::Resp(k)
    }

    fn resolve(&self, pos: Pos) -> Target {
        let last = self.client_last;
        match pos {
            Pos::Start => Target::None,
            Pos::Unknown => Target::Unknown,
            Pos::Empty => Target::Empty,
            Pos::Last => {
                if last == 0 {
                    Target::None
                } else {
                    Target::Index(last)
                }
            }
            Pos::Older(sel) => {
                if last == 0 {
                    Target::None
                } else {
                    Target::Index(1 + u64::from(sel) % last)
                }
            }
            Pos::Evicted => {
                if self.first >= 3 && self.first - 2 <= self.highest {
                    Target::Index(self.first - 2)
                } else if last == 0 {
                    Target::None
                } else {
                    Target::Index(last)
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
struct SessModel {
    live: bool,
    last_access: u64,
}

/// An LRU cache model: most recent at the back.
#[derive(Debug, Clone, Default)]
struct LruModel(Vec<usize>, usize);

impl LruModel {
    fn contains(&mut self, k: usize) -> bool {
        if let Some(i) = self.0.iter().position(|x| *x == k) {
            let v = self.0.remove(i);
            self.0.push(v);
            true
        } else {
            false
        }
    }

    fn insert(&mut self, k: usize) {
        if self.1 == 0 {
            return;
        }
        self.0.retain(|x| *x != k);
        self.0.push(k);
        while self.0.len() > self.1 {
            self.0.remove(0);
        }
    }
}

#[derive(Debug, Clone)]
struct Model {
    now: u64,
    sessions: [SessModel; 2],
    closed: LruModel,
    abandoned: LruModel,
    ops: [OpModel; 3],
    expect: Expect,
}

impl Model {
    fn live_count(&self) -> usize {
        self.ops.iter().filter(|o| o.live).count()
    }

    /// Get-or-create (ExecutePlan): `Ok` with the session refreshed.
    fn session_create(&mut self, s: usize) -> Result<(), E> {
        if !self.sessions[s].live {
            if self.closed.contains(s) {
                return Err(E::SessionClosed(s));
            }
            self.sessions[s].live = true;
            for (i, o) in self.ops.iter_mut().enumerate() {
                if OP_SESSION[i] == s {
                    o.inactive_since = None;
                }
            }
        }
        self.sessions[s].last_access = self.now;
        Ok(())
    }

    /// Lookup without creation (ReattachExecute, ReleaseExecute).
    fn session_lookup(&mut self, s: usize) -> Result<(), E> {
        if !self.sessions[s].live {
            return Err(if self.closed.contains(s) {
                E::SessionClosed(s)
            } else {
                E::SessionNotFound(s)
            });
        }
        self.sessions[s].last_access = self.now;
        Ok(())
    }

    fn remove_released(&mut self, op: usize) {
        let now = self.now;
        let o = &mut self.ops[op];
        o.close();
        o.inactive_since = Some(now);
    }

    fn close_session(&mut self, s: usize, tombstone: bool) {
        if !self.sessions[s].live {
            return;
        }
        self.sessions[s].live = false;
        if tombstone {
            self.closed.insert(s);
        }
        // executions in operation-id order (the slots are sorted by id)
        for (op, &owner) in OP_SESSION.iter().enumerate() {
            if owner == s {
                if self.ops[op].live {
                    self.abandoned.insert(op);
                    self.ops[op].close();
                }
                self.ops[op].inactive_since = None;
            }
        }
    }

    /// Attaches a consumer at the position of `target` (rx §3.5). Returns the outcome.
    fn attach(&mut self, op: usize, target: Target) -> Result<(), E> {
        let now = self.now;
        let o = &mut self.ops[op];
        if o.orphan {
            self.remove_released(op);
            return Err(E::Orphaned(op));
        }
        let next = match target {
            Target::None => 1,
            Target::Index(k) => k + 1,
            Target::Unknown | Target::Empty => return Err(E::NotFound(target)),
        };
        o.consumer = Some(Cursor {
            next,
            deadline: now + ROTATE_SECS,
            bytes: 0,
        });
        o.detached_since = None;
        if next < o.first && next <= o.produced() {
            o.end_consumer(now);
            return Err(E::NotAvailable(next));
        }
        Ok(())
    }

    fn interrupt(&mut self, op: usize) -> bool {
        let o = &mut self.ops[op];
        if o.live && o.runner == Runner::Started {
            o.runner = Runner::StartedInterrupted;
            o.error = Some(E::Canceled);
            o.final_index = Some(o.produced());
            true
        } else {
            false
        }
    }

    fn apply(&mut self, action: &Action) {
        self.expect = Expect::Nothing;
        let now = self.now;
        match *action {
            Action::Submit(op) => {
                let s = OP_SESSION[op];
                if let Err(e) = self.session_create(s) {
                    self.expect = Expect::SubmitErr(e);
                    return;
                }
                if self.ops[op].live {
                    let had_stream = self.ops[op].stream && self.ops[op].consumer.is_some();
                    let result = self.attach(op, Target::None);
                    let o = &mut self.ops[op];
                    o.stream = result.is_ok();
                    self.expect = Expect::Attach {
                        target: Target::None,
                        result,
                        preempted: had_stream,
                    };
                    return;
                }
                if self.abandoned.contains(op) {
                    self.expect = Expect::SubmitErr(E::OpAbandoned(op));
                    return;
                }
                if let Some(t) = self.ops[op].inactive_since {
                    if t + INACTIVE_SECS > now {
                        self.expect = Expect::SubmitErr(E::OpAbandoned(op));
                        return;
                    }
                    self.ops[op].inactive_since = None;
                }
                let mut o = OpModel::new();
                o.live = true;
                o.runner = Runner::Started;
                o.producer = true;
                o.stream = true;
                o.consumer = Some(Cursor {
                    next: 1,
                    deadline: now + ROTATE_SECS,
                    bytes: 0,
                });
                self.ops[op] = o;
                self.expect = Expect::Submitted { new: true };
            }
            Action::Produce(op, len) => {
                let size = size_of_len(LENS[len]);
                let o = &mut self.ops[op];
                let r = if !o.live {
                    Err(ProduceErr::Closed)
                } else if o.runner == Runner::StartedInterrupted {
                    Err(ProduceErr::Cancelled)
                } else if o.would_block(size) {
                    Err(ProduceErr::WouldBlock)
                } else {
                    o.sizes.push(size);
                    Ok(())
                };
                self.expect = Expect::Produce(r);
            }
            Action::Finish(op) | Action::Fail(op) => {
                let o = &mut self.ops[op];
                o.producer = false;
                let r = if !o.live {
                    if o.runner == Runner::StartedInterrupted {
                        o.runner = Runner::Completed;
                    }
                    Err(ProduceErr::Closed)
                } else if o.runner == Runner::StartedInterrupted {
                    o.runner = Runner::Completed;
                    Err(ProduceErr::Cancelled)
                } else {
                    if matches!(action, Action::Finish(_)) {
                        o.sizes.push(result_complete_size());
                    } else {
                        o.error = Some(E::Failed);
                    }
                    o.final_index = Some(o.produced());
                    o.runner = Runner::Completed;
                    Ok(())
                };
                self.expect = Expect::Produce(r);
            }
            Action::DropProducer(op) => {
                let o = &mut self.ops[op];
                o.producer = false;
                match o.runner {
                    Runner::Started => {
                        o.runner = Runner::Completed;
                        if o.live {
                            o.orphan = true;
                        }
                    }
                    Runner::StartedInterrupted => o.runner = Runner::Completed,
                    Runner::Completed => {}
                }
            }
            Action::Consume { op, steps, lose } => {
                let o = &mut self.ops[op];
                let mut events = Vec::new();
                let mut accepted = Vec::new();
                for _ in 0..steps {
                    let ev = o.poll(now);
                    let ev = match ev {
                        Ev::Err(E::Orphaned(_)) => Ev::Err(E::Orphaned(op)),
                        ev => ev,
                    };
                    if let Ev::Resp(k) = ev
                        && k == o.client_last + 1
                    {
                        o.client_last = k;
                        accepted.push(k);
                    }
                    let stop = !matches!(ev, Ev::Resp(_));
                    let ended = !matches!(ev, Ev::Resp(_) | Ev::Pending);
                    events.push(ev);
                    if ended {
                        o.stream = false;
                    }
                    if stop {
                        break;
                    }
                }
                // in-flight loss: the transport broke after delivering these
                let lost = if o.stream {
                    (lose as usize).min(accepted.len())
                } else {
                    0
                };
                if lost > 0 {
                    o.client_last = accepted[accepted.len() - lost] - 1;
                    o.stream = false;
                    if o.consumer.is_some() {
                        o.end_consumer(now);
                    }
                }
                self.expect = Expect::Events {
                    events,
                    lose: lost as u8,
                };
            }
            Action::Disconnect(op) => {
                let o = &mut self.ops[op];
                o.stream = false;
                if o.consumer.is_some() {
                    o.end_consumer(now);
                }
            }
            Action::Reattach(op, pos) => {
                let s = OP_SESSION[op];
                let target = self.ops[op].resolve(pos);
                let had_stream = self.ops[op].stream && self.ops[op].consumer.is_some();
                let result = (|| {
                    self.session_lookup(s)?;
                    if !self.ops[op].live {
                        return Err(if self.abandoned.contains(op) {
                            E::OpAbandoned(op)
                        } else {
                            E::OpNotFound(op)
                        });
                    }
                    self.attach(op, target)
                })();
                let preempted = had_stream
                    && !matches!(
                        result,
                        Err(E::NotFound(_)
                            | E::SessionClosed(_)
                            | E::SessionNotFound(_)
                            | E::OpNotFound(_)
                            | E::OpAbandoned(_))
                    );
                let o = &mut self.ops[op];
                if result.is_ok() {
                    o.stream = true;
                } else if preempted || matches!(result, Err(E::Orphaned(_))) {
                    o.stream = false;
                }
                self.expect = Expect::Attach {
                    target,
                    result,
                    preempted,
                };
            }
            Action::ReleaseUntil(op, pos) => {
                let s = OP_SESSION[op];
                let target = match self.ops[op].resolve(pos) {
                    Target::None => Target::Unknown,
                    t => t,
                };
                let result = (|| {
                    self.session_lookup(s)?;
                    let o = &mut self.ops[op];
                    if !o.live {
                        return Ok(false);
                    }
                    match target {
                        Target::Index(k) => {
                            o.first = o.first.max((k + 1).min(o.produced() + 1));
                            Ok(true)
                        }
                        t => Err(E::NotFound(t)),
                    }
                })();
                self.expect = Expect::Release { target, result };
            }
            Action::ReleaseAll(op) => {
                let s = OP_SESSION[op];
                let result = (|| {
                    self.session_lookup(s)?;
                    if !self.ops[op].live {
                        return Ok(false);
                    }
                    self.remove_released(op);
                    Ok(true)
                })();
                self.expect = Expect::Release {
                    target: Target::None,
                    result,
                };
            }
            Action::Interrupt(op) => {
                let s = OP_SESSION[op];
                // Interrupt gets or creates its session, as Spark's does (connect §3).
                let r = self
                    .session_create(s)
                    .map(|()| if self.interrupt(op) { vec![op] } else { vec![] });
                self.expect = Expect::Interrupt(r);
            }
            Action::InterruptAll(s) => {
                let r = self.session_create(s).map(|()| {
                    (0..OPS.len())
                        .filter(|&op| OP_SESSION[op] == s)
                        .filter(|&op| self.interrupt(op))
                        .collect()
                });
                self.expect = Expect::Interrupt(r);
            }
            Action::Advance(secs) => self.now += u64::from(secs),
            Action::Maintain => {
                for s in 0..SESSIONS.len() {
                    if self.sessions[s].live && self.sessions[s].last_access + SESSION_SECS <= now {
                        self.close_session(s, true);
                    }
                }
                for op in 0..OPS.len() {
                    if self.ops[op]
                        .detached_since_effective()
                        .is_some_and(|t| t + DETACHED_SECS <= now)
                    {
                        self.abandoned.insert(op);
                        self.ops[op].close();
                        self.ops[op].inactive_since = Some(now);
                    }
                }
                for o in &mut self.ops {
                    if o.inactive_since.is_some_and(|t| t + INACTIVE_SECS <= now) {
                        o.inactive_since = None;
                    }
                }
                self.expect = Expect::Maintain;
            }
            Action::CloseSession(s) => self.close_session(s, true),
        }
    }
}

struct RefMachine;

impl ReferenceStateMachine for RefMachine {
    type State = Model;
    type Transition = Action;

    fn init_state() -> BoxedStrategy<Self::State> {
        Just(Model {
            now: 0,
            sessions: [
                SessModel {
                    live: false,
                    last_access: 0,
                },
                SessModel {
                    live: false,
                    last_access: 0,
                },
            ],
            closed: LruModel(Vec::new(), CLOSED_TOMBSTONES),
            abandoned: LruModel(Vec::new(), TOMBSTONES),
            ops: [OpModel::new(), OpModel::new(), OpModel::new()],
            expect: Expect::Nothing,
        })
        .boxed()
    }

    fn transitions(_state: &Self::State) -> BoxedStrategy<Self::Transition> {
        let op = 0..OPS.len();
        let pos = prop_oneof![
            6 => Just(Pos::Last),
            2 => any::<u8>().prop_map(Pos::Older),
            2 => Just(Pos::Evicted),
            1 => Just(Pos::Unknown),
            1 => Just(Pos::Empty),
            1 => Just(Pos::Start),
        ];
        prop_oneof![
            3 => op.clone().prop_map(Action::Submit),
            10 => (op.clone(), 0..LENS.len()).prop_map(|(o, l)| Action::Produce(o, l)),
            2 => op.clone().prop_map(Action::Finish),
            1 => op.clone().prop_map(Action::Fail),
            1 => op.clone().prop_map(Action::DropProducer),
            10 => (op.clone(), 1u8..6, prop_oneof![4 => Just(0u8), 1 => 1u8..3])
                .prop_map(|(op, steps, lose)| Action::Consume { op, steps, lose }),
            2 => op.clone().prop_map(Action::Disconnect),
            5 => (op.clone(), pos.clone()).prop_map(|(o, p)| Action::Reattach(o, p)),
            3 => (op.clone(), pos).prop_map(|(o, p)| Action::ReleaseUntil(o, p)),
            2 => op.clone().prop_map(Action::ReleaseAll),
            1 => op.clone().prop_map(Action::Interrupt),
            1 => (0..SESSIONS.len()).prop_map(Action::InterruptAll),
            4 => prop_oneof![1u16..5, 5u16..30, 30u16..400].prop_map(Action::Advance),
            3 => Just(Action::Maintain),
            1 => (0..SESSIONS.len()).prop_map(Action::CloseSession),
        ]
        .boxed()
    }

    fn preconditions(state: &Self::State, action: &Self::Transition) -> bool {
        match *action {
            Action::Produce(op, _)
            | Action::Finish(op)
            | Action::Fail(op)
            | Action::DropProducer(op) => state.ops[op].producer,
            Action::Consume { op, .. } | Action::Disconnect(op) => state.ops[op].stream,
            _ => true,
        }
    }

    fn apply(mut state: Self::State, action: &Self::Transition) -> Self::State {
        state.apply(action);
        state
    }
}

// ---------------------------------------------------------------------------------------------
// System under test
// ---------------------------------------------------------------------------------------------

struct Client {
    /// index → response id, for every response this op's current execution delivered.
    ids: Vec<String>,
    by_id: HashMap<String, u64>,
    last: u64,
    /// After a successful attach at an older position (rx §3.5: the server resumes after
    /// the id named), the index the replay delivers next; `None` when not replaying.
    next_replay: Option<u64>,
}

impl Client {
    fn new() -> Self {
        Client {
            ids: Vec::new(),
            by_id: HashMap::new(),
            last: 0,
            next_replay: None,
        }
    }

    fn id(&self, k: u64) -> String {
        self.ids[(k - 1) as usize].clone()
    }

    /// A stream attached after `target` (rx §3.5): what it delivers first is the next index.
    fn attached_at(&mut self, target: Target) {
        self.next_replay = match target {
            Target::None => Some(1),
            Target::Index(k) => Some(k + 1),
            Target::Unknown | Target::Empty => None,
        };
    }
}

struct Sut {
    clock: ManualClock,
    m: ExecutionManager,
    producers: [Option<Producer>; 3],
    streams: [Option<ResponseStream>; 3],
    clients: [Client; 3],
    unknown_id: String,
    /// Responses delivered to the clients, and those found lost (a gap) or duplicated
    /// (an index delivered again that no reattach asked to replay), over the whole case.
    delivered: u64,
    lost: u64,
    duplicated: u64,
    /// The manager's events and metrics (`tether::observe`), checked after every step.
    observed: Observed,
    law: EventLaw,
}

/// Every event since the last call, checked against Spark's status machine (rx §2.1
/// item 4) and the session order.
fn check_events(sut: &mut Sut) {
    for e in sut.observed.rx.try_recv_all() {
        sut.law.check(&e);
    }
}

/// The model's user in session `s`: every request of the model comes from one of these.
fn caller(s: usize) -> Caller {
    Caller::new(USER, SESSIONS[s])
}

/// The client of operation slot `op` (its session's caller).
fn op_caller(op: usize) -> Caller {
    caller(OP_SESSION[op])
}

fn key(op: usize) -> ExecuteKey {
    op_caller(op).key(OPS[op])
}

impl Sut {
    fn model_error(&self, e: &E) -> ConnectError {
        match e {
            E::SessionNotFound(s) => ConnectError::SessionNotFound {
                handle: SESSIONS[*s].into(),
            },
            E::SessionClosed(s) => ConnectError::SessionClosed {
                handle: SESSIONS[*s].into(),
            },
            E::OpNotFound(op) => ConnectError::OperationNotFound {
                handle: OPS[*op].into(),
            },
            E::OpAbandoned(op) => ConnectError::OperationAbandoned {
                handle: OPS[*op].into(),
            },
            E::Orphaned(op) => ConnectError::Orphaned {
                handle: OPS[*op].into(),
            },
            E::NotAvailable(_) | E::NotFound(_) => unreachable!("built by the caller"),
            E::Disconnected => ConnectError::Disconnected,
            E::Canceled => ConnectError::OperationCanceled,
            E::Failed => ConnectError::failed("[MODEL_FAILURE] the producer failed"),
        }
    }

    fn expected_error(&self, op: usize, e: &E) -> ConnectError {
        match e {
            E::NotAvailable(k) => ConnectError::PositionNotAvailable {
                response_id: self.clients[op].id(*k),
                index: *k,
            },
            E::NotFound(t) => ConnectError::PositionNotFound {
                response_id: self.target_id(op, *t).unwrap_or_default(),
            },
            e => self.model_error(e),
        }
    }

    fn target_id(&self, op: usize, t: Target) -> Option<String> {
        match t {
            Target::None => None,
            Target::Index(k) => Some(self.clients[op].id(k)),
            Target::Unknown => Some(self.unknown_id.clone()),
            Target::Empty => Some(String::new()),
        }
    }

    /// Checks one delivered response against the model's index; records new ids.
    fn check_response(&mut self, op: usize, r: &ExecutePlanResponse, k: u64) {
        let c = &mut self.clients[op];
        // the tally of rx §3: counted before the assertions below fail the case
        self.delivered += 1;
        if k > c.last + 1 {
            self.lost += k - c.last - 1;
        } else if k <= c.last {
            if c.next_replay == Some(k) {
                c.next_replay = Some(k + 1);
            } else {
                self.duplicated += 1;
            }
        } else {
            c.next_replay = None;
        }
        assert_eq!(r.operation_id, OPS[op]);
        match c.by_id.get(&r.response_id) {
            Some(&known) => assert_eq!(known, k, "response re-delivered at another index"),
            None => {
                assert_eq!(c.ids.len() as u64 + 1, k, "a new response skipped an index");
                c.ids.push(r.response_id.clone());
                c.by_id.insert(r.response_id.clone(), k);
            }
        }
        // exactly once, in order: the client only ever accepts its next index; anything
        // earlier is a duplicate after a deliberate backtrack, anything later is a gap
        assert!(k <= c.last + 1, "gap: got index {k} after {}", c.last);
        if k == c.last + 1 {
            c.last = k;
        }
    }

    fn expect_preempted(&mut self, op: usize) {
        if let Some(mut old) = self.streams[op].take() {
            assert_eq!(
                old.try_next(),
                ConsumerEvent::Error(ConnectError::Disconnected),
                "the previous stream must be disconnected"
            );
        }
    }
}

struct Harness;

impl StateMachineTest for Harness {
    type SystemUnderTest = Sut;
    type Reference = RefMachine;

    fn init_test(_ref_state: &Model) -> Sut {
        let observed = Observed::new(config(), 1 << 16);
        Sut {
            clock: observed.clock.clone(),
            m: observed.m.clone(),
            observed,
            law: EventLaw::default(),
            producers: [None, None, None],
            streams: [None, None, None],
            clients: [Client::new(), Client::new(), Client::new()],
            unknown_id: connect::op_id(),
            delivered: 0,
            lost: 0,
            duplicated: 0,
        }
    }

    fn apply(mut sut: Sut, model: &Model, action: Action) -> Sut {
        match action {
            Action::Submit(op) => {
                let req = op_caller(op).execute(OPS[op]);
                let got = sut.m.execute_plan(&req);
                match (&model.expect, got) {
                    (Expect::Submitted { new: true }, Ok(Submitted::Reattachable(init))) => {
                        let (_h, p, s) = init.start();
                        sut.producers[op] = Some(p);
                        sut.streams[op] = Some(s);
                        sut.clients[op] = Client::new();
                    }
                    (Expect::SubmitErr(e), Err(got)) => {
                        assert_eq!(got, sut.expected_error(op, e));
                    }
                    (
                        Expect::Attach {
                            target,
                            result,
                            preempted,
                        },
                        got,
                    ) => {
                        if *preempted {
                            sut.expect_preempted(op);
                        }
                        match (result, got) {
                            (Ok(()), Ok(Submitted::Reattached(s))) => {
                                sut.streams[op] = Some(*s);
                                sut.clients[op].attached_at(*target);
                            }
                            (Err(e), Err(got)) => {
                                assert_eq!(got, sut.expected_error(op, e));
                                sut.streams[op] = None;
                            }
                            (want, got) => panic!("duplicate submit: want {want:?}, got {got:?}"),
                        }
                    }
                    (want, got) => panic!("submit: want {want:?}, got {got:?}"),
                }
            }
            Action::Produce(op, len) => {
                let p = sut.producers[op].as_mut().expect("producer");
                let got = p.try_push(batch(LENS[len]));
                let Expect::Produce(want) = &model.expect else {
                    unreachable!()
                };
                match (want, got) {
                    (Ok(()), Ok(_)) => {}
                    (Err(ProduceErr::WouldBlock), Err(ProduceError::WouldBlock(_))) => {}
                    (Err(ProduceErr::Cancelled), Err(ProduceError::Cancelled)) => {}
                    (Err(ProduceErr::Closed), Err(ProduceError::Closed)) => {}
                    (want, got) => panic!("produce: want {want:?}, got {got:?}"),
                }
            }
            Action::Finish(op) | Action::Fail(op) => {
                let p = sut.producers[op].take().expect("producer");
                let got = if matches!(action, Action::Finish(_)) {
                    p.finish()
                } else {
                    p.fail(ConnectError::failed("[MODEL_FAILURE] the producer failed"))
                };
                let Expect::Produce(want) = &model.expect else {
                    unreachable!()
                };
                match (want, got) {
                    (Ok(()), Ok(())) => {}
                    (Err(ProduceErr::Cancelled), Err(ProduceError::Cancelled)) => {}
                    (Err(ProduceErr::Closed), Err(ProduceError::Closed)) => {}
                    (want, got) => panic!("finish: want {want:?}, got {got:?}"),
                }
            }
            Action::DropProducer(op) => {
                sut.producers[op] = None;
            }
            Action::Consume { op, .. } => {
                let Expect::Events { events, lose } = &model.expect else {
                    unreachable!()
                };
                let mut accepted = Vec::new();
                for want in events {
                    let s = sut.streams[op].as_mut().expect("stream");
                    let got = s.try_next();
                    match (want, got) {
                        (Ev::Resp(k), ConsumerEvent::Response(r)) => {
                            let before = sut.clients[op].last;
                            sut.check_response(op, &r, *k);
                            if sut.clients[op].last > before {
                                accepted.push(*k);
                            }
                        }
                        (Ev::Pending, ConsumerEvent::Pending { .. }) => {}
                        (Ev::Rotated, ConsumerEvent::End(StreamEnd::Rotated)) => {
                            sut.streams[op] = None;
                        }
                        (Ev::Complete, ConsumerEvent::End(StreamEnd::Complete)) => {
                            sut.streams[op] = None;
                        }
                        (Ev::Err(e), ConsumerEvent::Error(got)) => {
                            assert_eq!(got, sut.expected_error(op, e));
                            sut.streams[op] = None;
                        }
                        (want, got) => panic!("consume: want {want:?}, got {got:?}"),
                    }
                }
                let lose = *lose as usize;
                if lose > 0 {
                    sut.clients[op].last = accepted[accepted.len() - lose] - 1;
                    sut.streams[op] = None;
                }
            }
            Action::Disconnect(op) => {
                sut.streams[op] = None;
            }
            Action::Reattach(op, _) => {
                let Expect::Attach {
                    target,
                    result,
                    preempted,
                } = &model.expect
                else {
                    unreachable!()
                };
                let last = sut.target_id(op, *target);
                let req = op_caller(op).reattach(OPS[op], last.as_deref());
                let got = sut.m.reattach_execute(&req);
                if *preempted {
                    sut.expect_preempted(op);
                }
                match (result, got) {
                    (Ok(()), Ok(s)) => {
                        sut.streams[op] = Some(s);
                        sut.clients[op].attached_at(*target);
                    }
                    (Err(e), Err(got)) => {
                        assert_eq!(got, sut.expected_error(op, e));
                        if matches!(e, E::Orphaned(_)) {
                            sut.streams[op] = None;
                        }
                    }
                    (want, got) => panic!("reattach: want {want:?}, got {got:?}"),
                }
            }
            Action::ReleaseUntil(op, _) | Action::ReleaseAll(op) => {
                let Expect::Release { target, result } = &model.expect else {
                    unreachable!()
                };
                let req = match action {
                    Action::ReleaseAll(_) => op_caller(op).release_all(OPS[op]),
                    _ => op_caller(op)
                        .release_until(OPS[op], &sut.target_id(op, *target).unwrap_or_default()),
                };
                match (result, sut.m.release_execute(&req)) {
                    (Ok(found), Ok(r)) => {
                        assert_eq!(r.operation_id.is_some(), *found);
                        assert_eq!(r.session_id, SESSIONS[OP_SESSION[op]]);
                    }
                    (Err(e), Err(got)) => assert_eq!(got, sut.expected_error(op, e)),
                    (want, got) => panic!("release: want {want:?}, got {got:?}"),
                }
            }
            Action::Interrupt(_) | Action::InterruptAll(_) => {
                let Expect::Interrupt(want) = &model.expect else {
                    unreachable!()
                };
                let (s, which, ty) = match action {
                    Action::Interrupt(op) => (
                        OP_SESSION[op],
                        Some(interrupt_request::Interrupt::OperationId(OPS[op].into())),
                        InterruptType::OperationId,
                    ),
                    Action::InterruptAll(s) => (s, None, InterruptType::All),
                    _ => unreachable!(),
                };
                let req = caller(s).interrupt(ty, which);
                match (want, sut.m.interrupt(&req)) {
                    (Ok(ops), Ok(r)) => {
                        let want: Vec<String> = ops.iter().map(|&o| OPS[o].to_owned()).collect();
                        assert_eq!(r.interrupted_ids, want);
                    }
                    (Err(e), Err(got)) => assert_eq!(got, sut.expected_error(0, e)),
                    (want, got) => panic!("interrupt: want {want:?}, got {got:?}"),
                }
            }
            Action::Advance(secs) => sut.clock.advance(Duration::from_secs(u64::from(secs))),
            Action::Maintain => {
                sut.m.maintain();
            }
            Action::CloseSession(s) => {
                sut.m.release_session(&caller(s).release_session(false));
            }
        }
        check_events(&mut sut);
        // What the events say is live is what the manager holds.
        assert_eq!(
            sut.law.open(),
            sut.m.execution_count(),
            "events vs registry"
        );
        assert_eq!(
            sut.law.live_sessions(),
            (0..SESSIONS.len())
                .filter(|&s| model.sessions[s].live)
                .count(),
            "events vs live sessions"
        );
        sut
    }

    fn teardown(mut sut: Sut, _model: Model) {
        DELIVERY.record("responses", sut.delivered, sut.lost, sut.duplicated);
        // Everything released: every gauge is back to 0, and the counters equal the events
        // and the manager's totals (created = released + abandoned + forgotten + live).
        sut.streams = [None, None, None];
        sut.producers = [None, None, None];
        for s in 0..SESSIONS.len() {
            sut.m.release_session(&caller(s).release_session(true));
        }
        // The gauges are sampled by the maintenance pass.
        sut.m.maintain();
        check_events(&mut sut);
        let o = &sut.observed;
        for gauge in [
            "tether_connect_executions",
            "tether_connect_sessions",
            "tether_connect_attached_streams",
        ] {
            assert_eq!(
                o.metric(gauge, &[]),
                0.0,
                "{gauge} after releasing everything"
            );
        }
        assert_eq!(sut.law.open(), 0);
        assert_eq!(sut.law.live_sessions(), 0);
        let stats = sut.m.stats();
        let started = o.metric("tether_connect_executions_started_total", &[]);
        assert_eq!(started, stats.created as f64);
        assert_eq!(started, sut.law.started as f64);
        assert_eq!(
            o.metric("tether_connect_executions_closed_total", &[]),
            (stats.released + stats.abandoned + stats.forgotten) as f64
        );
        assert_eq!(sut.law.closed, sut.law.started);
        assert_eq!(sut.observed.rx.dropped(), 0);
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        // the registry holds exactly the live executions
        let live: BTreeSet<ExecuteKey> = (0..OPS.len())
            .filter(|&op| model.ops[op].live)
            .map(key)
            .collect();
        let got: BTreeSet<ExecuteKey> = sut.m.execution_keys().into_iter().collect();
        assert_eq!(got, live);
        assert_eq!(sut.m.execution_count(), model.live_count());
        // tombstones follow the model's LRU caches
        let abandoned: BTreeSet<ExecuteKey> = model.abandoned.0.iter().map(|&op| key(op)).collect();
        let got: BTreeSet<ExecuteKey> = sut.m.abandoned_keys().into_iter().collect();
        assert_eq!(got, abandoned);
        for s in 0..SESSIONS.len() {
            let k = caller(s).session_key();
            assert_eq!(sut.m.is_session_closed(&k), model.closed.0.contains(&s));
            assert_eq!(
                sut.m.server_side_session_id(&k).is_some(),
                model.sessions[s].live
            );
        }
        // both byte bounds, exactly as modelled
        let largest = size_of_len(*LENS.iter().max().unwrap());
        let mut held = 0;
        for (op, o) in model.ops.iter().enumerate() {
            if !o.live {
                continue;
            }
            let (retained, unsent) = match sut.m.lookup(&key(op)) {
                Some(Lookup::Reattachable(any)) => match any {
                    AnyExecution::Init(e) => (e.retained_bytes(), e.unsent_bytes()),
                    AnyExecution::Streaming(e) => (e.retained_bytes(), e.unsent_bytes()),
                    AnyExecution::Finishing(e) => (e.retained_bytes(), e.unsent_bytes()),
                    AnyExecution::Cancelling(e) => (e.retained_bytes(), e.unsent_bytes()),
                    AnyExecution::Terminated(e) => (e.retained_bytes(), e.unsent_bytes()),
                },
                other => panic!("live op {op} not found as reattachable: {other:?}"),
            };
            assert_eq!(retained, o.retained_bytes(), "retained bytes of op {op}");
            assert_eq!(unsent, o.unsent_bytes(), "unsent bytes of op {op}");
            held += retained + unsent;
            assert!(retained < BUDGET + 2 * largest);
            assert!(unsent <= MAX_UNSENT_BYTES.max(largest) + result_complete_size());
            assert!(o.unsent_len() <= MAX_UNSENT as u64 + 1);
        }
        // the manager's memory budget counts exactly the held bytes of the live executions
        // (released, abandoned and closed ones returned theirs): 0 when none is live
        let usage = sut
            .m
            .memory_usage()
            .expect("the default config has a memory budget");
        assert_eq!(usage.used, held, "memory budget vs the logs' held bytes");
        for op in 0..OPS.len() {
            if model.ops[op].live || model.ops[op].stream {
                assert_eq!(sut.clients[op].last, model.ops[op].client_last);
            }
            assert_eq!(
                sut.streams[op].is_some(),
                model.ops[op].stream,
                "stream of op {op}"
            );
        }
    }
}

/// Every response delivered over every case of [`rx_model_server_matches_reference`].
static DELIVERY: model_support::Tally = model_support::Tally::new();

#[test]
fn rx_model_server_matches_reference() {
    model_support::run::<Harness>(
        "rx server (ExecutionCore/ResponseLog)",
        "responses",
        256,
        1..120,
        &DELIVERY,
    );
}

#[test]
fn rx_model_sizes_are_distinct_enough() {
    // the model relies on these sizes to exercise eviction, both bounds and rotation
    let sizes: Vec<u64> = LENS.iter().map(|&l| size_of_len(l)).collect();
    assert!(sizes[0] < sizes[1] && sizes[1] < sizes[2]);
    assert_eq!(BUDGET, 2 * sizes[0] + sizes[1]);
    assert!(sizes[2] < BUDGET && 3 * sizes[2] > BUDGET);
    assert!(sizes[2] * (MAX_UNSENT as u64) > MAX_UNSENT_BYTES);
    assert!(sizes[2] * 4 > ROTATE_BYTES);
}
