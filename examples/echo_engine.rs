//! A standalone engine for `echo_worker`: a process dispatcher spawns the worker, one
//! session runs over Spark's `UdfWorker` gRPC service on the worker's Unix socket, and the
//! echoed rows and the session's outcome are printed. Run:
//! `cargo build --features grpc --example echo_worker --example echo_engine`, then
//! `target/debug/examples/echo_engine target/debug/examples/echo_worker`.
use bytes::Bytes;
use futures::StreamExt;
use tether::spark::udf_grpc::GrpcTransport;
use tether::wire::{Init, UdfPayload, UdfWorkerDataFormat, UdfWorkerSpecification};
use tether::worker::dispatcher::{Dispatcher, DispatcherConfig};

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let worker = std::env::args().nth(1).ok_or("usage: engine WORKER")?;
    let spec = UdfWorkerSpecification::direct_unix([worker]);
    let dispatcher = Dispatcher::new(spec, GrpcTransport::default(), DispatcherConfig::default())?;
    let result = echo(&dispatcher).await;
    dispatcher.close().await; // on every path: SIGTERM to the worker, socket directory removed
    result
}

async fn echo(dispatcher: &Dispatcher<GrpcTransport>) -> Result<(), Error> {
    // Spawns `worker --id <uuid> --connection <socket>`, waits until it answers gRPC.
    let session = dispatcher.create_session().await?;
    let udf = UdfPayload::new(Bytes::new(), "echo");
    let init = Init::new(UdfWorkerDataFormat::Arrow, udf);
    let (session, _init_response) = session.init(init).await?;
    let rows = ["hello", "world"].map(Bytes::from);
    let mut output = session.process(futures::stream::iter(rows));
    while let Some(Ok(batch)) = output.next().await {
        println!("echoed {}", String::from_utf8_lossy(&batch));
    }
    println!("{}", output.close().await); // the one outcome: Finished, Cancelled, …
    Ok(())
}
