//! The environment lifecycle of a dispatcher (spec §6.3): verification, then installation
//! if verification failed or is absent, once, on a dedicated thread whose result every
//! waiting session shares; cleanup once when the dispatcher closes.

use std::sync::Arc;

use crate::worker::transport::WorkerTransport;

use super::error::{CallableStage, DispatchError, EnvironmentError};
use super::process::{CallableRun, run_callable};
use super::shared::Shared;

/// Where a dispatcher's environment setup stands (spec §6.3 states).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EnvironmentState {
    /// No session has been requested yet.
    Pending,
    /// Verification/installation is running.
    Running,
    /// The environment is ready (verified, installed, or nothing to do).
    Ready,
    /// Setup failed; every later session fails with
    /// [`DispatchError::EnvironmentPreviouslyFailed`] and nothing is rerun.
    Failed(EnvironmentError),
    /// The dispatcher closed and the cleanup callable (if any) has run.
    CleanedUp,
}

/// Waits until the environment is ready, starting the setup if this is the first session.
/// Cancel-safe: the setup runs on its own thread and is never started twice.
pub(crate) async fn ensure_ready<T: WorkerTransport>(
    shared: &Arc<Shared<T>>,
) -> Result<(), DispatchError> {
    enum Step {
        Done(Result<(), DispatchError>),
        Wait,
        Start,
    }
    let settings = &shared.settings;
    let step = shared.env.update(|env| match env {
        EnvironmentState::Ready | EnvironmentState::CleanedUp => Step::Done(Ok(())),
        EnvironmentState::Failed(e) => {
            Step::Done(Err(DispatchError::EnvironmentPreviouslyFailed(e.clone())))
        }
        EnvironmentState::Running => Step::Wait,
        EnvironmentState::Pending => {
            if settings.verification.is_none() && settings.installation.is_none() {
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
        Step::Start => start_setup(shared),
        Step::Wait => {}
    }
    let mut closed = shared.closed_signal();
    tokio::select! {
        result = shared.env.wait(|env| match env {
            EnvironmentState::Pending | EnvironmentState::Running => None,
            EnvironmentState::Ready | EnvironmentState::CleanedUp => Some(Ok(())),
            EnvironmentState::Failed(e) => Some(Err(DispatchError::Environment(e.clone()))),
        }) => result,
        _ = closed.wait_for(|c| *c) => Err(DispatchError::Closed),
    }
}

fn start_setup<T: WorkerTransport>(shared: &Arc<Shared<T>>) {
    let for_thread = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("tether-udf-env".into())
        .spawn(move || {
            let result = setup_blocking(&for_thread);
            for_thread.env.update(|env| {
                *env = match result {
                    Ok(()) => EnvironmentState::Ready,
                    Err(e) => EnvironmentState::Failed(e),
                }
            });
        });
    if let Err(e) = spawned {
        shared.env.update(|env| {
            *env = EnvironmentState::Failed(EnvironmentError::Spawn {
                stage: CallableStage::Installation,
                command: "environment setup thread".into(),
                source: Arc::new(e),
            });
        });
    }
}

/// Verification, then installation unless verification succeeded. A verification that
/// exits non-zero, times out or cannot start counts as "not verified" (installation may be
/// what provides it).
fn setup_blocking<T: WorkerTransport>(shared: &Shared<T>) -> Result<(), EnvironmentError> {
    let settings = &shared.settings;
    let run = |stage: CallableStage, callable| {
        run_callable(
            stage,
            callable,
            shared.config.callable_timeout,
            &shared.dir.join(format!("env-{stage}.log")),
            shared.config.process_group,
        )
    };
    let verified = match &settings.verification {
        None => false,
        Some(callable) => match run(CallableStage::Verification, callable) {
            CallableRun::Success => true,
            CallableRun::Failed(e) => {
                tracing::info!(error = %e, "environment verification did not pass; installing");
                false
            }
        },
    };
    if !verified
        && let Some(callable) = &settings.installation
        && let CallableRun::Failed(e) = run(CallableStage::Installation, callable)
    {
        tracing::warn!(error = %e, "environment installation failed");
        return Err(e);
    }
    Ok(())
}

/// Runs the cleanup callable once (after any running setup ends) and settles `CleanedUp`.
/// A failing cleanup is only logged (spec §6.3). Blocks the calling thread.
pub(crate) fn cleanup_blocking<T: WorkerTransport>(shared: &Shared<T>) {
    shared
        .env
        .wait_blocking(|env| (!matches!(env, EnvironmentState::Running)).then_some(()));
    if matches!(*shared.env.lock(), EnvironmentState::CleanedUp) {
        return;
    }
    if let Some(callable) = &shared.settings.cleanup {
        match run_callable(
            CallableStage::Cleanup,
            callable,
            shared.config.callable_timeout,
            &shared.dir.join("env-cleanup.log"),
            shared.config.process_group,
        ) {
            CallableRun::Success => tracing::debug!("environment cleanup done"),
            CallableRun::Failed(e) => tracing::warn!(error = %e, "environment cleanup failed"),
        }
    }
    shared.env.update(|env| *env = EnvironmentState::CleanedUp);
}
