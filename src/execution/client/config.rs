//! Settings of a reattaching client stream (rx §6).

use std::sync::Arc;
use std::time::Duration;

use crate::time::Timer;

use super::retry::RetryPolicy;

/// When the stream acknowledges responses with `ReleaseExecute(ReleaseUntil)` (rx §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReleaseMode {
    /// After every delivered response, as Spark's clients do (default). The server may then
    /// free everything up to it; a later reattach resumes after the last delivered id.
    #[default]
    AfterDelivery,
    /// Only when the caller calls
    /// [`ReattachingStream::release_until`](super::ReattachingStream::release_until) with a
    /// [`ResponseId`](super::ResponseId) it received (e.g. once a batch is persisted).
    /// Unreleased responses count against the server's retry budget (10 MiB by default), after
    /// which the server evicts them itself (rx §3.4). `ReleaseAll` is still automatic.
    Manual,
}

/// Settings of a [`ReattachingStream`](super::ReattachingStream) or
/// [`ExecuteStream`](super::ExecuteStream). [`ClientConfig::default`] is the behaviour of
/// Spark's clients (rx §6.1–§6.3) plus tether's bounds, each marked below.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Retry policies, tried in order; the first whose `can_retry` accepts an error decides
    /// (rx §6.1). Default: one [`RetryPolicy::default`] (Spark's `DefaultPolicy`).
    pub retry_policies: Vec<RetryPolicy>,
    /// When `ReleaseUntil` is sent. Default [`ReleaseMode::AfterDelivery`], as Spark's
    /// iterator (rx §6.3 `next()` step 5).
    pub release_mode: ReleaseMode,
    /// Most release RPCs in flight per stream (tether's bound; Spark queues them without
    /// limit, rx §6.3 `release_until`). Beyond it, `ReleaseUntil`s are coalesced into the
    /// newest one, which releases everything the skipped ones would have; `ReleaseAll` is
    /// never held back. Default 4; 0 is treated as 1.
    pub max_releases_in_flight: usize,
    /// Client-side deadline of each `ExecutePlan` / `ReattachExecute` RPC, counted from the
    /// call. It is acted on when the RPC has nothing ready (a stream that keeps delivering
    /// is never cut mid-response): the RPC is dropped and, for a reattachable execution,
    /// the client reattaches at once without consuming a retry (Spark master-2026,
    /// SPARK-56538: 10 min there); for a non-reattachable one the stream fails with
    /// `DEADLINE_EXCEEDED`. `None` (default) disables it; the server's own 2-minute
    /// rotation normally keeps streams short. Needs a [`timer`](Self::timer).
    pub stream_deadline: Option<Duration>,
    /// Most immediate retries (re-executes after `OPERATION_NOT_FOUND`/`SESSION_NOT_FOUND`
    /// with nothing delivered, reattaches after [`stream_deadline`](Self::stream_deadline))
    /// in one retry scope (tether's bound; Spark only bounds its `RetryException` by time,
    /// rx §6.1). Default 100.
    pub max_immediate_retries: u32,
    /// Cumulative time bound on immediate retries in one retry scope, counted from the first
    /// of them; past it the underlying error is returned (Spark master-2026, SPARK-58162).
    /// Default 1 h.
    pub max_immediate_retry_elapsed: Duration,
    /// Most consecutive graceful rotations that deliver nothing before the stream fails with
    /// [`Violation::EndlessRotation`](super::Violation::EndlessRotation). Empty rotations are
    /// normal (a long query produces nothing for minutes while the server rotates every
    /// 2 min), so the default is `None`: unbounded, as in Spark (rx §6.3 step 2b).
    pub max_empty_rotations: Option<u32>,
    /// Seed of the retry jitter (the policies' `jitter`, rx §6.1); `None` (default) seeds
    /// from the OS.
    pub jitter_seed: Option<u64>,
    /// The clock for backoff waits (rx §6.1) and the stream deadline: by default tokio's
    /// ([`TokioTimer`](crate::time::TokioTimer), which honours `tokio::time::pause`; outside
    /// a tokio runtime it never fires, so supply a timer for other executors). On
    /// [`NoTimeouts`](crate::time::NoTimeouts) backoff waits are skipped (retries happen at
    /// once, still bounded by the policy) and `stream_deadline` never fires.
    pub timer: Arc<dyn Timer>,
}

impl ClientConfig {
    /// Spark's client defaults (rx §6.1: one [`RetryPolicy::default`], releases after
    /// delivery, no stream deadline), every wait on `timer`.
    pub fn with_timer(timer: Arc<dyn Timer>) -> Self {
        Self {
            retry_policies: vec![RetryPolicy::default()],
            release_mode: ReleaseMode::AfterDelivery,
            max_releases_in_flight: 4,
            stream_deadline: None,
            max_immediate_retries: 100,
            max_immediate_retry_elapsed: Duration::from_secs(3600),
            max_empty_rotations: None,
            jitter_seed: None,
            timer,
        }
    }
}

/// [`ClientConfig::with_timer`] on tokio's clock (feature `tokio`; rx §6.1).
#[cfg(feature = "tokio")]
impl Default for ClientConfig {
    fn default() -> Self {
        Self::with_timer(Arc::new(crate::time::TokioTimer))
    }
}
