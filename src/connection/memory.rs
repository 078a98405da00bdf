//! A bounded, backpressured in-memory [`Connection`] pair.
//!
//! Each direction is one bounded queue behind a lock: a sender whose peer has not taken the
//! previous `capacity` messages waits in `poll_ready` (backpressure, never an unbounded
//! queue). Dropping or closing one end ends the other end's inbound stream (`poll_recv`
//! gives `Ready(None)` once the messages already queued are read), which is how a test
//! simulates a peer that goes away.
//!
//! Per message the queue costs one lock on each side and no allocation (the ring buffer is
//! allocated once, `capacity` slots). An end is woken only when what it waits for changed:
//! the receiver when a message arrives or the sender goes away, and only if it found the
//! queue empty; the sender when a slot frees up or the receiver goes away, and only if it
//! found the queue full. So each wait costs at most one wake-up, however many messages
//! move while the waiting task runs.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::sync::{Mutex, MutexGuard};

use super::{Connection, ConnectionError};

/// One direction of a pair: the queued messages and who waits on them.
struct Queue<T> {
    items: VecDeque<T>,
    capacity: usize,
    /// The receiving end, registered when it found no message (woken by a send or the end).
    receiver: Option<Waker>,
    /// The sending end, registered when it found no room (woken by a receive or the end).
    sender: Option<Waker>,
    /// No more messages come: the sending end half-closed, aborted or was dropped.
    sender_gone: bool,
    /// Nothing more is read: the receiving end aborted or was dropped (sends fail).
    receiver_gone: bool,
}

/// A [`Queue`] shared by the two ends, behind the crate's loom-aware lock (`crate::sync`).
/// The lock is never held across a wake-up.
struct Shared<T>(Mutex<Queue<T>>);

impl<T> Shared<T> {
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self(Mutex::new(Queue {
            items: VecDeque::with_capacity(capacity),
            capacity,
            receiver: None,
            sender: None,
            sender_gone: false,
            receiver_gone: false,
        })))
    }

    /// Locks the queue; a poisoned lock is taken over (every step leaves it consistent).
    fn lock(&self) -> MutexGuard<'_, Queue<T>> {
        self.0.lock()
    }

    /// The sending end goes away: the receiver reads what is queued, then the end.
    fn close_sender(&self) {
        let waker = {
            let mut q = self.lock();
            q.sender_gone = true;
            q.receiver.take()
        };
        wake(waker);
    }

    /// The receiving end goes away: queued messages are dropped, later sends fail.
    fn close_receiver(&self) {
        let (waker, dropped) = {
            let mut q = self.lock();
            q.receiver_gone = true;
            (q.sender.take(), std::mem::take(&mut q.items))
        };
        // Dropped outside the lock: a message's destructor never runs under it.
        drop(dropped);
        wake(waker);
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}

/// Registers `cx`'s waker in `slot`, cloning only when it is not the one already there.
fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(waker) if waker.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

/// One end of an in-memory connection: sends `Out`, receives `In`. An in-process stand-in
/// for the `Execute` stream (udf §1.1), with a bounded buffer where gRPC has HTTP/2 flow
/// control (udf §1.4).
pub struct MemoryConnection<Out, In> {
    tx: Arc<Shared<Out>>,
    rx: Arc<Shared<In>>,
    /// Messages `start_send` may still queue without looking at the queue: the free slots
    /// the last `poll_ready` saw (only this end fills the queue, so they stay free).
    credit: usize,
    send_closed: bool,
    recv_ended: bool,
}

impl<Out, In> fmt::Debug for MemoryConnection<Out, In> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryConnection")
            .field("send_closed", &self.send_closed)
            .field("recv_ended", &self.recv_ended)
            .finish_non_exhaustive()
    }
}

/// Creates a connected pair; each direction buffers at most `capacity` messages (at least 1).
///
/// The first end sends `A` and receives `B`; the second the reverse. It plays the part of the
/// in-process gRPC server of Spark's `GrpcWorkerSessionConcurrencySuite` (udf §8.2). For a
/// worker session:
/// `let (engine, worker) = pair::<UdfRequest, UdfResponse>(16);`.
pub fn pair<A, B>(capacity: usize) -> (MemoryConnection<A, B>, MemoryConnection<B, A>) {
    let capacity = capacity.max(1);
    let (a_to_b, b_to_a) = (Shared::new(capacity), Shared::new(capacity));
    (
        MemoryConnection::new(Arc::clone(&a_to_b), Arc::clone(&b_to_a)),
        MemoryConnection::new(b_to_a, a_to_b),
    )
}

impl<Out, In> MemoryConnection<Out, In> {
    fn new(tx: Arc<Shared<Out>>, rx: Arc<Shared<In>>) -> Self {
        Self {
            tx,
            rx,
            credit: 0,
            send_closed: false,
            recv_ended: false,
        }
    }

    /// Abruptly drops both directions, as a crashed peer would: the other end sees its inbound
    /// stream end and its sends fail with [`ConnectionError::Closed`] — a stream ended without
    /// a terminator (udf §2 R10), as after the SIGKILL of udf §8.4 scenario 83.
    pub fn abort(&mut self) {
        if !self.send_closed {
            self.tx.close_sender();
        }
        self.rx.close_receiver();
        self.send_closed = true;
        self.recv_ended = true;
    }
}

impl<Out, In> Drop for MemoryConnection<Out, In> {
    fn drop(&mut self) {
        if !self.send_closed {
            self.tx.close_sender();
        }
        // Always: an end that read its stream's end still drops what it never read.
        self.rx.close_receiver();
    }
}

impl<Out, In> Connection<Out, In> for MemoryConnection<Out, In> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        if self.send_closed {
            return Poll::Ready(Err(ConnectionError::Closed));
        }
        if self.credit > 0 {
            return Poll::Ready(Ok(()));
        }
        let mut q = self.tx.lock();
        if q.receiver_gone {
            return Poll::Ready(Err(ConnectionError::Closed));
        }
        self.credit = q.capacity - q.items.len();
        if self.credit > 0 {
            return Poll::Ready(Ok(()));
        }
        register(&mut q.sender, cx);
        Poll::Pending
    }

    fn start_send(&mut self, msg: Out) -> Result<(), ConnectionError> {
        if self.send_closed {
            return Err(ConnectionError::Closed);
        }
        let waker = {
            let mut q = self.tx.lock();
            if q.receiver_gone {
                return Err(ConnectionError::Closed);
            }
            // Full only when `poll_ready` was skipped: refused, as futures' bounded sender
            // refuses it, so the bound holds. Not `Closed`: the connection is not closed, the
            // caller broke the `Connection` contract (udf §1.4 backpressure).
            if q.items.len() >= q.capacity {
                return Err(ConnectionError::transport(
                    "start_send on a full in-memory queue without poll_ready: the message was not sent",
                ));
            }
            q.items.push_back(msg);
            self.credit = q.capacity - q.items.len();
            q.receiver.take()
        };
        wake(waker);
        Ok(())
    }

    fn poll_flush(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        if !self.send_closed {
            self.send_closed = true;
            self.tx.close_sender();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<In, ConnectionError>>> {
        if self.recv_ended {
            return Poll::Ready(None);
        }
        let (message, waker) = {
            let mut q = self.rx.lock();
            match q.items.pop_front() {
                // The sender waits only while the queue is full: this pop is the room it
                // waits for.
                Some(message) => (message, q.sender.take()),
                None if q.sender_gone => {
                    drop(q);
                    self.recv_ended = true;
                    return Poll::Ready(None);
                }
                None => {
                    register(&mut q.receiver, cx);
                    return Poll::Pending;
                }
            }
        };
        wake(waker);
        Poll::Ready(Some(Ok(message)))
    }

    fn is_active(&self) -> bool {
        // Usable while either direction is still open.
        let send_over = self.send_closed || self.tx.lock().receiver_gone;
        !(send_over && self.recv_ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::ConnectionExt;

    #[test]
    fn messages_flow_both_ways_in_order() {
        futures::executor::block_on(async {
            let (mut a, mut b) = pair::<u32, &'static str>(4);
            for i in 0..3 {
                a.send_message(i).await.unwrap();
            }
            b.send_message("x").await.unwrap();
            for i in 0..3 {
                assert_eq!(b.recv_message().await.unwrap().unwrap(), i);
            }
            assert_eq!(a.recv_message().await.unwrap().unwrap(), "x");
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

    /// A waker that counts its wake-ups.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        (Arc::clone(&count), Waker::from(count))
    }

    fn wakes(count: &Count) -> usize {
        count.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn a_waiting_receiver_is_woken_once_per_wait() {
        let (mut a, mut b) = pair::<u32, u32>(4);
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        assert!(b.poll_recv(&mut cx).is_pending());
        assert!(
            b.poll_recv(&mut cx).is_pending(),
            "registered twice, still one wait"
        );
        let noop = futures::task::noop_waker();
        let mut sender_cx = Context::from_waker(&noop);
        for i in 0..3 {
            assert!(a.poll_ready(&mut sender_cx).is_ready());
            a.start_send(i).unwrap();
        }
        assert_eq!(
            wakes(&count),
            1,
            "three messages, one wake-up of the waiting receiver"
        );
        for i in 0..3 {
            assert!(matches!(b.poll_recv(&mut cx), Poll::Ready(Some(Ok(m))) if m == i));
        }
        assert_eq!(
            wakes(&count),
            1,
            "a receiver that finds messages is not woken"
        );
        assert!(b.poll_recv(&mut cx).is_pending());
        assert!(a.poll_close(&mut sender_cx).is_ready());
        assert_eq!(wakes(&count), 2, "the end wakes the waiting receiver");
        assert!(matches!(b.poll_recv(&mut cx), Poll::Ready(None)));
    }

    #[test]
    fn a_sender_waiting_for_room_is_woken_by_a_receive_only() {
        let (mut a, mut b) = pair::<u32, u32>(2);
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        for i in 0..2 {
            assert!(matches!(a.poll_ready(&mut cx), Poll::Ready(Ok(()))));
            a.start_send(i).unwrap();
        }
        assert!(a.poll_ready(&mut cx).is_pending());
        assert_eq!(wakes(&count), 0);
        let noop = futures::task::noop_waker();
        let mut receiver_cx = Context::from_waker(&noop);
        assert!(b.poll_recv(&mut receiver_cx).is_ready());
        assert_eq!(wakes(&count), 1, "a freed slot wakes the waiting sender");
        assert!(b.poll_recv(&mut receiver_cx).is_ready());
        assert_eq!(wakes(&count), 1, "nobody waits: no wake-up");
        assert!(matches!(a.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    }

    #[test]
    fn a_gone_receiver_wakes_the_sender_and_fails_its_sends() {
        let (mut a, b) = pair::<u32, u32>(1);
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        assert!(a.poll_ready(&mut cx).is_ready());
        a.start_send(7).unwrap();
        assert!(a.poll_ready(&mut cx).is_pending());
        drop(b);
        assert_eq!(wakes(&count), 1);
        assert!(matches!(
            a.poll_ready(&mut cx),
            Poll::Ready(Err(ConnectionError::Closed))
        ));
        assert!(matches!(a.poll_recv(&mut cx), Poll::Ready(None)));
        assert!(!a.is_active());
    }

    #[test]
    fn a_send_without_readiness_never_exceeds_the_bound() {
        let (mut a, mut b) = pair::<u32, u32>(1);
        let noop = futures::task::noop_waker();
        let mut cx = Context::from_waker(&noop);
        a.start_send(1).unwrap();
        // Refused as a broken contract, not reported as a closed connection: it is open.
        match a.start_send(2) {
            Err(e @ ConnectionError::Transport(_)) => assert!(
                std::error::Error::source(&e)
                    .is_some_and(|s| s.to_string().contains("without poll_ready")),
                "{e:?}"
            ),
            other => panic!("expected a transport error, got {other:?}"),
        }
        assert!(a.is_active());
        assert!(matches!(b.poll_recv(&mut cx), Poll::Ready(Some(Ok(1)))));
        assert!(b.poll_recv(&mut cx).is_pending());
        // Room again: the connection still works.
        assert!(matches!(a.poll_ready(&mut cx), Poll::Ready(Ok(()))));
        a.start_send(3).unwrap();
        assert!(matches!(b.poll_recv(&mut cx), Poll::Ready(Some(Ok(3)))));
    }
}
