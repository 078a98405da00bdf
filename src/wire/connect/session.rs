//! `CloneSession` and `GetStatus`: the two session-level RPCs beyond Config and AnalyzePlan
//! (connect §14, §15; Spark 4.3.0's `base.proto`). Neither runs a query: CloneSession copies a
//! session into a new one, GetStatus reports the states of a session's operations. Field
//! numbers are Spark 4.3.0's.

use super::{Any, UserContext, user_id_of};

/// `spark.connect.CloneSessionRequest`: copy the session `(user_id, session_id)` into a new
/// session of the same user (connect §14.1; Spark's `SparkConnectCloneSessionHandler`).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct CloneSessionRequest {
    /// Field 1: the source session's id (a UUID string).
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: who asks; with `session_id` it names the source session.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: the client's self-description; logging only.
    #[prost(string, optional, tag = "3")]
    pub client_type: Option<String>,
    /// Field 4: the id of the new session (a UUID string); unset or empty: the server
    /// generates one.
    #[prost(string, optional, tag = "4")]
    pub new_session_id: Option<String>,
    /// Field 5: the source's `server_side_session_id` the client saw last, if any
    /// (connect §3); an empty one is not checked.
    #[prost(string, optional, tag = "5")]
    pub client_observed_server_side_session_id: Option<String>,
}

impl CloneSessionRequest {
    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent (rx §5.1).
    pub fn user_id(&self) -> &str {
        user_id_of(self.user_context.as_ref())
    }
}

/// `spark.connect.CloneSessionResponse` (connect §14.1).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct CloneSessionResponse {
    /// Field 1: the source session's id, as the request spelled it.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the source session's `server_side_session_id` (connect §3).
    #[prost(string, tag = "2")]
    pub server_side_session_id: String,
    /// Field 3: the new session's id, as given or generated.
    #[prost(string, tag = "3")]
    pub new_session_id: String,
    /// Field 4: the new session's `server_side_session_id`.
    #[prost(string, tag = "4")]
    pub new_server_side_session_id: String,
}

/// `spark.connect.GetStatusRequest`: the states of a session's operations (connect §15.1;
/// Spark's `SparkConnectGetStatusHandler`).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct GetStatusRequest {
    /// Field 1: the session's id (a UUID string).
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: who asks; with `session_id` it names the session.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: the client's self-description; logging only.
    #[prost(string, optional, tag = "3")]
    pub client_type: Option<String>,
    /// Field 4: the `server_side_session_id` the client saw last, if any (connect §3).
    #[prost(string, optional, tag = "4")]
    pub client_observed_server_side_session_id: Option<String>,
    /// Field 5: which operations to report; unset: none (the response carries the session's
    /// ids only).
    #[prost(message, optional, tag = "5")]
    pub operation_status: Option<get_status_request::OperationStatusRequest>,
    /// Field 999: extensions (`google.protobuf.Any`); ignored.
    #[prost(message, repeated, tag = "999")]
    pub extensions: Vec<Any>,
}

impl GetStatusRequest {
    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent (rx §5.1).
    pub fn user_id(&self) -> &str {
        user_id_of(self.user_context.as_ref())
    }
}

/// Nested types of [`GetStatusRequest`] (connect §15.1).
pub mod get_status_request {
    use super::Any;

    /// `GetStatusRequest.OperationStatusRequest` (connect §15.1).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct OperationStatusRequest {
        /// Field 1: the operations to report, by id; empty: every operation the session
        /// knows (live, and inactive for `inactive_operation_expiry`).
        #[prost(string, repeated, tag = "1")]
        pub operation_ids: Vec<String>,
        /// Field 999: extensions (`google.protobuf.Any`); ignored.
        #[prost(message, repeated, tag = "999")]
        pub extensions: Vec<Any>,
    }
}

/// `spark.connect.GetStatusResponse` (connect §15.1).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct GetStatusResponse {
    /// Field 1: the session's id, as the request spelled it.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the session's `server_side_session_id` (connect §3).
    #[prost(string, tag = "2")]
    pub server_side_session_id: String,
    /// Field 3: one entry per operation reported.
    #[prost(message, repeated, tag = "3")]
    pub operation_statuses: Vec<get_status_response::OperationStatus>,
    /// Field 999: extensions (`google.protobuf.Any`); tether sends none.
    #[prost(message, repeated, tag = "999")]
    pub extensions: Vec<Any>,
}

/// Nested types of [`GetStatusResponse`] (connect §15.1).
pub mod get_status_response {
    use super::Any;

    /// `GetStatusResponse.OperationStatus`: one operation's state (connect §15.1).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct OperationStatus {
        /// Field 1: the operation id, as the request spelled it (or the canonical id when
        /// every operation is reported).
        #[prost(string, tag = "1")]
        pub operation_id: String,
        /// Field 2: its [`OperationState`], as a raw `i32`.
        #[prost(enumeration = "OperationState", tag = "2")]
        pub state: i32,
        /// Field 999: extensions (`google.protobuf.Any`); tether sends none.
        #[prost(message, repeated, tag = "999")]
        pub extensions: Vec<Any>,
    }

    impl OperationStatus {
        /// An entry for `operation_id` in `state` (connect §15.1).
        pub fn new(operation_id: impl Into<String>, state: OperationState) -> Self {
            Self {
                operation_id: operation_id.into(),
                state: state as i32,
                extensions: Vec::new(),
            }
        }
    }

    /// `GetStatusResponse.OperationStatus.OperationState` (connect §15.2, as Spark 4.3.0's
    /// `SparkConnectGetStatusHandler` maps its `ExecuteStatus`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
    #[repr(i32)]
    pub enum OperationState {
        /// 0: unspecified; never sent.
        Unspecified = 0,
        /// 1: the session does not know the operation (never existed, forgotten, or an id
        /// that is no UUID).
        Unknown = 1,
        /// 2: registered and not yet ended.
        Running = 2,
        /// 3: finished or failed, still registered (its results may still be read).
        Terminating = 3,
        /// 4: finished and removed (released, or a non-reattachable stream's end).
        Succeeded = 4,
        /// 5: failed and removed.
        Failed = 5,
        /// 6: interrupted, or removed before it finished.
        Cancelled = 6,
    }

    impl OperationState {
        /// The enum value's name as spelled in the protobuf schema (connect §15.2).
        pub fn as_str_name(&self) -> &'static str {
            match self {
                Self::Unspecified => "OPERATION_STATE_UNSPECIFIED",
                Self::Unknown => "OPERATION_STATE_UNKNOWN",
                Self::Running => "OPERATION_STATE_RUNNING",
                Self::Terminating => "OPERATION_STATE_TERMINATING",
                Self::Succeeded => "OPERATION_STATE_SUCCEEDED",
                Self::Failed => "OPERATION_STATE_FAILED",
                Self::Cancelled => "OPERATION_STATE_CANCELLED",
            }
        }

        /// Parses a schema spelling produced by [`as_str_name`](Self::as_str_name)
        /// (connect §15.2).
        pub fn from_str_name(value: &str) -> Option<Self> {
            Some(match value {
                "OPERATION_STATE_UNSPECIFIED" => Self::Unspecified,
                "OPERATION_STATE_UNKNOWN" => Self::Unknown,
                "OPERATION_STATE_RUNNING" => Self::Running,
                "OPERATION_STATE_TERMINATING" => Self::Terminating,
                "OPERATION_STATE_SUCCEEDED" => Self::Succeeded,
                "OPERATION_STATE_FAILED" => Self::Failed,
                "OPERATION_STATE_CANCELLED" => Self::Cancelled,
                _ => return None,
            })
        }

        /// Whether the operation has ended for good: Succeeded, Failed or Cancelled
        /// (connect §15.2). An ended state never changes again.
        pub fn is_final(self) -> bool {
            matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
        }
    }
}
