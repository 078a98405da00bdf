//! The identities of sessions and executions (rx §5.1, §5.6), shared by the registry and
//! the executions it holds.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use uuid::Uuid;

/// Handles parse as the wire layer parses them (rx §1.9); re-exported for the server side.
pub(crate) use crate::wire::connect::parse_uuid;

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

/// The maps of the registry and its caches (rx §5.1, §5.2, §5.4, §5.6): hashbrown's table
/// with aHash, keyed per map from the process's random seed. The keys are client-chosen
/// (user, session and operation ids), so the hasher stays keyed: without the key a client
/// cannot pick ids that collide (HashDoS). aHash over a 16-byte UUID is a few
/// multiply-folds, where the standard library's SipHash-1-3 is about ten times that.
pub(crate) type FastMap<K, V> = hashbrown::HashMap<K, V, ahash::RandomState>;

/// An empty [`FastMap`] with fresh random keys (rx §5.1).
pub(crate) fn fast_map<K, V>() -> FastMap<K, V> {
    FastMap::with_hasher(ahash::RandomState::new())
}

/// A [`SessionKey`] borrowed from a request (rx §5.6): looks a session up without
/// allocating the user id. Hashes exactly as [`SessionKey`]'s derived `Hash` (the user's
/// `str`, then the UUID), and compares equal to it field by field.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionRef<'a> {
    /// `UserContext.user_id`.
    pub(crate) user_id: &'a str,
    /// The parsed session id.
    pub(crate) session_id: Uuid,
}

impl Hash for SessionRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The field order and types of `SessionKey`'s derive: `Arc<str>` hashes as `str`.
        self.user_id.hash(state);
        self.session_id.hash(state);
    }
}

impl hashbrown::Equivalent<SessionKey> for SessionRef<'_> {
    fn equivalent(&self, key: &SessionKey) -> bool {
        self.session_id == key.session_id && self.user_id == &*key.user_id
    }
}

impl SessionRef<'_> {
    /// The owned key (allocates the user id).
    pub(crate) fn to_key(self) -> SessionKey {
        SessionKey {
            user_id: Arc::from(self.user_id),
            session_id: self.session_id,
        }
    }
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
    use std::hash::BuildHasher;

    use super::{SessionKey, SessionRef, fast_map, parse_uuid, shown};
    use uuid::Uuid;

    #[test]
    fn long_ids_are_shown_cut() {
        assert!(matches!(shown("abc"), std::borrow::Cow::Borrowed("abc")));
        let long = "é".repeat(100_000);
        let s = shown(&long);
        assert!(s.len() < 100 && s.ends_with("…(200000 bytes)"), "{s}");
    }

    /// A borrowed session key finds the owned one: same hash, equal fields; another user
    /// or another session id is another session (rx §5.6).
    #[test]
    fn borrowed_session_keys_hash_and_compare_as_owned_ones() {
        let sid = Uuid::from_u128(7);
        let owned = SessionKey {
            user_id: "alice".into(),
            session_id: sid,
        };
        let mut map = fast_map();
        map.insert(owned.clone(), 1);
        let hasher = map.hasher().clone();
        let r = SessionRef {
            user_id: "alice",
            session_id: sid,
        };
        assert_eq!(
            BuildHasher::hash_one(&hasher, r),
            BuildHasher::hash_one(&hasher, &owned)
        );
        assert_eq!(map.get(&r), Some(&1));
        assert_eq!(r.to_key(), owned);
        let other_user = SessionRef {
            user_id: "bob",
            ..r
        };
        let other_session = SessionRef {
            session_id: Uuid::from_u128(8),
            ..r
        };
        assert_eq!(map.get(&other_user), None);
        assert_eq!(map.get(&other_session), None);
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
