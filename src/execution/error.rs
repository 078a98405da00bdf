//! Spark Connect error conditions of the execution layer (reattach rx §1.8).
//!
//! [`ConnectError::message`] (also its `Display`) is the status message a Spark server would
//! send: it starts with the bracketed error condition (`[INVALID_CURSOR.DISCONNECTED] …`), because Spark
//! clients classify errors by searching the message for the condition name (rx §1.8).
//! The wording after the bracket is tether's own. [`ConnectError::code`] gives the gRPC
//! status code category a transport adapter should use; Spark sends every recoverable server
//! error as `INTERNAL` (rx §1.8), and so does tether except where noted.

use std::fmt;

use super::Code;
use super::condition::{self, Condition};
use crate::execution::client::RpcError;

/// Every error the server side of the execution layer reports to a client (rx §1.8, §3.5,
/// rx §4.4, §5). The status message, [`message`](Self::message) (and `Display`), starts with
/// the Spark error condition in brackets where Spark has one. The errors carry data only,
/// no source.
///
/// `handle` parameters are the identifier the request named (an operation or session id),
/// as Spark's `handle` message parameter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectError {
    /// `INVALID_HANDLE.FORMAT`: a session or operation id is not a UUID (rx §1.9).
    InvalidHandleFormat {
        /// The offending identifier, as sent.
        handle: String,
    },
    /// `INVALID_HANDLE.OPERATION_ABANDONED`: the operation was removed for inactivity (or
    /// with its closed session) and is remembered in the tombstones; or, as in Spark 4.3.0,
    /// an ExecutePlan re-submits the id of a released or completed execution (rx §5.2,
    /// rx §5.4).
    OperationAbandoned {
        /// The operation id.
        handle: String,
    },
    /// `INVALID_HANDLE.OPERATION_ALREADY_EXISTS`: an ExecutePlan names a live operation with
    /// a different plan (rx §5.2).
    OperationAlreadyExists {
        /// The operation id.
        handle: String,
    },
    /// `INVALID_HANDLE.OPERATION_NOT_FOUND`: no live operation with this id in the session,
    /// and no tombstone (released, or never existed) (rx §5.5).
    OperationNotFound {
        /// The operation id.
        handle: String,
    },
    /// `INVALID_HANDLE.SESSION_CHANGED`: `client_observed_server_side_session_id` differs
    /// from the session's `server_side_session_id` (rx §1.2, §5.5).
    SessionChanged {
        /// The session id.
        handle: String,
    },
    /// `INVALID_HANDLE.SESSION_CLOSED`: the session was released or expired and is in the
    /// closed-session tombstones (rx §5.6).
    SessionClosed {
        /// The session id.
        handle: String,
    },
    /// `INVALID_HANDLE.SESSION_NOT_FOUND`: no such `(user_id, session_id)` session
    /// (rx §5.5).
    SessionNotFound {
        /// The session id.
        handle: String,
    },
    /// `INVALID_CURSOR.DISCONNECTED`: the server ended this stream because another consumer
    /// attached, or the execution was released, abandoned or its session closed (rx §4.4).
    /// Clients retry it by reattaching (rx §6.1).
    Disconnected,
    /// `INVALID_CURSOR.NOT_REATTACHABLE`: reattach or release on an execution that is not
    /// reattachable, or whose runner has not started (rx §5.5, SPARK-49492).
    NotReattachable,
    /// `INVALID_CURSOR.POSITION_NOT_AVAILABLE`: the response at `index` was already released
    /// from the retry buffer (rx §3.3, §3.5).
    PositionNotAvailable {
        /// The id of the missing response, or `<UNKNOWN>` (Spark's spelling) if not known.
        response_id: String,
        /// Its 1-based index in the response log.
        index: u64,
    },
    /// `INVALID_CURSOR.POSITION_NOT_FOUND`: the response id was never produced by this
    /// execution (unknown, empty, another operation's) (rx §3.4, §3.5).
    PositionNotFound {
        /// The response id as sent.
        response_id: String,
    },
    /// `OPERATION_CANCELED`: the execution was interrupted (rx §2.2 T9, §5.7). Delivered
    /// after every earlier response.
    OperationCanceled,
    /// `INVALID_PARAMETER_VALUE.INTERRUPT_TYPE_TAG_REQUIRES_TAG` (rx §5.7).
    InterruptTagRequiresTag,
    /// `INVALID_PARAMETER_VALUE.INTERRUPT_TYPE_OPERATION_ID_REQUIRES_ID` (rx §5.7).
    InterruptOperationIdRequiresId,
    /// `UNSUPPORTED_FEATURE.INTERRUPT_TYPE`: unspecified or unknown interrupt type
    /// (rx §5.7).
    UnsupportedInterruptType {
        /// The raw `interrupt_type` value.
        interrupt_type: i32,
    },
    /// An ExecutePlan tag is empty or contains `,` (rx §1.2). Spark raises a plain
    /// `IllegalArgumentException` (no condition).
    InvalidTag {
        /// The tag as sent.
        tag: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A ReleaseExecute with neither `release_all` nor `release_until` (rx §1.5). Spark
    /// raises a plain exception (no condition).
    UnknownReleaseType,
    /// The execution's producer stopped without completing or failing: the execution is an
    /// orphan and was removed (rx §2.2 T15, SPARK-50735). Spark raises a plain
    /// `IllegalStateException` (no condition).
    Orphaned {
        /// The operation id.
        handle: String,
    },
    /// tether-specific `EXECUTION_LIMIT_EXCEEDED`: the session is at its limit of `limit`
    /// live executions (`ManagerConfig::max_executions_per_session`, default 1 000; 0 refuses
    /// every execution). Status code `RESOURCE_EXHAUSTED`; not retried by Spark
    /// clients. Release finished executions (ReleaseExecute(ReleaseAll)) first.
    ExecutionLimitExceeded {
        /// The session id.
        session: String,
        /// The per-session cap.
        limit: usize,
    },
    /// tether-specific `SERVER_DRAINING`: the server is draining
    /// ([`ExecutionManager::refuse_new`](super::ExecutionManager::refuse_new)) and creates no session
    /// and registers no execution; live ones are served as before. Status code
    /// `UNAVAILABLE`, which Spark clients retry with backoff (rx §6.1): behind a load
    /// balancer the retry reaches another server once this one stops, or at once for a new
    /// session the balancer sends elsewhere (docs/deployment.md §5).
    ServerDraining,
    /// tether-specific `SERVER_BUSY`: the server runs as many executions as its admission
    /// allows ([`AdmissionConfig`](super::AdmissionConfig); SPARK-49580's proposal) and this
    /// one waited [`max_wait`](super::AdmissionConfig::max_wait) for a slot without getting
    /// one. Nothing was registered. Status code `UNAVAILABLE`, which Spark clients retry
    /// with backoff (rx §6.1): a retried ExecutePlan queues again.
    ServerBusy {
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// tether-specific `ARROW_BATCH_TOO_LARGE`: a result batch's response is larger than
    /// the largest message the server sends (`spark::connect::MAX_MESSAGE_SIZE`
    /// by default) and the client did not allow chunking (connect §10,
    /// `ResultChunkingOptions`; Spark 4.3.0 sends it and the client fails with gRPC's `RESOURCE_EXHAUSTED`
    /// "Received message larger than max"). Status code `RESOURCE_EXHAUSTED`.
    BatchTooLarge {
        /// The encoded response's size, in bytes.
        bytes: usize,
        /// The largest message the server sends, in bytes.
        limit: usize,
    },
    /// The execution failed: the terminal error its producer reported, re-delivered to every
    /// stream that reaches the end of the log (rx §2.2 T8, §4.2). `message` is used
    /// verbatim as the status message. No condition travels in the rich status: a Spark
    /// client sees a generic error whose condition it can only find in the text. For an
    /// error Spark clients classify (condition, SQLSTATE, exception class), use
    /// [`ConnectError::Spark`].
    Failed {
        /// The status message.
        message: String,
        /// The status code category.
        code: Code,
    },
    /// The execution failed with an error in Spark's form (connect §2): its condition,
    /// SQLSTATE, message parameters and Java classes travel in the rich status, so a Spark
    /// client raises the same exception class as against real Spark (PySpark maps the first
    /// class it knows of `classes`). Status code `INTERNAL`.
    Spark(Box<SparkError>),
}

/// An error a query engine raises, in the form Spark sends it (connect §2): the status
/// message `[CONDITION] text SQLSTATE: state` and an `ErrorInfo` carrying `errorClass`,
/// `sqlState`, `messageParameters` and `classes`, with the most specific Java class as the
/// `reason`. Spark's own errors without a condition (a plain `IllegalArgumentException`)
/// have `condition` and `sql_state` unset and send `text` alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SparkError {
    /// `errorClass`, e.g. `INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE` (Spark's
    /// `error-conditions.json`); `None` for a plain Java exception.
    pub condition: Option<String>,
    /// The message text, after `[CONDITION] ` and before ` SQLSTATE: …`.
    pub text: String,
    /// The SQLSTATE of the condition, e.g. `42K0E`.
    pub sql_state: Option<String>,
    /// `messageParameters`, by name.
    pub parameters: std::collections::BTreeMap<String, String>,
    /// The Java class of the exception and its superclasses, most specific first (Spark's
    /// `classes` metadata; the first is the `ErrorInfo.reason`).
    pub classes: Vec<String>,
    /// The error that caused this one (Java's `Throwable.getCause`), if any: not in the
    /// status, only in FetchErrorDetails' error chain (connect §8), which ends after five
    /// errors as Spark's does.
    pub cause: Option<Box<Self>>,
}

impl SparkError {
    /// The classes of Spark's `AnalysisException` (connect §10: a negative limit).
    pub const ANALYSIS_EXCEPTION: &'static [&'static str] = &[
        "org.apache.spark.sql.AnalysisException",
        "java.lang.Exception",
        "java.lang.Throwable",
        "java.lang.Object",
    ];

    /// The classes of `java.lang.IllegalArgumentException`, which Spark raises without a
    /// condition for a failed `require` (connect §10: a range step of 0).
    pub const ILLEGAL_ARGUMENT_EXCEPTION: &'static [&'static str] = &[
        "java.lang.IllegalArgumentException",
        "java.lang.RuntimeException",
        "java.lang.Exception",
        "java.lang.Throwable",
        "java.lang.Object",
    ];

    /// The classes of Spark Connect's `InvalidPlanInput`, raised for a plan it cannot read
    /// (connect §10: an unset or unsupported oneof).
    pub const INVALID_PLAN_INPUT: &'static [&'static str] = &[
        "org.apache.spark.sql.connect.common.InvalidPlanInput",
        "java.lang.Exception",
        "java.lang.Throwable",
        "java.lang.Object",
    ];

    /// `CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SET` (SQLSTATE 56K00): the oneof of
    /// message `full_name` (e.g. `spark.connect.Relation`) is not set; `case` is Spark's name
    /// for the unset case (`RELTYPE_NOT_SET`, `OPTYPE_NOT_SET`, `COMMANDTYPE_NOT_SET`). Text,
    /// parameters and classes as real Spark 4.3.0 sends them (connect §10).
    pub fn oneof_not_set(full_name: &str, case: &str) -> Self {
        Self::invalid_plan_input(
            "CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SET",
            format!(
                "The Spark Connect plan is invalid. This oneOf field in {full_name} is not set: \
                 {case}"
            ),
        )
        .with_parameter("fullName", full_name)
        .with_parameter("name", case)
    }

    /// `CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SUPPORTED` (SQLSTATE 56K00): the set
    /// case of the oneof of `full_name` is one the server does not run; `case` is the
    /// field's name in upper case (`PROJECT`) and `number` its field number. Text, parameters
    /// and classes as real Spark 4.3.0 sends them (connect §10).
    pub fn oneof_not_supported(full_name: &str, case: &str, number: u32) -> Self {
        Self::invalid_plan_input(
            "CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SUPPORTED",
            format!(
                "The Spark Connect plan is invalid. This oneOf field message in {full_name} is \
                 not supported: {case}({number})"
            ),
        )
        .with_parameter("fullName", full_name)
        .with_parameter("name", case)
        .with_parameter("number", number.to_string())
    }

    /// The classes of Spark's `SparkNoSuchElementException` (connect §2: a Config `get` of
    /// an unknown key).
    pub const NO_SUCH_ELEMENT_EXCEPTION: &'static [&'static str] = &[
        "org.apache.spark.SparkNoSuchElementException",
        "java.util.NoSuchElementException",
        "java.lang.RuntimeException",
        "java.lang.Exception",
        "java.lang.Throwable",
        "java.lang.Object",
    ];

    /// `SQL_CONF_NOT_FOUND` (SQLSTATE 42K0I): a Config `get` of `key`, which has no value
    /// and no default. Text, parameter (`sqlConf`, the key in double quotes) and classes as
    /// Spark 4.3.0 sends them (connect §2).
    pub fn sql_conf_not_found(key: &str) -> Self {
        Self {
            condition: Some("SQL_CONF_NOT_FOUND".to_owned()),
            text: format!(
                "The SQL config \"{key}\" cannot be found. Please verify that the config exists."
            ),
            sql_state: Some("42K0I".to_owned()),
            parameters: std::collections::BTreeMap::new(),
            classes: Self::NO_SUCH_ELEMENT_EXCEPTION
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
            cause: None,
        }
        .with_parameter("sqlConf", format!("\"{key}\""))
    }

    /// The classes of Spark's `SparkSQLException` (connect §14: the refusals of
    /// CloneSession).
    pub const SQL_EXCEPTION: &'static [&'static str] = &[
        "org.apache.spark.SparkSQLException",
        "java.sql.SQLException",
        "java.lang.Exception",
        "java.lang.Throwable",
        "java.lang.Object",
    ];

    /// `INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_FORMAT` (SQLSTATE 42K04): a
    /// CloneSession's `new_session_id` is no UUID. Text, parameter (`targetSessionId`) and
    /// classes as Spark 4.3.0 sends them (connect §14.2).
    pub fn clone_target_format(target: &str) -> Self {
        Self::invalid_clone(
            "TARGET_SESSION_ID_FORMAT",
            target,
            format!(
                "Target session ID {target} for clone operation must be an UUID string of the \
                 format '00112233-4455-6677-8899-aabbccddeeff'."
            ),
        )
    }

    /// `INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_ALREADY_CLOSED` (SQLSTATE 42K04): a
    /// CloneSession's target was released and is in the closed-session tombstones
    /// (connect §14.2).
    pub fn clone_target_closed(target: &str) -> Self {
        Self::invalid_clone(
            "TARGET_SESSION_ID_ALREADY_CLOSED",
            target,
            format!(
                "Cannot clone session to target session ID {target} because a session with \
                 this ID was previously closed."
            ),
        )
    }

    /// `INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_ALREADY_EXISTS` (SQLSTATE 42K04): a
    /// CloneSession's target is a live session, the source included (connect §14.2).
    pub fn clone_target_exists(target: &str) -> Self {
        Self::invalid_clone(
            "TARGET_SESSION_ID_ALREADY_EXISTS",
            target,
            format!(
                "Cannot clone session to target session ID {target} because a session with \
                 this ID already exists."
            ),
        )
    }

    fn invalid_clone(sub: &str, target: &str, detail: String) -> Self {
        Self {
            condition: Some(format!("INVALID_CLONE_SESSION_REQUEST.{sub}")),
            text: format!("Invalid session clone request. {detail}"),
            sql_state: Some("42K04".to_owned()),
            parameters: std::collections::BTreeMap::new(),
            classes: Self::SQL_EXCEPTION
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
            cause: None,
        }
        .with_parameter("targetSessionId", target)
    }

    fn invalid_plan_input(condition: &str, text: String) -> Self {
        Self {
            condition: Some(condition.to_owned()),
            text,
            sql_state: Some("56K00".to_owned()),
            parameters: std::collections::BTreeMap::new(),
            classes: Self::INVALID_PLAN_INPUT
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
            cause: None,
        }
    }

    /// An `AnalysisException` with `condition`, `text` and `sql_state` (connect §2).
    pub fn analysis(condition: &str, text: impl Into<String>, sql_state: &str) -> Self {
        Self {
            condition: Some(condition.to_owned()),
            text: text.into(),
            sql_state: Some(sql_state.to_owned()),
            parameters: std::collections::BTreeMap::new(),
            classes: Self::ANALYSIS_EXCEPTION
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
            cause: None,
        }
    }

    /// A plain `IllegalArgumentException` without a condition (connect §10).
    pub fn illegal_argument(text: impl Into<String>) -> Self {
        Self {
            condition: None,
            text: text.into(),
            sql_state: None,
            parameters: std::collections::BTreeMap::new(),
            classes: Self::ILLEGAL_ARGUMENT_EXCEPTION
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
            cause: None,
        }
    }

    /// Sets the error that caused this one (connect §8: the next error of the chain
    /// FetchErrorDetails answers).
    #[must_use]
    pub fn with_cause(mut self, cause: Self) -> Self {
        self.cause = Some(Box::new(cause));
        self
    }

    /// Adds one `messageParameters` entry (connect §2).
    #[must_use]
    pub fn with_parameter(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.parameters.insert(name.into(), value.into());
        self
    }

    /// The status message, as Spark writes it (connect §2).
    pub fn message(&self) -> String {
        match (&self.condition, &self.sql_state) {
            (Some(c), Some(s)) => format!("[{c}] {} SQLSTATE: {s}", self.text),
            (Some(c), None) => format!("[{c}] {}", self.text),
            (None, _) => self.text.clone(),
        }
    }
}

impl From<SparkError> for ConnectError {
    fn from(error: SparkError) -> Self {
        Self::Spark(Box::new(error))
    }
}

impl ConnectError {
    /// The status message sent to clients: exactly what Spark 4.3.0 sends for the
    /// condition, `[CONDITION] text SQLSTATE: state` (connect §2; Spark's
    /// `error-conditions.json` texts, measured on loopback). Conditions Spark does not have
    /// (or that connect §2 did not measure) keep tether's wording in the same form. Stable
    /// and pinned by tests: Spark clients classify errors by searching it. `Display` writes
    /// the same text.
    pub fn message(&self) -> String {
        let text = match self {
            Self::InvalidHandleFormat { handle } => format!(
                "The handle {handle} is invalid. Handle must be an UUID string of the format \
                 '00112233-4455-6677-8899-aabbccddeeff'"
            ),
            Self::OperationAbandoned { handle } => format!(
                "The handle {handle} is invalid. Operation was considered abandoned because of \
                 inactivity and removed."
            ),
            Self::OperationAlreadyExists { handle } => {
                format!("The handle {handle} is invalid. Operation already exists.")
            }
            Self::OperationNotFound { handle } => {
                format!("The handle {handle} is invalid. Operation not found.")
            }
            Self::SessionChanged { handle } => format!(
                "The handle {handle} is invalid. The existing Spark server driver instance has \
                 restarted. Please reconnect."
            ),
            Self::SessionClosed { handle } => {
                format!("The handle {handle} is invalid. Session was closed.")
            }
            Self::SessionNotFound { handle } => {
                format!("The handle {handle} is invalid. Session not found.")
            }
            Self::Disconnected => {
                "The cursor is invalid. The cursor has been disconnected by the server.".into()
            }
            Self::NotReattachable => {
                "The cursor is invalid. The cursor is not reattachable.".into()
            }
            Self::PositionNotAvailable { response_id, index } => format!(
                "The cursor is invalid. The cursor position id {response_id} is no longer \
                 available at index {index}."
            ),
            Self::PositionNotFound { response_id } => {
                format!("The cursor is invalid. The cursor position id {response_id} is not found.")
            }
            Self::OperationCanceled => "Operation has been canceled.".into(),
            Self::InterruptTagRequiresTag => {
                "An interrupt of type TAG needs an operation_tag.".into()
            }
            Self::InterruptOperationIdRequiresId => {
                "An interrupt of type OPERATION_ID needs an operation_id.".into()
            }
            Self::UnsupportedInterruptType { interrupt_type } => {
                format!("Interrupt type {interrupt_type} is not supported.")
            }
            Self::InvalidTag { tag, reason } => {
                return format!("Spark Connect tag {tag:?} is invalid: {reason}.");
            }
            Self::UnknownReleaseType => {
                return "Unknown ReleaseExecute type: neither release_all nor release_until is \
                        set."
                    .into();
            }
            Self::Orphaned { handle } => {
                return format!(
                    "Operation {handle} was orphaned: its producer stopped without completing."
                );
            }
            Self::ExecutionLimitExceeded { session, limit } => format!(
                "Session {session} is at its limit of {limit} live executions \
                 (ManagerConfig::max_executions_per_session); release some before starting more."
            ),
            Self::ServerDraining => "The server is draining: it takes no new sessions or \
                                     executions. Retrying reaches another server once this \
                                     one has stopped, or at once where the load balancer \
                                     sends new sessions elsewhere."
                .into(),
            Self::ServerBusy { waited } => format!(
                "The server is running its maximum of concurrent executions; this one waited \
                 {waited:.1?} for a slot and was not started. Retry later."
            ),
            Self::BatchTooLarge { bytes, limit } => format!(
                "A result batch of {bytes} bytes does not fit in one response of at most \
                 {limit} bytes. Allow result chunking (ResultChunkingOptions, on by default \
                 since Spark 4.1 clients) or lower spark.sql.execution.arrow.maxRecordsPerBatch."
            ),
            Self::Failed { message, .. } => return message.clone(),
            Self::Spark(e) => return e.message(),
        };
        let condition = self.condition().unwrap_or_default();
        match self.sql_state() {
            Some(state) => format!("[{condition}] {text} SQLSTATE: {state}"),
            None => format!("[{condition}] {text}"),
        }
    }

    /// The Spark error condition (`"INVALID_CURSOR.DISCONNECTED"`, …; the conditions of
    /// rx §1.8, sent as `ErrorInfo` `errorClass`, connect §2), or `None` for the errors
    /// Spark raises as plain exceptions ([`InvalidTag`](Self::InvalidTag),
    /// [`UnknownReleaseType`](Self::UnknownReleaseType), [`Orphaned`](Self::Orphaned)) and
    /// for [`Failed`](Self::Failed), whose condition, if any, is inside its message, and
    /// [`Spark`](Self::Spark), whose condition is [`SparkError::condition`]. The name of
    /// [`spark_condition`](Self::spark_condition).
    pub fn condition(&self) -> Option<&'static str> {
        self.spark_condition().map(Condition::name)
    }

    /// The condition of [`condition`](Self::condition) with its SQLSTATE and code, from
    /// [`execution::condition`](super::condition), the one table both sides share (rx §1.8).
    pub fn spark_condition(&self) -> Option<Condition> {
        Some(match self {
            Self::InvalidHandleFormat { .. } => condition::INVALID_HANDLE_FORMAT,
            Self::OperationAbandoned { .. } => condition::INVALID_HANDLE_OPERATION_ABANDONED,
            Self::OperationAlreadyExists { .. } => {
                condition::INVALID_HANDLE_OPERATION_ALREADY_EXISTS
            }
            Self::OperationNotFound { .. } => condition::INVALID_HANDLE_OPERATION_NOT_FOUND,
            Self::SessionChanged { .. } => condition::INVALID_HANDLE_SESSION_CHANGED,
            Self::SessionClosed { .. } => condition::INVALID_HANDLE_SESSION_CLOSED,
            Self::SessionNotFound { .. } => condition::INVALID_HANDLE_SESSION_NOT_FOUND,
            Self::Disconnected => condition::INVALID_CURSOR_DISCONNECTED,
            Self::NotReattachable => condition::INVALID_CURSOR_NOT_REATTACHABLE,
            Self::PositionNotAvailable { .. } => condition::INVALID_CURSOR_POSITION_NOT_AVAILABLE,
            Self::PositionNotFound { .. } => condition::INVALID_CURSOR_POSITION_NOT_FOUND,
            Self::OperationCanceled => condition::OPERATION_CANCELED,
            Self::InterruptTagRequiresTag => {
                condition::INVALID_PARAMETER_VALUE_INTERRUPT_TYPE_TAG_REQUIRES_TAG
            }
            Self::InterruptOperationIdRequiresId => {
                condition::INVALID_PARAMETER_VALUE_INTERRUPT_TYPE_OPERATION_ID_REQUIRES_ID
            }
            Self::UnsupportedInterruptType { .. } => condition::UNSUPPORTED_FEATURE_INTERRUPT_TYPE,
            Self::ExecutionLimitExceeded { .. } => condition::EXECUTION_LIMIT_EXCEEDED,
            Self::ServerDraining => condition::SERVER_DRAINING,
            Self::ServerBusy { .. } => condition::SERVER_BUSY,
            Self::BatchTooLarge { .. } => condition::ARROW_BATCH_TOO_LARGE,
            Self::InvalidTag { .. }
            | Self::UnknownReleaseType
            | Self::Orphaned { .. }
            | Self::Failed { .. }
            | Self::Spark(_) => return None,
        })
    }

    /// The SQLSTATE sent with the condition, if any ([`Condition::sql_state`], measured on
    /// Spark 4.3.0, connect §2); `None` without a condition.
    pub fn sql_state(&self) -> Option<&'static str> {
        self.spark_condition()?.sql_state()
    }

    /// The gRPC status code category a transport should send this error with: the
    /// condition's ([`Condition::code`]: `INTERNAL`, as Spark does for every recoverable
    /// server error, rx §1.8, except `RESOURCE_EXHAUSTED` for
    /// [`ExecutionLimitExceeded`](Self::ExecutionLimitExceeded) and `UNAVAILABLE` for
    /// [`ServerDraining`](Self::ServerDraining)), the producer's code for
    /// [`Failed`](Self::Failed), else `INTERNAL`.
    pub fn code(&self) -> Code {
        match self {
            Self::Failed { code, .. } => *code,
            other => other
                .spark_condition()
                .map_or(Code::Internal, Condition::code),
        }
    }

    /// A producer-reported failure with status `INTERNAL` (see [`Failed`](Self::Failed)):
    /// the terminal error of rx §2.2 T8, `message` used verbatim.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed {
            message: message.into(),
            code: Code::Internal,
        }
    }
}

/// [`ConnectError::message`]: the status message.
impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for ConnectError {}

/// What a client receives for a server-side [`ConnectError`]: its status code, its
/// [`message`](ConnectError::message) and its condition as the rich-status condition — what a
/// gRPC adapter would carry over the wire (rx §1.8). In-memory transports use this directly.
impl From<&ConnectError> for RpcError {
    fn from(error: &ConnectError) -> Self {
        let rpc = Self::new(error.code(), error.message());
        match error.condition() {
            Some(condition) => rpc.with_condition(condition),
            None => rpc,
        }
    }
}

/// As `From<&ConnectError>` (rx §1.8).
impl From<ConnectError> for RpcError {
    fn from(error: ConnectError) -> Self {
        Self::from(&error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_starts_with_condition() {
        let errors = [
            ConnectError::InvalidHandleFormat { handle: "x".into() },
            ConnectError::OperationAbandoned { handle: "x".into() },
            ConnectError::OperationAlreadyExists { handle: "x".into() },
            ConnectError::OperationNotFound { handle: "x".into() },
            ConnectError::SessionChanged { handle: "x".into() },
            ConnectError::SessionClosed { handle: "x".into() },
            ConnectError::SessionNotFound { handle: "x".into() },
            ConnectError::Disconnected,
            ConnectError::NotReattachable,
            ConnectError::PositionNotAvailable {
                response_id: "r".into(),
                index: 3,
            },
            ConnectError::PositionNotFound {
                response_id: "r".into(),
            },
            ConnectError::OperationCanceled,
            ConnectError::InterruptTagRequiresTag,
            ConnectError::InterruptOperationIdRequiresId,
            ConnectError::UnsupportedInterruptType { interrupt_type: 9 },
            ConnectError::ExecutionLimitExceeded {
                session: "s".into(),
                limit: 1,
            },
        ];
        for e in errors {
            let c = e.condition().unwrap();
            assert!(e.to_string().starts_with(&format!("[{c}] ")), "{e}");
            let known = e.spark_condition().unwrap();
            assert_eq!(Condition::find_in(&e.to_string()), Some(known));
            assert!(condition::ALL.contains(&known));
        }
        assert_eq!(ConnectError::UnknownReleaseType.condition(), None);
        assert_eq!(ConnectError::failed("boom").to_string(), "boom");
    }

    /// The status messages clients receive (Spark clients search them for the condition):
    /// every variant's text, pinned.
    #[test]
    fn status_messages_are_pinned() {
        let h = || "op-1".to_string();
        let cases = [
            (
                ConnectError::InvalidHandleFormat { handle: h() },
                "[INVALID_HANDLE.FORMAT] The handle op-1 is invalid. Handle must be an UUID \
                 string of the format '00112233-4455-6677-8899-aabbccddeeff' SQLSTATE: HY000",
            ),
            (
                ConnectError::OperationAbandoned { handle: h() },
                "[INVALID_HANDLE.OPERATION_ABANDONED] The handle op-1 is invalid. Operation was \
                 considered abandoned because of inactivity and removed. SQLSTATE: HY000",
            ),
            (
                ConnectError::OperationAlreadyExists { handle: h() },
                "[INVALID_HANDLE.OPERATION_ALREADY_EXISTS] The handle op-1 is invalid. \
                 Operation already exists. SQLSTATE: HY000",
            ),
            (
                ConnectError::OperationNotFound { handle: h() },
                "[INVALID_HANDLE.OPERATION_NOT_FOUND] The handle op-1 is invalid. Operation not \
                 found. SQLSTATE: HY000",
            ),
            (
                ConnectError::SessionChanged { handle: h() },
                "[INVALID_HANDLE.SESSION_CHANGED] The handle op-1 is invalid. The existing Spark \
                 server driver instance has restarted. Please reconnect. SQLSTATE: 08003",
            ),
            (
                ConnectError::SessionClosed { handle: h() },
                "[INVALID_HANDLE.SESSION_CLOSED] The handle op-1 is invalid. Session was closed. \
                 SQLSTATE: 08003",
            ),
            (
                ConnectError::SessionNotFound { handle: h() },
                "[INVALID_HANDLE.SESSION_NOT_FOUND] The handle op-1 is invalid. Session not \
                 found. SQLSTATE: 08003",
            ),
            (
                ConnectError::Disconnected,
                "[INVALID_CURSOR.DISCONNECTED] The cursor is invalid. The cursor has been \
                 disconnected by the server. SQLSTATE: HY109",
            ),
            (
                ConnectError::NotReattachable,
                "[INVALID_CURSOR.NOT_REATTACHABLE] The cursor is invalid. The cursor is not \
                 reattachable. SQLSTATE: HY109",
            ),
            (
                ConnectError::PositionNotAvailable {
                    response_id: "r-7".into(),
                    index: 3,
                },
                "[INVALID_CURSOR.POSITION_NOT_AVAILABLE] The cursor is invalid. The cursor \
                 position id r-7 is no longer available at index 3. SQLSTATE: HY109",
            ),
            (
                ConnectError::PositionNotFound {
                    response_id: "r-7".into(),
                },
                "[INVALID_CURSOR.POSITION_NOT_FOUND] The cursor is invalid. The cursor position \
                 id r-7 is not found. SQLSTATE: HY109",
            ),
            (
                ConnectError::OperationCanceled,
                "[OPERATION_CANCELED] Operation has been canceled. SQLSTATE: HY008",
            ),
            (
                ConnectError::InterruptTagRequiresTag,
                "[INVALID_PARAMETER_VALUE.INTERRUPT_TYPE_TAG_REQUIRES_TAG] An interrupt of type \
                 TAG needs an operation_tag. SQLSTATE: 22023",
            ),
            (
                ConnectError::InterruptOperationIdRequiresId,
                "[INVALID_PARAMETER_VALUE.INTERRUPT_TYPE_OPERATION_ID_REQUIRES_ID] An interrupt \
                 of type OPERATION_ID needs an operation_id. SQLSTATE: 22023",
            ),
            (
                ConnectError::UnsupportedInterruptType { interrupt_type: 9 },
                "[UNSUPPORTED_FEATURE.INTERRUPT_TYPE] Interrupt type 9 is not supported. \
                 SQLSTATE: 0A000",
            ),
            (
                ConnectError::InvalidTag {
                    tag: "a,b".into(),
                    reason: "it contains a comma",
                },
                "Spark Connect tag \"a,b\" is invalid: it contains a comma.",
            ),
            (
                ConnectError::UnknownReleaseType,
                "Unknown ReleaseExecute type: neither release_all nor release_until is set.",
            ),
            (
                ConnectError::Orphaned { handle: h() },
                "Operation op-1 was orphaned: its producer stopped without completing.",
            ),
            (
                ConnectError::ExecutionLimitExceeded {
                    session: "s-1".into(),
                    limit: 1000,
                },
                "[EXECUTION_LIMIT_EXCEEDED] Session s-1 is at its limit of 1000 live executions \
                 (ManagerConfig::max_executions_per_session); release some before starting more.",
            ),
            (
                ConnectError::failed("[DIVIDE_BY_ZERO] boom"),
                "[DIVIDE_BY_ZERO] boom",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.message(), text, "{e:?}");
            assert_eq!(e.to_string(), text);
            // What a client receives for it.
            let rpc = crate::execution::client::RpcError::from(&e);
            assert_eq!(rpc.message(), text);
            assert_eq!(rpc.code(), e.code());
        }
    }

    #[test]
    fn codes_and_states() {
        assert_eq!(ConnectError::Disconnected.code(), Code::Internal);
        assert_eq!(ConnectError::Disconnected.sql_state(), Some("HY109"));
        assert_eq!(
            ConnectError::SessionNotFound { handle: "s".into() }.sql_state(),
            Some("08003")
        );
        assert_eq!(
            ConnectError::ExecutionLimitExceeded {
                session: "s".into(),
                limit: 1
            }
            .code(),
            Code::ResourceExhausted
        );
        assert_eq!(Code::Unavailable.to_string(), "UNAVAILABLE");
    }

    #[test]
    fn from_server_error() {
        let e = RpcError::from(ConnectError::Disconnected);
        assert_eq!(e.code(), Code::Internal);
        assert!(crate::execution::client::RetryPolicy::default_can_retry(&e));
        let nf = RpcError::from(ConnectError::SessionNotFound { handle: "s".into() });
        assert!(nf.is_not_found());
        assert_eq!(
            nf.condition(),
            Some(condition::INVALID_HANDLE_SESSION_NOT_FOUND.name())
        );
    }
}
