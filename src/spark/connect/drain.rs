//! Graceful drain of a Spark Connect server (tether's own; Spark 4.3.0 has none, its
//! server stops with its driver): health `NOT_SERVING`, no new session or execution, what
//! runs served to its end until a deadline, then interrupted with Spark's error. The
//! deployment story is in `docs/deployment.md`.

use std::fmt;
use std::time::{Duration, Instant};

use super::{ConnectService, QueryEngine};
use crate::execution::ExecuteKey;

/// How long [`ConnectService::drain`] waits, after its deadline interrupted what still ran,
/// for the clients to read their `OPERATION_CANCELED` and release (Spark clients release an
/// execution whose stream failed, rx §6.2): 5 s.
pub const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// How often a drain looks at the registry (rx §5.1) while it waits.
const POLL: Duration = Duration::from_millis(20);

/// What a [`ConnectService::drain`] did: every execution that was live when it began is
/// accounted for (released or abandoned by the end, interrupted at the deadline, or left
/// registered when the drain gave up; rx §5.1 registry, rx §2.2 T9 interrupt).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// Live executions when the drain began (rx §5.1's registry).
    pub live_at_start: usize,
    /// The executions the deadline interrupted (rx §2.2 T9): their clients got
    /// `OPERATION_CANCELED` after the responses produced before it. Empty when everything
    /// ended in time.
    pub interrupted: Vec<ExecuteKey>,
    /// The executions still registered when the drain returned (a client that neither read
    /// to the end nor released within [`DRAIN_GRACE`] after the deadline): the server drops
    /// them when it stops. Empty after a clean drain.
    pub left: Vec<ExecuteKey>,
    /// How long the drain took, wall clock.
    pub elapsed: Duration,
}

impl DrainReport {
    /// Whether every execution ended on its own before the deadline: nothing interrupted,
    /// nothing left (rx §5.1).
    pub fn is_clean(&self) -> bool {
        self.interrupted.is_empty() && self.left.is_empty()
    }
}

/// One line for a log: `drained live_at_start=N interrupted=N left=N elapsed_ms=N`, then the
/// operation ids interrupted and left, if any (rx §5.1 keys).
impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drained live_at_start={} interrupted={} left={} elapsed_ms={}",
            self.live_at_start,
            self.interrupted.len(),
            self.left.len(),
            self.elapsed.as_millis()
        )?;
        for (name, keys) in [("interrupted", &self.interrupted), ("left", &self.left)] {
            if !keys.is_empty() {
                let ids: Vec<String> = keys.iter().map(|k| k.operation_id.to_string()).collect();
                write!(f, " {name}_ids={}", ids.join(","))?;
            }
        }
        Ok(())
    }
}

impl<E: QueryEngine> ConnectService<E> {
    /// Drains the service for a shutdown or a rolling restart (docs/deployment.md;
    /// tether's own, rx §5.1 registry): health goes `NOT_SERVING` (connect §7.2), the
    /// manager refuses new sessions and executions with the retryable `SERVER_DRAINING`
    /// ([`ExecutionManager::drain`](crate::execution::ExecutionManager::drain)), and every
    /// live execution is served (streams, ReattachExecute, ReleaseExecute) until it is
    /// released or abandoned, or until `deadline` from now; then what still runs is
    /// interrupted (`OPERATION_CANCELED` to its client, rx §2.2 T9) and the drain waits at
    /// most [`DRAIN_GRACE`] more for those clients to release. Returns what happened; stop
    /// the `tonic` server afterwards (its graceful shutdown ends the open streams).
    ///
    /// Calling it again (or on a clone) drains again, with the state as it is then. A
    /// `deadline` too far to represent (`Duration::MAX`) waits without one.
    pub async fn drain(&self, deadline: Duration) -> DrainReport {
        let start = Instant::now();
        self.health().set_serving(false).await;
        let manager = self.manager();
        manager.drain();
        let live_at_start = manager.execution_count();
        // `None`: no deadline (one too far to represent).
        let drained = |until: Option<Instant>| async move {
            while manager.execution_count() > 0 {
                if until.is_some_and(|until| Instant::now() >= until) {
                    return false;
                }
                tokio::time::sleep(POLL).await;
            }
            true
        };
        let mut interrupted = Vec::new();
        if !drained(start.checked_add(deadline)).await {
            interrupted = manager.interrupt_all();
            tracing::warn!(
                interrupted = interrupted.len(),
                live = manager.execution_count(),
                "drain deadline passed: interrupted the executions still producing"
            );
            drained(Instant::now().checked_add(DRAIN_GRACE)).await;
        }
        DrainReport {
            live_at_start,
            interrupted,
            left: manager.execution_keys(),
            elapsed: start.elapsed(),
        }
    }
}
