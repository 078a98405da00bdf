//! The environment lifecycle of a dispatcher (udf §6.3): verification, then installation
//! if verification failed or is absent, once, on a dedicated thread whose result every
//! waiting session shares; cleanup once when the dispatcher closes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::wire::ProcessCallable;

use super::error::{CallableStage, DispatchError, EnvironmentError};
use super::monitor::Monitor;
use super::process::{CallableRun, run_callable};

/// Where a dispatcher's environment setup stands (udf §6.3 states).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EnvironmentState {
    /// No session has been requested yet.
    Pending,
    /// Verification/installation is running (tether's own state: Spark runs it under the
    /// dispatcher's lock, still `Pending`).
    Running,
    /// The environment is ready (verified, installed, or nothing to do).
    Ready,
    /// Setup failed; every later session fails with
    /// [`DispatchError::EnvironmentPreviouslyFailed`] and nothing is rerun.
    Failed(EnvironmentError),
    /// The dispatcher closed and the cleanup callable (if any) has run.
    CleanedUp,
}

/// A dispatcher's environment: its setup state and what it needs to run the callables.
/// Owned by the dispatcher's shared state; knows nothing of workers or sessions.
pub(crate) struct Environment {
    state: Monitor<EnvironmentState>,
    verification: Option<ProcessCallable>,
    installation: Option<ProcessCallable>,
    cleanup: Option<ProcessCallable>,
    callable_timeout: Duration,
    dir: PathBuf,
    process_group: bool,
}

impl Environment {
    /// An environment in [`EnvironmentState::Pending`]; callables' output logs go to `dir`.
    pub(crate) fn new(
        verification: Option<ProcessCallable>,
        installation: Option<ProcessCallable>,
        cleanup: Option<ProcessCallable>,
        callable_timeout: Duration,
        dir: PathBuf,
        process_group: bool,
    ) -> Self {
        Self {
            state: Monitor::new(EnvironmentState::Pending),
            verification,
            installation,
            cleanup,
            callable_timeout,
            dir,
            process_group,
        }
    }

    /// The current state (a snapshot).
    pub(crate) fn state(&self) -> EnvironmentState {
        self.state.lock().clone()
    }

    /// Waits until the environment is ready, starting the setup if this is the first
    /// session; gives up with [`DispatchError::Closed`] when `closed` turns true.
    /// Cancel-safe: the setup runs on its own thread and is never started twice.
    pub(crate) async fn ensure_ready(
        self: &Arc<Self>,
        mut closed: watch::Receiver<bool>,
    ) -> Result<(), DispatchError> {
        enum Step {
            Done(Result<(), DispatchError>),
            Wait,
            Start,
        }
        let nothing_to_run = self.verification.is_none() && self.installation.is_none();
        let step = self.state.update(|env| match env {
            EnvironmentState::Ready | EnvironmentState::CleanedUp => Step::Done(Ok(())),
            EnvironmentState::Failed(e) => {
                Step::Done(Err(DispatchError::EnvironmentPreviouslyFailed(e.clone())))
            }
            EnvironmentState::Running => Step::Wait,
            EnvironmentState::Pending => {
                if nothing_to_run {
                    *env = EnvironmentState::Ready;
                    Step::Done(Ok(()))
                } else {
                    *env = EnvironmentState::Running;
                    Step::Start
                }
            }
        });
        match step {
            Step::Done(result) => return result,
            Step::Start => self.start_setup(),
            Step::Wait => {}
        }
        tokio::select! {
            result = self.state.wait(|env| match env {
                EnvironmentState::Pending | EnvironmentState::Running => None,
                EnvironmentState::Ready | EnvironmentState::CleanedUp => Some(Ok(())),
                EnvironmentState::Failed(e) => Some(Err(DispatchError::Environment(e.clone()))),
            }) => result,
            _ = closed.wait_for(|c| *c) => Err(DispatchError::Closed),
        }
    }

    fn start_setup(self: &Arc<Self>) {
        let for_thread = self.clone();
        let spawned = std::thread::Builder::new()
            .name("tether-udf-env".into())
            .spawn(move || {
                let result = for_thread.setup_blocking();
                for_thread.state.update(|env| {
                    *env = match result {
                        Ok(()) => EnvironmentState::Ready,
                        Err(e) => EnvironmentState::Failed(e),
                    }
                });
            });
        if let Err(e) = spawned {
            self.state.update(|env| {
                *env = EnvironmentState::Failed(EnvironmentError::Spawn {
                    stage: CallableStage::Installation,
                    command: "environment setup thread".into(),
                    source: Arc::new(e),
                });
            });
        }
    }

    fn run(&self, stage: CallableStage, callable: &ProcessCallable, log: &str) -> CallableRun {
        run_callable(
            stage,
            callable,
            self.callable_timeout,
            &self.dir.join(log),
            self.process_group,
        )
    }

    /// Verification, then installation unless verification succeeded. A verification that
    /// exits non-zero, times out or cannot start counts as "not verified" (installation may
    /// be what provides it).
    fn setup_blocking(&self) -> Result<(), EnvironmentError> {
        let verified = match &self.verification {
            None => false,
            Some(callable) => {
                let log = format!("env-{}.log", CallableStage::Verification);
                match self.run(CallableStage::Verification, callable, &log) {
                    CallableRun::Success => true,
                    CallableRun::Failed(e) => {
                        tracing::info!(error = %e, "environment verification did not pass; installing");
                        false
                    }
                }
            }
        };
        if !verified && let Some(callable) = &self.installation {
            let log = format!("env-{}.log", CallableStage::Installation);
            if let CallableRun::Failed(e) = self.run(CallableStage::Installation, callable, &log) {
                tracing::warn!(error = %e, "environment installation failed");
                return Err(e);
            }
        }
        Ok(())
    }

    /// Runs the cleanup callable once (after any running setup ends) and settles
    /// `CleanedUp`. A failing cleanup is only logged (udf §6.3). Blocks the calling thread.
    pub(crate) fn cleanup_blocking(&self) {
        self.state
            .wait_blocking(|env| (!matches!(env, EnvironmentState::Running)).then_some(()));
        if matches!(*self.state.lock(), EnvironmentState::CleanedUp) {
            return;
        }
        if let Some(callable) = &self.cleanup {
            match self.run(CallableStage::Cleanup, callable, "env-cleanup.log") {
                CallableRun::Success => tracing::debug!("environment cleanup done"),
                CallableRun::Failed(e) => tracing::warn!(error = %e, "environment cleanup failed"),
            }
        }
        self.state.update(|env| *env = EnvironmentState::CleanedUp);
    }
}
