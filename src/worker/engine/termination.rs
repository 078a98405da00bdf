//! [`Termination`]: the single terminal outcome of a worker session, and the errors derived
//! from it.

use std::fmt;
use std::time::Duration;

use crate::connection::ConnectionError;
use crate::wire::{CancelResponse, ExecutionError, FinishResponse, MalformedMessage};
use crate::worker::Chain;

/// How a worker session ended: exactly one per session, the first one settled wins and never
/// changes afterwards (udf §4.1, §4.2 `completeTerminal`).
///
/// `close()` returns it from any state. Whether the worker may be reused is
/// [`is_salvageable`](Self::is_salvageable): `Finished`, `Cancelled` and `Failed` keep the
/// worker; `TransportFailed` and `Interrupted` invalidate it (udf §6.5).
#[derive(Debug, Clone)]
#[must_use]
pub enum Termination {
    /// The worker sent `FinishResponse` after the engine had sent `Finish` (udf §4.4
    /// `finished`). `response.error` carries a finish-callback error, if any.
    Finished {
        /// The worker's `FinishResponse` (metrics, opaque data, finish-callback error).
        response: FinishResponse,
        /// The first `ExecutionError` the worker reported before the terminator, if any (an
        /// `ErrorResponse` raced with Finish, udf §2 R5 (c)). It takes precedence over
        /// `response.error` when the outcome is turned into an error (udf §4.7).
        execution_error: Option<ExecutionError>,
    },
    /// The worker sent `CancelResponse`, or the session was closed before anything was on the
    /// wire (then `response` is empty and synthetic, udf §5.3).
    Cancelled {
        /// The worker's `CancelResponse` (partial metrics, cancel-callback error).
        response: CancelResponse,
        /// The first `ExecutionError` the worker reported (`ErrorResponse` or
        /// `InitResponse.error`) that led to the Cancel. tether keeps both this and
        /// `response.error`, where Spark drops the second (udf §10 gap 12).
        execution_error: Option<ExecutionError>,
    },
    /// Reserved: an execution error ended the session without a protocol terminator.
    /// Salvageable (the worker reported the error in-band).
    ///
    /// tether's engine session never produces it today: a worker's `InitResponse.error` or
    /// `ErrorResponse` is always followed by the Cancel/`CancelResponse` round trip and ends
    /// [`Cancelled`](Self::Cancelled) with the error in `execution_error`. It mirrors Spark's
    /// `Termination.Failed` in `org.apache.spark.udf.worker.core` (udf §4.1), which Spark's
    /// newest gRPC session does not produce either (an earlier revision settled it for init
    /// errors, udf §4.0); it exists so that the outcome set is Spark's, and for session
    /// implementations over transports without a terminator round trip.
    Failed(ExecutionError),
    /// The transport failed, the worker violated the protocol, or a timeout expired (udf
    /// §4.5, §6.5). The worker is invalidated.
    TransportFailed(TransportFailure),
    /// The session was dropped or interrupted mid-operation and the worker did not
    /// acknowledge the best-effort Cancel within the interrupt-cancel timeout (udf §4.9).
    /// The worker is invalidated.
    Interrupted(Interrupted),
}

/// The variant of a [`Termination`] without its payload, for matching and assertions: the
/// five outcomes of Spark's `Termination` (udf §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminationKind {
    /// [`Termination::Finished`].
    Finished,
    /// [`Termination::Cancelled`].
    Cancelled,
    /// [`Termination::Failed`] (reserved; never produced by the engine session today).
    Failed,
    /// [`Termination::TransportFailed`].
    TransportFailed,
    /// [`Termination::Interrupted`].
    Interrupted,
}

impl Termination {
    /// The synthetic outcome of a session closed before anything was sent (udf §5.3 first
    /// row): `Cancelled` with an empty `CancelResponse`.
    pub fn cancelled_before_start() -> Self {
        Self::Cancelled {
            response: CancelResponse::default(),
            execution_error: None,
        }
    }

    /// The variant, without payload (one of the five outcomes of udf §4.1).
    pub fn kind(&self) -> TerminationKind {
        match self {
            Self::Finished { .. } => TerminationKind::Finished,
            Self::Cancelled { .. } => TerminationKind::Cancelled,
            Self::Failed(_) => TerminationKind::Failed,
            Self::TransportFailed(_) => TerminationKind::TransportFailed,
            Self::Interrupted(_) => TerminationKind::Interrupted,
        }
    }

    /// Whether the worker may serve another session: true for `Finished`, `Cancelled` and
    /// `Failed`, false for `TransportFailed` and `Interrupted` (udf §4.1, §6.5).
    pub fn is_salvageable(&self) -> bool {
        matches!(
            self,
            Self::Finished { .. } | Self::Cancelled { .. } | Self::Failed(_)
        )
    }

    /// The first `ExecutionError` the worker reported (`ErrorResponse`, `InitResponse.error`;
    /// the first recorded wins, udf §4.4 `executionError`), or the `Failed` error; `None`
    /// for `TransportFailed` and `Interrupted`.
    pub fn execution_error(&self) -> Option<&ExecutionError> {
        match self {
            Self::Finished {
                execution_error, ..
            }
            | Self::Cancelled {
                execution_error, ..
            } => execution_error.as_ref(),
            Self::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// The error a finish or cancel callback reported in the terminator
    /// (`FinishResponse.error` / `CancelResponse.error`, udf §1.5).
    pub fn callback_error(&self) -> Option<&ExecutionError> {
        match self {
            Self::Finished { response, .. } => response.error.as_ref(),
            Self::Cancelled { response, .. } => response.error.as_ref(),
            _ => None,
        }
    }

    /// The worker-reported metrics of the terminator (`FinishResponse.metrics` /
    /// `CancelResponse.metrics`, the free-form `map<string,string>` revision of udf §1.6;
    /// partial for a Cancel), or `None` for `Failed`, `TransportFailed` and `Interrupted`.
    pub fn metrics(&self) -> Option<&std::collections::BTreeMap<String, String>> {
        match self {
            Self::Finished { response, .. } => Some(&response.metrics),
            Self::Cancelled { response, .. } => Some(&response.metrics),
            _ => None,
        }
    }

    /// The error this outcome means to whoever consumed the session's output, or `None` for
    /// a clean `Finished` (udf §4.7 `throwIfTerminalError`, with tether's precedence: the
    /// recorded execution error first, then the callback error).
    pub fn to_error(&self) -> Option<SessionError> {
        match self {
            Self::Finished {
                response,
                execution_error,
            } => execution_error
                .as_ref()
                .or(response.error.as_ref())
                .map(|e| SessionError::Execution(e.clone())),
            Self::Cancelled {
                response,
                execution_error,
            } => Some(
                execution_error
                    .as_ref()
                    .or(response.error.as_ref())
                    .map(|e| SessionError::Execution(e.clone()))
                    .unwrap_or(SessionError::Cancelled),
            ),
            Self::Failed(e) => Some(SessionError::Execution(e.clone())),
            Self::TransportFailed(f) => Some(SessionError::Transport(f.clone())),
            Self::Interrupted(i) => Some(SessionError::Interrupted(i.clone())),
        }
    }
}

impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Finished {
                execution_error,
                response,
            } => {
                f.write_str("Finished")?;
                if let Some(e) = execution_error {
                    write!(f, " (execution error: {e})")?;
                }
                if let Some(e) = &response.error {
                    write!(f, " (finish callback error: {e})")?;
                }
                Ok(())
            }
            Self::Cancelled {
                execution_error,
                response,
            } => {
                f.write_str("Cancelled")?;
                if let Some(e) = execution_error {
                    write!(f, " (execution error: {e})")?;
                }
                if let Some(e) = &response.error {
                    write!(f, " (cancel callback error: {e})")?;
                }
                Ok(())
            }
            Self::Failed(e) => write!(f, "Failed ({e})"),
            Self::TransportFailed(t) => write!(f, "TransportFailed ({})", Chain(t)),
            Self::Interrupted(i) => write!(f, "Interrupted ({i})"),
        }
    }
}

/// Why a session settled `TransportFailed` (udf §4.5, §4.11, §6.5).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TransportFailure {
    /// The connection reported an error (I/O, codec, RPC) or failed a write.
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    /// The worker broke the stream ordering rules (the violation is the source).
    #[error("protocol violation by the worker")]
    Protocol(#[from] PeerViolation),
    /// A deadline expired.
    #[error("timed out waiting for {waiting_for} after {after:?}")]
    Timeout {
        /// What the session was waiting for.
        waiting_for: Wait,
        /// The timeout that expired.
        after: Duration,
    },
}

/// What a session was waiting for when a timeout expired (the three waits of udf §7, all
/// settling `TransportFailed`, udf §4.6 step 4, §4.7 step 4, §5.2 step 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wait {
    /// `InitResponse` (init timeout, default 30 s: udf §7 `initResponseTimeoutMs`).
    InitResponse,
    /// The next worker event while reading output or sending input (per-poll timeout,
    /// default 30 s: udf §7 `terminalTimeoutMs`, §4.7).
    Output,
    /// The stream terminator (`FinishResponse` / `CancelResponse`), default 30 s: udf §7
    /// `terminalTimeoutMs`, §5.2.
    Terminator,
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InitResponse => "InitResponse",
            Self::Output => "UDF output",
            Self::Terminator => "the stream terminator",
        })
    }
}

/// A worker message that breaks the protocol (udf §4.5). Each one settles
/// `TransportFailed` and invalidates the worker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerViolation {
    /// A message arrived before the engine sent anything (the stream did not exist yet:
    /// `init` opens it, udf §4.6 step 3).
    #[error("worker message before the engine sent Init")]
    ResponseBeforeInit,
    /// A `DataResponse` arrived before the `InitResponse` (udf §2 R2, §4.5).
    #[error("DataResponse before InitResponse")]
    DataBeforeInitResponse,
    /// A `FinishResponse` arrived before the engine sent `Finish` (a premature success must
    /// not truncate input, udf §4.5).
    #[error("FinishResponse before the engine sent Finish")]
    FinishResponseBeforeFinish,
    /// A message with an unset oneof (udf §1.2, §4.5; the [`MalformedMessage`] is the
    /// source).
    #[error("malformed message")]
    Malformed(#[from] MalformedMessage),
    /// The worker ended its stream without a terminator (udf §2 R10, §4.5).
    #[error("response stream closed without a terminator (the worker exited or broke rule R10)")]
    StreamEndedWithoutTerminator,
}

/// Why a session settled `Interrupted` (udf §4.9). Its text says how long the session
/// waited for the worker to acknowledge its Cancel, or, when it could not wait at all (zero:
/// dropped without an async runtime, or a zero `interrupt_cancel_timeout`), that it did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interrupted {
    /// What the session was doing when it was interrupted (e.g. "waiting for InitResponse").
    pub context: &'static str,
    /// How long the session waited for the Cancel acknowledgement (zero without a runtime).
    pub waited: Duration,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let context = self.context;
        if self.waited.is_zero() {
            write!(
                f,
                "interrupted while {context}, without waiting for the worker to acknowledge a \
                 Cancel"
            )
        } else {
            write!(
                f,
                "interrupted while {context}; the worker did not acknowledge Cancel within {:?}",
                self.waited
            )
        }
    }
}

impl std::error::Error for Interrupted {}

/// The error a session operation reports when the session has ended badly: derived from the
/// [`Termination`] (udf §4.7 `throwIfTerminalError`). The session itself still holds the
/// full `Termination`; `close()` returns it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The worker reported an execution error (user, worker or protocol error), including
    /// finish- and cancel-callback errors. The `ExecutionError` is the source.
    #[error("UDF worker reported an error")]
    Execution(#[source] ExecutionError),
    /// The execution was cancelled without an error (by the engine, or unsolicited by the
    /// worker).
    #[error("UDF execution was cancelled")]
    Cancelled,
    /// The transport failed, the worker broke the protocol, or a timeout expired (udf §4.7:
    /// "UDF worker stream failed" with the cause, the [`TransportFailure`], as source).
    #[error("UDF worker stream failed")]
    Transport(#[source] TransportFailure),
    /// The session was interrupted and the worker did not acknowledge the Cancel (the
    /// [`Interrupted`] is the source).
    #[error("UDF execution was interrupted")]
    Interrupted(#[source] Interrupted),
}

impl SessionError {
    /// The worker-reported error (the structured `executionError` Spark attaches to its
    /// exception, udf §4.6), if this is [`Execution`](Self::Execution).
    pub fn execution_error(&self) -> Option<&ExecutionError> {
        match self {
            Self::Execution(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// udf §4.9: the text says how long the Cancel acknowledgement was waited for, or that
    /// it was not (a session dropped without a runtime sends no Cancel to wait for).
    #[test]
    fn an_interruption_says_whether_it_waited_for_the_cancel_acknowledgement() {
        let waited = Interrupted {
            context: "streaming",
            waited: Duration::from_secs(2),
        };
        assert_eq!(
            waited.to_string(),
            "interrupted while streaming; the worker did not acknowledge Cancel within 2s"
        );
        let dropped = Interrupted {
            context: "streaming",
            waited: Duration::ZERO,
        };
        assert_eq!(
            dropped.to_string(),
            "interrupted while streaming, without waiting for the worker to acknowledge a Cancel"
        );
    }
}
