//! What the client sees of failed RPCs ([`RpcError`], [`Code`]) and how a reattaching stream
//! ends in error ([`ClientError`]) (rx §1.8, §6).
//!
//! [`RpcError`] is deliberately transport-agnostic: a gRPC adapter builds one from a
//! `tonic::Status` (code, message, and the `errorClass` / `RetryInfo` found in the
//! `grpc-status-details-bin` trailer), an in-memory transport from the server's error enum.
//! Spark's clients classify errors by substring search on the status message (rx §1.8), so
//! [`RpcError::has_condition`] matches the condition either in the explicit
//! [`condition`](RpcError::condition) or anywhere in the message.

use std::fmt;
use std::time::Duration;

use crate::execution::Code;
use crate::execution::condition::{self, Condition};

/// A failed RPC as the client sees it: a status [`Code`], the status message, and what a rich
/// status may add (the Spark error condition from `ErrorInfo.metadata["errorClass"]`, the
/// `RetryInfo.retry_delay`) (rx §1.8).
///
/// `Display` is `"<CODE>: <message>"`, e.g.
/// `INTERNAL: [INVALID_CURSOR.DISCONNECTED] The cursor was disconnected by the server.`, so
/// Spark clients and humans recognise the condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    code: Code,
    message: String,
    condition: Option<String>,
    retry_delay: Option<Duration>,
}

impl RpcError {
    /// An error with a status code and message, no rich status (what a server without the
    /// `grpc-status-details-bin` trailer sends, rx §1.8).
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            condition: None,
            retry_delay: None,
        }
    }

    /// A Spark error as a Spark server sends it: the message is `"[<condition>] <detail>"`
    /// and the condition is also recorded as if read from the rich status (rx §1.8).
    pub fn spark(code: Code, condition: Condition, detail: impl fmt::Display) -> Self {
        Self {
            code,
            message: format!("[{condition}] {detail}"),
            condition: Some(condition.name().to_owned()),
            retry_delay: None,
        }
    }

    /// `UNAVAILABLE` with a message: what a transport reports for a broken connection
    /// (retryable under the default policy, rx §6.1).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }

    /// Sets the Spark error condition read from the rich status (`ErrorInfo` metadata
    /// `errorClass`, rx §1.8, connect §2).
    pub fn with_condition(mut self, condition: impl Into<String>) -> Self {
        self.condition = Some(condition.into());
        self
    }

    /// Sets the server's `RetryInfo.retry_delay` (rx §6.1, 4.1+). Under the default policy
    /// such an error is retried whatever its code, waiting at least this long (capped at
    /// [`RetryPolicy::max_server_retry_delay`](super::RetryPolicy::max_server_retry_delay)).
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = Some(delay);
        self
    }

    /// The status code (`INTERNAL` for Spark's conditions, rx §1.8; the retry policy
    /// reads it, rx §6.1).
    pub fn code(&self) -> Code {
        self.code
    }

    /// The status message (for a Spark error, `[CONDITION] text`, rx §1.8; connect §2
    /// gives the texts Spark 4.3.0 sends).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The Spark error condition from the rich status (`ErrorInfo` `errorClass`, rx §1.8),
    /// if the transport supplied one.
    pub fn condition(&self) -> Option<&str> {
        self.condition.as_deref()
    }

    /// The server's `RetryInfo.retry_delay` (rx §6.1, 4.1+), if any.
    pub fn retry_delay(&self) -> Option<Duration> {
        self.retry_delay
    }

    /// Whether this error carries the Spark condition `condition` (for example
    /// [`condition::INVALID_CURSOR_DISCONNECTED`]): as the rich-status condition, or anywhere
    /// in the message, the way Spark's clients search it (rx §1.8).
    pub fn has_condition(&self, condition: Condition) -> bool {
        let name = condition.name();
        self.condition.as_deref() == Some(name) || self.message.contains(name)
    }

    /// Whether this is `INVALID_HANDLE.OPERATION_NOT_FOUND` or
    /// `INVALID_HANDLE.SESSION_NOT_FOUND`: the errors that make a client re-execute when
    /// nothing was delivered yet (rx §6.3 step 3).
    pub fn is_not_found(&self) -> bool {
        self.has_condition(condition::INVALID_HANDLE_OPERATION_NOT_FOUND)
            || self.has_condition(condition::INVALID_HANDLE_SESSION_NOT_FOUND)
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for RpcError {}

/// A response the server sent that breaks the protocol (rx §1.3: `operation_id` and a
/// fresh `response_id` on every response); the stream fails with
/// [`ClientError::Violation`] rather than deliver something it cannot resume from (rx §6.4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A response of a reattachable execution without `response_id`: it could never be
    /// named in `last_response_id`, and an empty `last_response_id` is
    /// `POSITION_NOT_FOUND` (rx §1.4, §6.4).
    #[error("response without response_id in a reattachable execution")]
    MissingResponseId,
    /// The same `response_id` twice in a row: delivering it again would duplicate a result
    /// (every response gets a fresh random id, rx §1.9).
    #[error("response {response_id} delivered twice")]
    DuplicateResponse {
        /// The repeated id.
        response_id: String,
    },
    /// A response naming another operation (rx §1.3: `operation_id` is set on every
    /// response).
    #[error("response for operation {actual}, expected {expected}")]
    WrongOperation {
        /// This stream's operation id.
        expected: String,
        /// The id on the response.
        actual: String,
    },
    /// More consecutive empty graceful rotations than
    /// [`ClientConfig::max_empty_rotations`](super::ClientConfig::max_empty_rotations) allows
    /// (an execution that never produces `ResultComplete`, e.g. an orphan on a pre-4.0
    /// server, SPARK-50735).
    #[error("{count} consecutive reattaches returned nothing")]
    EndlessRotation {
        /// Consecutive empty rotations seen.
        count: u32,
    },
}

/// Why a [`ReattachingStream`](super::ReattachingStream) or
/// [`ExecuteStream`](super::ExecuteStream) ended in error. The stream yields it once, has
/// already queued its one `ReleaseAll` (reattachable form: any error escaping the retry
/// scope ⇒ `release_all()`, rx §6.3), and then ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// An RPC failed with an error the retry policy does not retry (for example
    /// `OPERATION_CANCELED`, `INVALID_HANDLE.OPERATION_ABANDONED`, `DEADLINE_EXCEEDED`), or an
    /// immediate-retry bound was reached and this is the underlying error (rx §6.1, §6.3).
    #[error("{0}")]
    Rpc(RpcError),
    /// A retryable error kept coming back until the policy's retries were used up. Spark
    /// 4.1+ re-raises the original error here (SPARK-53307); it is kept apart so callers can
    /// tell, and [`rpc_error`](ClientError::rpc_error) gives the original (also the
    /// source).
    #[error("[RETRIES_EXCEEDED] gave up after {retries} retries")]
    RetriesExceeded {
        /// The last error.
        #[source]
        error: RpcError,
        /// Retries made in this retry scope.
        retries: u32,
    },
    /// `OPERATION_NOT_FOUND` / `SESSION_NOT_FOUND` after responses had been delivered:
    /// re-executing would duplicate them, so this is fatal (rx §6.3 step 3, SPARK-48056).
    /// The not-found error is the source.
    #[error(
        "[RESPONSE_ALREADY_RECEIVED] the server lost the operation after {delivered} \
         responses were delivered; re-executing would duplicate results"
    )]
    ResponseAlreadyReceived {
        /// The not-found error.
        #[source]
        error: RpcError,
        /// Responses delivered before it.
        delivered: u64,
    },
    /// A response carried a different `server_side_session_id` than the first one: the server
    /// session was restarted under the client (rx §1.3, §6.2, SPARK-45798).
    #[error(
        "[INVALID_HANDLE.SESSION_CHANGED] server_side_session_id changed from {expected} to \
         {actual}"
    )]
    SessionChanged {
        /// The id seen first (or the one the request said it observed).
        expected: String,
        /// The id on the offending response.
        actual: String,
    },
    /// The server broke the protocol (the [`Violation`] is the source).
    #[error("protocol violation by the server")]
    Violation(#[from] Violation),
    /// The request's `operation_id` is not a UUID; the server would answer
    /// `INVALID_HANDLE.FORMAT` (rx §1.2, §1.9). Reported at construction.
    #[error("[INVALID_HANDLE.FORMAT] operation_id {0:?} is not a UUID")]
    InvalidOperationId(String),
}

impl ClientError {
    /// The RPC error behind this one, if it came from an RPC: for
    /// [`RetriesExceeded`](Self::RetriesExceeded) the original error Spark 4.1+ re-raises
    /// (rx §6.1, SPARK-53307).
    pub fn rpc_error(&self) -> Option<&RpcError> {
        match self {
            Self::Rpc(e)
            | Self::RetriesExceeded { error: e, .. }
            | Self::ResponseAlreadyReceived { error: e, .. } => Some(e),
            _ => None,
        }
    }

    /// Whether this error is, or wraps, the Spark condition `condition` (found as Spark's
    /// clients find it, rx §1.8). The client-only
    /// [`condition::RESPONSE_ALREADY_RECEIVED`] (rx §6.3) and
    /// `INVALID_HANDLE.SESSION_CHANGED` (rx §6.2) match their variants.
    pub fn has_condition(&self, condition: Condition) -> bool {
        match self {
            Self::ResponseAlreadyReceived { .. }
                if condition == condition::RESPONSE_ALREADY_RECEIVED =>
            {
                true
            }
            Self::SessionChanged { .. }
                if condition == condition::INVALID_HANDLE_SESSION_CHANGED =>
            {
                true
            }
            _ => self.rpc_error().is_some_and(|e| e.has_condition(condition)),
        }
    }
}

/// A misuse of [`ReattachingStream::release_until`](super::ReattachingStream::release_until),
/// refused before any `ReleaseUntil` is sent (rx §1.5; a client releases only responses it
/// delivered, rx §6.4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// The id was delivered by another operation's stream (the server would answer
    /// `POSITION_NOT_FOUND`, rx §3.4).
    #[error("response id belongs to operation {id_operation}, not {stream_operation}")]
    ForeignResponseId {
        /// The operation the id came from.
        id_operation: String,
        /// This stream's operation.
        stream_operation: String,
    },
    /// The stream releases automatically ([`ReleaseMode::AfterDelivery`](super::ReleaseMode),
    /// Spark's per-response `release_until`, rx §6.3); manual releases would race it.
    #[error("release_until needs ReleaseMode::Manual")]
    AutomaticMode,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spark_error_display_and_condition() {
        let e = RpcError::spark(
            Code::Internal,
            condition::INVALID_CURSOR_DISCONNECTED,
            "preempted",
        );
        assert_eq!(
            e.to_string(),
            "INTERNAL: [INVALID_CURSOR.DISCONNECTED] preempted"
        );
        assert!(e.has_condition(condition::INVALID_CURSOR_DISCONNECTED));
        assert!(!e.is_not_found());
    }

    #[test]
    fn condition_only_in_rich_status_or_only_in_message() {
        let rich = RpcError::new(Code::Unavailable, "gone")
            .with_condition(condition::INVALID_HANDLE_SESSION_NOT_FOUND);
        assert!(rich.is_not_found());
        let msg = RpcError::new(
            Code::Internal,
            "[INVALID_HANDLE.OPERATION_NOT_FOUND] The handle x is invalid.",
        );
        assert!(msg.is_not_found());
        assert_eq!(msg.condition(), None);
    }

    #[test]
    fn client_error_conditions() {
        let nf = RpcError::spark(
            Code::Internal,
            condition::INVALID_HANDLE_OPERATION_NOT_FOUND,
            "x",
        );
        let e = ClientError::ResponseAlreadyReceived {
            error: nf,
            delivered: 1,
        };
        assert!(e.has_condition(condition::RESPONSE_ALREADY_RECEIVED));
        assert!(e.has_condition(condition::INVALID_HANDLE_OPERATION_NOT_FOUND));
        assert!(e.to_string().starts_with("[RESPONSE_ALREADY_RECEIVED]"));
    }
}
