//! The Python side: the venv's interpreter running the scripts under `tests/python/`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The Python interpreter of the venv and the scripts directory.
pub struct PythonEnv {
    python: PathBuf,
    scripts: PathBuf,
}

/// Exit status of the Python helpers for an environment problem (see `udf_protos.py`).
const PY_ENV_ERROR: i32 = 3;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's Python, checked by a preflight that validates the pinned packages and
/// generates the classes; `None` (after a loud message) when it cannot run.
///
/// # Panics
/// Under `CI=true` instead of returning `None`.
pub fn python_env(test: &str) -> Option<PythonEnv> {
    let python = match std::env::var_os("TETHER_PYTHON") {
        Some(path) => repo().join(path),
        None => repo().join("target/py-venv/bin/python"),
    };
    if !python.exists() {
        return unavailable(
            test,
            &format!("no Python venv at {} (no python3?)", python.display()),
        );
    }
    let env = PythonEnv {
        python,
        scripts: repo().join("tests/python"),
    };
    let preflight = env
        .command("udf_protos.py")
        .arg("--generate")
        .output()
        .expect("the venv's python runs");
    match preflight.status.code() {
        Some(0) => Some(env),
        Some(PY_ENV_ERROR) => unavailable(test, String::from_utf8_lossy(&preflight.stderr).trim()),
        _ => panic!(
            "udf_protos.py --generate failed: {}",
            String::from_utf8_lossy(&preflight.stderr)
        ),
    }
}

fn unavailable<T>(test: &str, why: &str) -> Option<T> {
    let why = format!(
        "the Python conformance peer cannot run: {why}. Run scripts/test.sh (or `bash \
         scripts/python-env.sh` once) to set up target/py-venv"
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("FAILED (CI=true, no skipping): {test}: {why}");
    }
    // Straight to the process's stderr, past the test harness's capture, so it is seen.
    let _ = writeln!(std::io::stderr(), "\n!!!!! SKIPPED: {test}: {why} !!!!!\n");
    None
}

impl PythonEnv {
    /// `python tests/python/<script>`, run from the repository root.
    pub fn command(&self, script: &str) -> Command {
        let mut command = Command::new(&self.python);
        command
            .arg(self.scripts.join(script))
            .env("PYTHONIOENCODING", "utf-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(repo());
        command
    }

    /// Runs `script` with `input` on stdin; its whole output.
    pub fn run(&self, script: &str, input: Vec<u8>) -> Output {
        let mut child = self
            .command(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the venv's python starts");
        let mut stdin = child.stdin.take().expect("piped stdin");
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let output = child.wait_with_output().expect("python ran");
        writer
            .join()
            .expect("writer thread")
            .expect("stdin written");
        output
    }
}
