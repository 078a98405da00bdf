//! The gRPC status code categories both sides of reattachable executions speak in (rx §1.8):
//! the server's errors are sent with one, the client's retry policy decides by it (rx §6.1).
//! Shared by the server and the client; imports nothing from either.

use std::fmt;

/// A gRPC status code category (the canonical `google.rpc.Code` values). Spark sends every
/// recoverable server error as `INTERNAL` and fatal ones as `UNKNOWN` (rx §1.8); its clients
/// decide retries by code and message (rx §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    /// 0: not an error.
    Ok = 0,
    /// 1: cancelled by the caller.
    Cancelled = 1,
    /// 2: unknown error; Spark uses it for fatal throwables (rx §1.8).
    Unknown = 2,
    /// 3: the client sent an invalid argument.
    InvalidArgument = 3,
    /// 4: the deadline expired before the operation completed.
    DeadlineExceeded = 4,
    /// 5: an entity was not found.
    NotFound = 5,
    /// 6: an entity already exists.
    AlreadyExists = 6,
    /// 7: permission denied.
    PermissionDenied = 7,
    /// 8: a resource (quota, capacity) is exhausted.
    ResourceExhausted = 8,
    /// 9: the system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// 10: aborted (concurrency conflict).
    Aborted = 10,
    /// 11: out of range.
    OutOfRange = 11,
    /// 12: not implemented.
    Unimplemented = 12,
    /// 13: internal error; Spark's code for every recoverable server error (rx §1.8).
    Internal = 13,
    /// 14: the service is unavailable (transient; clients retry it, rx §6.1).
    Unavailable = 14,
    /// 15: unrecoverable data loss.
    DataLoss = 15,
    /// 16: the request lacks valid credentials.
    Unauthenticated = 16,
}

impl Code {
    /// The code's canonical upper-case name, e.g. `"INTERNAL"`, as status texts print it
    /// (rx §1.8, §6.1).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Cancelled => "CANCELLED",
            Self::Unknown => "UNKNOWN",
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Self::NotFound => "NOT_FOUND",
            Self::AlreadyExists => "ALREADY_EXISTS",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Self::FailedPrecondition => "FAILED_PRECONDITION",
            Self::Aborted => "ABORTED",
            Self::OutOfRange => "OUT_OF_RANGE",
            Self::Unimplemented => "UNIMPLEMENTED",
            Self::Internal => "INTERNAL",
            Self::Unavailable => "UNAVAILABLE",
            Self::DataLoss => "DATA_LOSS",
            Self::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
