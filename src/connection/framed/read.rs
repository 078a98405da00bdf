//! The read half of a framed connection: one buffer, sized from each frame's length prefix
//! so a body arrives in place, without committing memory the peer has not sent (udf §6.4's
//! 128 MiB limit is a bound, not an allocation).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, BytesMut};
use tokio::io::AsyncRead;
use tokio_util::io::poll_read_buf;

use super::FramedError;
use crate::wire::{FrameCodec, FrameError};

/// Most capacity committed for a frame on the strength of its prefix alone (1 MiB); beyond
/// it the buffer grows to twice the bytes received, so a 4-byte prefix claiming 128 MiB
/// commits at most this much.
pub(super) const FIRST_COMMIT: usize = 1024 * 1024;

/// Read-ahead past the end of a small frame or before a prefix is known (16 KiB): small
/// frames arrive many per read.
pub(super) const READ_AHEAD: usize = 16 * 1024;

/// Read-ahead past the end of a large frame (256 bytes): enough for the next prefix and
/// envelope head, so little of the next frame's body lands in this frame's buffer, where it
/// would be copied out again.
pub(super) const LARGE_READ_AHEAD: usize = 256;

/// Frames from this size up (64 KiB) get only [`LARGE_READ_AHEAD`].
pub(super) const LARGE_FRAME: usize = 64 * 1024;

/// The received bytes not yet decoded, and whether the stream has ended.
#[derive(Debug)]
pub(super) struct ReadBuffer {
    buf: BytesMut,
    eof: bool,
}

impl ReadBuffer {
    /// An empty buffer with `capacity` bytes to start with.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: BytesMut::with_capacity(capacity),
            eof: false,
        }
    }

    /// Whether a frame has started arriving (bytes are buffered).
    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The next message: `Ready(None)` at a clean end of stream (on a frame boundary),
    /// a typed error for an I/O failure, an oversize prefix, an undecodable body or a
    /// stream cut inside a frame.
    pub(super) fn poll_next<T: AsyncRead, M: prost::Message + Default>(
        &mut self,
        codec: &mut FrameCodec,
        mut io: Pin<&mut T>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<M, FramedError>>> {
        loop {
            match codec.decode_complete(&mut self.buf) {
                Ok(Some(msg)) => return Poll::Ready(Some(Ok(msg))),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
            if self.eof {
                return Poll::Ready(
                    codec
                        .decode_eof(&mut self.buf)
                        .map_err(Into::into)
                        .transpose(),
                );
            }
            let limit = match self.make_room(codec) {
                Ok(limit) => limit,
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            };
            let n = match ready!(poll_read_buf(
                io.as_mut(),
                cx,
                &mut (&mut self.buf).limit(limit)
            )) {
                Ok(n) => n,
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            };
            if n == 0 {
                self.eof = true;
            }
        }
    }

    /// Makes sure the buffer has spare capacity for the next read and returns how many
    /// bytes that read may take: up to the end of the frame being received plus a little
    /// read-ahead, and no more capacity than [`FIRST_COMMIT`] or twice the bytes of the
    /// frame received so far, whichever is larger. Growing by doubling, a body of `n` bytes
    /// is copied at most about `n` more times in all by the regrowths; a buffer whose
    /// earlier frames were all dropped is reused in place (no fresh allocation, so no page
    /// faults on memory the allocator just mapped).
    fn make_room(&mut self, codec: &FrameCodec) -> Result<usize, FrameError> {
        let have = self.buf.len();
        let want = match codec.frame_total(&self.buf)? {
            Some(total) => {
                let ahead = if total >= LARGE_FRAME {
                    LARGE_READ_AHEAD
                } else {
                    READ_AHEAD
                };
                (total + ahead).min(FIRST_COMMIT.max(2 * have))
            }
            None => have + READ_AHEAD,
        };
        if self.buf.capacity() < want {
            self.buf.reserve(want - have);
        }
        Ok(want - have)
    }
}
