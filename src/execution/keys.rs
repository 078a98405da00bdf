//! The identities of sessions and executions (rx §5.1, §5.6), shared by the registry and
//! the executions it holds.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use uuid::Uuid;

/// A handle as the wire layer parses it (rx §1.9, `wire::connect::parse_uuid`): exactly a
/// hyphenated UUID, 8-4-4-4-12 hex digits of either case; anything else is `None`.
///
/// The registry parses a session and an operation id on every ExecutePlan and
/// ReleaseExecute. The uuid crate's parser gathers the 32 digits byte by byte into a buffer
/// it then reads back as vectors, and that read waits for the byte stores to retire; this
/// one reads the request's bytes eight at a time and decodes them in registers.
#[inline]
pub(crate) fn parse_uuid(s: &str) -> Option<Uuid> {
    let b: &[u8; 36] = s.as_bytes().try_into().ok()?;
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let half = |i: usize| u64::from(u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes")));
    let (first, a) = hex8(word(0));
    let (second, c) = hex8(half(9) | (half(14) << 32));
    let (third, d) = hex8(half(19) | (half(24) << 32));
    let (fourth, e) = hex8(word(28));
    if a & c & d & e != HIGH || [b[8], b[13], b[18], b[23]] != *b"----" {
        return None;
    }
    let mut bytes = [0; 16];
    bytes[..4].copy_from_slice(&first.to_le_bytes());
    bytes[4..8].copy_from_slice(&second.to_le_bytes());
    bytes[8..12].copy_from_slice(&third.to_le_bytes());
    bytes[12..].copy_from_slice(&fourth.to_le_bytes());
    Some(Uuid::from_bytes(bytes))
}

/// A byte's lowest bit in each of a `u64`'s eight bytes.
const ONES: u64 = 0x0101_0101_0101_0101;
/// A byte's highest bit in each of a `u64`'s eight bytes.
const HIGH: u64 = ONES << 7;

/// Eight hex digits, the first in `x`'s lowest byte, decoded into four bytes (the first in
/// the lowest), with the mask of the bytes that are digits: the high bit of each byte that
/// is `0-9`, `a-f` or `A-F` (all of [`HIGH`] for a valid word).
#[inline]
fn hex8(x: u64) -> (u32, u64) {
    // The high bit of each byte that is at least `c` (≤ 0x80: no borrow crosses a byte);
    // meaningful for the bytes below 0x80, and the others are masked out below.
    let at_least = |x: u64, c: u8| ((x | HIGH) - ONES * u64::from(c)) & HIGH;
    let digit = at_least(x, b'0') & !at_least(x, b'9' + 1);
    // `| 0x20` maps `A-F` to `a-f` and nothing else into `a-f`.
    let lower = x | (ONES * 0x20);
    let alpha = at_least(lower, b'a') & !at_least(lower, b'f' + 1);
    let valid = (digit | alpha) & !x;
    // The low nibble, plus 9 for a letter (`a` is 0x61, `A` 0x41).
    let nibbles = (x & (ONES * 0x0f)) + (alpha >> 7) * 9;
    // Byte k = nibble k << 4 | nibble k + 1; the even bytes are the output, gathered down.
    let pairs = ((nibbles << 4) | (nibbles >> 8)) & 0x00ff_00ff_00ff_00ff;
    let pairs = (pairs | (pairs >> 8)) & 0x0000_ffff_0000_ffff;
    ((pairs | (pairs >> 16)) as u32, valid)
}

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

    /// The word-at-a-time parser accepts and decodes exactly what the wire layer's does
    /// (the uuid crate's, at 36 bytes): every ASCII byte and some multi-byte characters at
    /// every position of valid handles of either case, and random ones.
    #[test]
    fn handles_parse_as_the_wire_layer_parses_them() {
        let wire = crate::wire::connect::parse_uuid;
        for id in [
            "00112233-4455-6677-8899-aabbccddeeff",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "00000000-0000-0000-0000-000000000000",
            "0A1b2C3d-4E5f-6a7B-8c9D-aEbFcAdBeCfD",
            "99999999-9999-9999-9999-999999999999",
        ] {
            assert!(parse_uuid(id).is_some(), "{id}");
            assert_eq!(parse_uuid(id), wire(id), "{id}");
            for at in 0..id.len() {
                for c in (0u8..0x80).map(char::from).chain(['é', '€', '\u{10000}']) {
                    let mut s = String::with_capacity(40);
                    s.push_str(&id[..at]);
                    s.push(c);
                    s.push_str(&id[at + 1..]);
                    assert_eq!(parse_uuid(&s), wire(&s), "{s:?}");
                    // A multi-byte character cut back to 36 bytes.
                    let end = s.len().min(36);
                    if s.is_char_boundary(end) {
                        assert_eq!(parse_uuid(&s[..end]), wire(&s[..end]), "{s:?}");
                    }
                }
            }
        }
        for _ in 0..10_000 {
            let u = Uuid::new_v4();
            let s = u.hyphenated().to_string();
            assert_eq!(parse_uuid(&s), Some(u));
            assert_eq!(parse_uuid(&s.to_uppercase()), Some(u));
        }
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
