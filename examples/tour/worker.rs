//! Worker mode: what the tour's executable does when a dispatcher starts it as
//! `tour --worker [--framed] --id <uuid> --connection <socket path>` (udf §1.9
//! `ProcessCallable`: the engine appends `--id` and `--connection`).
//!
//! Everything a worker process needs is tether's [`WorkerMain`]: it parses `--id` and
//! `--connection`, installs the SIGTERM handler before it binds, serves the official
//! `UdfWorker` gRPC service on the socket (or tether's framed transport with `--framed`),
//! stops when its parent engine has gone away, and shuts down gracefully (stop accepting, a
//! short grace for open sessions, the socket file removed). The tour adds only:
//!
//! - a fresh [`TourUdf`] per session: Arrow IPC in, the Init payload's UDF, Arrow IPC out; a
//!   Cancel is honoured at the next batch boundary (the `CancelResponse` carries the partial
//!   metrics);
//! - if `TETHER_TOUR_JOURNAL` names a file, a line `<pid> <id> start` when it starts and
//!   `<pid> <id> exit reason=sigterm|parent-exited|… sessions=N` when it stops cleanly; the
//!   tour reads them to show how each worker ended (a SIGKILLed worker has no exit line).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tether::connection::framed::FramedConfig;
use tether::spark::udf_grpc::{USAGE, WorkerArgs, WorkerMain};

use super::udf::TourUdf;

/// Environment variable naming the lifecycle journal file.
pub const JOURNAL_ENV: &str = "TETHER_TOUR_JOURNAL";
/// How long open sessions may take to end after SIGTERM before they are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

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
    let args = match WorkerArgs::parse(args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("tour worker: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let framed = match args
        .arguments
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()[..]
    {
        ["--worker"] => false,
        ["--worker", "--framed"] => true,
        _ => {
            eprintln!("tour worker: unexpected arguments {:?}", args.arguments);
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
    let journal = Journal::from_env(&args.id);
    journal.record("start");
    let sessions = Arc::new(AtomicU64::new(0));
    let counter = sessions.clone();
    let mut worker =
        WorkerMain::new(move || TourUdf::new(counter.clone())).with_shutdown_grace(SHUTDOWN_GRACE);
    if framed {
        worker = worker.with_framed(FramedConfig::default());
    }
    match runtime.block_on(worker.serve(&args)) {
        Ok(reason) => {
            let served = sessions.load(Ordering::SeqCst);
            journal.record(&format!("exit reason={reason} sessions={served}"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tour worker: {}", super::scenarios::chain(&e));
            ExitCode::FAILURE
        }
    }
}
