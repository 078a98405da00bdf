//! [`WorkerHandle`]: the engine's view of one worker process (udf §3, §6.1).

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use super::termination::Termination;
use crate::connection::ConnectionError;
use crate::sync::{AtomicBool, AtomicUsize, Mutex, Ordering};

/// The engine's view of a worker that serves sessions (udf §3 `WorkerHandle`).
///
/// A session calls, exactly once, when it is finalized (by `close()` or by drop cleanup), in
/// this order: [`session_terminated`](Self::session_terminated), then
/// [`mark_invalid`](Self::mark_invalid) if the outcome is unsalvageable, then
/// [`release_session`](Self::release_session). `mark_invalid` strictly before release means a
/// released worker is never recycled while unsafe (udf §5.1 step 5).
pub trait WorkerHandle: Send + Sync + fmt::Debug {
    /// Stable identity of the worker, used in logs and as a dispatcher key (udf §3
    /// `WorkerHandle.id`).
    fn id(&self) -> &str;

    /// Marks the worker unsafe to reuse. Idempotent and sticky (udf §6.1).
    fn mark_invalid(&self);

    /// Whether [`mark_invalid`](Self::mark_invalid) was called (udf §6.1 `isInvalid`).
    fn is_invalid(&self) -> bool;

    /// Ends one session's use of the worker (decrements its session count). Called exactly
    /// once per session, so it need not be idempotent (udf §3 `releaseSession`, §6.1).
    ///
    /// # Errors
    /// [`HandleError::Underflow`] when more sessions are released than were acquired (a
    /// dispatcher bug); the session logs it and carries on.
    fn release_session(&self) -> Result<(), HandleError>;

    /// Observes the outcome of a session on this worker, just before it is released. The
    /// default does nothing; pools, metrics and tests use it. tether's hook: Spark's
    /// `WorkerHandle` has only `id`, `markInvalid`, `releaseSession` and `connection`
    /// (udf §3).
    fn session_terminated(&self, termination: &Termination) {
        let _ = termination;
    }

    /// Explains a lost connection when the handle knows more than the transport does. A
    /// session calls it once, when its connection failed (`cause`) or the worker's response
    /// stream ended (`None`) before the outcome was settled; the future's error is what the
    /// session then settles `TransportFailed` with (udf §4.5), and should keep `cause` as its
    /// source. It must finish within a small bound: the session waits for it.
    ///
    /// The default returns `None`: the loss is reported as it is. The handle of a
    /// `worker::dispatcher::Dispatcher` (feature `tokio`) waits, within a bound, for the
    /// worker process's exit status and reports a `worker::dispatcher::WorkerLost`: "the
    /// worker connection was lost (worker pid N exited: SIGKILL)". tether's hook: Spark's
    /// engine reports the transport's own error (udf §4.5, §6.1 `isAlive`).
    fn explain_connection_loss(
        &self,
        cause: Option<&ConnectionError>,
    ) -> Option<BoxFuture<'static, ConnectionError>> {
        let _ = cause;
        None
    }
}

/// What [`Session::new`](super::Session::new) accepts as a session's worker handle (udf §3
/// `WorkerHandle`): an `Arc` of a concrete [`WorkerHandle`], or an `Arc<dyn WorkerHandle>`
/// (what a dispatcher holds).
///
/// Keep a clone of a typed handle to inspect it after the session ended; no coercion to
/// `Arc<dyn WorkerHandle>` is needed, `Arc::clone(&handle)` included (against a parameter of
/// type `Arc<dyn WorkerHandle>`, type inference makes `Arc::clone` clone a trait object and
/// rejects the typed reference):
///
/// ```
/// # async fn demo(conn: tether::connection::MemoryConnection<tether::wire::UdfRequest, tether::wire::UdfResponse>) {
/// use std::sync::Arc;
/// use tether::worker::engine::{CountingHandle, Session, SessionConfig};
///
/// let handle = Arc::new(CountingHandle::for_one_session());
/// let session = Session::new(conn, Arc::clone(&handle), SessionConfig::default());
/// let _ = session.close().await;
/// assert_eq!(handle.releases(), 1); // still typed: the counters are readable
/// # }
/// ```
pub trait IntoWorkerHandle {
    /// The handle as the trait object the session stores (udf §3 `WorkerHandle`).
    fn into_worker_handle(self) -> Arc<dyn WorkerHandle>;
}

impl<H: WorkerHandle + 'static> IntoWorkerHandle for Arc<H> {
    fn into_worker_handle(self) -> Arc<dyn WorkerHandle> {
        self
    }
}

impl IntoWorkerHandle for Arc<dyn WorkerHandle> {
    fn into_worker_handle(self) -> Arc<dyn WorkerHandle> {
        self
    }
}

/// Errors of a [`WorkerHandle`]: the `IllegalStateException`s of Spark's
/// `DirectWorkerProcess` (udf §6.1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// `release_session` was called more often than sessions were acquired (a dispatcher
    /// bug; the count is not reset, udf §6.1).
    #[error("worker {id}: release_session without a matching acquire (session count underflow)")]
    Underflow {
        /// The worker's id.
        id: String,
    },
    /// The worker was closed; no new session can be acquired (udf §6.1 `acquireSession`).
    #[error("worker {id} is closed")]
    Closed {
        /// The worker's id.
        id: String,
    },
}

/// A reference-counted [`WorkerHandle`] that records what happened to its sessions: the
/// in-process building block for dispatchers, pools and tests (the session ref-count of
/// Spark's `DirectWorkerProcess`, udf §6.1, without a process).
///
/// The count starts at zero; [`acquire_session`](Self::acquire_session) adds one,
/// `release_session` takes one away and fails on underflow without wrapping (udf §6.1).
#[derive(Debug, Default)]
pub struct CountingHandle {
    id: String,
    sessions: AtomicUsize,
    releases: AtomicUsize,
    invalid: AtomicBool,
    closed: AtomicBool,
    outcomes: Mutex<Vec<Termination>>,
}

impl CountingHandle {
    /// A handle with the given id (udf §3 `WorkerHandle.id`), no sessions, valid, open.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            ..Default::default()
        }
    }

    /// A handle with a fresh UUID v4 id (as Spark's `DirectWorkerProcess` ids, udf §6.1)
    /// and one session already acquired: what a session created outside a dispatcher needs.
    pub fn for_one_session() -> Self {
        let h = Self::new(uuid::Uuid::new_v4().to_string());
        h.sessions.store(1, Ordering::SeqCst);
        h
    }

    /// Adds one session (udf §6.1 `acquireSession`: ref-count += 1).
    ///
    /// # Errors
    /// [`HandleError::Closed`] after [`close`](Self::close).
    pub fn acquire_session(&self) -> Result<(), HandleError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(HandleError::Closed {
                id: self.id.clone(),
            });
        }
        self.sessions.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Refuses further [`acquire_session`](Self::acquire_session) calls (a closed worker,
    /// udf §6.1). Idempotent; sessions already acquired may still be released.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Sessions currently acquired and not released (udf §6.1 `activeSessions`).
    pub fn active_sessions(&self) -> usize {
        self.sessions.load(Ordering::SeqCst)
    }

    /// How many times `release_session` succeeded (udf §5.1 step 5 calls it once per
    /// session).
    pub fn releases(&self) -> usize {
        self.releases.load(Ordering::SeqCst)
    }

    /// The outcomes (udf §4.1 `Termination`) of the sessions finalized on this worker, in
    /// order, as [`session_terminated`](WorkerHandle::session_terminated) saw them.
    pub fn outcomes(&self) -> Vec<Termination> {
        self.outcomes.lock().clone()
    }

    /// The outcome (udf §4.1 `Termination`) of the most recently finalized session, if
    /// any.
    pub fn last_outcome(&self) -> Option<Termination> {
        self.outcomes.lock().last().cloned()
    }
}

impl WorkerHandle for CountingHandle {
    fn id(&self) -> &str {
        &self.id
    }

    fn mark_invalid(&self) {
        self.invalid.store(true, Ordering::SeqCst);
    }

    fn is_invalid(&self) -> bool {
        self.invalid.load(Ordering::SeqCst)
    }

    fn release_session(&self) -> Result<(), HandleError> {
        self.sessions
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .map_err(|_| HandleError::Underflow {
                id: self.id.clone(),
            })?;
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn session_terminated(&self, termination: &Termination) {
        self.outcomes.lock().push(termination.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_underflow_is_an_error_not_a_wrap() {
        let h = CountingHandle::new("w1");
        assert_eq!(
            h.release_session(),
            Err(HandleError::Underflow { id: "w1".into() })
        );
        assert_eq!(h.active_sessions(), 0);
        h.acquire_session().unwrap();
        assert_eq!(h.release_session(), Ok(()));
        assert_eq!(h.releases(), 1);
        assert!(h.release_session().is_err());
    }

    #[test]
    fn mark_invalid_is_sticky_and_closed_refuses_acquire() {
        let h = CountingHandle::for_one_session();
        assert!(!h.is_invalid());
        h.mark_invalid();
        h.mark_invalid();
        assert!(h.is_invalid());
        h.close();
        assert!(matches!(
            h.acquire_session(),
            Err(HandleError::Closed { .. })
        ));
        assert_eq!(h.active_sessions(), 1);
    }
}
