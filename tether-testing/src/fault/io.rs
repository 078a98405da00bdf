//! Fault injection at the byte level: [`FaultyIo`] wraps any tokio `AsyncRead +
//! AsyncWrite` and applies an [`IoPlan`] (feature `tokio`).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::message::Direction;
use super::{InjectedFault, SplitMix};

/// How a truncated read side ends (udf §4.5: a truncated frame is a transport failure
/// either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadEnd {
    /// A clean end of file, as when the peer closes mid-frame.
    Eof,
    /// An `io::Error` (`ConnectionReset`, carrying [`InjectedFault::ReadTruncated`]).
    Error,
}

/// A declarative I/O schedule for a [`FaultyIo`], built by hand or from a seed: benign
/// reshaping (split reads and writes, `Pending`) that must not change a session's outcome
/// (udf §1.4: the transport only moves bytes), and destructive cuts (udf §6.5).
///
/// ```
/// use tether_testing::fault::{IoPlan, ReadEnd};
///
/// let benign = IoPlan::new().split_writes(1).pending_every(2);
/// assert!(benign.is_benign());
/// assert!(!benign.truncate_read(10, ReadEnd::Eof).is_benign());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoPlan {
    split_writes: Option<usize>,
    split_reads: Option<usize>,
    pending_every: Option<u64>,
    truncate_read: Option<(u64, ReadEnd)>,
    truncate_write: Option<u64>,
    cut: Option<(Direction, u64)>,
}

/// The settings of [`IoPlan::random`] (udf §1.4 schedules, udf §6.5 cuts).
#[derive(Debug, Clone)]
pub struct RandomIo {
    /// Byte positions of cuts and truncations are drawn from `0..horizon`.
    pub horizon: u64,
    /// Largest piece a split read or write is drawn up to (at least 1).
    pub max_piece: usize,
    /// `Pending` every n-th poll, n drawn from `2..=max_pending_every` (at least 2).
    pub max_pending_every: u64,
    /// Whether a truncation or cut may be drawn (about half of the plans get one).
    pub destructive: bool,
}

impl Default for RandomIo {
    /// Cuts within the first 256 bytes, pieces up to 16 bytes, `Pending` up to every 5th
    /// poll, destructive faults allowed (udf §6.5).
    fn default() -> Self {
        Self {
            horizon: 256,
            max_piece: 16,
            max_pending_every: 5,
            destructive: true,
        }
    }
}

impl IoPlan {
    /// A plan that passes every byte through unchanged (and counts it): the transport only
    /// moves bytes (udf §1.4).
    pub fn new() -> Self {
        Self::default()
    }

    /// Hands at most `k` bytes (at least 1) to each write of the wrapped stream, as a socket
    /// with a small send buffer does (udf §1.4).
    pub fn split_writes(mut self, k: usize) -> Self {
        self.split_writes = Some(k.max(1));
        self
    }

    /// Returns at most `k` bytes (at least 1) from each read (udf §1.4).
    pub fn split_reads(mut self, k: usize) -> Self {
        self.split_reads = Some(k.max(1));
        self
    }

    /// Returns `Pending` on every `n`-th poll of each direction (n at least 2), waking the
    /// task at once, as a busy socket does (udf §1.4).
    pub fn pending_every(mut self, n: u64) -> Self {
        self.pending_every = Some(n.max(2));
        self
    }

    /// Ends the read side after `after` bytes, with `end` (a peer gone mid-frame, udf §4.5).
    pub fn truncate_read(mut self, after: u64, end: ReadEnd) -> Self {
        self.truncate_read = Some((after, end));
        self
    }

    /// Shuts the wrapped stream's write side down after `after` bytes were written (the
    /// peer reads an end of file, mid-frame unless `after` falls on a boundary) and fails
    /// every later write with `BrokenPipe` (udf §2 R10).
    pub fn truncate_write(mut self, after: u64) -> Self {
        self.truncate_write = Some(after);
        self
    }

    /// Drops the whole wrapped stream once `after` bytes went through `direction`: the peer
    /// sees the end of its read side and failing writes, as after a SIGKILL (udf §8.4);
    /// every later call on this side fails with `ConnectionReset`.
    pub fn cut_after(mut self, direction: Direction, after: u64) -> Self {
        self.cut = Some((direction, after));
        self
    }

    /// Whether the plan only reshapes the byte flow (splits, `Pending`): then the protocol
    /// outcome must not change (udf §1.4).
    pub fn is_benign(&self) -> bool {
        self.truncate_read.is_none() && self.truncate_write.is_none() && self.cut.is_none()
    }

    /// A plan drawn from `seed` (the same seed gives the same plan) within `settings`: splits
    /// and `Pending`s, plus, when allowed, one truncation or cut (udf §1.4, §6.5).
    pub fn random(seed: u64, settings: &RandomIo) -> Self {
        let mut rng = SplitMix::new(seed);
        let mut plan = Self::new();
        let piece = settings.max_piece.max(1) as u64;
        if rng.below(4) != 0 {
            plan = plan.split_writes(1 + rng.below(piece) as usize);
        }
        if rng.below(4) != 0 {
            plan = plan.split_reads(1 + rng.below(piece) as usize);
        }
        if rng.below(2) == 0 {
            let most = settings.max_pending_every.max(2);
            plan = plan.pending_every(2 + rng.below(most - 1));
        }
        if settings.destructive && rng.below(2) == 0 {
            let at = rng.below(settings.horizon.max(1));
            plan = match rng.below(4) {
                0 => plan.truncate_read(at, ReadEnd::Eof),
                1 => plan.truncate_read(at, ReadEnd::Error),
                2 => plan.truncate_write(at),
                _ => {
                    let direction = if rng.below(2) == 0 {
                        Direction::Send
                    } else {
                        Direction::Recv
                    };
                    plan.cut_after(direction, at)
                }
            };
        }
        plan
    }
}

/// What a [`FaultyIo`] did (read through [`IoCounters::report`]): the bytes that moved and
/// the faults that fired (udf §6.5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoReport {
    /// Bytes read from the wrapped stream and passed on.
    pub bytes_read: u64,
    /// Bytes written to the wrapped stream.
    pub bytes_written: u64,
    /// Writes shortened by [`IoPlan::split_writes`].
    pub split_writes: u64,
    /// Reads shortened by [`IoPlan::split_reads`].
    pub split_reads: u64,
    /// `Pending`s injected by [`IoPlan::pending_every`].
    pub pendings: u64,
    /// Whether the read side was truncated.
    pub read_truncated: bool,
    /// Whether the write side was truncated.
    pub write_truncated: bool,
    /// Whether the stream was cut.
    pub cut: bool,
}

impl IoReport {
    /// Whether a destructive fault fired (a truncation or a cut; udf §6.5).
    pub fn destructive(&self) -> bool {
        self.read_truncated || self.write_truncated || self.cut
    }
}

#[derive(Debug, Default)]
struct Counters {
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    split_writes: AtomicU64,
    split_reads: AtomicU64,
    pendings: AtomicU64,
    read_truncated: AtomicU64,
    write_truncated: AtomicU64,
    cut: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// A cloneable view of a [`FaultyIo`]'s counters that outlives the stream moving into a
/// framed connection (udf §1.1: one socket per session).
#[derive(Debug, Clone, Default)]
pub struct IoCounters(Arc<Counters>);

impl IoCounters {
    /// A snapshot (see [`IoReport`]; udf §6.5).
    pub fn report(&self) -> IoReport {
        let c = &self.0;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IoReport {
            bytes_read: get(&c.bytes_read),
            bytes_written: get(&c.bytes_written),
            split_writes: get(&c.split_writes),
            split_reads: get(&c.split_reads),
            pendings: get(&c.pendings),
            read_truncated: get(&c.read_truncated) > 0,
            write_truncated: get(&c.write_truncated) > 0,
            cut: get(&c.cut) > 0,
        }
    }
}

/// A tokio `AsyncRead + AsyncWrite` that applies an [`IoPlan`] to the stream it wraps: put
/// it under a [`FramedConnection`](tether::connection::framed::FramedConnection) to inject
/// partial reads and writes, `Pending`s, truncated frames and cuts (udf §1.4, §4.5, §6.5).
/// Errors it injects carry an [`InjectedFault`].
pub struct FaultyIo<T> {
    inner: Option<T>,
    plan: IoPlan,
    counters: IoCounters,
    read: u64,
    written: u64,
    read_polls: u64,
    write_polls: u64,
    /// The write side was truncated: the wrapped stream's shutdown is done.
    write_closed: bool,
    /// The truncation point was reached; the shutdown is still to complete.
    shutdown_due: bool,
    scratch: Vec<u8>,
}

impl<T> fmt::Debug for FaultyIo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyIo")
            .field("plan", &self.plan)
            .field("report", &self.counters.report())
            .finish_non_exhaustive()
    }
}

fn injected(kind: io::ErrorKind, fault: InjectedFault) -> io::Error {
    io::Error::new(kind, fault)
}

impl<T> FaultyIo<T> {
    /// Wraps `inner`, applying `plan` (udf §1.4 schedules, udf §6.5 cuts).
    pub fn new(inner: T, plan: IoPlan) -> Self {
        Self {
            inner: Some(inner),
            plan,
            counters: IoCounters::default(),
            read: 0,
            written: 0,
            read_polls: 0,
            write_polls: 0,
            write_closed: false,
            shutdown_due: false,
            scratch: Vec::new(),
        }
    }

    /// The counters, shared: keep a clone before the stream moves into a connection
    /// (udf §1.1).
    pub fn counters(&self) -> IoCounters {
        self.counters.clone()
    }

    /// The wrapped stream, unless a cut dropped it (udf §8.4).
    pub fn get_ref(&self) -> Option<&T> {
        self.inner.as_ref()
    }

    fn c(&self) -> &Counters {
        &self.counters.0
    }

    /// Whether this poll of one direction is an injected `Pending` (the task is woken).
    fn inject_pending(polls: &mut u64, every: Option<u64>, counters: &Counters) -> bool {
        let Some(every) = every else { return false };
        *polls += 1;
        if (*polls).is_multiple_of(every) {
            add(&counters.pendings, 1);
            return true;
        }
        false
    }

    /// Cuts the stream if `direction` has moved its planned number of bytes.
    fn cut_if_due(&mut self, direction: Direction) {
        let moved = match direction {
            Direction::Send => self.written,
            Direction::Recv => self.read,
        };
        if matches!(self.plan.cut, Some((d, at)) if d == direction && moved >= at)
            && self.inner.take().is_some()
        {
            add(&self.c().cut, 1);
        }
    }

    /// How many bytes `direction` may still move before its cut or truncation point.
    fn room(&self, direction: Direction) -> u64 {
        let moved = match direction {
            Direction::Send => self.written,
            Direction::Recv => self.read,
        };
        let mut limit = u64::MAX;
        if let Some((d, at)) = self.plan.cut
            && d == direction
        {
            limit = limit.min(at.saturating_sub(moved));
        }
        let truncation = match direction {
            Direction::Send => self.plan.truncate_write,
            Direction::Recv => self.plan.truncate_read.map(|(at, _)| at),
        };
        if let Some(at) = truncation {
            limit = limit.min(at.saturating_sub(moved));
        }
        limit
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FaultyIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.cut_if_due(Direction::Recv);
        if this.inner.is_none() {
            return Poll::Ready(Err(injected(
                io::ErrorKind::ConnectionReset,
                InjectedFault::ConnectionDropped,
            )));
        }
        if Self::inject_pending(
            &mut this.read_polls,
            this.plan.pending_every,
            &this.counters.0,
        ) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let room = this.room(Direction::Recv);
        if room == 0
            && buf.remaining() > 0
            && let Some((_, end)) = this.plan.truncate_read
        {
            this.c().read_truncated.store(1, Ordering::Relaxed);
            return Poll::Ready(match end {
                ReadEnd::Eof => Ok(()),
                ReadEnd::Error => Err(injected(
                    io::ErrorKind::ConnectionReset,
                    InjectedFault::ReadTruncated,
                )),
            });
        }
        let mut limit = buf
            .remaining()
            .min(usize::try_from(room).unwrap_or(usize::MAX));
        if let Some(k) = this.plan.split_reads
            && k < limit
        {
            limit = k;
            add(&this.c().split_reads, 1);
        }
        this.scratch.resize(limit, 0);
        let mut piece = ReadBuf::new(&mut this.scratch);
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(Err(injected(
                io::ErrorKind::ConnectionReset,
                InjectedFault::ConnectionDropped,
            )));
        };
        match Pin::new(inner).poll_read(cx, &mut piece) {
            Poll::Ready(Ok(())) => {
                let n = piece.filled().len();
                buf.put_slice(piece.filled());
                this.read += n as u64;
                add(&this.c().bytes_read, n as u64);
                this.cut_if_due(Direction::Recv);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> FaultyIo<T> {
    /// Completes a due write-side truncation: shuts the wrapped stream's write side down.
    fn poll_truncate(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.shutdown_due {
            return Poll::Ready(());
        }
        if let Some(inner) = self.inner.as_mut() {
            // Failing or not, the write side is over.
            if Pin::new(inner).poll_shutdown(cx).is_pending() {
                return Poll::Pending;
            }
        }
        self.shutdown_due = false;
        self.write_closed = true;
        self.c().write_truncated.store(1, Ordering::Relaxed);
        Poll::Ready(())
    }

    fn write_error(&self) -> Option<io::Error> {
        if self.inner.is_none() {
            return Some(injected(
                io::ErrorKind::ConnectionReset,
                InjectedFault::ConnectionDropped,
            ));
        }
        self.write_closed
            .then(|| injected(io::ErrorKind::BrokenPipe, InjectedFault::WriteTruncated))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FaultyIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.cut_if_due(Direction::Send);
        if this.poll_truncate(cx).is_pending() {
            return Poll::Pending;
        }
        if let Some(e) = this.write_error() {
            return Poll::Ready(Err(e));
        }
        if Self::inject_pending(
            &mut this.write_polls,
            this.plan.pending_every,
            &this.counters.0,
        ) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let room = this.room(Direction::Send);
        if room == 0 && !data.is_empty() && this.plan.truncate_write.is_some() {
            // Reached exactly at a write boundary: truncate now.
            this.shutdown_due = true;
            if this.poll_truncate(cx).is_pending() {
                return Poll::Pending;
            }
            return Poll::Ready(Err(this.write_error().unwrap_or_else(|| {
                injected(io::ErrorKind::BrokenPipe, InjectedFault::WriteTruncated)
            })));
        }
        let mut limit = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        if let Some(k) = this.plan.split_writes
            && k < limit
        {
            limit = k;
            add(&this.c().split_writes, 1);
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(Err(injected(
                io::ErrorKind::ConnectionReset,
                InjectedFault::ConnectionDropped,
            )));
        };
        match Pin::new(inner).poll_write(cx, &data[..limit]) {
            Poll::Ready(Ok(n)) => {
                this.written += n as u64;
                add(&this.c().bytes_written, n as u64);
                this.cut_if_due(Direction::Send);
                if this.plan.truncate_write == Some(this.written) {
                    this.shutdown_due = true;
                    // Best effort now; a pending shutdown completes on the next call.
                    let _ = this.poll_truncate(cx);
                }
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.poll_truncate(cx).is_pending() {
            return Poll::Pending;
        }
        if let Some(e) = this.write_error() {
            return Poll::Ready(Err(e));
        }
        match this.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.poll_truncate(cx).is_pending() {
            return Poll::Pending;
        }
        if this.write_closed {
            return Poll::Ready(Ok(()));
        }
        match this.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_shutdown(cx),
            None => Poll::Ready(Err(injected(
                io::ErrorKind::NotConnected,
                InjectedFault::ConnectionDropped,
            ))),
        }
    }
}
