//! Worker sessions (udf): every suite of the engine and worker sides in one test binary, one
//! module per former suite (linking tonic and Arrow once instead of ten times).
//!
//! - [`core_model`], [`worker_core_model`]: the sans-IO cores against reference models;
//! - [`worker_core`]: the worker core's unit and property tests (`Init` validation, every
//!   udf §2 R6 violation row, Cancel, the deadlines, invariants over arbitrary sequences);
//! - [`pair`]: both cores under simulated time (`tether_testing::pair`);
//! - [`engine_session`], [`protocol_suite`], [`deadlines`]: the ported udf §8 scenarios and
//!   the udf §7 deadline table;
//! - [`dispatcher`]: the process dispatcher with real worker processes (this binary, run as
//!   a worker through `tests/support/tether-worker.sh`);
//! - [`events`]: the lifecycle events and metrics of sessions and of the dispatcher's
//!   worker processes;
//! - [`transport_framed`], [`transport_grpc`]: the transports end to end;
//! - [`tour_smoke`]: the tour's UDF logic in process.

#[path = "../model_support/mod.rs"]
mod model_support;

mod core_model;
mod deadlines;
mod dispatcher;
mod engine_session;
mod events;
mod pair;
mod protocol_suite;
mod tour_smoke;
mod transport_framed;
mod transport_grpc;
mod worker_core;
mod worker_core_model;
