//! The clock shared by both protocols: the [`Timer`] trait that every deadline runs on,
//! [`TokioTimer`] (feature `tokio`), the [`ManualClock`] for tests and simulations, and
//! [`NoTimeouts`], the explicit choice of no deadlines at all.
//!
//! Every configuration that has deadlines takes its clock the same way, as a required
//! `timer: Arc<dyn Timer>` field ([`SessionConfig`](crate::worker::engine::SessionConfig),
//! [`EndpointConfig`](crate::worker::endpoint::EndpointConfig),
//! [`ClientConfig`](crate::execution::client::ClientConfig),
//! [`ManagerConfig`](crate::execution::ManagerConfig)); their `Default` (feature `tokio`)
//! is [`TokioTimer`], and `with_timer` builds one on any other clock.
//!
//! This is the bottom layer of the crate: it imports nothing from [`worker`](crate::worker)
//! or [`execution`](crate::execution), which both take their time from here. Deadlines are
//! data (the defaults are Spark's: udf §7, rx §4.5); the sans-IO cores take `now` as an
//! argument and never read a clock themselves.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

// The manual clock's lock is the facade's: its sleeps clone and drop wakers under it, which
// the loom tests' wakers make points where loom switches threads (tests/loom.rs).
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

/// A source of time for every deadline of both protocols: the worker-session timeouts of
/// udf §7, the execution timers of rx §4.5 and the client backoff of rx §6.1 (Spark's
/// `Clock`). The `tokio` feature provides [`TokioTimer`] (which honours
/// `tokio::time::pause`, so tests never sleep for real).
pub trait Timer: Send + Sync + fmt::Debug + 'static {
    /// The current instant on this timer's clock (Spark's `Clock.getTimeMillis`).
    fn now(&self) -> Instant;
    /// A future that completes at `deadline` (at once if it has passed; Spark's
    /// `Clock.waitTillTime`, without blocking a thread).
    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>>;
    /// Whether a sleep on this timer ever completes: `true` for every clock but
    /// [`NoTimeouts`]. Drivers arm no deadline on a timer that never fires (udf §7, rx §4.5)
    /// and wait for no backoff on it (rx §6.1).
    fn fires(&self) -> bool {
        true
    }
}

/// The explicit "no deadlines" clock: its sleeps never complete, so no udf §7 or rx §4.5
/// deadline fires on it, and a reattaching client does not wait out its retry backoff
/// (rx §6.1): the retry follows at once. [`now`](Timer::now) is the system's monotonic clock.
/// For sans-IO use and executors without timers, where the caller owns time.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTimeouts;

impl Timer for NoTimeouts {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, _deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(std::future::pending())
    }

    fn fires(&self) -> bool {
        false
    }
}

/// [`Timer`] on tokio's clock (`tokio::time`), available with the `tokio` feature: the
/// real-time clock of the udf §7 and rx §4.5 deadlines (Spark's `SystemClock`).
///
/// Outside a tokio runtime (a session driven by another executor) its sleeps never complete,
/// so timeouts are disabled there; a warning is logged. Supply your own [`Timer`] for other
/// executors.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTimer;

#[cfg(feature = "tokio")]
impl Timer for TokioTimer {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::warn!(
                "TokioTimer used outside a tokio runtime: session timeouts are disabled"
            );
            return Box::pin(std::future::pending());
        }
        Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
            deadline,
        )))
    }
}

/// A sleep of a [`Timer`].
pub(crate) type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The one sleep a driver keeps for its sans-IO core's next deadline (udf §7, rx §4.5,
/// §6.1): the drivers of both protocols ask their core for `poll_timeout()`, wait here, and
/// hand the time back with `handle_timeout(now)`. A sleep armed for an earlier instant is
/// kept when the deadline moves later: it fires early and is re-armed, so a deadline that
/// moves on every message costs no new sleep per message.
#[derive(Default)]
pub(crate) struct DeadlineSleep(Option<(Instant, Sleep)>);

impl DeadlineSleep {
    /// Waits on `timer` until `at`: `Ready(now)` once the timer's clock has reached it (the
    /// sleep is then disarmed), `Pending` with `cx`'s waker registered otherwise.
    pub(crate) fn poll_until(
        &mut self,
        timer: &dyn Timer,
        at: Instant,
        cx: &mut Context<'_>,
    ) -> Poll<Instant> {
        loop {
            if !matches!(&self.0, Some((armed, _)) if *armed <= at) {
                self.0 = Some((at, timer.sleep_until(at)));
            }
            let Some((_, sleep)) = self.0.as_mut() else {
                return Poll::Pending;
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.0 = None;
            let now = timer.now();
            if now >= at {
                return Poll::Ready(now);
            }
            // Fired for an earlier deadline that has since moved: sleep again.
        }
    }

    /// Drops the sleep (nothing is timed any more).
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }
}

/// The longest wait a deadline is armed for: about 100 years. A configured or
/// peer-supplied duration beyond it (`Duration::MAX` as "never", a hostile `RetryInfo`
/// delay, rx §6.1) waits this long instead of overflowing an `Instant`.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `now + after`, saturating at [`FOREVER`] from `now`: adding a duration to an `Instant`
/// panics on overflow, and every deadline of udf §7 and rx §4.5, §6.1 is built this way.
/// Shared with the test-support crate; hidden, not covered by semver.
#[doc(hidden)]
pub fn deadline_after(now: Instant, after: Duration) -> Instant {
    now.checked_add(after)
        .or_else(|| now.checked_add(FOREVER))
        .unwrap_or(now)
}

/// A [`Timer`] whose time only moves with [`advance`](Self::advance) /
/// [`set`](Self::set), like Spark's `ManualClock`: tests drive the udf §7 and rx §4.5
/// deadlines without sleeping. Sleeps complete when the clock is moved past their
/// deadline. Clones share the same time.
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<ManualShared>,
}

struct ManualShared {
    start: Instant,
    /// Nanoseconds from `start` to the current reading: written only under `state`'s lock
    /// (by [`ManualClock::set`]), read without it, so that [`ManualClock::now`] is one
    /// atomic load (every RPC of the execution manager reads its clock).
    elapsed_nanos: AtomicU64,
    state: Mutex<ManualInner>,
}

struct ManualInner {
    next_sleeper: u64,
    sleepers: HashMap<u64, (Instant, Waker)>,
}

impl ManualClock {
    /// A clock reading the current instant, frozen until advanced (Spark's `ManualClock`
    /// starts at 0 instead; an [`Instant`] has no zero).
    pub fn new() -> Self {
        Self::starting_at(Instant::now())
    }

    /// A clock reading `start`, frozen until advanced (Spark's `ManualClock(time)`).
    pub fn starting_at(start: Instant) -> Self {
        Self {
            inner: Arc::new(ManualShared {
                start,
                elapsed_nanos: AtomicU64::new(0),
                state: Mutex::new(ManualInner {
                    next_sleeper: 0,
                    sleepers: HashMap::new(),
                }),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ManualInner> {
        self.inner.state.lock()
    }

    /// The current reading (Spark's `ManualClock.getTimeMillis`, as an [`Instant`]).
    pub fn now(&self) -> Instant {
        let elapsed = self.inner.elapsed_nanos.load(Ordering::Acquire);
        self.inner.start + Duration::from_nanos(elapsed)
    }

    /// Moves the clock forward by `by` and wakes every sleep that is now due: expires the
    /// udf §7 session timeouts and the rx §4.5 execution deadlines that fall within it
    /// (Spark's `ManualClock.advance`). A `by` past what an [`Instant`] can hold moves the
    /// clock about 100 years on instead of panicking.
    pub fn advance(&self, by: Duration) {
        let to = deadline_after(self.now(), by);
        self.set(to);
    }

    /// Moves the clock to `to` (never backwards) and wakes every sleep that is now due
    /// (Spark's `ManualClock.setTime`, which may move back; this one does not).
    pub fn set(&self, to: Instant) {
        let due: Vec<Waker> = {
            let mut st = self.lock();
            if to > self.now() {
                // Saturates 584 years after the start.
                let nanos = to.duration_since(self.inner.start).as_nanos();
                let nanos = u64::try_from(nanos).unwrap_or(u64::MAX);
                self.inner.elapsed_nanos.store(nanos, Ordering::Release);
            }
            let now = self.now();
            let ids: Vec<u64> = st
                .sleepers
                .iter()
                .filter(|(_, (at, _))| *at <= now)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| st.sleepers.remove(&id).map(|(_, w)| w))
                .collect()
        };
        due.into_iter().for_each(Waker::wake);
    }

    /// Number of sleeps currently waiting, for tests: e.g. that a session armed its udf §7
    /// deadline before the test advances past it.
    pub fn pending_sleeps(&self) -> usize {
        self.lock().sleepers.len()
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish()
    }
}

struct ManualSleep {
    clock: ManualClock,
    deadline: Instant,
    id: Option<u64>,
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let mut st = this.clock.lock();
        // Read under the lock `set` moves the clock under: no wake-up is lost.
        if this.clock.now() >= this.deadline {
            if let Some(id) = this.id.take() {
                st.sleepers.remove(&id);
            }
            return Poll::Ready(());
        }
        let id = match this.id {
            Some(id) => id,
            None => {
                st.next_sleeper += 1;
                let id = st.next_sleeper;
                this.id = Some(id);
                id
            }
        };
        st.sleepers.insert(id, (this.deadline, cx.waker().clone()));
        Poll::Pending
    }
}

impl Drop for ManualSleep {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.clock.lock().sleepers.remove(&id);
        }
    }
}

impl Timer for ManualClock {
    fn now(&self) -> Instant {
        Self::now(self)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(ManualSleep {
            clock: self.clone(),
            deadline,
            id: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn sleeps_complete_only_when_advanced() {
        let clock = ManualClock::new();
        let start = clock.now();
        let mut sleep = Timer::sleep_until(&clock, start + Duration::from_secs(5));
        assert!((&mut sleep).now_or_never().is_none());
        assert_eq!(clock.pending_sleeps(), 1);
        clock.advance(Duration::from_secs(4));
        assert!((&mut sleep).now_or_never().is_none());
        clock.advance(Duration::from_secs(1));
        assert!(sleep.now_or_never().is_some());
        assert_eq!(clock.pending_sleeps(), 0);
        assert_eq!(clock.now(), start + Duration::from_secs(5));
    }

    /// An advance past what an `Instant` holds saturates (about 100 years), fires every
    /// sleep, and the clock keeps working; `set` never moves it back.
    #[test]
    fn a_huge_advance_saturates() {
        let clock = ManualClock::new();
        let start = clock.now();
        let mut sleep = Timer::sleep_until(&clock, start + Duration::from_secs(3600));
        assert!((&mut sleep).now_or_never().is_none());
        clock.advance(Duration::MAX);
        assert!(sleep.now_or_never().is_some());
        let far = clock.now();
        assert!(far >= start + Duration::from_secs(99 * 365 * 24 * 3600));
        clock.advance(Duration::MAX);
        assert!(clock.now() >= far);
        clock.set(start);
        assert!(clock.now() >= far, "never backwards");
    }
}
