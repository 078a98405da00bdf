//! A whole UDF worker process in one call: [`WorkerMain`], the counterpart of Spark's test
//! worker `EchoGrpcWorkerMain` (udf §9) for any [`Udf`].

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::task::JoinSet;

use super::{GrpcConfig, WorkerServer, WorkerService};
use crate::connection::framed::{FramedConfig, FramedListener};
use crate::wire::{UdfRequest, UdfResponse};
use crate::worker::endpoint::{EndpointConfig, Udf, serve};
use crate::worker::engine::WorkerAddress;

/// The worker's command line as the engine's dispatcher writes it (udf §1.9
/// `ProcessCallable`): the spec's own `arguments`, then `--id <worker id>` and
/// `--connection <address>`, which the engine always appends.
///
/// [`parse`](Self::parse) accepts the options anywhere on the line, as `--id VALUE` or
/// `--id=VALUE`. Every other argument is kept, in order, in
/// [`arguments`](Self::arguments): they are the worker's own (the spec's
/// `ProcessCallable.arguments`, which may not contain `--id` or `--connection`), so tether
/// neither rejects nor interprets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerArgs {
    /// The worker id (`--id`; a UUID when Spark's or tether's dispatcher spawns the worker,
    /// udf §6.1), free text here.
    pub id: String,
    /// Where to listen (`--connection`; udf §1.9): a decimal port number (1–65535) is local
    /// TCP on `127.0.0.1` (`LocalTcpConnection`; udf §1.9 has the worker bind `::1` as well,
    /// [`WorkerMain`] binds only `127.0.0.1`, where tether's dispatcher connects), any other
    /// value a Unix socket path (`UnixDomainSocket`).
    pub connection: WorkerAddress,
    /// Every other argument, in order: the spec's `ProcessCallable.arguments` (udf §1.9).
    pub arguments: Vec<String>,
}

/// Why a worker command line cannot be used (udf §1.9: the engine appends `--id <worker
/// id>` and `--connection <address>`). [`WorkerMain::run`] prints it with [`USAGE`] on
/// stderr and exits with status 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    /// `--id` is not on the command line.
    #[error("--id <worker id> is missing")]
    MissingId,
    /// `--connection` is not on the command line.
    #[error("--connection <socket path | port> is missing")]
    MissingConnection,
    /// The option is last, or followed by another option, or its value is empty.
    #[error("{option} needs a value")]
    MissingValue {
        /// `"--id"` or `"--connection"`.
        option: &'static str,
    },
    /// The option is given twice (the spec's own arguments may not contain it, udf §1.9).
    #[error("{option} is given twice")]
    Repeated {
        /// `"--id"` or `"--connection"`.
        option: &'static str,
    },
    /// A `--connection` made of digits is not a port in 1–65535.
    #[error("--connection {value}: not a TCP port (1-65535)")]
    InvalidPort {
        /// The value as given.
        value: String,
    },
    /// An argument is not valid UTF-8.
    #[error("argument {position} is not valid UTF-8")]
    NotUtf8 {
        /// Its position, 1 for the first argument after the program name.
        position: usize,
    },
}

/// The usage line [`WorkerMain::run`] prints after a [`UsageError`] (the arguments of
/// udf §1.9 `ProcessCallable`).
pub const USAGE: &str =
    "usage: WORKER [ARGUMENTS...] --id <worker id> --connection <socket path | port>";

/// Whether the arguments after the program name are a lone `--help` or `-h` (a person
/// asking for [`USAGE`]; an engine always passes `--id` and `--connection`, udf §1.9).
fn help_requested<I, S>(args: I) -> bool
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut words = args.into_iter();
    match (words.next(), words.next()) {
        (Some(word), None) => matches!(word.as_ref().to_str(), Some("--help" | "-h")),
        _ => false,
    }
}

const ID: &str = "--id";
const CONNECTION: &str = "--connection";

impl WorkerArgs {
    /// Parses the arguments after the program name (udf §1.9: `--id` and `--connection` as
    /// the engine appends them; everything else is kept in [`arguments`](Self::arguments)).
    ///
    /// # Errors
    /// The first [`UsageError`] found.
    pub fn parse<I, S>(args: I) -> Result<Self, UsageError>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let mut id = None;
        let mut connection = None;
        let mut arguments = Vec::new();
        let mut words = args.into_iter().map(Into::into).enumerate();
        while let Some((index, word)) = words.next() {
            let word = word.into_string().map_err(|_| UsageError::NotUtf8 {
                position: index + 1,
            })?;
            let (option, inline) = match word.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (word.as_str(), None),
            };
            let slot = match option {
                ID => &mut id,
                CONNECTION => &mut connection,
                _ => {
                    arguments.push(word);
                    continue;
                }
            };
            let option = if option == ID { ID } else { CONNECTION };
            let value = match inline {
                Some(value) => value,
                None => match words.next() {
                    Some((index, value)) => {
                        value.into_string().map_err(|_| UsageError::NotUtf8 {
                            position: index + 1,
                        })?
                    }
                    None => return Err(UsageError::MissingValue { option }),
                },
            };
            if value.is_empty() || value.starts_with("--") {
                return Err(UsageError::MissingValue { option });
            }
            if slot.replace(value).is_some() {
                return Err(UsageError::Repeated { option });
            }
        }
        let id = id.ok_or(UsageError::MissingId)?;
        let connection = connection.ok_or(UsageError::MissingConnection)?;
        Ok(Self {
            id,
            connection: address(connection)?,
            arguments,
        })
    }

    /// Parses this process's arguments ([`std::env::args_os`] after the program name, as
    /// udf §1.9 `ProcessCallable` lays them out).
    ///
    /// # Errors
    /// As [`parse`](Self::parse).
    pub fn from_env() -> Result<Self, UsageError> {
        Self::parse(std::env::args_os().skip(1))
    }
}

/// `--connection`'s value: digits are a loopback TCP port, anything else a socket path
/// (udf §1.9 `WorkerConnectionSpec`).
fn address(value: String) -> Result<WorkerAddress, UsageError> {
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(WorkerAddress::Unix(PathBuf::from(value)));
    }
    match value.parse::<u16>() {
        Ok(port) if port != 0 => Ok(WorkerAddress::Tcp(SocketAddr::from(([127, 0, 0, 1], port)))),
        _ => Err(UsageError::InvalidPort { value }),
    }
}

/// Why a [`WorkerMain`] stopped serving (udf §1.7, §6.1): every reason is a graceful stop,
/// and [`WorkerMain::run`] exits with status 0 after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// SIGTERM: the engine stops the worker (Spark's `DirectWorkerProcess.close()`, udf
    /// §6.1, SIGKILL follows after the graceful timeout).
    Terminated,
    /// SIGINT: Ctrl-C, when the worker was started by hand (a dispatcher starts workers in
    /// their own process group, out of the terminal's reach).
    Interrupted,
    /// The process that started the worker has exited: the worker was re-parented, so
    /// nobody will stop it (udf §6.1: the engine owns its workers' lifetime).
    ParentExited,
    /// A `Manage` `ShutdownRequest` (udf §1.7; gRPC only).
    ShutdownRequested,
}

impl StopReason {
    /// A short, stable name for logs: `sigterm`, `sigint`, `parent-exited`,
    /// `manage-shutdown` (the stop paths of udf §1.7 and §6.1).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Terminated => "sigterm",
            Self::Interrupted => "sigint",
            Self::ParentExited => "parent-exited",
            Self::ShutdownRequested => "manage-shutdown",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a [`WorkerMain`] could not serve (udf §1.9: the worker creates and listens on its
/// `--connection` address; §6.4). [`WorkerMain::run`] prints it, with its
/// [`source`](std::error::Error::source) chain, on stderr and exits with status 1.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerMainError {
    /// The tokio runtime could not be built.
    #[error("cannot start the tokio runtime")]
    Runtime(#[source] io::Error),
    /// A signal handler (SIGTERM, SIGINT) could not be installed.
    #[error("cannot install the {signal} handler")]
    Signal {
        /// `"SIGTERM"` or `"SIGINT"`.
        signal: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A process answers on the socket path: another worker is listening there.
    #[error("another process is listening on the socket {}", path.display())]
    SocketInUse {
        /// The `--connection` path.
        path: PathBuf,
    },
    /// The `--connection` path exists and is not a socket; it is left alone.
    #[error("{} exists and is not a socket", path.display())]
    NotASocket {
        /// The `--connection` path.
        path: PathBuf,
    },
    /// The socket file left by a stopped worker could not be checked or removed.
    #[error("cannot replace the stale socket file {}", path.display())]
    StaleSocket {
        /// The `--connection` path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Binding the `--connection` address failed.
    #[error("cannot listen on {address}")]
    Bind {
        /// The `--connection` address.
        address: WorkerAddress,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Which transport a [`WorkerMain`] serves.
#[derive(Debug, Clone)]
enum Served {
    Grpc(GrpcConfig),
    Framed(FramedConfig),
}

/// A UDF worker's `main` (udf §1.9, §6.1, §6.4): parses the dispatcher's `--id` /
/// `--connection` arguments, serves Spark's transport — the `UdfWorker` gRPC service on
/// the Unix socket — with one fresh [`Udf`] per session, and stops gracefully.
///
/// ```no_run
/// use std::process::ExitCode;
///
/// use bytes::Bytes;
/// use tether::spark::udf_grpc::WorkerMain;
/// use tether::wire::{ExecutionError, FinishResponse, Init};
/// use tether::worker::endpoint::Udf;
///
/// struct Echo;
///
/// impl Udf for Echo {
///     fn init(&mut self, _init: &Init) -> Result<Option<Bytes>, ExecutionError> {
///         Ok(None)
///     }
///     fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
///         out.push(batch);
///         Ok(())
///     }
///     fn finish(&mut self, _out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
///         Ok(FinishResponse::default())
///     }
/// }
///
/// fn main() -> ExitCode {
///     WorkerMain::new(|| Echo).run()
/// }
/// ```
///
/// In order, [`run`](Self::run):
///
/// 1. parses the command line ([`WorkerArgs`]); a [`UsageError`] is printed with [`USAGE`]
///    on stderr and the exit status is 2. Arguments other than `--id` / `--connection` are
///    the worker's own (the spec's `ProcessCallable.arguments`) and are ignored here; use
///    [`serve`](Self::serve) to read them;
/// 2. installs the SIGTERM (and SIGINT) handlers *before* it binds, so once the engine can
///    connect, its SIGTERM is a graceful stop and never the default kill;
/// 3. prepares the socket path: a file left there by a killed predecessor (a socket that
///    refuses connections) is removed; a socket where a process still accepts connections,
///    or a path that is not a socket, is refused with an error naming the path;
/// 4. serves until SIGTERM, SIGINT, a `Manage` `ShutdownRequest` (udf §1.7), or the exit of
///    the process that started it ([`StopReason`]). The parent is watched by polling
///    `getppid` (every [`with_parent_poll`](Self::with_parent_poll), 500 ms by default), not
///    with `PR_SET_PDEATHSIG`, which fires when the *thread* that spawned the worker exits
///    and would kill healthy workers of an engine whose spawning thread ended;
/// 5. stops gracefully: stops accepting, removes the socket file, gives open sessions up to
///    [`with_shutdown_grace`](Self::with_shutdown_grace) (5 s by default: Spark's
///    SIGTERM→SIGKILL grace, udf §7) to end, closes the rest, and exits with status 0.
///    Errors (bind, runtime) are printed with their causes on stderr; the status is 1.
///
/// The framed transport ([`with_framed`](Self::with_framed)) is tether's own and a worker
/// choice: no field of the worker specification can ask for it (udf §1.9 lists only the
/// socket kind), so the engine must be set up for it too
/// ([`FramedTransport`](crate::worker::engine::FramedTransport)).
pub struct WorkerMain<F> {
    make_udf: Arc<F>,
    endpoint_config: EndpointConfig,
    served: Served,
    shutdown_grace: Duration,
    parent_poll: Option<Duration>,
    max_framed_sessions: usize,
}

/// The default of [`WorkerMain::with_max_framed_sessions`]: framed sessions served at once.
const DEFAULT_MAX_FRAMED_SESSIONS: usize = 1024;

impl<F> fmt::Debug for WorkerMain<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerMain")
            .field("endpoint_config", &self.endpoint_config)
            .field("served", &self.served)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("parent_poll", &self.parent_poll)
            .field("max_framed_sessions", &self.max_framed_sessions)
            .finish_non_exhaustive()
    }
}

impl<F, U> WorkerMain<F>
where
    F: Fn() -> U + Send + Sync + 'static,
    U: Udf + Send + 'static,
{
    /// A worker that runs `make_udf()` under [`serve`](crate::worker::endpoint::serve) for
    /// every session (one `Execute` stream each, udf §1.1), over gRPC, with the default
    /// [`EndpointConfig`] and [`GrpcConfig`].
    pub fn new(make_udf: F) -> Self {
        Self {
            make_udf: Arc::new(make_udf),
            endpoint_config: EndpointConfig::default(),
            served: Served::Grpc(GrpcConfig::default()),
            shutdown_grace: GrpcConfig::default().shutdown_grace,
            parent_poll: Some(Duration::from_millis(500)),
            max_framed_sessions: DEFAULT_MAX_FRAMED_SESSIONS,
        }
    }

    /// Runs every session with `config` (the accepted data formats and protocol version of
    /// udf §1.3, the bounds of udf §2).
    pub fn with_endpoint_config(mut self, config: EndpointConfig) -> Self {
        self.endpoint_config = config;
        self
    }

    /// Serves the `UdfWorker` gRPC service with `config` (udf §6.4), the default transport.
    /// Its `shutdown_grace` is replaced by [`with_shutdown_grace`](Self::with_shutdown_grace)'s.
    pub fn with_grpc_config(mut self, config: GrpcConfig) -> Self {
        self.served = Served::Grpc(config);
        self
    }

    /// Serves tether's framed transport instead of gRPC: one socket connection per session
    /// ([`connection::framed`](crate::connection::framed)). The engine must use
    /// [`FramedTransport`](crate::worker::engine::FramedTransport): no spec field says which
    /// transport a worker speaks (udf §1.9).
    pub fn with_framed(mut self, config: FramedConfig) -> Self {
        self.served = Served::Framed(config);
        self
    }

    /// The framed transport's accept limit: at most `max` session connections served at once
    /// (at least 1; default 1024, tether's bound, since each holds
    /// a descriptor and a task and udf §1.1 sets none). At the limit the worker stops
    /// accepting until a session ends: further connections wait in the socket's listen
    /// backlog (or are refused when it is full), and open sessions are unaffected. The gRPC
    /// transport bounds its streams per connection instead
    /// ([`GrpcConfig::max_concurrent_streams`]).
    pub fn with_max_framed_sessions(mut self, max: usize) -> Self {
        self.max_framed_sessions = max.max(1);
        self
    }

    /// How long open sessions may run on after a stop before their connections are closed
    /// (default 5 s, Spark's graceful termination timeout, udf §7; keep it below the spec's
    /// `graceful_termination_timeout_ms`, after which the engine sends SIGKILL, udf §6.1).
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How often to check that the parent process is still there (default every 500 ms);
    /// `None` never checks. A worker whose engine died would otherwise run on unowned
    /// (udf §6.1: the engine stops its workers).
    pub fn with_parent_poll(mut self, interval: Option<Duration>) -> Self {
        self.parent_poll = interval;
        self
    }

    /// The whole worker process (see [`WorkerMain`]): parses [`WorkerArgs::from_env`],
    /// starts a multi-threaded tokio runtime and [`serve`](Self::serve)s until a stop.
    /// Returns the exit status: 0 after a graceful stop (or after printing [`USAGE`] for a
    /// lone `--help` / `-h`), 1 after an error, 2 after a usage error; errors are printed on stderr, prefixed with the program name (udf §1.9:
    /// exit 0 means success).
    pub fn run(self) -> ExitCode {
        let program = program_name();
        // A person asking (`WORKER --help` or `-h` alone): the usage, on stdout, status 0.
        if help_requested(std::env::args_os().skip(1)) {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        let args = match WorkerArgs::from_env() {
            Ok(args) => args,
            Err(e) => {
                eprintln!("{program}: {e}\n{USAGE}");
                return ExitCode::from(2);
            }
        };
        let served = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(WorkerMainError::Runtime)
            .and_then(|runtime| runtime.block_on(self.serve(&args)));
        match served {
            Ok(reason) => {
                tracing::debug!(%reason, "worker stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{program}: {}", crate::worker::Chain(&e));
                ExitCode::FAILURE
            }
        }
    }

    /// Serves `args.connection` until a stop, inside the caller's tokio runtime, and
    /// returns why it stopped: steps 2–5 of [`WorkerMain`] (udf §1.7, §6.1, §6.4). For a
    /// `main` of your own that reads [`WorkerArgs::arguments`] or records the
    /// [`StopReason`].
    ///
    /// # Errors
    /// [`WorkerMainError`]: a signal handler could not be installed, the socket path is in
    /// use or not a socket, or the address could not be bound.
    pub async fn serve(self, args: &WorkerArgs) -> Result<StopReason, WorkerMainError> {
        // The handlers exist before the socket does: a SIGTERM after readiness is ours.
        let mut stops = Stops::install(self.parent_poll)?;
        if let WorkerAddress::Unix(path) = &args.connection {
            clear_stale_socket(path)?;
        }
        let bind_error = |source| WorkerMainError::Bind {
            address: args.connection.clone(),
            source,
        };
        match self.served {
            Served::Grpc(mut config) => {
                config.shutdown_grace = self.shutdown_grace;
                let make_udf = self.make_udf;
                let service = WorkerService::for_udf(move || make_udf(), self.endpoint_config)
                    .with_config(config);
                let server = match &args.connection {
                    WorkerAddress::Unix(path) => WorkerServer::bind_unix(path, service),
                    WorkerAddress::Tcp(addr) => WorkerServer::bind_tcp(*addr, service).await,
                }
                .map_err(bind_error)?;
                let manage = server.shutdown_handle();
                let reason = tokio::select! {
                    reason = stops.next() => reason,
                    () = manage.requested() => StopReason::ShutdownRequested,
                };
                // Stops accepting, removes the socket file, lets open streams end in the grace.
                server.shutdown().await;
                Ok(reason)
            }
            Served::Framed(config) => {
                let listener = match &args.connection {
                    WorkerAddress::Unix(path) => FramedListener::bind_unix(path),
                    WorkerAddress::Tcp(addr) => FramedListener::bind_tcp(*addr).await,
                }
                .map_err(bind_error)?;
                let framed = Framed {
                    listener,
                    config,
                    make_udf: self.make_udf,
                    endpoint_config: self.endpoint_config,
                    grace: self.shutdown_grace,
                    max_sessions: self.max_framed_sessions,
                };
                Ok(framed.serve(&args.connection, stops).await)
            }
        }
    }
}

/// The program's file name, for messages (`worker` when unknown).
fn program_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|p| {
            Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "worker".to_owned())
}

/// The stop signals a worker waits for (udf §6.1): SIGTERM, SIGINT and the parent's exit.
struct Stops {
    sigterm: Signal,
    sigint: Signal,
    parent_poll: Option<Duration>,
    parent: u32,
}

impl Stops {
    fn install(parent_poll: Option<Duration>) -> Result<Self, WorkerMainError> {
        let install = |kind, name| {
            signal(kind).map_err(|source| WorkerMainError::Signal {
                signal: name,
                source,
            })
        };
        Ok(Self {
            sigterm: install(SignalKind::terminate(), "SIGTERM")?,
            sigint: install(SignalKind::interrupt(), "SIGINT")?,
            parent_poll,
            parent: std::os::unix::process::parent_id(),
        })
    }

    async fn next(&mut self) -> StopReason {
        let (parent, poll) = (self.parent, self.parent_poll);
        let parent_gone = async move {
            let Some(interval) = poll else {
                return std::future::pending().await;
            };
            loop {
                tokio::time::sleep(interval).await;
                if std::os::unix::process::parent_id() != parent {
                    return;
                }
            }
        };
        tokio::select! {
            _ = self.sigterm.recv() => StopReason::Terminated,
            _ = self.sigint.recv() => StopReason::Interrupted,
            () = parent_gone => StopReason::ParentExited,
        }
    }
}

/// Makes `path` free for the worker's socket (udf §6.4: the worker creates the socket
/// file). A socket that refuses connections was left by a killed worker and is removed; a
/// socket that accepts them, or anything that is not a socket, is refused.
fn clear_stale_socket(path: &Path) -> Result<(), WorkerMainError> {
    let stale = |source| WorkerMainError::StaleSocket {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {}
        Ok(_) => {
            return Err(WorkerMainError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(stale(e)),
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(WorkerMainError::SocketInUse {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing a stale socket file");
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(stale(e)),
                _ => Ok(()),
            }
        }
        Err(e) => Err(stale(e)),
    }
}

/// The framed transport's accept loop (tether's own transport, one connection per session).
struct Framed<F> {
    listener: FramedListener,
    config: FramedConfig,
    make_udf: Arc<F>,
    endpoint_config: EndpointConfig,
    grace: Duration,
    max_sessions: usize,
}

impl<F, U> Framed<F>
where
    F: Fn() -> U + Send + Sync + 'static,
    U: Udf + Send + 'static,
{
    /// Serves sessions until a stop; then stops accepting, removes the socket file and
    /// gives open sessions the grace (udf §6.1).
    async fn serve(self, address: &WorkerAddress, mut stops: Stops) -> StopReason {
        let mut sessions = JoinSet::new();
        let reason = loop {
            tokio::select! {
                reason = stops.next() => break reason,
                // At the accept limit, nothing is accepted until a session ends.
                accepted = self.listener.accept::<UdfResponse, UdfRequest>(&self.config),
                    if sessions.len() < self.max_sessions => {
                    match accepted {
                        Ok(connection) => {
                            let udf = (self.make_udf)();
                            let config = self.endpoint_config.clone();
                            sessions.spawn(serve(connection, udf, config));
                        }
                        Err(e) => {
                            // E.g. out of file descriptors: back off instead of spinning.
                            tracing::warn!(error = %e, "accepting a session failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
            }
        };
        drop(self.listener);
        if let WorkerAddress::Unix(path) = address
            && let Err(e) = std::fs::remove_file(path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "removing the socket file failed");
        }
        let drained = tokio::time::timeout(self.grace, async {
            while sessions.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                open = sessions.len(),
                grace = ?self.grace,
                "sessions still open after the shutdown grace; closing them"
            );
        }
        sessions.shutdown().await;
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<WorkerArgs, UsageError> {
        WorkerArgs::parse(words.iter().copied())
    }

    #[test]
    fn the_dispatchers_arguments_are_parsed_and_the_rest_kept_in_order() {
        let args = parse(&[
            "--worker",
            "--id",
            "w-1",
            "-v",
            "--connection",
            "/tmp/w.sock",
        ]);
        assert_eq!(
            args,
            Ok(WorkerArgs {
                id: "w-1".into(),
                connection: WorkerAddress::Unix("/tmp/w.sock".into()),
                arguments: vec!["--worker".into(), "-v".into()],
            })
        );
        let inline = parse(&["--id=w-2", "--connection=8080"]).unwrap();
        assert_eq!(inline.id, "w-2");
        assert_eq!(
            inline.connection,
            WorkerAddress::Tcp(SocketAddr::from(([127, 0, 0, 1], 8080)))
        );
        assert!(inline.arguments.is_empty());
    }

    #[test]
    fn a_lone_help_flag_asks_for_the_usage_and_nothing_else_does() {
        assert!(help_requested(["--help"]));
        assert!(help_requested(["-h"]));
        assert!(!help_requested(Vec::<&str>::new()));
        assert!(!help_requested(["--help", "--id", "w"]));
        assert!(!help_requested(["--id", "--help"]));
        assert!(!help_requested(["help"]));
    }

    #[test]
    fn bad_command_lines_are_typed_usage_errors() {
        assert_eq!(parse(&[]), Err(UsageError::MissingId));
        assert_eq!(parse(&["--id", "w"]), Err(UsageError::MissingConnection));
        assert_eq!(
            parse(&["--connection", "/s", "--id"]),
            Err(UsageError::MissingValue { option: "--id" })
        );
        assert_eq!(
            parse(&["--id", "--connection", "/s"]),
            Err(UsageError::MissingValue { option: "--id" })
        );
        assert_eq!(
            parse(&["--id", "w", "--connection="]),
            Err(UsageError::MissingValue {
                option: "--connection"
            })
        );
        assert_eq!(
            parse(&["--id", "a", "--id", "b", "--connection", "/s"]),
            Err(UsageError::Repeated { option: "--id" })
        );
        for port in ["0", "65536", "99999999999"] {
            assert_eq!(
                parse(&["--id", "w", "--connection", port]),
                Err(UsageError::InvalidPort { value: port.into() })
            );
        }
        use std::os::unix::ffi::OsStringExt as _;
        let bad = OsString::from_vec(vec![b'/', 0xff]);
        let words = vec![
            OsString::from("--id"),
            OsString::from("w"),
            OsString::from("--connection"),
            bad,
        ];
        assert_eq!(
            WorkerArgs::parse(words),
            Err(UsageError::NotUtf8 { position: 4 })
        );
        assert_eq!(
            UsageError::MissingValue { option: "--id" }.to_string(),
            "--id needs a value"
        );
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tether-worker-main-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_stale_socket_is_removed_and_a_live_one_refused_by_path() {
        let dir = scratch("stale");
        let path = dir.join("w.sock");
        // Nothing there: nothing to do.
        clear_stale_socket(&path).unwrap();
        // A live listener answers: refused, the message names the path, the file stays.
        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = clear_stale_socket(&path).unwrap_err();
        assert!(
            matches!(err, WorkerMainError::SocketInUse { .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "another process is listening on the socket {}",
                path.display()
            )
        );
        assert!(path.exists());
        // The listener is gone (a killed worker): connect is refused, the file is removed.
        drop(live);
        assert!(path.exists());
        clear_stale_socket(&path).unwrap();
        assert!(!path.exists());
        // Not a socket: left alone.
        std::fs::write(&path, b"data").unwrap();
        let err = clear_stale_socket(&path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{} exists and is not a socket", path.display())
        );
        assert!(path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stop_reasons_have_stable_names() {
        let names = [
            StopReason::Terminated,
            StopReason::Interrupted,
            StopReason::ParentExited,
            StopReason::ShutdownRequested,
        ]
        .map(|r| r.to_string());
        assert_eq!(
            names,
            ["sigterm", "sigint", "parent-exited", "manage-shutdown"]
        );
    }
}
