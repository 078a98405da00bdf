//! What the worker side rejects: the engine's protocol violations ([`EngineViolation`]) and
//! the `Init`s it cannot run ([`InitRejection`]), each with the exact text it sends to the
//! engine in a `ProtocolError`.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::wire::{ExecutionError, MalformedMessage, UdfWorkerDataFormat};

/// An engine message (or silence) that breaks the ordering rules of the `Execute` stream, as
/// the worker detects it (udf §2 R6, §2.1 "any other combination"). Each one ends the
/// session: the worker reports a `ProtocolError` with [`wire_message`](Self::wire_message),
/// sends a `CancelResponse` and closes the stream
/// ([`EndpointOutcome::ProtocolViolation`](super::EndpointOutcome::ProtocolViolation)).
///
/// The worker-side mirror of the engine's
/// [`PeerViolation`](crate::worker::engine::PeerViolation).
///
/// `Display` is [`wire_message`](Self::wire_message), except for
/// [`Malformed`](Self::Malformed), whose `Display` is "malformed request" and whose
/// [`source`](StdError::source) is the [`MalformedMessage`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineViolation {
    /// A `UdfRequest` with an unset oneof (udf §1.2).
    Malformed(MalformedMessage),
    /// The engine ended its request stream before the session was done (udf §2.1 last row;
    /// the engine half-closes only once the outcome is known, R9).
    RequestStreamEnded,
    /// No `Cancel` arrived within the cancel timeout after the worker reported an error
    /// (udf §2 R4: the engine must answer a worker error with Cancel).
    NoCancelAfterError {
        /// The cancel timeout that expired.
        after: Duration,
    },
    /// A second `Init` on the stream (exactly one per stream, udf §1.3; §2 R6).
    SecondInit {
        /// Whether it came while the first `Init`'s payload chunks were still awaited.
        awaiting_chunks: bool,
    },
    /// The `Init`'s inline payload is larger than the worker accepts
    /// ([`EndpointConfig::max_payload_size`](super::EndpointConfig::max_payload_size), a
    /// tether bound: the protocol sets none, udf §1.3).
    InlinePayloadTooLarge {
        /// The inline payload's size in bytes.
        size: u64,
        /// The worker's limit in bytes.
        limit: u64,
    },
    /// The payload assembled from the inline part and the chunks (udf §1.3) grew beyond the
    /// worker's limit
    /// ([`EndpointConfig::max_payload_size`](super::EndpointConfig::max_payload_size)).
    ChunkedPayloadTooLarge {
        /// The assembled size in bytes, including the chunk that crossed the limit.
        size: u64,
        /// The worker's limit in bytes.
        limit: u64,
    },
    /// A `PayloadChunk` before any `Init` (udf §1.3).
    ChunkBeforeInit,
    /// A `PayloadChunk` after the chunk with `last = true` (the final chunk, udf §1.3).
    ChunkAfterLastChunk,
    /// A `PayloadChunk` after an `Init` without `is_chunking_payload` (chunks only when
    /// chunking is declared, udf §2 R1).
    ChunkWithoutChunking,
    /// A `PayloadChunk` after the `InitResponse` (chunks only before it, udf §2 R1).
    ChunkAfterInitResponse,
    /// A `PayloadChunk` after `Cancel` (Cancel is the engine's last message, udf §2; the
    /// engine writes nothing after it, §4.7).
    ChunkAfterCancel,
    /// A `PayloadChunk` with no data (chunk data must be non-empty, udf §1.3).
    EmptyChunk,
    /// A `DataRequest` before the `InitResponse` (udf §2 R3).
    DataBeforeInitResponse,
    /// A `DataRequest` after the worker's `InitResponse.error` (init failed: the engine owes
    /// a Cancel, not data, udf §1.3, §2 R4).
    DataAfterFailedInit,
    /// A `DataRequest` after `Finish` (all input precedes `Finish`, udf §1.5, §2).
    DataAfterFinish,
    /// A `DataRequest` after `Cancel` (Cancel is the engine's last message, udf §2; the
    /// engine writes nothing after it, §4.7).
    DataAfterCancel,
    /// `Finish` before the `InitResponse` (udf §2 R3).
    FinishBeforeInitResponse,
    /// A second `Finish` (the engine sends one, udf §2; Spark writes it at most once,
    /// §4.7).
    SecondFinish,
    /// `Finish` after `Cancel` (Cancel never precedes Finish, udf §2 R5).
    FinishAfterCancel,
}

/// The cause of a session that ended
/// [`TransportFailed`](super::EndpointOutcome::TransportFailed) because no `Init` arrived
/// within [`EndpointConfig::init_timeout`](super::EndpointConfig::init_timeout): the wait of
/// a new stream for its first message (udf §2, §4.6; Spark's engine gives up on an init after
/// `initResponseTimeoutMs`, udf §7). It is the [`source`](StdError::source) of the
/// outcome's [`ConnectionError`](crate::connection::ConnectionError). `Display`: "no Init
/// within `<after>`".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no Init within {after:?}")]
pub struct InitTimeout {
    /// The init timeout that expired.
    pub after: Duration,
}

impl EngineViolation {
    /// The text sent to the engine in the `ProtocolError.message` (udf §1.5), in the
    /// `InitResponse.error`, an `ErrorResponse` or the `CancelResponse.error` as udf §2 R6
    /// places it; stable, pinned by tests. tether's wording: the protocol fixes none.
    pub fn wire_message(&self) -> String {
        match self {
            Self::Malformed(e) => format!("malformed request: {e}"),
            Self::RequestStreamEnded => "the request stream ended before the session did".into(),
            Self::NoCancelAfterError { after } => {
                format!("no Cancel within {after:?} after the worker reported an error")
            }
            Self::SecondInit {
                awaiting_chunks: true,
            } => "a second Init while its payload chunks were awaited".into(),
            Self::SecondInit {
                awaiting_chunks: false,
            } => "a second Init on the stream".into(),
            Self::InlinePayloadTooLarge { size, limit } => format!(
                "the inline payload of {size} bytes exceeds the worker's limit of {limit} bytes"
            ),
            Self::ChunkedPayloadTooLarge { limit, .. } => {
                format!("the chunked payload exceeds the worker's limit of {limit} bytes")
            }
            Self::ChunkBeforeInit => "a PayloadChunk before Init".into(),
            Self::ChunkAfterLastChunk => "a PayloadChunk after the last chunk".into(),
            Self::ChunkWithoutChunking => {
                "a PayloadChunk after an Init that did not declare chunking".into()
            }
            Self::ChunkAfterInitResponse => "a PayloadChunk after InitResponse".into(),
            Self::ChunkAfterCancel => "a PayloadChunk after Cancel".into(),
            Self::EmptyChunk => "an empty PayloadChunk (chunk data must be non-empty)".into(),
            Self::DataBeforeInitResponse => "a DataRequest before InitResponse".into(),
            Self::DataAfterFailedInit => "a DataRequest after a failed init".into(),
            Self::DataAfterFinish => "a DataRequest after Finish".into(),
            Self::DataAfterCancel => "a DataRequest after Cancel".into(),
            Self::FinishBeforeInitResponse => "Finish before InitResponse".into(),
            Self::SecondFinish => "a second Finish".into(),
            Self::FinishAfterCancel => "Finish after Cancel".into(),
        }
    }

    /// The `ExecutionError` (kind `ProtocolError`, message
    /// [`wire_message`](Self::wire_message); udf §1.5) the worker sends for this violation
    /// (udf §2 R6).
    pub fn to_execution_error(&self) -> ExecutionError {
        ExecutionError::protocol(self.wire_message())
    }
}

impl fmt::Display for EngineViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The cause is the source.
            Self::Malformed(_) => f.write_str("malformed request"),
            _ => f.write_str(&self.wire_message()),
        }
    }
}

impl StdError for EngineViolation {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::Malformed(e) => Some(e),
            _ => None,
        }
    }
}

/// Why the worker answered an `Init` with `InitResponse(error = ProtocolError)` on its own,
/// without the user seeing it (udf §1.3): the `Init` is well-ordered but this worker cannot
/// run it. The session then waits for the engine's Cancel, as after any init error (udf §2
/// R4), and ends [`Cancelled`](super::EndpointOutcome::Cancelled) with the reported error.
///
/// `Display` is [`wire_message`](Self::wire_message).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InitRejection {
    /// `protocol_version` is set and differs from the worker's (udf §1.3 field 1: unset
    /// means the initial version).
    UnsupportedProtocolVersion {
        /// The version the `Init` asked for.
        requested: u32,
        /// The version this worker speaks.
        supported: u32,
    },
    /// `data_format` is not one the worker supports (`UNSPECIFIED` never is; unknown
    /// numeric values neither; udf §1.3 field 2).
    UnsupportedDataFormat {
        /// The raw `data_format` value of the `Init` (possibly unknown to this build).
        requested: i32,
        /// The formats this worker supports.
        supported: Vec<UdfWorkerDataFormat>,
    },
    /// The `Init` has no `udf` (a required field, udf §1.3 field 3).
    MissingUdf,
    /// `payload_size` differs from the length of the assembled payload (receivers MUST
    /// verify it when set, udf §1.3).
    PayloadSizeMismatch {
        /// The `payload_size` the `Init` declared.
        declared: i64,
        /// The assembled payload's length in bytes.
        assembled: u64,
    },
    /// `payload_crc32` differs from the CRC-32 (IEEE) of the assembled payload (a
    /// `ProtocolError`, udf §1.3).
    PayloadCrcMismatch {
        /// The `payload_crc32` the `Init` declared.
        declared: u32,
        /// The CRC-32 of the assembled payload.
        assembled: u32,
    },
}

impl InitRejection {
    /// The text sent to the engine in the `ProtocolError.message` of the
    /// `InitResponse.error` (udf §1.3, §1.5); stable, pinned by tests. tether's wording: the
    /// protocol fixes none.
    pub fn wire_message(&self) -> String {
        match self {
            Self::UnsupportedProtocolVersion {
                requested,
                supported,
            } => format!(
                "unsupported protocol_version {requested}; this worker speaks version {supported}"
            ),
            Self::UnsupportedDataFormat {
                requested,
                supported,
            } => {
                let name = UdfWorkerDataFormat::try_from(*requested)
                    .map(|f| f.as_str_name().to_string())
                    .unwrap_or_else(|_| format!("unknown value {requested}"));
                let supported: Vec<&str> = supported.iter().map(|f| f.as_str_name()).collect();
                format!("unsupported data_format {name}; this worker supports {supported:?}")
            }
            Self::MissingUdf => "Init without a udf payload".into(),
            Self::PayloadSizeMismatch {
                declared,
                assembled,
            } => format!(
                "payload_size {declared} does not match the assembled payload of {assembled} bytes"
            ),
            Self::PayloadCrcMismatch {
                declared,
                assembled,
            } => format!(
                "payload_crc32 mismatch: declared {declared:#010x}, assembled payload has {assembled:#010x}"
            ),
        }
    }

    /// The `ExecutionError` (kind `ProtocolError`, message
    /// [`wire_message`](Self::wire_message); udf §1.5) the worker sends in the
    /// `InitResponse.error` (udf §1.3).
    pub fn to_execution_error(&self) -> ExecutionError {
        ExecutionError::protocol(self.wire_message())
    }
}

impl fmt::Display for InitRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.wire_message())
    }
}

impl StdError for InitRejection {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts the engine receives. They are part of the protocol surface (engines and
    /// their tests match them): changing one is a deliberate, visible change here.
    #[test]
    fn wire_messages_are_pinned() {
        use EngineViolation as V;
        let violations = [
            (
                V::Malformed(MalformedMessage::EmptyRequest),
                "malformed request: empty UdfRequest oneof",
            ),
            (
                V::Malformed(MalformedMessage::EmptyControlRequest),
                "malformed request: empty UdfControlRequest oneof",
            ),
            (
                V::RequestStreamEnded,
                "the request stream ended before the session did",
            ),
            (
                V::NoCancelAfterError {
                    after: Duration::from_secs(30),
                },
                "no Cancel within 30s after the worker reported an error",
            ),
            (
                V::NoCancelAfterError {
                    after: Duration::from_millis(1500),
                },
                "no Cancel within 1.5s after the worker reported an error",
            ),
            (
                V::SecondInit {
                    awaiting_chunks: true,
                },
                "a second Init while its payload chunks were awaited",
            ),
            (
                V::SecondInit {
                    awaiting_chunks: false,
                },
                "a second Init on the stream",
            ),
            (
                V::InlinePayloadTooLarge { size: 6, limit: 4 },
                "the inline payload of 6 bytes exceeds the worker's limit of 4 bytes",
            ),
            (
                V::ChunkedPayloadTooLarge { size: 6, limit: 4 },
                "the chunked payload exceeds the worker's limit of 4 bytes",
            ),
            (V::ChunkBeforeInit, "a PayloadChunk before Init"),
            (
                V::ChunkAfterLastChunk,
                "a PayloadChunk after the last chunk",
            ),
            (
                V::ChunkWithoutChunking,
                "a PayloadChunk after an Init that did not declare chunking",
            ),
            (
                V::ChunkAfterInitResponse,
                "a PayloadChunk after InitResponse",
            ),
            (V::ChunkAfterCancel, "a PayloadChunk after Cancel"),
            (
                V::EmptyChunk,
                "an empty PayloadChunk (chunk data must be non-empty)",
            ),
            (
                V::DataBeforeInitResponse,
                "a DataRequest before InitResponse",
            ),
            (V::DataAfterFailedInit, "a DataRequest after a failed init"),
            (V::DataAfterFinish, "a DataRequest after Finish"),
            (V::DataAfterCancel, "a DataRequest after Cancel"),
            (V::FinishBeforeInitResponse, "Finish before InitResponse"),
            (V::SecondFinish, "a second Finish"),
            (V::FinishAfterCancel, "Finish after Cancel"),
        ];
        for (v, text) in &violations {
            assert_eq!(v.wire_message(), *text, "{v:?}");
            assert_eq!(v.to_execution_error(), ExecutionError::protocol(*text));
            match v {
                V::Malformed(e) => {
                    assert_eq!(v.to_string(), "malformed request");
                    assert_eq!(v.source().map(ToString::to_string), Some(e.to_string()));
                }
                _ => {
                    assert_eq!(v.to_string(), *text);
                    assert!(v.source().is_none());
                }
            }
        }

        use InitRejection as R;
        let rejections = [
            (
                R::UnsupportedProtocolVersion {
                    requested: 1000,
                    supported: 1,
                },
                "unsupported protocol_version 1000; this worker speaks version 1",
            ),
            (
                R::UnsupportedDataFormat {
                    requested: 0,
                    supported: vec![UdfWorkerDataFormat::Arrow],
                },
                r#"unsupported data_format UDF_WORKER_DATA_FORMAT_UNSPECIFIED; this worker supports ["ARROW"]"#,
            ),
            (
                R::UnsupportedDataFormat {
                    requested: 42,
                    supported: vec![],
                },
                "unsupported data_format unknown value 42; this worker supports []",
            ),
            (R::MissingUdf, "Init without a udf payload"),
            (
                R::PayloadSizeMismatch {
                    declared: -1,
                    assembled: 3,
                },
                "payload_size -1 does not match the assembled payload of 3 bytes",
            ),
            (
                R::PayloadCrcMismatch {
                    declared: 0xdead_beef,
                    assembled: 0x0012_3456,
                },
                "payload_crc32 mismatch: declared 0xdeadbeef, assembled payload has 0x00123456",
            ),
        ];
        for (r, text) in &rejections {
            assert_eq!(r.wire_message(), *text, "{r:?}");
            assert_eq!(r.to_string(), *text);
            assert_eq!(r.to_execution_error(), ExecutionError::protocol(*text));
        }
    }
}
