//! tether's Spark Connect client against any Spark Connect server (the real Spark one, or
//! `examples/connect_server`): it reads `spark.range(rows)` through a
//! [`ReattachingStream`] over tonic ([`ConnectClient`]), decodes every Arrow batch and
//! checks that every row arrived exactly once and in order.
//!
//! ```text
//! cargo run --release --example connect_client --features spark-connect -- \
//!     --url http://127.0.0.1:15002 --rows 5000000
//! ```
//!
//! Over TLS (`examples/connect_server --tls-cert … --tls-key …`), trusting the server's CA,
//! with `--tls-cert`/`--tls-key` for a server that requires a client certificate:
//!
//! ```text
//! cargo run --release --example connect_client --features spark-connect -- \
//!     --url https://localhost:15002 --tls-ca ca.pem
//! ```
//!
//! What it checks, and fails (exit status 1) when it does not hold:
//!
//! - the rows are `0, 1, …, rows - 1`, each once, in order, in Arrow batches of one
//!   non-null `bigint` column whose `start_offset`s count the rows before them;
//! - the stream ended with `ResultComplete`, and the client sent its releases: a
//!   `ReleaseUntil` per response (rx §6.3) and one `ReleaseAll`, all answered;
//! - with `--verify-released`, the server holds nothing of it any more: a ReattachExecute
//!   of the operation afterwards gets `INVALID_HANDLE.OPERATION_NOT_FOUND` (rx §5.5);
//! - its session is released at the end (`ReleaseSession`, rx §1.7), as PySpark's
//!   `spark.stop()` does, so that a server's live sessions go back to what they were.
//!
//! It prints one line `RESULT {json}` on stdout: `rows`, `batches`, `responses`,
//! `reattaches`, `execute_plans`, `retries`, `release_until_calls`, `release_all_calls`,
//! `release_failures`, `seconds` (wall time from the ExecutePlan to the last response),
//! `rows_per_s` and `responses_per_s`. `scripts/real-spark.sh` and
//! `scripts/bench-connect.sh` read it.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use clap::Parser;
use futures::StreamExt;
use prost::Message;
use tether::execution::client::{ClientConfig, ExecutionRpc, ReattachingStream};
use tether::spark::connect::tls::ClientTls;
use tether::spark::connect::{ConnectClient, error_chain};
use tether::wire::connect::{
    ExecutePlanRequest, Plan, ReattachExecuteRequest, Relation, ReleaseSessionRequest, UserContext,
    execute_plan_response::ResponseType,
};

/// Reads `spark.range(rows)` from a Spark Connect server with tether's client.
#[derive(Debug, Parser)]
#[command(name = "connect_client")]
struct Args {
    /// The server, as an `http://host:port` URL (`https://host:port` with `--tls-ca`).
    #[arg(long, default_value = "http://127.0.0.1:15002")]
    url: String,
    /// Connect over TLS (an `https://` URL), trusting the CA certificates of this PEM file
    /// (connect §7.1).
    #[arg(long, value_name = "PEM")]
    tls_ca: Option<std::path::PathBuf>,
    /// Present this PEM client certificate to a server that requires one (mutual TLS; with
    /// `--tls-key` and `--tls-ca`).
    #[arg(long, value_name = "PEM", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Rows of `spark.range(rows)`.
    #[arg(long, default_value_t = 1_000_000)]
    rows: i64,
    /// The pre-shared token (`authorization: Bearer …`, connect §4).
    #[arg(long)]
    token: Option<String>,
    /// The `user_id` of the session.
    #[arg(long, default_value = "tether-client")]
    user_id: String,
    /// Send `NAME: VALUE` on every RPC (repeatable), as PySpark sends an extra
    /// `;NAME=VALUE` of its connection string. `--header x-spark-connect-session-id=SESSION`
    /// routes through the proxy of docs/deployment.md (`SESSION` is replaced by the
    /// session id this client uses).
    #[arg(long, value_name = "NAME=VALUE")]
    header: Vec<String>,
    /// Check afterwards that the server released the execution.
    #[arg(long)]
    verify_released: bool,
    /// Skip decoding the Arrow batches (count rows from `row_count` only): for
    /// benchmarks that compare servers, not clients.
    #[arg(long)]
    no_decode: bool,
}

#[derive(Debug, Default)]
struct Tally {
    rows: i64,
    batches: u64,
    responses: u64,
    result_complete: bool,
}

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("connect_client: {message}");
    std::process::exit(1);
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let connected = match &args.tls_ca {
        Some(ca) => {
            let identity = args.tls_cert.as_deref().zip(args.tls_key.as_deref());
            let tls = ClientTls::from_pem_files(ca, identity)
                .unwrap_or_else(|e| fail(format!("TLS: {}", error_chain(&e))));
            ConnectClient::connect_tls(&args.url, args.token.as_deref(), &tls).await
        }
        None => ConnectClient::connect(&args.url, args.token.as_deref()).await,
    };
    let mut client = connected.unwrap_or_else(|e| {
        fail(format!(
            "cannot connect to {}: {}",
            args.url,
            error_chain(&e)
        ))
    });
    let session_id = uuid::Uuid::new_v4().to_string();
    for header in &args.header {
        let Some((name, value)) = header.split_once('=') else {
            fail(format!("--header {header:?}: expected NAME=VALUE"));
        };
        let value = if value == "SESSION" {
            &session_id
        } else {
            value
        };
        client = client
            .with_header(name, value)
            .unwrap_or_else(|e| fail(format!("--header: {e}")));
    }
    let user = UserContext::new(&args.user_id);
    let request = ExecutePlanRequest {
        session_id: session_id.clone(),
        user_context: Some(user.clone()),
        plan: Some(Plan::root(Relation::range(0, args.rows, 1).encode_to_vec())),
        ..Default::default()
    };
    let client = Arc::new(client);
    let started = Instant::now();
    let mut stream = ReattachingStream::new(client.clone(), request, ClientConfig::default())
        .unwrap_or_else(|e| fail(format!("invalid request: {e}")));
    let operation_id = stream.operation_id().to_owned();
    let mut tally = Tally::default();
    while let Some(item) = stream.next().await {
        let response =
            item.unwrap_or_else(|e| fail(format!("the execution failed: {}", error_chain(&e))));
        tally.responses += 1;
        match response.response_type {
            Some(ResponseType::ArrowBatch(batch)) => {
                tally.batches += 1;
                if batch.start_offset.is_some_and(|o| o != tally.rows) {
                    fail(format!(
                        "batch {} starts at offset {:?}, after {} rows",
                        tally.batches, batch.start_offset, tally.rows
                    ));
                }
                if args.no_decode {
                    tally.rows += batch.row_count;
                    continue;
                }
                let reader = arrow::ipc::reader::StreamReader::try_new(&batch.data[..], None)
                    .unwrap_or_else(|e| fail(format!("not an Arrow IPC stream: {e}")));
                for record in reader {
                    let record = record.unwrap_or_else(|e| fail(format!("bad Arrow batch: {e}")));
                    let ids = record.column(0).as_primitive_opt::<Int64Type>();
                    let ids = ids.unwrap_or_else(|| fail("the column is not a bigint"));
                    for id in ids.values().iter() {
                        if *id != tally.rows {
                            fail(format!("row {} is {id}", tally.rows));
                        }
                        tally.rows += 1;
                    }
                }
            }
            Some(ResponseType::ResultComplete(_)) => tally.result_complete = true,
            _ => {}
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let stats = stream.stats();
    let releases = stream.close().await;
    if tally.rows != args.rows {
        fail(format!("{} rows, {} expected", tally.rows, args.rows));
    }
    if !tally.result_complete {
        fail("the stream ended without ResultComplete");
    }
    if releases.all_calls == 0 || releases.failed > 0 {
        fail(format!("releases not all answered: {releases:?}"));
    }
    if args.verify_released {
        let reattach = ReattachExecuteRequest {
            session_id: session_id.clone(),
            user_context: Some(user),
            operation_id: operation_id.clone(),
            ..Default::default()
        };
        let outcome = match client.reattach_execute(reattach).await {
            Ok(mut s) => s.next().await.transpose().map(|_| ()),
            Err(e) => Err(e),
        };
        match outcome {
            Err(e) if e.condition() == Some("INVALID_HANDLE.OPERATION_NOT_FOUND") => {}
            other => fail(format!(
                "after ReleaseAll, a reattach to {operation_id} must get OPERATION_NOT_FOUND, \
                 got {other:?}"
            )),
        }
    }
    let release = ReleaseSessionRequest::new(session_id, args.user_id.as_str(), false);
    if let Err(e) = client.release_session(release).await {
        fail(format!("ReleaseSession failed: {}", error_chain(&e)));
    }
    let result = serde_json::json!({
        "rows": tally.rows,
        "batches": tally.batches,
        "responses": tally.responses,
        "reattaches": stats.reattaches,
        "execute_plans": stats.execute_plans,
        "retries": stats.retries,
        "release_until_calls": releases.until_calls,
        "release_all_calls": releases.all_calls,
        "release_failures": releases.failed,
        "seconds": seconds,
        "rows_per_s": tally.rows as f64 / seconds,
        "responses_per_s": tally.responses as f64 / seconds,
    });
    println!("RESULT {result}");
}
