//! The write half of a framed connection: frames queued as slices and written with vectored
//! writes, each data batch (udf §1.4) by reference rather than copied.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncWrite;

use crate::wire::{FrameCodec, FrameError};

/// Most slices handed to one vectored write (Linux accepts 1024).
const MAX_SLICES: usize = 64;

/// Frames waiting to be written, in wire order: `sealed` slices first, then `open`.
///
/// A frame whose message ends with a large batch (udf §1.4) is queued as its head (prefix,
/// tags and lengths, encoded into `open`, which is then sealed) and the batch's own `Bytes`,
/// so the batch is never copied; every other frame is encoded whole into `open`, where
/// small frames accumulate for one write.
#[derive(Debug, Default)]
pub(super) struct WriteQueue {
    sealed: VecDeque<Bytes>,
    open: BytesMut,
    /// Bytes queued in all, `sealed` and `open` (what the write buffer bound counts).
    queued: usize,
}

impl WriteQueue {
    /// Bytes queued and not yet written.
    pub(super) fn queued(&self) -> usize {
        self.queued
    }

    /// Queues the frame holding `msg`; on error nothing is queued.
    pub(super) fn push<M: prost::Message + 'static>(
        &mut self,
        codec: &FrameCodec,
        msg: &M,
    ) -> Result<(), FrameError> {
        let before = self.open.len();
        let payload = codec.encode_head(msg, &mut self.open)?;
        self.queued += self.open.len() - before;
        if let Some(payload) = payload {
            self.queued += payload.len();
            self.sealed.push_back(self.open.split().freeze());
            self.sealed.push_back(payload);
        }
        Ok(())
    }

    /// Writes until nothing is queued. A stream that reports itself able to take several
    /// slices gets up to [`MAX_SLICES`] per write; any other stream gets one slice per
    /// write. Partial writes resume where they stopped.
    pub(super) fn poll_write_all<T: AsyncWrite>(
        &mut self,
        mut io: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.queued > 0 {
            let n = if io.is_write_vectored() {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let mut count = 0;
                for (slot, chunk) in slices.iter_mut().zip(self.chunks()) {
                    *slot = IoSlice::new(chunk);
                    count += 1;
                }
                ready!(io.as_mut().poll_write_vectored(cx, &slices[..count]))?
            } else {
                let first = self.chunks().next().unwrap_or_default();
                ready!(io.as_mut().poll_write(cx, first))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "failed to write frame to transport",
                )));
            }
            self.consume(n);
        }
        Poll::Ready(Ok(()))
    }

    /// The queued bytes as non-empty slices, in wire order.
    fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.sealed
            .iter()
            .map(|b| &b[..])
            .chain(std::iter::once(&self.open[..]))
            .filter(|c| !c.is_empty())
    }

    /// Drops the first `n` queued bytes (just written).
    fn consume(&mut self, mut n: usize) {
        self.queued -= n.min(self.queued);
        while n > 0 {
            let Some(front) = self.sealed.front_mut() else {
                let n = n.min(self.open.len());
                self.open.advance(n);
                return;
            };
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.sealed.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{UdfRequest, UdfResponse};
    use futures::task::noop_waker_ref;

    /// A stream that takes at most `step` bytes per write, answers `Pending` before every
    /// other write when `stall`, and records what it got and the slices it was shown.
    struct Sink {
        vectored: bool,
        step: usize,
        stall: bool,
        stalled: bool,
        wire: Vec<u8>,
        /// Per write call: the (address, length) of each slice offered.
        calls: Vec<Vec<(usize, usize)>>,
    }

    impl Sink {
        fn new(vectored: bool, step: usize, stall: bool) -> Self {
            Self {
                vectored,
                step,
                stall,
                stalled: false,
                wire: Vec::new(),
                calls: Vec::new(),
            }
        }
    }

    impl AsyncWrite for Sink {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            if self.stall && !self.stalled {
                self.stalled = true;
                return Poll::Pending;
            }
            self.stalled = false;
            self.calls.push(
                bufs.iter()
                    .map(|b| (b.as_ptr() as usize, b.len()))
                    .collect(),
            );
            let mut room = self.step;
            for b in bufs {
                let n = room.min(b.len());
                self.wire.extend_from_slice(&b[..n]);
                room -= n;
            }
            Poll::Ready(Ok(self.step - room))
        }

        fn is_write_vectored(&self) -> bool {
            self.vectored
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn batch(len: usize, seed: u8) -> bytes::Bytes {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// Queues `msgs` and writes them all to `sink`; returns the queue's byte counts before
    /// writing and the frames `FrameCodec::encode` would have written.
    fn write_all(sink: &mut Sink, msgs: &[UdfRequest]) -> (usize, Vec<u8>) {
        let codec = FrameCodec::default();
        let mut queue = WriteQueue::default();
        let mut expected = BytesMut::new();
        for m in msgs {
            queue.push(&codec, m).unwrap();
            codec.encode(m, &mut expected).unwrap();
        }
        let queued = queue.queued();
        let mut cx = Context::from_waker(noop_waker_ref());
        let mut polls = 0;
        while queue
            .poll_write_all(Pin::new(&mut *sink), &mut cx)
            .is_pending()
        {
            polls += 1;
            assert!(polls < 1_000_000, "no progress");
        }
        assert_eq!(queue.queued(), 0);
        assert!(queue.chunks().next().is_none(), "everything was written");
        (queued, expected.to_vec())
    }

    fn messages() -> (Vec<UdfRequest>, Vec<bytes::Bytes>) {
        let big = [batch(70_000, 1), batch(4096, 2)];
        let msgs = vec![
            UdfRequest::finish(),
            UdfRequest::data(big[0].clone()),
            UdfRequest::data(batch(10, 3)),
            UdfRequest::cancel(Some("x".into())),
            UdfRequest::data(big[1].clone()),
        ];
        (msgs, big.to_vec())
    }

    #[test]
    fn batches_go_out_by_reference_in_one_vectored_write() {
        let (msgs, big) = messages();
        let mut sink = Sink::new(true, usize::MAX, false);
        let (queued, expected) = write_all(&mut sink, &msgs);
        assert_eq!(queued, expected.len(), "the bound counts every queued byte");
        assert_eq!(sink.wire, expected, "byte for byte the frames of `encode`");
        assert_eq!(sink.calls.len(), 1, "one write for all the frames");
        let slices = &sink.calls[0];
        // [finish + head 1], batch 1, [small frames + head 2], batch 2.
        assert_eq!(slices.len(), 4, "{slices:?}");
        for b in &big {
            assert!(
                slices.contains(&(b.as_ptr() as usize, b.len())),
                "the batch itself was written, not a copy"
            );
        }
    }

    #[test]
    fn partial_writes_and_pending_resume_exactly_on_both_kinds_of_stream() {
        let (msgs, _) = messages();
        for vectored in [true, false] {
            for step in [1, 3, 7, 1000, 65_536, 70_003] {
                for stall in [false, true] {
                    let mut sink = Sink::new(vectored, step, stall);
                    let (_, expected) = write_all(&mut sink, &msgs);
                    assert_eq!(sink.wire, expected, "vectored {vectored} step {step}");
                    if !vectored {
                        assert!(sink.calls.iter().all(|c| c.len() == 1), "one slice a write");
                    }
                }
            }
        }
    }

    #[test]
    fn a_stream_that_takes_nothing_is_a_write_zero_error() {
        let codec = FrameCodec::default();
        let mut queue = WriteQueue::default();
        queue
            .push(&codec, &UdfResponse::data(batch(5000, 4)))
            .unwrap();
        let mut sink = Sink::new(true, 0, false);
        let mut cx = Context::from_waker(noop_waker_ref());
        match queue.poll_write_all(Pin::new(&mut sink), &mut cx) {
            Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::WriteZero),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn an_oversize_message_queues_nothing() {
        let codec = FrameCodec::new(2000);
        let mut queue = WriteQueue::default();
        queue.push(&codec, &UdfRequest::finish()).unwrap();
        let before = queue.queued();
        assert!(
            queue
                .push(&codec, &UdfRequest::data(batch(3000, 5)))
                .is_err()
        );
        assert!(
            queue
                .push(&codec, &UdfRequest::data(batch(1500, 5)))
                .is_ok()
        );
        assert_eq!(queue.queued(), before + 4 + 1500 + 6);
        assert_eq!(queue.sealed.len(), 2, "one head and one batch");
    }
}
