//! A bounded, backpressured in-memory [`Connection`] pair.
//!
//! Each direction is a bounded channel: a sender whose peer has not taken the previous
//! `capacity` messages waits in `poll_ready` (backpressure, never an unbounded queue).
//! Dropping or closing one end ends the other end's inbound stream (`poll_recv` gives
//! `Ready(None)`), which is how a test simulates a peer that goes away.

use std::task::{Context, Poll};

use futures::StreamExt;
use futures::channel::mpsc;

use super::{Connection, ConnectionError};

/// One end of an in-memory connection: sends `Out`, receives `In`. An in-process stand-in
/// for the `Execute` stream (udf §1.1), with a bounded buffer where gRPC has HTTP/2 flow
/// control (udf §1.4).
#[derive(Debug)]
pub struct MemoryConnection<Out, In> {
    tx: mpsc::Sender<Out>,
    rx: mpsc::Receiver<In>,
    send_closed: bool,
    recv_ended: bool,
}

/// Creates a connected pair; each direction buffers at most `capacity` messages (at least 1).
///
/// The first end sends `A` and receives `B`; the second the reverse. It plays the part of the
/// in-process gRPC server of Spark's `GrpcWorkerSessionConcurrencySuite` (udf §8.2). For a
/// worker session:
/// `let (engine, worker) = pair::<UdfRequest, UdfResponse>(16);`.
pub fn pair<A, B>(capacity: usize) -> (MemoryConnection<A, B>, MemoryConnection<B, A>) {
    // futures' bounded channel admits `buffer + senders` messages; one sender per direction.
    let buffer = capacity.max(1) - 1;
    let (tx_a, rx_a) = mpsc::channel(buffer);
    let (tx_b, rx_b) = mpsc::channel(buffer);
    (
        MemoryConnection {
            tx: tx_a,
            rx: rx_b,
            send_closed: false,
            recv_ended: false,
        },
        MemoryConnection {
            tx: tx_b,
            rx: rx_a,
            send_closed: false,
            recv_ended: false,
        },
    )
}

impl<Out, In> MemoryConnection<Out, In> {
    /// Abruptly drops both directions, as a crashed peer would: the other end sees its inbound
    /// stream end and its sends fail with [`ConnectionError::Closed`] — a stream ended without
    /// a terminator (udf §2 R10), as after the SIGKILL of udf §8.4 scenario 83.
    pub fn abort(&mut self) {
        self.tx.close_channel();
        self.rx.close();
        self.send_closed = true;
        self.recv_ended = true;
    }
}

impl<Out, In> Connection<Out, In> for MemoryConnection<Out, In> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        if self.send_closed {
            return Poll::Ready(Err(ConnectionError::Closed));
        }
        self.tx.poll_ready(cx).map_err(|_| ConnectionError::Closed)
    }

    fn start_send(&mut self, msg: Out) -> Result<(), ConnectionError> {
        if self.send_closed {
            return Err(ConnectionError::Closed);
        }
        self.tx.start_send(msg).map_err(|_| ConnectionError::Closed)
    }

    fn poll_flush(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        self.tx.close_channel();
        self.send_closed = true;
        Poll::Ready(Ok(()))
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<In, ConnectionError>>> {
        if self.recv_ended {
            return Poll::Ready(None);
        }
        match self.rx.poll_next_unpin(cx) {
            Poll::Ready(Some(m)) => Poll::Ready(Some(Ok(m))),
            Poll::Ready(None) => {
                self.recv_ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_active(&self) -> bool {
        // Usable while either direction is still open.
        !(self.tx.is_closed() && self.recv_ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::poll_fn;

    async fn send<O, I>(c: &mut MemoryConnection<O, I>, m: O) -> Result<(), ConnectionError> {
        poll_fn(|cx| c.poll_ready(cx)).await?;
        c.start_send(m)
    }

    #[test]
    fn messages_flow_both_ways_in_order() {
        futures::executor::block_on(async {
            let (mut a, mut b) = pair::<u32, &'static str>(4);
            for i in 0..3 {
                send(&mut a, i).await.unwrap();
            }
            send(&mut b, "x").await.unwrap();
            for i in 0..3 {
                assert_eq!(poll_fn(|cx| b.poll_recv(cx)).await.unwrap().unwrap(), i);
            }
            assert_eq!(poll_fn(|cx| a.poll_recv(cx)).await.unwrap().unwrap(), "x");
        });
    }

    #[test]
    fn bounded_sender_waits_for_the_receiver() {
        let (mut a, mut b) = pair::<u32, u32>(2);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut sent = 0;
        while let Poll::Ready(Ok(())) = a.poll_ready(&mut cx) {
            a.start_send(sent).unwrap();
            sent += 1;
            assert!(sent < 100, "no backpressure");
        }
        assert_eq!(sent, 2, "capacity 2 admits exactly two messages");
        assert!(matches!(b.poll_recv(&mut cx), Poll::Ready(Some(Ok(0)))));
        assert!(matches!(a.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    }

    #[test]
    fn close_and_abort_end_the_peer_stream() {
        let (mut a, mut b) = pair::<u32, u32>(2);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(a.poll_close(&mut cx).is_ready());
        assert!(matches!(b.poll_recv(&mut cx), Poll::Ready(None)));
        assert!(matches!(a.start_send(1), Err(ConnectionError::Closed)));
        b.abort();
        assert!(matches!(a.poll_recv(&mut cx), Poll::Ready(None)));
        assert!(!b.is_active());
    }
}
