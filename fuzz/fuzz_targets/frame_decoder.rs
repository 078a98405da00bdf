//! The frame decoder (`FrameCodec`, tether's framing of the udf §1.2 envelopes) against an
//! independent oracle that splits the whole input into frames by hand. The input arrives in
//! fuzzed chunks; whatever the chunking, the decoder must yield exactly the oracle's events
//! (a message equal to prost's decoding of that frame's body, a typed `Decode` error that
//! consumes the frame, `Oversize` that leaves the buffer untouched, `Truncated` at the end
//! of input). Memory: a length prefix over the limit errors without reserving anything, and
//! waiting for a body never grows the buffer by more than 64 KiB beyond what was received,
//! whatever length the prefix claims.
#![no_main]

use arbitrary::Arbitrary;
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tether::wire::{FrameCodec, FrameError, UdfRequest, UdfResponse};

const MAX_RESERVE: usize = 64 * 1024;

#[derive(Arbitrary, Debug)]
struct Input {
    /// A small limit (0..=1023 bytes), or a large one (16 MiB) to show that a claimed
    /// length under the limit is still not allocated ahead of the bytes.
    small_limit: Option<u16>,
    responses: bool,
    /// Where the input is split into reads.
    cuts: Vec<u16>,
    bytes: Vec<u8>,
}

#[derive(Debug, PartialEq)]
enum Event<M> {
    Msg(M),
    Decode,
    Oversize { len: usize },
    Truncated { needed: usize, available: usize },
}

fn oracle<M: Message + Default>(bytes: &[u8], max: usize) -> Vec<Event<M>> {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            return out;
        }
        if rest.len() < 4 {
            out.push(Event::Truncated {
                needed: 4,
                available: rest.len(),
            });
            return out;
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len > max {
            out.push(Event::Oversize { len });
            return out;
        }
        if rest.len() < 4 + len {
            out.push(Event::Truncated {
                needed: 4 + len,
                available: rest.len(),
            });
            return out;
        }
        out.push(match M::decode(&rest[4..4 + len]) {
            Ok(m) => Event::Msg(m),
            Err(_) => Event::Decode,
        });
        at += 4 + len;
    }
}

fn run<M: Message + Default + PartialEq + Clone + std::fmt::Debug>(input: &Input) {
    let max = match input.small_limit {
        Some(n) => usize::from(n % 1024),
        None => 16 * 1024 * 1024,
    };
    let expected = oracle::<M>(&input.bytes, max);
    let mut codec = FrameCodec::new(max);
    assert_eq!(codec.max_frame_len(), max);
    let mut got: Vec<Event<M>> = Vec::new();
    let mut buf = BytesMut::new();
    let mut cuts: Vec<usize> = input
        .cuts
        .iter()
        .map(|c| usize::from(*c) % (input.bytes.len() + 1))
        .collect();
    cuts.push(input.bytes.len());
    cuts.sort_unstable();
    let mut fed = 0;
    let mut fatal = false;
    'feed: for cut in cuts {
        buf.extend_from_slice(&input.bytes[fed..cut]);
        fed = cut;
        loop {
            let (len, cap) = (buf.len(), buf.capacity());
            let snapshot = buf.clone();
            match codec.decode::<M>(&mut buf) {
                Ok(Some(m)) => {
                    let body = len - buf.len() - 4;
                    assert!(body <= max, "a frame over the limit was decoded");
                    // Re-encoding gives a frame that decodes to the same value.
                    let mut again = BytesMut::new();
                    codec.encode(&m, &mut again).expect("re-encode");
                    assert_eq!(
                        codec.decode::<M>(&mut again).expect("re-decode"),
                        Some(m.clone())
                    );
                    assert!(again.is_empty());
                    got.push(Event::Msg(m));
                }
                Ok(None) => {
                    assert_eq!(buf, snapshot, "Ok(None) consumed bytes");
                    // No allocation ahead of the bytes: the buffer stays within a constant
                    // factor (the allocator's doubling) of the bytes actually received plus
                    // min(64 KiB, the limit), however long the claimed body.
                    let ahead = MAX_RESERVE.min(max + 4);
                    let bound = cap.max(4 * (fed + 8 + ahead));
                    assert!(
                        buf.capacity() <= bound,
                        "reserved {} > {bound}",
                        buf.capacity()
                    );
                    break;
                }
                Err(FrameError::Oversize {
                    len: claimed,
                    max: m,
                }) => {
                    assert_eq!(m, max);
                    assert!(claimed > max);
                    assert_eq!(buf, snapshot, "Oversize touched the buffer");
                    assert_eq!(buf.capacity(), cap, "Oversize reserved memory");
                    got.push(Event::Oversize { len: claimed });
                    fatal = true;
                    break 'feed;
                }
                Err(FrameError::Decode(_)) => {
                    assert!(buf.len() < len, "a bad frame was not consumed");
                    got.push(Event::Decode);
                }
                Err(e) => panic!("unexpected error from decode: {e:?}"),
            }
        }
    }
    if !fatal {
        // End of input.
        loop {
            let snapshot = buf.clone();
            match codec.decode_eof::<M>(&mut buf) {
                Ok(Some(m)) => got.push(Event::Msg(m)),
                Ok(None) => {
                    assert!(buf.is_empty(), "a clean end with bytes left");
                    break;
                }
                Err(FrameError::Truncated { needed, available }) => {
                    assert_eq!(available, buf.len());
                    assert!(needed > available);
                    assert_eq!(buf, snapshot, "Truncated touched the buffer");
                    got.push(Event::Truncated { needed, available });
                    break;
                }
                Err(FrameError::Decode(_)) => got.push(Event::Decode),
                Err(FrameError::Oversize { len, .. }) => {
                    got.push(Event::Oversize { len });
                    break;
                }
                Err(e) => panic!("unexpected error from decode_eof: {e:?}"),
            }
        }
    }
    assert_eq!(got, expected, "the decoder disagrees with the oracle");
}

fuzz_target!(|input: Input| {
    if input.responses {
        run::<UdfResponse>(&input);
    } else {
        run::<UdfRequest>(&input);
    }
});
