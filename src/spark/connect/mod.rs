//! Spark Connect over gRPC (feature `spark-connect`): a tonic service over
//! [`ExecutionManager`](crate::execution::ExecutionManager) that a Rust Spark Connect server
//! plugs its query engine into, and a tonic client for
//! [`ReattachingStream`](crate::execution::client::ReattachingStream) (rx §1, connect §1–§4).
//!
//! The gRPC glue is generated at build time from the hand-written messages of
//! [`wire::connect`](crate::wire::connect) (no `.proto` file is read). The served methods
//! are ExecutePlan, ReattachExecute, ReleaseExecute, Interrupt, ReleaseSession, Config,
//! AnalyzePlan, FetchErrorDetails (connect §8), AddArtifacts and ArtifactStatus
//! ([`ArtifactStore`]), CloneSession and GetStatus (connect §14, §15): all twelve of Spark
//! 4.3.0's `SparkConnectService`; a method added later answers `UNIMPLEMENTED`. Results of
//! any size go out in chunks when the client allows it (connect §10), admission caps the
//! executions running at once ([`AdmissionConfig`](crate::execution::AdmissionConfig),
//! connect §11), and the correlation headers reach the spans and events (connect §13).
//!
//! [`ConnectServer`] serves it: TLS and mutual TLS ([`tls`], connect §7.1), the token, the
//! standard `grpc.health.v1` service ([`ConnectHealth`], connect §7.2) on the same port,
//! bounded HTTP/2 buffers ([`TransportLimits`]), metrics publishing and a graceful drain
//! ([`Drain`](crate::execution::Drain)) on a shutdown future. Spark 4.3.0's server has no
//! TLS of its own: its deployments put a proxy in front.
//!
//! # Where tether deliberately differs from Spark
//!
//! Each difference is listed once, here; everything else follows Spark 4.3.0 (the tests
//! that compare the two servers apply exactly this table).
//!
//! | case | Spark 4.3.0 | tether |
//! |---|---|---|
//! | an upper-case `operation_id` | ExecutePlan registers (and echoes) it in canonical lower case; a ReattachExecute, ReleaseExecute or Interrupt with the upper-case spelling misses it (`OPERATION_NOT_FOUND`, a no-op release; measured) | canonical lower case in every lookup, so any spelling of the UUID names the execution end to end (rx §1.9) |
//! | `ReleaseAll` after an `Interrupt` of a running execution | can fail with `SPARK_CONNECT_ILLEGAL_STATE.STATE_CONSISTENCY_EXECUTION_STATE_TRANSITION_INVALID_OPERATION_STATUS_MISMATCH` (`XXSC0`; measured) | succeeds and removes the execution (rx §5.7) |
//! | responses produced but not yet sent | unbounded | bounded (bytes and count); the producer waits (rx §3) |
//! | live executions per session | unbounded | capped (default 1 000): `EXECUTION_LIMIT_EXCEEDED`, `RESOURCE_EXHAUSTED` |
//! | executions running at once | unbounded | optionally capped, server-wide and per user, FIFO waiting, then the retryable `SERVER_BUSY` (`UNAVAILABLE`; connect §11) |
//! | a result batch larger than a message, the client not allowing chunking | sent; the client fails with gRPC's `RESOURCE_EXHAUSTED` | `ARROW_BATCH_TOO_LARGE` (`RESOURCE_EXHAUSTED`) naming the size and the way out (connect §10) |
//! | a reattach before `ResultComplete` was delivered, from a position whose successors were released | can answer an empty stream with neither an error nor `ResultComplete`, which a client reattaches to forever | `INVALID_CURSOR.POSITION_NOT_AVAILABLE`; a reattach after `ResultComplete` was delivered is still the legitimate empty stream (rx §3.5) |
//! | GetStatus right after an `Interrupt` | `OPERATION_STATE_RUNNING` until the runner notices, then `CANCELLED` (measured) | `CANCELLED` from the interrupt on: the run ends at once (connect §15.2) |
//! | conditions connect §2 did not measure (interrupt-type and tag errors) | Spark's wording | tether's wording, same condition and SQLSTATE |
//! | FetchErrorDetails' `stack_trace` | the JVM's stack, whatever `spark.sql.connect.serverStacktrace.enabled` says | none: tether has no JVM stack (connect §8.1) |
//! | the errors a session keeps for FetchErrorDetails | 20, Guava's approximate eviction (measured: it can evict more than the oldest) | `ManagerConfig::error_details_per_session` (20), exactly the oldest evicted (connect §8.1) |
//! | a stream's error delivered again after its id was fetched | the same `errorId`, now answered empty | a new `errorId`, answered with the details (connect §8.1) |
//! | a Config value containing the server's token (under a key the redaction pattern does not match) | answered | absent, as a redacted entry (connect §12.1) |
//! | `spark.connect.session.planCompression.threshold` / `.defaultAlgorithm` defaults | `10485760` / `ZSTD` | `-1` / `NONE`: tether reads no compressed plan (connect §12.2) |
//! | an artifact name Spark keeps but that is not one canonical relative path under `cache/`, `jars/`, `pyfiles/`, `archives/`, `files/` or `classes/` (`files//x`, a `..` segment that stays inside, `unknown/x`, a NUL, a backslash, `cache/` not followed by a SHA-256 in hex; measured) | kept (a NUL: `InvalidPathException`, no condition) | `INVALID_ARTIFACT_PATH` (connect §9.3) |
//! | a `cache/<hash>` artifact whose bytes have another SHA-256 | kept under the wrong name | `ARTIFACT_HASH_MISMATCH` |
//! | an `AddArtifacts` stream refused part way (a refused name, `ARTIFACT_ALREADY_EXISTS`) | keeps what it flushed before the error (measured; after a refused name, only sometimes) | keeps nothing of the stream |
//! | an `AddArtifacts` stream with no request | `UNKNOWN` without a rich status | an `IllegalArgumentException` |
//! | artifact bytes per session and per server | unbounded | bounded ([`ArtifactLimits`]): `ARTIFACT_LIMIT_EXCEEDED`, before the bytes are buffered |
//! | a server shutting down | stops with its driver: running queries fail, clients retry `UNAVAILABLE` | [`ConnectServer`] drains ([`ConnectService::drain`]): health `NOT_SERVING`, new sessions and executions refused with the retryable `SERVER_DRAINING` (`UNAVAILABLE`), running executions served until a deadline, then `OPERATION_CANCELED` (docs/deployment.md) |
//!
//! # A Spark Connect server in 60 lines
//!
//! The engine turns each ExecutePlan into a stream of responses (a first one carrying the
//! `schema`, then Arrow batches, each a complete Arrow IPC stream, connect §6.1) and answers
//! AnalyzePlan's `schema`; the service does sessions, reattach, release, stream rotation,
//! abandonment, interrupts, Config and errors. PySpark runs `spark.range(5).collect()` and
//! `toArrow()` against this one:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use arrow::array::{ArrayRef, Int64Array};
//! use arrow::{ipc::writer::StreamWriter, record_batch::RecordBatch};
//! use futures::StreamExt;
//! use prost::Message;
//! use tether::execution::{ConnectError, ExecutionManager, ManagerConfig, SparkError};
//! use tether::spark::connect::{
//!     ConnectServer, ConnectService, QueryEngine, ResponseSource, SessionContext,
//! };
//! use tether::wire::connect::{
//!     AnalyzePlanRequest, DataType, ExecutePlanRequest, ExecutePlanResponse, Relation,
//!     analyze_plan_request::Analyze, analyze_plan_response as analyzed, plan::OpType,
//!     relation::RelType,
//! };
//!
//! /// Runs `spark.range(start, end)` and nothing else: one `bigint` column `id`, in one
//! /// batch (a real engine splits its result into batches of at most
//! /// `spark.sql.execution.arrow.maxRecordsPerBatch` rows: `examples/connect_server/range.rs`).
//! struct Engine;
//!
//! fn schema() -> DataType {
//!     DataType::row([("id", DataType::long(), false)])
//! }
//!
//! impl QueryEngine for Engine {
//!     fn execute(
//!         &self,
//!         _: &SessionContext,
//!         request: &ExecutePlanRequest,
//!     ) -> Result<ResponseSource, ConnectError> {
//!         let root = match request.plan.as_ref().and_then(|p| p.op_type.as_ref()) {
//!             Some(OpType::Root(bytes)) => Relation::decode(bytes.clone()).ok(),
//!             _ => None,
//!         };
//!         let Some(RelType::Range(r)) = root.and_then(|r| r.rel_type) else {
//!             let refusal = SparkError::illegal_argument("only spark.range(start, end) runs here");
//!             return Err(refusal.into());
//!         };
//!         if r.step != 1 {
//!             return Err(SparkError::illegal_argument("only a step of 1 runs here").into());
//!         }
//!         // Every batch is a whole Arrow IPC stream (schema, record batch, end marker).
//!         let ids = Int64Array::from_iter_values(r.start.unwrap_or(0)..r.end);
//!         let ids: ArrayRef = Arc::new(ids);
//!         let batch = RecordBatch::try_from_iter_with_nullable([("id", ids, false)]).unwrap();
//!         let mut ipc = StreamWriter::try_new(Vec::new(), &batch.schema()).unwrap();
//!         ipc.write(&batch).and_then(|()| ipc.finish()).unwrap();
//!         let first = ExecutePlanResponse {
//!             schema: Some(schema().encode_to_vec().into()),
//!             ..Default::default()
//!         };
//!         let data = ipc.into_inner().unwrap();
//!         let rows = ExecutePlanResponse::arrow_batch(batch.num_rows() as i64, data);
//!         Ok(futures::stream::iter([Ok(first), Ok(rows)]).boxed())
//!     }
//!
//!     // PySpark's `toArrow()` asks for the schema first.
//!     fn analyze(
//!         &self,
//!         _: &SessionContext,
//!         request: &AnalyzePlanRequest,
//!     ) -> Result<analyzed::Result, ConnectError> {
//!         let Some(Analyze::Schema(_)) = request.analyze else {
//!             return Err(SparkError::illegal_argument("only the schema is analysed here").into());
//!         };
//!         Ok(analyzed::Result::Schema(analyzed::Schema { schema: Some(schema()) }))
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let manager = ExecutionManager::new(ManagerConfig::default());
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:15002").await?; // or port 0
//!     println!("listening on {}", listener.local_addr()?);
//!     // Ctrl-C here; an orchestrator sends SIGTERM (`tokio::signal::unix`).
//!     let stop = async {
//!         let _ = tokio::signal::ctrl_c().await;
//!     };
//!     // Health, the maintenance pass, bounded buffers; on Ctrl-C a drain (`ConnectServer`).
//!     let report = ConnectServer::new(ConnectService::new(manager, Engine))
//!         // PySpark sends a token in plaintext only to `localhost`; elsewhere serve `.tls(…)`.
//!         .token("s3cret") // clients: `sc://localhost:PORT/;token=s3cret`
//!         .serve(listener, stop)
//!         .await?;
//!     println!("{report}");
//!     Ok(())
//! }
//! ```

#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::use_self,
    reason = "generated by tonic-build"
)]
mod generated {
    include!(concat!(
        env!("OUT_DIR"),
        "/spark.connect.SparkConnectService.rs"
    ));
}

mod accepted;
mod artifacts;
mod auth;
mod chunks;
mod client;
mod config;
mod drain;
mod error_details;
mod health;
mod server;
mod service;
mod status;
pub mod tls;

pub use self::accepted::DrainConnection;
pub use self::artifacts::{
    ARTIFACT_PREFIXES, ArtifactError, ArtifactLimits, ArtifactSession, ArtifactStore,
    MemoryArtifactStore, SessionArtifacts, check_hash, check_name,
};
pub use self::auth::check_token;
pub use self::chunks::DEFAULT_MAX_CHUNK_SIZE;
pub use self::client::{ConnectClient, ConnectClientError};
pub use self::health::ConnectHealth;
pub use self::server::{CLOSE_WAIT, ConnectServer, STOP_WAIT, TransportLimits};
pub use self::service::{
    ConnectConfig, ConnectGrpcService, ConnectService, QueryEngine, ResponseSource, SPARK_VERSION,
    SessionContext, default_conf,
};
pub use self::status::to_status;

/// The gRPC service name of Spark Connect, `spark.connect.SparkConnectService` (rx §1.1).
pub const SERVICE_NAME: &str = "spark.connect.SparkConnectService";

/// Largest message the service and client accept or send: 128 MiB, Spark's
/// `spark.connect.grpc.maxInboundMessageSize` (rx §4.5; tonic's default is 4 MiB).
pub const MAX_MESSAGE_SIZE: usize = 128 * 1024 * 1024;

/// `e` and its causes, `: `-separated, leaving out a cause whose text the line already holds
/// (tonic's and hyper's wrappers repeat their cause, or say only "transport error"): how
/// the client reports a transport's error (connect §7.1), and how to print a
/// [`ConnectClientError`] or [`TlsError`](tls::TlsError) whole.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty() && !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        next = e.source();
    }
    line
}
