//! I/O schedules over the framed connection (`connection::framed`, udf §1.1 over a byte
//! stream): a fuzzed `AsyncRead`/`AsyncWrite` that returns partial reads and writes (one
//! slice at a time or vectored), `Pending` at any point, EOF or an I/O error at any byte, a
//! zero-byte write. Data batches are small or large (1 KiB to 2 MiB: the by-reference write
//! path and the growing read buffer). Invariants:
//! - writing: the bytes that reach the socket are always a prefix of the frames of the
//!   messages accepted, all of them once the flush succeeds; a failing socket surfaces as a
//!   typed `ConnectionError::Transport` whose source is `FramedError::Io` (`WriteZero` for a
//!   zero-byte write);
//! - reading: every frame that arrived whole is read back intact and in order; the stream
//!   then ends cleanly exactly when the input stopped on a frame boundary, and otherwise
//!   with a typed error (`FramedError::Frame(Truncated)` for a cut, `FramedError::Io` for a
//!   failing socket, `Oversize` / `Decode` for a bad trailing frame that arrived whole),
//!   after which it stays ended.
#![no_main]

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use arbitrary::Arbitrary;
use bytes::BytesMut;
use futures::task::noop_waker_ref;
use libfuzzer_sys::fuzz_target;
use tether::connection::framed::{FramedConfig, FramedConnection, FramedError};
use tether::connection::{Connection, ConnectionError};
use tether_testing::fixtures::tagged;
use tether::wire::{FrameCodec, FrameError, UdfRequest, UdfResponse};
use tether_fuzz::FuzzRequest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One I/O call's fate: `Pending` (a multiple of 5), as much as the call offers (240 and
/// up that is not a multiple of 5, so that megabyte frames finish), or up to that many bytes.
#[derive(Arbitrary, Debug)]
struct Schedule(Vec<u8>);

impl Schedule {
    fn step(&self, i: &mut usize) -> Option<usize> {
        if self.0.is_empty() {
            return Some(usize::MAX);
        }
        let s = self.0[*i % self.0.len()];
        *i += 1;
        match s {
            _ if s % 5 == 0 => None,
            240.. => Some(usize::MAX),
            _ => Some(usize::from(s)),
        }
    }
}

/// Sizes of large data batches, chosen by a message's size byte: around the by-reference
/// write threshold (1 KiB), the reader's large-frame mark (64 KiB) and its first commit
/// (1 MiB), so the vectored write queue and the growing read buffer are exercised.
const LARGE: [usize; 8] = [
    1023,
    1024,
    4096,
    64 * 1024 - 9,
    64 * 1024 + 1,
    300 * 1024,
    1024 * 1024 + 17,
    2 * 1024 * 1024 + 3,
];

/// At most this many bytes of large batches per input (keeps an execution fast).
const LARGE_BUDGET: usize = 4 * 1024 * 1024;

struct Mock {
    input: Vec<u8>,
    pos: usize,
    /// Reads end here: EOF, or an error when `read_error`.
    end: usize,
    read_error: bool,
    reads: Schedule,
    read_i: usize,
    written: Vec<u8>,
    writes: Schedule,
    write_i: usize,
    /// Writes fail once this many bytes were written.
    write_fail_at: Option<usize>,
    /// The failure is a write of zero bytes rather than an error.
    write_zero: bool,
    /// Reports itself able to take several slices per write.
    vectored: bool,
}

impl Mock {
    /// A write of up to `offered` bytes, as the schedule and the failure point allow.
    fn write_step(&mut self, cx: &mut Context<'_>, offered: usize) -> Poll<io::Result<usize>> {
        if self
            .write_fail_at
            .is_some_and(|at| self.written.len() >= at)
        {
            if self.write_zero {
                return Poll::Ready(Ok(0));
            }
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "broken pipe",
            )));
        }
        let Some(n) = self.writes.step(&mut self.write_i) else {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        };
        Poll::Ready(Ok(n.min(offered)))
    }
}

impl AsyncRead for Mock {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        let Some(n) = me.reads.step(&mut me.read_i) else {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        };
        if me.pos >= me.end {
            if me.read_error {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset")));
            }
            return Poll::Ready(Ok(())); // EOF
        }
        let n = n.min(me.end - me.pos).min(buf.remaining());
        buf.put_slice(&me.input[me.pos..me.pos + n]);
        me.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Mock {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        let n = ready!(me.write_step(cx, buf.len()))?;
        me.written.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        let offered = bufs.iter().map(|b| b.len()).sum();
        let n = ready!(me.write_step(cx, offered))?;
        let mut left = n;
        for b in bufs {
            let take = left.min(b.len());
            me.written.extend_from_slice(&b[..take]);
            left -= take;
        }
        Poll::Ready(Ok(n))
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

#[derive(Arbitrary, Debug)]
struct Input {
    messages: Vec<(FuzzRequest, u8)>,
    reads: Schedule,
    writes: Schedule,
    read_buffer: u8,
    write_buffer: u8,
    /// Where the reader's input ends, as a fraction of the whole (255 = all of it).
    cut: u8,
    read_error: bool,
    write_fail_at: Option<u16>,
    write_zero: bool,
    vectored: bool,
    /// A bad frame after the messages, for the reader only.
    trailer: Option<Trailer>,
}

/// A frame the reader must refuse once it has arrived whole.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq)]
enum Trailer {
    /// A prefix claiming more than the maximum frame length: refused from its 4 bytes.
    Oversize,
    /// A 3-byte body that is not protobuf: refused once whole.
    Undecodable,
}

impl Trailer {
    fn bytes(self) -> &'static [u8] {
        match self {
            Trailer::Oversize => &[0xff, 0xff, 0xff, 0xff],
            Trailer::Undecodable => &[0, 0, 0, 3, 0xff, 0xff, 0xff],
        }
    }
}

fn mock(input: Vec<u8>, end: usize, i: &Input) -> Mock {
    Mock {
        input,
        pos: 0,
        end,
        read_error: i.read_error,
        reads: Schedule(i.reads.0.clone()),
        read_i: 0,
        written: Vec::new(),
        writes: Schedule(i.writes.0.clone()),
        write_i: 0,
        write_fail_at: i.write_fail_at.map(usize::from),
        write_zero: i.write_zero,
        vectored: i.vectored,
    }
}

/// Polls until ready; a schedule of only `Pending` would spin, so give up after a bound.
fn ready<T>(mut f: impl FnMut(&mut Context<'_>) -> Poll<T>) -> Option<T> {
    let mut cx = Context::from_waker(noop_waker_ref());
    for _ in 0..100_000 {
        if let Poll::Ready(v) = f(&mut cx) {
            return Some(v);
        }
    }
    None
}

fn framed_error(e: &ConnectionError) -> &FramedError {
    let ConnectionError::Transport(inner) = e else {
        panic!("an untyped connection error: {e:?}");
    };
    inner
        .downcast_ref::<FramedError>()
        .expect("the source is a FramedError")
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
}

fuzz_target!(|input: Input| {
    RUNTIME.with(|rt| {
        let _guard = rt.enter();
        run(&input);
    });
});

fn run(input: &Input) {
    let mut large_left = LARGE_BUDGET;
    let msgs: Vec<UdfRequest> = input
        .messages
        .iter()
        .take(32)
        .enumerate()
        .map(|(i, (m, size))| {
            // A data batch whose size byte is odd is a large one, if the budget allows.
            let len = LARGE[usize::from(size / 2) % LARGE.len()];
            if matches!(m, FuzzRequest::Data) && size % 2 == 1 && len <= large_left {
                large_left -= len;
                UdfRequest::data(tagged(i as u64, len))
            } else {
                m.message(i as u32)
            }
        })
        .collect();
    let codec = FrameCodec::default();
    let mut frames = Vec::new(); // frame end offsets
    let mut all = BytesMut::new();
    for m in &msgs {
        codec.encode(m, &mut all).unwrap();
        frames.push(all.len());
    }
    let config = FramedConfig {
        read_buffer: usize::from(input.read_buffer),
        write_buffer: usize::from(input.write_buffer),
        ..FramedConfig::default()
    };

    // Writing.
    let mut w: FramedConnection<Mock, UdfRequest, UdfResponse> =
        FramedConnection::new(mock(Vec::new(), 0, input), &config);
    let mut accepted = 0;
    let mut failed = None;
    'send: for m in &msgs {
        match ready(|cx| w.poll_ready(cx)) {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                failed = Some(e);
                break 'send;
            }
            None => break 'send,
        }
        if let Err(e) = w.start_send(m.clone()) {
            failed = Some(e);
            break;
        }
        accepted += 1;
    }
    if failed.is_none() {
        match ready(|cx| w.poll_flush(cx)) {
            Some(Ok(())) => {
                let written = &w.get_ref().written;
                let want = if accepted == 0 {
                    0
                } else {
                    frames[accepted - 1]
                };
                assert_eq!(written.len(), want, "a successful flush wrote everything");
            }
            Some(Err(e)) => failed = Some(e),
            None => {}
        }
    }
    let written = &w.get_ref().written;
    assert!(written.len() <= all.len());
    assert_eq!(
        written[..],
        all[..written.len()],
        "the socket got something else than the frames"
    );
    if let Some(e) = failed {
        let FramedError::Io(io) = framed_error(&e) else {
            panic!("not an I/O error: {e:?}");
        };
        assert_eq!(
            io.kind() == io::ErrorKind::WriteZero,
            input.write_zero,
            "a zero-byte write is WriteZero, a failing one is not: {e:?}"
        );
        assert!(
            input.write_fail_at.is_some(),
            "a write error without a failing socket"
        );
    }

    // Reading what arrived (and the trailer), cut anywhere.
    let messages_end = all.len();
    let mut arrived = all.to_vec();
    arrived.extend_from_slice(input.trailer.map_or(&[][..], Trailer::bytes));
    let end = arrived.len() * usize::from(input.cut) / 255;
    // The trailer's error, if it arrived whole (it is found before any later I/O error).
    let refused = input
        .trailer
        .filter(|t| end >= messages_end + t.bytes().len());
    let mut r: FramedConnection<Mock, UdfResponse, UdfRequest> =
        FramedConnection::new(mock(arrived, end, input), &config);
    let whole = frames.iter().filter(|&&f| f <= end).count();
    let boundary = end == 0 || frames.contains(&end);
    let mut got = 0;
    loop {
        match ready(|cx| r.poll_recv(cx)) {
            None => return, // only Pending: nothing more to check
            Some(Some(Ok(m))) => {
                assert!(got < whole, "a message beyond the input");
                assert_eq!(m, msgs[got], "a frame was not read back intact");
                got += 1;
            }
            Some(Some(Err(e))) => {
                assert_eq!(got, whole, "a whole frame was lost before the error");
                match (framed_error(&e), refused) {
                    (FramedError::Frame(FrameError::Oversize { .. }), Some(Trailer::Oversize)) => {}
                    (FramedError::Frame(FrameError::Decode(_)), Some(Trailer::Undecodable)) => {}
                    (other, Some(t)) => panic!("{t:?} arrived whole, yet {other:?}"),
                    (FramedError::Io(_), None) => {
                        assert!(input.read_error, "an I/O error from a clean socket")
                    }
                    (FramedError::Frame(FrameError::Truncated { .. }), None) => {
                        assert!(
                            !input.read_error && !boundary,
                            "Truncated on a frame boundary"
                        )
                    }
                    (other, None) => panic!("unexpected error {other:?}"),
                }
                assert!(
                    matches!(ready(|cx| r.poll_recv(cx)), Some(None)),
                    "not ended after the error"
                );
                return;
            }
            Some(None) => {
                assert_eq!(got, whole, "a clean end before every whole frame");
                assert!(
                    boundary && !input.read_error,
                    "a clean end mid-frame or on an I/O error"
                );
                return;
            }
        }
    }
}
