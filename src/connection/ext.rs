//! Async forms of [`Connection`]'s poll methods, for driving a connection by hand: a test of a
//! custom transport, a scripted peer, a tool that speaks the udf §1.2 envelopes directly.
//! Sessions do not need them; they poll their connection from their own task.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use super::{Connection, ConnectionError};

/// Async forms of [`Connection`]'s poll methods, for every connection (a blanket impl):
/// send with backpressure (udf §1.4), receive, half-close (udf §2 R9).
///
/// The names differ from `futures::SinkExt::send` / `flush` / `close` on purpose: a
/// connection that is also a [`Sink`](futures::Sink) (through the blanket [`Connection`]
/// impl) can have both traits in scope without an ambiguous method call. The futures are
/// named types, so they are `Send` whenever the connection and the message are.
///
/// ```
/// use tether::connection::{ConnectionExt, pair};
///
/// # futures::executor::block_on(async {
/// let (mut engine, mut worker) = pair::<String, String>(4);
/// engine.send_message("init".to_owned()).await?;
/// assert_eq!(worker.recv_message().await.transpose()?, Some("init".to_owned()));
/// engine.close_send().await?;
/// assert!(worker.recv_message().await.is_none(), "the half-close ends the peer's stream");
/// # Ok::<(), tether::connection::ConnectionError>(())
/// # }).unwrap();
/// ```
pub trait ConnectionExt<Out, In>: Connection<Out, In> {
    /// Waits until the connection takes one more message (backpressure, udf §1.4), buffers
    /// `msg`, then waits until it is handed to the transport (`poll_ready`, `start_send`,
    /// `poll_flush`).
    ///
    /// Output: the connection's error, which is terminal (stop using the connection); on
    /// the engine side a failed write settles `TransportFailed` (udf §4.7).
    fn send_message(&mut self, msg: Out) -> SendMessage<'_, Self, Out, In> {
        SendMessage {
            conn: self,
            msg: Some(msg),
            _in: PhantomData,
        }
    }

    /// Waits for the next inbound message (`poll_recv`): `None` once the peer ended its side,
    /// which without a terminator is a failure (udf §2 R10).
    fn recv_message(&mut self) -> RecvMessage<'_, Self, Out, In> {
        RecvMessage {
            conn: self,
            _msgs: PhantomData,
        }
    }

    /// Flushes and closes the sending half (`poll_close`: a half-close, receiving may go on;
    /// udf §2 R9).
    ///
    /// Output: the connection's error, which is terminal.
    fn close_send(&mut self) -> CloseSend<'_, Self, Out, In> {
        CloseSend {
            conn: self,
            _msgs: PhantomData,
        }
    }
}

impl<C, Out, In> ConnectionExt<Out, In> for C where C: Connection<Out, In> + ?Sized {}

/// The future of [`ConnectionExt::send_message`]: `Result<(), ConnectionError>`, after the
/// connection had room (udf §1.4) and flushed the message.
#[must_use = "futures do nothing unless awaited"]
#[derive(Debug)]
pub struct SendMessage<'a, C: ?Sized, Out, In> {
    conn: &'a mut C,
    /// The message until the connection has taken it.
    msg: Option<Out>,
    _in: PhantomData<fn() -> In>,
}

// The message is moved out whole and never pinned, so the future is `Unpin` whatever it is.
impl<C: ?Sized, Out, In> Unpin for SendMessage<'_, C, Out, In> {}

impl<C, Out, In> Future for SendMessage<'_, C, Out, In>
where
    C: Connection<Out, In> + ?Sized,
{
    type Output = Result<(), ConnectionError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.msg.is_some() {
            ready!(this.conn.poll_ready(cx))?;
            if let Some(msg) = this.msg.take() {
                this.conn.start_send(msg)?;
            }
        }
        this.conn.poll_flush(cx)
    }
}

/// The future of [`ConnectionExt::recv_message`]: the next message, `None` at the peer's end
/// (udf §2 R10).
#[must_use = "futures do nothing unless awaited"]
#[derive(Debug)]
pub struct RecvMessage<'a, C: ?Sized, Out, In> {
    conn: &'a mut C,
    _msgs: PhantomData<fn() -> (Out, In)>,
}

impl<C, Out, In> Future for RecvMessage<'_, C, Out, In>
where
    C: Connection<Out, In> + ?Sized,
{
    type Output = Option<Result<In, ConnectionError>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().conn.poll_recv(cx)
    }
}

/// The future of [`ConnectionExt::close_send`]: `Result<(), ConnectionError>`, once the
/// sending half is flushed and closed (udf §2 R9).
#[must_use = "futures do nothing unless awaited"]
#[derive(Debug)]
pub struct CloseSend<'a, C: ?Sized, Out, In> {
    conn: &'a mut C,
    _msgs: PhantomData<fn() -> (Out, In)>,
}

impl<C, Out, In> Future for CloseSend<'_, C, Out, In>
where
    C: Connection<Out, In> + ?Sized,
{
    type Output = Result<(), ConnectionError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().conn.poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use futures::FutureExt;
    use futures::executor::block_on;

    use super::ConnectionExt;
    use crate::connection::{ConnectionError, pair};

    /// udf §1.4: a full queue holds the send back until the peer reads; the message is sent
    /// once, in order; the half-close ends the peer's stream after what was sent (udf §2 R9).
    #[test]
    fn send_waits_for_room_and_delivers_in_order() {
        let (mut a, mut b) = pair::<u32, u32>(1);
        block_on(a.send_message(1)).unwrap();
        let mut second = a.send_message(2);
        assert!((&mut second).now_or_never().is_none(), "the queue is full");
        assert_eq!(block_on(b.recv_message()).transpose().unwrap(), Some(1));
        assert_eq!(second.now_or_never().map(|r| r.is_ok()), Some(true));
        block_on(a.close_send()).unwrap();
        assert_eq!(block_on(b.recv_message()).transpose().unwrap(), Some(2));
        assert!(block_on(b.recv_message()).is_none());
        // The other direction still works after the half-close.
        block_on(b.send_message(3)).unwrap();
        assert_eq!(block_on(a.recv_message()).transpose().unwrap(), Some(3));
    }

    /// A send into a connection whose peer is gone fails with the connection's error, and
    /// the futures are `Send` for a `Send` connection and message (spawnable).
    #[test]
    fn a_send_to_a_dropped_peer_fails() {
        fn assert_send<T: Send>(_: &T) {}
        let (mut a, b) = pair::<String, String>(1);
        drop(b);
        let send = a.send_message("x".to_owned());
        assert_send(&send);
        match block_on(send) {
            Err(ConnectionError::Closed) => {}
            other => panic!("expected Closed, got {other:?}"),
        }
        assert!(matches!(
            a.recv_message()
                .poll_unpin(&mut std::task::Context::from_waker(
                    futures::task::noop_waker_ref()
                )),
            Poll::Ready(None)
        ));
    }
}
