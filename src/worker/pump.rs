//! The one I/O pump both worker-session drivers run on: the engine's
//! [`Session`](super::engine::Session) and [`ProcessStream`](super::engine::ProcessStream), and the
//! worker's [`Endpoint`](super::endpoint::Endpoint).
//!
//! A [`Pump`] moves messages between a sans-IO core ([`PumpCore`]: `EngineCore` or
//! `WorkerCore`) and a [`Connection`], and mirrors the core's one deadline
//! ([`PumpCore::poll_timeout`]) into one sleep on the session's [`Timer`]. It holds no queue
//! of its own: outgoing messages wait in the core's outbox until the connection is ready
//! (`poll_ready`), and incoming ones stay in the connection until the core has room
//! (`wants_recv`), so backpressure is the connection's own bound plus the core's one queue
//! per direction. It decides nothing: which deadline runs, and what its expiry means, is the
//! core's (udf §7), and so is when the send side is half-closed or aborted (udf §2 R9).
//!
//! The pump's flags, and the combinations that occur (as in tokio-util's `framed_impl.rs`):
//!
//! | situation                                 | needs_flush | send_broken | recv_ended | closed | aborted |
//! |-------------------------------------------|-------------|-------------|------------|--------|---------|
//! | streaming, everything flushed             | false       | false       | false      | false  | false   |
//! | a message handed over, not yet flushed    | true        | false       | any        | false  | false   |
//! | the peer ended its side (EOF or error)    | any         | any         | true       | any    | any     |
//! | a send, flush or readiness poll failed    | any         | true        | any        | false  | false   |
//! | send side half-closed (the core said so)  | false       | false       | any        | true   | false   |
//! | send side aborted (the core said so)      | false       | false       | any        | false  | true    |
//!
//! At most one of `send_broken`, `closed` and `aborted` holds: after any, nothing more is
//! sent. An abort is not a method of [`Connection`]: the pump stops sending without
//! half-closing, and the connection is given up unclosed when the session lets go of it,
//! which every transport takes as an abort (gRPC resets the stream, `RST_STREAM(CANCEL)`,
//! Spark's `onError`; a socket or an in-memory channel just ends without a clean close).

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::{BoxFuture, poll_fn};

use crate::connection::{Connection, ConnectionError};
use crate::time::{DeadlineSleep, Timer};

/// What a [`Pump`] needs from a sans-IO core. Implemented by `EngineCore` and `WorkerCore`;
/// every method forwards to the core's public method of the same purpose.
pub(crate) trait PumpCore {
    /// The message type the core sends.
    type Tx;
    /// The message type the core receives.
    type Rx;
    /// The next message to hand to the connection.
    fn poll_transmit(&mut self) -> Option<Self::Tx>;
    /// Whether messages wait for [`poll_transmit`](Self::poll_transmit).
    fn has_transmit(&self) -> bool;
    /// Whether the core takes another received message now (not done, room in its queue).
    fn wants_recv(&self) -> bool;
    /// One received message.
    fn handle_recv(&mut self, message: Self::Rx);
    /// The peer ended its side of the stream.
    fn handle_stream_end(&mut self);
    /// The connection failed (read, write, flush or readiness).
    fn handle_connection_error(&mut self, error: ConnectionError);
    /// Whether the core has settled its outcome (a lost connection changes nothing then).
    fn is_settled(&self) -> bool;
    /// Whether the send side should be half-closed now (nothing more will be sent).
    fn wants_half_close(&self) -> bool;
    /// Whether the send side should be aborted now instead of half-closed (udf §2 R9). Only
    /// the engine's core ever aborts: the worker half-closes after its terminator.
    fn wants_abort(&self) -> bool {
        false
    }
    /// A wait begins: the core arms the deadline its state calls for, reading the clock
    /// (`now`) only if it arms one.
    fn begin_wait_with(&mut self, now: impl FnOnce() -> Instant);
    /// The caller's wait ended (it got what it waited for).
    fn end_wait(&mut self);
    /// The instant at which [`handle_timeout`](Self::handle_timeout) is due, if any.
    fn poll_timeout(&self) -> Option<Instant>;
    /// The deadline passed; `now` is the current time.
    fn handle_timeout(&mut self, now: Instant);
}

/// Explains a lost connection before the core sees it: given the connection's error (`None`
/// when the peer ended its side), a future of the error to report instead, or `None` to
/// report the loss as it is. An engine session asks its worker handle
/// (`WorkerHandle::explain_connection_loss`: a dispatcher knows the worker process).
pub(crate) type LossExplainer = Arc<
    dyn Fn(Option<&ConnectionError>) -> Option<BoxFuture<'static, ConnectionError>> + Send + Sync,
>;

/// Implements [`PumpCore`] for a core by forwarding to its inherent methods of the same
/// names (`handle_recv` to the one named here).
macro_rules! forward_pump_core {
    (
        $core:ty,
        tx = $tx:ty,
        rx = $rx:ty,
        handle_recv = $handle:ident,
        is_settled = $settled:ident
        $(, wants_abort = $abort:ident)? $(,)?
    ) => {
        impl $crate::worker::pump::PumpCore for $core {
            type Tx = $tx;
            type Rx = $rx;
            fn poll_transmit(&mut self) -> Option<$tx> {
                Self::poll_transmit(self)
            }
            fn has_transmit(&self) -> bool {
                Self::has_transmit(self)
            }
            fn wants_recv(&self) -> bool {
                Self::wants_recv(self)
            }
            fn handle_recv(&mut self, message: $rx) {
                self.$handle(message);
            }
            fn handle_stream_end(&mut self) {
                Self::handle_stream_end(self);
            }
            fn handle_connection_error(&mut self, error: $crate::connection::ConnectionError) {
                Self::handle_connection_error(self, error);
            }
            fn is_settled(&self) -> bool {
                Self::$settled(self)
            }
            fn wants_half_close(&self) -> bool {
                Self::wants_half_close(self)
            }
            $(
                fn wants_abort(&self) -> bool {
                    Self::$abort(self)
                }
            )?
            fn begin_wait_with(&mut self, now: impl FnOnce() -> std::time::Instant) {
                Self::begin_wait_with(self, now);
            }
            fn end_wait(&mut self) {
                Self::end_wait(self);
            }
            fn poll_timeout(&self) -> Option<std::time::Instant> {
                Self::poll_timeout(self)
            }
            fn handle_timeout(&mut self, now: std::time::Instant) {
                Self::handle_timeout(self, now);
            }
        }
    };
}
pub(crate) use forward_pump_core;

/// The shared I/O pump over one [`Connection`] (see the module docs for its flags).
pub(crate) struct Pump<C> {
    conn: C,
    timer: Arc<dyn Timer>,
    /// The sleep mirroring the core's deadline.
    sleep: DeadlineSleep,
    /// Asked once when the connection is lost before the core settled.
    explainer: Option<LossExplainer>,
    /// The explanation being awaited; the core hears of the loss when it resolves. In a
    /// mutex only so that the pump stays `Sync` (it is reached through `get_mut`).
    explaining: Option<Mutex<BoxFuture<'static, ConnectionError>>>,
    needs_flush: bool,
    send_broken: bool,
    recv_ended: bool,
    closed: bool,
    aborted: bool,
    /// `poll_recv` returned `Pending` in this poll: the connection holds the task's waker
    /// and wakes it when a message comes, so it is not asked again until the next poll.
    recv_parked: bool,
    /// The same for `poll_ready`: the connection wakes the task when it has room.
    send_parked: bool,
}

impl<C> Pump<C> {
    /// A pump over `conn` whose deadlines run on `timer` (on
    /// [`NoTimeouts`](crate::time::NoTimeouts) the core's deadlines are never armed, so no
    /// timeout fires, udf §7).
    pub(crate) fn new(conn: C, timer: Arc<dyn Timer>) -> Self {
        Self {
            conn,
            timer,
            sleep: DeadlineSleep::default(),
            explainer: None,
            explaining: None,
            needs_flush: false,
            send_broken: false,
            recv_ended: false,
            closed: false,
            aborted: false,
            recv_parked: false,
            send_parked: false,
        }
    }

    /// Has `explainer` explain a connection lost before the core settled.
    pub(crate) fn with_explainer(mut self, explainer: Option<LossExplainer>) -> Self {
        self.explainer = explainer;
        self
    }

    /// The connection, for a non-blocking close on drop.
    pub(crate) fn connection_mut(&mut self) -> &mut C {
        &mut self.conn
    }

    /// Whether the pump's timer fires (deadlines can fire; not on `NoTimeouts`).
    #[cfg(feature = "tokio")]
    pub(crate) fn has_timer(&self) -> bool {
        self.timer.fires()
    }

    /// Whether nothing more can be sent: the send side was half-closed, aborted or failed.
    pub(crate) fn send_done(&self) -> bool {
        self.closed || self.aborted || self.send_broken
    }

    /// A new poll of a driver future begins (a `drive`, `ProcessStream::poll_next`): the
    /// connection is asked again for messages and room. Within one poll, a connection that
    /// answered `Pending` holds the task's waker and wakes it on any change, so asking it
    /// again in the same poll finds nothing new; the pump skips that (each skipped ask is a
    /// lock and a waker registration on the in-memory pair).
    pub(crate) fn begin_poll(&mut self) {
        self.recv_parked = false;
        self.send_parked = false;
    }
}

impl<C> Pump<C> {
    /// Moves received messages into the core while it has room, queued messages to the
    /// connection while it is ready, flushes, and half-closes the send side once the core
    /// says so. Receiving comes first: a terminator that is already here wins over messages
    /// still queued (nothing is sent after a terminal). Returns whether anything moved.
    ///
    /// The caller calls [`begin_poll`](Self::begin_poll) once at the start of each poll of
    /// its task, before the first `poll_io` of that poll.
    pub(crate) fn poll_io<K>(&mut self, core: &mut K, cx: &mut Context<'_>) -> bool
    where
        K: PumpCore,
        C: Connection<K::Tx, K::Rx>,
    {
        let mut progress = false;
        if let Some(explaining) = &mut self.explaining {
            let explanation = explaining.get_mut().unwrap_or_else(PoisonError::into_inner);
            match explanation.as_mut().poll(cx) {
                Poll::Ready(error) => {
                    self.explaining = None;
                    core.handle_connection_error(error);
                    progress = true;
                }
                // Nothing moves on a lost connection; the core's deadline still runs.
                Poll::Pending => return false,
            }
        }
        while !self.recv_ended && !self.recv_parked && core.wants_recv() {
            match self.conn.poll_recv(cx) {
                Poll::Ready(Some(Ok(message))) => core.handle_recv(message),
                Poll::Ready(Some(Err(e))) => {
                    self.recv_ended = true;
                    self.lost(core, Some(e));
                }
                Poll::Ready(None) => {
                    self.recv_ended = true;
                    self.lost(core, None);
                }
                Poll::Pending => {
                    self.recv_parked = true;
                    break;
                }
            }
            progress = true;
        }
        if self.explaining.is_some() {
            return true;
        }
        while !self.send_done() && !self.send_parked && core.has_transmit() {
            match self.conn.poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    let Some(message) = core.poll_transmit() else {
                        break;
                    };
                    match self.conn.start_send(message) {
                        Ok(()) => self.needs_flush = true,
                        Err(e) => self.send_failed(core, e),
                    }
                    progress = true;
                }
                Poll::Ready(Err(e)) => {
                    self.send_failed(core, e);
                    progress = true;
                }
                Poll::Pending => {
                    self.send_parked = true;
                    break;
                }
            }
        }
        if self.explaining.is_some() {
            return true;
        }
        if self.needs_flush && !self.send_done() {
            match self.conn.poll_flush(cx) {
                Poll::Ready(Ok(())) => self.needs_flush = false,
                Poll::Ready(Err(e)) => {
                    self.send_failed(core, e);
                    return true;
                }
                Poll::Pending => {}
            }
        }
        if !self.send_done() && !self.needs_flush && core.wants_half_close() {
            // A failed half-close leaves nothing to do: the send side is over either way.
            if self.conn.poll_close(cx).is_ready() {
                self.closed = true;
                progress = true;
            }
        }
        if !self.send_done() && !self.needs_flush && core.wants_abort() {
            // Never half-closed: the connection is given up unclosed (see the module docs).
            self.aborted = true;
            progress = true;
        }
        progress
    }

    fn send_failed<K: PumpCore>(&mut self, core: &mut K, error: ConnectionError) {
        self.send_broken = true;
        self.needs_flush = false;
        self.lost(core, Some(error));
    }

    /// The connection failed (`Some`) or the peer ended its side (`None`): tells the core, or,
    /// with an explainer and an unsettled core, starts the explanation the core then gets.
    fn lost<K: PumpCore>(&mut self, core: &mut K, error: Option<ConnectionError>) {
        let explanation = match &self.explainer {
            Some(explain) if !core.is_settled() && self.explaining.is_none() => {
                explain(error.as_ref())
            }
            _ => None,
        };
        match (explanation, error) {
            (Some(explanation), _) => self.explaining = Some(Mutex::new(explanation)),
            (None, Some(error)) => core.handle_connection_error(error),
            (None, None) => core.handle_stream_end(),
        }
    }

    /// A wait begins: lets the core arm its deadline (the clock is read only if it arms
    /// one), and mirrors the deadline into the one sleep. Returns `true` when the deadline
    /// has passed and the core handled it (the caller polls again), `false` when the waker
    /// is registered.
    pub(crate) fn poll_timer<K: PumpCore>(&mut self, core: &mut K, cx: &mut Context<'_>) -> bool {
        let timer = &self.timer;
        if !timer.fires() {
            return false;
        }
        core.begin_wait_with(|| timer.now());
        let Some(at) = core.poll_timeout() else {
            return false;
        };
        match self.sleep.poll_until(&**timer, at, cx) {
            Poll::Ready(now) => {
                core.handle_timeout(now);
                true
            }
            Poll::Pending => false,
        }
    }

    /// Drives I/O and the core's deadline until `check` yields a value, then ends the wait.
    pub(crate) async fn drive<K, T>(
        &mut self,
        core: &mut K,
        mut check: impl FnMut(&mut K, &Self) -> Option<T>,
    ) -> T
    where
        K: PumpCore,
        C: Connection<K::Tx, K::Rx>,
    {
        poll_fn(|cx| {
            self.begin_poll();
            loop {
                let progress = self.poll_io(core, cx);
                if let Some(value) = check(core, self) {
                    core.end_wait();
                    return Poll::Ready(value);
                }
                if progress || self.poll_timer(core, cx) {
                    continue;
                }
                return Poll::Pending;
            }
        })
        .await
    }
}
