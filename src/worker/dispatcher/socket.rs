//! The dispatcher's private directory (sockets and output logs) and socket names
//! (udf §6.4).

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::DispatchError;

/// Longest Unix socket path in bytes: `sun_path` minus the terminating NUL (udf §6.4).
pub const MAX_SOCKET_PATH_BYTES: usize = if cfg!(any(target_os = "linux", target_os = "android")) {
    107
} else {
    103
};

/// The prefix of a dispatcher's private directory's name (`tether-udf-<12 hex>`).
const DIR_PREFIX: &str = "tether-udf-";

/// The file in a private directory naming the process that owns it: `<pid> <start time>
/// <pid namespace>` (the start time from `/proc/<pid>/stat`, in clock ticks since boot, so
/// that a reused pid is not taken for the owner; the namespace from `/proc/self/ns/pid`, so
/// that a process of another container sharing the base directory is never judged by a pid
/// that is not its own; both `-` where there is no `/proc`).
const OWNER_FILE: &str = "owner";

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

/// The longest socket path [`allocate_leaf`] can give in `dir`: `w-<16 hex>-16.sock`.
fn longest_socket_path(dir: &Path) -> PathBuf {
    dir.join(format!("w-{}-{LEAF_RETRIES}.sock", "0".repeat(16)))
}

/// Creates the dispatcher's private directory, mode `0700`, under the shortest writable
/// candidate (udf §6.4). The mode is set at creation (`mkdir(2)` with mode 0700, so no
/// window with wider permissions) and re-applied if a umask changed it. With `sockets`
/// (workers reached over Unix sockets), a candidate where a worker's socket path would be
/// over [`MAX_SOCKET_PATH_BYTES`] is passed over, so that the limit fails the dispatcher's
/// construction, not its first session.
///
/// # Errors
/// [`DispatchError::SocketPathTooLong`] when `sockets` and no candidate is short enough;
/// [`DispatchError::SocketDirectory`] when none could be created.
pub(crate) fn create_private_dir(
    base: Option<&Path>,
    sockets: bool,
) -> Result<PathBuf, DispatchError> {
    let tried = base_candidates(base);
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no candidate directory");
    let mut too_long = None;
    for candidate in &tried {
        // The directory's own name is as long as `tether-udf-<12 hex>`.
        let longest =
            longest_socket_path(&candidate.join(format!("{DIR_PREFIX}{}", "0".repeat(12))));
        let len = longest.as_os_str().as_bytes().len();
        if sockets && len > MAX_SOCKET_PATH_BYTES {
            too_long.get_or_insert(DispatchError::SocketPathTooLong {
                path: longest,
                len,
                max: MAX_SOCKET_PATH_BYTES,
            });
            continue;
        }
        for _ in 0..4 {
            let hex = uuid::Uuid::new_v4().simple().to_string();
            let dir = candidate.join(format!("{DIR_PREFIX}{}", &hex[..12]));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {
                    let mode = std::fs::metadata(&dir).map(|m| m.permissions().mode() & 0o777);
                    if !matches!(mode, Ok(0o700)) {
                        let fixed = std::fs::Permissions::from_mode(0o700);
                        if let Err(e) = std::fs::set_permissions(&dir, fixed) {
                            tracing::warn!(?dir, error = %e, "could not make the socket directory private (0700)");
                        }
                    }
                    if let Err(e) = write_owner(&dir) {
                        tracing::debug!(?dir, error = %e, "could not record the directory's owner");
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
    Err(too_long.unwrap_or(DispatchError::SocketDirectory {
        tried,
        source: last,
    }))
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`, clock ticks since boot),
/// if it runs and there is a `/proc`.
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(19).map(str::to_owned)
}

/// This process's pid namespace (`pid:[4026531836]`), if there is a `/proc`.
fn pid_namespace() -> Option<String> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(link.to_string_lossy().into_owned())
}

/// Records this process as the owner of `dir` ([`OWNER_FILE`]).
fn write_owner(dir: &Path) -> io::Result<()> {
    let pid = std::process::id();
    let start = process_start(pid).unwrap_or_else(|| "-".into());
    let namespace = pid_namespace().unwrap_or_else(|| "-".into());
    std::fs::write(dir.join(OWNER_FILE), format!("{pid} {start} {namespace}\n"))
}

/// Whether the process an [`OWNER_FILE`]'s text names is known to be gone: it was recorded
/// in this process's pid namespace, and no process has its pid, or the one that has it
/// started at another time. Anything unknown (no `/proc`, another namespace, an unreadable
/// file) counts as alive: a directory is only removed when its owner is surely gone.
fn owner_gone(owner: &str) -> bool {
    let fields: Vec<&str> = owner.split_whitespace().collect();
    let [pid, start, namespace] = fields[..] else {
        return false;
    };
    let (Ok(pid), Some(ours)) = (pid.parse::<i32>(), pid_namespace()) else {
        return false;
    };
    if namespace != ours {
        return false;
    }
    if let Err(nix::errno::Errno::ESRCH) =
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
    {
        return true;
    }
    process_start(pid.unsigned_abs()).is_some_and(|now| start != "-" && now != start)
}

/// Removes the private directories under `dir`'s parent that an earlier dispatcher left when
/// its process ended without closing it (killed, or exiting right after dropping it): those
/// of this user whose [`OWNER_FILE`] names a process surely gone ([`owner_gone`]; udf §6.4:
/// the directory is the dispatcher's, and nobody else's to keep). Directories without an
/// owner file, of other users, of live processes or of other pid namespaces are left alone.
/// Returns how many it removed.
pub(crate) fn sweep_stale(dir: &Path) -> usize {
    let (Some(base), Ok(own)) = (dir.parent(), std::fs::metadata(dir)) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let stale = path != dir
            && entry.file_name().to_string_lossy().starts_with(DIR_PREFIX)
            && std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == own.uid())
            && std::fs::read_to_string(path.join(OWNER_FILE)).is_ok_and(|o| owner_gone(&o));
        if !stale {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(dir = ?path, "removed a socket directory its dispatcher left");
                removed += 1;
            }
            Err(e) => {
                tracing::debug!(dir = ?path, error = %e, "could not remove a stale socket directory")
            }
        }
    }
    removed
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
        let dir = create_private_dir(None, true).unwrap();
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
    fn a_base_too_long_for_a_socket_path_fails_at_once_unless_no_socket_is_used() {
        let base = std::env::temp_dir().join(format!("tether-long-{}", "d".repeat(60)));
        std::fs::create_dir_all(&base).unwrap();
        match create_private_dir(Some(&base), true) {
            Err(DispatchError::SocketPathTooLong { path, len, max }) => {
                assert_eq!(max, MAX_SOCKET_PATH_BYTES);
                assert!(len > max && path.starts_with(&base), "{path:?}");
            }
            other => panic!("expected SocketPathTooLong, got {other:?}"),
        }
        let dir = create_private_dir(Some(&base), false).expect("no sockets: any length");
        assert!(dir.starts_with(&base));
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// A directory whose owner process is gone is removed by the next dispatcher's sweep;
    /// one of a live owner, or without an owner file, is left alone.
    #[test]
    fn the_sweep_removes_directories_whose_owner_is_gone() {
        let base = std::env::temp_dir().join(format!("tether-sweep-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&base).unwrap();
        let mine = create_private_dir(Some(&base), true).unwrap();
        let owner = std::fs::read_to_string(mine.join(OWNER_FILE)).unwrap();
        let me = std::process::id();
        assert!(owner.starts_with(&format!("{me} ")), "{owner:?}");
        assert!(!owner_gone(&owner));
        let (Some(namespace), Some(start)) = (pid_namespace(), process_start(me)) else {
            std::fs::remove_dir_all(&base).unwrap();
            return; // no /proc: nothing is ever judged gone
        };
        // A process that ran and was reaped: its pid no longer names it.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let owned = |name: &str, owner: String| {
            let dir = base.join(format!("{DIR_PREFIX}{name}"));
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join(OWNER_FILE), owner).unwrap();
            dir
        };
        let stale = owned("000000000001", format!("{gone} 1 {namespace}\n"));
        std::fs::write(stale.join("w-0.log"), b"output").unwrap();
        // This process's pid with another start time: a reused pid is not the owner.
        let reused = owned("000000000002", format!("{me} {start}0 {namespace}\n"));
        // The same dead pid in another pid namespace (another container): not judged.
        let elsewhere = owned("000000000003", format!("{gone} 1 pid:[1]\n"));
        let unowned = base.join(format!("{DIR_PREFIX}000000000004"));
        std::fs::create_dir(&unowned).unwrap();
        let other = base.join("unrelated");
        std::fs::create_dir(&other).unwrap();

        assert_eq!(sweep_stale(&mine), 2);
        assert!(!stale.exists(), "the dead owner's directory is removed");
        assert!(
            !reused.exists(),
            "a reused pid is told apart by its start time"
        );
        assert!(mine.exists() && elsewhere.exists() && unowned.exists() && other.exists());
        std::fs::remove_dir_all(&base).unwrap();
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
