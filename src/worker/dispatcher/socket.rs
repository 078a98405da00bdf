//! The dispatcher's private directory (sockets and output logs) and socket names
//! (udf §6.4).

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::DispatchError;

/// Longest Unix socket path in bytes: `sun_path` minus the terminating NUL (udf §6.4).
pub const MAX_SOCKET_PATH_BYTES: usize = if cfg!(any(target_os = "linux", target_os = "android")) {
    107
} else {
    103
};

/// Collision suffixes tried after the plain leaf name (udf §6.4: `-1`…`-16`).
const LEAF_RETRIES: usize = 16;

/// Candidate base directories: `base` if configured, else `$TMPDIR`, `$TEMP`, `$TMP` and
/// `/tmp` (set and non-empty, duplicates removed), shortest first.
pub(crate) fn base_candidates(base: Option<&Path>) -> Vec<PathBuf> {
    if let Some(base) = base {
        return vec![base.to_path_buf()];
    }
    let mut out: Vec<PathBuf> = Vec::new();
    let env = ["TMPDIR", "TEMP", "TMP"]
        .into_iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    for p in env.chain([PathBuf::from("/tmp")]) {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    // Stable: among equal lengths the environment's order wins.
    out.sort_by_key(|p| p.as_os_str().len());
    out
}

/// Creates the dispatcher's private directory, mode `0700`, under the shortest writable
/// candidate (udf §6.4). The mode is set at creation (`mkdir(2)` with mode 0700, so no
/// window with wider permissions) and re-applied if a umask changed it.
pub(crate) fn create_private_dir(base: Option<&Path>) -> Result<PathBuf, DispatchError> {
    let tried = base_candidates(base);
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no candidate directory");
    for candidate in &tried {
        for _ in 0..4 {
            let hex = uuid::Uuid::new_v4().simple().to_string();
            let dir = candidate.join(format!("tether-udf-{}", &hex[..12]));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {
                    let mode = std::fs::metadata(&dir).map(|m| m.permissions().mode() & 0o777);
                    if !matches!(mode, Ok(0o700)) {
                        let fixed = std::fs::Permissions::from_mode(0o700);
                        if let Err(e) = std::fs::set_permissions(&dir, fixed) {
                            tracing::warn!(?dir, error = %e, "could not make the socket directory private (0700)");
                        }
                    }
                    return Ok(dir);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
                Err(e) => {
                    last = e;
                    break;
                }
            }
        }
    }
    Err(DispatchError::SocketDirectory {
        tried,
        source: last,
    })
}

/// Picks `dir/w-<hex16>.sock` (or `-1`…`-16` suffixed when taken) and its log path
/// `….log`; checks the socket path length (udf §6.4).
pub(crate) fn allocate_leaf(dir: &Path, hex16: &str) -> Result<(PathBuf, PathBuf), DispatchError> {
    for attempt in 0..=LEAF_RETRIES {
        let stem = if attempt == 0 {
            format!("w-{hex16}")
        } else {
            format!("w-{hex16}-{attempt}")
        };
        let socket = dir.join(format!("{stem}.sock"));
        let len = socket.as_os_str().as_bytes().len();
        if len > MAX_SOCKET_PATH_BYTES {
            return Err(DispatchError::SocketPathTooLong {
                path: socket,
                len,
                max: MAX_SOCKET_PATH_BYTES,
            });
        }
        let log = dir.join(format!("{stem}.log"));
        if !socket.exists() && !log.exists() {
            return Ok((socket, log));
        }
    }
    Err(DispatchError::SocketNameExhausted {
        dir: dir.to_path_buf(),
    })
}

/// A free loopback TCP port: bound, read and released (another process can take it before
/// the worker binds it; the readiness wait then fails).
pub(crate) fn free_tcp_port() -> io::Result<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    listener.local_addr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_names_take_suffixes_on_collision_and_paths_are_length_checked() {
        let dir = create_private_dir(None).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let (s0, l0) = allocate_leaf(&dir, "0123456789abcdef").unwrap();
        assert!(s0.ends_with("w-0123456789abcdef.sock"));
        assert!(l0.ends_with("w-0123456789abcdef.log"));
        std::fs::write(&s0, b"").unwrap();
        let (s1, _) = allocate_leaf(&dir, "0123456789abcdef").unwrap();
        assert!(s1.ends_with("w-0123456789abcdef-1.sock"));
        for i in 1..=LEAF_RETRIES {
            std::fs::write(dir.join(format!("w-0123456789abcdef-{i}.sock")), b"").unwrap();
        }
        assert!(matches!(
            allocate_leaf(&dir, "0123456789abcdef"),
            Err(DispatchError::SocketNameExhausted { .. })
        ));
        let deep = dir.join("d".repeat(100));
        assert!(matches!(
            allocate_leaf(&deep, "0123456789abcdef"),
            Err(DispatchError::SocketPathTooLong {
                max: MAX_SOCKET_PATH_BYTES,
                ..
            })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn candidates_are_deduplicated_and_shortest_first() {
        let c = base_candidates(Some(Path::new("/x/y")));
        assert_eq!(c, vec![PathBuf::from("/x/y")]);
        let c = base_candidates(None);
        assert!(c.contains(&PathBuf::from("/tmp")));
        assert!(
            c.windows(2)
                .all(|w| w[0].as_os_str().len() <= w[1].as_os_str().len())
        );
    }
}
