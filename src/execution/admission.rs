//! Admission (connect §11): a server-wide cap on running executions, and one per user, with
//! FIFO waiting and a timeout (tether's; Spark 4.3.0 has no such cap, the open proposal SPARK-49580 adds
//! `spark.connect.execute.maxConcurrentQueries` with the same shape: excess queries wait in
//! FIFO order and are refused with a retryable error after a timeout).
//!
//! An execution holds its slot from admission until its run ends (the engine's stream
//! finished, failed or was canceled, rx §2.2 T7–T9), not while its finished result waits to
//! be read or released: the cap bounds the work the engine does at once, not the results it
//! keeps (the memory budget bounds those, rx §3.1).
//!
//! The rule is the [`Queue`]: plain data, no clock and no waker of its own, so it is tested
//! step by step. [`AdmissionWait`] is its future, on the manager's [`Timer`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::error::ConnectError;
use super::stream::ExecEnv;

/// Limits of [`ExecutionManager::admit`](super::ExecutionManager::admit) (tether's;
/// SPARK-49580's proposal). The default admits everything at once, as Spark 4.3.0 does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Most executions running at once, server-wide (SPARK-49580's
    /// `maxConcurrentQueries`); `None` = no cap.
    pub max_running: Option<usize>,
    /// Most executions of one `user_id` running at once; `None` = no cap. A user at its
    /// cap waits without holding back other users' executions queued behind it.
    pub max_running_per_user: Option<usize>,
    /// Longest an execution waits for a slot before it is refused with the retryable
    /// `SERVER_BUSY` (`UNAVAILABLE`: Spark clients retry it with backoff, rx §6.1);
    /// `None` = wait as long as it takes (SPARK-49580's timeout 0). Default 60 s.
    pub max_wait: Option<Duration>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_running: None,
            max_running_per_user: None,
            max_wait: Some(Duration::from_secs(60)),
        }
    }
}

/// What the admission holds now ([`ExecutionManager::admission_usage`](super::ExecutionManager::admission_usage);
/// connect §11): both 0 without a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdmissionUsage {
    /// Executions holding a slot (running).
    pub running: usize,
    /// Executions waiting for a slot.
    pub waiting: usize,
}

/// Why a waiting execution was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It waited [`AdmissionConfig::max_wait`].
    Timeout,
    /// The server began draining ([`refuse_new`](super::ExecutionManager::refuse_new)).
    Draining,
}

/// Where one ticket stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Admitted: it holds a slot (its permit must release it).
    Admitted,
    /// Still queued.
    Waiting,
    /// Refused; it holds nothing.
    Refused(Refusal),
}

struct Waiter {
    ticket: u64,
    user: Arc<str>,
    admitted: bool,
    refused: Option<Refusal>,
    waker: Option<Waker>,
}

/// The admission rule: running counts (server-wide and per user) and the FIFO of waiting
/// tickets. Every method is one step; wakers handed in are woken by the caller's
/// [`Queue::take_wakes`].
pub(crate) struct Queue {
    config: AdmissionConfig,
    running: usize,
    per_user: HashMap<Arc<str>, usize>,
    waiting: VecDeque<Waiter>,
    next_ticket: u64,
    refusing: bool,
    wakes: Vec<Waker>,
}

impl Queue {
    pub(crate) fn new(config: AdmissionConfig) -> Self {
        Self {
            config,
            running: 0,
            per_user: HashMap::new(),
            waiting: VecDeque::new(),
            next_ticket: 0,
            refusing: false,
            wakes: Vec::new(),
        }
    }

    fn has_room(&self, user: &str) -> bool {
        self.config.max_running.is_none_or(|m| self.running < m)
            && self
                .config
                .max_running_per_user
                .is_none_or(|m| self.per_user.get(user).copied().unwrap_or(0) < m)
    }

    fn take_slot(&mut self, user: &Arc<str>) {
        self.running += 1;
        *self.per_user.entry(user.clone()).or_insert(0) += 1;
    }

    /// Asks for a slot for `user`: `Ok` when admitted at once (a slot is taken), else the
    /// ticket that waits. Nobody jumps the queue: with anyone of this user's standing
    /// waiting, or no room, the request queues.
    pub(crate) fn request(&mut self, user: &str) -> Result<(), u64> {
        let user: Arc<str> = Arc::from(user);
        let queued_ahead = self.waiting.iter().any(|w| !w.admitted);
        if !self.refusing && !queued_ahead && self.has_room(&user) {
            self.take_slot(&user);
            return Ok(());
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.waiting.push_back(Waiter {
            ticket,
            user,
            admitted: false,
            refused: self.refusing.then_some(Refusal::Draining),
            waker: None,
        });
        if !self.refusing {
            self.admit_waiting();
        }
        Err(ticket)
    }

    /// Admits waiting tickets in FIFO order while there is room: a ticket whose user is at
    /// its own cap is passed over (it keeps its place), so one user's backlog never holds
    /// back another's.
    fn admit_waiting(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.config.max_running.is_some_and(|m| self.running >= m) {
                break;
            }
            let w = &self.waiting[i];
            if !w.admitted && w.refused.is_none() && self.has_room(&w.user) {
                let user = w.user.clone();
                self.take_slot(&user);
                let w = &mut self.waiting[i];
                w.admitted = true;
                if let Some(waker) = w.waker.take() {
                    self.wakes.push(waker);
                }
            }
            i += 1;
        }
    }

    /// Where `ticket` stands, registering `waker` while it waits.
    pub(crate) fn poll(&mut self, ticket: u64, waker: Option<&Waker>) -> Standing {
        let Some(at) = self.waiting.iter().position(|w| w.ticket == ticket) else {
            // Unknown: already taken (callers never poll a finished ticket).
            return Standing::Refused(Refusal::Draining);
        };
        let w = &mut self.waiting[at];
        if let Some(refusal) = w.refused {
            self.waiting.remove(at);
            return Standing::Refused(refusal);
        }
        if w.admitted {
            self.waiting.remove(at);
            return Standing::Admitted;
        }
        if let Some(waker) = waker
            && !w.waker.as_ref().is_some_and(|old| old.will_wake(waker))
        {
            w.waker = Some(waker.clone());
        }
        Standing::Waiting
    }

    /// `ticket` gives up (timed out, or its RPC went away): removed from the queue; a slot
    /// it was admitted to meanwhile goes to the next waiter. Returns how it stood.
    pub(crate) fn cancel(&mut self, ticket: u64, why: Refusal) -> Standing {
        let Some(at) = self.waiting.iter().position(|w| w.ticket == ticket) else {
            return Standing::Refused(why);
        };
        let w = self.waiting.remove(at).unwrap_or_else(|| unreachable!());
        if w.admitted {
            self.release(&w.user);
            return Standing::Admitted;
        }
        Standing::Refused(w.refused.unwrap_or(why))
    }

    /// A slot of `user` is free again: the next waiters that fit are admitted.
    pub(crate) fn release(&mut self, user: &str) {
        self.running = self.running.saturating_sub(1);
        if let Some(n) = self.per_user.get_mut(user) {
            *n -= 1;
            if *n == 0 {
                self.per_user.remove(user);
            }
        }
        if !self.refusing {
            self.admit_waiting();
        }
    }

    /// The server drains: every waiting ticket is refused now, and every later request
    /// queues only to be refused (the manager refuses it before, with `SERVER_DRAINING`).
    pub(crate) fn refuse_all(&mut self) {
        self.refusing = true;
        for w in &mut self.waiting {
            if !w.admitted && w.refused.is_none() {
                w.refused = Some(Refusal::Draining);
                if let Some(waker) = w.waker.take() {
                    self.wakes.push(waker);
                }
            }
        }
    }

    /// The wakers of tickets whose standing changed; wake them after releasing the lock.
    pub(crate) fn take_wakes(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.wakes)
    }

    /// Executions running (holding a slot).
    pub(crate) fn running(&self) -> usize {
        self.running
    }

    /// Tickets still waiting for a slot.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting
            .iter()
            .filter(|w| !w.admitted && w.refused.is_none())
            .count()
    }
}

/// The queue behind its lock, shared by the manager, its futures and its permits; counted
/// on the manager's observer (`tether_connect_admission_*`).
pub(crate) struct Admission {
    queue: Mutex<Queue>,
    config: AdmissionConfig,
    env: Arc<ExecEnv>,
}

impl Admission {
    pub(crate) fn new(config: AdmissionConfig, env: Arc<ExecEnv>) -> Self {
        Self {
            queue: Mutex::new(Queue::new(config)),
            config,
            env,
        }
    }

    /// Runs `f` on the queue, then wakes whom it decided to wake (outside the lock).
    fn with<T>(&self, f: impl FnOnce(&mut Queue) -> T) -> T {
        let (out, wakes) = {
            let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            let out = f(&mut q);
            (out, q.take_wakes())
        };
        for w in wakes {
            w.wake();
        }
        out
    }

    /// What it holds now.
    pub(crate) fn usage(&self) -> AdmissionUsage {
        self.with(|q| AdmissionUsage {
            running: q.running(),
            waiting: q.waiting(),
        })
    }

    pub(crate) fn refuse_all(&self) {
        self.with(Queue::refuse_all);
    }

    /// Asks for a slot for `user_id`, timed on the manager's clock.
    pub(crate) fn admit(self: &Arc<Self>, user_id: &str) -> AdmissionWait {
        let uncapped =
            self.config.max_running.is_none() && self.config.max_running_per_user.is_none();
        if uncapped {
            // Nothing to count or wait for (the default): no lock, no slot.
            return AdmissionWait {
                admission: self.clone(),
                user: Arc::from(""),
                state: WaitState::Uncapped,
            };
        }
        let state = match self.with(|q| q.request(user_id)) {
            Ok(()) => WaitState::Ready,
            Err(ticket) => {
                self.env.observer.admission_waited();
                let timer = &self.env.clock;
                let started = timer.now();
                let timeout = self
                    .config
                    .max_wait
                    .filter(|_| timer.fires())
                    .map(|d| timer.sleep_until(started + d));
                WaitState::Queued {
                    ticket,
                    started,
                    timeout,
                }
            }
        };
        AdmissionWait {
            admission: self.clone(),
            user: Arc::from(user_id),
            state,
        }
    }
}

enum WaitState {
    /// No cap: admitted, holding no slot.
    Uncapped,
    Ready,
    Queued {
        ticket: u64,
        started: Instant,
        timeout: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    },
    Done,
}

/// The wait for a slot (from [`ExecutionManager::admit`](super::ExecutionManager::admit);
/// SPARK-49580's proposal, connect §11):
/// resolves to the [`AdmissionPermit`], or to the retryable refusal `SERVER_BUSY` after
/// [`AdmissionConfig::max_wait`], or `SERVER_DRAINING` once the server drains. Dropping it
/// leaves the queue (a slot it was given meanwhile passes to the next waiter).
#[must_use = "an admission is taken only when the future is awaited"]
pub struct AdmissionWait {
    admission: Arc<Admission>,
    user: Arc<str>,
    state: WaitState,
}

impl fmt::Debug for AdmissionWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionWait")
            .field("user", &self.user)
            .field("waiting", &matches!(self.state, WaitState::Queued { .. }))
            .finish_non_exhaustive()
    }
}

impl AdmissionWait {
    fn permit(&self) -> AdmissionPermit {
        AdmissionPermit {
            admission: Some(self.admission.clone()),
            user: self.user.clone(),
        }
    }

    fn refused(&self, refusal: Refusal, started: Instant) -> ConnectError {
        let env = &self.admission.env;
        env.observer.admission_refused(refusal == Refusal::Timeout);
        match refusal {
            Refusal::Timeout => ConnectError::ServerBusy {
                waited: env.clock.now().saturating_duration_since(started),
            },
            Refusal::Draining => ConnectError::ServerDraining,
        }
    }
}

impl Future for AdmissionWait {
    type Output = Result<AdmissionPermit, ConnectError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let (ticket, started) = match &mut this.state {
            WaitState::Uncapped => {
                this.state = WaitState::Done;
                return Poll::Ready(Ok(AdmissionPermit {
                    admission: None,
                    user: this.user.clone(),
                }));
            }
            WaitState::Ready => {
                this.state = WaitState::Done;
                return Poll::Ready(Ok(this.permit()));
            }
            WaitState::Queued {
                ticket, started, ..
            } => (*ticket, *started),
            WaitState::Done => panic!("AdmissionWait polled after it completed"),
        };
        let standing = this.admission.with(|q| q.poll(ticket, Some(cx.waker())));
        let out = match standing {
            Standing::Admitted => Ok(this.permit()),
            Standing::Refused(r) => Err(this.refused(r, started)),
            Standing::Waiting => {
                let timed_out = match &mut this.state {
                    WaitState::Queued {
                        timeout: Some(t), ..
                    } => t.as_mut().poll(cx).is_ready(),
                    _ => false,
                };
                if !timed_out {
                    return Poll::Pending;
                }
                match this.admission.with(|q| q.cancel(ticket, Refusal::Timeout)) {
                    // Admitted between the two locks: the slot was handed on by `cancel`;
                    // the refusal stands (the client retries).
                    Standing::Admitted | Standing::Waiting => {
                        Err(this.refused(Refusal::Timeout, started))
                    }
                    Standing::Refused(r) => Err(this.refused(r, started)),
                }
            }
        };
        this.state = WaitState::Done;
        Poll::Ready(out)
    }
}

impl Drop for AdmissionWait {
    fn drop(&mut self) {
        if let WaitState::Queued { ticket, .. } = self.state {
            self.admission.with(|q| q.cancel(ticket, Refusal::Timeout));
        }
    }
}

/// One admitted execution's slot (see [`ExecutionManager::admit`](super::ExecutionManager::admit);
/// connect §11):
/// dropping it frees the slot for the next waiter. Hold it for as long as the execution
/// runs.
#[must_use = "dropping the permit frees its slot at once"]
pub struct AdmissionPermit {
    admission: Option<Arc<Admission>>,
    user: Arc<str>,
}

impl fmt::Debug for AdmissionPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionPermit")
            .field("user", &self.user)
            .finish()
    }
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        if let Some(a) = self.admission.take() {
            a.with(|q| q.release(&self.user));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max: usize, per_user: Option<usize>) -> AdmissionConfig {
        AdmissionConfig {
            max_running: Some(max),
            max_running_per_user: per_user,
            max_wait: None,
        }
    }

    #[test]
    fn waiters_are_admitted_in_fifo_order_as_slots_free() {
        let mut q = Queue::new(config(2, None));
        assert_eq!(q.request("a"), Ok(()));
        assert_eq!(q.request("b"), Ok(()));
        let t: Vec<u64> = (0..3).map(|_| q.request("c").unwrap_err()).collect();
        assert_eq!((q.running(), q.waiting()), (2, 3));
        q.release("a");
        assert_eq!(q.poll(t[1], None), Standing::Waiting);
        assert_eq!(q.poll(t[0], None), Standing::Admitted);
        q.release("b");
        assert_eq!(q.poll(t[2], None), Standing::Waiting);
        assert_eq!(q.poll(t[1], None), Standing::Admitted);
        assert_eq!((q.running(), q.waiting()), (2, 1));
    }

    #[test]
    fn nobody_jumps_the_queue_while_someone_waits() {
        let mut q = Queue::new(config(1, None));
        assert_eq!(q.request("a"), Ok(()));
        let first = q.request("b").unwrap_err();
        q.release("a");
        // The freed slot went to the waiter, not to the newcomer.
        let second = q.request("c").unwrap_err();
        assert_eq!(q.poll(first, None), Standing::Admitted);
        assert_eq!(q.poll(second, None), Standing::Waiting);
    }

    #[test]
    fn a_user_at_its_cap_does_not_hold_back_others() {
        let mut q = Queue::new(config(3, Some(1)));
        assert_eq!(q.request("a"), Ok(()));
        let a2 = q.request("a").unwrap_err();
        // "b" queued behind a2, admitted at once: a2 waits for "a"'s slot only.
        let b = q.request("b").unwrap_err();
        assert_eq!(q.poll(b, None), Standing::Admitted);
        assert_eq!(q.poll(a2, None), Standing::Waiting);
        q.release("a");
        assert_eq!(q.poll(a2, None), Standing::Admitted);
        assert_eq!(q.running(), 2);
    }

    #[test]
    fn a_canceled_ticket_hands_its_slot_on() {
        let mut q = Queue::new(config(1, None));
        assert_eq!(q.request("a"), Ok(()));
        let t1 = q.request("b").unwrap_err();
        let t2 = q.request("c").unwrap_err();
        q.release("a");
        // t1 was admitted but its RPC went away before it looked.
        assert_eq!(q.cancel(t1, Refusal::Timeout), Standing::Admitted);
        assert_eq!(q.poll(t2, None), Standing::Admitted);
        assert_eq!((q.running(), q.waiting()), (1, 0));
        assert_eq!(
            q.cancel(t2, Refusal::Timeout),
            Standing::Refused(Refusal::Timeout)
        );
    }

    #[test]
    fn draining_refuses_every_waiter_and_every_later_request() {
        let mut q = Queue::new(config(1, None));
        assert_eq!(q.request("a"), Ok(()));
        let t = q.request("b").unwrap_err();
        q.refuse_all();
        assert_eq!(q.poll(t, None), Standing::Refused(Refusal::Draining));
        q.release("a");
        let later = q.request("c").unwrap_err();
        assert_eq!(q.poll(later, None), Standing::Refused(Refusal::Draining));
        assert_eq!((q.running(), q.waiting()), (0, 0));
    }

    #[test]
    fn no_cap_admits_everything() {
        let mut q = Queue::new(AdmissionConfig::default());
        for _ in 0..10_000 {
            assert_eq!(q.request("a"), Ok(()));
        }
        assert_eq!(q.running(), 10_000);
    }
}
