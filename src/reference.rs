//! The protocol reference: the project's notes on the two Spark protocols this crate
//! implements, shipped inside the crate as three rustdoc chapters.
//!
//! - [`udf`] — Apache Spark's external UDF worker framework: the `UdfWorker` gRPC wire
//!   protocol (Spark 4.3.0 `.proto` files), the engine-side `WorkerSession` state machine, the
//!   direct worker dispatcher, timeouts and the upstream test scenarios.
//! - [`rx`] — Spark Connect reattachable executions: `ExecutePlan` with `ReattachOptions`,
//!   `ReattachExecute`, `ReleaseExecute`, the server's execution registry and response log, and
//!   the client retry/reattach state machine (Spark 3.5 to 4.1 and upstream `master`, checked
//!   against Spark 4.3.0).
//! - [`connect`] — the Spark Connect messages beyond the reattach subset (field numbers), the
//!   errors exactly as Spark 4.3.0 sends them, sessions on the non-execution RPCs and token
//!   authentication.
//!
//! # Citation convention
//!
//! "udf §4.5" means section 4.5 of [`udf`], "rx §3.5" section 3.5 of [`rx`] and "connect §2"
//! section 2 of [`connect`]. Every doc comment in the crate cites one of these, or an upstream
//! Spark class, method or JIRA (e.g. `ExecuteResponseObserver`, SPARK-44625). Section numbers
//! are stable: a chapter may be reworded, but its sections are never renumbered.

#[doc = include_str!("../docs/reference/udf-worker-protocol.md")]
pub mod udf {}

#[doc = include_str!("../docs/reference/reattach-protocol.md")]
pub mod rx {}

#[doc = include_str!("../docs/reference/spark-connect.md")]
pub mod connect {}
