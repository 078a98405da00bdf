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
