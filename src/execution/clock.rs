//! A manual clock for tests, examples and simulations: time moves only when told to.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::worker::Timer;

/// A [`Timer`] whose time only moves with [`advance`](Self::advance) /
/// [`set`](Self::set). Sleeps complete when the clock is moved past their deadline. Clones
/// share the same time.
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<Mutex<ManualInner>>,
}

struct ManualInner {
    now: Instant,
    next_sleeper: u64,
    sleepers: HashMap<u64, (Instant, Waker)>,
}

impl ManualClock {
    /// A clock reading the current instant, frozen until advanced.
    pub fn new() -> Self {
        Self::starting_at(Instant::now())
    }

    /// A clock reading `start`, frozen until advanced.
    pub fn starting_at(start: Instant) -> Self {
        ManualClock {
            inner: Arc::new(Mutex::new(ManualInner {
                now: start,
                next_sleeper: 0,
                sleepers: HashMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ManualInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current reading.
    pub fn now(&self) -> Instant {
        self.lock().now
    }

    /// Moves the clock forward by `by` and wakes every sleep that is now due.
    pub fn advance(&self, by: Duration) {
        let to = self.now() + by;
        self.set(to);
    }

    /// Moves the clock to `to` (never backwards) and wakes every sleep that is now due.
    pub fn set(&self, to: Instant) {
        let due: Vec<Waker> = {
            let mut st = self.lock();
            if to > st.now {
                st.now = to;
            }
            let now = st.now;
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

    /// Number of sleeps currently waiting (for tests).
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
        if st.now >= this.deadline {
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
        ManualClock::now(self)
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
}
