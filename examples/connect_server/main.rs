//! A small Spark Connect server on [`tether::spark::connect`]: real PySpark clients
//! (`pyspark-client`) connect to it and run `spark.range(…)`, `limit(n)` and `count()` with
//! `collect()`, `toArrow()`, `toLocalIterator()` — reattachable executions, stream
//! rotation, releases and abandonment all handled by tether's
//! [`ExecutionManager`](tether::execution::ExecutionManager).
//!
//! ```text
//! cargo run --example connect_server --features spark-connect -- --port 15002
//! python -c 'from pyspark.sql import SparkSession
//! spark = SparkSession.builder.remote("sc://localhost:15002/;user_id=me").getOrCreate()
//! print(spark.range(10).limit(3).collect(), spark.range(200000).count())'
//! ```
//!
//! # What it runs
//!
//! The query engine ([`RangeEngine`]) interprets these relations (connect §1.24–§1.32). It
//! answers any other relation or command as Spark answers one it does not run,
//! `[CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SUPPORTED]` naming it (`PROJECT(3)`), an
//! empty one as Spark does (`RELTYPE_NOT_SET`), and an aggregate other than `count()` with
//! `[UNSUPPORTED_FEATURE]` (connect §6.3):
//!
//! - `range(start, end, step[, numPartitions])`: one non-null `bigint` column `id`, split
//!   into partitions as Spark's `RangeExec` splits it (partition `i` of `p` holds the rows
//!   `i·n/p ..< (i+1)·n/p`); without `numPartitions` it uses `--default-parallelism` (2, as
//!   Spark's `local[2]`).
//! - `limit(n)` over a supported relation: the first `n` rows, in one partition (Spark's
//!   `CollectLimit`).
//! - `count()`, which PySpark sends as an `Aggregate` of `count(lit(1))` over a supported
//!   relation: one row, one non-null `bigint` column `count(1)` (or the alias's name, as for
//!   `groupBy().count()`).
//!
//! The responses of an `ExecutePlan` are those real Spark 4.3.0 sends for these plans
//! (connect §6, measured on `local[2]`): first a response carrying only `schema` (a struct
//! `DataType`), then one `ArrowBatch` per batch, each a complete Arrow IPC stream (schema
//! message, one record batch, end marker) with `row_count` and `start_offset` set. A batch
//! holds at most `--max-records-per-batch` rows (`spark.sql.execution.arrow.maxRecordsPerBatch`,
//! 10 000) and never spans two partitions; an empty result is one batch of 0 rows. The
//! service appends `ResultComplete`. Differences: no `execution_progress` and no `metrics`
//! responses.
//!
//! AnalyzePlan answers `schema` for the same plans and `spark_version`.
//!
//! A PySpark script that ends without `spark.stop()` sends one last command from its exit
//! hook and never releases it (connect §6.4): this server refuses the command, and the
//! execution stays until `--detached-timeout-ms` abandons it.
//!
//! # Output
//!
//! stdout carries two kinds of lines, for scripts and tests:
//!
//! - once, when the listener is bound: `listening on 127.0.0.1:PORT`;
//! - every `--stats-interval-ms` (and once on shutdown), the manager's counters:
//!   `stats live_executions=N sessions=N created=N released=N abandoned=N forgotten=N`, then
//!   with `--faults` the faults injected, `faults=N` in all and per kind
//!   (`fault_graceful`, `fault_disconnected`, `fault_dropped`, `fault_forgotten`)
//!   (space-separated `key=value` pairs after the word `stats`; more keys may be appended at
//!   the end).
//!
//! With `--metrics-addr HOST:PORT` it serves tether's metrics (the table in
//! `tether::observe`) as Prometheus text at `http://HOST:PORT/metrics` and prints
//! `metrics on http://HOST:PORT/metrics`; with `--events-log FILE` it appends every
//! lifecycle event of its execution manager to `FILE`, one JSON object per line, and
//! opens `FILE` again on SIGHUP (after a log rotation moved it away).
//!
//! # Drain
//!
//! On SIGTERM (or Ctrl-C) the server drains (`ConnectService::drain`, docs/deployment.md):
//! it prints `draining …`, its health goes `NOT_SERVING`, new sessions and executions get
//! the retryable `SERVER_DRAINING` (`UNAVAILABLE`), and running queries are streamed to
//! their clients until they release them (and their sessions have been quiet for
//! `SESSION_QUIET`, 1 s, so `spark.stop()` still reaches this server) or
//! `--drain-timeout-ms` passes. At the deadline every query still live is canceled: its
//! client gets `OPERATION_CANCELED` at once, what was not read is dropped, and the drain
//! waits up to `DRAIN_GRACE` (5 s) for those clients to release; a query no client has
//! been attached to for 5 s is abandoned (nobody to tell). It prints the drain's report
//! (`drained live_at_start=N canceled=N abandoned=N left=N sessions_open=N elapsed_ms=N`),
//! stops (waiting up to 5 s more for open streams; if those that are left reached no
//! handler, such as a request whose body never came, it closes their connections and waits
//! up to 2 s more), prints its last `stats` line and exits 0, or 1 if the stop cut
//! something short: executions `left` (a client still attached, not done), streams of the
//! service still open 5 s after the drain, or a second signal, which stops it at once. So a
//! SIGTERM ends the process within `--drain-timeout-ms` + 12 s (`DRAIN_GRACE` 5 s, `HARD_STOP`
//! 5 s, `CLOSE_WAIT` 2 s; 5 s more for a slow `--events-log` reader, `EVENTS_LOG_FLUSH`): give
//! an orchestrator's grace period (Kubernetes' `terminationGracePeriodSeconds`) at least
//! that. A client that already holds the rest of its result (in its own and the
//! transport's buffers) when the deadline passes reads it to the end and is not told:
//! nothing of its query was left to cancel.
//!
//! # TLS and health
//!
//! `--tls-cert PEM --tls-key PEM` serve TLS (`--tls-client-ca PEM` adds mutual TLS: clients
//! must present a certificate that CA signed); `--token` works over it unchanged. PySpark
//! connects with `sc://localhost:PORT/;use_ssl=true;token=…`, trusting the server's CA
//! through `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=ca.pem`; `examples/connect_client.rs` with
//! `--url https://localhost:PORT --tls-ca ca.pem`.
//!
//! The standard `grpc.health.v1.Health` service is served on the same port, without the
//! token: `SERVING` for `""` and for `spark.connect.SparkConnectService`.
//!
//! # Faults
//!
//! `--faults SEED` ends some response streams as a flaky network or a restarting server
//! would, so a client's recovery really runs (module `faults`).
//!
//! stderr carries the log (tracing; `RUST_LOG` overrides the default `info`: start, drain,
//! stop and errors). `RUST_LOG=info,tether::spark::connect=debug` adds one line per
//! ExecutePlan (with the interpreted plan), ReattachExecute, ReleaseExecute, Interrupt and
//! ReleaseSession: with stream rotation, several per query.

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::Int64Array;
use arrow::datatypes::{DataType as ArrowType, Field, Schema};
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use clap::Parser;
use prost::Message;
use tether::execution::{
    ConnectError, ExecutionEvent, ExecutionEventKind as EventKind, ExecutionManager, ManagerConfig,
    SparkError, StreamLimits,
};
use tether::observe::{EventReceiver, event_channel};
use tether::spark::connect::tls::ServerTls;
use tether::spark::connect::{
    QueryEngine, ResponseSource, SPARK_VERSION, SessionContext, error_chain,
};
use tether::wire::connect::{
    Aggregate, AnalyzePlanRequest, DataType, ExecutePlanRequest, ExecutePlanResponse, Limit, Range,
    aggregate, analyze_plan_request, analyze_plan_response, data_type, execute_plan_response,
    expression, plan,
};
use tokio::net::TcpListener;

mod baseline;
mod faults;
mod harness;
mod serve;
use faults::Faults;

/// A Spark Connect server for `spark.range`, `limit` and `count()`, on tether.
#[derive(Debug, Parser)]
#[command(name = "connect_server")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port to listen on; 0 binds an ephemeral port (the bound address is printed on
    /// stdout either way).
    #[arg(long, default_value_t = 15002)]
    port: u16,
    /// The pre-shared token every RPC must carry as `authorization: Bearer <token>`
    /// (Spark's `spark.connect.authenticate.token`). Default: no authentication. Must not
    /// be empty, and must be printable ASCII (what a client can send in a header).
    #[arg(long, value_parser = parse_token)]
    token: Option<String>,
    /// Serve TLS with this PEM certificate chain (the server's certificate first) and
    /// `--tls-key`; PySpark connects with `sc://HOST:PORT/;use_ssl=true`, tether's client
    /// with an `https://` URL. A file that is not a usable certificate stops the server
    /// before it listens. Default: plaintext.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Require every client to present a certificate signed by a CA of this PEM file
    /// (mutual TLS; with `--tls-cert`). A client without one is answered `UNAUTHENTICATED`
    /// saying so. Not with `--faults` (whose connections carry no certificate information).
    #[arg(
        long,
        value_name = "PEM",
        requires = "tls_cert",
        conflicts_with = "faults"
    )]
    tls_client_ca: Option<std::path::PathBuf>,
    /// End each response stream after this many milliseconds, so the client reattaches
    /// (`spark.connect.execute.reattachable.senderMaxStreamDuration`; 0 = unlimited).
    #[arg(long, default_value_t = 120_000)]
    max_stream_duration_ms: u64,
    /// End each response stream once it has sent more than this many bytes
    /// (`spark.connect.execute.reattachable.senderMaxStreamSize`; 0 = unlimited).
    #[arg(long, default_value_t = 1 << 30)]
    max_stream_bytes: u64,
    /// Abandon an execution no client has been attached to for this long
    /// (`spark.connect.execute.manager.detachedTimeout`).
    #[arg(long, default_value_t = 300_000)]
    detached_timeout_ms: u64,
    /// Period of the maintenance pass that abandons detached executions and expires idle
    /// sessions (`spark.connect.execute.manager.maintenanceInterval`).
    #[arg(long, default_value_t = 30_000)]
    maintenance_interval_ms: u64,
    /// Period of the `stats …` line on stdout.
    #[arg(long, default_value_t = 5_000)]
    stats_interval_ms: u64,
    /// On SIGTERM, how long running queries are streamed to their clients before what
    /// was not sent yet is canceled (`ConnectService::drain`'s deadline); the process ends
    /// at most 12 s after it (17 s with a slow `--events-log` reader; see "Drain" above).
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// Most rows per Arrow batch (`spark.sql.execution.arrow.maxRecordsPerBatch`).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    max_records_per_batch: u32,
    /// Partitions of a `range` that does not ask for a number (Spark's default
    /// parallelism; `local[2]` has 2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    default_parallelism: u32,
    /// Seeded fault mode: end at most 10 % of the response streams (never two of one
    /// operation in a row) gracefully without `ResultComplete`, with
    /// `[INVALID_CURSOR.DISCONNECTED]`, by dropping the connection, or (an ExecutePlan
    /// before its first response) by forgetting the operation as a restarted server would.
    #[arg(long, value_name = "SEED")]
    faults: Option<u64>,
    /// Serve the metrics (tether's, `tether::observe`) as Prometheus text at
    /// `http://HOST:PORT/metrics`, through `metrics-exporter-prometheus`; the manager's
    /// counters and gauges are published every second (the `_seconds` metrics are
    /// histograms with buckets from 1 ms to 10 min). Port 0 takes a free port; the address
    /// is printed (`metrics on http://…/metrics`).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<SocketAddr>,
    /// Append every lifecycle event of the execution manager to this file (created if
    /// missing; the server does not start if it cannot be opened), one JSON object per line
    /// (`tether::execution::ExecutionEvent`): `at_ms` (milliseconds since the server
    /// started), `kind`, `user_id`, `session_id`, `operation_id` (null for session events),
    /// `job_tag`, and `fields`, the kind's own fields; a last line
    /// `{"kind":"Dropped","count":N,"unwritten":M}` counts the events a full channel dropped
    /// (also in `tether_events_dropped_total`) and those a failed write lost (also in
    /// `connect_server_events_unwritten_total`; the first failure of a streak is logged at
    /// once). Written by a thread of its own; a stopping server waits at most 5 s for it.
    /// On SIGHUP the file is opened again at this path (created if missing), as after a log
    /// rotation renamed it; if that fails, the old file is kept and the failure logged.
    /// The streams `--faults` ends are the example's own doing, not the manager's: they are
    /// neither events nor counted in `tether_connect_errors_total`; an operation the faults
    /// forget runs again under its id, so its id has two `OperationStarted` … `OperationClosed`
    /// runs.
    #[arg(long, value_name = "FILE")]
    events_log: Option<std::path::PathBuf>,
    /// Serve the same engine without tether (module `baseline`): the baseline of
    /// `scripts/bench-connect.sh`. Not a Spark Connect server to use.
    #[arg(long, value_enum, conflicts_with_all = ["faults", "token"])]
    baseline: Option<Baseline>,
}

/// The bare baselines (module `baseline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Baseline {
    /// Plain tonic: every response in one stream.
    Bare,
    /// Plain tonic, every stream ended after one response (as a 123-byte rotation does).
    BareRotating,
}

// ---------------------------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------------------------

/// `count`, `sum`, …: the one result column, always a non-null `bigint`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    name: String,
    /// Spark named the column itself (`count(1)`): it marks the field with
    /// `{"__autoGeneratedAlias":"true"}` in both schemas.
    auto_alias: bool,
}

const AUTO_ALIAS: &str = r#"{"__autoGeneratedAlias":"true"}"#;

impl Column {
    fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            auto_alias: false,
        }
    }

    /// The result schema as Spark Connect sends it: a struct `DataType` of one non-null
    /// `bigint` field (connect §1.33–§1.35).
    fn spark_schema(&self) -> DataType {
        DataType {
            kind: Some(data_type::Kind::Struct(data_type::Struct {
                fields: vec![data_type::StructField {
                    name: self.name.clone(),
                    data_type: Some(DataType::long()),
                    nullable: false,
                    metadata: self.auto_alias.then(|| AUTO_ALIAS.to_owned()),
                }],
                type_variation_reference: 0,
            })),
        }
    }

    /// The Arrow schema of the batches, with Spark's field metadata key.
    fn arrow_schema(&self) -> Arc<Schema> {
        let mut field = Field::new(&self.name, ArrowType::Int64, false);
        if self.auto_alias {
            field = field.with_metadata(HashMap::from([(
                "SPARK::metadata::json".to_owned(),
                AUTO_ALIAS.to_owned(),
            )]));
        }
        Arc::new(Schema::new(vec![field]))
    }
}

/// The arithmetic sequence `first, first + step, …` of `len` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first: i64,
    step: i64,
    len: u64,
}

impl Run {
    /// The values `skip ..< skip + take` of the run. Every value of a run lies between
    /// the range's bounds, so none overflows.
    fn values(self, skip: u64, take: u64) -> impl Iterator<Item = i64> {
        let (first, step) = (i128::from(self.first), i128::from(self.step));
        (skip..skip + take).map(move |k| {
            i64::try_from(first + i128::from(k) * step).expect("a range value fits in i64")
        })
    }
}

/// The rows of one partition, in order.
type Partition = Vec<Run>;

/// What a plan computes: its column and its rows, by partition.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Output {
    column: Column,
    partitions: Vec<Partition>,
    /// How the plan reads, for the log.
    text: String,
}

impl Output {
    fn rows(&self) -> u128 {
        self.partitions
            .iter()
            .flatten()
            .map(|r| u128::from(r.len))
            .sum()
    }
}

fn failed(message: impl Into<String>) -> ConnectError {
    ConnectError::failed(message)
}

fn unsupported(what: &str) -> ConnectError {
    failed(format!(
        "[UNSUPPORTED_FEATURE] The feature is not supported: {what}. This server runs \
         spark.range(...), limit(n) and count() only. SQLSTATE: 0A000"
    ))
}

/// Plan bytes that do not decode: Spark's class for an unreadable plan (`InvalidPlanInput`,
/// connect §6.3), so clients classify it as Spark's own.
fn invalid_plan(what: impl std::fmt::Display) -> ConnectError {
    SparkError {
        condition: Some("CONNECT_INVALID_PLAN".to_owned()),
        text: format!("The Spark Connect plan is invalid: {what}."),
        sql_state: Some("56K00".to_owned()),
        parameters: Default::default(),
        classes: SparkError::INVALID_PLAN_INPUT
            .iter()
            .map(|c| (*c).to_owned())
            .collect(),
    }
    .into()
}

/// A oneof case this server does not run, answered as Spark answers one it does not run
/// (connect §6.3): `INVALID_ONE_OF_FIELD_NOT_SUPPORTED`, naming the case in upper case.
fn not_run(full_name: &str, cases: &[(u32, &str)], number: u32) -> ConnectError {
    let name = cases
        .iter()
        .find(|(k, _)| *k == number)
        .map_or_else(|| "UNKNOWN".to_owned(), |(_, name)| name.to_uppercase());
    SparkError::oneof_not_supported(full_name, &name, number).into()
}

/// The branches of `spark.connect.Relation.rel_type`, by field number, as named in
/// pyspark-client 4.2.0's descriptor (connect §1.24): to name a relation this server does
/// not run.
const RELATION_TYPES: &[(u32, &str)] = &[
    (2, "read"),
    (3, "project"),
    (4, "filter"),
    (5, "join"),
    (6, "set_op"),
    (7, "sort"),
    (8, "limit"),
    (9, "aggregate"),
    (10, "sql"),
    (11, "local_relation"),
    (12, "sample"),
    (13, "offset"),
    (14, "deduplicate"),
    (15, "range"),
    (16, "subquery_alias"),
    (17, "repartition"),
    (18, "to_df"),
    (19, "with_columns_renamed"),
    (20, "show_string"),
    (21, "drop"),
    (22, "tail"),
    (23, "with_columns"),
    (24, "hint"),
    (25, "unpivot"),
    (26, "to_schema"),
    (27, "repartition_by_expression"),
    (28, "map_partitions"),
    (29, "collect_metrics"),
    (30, "parse"),
    (31, "group_map"),
    (32, "co_group_map"),
    (33, "with_watermark"),
    (34, "apply_in_pandas_with_state"),
    (35, "html_string"),
    (36, "cached_local_relation"),
    (37, "cached_remote_relation"),
    (38, "common_inline_user_defined_table_function"),
    (39, "as_of_join"),
    (40, "common_inline_user_defined_data_source"),
    (41, "with_relations"),
    (42, "transpose"),
    (43, "unresolved_table_valued_function"),
    (44, "lateral_join"),
    (45, "chunked_cached_local_relation"),
    (46, "relation_changes"),
    (47, "nearest_by_join"),
    (90, "fill_na"),
    (91, "drop_na"),
    (92, "replace"),
    (100, "summary"),
    (101, "crosstab"),
    (102, "describe"),
    (103, "cov"),
    (104, "corr"),
    (105, "approx_quantile"),
    (106, "freq_items"),
    (107, "sample_by"),
    (200, "catalog"),
    (300, "ml_relation"),
    (998, "extension"),
    (999, "unknown"),
];

/// The branches of `spark.connect.Command.command_type`, by field number, as named in
/// pyspark-client 4.2.0's descriptor: to name a command this server does not run.
const COMMAND_TYPES: &[(u32, &str)] = &[
    (1, "register_function"),
    (2, "write_operation"),
    (3, "create_dataframe_view"),
    (4, "write_operation_v2"),
    (5, "sql_command"),
    (6, "write_stream_operation_start"),
    (7, "streaming_query_command"),
    (8, "get_resources_command"),
    (9, "streaming_query_manager_command"),
    (10, "register_table_function"),
    (11, "streaming_query_listener_bus_command"),
    (12, "register_data_source"),
    (13, "create_resource_profile_command"),
    (14, "checkpoint_command"),
    (15, "remove_cached_remote_relation_command"),
    (16, "merge_into_table_command"),
    (17, "ml_command"),
    (18, "execute_external_command"),
    (19, "pipeline_command"),
    (999, "extension"),
];

/// The top-level fields of an encoded protobuf message: field number and, for
/// length-delimited fields, the payload. Only the structure is read: tether's typed
/// messages ([`Range`], [`Limit`], [`Aggregate`]) decode the nodes this server runs, and
/// this finds which `rel_type` a relation has, including the ones it does not model.
fn fields(mut buf: &[u8]) -> Result<Vec<(u32, &[u8])>, ConnectError> {
    fn varint(buf: &mut &[u8]) -> Result<u64, ConnectError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = buf
                .split_first()
                .ok_or_else(|| invalid_plan("truncated varint"))?;
            *buf = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(invalid_plan("overlong varint"))
    }
    fn take<'a>(buf: &mut &'a [u8], n: u64) -> Result<&'a [u8], ConnectError> {
        let n = usize::try_from(n).map_err(|_| invalid_plan("field too long"))?;
        if buf.len() < n {
            return Err(invalid_plan("truncated field"));
        }
        let (head, rest) = buf.split_at(n);
        *buf = rest;
        Ok(head)
    }
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let number = u32::try_from(key >> 3).map_err(|_| invalid_plan("bad field number"))?;
        let payload: &[u8] = match key & 7 {
            0 => {
                varint(&mut buf)?;
                &[]
            }
            1 => take(&mut buf, 8)?,
            2 => {
                let n = varint(&mut buf)?;
                take(&mut buf, n)?
            }
            5 => take(&mut buf, 4)?,
            other => return Err(invalid_plan(format!("unsupported wire type {other}"))),
        };
        out.push((number, payload));
    }
    Ok(out)
}

/// The one length-delimited field `number` of a message (the last one wins, as protobuf
/// merges), or empty bytes (an empty message) when absent.
fn field(buf: &[u8], number: u32) -> Result<&[u8], ConnectError> {
    Ok(fields(buf)?
        .into_iter()
        .rev()
        .find(|(n, _)| *n == number)
        .map_or(&[][..], |(_, payload)| payload))
}

fn decode<M: Message + Default>(bytes: &[u8], what: &str) -> Result<M, ConnectError> {
    M::decode(bytes).map_err(|e| invalid_plan(format!("cannot decode {what}: {e}")))
}

/// The engine's settings.
#[derive(Debug, Clone, Copy)]
struct EngineConfig {
    max_records_per_batch: u32,
    default_parallelism: u32,
}

/// Interprets the encoded `spark.connect.Relation` `bytes`.
fn interpret(bytes: &[u8], config: EngineConfig) -> Result<Output, ConnectError> {
    // The rel_type oneof is every field but `common` (1).
    let Some((number, payload)) = fields(bytes)?.into_iter().rev().find(|(n, _)| *n != 1) else {
        return Err(SparkError::oneof_not_set("spark.connect.Relation", "RELTYPE_NOT_SET").into());
    };
    match number {
        15 => range(&decode::<Range>(payload, "Range")?, config),
        8 => {
            let Limit { limit, .. } = decode::<Limit>(payload, "Limit")?;
            limit_of(interpret(field(payload, 1)?, config)?, limit)
        }
        9 => {
            let agg = decode::<Aggregate>(payload, "Aggregate")?;
            count_of(interpret(field(payload, 1)?, config)?, &agg)
        }
        n => Err(not_run("spark.connect.Relation", RELATION_TYPES, n)),
    }
}

/// `spark.range`: partition `i` of `p` holds the rows `i·n/p ..< (i+1)·n/p` (Spark's
/// `RangeExec`, connect §6.2).
fn range(r: &Range, config: EngineConfig) -> Result<Output, ConnectError> {
    // Spark's own messages for these (connect §6.3).
    let Some(n) = r.row_count() else {
        return Err(
            SparkError::illegal_argument("requirement failed: step (0) cannot be 0").into(),
        );
    };
    let parts = match r.num_partitions {
        None => config.default_parallelism,
        Some(p) => u32::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| {
            ConnectError::from(SparkError::illegal_argument(
                "Positive number of partitions required",
            ))
        })?,
    };
    let (start, step) = (r.start.unwrap_or(0), r.step);
    let partitions = (0..u128::from(parts))
        .map(|i| {
            let at = |i: u128| i * u128::from(n) / u128::from(parts);
            let (lo, hi) = (at(i), at(i + 1));
            let first =
                i128::from(start) + i128::try_from(lo).expect("lo < 2^64") * i128::from(step);
            // Past the last value (an empty partition) the first value may lie beyond
            // i64; an empty run holds none.
            let first = i64::try_from(first).unwrap_or(start);
            let len = u64::try_from(hi - lo).expect("hi - lo <= n");
            vec![Run { first, step, len }]
        })
        .collect();
    Ok(Output {
        column: Column::named("id"),
        partitions,
        text: format!("range({start}, {}, {step}; {parts} partitions)", r.end),
    })
}

/// `limit(n)`: the first `n` rows in one partition (Spark's `CollectLimit`, connect §6.2).
fn limit_of(input: Output, limit: i32) -> Result<Output, ConnectError> {
    let Ok(mut left) = u64::try_from(limit) else {
        // As Spark 4.3.0 sends it, but for the logical plan it appends (connect §6.3).
        let mut error = SparkError::analysis(
            "INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE",
            format!(
                "The limit like expression \"{limit}\" is invalid. The limit expression must \
                 be equal to or greater than 0, but got {limit}."
            ),
            "42K0E",
        )
        .with_parameter("name", "limit")
        .with_parameter("expr", format!("\"{limit}\""))
        .with_parameter("v", limit.to_string());
        error.classes.insert(
            0,
            "org.apache.spark.sql.catalyst.ExtendedAnalysisException".to_owned(),
        );
        return Err(error.into());
    };
    let mut runs = Vec::new();
    for run in input.partitions.into_iter().flatten() {
        if left == 0 {
            break;
        }
        let len = run.len.min(left);
        left -= len;
        if len > 0 {
            runs.push(Run { len, ..run });
        }
    }
    Ok(Output {
        column: input.column,
        partitions: vec![runs],
        text: format!("limit({}, {limit})", input.text),
    })
}

/// `count()`: PySpark sends a global `GROUPBY` aggregate of `count(lit(1))` (connect §3).
fn count_of(input: Output, agg: &Aggregate) -> Result<Output, ConnectError> {
    let [expr] = agg.aggregate_expressions.as_slice() else {
        return Err(unsupported("an aggregate other than count()"));
    };
    if agg.group_type != aggregate::GroupType::Groupby as i32
        || !agg.grouping_expressions.is_empty()
        || !expr.is_count_of_one()
    {
        return Err(unsupported("an aggregate other than count()"));
    }
    let column = match &expr.expr_type {
        Some(expression::ExprType::Alias(alias)) if alias.name.len() == 1 => {
            Column::named(&alias.name[0])
        }
        _ => Column {
            name: "count(1)".to_owned(),
            auto_alias: true,
        },
    };
    let rows = input.rows();
    // Spark's `SparkArithmeticException` (PySpark raises its ArithmeticException).
    let count = i64::try_from(rows).map_err(|_| {
        ConnectError::from(SparkError {
            condition: Some("ARITHMETIC_OVERFLOW".to_owned()),
            text: format!("count() of {rows} rows overflows bigint."),
            sql_state: Some("22003".to_owned()),
            parameters: Default::default(),
            classes: [
                "org.apache.spark.SparkArithmeticException",
                "java.lang.ArithmeticException",
                "java.lang.RuntimeException",
                "java.lang.Exception",
                "java.lang.Throwable",
                "java.lang.Object",
            ]
            .map(str::to_owned)
            .to_vec(),
        })
    })?;
    Ok(Output {
        column,
        partitions: vec![vec![Run {
            first: count,
            step: 1,
            len: 1,
        }]],
        text: format!("count({})", input.text),
    })
}

/// Interprets the root of an ExecutePlan or AnalyzePlan plan.
fn interpret_plan(
    plan: Option<&tether::wire::connect::Plan>,
    config: EngineConfig,
) -> Result<Output, ConnectError> {
    match plan.and_then(|p| p.op_type.as_ref()) {
        Some(plan::OpType::Root(root)) => interpret(root, config),
        Some(plan::OpType::Command(command)) => match fields(command)?.last() {
            Some(&(n, _)) => Err(not_run("spark.connect.Command", COMMAND_TYPES, n)),
            None => Err(
                SparkError::oneof_not_set("spark.connect.Command", "COMMANDTYPE_NOT_SET").into(),
            ),
        },
        // Field 3 (`compressed_operation`) is not modelled; it decodes as no op_type, and is
        // answered as Spark answers an empty plan.
        None => Err(SparkError::oneof_not_set("spark.connect.Plan", "OPTYPE_NOT_SET").into()),
    }
}

// ---------------------------------------------------------------------------------------------
// Batches
// ---------------------------------------------------------------------------------------------

/// The batches of an output: at most `max` rows each, never spanning two partitions, each
/// as the runs it takes rows from (`(run, skip, take)`), with its row offset.
struct Batches {
    partitions: VecDeque<VecDeque<Run>>,
    /// Rows of the front run already batched.
    skip: u64,
    max: u64,
    offset: u64,
    sent_any: bool,
}

impl Batches {
    fn new(output: Output, max: u32) -> Self {
        Self {
            partitions: output
                .partitions
                .into_iter()
                .map(|p| p.into_iter().filter(|r| r.len > 0).collect::<VecDeque<_>>())
                .filter(|p| !p.is_empty())
                .collect(),
            skip: 0,
            max: u64::from(max),
            offset: 0,
            sent_any: false,
        }
    }
}

impl Iterator for Batches {
    /// The batch's row offset and its pieces.
    type Item = (u64, Vec<(Run, u64, u64)>);

    fn next(&mut self) -> Option<Self::Item> {
        let Some(partition) = self.partitions.front_mut() else {
            // An empty result is still one (empty) batch, as Spark sends it.
            return (!std::mem::replace(&mut self.sent_any, true)).then(|| (0, Vec::new()));
        };
        self.sent_any = true;
        let mut pieces = Vec::new();
        let mut room = self.max;
        while room > 0 {
            let Some(run) = partition.front() else { break };
            let take = (run.len - self.skip).min(room);
            pieces.push((*run, self.skip, take));
            room -= take;
            self.skip += take;
            if self.skip == run.len {
                partition.pop_front();
                self.skip = 0;
            }
        }
        if partition.is_empty() {
            self.partitions.pop_front();
        }
        let offset = self.offset;
        self.offset += self.max - room;
        Some((offset, pieces))
    }
}

/// One Arrow IPC stream: the schema message, one record batch, the end marker.
fn ipc_stream(
    schema: &Arc<Schema>,
    pieces: &[(Run, u64, u64)],
) -> Result<(i64, Bytes), ConnectError> {
    let values: Int64Array = pieces
        .iter()
        .flat_map(|&(run, skip, take)| run.values(skip, take))
        .collect();
    let rows = i64::try_from(values.len()).expect("a batch has at most u32::MAX rows");
    let arrow = |e: arrow::error::ArrowError| failed(format!("[INTERNAL_ERROR] Arrow: {e}"));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(values)]).map_err(arrow)?;
    let mut writer = StreamWriter::try_new(Vec::new(), schema).map_err(arrow)?;
    writer.write(&batch).map_err(arrow)?;
    writer.finish().map_err(arrow)?;
    Ok((rows, Bytes::from(writer.into_inner().map_err(arrow)?)))
}

/// The responses of an output: `schema`, then the batches (the service adds
/// `ResultComplete`).
fn responses(output: Output, max_records: u32) -> ResponseSource {
    let schema_response = ExecutePlanResponse {
        schema: Some(output.column.spark_schema().encode_to_vec().into()),
        ..ExecutePlanResponse::default()
    };
    let schema = output.column.arrow_schema();
    let batches = Batches::new(output, max_records).map(move |(offset, pieces)| {
        let (row_count, data) = ipc_stream(&schema, &pieces)?;
        Ok(ExecutePlanResponse {
            response_type: Some(execute_plan_response::ResponseType::ArrowBatch(
                execute_plan_response::ArrowBatch {
                    row_count,
                    data,
                    start_offset: Some(i64::try_from(offset).unwrap_or(i64::MAX)),
                },
            )),
            ..ExecutePlanResponse::default()
        })
    });
    Box::pin(futures::stream::iter(
        std::iter::once(Ok(schema_response)).chain(batches),
    ))
}

// ---------------------------------------------------------------------------------------------
// The engine
// ---------------------------------------------------------------------------------------------

/// The [`QueryEngine`]: range, limit and count, as above.
#[derive(Debug, Clone, Copy)]
struct RangeEngine {
    config: EngineConfig,
}

impl QueryEngine for RangeEngine {
    fn execute(
        &self,
        session: &SessionContext,
        request: &ExecutePlanRequest,
    ) -> Result<ResponseSource, ConnectError> {
        let operation_id = request.operation_id.as_deref().unwrap_or("");
        match interpret_plan(request.plan.as_ref(), self.config) {
            Ok(output) => {
                tracing::info!(
                    operation_id,
                    user_id = %session.user_id,
                    session_id = %session.session_id,
                    plan = %output.text,
                    rows = %output.rows(),
                    "running"
                );
                Ok(responses(output, self.config.max_records_per_batch))
            }
            Err(e) => {
                tracing::info!(operation_id, error = %e, "refused");
                Err(e)
            }
        }
    }

    fn analyze(
        &self,
        _session: &SessionContext,
        request: &AnalyzePlanRequest,
    ) -> Result<analyze_plan_response::Result, ConnectError> {
        match &request.analyze {
            Some(analyze_plan_request::Analyze::Schema(s)) => {
                let output = interpret_plan(s.plan.as_ref(), self.config)?;
                Ok(analyze_plan_response::Result::Schema(
                    analyze_plan_response::Schema {
                        schema: Some(output.column.spark_schema()),
                    },
                ))
            }
            Some(analyze_plan_request::Analyze::SparkVersion(_)) => Ok(
                analyze_plan_response::Result::SparkVersion(analyze_plan_response::SparkVersion {
                    version: SPARK_VERSION.to_owned(),
                }),
            ),
            None => Err(unsupported("this analysis (only schema and spark_version)")),
        }
    }

    fn statement_text(&self, request: &ExecutePlanRequest) -> Option<String> {
        interpret_plan(request.plan.as_ref(), self.config)
            .ok()
            .map(|output| output.text)
    }

    fn default_conf(&self, key: &str) -> Option<String> {
        match key {
            "spark.sql.execution.arrow.maxRecordsPerBatch" => {
                Some(self.config.max_records_per_batch.to_string())
            }
            _ => tether::spark::connect::default_conf(key),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

fn stats_line(manager: &ExecutionManager, faults: Option<&Faults>) -> String {
    let s = manager.stats();
    let mut line = format!(
        "stats live_executions={} sessions={} created={} released={} abandoned={} forgotten={}",
        s.executions, s.sessions, s.created, s.released, s.abandoned, s.forgotten
    );
    if let Some(faults) = faults {
        line.push(' ');
        line.push_str(&faults.stats());
    }
    line
}

/// The user of each live session and operation, as their `SessionStarted` and
/// `OperationStarted` events named it (the other events carry ids only), so that every
/// line of `--events-log` names its user and job tag.
#[derive(Default)]
struct Users {
    sessions: std::collections::HashMap<uuid::Uuid, std::sync::Arc<str>>,
    operations: std::collections::HashMap<uuid::Uuid, std::sync::Arc<str>>,
}

impl Users {
    /// The user of `e`, remembering or forgetting it as `e` opens or closes a session or
    /// an operation.
    fn of(&mut self, e: &ExecutionEvent) -> Option<std::sync::Arc<str>> {
        match (&e.kind, e.operation_id) {
            (EventKind::SessionStarted { user_id }, _) => {
                self.sessions.insert(e.session_id, user_id.clone());
                Some(user_id.clone())
            }
            (EventKind::SessionClosed { .. }, _) => self.sessions.remove(&e.session_id),
            (EventKind::OperationStarted { user_id, .. }, Some(op)) => {
                self.operations.insert(op, user_id.clone());
                Some(user_id.clone())
            }
            (EventKind::OperationClosed, Some(op)) => self.operations.remove(&op),
            (_, Some(op)) => self
                .operations
                .get(&op)
                .or_else(|| self.sessions.get(&e.session_id))
                .cloned(),
            (_, None) => self.sessions.get(&e.session_id).cloned(),
        }
    }
}

/// One lifecycle event as a JSON object (`--events-log`); `start` is the server's start.
fn event_json(
    e: &ExecutionEvent,
    users: &mut Users,
    start: std::time::Instant,
) -> serde_json::Value {
    use serde_json::json;
    let (kind, fields) = match &e.kind {
        EventKind::SessionStarted { .. } => ("SessionStarted", json!({})),
        EventKind::SessionClosed { .. } => ("SessionClosed", json!({})),
        EventKind::OperationStarted { tags, .. } => ("OperationStarted", json!({ "tags": tags })),
        EventKind::OperationAnalyzed { statement_text } => (
            "OperationAnalyzed",
            json!({ "statement_text": statement_text }),
        ),
        EventKind::OperationReadyForExecution => ("OperationReadyForExecution", json!({})),
        EventKind::OperationFinished { produced_row_count } => (
            "OperationFinished",
            json!({ "produced_row_count": produced_row_count }),
        ),
        EventKind::OperationFailed { error_message } => {
            ("OperationFailed", json!({ "error_message": error_message }))
        }
        EventKind::OperationCanceled => ("OperationCanceled", json!({})),
        EventKind::OperationClosed => ("OperationClosed", json!({})),
        EventKind::Reattached {
            resumed_at,
            replayed,
        } => (
            "Reattached",
            json!({ "resumed_at": resumed_at, "replayed": replayed }),
        ),
        EventKind::StreamRotated { reason } => {
            ("StreamRotated", json!({ "reason": format!("{reason:?}") }))
        }
        EventKind::Released { until } => ("Released", json!({ "until": until })),
        EventKind::Abandoned => ("Abandoned", json!({})),
        EventKind::TombstoneHit => ("TombstoneHit", json!({})),
        EventKind::ProducerWaiting { bytes } => ("ProducerWaiting", json!({ "bytes": bytes })),
        other => ("Other", json!({ "debug": format!("{other:?}") })),
    };
    let user_id = users.of(e);
    json!({
        "at_ms": e.at.saturating_duration_since(start).as_millis() as u64,
        "kind": kind,
        "user_id": user_id.as_deref(),
        "session_id": e.session_id.to_string(),
        "operation_id": e.operation_id.map(|o| o.to_string()),
        "job_tag": user_id.and_then(|u| e.job_tag(&u)),
        "fields": fields,
    })
}

/// The `--events-log` writer: a thread of its own (a file write blocks, and a slow reader
/// of a pipe would hold a runtime worker) that reads the manager's event channel in batches
/// every [`EVENTS_LOG_PERIOD`] (as `tether::observe` suggests at high event rates) and
/// appends them, one JSON line each. A failed write is logged at once (the first of a
/// streak) and its events counted as `unwritten`, in the metric
/// `connect_server_events_unwritten_total` and on the last line; the writer keeps reading,
/// so the channel never fills behind a broken file, and writes again once the file takes
/// them (a full disk freed). On SIGHUP it opens its path again before its next write (the
/// convention of log rotation: the old file was renamed, and its last events are in it).
struct EventsLog {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// How often the `--events-log` writer reads the channel.
const EVENTS_LOG_PERIOD: Duration = Duration::from_millis(10);

/// How long a stopping server waits for the `--events-log` writer to write what it read
/// and its last line; a reader of a pipe that slow loses the rest (said on stdout).
const EVENTS_LOG_FLUSH: Duration = Duration::from_secs(5);

impl EventsLog {
    fn start(
        mut events: EventReceiver<ExecutionEvent>,
        path: std::path::PathBuf,
        start: std::time::Instant,
    ) -> Result<Self, String> {
        use std::io::Write;
        let open = |path: &std::path::Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        };
        // Opened now: a path that cannot be written stops the server before it serves.
        let mut file = open(&path).map_err(|e| format!("--events-log {}: {e}", path.display()))?;
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| format!("a SIGHUP handler: {e}"))?;
        let reopen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reopening = reopen.clone();
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                reopening.store(true, std::sync::atomic::Ordering::Release);
            }
        });
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        metrics::describe_counter!(
            "connect_server_events_unwritten_total",
            metrics::Unit::Count,
            "Events the --events-log writer read but could not write."
        );
        let unwritten_total = metrics::counter!("connect_server_events_unwritten_total");
        let thread = std::thread::spawn(move || {
            let mut users = Users::default();
            let (mut unwritten, mut failing) = (0u64, false);
            let mut batch = Vec::new();
            loop {
                let last = stopping.load(std::sync::atomic::Ordering::Acquire);
                if reopen.swap(false, std::sync::atomic::Ordering::AcqRel) {
                    match open(&path) {
                        Ok(reopened) => {
                            file = reopened;
                            tracing::info!(path = %path.display(), "events log opened again (SIGHUP)");
                        }
                        Err(e) => tracing::error!(
                            path = %path.display(),
                            error = %e,
                            "opening the events log again failed (SIGHUP): writing on to the old file"
                        ),
                    }
                }
                let mut n = 0u64;
                while let Some(e) = events.try_recv() {
                    let _ = writeln!(batch, "{}", event_json(&e, &mut users, start));
                    n += 1;
                }
                if last {
                    let _ = writeln!(
                        batch,
                        "{}",
                        serde_json::json!({
                            "kind": "Dropped",
                            "count": events.dropped(),
                            "unwritten": unwritten + n,
                        })
                    );
                }
                if !batch.is_empty() {
                    match file.write_all(&batch).and_then(|()| file.flush()) {
                        Ok(()) => failing = false,
                        Err(e) => {
                            if !failing {
                                tracing::error!(
                                    error = %e,
                                    "writing the events log failed: its events are counted \
                                     as unwritten until a write succeeds"
                                );
                            }
                            failing = true;
                            unwritten += n;
                            unwritten_total.increment(n);
                        }
                    }
                    batch.clear();
                }
                if last {
                    if unwritten > 0 {
                        println!("events log: {unwritten} events could not be written");
                    }
                    return;
                }
                std::thread::sleep(EVENTS_LOG_PERIOD);
            }
        });
        Ok(Self { stop, thread })
    }

    /// Writes what is left and the last line, waiting at most [`EVENTS_LOG_FLUSH`].
    async fn finish(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        let waited = std::time::Instant::now();
        while !self.thread.is_finished() {
            if waited.elapsed() >= EVENTS_LOG_FLUSH {
                println!(
                    "events log: not written {} ms after the stop (its reader is too slow): \
                     the rest is lost",
                    EVENTS_LOG_FLUSH.as_millis()
                );
                return;
            }
            tokio::time::sleep(EVENTS_LOG_PERIOD).await;
        }
        if self.thread.join().is_err() {
            tracing::error!("the events log writer panicked");
        }
    }
}

/// `--token`: refuses what no client could send, or what would look like a token and
/// protect nothing (connect §4: the token travels in the `authorization` header).
fn parse_token(token: &str) -> Result<String, String> {
    tether::spark::connect::check_token(token).map(|()| token.to_owned())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

#[tokio::main]
async fn main() {
    // Start-up errors in words, with their causes (a missing file says why), exit 1.
    if let Err(e) = serve(Args::parse()).await {
        eprintln!("connect_server: {}", error_chain(e.as_ref()));
        std::process::exit(1);
    }
}

async fn serve(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    // The recorder first: the manager registers its metric handles when it is built.
    let start = std::time::Instant::now();
    if let Some(mut addr) = args.metrics_addr {
        if addr.port() == 0 {
            // The exporter binds its own listener and does not say its port: take a free one
            // now (another process could take it in between; then the exporter fails to bind).
            addr = std::net::TcpListener::bind(addr)
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
        }
        // Histograms with buckets (a summary's quantiles cannot be aggregated): 1 ms to 10 min.
        let buckets = [
            0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
        ];
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
                &buckets,
            )?
            .install()?;
        println!("metrics on http://{addr}/metrics");
    }
    let (events, events_task) = match &args.events_log {
        Some(path) => {
            let (tx, rx) = event_channel(1 << 16);
            (Some(tx), Some(EventsLog::start(rx, path.clone(), start)?))
        }
        None => (None, None),
    };
    let manager = ExecutionManager::new(ManagerConfig {
        stream: StreamLimits {
            // 0 is unlimited, as Spark's 0 (`StreamLimits`).
            max_duration: Some(Duration::from_millis(args.max_stream_duration_ms)),
            max_bytes: Some(args.max_stream_bytes),
        },
        detached_timeout: Duration::from_millis(args.detached_timeout_ms),
        maintenance_interval: Duration::from_millis(args.maintenance_interval_ms.max(1)),
        events,
        ..ManagerConfig::default()
    });
    let engine = RangeEngine {
        config: EngineConfig {
            max_records_per_batch: args.max_records_per_batch,
            default_parallelism: args.default_parallelism,
        },
    };
    // Read before the listener is bound: a bad certificate or key stops the server first.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            ServerTls::from_pem_files(cert, key, args.tls_client_ca.as_deref())
                .map_err(|e| format!("TLS: {}", error_chain(&e)))?,
        ),
        _ => None,
    };
    let drained = Arc::new(std::sync::OnceLock::new());

    let listener = TcpListener::bind(SocketAddr::new(args.host, args.port)).await?;
    let address = listener.local_addr()?;
    println!("listening on {address}");
    tracing::info!(
        %address,
        token = args.token.is_some(),
        tls = tls.is_some(),
        mutual_tls = tls.as_ref().is_some_and(ServerTls::requires_client_certificate),
        max_stream_duration_ms = args.max_stream_duration_ms,
        max_stream_bytes = args.max_stream_bytes,
        detached_timeout_ms = args.detached_timeout_ms,
        maintenance_interval_ms = args.maintenance_interval_ms,
        "Spark Connect server started"
    );

    let faults = args.faults.map(|seed| Faults::new(seed, manager.clone()));
    let stats = {
        let manager = manager.clone();
        let faults = faults.clone();
        let period = Duration::from_millis(args.stats_interval_ms.max(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                println!("{}", stats_line(&manager, faults.as_deref()));
            }
        })
    };

    let forced = if faults.is_some() || args.baseline.is_some() {
        // The test harnesses: faults injected into the service and its connections, or the
        // bare baseline without tether (module `harness`).
        harness::serve(
            &args,
            engine,
            manager.clone(),
            tls,
            listener,
            faults.clone(),
            drained.clone(),
        )
        .await?
    } else {
        // On the first signal the server drains; a second one stops it at once.
        let signaled = Arc::new(tokio::sync::Notify::new());
        let deadline = Duration::from_millis(args.drain_timeout_ms);
        let first = {
            let signaled = signaled.clone();
            async move {
                shutdown_signal().await;
                println!(
                    "draining: health NOT_SERVING, new sessions and executions refused, deadline {} ms",
                    deadline.as_millis()
                );
                signaled.notify_one();
            }
        };
        let serving = serve::serve(
            engine,
            manager.clone(),
            listener,
            tls,
            args.token.clone(),
            deadline,
            first,
        );
        tokio::select! {
            report = serving => {
                let report = report?;
                println!("{report}");
                let _ = drained.set(report);
                None
            }
            () = async { signaled.notified().await; shutdown_signal().await } => {
                println!("a second signal: stopping now");
                Some("a second signal")
            }
        }
    };
    stats.abort();
    println!("{}", stats_line(&manager, faults.as_deref()));
    if let Some(log) = events_task {
        log.finish().await;
    }
    // Exit 1 when the stop cut something short: a forced stop, or executions the drain left
    // with a client attached (its stream is cut). Canceled executions were told; abandoned
    // ones had nobody to tell.
    let left = drained.get().map_or(0, |r| r.left.len());
    if forced.is_some() || left > 0 {
        tracing::warn!(
            ?forced,
            left,
            "Spark Connect server stopped before everything ended"
        );
        std::process::exit(1);
    }
    tracing::info!("Spark Connect server stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: EngineConfig = EngineConfig {
        max_records_per_batch: 10_000,
        default_parallelism: 2,
    };

    fn batch_sizes(output: Output) -> Vec<(u64, u64)> {
        Batches::new(output, CONFIG.max_records_per_batch)
            .map(|(offset, pieces)| (offset, pieces.iter().map(|p| p.2).sum()))
            .collect()
    }

    fn r(start: i64, end: i64, step: i64, parts: Option<i32>) -> Output {
        range(
            &Range {
                start: Some(start),
                end,
                step,
                num_partitions: parts,
            },
            CONFIG,
        )
        .unwrap()
    }

    #[test]
    fn tokens_no_client_could_send_or_that_protect_nothing_are_refused() {
        assert_eq!(parse_token("s3cr3t-token").as_deref(), Ok("s3cr3t-token"));
        for bad in ["", "line\nbreak", "tab\t", " padded", "tr\u{e9}s"] {
            let e = parse_token(bad).expect_err(bad);
            assert!(e.starts_with("the token "), "{bad:?}: {e}");
        }
    }

    #[test]
    fn ranges_batch_as_spark_does() {
        // Measured on Spark 4.3.0, local[2].
        let sizes = |o| batch_sizes(o).into_iter().map(|b| b.1).collect::<Vec<_>>();
        assert_eq!(sizes(r(0, 200_000, 1, None)), vec![10_000; 20]);
        assert_eq!(sizes(r(0, 25_000, 1, Some(1))), vec![10_000, 10_000, 5_000]);
        assert_eq!(
            sizes(r(0, 25_000, 1, None)),
            vec![10_000, 2_500, 10_000, 2_500]
        );
        assert_eq!(
            sizes(r(5, 100_007, 3, None)),
            vec![10_000, 6_667, 10_000, 6_667]
        );
        assert_eq!(sizes(r(0, 3, 1, None)), vec![1, 2]);
        assert_eq!(sizes(r(0, 0, 1, None)), vec![0]);
        assert_eq!(
            sizes(limit_of(r(0, 25_000, 1, None), 20_000).unwrap()),
            vec![10_000, 10_000]
        );
        assert_eq!(
            sizes(limit_of(r(0, 200_000, 1, None), 12_345).unwrap()),
            vec![10_000, 2_345]
        );
        assert_eq!(sizes(limit_of(r(0, 10, 1, None), 0).unwrap()), vec![0]);
        let offsets: Vec<u64> = batch_sizes(r(0, 25_000, 1, None))
            .iter()
            .map(|b| b.0)
            .collect();
        assert_eq!(offsets, vec![0, 10_000, 12_500, 22_500]);
    }

    #[test]
    fn values_follow_the_step_across_partitions() {
        let values = |o: Output| -> Vec<i64> {
            o.partitions
                .into_iter()
                .flatten()
                .flat_map(|r| r.values(0, r.len))
                .collect()
        };
        assert_eq!(values(r(10, 0, -3, None)), vec![10, 7, 4, 1]);
        assert_eq!(values(r(0, 7, 2, Some(3))), vec![0, 2, 4, 6]);
        let extreme = r(i64::MAX - 2, i64::MAX, 1, Some(5));
        assert_eq!(values(extreme), vec![i64::MAX - 2, i64::MAX - 1]);
        let everything = r(i64::MIN, i64::MAX, 1, None);
        assert_eq!(everything.rows(), u128::from(u64::MAX));
    }

    #[test]
    fn plans_decode_from_their_bytes() {
        use tether::wire::connect::Relation;
        let count = Relation::count(Relation::limit(Relation::range(0, 100, 1), 30));
        let out = interpret(&count.encode_to_vec(), CONFIG).unwrap();
        assert_eq!(out.column.name, "count(1)");
        assert!(out.column.auto_alias);
        assert_eq!(
            out.partitions,
            vec![vec![Run {
                first: 30,
                step: 1,
                len: 1
            }]]
        );
        assert_eq!(out.text, "count(limit(range(0, 100, 1; 2 partitions), 30))");

        // A `project` (field 3): named in the error, as Spark names a relation it does not
        // run.
        let project = [0x1a, 0x00];
        let e = interpret(&project, CONFIG).unwrap_err().to_string();
        assert_eq!(
            e,
            "[CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SUPPORTED] The Spark Connect plan \
             is invalid. This oneOf field message in spark.connect.Relation is not supported: \
             PROJECT(3) SQLSTATE: 56K00"
        );
        let e = interpret(&[], CONFIG).unwrap_err().to_string();
        assert_eq!(
            e,
            "[CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SET] The Spark Connect plan is \
             invalid. This oneOf field in spark.connect.Relation is not set: RELTYPE_NOT_SET \
             SQLSTATE: 56K00"
        );
        let e = interpret(&[0x0a, 5, 1], CONFIG).unwrap_err().to_string();
        assert!(e.starts_with("[CONNECT_INVALID_PLAN]"), "{e}");
    }
}
