//! gRPC adapters for Spark's own services (feature `grpc`, tonic).
//!
//! - [`udf_grpc`]: the official `org.apache.spark.udf.worker.UdfWorker` service (udf §1.1,
//!   udf §1.7, §6.4) on both sides. The engine side opens one HTTP/2 channel per worker over its
//!   Unix socket and one `Execute` stream per session on it
//!   ([`GrpcChannel`](udf_grpc::GrpcChannel), [`GrpcTransport`](udf_grpc::GrpcTransport));
//!   the worker side serves the service on its `--connection` path and hands each `Execute`
//!   stream to [`endpoint::serve`](crate::worker::endpoint::serve) or any other handler
//!   ([`WorkerService`](udf_grpc::WorkerService), [`WorkerServer`](udf_grpc::WorkerServer)).
//!
//! The service glue is written by hand against tonic's codegen API (no `protoc`, no build
//! script): the message types are tether's own prost types in [`crate::wire`], which carry
//! the official field numbers.

pub mod udf_grpc;
