//! The server side of an accepted connection that a drain can cut ([`DrainConnection`], from
//! [`ConnectService::connections`](super::ConnectService::connections)): tether's own, for
//! the drain of docs/deployment.md (Spark 4.3.0's server has no drain).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

/// A server connection that a drain's deadline can close (from
/// [`ConnectService::connections`](super::ConnectService::connections)): once its token is
/// canceled, every read and write fails (`ConnectionAborted`), so the server drops the
/// connection and its client sees it lost (gRPC `UNAVAILABLE`, which Spark clients retry
/// with a ReattachExecute, rx §6.2). A connection waiting to read is woken by the cut.
/// Carries the wrapped connection's `connect_info` (tonic's `Connected`), so request
/// extensions stay as they were.
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
