//! `Config` and `AnalyzePlan`: the two non-execution RPCs a PySpark session calls before it
//! runs anything (connect §1.1–§1.16, §3). Both get or create their session, and their
//! responses carry the session's one `server_side_session_id` (connect §3).

use super::{Plan, UserContext};
use crate::wire::connect::DataType;

/// `spark.connect.KeyValue`: one configuration entry (connect §1.11).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct KeyValue {
    /// Field 1: the key, e.g. `spark.sql.session.timeZone`.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Field 2: the value; unset for a key without one.
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

impl KeyValue {
    /// An entry with a value (connect §1.11).
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: Some(value.into()),
        }
    }
}

/// `spark.connect.ConfigRequest`: read or change the session's SQL configuration
/// (connect §1.1; Spark's `SparkConnectConfigHandler`).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ConfigRequest {
    /// Field 1: the client's session id (a UUID string).
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: who asks; with `session_id` it names the session.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: what to do.
    #[prost(message, optional, tag = "3")]
    pub operation: Option<config_request::Operation>,
    /// Field 4: the client's self-description, e.g. `_SPARK_CONNECT_PYTHON …`.
    #[prost(string, optional, tag = "4")]
    pub client_type: Option<String>,
    /// Field 8: the `server_side_session_id` the client saw last, if any (connect §3).
    #[prost(string, optional, tag = "8")]
    pub client_observed_server_side_session_id: Option<String>,
}

/// Nested types of [`ConfigRequest`] (connect §1.2–§1.9).
pub mod config_request {
    use super::KeyValue;

    /// `ConfigRequest.Operation`: one of the seven operations (connect §1.2).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Operation {
        /// The `op_type` oneof.
        #[prost(oneof = "operation::OpType", tags = "1, 2, 3, 4, 5, 6, 7")]
        pub op_type: Option<operation::OpType>,
    }

    /// Oneof types of [`Operation`].
    pub mod operation {
        /// The branches of [`Operation::op_type`](super::Operation::op_type) (connect §1.2).
        #[derive(Clone, PartialEq, ::prost::Oneof)]
        pub enum OpType {
            /// Field 1: set keys to values.
            #[prost(message, tag = "1")]
            Set(super::Set),
            /// Field 2: get values; an unknown key is an error (`SQL_CONF_NOT_FOUND`).
            #[prost(message, tag = "2")]
            Get(super::Get),
            /// Field 3: get values, with a default for each key.
            #[prost(message, tag = "3")]
            GetWithDefault(super::GetWithDefault),
            /// Field 4: get values; an unknown key answers without a value.
            #[prost(message, tag = "4")]
            GetOption(super::GetOption),
            /// Field 5: every entry, optionally under a prefix.
            #[prost(message, tag = "5")]
            GetAll(super::GetAll),
            /// Field 6: remove keys.
            #[prost(message, tag = "6")]
            Unset(super::Unset),
            /// Field 7: whether each key may be changed at run time.
            #[prost(message, tag = "7")]
            IsModifiable(super::IsModifiable),
        }
    }

    /// `ConfigRequest.Set` (connect §1.3).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Set {
        /// Field 1: the entries to set.
        #[prost(message, repeated, tag = "1")]
        pub pairs: Vec<KeyValue>,
        /// Field 2: suppress warnings about the keys.
        #[prost(bool, optional, tag = "2")]
        pub silent: Option<bool>,
    }

    /// `ConfigRequest.Get` (connect §1.4).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Get {
        /// Field 1: the keys to read.
        #[prost(string, repeated, tag = "1")]
        pub keys: Vec<String>,
    }

    /// `ConfigRequest.GetWithDefault` (connect §1.5).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct GetWithDefault {
        /// Field 1: the keys, each with its default as the value.
        #[prost(message, repeated, tag = "1")]
        pub pairs: Vec<KeyValue>,
    }

    /// `ConfigRequest.GetOption` (connect §1.6).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct GetOption {
        /// Field 1: the keys to read.
        #[prost(string, repeated, tag = "1")]
        pub keys: Vec<String>,
    }

    /// `ConfigRequest.GetAll` (connect §1.7).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct GetAll {
        /// Field 1: only keys starting with this prefix.
        #[prost(string, optional, tag = "1")]
        pub prefix: Option<String>,
    }

    /// `ConfigRequest.Unset` (connect §1.8).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Unset {
        /// Field 1: the keys to remove.
        #[prost(string, repeated, tag = "1")]
        pub keys: Vec<String>,
    }

    /// `ConfigRequest.IsModifiable` (connect §1.9).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct IsModifiable {
        /// Field 1: the keys to ask about.
        #[prost(string, repeated, tag = "1")]
        pub keys: Vec<String>,
    }
}

/// `spark.connect.ConfigResponse` (connect §1.10).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ConfigResponse {
    /// Field 1: the request's session id, echoed.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: the answered entries, in request order.
    #[prost(message, repeated, tag = "2")]
    pub pairs: Vec<KeyValue>,
    /// Field 3: warnings, e.g. about deprecated keys.
    #[prost(string, repeated, tag = "3")]
    pub warnings: Vec<String>,
    /// Field 4: the session's server-side id (connect §3).
    #[prost(string, tag = "4")]
    pub server_side_session_id: String,
}

/// `spark.connect.AnalyzePlanRequest`, the two analyses modelled: `schema` and
/// `spark_version` (connect §1.12; Spark's `SparkConnectAnalyzeHandler`). Other analyses
/// decode with [`analyze`](Self::analyze) `None`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct AnalyzePlanRequest {
    /// Field 1: the client's session id (a UUID string).
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// Field 2: who asks.
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    /// Field 3: the client's self-description.
    #[prost(string, optional, tag = "3")]
    pub client_type: Option<String>,
    /// The `analyze` oneof.
    #[prost(oneof = "analyze_plan_request::Analyze", tags = "4, 10")]
    pub analyze: Option<analyze_plan_request::Analyze>,
    /// Field 17: the `server_side_session_id` the client saw last, if any (connect §3).
    #[prost(string, optional, tag = "17")]
    pub client_observed_server_side_session_id: Option<String>,
}

/// Nested types of [`AnalyzePlanRequest`] (connect §1.13).
pub mod analyze_plan_request {
    use super::Plan;

    /// The modelled branches of
    /// [`AnalyzePlanRequest::analyze`](super::AnalyzePlanRequest::analyze) (connect §1.12).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Analyze {
        /// Field 4: the schema of a plan's result (`df.schema`, and `toArrow()` first).
        #[prost(message, tag = "4")]
        Schema(Schema),
        /// Field 10: the server's Spark version.
        #[prost(message, tag = "10")]
        SparkVersion(SparkVersion),
    }

    /// `AnalyzePlanRequest.Schema` (connect §1.13).
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Schema {
        /// Field 1: the plan to analyse.
        #[prost(message, optional, tag = "1")]
        pub plan: Option<Plan>,
    }

    /// `AnalyzePlanRequest.SparkVersion`: no fields (connect §1.12).
    #[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
    pub struct SparkVersion {}
}

/// `spark.connect.AnalyzePlanResponse` (connect §1.14).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct AnalyzePlanResponse {
    /// Field 1: the request's session id, echoed.
    #[prost(string, tag = "1")]
    pub session_id: String,
    /// The `result` oneof: the answer to the request's analysis.
    #[prost(oneof = "analyze_plan_response::Result", tags = "2, 8")]
    pub result: Option<analyze_plan_response::Result>,
    /// Field 15: the session's server-side id (connect §3).
    #[prost(string, tag = "15")]
    pub server_side_session_id: String,
}

/// Nested types of [`AnalyzePlanResponse`] (connect §1.15, §1.16).
pub mod analyze_plan_response {
    use super::DataType;

    /// The modelled branches of
    /// [`AnalyzePlanResponse::result`](super::AnalyzePlanResponse::result) (connect §1.14).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Result {
        /// Field 2: the schema.
        #[prost(message, tag = "2")]
        Schema(Schema),
        /// Field 8: the Spark version.
        #[prost(message, tag = "8")]
        SparkVersion(SparkVersion),
    }

    /// `AnalyzePlanResponse.Schema` (connect §1.15): a struct [`DataType`] of the columns.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Schema {
        /// Field 1: the schema.
        #[prost(message, optional, tag = "1")]
        pub schema: Option<DataType>,
    }

    /// `AnalyzePlanResponse.SparkVersion` (connect §1.16).
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct SparkVersion {
        /// Field 1: the version, e.g. `4.3.0`.
        #[prost(string, tag = "1")]
        pub version: String,
    }
}
