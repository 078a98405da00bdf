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
    /// Whether the last frame whose prefix was seen was a large one.
    large: bool,
}

impl ReadBuffer {
    /// An empty buffer with `capacity` bytes to start with.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: BytesMut::with_capacity(capacity),
            eof: false,
            large: false,
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
    /// read-ahead. Once the prefix is known the buffer holds up to the frame's end, but at
    /// most [`FIRST_COMMIT`]; when it fills before the end it grows to twice the bytes
    /// received. Growing by doubling, the regrowths move fewer bytes in all than the
    /// capacity finally reached (under twice the body), and `realloc` usually remaps
    /// rather than copies them. The allocation is reused
    /// in place when every earlier frame taken from it has been dropped; otherwise a new
    /// one of exactly the size needed is made (an exact size stays under the allocator's
    /// mmap threshold when the frame does, so frames of up to about 128 KiB do not cost
    /// fresh mappings and their page faults).
    fn make_room(&mut self, codec: &FrameCodec) -> Result<usize, FrameError> {
        let have = self.buf.len();
        let full = self.buf.capacity() == have;
        // `end`: where the read may stop; `need`: the capacity to have before reading.
        let (end, need) = match codec.frame_total(&self.buf)? {
            Some(total) => {
                self.large = total >= LARGE_FRAME;
                let end = total + self.read_ahead();
                let grown = if full { 2 * have } else { 0 };
                (end, end.min(FIRST_COMMIT.max(grown)))
            }
            // Before a prefix: after a large frame, expect another one and read little of
            // its body into a buffer it would be copied out of.
            None => (have + self.read_ahead(), have + self.read_ahead()),
        };
        if self.buf.capacity() < need && !self.buf.try_reclaim(need - have) {
            if have >= FIRST_COMMIT {
                // Growing a large frame's own allocation: `realloc`, which moves the pages
                // of a large block (`mremap`) rather than copying them.
                self.buf.reserve(need - have);
            } else {
                let mut fresh = BytesMut::with_capacity(need);
                fresh.extend_from_slice(&self.buf);
                self.buf = fresh;
            }
        }
        Ok(self.buf.capacity().min(end) - have)
    }

    /// How far to read past the end of the current frame (or into an unknown one).
    fn read_ahead(&self) -> usize {
        if self.large {
            LARGE_READ_AHEAD
        } else {
            READ_AHEAD
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{DEFAULT_MAX_FRAME_LEN, ResponseMessage, UdfResponse};
    use bytes::Bytes;
    use futures::task::noop_waker_ref;
    use tokio::io::ReadBuf;

    /// A stream holding `input`; it gives at most `step` bytes per read and answers
    /// `Pending` after each read (so the test sees the buffer between reads), then ends at
    /// `input.len()`.
    struct Source {
        input: Vec<u8>,
        pos: usize,
        step: usize,
        ready: bool,
        /// Whether the stream ends after `input` (otherwise it stays `Pending`).
        ended: bool,
    }

    impl Source {
        fn new(input: Vec<u8>, step: usize) -> Self {
            Self {
                input,
                pos: 0,
                step,
                ready: true,
                ended: false,
            }
        }
    }

    impl AsyncRead for Source {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let exhausted = self.pos == self.input.len();
            if !std::mem::replace(&mut self.ready, false) || (exhausted && !self.ended) {
                self.ready = true;
                return Poll::Pending;
            }
            let n = self
                .step
                .min(buf.remaining())
                .min(self.input.len() - self.pos);
            let start = self.pos;
            buf.put_slice(&self.input[start..start + n]);
            self.pos += n;
            Poll::Ready(Ok(()))
        }
    }

    fn frame(data: &Bytes) -> Vec<u8> {
        let mut out = BytesMut::new();
        FrameCodec::default()
            .encode(&UdfResponse::data(data.clone()), &mut out)
            .unwrap();
        out.to_vec()
    }

    fn batch(len: usize, seed: u8) -> Bytes {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(13) ^ seed)
            .collect()
    }

    fn data_of(msg: UdfResponse) -> Bytes {
        match msg.into_message() {
            Ok(ResponseMessage::Data(d)) => d,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Polls once: `Some` with the outcome, or `None` on `Pending`.
    fn poll(
        read: &mut ReadBuffer,
        codec: &mut FrameCodec,
        io: &mut Source,
    ) -> Option<Option<Result<UdfResponse, FramedError>>> {
        let mut cx = Context::from_waker(noop_waker_ref());
        match read.poll_next::<_, UdfResponse>(codec, Pin::new(io), &mut cx) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }

    #[test]
    fn a_prefix_alone_commits_at_most_one_mib_of_the_128_mib_it_claims() {
        let mut input = (DEFAULT_MAX_FRAME_LEN as u32).to_be_bytes().to_vec();
        input.extend_from_slice(&[0x12; 100]);
        let mut io = Source::new(input, usize::MAX);
        let mut codec = FrameCodec::default();
        let mut read = ReadBuffer::with_capacity(64);
        for _ in 0..6 {
            assert!(poll(&mut read, &mut codec, &mut io).is_none());
            assert!(
                read.buf.capacity() <= FIRST_COMMIT,
                "committed {} bytes for 104 received",
                read.buf.capacity()
            );
        }
        assert_eq!(read.buf.len(), 104);
        assert!(!read.is_empty());
        // The stream ends: a truncated frame, not a message.
        io.ended = true;
        let mut end = None;
        for _ in 0..4 {
            end = poll(&mut read, &mut codec, &mut io);
            if end.is_some() {
                break;
            }
        }
        match end {
            Some(Some(Err(FramedError::Frame(FrameError::Truncated {
                needed,
                available: 104,
            })))) => assert_eq!(needed, 4 + DEFAULT_MAX_FRAME_LEN),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_large_body_grows_by_doubling_as_it_arrives_and_moves_less_than_twice_its_size() {
        let data = batch(5 * 1024 * 1024 + 17, 1);
        let input = frame(&data);
        let total = input.len();
        let mut io = Source::new(input, 64 * 1024);
        let mut codec = FrameCodec::default();
        let mut read = ReadBuffer::with_capacity(64 * 1024);
        let mut copied = 0;
        let mut allocations = 0;
        let mut last = (read.buf.as_ptr(), 0usize);
        let msg = loop {
            let before = read.buf.len();
            match poll(&mut read, &mut codec, &mut io) {
                None => {
                    let received = read.buf.len();
                    assert!(
                        read.buf.capacity() <= FIRST_COMMIT.max(2 * received) + READ_AHEAD,
                        "capacity {} for {received} received",
                        read.buf.capacity()
                    );
                    if read.buf.as_ptr() != last.0 {
                        // A new allocation: the bytes of the frame so far moved into it.
                        allocations += 1;
                        copied += last.1.min(before);
                    }
                    last = (read.buf.as_ptr(), received);
                }
                Some(Some(Ok(m))) => break m,
                Some(other) => panic!("unexpected {other:?}"),
            }
        };
        assert_eq!(data_of(msg), data, "the body arrived intact");
        // 16 KiB before the prefix, then 1 MiB, 2, 4 and 8 MiB: a handful of allocations,
        // and the regrowths moved (at worst copied) fewer bytes than the capacity reached,
        // under twice the frame.
        assert!(allocations <= 5, "{allocations} allocations");
        assert!(copied < 2 * total, "moved {copied} of {total}");
        assert!(read.is_empty());
    }

    #[test]
    fn the_buffer_is_reused_once_earlier_frames_are_dropped_and_kept_apart_otherwise() {
        let (a, b, c) = (batch(70_000, 2), batch(70_000, 3), batch(70_000, 4));
        let mut input = frame(&a);
        input.extend(frame(&b));
        input.extend(frame(&c));
        let mut io = Source::new(input, usize::MAX);
        let mut codec = FrameCodec::default();
        let mut read = ReadBuffer::with_capacity(1024);
        let mut next = || loop {
            if let Some(r) = poll(&mut read, &mut codec, &mut io) {
                return data_of(r.expect("a frame").expect("decodes"));
            }
        };
        let first = next();
        assert_eq!(first, a);
        let at = first.as_ptr();
        drop(first);
        let second = next();
        assert_eq!(second, b);
        assert_eq!(
            second.as_ptr(),
            at,
            "the dropped frame's allocation was reused"
        );
        // Held: the next frame goes elsewhere and the held one is untouched.
        let third = next();
        assert_eq!(third, c);
        assert_ne!(third.as_ptr(), second.as_ptr());
        assert_eq!(second, b, "a held frame is never overwritten");
    }
}
