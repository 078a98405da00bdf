//! gRPC adapters for Spark's own services (tonic): the UDF worker service (feature `grpc`)
//! and Spark Connect (feature `spark-connect`).
//!
//! - `udf_grpc` (feature `grpc`): the official `org.apache.spark.udf.worker.UdfWorker` service (udf §1.1,
//!   udf §1.7, §6.4) on both sides. The engine side opens one HTTP/2 channel per worker over its
//!   Unix socket and one `Execute` stream per session on it
//!   (`udf_grpc::GrpcChannel`, `udf_grpc::GrpcTransport`);
//!   the worker side serves the service on its `--connection` path and hands each `Execute`
//!   stream to [`endpoint::serve`](crate::worker::endpoint::serve) or any other handler
//!   (`udf_grpc::WorkerService`, `udf_grpc::WorkerServer`).
//!
//! - `connect` (feature `spark-connect`): Spark Connect's `SparkConnectService` over the execution layer
//!   (rx §1, connect §1–§4).
//!
//! (Plain names, not links: each module exists only with its feature.)
//!
//! The UDF service glue is written by hand against tonic's codegen API (no `protoc`, no build
//! script): the message types are tether's own prost types in [`crate::wire`], which carry
//! the official field numbers.

#[cfg(feature = "spark-connect")]
pub mod connect;
#[cfg(feature = "grpc")]
pub mod udf_grpc;
