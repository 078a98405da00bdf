//! The identities of sessions and executions (rx §5.1, §5.6), shared by the registry and
//! the executions it holds.

use std::sync::Arc;

use uuid::Uuid;

/// Identifies a session: `(user_id, session_id)` (rx §5.6: sessions are isolated by that
/// pair). Another user's identical `session_id` is another session.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey {
    /// The user id from `UserContext.user_id`, compared exactly.
    pub user_id: Arc<str>,
    /// The session id (a UUID; any spelling of it names the same session).
    pub session_id: Uuid,
}

/// Identifies an execution: `(user_id, session_id, operation_id)` (Spark's `ExecuteKey`,
/// rx §5.1).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecuteKey {
    /// The user id (`UserContext.user_id`, rx §1.2).
    pub user_id: Arc<str>,
    /// The session id (a UUID, rx §1.9).
    pub session_id: Uuid,
    /// The operation id (canonical lower case on the wire, rx §1.9).
    pub operation_id: Uuid,
}

impl ExecuteKey {
    /// The key of the session the execution belongs to (rx §5.1: the session tracks its
    /// operation ids).
    pub fn session(&self) -> SessionKey {
        SessionKey {
            user_id: self.user_id.clone(),
            session_id: self.session_id,
        }
    }
}
