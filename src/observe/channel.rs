//! The bounded, lock-free event channel both protocol sides report their lifecycle through
//! (see [`observe`](super)): Spark's `AsyncEventQueue` behind its listener bus, without the
//! thread.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use crossbeam_queue::ArrayQueue;
use futures::Stream;
use futures::task::AtomicWaker;

struct Shared<E> {
    queue: ArrayQueue<E>,
    waker: AtomicWaker,
    /// Whether the receiver was ever polled as a [`Stream`] (only then is there a task to
    /// wake): a sender to a receiver read with `try_recv` touches no shared waker state.
    polled: AtomicBool,
    dropped: AtomicU64,
    receiver_alive: AtomicBool,
    senders: AtomicU64,
}

/// A bounded event channel of `capacity` events (at least 1): the sending half for the
/// protocol, the receiving half for the application (see the [module docs](super)). Like
/// Spark's `AsyncEventQueue` behind its listener bus, a full queue drops what it cannot take
/// and counts it rather than slow the sender down.
///
/// ```
/// let (tx, mut rx) = tether::observe::event_channel::<u32>(2);
/// assert!(tx.send(1));
/// assert!(tx.send(2));
/// assert!(!tx.send(3)); // full: dropped and counted, the sender never waits
/// assert_eq!(rx.try_recv(), Some(1));
/// assert_eq!(rx.try_recv(), Some(2));
/// assert_eq!(rx.try_recv(), None);
/// assert_eq!(rx.dropped(), 1);
/// ```
pub fn event_channel<E>(capacity: usize) -> (EventSender<E>, EventReceiver<E>) {
    let shared = Arc::new(Shared {
        queue: ArrayQueue::new(capacity.max(1)),
        waker: AtomicWaker::new(),
        polled: AtomicBool::new(false),
        dropped: AtomicU64::new(0),
        receiver_alive: AtomicBool::new(true),
        senders: AtomicU64::new(1),
    });
    (
        EventSender {
            shared: shared.clone(),
        },
        EventReceiver { shared },
    )
}

/// The sending half of an [`event_channel`]: cheap to clone, never blocks
/// (as Spark's `AsyncEventQueue.post`).
pub struct EventSender<E> {
    shared: Arc<Shared<E>>,
}

impl<E> EventSender<E> {
    /// Queues `event`; `false` if it was dropped because the channel was full (counted in
    /// [`dropped`](Self::dropped)) or because the receiver is gone (not counted: nobody
    /// listens). Lock-free, no allocation. Spark's `AsyncEventQueue.post` drops the same way.
    pub fn send(&self, event: E) -> bool {
        if !self.shared.receiver_alive.load(Ordering::Relaxed) {
            return false;
        }
        match self.shared.queue.push(event) {
            Ok(()) => {
                // SeqCst with the receiver's store before it registers: either this load sees
                // it (and wakes), or the receiver's check after registering sees the event.
                if self.shared.polled.load(Ordering::SeqCst) {
                    self.shared.waker.wake();
                }
                true
            }
            Err(_) => {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// How many events a full channel dropped so far
    /// (Spark's `AsyncEventQueue.droppedEventsCounter`).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Whether the receiver still exists (Spark's `AsyncEventQueue` after `stop`: posts are
    /// discarded).
    pub fn is_listened(&self) -> bool {
        self.shared.receiver_alive.load(Ordering::Relaxed)
    }
}

impl<E> Clone for EventSender<E> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<E> Drop for EventSender<E> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last sender: a receiver waiting for more sees the end.
            self.shared.waker.wake();
        }
    }
}

impl<E> fmt::Debug for EventSender<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSender")
            .field("queued", &self.shared.queue.len())
            .field("capacity", &self.shared.queue.capacity())
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// The receiving half of an [`event_channel`]: [`try_recv`](Self::try_recv), or as a
/// [`Stream`] that ends once every sender is gone and the queue is empty. It plays the part
/// of Spark's `AsyncEventQueue` dispatch thread: the application reads at its own pace.
pub struct EventReceiver<E> {
    shared: Arc<Shared<E>>,
}

impl<E> EventReceiver<E> {
    /// The oldest queued event, if any (first in, first out, as Spark's `AsyncEventQueue`).
    pub fn try_recv(&mut self) -> Option<E> {
        self.shared.queue.pop()
    }

    /// Every event queued now, oldest first (Spark's `AsyncEventQueue` order):
    /// [`try_recv`](Self::try_recv) until the queue is empty; never waits.
    pub fn try_recv_all(&mut self) -> Vec<E> {
        std::iter::from_fn(|| self.try_recv()).collect()
    }

    /// How many events a full channel dropped so far: the listener fell behind
    /// (Spark's `AsyncEventQueue.droppedEventsCounter`).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl<E> Drop for EventReceiver<E> {
    fn drop(&mut self) {
        self.shared.receiver_alive.store(false, Ordering::Relaxed);
    }
}

impl<E> Stream for EventReceiver<E> {
    type Item = E;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<E>> {
        if let Some(e) = self.try_recv() {
            return Poll::Ready(Some(e));
        }
        self.shared.polled.store(true, Ordering::SeqCst);
        self.shared.waker.register(cx.waker());
        // Checked again after registering, so a send in between is not missed.
        match self.try_recv() {
            Some(e) => Poll::Ready(Some(e)),
            None if self.shared.senders.load(Ordering::Acquire) == 0 => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

impl<E> fmt::Debug for EventReceiver<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventReceiver")
            .field("queued", &self.shared.queue.len())
            .field("dropped", &self.dropped())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    #[test]
    fn a_receiver_waiting_as_a_stream_is_woken_by_a_send_and_ends_with_the_senders() {
        let (tx, mut rx) = event_channel::<u32>(4);
        let (seen, seen_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            futures::executor::block_on(async {
                while let Some(e) = rx.next().await {
                    seen.send(e).unwrap();
                }
            });
        });
        for e in [1, 2] {
            // The reader is parked on an empty channel by now: only this send can wake it.
            std::thread::sleep(Duration::from_millis(30));
            assert!(tx.send(e));
            let got = seen_rx.recv_timeout(Duration::from_secs(5));
            assert_eq!(got, Ok(e), "the parked reader was not woken by the send");
        }
        drop(tx);
        reader.join().unwrap();
    }

    #[test]
    fn a_dropped_receiver_discards_without_counting() {
        let (tx, rx) = event_channel::<u32>(1);
        drop(rx);
        assert!(!tx.is_listened());
        assert!(!tx.send(1));
        assert_eq!(tx.dropped(), 0);
    }
}
