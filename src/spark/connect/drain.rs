//! Graceful drain of a Spark Connect server (tether's own; Spark 4.3.0 has none, its
//! server stops with its driver): health `NOT_SERVING`, no new session or execution, what
//! runs served to its end until a deadline, then interrupted with Spark's error. The
//! deployment story is in `docs/deployment.md`.

use std::time::Duration;

use super::{ConnectService, QueryEngine};
use crate::execution::{DrainReport, DrainStep};

impl<E: QueryEngine> ConnectService<E> {
    /// Drains the service for a shutdown or a rolling restart (docs/deployment.md; the
    /// rule is [`Drain`](crate::execution::Drain), rx §5.1 registry): health goes
    /// `NOT_SERVING` (connect §7.2), new sessions and executions are refused with the
    /// retryable `SERVER_DRAINING`, and what is live is served until it ends or until
    /// `deadline` from now; then it is canceled (`OPERATION_CANCELED`, rx §2.2 T9), every
    /// connection accepted through [`connections`](Self::connections) is closed so that
    /// clients read that error now, and the drain waits at most
    /// [`DRAIN_GRACE`](crate::execution::DRAIN_GRACE) more. Its handlers in flight
    /// ([`rpcs_in_flight`](Self::rpcs_in_flight)) hold it too. Sleeps on the manager's
    /// clock. [`ConnectServer`](super::ConnectServer) runs it on its shutdown signal; a
    /// server of your own stops its transport afterwards.
    ///
    /// Calling it again (or on a clone) drains again, with the state as it is then. A
    /// `deadline` too far to represent (`Duration::MAX`) waits without one.
    pub async fn drain(&self, deadline: Duration) -> DrainReport {
        self.drain_with_grace(deadline, crate::execution::DRAIN_GRACE)
            .await
    }

    /// [`drain`](Self::drain) with `grace` instead of
    /// [`DRAIN_GRACE`](crate::execution::DRAIN_GRACE) ([`Drain::with_grace`](crate::execution::Drain::with_grace)).
    pub(super) async fn drain_with_grace(
        &self,
        deadline: Duration,
        grace: Duration,
    ) -> DrainReport {
        self.health().set_serving(false).await;
        let manager = self.manager();
        let clock = manager.clock().clone();
        let mut drain = manager.begin_drain(deadline).with_grace(grace);
        loop {
            match manager.step_drain(&mut drain, self.rpcs_in_flight()) {
                DrainStep::Wait(until) => clock.sleep_until(until).await,
                DrainStep::CancelAll => {
                    // Their open streams hold responses the clients have not read yet, ahead
                    // of the error: cut the connections, so the clients reattach and get the
                    // error now.
                    self.close_connections();
                    tracing::warn!(
                        live = manager.execution_count(),
                        "drain deadline passed: canceled every live execution \
                         (OPERATION_CANCELED now, held responses dropped, connections closed)"
                    );
                }
                DrainStep::Done | DrainStep::Abandon { .. } => break,
            }
        }
        manager.drain_report(&drain)
    }
}
