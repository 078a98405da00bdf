//! An engine and a Rust UDF worker in one process, over tether's in-memory connection.
//!
//! Runs four worker sessions and prints the `Termination` of each:
//! 1. finished: three batches in, three out, `FinishResponse` with metrics;
//! 2. cancelled midway: the engine cancels after the first batch;
//! 3. a user error: the UDF rejects a batch, the engine cancels, the outcome is `Cancelled`
//!    carrying the `UserError`;
//! 4. a generator with zero inputs: `Finish` right after init, the UDF emits its own rows.
//!
//! Run: `cargo run --example in_memory`

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tether::connection::pair;
use tether::wire::{
    CancelResponse, ExecutionError, FinishResponse, Init, UdfPayload, UdfRequest, UdfResponse,
    UdfWorkerDataFormat,
};
use tether::worker::endpoint::{EndpointConfig, Udf, serve};
use tether::worker::engine::{CountingHandle, Session, SessionConfig, Termination, WorkerHandle};

/// The worker's UDF: upper-cases text batches; "generate:N" payload makes it a generator.
#[derive(Default)]
struct TextUdf {
    generate: usize,
    rows_in: usize,
    rows_out: usize,
}

impl Udf for TextUdf {
    fn init(&mut self, init: &Init) -> Result<Option<Bytes>, ExecutionError> {
        let payload = init
            .udf
            .as_ref()
            .map(|u| u.payload.clone())
            .unwrap_or_default();
        let text = std::str::from_utf8(&payload).unwrap_or_default();
        if let Some(n) = text.strip_prefix("generate:") {
            self.generate = n
                .parse()
                .map_err(|_| ExecutionError::worker("bad generator size"))?;
        }
        Ok(None)
    }

    fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
        self.rows_in += 1;
        if batch.as_ref() == b"1/0" {
            return Err(ExecutionError::user_with_class(
                "division by zero in row 1/0",
                "DIVIDE_BY_ZERO",
            ));
        }
        out.push(Bytes::from(batch.to_ascii_uppercase()));
        self.rows_out += 1;
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
        for i in 0..self.generate {
            out.push(Bytes::from(format!("generated row {i}")));
            self.rows_out += 1;
        }
        let mut response = FinishResponse::default();
        response
            .metrics
            .insert("rows_in".into(), self.rows_in.to_string());
        response
            .metrics
            .insert("rows_out".into(), self.rows_out.to_string());
        Ok(response)
    }

    fn cancel(&mut self) -> CancelResponse {
        let mut response = CancelResponse::default();
        response
            .metrics
            .insert("rows_in".into(), self.rows_in.to_string());
        response
    }
}

type Conn = tether::connection::MemoryConnection<UdfRequest, UdfResponse>;

/// Starts a worker task and returns an engine session connected to it.
fn start() -> (
    Session<tether::worker::state::Init, Conn>,
    Arc<CountingHandle>,
) {
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(8);
    tokio::spawn(serve(worker, TextUdf::default(), EndpointConfig::default()));
    let handle = Arc::new(CountingHandle::for_one_session());
    (
        Session::new(engine, handle.clone(), SessionConfig::default()),
        handle,
    )
}

/// An error and its causes on one line (each error states itself; the cause is its
/// `source()`).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text += &format!(": {e}");
        source = e.source();
    }
    text
}

fn init(payload: &'static str) -> Init {
    Init::new(
        UdfWorkerDataFormat::Arrow,
        UdfPayload::new(Bytes::from_static(payload.as_bytes()), "text"),
    )
}

fn batches(rows: &[&'static str]) -> impl futures::Stream<Item = Bytes> + Unpin + use<> {
    futures::stream::iter(
        rows.iter()
            .map(|r| Bytes::from_static(r.as_bytes()))
            .collect::<Vec<_>>(),
    )
}

fn report(name: &str, outputs: &[Bytes], t: &Termination, handle: &CountingHandle) {
    let outs: Vec<_> = outputs
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    println!("{name}");
    println!("  output:      {outs:?}");
    println!("  termination: {t}");
    if let Some(metrics) = t.metrics().filter(|m| !m.is_empty()) {
        println!("  metrics:     {metrics:?}");
    }
    println!(
        "  worker:      released {} time(s), {}",
        handle.releases(),
        if handle.is_invalid() {
            "invalidated"
        } else {
            "still valid"
        }
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Finished.
    let (session, handle) = start();
    let (session, _) = session.init(init("upper")).await.map_err(|e| e.error)?;
    let mut stream = session.process(batches(&["alpha", "beta", "gamma"]));
    let mut outputs = Vec::new();
    while let Some(batch) = stream.next().await {
        outputs.push(batch?);
    }
    let t = stream.close().await;
    report("1. finished", &outputs, &t, &handle);
    assert!(matches!(t, Termination::Finished { .. }));

    // 2. Cancelled midway: one batch, then Cancel.
    let (session, handle) = start();
    let (mut session, _) = session.init(init("upper")).await.map_err(|e| e.error)?;
    session.send(Bytes::from_static(b"first")).await?;
    let first = session.recv().await?.into_iter().collect::<Vec<_>>();
    let t = session
        .cancel(Some("enough rows".into()))
        .await
        .close()
        .await;
    report("2. cancelled midway", &first, &t, &handle);
    assert!(matches!(t, Termination::Cancelled { .. }));

    // 3. A user error: the UDF fails on a row; the session ends Cancelled carrying it.
    let (session, handle) = start();
    let (session, _) = session.init(init("upper")).await.map_err(|e| e.error)?;
    let mut stream = session.process(batches(&["ok", "1/0", "never sent"]));
    let mut outputs = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(batch) => outputs.push(batch),
            Err(e) => println!("   (the consumer saw: {})", chain(&e)),
        }
    }
    let t = stream.close().await;
    report("3. user error", &outputs, &t, &handle);
    assert_eq!(
        t.execution_error().and_then(|e| e.error_class()),
        Some("DIVIDE_BY_ZERO")
    );

    // 4. A generator with zero inputs.
    let (session, handle) = start();
    let (session, _) = session
        .init(init("generate:3"))
        .await
        .map_err(|e| e.error)?;
    let outputs: Vec<Bytes> = session
        .process(futures::stream::empty())
        .map(|r| r.expect("generator output"))
        .collect()
        .await;
    let t = handle
        .last_outcome()
        .expect("finalized when the stream was dropped");
    report("4. generator with zero inputs", &outputs, &t, &handle);
    assert_eq!(outputs.len(), 3);
    Ok(())
}
