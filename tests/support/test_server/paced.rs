//! `--response-delay-ms`: the engine's responses, each produced that much later (a slow
//! query), so that tests of admission (connect §11) see executions hold their slots.

use std::time::Duration;

use futures::StreamExt;
use tether::execution::ConnectError;
use tether::spark::connect::{QueryEngine, ResponseSource, SessionContext};
use tether::wire::connect::{AnalyzePlanRequest, ExecutePlanRequest, analyze_plan_response};

use super::range::RangeEngine;

/// The range engine, its responses delayed by `delay` each (none when zero).
#[derive(Clone, Copy)]
pub(crate) struct Paced {
    pub(crate) engine: RangeEngine,
    pub(crate) delay: Duration,
}

impl QueryEngine for Paced {
    fn execute(
        &self,
        session: &SessionContext,
        request: &ExecutePlanRequest,
    ) -> Result<ResponseSource, ConnectError> {
        let source = self.engine.execute(session, request)?;
        if self.delay.is_zero() {
            return Ok(source);
        }
        let delay = self.delay;
        Ok(source
            .then(move |item| async move {
                tokio::time::sleep(delay).await;
                item
            })
            .boxed())
    }

    fn analyze(
        &self,
        session: &SessionContext,
        request: &AnalyzePlanRequest,
    ) -> Result<analyze_plan_response::Result, ConnectError> {
        self.engine.analyze(session, request)
    }

    fn statement_text(&self, request: &ExecutePlanRequest) -> Option<String> {
        self.engine.statement_text(request)
    }

    fn default_conf(&self, key: &str) -> Option<String> {
        self.engine.default_conf(key)
    }
}
