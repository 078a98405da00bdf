//! The dispatcher's errors: an invalid specification ([`SpecError`]), a failed environment
//! callable ([`EnvironmentError`]) and everything `create_session` can report
//! ([`DispatchError`]).

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::connection::ConnectionError;
use crate::worker::StopReason;
use crate::worker::engine::WorkerAddress;

/// Why a [`UdfWorkerSpecification`](crate::wire::UdfWorkerSpecification) cannot be run by a
/// [`Dispatcher`](super::Dispatcher) (udf §6.2, §6.4; scenarios 79–80, 92–95, 99–100,
/// 113–114, 116, 129).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// `worker` is unset: only the `direct` worker exists (udf §1.9).
    #[error("the worker specification must set a direct worker (UDFWorkerSpecification.direct)")]
    MissingDirectWorker,
    /// `direct.runner` is unset (udf §1.9 `DirectWorker.runner`, checked at construction,
    /// udf §6.2).
    #[error("the direct worker must set a runner (DirectWorker.runner)")]
    MissingRunner,
    /// A callable's `command` is empty (udf §8 scenario 116).
    #[error("the {callable} command must contain at least one entry")]
    EmptyCommand {
        /// Which callable: `runner`, `installation`, `environment_verification` or
        /// `environment_cleanup`.
        callable: &'static str,
    },
    /// The runner's `arguments` contain `--id` or `--connection`, which the engine appends
    /// itself (udf §1.9).
    #[error("the runner arguments must not contain {argument}: the engine appends it itself")]
    ReservedArgument {
        /// The offending argument.
        argument: String,
    },
    /// `direct.properties.connection` (or its transport) is unset (scenarios 92, 113).
    #[error("UDFWorkerProperties.connection must be set (unix_domain_socket or tcp)")]
    MissingConnection,
    /// The spec asks for local TCP but the dispatcher's transport needs a Unix domain socket
    /// ([`DispatcherConfig::allow_tcp`](super::DispatcherConfig::allow_tcp) is off;
    /// scenarios 93, 114).
    #[error(
        "this dispatcher requires UNIX domain socket transport (WorkerConnectionSpec.unix_domain_socket), but the specification asks for tcp"
    )]
    UnixSocketRequired,
    /// `capabilities` is unset (scenarios 80, 94, 99).
    #[error(
        "the dispatcher requires WorkerCapabilities: supported_data_formats must contain at least ARROW and supported_communication_patterns must contain BIDIRECTIONAL_STREAMING"
    )]
    MissingCapabilities,
    /// `supported_data_formats` does not contain `ARROW` (it must, udf §1.9
    /// `WorkerCapabilities`, §6.2).
    #[error("supported_data_formats must contain at least ARROW")]
    ArrowRequired,
    /// `supported_data_formats` contains `UNSPECIFIED` (udf §8 scenario 100).
    #[error("supported_data_formats must not contain UNSPECIFIED")]
    UnspecifiedDataFormat,
    /// `supported_communication_patterns` contains `UNSPECIFIED` (scenarios 95, 100).
    #[error(
        "supported_communication_patterns must not contain UNSPECIFIED (the dispatcher requires BIDIRECTIONAL_STREAMING)"
    )]
    UnspecifiedCommunicationPattern,
    /// `supported_communication_patterns` lacks `BIDIRECTIONAL_STREAMING` (udf §8 scenario 79).
    #[error("the dispatcher requires BIDIRECTIONAL_STREAMING in supported_communication_patterns")]
    BidirectionalStreamingRequired,
    /// `environment_verification` is set without `installation` (udf §8 scenario 129).
    #[error(
        "WorkerEnvironment.environment_verification requires an installation callable (WorkerEnvironment.installation)"
    )]
    VerificationWithoutInstallation,
}

/// One of the environment callables (udf §1.9 `WorkerEnvironment`, §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallableStage {
    /// `environment_verification`: exit 0 means the environment is ready.
    Verification,
    /// `installation`: run when verification failed or is absent.
    Installation,
    /// `environment_cleanup`: run once when the dispatcher closes.
    Cleanup,
}

impl fmt::Display for CallableStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Verification => "verification",
            Self::Installation => "installation",
            Self::Cleanup => "cleanup",
        })
    }
}

/// How a process ended: an exit code, or the signal that killed it. What the dispatcher
/// reports for a worker that exits before becoming reachable (udf §6.4, §8 scenario 117:
/// "exited with code 42") and for a failing environment callable (udf §6.3: exit code and
/// output tail; exit 0 = success, udf §1.9 `ProcessCallable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExitReason {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal number (e.g. the SIGKILL that stops a timed-out
    /// callable, udf §6.3).
    Signal(i32),
}

impl ExitReason {
    /// The reason of a finished process's status (Unix): its exit code, else the signal
    /// that killed it (udf §6.3, §6.4). A status with neither, which `wait` never returns,
    /// maps to `Code(-1)`.
    pub fn from_status(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Self::Code(code),
            (None, Some(signal)) => Self::Signal(signal),
            // Neither: a stopped/continued status, which `wait` never returns.
            (None, None) => Self::Code(-1),
        }
    }
}

/// `code 42`, or the signal's name (`SIGKILL`; `signal 64` for a number without one).
impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(c) => write!(f, "code {c}"),
            Self::Signal(s) => match nix::sys::signal::Signal::try_from(*s) {
                Ok(signal) => f.write_str(signal.as_str()),
                Err(_) => write!(f, "signal {s}"),
            },
        }
    }
}

/// The connection to a dispatcher's worker failed, or its response stream ended, before the
/// session's outcome was settled: what an engine session on a
/// [`Dispatcher`](super::Dispatcher)'s worker reports inside
/// [`ConnectionError::Transport`] (so a session settles `TransportFailed` with it, udf §4.5,
/// and the worker is invalidated, udf §6.5).
///
/// Its text names the process and how it ended, "the worker connection was lost (worker pid
/// 4242 exited: SIGKILL)", or "(worker pid 4242 still running)" when the process had not
/// ended within [`DispatcherConfig::exit_status_wait`](super::DispatcherConfig::exit_status_wait)
/// (the worker dropped the connection itself, as when a callback of its UDF panicked);
/// then, when the dispatcher itself was stopping the worker (its close), "stopped by the
/// dispatcher: closed"; then the last lines of the worker's output (its log file, where a
/// panic's message and a crash's last words are), unless the dispatcher stopped it. The
/// transport's own error, if there was one (a stream that simply ended has none), is the
/// [`source`](std::error::Error::source).
#[derive(Debug, Clone)]
pub struct WorkerLost {
    /// The worker's id (`--id`, udf §6.1).
    pub id: String,
    /// Its process id.
    pub pid: u32,
    /// How the process ended; `None` when it had not ended (or had not been reaped) within
    /// the wait.
    pub exit: Option<ExitReason>,
    /// Why the dispatcher was stopping the worker when the loss was explained (its close
    /// stops the workers of running sessions, udf §6.2 `close`); `None` if it was not.
    pub stopping: Option<StopReason>,
    /// The worker's last lines of output when the loss was explained (at most 50 lines of
    /// its log's last 1 MiB, udf §7 `PROCESS_OUTPUT_TAIL_LINES`; from the last Rust panic
    /// report among them, if there is one, so that its message leads); empty if it printed
    /// nothing or the dispatcher was stopping it.
    pub output: String,
    cause: Option<ConnectionError>,
}

impl WorkerLost {
    pub(crate) fn new(
        id: String,
        pid: u32,
        exit: Option<ExitReason>,
        cause: Option<ConnectionError>,
    ) -> Self {
        Self {
            id,
            pid,
            exit,
            stopping: None,
            output: String::new(),
            cause,
        }
    }
}

impl fmt::Display for WorkerLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pid = self.pid;
        match &self.exit {
            Some(reason) => write!(
                f,
                "the worker connection was lost (worker pid {pid} exited: {reason}"
            )?,
            None => write!(
                f,
                "the worker connection was lost (worker pid {pid} still running"
            )?,
        }
        if let Some(reason) = self.stopping {
            write!(f, ", stopped by the dispatcher: {}", reason.label())?;
        }
        f.write_str(")")?;
        if !self.output.is_empty() {
            write!(f, "{}", OutputTail(&self.output))?;
        }
        Ok(())
    }
}

impl std::error::Error for WorkerLost {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.cause.as_ref()? {
            // The transport's error itself, not the generic wrapper around it.
            ConnectionError::Transport(error) => Some(&**error),
            closed => Some(closed),
        }
    }
}

/// Formats a captured output tail for an error message (empty output adds nothing).
pub(crate) struct OutputTail<'a>(pub(crate) &'a str);

impl fmt::Display for OutputTail<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("; it printed nothing")
        } else {
            write!(f, "; output (last lines):\n{}", self.0)
        }
    }
}

/// An environment callable failed (udf §6.3). Failures of verification+installation are
/// permanent for the dispatcher: later sessions get
/// [`DispatchError::EnvironmentPreviouslyFailed`] without the callables being rerun.
///
/// `output` is the tail of the callable's merged stdout and stderr: at most the last 50 lines
/// of the last 1 MiB (udf §7 `PROCESS_OUTPUT_TAIL_LINES`, `MAX_OUTPUT_SCAN_BYTES`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EnvironmentError {
    /// The callable exited unsuccessfully (udf §8 scenario 122: "exit code 7" and its output).
    #[error("environment {stage} failed with exit {reason}{}", OutputTail(output))]
    Failed {
        /// Which callable.
        stage: CallableStage,
        /// Its exit code or signal.
        reason: ExitReason,
        /// Its output tail.
        output: String,
    },
    /// The callable ran longer than
    /// [`DispatcherConfig::callable_timeout`](super::DispatcherConfig::callable_timeout); it
    /// was killed (SIGKILL to its process group) and reaped (udf §8 scenario 123).
    #[error("environment {stage}: callable timed out after {}ms{}", after.as_millis(), OutputTail(output))]
    TimedOut {
        /// Which callable.
        stage: CallableStage,
        /// The timeout that expired.
        after: Duration,
        /// Its output tail.
        output: String,
    },
    /// The callable could not be started (the OS error is the source).
    #[error("environment {stage}: could not start `{command}`")]
    Spawn {
        /// Which callable.
        stage: CallableStage,
        /// The command line.
        command: String,
        /// The OS error (shared so the error can be cloned to every waiting session).
        source: Arc<io::Error>,
    },
}

impl EnvironmentError {
    /// The callable that failed (verification, installation or cleanup, udf §6.3).
    pub fn stage(&self) -> CallableStage {
        match self {
            Self::Failed { stage, .. }
            | Self::TimedOut { stage, .. }
            | Self::Spawn { stage, .. } => *stage,
        }
    }
}

/// Everything [`Dispatcher::new`](super::Dispatcher::new) and
/// [`Dispatcher::create_session`](super::Dispatcher::create_session) can report (udf §6.2).
///
/// Worker start failures carry the worker's id, its address and the tail of its merged
/// stdout/stderr (last 50 lines of the last 1 MiB); by the time one is returned the process
/// has been killed and reaped and its socket file removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The specification is invalid for this dispatcher (the [`SpecError`] is the source).
    #[error("invalid UDF worker specification")]
    InvalidSpec(#[from] SpecError),
    /// A security scope was passed; only `None` is accepted (udf §3, udf §8 scenario 128).
    #[error("worker security scopes are not supported yet: create sessions without a scope")]
    SecurityScopeNotSupported,
    /// The dispatcher is closed (or closed while this session was being created; scenarios
    /// 106, 109).
    #[error("the dispatcher is closed")]
    Closed,
    /// This session ran the environment setup and it failed (scenarios 122, 123, 126, 127).
    #[error(transparent)]
    Environment(EnvironmentError),
    /// The environment setup failed for an earlier session; it is not rerun (scenarios 126,
    /// 127). That session's [`EnvironmentError`] is the source.
    #[error("environment setup previously failed")]
    EnvironmentPreviouslyFailed(#[source] EnvironmentError),
    /// No candidate directory (`$TMPDIR`, `$TEMP`, `$TMP`, `/tmp`, or the configured base)
    /// accepted the private socket directory (the last error is the source).
    #[error("could not create a private socket directory under any of {tried:?}")]
    SocketDirectory {
        /// The base directories tried, shortest first.
        tried: Vec<PathBuf>,
        /// The last error.
        source: io::Error,
    },
    /// The socket path is longer than the platform's limit (107 bytes on Linux, 103 on macOS
    /// and the BSDs; udf §6.4).
    #[error("socket path {path:?} is {len} bytes long, over the platform limit of {max} bytes")]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Every candidate socket name (`w-<16 hex>.sock` and suffixes `-1`…`-16`) was taken.
    #[error("no free socket name in {dir:?} after 17 attempts")]
    SocketNameExhausted {
        /// The socket directory.
        dir: PathBuf,
    },
    /// A local I/O step failed (creating the output log, choosing a TCP port); the OS error
    /// is the source.
    #[error("{what} failed")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// The worker process could not be started (the OS error is the source).
    #[error("could not start worker `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// The OS error.
        source: io::Error,
    },
    /// The worker died before it became reachable (udf §8 scenario 117: "exited with code 42").
    #[error(
        "worker {id} exited with {reason} before becoming reachable at {address}{}",
        OutputTail(output)
    )]
    ExitedAtStart {
        /// The worker's id.
        id: String,
        /// Where it should have listened.
        address: WorkerAddress,
        /// Its exit code or signal.
        reason: ExitReason,
        /// Its output tail.
        output: String,
    },
    /// The worker did not accept a connection within the initialization timeout (scenarios
    /// 91, 118).
    #[error("worker {id} did not become reachable at {address} within {}ms: {detail}{}", waited.as_millis(), OutputTail(output))]
    NotReachable {
        /// The worker's id.
        id: String,
        /// Where it should have listened.
        address: WorkerAddress,
        /// The initialization timeout that expired.
        waited: Duration,
        /// What was observed (socket file never created; last connect error).
        detail: String,
        /// Its output tail.
        output: String,
    },
    /// The worker was ready but the session's connection could not be opened; the worker
    /// was marked invalid and stopped (udf §8 scenario 112). The transport's error is the
    /// source.
    #[error("could not open a session to worker {id} at {address}")]
    OpenSession {
        /// The worker's id.
        id: String,
        /// Its address.
        address: WorkerAddress,
        /// The transport's error.
        source: io::Error,
    },
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn exit_reasons_name_their_signal() {
        assert_eq!(ExitReason::Code(3).to_string(), "code 3");
        assert_eq!(ExitReason::Signal(9).to_string(), "SIGKILL");
        assert_eq!(ExitReason::Signal(15).to_string(), "SIGTERM");
        assert_eq!(ExitReason::Signal(1000).to_string(), "signal 1000");
    }

    #[test]
    fn worker_lost_says_how_the_process_ended_and_keeps_the_transport_error_as_source() {
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        let lost = WorkerLost::new(
            "w".into(),
            42,
            Some(ExitReason::Code(1)),
            Some(ConnectionError::transport(reset)),
        );
        assert_eq!(
            lost.to_string(),
            "the worker connection was lost (worker pid 42 exited: code 1)"
        );
        let source = lost.source().expect("the transport error");
        assert_eq!(source.to_string(), "connection reset");

        let mut unknown = WorkerLost::new("w".into(), 42, None, Some(ConnectionError::Closed));
        assert_eq!(
            unknown.to_string(),
            "the worker connection was lost (worker pid 42 still running)"
        );
        unknown.output = "thread 'main' panicked at udf.rs:7:5:\nboom".into();
        assert_eq!(
            unknown.to_string(),
            "the worker connection was lost (worker pid 42 still running); output (last \
             lines):\nthread 'main' panicked at udf.rs:7:5:\nboom"
        );
        let mut closed = WorkerLost::new("w".into(), 42, Some(ExitReason::Signal(9)), None);
        closed.stopping = Some(StopReason::DispatcherClosed);
        assert_eq!(
            closed.to_string(),
            "the worker connection was lost (worker pid 42 exited: SIGKILL, stopped by the \
             dispatcher: closed)"
        );
        assert_eq!(
            unknown.source().map(ToString::to_string).as_deref(),
            Some("connection closed")
        );
        let ended = WorkerLost::new("w".into(), 42, Some(ExitReason::Signal(9)), None);
        assert!(
            ended.source().is_none(),
            "a stream that just ended has no error"
        );
    }
}
