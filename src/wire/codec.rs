//! A sans-IO length-delimited frame codec for carrying protocol messages over byte streams:
//! tether's own framing, where Spark carries the udf §1.1 `Execute` stream over gRPC.

#[cfg(feature = "tokio")]
use std::any::Any;

use bytes::{Buf, BufMut, BytesMut};
// What the framed transport's by-reference writes (`encode_head`) look inside.
#[cfg(feature = "tokio")]
use {
    super::{DataRequest, DataResponse, UdfRequest, UdfResponse, udf_request, udf_response},
    bytes::Bytes,
};

/// Default upper bound on a frame body: 128 MiB (134 217 728 bytes), excluding the 4-byte
/// length prefix — Spark's gRPC max inbound message size for worker channels
/// (`DEFAULT_MAX_INBOUND_MESSAGE_SIZE`, udf §6.4, §7).
pub const DEFAULT_MAX_FRAME_LEN: usize = 128 * 1024 * 1024;

/// Size of the big-endian `u32` length prefix, in bytes.
const HEADER_LEN: usize = 4;

/// Largest buffer reservation made at once while waiting for a frame body, in bytes (64 KiB).
const MAX_RESERVE: usize = 64 * 1024;

#[cfg(feature = "tokio")] // the framed transport's vectored writes only
/// Smallest trailing `bytes` payload that [`FrameCodec::encode_head`] leaves out of the
/// encoded head, to be written by reference (1 KiB): below it, copying is cheaper than an
/// extra slice in the write.
pub(crate) const BY_REFERENCE_MIN: usize = 1024;

#[cfg(feature = "tokio")] // the framed transport's vectored writes only
/// Protobuf wire type of length-delimited fields (`bytes`, nested messages).
const LENGTH_DELIMITED: u64 = 2;

/// Why a frame could not be encoded or decoded. On a session's connection any of these is a
/// transport failure (on the engine side, `TransportFailed`: udf §4.5).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame body (`len` bytes) is larger than the codec's maximum (`max` bytes). On
    /// decode the buffer is left untouched and the stream cannot be resynchronised; treat it
    /// as fatal.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    Oversize {
        /// Body length in bytes that was claimed (decode) or required (encode).
        len: usize,
        /// The codec's maximum body length in bytes.
        max: usize,
    },
    /// Input ended part-way through a frame: only `available` of the frame's `needed` bytes
    /// (prefix included; `needed` is 4 when the prefix itself is incomplete) were received.
    #[error("stream ended inside a frame: {available} of {needed} bytes")]
    Truncated {
        /// Bytes the incomplete frame needs in total, including the 4-byte prefix.
        needed: usize,
        /// Bytes actually buffered.
        available: usize,
    },
    /// A complete frame's body is not a valid encoding of the expected message. The frame
    /// has been consumed, so the next one can still be decoded.
    #[error("undecodable frame")]
    Decode(#[from] prost::DecodeError),
}

/// A sans-IO length-delimited frame codec for carrying protocol messages over byte streams
/// (sockets, pipes) where gRPC's own framing is not available: tether's framing of the
/// udf §1.1 `Execute` stream, whose transport in Spark is gRPC over a Unix socket (udf §6.4).
///
/// Each frame is a 4-byte big-endian unsigned length `N` followed by exactly `N` bytes holding
/// one encoded protobuf message (for the `Execute` stream: a
/// [`UdfRequest`](crate::wire::UdfRequest) or [`UdfResponse`](crate::wire::UdfResponse),
/// udf §1.2). The codec only moves bytes between a [`BytesMut`] buffer and messages; reading
/// and writing the transport is the caller's job.
///
/// Robustness: a length prefix above the configured maximum is rejected as soon as the four
/// prefix bytes are buffered, and while waiting for a body the codec asks for at most 64 KiB
/// of extra buffer capacity beyond the bytes already received, so a hostile length prefix
/// cannot make it allocate memory the peer has not actually sent. A frame whose body fails to
/// decode is consumed before the error is returned, so decoding can continue with the next
/// frame.
///
/// Holds only the maximum body length, so it is cheap to clone; it keeps no per-stream state
/// between calls.
#[derive(Debug, Clone)]
pub struct FrameCodec {
    max_frame_len: usize,
}

impl Default for FrameCodec {
    /// A codec with the [`DEFAULT_MAX_FRAME_LEN`] limit (128 MiB).
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME_LEN)
    }
}

impl FrameCodec {
    /// A codec accepting frame bodies of at most `max_frame_len` bytes (Spark's gRPC limit,
    /// the default, is 128 MiB: udf §6.4). Values above `u32::MAX` are clamped to it, the
    /// largest length the prefix can express.
    pub fn new(max_frame_len: usize) -> Self {
        let prefix_limit = usize::try_from(u32::MAX).unwrap_or(usize::MAX);
        Self {
            max_frame_len: max_frame_len.min(prefix_limit),
        }
    }

    /// The largest accepted frame body, in bytes (excluding the 4-byte prefix; udf §6.4's
    /// 128 MiB by default).
    pub fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    /// Appends one frame holding `msg` (one udf §1.2 envelope) to `dst`. Fails with
    /// [`FrameError::Oversize`], leaving `dst` unchanged, if the encoded message is longer
    /// than [`max_frame_len`](Self::max_frame_len).
    pub fn encode<M: prost::Message>(&self, msg: &M, dst: &mut BytesMut) -> Result<(), FrameError> {
        let len = msg.encoded_len();
        let oversize = FrameError::Oversize {
            len,
            max: self.max_frame_len,
        };
        if len > self.max_frame_len {
            return Err(oversize);
        }
        // `new` clamps the maximum to u32::MAX, so this conversion cannot fail.
        let Ok(prefix) = u32::try_from(len) else {
            return Err(oversize);
        };
        dst.reserve(HEADER_LEN + len);
        dst.put_u32(prefix);
        // prost only fails when the buffer lacks capacity, which a `BytesMut` with the space
        // reserved above never does; report it as oversize rather than panicking.
        msg.encode(dst).map_err(|_| oversize)
    }

    #[cfg(feature = "tokio")] // the framed transport's vectored writes only
    /// Appends to `dst` the frame holding `msg`, like [`encode`](Self::encode), except for a
    /// message whose encoding ends with a `bytes` field of at least [`BY_REFERENCE_MIN`]
    /// bytes (a data batch of udf §1.4, in its envelope or alone): then only the head goes
    /// into `dst` (the prefix, then every tag and length down to that field) and the field's
    /// contents are returned, to be written right after it without being copied. The head
    /// followed by the returned bytes is exactly what `encode` writes. Fails with
    /// [`FrameError::Oversize`], leaving `dst` unchanged, like `encode`.
    pub(crate) fn encode_head<M: prost::Message + 'static>(
        &self,
        msg: &M,
        dst: &mut BytesMut,
    ) -> Result<Option<Bytes>, FrameError> {
        let Some((path, data)) = trailing_bytes(msg).filter(|(_, d)| d.len() >= BY_REFERENCE_MIN)
        else {
            self.encode(msg, dst)?;
            return Ok(None);
        };
        // contents[i]: the length of the field `path[i]`'s contents; the body is the
        // outermost field.
        let mut contents = [0usize; MAX_DEPTH];
        let mut len = data.len();
        for (i, &tag) in path.iter().enumerate().rev() {
            contents[i] = len;
            len = varint_len(key(tag)) + varint_len(len as u64) + len;
        }
        if len > self.max_frame_len {
            return Err(FrameError::Oversize {
                len,
                max: self.max_frame_len,
            });
        }
        let Ok(prefix) = u32::try_from(len) else {
            return Err(FrameError::Oversize {
                len,
                max: self.max_frame_len,
            });
        };
        dst.reserve(HEADER_LEN + path.len() * 2 * MAX_VARINT_LEN);
        dst.put_u32(prefix);
        for (&tag, &content) in path.iter().zip(&contents) {
            put_varint(key(tag), dst);
            put_varint(content as u64, dst);
        }
        Ok(Some(data.clone()))
    }

    /// Takes the next complete frame off the front of `src` and decodes it (one udf §1.2
    /// envelope).
    ///
    /// Returns `Ok(None)` when `src` does not yet hold a whole frame (nothing is consumed; at
    /// most 64 KiB of extra capacity is reserved in `src`, however long the claimed body). The
    /// length prefix is checked against the maximum as soon as it is buffered, so an oversize
    /// frame errors at once without waiting for (or allocating) its body. On
    /// [`FrameError::Decode`] the bad frame has been consumed.
    pub fn decode<M: prost::Message + Default>(
        &mut self,
        src: &mut BytesMut,
    ) -> Result<Option<M>, FrameError> {
        let decoded = self.decode_complete(src)?;
        if decoded.is_none()
            && let Some(total) = self.frame_total(src)?
        {
            src.reserve((total - src.len()).min(MAX_RESERVE));
        }
        Ok(decoded)
    }

    /// Like [`decode`](Self::decode), but never reserves: for a reader that sizes its buffer
    /// itself (the framed connection, udf §6.4's transport role).
    pub(crate) fn decode_complete<M: prost::Message + Default>(
        &mut self,
        src: &mut BytesMut,
    ) -> Result<Option<M>, FrameError> {
        let Some(total) = self.frame_total(src)? else {
            return Ok(None);
        };
        if src.len() < total {
            return Ok(None);
        }
        let len = total - HEADER_LEN;
        src.advance(HEADER_LEN);
        let body = src.split_to(len).freeze();
        M::decode(body).map(Some).map_err(FrameError::from)
    }

    /// Like [`decode`](Self::decode), for when the input has ended: a complete frame yields
    /// `Some`, an empty buffer yields `None` (clean end of stream: the peer's half-close,
    /// udf §2 R9), and leftover bytes that do not form a whole frame yield
    /// [`FrameError::Truncated`] (the buffer is left as is).
    pub fn decode_eof<M: prost::Message + Default>(
        &mut self,
        src: &mut BytesMut,
    ) -> Result<Option<M>, FrameError> {
        if let Some(msg) = self.decode_complete(src)? {
            return Ok(Some(msg));
        }
        if src.is_empty() {
            return Ok(None);
        }
        let needed = match self.peek_len(src)? {
            Some(len) => HEADER_LEN + len,
            None => HEADER_LEN,
        };
        Err(FrameError::Truncated {
            needed,
            available: src.len(),
        })
    }

    /// The length of the frame at the front of `src`, prefix included, once its four prefix
    /// bytes are there; errors if the body exceeds the maximum.
    pub(crate) fn frame_total(&self, src: &BytesMut) -> Result<Option<usize>, FrameError> {
        Ok(self.peek_len(src)?.map(|len| HEADER_LEN + len))
    }

    /// The body length announced by the prefix at the front of `src`, if all four prefix
    /// bytes are there; errors if it exceeds the maximum.
    fn peek_len(&self, src: &BytesMut) -> Result<Option<usize>, FrameError> {
        let Some(prefix) = src.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let claimed = u32::from_be_bytes(*prefix);
        let len = usize::try_from(claimed).unwrap_or(usize::MAX);
        if len > self.max_frame_len {
            return Err(FrameError::Oversize {
                len,
                max: self.max_frame_len,
            });
        }
        Ok(Some(len))
    }
}

#[cfg(feature = "tokio")] // the framed transport's vectored writes only
/// Deepest nesting of a trailing `bytes` field that [`trailing_bytes`] reports.
const MAX_DEPTH: usize = 2;

#[cfg(feature = "tokio")] // the framed transport's vectored writes only
/// Longest varint: 10 bytes for a `u64`.
const MAX_VARINT_LEN: usize = 10;

#[cfg(feature = "tokio")] // the framed transport's vectored writes only
/// The field numbers from the frame body down to the `bytes` field that ends `msg`'s
/// encoding, and that field, for the messages whose large part is a data batch (udf §1.4):
/// `UdfRequest.data` (2) → `DataRequest.data` (1), `UdfResponse.data` (2) →
/// `DataResponse.data` (1), and the two batch messages alone. Each has that field as the
/// only one set at its level, so it is the last thing encoded. An empty batch is not
/// encoded at all (proto3 omits a default `bytes` field), so it is never reported.
fn trailing_bytes(msg: &dyn Any) -> Option<(&'static [u32], &Bytes)> {
    let (path, data): (&'static [u32], &Bytes) = if let Some(m) = msg.downcast_ref::<UdfRequest>() {
        let Some(udf_request::Request::Data(d)) = &m.request else {
            return None;
        };
        (&[2, 1], &d.data)
    } else if let Some(m) = msg.downcast_ref::<UdfResponse>() {
        let Some(udf_response::Response::Data(d)) = &m.response else {
            return None;
        };
        (&[2, 1], &d.data)
    } else if let Some(m) = msg.downcast_ref::<DataRequest>() {
        (&[1], &m.data)
    } else if let Some(m) = msg.downcast_ref::<DataResponse>() {
        (&[1], &m.data)
    } else {
        return None;
    };
    (!data.is_empty()).then_some((path, data))
}

#[cfg(feature = "tokio")] // the framed transport's vectored writes only
/// The key of length-delimited field `tag`.
fn key(tag: u32) -> u64 {
    (u64::from(tag) << 3) | LENGTH_DELIMITED
}

#[cfg(feature = "tokio")] // the framed transport's vectored writes only
/// Bytes in the varint encoding of `v`.
fn varint_len(v: u64) -> usize {
    // One byte per started group of 7 bits; zero takes one byte.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

#[cfg(feature = "tokio")] // the framed transport's vectored writes only
/// Appends the varint encoding of `v`.
fn put_varint(mut v: u64, dst: &mut BytesMut) {
    while v >= 0x80 {
        dst.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    dst.put_u8(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        ExecutionError, FinishResponse, Init, InitResponse, UdfPayload, UdfWorkerDataFormat,
    };
    use bytes::Bytes;
    use proptest::prelude::*;
    use prost::Message;

    fn sample_requests() -> Vec<UdfRequest> {
        let mut init = Init::new(
            UdfWorkerDataFormat::Arrow,
            UdfPayload::new(Bytes::from_static(b"fn"), "cloudpickle"),
        );
        init.timezone = Some("UTC".into());
        vec![
            UdfRequest::init(init),
            UdfRequest::payload_chunk(Bytes::from_static(b"more"), true),
            UdfRequest::data(Bytes::from(vec![7u8; 300])),
            UdfRequest::data(Bytes::new()),
            UdfRequest::finish(),
            UdfRequest::cancel(Some("stop".into())),
        ]
    }

    fn encode_all(msgs: &[UdfRequest]) -> BytesMut {
        let codec = FrameCodec::default();
        let mut buf = BytesMut::new();
        for m in msgs {
            codec.encode(m, &mut buf).unwrap();
        }
        buf
    }

    #[test]
    fn defaults_and_limits() {
        assert_eq!(DEFAULT_MAX_FRAME_LEN, 134_217_728);
        assert_eq!(FrameCodec::default().max_frame_len(), DEFAULT_MAX_FRAME_LEN);
        assert_eq!(FrameCodec::new(10).max_frame_len(), 10);
        if usize::BITS > 32 {
            assert_eq!(
                FrameCodec::new(usize::MAX).max_frame_len(),
                u32::MAX as usize
            );
        }
    }

    #[test]
    fn frame_layout_is_a_big_endian_length_then_the_message() {
        let codec = FrameCodec::default();
        let mut buf = BytesMut::from(&b"prev"[..]);
        codec.encode(&UdfRequest::finish(), &mut buf).unwrap();
        // Appends after existing content.
        assert_eq!(
            &buf[..],
            &[b'p', b'r', b'e', b'v', 0, 0, 0, 4, 0x0A, 0x02, 0x1A, 0x00]
        );
        let mut big = BytesMut::new();
        let msg = DataRequest {
            data: Bytes::from(vec![1u8; 1000]),
        };
        codec.encode(&msg, &mut big).unwrap();
        assert_eq!(&big[..4], &1003u32.to_be_bytes());
        assert_eq!(big.len(), 4 + 1003);
        // An empty message is a zero-length frame.
        let mut empty = BytesMut::new();
        codec.encode(&UdfRequest::default(), &mut empty).unwrap();
        assert_eq!(&empty[..], &[0, 0, 0, 0]);
        let mut codec = codec;
        assert_eq!(
            codec.decode::<UdfRequest>(&mut empty).unwrap(),
            Some(UdfRequest::default())
        );
        assert!(empty.is_empty());
    }

    #[test]
    fn decodes_several_frames_split_at_every_byte() {
        let msgs = sample_requests();
        let wire = encode_all(&msgs).freeze();
        for split in 0..=wire.len() {
            let mut codec = FrameCodec::default();
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                buf.extend_from_slice(part);
                while let Some(m) = codec.decode::<UdfRequest>(&mut buf).unwrap() {
                    out.push(m);
                }
            }
            assert_eq!(codec.decode_eof::<UdfRequest>(&mut buf).unwrap(), None);
            assert_eq!(out, msgs, "split at {split}");
        }
    }

    #[test]
    fn decodes_when_fed_one_byte_at_a_time() {
        let msgs = sample_requests();
        let wire = encode_all(&msgs);
        let mut codec = FrameCodec::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for byte in wire.iter() {
            buf.put_u8(*byte);
            if let Some(m) = codec.decode::<UdfRequest>(&mut buf).unwrap() {
                out.push(m);
                assert!(buf.is_empty(), "a frame completes exactly on its last byte");
            }
        }
        assert_eq!(out, msgs);
    }

    #[test]
    fn encode_rejects_oversize_messages() {
        let codec = FrameCodec::new(8);
        let mut buf = BytesMut::from(&b"keep"[..]);
        let fits = DataRequest {
            data: Bytes::from_static(b"123456"), // 2 + 6 = 8 bytes
        };
        codec.encode(&fits, &mut buf).unwrap();
        assert_eq!(buf.len(), 4 + 4 + 8);
        let too_big = DataRequest {
            data: Bytes::from_static(b"1234567"), // 9 bytes
        };
        match codec.encode(&too_big, &mut buf) {
            Err(FrameError::Oversize { len: 9, max: 8 }) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(buf.len(), 16, "nothing written on error");
        let err = codec.encode(&too_big, &mut buf).unwrap_err();
        assert_eq!(
            err.to_string(),
            "frame of 9 bytes exceeds the maximum of 8 bytes"
        );
    }

    #[test]
    fn decode_rejects_an_oversize_prefix_immediately_without_allocating() {
        let mut codec = FrameCodec::default();
        // Claims 4 GiB - 1 bytes; only the prefix is present.
        let mut buf = BytesMut::with_capacity(16);
        buf.put_u32(u32::MAX);
        let capacity = buf.capacity();
        match codec.decode::<UdfResponse>(&mut buf) {
            Err(FrameError::Oversize { len, max }) => {
                assert_eq!(len, u32::MAX as usize);
                assert_eq!(max, DEFAULT_MAX_FRAME_LEN);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            buf.capacity(),
            capacity,
            "no reservation for the claimed length"
        );
        assert_eq!(buf.len(), 4, "buffer left untouched");
        // Just over a small limit, with the full body present, still errors.
        let mut small = FrameCodec::new(3);
        let mut buf = BytesMut::from(&[0u8, 0, 0, 4, 1, 2, 3, 4][..]);
        match small.decode::<UdfResponse>(&mut buf) {
            Err(FrameError::Oversize { len: 4, max: 3 }) => {}
            other => panic!("unexpected {other:?}"),
        }
        // The EOF variant reports the same error rather than Truncated.
        let mut buf = BytesMut::from(&[0xFFu8, 0xFF, 0xFF, 0xFF, 0][..]);
        assert!(matches!(
            codec.decode_eof::<UdfResponse>(&mut buf),
            Err(FrameError::Oversize { .. })
        ));
    }

    #[test]
    fn waiting_for_a_huge_but_allowed_body_reserves_in_bounded_steps() {
        let mut codec = FrameCodec::new(u32::MAX as usize);
        let mut buf = BytesMut::new();
        buf.put_u32(u32::MAX - 1);
        buf.extend_from_slice(&[0u8; 10]);
        for _ in 0..3 {
            assert_eq!(codec.decode::<UdfResponse>(&mut buf).unwrap(), None);
        }
        assert_eq!(buf.len(), 14, "nothing consumed while waiting");
        assert!(
            buf.capacity() <= 14 + MAX_RESERVE + 1024,
            "capacity {} grew beyond a bounded step",
            buf.capacity()
        );
        match codec.decode_eof::<UdfResponse>(&mut buf) {
            Err(FrameError::Truncated { needed, available }) => {
                assert_eq!(needed, 4 + (u32::MAX as usize - 1));
                assert_eq!(available, 14);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn truncated_input_at_eof() {
        let mut codec = FrameCodec::default();
        // Empty: clean end.
        let mut buf = BytesMut::new();
        assert_eq!(codec.decode_eof::<UdfRequest>(&mut buf).unwrap(), None);
        // Partial header.
        let mut buf = BytesMut::from(&[0u8, 0][..]);
        match codec.decode_eof::<UdfRequest>(&mut buf) {
            Err(FrameError::Truncated {
                needed: 4,
                available: 2,
            }) => {}
            other => panic!("unexpected {other:?}"),
        }
        // Partial body.
        let full = encode_all(&[UdfRequest::data(Bytes::from_static(b"abcdef"))]);
        assert_eq!(full.len(), 4 + 10);
        let mut buf = BytesMut::from(&full[..9]);
        let err = codec.decode_eof::<UdfRequest>(&mut buf).unwrap_err();
        assert!(matches!(
            err,
            FrameError::Truncated {
                needed: 14,
                available: 9
            }
        ));
        assert_eq!(
            err.to_string(),
            "stream ended inside a frame: 9 of 14 bytes"
        );
        assert_eq!(buf.len(), 9, "buffer left as is");
        // A complete frame then EOF: Some, then None.
        let mut buf = full;
        assert_eq!(
            codec.decode_eof::<UdfRequest>(&mut buf).unwrap(),
            Some(UdfRequest::data(Bytes::from_static(b"abcdef")))
        );
        assert_eq!(codec.decode_eof::<UdfRequest>(&mut buf).unwrap(), None);
    }

    #[test]
    fn an_undecodable_frame_is_consumed_and_the_next_one_decodes() {
        let mut codec = FrameCodec::default();
        let mut buf = BytesMut::new();
        // Body: field 1, wire type 2, length 5 but only 1 byte follows -> invalid.
        buf.extend_from_slice(&[0, 0, 0, 3, 0x0A, 0x05, 0x00]);
        let good = UdfResponse::finish(FinishResponse {
            metrics: [("status".to_string(), "ok".to_string())].into(),
            ..FinishResponse::default()
        });
        codec.encode(&good, &mut buf).unwrap();
        let err = codec.decode::<UdfResponse>(&mut buf).unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)), "{err:?}");
        assert_eq!(err.to_string(), "undecodable frame");
        assert_eq!(codec.decode::<UdfResponse>(&mut buf).unwrap(), Some(good));
        assert!(buf.is_empty());
        // A body with an invalid wire type (7) also fails cleanly.
        let mut buf = BytesMut::from(&[0u8, 0, 0, 1, 0x0F][..]);
        assert!(matches!(
            codec.decode::<UdfResponse>(&mut buf),
            Err(FrameError::Decode(_))
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn decoded_bytes_fields_share_the_frame_buffer() {
        let mut codec = FrameCodec::default();
        let payload = Bytes::from(vec![42u8; 4096]);
        let mut buf = BytesMut::new();
        codec
            .encode(&UdfResponse::data(payload.clone()), &mut buf)
            .unwrap();
        let start = buf.as_ptr() as usize;
        let end = start + buf.len();
        let msg = codec.decode::<UdfResponse>(&mut buf).unwrap().unwrap();
        match msg.into_message() {
            Ok(crate::wire::ResponseMessage::Data(data)) => {
                assert_eq!(data, payload);
                let p = data.as_ptr() as usize;
                assert!(
                    p >= start && p < end,
                    "payload was not copied out of the frame"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn frame_errors_are_std_errors_and_decode_keeps_its_source() {
        use std::error::Error as _;
        let mut codec = FrameCodec::default();
        let mut buf = BytesMut::from(&[0u8, 0, 0, 1, 0x0F][..]);
        let err = codec.decode::<UdfResponse>(&mut buf).unwrap_err();
        let FrameError::Decode(inner) = &err else {
            panic!("unexpected {err:?}");
        };
        assert_eq!(err.to_string(), "undecodable frame");
        assert_eq!(
            err.source().map(ToString::to_string),
            Some(inner.to_string())
        );
        let oversize = FrameError::Oversize { len: 5, max: 4 };
        assert!(oversize.source().is_none());
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(oversize);
        assert_eq!(
            boxed.to_string(),
            "frame of 5 bytes exceeds the maximum of 4 bytes"
        );
    }

    #[test]
    fn frames_concatenate_without_padding() {
        let responses = [
            UdfResponse::init(InitResponse {
                data: None,
                error: Some(ExecutionError::worker("w")),
            }),
            UdfResponse::data(Bytes::from_static(b"d")),
        ];
        let codec = FrameCodec::default();
        let mut buf = BytesMut::new();
        for r in &responses {
            codec.encode(r, &mut buf).unwrap();
        }
        let expected: usize = responses.iter().map(|r| 4 + r.encoded_len()).sum();
        assert_eq!(buf.len(), expected);
        let mut codec = codec;
        for r in responses {
            assert_eq!(codec.decode::<UdfResponse>(&mut buf).unwrap(), Some(r));
        }
        assert!(buf.is_empty());
    }

    /// What one decode step produced, comparable across chunkings.
    #[derive(Debug, PartialEq)]
    enum Outcome {
        Frame(UdfResponse),
        Undecodable,
        Oversize(usize),
        Truncated { needed: usize, available: usize },
    }

    /// Feeds `input` to a codec in `chunks`-sized pieces, decoding as far as possible after
    /// each piece; stops at the first oversize error (fatal) and finishes with `decode_eof`.
    fn drive(max: usize, input: &[u8], chunks: &[usize]) -> Vec<Outcome> {
        let mut codec = FrameCodec::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut rest = input;
        let mut sizes = chunks.iter().copied().cycle();
        loop {
            let n = sizes.next().unwrap_or(1).max(1).min(rest.len());
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            loop {
                match codec.decode::<UdfResponse>(&mut buf) {
                    Ok(Some(m)) => out.push(Outcome::Frame(m)),
                    Ok(None) => break,
                    Err(FrameError::Decode(_)) => out.push(Outcome::Undecodable),
                    Err(FrameError::Oversize { len, .. }) => {
                        out.push(Outcome::Oversize(len));
                        return out;
                    }
                    Err(other) => panic!("decode never reports {other:?}"),
                }
            }
            if rest.is_empty() {
                break;
            }
        }
        match codec.decode_eof::<UdfResponse>(&mut buf) {
            Ok(None) => {}
            Ok(Some(m)) => panic!("decode left a whole frame behind: {m:?}"),
            Err(FrameError::Truncated { needed, available }) => {
                assert!(available < needed);
                out.push(Outcome::Truncated { needed, available });
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
        out
    }

    /// Frames with random (mostly invalid) bodies and honest prefixes, optionally followed
    /// by raw garbage.
    fn framed_garbage() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..6),
            prop::collection::vec(any::<u8>(), 0..8),
        )
            .prop_map(|(bodies, tail)| {
                let mut out = Vec::new();
                for body in bodies {
                    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
                    out.extend_from_slice(&body);
                }
                out.extend_from_slice(&tail);
                out
            })
    }

    /// `encode_head`'s head followed by its payload, and whether the payload was left out
    /// of the head (sent by reference).
    fn head_then_payload<M: Message + 'static>(codec: &FrameCodec, msg: &M) -> (Vec<u8>, bool) {
        let mut head = BytesMut::from(&b"prev"[..]);
        let payload = codec.encode_head(msg, &mut head).unwrap();
        assert_eq!(&head[..4], b"prev", "appends after existing content");
        let mut wire = head[4..].to_vec();
        if let Some(p) = &payload {
            wire.extend_from_slice(p);
        }
        (wire, payload.is_some())
    }

    /// The frame `encode` writes for `msg`: prost's encoding behind the prefix.
    fn prost_frame<M: Message>(msg: &M) -> Vec<u8> {
        let body = msg.encode_to_vec();
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        frame
    }

    #[test]
    fn encode_head_leaves_large_trailing_batches_out_and_sends_them_by_reference() {
        let codec = FrameCodec::default();
        let data = Bytes::from(vec![9u8; 70_000]);
        let msg = UdfResponse::data(data.clone());
        let mut head = BytesMut::new();
        let payload = codec.encode_head(&msg, &mut head).unwrap().unwrap();
        assert_eq!(payload.as_ptr(), data.as_ptr(), "the batch is not copied");
        assert_eq!(payload.len(), data.len());
        // Prefix, UdfResponse.data (field 2) and its length, DataResponse.data (field 1) and
        // its length: 70 000 is a 3-byte varint, 70 004 too.
        assert_eq!(head.len(), 4 + 1 + 3 + 1 + 3);
        assert_eq!(&head[..4], &(70_008u32).to_be_bytes());
        // Control messages and small batches are encoded whole.
        for small in [
            UdfRequest::finish(),
            UdfRequest::data(Bytes::from(vec![1u8; BY_REFERENCE_MIN - 1])),
        ] {
            let mut buf = BytesMut::new();
            assert!(codec.encode_head(&small, &mut buf).unwrap().is_none());
            assert_eq!(buf[..], prost_frame(&small)[..]);
        }
        // Oversize: refused, nothing written, as `encode`.
        let small_limit = FrameCodec::new(2000);
        let mut buf = BytesMut::from(&b"keep"[..]);
        let big = DataRequest {
            data: Bytes::from(vec![0u8; 1998]), // 1 + 2 + 1998 = 2001 bytes
        };
        assert!(matches!(
            small_limit.encode_head(&big, &mut buf),
            Err(FrameError::Oversize {
                len: 2001,
                max: 2000
            })
        ));
        assert_eq!(&buf[..], b"keep");
    }

    /// Batch lengths around every varint boundary up to 3 MiB, and the by-reference
    /// threshold.
    fn batch_len() -> impl Strategy<Value = usize> {
        prop_oneof![
            0usize..2 * BY_REFERENCE_MIN,
            (1usize..=3).prop_flat_map(|bytes| {
                let edge = 1usize << (7 * bytes);
                (edge - 16)..(edge + 16)
            }),
            (3usize << 20)..(3usize << 20) + 16,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn encode_head_then_payload_is_byte_for_byte_prosts_encoding(
            len in batch_len(),
            fill in any::<u8>(),
            kind in 0u8..5,
        ) {
            let codec = FrameCodec::default();
            let data = Bytes::from(vec![fill; len]);
            let by_reference = len >= BY_REFERENCE_MIN;
            let (wire, split, expected) = match kind {
                0 => {
                    let m = UdfRequest::data(data);
                    let (w, s) = head_then_payload(&codec, &m);
                    (w, s, prost_frame(&m))
                }
                1 => {
                    let m = UdfResponse::data(data);
                    let (w, s) = head_then_payload(&codec, &m);
                    (w, s, prost_frame(&m))
                }
                2 => {
                    let m = DataRequest { data };
                    let (w, s) = head_then_payload(&codec, &m);
                    (w, s, prost_frame(&m))
                }
                3 => {
                    let m = DataResponse { data };
                    let (w, s) = head_then_payload(&codec, &m);
                    (w, s, prost_frame(&m))
                }
                _ => {
                    // Not a batch: a payload chunk's data is followed by its `last` field.
                    let m = UdfRequest::payload_chunk(data, true);
                    let (w, s) = head_then_payload(&codec, &m);
                    prop_assert!(!s, "a field that is not last was left out");
                    (w, by_reference, prost_frame(&m))
                }
            };
            prop_assert_eq!(split, by_reference);
            prop_assert_eq!(wire, expected);
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_and_chunking_does_not_matter(
            input in prop_oneof![prop::collection::vec(any::<u8>(), 0..256), framed_garbage()],
            chunks in prop::collection::vec(1usize..64, 1..16),
            max in prop_oneof![Just(DEFAULT_MAX_FRAME_LEN), 0usize..64],
        ) {
            let whole = drive(max, &input, &[input.len().max(1)]);
            let chunked = drive(max, &input, &chunks);
            let bytewise = drive(max, &input, &[1]);
            prop_assert_eq!(&chunked, &whole);
            prop_assert_eq!(&bytewise, &whole);
        }

        #[test]
        fn data_requests_roundtrip_through_frames(
            payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..2048), 1..8),
            chunks in prop::collection::vec(1usize..512, 1..8),
        ) {
            let codec = FrameCodec::default();
            let msgs: Vec<DataRequest> = payloads
                .into_iter()
                .map(|p| DataRequest { data: Bytes::from(p) })
                .collect();
            let mut wire = BytesMut::new();
            for m in &msgs {
                codec.encode(m, &mut wire).unwrap();
            }
            let expected_len: usize = msgs.iter().map(|m| 4 + m.encoded_len()).sum();
            prop_assert_eq!(wire.len(), expected_len);
            let mut codec = codec;
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut rest = &wire[..];
            let mut sizes = chunks.iter().copied().cycle();
            while !rest.is_empty() {
                let n = sizes.next().unwrap_or(1).min(rest.len());
                buf.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
                while let Some(m) = codec.decode::<DataRequest>(&mut buf).unwrap() {
                    out.push(m);
                }
            }
            prop_assert_eq!(codec.decode_eof::<DataRequest>(&mut buf).unwrap(), None);
            prop_assert_eq!(out, msgs);
        }
    }
}
