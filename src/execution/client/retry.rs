//! Spark Connect's client retry policies as pure values (rx §6.1).
//!
//! A [`RetryPolicy`] says which errors it retries and how long to wait; a [`Retrying`] is one
//! retry scope over a list of policies (Spark's `Retrying`): the first policy whose
//! `can_retry` accepts an error is the one whose counter and backoff advance, and when it is
//! used up the error is final. Nothing here sleeps or reads a clock, and the random jitter
//! comes in as a number, so every decision can be tested exactly; the
//! [driver](super::ReattachingStream) sleeps on its [`Timer`](crate::time::Timer).

use std::sync::Arc;
use std::time::Duration;

use super::error::RpcError;
use crate::execution::Code;
use crate::execution::condition;

/// One retry policy (Spark's `RetryPolicy`, in Scala's `org.apache.spark.sql.connect.client`
/// and PySpark's `retries.py`; rx §6.1). [`RetryPolicy::default`] is Spark's
/// `DefaultPolicy`, identical in the Scala and Python clients.
///
/// The wait before retry *n* (1-based) is `initial_backoff × backoff_multiplier^(n-1)`,
/// capped at `max_backoff`; when the error carries `RetryInfo` and
/// `recognize_server_retry_delay` is set, the wait is at least that delay (itself capped at
/// `max_server_retry_delay`, and allowed to exceed `max_backoff`); finally, a wait of at least
/// `min_jitter_threshold` gets a uniform random `[0, jitter]` added. Waits are truncated to
/// whole milliseconds, as Spark does (`RetryPolicyState.next_attempt`).
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Retries allowed in one scope (not counting the first attempt); `None` is unbounded.
    /// Default 15 (`max_retries`, rx §6.1).
    pub max_retries: Option<u32>,
    /// The first wait. Default 50 ms (`initial_backoff`, rx §6.1).
    pub initial_backoff: Duration,
    /// The largest backoff wait; `None` keeps the wait at `initial_backoff` forever (Spark's
    /// Python quirk, rx §6.1). Default 60 s.
    pub max_backoff: Option<Duration>,
    /// Factor between consecutive waits. Default 4.0 (`backoff_multiplier`, rx §6.1).
    pub backoff_multiplier: f64,
    /// Upper bound of the uniform random jitter added to long waits. Default 500 ms
    /// (`jitter`, rx §6.1).
    pub jitter: Duration,
    /// Jitter is only added to waits of at least this long. Default 2 s
    /// (`min_jitter_threshold`, rx §6.1).
    pub min_jitter_threshold: Duration,
    /// Whether a server `RetryInfo.retry_delay` raises the wait (4.1+). Default `true`
    /// (`recognize_server_retry_delay`, rx §6.1).
    pub recognize_server_retry_delay: bool,
    /// Cap on a server-supplied retry delay; `None` is uncapped. Default 10 min
    /// (`max_server_retry_delay`, rx §6.1).
    pub max_server_retry_delay: Option<Duration>,
    /// Which errors this policy retries. Default [`RetryPolicy::default_can_retry`]
    /// (`DefaultPolicy.can_retry`, rx §6.1).
    pub can_retry: fn(&RpcError) -> bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: Some(15),
            initial_backoff: Duration::from_millis(50),
            max_backoff: Some(Duration::from_secs(60)),
            backoff_multiplier: 4.0,
            jitter: Duration::from_millis(500),
            min_jitter_threshold: Duration::from_secs(2),
            recognize_server_retry_delay: true,
            max_server_retry_delay: Some(Duration::from_secs(600)),
            can_retry: Self::default_can_retry,
        }
    }
}

impl RetryPolicy {
    /// Spark's `DefaultPolicy` (same as [`Default`]; rx §6.1): 15 retries, 50 ms × 4 capped
    /// at 60 s, up to 500 ms jitter on waits ≥ 2 s; base waits 50, 200, 800, 3 200, 12 800,
    /// 51 200, then 60 000 ms ×9 — about 608 s, so at least 10 minutes of outage are
    /// survived.
    pub fn spark_default() -> Self {
        Self::default()
    }

    /// `DefaultPolicy.can_retry` (rx §6.1): `UNAVAILABLE`; `INTERNAL` whose message carries
    /// `INVALID_CURSOR.DISCONNECTED` (SPARK-44835); any error with a server `RetryInfo`
    /// (4.1+). Everything else — `DEADLINE_EXCEEDED` explicitly included — is not retried.
    pub fn default_can_retry(error: &RpcError) -> bool {
        match error.code() {
            Code::Unavailable => true,
            Code::Internal if error.has_condition(condition::INVALID_CURSOR_DISCONNECTED) => true,
            _ => error.retry_delay().is_some(),
        }
    }

    /// The base waits (before server delays and jitter) this policy would use, in order: one
    /// per allowed retry, or an endless iterator when `max_retries` is `None` (rx §6.1,
    /// "Base wait sequence").
    pub fn base_waits(&self) -> impl Iterator<Item = Duration> + '_ {
        let mut state = PolicyState::new(self);
        std::iter::from_fn(move || state.next_wait(self, None, 0.0))
    }
}

/// The per-scope state of one policy (Spark's `RetryPolicyState`).
#[derive(Debug, Clone, PartialEq)]
struct PolicyState {
    attempt: u32,
    /// The next base wait, in (fractional) milliseconds.
    next_wait_ms: f64,
}

impl PolicyState {
    fn new(policy: &RetryPolicy) -> Self {
        Self {
            attempt: 0,
            next_wait_ms: millis(policy.initial_backoff),
        }
    }

    /// The wait before the next attempt, or `None` when this policy allows no more.
    /// `unit` is a uniform random number in `[0, 1)` for the jitter.
    fn next_wait(
        &mut self,
        policy: &RetryPolicy,
        error: Option<&RpcError>,
        unit: f64,
    ) -> Option<Duration> {
        if policy.max_retries.is_some_and(|max| self.attempt >= max) {
            return None;
        }
        self.attempt += 1;
        let mut wait_ms = self.next_wait_ms;
        // The next base wait is computed before any server delay or jitter is applied.
        if let Some(max) = policy.max_backoff {
            self.next_wait_ms = millis(max).min(wait_ms * policy.backoff_multiplier);
        }
        if policy.recognize_server_retry_delay
            && let Some(delay) = error.and_then(RpcError::retry_delay)
        {
            let delay = policy
                .max_server_retry_delay
                .map_or(delay, |cap| delay.min(cap));
            wait_ms = wait_ms.max(millis(delay));
        }
        if wait_ms >= millis(policy.min_jitter_threshold) {
            wait_ms += unit.clamp(0.0, 1.0) * millis(policy.jitter);
        }
        Some(Duration::from_millis(wait_ms.max(0.0) as u64))
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What a [`Retrying`] scope decides about an error (Spark's `Retrying._wait`: sleep and
/// retry, pass a non-retryable error through, or give up, rx §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Retry after waiting this long.
    Retry(Duration),
    /// No policy retries this error: it is final.
    NotRetryable,
    /// The first policy that accepts this error has no retries left: it is final.
    Exhausted,
}

/// One retry scope over an ordered list of policies (Spark's `Retrying`, rx §6.1).
///
/// The reattaching client opens a new scope for every response it waits for: the counters
/// restart once a response is delivered (rx §6.3, "inside one retry scope").
#[derive(Debug, Clone)]
pub struct Retrying {
    policies: Arc<[RetryPolicy]>,
    states: Vec<PolicyState>,
    retries: u32,
}

impl Retrying {
    /// A fresh scope over `policies` (tried in order; an empty list retries nothing), as
    /// Spark's `Retrying(policies)` (rx §6.1).
    pub fn new(policies: Arc<[RetryPolicy]>) -> Self {
        let states = policies.iter().map(PolicyState::new).collect();
        Self {
            policies,
            states,
            retries: 0,
        }
    }

    /// Restarts every policy's counter and backoff (a new scope, rx §6.3: one per wait for a
    /// response).
    pub fn reset(&mut self) {
        self.states = self.policies.iter().map(PolicyState::new).collect();
        self.retries = 0;
    }

    /// Retries granted in this scope so far (across its policies, rx §6.1).
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Decides about `error`: the first policy whose `can_retry` accepts it advances and gives
    /// the wait; later policies are not consulted even when it is used up (newest Spark
    /// behaviour, rx §6.1). `unit` is a uniform random number in `[0, 1)` for the jitter.
    pub fn on_error(&mut self, error: &RpcError, unit: f64) -> RetryDecision {
        let Some(i) = self.policies.iter().position(|p| (p.can_retry)(error)) else {
            return RetryDecision::NotRetryable;
        };
        match self.states[i].next_wait(&self.policies[i], Some(error), unit) {
            Some(wait) => {
                self.retries += 1;
                RetryDecision::Retry(wait)
            }
            None => RetryDecision::Exhausted,
        }
    }
}

/// A small deterministic random source (SplitMix64) for the retry jitter of rx §6.1: seeded
/// from the OS (via a v4 UUID) by default, or from a fixed seed for reproducible tests.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// A source seeded with `seed`, or from the OS when `None` (rx §6.1 jitter).
    pub fn new(seed: Option<u64>) -> Self {
        Self(seed.unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0))
    }

    /// The next 64 random bits (SplitMix64; the rx §6.1 jitter's source).
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in `[0, 1)` (the rx §6.1 jitter's factor).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn default_policy_base_waits() {
        let waits: Vec<u64> = RetryPolicy::default()
            .base_waits()
            .map(|d| d.as_millis() as u64)
            .collect();
        let mut expected = vec![50, 200, 800, 3_200, 12_800, 51_200];
        expected.extend([60_000; 9]);
        assert_eq!(waits, expected);
        // rx §6.1 / §7.5 #53, §7.6 #61: at least 10 minutes of outage tolerated.
        assert!(waits.iter().sum::<u64>() >= 600_000);
    }

    #[test]
    fn jitter_only_at_or_above_threshold() {
        let mut r = Retrying::new(Arc::from(vec![RetryPolicy::default()]));
        let e = RpcError::unavailable("down");
        // Unit 0.999…: 50, 200, 800 stay exact (below 2 s), 3 200 gets ≈ +499 ms.
        let waits: Vec<Duration> = (0..4)
            .map(|_| match r.on_error(&e, 0.999) {
                RetryDecision::Retry(d) => d,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(&waits[..3], &[ms(50), ms(200), ms(800)]);
        assert_eq!(waits[3], ms(3_699));
    }

    #[test]
    fn fifteen_retries_then_exhausted() {
        let mut r = Retrying::new(Arc::from(vec![RetryPolicy::default()]));
        let e = RpcError::unavailable("down");
        for _ in 0..15 {
            assert!(matches!(r.on_error(&e, 0.0), RetryDecision::Retry(_)));
        }
        assert_eq!(r.on_error(&e, 0.0), RetryDecision::Exhausted);
        assert_eq!(r.retries(), 15);
        r.reset();
        assert_eq!(r.on_error(&e, 0.0), RetryDecision::Retry(ms(50)));
    }

    #[test]
    fn default_can_retry_set() {
        let can = RetryPolicy::default_can_retry;
        assert!(can(&RpcError::unavailable("x")));
        assert!(can(&RpcError::spark(
            Code::Internal,
            condition::INVALID_CURSOR_DISCONNECTED,
            "preempted"
        )));
        // DISCONNECTED only counts on INTERNAL, as in Spark.
        assert!(!can(&RpcError::spark(
            Code::Unknown,
            condition::INVALID_CURSOR_DISCONNECTED,
            "x"
        )));
        assert!(!can(&RpcError::new(Code::DeadlineExceeded, "slow")));
        assert!(!can(&RpcError::new(Code::Aborted, "x")));
        assert!(!can(&RpcError::spark(
            Code::Internal,
            condition::OPERATION_CANCELED,
            "x"
        )));
        assert!(can(
            &RpcError::new(Code::ResourceExhausted, "busy").with_retry_delay(ms(10))
        ));
    }

    #[test]
    fn server_retry_delay_overrides_and_is_capped() {
        let mut r = Retrying::new(Arc::from(vec![RetryPolicy::default()]));
        let five_min = RpcError::new(Code::Internal, "busy").with_retry_delay(ms(300_000));
        // 5 min > max_backoff (60 s) still wins; ≥ 2 s so jitter applies (unit 0 → none).
        assert_eq!(
            r.on_error(&five_min, 0.0),
            RetryDecision::Retry(ms(300_000))
        );
        let five_days =
            RpcError::new(Code::Internal, "busy").with_retry_delay(Duration::from_secs(432_000));
        assert_eq!(
            r.on_error(&five_days, 0.0),
            RetryDecision::Retry(ms(600_000))
        );
        // Without RetryInfo the exponential sequence resumes where it was (third wait).
        assert_eq!(
            r.on_error(&RpcError::unavailable("x"), 0.0),
            RetryDecision::Retry(ms(800))
        );
    }

    #[test]
    fn first_matching_policy_only() {
        fn internal(e: &RpcError) -> bool {
            e.code() == Code::Internal
        }
        let p = RetryPolicy {
            max_retries: Some(2),
            can_retry: internal,
            ..RetryPolicy::default()
        };
        let mut r = Retrying::new(Arc::from(vec![p.clone(), p]));
        let e = RpcError::new(Code::Internal, "x");
        assert!(matches!(r.on_error(&e, 0.0), RetryDecision::Retry(_)));
        assert!(matches!(r.on_error(&e, 0.0), RetryDecision::Retry(_)));
        assert_eq!(r.on_error(&e, 0.0), RetryDecision::Exhausted);
        assert_eq!(
            r.on_error(&RpcError::unavailable("x"), 0.0),
            RetryDecision::NotRetryable
        );
    }

    #[test]
    fn no_max_backoff_keeps_initial_wait() {
        let p = RetryPolicy {
            max_backoff: None,
            max_retries: Some(3),
            ..RetryPolicy::default()
        };
        let waits: Vec<_> = p.base_waits().collect();
        assert_eq!(waits, vec![ms(50); 3]);
    }

    #[test]
    fn jitter_source_is_uniform_enough_and_seedable() {
        let mut a = Jitter::new(Some(7));
        let mut b = Jitter::new(Some(7));
        let xs: Vec<f64> = (0..1000).map(|_| a.unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        assert_eq!(xs[0], b.unit());
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.4..0.6).contains(&mean));
    }
}
