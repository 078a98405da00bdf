//! Model-based test of the client side of reattachable executions: the sans-IO
//! [`ReattachCore`] (rx §6.3, Spark's `ExecutePlanResponseReattachableIterator` and its retry
//! policy), as a proptest-state-machine test: [`ClientReference`] + [`ClientCoreTest`].
//! Depth: `TETHER_MODEL_CASES` (default 256).
//!
//! Each transition is what the server does with the client's next RPC: refuse it with a
//! retryable error, lose an `ExecutePlan` before it registers, stream up to `take` responses
//! then end or fail (retryably or fatally). The test side drives the core through its
//! commands (sleeping through backoffs at once, answering a reattach to an unregistered
//! operation with `OPERATION_NOT_FOUND`, as a server does) and compares with the reference
//! after every step:
//!
//! - every response is delivered exactly once and in order: the client holds exactly
//!   responses `1..=sent` of the server (counted: 0 lost, 0 duplicated);
//! - each reattach names the last delivered response, never an empty id (rx §3.5);
//!   `ExecutePlan` is re-sent only when the first one never registered (rx §6.3);
//! - the client ends `Complete` exactly when `ResultComplete` was delivered, fails exactly
//!   on a fatal error or when a retry scope runs out (after exactly the policy's 15
//!   retries), and never retries more often than faults were injected;
//! - the releases: `ReleaseUntil` ids strictly increase, name delivered responses and stop
//!   at `ReleaseAll`, which is queued exactly once (also when closed early).

use std::time::Instant;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tether::execution::ConnectError;
use tether::execution::client::{ClientError, ClientPhase, Command, ReattachCore, RpcError};
use tether::testing::connect::{
    Caller, RpcFault as Fault, client_config as config, numbered_response,
};
use tether::wire::connect::{ExecutePlanRequest, release_execute_request::Release};

mod model_support;

/// Spark's default retry policy: 15 retries per scope (rx §6.3).
const RETRIES: u32 = 15;

fn request() -> ExecutePlanRequest {
    Caller::default().client_request("tether-model")
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        3 => any::<bool>().prop_map(Fault::OpenFails),
        1 => Just(Fault::LostExecute),
        5 => (0usize..4, proptest::option::of(any::<bool>()))
            .prop_map(|(take, error)| Fault::Stream { take, error }),
        1 => (0usize..4).prop_map(|take| Fault::Fatal { take }),
    ]
}

/// How the reference says the client ended.
#[derive(Clone, Debug, PartialEq)]
enum End {
    Complete,
    Fatal,
    /// A retry scope ran out.
    Exhausted,
}

/// The reference: the server's view (registered, responses sent) and the client's retry
/// scope, from rx §6.3 and Spark's retry policy.
#[derive(Clone, Debug)]
struct ClientRef {
    /// Responses of the result; the last is `ResultComplete`.
    n: usize,
    registered: bool,
    /// Responses sent, all of which reach the client: `1..=sent`.
    sent: usize,
    end: Option<End>,
    /// Policy retries since the last delivery.
    scope: u32,
    faults: u64,
}

impl ClientRef {
    fn retry(&mut self) {
        if self.scope == RETRIES {
            self.end = Some(End::Exhausted);
        } else {
            self.scope += 1;
        }
    }

    /// Streams up to `take` responses from the next one; whether `ResultComplete` went out.
    fn stream(&mut self, take: usize) -> bool {
        let until = (self.sent + take).min(self.n);
        if until > self.sent {
            self.scope = 0;
        }
        self.sent = until;
        if self.sent == self.n {
            self.end = Some(End::Complete);
        }
        self.end.is_some()
    }
}

struct ClientReference;

impl ReferenceStateMachine for ClientReference {
    type State = ClientRef;
    type Transition = Fault;

    fn init_state() -> BoxedStrategy<ClientRef> {
        (1usize..40)
            .prop_map(|n| ClientRef {
                n,
                registered: false,
                sent: 0,
                end: None,
                scope: 0,
                faults: 0,
            })
            .boxed()
    }

    fn transitions(_: &ClientRef) -> BoxedStrategy<Fault> {
        fault().boxed()
    }

    fn apply(mut r: ClientRef, f: &Fault) -> ClientRef {
        if r.end.is_some() {
            return r;
        }
        r.faults += 1;
        // The client's RPC is ExecutePlan until the operation is registered (a reattach to
        // an unknown operation bounces back to ExecutePlan at once); either way the fault
        // decides.
        match f {
            Fault::OpenFails(_) => {
                r.registered = true;
                r.retry();
            }
            Fault::LostExecute => r.retry(),
            Fault::Stream { take, error } => {
                r.registered = true;
                if !r.stream(*take) && error.is_some() {
                    r.retry();
                }
            }
            Fault::Fatal { take } => {
                r.registered = true;
                if !r.stream(*take) {
                    r.end = Some(End::Fatal);
                }
            }
        }
        r
    }
}

/// The system under test: the core, its manual clock and the server it talks to.
struct ClientSut {
    core: ReattachCore,
    now: Instant,
    registered: bool,
    sent: usize,
    /// What the core handed out to its caller, in order.
    delivered: Vec<String>,
    executes: u32,
    error: Option<ClientError>,
}

/// Every response of every case of [`client_core_matches_reference_model`].
static CLIENT_DELIVERY: model_support::Tally = model_support::Tally::new();

impl ClientSut {
    /// Runs the core up to its next RPC; `Some(execute?)`, or `None` once it has ended.
    fn next_rpc(&mut self) -> Option<bool> {
        loop {
            match self.core.poll_command() {
                Command::Sleep(until) => {
                    self.now = self.now.max(until);
                    self.core.on_wait_elapsed();
                }
                Command::ExecutePlan(req) => {
                    assert!(
                        !self.registered,
                        "ExecutePlan re-sent for a registered operation"
                    );
                    assert_eq!(req.operation_id.as_deref(), Some(self.core.operation_id()));
                    self.executes += 1;
                    return Some(true);
                }
                Command::ReattachExecute(req) => {
                    let expected = self.delivered.last().cloned();
                    assert_eq!(
                        req.last_response_id, expected,
                        "a reattach names the last delivered response (rx §3.5)"
                    );
                    assert_ne!(req.last_response_id.as_deref(), Some(""), "empty id");
                    if !self.registered {
                        let e = RpcError::from(ConnectError::OperationNotFound {
                            handle: req.operation_id.clone(),
                        });
                        self.core.on_error(e, self.now);
                        continue;
                    }
                    return Some(false);
                }
                Command::Read => panic!("Read with no RPC open"),
                Command::Fail(e) => {
                    self.error = Some(e);
                }
                Command::Done => return None,
            }
        }
    }

    /// Streams up to `take` responses; whether `ResultComplete` went out.
    fn stream(&mut self, execute: bool, take: usize, n: usize) -> bool {
        let op = self.core.operation_id().to_owned();
        let start = if execute { 1 } else { self.sent + 1 };
        let mut i = start;
        while i <= n && i < start + take {
            assert!(matches!(self.core.poll_command(), Command::Read));
            let got = self.core.on_response(numbered_response(i, n, &op));
            let got = got.expect("a valid response is delivered");
            self.delivered.push(got.response_id);
            self.sent = i;
            i += 1;
        }
        self.sent == n
    }

    fn apply(&mut self, f: &Fault, n: usize) {
        let Some(execute) = self.next_rpc() else {
            return;
        };
        match f {
            Fault::OpenFails(d) => {
                if execute {
                    self.registered = true;
                }
                self.core.on_error(Fault::retryable(*d), self.now);
            }
            Fault::LostExecute => self.core.on_error(Fault::retryable(false), self.now),
            Fault::Stream { take, error } => {
                self.registered = true;
                if !self.stream(execute, *take, n) {
                    match error {
                        Some(d) => self.core.on_error(Fault::retryable(*d), self.now),
                        None => self.core.on_stream_end(),
                    }
                }
            }
            Fault::Fatal { take } => {
                self.registered = true;
                if !self.stream(execute, *take, n) {
                    self.core
                        .on_error(RpcError::from(ConnectError::OperationCanceled), self.now);
                }
            }
        }
        // Hand out a final error now, as a driver's next poll would.
        if self.core.phase() == ClientPhase::Failed {
            self.next_rpc();
        }
    }

    fn check(&self, r: &ClientRef) {
        let expected: Vec<String> = (1..=r.sent).map(|i| format!("r{i}")).collect();
        assert_eq!(
            self.delivered, expected,
            "every response once, in order (rx §3)"
        );
        let phase = self.core.phase();
        match r.end {
            None => assert!(
                !matches!(phase, ClientPhase::Complete | ClientPhase::Failed),
                "ended {phase:?}; the reference goes on"
            ),
            Some(End::Complete) => assert_eq!(phase, ClientPhase::Complete),
            Some(End::Fatal) => {
                assert_eq!(phase, ClientPhase::Failed);
                assert!(
                    matches!(&self.error, Some(ClientError::Rpc(_))),
                    "{:?}",
                    self.error
                );
            }
            Some(End::Exhausted) => {
                assert_eq!(phase, ClientPhase::Failed);
                match &self.error {
                    Some(ClientError::RetriesExceeded { retries, .. }) => {
                        assert_eq!(*retries, RETRIES)
                    }
                    other => panic!("expected RetriesExceeded, got {other:?}"),
                }
            }
        }
        assert!(
            self.core.stats().retries <= r.faults,
            "more retries than faults"
        );
        assert_eq!(self.core.stats().delivered, r.sent as u64);
    }
}

struct ClientCoreTest;

impl StateMachineTest for ClientCoreTest {
    type SystemUnderTest = ClientSut;
    type Reference = ClientReference;

    fn init_test(_: &ClientRef) -> ClientSut {
        ClientSut {
            core: ReattachCore::reattachable(request(), &config()).expect("valid request"),
            now: Instant::now(),
            registered: false,
            sent: 0,
            delivered: Vec::new(),
            executes: 0,
            error: None,
        }
    }

    fn apply(mut sut: ClientSut, r: &ClientRef, f: Fault) -> ClientSut {
        sut.apply(&f, r.n);
        sut.check(r);
        sut
    }

    /// The server then serves the rest without faults (unless the client ended): the
    /// result completes; every response crossed once, in order; the releases are right.
    fn teardown(mut sut: ClientSut, mut r: ClientRef) {
        if r.end.is_none() {
            let rest = Fault::Stream {
                take: usize::MAX / 2,
                error: None,
            };
            r = ClientReference::apply(r, &rest);
            sut.apply(&rest, r.n);
            sut.check(&r);
        }
        sut.core.close();
        // Releases (rx §4): ReleaseUntil ids strictly increase and name delivered
        // responses; exactly one ReleaseAll, last.
        let mut release_all = 0;
        let mut last_until = 0usize;
        while let Some(req) = sut.core.poll_release() {
            match req.release {
                Some(Release::ReleaseAll(_)) => release_all += 1,
                Some(Release::ReleaseUntil(u)) => {
                    assert_eq!(release_all, 0, "ReleaseUntil after ReleaseAll");
                    let i: usize = u.response_id[1..].parse().expect("an id of ours");
                    assert!(i > last_until, "ReleaseUntil ids strictly increase");
                    assert!(
                        sut.delivered.contains(&u.response_id),
                        "released undelivered"
                    );
                    last_until = i;
                }
                None => panic!("release without type"),
            }
        }
        assert_eq!(release_all, 1, "exactly one ReleaseAll");
        assert!(sut.executes >= 1);
        // The tally: against the server's 1..=sent (and the whole result when complete).
        let mut seen = std::collections::HashMap::new();
        for id in &sut.delivered {
            *seen.entry(id.clone()).or_insert(0u64) += 1;
        }
        let duplicated = seen.values().map(|c| c - 1).sum();
        let owed = if r.end == Some(End::Complete) {
            r.n
        } else {
            r.sent
        };
        let lost = (1..=owed)
            .filter(|i| !seen.contains_key(&format!("r{i}")))
            .count() as u64;
        CLIENT_DELIVERY.record("responses", sut.delivered.len() as u64, lost, duplicated);
    }
}

#[test]
fn client_core_matches_reference_model() {
    model_support::run::<ClientCoreTest>(
        "rx client (ReattachCore)",
        "responses",
        256,
        1..40,
        &CLIENT_DELIVERY,
    );
}

/// The schedules reach every ending (a generator that never exhausts a retry scope or
/// never fails fatally would leave those rules untested).
#[test]
fn client_schedules_cover_every_ending() {
    let mut seen = std::collections::BTreeSet::new();
    let schedules = model_support::samples(ClientReference::sequential_strategy(1..40), 2048);
    for (initial, faults, _) in schedules {
        let r = faults.iter().fold(initial, ClientReference::apply);
        seen.insert(format!("{:?}", r.end));
    }
    for end in ["None", "Some(Complete)", "Some(Fatal)"] {
        assert!(seen.contains(end), "no schedule ended {end}: {seen:?}");
    }
}
