//! The README's Spark Connect client: reads `spark.range(1000000)` from any Spark Connect
//! server (the real Spark one, or `examples/connect_server`) with [`ReattachingStream`] over
//! [`ConnectClient`], and prints the row count and how often it reattached (rx §6).
//!
//! ```text
//! cargo run --features spark-connect --example range_client -- http://127.0.0.1:15002
//! ```
//!
//! [`ReattachingStream`]: tether::execution::client::ReattachingStream
//! [`ConnectClient`]: tether::spark::connect::ConnectClient
use std::sync::Arc;

use futures::StreamExt;
use prost::Message;
use tether::execution::client::{ClientConfig, ReattachingStream};
use tether::spark::connect::ConnectClient;
use tether::wire::connect::execute_plan_response::ResponseType;
use tether::wire::connect::{ExecutePlanRequest, Plan, Relation, UserContext};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).ok_or("usage: range_client URL")?;
    let client = Arc::new(ConnectClient::connect(&url, None).await?);
    let request = ExecutePlanRequest {
        session_id: uuid::Uuid::new_v4().to_string(),
        user_context: Some(UserContext::new("me")),
        plan: Some(Plan::root(Relation::range(0, 1_000_000, 1).encode_to_vec())),
        ..Default::default()
    };
    let mut stream = ReattachingStream::new(client, request, ClientConfig::default())?;
    let mut rows = 0;
    while let Some(response) = stream.next().await {
        if let Some(ResponseType::ArrowBatch(batch)) = response?.response_type {
            rows += batch.row_count;
        }
    }
    println!("{rows} rows, {} reattaches", stream.stats().reattaches);
    stream.close().await; // ReleaseAll: the server forgets the execution
    Ok(())
}
