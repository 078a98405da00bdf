//! Reattachable executions (rx) and Spark Connect: every suite of the server, the client and
//! the gRPC service in one test binary, one module per former suite.
//!
//! - [`server`], [`client`]: the ported rx §7 scenarios (`rx_sNN_…`) on each side;
//! - [`server_model`], [`client_model`]: the cores against reference models;
//! - [`events`]: lifecycle events and metrics (rx §7.4 and tether's own);
//! - [`drain`]: a draining manager (docs/deployment.md);
//! - [`error_details`]: FetchErrorDetails and the sessions' stored errors (connect §8);
//! - [`memory_budget`]: the manager-wide byte budget (rx §3.1);
//! - [`connect_grpc`], [`connect_bounded`]: `ConnectService` and `ConnectClient` over gRPC;
//! - [`pyspark_connect`]: the example server as a process, read by tether's client and by
//!   the real PySpark client;
//! - [`tls`]: TLS, mutual TLS and health (connect §7), in process and on the example
//!   server, with tether's client and PySpark;
//! - [`admission`]: the cap on running executions (connect §11), on the manual clock;
//! - [`correlation`]: the correlation headers on spans and events (connect §13);
//! - [`service_limits`]: results of any size and admission with PySpark (connect §10, §11).

#[path = "../model_support/mod.rs"]
mod model_support;

mod admission;
mod client;
mod client_model;
mod connect_bounded;
mod connect_grpc;
mod correlation;
mod drain;
mod error_details;
mod events;
mod memory_budget;
mod pyspark_connect;
mod server;
mod server_model;
mod service_limits;
mod tls;
