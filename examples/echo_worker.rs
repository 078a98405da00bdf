//! A standalone UDF worker on `WorkerMain`: it sends every input batch back unchanged.
//! The engine's dispatcher starts it as `echo_worker --id <uuid> --connection <socket>`
//! and reaches it over Spark's `UdfWorker` gRPC service on that socket (the README shows
//! the engine). By hand: `cargo run --features grpc --example echo_worker -- --id w1
//! --connection /tmp/echo.sock`, stopped with Ctrl-C.
use std::process::ExitCode;

use bytes::Bytes;
use tether::spark::udf_grpc::WorkerMain;
use tether::wire::{ExecutionError, FinishResponse, Init};
use tether::worker::endpoint::Udf;

/// Sends every input batch back unchanged.
struct Echo;

impl Udf for Echo {
    fn init(&mut self, _init: &Init) -> Result<Option<Bytes>, ExecutionError> {
        Ok(None)
    }
    fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
        out.push(batch);
        Ok(())
    }
    fn finish(&mut self, _out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
        Ok(FinishResponse::default())
    }
}

fn main() -> ExitCode {
    // Parses --id/--connection, serves gRPC on the socket, stops on SIGTERM.
    WorkerMain::new(|| Echo).run()
}
