//! The wire layer: hand-written protobuf types for Apache Spark 4.3.0's external-UDF-worker
//! protocol (proto package `org.apache.spark.udf.worker`) and a sans-IO length-delimited frame
//! codec to carry them over byte streams.
//!
//! * messages — the `Execute` stream envelopes and every message they carry, the `Manage`
//!   RPC messages and the shared enums (udf §1.2–§1.8), plus flattened views
//!   ([`RequestMessage`], [`ResponseMessage`]) that hide the two levels of nested oneofs.
//! * the worker specification a worker ships to describe how to install, start and
//!   reach it (udf §1.9).
//! * [`FrameCodec`]: each frame is a 4-byte big-endian length followed by exactly
//!   one encoded message.
//!
//! All types are derived with `prost` directly (no build script, no `protoc`). Field numbers,
//! scalar types, `optional` presence, maps and oneofs follow the shipped Spark 4.3.0 schema
//! exactly, so these messages are wire-compatible with any other implementation of it. Type
//! names are the ones `prost-build` would generate (`UDFWorkerDataFormat` becomes
//! [`UdfWorkerDataFormat`], and so on). `bytes` fields are [`bytes::Bytes`] (zero-copy when
//! decoding from a `Bytes` buffer) and `map<string, string>` fields are
//! [`BTreeMap`](std::collections::BTreeMap)s so encoding is deterministic.

mod codec;
pub mod connect;
mod messages;
mod spec;

pub use codec::{DEFAULT_MAX_FRAME_LEN, FrameCodec, FrameError};
pub use messages::*;
pub use spec::*;
