//! What tether tells an operator: typed lifecycle events through a bounded channel, metrics
//! through the [`metrics`] facade, and `tracing` spans.
//!
//! # Events
//!
//! Each protocol side publishes its lifecycle as typed events:
//! [`ExecutionEvent`](crate::execution::ExecutionEvent)s from an
//! [`ExecutionManager`](crate::execution::ExecutionManager) (Spark Connect's session and
//! operation listener events, and those only tether knows: reattaches, rotations,
//! releases, abandonment, tombstone hits, producers waiting on the memory budget), and
//! [`WorkerEvent`](crate::worker::WorkerEvent)s from worker sessions (created,
//! initialized, terminated with their `Termination`, udf §4.1) and from the worker
//! processes a dispatcher runs (spawned, ready, reused, invalidated, stopped, udf §6). They
//! go through an [`EventSender`] the application hands in (for the manager,
//! [`ManagerConfig::events`](crate::execution::ManagerConfig::events); for sessions and a
//! dispatcher, [`SessionConfig::events`](crate::worker::engine::SessionConfig::events)) and
//! are read from the matching [`EventReceiver`], on the application's own task or thread.
//!
//! The channel is bounded and never blocks the protocol: sending is one push into a
//! fixed ring (no lock, no allocation); when the ring is full the event is dropped, counted
//! ([`EventReceiver::dropped`], [`EventSender::dropped`]) and reported in the metric
//! `tether_events_dropped_total`, never lost silently. Once the [`EventReceiver`] is
//! dropped nobody listens: events are discarded uncounted ([`EventSender::is_listened`]
//! says so), as Spark's listener bus discards posts after its queue stopped. A listener
//! that can fail (a log file on a full disk) should keep its receiver and keep reading,
//! counting what it could not keep, rather than drop it: `examples/connect_server`'s
//! `--events-log` does. A listener that keeps up sees every
//! event, in the order the protocol decided it (per execution and per session, the order of
//! Spark's status machine, [`OperationStatus`](crate::execution::OperationStatus); per
//! worker session, the udf §4.1 states its `EngineCore` reached; per worker process, the
//! order of the dispatcher's decisions).
//!
//! # Metrics
//!
//! tether records through the [`metrics`] facade: install a recorder (an exporter such as
//! `metrics-exporter-prometheus`) **before** building the manager or the worker dispatcher,
//! which register their handles once, so that no protocol path looks a metric up or
//! allocates for one (the `tether_udf_` metrics are a dispatcher's, for its workers and
//! sessions; a session made with `Session::new` reports events only). Without a
//! recorder every update is a no-op. An execution manager counts on its own (one relaxed
//! atomic add per event) and hands its counters to the recorder, and samples its gauges, at
//! each maintenance pass (`ManagerConfig::maintenance_interval`, 30 s by default;
//! `ExecutionManager::publish_metrics` does it on demand), so that a request pays nothing for
//! a gauge and makes no call into the recorder. Its histograms are bucketed on its own
//! memory the same way (32 log-linear buckets per power of two of nanoseconds) and handed
//! over at the same passes as samples of each bucket's midpoint, within 1.6 % of the value
//! recorded.
//! Names follow Prometheus conventions; no label is unbounded (no ids: those are in the
//! events and spans).
//!
//! # Spans and logs
//!
//! tether logs through `tracing`, inside spans that carry the ids, so that an application's
//! subscriber can filter and correlate: each Spark Connect RPC runs in a `spark_connect_rpc`
//! span (`rpc`, `user_id`, `session_id`, `operation_id`), each execution's producer in a
//! `spark_connect_execution` span (the same ids), and each worker session in a `udf_session`
//! span (`session`, `worker`). Errors answered to a client are logged as Spark's
//! `ErrorUtils.handleError` logs them, except for the level of an RPC's own refusal: one
//! with a Spark condition (the client's mistake or race: an unknown operation, a closed
//! session, a configuration key the server lacks) or a retryable one (`UNAVAILABLE`, as
//! while draining) at INFO, any other (a failure in the server) at ERROR (`Spark Connect RPC
//! error`; Spark logs all of them at ERROR); an execution's error on its response stream at
//! INFO (`Spark Connect error on a response stream`: the user's query failed or was
//! canceled). Each line has the Spark condition (the engine's own too, which
//! `tether_connect_errors_total` counts as `OTHER`; `OTHER` for none) and the message. A
//! request refused before it reaches the service (a wrong or missing token, no client
//! certificate where one is required) is logged at WARN with the peer's address.
//! Each RPC's outcome is also logged at DEBUG.
//!
//! | name | type | unit | labels | what |
//! |---|---|---|---|---|
//! | `tether_connect_sessions` | gauge | sessions | | live sessions (rx §5.6; sampled at each maintenance pass) |
//! | `tether_connect_sessions_started_total` | counter | sessions | | sessions created |
//! | `tether_connect_sessions_closed_total` | counter | sessions | | sessions released or expired (rx §5.6) |
//! | `tether_connect_executions` | gauge | executions | | live (registered) executions (rx §5.1; sampled at each maintenance pass) |
//! | `tether_connect_executions_started_total` | counter | executions | | executions registered (`OperationStarted`) |
//! | `tether_connect_executions_ended_total` | counter | executions | `status`: `finished`, `failed`, `canceled` | executions whose run ended (rx §2.2 T7–T9) |
//! | `tether_connect_executions_closed_total` | counter | executions | `removal`: `released` (fault-injection forgets included), `abandoned` (detached past the detached timeout, or still registered when their session was released or expired, as Spark's `removeAllExecutionsForSession` abandons them: PySpark's `spark.stop()` can overtake its own last ReleaseAll) | executions that left the registry (`OperationClosed`, rx §2.2 T12) |
//! | `tether_connect_attached_streams` | gauge | streams | | response streams attached (rx §4.4; sampled at each maintenance pass) |
//! | `tether_connect_reattaches_total` | counter | reattaches | | ReattachExecute (and duplicate ExecutePlan) attaches (rx §5.5) |
//! | `tether_connect_replayed_responses_total` | counter | responses | | responses a reattach resumed before the last one an earlier stream sent (rx §3.5) |
//! | `tether_connect_stream_rotations_total` | counter | streams | `reason`: `duration`, `bytes` | streams ended gracefully for rotation (rx §4.2) |
//! | `tether_connect_releases_total` | counter | requests | `kind`: `until`, `all` | ReleaseExecute applied (rx §3.4, §5.5) |
//! | `tether_connect_tombstone_hits_total` | counter | requests | | requests refused by an abandoned-operation tombstone (rx §5.4) |
//! | `tether_connect_errors_total` | counter | errors | `condition`: a Spark condition of [`condition::ALL`](crate::execution::condition::ALL), or `OTHER` | errors answered to a client, by RPC or on a response stream (rx §1.8) |
//! | `tether_connect_memory_budget_used_bytes` | gauge | bytes | | the shared memory budget in use (unsent and retained responses) |
//! | `tether_connect_memory_budget_waiting_producers` | gauge | producers | | producers waiting for the memory budget |
//! | `tether_connect_producer_waits_total` | counter | waits | | times a producer waited for the memory budget |
//! | `tether_connect_unsent_bytes` | gauge | bytes | | responses produced and not yet sent, all executions (rx §3.1; sampled at each maintenance pass) |
//! | `tether_connect_retained_bytes` | gauge | bytes | | responses sent and kept for a reattach, all executions (rx §3.1; sampled at each maintenance pass) |
//! | `tether_connect_execution_seconds` | histogram | seconds | | from `OperationStarted` to the run's end (Finished, Failed, Canceled) |
//! | `tether_connect_reattach_gap_seconds` | histogram | seconds | | how long an execution was detached before a reattach resumed it |
//! | `tether_events_dropped_total` | counter | events | `side`: `connect`, `udf` | events a full channel dropped |
//! | `tether_udf_sessions` | gauge | sessions | | live worker sessions: created and not yet terminated (udf §4.1) |
//! | `tether_udf_sessions_total` | counter | sessions | `termination`: `finished`, `cancelled`, `failed`, `transport_failed`, `interrupted` | worker sessions ended, by their [`TerminationKind`](crate::worker::engine::TerminationKind) (udf §4.1) |
//! | `tether_udf_workers` | gauge | workers | | worker processes spawned and not yet stopped (udf §6.1) |
//! | `tether_udf_idle_workers` | gauge | workers | | the pool's size: idle workers waiting for reuse (udf §6.6) |
//! | `tether_udf_workers_spawned_total` | counter | workers | | worker processes started (udf §6.2 step 4) |
//! | `tether_udf_workers_reused_total` | counter | sessions | | sessions given an idle pooled worker instead of a new process (udf §6.6) |
//! | `tether_udf_workers_invalidated_total` | counter | workers | `reason`: `transport_failed`, `interrupted`, `open_failed`, `exited`, `inactive`, `marked` | workers judged unsafe to reuse ([`InvalidationReason`](crate::worker::InvalidationReason), udf §6.5) |
//! | `tether_udf_workers_stopped_total` | counter | workers | `reason`: `released`, `invalid`, `idle_timeout`, `start_failed`, `closed` | worker processes stopped and reaped ([`StopReason`](crate::worker::StopReason), udf §6.1) |
//! | `tether_udf_worker_startup_seconds` | histogram | seconds | | from a worker's spawn to its readiness (udf §6.4) |

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

/// Hands each metric's unit and description to the installed recorder (its `# HELP` lines),
/// by the Prometheus naming the table above follows: `_total` a counter, `_seconds` a
/// histogram, anything else a gauge. Both sides' metric tables go through it.
pub(crate) fn describe(table: &[(&'static str, metrics::Unit, &'static str)]) {
    for &(name, unit, help) in table {
        if name.ends_with("_total") {
            metrics::describe_counter!(name, unit, help);
        } else if name.ends_with("_seconds") {
            metrics::describe_histogram!(name, unit, help);
        } else {
            metrics::describe_gauge!(name, unit, help);
        }
    }
}

/// A bounded event channel of `capacity` events (at least 1): the sending half for the
/// protocol, the receiving half for the application (see the [module docs](self)). Like
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

    /// Every queued event, oldest first (Spark's `AsyncEventQueue` order).
    pub fn drain(&mut self) -> Vec<E> {
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
