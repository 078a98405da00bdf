//! One byte budget over the unsent and retained responses of every execution of a manager
//! (tether's own bound; "unsent" and "retained" as in rx §3.1, §3.4).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::task::Waker;

use crate::sync::Mutex;

/// A byte budget shared by the response logs of many executions: tether's own bound over
/// every execution's unsent and retained responses (rx §3.1 names both ranges of Spark's
/// `ExecuteResponseObserver`; Spark bounds neither across executions, and the per-execution
/// bounds of [`LogConfig`](super::LogConfig) alone allow 10 000 × 74 MiB).
///
/// The rules, applied by [`ResponseLog::push`](super::ResponseLog::push):
///
/// - A response is charged when it is appended and returned exactly once when it leaves its
///   log: automatic release on consume and `ReleaseUntil` (rx §3.4), eviction under
///   pressure (below), close (released, abandoned, interrupted and released, rx §2.2 T12)
///   and the log being dropped. [`used`](Self::used) is always the sum of the held bytes of
///   every log sharing the budget.
/// - A response that fits (`used + size ≤ limit`) is admitted if no producer waits ahead
///   of it; producers that do not fit wait in FIFO order and are woken, head first, as
///   bytes are returned.
/// - **Per-execution floor**: a log that holds nothing always takes one response, whatever
///   the budget says, so no execution can be starved by others' slow consumers. When a
///   producer does not fit and its log has no unsent response (its consumer waits for it),
///   the log first evicts its retained responses (the retry buffer of rx §3.4) and then takes
///   the response through the floor. This keeps what a reattach from the *last sent*
///   response needs — response ids stay known and only the next index must be held
///   (rx §3.5) — so a client that received everything sent resumes as usual; only a client
///   that also lost sent responses in transit gets the typed
///   `INVALID_CURSOR.POSITION_NOT_AVAILABLE`, as past Spark's retry budget (rx §3.4).
///   Spark keeps up to 10 MiB per execution instead, with no bound across executions.
/// - The `ResultComplete` response appended by [`ResponseLog::finish`](super::ResponseLog::finish)
///   (rx §2.2 T7) is charged without waiting.
///
/// So `used ≤ limit + n × largest response` for `n` executions (one floor response each,
/// plus the small `ResultComplete`): see [`bound`](Self::bound).
pub struct MemoryBudget {
    limit: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    used: u64,
    peak: u64,
    next_ticket: u64,
    /// Waiting producers, oldest first: a ticket and the waker of its latest poll.
    queue: VecDeque<(u64, Option<Waker>)>,
    floor_admits: u64,
    waits: u64,
}

/// A snapshot of a [`MemoryBudget`] (tether's bound over rx §3.1's unsent and retained
/// responses), for the soak and scaling runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BudgetUsage {
    /// The configured limit in bytes.
    pub limit: u64,
    /// Bytes held now by every log sharing the budget.
    pub used: u64,
    /// Highest `used` seen.
    pub peak: u64,
    /// Producers waiting now.
    pub waiting: usize,
    /// Responses admitted beyond the limit through the per-execution floor.
    pub floor_admits: u64,
    /// Times a producer had to wait (or was told the budget is full).
    pub waits: u64,
}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("usage", &self.usage())
            .finish()
    }
}

impl MemoryBudget {
    /// The default limit: 1 GiB over every execution of a manager (tether's own bound,
    /// over rx §3.1's unsent and retained responses).
    pub const DEFAULT_LIMIT: u64 = 1024 * 1024 * 1024;

    /// A budget of `limit` bytes (tether's bound over rx §3.1's unsent and retained
    /// responses; 0 admits only floor responses).
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            state: Mutex::new(State::default()),
        })
    }

    /// The limit in bytes (tether's bound, rx §3.1 ranges).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now by every log sharing the budget (unsent plus retained, rx §3.1).
    pub fn used(&self) -> u64 {
        self.state.lock().used
    }

    /// A snapshot of the counters (tether's bound over rx §3.1's ranges).
    pub fn usage(&self) -> BudgetUsage {
        let s = self.state.lock();
        BudgetUsage {
            limit: self.limit,
            used: s.used,
            peak: s.peak,
            waiting: s.queue.len(),
            floor_admits: s.floor_admits,
            waits: s.waits,
        }
    }

    /// The most bytes `executions` executions can hold under this budget when no response
    /// is larger than `largest_response` bytes: the limit plus one floor response and one
    /// `ResultComplete` each (tether's bound, rx §3.1 ranges; see the type's rules).
    pub fn bound(&self, executions: u64, largest_response: u64) -> u64 {
        self.limit.saturating_add(
            executions.saturating_mul(largest_response.saturating_add(RESULT_COMPLETE_ALLOWANCE)),
        )
    }

    /// Charges `size` bytes if they fit, or unconditionally with `floor`; otherwise queues
    /// `waiter` (FIFO, rx §3.1 ranges under tether's bound) and returns `false`.
    pub(crate) fn admit(&self, size: u64, floor: bool, waiter: Option<&mut Waiter>) -> bool {
        let mut s = self.state.lock();
        let mine = waiter.as_ref().and_then(|w| w.ticket);
        let ahead = match (s.queue.front(), mine) {
            (None, _) => false,
            (Some((head, _)), Some(t)) => *head != t,
            (Some(_), None) => true,
        };
        let fits = s.used.saturating_add(size) <= self.limit;
        if floor || (!ahead && fits) {
            if let Some(t) = mine {
                // Admitted waiters are almost always the head (FIFO): O(1) then.
                if s.queue.front().is_some_and(|(q, _)| *q == t) {
                    s.queue.pop_front();
                } else {
                    s.queue.retain(|(q, _)| *q != t);
                }
            }
            if let Some(w) = waiter {
                w.ticket = None;
            }
            if floor && !fits {
                s.floor_admits += 1;
            }
            s.charge(size);
            // The next in line may fit in what is left.
            let next = s.wake_head_if(self.limit);
            drop(s);
            next.into_iter().for_each(Waker::wake);
            return true;
        }
        s.waits += 1;
        if let Some(w) = waiter {
            match w.ticket {
                Some(t) => {
                    if let Some(entry) = s.queue.iter_mut().find(|(q, _)| *q == t) {
                        entry.1 = w.waker.clone();
                    }
                }
                None => {
                    let t = s.next_ticket;
                    s.next_ticket += 1;
                    w.ticket = Some(t);
                    s.queue.push_back((t, w.waker.clone()));
                }
            }
        }
        false
    }

    /// Charges `size` bytes without asking (the `ResultComplete` of rx §2.2 T7).
    pub(crate) fn charge(&self, size: u64) {
        self.state.lock().charge(size);
    }

    /// Returns `size` bytes (a response left its log, rx §3.4, §2.2 T12) and wakes the
    /// first waiting producer.
    pub(crate) fn release(&self, size: u64) {
        if size == 0 {
            return;
        }
        let waker = {
            let mut s = self.state.lock();
            debug_assert!(s.used >= size, "budget released more than it charged");
            s.used = s.used.saturating_sub(size);
            s.wake_head_if(self.limit)
        };
        waker.into_iter().for_each(Waker::wake);
    }

    fn cancel(&self, ticket: u64) {
        let waker = {
            let mut s = self.state.lock();
            let was_head = s.queue.front().is_some_and(|(t, _)| *t == ticket);
            s.queue.retain(|(q, _)| *q != ticket);
            if was_head {
                s.wake_head_if(self.limit)
            } else {
                None
            }
        };
        waker.into_iter().for_each(Waker::wake);
    }
}

/// Room left for the `ResultComplete` response each execution may append without waiting
/// (its stamped ids and the empty message: well under 256 bytes, rx §1.3).
const RESULT_COMPLETE_ALLOWANCE: u64 = 256;

impl State {
    fn charge(&mut self, size: u64) {
        self.used = self.used.saturating_add(size);
        self.peak = self.peak.max(self.used);
    }

    /// The head waiter's waker, taken, if the budget is below `limit`.
    fn wake_head_if(&mut self, limit: u64) -> Option<Waker> {
        if self.used >= limit {
            return None;
        }
        self.queue.front_mut().and_then(|(_, w)| w.take())
    }
}

/// One producer's place in a [`MemoryBudget`]'s FIFO queue (tether's bound, rx §3.1
/// ranges). Dropping it gives up the place (and passes the turn on).
pub(crate) struct Waiter {
    budget: Arc<MemoryBudget>,
    ticket: Option<u64>,
    waker: Option<Waker>,
}

impl Waiter {
    pub(crate) fn new(budget: Arc<MemoryBudget>) -> Self {
        Self {
            budget,
            ticket: None,
            waker: None,
        }
    }

    /// The waker to register if the next admission has to wait.
    pub(crate) fn set_waker(&mut self, waker: &Waker) {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            self.waker = Some(waker.clone());
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.budget.cancel(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A waiter whose waker counts its wake-ups.
    fn waiter(b: &Arc<MemoryBudget>) -> (Arc<Count>, Waiter) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let mut w = Waiter::new(b.clone());
        w.set_waker(&Waker::from(c.clone()));
        (c, w)
    }

    #[test]
    fn fifo_admission_and_wake_order() {
        let b = MemoryBudget::new(100);
        assert!(b.admit(80, false, None));
        let (ca, mut a) = waiter(&b);
        let (cb, mut w2) = waiter(&b);
        assert!(!b.admit(50, false, Some(&mut a)));
        // b would fit (10 ≤ 20 left) but a is ahead of it
        assert!(!b.admit(10, false, Some(&mut w2)));
        assert!(!b.admit(10, false, None), "try_push respects the queue");
        assert_eq!(b.usage().waiting, 2);
        b.release(40);
        assert_eq!(ca.0.load(Ordering::SeqCst), 1, "the head is woken");
        assert_eq!(cb.0.load(Ordering::SeqCst), 0);
        assert!(b.admit(50, false, Some(&mut a)));
        // a's admission passes the turn on: b fits in what is left
        assert_eq!(cb.0.load(Ordering::SeqCst), 1);
        assert!(b.admit(10, false, Some(&mut w2)));
        assert_eq!(b.used(), 100);
        assert_eq!(b.usage().waiting, 0);
    }

    #[test]
    fn floor_bypasses_and_cancel_passes_the_turn() {
        let b = MemoryBudget::new(10);
        assert!(b.admit(10, false, None));
        assert!(b.admit(1000, true, None), "the floor always admits");
        assert_eq!(b.usage().floor_admits, 1);
        let (ca, mut a) = waiter(&b);
        let (cb, mut w2) = waiter(&b);
        assert!(!b.admit(1, false, Some(&mut a)));
        assert!(!b.admit(1, false, Some(&mut w2)));
        b.release(1005);
        assert_eq!(ca.0.load(Ordering::SeqCst), 1);
        drop(a);
        assert_eq!(cb.0.load(Ordering::SeqCst), 1, "a's turn passed to b");
        assert!(b.admit(1, false, Some(&mut w2)));
        assert_eq!(b.used(), 6);
        assert_eq!(b.usage().peak, 1010);
    }
}
