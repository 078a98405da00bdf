//! The subset of Spark Connect's `spark.connect` protobuf messages (`base.proto`) that the
//! reattachable-execution layer needs (reattach rx §1).
//!
//! Hand-written with `prost` and Spark's field numbers, like the rest of [`crate::wire`]:
//!
//! * [`ExecutePlanRequest`] / [`ExecutePlanResponse`] — start an execution and the streamed
//!   responses of both `ExecutePlan` and `ReattachExecute` (rx §1.2, §1.3).
//! * [`ReattachExecuteRequest`] — resume a reattachable execution (rx §1.4).
//! * [`ReleaseExecuteRequest`] / [`ReleaseExecuteResponse`] — free responses or the whole
//!   execution (rx §1.5, §1.6).
//! * [`InterruptRequest`] / [`InterruptResponse`] and [`ReleaseSessionRequest`] /
//!   [`ReleaseSessionResponse`] (rx §1.7).
//! * [`FetchErrorDetailsRequest`] / [`FetchErrorDetailsResponse`] — the details of an error
//!   sent with an `errorId` (connect §8).
//! * [`AddArtifactsRequest`] / [`AddArtifactsResponse`] and [`ArtifactStatusesRequest`] /
//!   [`ArtifactStatusesResponse`] — upload artifacts to a session and ask which it has
//!   (Spark's `SparkConnectAddArtifactsHandler`).
//! * [`CloneSessionRequest`] / [`CloneSessionResponse`] and [`GetStatusRequest`] /
//!   [`GetStatusResponse`] (connect §14, §15).
//!
//! # What is opaque
//!
//! This layer never looks inside a query, so the message trees it only carries are kept as
//! their encoded bytes, in fields whose wire form is identical to the real embedded message
//! (a length-delimited field): [`Plan`]'s `root` (a `Relation`) and `command` (a `Command`),
//! [`ExecutePlanResponse::metrics`], [`ExecutePlanResponse::observed_metrics`] and
//! [`ExecutePlanResponse::schema`]. Bytes produced by any real Spark Connect encoder decode
//! into them unchanged and re-encode identically. Fields and `response_type` variants that
//! are not modelled here are skipped on decode, as protobuf requires for unknown fields; a
//! client must ignore unknown response types anyway (rx §1.3). Every `response_type` branch
//! of Spark 4.3.0 is here, the command results as their encoded messages, so an engine can
//! send any response Spark sends.
//!
//! Identifiers (`session_id`, `operation_id`, `response_id`) are UUID strings in the
//! canonical `00112233-4455-6677-8899-aabbccddeeff` form (rx §1.9).

use bytes::Bytes;

mod artifacts;
mod config;
mod errors;
mod query;
mod session;

pub use self::artifacts::{
    AddArtifactsRequest, AddArtifactsResponse, ArtifactStatusesRequest, ArtifactStatusesResponse,
    add_artifacts_request, add_artifacts_response, artifact_statuses_response,
};

pub use self::config::{
    AnalyzePlanRequest, AnalyzePlanResponse, ConfigRequest, ConfigResponse, KeyValue,
    analyze_plan_request, analyze_plan_response, config_request,
};
pub use self::errors::{
    FetchErrorDetailsRequest, FetchErrorDetailsResponse, fetch_error_details_response,
};
pub use self::query::{
    Aggregate, DataType, Expression, Limit, Range, Relation, RelationCommon, aggregate, data_type,
    expression, relation,
};
pub use self::session::{
    CloneSessionRequest, CloneSessionResponse, GetStatusRequest, GetStatusResponse,
    get_status_request, get_status_response,
};

// ---------------------------------------------------------------------------------------------
// Shared messages
// ---------------------------------------------------------------------------------------------

/// `google.protobuf.Any`: a type URL and an encoded message, used by the `extension` fields
/// (rx §1.2, §1.3).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct Any {
    /// Field 1: the type URL, e.g. `type.googleapis.com/spark.connect.Foo`.
    #[prost(string, tag = "1")]
    pub type_url: String,
    /// Field 2: the encoded message.
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

/// `UserContext`: who issues a request (rx §1.2). `user_id` and the request's `session_id`
/// together name one server-side session (rx §5.6).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct UserContext {
    /// Field 1: the user id; part of every session and execution key (rx §5.1, §5.6).
    #[prost(string, tag = "1")]
    pub user_id: String,
    /// Field 2: the user name; informational.
    #[prost(string, tag = "2")]
    pub user_name: String,
    /// Field 999: extensions (`google.protobuf.Any`).
    #[prost(message, repeated, tag = "999")]
    pub extensions: Vec<Any>,
}

/// The `user_id` of a request's `user_context`, or `""` when absent (protobuf's default, as
/// Spark reads `getUserContext.getUserId`; rx §5.1): what every request's `user_id()` returns.
fn user_id_of(context: Option<&UserContext>) -> &str {
    context.map_or("", |u| u.user_id.as_str())
}

impl UserContext {
    /// A context with only `user_id` set (rx §1.2: `user_name` and `extensions` empty).
    pub fn new(user_id: impl Into<String>) -> Self {
        Self {
            user_id: user_id.into(),
            ..Self::default()
        }
    }
}

/// `Plan`: what an `ExecutePlan` runs (rx §1.2, field 3).
///
/// Modelled with its real oneof (`root` = 1, `command` = 2) but with the `Relation` /
/// `Command` trees kept as their encoded bytes: the wire form is identical, and this layer
/// only compares plans byte-for-byte (a duplicate `operation_id` with the same plan bytes
/// reattaches, rx §5.2).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct Plan {
    /// The `op_type` oneof; `None` for an empty plan.
    #[prost(oneof = "plan::OpType", tags = "1, 2")]
    pub op_type: Option<plan::OpType>,
}

/// Oneof types nested in [`Plan`].
pub mod plan {
    use bytes::Bytes;

    /// The branches of [`Plan::op_type`](super::Plan::op_type) (rx §1.2).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Oneof)]
    pub enum OpType {
        /// Field 1: a query (`Relation`), as its encoded bytes.
        #[prost(bytes = "bytes", tag = "1")]
        Root(Bytes),
        /// Field 2: a command (`Command`), as its encoded bytes.
        #[prost(bytes = "bytes", tag = "2")]
        Command(Bytes),
    }
}

impl Plan {
    /// A query plan whose `root` (field 1, rx §1.2) is the given encoded `Relation`.
    pub fn root(relation: impl Into<Bytes>) -> Self {
        Self {
            op_type: Some(plan::OpType::Root(relation.into())),
        }
    }

    /// A command plan whose `command` (field 2, rx §1.2) is the given encoded `Command`.
    pub fn command(command: impl Into<Bytes>) -> Self {
        Self {
            op_type: Some(plan::OpType::Command(command.into())),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ExecutePlan
// ---------------------------------------------------------------------------------------------

/// `ReattachOptions` (rx §1.2): `reattachable = true` asks for a reattachable execution.
#[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
pub struct ReattachOptions {
    /// Field 1: whether the execution can be reattached to and must end with
    /// `ResultComplete` (rx §1.2, §1.3).
    #[prost(bool, tag = "1")]
    pub reattachable: bool,
}

/// `ExecutePlanRequest`: starts an execution (rx §1.2).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ExecutePlanRequest {
    /// Field 1: the client's session id, a UUID (rx §1.2, §5.5).
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the user; `user_id` is part of the session key (rx §5.6).
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: the plan to run (see [`Plan`] for what is opaque).
    #[prost(message, optional, tag = "3")]
    pub plan: Option<Plan>,
    /// Field 4: user agent; logging only.
    #[prost(string, optional, tag = "4")]
    pub client_type: Option<String>,
    /// Field 5: request options; the execution is reattachable iff one of them carries
    /// `reattach_options.reattachable = true` (rx §1.2). See
    /// [`is_reattachable`](Self::is_reattachable).
    #[prost(message, repeated, tag = "5")]
    pub request_options: Vec<execute_plan_request::RequestOption>,
    /// Field 6: the client-chosen operation id; must be a UUID, else
    /// `INVALID_HANDLE.FORMAT`; the server generates one when absent (rx §1.2, §1.9).
    #[prost(string, optional, tag = "6")]
    pub operation_id: Option<String>,
    /// Field 7: tags for `Interrupt(TAG)`; none may be empty or contain `,` (rx §1.2).
    #[prost(string, repeated, tag = "7")]
    pub tags: Vec<String>,
    /// Field 8: the `server_side_session_id` the client saw last; a mismatch is
    /// `INVALID_HANDLE.SESSION_CHANGED` (rx §1.2, §5.5).
    #[prost(string, optional, tag = "8")]
    pub client_observed_server_side_session_id: Option<String>,
}

/// `ResultChunkingOptions` (Spark 4.1+, connect §10): whether the client accepts an Arrow
/// batch split over several responses, and the chunk size it prefers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
pub struct ResultChunkingOptions {
    /// Field 1: the server may split a large Arrow batch into chunks
    /// ([`ArrowBatch::chunk_index`](execute_plan_response::ArrowBatch::chunk_index)).
    #[prost(bool, tag = "1")]
    pub allow_arrow_batch_chunking: bool,
    /// Field 2: the chunk size the client prefers, in bytes of `ArrowBatch.data`; Spark uses
    /// it only within `[1 KiB, spark.connect.session.resultChunking.maxChunkSize]`.
    #[prost(int64, optional, tag = "2")]
    pub preferred_arrow_chunk_size: Option<i64>,
}

/// Nested types of [`ExecutePlanRequest`].
pub mod execute_plan_request {
    /// `ExecutePlanRequest.RequestOption` (rx §1.2).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct RequestOption {
        /// The `request_option` oneof.
        #[prost(oneof = "request_option::RequestOption", tags = "1, 2, 999")]
        pub request_option: Option<request_option::RequestOption>,
    }

    /// Oneof types nested in [`RequestOption`].
    pub mod request_option {
        /// The branches of `RequestOption.request_option` (rx §1.2).
        #[derive(Clone, PartialEq, Eq, Hash, ::prost::Oneof)]
        pub enum RequestOption {
            /// Field 1: reattach options.
            #[prost(message, tag = "1")]
            ReattachOptions(super::super::ReattachOptions),
            /// Field 2: result chunking options (Spark 4.1+, connect §10).
            #[prost(message, tag = "2")]
            ResultChunkingOptions(super::super::ResultChunkingOptions),
            /// Field 999: an extension option.
            #[prost(message, tag = "999")]
            Extension(super::super::Any),
        }
    }

    impl RequestOption {
        /// The option `reattach_options { reattachable }` (field 1, rx §1.2; connect §1.17).
        pub fn reattach(reattachable: bool) -> Self {
            Self {
                request_option: Some(request_option::RequestOption::ReattachOptions(
                    super::ReattachOptions { reattachable },
                )),
            }
        }

        /// The option `result_chunking_options { allow_arrow_batch_chunking,
        /// preferred_arrow_chunk_size }` (field 2, connect §10), as PySpark 4.2 sends it on
        /// every ExecutePlan (`allow` true by default).
        pub fn result_chunking(allow: bool, preferred_chunk_size: Option<i64>) -> Self {
            Self {
                request_option: Some(request_option::RequestOption::ResultChunkingOptions(
                    super::ResultChunkingOptions {
                        allow_arrow_batch_chunking: allow,
                        preferred_arrow_chunk_size: preferred_chunk_size,
                    },
                )),
            }
        }
    }
}

impl ExecutePlanRequest {
    /// The request's `ResultChunkingOptions` (connect §10), if it sent any (the last one
    /// wins). `None`: the client did not allow chunking.
    pub fn result_chunking(&self) -> Option<&ResultChunkingOptions> {
        self.request_options
            .iter()
            .rev()
            .find_map(|o| match &o.request_option {
                Some(
                    execute_plan_request::request_option::RequestOption::ResultChunkingOptions(c),
                ) => Some(c),
                _ => None,
            })
    }

    /// Whether any request option asks for a reattachable execution (rx §1.2; the server
    /// conf `spark.connect.execute.reattachable.enabled` is assumed true).
    pub fn is_reattachable(&self) -> bool {
        self.request_options.iter().any(|o| {
            matches!(
                o.request_option,
                Some(
                    execute_plan_request::request_option::RequestOption::ReattachOptions(
                        ReattachOptions { reattachable: true }
                    )
                )
            )
        })
    }

    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent (protobuf's
    /// default, as Spark reads `getUserContext.getUserId`); part of the session and execution
    /// keys (rx §5.1).
    pub fn user_id(&self) -> &str {
        user_id_of(self.user_context.as_ref())
    }
}

/// `ExecutePlanResponse`: one streamed response of `ExecutePlan` or `ReattachExecute`
/// (rx §1.3).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ExecutePlanResponse {
    /// Field 1: the echoed client session id.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 15: the server-generated id of the underlying session; constant for the
    /// session's life, on every response of every RPC (rx §1.3, connect §3).
    #[prost(string, tag = "15")]
    pub server_side_session_id: String,
    /// Field 12: the operation id, set on every response (rx §1.3).
    #[prost(string, tag = "12")]
    pub operation_id: String,
    /// Field 13: a fresh random UUID per response, set by the server (rx §1.3, §3.2).
    #[prost(string, tag = "13")]
    pub response_id: String,
    /// The `response_type` oneof (the modelled subset; see the module docs).
    #[prost(
        oneof = "execute_plan_response::ResponseType",
        tags = "2, 5, 8, 9, 10, 11, 14, 16, 17, 18, 19, 20, 21, 22, 999"
    )]
    pub response_type: Option<execute_plan_response::ResponseType>,
    /// Field 4: `Metrics`, as its encoded bytes (opaque at this layer).
    #[prost(bytes = "bytes", optional, tag = "4")]
    pub metrics: Option<Bytes>,
    /// Field 6: `ObservedMetrics`, each as its encoded bytes (opaque at this layer).
    #[prost(bytes = "bytes", repeated, tag = "6")]
    pub observed_metrics: Vec<Bytes>,
    /// Field 7: the result schema (`DataType`), as its encoded bytes (opaque at this layer).
    #[prost(bytes = "bytes", optional, tag = "7")]
    pub schema: Option<Bytes>,
}

/// Nested types of [`ExecutePlanResponse`].
pub mod execute_plan_response {
    use bytes::Bytes;

    /// `ExecutePlanResponse.ArrowBatch`: one batch of results (rx §1.3, field 2).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct ArrowBatch {
        /// Field 1: the number of rows in `data`.
        #[prost(int64, tag = "1")]
        pub row_count: i64,
        /// Field 2: Arrow IPC stream bytes.
        #[prost(bytes = "bytes", tag = "2")]
        pub data: Bytes,
        /// Field 3: the row offset of this batch in the whole result, if known.
        #[prost(int64, optional, tag = "3")]
        pub start_offset: Option<i64>,
        /// Field 4: this chunk's index in its batch, from 0, when the batch is sent in
        /// chunks (Spark 4.1+, `ResultChunkingOptions`, connect §10); every chunk carries
        /// the batch's `row_count` and `start_offset`, and `data` is a slice of the batch's
        /// Arrow IPC stream.
        #[prost(int64, optional, tag = "4")]
        pub chunk_index: Option<i64>,
        /// Field 5: how many chunks the batch was split into (the same on each chunk);
        /// unset or 0 when the batch is whole in this response (connect §10).
        #[prost(int64, optional, tag = "5")]
        pub num_chunks_in_batch: Option<i64>,
    }

    /// `ExecutePlanResponse.ResultComplete` (empty): the end-of-result marker of a
    /// reattachable execution (rx §1.3). A stream ending without it means "reattach".
    #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct ResultComplete {}

    /// `ExecutePlanResponse.ExecutionProgress`: progress report (rx §1.3, field 18).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct ExecutionProgress {
        /// Field 1: per-stage progress.
        #[prost(message, repeated, tag = "1")]
        pub stages: Vec<StageInfo>,
        /// Field 2: tasks currently running.
        #[prost(int64, tag = "2")]
        pub num_inflight_tasks: i64,
    }

    /// `ExecutionProgress.StageInfo` (rx §1.3, field 18).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct StageInfo {
        /// Field 1: the stage id.
        #[prost(int64, tag = "1")]
        pub stage_id: i64,
        /// Field 2: tasks in the stage.
        #[prost(int64, tag = "2")]
        pub num_tasks: i64,
        /// Field 3: tasks completed.
        #[prost(int64, tag = "3")]
        pub num_completed_tasks: i64,
        /// Field 4: input bytes read.
        #[prost(int64, tag = "4")]
        pub input_bytes_read: i64,
        /// Field 5: whether the stage is done.
        #[prost(bool, tag = "5")]
        pub done: bool,
    }

    /// Every branch of `ExecutePlanResponse.response_type` in Spark 4.3.0's `base.proto`
    /// (rx §1.3). The three the session layer reads are modelled; the command results it
    /// only carries are their encoded messages (same wire form as the embedded message, as
    /// in the module docs), so an engine answers each command as Spark does: for example
    /// `spark.sql()`'s `SqlCommand` with [`SqlCommandResult`](Self::SqlCommandResult), the
    /// encoded `SqlCommandResult { relation }` (Spark's `SparkConnectPlanner.handleSqlCommand`).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum ResponseType {
        /// Field 2: a result batch.
        #[prost(message, tag = "2")]
        ArrowBatch(ArrowBatch),
        /// Field 5: `SqlCommandResult`, encoded (the relation a SQL command returns).
        #[prost(bytes = "bytes", tag = "5")]
        SqlCommandResult(Bytes),
        /// Field 8: `WriteStreamOperationStartResult`, encoded.
        #[prost(bytes = "bytes", tag = "8")]
        WriteStreamOperationStartResult(Bytes),
        /// Field 9: `StreamingQueryCommandResult`, encoded.
        #[prost(bytes = "bytes", tag = "9")]
        StreamingQueryCommandResult(Bytes),
        /// Field 10: `GetResourcesCommandResult`, encoded.
        #[prost(bytes = "bytes", tag = "10")]
        GetResourcesCommandResult(Bytes),
        /// Field 11: `StreamingQueryManagerCommandResult`, encoded.
        #[prost(bytes = "bytes", tag = "11")]
        StreamingQueryManagerCommandResult(Bytes),
        /// Field 14: end of result (reattachable executions only).
        #[prost(message, tag = "14")]
        ResultComplete(ResultComplete),
        /// Field 16: `StreamingQueryListenerEventsResult`, encoded.
        #[prost(bytes = "bytes", tag = "16")]
        StreamingQueryListenerEventsResult(Bytes),
        /// Field 17: `CreateResourceProfileCommandResult`, encoded.
        #[prost(bytes = "bytes", tag = "17")]
        CreateResourceProfileCommandResult(Bytes),
        /// Field 18: a progress report.
        #[prost(message, tag = "18")]
        ExecutionProgress(ExecutionProgress),
        /// Field 19: `CheckpointCommandResult`, encoded.
        #[prost(bytes = "bytes", tag = "19")]
        CheckpointCommandResult(Bytes),
        /// Field 20: `MlCommandResult`, encoded.
        #[prost(bytes = "bytes", tag = "20")]
        MlCommandResult(Bytes),
        /// Field 21: `PipelineEventResult`, encoded.
        #[prost(bytes = "bytes", tag = "21")]
        PipelineEventResult(Bytes),
        /// Field 22: `PipelineCommandResult`, encoded.
        #[prost(bytes = "bytes", tag = "22")]
        PipelineCommandResult(Bytes),
        /// Field 999: an arbitrary result (`google.protobuf.Any`).
        #[prost(message, tag = "999")]
        Extension(super::Any),
    }
}

impl ExecutePlanResponse {
    /// A response carrying one Arrow batch; the ids are left empty (the response log fills
    /// them in, rx §3.2).
    pub fn arrow_batch(row_count: i64, data: impl Into<Bytes>) -> Self {
        Self {
            response_type: Some(execute_plan_response::ResponseType::ArrowBatch(
                execute_plan_response::ArrowBatch {
                    row_count,
                    data: data.into(),
                    start_offset: None,
                    chunk_index: None,
                    num_chunks_in_batch: None,
                },
            )),
            ..Self::default()
        }
    }

    /// A `ResultComplete` response; ids left empty (rx §1.3).
    pub fn result_complete() -> Self {
        Self {
            response_type: Some(execute_plan_response::ResponseType::ResultComplete(
                execute_plan_response::ResultComplete {},
            )),
            ..Self::default()
        }
    }

    /// Whether this response carries `ResultComplete` (rx §1.3).
    pub fn is_result_complete(&self) -> bool {
        matches!(
            self.response_type,
            Some(execute_plan_response::ResponseType::ResultComplete(_))
        )
    }

    /// The rows of the Arrow batch this response carries (`ArrowBatch.row_count`, rx §1.3;
    /// a negative count reads as 0); `None` for any other response. A batch sent in chunks
    /// counts on its first chunk only (each chunk repeats the batch's count, connect §10),
    /// so the counts of a result's responses add up to its rows.
    pub fn row_count(&self) -> Option<u64> {
        match &self.response_type {
            Some(execute_plan_response::ResponseType::ArrowBatch(batch)) => {
                if batch.chunk_index.is_some_and(|i| i > 0) {
                    return Some(0);
                }
                Some(u64::try_from(batch.row_count).unwrap_or(0))
            }
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ReattachExecute / ReleaseExecute
// ---------------------------------------------------------------------------------------------

/// `ReattachExecuteRequest`: resume a reattachable execution (rx §1.4).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct ReattachExecuteRequest {
    /// Field 1: the session; must exist (no implicit creation, rx §1.4).
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the user.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: the operation to resume; required.
    #[prost(string, tag = "3")]
    pub operation_id: String,
    /// Field 4: user agent; logging only.
    #[prost(string, optional, tag = "4")]
    pub client_type: Option<String>,
    /// Field 5: resume after this response; `None` restarts at index 1; `Some("")` is looked
    /// up as the id `""` and fails with `INVALID_CURSOR.POSITION_NOT_FOUND` (rx §1.4, §3.5).
    #[prost(string, optional, tag = "5")]
    pub last_response_id: Option<String>,
    /// Field 6: the `server_side_session_id` the client saw last (rx §5.5).
    #[prost(string, optional, tag = "6")]
    pub client_observed_server_side_session_id: Option<String>,
}

impl ReattachExecuteRequest {
    /// A ReattachExecute of `operation_id` in the session `(user_id, session_id)`, resuming
    /// after `last_response_id` (`None`: from the first response; rx §1.4, §3.5); no
    /// `client_type` and no observed server-side session id (set the fields to add them).
    pub fn new(
        session_id: impl Into<String>,
        user_id: impl Into<String>,
        operation_id: impl Into<String>,
        last_response_id: Option<String>,
    ) -> Self {
        Self {
            session_id: session_id.into(),
            user_context: Some(UserContext::new(user_id)),
            operation_id: operation_id.into(),
            last_response_id,
            ..Self::default()
        }
    }

    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent (protobuf's
    /// default, as Spark reads `getUserContext.getUserId`); part of the session and execution
    /// keys (rx §5.1).
    pub fn user_id(&self) -> &str {
        user_id_of(self.user_context.as_ref())
    }
}

/// `ReleaseExecuteRequest`: free responses up to an id, or the whole execution (rx §1.5).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct ReleaseExecuteRequest {
    /// Field 1: the session.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the user.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: the operation.
    #[prost(string, tag = "3")]
    pub operation_id: String,
    /// Field 4: user agent; logging only.
    #[prost(string, optional, tag = "4")]
    pub client_type: Option<String>,
    /// The `release` oneof (fields 5 and 6); `None` is an "unknown release type" error
    /// (rx §1.5).
    #[prost(oneof = "release_execute_request::Release", tags = "5, 6")]
    pub release: Option<release_execute_request::Release>,
    /// Field 7: the `server_side_session_id` the client saw last. Spark deliberately does not
    /// validate it for this RPC (rx §1.5).
    #[prost(string, optional, tag = "7")]
    pub client_observed_server_side_session_id: Option<String>,
}

/// Nested types of [`ReleaseExecuteRequest`].
pub mod release_execute_request {
    /// `ReleaseAll` (empty): free everything, interrupting the execution if it still runs
    /// (rx §1.5).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct ReleaseAll {}

    /// `ReleaseUntil`: free buffered responses up to and including `response_id`
    /// (rx §1.5, §3.4).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
    pub struct ReleaseUntil {
        /// Field 1: the last response id to free.
        #[prost(string, tag = "1")]
        pub response_id: String,
    }

    /// The branches of `ReleaseExecuteRequest.release` (rx §1.5).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Oneof)]
    pub enum Release {
        /// Field 5: release everything.
        #[prost(message, tag = "5")]
        ReleaseAll(ReleaseAll),
        /// Field 6: release up to and including a response.
        #[prost(message, tag = "6")]
        ReleaseUntil(ReleaseUntil),
    }
}

impl ReleaseExecuteRequest {
    /// A `ReleaseExecute(ReleaseAll)` of `operation_id` in the session `(user_id,
    /// session_id)`: frees the whole execution, interrupting it if it still runs (rx §1.5).
    pub fn release_all(
        session_id: impl Into<String>,
        user_id: impl Into<String>,
        operation_id: impl Into<String>,
    ) -> Self {
        Self {
            session_id: session_id.into(),
            user_context: Some(UserContext::new(user_id)),
            operation_id: operation_id.into(),
            release: Some(release_execute_request::Release::ReleaseAll(
                release_execute_request::ReleaseAll {},
            )),
            ..Self::default()
        }
    }

    /// A `ReleaseExecute(ReleaseUntil(response_id))` of `operation_id` in the session
    /// `(user_id, session_id)`: frees the responses up to and including `response_id`
    /// (rx §1.5, §3.4).
    pub fn release_until(
        session_id: impl Into<String>,
        user_id: impl Into<String>,
        operation_id: impl Into<String>,
        response_id: impl Into<String>,
    ) -> Self {
        Self {
            release: Some(release_execute_request::Release::ReleaseUntil(
                release_execute_request::ReleaseUntil {
                    response_id: response_id.into(),
                },
            )),
            ..Self::release_all(session_id, user_id, operation_id)
        }
    }

    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent (protobuf's
    /// default, as Spark reads `getUserContext.getUserId`); part of the session and execution
    /// keys (rx §5.1).
    pub fn user_id(&self) -> &str {
        user_id_of(self.user_context.as_ref())
    }
}

/// `ReleaseExecuteResponse` (rx §1.6).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct ReleaseExecuteResponse {
    /// Field 1: the session id.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 3: the server-side session id.
    #[prost(string, tag = "3")]
    pub server_side_session_id: String,
    /// Field 2: set when the execution was found and released; unset when it was not found
    /// (already released, abandoned, never existed) — not an error (rx §1.6).
    #[prost(string, optional, tag = "2")]
    pub operation_id: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Interrupt / ReleaseSession
// ---------------------------------------------------------------------------------------------

/// `InterruptRequest.InterruptType` (rx §1.7). Stored as a raw `i32` in
/// [`InterruptRequest::interrupt_type`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum InterruptType {
    /// 0: unspecified; rejected by the server.
    Unspecified = 0,
    /// 1: every execution of the session.
    All = 1,
    /// 2: every execution carrying [`interrupt_request::Interrupt::OperationTag`].
    Tag = 2,
    /// 3: the execution named by [`interrupt_request::Interrupt::OperationId`].
    OperationId = 3,
}

impl InterruptType {
    /// The enum value's name as spelled in the protobuf schema (rx §1.7).
    pub fn as_str_name(&self) -> &'static str {
        match self {
            Self::Unspecified => "INTERRUPT_TYPE_UNSPECIFIED",
            Self::All => "INTERRUPT_TYPE_ALL",
            Self::Tag => "INTERRUPT_TYPE_TAG",
            Self::OperationId => "INTERRUPT_TYPE_OPERATION_ID",
        }
    }

    /// Parses a schema spelling produced by [`as_str_name`](Self::as_str_name) (rx §1.7).
    pub fn from_str_name(value: &str) -> Option<Self> {
        match value {
            "INTERRUPT_TYPE_UNSPECIFIED" => Some(Self::Unspecified),
            "INTERRUPT_TYPE_ALL" => Some(Self::All),
            "INTERRUPT_TYPE_TAG" => Some(Self::Tag),
            "INTERRUPT_TYPE_OPERATION_ID" => Some(Self::OperationId),
            _ => None,
        }
    }
}

/// `InterruptRequest`: interrupt all, tagged, or one execution of a session (rx §1.7,
/// rx §5.7).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct InterruptRequest {
    /// Field 1: the session.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the user.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: user agent; logging only.
    #[prost(string, optional, tag = "3")]
    pub client_type: Option<String>,
    /// Field 4: an [`InterruptType`] as a raw `i32`.
    #[prost(enumeration = "InterruptType", tag = "4")]
    pub interrupt_type: i32,
    /// The `interrupt` oneof (fields 5 and 6).
    #[prost(oneof = "interrupt_request::Interrupt", tags = "5, 6")]
    pub interrupt: Option<interrupt_request::Interrupt>,
    /// Field 7: the `server_side_session_id` the client saw last (rx §5.5).
    #[prost(string, optional, tag = "7")]
    pub client_observed_server_side_session_id: Option<String>,
}

/// Nested types of [`InterruptRequest`].
pub mod interrupt_request {
    /// The branches of `InterruptRequest.interrupt` (rx §1.7).
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Oneof)]
    pub enum Interrupt {
        /// Field 5: the tag, for [`InterruptType::Tag`](super::InterruptType::Tag).
        #[prost(string, tag = "5")]
        OperationTag(String),
        /// Field 6: the operation id, for
        /// [`InterruptType::OperationId`](super::InterruptType::OperationId).
        #[prost(string, tag = "6")]
        OperationId(String),
    }
}

impl InterruptRequest {
    /// An Interrupt of type `ALL`: every execution of the session `(user_id, session_id)`
    /// (rx §1.7, §5.7).
    pub fn all(session_id: impl Into<String>, user_id: impl Into<String>) -> Self {
        Self {
            session_id: session_id.into(),
            user_context: Some(UserContext::new(user_id)),
            interrupt_type: InterruptType::All as i32,
            ..Self::default()
        }
    }

    /// An Interrupt of type `TAG`: the executions of the session carrying `tag`
    /// (rx §1.7, §5.7).
    pub fn tag(
        session_id: impl Into<String>,
        user_id: impl Into<String>,
        tag: impl Into<String>,
    ) -> Self {
        Self {
            interrupt_type: InterruptType::Tag as i32,
            interrupt: Some(interrupt_request::Interrupt::OperationTag(tag.into())),
            ..Self::all(session_id, user_id)
        }
    }

    /// An Interrupt of type `OPERATION_ID`: the execution `operation_id` of the session
    /// (rx §1.7, §5.7).
    pub fn operation(
        session_id: impl Into<String>,
        user_id: impl Into<String>,
        operation_id: impl Into<String>,
    ) -> Self {
        Self {
            interrupt_type: InterruptType::OperationId as i32,
            interrupt: Some(interrupt_request::Interrupt::OperationId(
                operation_id.into(),
            )),
            ..Self::all(session_id, user_id)
        }
    }

    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent (protobuf's
    /// default, as Spark reads `getUserContext.getUserId`); part of the session and execution
    /// keys (rx §5.1).
    pub fn user_id(&self) -> &str {
        user_id_of(self.user_context.as_ref())
    }
}

/// `InterruptResponse` (rx §1.7).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct InterruptResponse {
    /// Field 1: the session id.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the operation ids whose runner this call interrupted (rx §5.7).
    #[prost(string, repeated, tag = "2")]
    pub interrupted_ids: Vec<String>,
    /// Field 3: the server-side session id.
    #[prost(string, tag = "3")]
    pub server_side_session_id: String,
}

/// `ReleaseSessionRequest`: close a session and abandon its executions (rx §1.7, §5.6).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct ReleaseSessionRequest {
    /// Field 1: the session.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the user.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: user agent; logging only.
    #[prost(string, optional, tag = "3")]
    pub client_type: Option<String>,
    /// Field 4: allow a later request to recreate the session instead of tombstoning it
    /// (rx §1.7, SPARK-50710).
    #[prost(bool, tag = "4")]
    pub allow_reconnect: bool,
}

impl ReleaseSessionRequest {
    /// A ReleaseSession of `(user_id, session_id)`; `allow_reconnect` lets a later request
    /// recreate the session instead of meeting its tombstone (rx §1.7, §5.6, SPARK-50710).
    pub fn new(
        session_id: impl Into<String>,
        user_id: impl Into<String>,
        allow_reconnect: bool,
    ) -> Self {
        Self {
            session_id: session_id.into(),
            user_context: Some(UserContext::new(user_id)),
            allow_reconnect,
            ..Self::default()
        }
    }

    /// The `user_id` of [`user_context`](Self::user_context), or `""` when absent (rx §5.1).
    pub fn user_id(&self) -> &str {
        user_id_of(self.user_context.as_ref())
    }
}

/// `ReleaseSessionResponse` (rx §1.7).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct ReleaseSessionResponse {
    /// Field 1: the session id.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the server-side session id.
    #[prost(string, tag = "2")]
    pub server_side_session_id: String,
}

/// Parses a handle (a session, operation or response id) in the one form Spark accepts:
/// hyphenated, 36 characters, 8-4-4-4-12 hexadecimal digits in either case (Java's
/// `UUID.fromString` as Spark uses it, rx §1.9). The braced, URN and unhyphenated
/// spellings the `uuid` crate also reads are not handles.
pub(crate) fn parse_uuid(s: &str) -> Option<uuid::Uuid> {
    if s.len() != 36 {
        return None;
    }
    uuid::Uuid::try_parse(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn execute_plan_request_field_numbers() {
        let req = ExecutePlanRequest {
            session_id: "s".into(),
            operation_id: Some("o".into()),
            tags: vec!["t".into()],
            client_observed_server_side_session_id: Some("x".into()),
            request_options: vec![execute_plan_request::RequestOption::reattach(true)],
            plan: Some(Plan::root(Bytes::from_static(b"\x01"))),
            ..Default::default()
        };
        let buf = req.encode_to_vec();
        // field 1 string "s"
        assert_eq!(&buf[..3], &[0x0a, 1, b's']);
        // plan: field 3, len 3, inner field 1 len 1 0x01
        assert!(buf.windows(5).any(|w| w == [0x1a, 3, 0x0a, 1, 1]));
        // request option: field 5 { field 1 { field 1 = true } }
        assert!(buf.windows(6).any(|w| w == [0x2a, 4, 0x0a, 2, 0x08, 1]));
        // operation id: field 6
        assert!(buf.windows(3).any(|w| w == [0x32, 1, b'o']));
        // tags: field 7
        assert!(buf.windows(3).any(|w| w == [0x3a, 1, b't']));
        // client_observed: field 8
        assert!(buf.windows(3).any(|w| w == [0x42, 1, b'x']));
        let back = ExecutePlanRequest::decode(buf.as_slice()).unwrap();
        assert_eq!(back, req);
        assert!(back.is_reattachable());
    }

    #[test]
    fn result_complete_is_field_14() {
        let r = ExecutePlanResponse::result_complete();
        assert_eq!(r.encode_to_vec(), vec![0x72, 0]);
        assert!(r.is_result_complete());
        let a = ExecutePlanResponse::arrow_batch(1, Bytes::from_static(b"z"));
        assert_eq!(a.encode_to_vec()[0], 0x12);
        assert!(!a.is_result_complete());
    }

    #[test]
    fn release_oneof_tags() {
        let all = ReleaseExecuteRequest {
            release: Some(release_execute_request::Release::ReleaseAll(
                release_execute_request::ReleaseAll {},
            )),
            ..Default::default()
        };
        assert_eq!(all.encode_to_vec(), vec![0x2a, 0]);
        let until = ReleaseExecuteRequest {
            release: Some(release_execute_request::Release::ReleaseUntil(
                release_execute_request::ReleaseUntil {
                    response_id: "r".into(),
                },
            )),
            ..Default::default()
        };
        assert_eq!(until.encode_to_vec(), vec![0x32, 3, 0x0a, 1, b'r']);
    }

    #[test]
    fn release_response_optional_operation_id() {
        let unset = ReleaseExecuteResponse::default();
        assert!(unset.encode_to_vec().is_empty());
        let set = ReleaseExecuteResponse {
            operation_id: Some(String::new()),
            ..Default::default()
        };
        // explicit presence: field 2 with empty string is still encoded
        assert_eq!(set.encode_to_vec(), vec![0x12, 0]);
    }

    #[test]
    fn reattach_last_response_id_presence() {
        let empty = ReattachExecuteRequest {
            last_response_id: Some(String::new()),
            ..Default::default()
        };
        let back = ReattachExecuteRequest::decode(empty.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back.last_response_id.as_deref(), Some(""));
        let none = ReattachExecuteRequest::default();
        let back = ReattachExecuteRequest::decode(none.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back.last_response_id, None);
    }

    #[test]
    fn interrupt_fields() {
        let r = InterruptRequest {
            interrupt_type: InterruptType::OperationId as i32,
            interrupt: Some(interrupt_request::Interrupt::OperationId("o".into())),
            ..Default::default()
        };
        assert_eq!(r.encode_to_vec(), vec![0x20, 3, 0x32, 1, b'o']);
        assert_eq!(
            InterruptType::from_str_name(InterruptType::Tag.as_str_name()),
            Some(InterruptType::Tag)
        );
    }
}
