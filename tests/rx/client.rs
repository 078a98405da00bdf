//! Client-side reattach scenarios ported from rx §7 (`rx_sNN_…`, numbered as in rx §7:
//! rx §7.1/§7.2 where the client's behaviour is observable, rx §7.5 Python client, §7.6 Scala
//! client, §7.7 third-party clients), run against a scripted fake [`ExecutionRpc`] under a
//! paused tokio clock. Each asserts the exact request sequence (which RPCs, with which
//! `last_response_id` / release ids) and the delivery (exactly once, in order). Two proptests
//! at the end strike random faults through [`FaultyRpc`] around a [`ResultServer`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, FusedStream, StreamExt};
use proptest::prelude::*;
use tether::execution::client::{
    ClientConfig, ClientError, ExecuteStream, ExecutionRpc, ReattachingStream, ReleaseError,
    ReleaseMode, RetryPolicy, RpcError, Violation,
};
use tether::execution::{Code, ConnectError, condition};
use tether::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, ReattachExecuteRequest, ReleaseExecuteRequest,
    ReleaseExecuteResponse, release_execute_request::Release,
};
use tether_testing::connect::{Caller, SESSION_ID, client_config as config};
use tether_testing::fault::{
    FaultyRpc, ResultServer, RpcEvent, RpcFault, RpcPlan, RpcReport,
    SERVER_SIDE_SESSION as SERVER_SESSION, ServerCall,
};
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// The scripted fake
// ---------------------------------------------------------------------------------------------

/// What one RPC's stream does, item by item.
#[derive(Clone, Debug)]
enum Step {
    /// Send this response.
    Resp(ExecutePlanResponse),
    /// Fail the stream with this error.
    Fail(RpcError),
    /// Never send anything again (the RPC hangs).
    Stall,
}

/// One scripted RPC: refused at the call, or a stream of steps (ending gracefully unless the
/// last step fails or stalls).
type Script = Result<Vec<Step>, RpcError>;

/// A request the fake received, in call order.
#[derive(Clone, Debug)]
enum Call {
    Execute(ExecutePlanRequest),
    Reattach(ReattachExecuteRequest),
    Release(ReleaseExecuteRequest),
}

/// The compact view of a [`Call`] the scenarios assert on.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ev {
    /// `ExecutePlan`.
    Execute,
    /// `ReattachExecute(last_response_id)`.
    Reattach(Option<String>),
    /// `ReleaseExecute(ReleaseUntil(id))`.
    Until(String),
    /// `ReleaseExecute(ReleaseAll)`.
    All,
}

fn reattach(last: Option<&str>) -> Ev {
    Ev::Reattach(last.map(str::to_owned))
}

fn until(id: &str) -> Ev {
    Ev::Until(id.to_owned())
}

#[derive(Default)]
struct FakeState {
    executes: VecDeque<Script>,
    reattaches: VecDeque<Script>,
    release_results: VecDeque<Result<(), RpcError>>,
    stall_releases: bool,
    calls: Vec<Call>,
}

/// A scripted Spark Connect server: each `ExecutePlan` / `ReattachExecute` takes the next
/// script of its kind; responses get the request's operation id and [`SERVER_SESSION`]
/// unless the script set them; every request is recorded.
#[derive(Default)]
struct Fake(Mutex<FakeState>);

type RespStream = BoxStream<'static, Result<ExecutePlanResponse, RpcError>>;

impl Fake {
    fn new() -> Arc<Self> {
        Arc::new(Fake::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0.lock().unwrap()
    }

    fn on_execute(self: &Arc<Self>, script: Script) -> Arc<Self> {
        self.lock().executes.push_back(script);
        self.clone()
    }

    fn on_reattach(self: &Arc<Self>, script: Script) -> Arc<Self> {
        self.lock().reattaches.push_back(script);
        self.clone()
    }

    fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    fn events(&self) -> Vec<Ev> {
        self.calls()
            .into_iter()
            .map(|c| match c {
                Call::Execute(_) => Ev::Execute,
                Call::Reattach(r) => Ev::Reattach(r.last_response_id),
                Call::Release(r) => match r.release {
                    Some(Release::ReleaseAll(_)) => Ev::All,
                    Some(Release::ReleaseUntil(u)) => Ev::Until(u.response_id),
                    None => panic!("release without a release type"),
                },
            })
            .collect()
    }

    fn count(&self, ev: impl Fn(&Ev) -> bool) -> usize {
        self.events().iter().filter(|e| ev(e)).count()
    }

    fn open(script: Option<Script>, operation_id: &str) -> Result<RespStream, RpcError> {
        let steps = script.unwrap_or_else(|| {
            Err(RpcError::new(
                Code::FailedPrecondition,
                "fake: no script left for this RPC",
            ))
        })?;
        let op = operation_id.to_owned();
        let stall = matches!(steps.last(), Some(Step::Stall));
        let items: Vec<_> = steps
            .into_iter()
            .filter_map(|s| match s {
                Step::Resp(mut r) => {
                    if r.operation_id.is_empty() {
                        r.operation_id = op.clone();
                    }
                    if r.server_side_session_id.is_empty() {
                        r.server_side_session_id = SERVER_SESSION.into();
                    }
                    Some(Ok(r))
                }
                Step::Fail(e) => Some(Err(e)),
                Step::Stall => None,
            })
            .collect();
        let tail: RespStream = if stall {
            stream::pending().boxed()
        } else {
            stream::empty().boxed()
        };
        Ok(stream::iter(items).chain(tail).boxed())
    }
}

impl ExecutionRpc for Fake {
    type Stream = RespStream;

    fn execute_plan(
        &self,
        request: ExecutePlanRequest,
    ) -> BoxFuture<'static, Result<RespStream, RpcError>> {
        let mut st = self.lock();
        let op = request.operation_id.clone().unwrap_or_default();
        st.calls.push(Call::Execute(request));
        let r = Fake::open(st.executes.pop_front(), &op);
        Box::pin(async move { r })
    }

    fn reattach_execute(
        &self,
        request: ReattachExecuteRequest,
    ) -> BoxFuture<'static, Result<RespStream, RpcError>> {
        let mut st = self.lock();
        let op = request.operation_id.clone();
        st.calls.push(Call::Reattach(request));
        let r = Fake::open(st.reattaches.pop_front(), &op);
        Box::pin(async move { r })
    }

    fn release_execute(
        &self,
        request: ReleaseExecuteRequest,
    ) -> BoxFuture<'static, Result<ReleaseExecuteResponse, RpcError>> {
        let mut st = self.lock();
        let op = request.operation_id.clone();
        st.calls.push(Call::Release(request));
        if st.stall_releases {
            return Box::pin(futures::future::pending());
        }
        let r = st.release_results.pop_front().unwrap_or(Ok(()));
        Box::pin(async move {
            r.map(|()| ReleaseExecuteResponse {
                operation_id: Some(op),
                ..Default::default()
            })
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn r(id: &str) -> Step {
    Step::Resp(ExecutePlanResponse {
        response_id: id.into(),
        ..ExecutePlanResponse::arrow_batch(1, id.as_bytes().to_vec())
    })
}

fn done(id: &str) -> Step {
    Step::Resp(ExecutePlanResponse {
        response_id: id.into(),
        ..ExecutePlanResponse::result_complete()
    })
}

fn fail(e: RpcError) -> Step {
    Step::Fail(e)
}

fn unavailable() -> RpcError {
    RpcError::unavailable("connection reset")
}

fn disconnected() -> RpcError {
    RpcError::from(ConnectError::Disconnected)
}

fn op_not_found() -> RpcError {
    RpcError::from(ConnectError::OperationNotFound {
        handle: "op".into(),
    })
}

fn request() -> ExecutePlanRequest {
    Caller::default().client_request("tether-tests")
}

fn open(fake: &Arc<Fake>) -> ReattachingStream<Fake> {
    ReattachingStream::new(fake.clone(), request(), config()).expect("valid request")
}

/// Drains the stream: the delivered response ids (in order) and the error, if one ended it.
async fn drain<S>(s: &mut S) -> (Vec<String>, Option<ClientError>)
where
    S: futures::Stream<Item = Result<ExecutePlanResponse, ClientError>> + Unpin,
{
    let mut ids = Vec::new();
    while let Some(item) = s.next().await {
        match item {
            Ok(resp) => ids.push(resp.response_id),
            Err(e) => {
                assert!(s.next().await.is_none(), "nothing after the error");
                return (ids, Some(e));
            }
        }
    }
    (ids, None)
}

/// Runs a reattaching stream to its end and closes it (so every release RPC has been made).
async fn run(fake: &Arc<Fake>) -> (Vec<String>, Option<ClientError>) {
    run_with(fake, config()).await
}

async fn run_with(fake: &Arc<Fake>, config: ClientConfig) -> (Vec<String>, Option<ClientError>) {
    let mut s = ReattachingStream::new(fake.clone(), request(), config).expect("valid request");
    let out = drain(&mut s).await;
    s.close().await;
    out
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn operation_ids(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .map(|c| match c {
            Call::Execute(r) => r.operation_id.clone().unwrap_or_default(),
            Call::Reattach(r) => r.operation_id.clone(),
            Call::Release(r) => r.operation_id.clone(),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// rx §7.1 ReattachableExecuteSuite, as seen by the client
// ---------------------------------------------------------------------------------------------

/// rx §7.1 #1: the server rotates the RPC (deadline) mid-result; the client reattaches with the
/// last id and the results continue.
#[tokio::test(start_paused = true)]
async fn rx_s01_rotation_reattaches_transparently() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), r("r2")]))
        .on_reattach(Ok(vec![r("r3"), done("r4")]));
    let (got, err) = run(&fake).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2", "r3", "r4"]));
    assert_eq!(
        fake.events(),
        vec![
            Ev::Execute,
            until("r1"),
            until("r2"),
            reattach(Some("r2")),
            until("r3"),
            Ev::All
        ]
    );
}

/// rx §7.1 #4: the server interrupts the sender (`INVALID_CURSOR.DISCONNECTED`); the next read
/// succeeds through a reattach after the first backoff (50 ms).
#[tokio::test(start_paused = true)]
async fn rx_s04_disconnected_by_interrupt_reattaches_after_backoff() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), fail(disconnected())]))
        .on_reattach(Ok(vec![r("r2"), done("r3")]));
    let start = Instant::now();
    let mut s = open(&fake);
    let (got, err) = drain(&mut s).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2", "r3"]));
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    assert_eq!(s.stats().retries, 1);
    s.close().await;
    assert_eq!(
        fake.events(),
        vec![
            Ev::Execute,
            until("r1"),
            reattach(Some("r1")),
            until("r2"),
            Ev::All
        ]
    );
}

/// rx §7.1 #5: another ReattachExecute preempts the client's RPC; the client reattaches after
/// the last response it returned and continues.
#[tokio::test(start_paused = true)]
async fn rx_s05_preempted_by_other_attach_resumes() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), r("r2"), fail(disconnected())]))
        .on_reattach(Ok(vec![r("r3"), done("r4")]));
    let (got, err) = run(&fake).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2", "r3", "r4"]));
    let reattaches: Vec<_> = fake
        .events()
        .into_iter()
        .filter(|e| matches!(e, Ev::Reattach(_)))
        .collect();
    assert_eq!(reattaches, vec![reattach(Some("r2"))]);
}

/// rx §7.1 #6: the execution was abandoned while detached; the client's reattach fails with
/// `OPERATION_ABANDONED`, which is final (not retried, no re-execute), and it releases all.
#[tokio::test(start_paused = true)]
async fn rx_s06_abandoned_operation_fails() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), fail(disconnected())]))
        .on_reattach(Err(RpcError::from(ConnectError::OperationAbandoned {
            handle: "op".into(),
        })));
    let (got, err) = run(&fake).await;
    assert_eq!(got, ids(&["r1"]));
    let err = err.expect("abandoned is fatal");
    assert!(err.has_condition(condition::INVALID_HANDLE_OPERATION_ABANDONED));
    assert!(matches!(err, ClientError::Rpc(_)));
    assert_eq!(
        fake.events(),
        vec![Ev::Execute, until("r1"), reattach(Some("r1")), Ev::All]
    );
}

/// rx §7.1 #7: after being disconnected, the client reattaches after the last response it
/// returned and gets exactly the following ones (r3, r4, r5), no gap and no repeat.
#[tokio::test(start_paused = true)]
async fn rx_s07_reattach_returns_exactly_the_following_responses() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), r("r2"), fail(disconnected())]))
        .on_reattach(Ok(vec![r("r3"), r("r4"), r("r5"), done("r6")]));
    let (got, err) = run(&fake).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2", "r3", "r4", "r5", "r6"]));
    assert_eq!(
        fake.events(),
        vec![
            Ev::Execute,
            until("r1"),
            until("r2"),
            reattach(Some("r2")),
            until("r3"),
            until("r4"),
            until("r5"),
            Ev::All
        ]
    );
}

/// rx §7.1 #9: `OPERATION_CANCELED` on the stream is final; the client releases all.
#[tokio::test(start_paused = true)]
async fn rx_s09_operation_canceled_is_final() {
    let fake = Fake::new().on_execute(Ok(vec![
        r("r1"),
        fail(RpcError::from(ConnectError::OperationCanceled)),
    ]));
    let (got, err) = run(&fake).await;
    assert_eq!(got, ids(&["r1"]));
    assert!(
        err.expect("canceled")
            .has_condition(condition::OPERATION_CANCELED)
    );
    assert_eq!(fake.events(), vec![Ev::Execute, until("r1"), Ev::All]);
}

/// rx §7.1 #12: a size-limited sender rotates after every response; 200 graceful reattaches,
/// all 201 responses once, in order.
#[tokio::test(start_paused = true)]
async fn rx_s12_many_rotations_by_size() {
    let fake = Fake::new().on_execute(Ok(vec![r("r0")]));
    for i in 1..200 {
        fake.on_reattach(Ok(vec![r(&format!("r{i}"))]));
    }
    fake.on_reattach(Ok(vec![done("r200")]));
    let mut s = open(&fake);
    // A consumer that yields between responses (as one doing real work does), so every
    // spawned ReleaseUntil runs before the next delivery and none is coalesced.
    let mut got = Vec::new();
    while let Some(item) = s.next().await {
        got.push(item.unwrap().response_id);
        tokio::task::yield_now().await;
    }
    let expected: Vec<String> = (0..=200).map(|i| format!("r{i}")).collect();
    assert_eq!(got, expected);
    assert_eq!(s.stats().reattaches, 200);
    assert_eq!(s.stats().retries, 0);
    let stats = s.close().await;
    assert_eq!(stats.coalesced, 0);
    let ev = fake.events();
    // Every reattach names the response delivered just before it.
    let mut last = None;
    for e in &ev {
        match e {
            Ev::Reattach(l) => assert_eq!(l, &last),
            Ev::Until(id) => last = Some(id.clone()),
            _ => {}
        }
    }
    assert_eq!(fake.count(|e| matches!(e, Ev::Until(_))), 200);
    assert_eq!(fake.count(|e| *e == Ev::All), 1);
}

/// rx §7.1 #14: a long query produces nothing for a while; the sender rotates repeatedly with
/// empty streams; the client keeps reattaching (no retries used) until the result.
#[tokio::test(start_paused = true)]
async fn rx_s14_repeated_empty_rotations_then_complete() {
    let fake = Fake::new().on_execute(Ok(vec![]));
    for _ in 0..10 {
        fake.on_reattach(Ok(vec![]));
    }
    fake.on_reattach(Ok(vec![r("r1"), done("r2")]));
    let mut s = open(&fake);
    let (got, err) = drain(&mut s).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2"]));
    assert_eq!(s.stats().empty_rotations, 11);
    assert_eq!(s.stats().retries, 0);
    s.close().await;
    let mut expected = vec![Ev::Execute];
    expected.extend(std::iter::repeat_n(reattach(None), 11));
    expected.extend([until("r1"), Ev::All]);
    assert_eq!(fake.events(), expected);
}

// ---------------------------------------------------------------------------------------------
// rx §7.2 SparkConnectServiceE2ESuite, as seen by the client
// ---------------------------------------------------------------------------------------------

/// rx §7.2 #20 / §7.5 #54: the session is released while the query runs; the RPC is cut
/// (`DISCONNECTED`), the reattach gets `SESSION_CLOSED`: final — `SESSION_CLOSED` is not
/// `SESSION_NOT_FOUND`, so no re-execute even with nothing delivered.
#[tokio::test(start_paused = true)]
async fn rx_s20_session_closed_is_final_without_reexecute() {
    let closed = || RpcError::from(ConnectError::SessionClosed { handle: "s".into() });
    let fake = Fake::new()
        .on_execute(Ok(vec![fail(disconnected())]))
        .on_reattach(Err(closed()));
    let (got, err) = run(&fake).await;
    assert!(got.is_empty());
    assert!(
        err.expect("closed")
            .has_condition(condition::INVALID_HANDLE_SESSION_CLOSED)
    );
    assert_eq!(fake.events(), vec![Ev::Execute, reattach(None), Ev::All]);
}

/// rx §7.2 #28 (client half): a response with another `server_side_session_id` means the server
/// session changed under the client: final, nothing more delivered.
#[tokio::test(start_paused = true)]
async fn rx_s28_server_side_session_change_is_final() {
    let Step::Resp(mut changed) = r("r2") else {
        unreachable!()
    };
    changed.server_side_session_id = "ffffffff-0000-4000-8000-000000000000".into();
    let fake = Fake::new().on_execute(Ok(vec![r("r1"), Step::Resp(changed), done("r3")]));
    let mut s = open(&fake);
    let (got, err) = drain(&mut s).await;
    assert_eq!(got, ids(&["r1"]));
    assert!(matches!(
        err,
        Some(ClientError::SessionChanged { ref expected, .. }) if expected == SERVER_SESSION
    ));
    assert_eq!(s.server_side_session_id(), Some(SERVER_SESSION));
    s.close().await;
    assert_eq!(fake.events(), vec![Ev::Execute, until("r1"), Ev::All]);
}

/// rx §7.2 #30: a lost completion (orphan) — the reattach fails with the server's
/// `IllegalStateException`-style error and the client stops instead of looping.
#[tokio::test(start_paused = true)]
async fn rx_s30_orphan_error_ends_instead_of_looping() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1")]))
        .on_reattach(Err(RpcError::from(ConnectError::Orphaned {
            handle: "op".into(),
        })));
    let (got, err) = run(&fake).await;
    assert_eq!(got, ids(&["r1"]));
    let err = err.expect("orphan");
    let orphaned = ConnectError::Orphaned {
        handle: "op".into(),
    };
    assert!(
        matches!(&err, ClientError::Rpc(e) if e.message() == orphaned.message()),
        "{err}"
    );
    assert_eq!(
        fake.events(),
        vec![Ev::Execute, until("r1"), reattach(Some("r1")), Ev::All]
    );
}

/// rx §7.2 #30, tether's optional bound: a server that rotates forever without producing (an
/// orphan on a pre-4.0 server) is cut off after `max_empty_rotations`.
#[tokio::test(start_paused = true)]
async fn rx_s30_endless_empty_rotations_are_bounded_when_configured() {
    let fake = Fake::new().on_execute(Ok(vec![r("r1")]));
    for _ in 0..10 {
        fake.on_reattach(Ok(vec![]));
    }
    let cfg = ClientConfig {
        max_empty_rotations: Some(3),
        ..config()
    };
    let (got, err) = run_with(&fake, cfg).await;
    assert_eq!(got, ids(&["r1"]));
    assert_eq!(
        err,
        Some(ClientError::Violation(Violation::EndlessRotation {
            count: 4
        }))
    );
    assert_eq!(fake.count(|e| matches!(e, Ev::Reattach(_))), 4);
    assert_eq!(fake.count(|e| *e == Ev::All), 1);
}

// ---------------------------------------------------------------------------------------------
// rx §7.5 Python client
// ---------------------------------------------------------------------------------------------

/// rx §7.5 #46 / §7.7 #73: [r1, complete] → 1 ExecutePlan, 0 reattach, 1 ReleaseUntil(r1),
/// 1 ReleaseAll; the `ResultComplete` response is returned to the caller too.
#[tokio::test(start_paused = true)]
async fn rx_s46_basic_flow() {
    let fake = Fake::new().on_execute(Ok(vec![r("r1"), done("r2")]));
    let (got, err) = run(&fake).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2"]));
    assert_eq!(fake.events(), vec![Ev::Execute, until("r1"), Ev::All]);
}

/// rx §7.5 #47: a non-retryable error after r1 surfaces; 0 reattach, 1 ReleaseUntil,
/// 1 ReleaseAll.
#[tokio::test(start_paused = true)]
async fn rx_s47_non_retryable_error_after_first_response() {
    let fatal = RpcError::new(Code::Internal, "Fatal");
    let fake = Fake::new().on_execute(Ok(vec![r("r1"), fail(fatal.clone())]));
    let (got, err) = run(&fake).await;
    assert_eq!(got, ids(&["r1"]));
    assert_eq!(err, Some(ClientError::Rpc(fatal)));
    assert_eq!(fake.events(), vec![Ev::Execute, until("r1"), Ev::All]);
}

/// rx §7.5 #48: UNAVAILABLE after r1; the reattach stream gives r, r, complete → 1 reattach,
/// 3 ReleaseUntil, 1 ReleaseAll.
#[tokio::test(start_paused = true)]
async fn rx_s48_unavailable_then_reattach_completes() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), fail(unavailable())]))
        .on_reattach(Ok(vec![r("r2"), r("r3"), done("r4")]));
    let (got, err) = run(&fake).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2", "r3", "r4"]));
    assert_eq!(
        fake.events(),
        vec![
            Ev::Execute,
            until("r1"),
            reattach(Some("r1")),
            until("r2"),
            until("r3"),
            Ev::All
        ]
    );
}

/// rx §7.5 #49: UNAVAILABLE after r1, and the reattach stream fails transiently again →
/// 2 reattaches, 3 ReleaseUntil, 1 ReleaseAll.
#[tokio::test(start_paused = true)]
async fn rx_s49_reattach_fails_transiently_then_succeeds() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), fail(unavailable())]))
        .on_reattach(Ok(vec![r("r2"), fail(unavailable())]))
        .on_reattach(Ok(vec![r("r3"), done("r4")]));
    let (got, err) = run(&fake).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2", "r3", "r4"]));
    assert_eq!(
        fake.events(),
        vec![
            Ev::Execute,
            until("r1"),
            reattach(Some("r1")),
            until("r2"),
            reattach(Some("r2")),
            until("r3"),
            Ev::All
        ]
    );
}

/// rx §7.5 #50 (SPARK-48056): the first read fails (UNAVAILABLE, with the not-found condition in
/// the rich status) before any response → the same ExecutePlan is sent again at once (no
/// backoff, no reattach), and the result completes. Both OPERATION_ and SESSION_NOT_FOUND.
#[tokio::test(start_paused = true)]
async fn rx_s50_not_found_before_any_response_reexecutes() {
    for cond in [
        condition::INVALID_HANDLE_OPERATION_NOT_FOUND,
        condition::INVALID_HANDLE_SESSION_NOT_FOUND,
    ] {
        let not_found = RpcError::new(Code::Unavailable, cond).with_condition(cond);
        let fake = Fake::new()
            .on_execute(Ok(vec![fail(not_found)]))
            .on_execute(Ok(vec![done("r1")]));
        let start = Instant::now();
        let (got, err) = run(&fake).await;
        assert_eq!(err, None, "{cond}");
        assert_eq!(got, ids(&["r1"]));
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "re-execute without backoff"
        );
        assert_eq!(fake.events(), vec![Ev::Execute, Ev::Execute, Ev::All]);
        let ops = operation_ids(&fake.calls());
        assert!(ops.iter().all(|o| *o == ops[0]), "same operation id");
    }
}

/// rx §7.5 #51 (SPARK-48056): r1 received, then the reattach says not found →
/// `RESPONSE_ALREADY_RECEIVED`; 1 ExecutePlan, 1 reattach, no re-execute. (The client still
/// released r1 and sends its one ReleaseAll on the error, per rx §6.3.)
#[tokio::test(start_paused = true)]
async fn rx_s51_not_found_after_response_is_response_already_received() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1")]))
        .on_reattach(Err(RpcError::from(ConnectError::SessionNotFound {
            handle: "s".into(),
        })));
    let (got, err) = run(&fake).await;
    assert_eq!(got, ids(&["r1"]));
    let err = err.expect("fatal");
    assert!(err.has_condition(condition::RESPONSE_ALREADY_RECEIVED));
    assert!(matches!(
        err,
        ClientError::ResponseAlreadyReceived { delivered: 1, .. }
    ));
    assert_eq!(
        fake.events(),
        vec![Ev::Execute, until("r1"), reattach(Some("r1")), Ev::All]
    );
}

/// rx §7.5 #52 (SPARK-49458): ReattachExecute (and ReleaseExecute) carry
/// `client_observed_server_side_session_id` only when the initial request had one.
#[tokio::test(start_paused = true)]
async fn rx_s52_observed_server_session_only_when_initial_had_one() {
    for observed in [None, Some(SERVER_SESSION.to_owned())] {
        let fake = Fake::new()
            .on_execute(Ok(vec![r("r1")]))
            .on_reattach(Ok(vec![done("r2")]));
        let req = ExecutePlanRequest {
            client_observed_server_side_session_id: observed.clone(),
            ..request()
        };
        let mut s = ReattachingStream::new(fake.clone(), req, config()).unwrap();
        let (got, err) = drain(&mut s).await;
        assert_eq!((got.len(), err), (2, None));
        s.close().await;
        for call in fake.calls() {
            match call {
                Call::Execute(r) => {
                    assert_eq!(r.client_observed_server_side_session_id, observed)
                }
                Call::Reattach(r) => {
                    assert_eq!(r.client_observed_server_side_session_id, observed)
                }
                Call::Release(r) => {
                    assert_eq!(r.client_observed_server_side_session_id, observed)
                }
            }
        }
    }
}

/// rx §7.5 #53 / §7.6 #61 (SPARK-44721): the default policy rides out ≥ 10 minutes of
/// continuous UNAVAILABLE: 15 retries (16 attempts) then success.
#[tokio::test(start_paused = true)]
async fn rx_s53_default_policy_tolerates_ten_minutes_of_unavailable() {
    let fake = Fake::new().on_execute(Err(unavailable()));
    for _ in 0..14 {
        fake.on_reattach(Err(unavailable()));
    }
    fake.on_reattach(Ok(vec![r("r1"), done("r2")]));
    let start = Instant::now();
    let mut s = open(&fake);
    let (got, err) = drain(&mut s).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2"]));
    assert!(
        start.elapsed() >= Duration::from_secs(600),
        "{:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() <= Duration::from_secs(608 + 10),
        "jitter ≤ 0.5 s × 10"
    );
    assert_eq!(s.stats().retries, 15);
    assert_eq!(s.stats().reattaches, 15);
}

// ---------------------------------------------------------------------------------------------
// rx §7.6 Scala client
// ---------------------------------------------------------------------------------------------

/// rx §7.6 #55 (SPARK-45871): consuming to the end leaves the stream complete: `ResultComplete`
/// returned, then `None`, the stream fused, and the one ReleaseAll sent.
#[tokio::test(start_paused = true)]
async fn rx_s55_full_consumption_completes_the_stream() {
    let fake = Fake::new().on_execute(Ok(vec![r("r1"), done("r2")]));
    let mut s = open(&fake);
    assert_eq!(s.next().await.unwrap().unwrap().response_id, "r1");
    assert!(!s.is_finished());
    let last = s.next().await.unwrap().unwrap();
    assert!(last.is_result_complete());
    assert!(s.is_finished());
    assert!(s.is_terminated());
    assert!(s.next().await.is_none());
    assert!(s.next().await.is_none());
    let stats = s.close().await;
    assert_eq!((stats.until_calls, stats.all_calls), (1, 1));
    assert_eq!(stats.succeeded, 2);
}

/// rx §7.6 #56 (SPARK-48056): the first ExecutePlan call itself fails with `SESSION_NOT_FOUND`
/// (INTERNAL) → the client re-executes and completes.
#[tokio::test(start_paused = true)]
async fn rx_s56_session_not_found_on_first_execute_reexecutes() {
    let fake = Fake::new()
        .on_execute(Err(RpcError::new(
            Code::Internal,
            "[INVALID_HANDLE.SESSION_NOT_FOUND] The handle s is invalid.",
        )))
        .on_execute(Ok(vec![r("r1"), done("r2")]));
    let mut s = open(&fake);
    let (got, err) = drain(&mut s).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2"]));
    assert_eq!(s.stats().reexecutions, 1);
    s.close().await;
    assert_eq!(
        fake.events(),
        vec![Ev::Execute, Ev::Execute, until("r1"), Ev::All]
    );
}

/// rx §7.6 #57: the client generates a UUID v4 operation id and uses it on every request of the
/// execution (reattachable or not); the reattach option is set only on the reattachable form.
#[tokio::test(start_paused = true)]
async fn rx_s57_generated_operation_id_on_every_request() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), fail(unavailable())]))
        .on_reattach(Ok(vec![done("r2")]));
    let mut s = open(&fake);
    let op = s.operation_id().to_owned();
    assert_eq!(uuid::Uuid::parse_str(&op).unwrap().get_version_num(), 4);
    let _ = drain(&mut s).await;
    s.close().await;
    let calls = fake.calls();
    assert_eq!(calls.len(), 4);
    assert!(operation_ids(&calls).iter().all(|o| *o == op));
    let Call::Execute(first) = &calls[0] else {
        panic!("first call is ExecutePlan")
    };
    assert!(first.is_reattachable());

    let plain = Fake::new().on_execute(Ok(vec![r("x1")]));
    let mut p = ExecuteStream::new(plain.clone(), request(), config()).unwrap();
    let _ = drain(&mut p).await;
    let Call::Execute(req) = &plain.calls()[0] else {
        panic!("ExecutePlan")
    };
    let op = req.operation_id.clone().unwrap();
    assert_eq!(uuid::Uuid::parse_str(&op).unwrap().get_version_num(), 4);
    assert!(!req.is_reattachable());
}

/// rx §7.6 #58: a custom operation id is used (canonicalised to lower case, rx §1.9 pitfall)
/// and echoed on every request; one that is not a UUID is refused up front.
#[tokio::test(start_paused = true)]
async fn rx_s58_custom_operation_id() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1")]))
        .on_reattach(Ok(vec![done("r2")]));
    let custom = "ABCDEF01-2345-4678-9ABC-DEF012345678";
    let req = ExecutePlanRequest {
        operation_id: Some(custom.into()),
        ..request()
    };
    let mut s = ReattachingStream::new(fake.clone(), req, config()).unwrap();
    assert_eq!(s.operation_id(), custom.to_lowercase());
    let (_, err) = drain(&mut s).await;
    assert_eq!(err, None);
    s.close().await;
    assert!(
        operation_ids(&fake.calls())
            .iter()
            .all(|o| *o == custom.to_lowercase())
    );

    let bad = ExecutePlanRequest {
        operation_id: Some("op-1".into()),
        ..request()
    };
    let e = ReattachingStream::new(Fake::new(), bad, config()).unwrap_err();
    assert_eq!(e, ClientError::InvalidOperationId("op-1".into()));
    assert!(e.to_string().starts_with("[INVALID_HANDLE.FORMAT]"));
}

/// rx §7.6 #59 (SPARK-56538): the ExecutePlan stalls after r1 past the client's 50 ms RPC
/// deadline → the client drops it and reattaches at once (no retry consumed), gets r2, r3.
#[tokio::test(start_paused = true)]
async fn rx_s59_client_deadline_reattaches() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), Step::Stall]))
        .on_reattach(Ok(vec![r("r2"), done("r3")]));
    let cfg = ClientConfig {
        stream_deadline: Some(Duration::from_millis(50)),
        ..config()
    };
    let start = Instant::now();
    let mut s = ReattachingStream::new(fake.clone(), request(), cfg).unwrap();
    let (got, err) = drain(&mut s).await;
    assert_eq!(err, None);
    assert_eq!(got, ids(&["r1", "r2", "r3"]));
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    assert_eq!(s.stats().retries, 0);
    assert_eq!(s.stats().deadline_reattaches, 1);
    s.close().await;
    assert_eq!(
        fake.events(),
        vec![
            Ev::Execute,
            until("r1"),
            reattach(Some("r1")),
            until("r2"),
            Ev::All
        ]
    );
}

/// rx §7.6 #60 (SPARK-58162): the server never responds; 50 ms deadlines; immediate retries
/// bounded at 200 ms cumulative → the client gives up with the real error
/// (`DEADLINE_EXCEEDED`).
#[tokio::test(start_paused = true)]
async fn rx_s60_immediate_retries_bounded_by_elapsed_time() {
    let fake = Fake::new().on_execute(Ok(vec![Step::Stall]));
    for _ in 0..20 {
        fake.on_reattach(Ok(vec![Step::Stall]));
    }
    let cfg = ClientConfig {
        stream_deadline: Some(Duration::from_millis(50)),
        max_immediate_retry_elapsed: Duration::from_millis(200),
        ..config()
    };
    let start = Instant::now();
    let (got, err) = run_with(&fake, cfg).await;
    assert!(got.is_empty());
    let Some(ClientError::Rpc(e)) = err else {
        panic!("expected the deadline error, got {err:?}")
    };
    assert_eq!(e.code(), Code::DeadlineExceeded);
    // Deadlines fire at 50, 100, 150, 200 and 250 ms. The bound counts from the first
    // immediate retry (50 ms), so the fifth deadline, 200 ms after it, gives up: 4 reattaches.
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    assert_eq!(fake.count(|e| matches!(e, Ev::Reattach(_))), 4);
    assert_eq!(fake.count(|e| *e == Ev::All), 1);
}

/// rx §7.6 #62 (SPARK-44275): retries until success (3 failures, the 4th attempt works);
/// ABORTED is not retried; a policy with `max_retries = 1` makes exactly 2 calls; a policy
/// whose `can_retry` refuses makes 1.
#[tokio::test(start_paused = true)]
async fn rx_s62_retry_until_success_and_limits() {
    // Three failures then success.
    let fake = Fake::new().on_execute(Err(unavailable()));
    fake.on_reattach(Err(unavailable()));
    fake.on_reattach(Err(unavailable()));
    fake.on_reattach(Ok(vec![done("r1")]));
    let (got, err) = run(&fake).await;
    assert_eq!((got, err), (ids(&["r1"]), None));
    assert_eq!(fake.count(|e| matches!(e, Ev::Reattach(None))), 3);

    // ABORTED: not retried.
    let fake = Fake::new().on_execute(Err(RpcError::new(Code::Aborted, "aborted")));
    let (_, err) = run(&fake).await;
    assert_eq!(err.unwrap().rpc_error().unwrap().code(), Code::Aborted);
    assert_eq!(fake.events(), vec![Ev::Execute, Ev::All]);

    // max_retries = 1: two calls, then the retries are exceeded.
    let fake = Fake::new()
        .on_execute(Err(unavailable()))
        .on_reattach(Err(unavailable()));
    let cfg = ClientConfig {
        retry_policies: vec![RetryPolicy {
            max_retries: Some(1),
            ..RetryPolicy::default()
        }],
        ..config()
    };
    let (_, err) = run_with(&fake, cfg).await;
    assert!(matches!(
        err,
        Some(ClientError::RetriesExceeded { retries: 1, .. })
    ));
    assert_eq!(fake.events(), vec![Ev::Execute, reattach(None), Ev::All]);

    // can_retry refuses everything: one call.
    let fake = Fake::new().on_execute(Err(unavailable()));
    let cfg = ClientConfig {
        retry_policies: vec![RetryPolicy {
            can_retry: |_| false,
            ..RetryPolicy::default()
        }],
        ..config()
    };
    let (_, err) = run_with(&fake, cfg).await;
    assert_eq!(err, Some(ClientError::Rpc(unavailable())));
    assert_eq!(fake.events(), vec![Ev::Execute, Ev::All]);
}

/// rx §7.6 #63: two policies (UNAVAILABLE ×2, INTERNAL ×4) tolerate exactly that mix; with two
/// INTERNAL policies only the first is used (its 2 retries ⇒ 3 attempts).
#[tokio::test(start_paused = true)]
async fn rx_s63_first_matching_policy_decides() {
    fn only_unavailable(e: &RpcError) -> bool {
        e.code() == Code::Unavailable
    }
    fn only_internal(e: &RpcError) -> bool {
        e.code() == Code::Internal
    }
    let policy = |n, f: fn(&RpcError) -> bool| RetryPolicy {
        max_retries: Some(n),
        can_retry: f,
        ..RetryPolicy::default()
    };
    let internal = || RpcError::new(Code::Internal, "flaky");

    let fake = Fake::new().on_execute(Err(unavailable()));
    fake.on_reattach(Err(unavailable()));
    for _ in 0..4 {
        fake.on_reattach(Err(internal()));
    }
    fake.on_reattach(Ok(vec![done("r1")]));
    let cfg = ClientConfig {
        retry_policies: vec![policy(2, only_unavailable), policy(4, only_internal)],
        ..config()
    };
    let (got, err) = run_with(&fake, cfg).await;
    assert_eq!((got, err), (ids(&["r1"]), None));

    let fake = Fake::new().on_execute(Err(internal()));
    for _ in 0..5 {
        fake.on_reattach(Err(internal()));
    }
    let cfg = ClientConfig {
        retry_policies: vec![policy(2, only_internal), policy(4, only_internal)],
        ..config()
    };
    let (_, err) = run_with(&fake, cfg).await;
    assert!(matches!(
        err,
        Some(ClientError::RetriesExceeded { retries: 2, .. })
    ));
    assert_eq!(
        fake.count(|e| matches!(e, Ev::Execute | Ev::Reattach(_))),
        3
    );
}

/// rx §7.6 #64: a server `RetryInfo` makes any error retryable and its delay (5 min) overrides
/// `max_backoff`; a 5-day delay is capped at 10 min.
#[tokio::test(start_paused = true)]
async fn rx_s64_server_retry_delay() {
    let busy = |d| RpcError::new(Code::ResourceExhausted, "busy").with_retry_delay(d);
    let fake = Fake::new()
        .on_execute(Err(busy(Duration::from_secs(300))))
        .on_reattach(Err(busy(Duration::from_secs(5 * 86_400))))
        .on_reattach(Ok(vec![done("r1")]));
    let cfg = ClientConfig {
        retry_policies: vec![RetryPolicy {
            jitter: Duration::ZERO,
            ..RetryPolicy::default()
        }],
        ..config()
    };
    let start = Instant::now();
    let (got, err) = run_with(&fake, cfg).await;
    assert_eq!((got, err), (ids(&["r1"]), None));
    assert_eq!(start.elapsed(), Duration::from_secs(300 + 600));
}

/// rx §7.6 #65: DEADLINE_EXCEEDED from the server is not retried: one call, final.
#[tokio::test(start_paused = true)]
async fn rx_s65_deadline_exceeded_not_retried() {
    let fake = Fake::new().on_execute(Err(RpcError::new(Code::DeadlineExceeded, "slow")));
    let (got, err) = run(&fake).await;
    assert!(got.is_empty());
    assert_eq!(
        err.unwrap().rpc_error().unwrap().code(),
        Code::DeadlineExceeded
    );
    assert_eq!(fake.events(), vec![Ev::Execute, Ev::All]);
}

/// rx §7.6 #66: immediate retries (re-executes on not-found with nothing delivered) never use
/// the backoff policy and are bounded; past the bound the underlying error is returned.
#[tokio::test(start_paused = true)]
async fn rx_s66_immediate_retries_bounded_by_count() {
    let fake = Fake::new();
    for _ in 0..10 {
        fake.on_execute(Err(op_not_found()));
    }
    let cfg = ClientConfig {
        max_immediate_retries: 5,
        ..config()
    };
    let start = Instant::now();
    let (got, err) = run_with(&fake, cfg).await;
    assert!(got.is_empty());
    assert_eq!(err, Some(ClientError::Rpc(op_not_found())));
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(fake.count(|e| *e == Ev::Execute), 6);
    assert_eq!(fake.count(|e| *e == Ev::All), 1);
}

/// rx §7.6 #67: a server-streaming call may fail at the call or on the first read; the client
/// treats both the same.
#[tokio::test(start_paused = true)]
async fn rx_s67_failure_at_call_or_first_read_alike() {
    let at_call = Fake::new()
        .on_execute(Err(unavailable()))
        .on_reattach(Ok(vec![done("r1")]));
    let at_read = Fake::new()
        .on_execute(Ok(vec![fail(unavailable())]))
        .on_reattach(Ok(vec![done("r1")]));
    let a = run(&at_call).await;
    let b = run(&at_read).await;
    assert_eq!(a, b);
    assert_eq!(at_call.events(), at_read.events());
    assert_eq!(at_call.events(), vec![Ev::Execute, reattach(None), Ev::All]);
}

// ---------------------------------------------------------------------------------------------
// rx §7.7 third-party clients
// ---------------------------------------------------------------------------------------------

/// rx §7.7 #68: the stream ends before `ResultComplete` → exactly one ReattachExecute with
/// `last_response_id = r1`.
#[tokio::test(start_paused = true)]
async fn rx_s68_end_before_result_complete_reattaches_once() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1")]))
        .on_reattach(Ok(vec![done("r2")]));
    let (got, err) = run(&fake).await;
    assert_eq!((got, err), (ids(&["r1", "r2"]), None));
    assert_eq!(
        fake.events(),
        vec![Ev::Execute, until("r1"), reattach(Some("r1")), Ev::All]
    );
}

/// rx §7.7 #69: the stream ends before any response → the reattach omits `last_response_id`
/// (absent, not empty).
#[tokio::test(start_paused = true)]
async fn rx_s69_end_before_any_response_omits_last_response_id() {
    let fake = Fake::new()
        .on_execute(Ok(vec![]))
        .on_reattach(Ok(vec![r("r1"), done("r2")]));
    let (got, err) = run(&fake).await;
    assert_eq!((got, err), (ids(&["r1", "r2"]), None));
    let Call::Reattach(req) = &fake.calls()[1] else {
        panic!("second call is ReattachExecute")
    };
    assert_eq!(req.last_response_id, None);
}

/// rx §7.7 #70: four consecutive empty rotations, then completion → 5 reattaches, success.
#[tokio::test(start_paused = true)]
async fn rx_s70_four_empty_rotations_then_complete() {
    let fake = Fake::new().on_execute(Ok(vec![r("r1")]));
    for _ in 0..4 {
        fake.on_reattach(Ok(vec![]));
    }
    fake.on_reattach(Ok(vec![done("r2")]));
    let (got, err) = run(&fake).await;
    assert_eq!((got, err), (ids(&["r1", "r2"]), None));
    let mut expected = vec![Ev::Execute, until("r1")];
    expected.extend(std::iter::repeat_n(reattach(Some("r1")), 5));
    expected.push(Ev::All);
    assert_eq!(fake.events(), expected);
}

/// rx §7.7 #71: the consumer stops (its task is cancelled: the stream is dropped) mid-result →
/// the loop stops and the one ReleaseAll is spawned.
#[tokio::test(start_paused = true)]
async fn rx_s71_dropped_stream_stops_and_releases_all() {
    let fake = Fake::new().on_execute(Ok(vec![r("r1"), Step::Stall]));
    let mut s = open(&fake);
    assert_eq!(s.next().await.unwrap().unwrap().response_id, "r1");
    // The consumer is cancelled while waiting for r2.
    let waiting = tokio::time::timeout(Duration::from_secs(1), s.next()).await;
    assert!(waiting.is_err());
    drop(s);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(fake.events(), vec![Ev::Execute, until("r1"), Ev::All]);
}

/// rx §7.7 #72: a non-reattachable execution: EOF is the end; no reattach, no releases.
#[tokio::test(start_paused = true)]
async fn rx_s72_non_reattachable_eof_is_the_end() {
    let fake = Fake::new().on_execute(Ok(vec![
        Step::Resp(ExecutePlanResponse::arrow_batch(1, vec![1])),
        Step::Resp(ExecutePlanResponse::arrow_batch(1, vec![2])),
    ]));
    let mut s = ExecuteStream::new(fake.clone(), request(), config()).unwrap();
    let mut rows = Vec::new();
    while let Some(item) = s.next().await {
        rows.push(item.unwrap());
    }
    assert_eq!(rows.len(), 2);
    assert!(s.is_terminated());
    drop(s);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(fake.events(), vec![Ev::Execute]);
}

/// rx §7.7 #72 (continued), §6.3 "for contrast": the non-reattachable form retries only before
/// the first response (by re-sending ExecutePlan); after one, an error is final.
#[tokio::test(start_paused = true)]
async fn rx_s72_non_reattachable_retries_only_before_first_response() {
    let fake = Fake::new()
        .on_execute(Err(unavailable()))
        .on_execute(Ok(vec![r("x1"), fail(unavailable())]));
    let mut s = ExecuteStream::new(fake.clone(), request(), config()).unwrap();
    let (got, err) = drain(&mut s).await;
    assert_eq!(got, ids(&["x1"]));
    assert_eq!(err, Some(ClientError::Rpc(unavailable())));
    assert_eq!(fake.events(), vec![Ev::Execute, Ev::Execute]);
}

/// rx §7.7 #73: r1 consumed then complete → ReleaseUntil(r1) and ReleaseAll, with the right
/// session, user, operation and client type.
#[tokio::test(start_paused = true)]
async fn rx_s73_release_until_then_release_all() {
    let fake = Fake::new().on_execute(Ok(vec![r("r1"), done("r2")]));
    let mut s = open(&fake);
    let op = s.operation_id().to_owned();
    let _ = drain(&mut s).await;
    s.close().await;
    let releases: Vec<_> = fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Release(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(releases.len(), 2);
    for rel in &releases {
        assert_eq!(rel.session_id, SESSION_ID);
        assert_eq!(rel.user_id(), "alice");
        assert_eq!(rel.operation_id, op);
        assert_eq!(rel.client_type.as_deref(), Some("tether-tests"));
    }
    assert!(matches!(
        &releases[0].release,
        Some(Release::ReleaseUntil(u)) if u.response_id == "r1"
    ));
    assert!(matches!(releases[1].release, Some(Release::ReleaseAll(_))));
}

/// rx §7.7 #74: the reattach says OPERATION_NOT_FOUND with nothing consumed (the first
/// ExecutePlan never arrived) → one ExecutePlan restart with the same operation id.
#[tokio::test(start_paused = true)]
async fn rx_s74_not_found_before_consume_restarts_execute() {
    let fake = Fake::new()
        .on_execute(Err(unavailable()))
        .on_reattach(Err(op_not_found()))
        .on_execute(Ok(vec![r("r1"), done("r2")]));
    let (got, err) = run(&fake).await;
    assert_eq!((got, err), (ids(&["r1", "r2"]), None));
    assert_eq!(
        fake.events(),
        vec![
            Ev::Execute,
            reattach(None),
            Ev::Execute,
            until("r1"),
            Ev::All
        ]
    );
    let ops = operation_ids(&fake.calls());
    assert!(ops.iter().all(|o| *o == ops[0]));
}

/// rx §7.7 #75: the same after r1 was consumed → an error mentioning the duplication; no
/// restart.
#[tokio::test(start_paused = true)]
async fn rx_s75_not_found_after_consume_does_not_restart() {
    let fake = Fake::new()
        .on_execute(Ok(vec![r("r1"), fail(unavailable())]))
        .on_reattach(Err(op_not_found()));
    let (got, err) = run(&fake).await;
    assert_eq!(got, ids(&["r1"]));
    let err = err.unwrap();
    assert!(
        matches!(&err, ClientError::ResponseAlreadyReceived { error, delivered: 1 } if *error == op_not_found()),
        "{err:?}"
    );
    assert!(err.to_string().contains("duplicate"), "{err}");
    assert_eq!(fake.count(|e| *e == Ev::Execute), 1);
    assert_eq!(
        fake.events(),
        vec![Ev::Execute, until("r1"), reattach(Some("r1")), Ev::All]
    );
}

// ---------------------------------------------------------------------------------------------
// tether's own client rules (rx §6.4 invariants and the release lane)
// ---------------------------------------------------------------------------------------------

/// rx §6.4: a response without `response_id` cannot be resumed from; it is refused (never an
/// empty `last_response_id` later).
#[tokio::test(start_paused = true)]
async fn rx_response_without_id_is_a_violation() {
    let fake = Fake::new().on_execute(Ok(vec![
        r("r1"),
        Step::Resp(ExecutePlanResponse::arrow_batch(1, vec![0])),
    ]));
    let (got, err) = run(&fake).await;
    assert_eq!(got, ids(&["r1"]));
    assert_eq!(
        err,
        Some(ClientError::Violation(Violation::MissingResponseId))
    );
    assert_eq!(fake.events(), vec![Ev::Execute, until("r1"), Ev::All]);
}

/// Manual release mode: nothing released automatically but the final ReleaseAll;
/// `release_until` takes only ids this stream delivered.
#[tokio::test(start_paused = true)]
async fn rx_manual_release_takes_only_delivered_ids() {
    let fake = Fake::new().on_execute(Ok(vec![r("r1"), r("r2"), r("r3"), done("r4")]));
    let cfg = ClientConfig {
        release_mode: ReleaseMode::Manual,
        ..config()
    };
    let mut s = ReattachingStream::new(fake.clone(), request(), cfg.clone()).unwrap();
    s.next().await.unwrap().unwrap();
    s.next().await.unwrap().unwrap();
    let r2 = s.last_response_id().unwrap();
    assert_eq!((r2.as_str(), r2.index()), ("r2", 2));
    s.release_until(&r2).unwrap();

    let other_fake = Fake::new().on_execute(Ok(vec![r("o1")]));
    let mut other = ReattachingStream::new(other_fake, request(), cfg).unwrap();
    other.next().await.unwrap().unwrap();
    let foreign = other.last_response_id().unwrap();
    assert!(matches!(
        s.release_until(&foreign),
        Err(ReleaseError::ForeignResponseId { .. })
    ));

    let (rest, err) = drain(&mut s).await;
    assert_eq!((rest, err), (ids(&["r3", "r4"]), None));
    s.close().await;
    assert_eq!(fake.events(), vec![Ev::Execute, until("r2"), Ev::All]);

    // Automatic mode refuses manual releases.
    let auto = Fake::new().on_execute(Ok(vec![r("a1")]));
    let mut a = open(&auto);
    a.next().await.unwrap().unwrap();
    let id = a.last_response_id().unwrap();
    assert_eq!(a.release_until(&id), Err(ReleaseError::AutomaticMode));
}

/// Releases never block delivery, and at most `max_releases_in_flight` run at once: with a
/// server that never answers releases, delivery goes on, the excess ReleaseUntils are folded
/// into the newest, and the ReleaseAll still goes out at once.
#[tokio::test(start_paused = true)]
async fn rx_releases_are_bounded_and_never_block_delivery() {
    let mut steps: Vec<Step> = (1..=10).map(|i| r(&format!("r{i}"))).collect();
    steps.push(done("r11"));
    let fake = Fake::new().on_execute(Ok(steps));
    fake.lock().stall_releases = true;
    let cfg = ClientConfig {
        max_releases_in_flight: 2,
        ..config()
    };
    let mut s = ReattachingStream::new(fake.clone(), request(), cfg).unwrap();
    let (got, err) = drain(&mut s).await;
    assert_eq!(err, None);
    assert_eq!(got.len(), 11);
    let stats = s.release_stats();
    assert_eq!(stats.until_calls, 2);
    assert_eq!(stats.all_calls, 1);
    assert_eq!(stats.coalesced, 7, "r3..r9 folded into r10");
    assert_eq!(
        fake.events(),
        vec![Ev::Execute, until("r1"), until("r2"), Ev::All]
    );
    drop(s);
}

/// Release failures are retried with the policy and, if they persist, only counted: they
/// never fail the stream.
#[tokio::test(start_paused = true)]
async fn rx_release_failures_are_retried_then_ignored() {
    let fake = Fake::new().on_execute(Ok(vec![r("r1"), done("r2")]));
    {
        let mut st = fake.lock();
        st.release_results.push_back(Err(unavailable()));
        st.release_results.push_back(Ok(()));
        st.release_results
            .push_back(Err(RpcError::new(Code::Internal, "boom")));
    }
    let mut s = open(&fake);
    let (got, err) = drain(&mut s).await;
    assert_eq!((got, err), (ids(&["r1", "r2"]), None));
    let stats = s.close().await;
    assert_eq!(stats.until_calls, 2, "ReleaseUntil(r1) retried once");
    assert_eq!(stats.all_calls, 1);
    assert_eq!((stats.succeeded, stats.failed), (1, 1));
    assert_eq!(
        fake.events(),
        vec![Ev::Execute, until("r1"), Ev::All, until("r1")]
    );
}

/// rx §6.3: each wait for a response is its own retry scope — the policy's counter restarts
/// once a response is delivered, so 10 + 10 failures around a delivery are survived with a
/// policy of 10 retries, while 11 in a row are not.
#[tokio::test(start_paused = true)]
async fn rx_retry_scope_restarts_after_each_delivery() {
    let cfg = || ClientConfig {
        retry_policies: vec![RetryPolicy {
            max_retries: Some(10),
            ..RetryPolicy::default()
        }],
        ..config()
    };
    let fake = Fake::new().on_execute(Err(unavailable()));
    for _ in 0..9 {
        fake.on_reattach(Err(unavailable()));
    }
    fake.on_reattach(Ok(vec![r("r1"), fail(unavailable())]));
    for _ in 0..9 {
        fake.on_reattach(Err(unavailable()));
    }
    fake.on_reattach(Ok(vec![done("r2")]));
    let (got, err) = run_with(&fake, cfg()).await;
    assert_eq!((got, err), (ids(&["r1", "r2"]), None));

    let fake = Fake::new().on_execute(Err(unavailable()));
    for _ in 0..10 {
        fake.on_reattach(Err(unavailable()));
    }
    fake.on_reattach(Ok(vec![done("r1")]));
    let (got, err) = run_with(&fake, cfg()).await;
    assert!(got.is_empty());
    assert!(matches!(
        err,
        Some(ClientError::RetriesExceeded { retries: 10, .. })
    ));
}

/// The streams can be moved into spawned tasks.
#[test]
fn rx_streams_are_send() {
    fn assert_send<T: Send + 'static>() {}
    assert_send::<ReattachingStream<Fake>>();
    assert_send::<ExecuteStream<Fake>>();
    assert_send::<ReattachingStream<dyn ExecutionRpc<Stream = RespStream>>>();
}

/// `close` before the end sends the one ReleaseAll and waits for it.
#[tokio::test(start_paused = true)]
async fn rx_close_mid_stream_releases_all_once() {
    let fake = Fake::new().on_execute(Ok(vec![r("r1"), r("r2"), done("r3")]));
    let mut s = open(&fake);
    s.next().await.unwrap().unwrap();
    let stats = s.close().await;
    assert_eq!((stats.until_calls, stats.all_calls), (1, 1));
    assert_eq!(fake.events(), vec![Ev::Execute, until("r1"), Ev::All]);
}

// ---------------------------------------------------------------------------------------------
// Property tests: random faults through FaultyRpc around a ResultServer
// ---------------------------------------------------------------------------------------------

/// The fault that strikes one streaming call (the plans strike consecutive calls from the
/// first): a refusal after the server registered the call, a call lost before the server
/// (an `ExecutePlan` the client must send again, rx §6.3 `call_iter` step 3), a break after
/// up to three responses with the next one lost in flight (gracefully or with a retryable
/// status), or a delay. With `fatal`, one in ten is a break with `OPERATION_CANCELED`,
/// which the client does not retry (rx §6.1).
fn fault(fatal: bool) -> BoxedStrategy<RpcFault> {
    let retryable = || any::<bool>().prop_map(RpcFault::retryable);
    let survivable = prop_oneof![
        retryable().prop_map(|error| RpcFault::Refuse {
            reached_server: true,
            error
        }),
        Just(RpcFault::lost()),
        (0u64..4, proptest::option::of(retryable()))
            .prop_map(|(after, error)| RpcFault::Break { after, error }),
        (1u64..1_000).prop_map(|ms| RpcFault::Delay {
            by: Duration::from_millis(ms)
        }),
    ];
    if !fatal {
        return survivable.boxed();
    }
    let canceled = (0u64..4).prop_map(|after| RpcFault::Break {
        after,
        error: Some(RpcError::from(ConnectError::OperationCanceled)),
    });
    prop_oneof![9 => survivable, 1 => canceled].boxed()
}

/// A failure that costs the client one retry of its policy and delivers nothing: a
/// refusal after the server saw the call, or a stream broken before its first response
/// with a retryable status (rx §6.1; a graceful end would be a rotation, not a retry).
fn one_retry() -> impl Strategy<Value = RpcFault> {
    (any::<bool>(), any::<bool>()).prop_map(|(refuse, disconnected)| {
        let error = RpcFault::retryable(disconnected);
        if refuse {
            RpcFault::Refuse {
                reached_server: true,
                error,
            }
        } else {
            RpcFault::Break {
                after: 0,
                error: Some(error),
            }
        }
    })
}

/// What a client run through a fault plan left: what it delivered and how it ended, its
/// retries, the wrapper's journal and report, and the rule breaks the server saw.
struct Outcome {
    delivered: Vec<String>,
    error: Option<ClientError>,
    retries: u64,
    journal: Vec<RpcEvent>,
    report: RpcReport,
    violations: Vec<String>,
}

/// Runs a reattaching client to its end and closes it, over a [`ResultServer`] of `n`
/// responses behind a journaled [`FaultyRpc`] whose streaming call `i` suffers `faults[i]`.
fn run_faulty(n: u64, faults: Vec<RpcFault>) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let server = ResultServer::new(n);
        let plan = (0..)
            .zip(faults)
            .fold(RpcPlan::new(), |plan, (call, fault)| {
                plan.on_call(call, fault)
            });
        let rpc = FaultyRpc::new(server.clone(), plan).journaled();
        let counters = rpc.counters();
        let mut s = ReattachingStream::new(Arc::new(rpc), request(), config()).unwrap();
        let (delivered, error) = drain(&mut s).await;
        let retries = s.stats().retries;
        s.close().await;
        Outcome {
            delivered,
            error,
            retries,
            journal: counters.journal(),
            report: counters.report(),
            violations: server.violations(),
        }
    })
}

/// `r1 … rn` (rx §1.3).
fn first(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("r{i}")).collect()
}

/// The client's calls as the journal saw them (rx §6.3): every `ReattachExecute` names the
/// last response the client received before it (none before the first, never an empty
/// id), and no `ExecutePlan` follows a received response. The server's view
/// ([`ResultServer::violations`]) adds that no `ExecutePlan` reaches an operation it
/// registered (rx §6.4).
fn check_calls(o: &Outcome) -> Result<(), TestCaseError> {
    let mut received: Option<&str> = None;
    for event in &o.journal {
        match event {
            RpcEvent::Received(id) => received = Some(id),
            RpcEvent::Sent(call) => match call.as_ref() {
                ServerCall::Reattach(r) => {
                    let last = r.last_response_id.as_deref();
                    prop_assert_ne!(last, Some(""), "an empty last_response_id");
                    prop_assert_eq!(
                        last,
                        received,
                        "a reattach names the last response received"
                    );
                }
                ServerCall::Execute(_) => {
                    prop_assert_eq!(received, None, "ExecutePlan after a response arrived");
                }
                _ => {}
            },
            _ => {}
        }
    }
    prop_assert!(o.violations.is_empty(), "{:?}", o.violations);
    Ok(())
}

/// The client's releases (rx §6.3 `release_until` / `release_all`): `ReleaseUntil` ids
/// strictly increase and name delivered responses, none follows the `ReleaseAll`, and there
/// is exactly one `ReleaseAll`.
fn check_releases(o: &Outcome) -> Result<(), TestCaseError> {
    let mut release_all = 0;
    let mut last_until = 0u64;
    for event in &o.journal {
        let RpcEvent::Sent(call) = event else {
            continue;
        };
        let ServerCall::Release(r) = call.as_ref() else {
            continue;
        };
        match &r.release {
            Some(Release::ReleaseAll(_)) => release_all += 1,
            Some(Release::ReleaseUntil(u)) => {
                prop_assert_eq!(release_all, 0, "ReleaseUntil after ReleaseAll");
                let i: u64 = u.response_id[1..].parse().unwrap();
                prop_assert!(i > last_until, "ReleaseUntil ids strictly increase");
                prop_assert!(
                    o.delivered.contains(&u.response_id),
                    "released {} was delivered",
                    u.response_id
                );
                last_until = i;
            }
            None => prop_assert!(false, "release without type"),
        }
    }
    prop_assert_eq!(release_all, 1, "exactly one ReleaseAll");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(tether_testing::model_cases(256)))]

    /// Retryable faults only (at most 12, fewer than the 15 retries of a scope): every
    /// response is delivered exactly once and in order and crossed the wire once, each
    /// reattach names the last response received (never empty), ExecutePlan is re-sent
    /// only when the first never arrived, exactly one ReleaseAll, and the retries stay
    /// within the refusals and breaks that fired.
    #[test]
    fn rx_prop_random_cuts_deliver_exactly_once_in_order(
        n in 1usize..40,
        faults in proptest::collection::vec(fault(false), 0..12),
    ) {
        let o = run_faulty(n as u64, faults);
        check_calls(&o)?;
        prop_assert_eq!(o.error.as_ref(), None);
        prop_assert_eq!(&o.delivered, &first(n));
        prop_assert_eq!(o.report.responses, n as u64, "each response crossed the wire once");
        check_releases(&o)?;
        prop_assert!(o.retries <= o.report.refused + o.report.broken, "{:?}", o.report);
    }

    /// With fatal errors mixed in, the stream may end in error, but what it delivered is a
    /// prefix of the result, in order, without duplicates, and exactly one ReleaseAll is
    /// sent either way; the error is the injected `OPERATION_CANCELED` or a retry scope
    /// that ran out after exactly the policy's 15 retries.
    #[test]
    fn rx_prop_fatal_errors_keep_delivery_a_prefix(
        n in 1usize..30,
        faults in proptest::collection::vec(fault(true), 0..20),
    ) {
        let o = run_faulty(n as u64, faults);
        check_calls(&o)?;
        prop_assert_eq!(&o.delivered, &first(o.delivered.len()));
        prop_assert_eq!(o.report.responses, o.delivered.len() as u64);
        match &o.error {
            None => prop_assert_eq!(o.delivered.len(), n),
            Some(ClientError::RetriesExceeded { retries, .. }) => prop_assert_eq!(*retries, 15),
            Some(e) => prop_assert!(e.has_condition(condition::OPERATION_CANCELED), "{e:?}"),
        }
        check_releases(&o)?;
        prop_assert!(o.retries <= o.report.refused + o.report.broken, "{:?}", o.report);
    }

    /// Spark's default policy allows 15 retries in one scope (rx §6.1, §6.3): after a run of
    /// up to 15 failures before any response the client still delivers `r1 … rn`, one retry
    /// per failure; a 16th ends the stream with `RetriesExceeded` after exactly 15 retries,
    /// nothing delivered, and the one ReleaseAll still sent.
    #[test]
    fn rx_prop_a_retry_scope_ends_after_exactly_15_retries(
        n in 1usize..8,
        failures in proptest::collection::vec(one_retry(), 0..24),
    ) {
        let k = failures.len() as u64;
        let o = run_faulty(n as u64, failures);
        check_calls(&o)?;
        check_releases(&o)?;
        if k <= 15 {
            prop_assert_eq!(o.error.as_ref(), None);
            prop_assert_eq!(&o.delivered, &first(n));
            prop_assert_eq!(o.retries, k);
        } else {
            let retries = match &o.error {
                Some(ClientError::RetriesExceeded { retries, .. }) => Some(*retries),
                _ => None,
            };
            prop_assert_eq!(retries, Some(15), "{:?}", o.error);
            prop_assert!(o.delivered.is_empty());
            prop_assert_eq!(o.report.calls(), 16, "the first call and 15 retries");
        }
    }
}
