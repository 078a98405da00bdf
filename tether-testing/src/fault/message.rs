//! Fault injection at the typed-message level: [`FaultyConnection`] wraps any
//! [`Connection`] and applies a [`FaultPlan`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tether::connection::{Connection, ConnectionError};
use tether::time::Timer;

use super::{InjectedFault, SplitMix};

/// Which way a message travels through a [`FaultyConnection`] (or a byte through a
/// `FaultyIo`): the two directions of one `Execute` stream (udf §1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Messages this side sends (`poll_ready` / `start_send` / `poll_flush`).
    Send,
    /// Messages this side receives (`poll_recv`).
    Recv,
}

/// Where a write fails in a [`MessageFault::FailWrite`]: the two steps of a send on a
/// connection (udf §4.7: a failed write settles `TransportFailed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteStep {
    /// `start_send` of the message returns the error; the message is not handed over.
    StartSend,
    /// `start_send` hands the message over (the peer may receive it), then the next
    /// `poll_flush` returns the error.
    Flush,
}

/// One fault of a [`FaultPlan`]. Positions count messages from 0 in one direction: a fault
/// `at: n` lets messages `0..n` through and strikes message `n`. Each fault fires at most
/// once. The kinds are the transport failures of udf §6.5 (crash, half-close without a
/// terminator, failed write, silence until a timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MessageFault {
    /// The connection is cut at message `at` in `direction`: that message is lost, the
    /// wrapped connection is dropped (the peer sees its stream end and its sends fail, as
    /// after the SIGKILL of udf §8.4), and every later call on this side fails with an
    /// [`InjectedFault`].
    Drop {
        /// The direction whose message `at` triggers the cut.
        direction: Direction,
        /// Messages that pass before the cut.
        at: u64,
    },
    /// From message `at` on, `direction` never makes progress again: `poll_ready` (and
    /// `poll_close`) or `poll_recv` stay `Pending` and never wake. The wrapped connection
    /// stays open, so only a deadline ends the wait (udf §7).
    Stall {
        /// The direction that stalls.
        direction: Direction,
        /// Messages that pass before the stall.
        at: u64,
    },
    /// Message `at` in `direction` is held back for `by`, measured on the connection's
    /// [`Timer`] from the first poll for it (udf §7's deadlines run on the same clock).
    Delay {
        /// The direction of the delayed message.
        direction: Direction,
        /// Messages that pass undelayed first.
        at: u64,
        /// How long the message is held back.
        by: Duration,
    },
    /// Sending message `at` fails at `step`; every later send, flush and close fails the
    /// same way. The wrapped connection stays open (udf §4.7, §6.5: failed writes).
    FailWrite {
        /// Messages sent successfully before the failure.
        at: u64,
        /// Where the failure is reported.
        step: WriteStep,
    },
    /// Before message `at` is sent, the send side of the wrapped connection is closed with
    /// no terminator; message `at` and every later one is swallowed (reported sent, never
    /// delivered). The peer sees the stream end without `Finish`/`Cancel` or without a
    /// `FinishResponse`/`CancelResponse` (udf §2 R10, §6.5).
    HalfClose {
        /// Messages sent before the half-close.
        at: u64,
    },
}

impl MessageFault {
    /// Whether the fault ends the session's chance to finish normally: every kind but a
    /// [`Delay`](Self::Delay) (which only moves time; udf §7 decides whether that matters).
    pub fn is_destructive(&self) -> bool {
        !matches!(self, Self::Delay { .. })
    }
}

/// The settings of [`FaultPlan::random`]: how many faults, over how many messages, and the
/// longest delay (keep it under the udf §7 timeouts for delays that must not change the
/// outcome).
#[derive(Debug, Clone)]
pub struct RandomFaults {
    /// Positions are drawn from `0..horizon` (messages per direction).
    pub horizon: u64,
    /// At most this many faults (at least 0); the number is drawn uniformly.
    pub max_faults: usize,
    /// Delays are drawn from `1 ms ..= max_delay`.
    pub max_delay: Duration,
    /// Whether faults other than delays may be drawn (udf §6.5's failures).
    pub destructive: bool,
}

impl Default for RandomFaults {
    /// 8 messages, up to 2 faults, delays up to 5 s (a sixth of Spark's 30 s timeouts,
    /// udf §7), every kind.
    fn default() -> Self {
        Self {
            horizon: 8,
            max_faults: 2,
            max_delay: Duration::from_secs(5),
            destructive: true,
        }
    }
}

/// A declarative list of [`MessageFault`]s for a [`FaultyConnection`], built by hand or
/// drawn from a seed ([`random`](Self::random)); the transport failures of udf §6.5 on
/// demand.
///
/// ```
/// use std::time::Duration;
/// use tether_testing::fault::{Direction, FaultPlan, MessageFault};
///
/// let plan = FaultPlan::new()
///     .delay(Direction::Recv, 0, Duration::from_millis(100))
///     .drop_at(Direction::Send, 3);
/// assert_eq!(plan.faults().len(), 2);
/// assert!(matches!(plan.faults()[1], MessageFault::Drop { at: 3, .. }));
/// assert!(!plan.is_benign());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultPlan {
    faults: Vec<MessageFault>,
}

impl FaultPlan {
    /// A plan with no fault: the wrapper passes every udf §1.2 envelope through (and counts
    /// it).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds any fault (udf §6.5).
    pub fn with(mut self, fault: MessageFault) -> Self {
        self.faults.push(fault);
        self
    }

    /// Cuts the connection at message `at` in `direction` ([`MessageFault::Drop`]; udf §8.4's
    /// SIGKILL mid-stream).
    pub fn drop_at(self, direction: Direction, at: u64) -> Self {
        self.with(MessageFault::Drop { direction, at })
    }

    /// Stalls `direction` from message `at` on ([`MessageFault::Stall`]; a udf §7 timeout
    /// ends it).
    pub fn stall(self, direction: Direction, at: u64) -> Self {
        self.with(MessageFault::Stall { direction, at })
    }

    /// Holds message `at` in `direction` back for `by` ([`MessageFault::Delay`]; on the
    /// clock of udf §7).
    pub fn delay(self, direction: Direction, at: u64, by: Duration) -> Self {
        self.with(MessageFault::Delay { direction, at, by })
    }

    /// Fails sending message `at` at `step` ([`MessageFault::FailWrite`]; udf §4.7).
    pub fn fail_write(self, at: u64, step: WriteStep) -> Self {
        self.with(MessageFault::FailWrite { at, step })
    }

    /// Half-closes the send side before message `at`, with no terminator
    /// ([`MessageFault::HalfClose`]; udf §2 R10).
    pub fn half_close(self, at: u64) -> Self {
        self.with(MessageFault::HalfClose { at })
    }

    /// The faults, in the order they were added (udf §6.5's failure kinds).
    pub fn faults(&self) -> &[MessageFault] {
        &self.faults
    }

    /// Whether the plan holds only delays (or nothing): a plan that must not change a
    /// session's outcome while its delays stay under the udf §7 timeouts.
    pub fn is_benign(&self) -> bool {
        self.faults.iter().all(|f| !f.is_destructive())
    }

    /// A plan drawn from `seed` (the same seed gives the same plan) within `settings`: for
    /// model tests and soaks that inject the udf §6.5 failures at random.
    pub fn random(seed: u64, settings: &RandomFaults) -> Self {
        let mut rng = SplitMix::new(seed);
        let horizon = settings.horizon.max(1);
        let count = rng.below(settings.max_faults as u64 + 1);
        let mut plan = Self::new();
        for _ in 0..count {
            let direction = if rng.below(2) == 0 {
                Direction::Send
            } else {
                Direction::Recv
            };
            let at = rng.below(horizon);
            let kinds = if settings.destructive { 5 } else { 1 };
            plan = match rng.below(kinds) {
                0 => {
                    let max_ms = settings.max_delay.as_millis().max(1) as u64;
                    let by = Duration::from_millis(1 + rng.below(max_ms));
                    plan.delay(direction, at, by)
                }
                1 => plan.drop_at(direction, at),
                2 => plan.stall(direction, at),
                3 => {
                    let step = if rng.below(2) == 0 {
                        WriteStep::StartSend
                    } else {
                        WriteStep::Flush
                    };
                    plan.fail_write(at, step)
                }
                _ => plan.half_close(at),
            };
        }
        plan
    }
}

/// What a [`FaultyConnection`] did, read through [`FaultCounters::report`]: the messages
/// that passed and every fault that fired, so a test can assert that the udf §6.5 failure
/// it planned really happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultReport {
    /// Messages handed to the wrapped connection (`start_send` succeeded on it).
    pub sent: u64,
    /// Messages received from the wrapped connection and passed on.
    pub received: u64,
    /// [`MessageFault::Drop`]s that fired (0 or 1: the connection is gone after one).
    pub dropped: u64,
    /// [`MessageFault::Stall`]s that fired.
    pub stalled: u64,
    /// [`MessageFault::Delay`]s that elapsed.
    pub delayed: u64,
    /// [`MessageFault::FailWrite`]s that fired.
    pub failed_writes: u64,
    /// [`MessageFault::HalfClose`]s that fired.
    pub half_closed: u64,
    /// Messages swallowed after a half-close.
    pub swallowed: u64,
}

impl FaultReport {
    /// Faults of every kind that fired, delays included (udf §6.5's failures and the
    /// udf §7 waits).
    pub fn fired(&self) -> u64 {
        self.dropped + self.stalled + self.delayed + self.failed_writes + self.half_closed
    }

    /// Faults other than delays that fired: whether the session may legitimately end in
    /// anything but `Finished` (udf §6.5).
    pub fn destructive(&self) -> u64 {
        self.fired() - self.delayed
    }
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    dropped: AtomicU64,
    stalled: AtomicU64,
    delayed: AtomicU64,
    failed_writes: AtomicU64,
    half_closed: AtomicU64,
    swallowed: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A cloneable view of a [`FaultyConnection`]'s counters that outlives the connection
/// moving into a session (udf §4: the session owns its connection).
#[derive(Debug, Clone, Default)]
pub struct FaultCounters(Arc<Counters>);

impl FaultCounters {
    /// A snapshot of the counters (see [`FaultReport`]; udf §6.5).
    pub fn report(&self) -> FaultReport {
        let c = &self.0;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultReport {
            sent: get(&c.sent),
            received: get(&c.received),
            dropped: get(&c.dropped),
            stalled: get(&c.stalled),
            delayed: get(&c.delayed),
            failed_writes: get(&c.failed_writes),
            half_closed: get(&c.half_closed),
            swallowed: get(&c.swallowed),
        }
    }
}

type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A delay in progress: the index of the fault and its sleep. The sleep sits in a mutex only
/// so the wrapper stays `Sync` (it is reached through `get_mut`).
struct Pending {
    fault: usize,
    sleep: Mutex<Sleep>,
}

/// A [`Connection`] that applies a [`FaultPlan`] to the connection it wraps: the failures
/// of udf §6.5 (cut, stall, failed write, half-close without terminator) and delays, at
/// chosen messages, with [`FaultCounters`] to check they fired.
///
/// Delays run on the [`Timer`] given to [`with_timer`](Self::with_timer), by default tokio's
/// clock if the wrapper is created inside a tokio runtime, else
/// [`NoTimeouts`](tether::time::NoTimeouts); with a
/// [`ManualClock`](tether::time::ManualClock) a delay ends when the clock is advanced past
/// it. On a timer that never fires (`NoTimeouts`) a delay is not applied (and not counted).
///
/// Errors it injects are [`ConnectionError::Transport`] with an [`InjectedFault`] as the
/// cause; [`is_injected`](super::is_injected) recognises them.
pub struct FaultyConnection<C> {
    inner: Option<C>,
    faults: Vec<MessageFault>,
    fired: Vec<bool>,
    timer: Arc<dyn Timer>,
    counters: FaultCounters,
    sent: u64,
    received: u64,
    send_delay: Option<Pending>,
    recv_delay: Option<Pending>,
    /// After a cut: whether `poll_recv` has reported it (then it reports the end).
    cut_reported: bool,
    /// A failed write: every later send fails with it.
    broken: Option<InjectedFault>,
    /// A `FailWrite { step: Flush }` armed by `start_send`.
    fail_next_flush: bool,
    half_closed: bool,
    send_stalled: bool,
    recv_stalled: bool,
}

impl<C> fmt::Debug for FaultyConnection<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyConnection")
            .field("faults", &self.faults)
            .field("fired", &self.fired)
            .field("report", &self.counters.report())
            .field("cut", &self.inner.is_none())
            .finish_non_exhaustive()
    }
}

impl<C> FaultyConnection<C> {
    /// Wraps `inner`, applying `plan` (udf §6.5's failures on demand); delays run on the
    /// crate's default timer.
    pub fn new(inner: C, plan: FaultPlan) -> Self {
        let fired = vec![false; plan.faults.len()];
        Self {
            inner: Some(inner),
            faults: plan.faults,
            fired,
            timer: super::ambient_timer(),
            counters: FaultCounters::default(),
            sent: 0,
            received: 0,
            send_delay: None,
            recv_delay: None,
            cut_reported: false,
            broken: None,
            fail_next_flush: false,
            half_closed: false,
            send_stalled: false,
            recv_stalled: false,
        }
    }

    /// Runs delays on `timer` (a [`ManualClock`](tether::time::ManualClock) in a simulation;
    /// the same clock as the session's udf §7 deadlines).
    pub fn with_timer(mut self, timer: Arc<dyn Timer>) -> Self {
        self.timer = timer;
        self
    }

    /// The counters, shared: keep a clone before moving the connection into a session
    /// (udf §4).
    pub fn counters(&self) -> FaultCounters {
        self.counters.clone()
    }

    /// The wrapped connection, unless a [`MessageFault::Drop`] cut it (udf §8.4).
    pub fn get_ref(&self) -> Option<&C> {
        self.inner.as_ref()
    }

    /// The index of the first unfired fault matching `pred` at position `at`.
    fn due(&self, at: u64, pred: impl Fn(&MessageFault, u64) -> bool) -> Option<usize> {
        (0..self.faults.len()).find(|&i| !self.fired[i] && pred(&self.faults[i], at))
    }

    fn c(&self) -> &Counters {
        &self.counters.0
    }

    /// Cuts the wrapped connection (dropping it ends the peer's stream).
    fn cut(&mut self, fault: usize) -> ConnectionError {
        self.fired[fault] = true;
        self.inner = None;
        bump(&self.c().dropped);
        ConnectionError::transport(InjectedFault::ConnectionDropped)
    }

    /// Polls a delay of `direction` at position `at`, starting it if one is due. `Ready`
    /// when no delay holds the message (any more).
    fn poll_delay(&mut self, direction: Direction, at: u64, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let slot = match direction {
                Direction::Send => &mut self.send_delay,
                Direction::Recv => &mut self.recv_delay,
            };
            if let Some(pending) = slot {
                let sleep = pending
                    .sleep
                    .get_mut()
                    .unwrap_or_else(PoisonError::into_inner);
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let fault = pending.fault;
                *slot = None;
                self.fired[fault] = true;
                bump(&self.c().delayed);
                continue;
            }
            let Some(fault) = self.due(at, |f, at| {
                matches!(f, MessageFault::Delay { direction: d, at: n, .. } if *d == direction && *n == at)
            }) else {
                return Poll::Ready(());
            };
            let MessageFault::Delay { by, .. } = self.faults[fault] else {
                return Poll::Ready(());
            };
            let timer = &self.timer;
            if !timer.fires() {
                // No clock to measure the delay on: it is not applied.
                self.fired[fault] = true;
                continue;
            }
            let sleep = timer.sleep_until(tether::time::deadline_after(timer.now(), by));
            let pending = Some(Pending {
                fault,
                sleep: Mutex::new(sleep),
            });
            match direction {
                Direction::Send => self.send_delay = pending,
                Direction::Recv => self.recv_delay = pending,
            }
        }
    }

    /// Whether `direction` stalls at position `at` (marking the stall fired once).
    fn stalls(&mut self, direction: Direction, at: u64) -> bool {
        let stalled = match direction {
            Direction::Send => &mut self.send_stalled,
            Direction::Recv => &mut self.recv_stalled,
        };
        if *stalled {
            return true;
        }
        let due = self.due(at, |f, at| {
            matches!(f, MessageFault::Stall { direction: d, at: n } if *d == direction && *n <= at)
        });
        let Some(fault) = due else { return false };
        self.fired[fault] = true;
        match direction {
            Direction::Send => self.send_stalled = true,
            Direction::Recv => self.recv_stalled = true,
        }
        bump(&self.c().stalled);
        true
    }

    fn dead() -> ConnectionError {
        ConnectionError::transport(InjectedFault::ConnectionDropped)
    }
}

impl<C, Out, In> Connection<Out, In> for FaultyConnection<C>
where
    C: Connection<Out, In>,
{
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        if let Some(e) = &self.broken {
            return Poll::Ready(Err(ConnectionError::transport(*e)));
        }
        if self.inner.is_none() {
            return Poll::Ready(Err(Self::dead()));
        }
        let at = self.sent;
        if self.stalls(Direction::Send, at) {
            return Poll::Pending;
        }
        if self.poll_delay(Direction::Send, at, cx).is_pending() {
            return Poll::Pending;
        }
        if !self.half_closed
            && let Some(fault) = self.due(
                at,
                |f, at| matches!(f, MessageFault::HalfClose { at: n } if *n <= at),
            )
        {
            let Some(inner) = self.inner.as_mut() else {
                return Poll::Ready(Err(Self::dead()));
            };
            // Whether the close succeeds or fails, the send side is over.
            if inner.poll_close(cx).is_pending() {
                return Poll::Pending;
            }
            self.fired[fault] = true;
            self.half_closed = true;
            bump(&self.c().half_closed);
        }
        if self.half_closed {
            return Poll::Ready(Ok(()));
        }
        match self.inner.as_mut() {
            Some(inner) => inner.poll_ready(cx),
            None => Poll::Ready(Err(Self::dead())),
        }
    }

    fn start_send(&mut self, msg: Out) -> Result<(), ConnectionError> {
        if let Some(e) = &self.broken {
            return Err(ConnectionError::transport(*e));
        }
        let at = self.sent;
        if let Some(fault) = self.due(at, |f, at| {
            matches!(f, MessageFault::Drop { direction: Direction::Send, at: n } if *n == at)
        }) {
            return Err(self.cut(fault));
        }
        if let Some(fault) = self.due(at, |f, at| {
            matches!(f, MessageFault::FailWrite { at: n, step: WriteStep::StartSend } if *n == at)
        }) {
            self.fired[fault] = true;
            bump(&self.c().failed_writes);
            self.broken = Some(InjectedFault::WriteFailed);
            return Err(ConnectionError::transport(InjectedFault::WriteFailed));
        }
        if self.half_closed {
            self.sent += 1;
            bump(&self.c().swallowed);
            return Ok(());
        }
        let Some(inner) = self.inner.as_mut() else {
            return Err(Self::dead());
        };
        inner.start_send(msg)?;
        self.sent += 1;
        bump(&self.c().sent);
        if let Some(fault) = self.due(at, |f, at| {
            matches!(f, MessageFault::FailWrite { at: n, step: WriteStep::Flush } if *n == at)
        }) {
            self.fired[fault] = true;
            self.fail_next_flush = true;
        }
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        if self.fail_next_flush {
            self.fail_next_flush = false;
            bump(&self.c().failed_writes);
            self.broken = Some(InjectedFault::WriteFailed);
        }
        if let Some(e) = &self.broken {
            return Poll::Ready(Err(ConnectionError::transport(*e)));
        }
        if self.half_closed {
            return Poll::Ready(Ok(()));
        }
        match self.inner.as_mut() {
            Some(inner) => inner.poll_flush(cx),
            None => Poll::Ready(Err(Self::dead())),
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        if let Some(e) = &self.broken {
            return Poll::Ready(Err(ConnectionError::transport(*e)));
        }
        if self.send_stalled {
            return Poll::Pending;
        }
        if self.half_closed {
            return Poll::Ready(Ok(()));
        }
        match self.inner.as_mut() {
            Some(inner) => inner.poll_close(cx),
            None => Poll::Ready(Err(Self::dead())),
        }
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<In, ConnectionError>>> {
        if self.inner.is_none() {
            if self.cut_reported {
                return Poll::Ready(None);
            }
            self.cut_reported = true;
            return Poll::Ready(Some(Err(Self::dead())));
        }
        let at = self.received;
        if self.stalls(Direction::Recv, at) {
            return Poll::Pending;
        }
        if self.poll_delay(Direction::Recv, at, cx).is_pending() {
            return Poll::Pending;
        }
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match inner.poll_recv(cx) {
            Poll::Ready(Some(Ok(message))) => {
                if let Some(fault) = self.due(at, |f, at| {
                    matches!(f, MessageFault::Drop { direction: Direction::Recv, at: n } if *n == at)
                }) {
                    drop(message);
                    let error = self.cut(fault);
                    self.cut_reported = true;
                    return Poll::Ready(Some(Err(error)));
                }
                self.received += 1;
                bump(&self.c().received);
                Poll::Ready(Some(Ok(message)))
            }
            other => other,
        }
    }

    fn is_active(&self) -> bool {
        match &self.inner {
            Some(inner) => self.broken.is_none() && inner.is_active(),
            None => false,
        }
    }
}
