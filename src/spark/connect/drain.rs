//! Graceful drain of a Spark Connect server (tether's own; Spark 4.3.0 has none, its
//! server stops with its driver): health `NOT_SERVING`, no new session or execution, what
//! runs served to its end until a deadline, then interrupted with Spark's error. The
//! deployment story is in `docs/deployment.md`.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use super::{ConnectService, QueryEngine};
use crate::execution::{DrainReport, DrainStep};

impl<E: QueryEngine> ConnectService<E> {
    /// Drains the service for a shutdown or a rolling restart (docs/deployment.md; the
    /// rule is [`Drain`](crate::execution::Drain), rx §5.1 registry): health goes
    /// `NOT_SERVING` (connect §7.2), new sessions and executions are refused with the
    /// retryable `SERVER_DRAINING`, and what is live is served until it ends or until
    /// `deadline` from now; then it is canceled (`OPERATION_CANCELED`, rx §2.2 T9), every
    /// connection accepted through [`connections`](Self::connections) is closed so that
    /// clients read that error now, and the drain waits at most
    /// [`DRAIN_GRACE`](crate::execution::DRAIN_GRACE) more. Its handlers in flight
    /// ([`rpcs_in_flight`](Self::rpcs_in_flight)) hold it too. Sleeps on the manager's
    /// clock. [`ConnectServer`](super::ConnectServer) runs it on its shutdown signal; a
    /// server of your own stops its transport afterwards.
    ///
    /// Calling it again (or on a clone) drains again, with the state as it is then. A
    /// `deadline` too far to represent (`Duration::MAX`) waits without one.
    pub async fn drain(&self, deadline: Duration) -> DrainReport {
        self.drain_with_grace(deadline, crate::execution::DRAIN_GRACE)
            .await
    }

    /// [`drain`](Self::drain) with `grace` instead of
    /// [`DRAIN_GRACE`](crate::execution::DRAIN_GRACE) ([`Drain::with_grace`](crate::execution::Drain::with_grace)).
    pub(super) async fn drain_with_grace(
        &self,
        deadline: Duration,
        grace: Duration,
    ) -> DrainReport {
        self.health().set_serving(false).await;
        let manager = self.manager();
        let clock = manager.clock().clone();
        let mut drain = manager.begin_drain(deadline).with_grace(grace);
        loop {
            match manager.step_drain(&mut drain, self.rpcs_in_flight()) {
                DrainStep::Wait(until) => clock.sleep_until(until).await,
                DrainStep::CancelAll => {
                    // Their open streams hold responses the clients have not read yet, ahead
                    // of the error: cut the connections, so the clients reattach and get the
                    // error now.
                    self.close_connections();
                    tracing::warn!(
                        live = manager.execution_count(),
                        "drain deadline passed: canceled every live execution \
                         (OPERATION_CANCELED now, held responses dropped, connections closed)"
                    );
                }
                DrainStep::Done | DrainStep::Abandon { .. } => break,
            }
        }
        manager.drain_report(&drain)
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
