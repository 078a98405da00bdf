//! Graceful drain of a Spark Connect server (tether's own; Spark 4.3.0 has none, its
//! server stops with its driver): health `NOT_SERVING`, no new session or execution, what
//! runs served to its end until a deadline, then interrupted with Spark's error. The
//! deployment story is in `docs/deployment.md`.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use super::{ConnectService, QueryEngine};
use crate::execution::ExecuteKey;

/// How long [`ConnectService::drain`] waits, after its deadline canceled what was left,
/// for the clients to read their `OPERATION_CANCELED` and release (Spark clients release an
/// execution whose stream failed, rx §6.2): at most 5 s, less when they release sooner.
pub const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// How long every live session must have been quiet (no RPC) for [`ConnectService::drain`]
/// to end once no execution is live: 1 s, so that a client that just released its last
/// execution reaches the server with its ReleaseSession (PySpark's `spark.stop()`, rx §5.6)
/// rather than retrying it against a server that is gone. Bounded by the drain's deadline.
pub const SESSION_QUIET: Duration = Duration::from_secs(1);

/// How often a drain looks at the registry (rx §5.1) while it waits.
const POLL: Duration = Duration::from_millis(20);

/// What a [`ConnectService::drain`] did: every execution that was live when it began is
/// accounted for (released or abandoned by the end, canceled at the deadline, or left
/// registered when the drain gave up; rx §5.1 registry, rx §2.2 T9 interrupt).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// Live executions when the drain began (rx §5.1's registry).
    pub live_at_start: usize,
    /// The executions the deadline canceled
    /// ([`ExecutionManager::cancel_all`](crate::execution::ExecutionManager::cancel_all)):
    /// their clients got `OPERATION_CANCELED` (or the execution's own error) right after the
    /// responses already sent; what was still unsent was dropped. Empty when everything
    /// ended in time.
    pub canceled: Vec<ExecuteKey>,
    /// The executions the drain abandoned
    /// ([`ExecutionManager::abandon_detached`](crate::execution::ExecutionManager::abandon_detached),
    /// rx §5.3) because no client was attached to them: for [`DRAIN_GRACE`] during the
    /// drain, or at its end. A client that died, one told `OPERATION_CANCELED` that went
    /// away without releasing (so a key can be both `canceled` and `abandoned`), or one
    /// handed its whole result that was still reading it from its buffers at the end (its
    /// release then finds no server). Empty after a clean drain.
    pub abandoned: Vec<ExecuteKey>,
    /// The executions still registered, with a client attached, when the drain returned: a
    /// client still reading what was in flight, neither done nor released within
    /// [`DRAIN_GRACE`] after the deadline. The server drops them when it stops, cutting
    /// their streams. Empty after a clean drain.
    pub left: Vec<ExecuteKey>,
    /// Sessions still open when the drain returned (rx §5.6): clients that did not release
    /// their session ([`SESSION_QUIET`] after their last RPC, or by the deadline). Their
    /// next request meets another server (through a proxy) or none.
    pub sessions_open: usize,
    /// How long the drain took, wall clock.
    pub elapsed: Duration,
}

impl DrainReport {
    /// Whether every execution ended on its own before the deadline: nothing canceled,
    /// abandoned or left (rx §5.1). Open sessions do not count: they hold no query.
    pub fn is_clean(&self) -> bool {
        self.canceled.is_empty() && self.abandoned.is_empty() && self.left.is_empty()
    }
}

/// One line for a log: `drained live_at_start=N canceled=N abandoned=N left=N
/// sessions_open=N elapsed_ms=N`, then the operation ids canceled, abandoned and left, if
/// any (rx §5.1 keys).
impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drained live_at_start={} canceled={} abandoned={} left={} sessions_open={} \
             elapsed_ms={}",
            self.live_at_start,
            self.canceled.len(),
            self.abandoned.len(),
            self.left.len(),
            self.sessions_open,
            self.elapsed.as_millis()
        )?;
        for (name, keys) in [
            ("canceled", &self.canceled),
            ("abandoned", &self.abandoned),
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

impl<E: QueryEngine> ConnectService<E> {
    /// Drains the service for a shutdown or a rolling restart (docs/deployment.md;
    /// tether's own, rx §5.1 registry): health goes `NOT_SERVING` (connect §7.2), the
    /// manager refuses new sessions and executions with the retryable `SERVER_DRAINING`
    /// ([`ExecutionManager::drain`](crate::execution::ExecutionManager::drain)), and every
    /// live execution is served (streams, ReattachExecute, ReleaseExecute) until it is
    /// released or abandoned, no handler runs ([`rpcs_in_flight`](Self::rpcs_in_flight)) and
    /// every session has been quiet for [`SESSION_QUIET`] (or released), or until `deadline`
    /// from now. At the deadline every execution still live
    /// is canceled
    /// ([`ExecutionManager::cancel_all`](crate::execution::ExecutionManager::cancel_all):
    /// `OPERATION_CANCELED` is its next event, rx §2.2 T9), every connection accepted
    /// through [`connections`](Self::connections) is closed (so that a client reattaches
    /// and reads that error now, instead of after the responses in flight), and the drain
    /// waits at most [`DRAIN_GRACE`] more for those clients to release; what is detached
    /// then is abandoned. So it takes at most `deadline` + [`DRAIN_GRACE`]. Returns what
    /// happened; stop the `tonic` server afterwards (its graceful shutdown ends the open
    /// streams). Bound that shutdown too: a stream that never reached a handler (a request
    /// whose body never came) keeps a graceful shutdown waiting; when
    /// [`rpcs_in_flight`](Self::rpcs_in_flight) is 0 and no execution is left after a few
    /// seconds, [`close_connections`](Self::close_connections) ends such streams, as
    /// `examples/connect_server` does (its `HARD_STOP` and `CLOSE_WAIT`).
    ///
    /// Calling it again (or on a clone) drains again, with the state as it is then. A
    /// `deadline` too far to represent (`Duration::MAX`) waits without one.
    pub async fn drain(&self, deadline: Duration) -> DrainReport {
        let start = Instant::now();
        self.health().set_serving(false).await;
        let manager = self.manager();
        manager.drain();
        let live_at_start = manager.execution_count();
        // Executions no client has been attached to for DRAIN_GRACE (a client that died, or
        // one told and gone without releasing) are abandoned as the drain goes: waiting for
        // them would only hold the drain to its deadline. Not those whose client was handed
        // their whole result: it may still be reading its buffers, and will release.
        let abandoned = std::sync::Mutex::new(Vec::new());
        let done = || {
            let gone = manager.abandon_detached(DRAIN_GRACE, false);
            abandoned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend(gone);
            manager.execution_count() == 0
                && self.rpcs_in_flight() == 0
                && manager
                    .sessions_quiet_for()
                    .is_none_or(|quiet| quiet >= SESSION_QUIET)
        };
        // Waits until `done` or `until` (`None`: no deadline, one too far to represent);
        // returns whether it is done.
        let wait = |until: Option<Instant>| async move {
            loop {
                if done() {
                    return true;
                }
                if until.is_some_and(|until| Instant::now() >= until) {
                    return false;
                }
                tokio::time::sleep(POLL).await;
            }
        };
        let mut canceled = Vec::new();
        if !wait(start.checked_add(deadline)).await && manager.execution_count() > 0 {
            canceled = manager.cancel_all();
            // Their open streams hold responses the clients have not read yet, ahead of the
            // error: cut the connections, so the clients reattach and get the error now.
            self.close_connections();
            tracing::warn!(
                canceled = canceled.len(),
                live = manager.execution_count(),
                "drain deadline passed: canceled every live execution (OPERATION_CANCELED now, \
                 held responses dropped, connections closed)"
            );
            wait(Instant::now().checked_add(DRAIN_GRACE)).await;
        }
        // Whoever is not attached now will not come back: nobody to tell.
        let mut abandoned = abandoned
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        abandoned.extend(manager.abandon_detached(Duration::ZERO, true));
        DrainReport {
            live_at_start,
            canceled,
            abandoned,
            left: manager.execution_keys(),
            sessions_open: manager.stats().sessions,
            elapsed: start.elapsed(),
        }
    }
}

/// A server connection that a drain's deadline can close (from
/// [`ConnectService::connections`]): once its token is canceled, every read and write fails
/// (`ConnectionAborted`), so the server drops the connection and its client sees it lost
/// (gRPC `UNAVAILABLE`, which Spark clients retry with a ReattachExecute, rx §6.2). A
/// connection waiting to read is woken by the cut. Carries the wrapped connection's
/// `connect_info` (tonic's `Connected`), so request extensions stay as they were.
#[pin_project::pin_project]
pub struct DrainConnection<IO> {
    #[pin]
    io: IO,
    token: CancellationToken,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<IO> DrainConnection<IO> {
    pub(super) fn new(io: IO, token: CancellationToken) -> Self {
        Self {
            io,
            cut: Box::pin(token.clone().cancelled_owned()),
            token,
        }
    }

    /// The wrapped connection (the transport under rx §6.2's streams).
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Whether a drain's deadline closed this connection (its clients reattach, rx §6.2).
    pub fn is_cut(&self) -> bool {
        self.token.is_cancelled()
    }

    fn aborted() -> io::Error {
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "closed by the server's drain deadline (its executions were canceled)",
        )
    }
}

impl<IO> fmt::Debug for DrainConnection<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DrainConnection")
            .field("cut", &self.is_cut())
            .finish_non_exhaustive()
    }
}

impl<IO: Connected> Connected for DrainConnection<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead> AsyncRead for DrainConnection<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        // Polled first, so that the cut wakes a connection waiting to read.
        if this.cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(Self::aborted()));
        }
        this.io.poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite> AsyncWrite for DrainConnection<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.token.is_cancelled() {
            return Poll::Ready(Err(Self::aborted()));
        }
        self.project().io.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.token.is_cancelled() {
            return Poll::Ready(Err(Self::aborted()));
        }
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}
