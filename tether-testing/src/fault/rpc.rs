//! Fault injection on the Reattach side: [`FaultyRpc`] wraps any [`ExecutionRpc`] and
//! applies an [`RpcPlan`]; [`ResultServer`] is a small in-memory server to wrap.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt};

use tether::execution::ConnectError;
use tether::execution::client::{ExecutionRpc, RpcError};
use tether::time::Timer;
use tether::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, ReattachExecuteRequest, ReleaseExecuteRequest,
    ReleaseExecuteResponse,
};

use super::SplitMix;

/// What happens to one streaming call (`ExecutePlan` or `ReattachExecute`) of a
/// [`FaultyRpc`]: the failures a reattaching client must survive (rx §6.3) or report
/// (rx §6.1's non-retryable errors).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RpcFault {
    /// The call fails with `error` before any response. With `reached_server` the request
    /// reached the wrapped server first (an `ExecutePlan` registered its operation, rx §5.1)
    /// and only the answer was lost; without it the request never arrived (the case rx §6.3
    /// `call_iter` step 3 recovers from with a new `ExecutePlan`).
    Refuse {
        /// Whether the wrapped server received the request.
        reached_server: bool,
        /// The error the call fails with (a retryable status for a fault the client must
        /// survive, rx §6.1).
        error: RpcError,
    },
    /// The response stream passes `after` responses; the next one the server sends is lost
    /// in flight and the stream ends: gracefully when `error` is `None` (the server's
    /// `onCompleted` without `ResultComplete`, after which the client reattaches, rx §1.3,
    /// §6.3 step 2b), else with `error` (rx §6.3 `call_iter` step 5: the retry policy
    /// decides). A stream that ends by itself before that is passed through untouched and
    /// the fault does not fire.
    Break {
        /// Responses passed before the break.
        after: u64,
        /// `None`: a graceful end; else the error the stream fails with.
        error: Option<RpcError>,
    },
    /// The call is held back for `by` before it reaches the wrapped server, measured on the
    /// wrapper's [`Timer`] (the clock of the client's rx §6.1 backoff).
    Delay {
        /// How long the call is held back.
        by: Duration,
    },
}

impl RpcFault {
    /// A retryable status as Spark's `DefaultPolicy` sees it (rx §6.1): `UNAVAILABLE` when
    /// `disconnected` is false, else `INTERNAL` with `INVALID_CURSOR.DISCONNECTED`.
    pub fn retryable(disconnected: bool) -> RpcError {
        if disconnected {
            RpcError::from(ConnectError::Disconnected)
        } else {
            RpcError::unavailable("injected fault: connection reset")
        }
    }

    /// The call is lost before it reaches the server, with `UNAVAILABLE` (rx §6.3 `call_iter`
    /// step 3: an `ExecutePlan` that never arrived).
    pub fn lost() -> Self {
        Self::Refuse {
            reached_server: false,
            error: Self::retryable(false),
        }
    }
}

/// One fault on one `ReleaseExecute` call of a [`FaultyRpc`] (rx §6.3: releases are
/// fire-and-forget and retried; the server's abandonment of rx §5.3 covers the lost ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseFault {
    /// Whether the wrapped server received (and carried out) the release before the answer
    /// was lost.
    pub reached_server: bool,
    /// The error the call fails with.
    pub error: RpcError,
}

/// The settings of [`RpcPlan::random`]: how many faults over how many calls, how long a
/// stream may run before a break, the longest delay, and whether non-retryable errors may
/// be drawn (rx §6.1).
#[derive(Debug, Clone)]
pub struct RandomRpcFaults {
    /// Call positions are drawn from `0..horizon` (streaming calls and releases alike).
    pub horizon: u64,
    /// At most this many faults; the number is drawn uniformly from `0..=max_faults`.
    pub max_faults: usize,
    /// A [`RpcFault::Break`] passes `0..=max_after` responses.
    pub max_after: u64,
    /// Delays are drawn from `1 ms ..= max_delay`.
    pub max_delay: Duration,
    /// Whether a fault may carry a non-retryable error (`OPERATION_CANCELED`, which ends the
    /// client's stream, rx §6.1); otherwise every error is retryable.
    pub fatal: bool,
}

impl Default for RandomRpcFaults {
    /// 8 calls, up to 3 faults (well under the 15 retries of Spark's `DefaultPolicy`, rx
    /// §6.1, so a client always completes), breaks after up to 4 responses, delays up to
    /// 1 s, retryable errors only.
    fn default() -> Self {
        Self {
            horizon: 8,
            max_faults: 3,
            max_after: 4,
            max_delay: Duration::from_secs(1),
            fatal: false,
        }
    }
}

/// A declarative list of faults for a [`FaultyRpc`], built by hand or drawn from a seed
/// ([`random`](Self::random)): which streaming call (counted from 0 over `ExecutePlan` and
/// `ReattachExecute` together, in call order) suffers which [`RpcFault`], and which
/// `ReleaseExecute` call (counted from 0 on its own) fails. Each fault fires at most once;
/// on one call a delay applies first, then a refusal, else a break (rx §6.3).
///
/// ```
/// use std::time::Duration;
/// use tether_testing::fault::{RpcFault, RpcPlan};
///
/// let plan = RpcPlan::new()
///     .break_after(0, 2, None)
///     .refuse(1, RpcFault::retryable(true))
///     .delay(2, Duration::from_millis(50));
/// assert_eq!(plan.calls().len(), 3);
/// assert!(!plan.is_benign());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RpcPlan {
    calls: Vec<(u64, RpcFault)>,
    releases: Vec<(u64, ReleaseFault)>,
}

impl RpcPlan {
    /// A plan with no fault: every call passes (and is counted; rx §1.1).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `fault` on streaming call `call` (rx §6.3).
    pub fn on_call(mut self, call: u64, fault: RpcFault) -> Self {
        self.calls.push((call, fault));
        self
    }

    /// Streaming call `call` fails with `error` after reaching the server
    /// ([`RpcFault::Refuse`]; rx §6.3 `call_iter` step 5).
    pub fn refuse(self, call: u64, error: RpcError) -> Self {
        self.on_call(
            call,
            RpcFault::Refuse {
                reached_server: true,
                error,
            },
        )
    }

    /// Streaming call `call` is lost before the server ([`RpcFault::lost`]; rx §6.3
    /// `call_iter` step 3).
    pub fn lose(self, call: u64) -> Self {
        self.on_call(call, RpcFault::lost())
    }

    /// Streaming call `call` breaks after `after` responses ([`RpcFault::Break`]; rx §1.3,
    /// §6.3).
    pub fn break_after(self, call: u64, after: u64, error: Option<RpcError>) -> Self {
        self.on_call(call, RpcFault::Break { after, error })
    }

    /// Streaming call `call` is held back for `by` ([`RpcFault::Delay`]; rx §6.1's clock).
    pub fn delay(self, call: u64, by: Duration) -> Self {
        self.on_call(call, RpcFault::Delay { by })
    }

    /// `ReleaseExecute` call `release` fails with `error` without reaching the server
    /// ([`ReleaseFault`]; rx §6.3 `release_until` / `release_all`).
    pub fn fail_release(mut self, release: u64, error: RpcError) -> Self {
        let fault = ReleaseFault {
            reached_server: false,
            error,
        };
        self.releases.push((release, fault));
        self
    }

    /// Adds any [`ReleaseFault`] on `ReleaseExecute` call `release` (rx §1.5).
    pub fn on_release(mut self, release: u64, fault: ReleaseFault) -> Self {
        self.releases.push((release, fault));
        self
    }

    /// The streaming-call faults, in the order they were added (rx §6.3).
    pub fn calls(&self) -> &[(u64, RpcFault)] {
        &self.calls
    }

    /// The release faults, in the order they were added (rx §1.5).
    pub fn releases(&self) -> &[(u64, ReleaseFault)] {
        &self.releases
    }

    /// Whether the plan holds only delays: a client must then deliver the same responses in
    /// the same order as without it (rx §6.4).
    pub fn is_benign(&self) -> bool {
        self.releases.is_empty()
            && self
                .calls
                .iter()
                .all(|(_, f)| matches!(f, RpcFault::Delay { .. }))
    }

    /// A plan drawn from `seed` under `settings` (the same seed, the same plan): refusals
    /// before and after the server, breaks (graceful or with an error), delays and failed
    /// releases, with retryable errors unless `settings.fatal` (rx §6.1, §6.3).
    pub fn random(seed: u64, settings: &RandomRpcFaults) -> Self {
        let mut rng = SplitMix::new(seed);
        let n = rng.below(settings.max_faults as u64 + 1);
        let error = |rng: &mut SplitMix| {
            if settings.fatal && rng.below(4) == 0 {
                RpcError::from(ConnectError::OperationCanceled)
            } else {
                RpcFault::retryable(rng.below(2) == 0)
            }
        };
        let mut plan = Self::new();
        for _ in 0..n {
            let at = rng.below(settings.horizon);
            plan = match rng.below(5) {
                0 => {
                    let reached_server = rng.below(2) == 0;
                    let error = error(&mut rng);
                    plan.on_call(
                        at,
                        RpcFault::Refuse {
                            reached_server,
                            error,
                        },
                    )
                }
                1 | 2 => {
                    let after = rng.below(settings.max_after + 1);
                    let error = (rng.below(3) != 0).then(|| error(&mut rng));
                    plan.break_after(at, after, error)
                }
                3 => {
                    let ms = settings.max_delay.as_millis().max(1) as u64;
                    plan.delay(at, Duration::from_millis(1 + rng.below(ms)))
                }
                _ => {
                    let reached_server = rng.below(2) == 0;
                    let fault = ReleaseFault {
                        reached_server,
                        error: RpcFault::retryable(rng.below(2) == 0),
                    };
                    plan.on_release(at, fault)
                }
            };
        }
        plan
    }
}

/// What a [`FaultyRpc`] did, read through [`RpcCounters::report`]: the calls and responses
/// that passed and every fault that fired, so a test can assert that the rx §6.3 failure it
/// planned really happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpcReport {
    /// `ExecutePlan` calls made through the wrapper (rx §1.2).
    pub executes: u64,
    /// `ReattachExecute` calls made through the wrapper (rx §1.4).
    pub reattaches: u64,
    /// `ReleaseExecute` calls made through the wrapper (rx §1.5).
    pub releases: u64,
    /// Responses passed to the client.
    pub responses: u64,
    /// [`RpcFault::Refuse`]s that fired.
    pub refused: u64,
    /// [`RpcFault::Break`]s that fired (each lost one response in flight).
    pub broken: u64,
    /// [`RpcFault::Delay`]s that elapsed.
    pub delayed: u64,
    /// [`ReleaseFault`]s that fired.
    pub failed_releases: u64,
}

impl RpcReport {
    /// Streaming calls made: `ExecutePlan` and `ReattachExecute` (rx §1.1).
    pub fn calls(&self) -> u64 {
        self.executes + self.reattaches
    }

    /// Faults of every kind that fired, delays included (rx §6.3).
    pub fn fired(&self) -> u64 {
        self.refused + self.broken + self.delayed + self.failed_releases
    }
}

#[derive(Debug, Default)]
struct Counters {
    executes: AtomicU64,
    reattaches: AtomicU64,
    releases: AtomicU64,
    responses: AtomicU64,
    refused: AtomicU64,
    broken: AtomicU64,
    delayed: AtomicU64,
    failed_releases: AtomicU64,
    /// `Some` once [`FaultyRpc::journaled`] turned the journal on.
    journal: Mutex<Option<Vec<RpcEvent>>>,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A cloneable view of a [`FaultyRpc`]'s counters that outlives the wrapper moving into a
/// client (rx §6.2: the iterator owns its stub).
#[derive(Debug, Clone, Default)]
pub struct RpcCounters(Arc<Counters>);

impl RpcCounters {
    /// A snapshot of the counters (see [`RpcReport`]; rx §6.3).
    pub fn report(&self) -> RpcReport {
        let c = &self.0;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RpcReport {
            executes: get(&c.executes),
            reattaches: get(&c.reattaches),
            releases: get(&c.releases),
            responses: get(&c.responses),
            refused: get(&c.refused),
            broken: get(&c.broken),
            delayed: get(&c.delayed),
            failed_releases: get(&c.failed_releases),
        }
    }

    /// What the client sent and received through a [`journaled`](FaultyRpc::journaled)
    /// wrapper, in order; empty when the journal is off (rx §6.3).
    pub fn journal(&self) -> Vec<RpcEvent> {
        self.journal_lock().clone().unwrap_or_default()
    }

    fn journal_lock(&self) -> MutexGuard<'_, Option<Vec<RpcEvent>>> {
        self.0
            .journal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends `event()` when the journal is on (built only then).
    fn record(&self, event: impl FnOnce() -> RpcEvent) {
        if let Some(journal) = self.journal_lock().as_mut() {
            journal.push(event());
        }
    }
}

/// One entry of a [`FaultyRpc`]'s journal ([`RpcCounters::journal`]): the client's side of
/// the conversation, before the faults act on a call and after they act on a response.
/// It shows what no server can see: which response a client last *received* when it
/// reattached (rx §6.3 `call_iter` step 1 names it; a response lost in a
/// [`RpcFault::Break`] left the server but never arrived), and every `ReleaseExecute` it
/// sent, the failed ones too (rx §1.5).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RpcEvent {
    /// The client made this call (recorded when it is made, whatever fault then strikes it;
    /// rx §1.1).
    Sent(Box<ServerCall>),
    /// A response with this `response_id` reached the client (rx §1.3).
    Received(String),
}

/// The plan in progress: faults not yet fired, and the next call positions.
#[derive(Debug, Default)]
struct PlanState {
    calls: Vec<(u64, RpcFault)>,
    releases: Vec<(u64, ReleaseFault)>,
    next_call: u64,
    next_release: u64,
}

/// The faults one streaming call suffers.
#[derive(Debug, Default)]
struct CallFaults {
    delay: Option<Duration>,
    refuse: Option<(bool, RpcError)>,
    brk: Option<(u64, Option<RpcError>)>,
}

/// An [`ExecutionRpc`] that applies an [`RpcPlan`] to the one it wraps: refused calls
/// (before or after the server saw them), response streams broken after the n-th response
/// with that response lost in flight, delayed calls and failed releases, with
/// [`RpcCounters`] to check they fired. A reattaching client over it must still deliver
/// every response exactly once and in order (rx §6.3, §6.4) whenever its retry policy
/// covers the errors (rx §6.1).
///
/// Delays run on the [`Timer`] given to [`with_timer`](Self::with_timer), by default tokio's
/// clock if the wrapper is created inside a tokio runtime, else
/// [`NoTimeouts`](tether::time::NoTimeouts), on which a delay is not applied (and not
/// counted). Faults can also be added while the wrapper is
/// in use ([`add`](Self::add)), which is how a model test strikes the next call.
///
/// A client over a server that rotates nothing still reattaches through a break and a
/// refusal, every response once:
///
/// ```
/// use std::sync::Arc;
/// use futures::StreamExt;
/// use tether::execution::client::{ClientConfig, ReattachingStream};
/// use tether_testing::connect::Caller;
/// use tether_testing::fault::{FaultyRpc, ResultServer, RpcFault, RpcPlan};
///
/// # futures::executor::block_on(async {
/// let server = Arc::new(ResultServer::new(5));
/// let plan = RpcPlan::new()
///     .break_after(0, 2, Some(RpcFault::retryable(false)))
///     .refuse(1, RpcFault::retryable(true));
/// let rpc = FaultyRpc::new(server.clone(), plan);
/// let counters = rpc.counters();
/// let request = Caller::new("alice", "6f1c3d2e-1111-4222-8333-444455556666").plan("p");
/// // No timer: the client's backoff is skipped.
/// let config = ClientConfig::with_timer(Arc::new(tether::time::NoTimeouts));
/// let mut results = ReattachingStream::new(Arc::new(rpc), request, config).unwrap();
/// let mut ids = Vec::new();
/// while let Some(response) = results.next().await {
///     ids.push(response.unwrap().response_id);
/// }
/// assert_eq!(ids, ["r1", "r2", "r3", "r4", "r5"]);
/// let report = counters.report();
/// assert_eq!((report.broken, report.refused, report.executes), (1, 1, 1));
/// assert_eq!(report.reattaches, 2, "one refused, one that finished the result");
/// assert!(server.violations().is_empty());
/// # });
/// ```
pub struct FaultyRpc<R> {
    inner: Arc<R>,
    plan: Arc<Mutex<PlanState>>,
    timer: Arc<dyn Timer>,
    counters: RpcCounters,
}

impl<R> fmt::Debug for FaultyRpc<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyRpc")
            .field("plan", &*self.state())
            .field("report", &self.counters.report())
            .finish_non_exhaustive()
    }
}

impl<R> FaultyRpc<R> {
    /// Wraps `inner`, applying `plan` (rx §6.3's failures on demand); delays run on the
    /// crate's default timer.
    pub fn new(inner: R, plan: RpcPlan) -> Self {
        Self {
            inner: Arc::new(inner),
            plan: Arc::new(Mutex::new(PlanState {
                calls: plan.calls,
                releases: plan.releases,
                next_call: 0,
                next_release: 0,
            })),
            timer: super::ambient_timer(),
            counters: RpcCounters::default(),
        }
    }

    /// Runs delays on `timer` (a [`ManualClock`](tether::time::ManualClock) in a simulation;
    /// the clock of the client's rx §6.1 backoff).
    pub fn with_timer(mut self, timer: Arc<dyn Timer>) -> Self {
        self.timer = timer;
        self
    }

    /// Turns on the journal of [`RpcEvent`]s, read through [`RpcCounters::journal`]: every
    /// call the client makes and every response that reaches it, in order, for tests that
    /// check what a client names in its reattaches and releases (rx §6.3, §6.4). Off by
    /// default, so a long run does not keep every response id.
    pub fn journaled(self) -> Self {
        *self.counters.journal_lock() = Some(Vec::new());
        self
    }

    /// The counters, shared: keep a clone before moving the wrapper into a client (rx §6.2).
    pub fn counters(&self) -> RpcCounters {
        self.counters.clone()
    }

    /// The wrapped implementation (rx §1.1).
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The position the next streaming call will have (rx §6.3): `add(next_call(), fault)`
    /// strikes it.
    pub fn next_call(&self) -> u64 {
        self.state().next_call
    }

    /// Adds `fault` on streaming call `call` while the wrapper is in use; a position already
    /// passed never fires (rx §6.3).
    pub fn add(&self, call: u64, fault: RpcFault) {
        self.state().calls.push((call, fault));
    }

    fn state(&self) -> MutexGuard<'_, PlanState> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the faults of the next streaming call, counting it.
    fn next_faults(&self, execute: bool) -> CallFaults {
        let mut st = self.state();
        let call = st.next_call;
        st.next_call += 1;
        bump(if execute {
            &self.counters.0.executes
        } else {
            &self.counters.0.reattaches
        });
        let mut faults = CallFaults::default();
        let mut kept = Vec::with_capacity(st.calls.len());
        for (at, fault) in st.calls.drain(..) {
            if at != call {
                if at > call {
                    kept.push((at, fault));
                }
                continue;
            }
            match fault {
                RpcFault::Delay { by } if faults.delay.is_none() => faults.delay = Some(by),
                RpcFault::Refuse {
                    reached_server,
                    error,
                } if faults.refuse.is_none() => faults.refuse = Some((reached_server, error)),
                RpcFault::Break { after, error } if faults.brk.is_none() => {
                    faults.brk = Some((after, error))
                }
                // A second fault of a kind on the same call waits for nothing: drop it.
                _ => {}
            }
        }
        st.calls = kept;
        faults
    }

    /// Takes the fault of the next release call, counting it.
    fn next_release_fault(&self) -> Option<ReleaseFault> {
        let mut st = self.state();
        let release = st.next_release;
        st.next_release += 1;
        bump(&self.counters.0.releases);
        let i = st.releases.iter().position(|(at, _)| *at == release)?;
        Some(st.releases.remove(i).1)
    }
}

type ResponseStream = BoxStream<'static, Result<ExecutePlanResponse, RpcError>>;

/// A response stream under a [`RpcFault::Break`] (or none: `after` is `u64::MAX`).
struct Breaking<S> {
    inner: Option<S>,
    left: u64,
    error: Option<RpcError>,
    counters: RpcCounters,
}

impl<R> FaultyRpc<R> {
    /// Applies the delay and refusal of `faults` around `open` (which calls the wrapped
    /// server), then wraps the stream in its break.
    fn call<S>(
        &self,
        faults: CallFaults,
        open: impl FnOnce() -> BoxFuture<'static, Result<S, RpcError>> + Send + 'static,
    ) -> BoxFuture<'static, Result<ResponseStream, RpcError>>
    where
        S: futures::Stream<Item = Result<ExecutePlanResponse, RpcError>> + Send + 'static,
    {
        let timer = self.timer.clone();
        let counters = self.counters.clone();
        Box::pin(async move {
            if let Some(by) = faults.delay.filter(|_| timer.fires()) {
                timer
                    .sleep_until(tether::time::deadline_after(timer.now(), by))
                    .await;
                bump(&counters.0.delayed);
            }
            if let Some((reached_server, error)) = faults.refuse {
                if reached_server {
                    // The server handles the call; its answer is lost (the stream dropped).
                    drop(open().await);
                }
                bump(&counters.0.refused);
                return Err(error);
            }
            let inner = open().await?;
            let (left, error) = faults.brk.unwrap_or((u64::MAX, None));
            let breaking = Breaking {
                inner: Some(inner.boxed()),
                left,
                error,
                counters,
            };
            Ok(breaking.into_stream())
        })
    }
}

impl Breaking<ResponseStream> {
    fn into_stream(self) -> ResponseStream {
        stream::unfold(self, |mut st| async move {
            let inner = st.inner.as_mut()?;
            let item = inner.next().await;
            match item {
                None => None,
                Some(Err(e)) => {
                    st.inner = None;
                    Some((Err(e), st))
                }
                Some(Ok(response)) if st.left == 0 => {
                    // The break: this response is lost in flight.
                    drop(response);
                    st.inner = None;
                    bump(&st.counters.0.broken);
                    let error = st.error.take()?;
                    Some((Err(error), st))
                }
                Some(Ok(response)) => {
                    st.left -= 1;
                    bump(&st.counters.0.responses);
                    let id = &response.response_id;
                    st.counters.record(|| RpcEvent::Received(id.clone()));
                    Some((Ok(response), st))
                }
            }
        })
        .boxed()
    }
}

impl<R: ExecutionRpc> ExecutionRpc for FaultyRpc<R> {
    type Stream = ResponseStream;

    fn execute_plan(
        &self,
        request: ExecutePlanRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
        self.counters
            .record(|| RpcEvent::Sent(Box::new(ServerCall::Execute(request.clone()))));
        let faults = self.next_faults(true);
        let inner = self.inner.clone();
        self.call(faults, move || inner.execute_plan(request))
    }

    fn reattach_execute(
        &self,
        request: ReattachExecuteRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
        self.counters
            .record(|| RpcEvent::Sent(Box::new(ServerCall::Reattach(request.clone()))));
        let faults = self.next_faults(false);
        let inner = self.inner.clone();
        self.call(faults, move || inner.reattach_execute(request))
    }

    fn release_execute(
        &self,
        request: ReleaseExecuteRequest,
    ) -> BoxFuture<'static, Result<ReleaseExecuteResponse, RpcError>> {
        self.counters
            .record(|| RpcEvent::Sent(Box::new(ServerCall::Release(request.clone()))));
        let fault = self.next_release_fault();
        let inner = self.inner.clone();
        let counters = self.counters.clone();
        Box::pin(async move {
            match fault {
                None => inner.release_execute(request).await,
                Some(fault) => {
                    if fault.reached_server {
                        let _ = inner.release_execute(request).await;
                    }
                    bump(&counters.0.failed_releases);
                    Err(fault.error)
                }
            }
        })
    }
}

/// What a [`ResultServer`] was asked, in call order, or what a client sent through a
/// journaled [`FaultyRpc`] ([`RpcEvent::Sent`]) (rx §1.1).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerCall {
    /// `ExecutePlan` (rx §1.2).
    Execute(ExecutePlanRequest),
    /// `ReattachExecute` (rx §1.4).
    Reattach(ReattachExecuteRequest),
    /// `ReleaseExecute` (rx §1.5).
    Release(ReleaseExecuteRequest),
}

/// The server-side session id of every [`ResultServer`] response (rx §1.3).
pub const SERVER_SIDE_SESSION: &str = "0a0b0c0d-0000-4000-8000-00000000abcd";

#[derive(Debug, Default)]
struct ServerState {
    registered: bool,
    /// The highest response the server handed to a stream.
    sent: u64,
    calls: Vec<ServerCall>,
    violations: Vec<String>,
}

/// A small in-memory server of one reattachable execution whose result is `n` responses
/// `r1 … rn`, the last a `ResultComplete`: the thing a [`FaultyRpc`] wraps in tests of a
/// client. It keeps every response (nothing is ever released away), so it answers rx §3.5
/// positioning from any response it sent.
///
/// - `ExecutePlan` registers the operation and streams from `r1` (rx §5.1);
/// - `ReattachExecute` streams from the response after `last_response_id`; an unregistered
///   operation is `INVALID_HANDLE.OPERATION_NOT_FOUND`, an id never sent
///   `INVALID_CURSOR.POSITION_NOT_FOUND` (rx §3.5, §5.5);
/// - `ReleaseExecute` answers with the operation id (rx §1.6);
/// - streams are lazy: a response counts as sent when a stream yields it.
///
/// It records every call and the client-side rule breaks it sees ([`violations`](Self::violations)):
/// an `ExecutePlan` re-sent for a registered operation (rx §6.4), a reattach naming a
/// response never sent or an empty id (rx §3.5, §6.4). Clones share the same execution.
#[derive(Debug, Clone)]
pub struct ResultServer {
    n: u64,
    state: Arc<Mutex<ServerState>>,
}

impl ResultServer {
    /// A server of `n` responses (at least 1: the last is `ResultComplete`; rx §1.3).
    pub fn new(n: u64) -> Self {
        Self {
            n: n.max(1),
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Response `i` of the result for operation `op` (rx §1.3: ids `r1 … rn`).
    pub fn response(&self, i: u64, op: &str) -> ExecutePlanResponse {
        let mut response = if i == self.n {
            ExecutePlanResponse::result_complete()
        } else {
            ExecutePlanResponse::arrow_batch(1, vec![(i % 251) as u8])
        };
        response.response_id = format!("r{i}");
        response.operation_id = op.to_owned();
        response.server_side_session_id = SERVER_SIDE_SESSION.into();
        response
    }

    /// The number of responses of the result (rx §1.3).
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Always false: a result has at least its `ResultComplete` (rx §1.3).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether an `ExecutePlan` reached the server (rx §5.1).
    pub fn is_registered(&self) -> bool {
        self.state().registered
    }

    /// The highest response handed to a stream (rx §3.2), 0 before any.
    pub fn sent(&self) -> u64 {
        self.state().sent
    }

    /// Every call, in order (rx §1.1).
    pub fn calls(&self) -> Vec<ServerCall> {
        self.state().calls.clone()
    }

    /// The client-side rule breaks seen (rx §3.5, §6.4); empty for a correct client.
    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    /// The lazy stream of responses `from..=n`.
    fn stream_from(&self, from: u64, op: String) -> ResponseStream {
        let me = self.clone();
        stream::iter(from..=self.n)
            .map(move |i| {
                let mut st = me.state();
                st.sent = st.sent.max(i);
                drop(st);
                Ok(me.response(i, &op))
            })
            .boxed()
    }

    /// The ids the client may name: those sent (a reattach names the last it received).
    fn position(&self, last: Option<&str>) -> Result<u64, String> {
        let Some(id) = last else { return Ok(1) };
        let sent = self.state().sent;
        match id.strip_prefix('r').and_then(|n| n.parse::<u64>().ok()) {
            Some(i) if (1..=sent).contains(&i) => Ok(i + 1),
            _ => Err(format!(
                "reattach named {id:?}, never sent (sent up to r{sent})"
            )),
        }
    }
}

impl ExecutionRpc for ResultServer {
    type Stream = ResponseStream;

    fn execute_plan(
        &self,
        request: ExecutePlanRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
        let op = request.operation_id.clone().unwrap_or_default();
        {
            let mut st = self.state();
            if st.registered {
                st.violations
                    .push("ExecutePlan re-sent for a registered operation".into());
            }
            st.registered = true;
            st.calls.push(ServerCall::Execute(request));
        }
        let s = self.stream_from(1, op);
        Box::pin(async move { Ok(s) })
    }

    fn reattach_execute(
        &self,
        request: ReattachExecuteRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
        let op = request.operation_id.clone();
        let last = request.last_response_id.clone();
        let registered = {
            let mut st = self.state();
            st.calls.push(ServerCall::Reattach(request));
            st.registered
        };
        if !registered {
            let e = RpcError::from(ConnectError::OperationNotFound { handle: op });
            return Box::pin(async move { Err(e) });
        }
        match self.position(last.as_deref()) {
            Ok(from) => {
                let s = self.stream_from(from, op);
                Box::pin(async move { Ok(s) })
            }
            Err(violation) => {
                self.state().violations.push(violation);
                let e = RpcError::from(ConnectError::PositionNotFound {
                    response_id: last.unwrap_or_default(),
                });
                Box::pin(async move { Err(e) })
            }
        }
    }

    fn release_execute(
        &self,
        request: ReleaseExecuteRequest,
    ) -> BoxFuture<'static, Result<ReleaseExecuteResponse, RpcError>> {
        let response = ReleaseExecuteResponse {
            session_id: request.session_id.clone(),
            operation_id: Some(request.operation_id.clone()),
            ..ReleaseExecuteResponse::default()
        };
        self.state().calls.push(ServerCall::Release(request));
        Box::pin(async move { Ok(response) })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::task::{Context, Poll};

    use futures::FutureExt;

    use super::*;
    use tether::execution::Code;
    use tether::time::ManualClock;

    fn execute() -> ExecutePlanRequest {
        ExecutePlanRequest {
            operation_id: Some("op".into()),
            ..ExecutePlanRequest::default()
        }
    }

    fn reattach(last: Option<&str>) -> ReattachExecuteRequest {
        ReattachExecuteRequest {
            operation_id: "op".into(),
            last_response_id: last.map(str::to_owned),
            ..ReattachExecuteRequest::default()
        }
    }

    /// Every item of a stream that never waits.
    fn items(s: ResponseStream) -> Vec<Result<String, Code>> {
        futures::executor::block_on_stream(s)
            .map(|r| r.map(|r| r.response_id).map_err(|e| e.code()))
            .collect()
    }

    fn ids(ids: &[&str]) -> Vec<Result<String, Code>> {
        ids.iter().map(|s| Ok(s.to_string())).collect()
    }

    #[test]
    fn seeded_plans_repeat_and_vary() {
        let settings = RandomRpcFaults::default();
        assert_eq!(RpcPlan::random(3, &settings), RpcPlan::random(3, &settings));
        let distinct: BTreeSet<String> = (0..64)
            .map(|s| format!("{:?}", RpcPlan::random(s, &settings)))
            .collect();
        assert!(
            distinct.len() > 32,
            "only {} distinct plans",
            distinct.len()
        );
        // Without `fatal` every drawn error is one the default policy retries (rx §6.1).
        let can_retry = tether::execution::client::RetryPolicy::default_can_retry;
        for seed in 0..256 {
            let plan = RpcPlan::random(seed, &settings);
            for (_, fault) in plan.calls() {
                let error = match fault {
                    RpcFault::Refuse { error, .. } => Some(error),
                    RpcFault::Break { error, .. } => error.as_ref(),
                    RpcFault::Delay { .. } => None,
                };
                assert!(error.is_none_or(can_retry), "{fault:?}");
            }
        }
    }

    #[test]
    fn a_break_loses_the_next_response_in_flight_and_counts_once() {
        let server = ResultServer::new(5);
        let rpc = FaultyRpc::new(
            server.clone(),
            RpcPlan::new()
                .break_after(0, 2, None)
                .break_after(1, 0, Some(RpcFault::retryable(true)))
                .break_after(2, 9, None),
        );
        let open = |f: BoxFuture<'static, Result<ResponseStream, RpcError>>| {
            f.now_or_never().expect("ready").expect("opened")
        };
        // Graceful end after r1, r2; r3 left the server and was lost.
        assert_eq!(items(open(rpc.execute_plan(execute()))), ids(&["r1", "r2"]));
        assert_eq!(server.sent(), 3);
        // Broken at once with the retryable status; r3 lost again.
        assert_eq!(
            items(open(rpc.reattach_execute(reattach(Some("r2"))))),
            vec![Err(Code::Internal)]
        );
        // A break past the end never fires: the stream ends with ResultComplete.
        assert_eq!(
            items(open(rpc.reattach_execute(reattach(Some("r2"))))),
            ids(&["r3", "r4", "r5"])
        );
        let report = rpc.counters().report();
        assert_eq!((report.broken, report.responses), (2, 5));
        assert_eq!((report.executes, report.reattaches), (1, 2));
        assert!(server.violations().is_empty());
    }

    #[test]
    fn the_journal_keeps_what_the_client_sent_and_received_not_what_was_lost() {
        let journal = |rpc: &FaultyRpc<ResultServer>| {
            let open = rpc.execute_plan(execute()).now_or_never().expect("ready");
            let got = items(open.expect("opened"));
            let reattach = rpc.reattach_execute(reattach(Some("r1")));
            assert!(reattach.now_or_never().expect("ready").is_err());
            (got, rpc.counters().journal())
        };
        let plan = || RpcPlan::new().break_after(0, 1, None).lose(1);
        // Off by default: the same run records nothing.
        let (got, off) = journal(&FaultyRpc::new(ResultServer::new(3), plan()));
        assert_eq!((got, off), (ids(&["r1"]), vec![]));
        let server = ResultServer::new(3);
        let (got, on) = journal(&FaultyRpc::new(server.clone(), plan()).journaled());
        assert_eq!(got, ids(&["r1"]));
        assert_eq!(server.sent(), 2, "r2 left the server and was lost");
        let ServerCall::Execute(sent) = server.calls().remove(0) else {
            panic!("the server saw the ExecutePlan first");
        };
        assert_eq!(
            on,
            vec![
                RpcEvent::Sent(Box::new(ServerCall::Execute(sent))),
                RpcEvent::Received("r1".into()),
                // The lost reattach never reached the server; the journal still has it.
                RpcEvent::Sent(Box::new(ServerCall::Reattach(reattach(Some("r1"))))),
            ]
        );
        assert_eq!(server.calls().len(), 1);
    }

    #[test]
    fn a_refusal_before_the_server_registers_nothing_after_it_does() {
        let server = ResultServer::new(3);
        let rpc = FaultyRpc::new(
            server.clone(),
            RpcPlan::new().lose(0).refuse(2, RpcFault::retryable(false)),
        );
        let lost = rpc.execute_plan(execute()).now_or_never().expect("ready");
        assert_eq!(lost.err().map(|e| e.code()), Some(Code::Unavailable));
        assert!(!server.is_registered());
        // A reattach to the operation that never arrived: OPERATION_NOT_FOUND (rx §5.5).
        let bounced = rpc
            .reattach_execute(reattach(None))
            .now_or_never()
            .expect("ready");
        assert!(bounced.err().is_some_and(|e| e.is_not_found()));
        let refused = rpc.execute_plan(execute()).now_or_never().expect("ready");
        assert_eq!(refused.err().map(|e| e.code()), Some(Code::Unavailable));
        assert!(server.is_registered(), "the request reached the server");
        assert_eq!(server.sent(), 0, "its stream was dropped unread");
        assert_eq!(rpc.counters().report().refused, 2);
    }

    #[test]
    fn a_failed_release_may_or_may_not_reach_the_server() {
        let server = ResultServer::new(1);
        let after = ReleaseFault {
            reached_server: true,
            error: RpcFault::retryable(false),
        };
        let rpc = FaultyRpc::new(
            server.clone(),
            RpcPlan::new()
                .fail_release(0, RpcFault::retryable(false))
                .on_release(1, after),
        );
        let release = || ReleaseExecuteRequest {
            operation_id: "op".into(),
            ..ReleaseExecuteRequest::default()
        };
        let calls = |s: &ResultServer| s.calls().len();
        assert!(
            rpc.release_execute(release())
                .now_or_never()
                .expect("ready")
                .is_err()
        );
        assert_eq!(calls(&server), 0);
        assert!(
            rpc.release_execute(release())
                .now_or_never()
                .expect("ready")
                .is_err()
        );
        assert_eq!(calls(&server), 1);
        let ok = rpc
            .release_execute(release())
            .now_or_never()
            .expect("ready");
        assert_eq!(ok.expect("passes").operation_id.as_deref(), Some("op"));
        let report = rpc.counters().report();
        assert_eq!((report.releases, report.failed_releases), (3, 2));
    }

    #[test]
    fn a_delay_holds_the_call_back_on_a_manual_clock_and_faults_added_later_fire() {
        let clock = ManualClock::new();
        let server = ResultServer::new(2);
        let rpc = FaultyRpc::new(
            server.clone(),
            RpcPlan::new().delay(0, Duration::from_secs(2)),
        )
        .with_timer(Arc::new(clock.clone()));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut call = rpc.execute_plan(execute());
        assert!(call.as_mut().poll(&mut cx).is_pending());
        clock.advance(Duration::from_secs(1));
        assert!(call.as_mut().poll(&mut cx).is_pending());
        assert!(!server.is_registered(), "held back before the server");
        clock.advance(Duration::from_secs(1));
        let Poll::Ready(Ok(stream)) = call.as_mut().poll(&mut cx) else {
            panic!("the call opens once the delay elapsed");
        };
        assert_eq!(items(stream), ids(&["r1", "r2"]));
        assert_eq!(rpc.counters().report().delayed, 1);
        // A fault added for the next call strikes it; one for a passed call never fires.
        rpc.add(0, RpcFault::lost());
        rpc.add(rpc.next_call(), RpcFault::lost());
        let refused = rpc
            .reattach_execute(reattach(Some("r1")))
            .now_or_never()
            .expect("ready");
        assert!(refused.is_err());
        assert_eq!(rpc.counters().report().refused, 1);
    }

    #[test]
    fn the_server_reports_a_reattach_from_a_response_it_never_sent() {
        let server = ResultServer::new(4);
        let stream = server
            .execute_plan(execute())
            .now_or_never()
            .expect("ready");
        let mut stream = stream.expect("opened");
        assert!(stream.next().now_or_never().is_some());
        let far = server
            .reattach_execute(reattach(Some("r3")))
            .now_or_never()
            .expect("ready");
        assert!(far.is_err());
        let empty = server
            .reattach_execute(reattach(Some("")))
            .now_or_never()
            .expect("ready");
        assert!(empty.is_err());
        assert_eq!(server.violations().len(), 2, "{:?}", server.violations());
        let again = server
            .execute_plan(execute())
            .now_or_never()
            .expect("ready");
        assert!(again.is_ok());
        assert_eq!(server.violations().len(), 3);
    }
}
