//! Worker processes of the benchmarks: the bench binary re-executed in a role, serving on
//! a Unix socket (`#[path]`-included by each bench binary that spawns workers).

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// This binary re-executed with `role_env=role`, listening on `path`; killed and reaped
/// (and its socket file removed) on drop.
pub struct ChildProcess {
    child: Child,
    /// The socket the child serves on.
    pub path: PathBuf,
}

impl ChildProcess {
    /// Starts this binary with `role_env=role` and `args`, and waits until `path` accepts
    /// a connection (polled every 5 ms). Panics if the child exits first or is not
    /// listening after 10 s.
    pub fn listening(role_env: &str, role: &str, args: &[&OsStr], path: PathBuf) -> Self {
        let _ = std::fs::remove_file(&path);
        let child = Command::new(std::env::current_exe().expect("this bench binary"))
            .env(role_env, role)
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn a child process");
        let mut process = ChildProcess { child, path };
        let give_up = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&process.path).is_err() {
            if let Ok(Some(status)) = process.child.try_wait() {
                panic!("{role} process ended at start: {status}");
            }
            assert!(Instant::now() < give_up, "{role} not listening after 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        process
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}
