//! Worker mode: what the tour's executable does when a dispatcher starts it as
//! `tour --worker --id <uuid> --connection <socket path>` (udf §1.9 `ProcessCallable`: the
//! engine appends `--id` and `--connection`).
//!
//! - Installs the SIGTERM handler first, then binds the socket: once the engine can connect,
//!   a SIGTERM is a clean shutdown, never the default kill.
//! - Serves tether's framed transport on the Unix socket (one connection per session), or
//!   127.0.0.1 when `--connection` is a port number (IPv4 only); with `--transport grpc` (built
//!   with `--features grpc`) the official `UdfWorker` gRPC service instead.
//! - Runs each session with [`serve`] and a fresh [`TourUdf`] on its own task: Arrow IPC in,
//!   the Init payload's UDF, Arrow IPC out; a Cancel is honoured at the next batch boundary
//!   (unread input is dropped, the `CancelResponse` carries the partial metrics).
//! - On SIGTERM (or when its parent engine has gone away): stops accepting, gives open
//!   sessions a short grace, removes its socket file and exits with status 0.
//! - If `TETHER_TOUR_JOURNAL` names a file, appends a line `<pid> <id> start` when it starts
//!   and `<pid> <id> exit reason=sigterm|parent-gone sessions=N` when it exits cleanly; the
//!   tour reads them to show how each worker ended (a SIGKILLed worker has no exit line).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tether::connection::framed::{FramedConfig, FramedListener};
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::endpoint::{EndpointConfig, serve};
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinSet;

use super::udf::TourUdf;

/// Environment variable naming the lifecycle journal file.
pub const JOURNAL_ENV: &str = "TETHER_TOUR_JOURNAL";
/// How long open sessions may take to end after SIGTERM before they are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// Which transport the worker serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Framed,
    #[cfg(feature = "grpc")]
    Grpc,
}

/// The worker's command line.
#[derive(Debug)]
struct Args {
    id: String,
    connection: String,
    transport: Transport,
}

impl Args {
    fn parse(args: &[String]) -> Result<Args, String> {
        let mut id = None;
        let mut connection = None;
        let mut transport = Transport::Framed;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{arg} needs a value"))
            };
            match arg.as_str() {
                "--worker" => {}
                "--id" => id = Some(value()?),
                "--connection" => connection = Some(value()?),
                "--transport" => {
                    transport = match value()?.as_str() {
                        "framed" => Transport::Framed,
                        #[cfg(feature = "grpc")]
                        "grpc" => Transport::Grpc,
                        other => return Err(format!("unknown transport {other:?}")),
                    }
                }
                other => return Err(format!("unexpected argument {other:?}")),
            }
        }
        Ok(Args {
            id: id.ok_or("--id is required")?,
            connection: connection.ok_or("--connection is required")?,
            transport,
        })
    }
}

/// Appends lifecycle lines to the journal file, if one was given.
#[derive(Debug, Clone)]
struct Journal {
    path: Option<PathBuf>,
    prefix: String,
}

impl Journal {
    fn from_env(id: &str) -> Self {
        Journal {
            path: std::env::var_os(JOURNAL_ENV).map(PathBuf::from),
            prefix: format!("{} {id}", std::process::id()),
        }
    }

    fn record(&self, event: &str) {
        let Some(path) = &self.path else { return };
        let line = format!("{} {event}\n", self.prefix);
        let written = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!(
                "tour worker: cannot write the journal {}: {e}",
                path.display()
            );
        }
    }
}

/// Worker-mode entry point; `args` are the process arguments after the program name.
pub fn main(args: &[String]) -> ExitCode {
    let args = match Args::parse(args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("tour worker: {e}");
            eprintln!(
                "usage: tour --worker --id <uuid> --connection <socket path | port> [--transport framed|grpc]"
            );
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tour worker: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tour worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> std::io::Result<()> {
    // The handler exists before the socket does, so a SIGTERM after readiness is ours.
    let mut sigterm = signal(SignalKind::terminate())?;
    let journal = Journal::from_env(&args.id);
    journal.record("start");
    let sessions = Arc::new(AtomicU64::new(0));
    let stop = async {
        tokio::select! {
            _ = sigterm.recv() => "sigterm",
            () = parent_gone() => "parent-gone",
        }
    };
    let reason = match args.transport {
        Transport::Framed => serve_framed(&args, stop, &sessions).await?,
        #[cfg(feature = "grpc")]
        Transport::Grpc => serve_grpc(&args, stop, &sessions).await?,
    };
    journal.record(&format!(
        "exit reason={reason} sessions={}",
        sessions.load(Ordering::SeqCst)
    ));
    Ok(())
}

/// Resolves when the process that started this worker has exited (the worker was
/// re-parented), so an engine that died without stopping it leaves nothing running.
async fn parent_gone() {
    let parent = nix::unistd::getppid();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if nix::unistd::getppid() != parent {
            return;
        }
    }
}

/// Serves framed sessions until `stop` resolves; returns its reason.
async fn serve_framed(
    args: &Args,
    stop: impl Future<Output = &'static str>,
    sessions: &Arc<AtomicU64>,
) -> std::io::Result<&'static str> {
    let (listener, socket) = match args.connection.parse::<u16>() {
        Ok(port) => {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            (FramedListener::bind_tcp(addr).await?, None)
        }
        Err(_) => (
            FramedListener::bind_unix(&args.connection)?,
            Some(PathBuf::from(&args.connection)),
        ),
    };
    let config = FramedConfig::default();
    let mut tasks = JoinSet::new();
    tokio::pin!(stop);
    let reason = loop {
        tokio::select! {
            reason = &mut stop => break reason,
            accepted = listener.accept::<UdfResponse, UdfRequest>(&config) => match accepted {
                Ok(connection) => {
                    let udf = TourUdf::new(sessions.clone());
                    tasks.spawn(serve(connection, udf, EndpointConfig::default()));
                }
                Err(e) => {
                    eprintln!("tour worker: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    };
    drop(listener);
    if let Some(path) = socket
        && let Err(e) = std::fs::remove_file(&path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        eprintln!("tour worker: cannot remove {}: {e}", path.display());
    }
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        eprintln!(
            "tour worker: {} session(s) still open after {SHUTDOWN_GRACE:?}; closing them",
            tasks.len()
        );
    }
    tasks.shutdown().await;
    Ok(reason)
}

/// Serves the official `UdfWorker` gRPC service until `stop` resolves; returns its reason.
#[cfg(feature = "grpc")]
async fn serve_grpc(
    args: &Args,
    stop: impl Future<Output = &'static str>,
    sessions: &Arc<AtomicU64>,
) -> std::io::Result<&'static str> {
    use tether::spark::udf_grpc::{GrpcConfig, WorkerServer, WorkerService};

    let sessions = sessions.clone();
    let config = GrpcConfig {
        shutdown_grace: SHUTDOWN_GRACE,
        ..GrpcConfig::default()
    };
    let service = WorkerService::for_udf(
        move || TourUdf::new(sessions.clone()),
        EndpointConfig::default(),
    )
    .with_config(config);
    let server = WorkerServer::bind_unix(&args.connection, service)?;
    let reason = stop.await;
    // Graceful: removes the socket file, lets open streams end within the grace.
    server.shutdown().await;
    Ok(reason)
}
