//! The graceful drain of an [`ExecutionManager`](super::ExecutionManager)'s executions, as a sans-IO rule (tether's
//! own; Spark 4.3.0 has none: its server stops with its driver). The operating chapter
//! (`docs/deployment.md`) tells the story; this is the rule.
//!
//! [`Drain::begin`] takes the deadline and `now`; [`Drain::poll`] takes `now` and what the
//! registry and the server look like ([`DrainView`]) and says what to do next
//! ([`DrainStep`]). It reads no clock and does no I/O, so tests drive it on a
//! [`ManualClock`](crate::time::ManualClock). [`ExecutionManager::step_drain`](super::ExecutionManager::step_drain) runs the
//! steps that touch only the registry; a server adapter (`spark::connect::ConnectServer`)
//! flips its health, closes its connections when asked and sleeps until told.
//!
//! | phase | ends when | then |
//! |---|---|---|
//! | serving (until the deadline) | nothing is live, no handler runs, every session quiet for [`SESSION_QUIET`] | finish |
//! | serving | the deadline passes with executions live | [`DrainStep::CancelAll`], then grace |
//! | grace ([`DRAIN_GRACE`] after the deadline) | as serving, or its end | finish |
//! | finish | — | abandon everything detached, [`DrainStep::Done`] |
//!
//! In serving and grace, executions no client has been attached to for [`DRAIN_GRACE`] are
//! abandoned as the drain goes (a dead client would hold the drain to its deadline), except
//! those whose client was handed its whole result (it may still be reading its buffers, and
//! will release).

use std::fmt;
use std::time::{Duration, Instant};

use super::keys::ExecuteKey;

/// How long a drain waits, after its deadline canceled what was left, for the clients to
/// read their `OPERATION_CANCELED` and release (Spark clients release an execution whose
/// stream failed, rx §6.2): at most 5 s, less when they release sooner. Also how long an
/// execution may be detached during a drain before it is abandoned.
pub const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// How long every live session must have been quiet (no RPC) for a drain to end once no
/// execution is live: 1 s, so that a client that just released its last execution reaches
/// the server with its ReleaseSession (PySpark's `spark.stop()`, rx §5.6) rather than
/// retrying it against a server that is gone. Bounded by the drain's deadline.
pub const SESSION_QUIET: Duration = Duration::from_secs(1);

/// How often a drain looks for executions detached for [`DRAIN_GRACE`] (and, when nothing
/// else wakes it, whether it is done): the longest [`DrainStep::Wait`] (tether's own, over
/// rx §5.3's abandonment).
pub const DRAIN_CHECK: Duration = Duration::from_millis(50);

/// What a drain needs to know at each [`Drain::poll`]: the registry's and the server's
/// counts (rx §5.1 registry, rx §5.6 sessions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DrainView {
    /// Live executions ([`ExecutionManager::execution_count`](super::ExecutionManager::execution_count)).
    pub live: usize,
    /// RPC handlers running in the server (`ConnectService::rpcs_in_flight`; 0 without a
    /// server).
    pub handlers: usize,
    /// How long the most recently used live session has been quiet
    /// ([`ExecutionManager::sessions_quiet_for`](super::ExecutionManager::sessions_quiet_for)); `None`: no session is live.
    pub sessions_quiet_for: Option<Duration>,
}

impl DrainView {
    /// Whether nothing holds the drain: no execution, no handler, every session quiet for
    /// [`SESSION_QUIET`]; otherwise, when only the sessions' quiet is missing, how long
    /// until it is reached.
    fn settled(&self) -> Result<(), Option<Duration>> {
        if self.live > 0 || self.handlers > 0 {
            return Err(None);
        }
        match self.sessions_quiet_for {
            Some(quiet) if quiet < SESSION_QUIET => Err(Some(SESSION_QUIET - quiet)),
            _ => Ok(()),
        }
    }
}

/// What to do next in a drain ([`Drain::poll`]; tether's own, over rx §5.1's registry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainStep {
    /// Abandon every execution detached for at least `detached_for`
    /// ([`ExecutionManager::abandon_detached`](super::ExecutionManager::abandon_detached)`(detached_for, delivered_too)`, rx §5.3) and
    /// hand the keys to [`Drain::abandoned`]; then poll again.
    Abandon {
        /// How long an execution must have been detached.
        detached_for: Duration,
        /// Whether executions whose client was handed `ResultComplete` go too.
        delivered_too: bool,
    },
    /// The deadline passed with executions live: cancel every one
    /// ([`ExecutionManager::cancel_all`](super::ExecutionManager::cancel_all), rx §2.2 T9's error now), hand the keys to
    /// [`Drain::canceled`], and close the server's connections so that clients reattach
    /// and read the error instead of the responses in flight; then poll again.
    CancelAll,
    /// Nothing to do before this instant (on the clock `now` comes from), unless the
    /// registry or the server changes first; then poll again.
    Wait(Instant),
    /// The drain is over: build its report with [`Drain::report`].
    Done,
}

/// Where a drain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Until the deadline (`None`: none).
    Serving(Option<Instant>),
    /// After the deadline canceled what was live, until this instant.
    Grace(Instant),
    /// The last abandonment is due.
    Finishing,
    /// Over.
    Done,
}

/// The drain's rule (module docs; tether's own over rx §5.1's registry, rx §2.2 T9's
/// interrupt and rx §5.3's abandonment): begun once, polled until [`DrainStep::Done`].
#[derive(Debug, Clone)]
pub struct Drain {
    start: Instant,
    /// How long the grace after the deadline lasts, and how long an execution may be
    /// detached before it is abandoned ([`DRAIN_GRACE`] unless [`with_grace`](Self::with_grace)).
    grace: Duration,
    phase: Phase,
    /// When the last [`DrainStep::Abandon`] of detached executions was asked.
    last_check: Option<Instant>,
    live_at_start: usize,
    canceled: Vec<ExecuteKey>,
    abandoned: Vec<ExecuteKey>,
    untold: Vec<ExecuteKey>,
}

impl Drain {
    /// A drain begun at `now` with `live_at_start` live executions, whose deadline is
    /// `deadline` from now (one too far to represent, `Duration::MAX`, is none; rx §5.1). The caller
    /// has already stopped taking new work
    /// ([`ExecutionManager::refuse_new`](super::ExecutionManager::refuse_new); [`ExecutionManager::begin_drain`](super::ExecutionManager::begin_drain) does both).
    pub fn begin(deadline: Duration, now: Instant, live_at_start: usize) -> Self {
        Self {
            start: now,
            grace: DRAIN_GRACE,
            phase: Phase::Serving(now.checked_add(deadline)),
            last_check: None,
            live_at_start,
            canceled: Vec::new(),
            abandoned: Vec::new(),
            untold: Vec::new(),
        }
    }

    /// This drain with `grace` instead of [`DRAIN_GRACE`] (rx §5.3): how long it waits after
    /// the deadline for clients to read their `OPERATION_CANCELED`, and how long an execution
    /// may be detached before it is abandoned. Clients that read slowly, holding many
    /// responses in their transport's buffers when the deadline cuts their connection, need
    /// more to be told (else [`DrainReport::untold`]).
    #[must_use]
    pub fn with_grace(self, grace: Duration) -> Self {
        Self { grace, ..self }
    }

    /// What to do next, given the state at `now` (module docs' table; rx §5.1, §5.3).
    /// Cheap; call it again after every step.
    pub fn poll(&mut self, view: DrainView, now: Instant) -> DrainStep {
        let until = match self.phase {
            Phase::Done => return DrainStep::Done,
            Phase::Finishing => {
                // Whoever is not attached now will not come back: nobody to tell.
                self.phase = Phase::Done;
                return DrainStep::Abandon {
                    detached_for: Duration::ZERO,
                    delivered_too: true,
                };
            }
            Phase::Serving(until) => until,
            Phase::Grace(until) => Some(until),
        };
        if self.last_check.is_none_or(|at| now >= at + DRAIN_CHECK) {
            self.last_check = Some(now);
            return DrainStep::Abandon {
                detached_for: self.grace,
                delivered_too: false,
            };
        }
        let settled = view.settled();
        if settled.is_ok() {
            self.phase = Phase::Finishing;
            return self.poll(view, now);
        }
        if until.is_some_and(|until| now >= until) {
            if matches!(self.phase, Phase::Serving(_)) && view.live > 0 {
                self.phase = Phase::Grace(now + self.grace);
                return DrainStep::CancelAll;
            }
            self.phase = Phase::Finishing;
            return self.poll(view, now);
        }
        let mut wake = self.last_check.unwrap_or(now) + DRAIN_CHECK;
        if let Err(Some(quiet)) = settled {
            wake = wake.min(now + quiet);
        }
        if let Some(until) = until {
            wake = wake.min(until);
        }
        DrainStep::Wait(wake)
    }

    /// The executions a [`DrainStep::Abandon`] abandoned (rx §5.3), each with whether its
    /// client had been handed the execution's terminal error
    /// ([`ExecutionCore::delivered_error`](super::ExecutionCore::delivered_error)).
    pub fn abandoned(&mut self, keys: impl IntoIterator<Item = (ExecuteKey, bool)>) {
        for (key, told) in keys {
            if !told && self.canceled.contains(&key) {
                self.untold.push(key.clone());
            }
            self.abandoned.push(key);
        }
    }

    /// The executions a [`DrainStep::CancelAll`] canceled (rx §2.2 T9).
    pub fn canceled(&mut self, keys: impl IntoIterator<Item = ExecuteKey>) {
        self.canceled.extend(keys);
    }

    /// Whether the deadline passed and [`DrainStep::CancelAll`] was asked (rx §2.2 T9).
    pub fn deadline_passed(&self) -> bool {
        matches!(self.phase, Phase::Grace(_)) || !self.canceled.is_empty()
    }

    /// The report, once [`DrainStep::Done`]: `left` the executions still registered,
    /// `sessions_open` the sessions still live, at `now` (rx §5.1, §5.6).
    pub fn report(&self, left: Vec<ExecuteKey>, sessions_open: usize, now: Instant) -> DrainReport {
        DrainReport {
            live_at_start: self.live_at_start,
            canceled: self.canceled.clone(),
            abandoned: self.abandoned.clone(),
            untold: self.untold.clone(),
            left,
            sessions_open,
            elapsed: now.saturating_duration_since(self.start),
        }
    }
}

/// What a drain did: every execution that was live when it began is accounted for
/// (released or abandoned by the end, canceled at the deadline, or left registered when the
/// drain gave up; rx §5.1 registry, rx §2.2 T9 interrupt).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// Live executions when the drain began (rx §5.1's registry).
    pub live_at_start: usize,
    /// The executions the deadline canceled ([`ExecutionManager::cancel_all`](super::ExecutionManager::cancel_all)): their
    /// clients got `OPERATION_CANCELED` (or the execution's own error) right after the
    /// responses already sent. Empty when everything ended in time.
    pub canceled: Vec<ExecuteKey>,
    /// The executions abandoned because no client was attached (rx §5.3): for
    /// [`DRAIN_GRACE`] during the drain, or at its end. A key can be both `canceled` and
    /// `abandoned` (told, then gone without releasing). Empty after a clean drain.
    pub abandoned: Vec<ExecuteKey>,
    /// The executions canceled at the deadline and then abandoned before their client was
    /// handed the `OPERATION_CANCELED` (rx §2.2 T9): it was still reading responses it held
    /// when the grace ended, and learns how its query ended only as
    /// `INVALID_HANDLE.OPERATION_ABANDONED` from this server, or not at all once the server
    /// is gone (it retries a closed port). A longer grace
    /// ([`Drain::with_grace`]) tells such slow readers. Empty after a clean drain.
    pub untold: Vec<ExecuteKey>,
    /// The executions still registered, with a client attached, when the drain returned
    /// (still reading, not released within [`DRAIN_GRACE`] after the deadline): the server
    /// cuts their streams when it stops. Empty after a clean drain.
    pub left: Vec<ExecuteKey>,
    /// Sessions still open when the drain returned (rx §5.6): their next request meets
    /// another server (through a proxy) or none.
    pub sessions_open: usize,
    /// How long the drain took, on the manager's clock.
    pub elapsed: Duration,
}

impl DrainReport {
    /// Whether every execution ended on its own before the deadline: nothing canceled,
    /// abandoned (so none untold) or left (rx §5.1). Open sessions do not count: they hold
    /// no query.
    pub fn is_clean(&self) -> bool {
        self.canceled.is_empty() && self.abandoned.is_empty() && self.left.is_empty()
    }
}

/// One line for a log: `drained live_at_start=N canceled=N abandoned=N left=N
/// sessions_open=N elapsed_ms=N untold=N`, then the operation ids canceled, abandoned and left, if
/// any (rx §5.1 keys).
impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drained live_at_start={} canceled={} abandoned={} left={} sessions_open={} \
             elapsed_ms={} untold={}",
            self.live_at_start,
            self.canceled.len(),
            self.abandoned.len(),
            self.left.len(),
            self.sessions_open,
            self.elapsed.as_millis(),
            self.untold.len()
        )?;
        for (name, keys) in [
            ("canceled", &self.canceled),
            ("abandoned", &self.abandoned),
            ("untold", &self.untold),
            ("left", &self.left),
        ] {
            if !keys.is_empty() {
                let ids: Vec<String> = keys.iter().map(|k| k.operation_id.to_string()).collect();
                write!(f, " {name}_ids={}", ids.join(","))?;
            }
        }
        Ok(())
    }
}
