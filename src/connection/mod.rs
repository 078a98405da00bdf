//! The [`Connection`] trait: one session's bidirectional stream of typed protocol messages.
//!
//! A connection moves whole protobuf messages (never bytes): the engine side of a worker
//! session is a `Connection<UdfRequest, UdfResponse>`, the worker side a
//! `Connection<UdfResponse, UdfRequest>`. How a connection is obtained (a socket per session,
//! an HTTP/2 stream on a shared channel, an in-memory pair) is the dispatcher's business, not
//! the session's.
//!
//! Anything that is both a [`Sink`] of outbound messages and a [`Stream`] of
//! `Result<inbound, E>` is a connection through the blanket impl, so
//! `tokio_util::codec::Framed` and channel pairs plug in without wrapper code; [`Pair`] joins
//! a separate sink and stream (for example a gRPC request sender and response stream).
//! [`pair`] gives a bounded, backpressured in-memory pair for tests and for running an
//! engine and a worker in one process. [`ConnectionExt`] gives every connection async
//! `send_message` / `recv_message` / `close_send`, for driving one by hand.

mod ext;
#[cfg(feature = "tokio")]
pub mod framed;
mod memory;

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Sink, Stream};

pub use ext::{CloseSend, ConnectionExt, RecvMessage, SendMessage};
pub use memory::{MemoryConnection, pair};

/// A failure of the transport underneath a session: the channel is unusable afterwards. The
/// engine side settles `TransportFailed` (udf §4.5, the stream's `onError`); the worker side
/// ends the session without sending anything more (udf §2 R8).
///
/// Cloneable so it can be carried inside a [`Termination`](crate::worker::engine::Termination),
/// which every `close()` call returns by value.
#[derive(Clone)]
#[non_exhaustive]
pub enum ConnectionError {
    /// The connection was closed (locally, or the peer went away) while it was still needed.
    Closed,
    /// An I/O, codec or RPC error reported by the transport; the original error is kept as
    /// the [`source`](StdError::source).
    Transport(Arc<dyn StdError + Send + Sync + 'static>),
}

impl ConnectionError {
    /// Wraps any transport error: the cause a `TransportFailed` carries (udf §4.1).
    pub fn transport<E>(error: E) -> Self
    where
        E: Into<Box<dyn StdError + Send + Sync + 'static>>,
    {
        Self::Transport(Arc::from(error.into()))
    }
}

impl fmt::Debug for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Closed => f.write_str("Closed"),
            Self::Transport(e) => f.debug_tuple("Transport").field(&e.to_string()).finish(),
        }
    }
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Closed => f.write_str("connection closed"),
            // The transport's error is the source, not repeated here.
            Self::Transport(_) => f.write_str("transport error"),
        }
    }
}

impl StdError for ConnectionError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::Closed => None,
            Self::Transport(e) => Some(&**e),
        }
    }
}

impl From<std::io::Error> for ConnectionError {
    fn from(e: std::io::Error) -> Self {
        Self::transport(e)
    }
}

/// One session's bidirectional channel of typed messages: `Out` is what this side sends, `In`
/// what it receives. It stands for one `Execute` stream (udf §1.1: one stream is one
/// `WorkerSession`), whatever carries it.
///
/// The methods follow [`Sink`] and [`Stream`] (readiness, buffered send, flush, close,
/// receive) but take `&mut self`, so implementations must be [`Unpin`]-friendly. Sessions
/// drive sending and receiving from one task, concurrently: a connection must not make
/// `poll_recv` wait for a pending send or the reverse.
///
/// Errors are terminal: after any method returned an error the session stops using the
/// connection.
pub trait Connection<Out, In> {
    /// Polls until one more message can be buffered for sending (backpressure: what HTTP/2
    /// flow control gives a gRPC stream, udf §1.4).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>>;

    /// Buffers one message (one udf §1.2 envelope); only valid after `poll_ready` returned
    /// `Ready(Ok(()))`.
    fn start_send(&mut self, msg: Out) -> Result<(), ConnectionError>;

    /// Polls until every buffered message has been handed to the transport (on the engine
    /// side a failed write settles `TransportFailed`, udf §4.7).
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>>;

    /// Flushes and closes the sending half (a half-close: receiving may go on; udf §2 R9).
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>>;

    /// Polls for the next inbound message; `Ready(None)` means the peer ended its side
    /// (without a terminator, a failure: udf §2 R10).
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<In, ConnectionError>>>;

    /// Whether the transport is still usable (udf §3 `WorkerConnection.isActive`). The
    /// default answers `true`; implementations that can tell otherwise override it.
    fn is_active(&self) -> bool {
        true
    }
}

impl<T, Out, In, E> Connection<Out, In> for T
where
    T: Sink<Out, Error = E> + Stream<Item = Result<In, E>> + Unpin,
    E: Into<ConnectionError>,
{
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        Sink::poll_ready(Pin::new(self), cx).map_err(Into::into)
    }

    fn start_send(&mut self, msg: Out) -> Result<(), ConnectionError> {
        Sink::start_send(Pin::new(self), msg).map_err(Into::into)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        Sink::poll_flush(Pin::new(self), cx).map_err(Into::into)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        Sink::poll_close(Pin::new(self), cx).map_err(Into::into)
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<In, ConnectionError>>> {
        Stream::poll_next(Pin::new(self), cx).map(|o| o.map(|r| r.map_err(Into::into)))
    }
}

/// A separate sink and stream joined into one [`Sink`] + [`Stream`], and so into a
/// [`Connection`] through the blanket impl (for example a gRPC request sender with the
/// response stream: the two halves of the udf §1.1 `Execute` call).
#[pin_project::pin_project]
#[derive(Debug)]
pub struct Pair<Si, St> {
    #[pin]
    sink: Si,
    #[pin]
    stream: St,
}

impl<Si, St> Pair<Si, St> {
    /// Joins `sink` (outbound) and `stream` (inbound) into one `Execute` stream (udf §1.1).
    pub fn new(sink: Si, stream: St) -> Self {
        Self { sink, stream }
    }

    /// Splits the pair back into its halves (the request and response sides of udf §1.1).
    pub fn into_inner(self) -> (Si, St) {
        (self.sink, self.stream)
    }
}

impl<Si: Sink<Out>, St, Out> Sink<Out> for Pair<Si, St> {
    type Error = Si::Error;
    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.project().sink.poll_ready(cx)
    }
    fn start_send(self: Pin<&mut Self>, item: Out) -> Result<(), Self::Error> {
        self.project().sink.start_send(item)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.project().sink.poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.project().sink.poll_close(cx)
    }
}

impl<Si, St: Stream> Stream for Pair<Si, St> {
    type Item = St::Item;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.project().stream.poll_next(cx)
    }
}
