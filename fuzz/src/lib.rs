//! The fuzz-specific pieces of tether's fuzz targets: the structured inputs (`arbitrary`)
//! the core targets share. The watchers that check the udf §2 / §4 invariants on every
//! message a core hands out, the engine × worker pair and the message helpers live in the
//! crate, as `tether_testing::pair` (the workspace's test-support crate), shared with tether's own tests.

use arbitrary::Arbitrary;
use bytes::Bytes;
use tether_testing::fixtures::tagged;
use tether_testing::pair::UserAnswer;
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, Init, InitResponse, UdfRequest, UdfResponse,
};
use tether::worker::endpoint::EndpointConfig;
use tether::worker::engine::SessionConfig;

/// The pair's engine config (udf §7) with a fuzzed output bound of 1 to 8 batches and,
/// from the same byte, a byte bound (`SessionConfig::output_buffer_bytes`).
pub fn engine_config(output_buffer: u8) -> SessionConfig {
    SessionConfig {
        output_buffer: usize::from(output_buffer % 8) + 1,
        // The byte bound from the high bits: 0 (one batch at a time) to 60 bytes in steps
        // of 4, or the default when the top bit is clear.
        output_buffer_bytes: if output_buffer & 0x80 != 0 {
            usize::from((output_buffer >> 3) & 0x0f) * 4
        } else {
            SessionConfig::new().output_buffer_bytes
        },
        ..tether_testing::pair::engine_config()
    }
}

/// The pair's worker config (udf §2 R4) with a fuzzed input bound of 1 to 8 batches and,
/// from the same byte, a byte bound (`EndpointConfig::input_buffer_bytes`).
pub fn worker_config(input_buffer: u8) -> EndpointConfig {
    EndpointConfig {
        input_buffer: usize::from(input_buffer % 8) + 1,
        // The byte bound (`input_buffer_bytes`) from the high bits: 0 (one batch at a
        // time) to 60 bytes in steps of 4, or the default when the top bit is clear.
        input_buffer_bytes: if input_buffer & 0x80 != 0 {
            usize::from((input_buffer >> 3) & 0x0f) * 4
        } else {
            EndpointConfig::new().input_buffer_bytes
        },
        ..tether_testing::pair::worker_config()
    }
}

/// An `Init` whose payload is `len` bytes (chunked by the engine when asked).
pub fn init_message(len: u8) -> Init {
    tether_testing::fixtures::init(vec![0x5a; usize::from(len)])
}

/// One answer of the worker's user code (udf §2.1), as a fuzzer picks it: an index into
/// `UserAnswer::ALL`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Answer(u8);

impl From<Answer> for UserAnswer {
    fn from(a: Answer) -> Self {
        UserAnswer::ALL[usize::from(a.0) % UserAnswer::ALL.len()]
    }
}

/// A response a (possibly hostile) worker sends to the engine.
#[derive(Arbitrary, Debug, Clone)]
pub enum FuzzResponse {
    /// `InitResponse`, with or without an error.
    Init { error: bool },
    /// A `DataResponse`.
    Data,
    /// An `ErrorResponse`.
    Error,
    /// `FinishResponse`.
    Finish,
    /// `CancelResponse`.
    Cancel,
    /// An envelope with no oneof set.
    Empty,
}

impl FuzzResponse {
    /// The wire message; data batches get the tag `tag`.
    pub fn message(&self, tag: u32) -> UdfResponse {
        match self {
            Self::Init { error: false } => UdfResponse::init(InitResponse::default()),
            Self::Init { error: true } => UdfResponse::init(InitResponse {
                error: Some(ExecutionError::user("init failed")),
                ..InitResponse::default()
            }),
            Self::Data => UdfResponse::data(tagged(u64::from(tag), 8)),
            Self::Error => UdfResponse::error(ExecutionError::user("boom")),
            Self::Finish => UdfResponse::finish(FinishResponse::default()),
            Self::Cancel => UdfResponse::cancel(CancelResponse::default()),
            Self::Empty => UdfResponse::default(),
        }
    }
}

/// A request a (possibly hostile) engine sends to the worker.
#[derive(Arbitrary, Debug, Clone)]
pub enum FuzzRequest {
    /// `Init`, inline or announcing chunks, with a good or a bad protocol version.
    Init {
        chunked: bool,
        bad_version: bool,
        len: u8,
    },
    /// A `PayloadChunk`.
    Chunk { last: bool, len: u8 },
    /// A `DataRequest`.
    Data,
    /// `Finish`.
    Finish,
    /// `Cancel`.
    Cancel,
    /// An envelope with no oneof set.
    Empty,
}

impl FuzzRequest {
    /// The wire message; data batches get the tag `tag`.
    pub fn message(&self, tag: u32) -> UdfRequest {
        match self {
            Self::Init {
                chunked,
                bad_version,
                len,
            } => {
                let mut init = init_message(*len);
                if *chunked {
                    init.is_chunking_payload = Some(true);
                }
                if *bad_version {
                    init.protocol_version = Some(99);
                }
                UdfRequest::init(init)
            }
            Self::Chunk { last, len } => {
                UdfRequest::payload_chunk(Bytes::from(vec![1; usize::from(*len)]), *last)
            }
            Self::Data => UdfRequest::data(tagged(u64::from(tag), 8)),
            Self::Finish => UdfRequest::finish(),
            Self::Cancel => UdfRequest::cancel(Some("fuzz".into())),
            Self::Empty => UdfRequest::default(),
        }
    }
}
