//! Spark's error conditions of reattachable executions, each written once: its name, the
//! SQLSTATE Spark sends with it and the gRPC status code it travels under (rx §1.8, §5.7;
//! measured on Spark 4.3.0, connect §2). The server's [`ConnectError`](super::ConnectError)
//! reports these, and the client's retry and re-execute rules (rx §6) recognise them; both
//! sides import this module, and it imports nothing from either but [`Code`].
//!
//! Spark clients find a condition by searching the status message for its name (rx §1.8):
//! [`Condition::find_in`] does so over [`ALL`], longest names first.

use std::fmt;

use super::Code;

/// One Spark error condition: the name Spark puts in brackets at the start of a status
/// message and in `ErrorInfo.metadata["errorClass"]`, its SQLSTATE (`None` where Spark sends
/// none, or for tether's own conditions) and its gRPC status code (rx §1.8, connect §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Condition {
    name: &'static str,
    sql_state: Option<&'static str>,
    code: Code,
}

impl Condition {
    const fn new(name: &'static str, sql_state: Option<&'static str>, code: Code) -> Self {
        Self {
            name,
            sql_state,
            code,
        }
    }

    /// The condition's name, e.g. `"INVALID_CURSOR.DISCONNECTED"` (rx §1.8).
    pub const fn name(self) -> &'static str {
        self.name
    }

    /// The SQLSTATE Spark 4.3.0 sends with it (connect §2): `08003` for
    /// `INVALID_HANDLE.SESSION_*`, `HY000` for the other `INVALID_HANDLE.*`, `HY109` for
    /// `INVALID_CURSOR.*`, `HY008` for `OPERATION_CANCELED`, `22023` for
    /// `INVALID_PARAMETER_VALUE.*`, `0A000` for `UNSUPPORTED_FEATURE.*` (Spark's
    /// `error-conditions.json`); `None` for tether's own conditions
    /// (`EXECUTION_LIMIT_EXCEEDED`, `ARROW_BATCH_TOO_LARGE`, `SERVER_DRAINING`,
    /// `SERVER_BUSY`) and the client-only `RESPONSE_ALREADY_RECEIVED`.
    pub const fn sql_state(self) -> Option<&'static str> {
        self.sql_state
    }

    /// The gRPC status code it is sent with: `INTERNAL`, as Spark sends every recoverable
    /// server error (rx §1.8), except tether's `EXECUTION_LIMIT_EXCEEDED` and
    /// `ARROW_BATCH_TOO_LARGE` (`RESOURCE_EXHAUSTED`), `SERVER_DRAINING` and `SERVER_BUSY`
    /// (`UNAVAILABLE`, retried by clients).
    pub const fn code(self) -> Code {
        self.code
    }

    /// The first server condition of [`ALL`] whose name `message` contains, the way Spark
    /// clients classify errors (substring search, rx §1.8): longest names first, so that
    /// `INVALID_HANDLE.OPERATION_NOT_FOUND` is never mistaken for a shorter one.
    pub fn find_in(message: &str) -> Option<Self> {
        ALL.iter().copied().find(|c| message.contains(c.name))
    }
}

/// The name (rx §1.8).
impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// The name, as a status message or `ErrorInfo` carries it (rx §1.8).
impl From<Condition> for String {
    fn from(condition: Condition) -> Self {
        condition.name.to_owned()
    }
}

const INTERNAL: Code = Code::Internal;

/// A session or operation id is not a UUID (rx §1.9).
pub const INVALID_HANDLE_FORMAT: Condition =
    Condition::new("INVALID_HANDLE.FORMAT", Some("HY000"), INTERNAL);
/// The operation was abandoned by the server: removed for inactivity, or its tombstone hit
/// (rx §5.3, §5.4).
pub const INVALID_HANDLE_OPERATION_ABANDONED: Condition = Condition::new(
    "INVALID_HANDLE.OPERATION_ABANDONED",
    Some("HY000"),
    INTERNAL,
);
/// An ExecutePlan reused an operation id that is live or recently released (rx §5.2).
pub const INVALID_HANDLE_OPERATION_ALREADY_EXISTS: Condition = Condition::new(
    "INVALID_HANDLE.OPERATION_ALREADY_EXISTS",
    Some("HY000"),
    INTERNAL,
);
/// No such operation in the session: it never arrived, or it was released (rx §5.5). With
/// nothing delivered yet the client re-executes (SPARK-44624).
pub const INVALID_HANDLE_OPERATION_NOT_FOUND: Condition = Condition::new(
    "INVALID_HANDLE.OPERATION_NOT_FOUND",
    Some("HY000"),
    INTERNAL,
);
/// The server-side session changed under the client (rx §5.5).
pub const INVALID_HANDLE_SESSION_CHANGED: Condition =
    Condition::new("INVALID_HANDLE.SESSION_CHANGED", Some("08003"), INTERNAL);
/// The session was closed or expired (rx §5.6).
pub const INVALID_HANDLE_SESSION_CLOSED: Condition =
    Condition::new("INVALID_HANDLE.SESSION_CLOSED", Some("08003"), INTERNAL);
/// No such session (rx §5.5); the client treats it like `OPERATION_NOT_FOUND`
/// (SPARK-48056).
pub const INVALID_HANDLE_SESSION_NOT_FOUND: Condition =
    Condition::new("INVALID_HANDLE.SESSION_NOT_FOUND", Some("08003"), INTERNAL);
/// The RPC was cut by the server: another attach preempted it, or an interrupt, release or
/// close interrupted the sender (rx §4.4). Retryable (SPARK-44835).
pub const INVALID_CURSOR_DISCONNECTED: Condition =
    Condition::new("INVALID_CURSOR.DISCONNECTED", Some("HY109"), INTERNAL);
/// The execution is not reattachable (rx §5.5).
pub const INVALID_CURSOR_NOT_REATTACHABLE: Condition =
    Condition::new("INVALID_CURSOR.NOT_REATTACHABLE", Some("HY109"), INTERNAL);
/// The response after `last_response_id` was already evicted (rx §3.5).
pub const INVALID_CURSOR_POSITION_NOT_AVAILABLE: Condition = Condition::new(
    "INVALID_CURSOR.POSITION_NOT_AVAILABLE",
    Some("HY109"),
    INTERNAL,
);
/// `last_response_id` was never produced by this execution (rx §3.5).
pub const INVALID_CURSOR_POSITION_NOT_FOUND: Condition =
    Condition::new("INVALID_CURSOR.POSITION_NOT_FOUND", Some("HY109"), INTERNAL);
/// The execution was interrupted (rx §5.7).
pub const OPERATION_CANCELED: Condition =
    Condition::new("OPERATION_CANCELED", Some("HY008"), INTERNAL);
/// An Interrupt of type `TAG` without a tag (rx §5.7).
pub const INVALID_PARAMETER_VALUE_INTERRUPT_TYPE_TAG_REQUIRES_TAG: Condition = Condition::new(
    "INVALID_PARAMETER_VALUE.INTERRUPT_TYPE_TAG_REQUIRES_TAG",
    Some("22023"),
    INTERNAL,
);
/// An Interrupt of type `OPERATION_ID` without an operation id (rx §5.7).
pub const INVALID_PARAMETER_VALUE_INTERRUPT_TYPE_OPERATION_ID_REQUIRES_ID: Condition =
    Condition::new(
        "INVALID_PARAMETER_VALUE.INTERRUPT_TYPE_OPERATION_ID_REQUIRES_ID",
        Some("22023"),
        INTERNAL,
    );
/// An Interrupt of a type the server does not know (rx §5.7).
pub const UNSUPPORTED_FEATURE_INTERRUPT_TYPE: Condition = Condition::new(
    "UNSUPPORTED_FEATURE.INTERRUPT_TYPE",
    Some("0A000"),
    INTERNAL,
);
/// tether's own: a session already holds `ManagerConfig::max_executions_per_session` live
/// executions (rx §5.2; Spark has no such bound). Sent as `RESOURCE_EXHAUSTED`.
pub const EXECUTION_LIMIT_EXCEEDED: Condition =
    Condition::new("EXECUTION_LIMIT_EXCEEDED", None, Code::ResourceExhausted);
/// tether's own: the server is draining for a shutdown or a restart (`ExecutionManager::refuse_new`)
/// and takes no new session or execution; what runs is served to its end. Sent as
/// `UNAVAILABLE`, which Spark clients retry with backoff (rx §6.1), so that a load balancer
/// can route the retry to another server (docs/deployment.md).
pub const SERVER_DRAINING: Condition = Condition::new("SERVER_DRAINING", None, Code::Unavailable);
/// tether's own: the server's admission cap is reached and the execution waited its longest
/// for a slot (`AdmissionConfig`, SPARK-49580's proposal). Sent as `UNAVAILABLE`, which Spark
/// clients retry with backoff (rx §6.1).
pub const SERVER_BUSY: Condition = Condition::new("SERVER_BUSY", None, Code::Unavailable);
/// tether's own: a result batch does not fit in one response and the client did not allow
/// chunking (connect §10). Sent as `RESOURCE_EXHAUSTED`, as gRPC reports a message above
/// the receiver's limit.
pub const ARROW_BATCH_TOO_LARGE: Condition =
    Condition::new("ARROW_BATCH_TOO_LARGE", None, Code::ResourceExhausted);
/// Client-only: an operation or session was not found after responses had been delivered,
/// so re-executing would duplicate results (rx §1.8, §6.3; Python client's condition name).
/// No server sends it.
pub const RESPONSE_ALREADY_RECEIVED: Condition =
    Condition::new("RESPONSE_ALREADY_RECEIVED", None, INTERNAL);

/// Every condition a server reports (the server conditions of rx §1.8 and §5.7, and tether's
/// `EXECUTION_LIMIT_EXCEEDED`, `ARROW_BATCH_TOO_LARGE`, `SERVER_DRAINING` and
/// `SERVER_BUSY`), longest name first: the order [`Condition::find_in`] searches
/// in. Not [`RESPONSE_ALREADY_RECEIVED`], which only a client raises.
pub const ALL: &[Condition] = &[
    INVALID_PARAMETER_VALUE_INTERRUPT_TYPE_OPERATION_ID_REQUIRES_ID,
    INVALID_PARAMETER_VALUE_INTERRUPT_TYPE_TAG_REQUIRES_TAG,
    INVALID_HANDLE_OPERATION_ALREADY_EXISTS,
    INVALID_CURSOR_POSITION_NOT_AVAILABLE,
    INVALID_HANDLE_OPERATION_ABANDONED,
    INVALID_HANDLE_OPERATION_NOT_FOUND,
    UNSUPPORTED_FEATURE_INTERRUPT_TYPE,
    INVALID_CURSOR_POSITION_NOT_FOUND,
    INVALID_HANDLE_SESSION_NOT_FOUND,
    INVALID_CURSOR_NOT_REATTACHABLE,
    INVALID_HANDLE_SESSION_CHANGED,
    INVALID_HANDLE_SESSION_CLOSED,
    INVALID_CURSOR_DISCONNECTED,
    EXECUTION_LIMIT_EXCEEDED,
    ARROW_BATCH_TOO_LARGE,
    INVALID_HANDLE_FORMAT,
    OPERATION_CANCELED,
    SERVER_DRAINING,
    SERVER_BUSY,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_longest_first_and_each_name_is_found_as_itself() {
        for pair in ALL.windows(2) {
            assert!(pair[0].name.len() >= pair[1].name.len(), "{pair:?}");
        }
        for c in ALL {
            let message = format!("[{}] text", c.name);
            assert_eq!(Condition::find_in(&message), Some(*c));
        }
        assert_eq!(Condition::find_in("[RESPONSE_ALREADY_RECEIVED] x"), None);
        assert_eq!(Condition::find_in("nothing"), None);
    }

    #[test]
    fn sql_states_follow_the_condition_families() {
        for c in ALL {
            let expected = match c.name {
                n if n.starts_with("INVALID_HANDLE.SESSION_") => Some("08003"),
                n if n.starts_with("INVALID_HANDLE.") => Some("HY000"),
                n if n.starts_with("INVALID_CURSOR.") => Some("HY109"),
                "OPERATION_CANCELED" => Some("HY008"),
                n if n.starts_with("INVALID_PARAMETER_VALUE.") => Some("22023"),
                n if n.starts_with("UNSUPPORTED_FEATURE.") => Some("0A000"),
                _ => None,
            };
            assert_eq!(c.sql_state, expected, "{}", c.name);
        }
    }
}
