//! Worker sessions: one UDF execution on an external worker process (udf §4–§6).
//!
//! The module names say the side of the stream:
//!
//! - [`engine`]: the engine side. [`engine::Session`] (typestates over a
//!   [`Connection`](crate::connection::Connection)), its sans-IO rules in
//!   [`engine::EngineCore`], the single terminal outcome [`engine::Termination`], and the
//!   [`engine::WorkerHandle`] a session runs on, released exactly once per session.
//! - [`endpoint`]: the worker side. [`endpoint::Endpoint`] and its sans-IO rules in
//!   [`endpoint::WorkerCore`], and [`endpoint::serve`] for a whole worker.
//! - [`state`]: the typestate markers both sides share (always written `state::Init`, so
//!   that the bare name `Init` is the wire message).
//! - `dispatcher` (feature `tokio`): the engine's process dispatcher, which spawns,
//!   reaches, reuses and stops worker processes (udf §6).
//! - [`WorkerEvent`]: the lifecycle of sessions and worker processes as typed events, sent
//!   to [`engine::SessionConfig::events`] by a session made with `Session::new`, and to
//!   `dispatcher::DispatcherConfig::events` by a dispatcher, for its worker processes and
//!   its sessions (see [`observe`](crate::observe)).

#[cfg(feature = "tokio")]
pub mod dispatcher;
pub mod endpoint;
pub mod engine;
mod pump;
pub mod state;

pub use engine::events::{InvalidationReason, StopReason, WorkerEvent, WorkerEventKind};

/// Writes an error and its [`source`](std::error::Error::source) chain on one line,
/// `": "`-separated. Errors state themselves without their cause; the one-line summaries of
/// outcomes ([`engine::Termination`], [`endpoint::EndpointOutcome`]), which are not errors,
/// show the whole chain through this.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A source whose text the line already holds is left out: wrappers from other crates
        // (tonic, hyper) often print their cause inside their own message.
        let mut line = self.0.to_string();
        let mut source = self.0.source();
        while let Some(e) = source {
            let text = e.to_string();
            if !text.is_empty() && !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            source = e.source();
        }
        f.write_str(&line)
    }
}

#[cfg(test)]
mod tests {
    use super::Chain;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Leaf(&'static str);

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Wrap {
        text: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    }

    #[test]
    fn chain_leaves_out_a_source_the_line_already_holds() {
        // A foreign wrapper repeating its cause, as tonic's transport errors do.
        let e = Wrap {
            text: "status Unavailable: could not connect to /s",
            source: Box::new(Wrap {
                text: "transport error",
                source: Box::new(Wrap {
                    text: "could not connect to /s",
                    source: Box::new(Leaf("Connection refused")),
                }),
            }),
        };
        assert_eq!(
            Chain(&e).to_string(),
            "status Unavailable: could not connect to /s: transport error: Connection refused"
        );
    }
}
