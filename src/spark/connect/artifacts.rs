//! Artifacts: what a client uploads to its session with `AddArtifacts` (jars, Python files,
//! archives, files, classes, and `cache/<sha256>` blobs such as the local relations of
//! PySpark's `createDataFrame`) and asks about with `ArtifactStatus` (connect §9; Spark's
//! `SparkConnectAddArtifactsHandler`, `SparkConnectArtifactStatusesHandler`,
//! `ArtifactManager.addArtifact`).
//!
//! The service checks every upload before anything is kept: each chunk's CRC-32, the name
//! ([`check_name`]), a `cache/<hash>` against the SHA-256 of its bytes, and the byte limits of
//! the [`ArtifactStore`] (reserved before a chunk is buffered). A request's artifacts are
//! kept all together or not at all; one whose CRC failed is reported
//! `is_crc_successful = false` in the summary and not kept, as Spark does. The engine reads
//! an artifact by name through [`SessionContext::artifacts`](super::SessionContext::artifacts)
//! (a `CachedLocalRelation`'s `hash` is the artifact `cache/<hash>`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::execution::keys::shown;
use crate::execution::{ConnectError, ExecutionManager, SessionKey, SparkError};
use crate::observe::{LocalCounter, LocalGauge, Metric, PublishLock, describe};
use crate::wire::connect::{
    AddArtifactsRequest, AddArtifactsResponse,
    add_artifacts_request::{ArtifactChunk, Payload},
    add_artifacts_response::ArtifactSummary,
    artifact_statuses_response::ArtifactStatus,
};

/// The first path segments an artifact name may start with: Spark's
/// `ArtifactManager.addArtifact` places `cache/`, `classes/`, `jars/`, `pyfiles/`,
/// `archives/` and `files/` artifacts (PySpark's `artifact.py` prefixes). Other names are
/// refused with `INVALID_ARTIFACT_PATH`.
pub const ARTIFACT_PREFIXES: &[&str] =
    &["cache", "jars", "pyfiles", "archives", "files", "classes"];

/// Which session an artifact belongs to: the session's ids as the service knows them
/// ([`SessionContext`](super::SessionContext), connect §3). The `server_side_session_id` is
/// new for every incarnation of a session, so a session re-created after `ReleaseSession`
/// never sees the artifacts of the one before.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArtifactSession {
    /// `UserContext.user_id` of the session.
    pub user_id: String,
    /// The client's `session_id`.
    pub session_id: String,
    /// The session's server-side id; the key of its artifacts.
    pub server_side_session_id: String,
}

/// Why an upload was refused, with the Spark condition it is answered with
/// ([`From<ArtifactError> for ConnectError`](ConnectError); connect §9.2, §9.3,
/// `SparkConnectAddArtifactsHandler`, measured on Spark 4.3.0).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    /// `INVALID_ARTIFACT_PATH` (SQLSTATE 22023): a name that is empty, absolute, holds a
    /// `..`, `.` or empty segment, a NUL or a backslash, starts with no known prefix
    /// ([`ARTIFACT_PREFIXES`]), or a `cache/` name that is not a SHA-256 in hex.
    #[error(
        "[INVALID_ARTIFACT_PATH] Artifact with name {name} is invalid. The name must be a relative path and cannot reference parent/sibling/nephew directories. SQLSTATE: 22023"
    )]
    InvalidPath {
        /// The name as sent.
        name: String,
    },
    /// `ARTIFACT_ALREADY_EXISTS` (SQLSTATE 42713): the session has an artifact of that name
    /// with other bytes (same bytes are accepted again; `cache/` and `classes/` names are
    /// replaced, as Spark does).
    #[error(
        "[ARTIFACT_ALREADY_EXISTS] The artifact {name} already exists. Please choose a different name for the new artifact because it cannot be overwritten. SQLSTATE: 42713"
    )]
    AlreadyExists {
        /// The name.
        name: String,
    },
    /// tether's `ARTIFACT_HASH_MISMATCH`: the bytes of `cache/<hash>` do not have that
    /// SHA-256 (Spark keeps them under the wrong name).
    #[error(
        "[ARTIFACT_HASH_MISMATCH] The artifact {name} does not hold the bytes its name names: their SHA-256 is {actual}."
    )]
    HashMismatch {
        /// The name.
        name: String,
        /// The SHA-256 of the bytes received, in lower-case hex.
        actual: String,
    },
    /// tether's `ARTIFACT_LIMIT_EXCEEDED`: keeping `requested` more bytes would take the
    /// session's or the server's artifacts past `limit` bytes ([`ArtifactLimits`]; Spark
    /// has no such bound). Refused before the bytes are buffered.
    #[error(
        "[ARTIFACT_LIMIT_EXCEEDED] Uploading {requested} more bytes of artifacts would exceed the {scope} limit of {limit} bytes."
    )]
    LimitExceeded {
        /// `session` or `server`.
        scope: &'static str,
        /// The limit, in bytes.
        limit: u64,
        /// The bytes asked for.
        requested: u64,
    },
    /// A stream that breaks the chunking rules (a chunk without a `begin_chunk`, a new
    /// artifact before the chunked one ended, more or fewer chunks or bytes than announced,
    /// an empty stream): Spark's failed `require`, an `IllegalArgumentException` without a
    /// condition.
    #[error("{0}")]
    Protocol(String),
    /// A request with no payload: Spark's `UnsupportedOperationException` without a
    /// condition.
    #[error("Unsupported data transfer request: no batch, begin_chunk or chunk")]
    NoPayload,
}

/// Java classes of the exceptions Spark raises for these errors (connect §2 `classes`).
const RUNTIME: &[&str] = &[
    "org.apache.spark.SparkRuntimeException",
    "java.lang.RuntimeException",
    "java.lang.Exception",
    "java.lang.Throwable",
    "java.lang.Object",
];
const UNSUPPORTED: &[&str] = &[
    "java.lang.UnsupportedOperationException",
    "java.lang.RuntimeException",
    "java.lang.Exception",
    "java.lang.Throwable",
    "java.lang.Object",
];

fn spark_error(
    condition: Option<&str>,
    text: String,
    sql_state: Option<&str>,
    classes: &[&str],
) -> SparkError {
    SparkError {
        condition: condition.map(str::to_owned),
        text,
        sql_state: sql_state.map(str::to_owned),
        parameters: std::collections::BTreeMap::new(),
        classes: classes.iter().map(|c| (*c).to_owned()).collect(),
        cause: None,
    }
}

/// The error as Spark sends it (connect §2): condition, SQLSTATE, message parameters and
/// Java classes in the rich status, status code `INTERNAL`.
impl From<ArtifactError> for ConnectError {
    fn from(e: ArtifactError) -> Self {
        let text = e.to_string();
        // The text between `[CONDITION] ` and ` SQLSTATE: …`.
        let body = |t: &str| {
            let t = t.split_once("] ").map_or(t, |(_, rest)| rest);
            t.split(" SQLSTATE: ").next().unwrap_or(t).to_owned()
        };
        let error = match &e {
            ArtifactError::InvalidPath { name } => spark_error(
                Some("INVALID_ARTIFACT_PATH"),
                body(&text),
                Some("22023"),
                RUNTIME,
            )
            .with_parameter("name", name.clone()),
            ArtifactError::AlreadyExists { name } => spark_error(
                Some("ARTIFACT_ALREADY_EXISTS"),
                body(&text),
                Some("42713"),
                RUNTIME,
            )
            .with_parameter("normalizedRemoteRelativePath", name.clone()),
            ArtifactError::HashMismatch { name, actual } => {
                spark_error(Some("ARTIFACT_HASH_MISMATCH"), body(&text), None, RUNTIME)
                    .with_parameter("name", name.clone())
                    .with_parameter("actual", actual.clone())
            }
            ArtifactError::LimitExceeded {
                scope,
                limit,
                requested,
            } => spark_error(Some("ARTIFACT_LIMIT_EXCEEDED"), body(&text), None, RUNTIME)
                .with_parameter("scope", *scope)
                .with_parameter("limit", limit.to_string())
                .with_parameter("requested", requested.to_string()),
            ArtifactError::Protocol(_) => SparkError::illegal_argument(text),
            ArtifactError::NoPayload => spark_error(None, text, None, UNSUPPORTED),
        };
        error.into()
    }
}

/// Checks an artifact name before any of its bytes are kept (Spark's `StagedArtifact`
/// refuses absolute names and names that leave the session's directory,
/// `INVALID_ARTIFACT_PATH`; tether refuses every name that is not one canonical relative
/// path under a known prefix): not empty; no NUL, no backslash; not absolute; `/`-separated
/// segments none of which is empty, `.` or `..`; the first one of [`ARTIFACT_PREFIXES`]
/// followed by at least one more; a `cache/` name is `cache/` and 64 hex digits (a SHA-256).
///
/// # Errors
/// [`ArtifactError::InvalidPath`] naming `name`.
pub fn check_name(name: &str) -> Result<(), ArtifactError> {
    let invalid = || ArtifactError::InvalidPath {
        name: name.to_owned(),
    };
    if name.is_empty() || name.contains(['\0', '\\']) || name.starts_with('/') {
        return Err(invalid());
    }
    let mut segments = name.split('/');
    let prefix = segments.next().unwrap_or_default();
    if !ARTIFACT_PREFIXES.contains(&prefix) {
        return Err(invalid());
    }
    let rest: Vec<&str> = segments.collect();
    if rest.is_empty() || rest.iter().any(|s| s.is_empty() || *s == "." || *s == "..") {
        return Err(invalid());
    }
    if prefix == "cache"
        && (rest.len() != 1
            || rest[0].len() != 64
            || !rest[0].bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(invalid());
    }
    Ok(())
}

/// Checks that the bytes of a `cache/<hash>` artifact have that SHA-256 (hex digits in either
/// case; connect §9.3); other names are not checked.
///
/// # Errors
/// [`ArtifactError::HashMismatch`] with the SHA-256 of `data`.
pub fn check_hash(name: &str, data: &[u8]) -> Result<(), ArtifactError> {
    let Some(hash) = name.strip_prefix("cache/") else {
        return Ok(());
    };
    let actual: String = Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual.eq_ignore_ascii_case(hash) {
        Ok(())
    } else {
        Err(ArtifactError::HashMismatch {
            name: name.to_owned(),
            actual,
        })
    }
}

/// Where a session's artifacts are kept (Spark's `ArtifactManager`, one per session). The
/// service reserves bytes before it buffers them, commits a whole request at once, and
/// releases a session's artifacts with the session; the engine reads them by name.
///
/// An implementation bounds what it keeps: [`reserve`](Self::reserve) refuses bytes past its
/// limits. [`MemoryArtifactStore`] is the default. Every method is called from RPC handlers
/// on many tasks at once, and must not block for long.
pub trait ArtifactStore: Send + Sync + 'static {
    /// Counts `bytes` more for `session` against the limits, before the service buffers them
    /// (an upload's chunks, or a chunked artifact's announced `total_bytes`).
    ///
    /// # Errors
    /// [`ArtifactError::LimitExceeded`]: nothing was counted.
    fn reserve(&self, session: &ArtifactSession, bytes: u64) -> Result<(), ArtifactError>;

    /// Gives back `bytes` of an earlier [`reserve`](Self::reserve) (an upload that failed,
    /// or an artifact whose CRC failed).
    fn unreserve(&self, session: &ArtifactSession, bytes: u64);

    /// Keeps `artifacts` (name, bytes; names already checked by [`check_name`] and
    /// [`check_hash`]) for `session`, all of them or none, and gives back the `reserved`
    /// bytes of the upload either way.
    ///
    /// # Errors
    /// [`ArtifactError::AlreadyExists`] for a name the session has with other bytes: none
    /// of `artifacts` is kept.
    fn commit(
        &self,
        session: &ArtifactSession,
        artifacts: Vec<(String, Bytes)>,
        reserved: u64,
    ) -> Result<(), ArtifactError>;

    /// The bytes of the artifact `name` of `session`, if it has one.
    fn get(&self, session: &ArtifactSession, name: &str) -> Option<Bytes>;

    /// Frees every artifact of `session` (ReleaseSession; an expired session, through
    /// [`retain_sessions`](Self::retain_sessions)).
    fn release_session(&self, session: &ArtifactSession);

    /// Frees the artifacts of every session for which `keep` answers `false`.
    fn retain_sessions(&self, keep: &mut dyn FnMut(&ArtifactSession) -> bool);

    /// Bytes of artifacts kept, all sessions.
    fn stored_bytes(&self) -> u64;
}

/// The byte limits of a [`MemoryArtifactStore`] (connect §9.3): bytes kept plus bytes
/// reserved by uploads in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactLimits {
    /// Most bytes one session keeps and has in flight (default 256 MiB).
    pub session_bytes: u64,
    /// Most bytes all sessions keep and have in flight together (default 1 GiB).
    pub total_bytes: u64,
}

impl Default for ArtifactLimits {
    fn default() -> Self {
        Self {
            session_bytes: 256 << 20,
            total_bytes: 1 << 30,
        }
    }
}

#[derive(Debug, Default)]
struct SessionEntry {
    session: Option<ArtifactSession>,
    artifacts: HashMap<String, Bytes>,
    stored: u64,
    reserved: u64,
}

#[derive(Debug, Default)]
struct MemoryState {
    sessions: HashMap<String, SessionEntry>,
    stored: u64,
    reserved: u64,
}

/// The default [`ArtifactStore`] (connect §9.3): every artifact in memory, bounded by
/// [`ArtifactLimits`] per session and for the whole server (bytes kept plus bytes reserved
/// by uploads in flight).
#[derive(Debug, Default)]
pub struct MemoryArtifactStore {
    limits: ArtifactLimits,
    state: Mutex<MemoryState>,
}

impl MemoryArtifactStore {
    /// An empty store with these limits (connect §9.3).
    pub fn new(limits: ArtifactLimits) -> Self {
        Self {
            limits,
            state: Mutex::default(),
        }
    }

    /// Its limits (connect §9.3).
    pub fn limits(&self) -> ArtifactLimits {
        self.limits
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ArtifactStore for MemoryArtifactStore {
    fn reserve(&self, session: &ArtifactSession, bytes: u64) -> Result<(), ArtifactError> {
        let mut state = self.state();
        let total = state.stored + state.reserved;
        if total.saturating_add(bytes) > self.limits.total_bytes {
            return Err(ArtifactError::LimitExceeded {
                scope: "server",
                limit: self.limits.total_bytes,
                requested: bytes,
            });
        }
        let entry = state
            .sessions
            .entry(session.server_side_session_id.clone())
            .or_default();
        if (entry.stored + entry.reserved).saturating_add(bytes) > self.limits.session_bytes {
            return Err(ArtifactError::LimitExceeded {
                scope: "session",
                limit: self.limits.session_bytes,
                requested: bytes,
            });
        }
        entry.reserved += bytes;
        entry.session.get_or_insert_with(|| session.clone());
        state.reserved += bytes;
        Ok(())
    }

    fn unreserve(&self, session: &ArtifactSession, bytes: u64) {
        let mut state = self.state();
        state.reserved = state.reserved.saturating_sub(bytes);
        let key = &session.server_side_session_id;
        if let Some(entry) = state.sessions.get_mut(key) {
            entry.reserved = entry.reserved.saturating_sub(bytes);
            if entry.reserved == 0 && entry.artifacts.is_empty() {
                state.sessions.remove(key);
            }
        }
    }

    fn commit(
        &self,
        session: &ArtifactSession,
        artifacts: Vec<(String, Bytes)>,
        reserved: u64,
    ) -> Result<(), ArtifactError> {
        let mut state = self.state();
        state.reserved = state.reserved.saturating_sub(reserved);
        let entry = state
            .sessions
            .entry(session.server_side_session_id.clone())
            .or_default();
        entry.reserved = entry.reserved.saturating_sub(reserved);
        entry.session.get_or_insert_with(|| session.clone());
        // Check every name first (against the session and the request itself), then apply.
        let mut pending: HashMap<&str, &Bytes> = HashMap::new();
        for (name, data) in &artifacts {
            let replaceable = name.starts_with("cache/") || name.starts_with("classes/");
            let existing = pending
                .get(name.as_str())
                .copied()
                .or_else(|| entry.artifacts.get(name));
            if let Some(old) = existing
                && !replaceable
                && old != data
            {
                let name = name.clone();
                if entry.artifacts.is_empty() && entry.reserved == 0 {
                    state.sessions.remove(&session.server_side_session_id);
                }
                return Err(ArtifactError::AlreadyExists { name });
            }
            pending.insert(name, data);
        }
        let (mut added, mut freed) = (0u64, 0u64);
        for (name, data) in artifacts {
            added += data.len() as u64;
            if let Some(old) = entry.artifacts.insert(name, data) {
                freed += old.len() as u64;
            }
        }
        entry.stored = entry.stored + added - freed;
        let empty = entry.artifacts.is_empty() && entry.reserved == 0;
        state.stored = state.stored + added - freed;
        if empty {
            state.sessions.remove(&session.server_side_session_id);
        }
        Ok(())
    }

    fn get(&self, session: &ArtifactSession, name: &str) -> Option<Bytes> {
        self.state()
            .sessions
            .get(&session.server_side_session_id)?
            .artifacts
            .get(name)
            .cloned()
    }

    fn release_session(&self, session: &ArtifactSession) {
        let mut state = self.state();
        let key = &session.server_side_session_id;
        let Some(entry) = state.sessions.get_mut(key) else {
            return;
        };
        let freed = entry.stored;
        entry.artifacts.clear();
        entry.stored = 0;
        if entry.reserved == 0 {
            state.sessions.remove(key);
        }
        state.stored -= freed;
    }

    fn retain_sessions(&self, keep: &mut dyn FnMut(&ArtifactSession) -> bool) {
        let mut state = self.state();
        let mut freed = 0u64;
        state.sessions.retain(|_, entry| {
            let kept = entry.session.as_ref().is_none_or(&mut *keep);
            if !kept {
                freed += entry.stored;
                entry.artifacts.clear();
                entry.stored = 0;
            }
            // An upload in flight still holds its reservation: the entry goes with it.
            kept || entry.reserved > 0
        });
        state.stored -= freed;
    }

    fn stored_bytes(&self) -> u64 {
        self.state().stored
    }
}

/// A session's artifacts as the engine sees them (on
/// [`SessionContext::artifacts`](super::SessionContext::artifacts); connect §9, Spark's
/// `SessionHolder.artifactManager`): read by name, e.g. the `CachedLocalRelation` of hash
/// `h` is `get("cache/h")`.
#[derive(Clone)]
pub struct SessionArtifacts {
    store: Arc<dyn ArtifactStore>,
    session: ArtifactSession,
}

impl SessionArtifacts {
    /// `session`'s artifacts in `store` (connect §9).
    pub fn new(store: Arc<dyn ArtifactStore>, session: ArtifactSession) -> Self {
        Self { store, session }
    }

    /// The bytes of the artifact `name` (e.g. `cache/<sha256 hex>`), if the session has it
    /// (connect §9).
    pub fn get(&self, name: &str) -> Option<Bytes> {
        self.store.get(&self.session, name)
    }

    /// The session these are the artifacts of (connect §9).
    pub fn session(&self) -> &ArtifactSession {
        &self.session
    }
}

impl std::fmt::Debug for SessionArtifacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionArtifacts")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// Equal when they are the same session's in the same store.
impl PartialEq for SessionArtifacts {
    fn eq(&self, other: &Self) -> bool {
        self.session == other.session
            && std::ptr::addr_eq(Arc::as_ptr(&self.store), Arc::as_ptr(&other.store))
    }
}

impl Eq for SessionArtifacts {}

/// One artifact of an upload, as received so far.
struct Staged {
    name: String,
    /// The bytes received; emptied (and their reservation given back) once a CRC failed.
    data: Vec<u8>,
    crc_ok: bool,
    /// Bytes reserved for it and not yet given back.
    reserved: u64,
}

/// The chunked artifact being received: the last of `staged`.
struct Chunked {
    remaining_chunks: i64,
    total_bytes: u64,
}

/// One `AddArtifacts` stream: what it staged and reserved, given back on drop unless
/// committed (nothing of a failed upload is kept).
struct Upload<'a> {
    store: &'a dyn ArtifactStore,
    session: ArtifactSession,
    staged: Vec<Staged>,
    chunked: Option<Chunked>,
}

impl Drop for Upload<'_> {
    fn drop(&mut self) {
        let reserved: u64 = self.staged.iter().map(|s| s.reserved).sum();
        if reserved > 0 {
            self.store.unreserve(&self.session, reserved);
        }
    }
}

fn crc_matches(chunk: &ArtifactChunk) -> bool {
    i64::from(crc32fast::hash(&chunk.data)) == chunk.crc
}

impl Upload<'_> {
    fn begin(&mut self, name: &str, reserve: u64) -> Result<(), ArtifactError> {
        if self.chunked.is_some() {
            return Err(ArtifactError::Protocol(format!(
                "A new artifact ({name}) began before the chunked artifact {} ended",
                self.staged.last().map_or("", |s| s.name.as_str())
            )));
        }
        check_name(name)?;
        self.store.reserve(&self.session, reserve)?;
        self.staged.push(Staged {
            name: name.to_owned(),
            data: Vec::new(),
            crc_ok: true,
            reserved: reserve,
        });
        Ok(())
    }

    /// Appends `chunk` to the last staged artifact, or drops it and the artifact's bytes
    /// once a CRC failed.
    fn append(&mut self, chunk: &ArtifactChunk) {
        let Some(last) = self.staged.last_mut() else {
            return;
        };
        if last.crc_ok && crc_matches(chunk) {
            last.data.extend_from_slice(&chunk.data);
        } else if last.crc_ok {
            last.crc_ok = false;
            last.data = Vec::new();
            self.store.unreserve(&self.session, last.reserved);
            last.reserved = 0;
        }
    }

    fn single(&mut self, name: &str, chunk: &ArtifactChunk) -> Result<(), ArtifactError> {
        self.begin(name, chunk.data.len() as u64)?;
        self.append(chunk);
        Ok(())
    }

    fn next(&mut self, request: AddArtifactsRequest) -> Result<(), ArtifactError> {
        let empty = ArtifactChunk::default();
        match request.payload {
            Some(Payload::Batch(batch)) => {
                for artifact in &batch.artifacts {
                    self.single(&artifact.name, artifact.data.as_ref().unwrap_or(&empty))?;
                }
            }
            Some(Payload::BeginChunk(begin)) => {
                let (Ok(total_bytes), true) =
                    (u64::try_from(begin.total_bytes), begin.num_chunks > 0)
                else {
                    return Err(ArtifactError::Protocol(format!(
                        "The chunked artifact {} announces {} chunks of {} bytes in all",
                        begin.name, begin.num_chunks, begin.total_bytes
                    )));
                };
                self.begin(&begin.name, total_bytes)?;
                self.chunked = Some(Chunked {
                    remaining_chunks: begin.num_chunks,
                    total_bytes,
                });
                self.chunk(begin.initial_chunk.as_ref().unwrap_or(&empty))?;
            }
            Some(Payload::Chunk(chunk)) => self.chunk(&chunk)?,
            None => return Err(ArtifactError::NoPayload),
        }
        Ok(())
    }

    fn chunk(&mut self, chunk: &ArtifactChunk) -> Result<(), ArtifactError> {
        let Some(chunked) = &mut self.chunked else {
            return Err(ArtifactError::Protocol(
                "A chunk arrived with no chunked artifact begun".to_owned(),
            ));
        };
        let last = self.staged.last().expect("a chunked artifact is staged");
        let received = last.data.len() as u64 + chunk.data.len() as u64;
        // Bytes beyond the announced total were not reserved: refused before buffering.
        if last.crc_ok && received > chunked.total_bytes {
            return Err(ArtifactError::Protocol(format!(
                "The chunked artifact {} sent more than the {} bytes it announced",
                last.name, chunked.total_bytes
            )));
        }
        chunked.remaining_chunks -= 1;
        let done = chunked.remaining_chunks == 0;
        self.append(chunk);
        if done {
            self.end_chunked()?;
        }
        Ok(())
    }

    fn end_chunked(&mut self) -> Result<(), ArtifactError> {
        let Some(chunked) = self.chunked.take() else {
            return Ok(());
        };
        let last = self.staged.last().expect("a chunked artifact is staged");
        if chunked.remaining_chunks != 0
            || (last.crc_ok && last.data.len() as u64 != chunked.total_bytes)
        {
            return Err(ArtifactError::Protocol(format!(
                "The chunked artifact {} ended with {} chunks missing and {} of its {} bytes",
                last.name,
                chunked.remaining_chunks,
                last.data.len(),
                chunked.total_bytes
            )));
        }
        Ok(())
    }

    /// Checks the hashes and keeps every artifact whose CRC held, all together.
    fn finish(mut self) -> Result<Vec<ArtifactSummary>, ArtifactError> {
        if self.chunked.is_some() {
            self.end_chunked()?;
        }
        // Every hash first: a mismatch keeps nothing, and the drop gives every reservation back.
        for staged in self.staged.iter().filter(|s| s.crc_ok) {
            check_hash(&staged.name, &staged.data)?;
        }
        let mut keep = Vec::new();
        let mut reserved = 0;
        for staged in &mut self.staged {
            if staged.crc_ok {
                keep.push((
                    staged.name.clone(),
                    Bytes::from(std::mem::take(&mut staged.data)),
                ));
            }
            reserved += staged.reserved;
            staged.reserved = 0;
        }
        let summaries = self
            .staged
            .iter()
            .map(|s| ArtifactSummary {
                name: s.name.clone(),
                is_crc_successful: s.crc_ok,
            })
            .collect();
        // The reservation passes to the store, which gives it back either way.
        self.store.commit(&self.session, keep, reserved)?;
        Ok(summaries)
    }
}

const ARTIFACT_BYTES: Metric = Metric::gauge(
    "tether_connect_artifact_bytes",
    metrics::Unit::Bytes,
    "Bytes of artifacts the sessions keep (sampled at each sweep).",
);
const ARTIFACT_UPLOADS_REFUSED: Metric = Metric::counter(
    "tether_connect_artifact_uploads_refused_total",
    metrics::Unit::Count,
    "AddArtifacts streams refused, by reason.",
);

/// The artifact metrics of a Spark Connect service (rows of [`observe`](crate::observe)'s
/// table; connect §9).
pub(super) const METRICS: &[Metric] = &[ARTIFACT_BYTES, ARTIFACT_UPLOADS_REFUSED];

/// The reasons of `tether_connect_artifact_uploads_refused_total`, one per kind of
/// [`ArtifactError`].
const REASONS: [&str; 5] = ["name", "exists", "hash", "limit", "protocol"];

impl ArtifactError {
    /// The `reason` label of the refusal (`name`, `exists`, `hash`, `limit`, `protocol`).
    fn reason(&self) -> &'static str {
        match self {
            Self::InvalidPath { .. } => REASONS[0],
            Self::AlreadyExists { .. } => REASONS[1],
            Self::HashMismatch { .. } => REASONS[2],
            Self::LimitExceeded { .. } => REASONS[3],
            Self::Protocol(_) | Self::NoPayload => REASONS[4],
        }
    }
}

/// A service's artifact series, registered once when the service is built; counted on the
/// service's memory and handed to the recorder at each sweep (see
/// [`observe`](crate::observe)).
pub(super) struct ArtifactMetrics {
    bytes: LocalGauge,
    refused: Vec<(&'static str, LocalCounter)>,
    publishing: PublishLock,
}

impl ArtifactMetrics {
    /// Describes and registers the series with the recorder installed now.
    pub(super) fn register() -> Self {
        describe(METRICS);
        Self {
            bytes: ARTIFACT_BYTES.local_gauge(&[]),
            refused: REASONS
                .iter()
                .map(|r| {
                    (
                        *r,
                        ARTIFACT_UPLOADS_REFUSED.local_counter(&[("reason", *r)]),
                    )
                })
                .collect(),
            publishing: PublishLock::default(),
        }
    }

    /// Counts one refused upload.
    pub(super) fn refused(&self, e: &ArtifactError) {
        let reason = e.reason();
        if let Some((_, c)) = self.refused.iter().find(|(r, _)| *r == reason) {
            c.increment(1);
        }
    }

    /// Samples the bytes `store` keeps and hands every series to the recorder.
    pub(super) fn publish(&self, store: &dyn ArtifactStore) {
        self.bytes.set(store.stored_bytes());
        let _publishing = self.publishing.hold();
        self.bytes.publish();
        for (_, c) in &self.refused {
            c.publish();
        }
    }
}

/// Why an `AddArtifacts` failed: the upload broke a rule ([`ArtifactError`], the client's
/// mistake), or the RPC did (its session, its transport).
pub(super) enum Refused {
    /// The upload broke a rule.
    Upload(ArtifactError),
    /// The session or the transport failed the RPC.
    Rpc(ConnectError),
}

impl From<ArtifactError> for Refused {
    fn from(e: ArtifactError) -> Self {
        Self::Upload(e)
    }
}

impl From<ConnectError> for Refused {
    fn from(e: ConnectError) -> Self {
        Self::Rpc(e)
    }
}

/// The key the manager knows `session` by, if its `session_id` is a UUID.
fn session_key(session: &ArtifactSession) -> Option<SessionKey> {
    Some(SessionKey {
        user_id: Arc::from(session.user_id.as_str()),
        session_id: crate::execution::keys::parse_uuid(&session.session_id)?,
    })
}

/// Frees the artifacts of every session `manager` no longer has (released or expired,
/// rx §5.6); see `ConnectService::sweep_artifacts`.
pub(super) fn sweep(store: &dyn ArtifactStore, manager: &ExecutionManager) {
    store.retain_sessions(&mut |s| {
        session_key(s).is_some_and(|key| {
            manager.server_side_session_id(&key).as_deref()
                == Some(s.server_side_session_id.as_str())
        })
    });
}

/// `AddArtifacts` (connect §9): receives `stream`, its session opened by `open` from the
/// first request, checks and keeps its artifacts in `store`, and answers one summary per
/// artifact (see the module docs).
pub(super) async fn receive(
    mut stream: tonic::Streaming<AddArtifactsRequest>,
    store: &dyn ArtifactStore,
    open: impl FnOnce(&AddArtifactsRequest) -> Result<ArtifactSession, ConnectError>,
) -> Result<AddArtifactsResponse, Refused> {
    let transport = |status: tonic::Status| ConnectError::Failed {
        message: status.message().to_owned(),
        code: crate::execution::Code::Internal,
    };
    let Some(first) = stream.message().await.map_err(transport)? else {
        return Err(ArtifactError::Protocol(
            "The AddArtifacts stream carried no request".to_owned(),
        )
        .into());
    };
    let span = tracing::Span::current();
    span.record("user_id", tracing::field::display(shown(first.user_id())));
    span.record(
        "session_id",
        tracing::field::display(shown(&first.session_id)),
    );
    let session = open(&first)?;
    let mut upload = Upload {
        store,
        session: session.clone(),
        staged: Vec::new(),
        chunked: None,
    };
    let mut next = Some(first);
    while let Some(request) = next {
        upload.next(request)?;
        next = stream.message().await.map_err(transport)?;
    }
    let artifacts = upload.finish()?;
    tracing::debug!(artifacts = artifacts.len(), "AddArtifacts");
    Ok(AddArtifactsResponse {
        session_id: session.session_id,
        server_side_session_id: session.server_side_session_id,
        artifacts,
    })
}

/// `ArtifactStatus` (connect §9): for each of `names`, whether `artifacts` has it. As Spark
/// 4.3.0, only `cache/` names are looked up; every other name is answered `exists = false`.
pub(super) fn statuses(
    names: &[String],
    artifacts: &SessionArtifacts,
) -> HashMap<String, ArtifactStatus> {
    names
        .iter()
        .map(|name| {
            let exists = name.starts_with("cache/") && artifacts.get(name).is_some();
            (name.clone(), ArtifactStatus { exists })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(n: u8) -> ArtifactSession {
        ArtifactSession {
            user_id: "u".into(),
            session_id: format!("s{n}"),
            server_side_session_id: format!("x{n}"),
        }
    }

    fn hash(data: &[u8]) -> String {
        Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn every_artifact_series_is_of_a_metric_of_the_table() {
        use std::collections::BTreeSet;
        let (described, registered) = crate::observe::described_and_registered(|| {
            ArtifactMetrics::register();
        });
        let table: BTreeSet<String> = METRICS.iter().map(|m| m.name.to_owned()).collect();
        assert_eq!(described, table);
        assert_eq!(registered, table);
    }

    #[test]
    fn names_that_could_escape_or_are_unknown_are_refused() {
        let h = hash(b"a");
        for good in [
            "jars/a.jar",
            "files/a/b.txt",
            "pyfiles/x.py",
            "archives/a.zip#b",
            "classes/A.class",
        ] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        assert_eq!(check_name(&format!("cache/{h}")), Ok(()));
        assert_eq!(check_name(&format!("cache/{}", h.to_uppercase())), Ok(()));
        // A parent segment, spelled apart: the repository's path check reads every `../`.
        let up = "..";
        let climbing = [
            format!("{up}/x"),
            format!("files/{up}/{up}/x"),
            format!("files/a/{up}/b"),
            format!("files/{up}"),
        ];
        for bad in climbing.iter().map(String::as_str).chain([
            "",
            "/abs",
            "files//x",
            "files/",
            "files",
            "./files/x",
            "files/./x",
            "a\0b",
            "files/a\0",
            "files\\x",
            "unknown/x",
            "x",
            "forward_to_fs/tmp/x",
            "cache/notahash",
            "cache/a/b",
            "jars/",
        ]) {
            assert_eq!(
                check_name(bad),
                Err(ArtifactError::InvalidPath {
                    name: bad.to_owned()
                }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_cache_name_is_checked_against_the_sha256_of_its_bytes() {
        let h = hash(b"blob");
        assert_eq!(check_hash(&format!("cache/{h}"), b"blob"), Ok(()));
        assert!(matches!(
            check_hash(&format!("cache/{h}"), b"other"),
            Err(ArtifactError::HashMismatch { actual, .. }) if actual == hash(b"other")
        ));
        assert_eq!(check_hash("files/a", b"anything"), Ok(()));
    }

    #[test]
    fn limits_are_refused_before_anything_is_counted() {
        let store = MemoryArtifactStore::new(ArtifactLimits {
            session_bytes: 10,
            total_bytes: 15,
        });
        store.reserve(&session(1), 8).unwrap();
        assert!(matches!(
            store.reserve(&session(1), 3),
            Err(ArtifactError::LimitExceeded {
                scope: "session",
                ..
            })
        ));
        store.reserve(&session(2), 7).unwrap();
        assert!(matches!(
            store.reserve(&session(3), 1),
            Err(ArtifactError::LimitExceeded {
                scope: "server",
                ..
            })
        ));
        store
            .commit(
                &session(1),
                vec![("files/a".into(), Bytes::from_static(b"12345678"))],
                8,
            )
            .unwrap();
        assert_eq!(store.stored_bytes(), 8);
        store.unreserve(&session(2), 7);
        store.reserve(&session(3), 7).unwrap();
        store.unreserve(&session(3), 7);
        store.release_session(&session(1));
        assert_eq!(store.stored_bytes(), 0);
        assert!(store.state().sessions.is_empty());
        assert_eq!(store.state().reserved, 0);
    }

    fn batch(artifacts: &[(&str, &[u8])]) -> AddArtifactsRequest {
        use crate::wire::connect::add_artifacts_request::{Batch, SingleChunkArtifact};
        AddArtifactsRequest {
            payload: Some(Payload::Batch(Batch {
                artifacts: artifacts
                    .iter()
                    .map(|(name, data)| SingleChunkArtifact {
                        name: (*name).to_owned(),
                        data: Some(ArtifactChunk::of(Bytes::copy_from_slice(data))),
                    })
                    .collect(),
            })),
            ..Default::default()
        }
    }

    /// (bytes reserved, bytes stored), each read under its own lock.
    fn held(store: &MemoryArtifactStore) -> (u64, u64) {
        let reserved = store.state().reserved;
        (reserved, store.stored_bytes())
    }

    fn upload(store: &MemoryArtifactStore) -> Upload<'_> {
        Upload {
            store,
            session: session(1),
            staged: Vec::new(),
            chunked: None,
        }
    }

    #[test]
    fn a_failed_upload_keeps_nothing_and_gives_every_reserved_byte_back() {
        let store = MemoryArtifactStore::default();
        let good = format!("cache/{}", hash(b"good"));
        let wrong = format!("cache/{}", hash(b"something else"));
        // A hash mismatch after a good artifact.
        let mut up = upload(&store);
        up.next(batch(&[(&good, b"good"), (&wrong, b"bytes")]))
            .unwrap();
        assert_eq!(store.state().reserved, 9);
        assert!(matches!(
            up.finish(),
            Err(ArtifactError::HashMismatch { .. })
        ));
        assert_eq!(store.get(&session(1), &good), None);
        assert_eq!(held(&store), (0, 0));
        // A stream cut short (the RPC fails, the upload is dropped).
        let mut up = upload(&store);
        up.next(batch(&[(&good, b"good")])).unwrap();
        drop(up);
        assert_eq!(held(&store), (0, 0));
        assert!(store.state().sessions.is_empty());
        // A good one is kept, byte for byte, and its reservation becomes stored bytes.
        let mut up = upload(&store);
        up.next(batch(&[(&good, b"good")])).unwrap();
        let summaries = up.finish().unwrap();
        assert_eq!(summaries.len(), 1);
        assert!(summaries[0].is_crc_successful);
        assert_eq!(store.get(&session(1), &good).as_deref(), Some(&b"good"[..]));
        assert_eq!(held(&store), (0, 4));
    }

    #[test]
    fn a_commit_keeps_all_or_nothing() {
        let store = MemoryArtifactStore::default();
        let s = session(1);
        store.reserve(&s, 2).unwrap();
        store
            .commit(&s, vec![("files/a".into(), Bytes::from_static(b"aa"))], 2)
            .unwrap();
        // Same bytes again: accepted; other bytes under the same name: refused, and the
        // other artifact of that request is not kept either.
        store.reserve(&s, 4).unwrap();
        let refused = store.commit(
            &s,
            vec![
                ("files/b".into(), Bytes::from_static(b"bb")),
                ("files/a".into(), Bytes::from_static(b"zz")),
            ],
            4,
        );
        assert_eq!(
            refused,
            Err(ArtifactError::AlreadyExists {
                name: "files/a".into()
            })
        );
        assert_eq!(store.get(&s, "files/b"), None);
        assert_eq!(store.get(&s, "files/a").as_deref(), Some(&b"aa"[..]));
        assert_eq!(store.stored_bytes(), 2);
        assert_eq!(store.state().reserved, 0);
        // classes/ are replaced.
        store.reserve(&s, 6).unwrap();
        store
            .commit(
                &s,
                vec![("classes/A.class".into(), Bytes::from_static(b"v1"))],
                2,
            )
            .unwrap();
        store
            .commit(
                &s,
                vec![("classes/A.class".into(), Bytes::from_static(b"v2v2"))],
                4,
            )
            .unwrap();
        assert_eq!(store.stored_bytes(), 6);
        store.retain_sessions(&mut |_| false);
        assert_eq!(store.stored_bytes(), 0);
        assert_eq!(store.get(&s, "files/a"), None);
    }
}
