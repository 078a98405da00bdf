//! `FetchErrorDetails`: the details of an error a client was sent with an `errorId` in its
//! `ErrorInfo` (connect §8; Spark's `SparkConnectFetchErrorDetailsHandler`). Field numbers
//! are Spark 4.3.0's `base.proto` (connect §8.2).

use std::collections::BTreeMap;

use super::UserContext;

/// `spark.connect.FetchErrorDetailsRequest` (connect §8.2): the details of the error
/// `error_id` of the session `(user_context.user_id, session_id)`.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct FetchErrorDetailsRequest {
    /// Field 1: the client's session id, a UUID (else `INVALID_HANDLE.FORMAT`).
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 5: the `server_side_session_id` the client saw last; a mismatch is
    /// `INVALID_HANDLE.SESSION_CHANGED` (rx §5.5).
    #[prost(string, optional, tag = "5")]
    pub client_observed_server_side_session_id: Option<String>,
    /// Field 2: who asks; with `session_id` it names the session.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: the `errorId` of the error's `ErrorInfo` metadata (a UUID string; any other
    /// string names no error).
    #[prost(string, tag = "3")]
    pub error_id: String,
    /// Field 4: the client's self-description; logging only.
    #[prost(string, optional, tag = "4")]
    pub client_type: Option<String>,
}

impl FetchErrorDetailsRequest {
    /// A request for `error_id` in the session `(user_id, session_id)` (connect §8.2).
    pub fn new(
        session_id: impl Into<String>,
        user_id: impl Into<String>,
        error_id: impl Into<String>,
    ) -> Self {
        Self {
            session_id: session_id.into(),
            user_context: Some(UserContext::new(user_id)),
            error_id: error_id.into(),
            ..Self::default()
        }
    }

    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent (rx §5.1).
    pub fn user_id(&self) -> &str {
        super::user_id_of(self.user_context.as_ref())
    }
}

/// `spark.connect.FetchErrorDetailsResponse` (connect §8.2): the error chain, root first.
///
/// An unknown, expired, evicted or already fetched id is answered with every field unset
/// (no `root_error_idx`, no errors), as Spark 4.3.0 answers it (connect §8.1).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct FetchErrorDetailsResponse {
    /// Field 3: the server-side session id. Spark 4.3.0 leaves it unset (measured,
    /// connect §8.1), and so does tether.
    #[prost(string, tag = "3")]
    pub server_side_session_id: String,
    /// Field 4: the session id. Unset, as in Spark 4.3.0 (connect §8.1).
    #[prost(string, tag = "4")]
    pub session_id: String,
    /// Field 1: the index of the root error in [`errors`](Self::errors); unset when the
    /// error was not found.
    #[prost(int32, optional, tag = "1")]
    pub root_error_idx: Option<i32>,
    /// Field 2: the errors of the chain; each names its cause by index.
    #[prost(message, repeated, tag = "2")]
    pub errors: Vec<fetch_error_details_response::Error>,
}

/// Nested types of [`FetchErrorDetailsResponse`] (connect §8.2).
pub mod fetch_error_details_response {
    use super::BTreeMap;

    /// `FetchErrorDetailsResponse.StackTraceElement`: one frame of a JVM stack trace.
    /// tether has no JVM stack and never sends one (connect §8.1).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct StackTraceElement {
        /// Field 1: the fully qualified class of the frame.
        #[prost(string, tag = "1")]
        pub declaring_class: String,
        /// Field 2: the method of the frame.
        #[prost(string, tag = "2")]
        pub method_name: String,
        /// Field 3: the source file, if known.
        #[prost(string, optional, tag = "3")]
        pub file_name: Option<String>,
        /// Field 4: the line number.
        #[prost(int32, tag = "4")]
        pub line_number: i32,
    }

    /// `FetchErrorDetailsResponse.QueryContext`: where in the query an error arose
    /// (connect §8.2). tether sends none (connect §8.1).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct QueryContext {
        /// Field 10: a [`ContextType`] as a raw `i32` (`SQL` = 0, `DATAFRAME` = 1).
        #[prost(enumeration = "ContextType", tag = "10")]
        pub context_type: i32,
        /// Field 1: the object type (`VIEW`, …), empty for the main query.
        #[prost(string, tag = "1")]
        pub object_type: String,
        /// Field 2: the object name, empty for the main query.
        #[prost(string, tag = "2")]
        pub object_name: String,
        /// Field 3: the 0-based start index in the query text.
        #[prost(int32, tag = "3")]
        pub start_index: i32,
        /// Field 4: the 0-based stop index in the query text (inclusive).
        #[prost(int32, tag = "4")]
        pub stop_index: i32,
        /// Field 5: the fragment of the query text.
        #[prost(string, tag = "5")]
        pub fragment: String,
        /// Field 6: the user code's call site (DataFrame contexts).
        #[prost(string, tag = "6")]
        pub call_site: String,
        /// Field 7: a rendered summary of the context.
        #[prost(string, tag = "7")]
        pub summary: String,
    }

    /// `FetchErrorDetailsResponse.QueryContext.ContextType` (connect §8.2). Stored as a raw
    /// `i32` in [`QueryContext::context_type`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
    #[repr(i32)]
    pub enum ContextType {
        /// 0: a SQL text context.
        Sql = 0,
        /// 1: a DataFrame API context.
        Dataframe = 1,
    }

    /// `FetchErrorDetailsResponse.SparkThrowable`: the structured part of an error that has
    /// a Spark condition (connect §8.1, §8.2).
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct SparkThrowable {
        /// Field 1: the condition (`errorClass`), e.g. `DIVIDE_BY_ZERO`.
        #[prost(string, optional, tag = "1")]
        pub error_class: Option<String>,
        /// Field 2: the message parameters, by name.
        #[prost(btree_map = "string, string", tag = "2")]
        pub message_parameters: BTreeMap<String, String>,
        /// Field 3: the query contexts.
        #[prost(message, repeated, tag = "3")]
        pub query_contexts: Vec<QueryContext>,
        /// Field 4: the SQLSTATE, if the condition has one.
        #[prost(string, optional, tag = "4")]
        pub sql_state: Option<String>,
        /// Field 5: breaking-change information, if the error was caused by one.
        #[prost(message, optional, tag = "5")]
        pub breaking_change_info: Option<BreakingChangeInfo>,
    }

    /// `FetchErrorDetailsResponse.BreakingChangeInfo` (connect §8.2): how to migrate past a
    /// breaking change that caused the error. tether sends none.
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct BreakingChangeInfo {
        /// Field 1: how to migrate.
        #[prost(string, repeated, tag = "1")]
        pub migration_message: Vec<String>,
        /// Field 2: a configuration that mitigates the change.
        #[prost(message, optional, tag = "2")]
        pub mitigation_config: Option<MitigationConfig>,
        /// Field 3: whether the change needs a manual audit.
        #[prost(bool, optional, tag = "3")]
        pub needs_audit: Option<bool>,
    }

    /// `FetchErrorDetailsResponse.MitigationConfig`: a configuration key and the value that
    /// mitigates a breaking change (connect §8.2).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct MitigationConfig {
        /// Field 1: the key.
        #[prost(string, tag = "1")]
        pub key: String,
        /// Field 2: the value.
        #[prost(string, tag = "2")]
        pub value: String,
    }

    /// `FetchErrorDetailsResponse.Error`: one error of the chain (connect §8.1, §8.2).
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct Error {
        /// Field 1: the Java class of the error and its superclasses, most specific first,
        /// ending with `java.lang.Object` (the `classes` metadata of connect §2).
        #[prost(string, repeated, tag = "1")]
        pub error_type_hierarchy: Vec<String>,
        /// Field 2: the whole message (the status message of connect §2, untruncated).
        #[prost(string, tag = "2")]
        pub message: String,
        /// Field 3: the server's stack trace; always empty from tether (connect §8.1).
        #[prost(message, repeated, tag = "3")]
        pub stack_trace: Vec<StackTraceElement>,
        /// Field 4: the index of this error's cause in the response's errors, if any.
        #[prost(int32, optional, tag = "4")]
        pub cause_idx: Option<i32>,
        /// Field 5: the condition, parameters, SQLSTATE and contexts, for an error that has
        /// a Spark condition.
        #[prost(message, optional, tag = "5")]
        pub spark_throwable: Option<SparkThrowable>,
    }
}

#[cfg(test)]
mod tests {
    use super::fetch_error_details_response::{Error, SparkThrowable};
    use super::*;
    use prost::Message;

    #[test]
    fn request_field_numbers() {
        let r = FetchErrorDetailsRequest {
            session_id: "s".into(),
            client_observed_server_side_session_id: Some("o".into()),
            user_context: Some(UserContext::new("u")),
            error_id: "e".into(),
            client_type: Some("c".into()),
        };
        let buf = r.encode_to_vec();
        for field in [
            [0x0a, 1, b's'],
            [0x1a, 1, b'e'],
            [0x22, 1, b'c'],
            [0x2a, 1, b'o'],
        ] {
            assert!(buf.windows(3).any(|w| w == field), "{field:?} in {buf:?}");
        }
        // user_context: field 2 { field 1 "u" }
        assert!(buf.windows(5).any(|w| w == [0x12, 3, 0x0a, 1, b'u']));
        assert_eq!(FetchErrorDetailsRequest::decode(buf.as_slice()).unwrap(), r);
        assert_eq!(r.user_id(), "u");
    }

    /// The unknown-id answer is the empty message (no `root_error_idx`), as Spark sends it;
    /// a found one has `root_error_idx` 0 present (explicit presence) and its errors.
    #[test]
    fn response_field_numbers_and_presence() {
        assert!(
            FetchErrorDetailsResponse::default()
                .encode_to_vec()
                .is_empty()
        );
        let found = FetchErrorDetailsResponse {
            root_error_idx: Some(0),
            errors: vec![Error {
                error_type_hierarchy: vec!["A".into()],
                message: "m".into(),
                cause_idx: Some(1),
                spark_throwable: Some(SparkThrowable {
                    error_class: Some("C".into()),
                    message_parameters: [("k".to_owned(), "v".to_owned())].into(),
                    sql_state: Some("S".into()),
                    ..SparkThrowable::default()
                }),
                ..Error::default()
            }],
            ..FetchErrorDetailsResponse::default()
        };
        let buf = found.encode_to_vec();
        assert_eq!(&buf[..2], &[0x08, 0], "root_error_idx 0 is sent");
        assert_eq!(buf[2], 0x12, "errors: field 2");
        // error: hierarchy (1), message (2), cause_idx (4), spark_throwable (5)
        assert!(buf.windows(3).any(|w| w == [0x0a, 1, b'A']));
        assert!(buf.windows(3).any(|w| w == [0x12, 1, b'm']));
        assert!(buf.windows(2).any(|w| w == [0x20, 1]));
        // spark_throwable: error_class (1), map entry (2), sql_state (4)
        assert!(buf.windows(3).any(|w| w == [0x0a, 1, b'C']));
        assert!(
            buf.windows(8)
                .any(|w| w == [0x12, 6, 0x0a, 1, b'k', 0x12, 1, b'v'])
        );
        assert!(buf.windows(3).any(|w| w == [0x22, 1, b'S']));
        assert_eq!(
            FetchErrorDetailsResponse::decode(buf.as_slice()).unwrap(),
            found
        );
    }
}
