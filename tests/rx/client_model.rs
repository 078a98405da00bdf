//! Model-based test of the client side of reattachable executions: the sans-IO
//! [`ReattachCore`] (rx §6.3, Spark's `ExecutePlanResponseReattachableIterator` and its retry
//! policy), as a proptest-state-machine test: [`ClientReference`] + [`ClientCoreTest`].
//! Depth: `TETHER_MODEL_CASES` (default 256).
//!
//! The core talks to a `tether_testing::fault::ResultServer` through `tether_testing::fault::FaultyRpc`,
//! and each transition is the [`RpcFault`] that strikes the core's next RPC: refused with a
//! retryable error (after the server saw it, or lost before: an `ExecutePlan` that never
//! registered), a stream broken after `after` responses (the next one lost in flight) that
//! ends gracefully or fails (retryably or fatally), or a delayed call. The test side drives
//! the core through its commands (sleeping through backoffs on a manual clock, which also
//! runs the wrapper's delays; a reattach to an unregistered operation reaches the server
//! unfaulted and bounces with `OPERATION_NOT_FOUND`, as rx §5.5 says) and compares with the
//! reference after every step:
//!
//! - every response is delivered exactly once and in order: the client holds exactly
//!   responses `1..=sent` of the reference (counted: 0 lost, 0 duplicated), and every
//!   response that passed the wrapper was delivered;
//! - each reattach names the last delivered response, never an empty id (rx §3.5);
//!   `ExecutePlan` is re-sent only when the first one never registered (rx §6.3; the server
//!   reports any other);
//! - the client ends `Complete` exactly when `ResultComplete` was delivered, fails exactly
//!   on a fatal error or when a retry scope runs out (after exactly the policy's 15
//!   retries), and never retries more often than faults were injected;
//! - every planned fault fired: the wrapper's refusals, breaks and delays are the
//!   reference's;
//! - the releases: `ReleaseUntil` ids strictly increase, name delivered responses and stop
//!   at `ReleaseAll`, which is queued exactly once (also when closed early).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tether::execution::ConnectError;
use tether::execution::client::{
    ClientError, ClientPhase, Command, ExecutionRpc, ReattachCore, RetryPolicy, RpcError,
};
use tether::time::ManualClock;
use tether::wire::connect::{ExecutePlanRequest, release_execute_request::Release};
use tether_testing::connect::{Caller, client_config as config};
use tether_testing::fault::{FaultyRpc, ResultServer, RpcFault, RpcPlan};

use crate::model_support;

const SESSION: &str = "6f1c3d2e-1111-4222-8333-444455556666";
/// Spark's default retry policy: 15 retries per scope (rx §6.3).
const RETRIES: u32 = 15;

fn request() -> ExecutePlanRequest {
    Caller::new("alice", SESSION).client_request("tether-model")
}

/// What strikes the client's next RPC, in the fault wrapper's terms: a refusal or a break,
/// sometimes after a delay (on the same call: the wrapper delays first).
#[derive(Clone, Debug)]
struct Strike {
    delay: Option<Duration>,
    fault: RpcFault,
}

fn strike() -> impl Strategy<Value = Strike> {
    let retryable = || any::<bool>().prop_map(RpcFault::retryable);
    let fault = prop_oneof![
        3 => retryable().prop_map(|error| RpcFault::Refuse { reached_server: true, error }),
        1 => Just(RpcFault::lost()),
        5 => (0u64..4, proptest::option::of(retryable()))
            .prop_map(|(after, error)| RpcFault::Break { after, error }),
        1 => (0u64..4).prop_map(|after| RpcFault::Break {
            after,
            error: Some(RpcError::from(ConnectError::OperationCanceled)),
        }),
    ];
    let delay = proptest::option::weighted(0.2, (1u64..5_000).prop_map(Duration::from_millis));
    (delay, fault).prop_map(|(delay, fault)| Strike { delay, fault })
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
/// scope, from rx §6.3 and Spark's retry policy, and the faults that must fire.
#[derive(Clone, Debug)]
struct ClientRef {
    /// Responses of the result; the last is `ResultComplete`.
    n: usize,
    registered: bool,
    /// Responses sent that reached the client: `1..=sent`.
    sent: usize,
    end: Option<End>,
    /// Policy retries since the last delivery.
    scope: u32,
    /// Transitions applied before the end.
    faults: u64,
    /// Refusals, breaks and delays the wrapper must have fired.
    refused: u64,
    broken: u64,
    delayed: u64,
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
        let until = self.sent.saturating_add(take).min(self.n);
        if until > self.sent {
            self.scope = 0;
        }
        self.sent = until;
        if self.sent == self.n {
            self.end = Some(End::Complete);
        }
        self.end.is_some()
    }

    /// An error ends the client when the policy does not retry it (rx §6.1).
    fn error(&mut self, error: &RpcError) {
        if RetryPolicy::default_can_retry(error) {
            self.retry();
        } else {
            self.end = Some(End::Fatal);
        }
    }

    /// The rest of the result, unfaulted.
    fn finish(&mut self) {
        if self.end.is_none() {
            self.registered = true;
            self.stream(usize::MAX);
        }
    }
}

struct ClientReference;

impl ReferenceStateMachine for ClientReference {
    type State = ClientRef;
    type Transition = Strike;

    fn init_state() -> BoxedStrategy<ClientRef> {
        (1usize..40)
            .prop_map(|n| ClientRef {
                n,
                registered: false,
                sent: 0,
                end: None,
                scope: 0,
                faults: 0,
                refused: 0,
                broken: 0,
                delayed: 0,
            })
            .boxed()
    }

    fn transitions(_: &ClientRef) -> BoxedStrategy<Strike> {
        strike().boxed()
    }

    fn apply(mut r: ClientRef, strike: &Strike) -> ClientRef {
        if r.end.is_some() {
            return r;
        }
        r.faults += 1;
        if strike.delay.is_some() {
            r.delayed += 1;
        }
        // The faulted RPC is ExecutePlan until the operation is registered (a reattach to an
        // unknown operation bounces back to ExecutePlan at once, unfaulted).
        match &strike.fault {
            RpcFault::Refuse {
                reached_server,
                error,
            } => {
                r.registered |= *reached_server;
                r.refused += 1;
                r.error(error);
            }
            RpcFault::Break { after, error } => {
                r.registered = true;
                if !r.stream(*after as usize) {
                    // The response after the `after`-th was there: the break fired.
                    r.broken += 1;
                    if let Some(e) = error {
                        r.error(e);
                    }
                }
            }
            other => panic!("the model draws no {other:?}"),
        }
        r
    }
}

/// The system under test: the core, the fault wrapper around the server it talks to, and
/// the manual clock of both.
struct ClientSut {
    core: ReattachCore,
    clock: ManualClock,
    server: ResultServer,
    rpc: FaultyRpc<ResultServer>,
    /// What the core handed out to its caller, in order.
    delivered: Vec<String>,
    error: Option<ClientError>,
}

/// The RPC the core asked for.
enum Open {
    Execute(ExecutePlanRequest),
    Reattach(tether::wire::connect::ReattachExecuteRequest),
}

/// Every response of every case of [`client_core_matches_reference_model`].
static CLIENT_DELIVERY: model_support::Tally = model_support::Tally::new();

impl ClientSut {
    /// Runs the core up to its next RPC that a transition strikes, or `None` once it has
    /// ended. A reattach to an operation the server never registered goes through the
    /// wrapper unfaulted and bounces (rx §5.5, §6.3 `call_iter` step 3).
    fn next_rpc(&mut self) -> Option<Open> {
        loop {
            match self.core.poll_command(self.clock.now()) {
                Command::Sleep(until) => {
                    assert_eq!(self.core.poll_timeout(), Some(until));
                    self.clock.set(until);
                    self.core.handle_timeout(until);
                }
                Command::ExecutePlan(req) => {
                    assert_eq!(req.operation_id.as_deref(), Some(self.core.operation_id()));
                    return Some(Open::Execute(req));
                }
                Command::ReattachExecute(req) => {
                    let expected = self.delivered.last().cloned();
                    assert_eq!(
                        req.last_response_id, expected,
                        "a reattach names the last delivered response (rx §3.5)"
                    );
                    assert_ne!(req.last_response_id.as_deref(), Some(""), "empty id");
                    if !self.server.is_registered() {
                        let bounced = self.open(self.rpc.reattach_execute(req), None);
                        let e = bounced
                            .err()
                            .expect("an unregistered operation is not found");
                        assert!(e.is_not_found(), "{e}");
                        self.core.on_error(e, self.clock.now());
                        continue;
                    }
                    return Some(Open::Reattach(req));
                }
                Command::Read => panic!("Read with no RPC open"),
                Command::Fail(e) => {
                    self.error = Some(e);
                }
                Command::Done => return None,
            }
        }
    }

    /// Waits for a call, moving the manual clock through its planned delay.
    fn open<T>(&self, mut call: BoxFuture<'static, T>, delay: Option<Duration>) -> T {
        if let Some(out) = (&mut call).now_or_never() {
            return out;
        }
        let by = delay.expect("only a delayed call waits");
        self.clock.advance(by);
        call.now_or_never().expect("the delay elapsed")
    }

    /// The core's next RPC suffers `strike` (`None`: nothing).
    fn apply(&mut self, strike: Option<&Strike>) {
        let Some(open) = self.next_rpc() else {
            return;
        };
        let delay = strike.and_then(|s| s.delay);
        if let Some(strike) = strike {
            let call = self.rpc.next_call();
            if let Some(by) = strike.delay {
                self.rpc.add(call, RpcFault::Delay { by });
            }
            self.rpc.add(call, strike.fault.clone());
        }
        let call = match open {
            Open::Execute(req) => self.rpc.execute_plan(req),
            Open::Reattach(req) => self.rpc.reattach_execute(req),
        };
        match self.open(call, delay) {
            Err(e) => self.core.on_error(e, self.clock.now()),
            Ok(mut stream) => {
                while self.core.phase() == ClientPhase::Attached {
                    assert!(matches!(
                        self.core.poll_command(self.clock.now()),
                        Command::Read
                    ));
                    let item = stream
                        .next()
                        .now_or_never()
                        .expect("the server never waits");
                    match item {
                        Some(Ok(response)) => {
                            let got = self.core.on_response(response);
                            let got = got.expect("a valid response is delivered");
                            self.delivered.push(got.response_id);
                        }
                        Some(Err(e)) => self.core.on_error(e, self.clock.now()),
                        None => self.core.on_stream_end(),
                    }
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
        let report = self.rpc.counters().report();
        assert_eq!(
            (report.refused, report.broken, report.delayed),
            (r.refused, r.broken, r.delayed),
            "the planned faults fired (refused, broken, delayed)"
        );
        assert_eq!(
            report.responses, r.sent as u64,
            "every passed response delivered"
        );
        assert_eq!(self.server.violations(), Vec::<String>::new());
        assert_eq!(self.server.is_registered(), r.registered);
    }
}

struct ClientCoreTest;

impl StateMachineTest for ClientCoreTest {
    type SystemUnderTest = ClientSut;
    type Reference = ClientReference;

    fn init_test(r: &ClientRef) -> ClientSut {
        let clock = ManualClock::new();
        let server = ResultServer::new(r.n as u64);
        let rpc =
            FaultyRpc::new(server.clone(), RpcPlan::new()).with_timer(Arc::new(clock.clone()));
        ClientSut {
            core: ReattachCore::reattachable(request(), &config()).expect("valid request"),
            clock,
            server,
            rpc,
            delivered: Vec::new(),
            error: None,
        }
    }

    fn apply(mut sut: ClientSut, r: &ClientRef, strike: Strike) -> ClientSut {
        sut.apply(Some(&strike));
        sut.check(r);
        sut
    }

    /// The server then serves the rest without faults (unless the client ended): the
    /// result completes; every response crossed once, in order; the releases are right.
    fn teardown(mut sut: ClientSut, mut r: ClientRef) {
        if r.end.is_none() {
            r.finish();
            sut.apply(None);
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
        assert!(sut.rpc.counters().report().executes >= 1);
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
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..2048 {
        let (initial, faults, _) = ClientReference::sequential_strategy(1..40)
            .new_tree(&mut runner)
            .expect("strategy")
            .current();
        let r = faults.iter().fold(initial, ClientReference::apply);
        seen.insert(format!("{:?}", r.end));
    }
    for end in ["None", "Some(Complete)", "Some(Fatal)"] {
        assert!(seen.contains(end), "no schedule ended {end}: {seen:?}");
    }
}
