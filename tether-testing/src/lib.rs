//! Test support for tether's own suites and for code built on tether: a crate of its own
//! beside the library (not published; not part of the protocol API, not covered by semver).
//!
//! One place for what a test of a session protocol needs, in the manner of h2's
//! `h2-support` and `rustls-test`:
//!
//! - [`fixtures`]: the message fixtures of both protocols (an `Init`, an `InitResponse`,
//!   tagged batches, the terminal responses, Spark Connect requests) and the assertions on
//!   them. Every suite builds its messages here, so a fixture is written once.
//! - [`connect`]: Spark Connect request builders for a user and a session, and an execution
//!   manager on a manual clock.
//! - [`script`]: scripted peers, an engine end and a worker end driven by an expect/reply
//!   script over an in-memory [`Connection`](tether::connection::Connection), for the tests
//!   that must send what no compliant peer sends (udf §8's scenarios).
//! - [`echo`]: the reference echo worker of udf §2.1 as a `Udf`, for any transport.
//! - [`pair`]: an [`EngineCore`](tether::worker::engine::EngineCore) ×
//!   [`WorkerCore`](tether::worker::endpoint::WorkerCore) pair under simulated time, after
//!   quinn-proto's `Pair`: both sides' udf §2 / §4 rules checked against each other with no
//!   I/O and no clock.
//! - [`fault`]: fault injection at the typed-message level (a `Connection` wrapper) and at
//!   the byte level (an `AsyncRead` / `AsyncWrite` wrapper).
//! - [`metrics`]: what tether's metrics added up to, read from a debugging recorder.
//!
//! Use it only for tests, under `[dev-dependencies]` by path or git:
//! `tether-testing = { path = "…/tether-testing" }`.

pub mod connect;
pub mod echo;
pub mod fault;
pub mod fixtures;
pub mod metrics;
pub mod pair;
pub mod script;

/// The environment variable that sets how many cases each model test runs: the property
/// models of the engine and worker cores (udf §4, §8) and of the execution side (rx §3, §5,
/// §7). Unset, each model runs its own default of a few hundred cases; `TETHER_MODEL_CASES=100000`
/// runs them deep. Unlike `PROPTEST_CASES` it reaches tether's models only, not every
/// proptest in the build.
pub const MODEL_CASES_VAR: &str = "TETHER_MODEL_CASES";

/// How many cases a model test runs: [`MODEL_CASES_VAR`] when it is set to a positive
/// number, else `default` (the model's own few hundred cases; udf §8, rx §7).
///
/// # Panics
///
/// When the variable is set but is not a positive integer, so a typo never runs a deep
/// model silently at its default depth.
pub fn model_cases(default: u32) -> u32 {
    match std::env::var(MODEL_CASES_VAR) {
        Err(_) => default,
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(n) if n > 0 => n,
            _ => panic!("{MODEL_CASES_VAR}={text:?} is not a positive number of cases"),
        },
    }
}
