//! The identities of sessions and executions (rx §5.1, §5.6), shared by the registry and
//! the executions it holds.

use std::borrow::Cow;
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

/// Parses a handle (a session, operation or response id) in the one form Spark accepts:
/// hyphenated, 36 characters, 8-4-4-4-12 hexadecimal digits in either case (Java's
/// `UUID.fromString` as Spark uses it, rx §1.9). The braced, URN and unhyphenated
/// spellings the `uuid` crate also reads are not handles.
pub(crate) fn parse_uuid(s: &str) -> Option<Uuid> {
    if s.len() != 36 {
        return None;
    }
    Uuid::try_parse(s).ok()
}

/// Longest client-supplied id echoed whole in an error message or a log line.
const SHOWN_MAX: usize = 128;

/// A client-supplied id as error messages and logs show it: whole up to 128 bytes (every
/// well-formed handle), else its first 64 bytes, `…` and its length. A hostile
/// megabyte-long id then cannot make an error status too large for gRPC's metadata limits
/// (16 KiB in grpc-core) or flood the log. Borrows (no allocation) when the id is shown
/// whole.
pub(crate) fn shown(raw: &str) -> Cow<'_, str> {
    if raw.len() <= SHOWN_MAX {
        return Cow::Borrowed(raw);
    }
    let mut end = SHOWN_MAX / 2;
    while !raw.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…({} bytes)", &raw[..end], raw.len()))
}

#[cfg(test)]
mod tests {
    use super::{parse_uuid, shown};

    #[test]
    fn long_ids_are_shown_cut() {
        assert!(matches!(shown("abc"), std::borrow::Cow::Borrowed("abc")));
        let long = "é".repeat(100_000);
        let s = shown(&long);
        assert!(s.len() < 100 && s.ends_with("…(200000 bytes)"), "{s}");
    }

    #[test]
    fn handles_are_hyphenated_uuids_only() {
        let id = "00112233-4455-6677-8899-aabbccddeeff";
        assert!(parse_uuid(id).is_some());
        assert_eq!(parse_uuid(&id.to_uppercase()), parse_uuid(id));
        for bad in [
            "{00112233-4455-6677-8899-aabbccddeeff}",
            "urn:uuid:00112233-4455-6677-8899-aabbccddeeff",
            "00112233445566778899aabbccddeeff",
            "00112233-4455-6677-8899-aabbccddeefg",
            "",
        ] {
            assert_eq!(parse_uuid(bad), None, "{bad}");
        }
    }
}
