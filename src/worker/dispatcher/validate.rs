//! Spec validation (udf §6.2, §6.4) and the settings a dispatcher derives from a valid spec
//! (timeouts defaulted and clamped, udf §7).

use std::time::Duration;

use crate::wire::{
    ProcessCallable, UdfProtoCommunicationPattern, UdfWorkerDataFormat, UdfWorkerSpecification,
    udf_worker_specification, worker_connection_spec,
};

use super::DispatcherConfig;
use super::error::SpecError;

/// How the worker is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndpointKind {
    Unix,
    Tcp,
}

/// What a dispatcher needs from a validated specification.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) runner: ProcessCallable,
    pub(crate) endpoint: EndpointKind,
    pub(crate) init_timeout: Duration,
    pub(crate) graceful_timeout: Duration,
    pub(crate) supports_reuse: bool,
    pub(crate) verification: Option<ProcessCallable>,
    pub(crate) installation: Option<ProcessCallable>,
    pub(crate) cleanup: Option<ProcessCallable>,
}

/// Checks `spec` as a [`Dispatcher`](super::Dispatcher) built with `config` would, without
/// creating anything (udf §6.2 construction, §6.4 transport support).
///
/// Checked in this order: a direct worker with a runner whose command has at least one entry
/// and whose arguments do not contain `--id`/`--connection`; capabilities present;
/// `supported_data_formats` free of `UNSPECIFIED` and containing `ARROW`;
/// `supported_communication_patterns` free of `UNSPECIFIED` and containing
/// `BIDIRECTIONAL_STREAMING`; environment callables with non-empty commands, verification
/// only together with installation; `properties.connection` set, and a Unix domain socket
/// unless [`DispatcherConfig::allow_tcp`] is on.
///
/// # Errors
/// The first [`SpecError`] found.
pub fn validate_spec(
    spec: &UdfWorkerSpecification,
    config: &DispatcherConfig,
) -> Result<(), SpecError> {
    settings(spec, config).map(drop)
}

pub(crate) fn settings(
    spec: &UdfWorkerSpecification,
    config: &DispatcherConfig,
) -> Result<Settings, SpecError> {
    let Some(udf_worker_specification::Worker::Direct(direct)) = &spec.worker else {
        return Err(SpecError::MissingDirectWorker);
    };
    let runner = direct.runner.as_ref().ok_or(SpecError::MissingRunner)?;
    if runner.command.is_empty() {
        return Err(SpecError::EmptyCommand { callable: "runner" });
    }
    if let Some(arg) = runner
        .arguments
        .iter()
        .find(|a| *a == "--id" || *a == "--connection")
    {
        return Err(SpecError::ReservedArgument {
            argument: arg.clone(),
        });
    }

    let caps = spec
        .capabilities
        .as_ref()
        .ok_or(SpecError::MissingCapabilities)?;
    let unspecified_format = UdfWorkerDataFormat::Unspecified as i32;
    if caps.supported_data_formats.contains(&unspecified_format) {
        return Err(SpecError::UnspecifiedDataFormat);
    }
    if !caps
        .supported_data_formats
        .contains(&(UdfWorkerDataFormat::Arrow as i32))
    {
        return Err(SpecError::ArrowRequired);
    }
    let unspecified_pattern = UdfProtoCommunicationPattern::Unspecified as i32;
    if caps
        .supported_communication_patterns
        .contains(&unspecified_pattern)
    {
        return Err(SpecError::UnspecifiedCommunicationPattern);
    }
    if !caps
        .supported_communication_patterns
        .contains(&(UdfProtoCommunicationPattern::BidirectionalStreaming as i32))
    {
        return Err(SpecError::BidirectionalStreamingRequired);
    }

    let env = spec.environment.clone().unwrap_or_default();
    for (name, callable) in [
        ("installation", &env.installation),
        ("environment_verification", &env.environment_verification),
        ("environment_cleanup", &env.environment_cleanup),
    ] {
        if callable.as_ref().is_some_and(|c| c.command.is_empty()) {
            return Err(SpecError::EmptyCommand { callable: name });
        }
    }
    if env.environment_verification.is_some() && env.installation.is_none() {
        return Err(SpecError::VerificationWithoutInstallation);
    }

    let props = direct.properties.clone().unwrap_or_default();
    let endpoint = match props.connection.and_then(|c| c.transport) {
        None => return Err(SpecError::MissingConnection),
        Some(worker_connection_spec::Transport::UnixDomainSocket(_)) => EndpointKind::Unix,
        Some(worker_connection_spec::Transport::Tcp(_)) if config.allow_tcp => EndpointKind::Tcp,
        Some(worker_connection_spec::Transport::Tcp(_)) => {
            return Err(SpecError::UnixSocketRequired);
        }
    };

    Ok(Settings {
        runner: runner.clone(),
        endpoint,
        init_timeout: resolve_timeout(
            "initialization_timeout_ms",
            props.initialization_timeout_ms,
            config.default_init_timeout,
            config.max_spec_timeout,
        ),
        graceful_timeout: resolve_timeout(
            "graceful_termination_timeout_ms",
            props.graceful_termination_timeout_ms,
            config.default_graceful_timeout,
            config.max_spec_timeout,
        ),
        supports_reuse: caps.supports_reuse == Some(true),
        verification: env.environment_verification,
        installation: env.installation,
        cleanup: env.environment_cleanup,
    })
}

/// A spec-provided timeout: unset or ≤ 0 gives `default`; above `max` is clamped to `max`
/// with a warning (udf §6.2, §7 `ENGINE_MAX_TIMEOUT_MS`).
pub(crate) fn resolve_timeout(
    name: &str,
    spec_ms: Option<i32>,
    default: Duration,
    max: Duration,
) -> Duration {
    match spec_ms {
        None => default,
        Some(ms) if ms <= 0 => default,
        Some(ms) => {
            let asked = Duration::from_millis(ms.unsigned_abs().into());
            if asked > max {
                tracing::warn!(
                    "{name} = {ms} exceeds the engine maximum of {}ms; clamped",
                    max.as_millis()
                );
                max
            } else {
                asked
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_default_when_unset_or_not_positive_and_clamp_above_the_maximum() {
        let d = Duration::from_secs(10);
        let max = Duration::from_secs(30);
        assert_eq!(resolve_timeout("t", None, d, max), d);
        assert_eq!(resolve_timeout("t", Some(0), d, max), d);
        assert_eq!(resolve_timeout("t", Some(-5), d, max), d);
        assert_eq!(
            resolve_timeout("t", Some(500), d, max),
            Duration::from_millis(500)
        );
        assert_eq!(resolve_timeout("t", Some(30_000), d, max), max);
        assert_eq!(resolve_timeout("t", Some(60_000), d, max), max);
        assert_eq!(resolve_timeout("t", Some(i32::MAX), d, max), max);
    }
}
