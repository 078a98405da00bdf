//! Processes: spawning with merged output captured to a log file, the output tail for error
//! reports, liveness checks that do not reap, graceful stop (SIGTERM, grace, SIGKILL, reap)
//! and the environment callables (udf §6.1, §6.3).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::wire::ProcessCallable;

use super::error::{CallableStage, EnvironmentError, ExitReason};

/// Lines of output quoted in error messages (udf §7 `PROCESS_OUTPUT_TAIL_LINES`).
pub const OUTPUT_TAIL_LINES: usize = 50;
/// Bytes scanned from the end of an output log (udf §7 `MAX_OUTPUT_SCAN_BYTES`).
pub const MAX_OUTPUT_SCAN_BYTES: u64 = 1024 * 1024;

/// The last [`OUTPUT_TAIL_LINES`] lines of the file at `path`, reading at most the last
/// [`MAX_OUTPUT_SCAN_BYTES`] (lossy UTF-8). Empty when the file is missing or empty.
pub(crate) fn output_tail(path: &Path) -> String {
    tail_of(path, |lines| lines.len().saturating_sub(OUTPUT_TAIL_LINES))
}

/// What a lost connection quotes of the worker's output ([`WorkerLost`](super::WorkerLost)):
/// the last [`OUTPUT_TAIL_LINES`] lines, as [`output_tail`], except that when a Rust panic
/// report (a line with ` panicked at `) is among the last four times as many lines, the
/// quote starts at the last one, so that the panic's location and message lead rather than
/// be pushed out by its backtrace.
pub(crate) fn loss_output_tail(path: &Path) -> String {
    tail_of(path, |lines| {
        let tail = lines.len().saturating_sub(OUTPUT_TAIL_LINES);
        lines
            .iter()
            .rposition(|l| l.contains(" panicked at "))
            .filter(|&panic| panic >= tail.saturating_sub(3 * OUTPUT_TAIL_LINES))
            .unwrap_or(tail)
    })
}

/// Up to [`OUTPUT_TAIL_LINES`] lines of the file at `path` from the line `first` picks among
/// those of its last [`MAX_OUTPUT_SCAN_BYTES`] (lossy UTF-8). Empty when the file is
/// missing or empty.
fn tail_of(path: &Path, first: impl FnOnce(&[&str]) -> usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(MAX_OUTPUT_SCAN_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.trim_end_matches('\n').lines().collect();
    // A scan that started mid-file may begin mid-line: drop that fragment.
    if start > 0 && lines.len() > 1 {
        lines.remove(0);
    }
    let from = first(&lines).min(lines.len());
    let to = (from + OUTPUT_TAIL_LINES).min(lines.len());
    lines[from..to].join("\n")
}

/// The command line of `callable` plus `extra` arguments, for messages.
pub(crate) fn command_line(callable: &ProcessCallable, extra: &[String]) -> String {
    callable
        .command
        .iter()
        .chain(&callable.arguments)
        .chain(extra)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Starts `command ++ arguments ++ extra` with the callable's environment variables added to
/// the engine's, stdin from `/dev/null`, stdout and stderr appended to `log` (merged). With
/// `own_group` the process leads a new process group, so signals reach its children too.
pub(crate) fn spawn(
    callable: &ProcessCallable,
    extra: &[String],
    log: Option<&File>,
    own_group: bool,
) -> io::Result<Child> {
    let (program, leading) = callable
        .command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(leading)
        .args(&callable.arguments)
        .args(extra)
        .envs(&callable.environment_variables)
        .stdin(Stdio::null());
    match log {
        Some(log) => {
            cmd.stdout(log.try_clone()?).stderr(log.try_clone()?);
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    if own_group {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    cmd.spawn()
}

/// Creates (truncating) an output log readable only by the owner.
pub(crate) fn create_log(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
}

/// Whether [`peek_exit`] leaves an exited child unreaped on this platform.
const PEEK_KEEPS_ZOMBIE: bool = cfg!(any(
    target_os = "android",
    target_os = "freebsd",
    all(target_os = "linux", not(target_env = "uclibc"))
));

/// Whether `child` has ended, and how, preferably without reaping it.
///
/// On Linux (and Android/FreeBSD) this uses `waitid(WNOWAIT)`, so the process stays a zombie
/// and its pid (and process-group id) cannot be reused until [`stop`] reaps it: signalling
/// the group afterwards is safe. Elsewhere it falls back to `try_wait`, which reaps.
pub(crate) fn peek_exit(child: &mut Child) -> Option<ExitReason> {
    #[cfg(any(
        target_os = "android",
        target_os = "freebsd",
        all(target_os = "linux", not(target_env = "uclibc"))
    ))]
    {
        use nix::errno::Errno;
        use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid_of(child)), flags) {
            Ok(WaitStatus::Exited(_, code)) => return Some(ExitReason::Code(code)),
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                return Some(ExitReason::Signal(signal as i32));
            }
            Ok(_) => return None,
            // Already reaped (std caches the status): fall through to try_wait.
            Err(Errno::ECHILD) => {}
            Err(_) => return None,
        }
    }
    match child.try_wait() {
        Ok(Some(status)) => Some(ExitReason::from_status(status)),
        _ => None,
    }
}

fn signal(pid: Pid, group: bool, sig: Signal) {
    let result = if group {
        killpg(pid, sig)
    } else {
        kill(pid, sig)
    };
    if let Err(e) = result
        && e != nix::errno::Errno::ESRCH
    {
        tracing::warn!(pid = pid.as_raw(), ?sig, error = %e, "could not signal worker process");
    }
}

/// Polls `done` every few milliseconds until it is true or `timeout` passes.
fn poll_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = crate::time::deadline_after(Instant::now(), timeout);
    let mut step = Duration::from_millis(1);
    loop {
        if done() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(step.min(deadline - now));
        step = (step * 2).min(Duration::from_millis(10));
    }
}

/// Stops and reaps `child` (udf §6.1 `close`): SIGTERM (to its process group when
/// `group`), up to `grace` for it to exit, then SIGKILL (to the group: it also ends children
/// the worker left behind), then up to `reap_timeout` for the kernel to reap it; after that a
/// warning and a blocking wait (a process in uninterruptible sleep). Blocks the calling
/// thread. Returns how it ended.
pub(crate) fn stop(
    child: &mut Child,
    group: bool,
    grace: Duration,
    reap_timeout: Duration,
) -> Option<ExitReason> {
    let pid = pid_of(child);
    let mut exited = peek_exit(child);
    if exited.is_none() && !grace.is_zero() {
        signal(pid, group, Signal::SIGTERM);
        poll_until(grace, || {
            exited = peek_exit(child);
            exited.is_some()
        });
    }
    // Unreaped, the leader's pid (and so the group id) cannot be reused: signalling is safe.
    let maybe_reaped = exited.is_some() && !PEEK_KEEPS_ZOMBIE;
    if group && !maybe_reaped {
        signal(pid, true, Signal::SIGKILL);
    } else if exited.is_none() {
        signal(pid, false, Signal::SIGKILL);
    }
    let mut status = None;
    if !poll_until(reap_timeout, || match child.try_wait() {
        Ok(Some(s)) => {
            status = Some(s);
            true
        }
        Ok(None) => false,
        Err(_) => true,
    }) {
        tracing::warn!(
            pid = pid.as_raw(),
            "worker process not reaped {}ms after SIGKILL (uninterruptible sleep?); waiting",
            reap_timeout.as_millis()
        );
        status = child.wait().ok();
    }
    status.map(ExitReason::from_status).or(exited)
}

/// What running an environment callable gave.
pub(crate) enum CallableRun {
    Success,
    Failed(EnvironmentError),
}

/// Runs an environment callable to completion (udf §6.3): merged output to `log_path`
/// (deleted afterwards), at most `timeout`, after which its process group is killed and it
/// is reaped. Blocks the calling thread.
pub(crate) fn run_callable(
    stage: CallableStage,
    callable: &ProcessCallable,
    timeout: Duration,
    log_path: &Path,
    own_group: bool,
) -> CallableRun {
    let log = create_log(log_path)
        .inspect_err(|e| tracing::warn!(error = %e, ?log_path, "no output log for callable"))
        .ok();
    let outcome = run_with_log(stage, callable, timeout, log.as_ref(), log_path, own_group);
    drop(log);
    let _ = std::fs::remove_file(log_path);
    outcome
}

fn run_with_log(
    stage: CallableStage,
    callable: &ProcessCallable,
    timeout: Duration,
    log: Option<&File>,
    log_path: &Path,
    own_group: bool,
) -> CallableRun {
    let mut child = match spawn(callable, &[], log, own_group) {
        Ok(child) => child,
        Err(e) => {
            return CallableRun::Failed(EnvironmentError::Spawn {
                stage,
                command: command_line(callable, &[]),
                source: std::sync::Arc::new(e),
            });
        }
    };
    tracing::debug!(%stage, pid = child.id(), "environment callable started");
    let mut status = None;
    let finished = poll_until(timeout, || match child.try_wait() {
        Ok(Some(s)) => {
            status = Some(s);
            true
        }
        Ok(None) => false,
        Err(_) => true,
    });
    if !finished {
        // Not reaped yet, so the group id is still ours.
        signal(pid_of(&child), own_group, Signal::SIGKILL);
        let _ = child.wait();
        return CallableRun::Failed(EnvironmentError::TimedOut {
            stage,
            after: timeout,
            output: output_tail(log_path),
        });
    }
    match status {
        Some(s) if s.success() => CallableRun::Success,
        Some(s) => CallableRun::Failed(EnvironmentError::Failed {
            stage,
            reason: ExitReason::from_status(s),
            output: output_tail(log_path),
        }),
        None => CallableRun::Failed(EnvironmentError::Spawn {
            stage,
            command: command_line(callable, &[]),
            source: std::sync::Arc::new(io::Error::other("waiting for the callable failed")),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_tail_keeps_the_last_lines_within_the_scan_window() {
        let dir = std::env::temp_dir().join(format!("tether-tail-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("log");
        let text: String = (0..200).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let tail = output_tail(&path);
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), OUTPUT_TAIL_LINES);
        assert_eq!(lines[0], "line 150");
        assert_eq!(lines[49], "line 199");

        // A huge last line: only the last 1 MiB is scanned.
        let big = "x".repeat(3 * 1024 * 1024);
        std::fs::write(&path, format!("first\n{big}\nlast\n")).unwrap();
        let tail = output_tail(&path);
        assert!(!tail.contains("first"));
        assert!(tail.ends_with("last"));
        assert!(tail.len() <= MAX_OUTPUT_SCAN_BYTES as usize);

        assert_eq!(output_tail(&dir.join("missing")), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_lost_connection_quotes_from_the_last_recent_panic_report() {
        let dir = std::env::temp_dir().join(format!("tether-tail-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("log");
        let frames: String = (0..80).map(|i| format!("  {i}: frame\n")).collect();
        let panic = "thread 'main' panicked at src/udf.rs:7:5:\nboom\nstack backtrace:\n";
        std::fs::write(&path, format!("started\n{panic}{frames}")).unwrap();
        let tail = loss_output_tail(&path);
        assert!(
            tail.starts_with("thread 'main' panicked at src/udf.rs:7:5:\nboom"),
            "{tail}"
        );
        assert_eq!(tail.lines().count(), OUTPUT_TAIL_LINES);
        assert!(
            !output_tail(&path).contains("boom"),
            "pushed out of the plain tail"
        );

        // A panic long before the end (a reused worker's earlier session) is not it.
        let later: String = (0..500).map(|i| format!("later {i}\n")).collect();
        std::fs::write(&path, format!("{panic}{later}")).unwrap();
        assert_eq!(loss_output_tail(&path), output_tail(&path));
        std::fs::write(&path, "no panic\n").unwrap();
        assert_eq!(loss_output_tail(&path), "no panic");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
