//! The README's worker and engine, built as a user would build them: a fresh crate under
//! `<target>/fresh-crate/` that depends on tether by path (feature `grpc`), with the two
//! snippets copied from `README.md` as its binaries, the workspace's `Cargo.lock` and this
//! run's target directory (so only tether and the two binaries are compiled after the first
//! run). Checks:
//!
//! - the snippets are rustfmt'd, at most 25 lines each (not counting `use` lines, blank
//!   lines and comments), and identical to `examples/echo_worker.rs` / `echo_engine.rs`;
//! - the engine's dispatcher spawns the worker binary and they finish a session over gRPC
//!   on a Unix socket: the echoed rows and the `Finished` outcome are printed (udf §6.2,
//!   §6.4);
//! - the worker binary as a process (`WorkerMain`, udf §1.9, §6.1): a usage error exits 2,
//!   SIGTERM stops it with status 0 and its socket removed, a stale socket file is replaced,
//!   a live one is refused by path, and it exits when its parent goes away.

#![cfg(feature = "grpc")]

use std::io::Read as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The most lines a snippet may have, `use` lines, blank lines and comments not counted.
const MAX_LINES: usize = 25;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The running target directory (`CARGO_TARGET_TMPDIR` is its `tmp` subdirectory).
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent()
        .expect("CARGO_TARGET_TMPDIR has a parent")
        .to_owned()
}

/// The ```rust block after the marker `<!-- fresh-crate: NAME -->` in the README.
fn snippet(readme: &str, name: &str) -> String {
    let marker = format!("<!-- fresh-crate: {name} -->");
    let after = readme
        .split_once(&marker)
        .unwrap_or_else(|| panic!("README.md has no {marker}"))
        .1;
    let body = after
        .trim_start()
        .strip_prefix("```rust\n")
        .unwrap_or_else(|| panic!("a ```rust block follows {marker}"));
    let end = body.find("\n```").expect("the block is closed");
    format!("{}\n", &body[..end])
}

/// An example file without its leading `//!` doc comment.
fn example_body(name: &str) -> String {
    let text = std::fs::read_to_string(root().join("examples").join(name)).unwrap();
    text.lines()
        .skip_while(|l| l.starts_with("//!"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Lines that count: not blank, not a comment, not part of a `use` item.
fn counted_lines(code: &str) -> usize {
    let mut in_use = false;
    let mut count = 0;
    for line in code.lines() {
        let line = line.trim();
        if in_use {
            in_use = !line.ends_with(';');
            continue;
        }
        if line.starts_with("use ") || line.starts_with("pub use ") {
            in_use = !line.ends_with(';');
            continue;
        }
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        count += 1;
    }
    count
}

#[test]
fn counting_skips_use_items_blank_lines_and_comments() {
    let code = "use a::{\n    b,\n    c,\n};\nuse d;\n\n// note\n/// doc\nfn main() {\n    x(); // trailing\n}\n";
    assert_eq!(counted_lines(code), 3);
}

/// Runs `command` to its end, killing it after `limit`; returns its output.
fn run_bounded(command: &mut Command, limit: Duration) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let status = wait_bounded(&mut child, limit)
        .unwrap_or_else(|| panic!("{command:?} did not end within {limit:?}"));
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Waits for `child` up to `limit`; kills it and returns `None` when it is still running.
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The fresh crate's two binaries: (worker, engine).
struct Built {
    worker: PathBuf,
    engine: PathBuf,
}

/// Writes the fresh crate and builds it once per test run.
fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
        let worker = snippet(&readme, "worker");
        let engine = snippet(&readme, "engine");
        assert_eq!(
            worker,
            example_body("echo_worker.rs"),
            "README worker ≠ example"
        );
        assert_eq!(
            engine,
            example_body("echo_engine.rs"),
            "README engine ≠ example"
        );

        let target = target_dir();
        let dir = target.join("fresh-crate");
        std::fs::create_dir_all(dir.join("src/bin")).unwrap();
        let manifest = format!(
            r#"[package]
name = "tether-fresh-crate"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[[bin]]
name = "fresh-worker"
path = "src/bin/worker.rs"

[[bin]]
name = "fresh-engine"
path = "src/bin/engine.rs"

[dependencies]
spark-tether = {{ path = {:?}, features = ["grpc"] }}
bytes = "1"
futures = "0.3"
tokio = {{ version = "1", features = ["macros", "rt-multi-thread"] }}
"#,
            root().display().to_string()
        );
        write_if_changed(&dir.join("Cargo.toml"), &manifest);
        write_if_changed(&dir.join("src/bin/worker.rs"), &worker);
        write_if_changed(&dir.join("src/bin/engine.rs"), &engine);
        std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();

        let rustfmt = Command::new("rustfmt")
            .args(["--check", "--edition", "2024"])
            .arg(dir.join("src/bin/worker.rs"))
            .arg(dir.join("src/bin/engine.rs"))
            .output()
            .expect("rustfmt runs");
        assert!(
            rustfmt.status.success(),
            "the README snippets are not rustfmt'd:\n{}",
            String::from_utf8_lossy(&rustfmt.stdout)
        );
        let (worker_lines, engine_lines) = (counted_lines(&worker), counted_lines(&engine));
        println!("worker: {worker_lines} lines, engine: {engine_lines} lines");
        assert!(
            worker_lines <= MAX_LINES,
            "the worker has {worker_lines} lines"
        );
        assert!(
            engine_lines <= MAX_LINES,
            "the engine has {engine_lines} lines"
        );

        let started = Instant::now();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let build = run_bounded(
            Command::new(cargo)
                .args(["build", "--offline", "--bins", "--quiet"])
                .current_dir(&dir)
                .env("CARGO_TARGET_DIR", &target),
            Duration::from_secs(900),
        );
        assert!(
            build.status.success(),
            "the fresh crate does not build:\n{}",
            String::from_utf8_lossy(&build.stderr)
        );
        println!("fresh crate built in {:?}", started.elapsed());
        let bin = target.join("debug");
        Built {
            worker: bin.join("fresh-worker"),
            engine: bin.join("fresh-engine"),
        }
    })
}

/// Writes `text` unless the file already holds it (keeps mtimes, so cargo rebuilds less).
fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text).unwrap();
    }
}

#[test]
fn the_readme_engine_finishes_a_session_on_the_readme_worker_over_grpc() {
    let built = built();
    let started = Instant::now();
    let run = run_bounded(
        Command::new(&built.engine).arg(&built.worker),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("engine ran in {:?}:\n{stdout}", started.elapsed());
    assert!(
        run.status.success(),
        "engine failed: {}\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, ["echoed hello", "echoed world", "Finished"]);
}

/// A scratch directory for sockets, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tether-fresh-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits until something accepts connections on `path`.
fn wait_listening(path: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(path).is_err() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the worker exited early"
        );
        assert!(Instant::now() < deadline, "the worker never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sigterm(pid: u32) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

#[test]
fn the_worker_binary_explains_a_bad_command_line() {
    let built = built();
    let out = run_bounded(&mut Command::new(&built.worker), Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr,
        "fresh-worker: --id <worker id> is missing\n\
         usage: WORKER [ARGUMENTS...] --id <worker id> --connection <socket path | port>\n"
    );
}

#[test]
fn the_worker_replaces_a_stale_socket_and_stops_cleanly_on_sigterm() {
    let built = built();
    let scratch = Scratch::new("stale");
    let path = scratch.0.join("w.sock");
    // A killed predecessor's socket file: nothing listens, a connect is refused.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let mut worker = Command::new(&built.worker)
        .args(["--id", "w1", "--connection"])
        .arg(&path)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(&path, &mut worker);
    sigterm(worker.id());
    let status = wait_bounded(&mut worker, Duration::from_secs(20)).expect("stops on SIGTERM");
    let mut stderr = String::new();
    worker
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(!path.exists(), "the socket file is removed");
}

#[test]
fn the_worker_refuses_a_socket_another_process_listens_on() {
    let built = built();
    let scratch = Scratch::new("live");
    let path = scratch.0.join("w.sock");
    let _live = UnixListener::bind(&path).unwrap();
    let out = run_bounded(
        Command::new(&built.worker)
            .args(["--id", "w1", "--connection"])
            .arg(&path),
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "fresh-worker: another process is listening on the socket {}\n",
            path.display()
        )
    );
    assert!(path.exists(), "the live socket is left alone");
}

#[test]
fn the_worker_exits_when_its_parent_goes_away() {
    let built = built();
    let scratch = Scratch::new("orphan");
    let path = scratch.0.join("w.sock");
    // bash starts the worker in the background and exits once it listens: the worker is
    // orphaned after it noted its parent.
    let out = run_bounded(
        Command::new("bash")
            .arg("-c")
            .arg(concat!(
                r#""$0" --id w1 --connection "$1" </dev/null >/dev/null 2>&1 & "#,
                r#"while [ ! -S "$1" ]; do sleep 0.01; done; echo $!"#
            ))
            .arg(&built.worker)
            .arg(&path),
        Duration::from_secs(20),
    );
    assert!(out.status.success());
    let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    // It notices within its 500 ms poll, stops gracefully and removes its socket.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie its new parent has not reaped yet.
        let ended = stat.is_empty() || stat.rsplit(") ").next().is_some_and(|s| s.starts_with('Z'));
        if ended {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the orphaned worker {pid} is still running"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!path.exists(), "the socket file is removed");
}
