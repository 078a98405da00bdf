//! The ids of a session's inactive operations (rx §5.2, SPARK-53492): released, completed
//! or abandoned ids that a re-submitted ExecutePlan may not reuse for
//! `inactive_operation_expiry`, each with the state GetStatus reports for it (connect §15.2).
//!
//! One record per id, 24 bytes in the table (the UUID, and when it became inactive as
//! nanoseconds from the set's first record shifted left by two, its final state in the two
//! bits below; an `Instant` and a state would make it 32) and nothing else: no access order,
//! no per-insertion queue. Every ReleaseAll writes one and every ExecutePlan of a known id
//! reads one, so their size is what a busy session's submit/release cycle keeps in cache
//! (issue 12: the registry's "lighter record for inactive ids"; the least-recently-used map
//! this replaces also queued 24 bytes per insertion and re-read that queue to compact it).

use std::time::{Duration, Instant};

use hashbrown::hash_map::Entry;
use uuid::Uuid;

use super::keys::{FastMap, fast_map};
use crate::wire::connect::get_status_response::OperationState;

/// A session's inactive ids, at most `capacity` (tether's bound on rx §5.2's cache,
/// `ManagerConfig::inactive_operations_per_session`).
///
/// Beyond the bound the ids that became inactive first are forgotten (ties by id, so the
/// choice is deterministic): they are the next to expire anyway. Forgetting goes down to
/// seven eighths of the bound at once, so that the linear selection it costs is amortised
/// over an eighth of the bound's insertions: O(1) per insertion.
#[derive(Debug)]
pub(crate) struct InactiveIds {
    /// Per id, [`pack`]ed: when it became inactive, in nanoseconds from `epoch`, and its
    /// final state.
    map: FastMap<Uuid, i64>,
    /// The first instant recorded: every record is its exact offset from it (an `i64` of
    /// nanoseconds shifted by two spans ±73 years, far beyond any clock a process reads).
    epoch: Option<Instant>,
    capacity: usize,
}

/// The largest offset a record holds, in nanoseconds (±73 years: two bits hold the state).
const MAX_OFFSET: i64 = i64::MAX >> 2;

/// `at - epoch` in nanoseconds (saturated at ±73 years).
fn offset(at: Instant, epoch: Instant) -> i64 {
    let nanos = |d: Duration| i64::try_from(d.as_nanos()).map_or(MAX_OFFSET, |n| n.min(MAX_OFFSET));
    match at.checked_duration_since(epoch) {
        Some(after) => nanos(after),
        None => -nanos(epoch.duration_since(at)),
    }
}

/// The final states a record holds, by their two bits (connect §15.2).
const STATES: [OperationState; 4] = [
    OperationState::Succeeded,
    OperationState::Failed,
    OperationState::Cancelled,
    OperationState::Unknown,
];

/// A record: `offset` in the high bits, `state`'s index in [`STATES`] in the low two.
fn pack(offset: i64, state: OperationState) -> i64 {
    let bits = STATES.iter().position(|s| *s == state).unwrap_or(3);
    (offset << 2) | i64::try_from(bits).unwrap_or(3)
}

/// A record's offset ([`pack`]'s inverse; an arithmetic shift, exact for negative offsets).
fn offset_of(record: i64) -> i64 {
    record >> 2
}

/// A record's state ([`pack`]'s inverse).
fn state_of(record: i64) -> OperationState {
    STATES[usize::try_from(record & 3).unwrap_or(3)]
}

/// The instant `offset` nanoseconds from `epoch` (`offset`'s inverse).
fn instant(epoch: Instant, offset: i64) -> Instant {
    let d = Duration::from_nanos(offset.unsigned_abs());
    if offset >= 0 { epoch + d } else { epoch - d }
}

impl InactiveIds {
    /// No ids, remembering at most `capacity` (0: none at all).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            map: fast_map(),
            epoch: None,
            capacity,
        }
    }

    /// Number of remembered ids.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether a record made at `since` (an offset) is still in force at `now`.
    fn live(epoch: Instant, since: i64, now: Instant, expiry: Duration) -> bool {
        crate::time::deadline_after(instant(epoch, since), expiry) > now
    }

    /// Whether a re-submit of `op` is refused at `now` (rx §5.2): it became inactive less
    /// than `expiry` ago. An expired record is forgotten, so that a live id has none. One
    /// lookup.
    pub(crate) fn refuses(&mut self, op: Uuid, now: Instant, expiry: Duration) -> bool {
        let Some(epoch) = self.epoch else {
            return false;
        };
        match self.map.entry(op) {
            Entry::Occupied(o) if Self::live(epoch, offset_of(*o.get()), now, expiry) => true,
            Entry::Occupied(o) => {
                o.remove();
                false
            }
            Entry::Vacant(_) => false,
        }
    }

    /// The final state of `op` if it became inactive less than `expiry` before `now`
    /// (connect §15.2: what GetStatus reports for a removed operation).
    pub(crate) fn state(&self, op: Uuid, now: Instant, expiry: Duration) -> Option<OperationState> {
        let epoch = self.epoch?;
        let record = *self.map.get(&op)?;
        Self::live(epoch, offset_of(record), now, expiry).then(|| state_of(record))
    }

    /// Every id that became inactive less than `expiry` before `now`, with its final state,
    /// in no particular order (connect §15.2).
    pub(crate) fn states(
        &self,
        now: Instant,
        expiry: Duration,
    ) -> impl Iterator<Item = (Uuid, OperationState)> + '_ {
        self.map.iter().filter_map(move |(op, record)| {
            let epoch = self.epoch?;
            Self::live(epoch, offset_of(*record), now, expiry).then(|| (*op, state_of(*record)))
        })
    }

    /// Records that `op` became inactive at `at` in the final state `state` (replacing an
    /// older record of it), then applies the bound.
    pub(crate) fn insert(&mut self, op: Uuid, at: Instant, state: OperationState) {
        if self.capacity == 0 {
            return;
        }
        let epoch = *self.epoch.get_or_insert(at);
        self.map.insert(op, pack(offset(at, epoch), state));
        if self.map.len() > self.capacity {
            self.forget_oldest();
        }
    }

    /// Forgets the ids that became inactive first, down to seven eighths of the bound.
    fn forget_oldest(&mut self) {
        let keep = self.capacity - self.capacity / 8;
        let excess = self.map.len() - keep;
        let mut order: Vec<(i64, Uuid)> = self
            .map
            .iter()
            .map(|(op, record)| (offset_of(*record), *op))
            .collect();
        let (_, &mut last_forgotten, _) = order.select_nth_unstable(excess - 1);
        self.map
            .retain(|op, record| (offset_of(*record), *op) > last_forgotten);
    }

    /// Forgets every id that became inactive `expiry` or longer before `now` (rx §5.2
    /// expiry, run by maintenance).
    pub(crate) fn forget_expired(&mut self, now: Instant, expiry: Duration) {
        let Some(epoch) = self.epoch else {
            return;
        };
        self.map
            .retain(|_, record| Self::live(epoch, offset_of(*record), now, expiry));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: OperationState = OperationState::Succeeded;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    /// rx §5.2: refused until the expiry, then accepted and forgotten.
    #[test]
    fn refused_until_the_expiry() {
        let t = Instant::now();
        let expiry = Duration::from_secs(10);
        let mut ids = InactiveIds::new(4);
        ids.insert(id(1), t, S);
        assert!(ids.refuses(id(1), t + Duration::from_secs(9), expiry));
        assert_eq!(ids.len(), 1, "a refusal keeps the record");
        assert!(!ids.refuses(id(2), t, expiry));
        assert!(!ids.refuses(id(1), t + expiry, expiry), "due at the expiry");
        assert_eq!(ids.len(), 0, "an expired record is forgotten when read");
        ids.insert(id(1), t, S);
        ids.insert(id(2), t + Duration::from_secs(5), S);
        ids.forget_expired(t + expiry, expiry);
        assert!(!ids.refuses(id(1), t + expiry, Duration::MAX));
        assert!(ids.refuses(id(2), t + expiry, expiry));
    }

    /// The bound forgets the earliest first (ties by id), down to seven eighths of it.
    #[test]
    fn the_bound_forgets_the_earliest_first() {
        let t = Instant::now();
        let mut ids = InactiveIds::new(16);
        // Ids 1..=16 at t, t+1s, ...; id 17 at the same instant as id 16.
        for n in 1..=16u64 {
            ids.insert(id(u128::from(n)), t + Duration::from_secs(n), S);
        }
        assert_eq!(ids.len(), 16);
        ids.insert(id(17), t + Duration::from_secs(16), S);
        assert_eq!(ids.len(), 14, "down to 16 - 16/8");
        for n in 1..=3 {
            assert!(!ids.refuses(id(n), t, Duration::MAX), "{n} forgotten");
        }
        for n in 4..=17 {
            assert!(ids.refuses(id(n), t, Duration::MAX), "{n} kept");
        }
        // Equal instants: the smaller id goes first.
        let mut tied = InactiveIds::new(2);
        for n in [9, 3, 7] {
            tied.insert(id(n), t, S);
        }
        assert_eq!(tied.len(), 2);
        assert!(!tied.refuses(id(3), t, Duration::MAX));
        assert!(tied.refuses(id(7), t, Duration::MAX));
        assert!(tied.refuses(id(9), t, Duration::MAX));
    }

    /// Records are exact offsets from the first one, before it as after it: the expiry and
    /// the order of forgetting are those of the instants.
    #[test]
    fn records_before_and_after_the_first_are_exact() {
        let t = Instant::now() + Duration::from_secs(100);
        let expiry = Duration::from_secs(10);
        let mut ids = InactiveIds::new(2);
        ids.insert(id(1), t, S);
        ids.insert(id(2), t - Duration::from_nanos(30_000_000_001), S);
        let earlier = t - Duration::from_nanos(30_000_000_001);
        assert!(ids.refuses(id(2), earlier + expiry - Duration::from_nanos(1), expiry));
        assert!(ids.refuses(id(1), t + expiry - Duration::from_nanos(1), expiry));
        assert!(!ids.refuses(id(2), earlier + expiry, expiry));
        ids.insert(id(2), earlier, S);
        // The earliest goes first: id 2, recorded before the first record.
        ids.insert(id(3), t + Duration::from_nanos(1), S);
        assert_eq!(ids.len(), 2);
        assert!(!ids.refuses(id(2), t, Duration::MAX));
        assert!(ids.refuses(id(1), t, Duration::MAX));
        ids.forget_expired(t + expiry, expiry);
        assert!(!ids.refuses(id(1), t, Duration::MAX));
        assert!(ids.refuses(id(3), t + expiry, expiry));
    }

    /// connect §15.2: each record keeps its final state, before and after the epoch, until
    /// it expires.
    #[test]
    fn records_keep_their_state() {
        let t = Instant::now() + Duration::from_secs(100);
        let expiry = Duration::from_secs(10);
        let mut ids = InactiveIds::new(8);
        let all = [
            OperationState::Succeeded,
            OperationState::Failed,
            OperationState::Cancelled,
            OperationState::Unknown,
        ];
        for (n, state) in (1..).zip(all) {
            ids.insert(id(n), t - Duration::from_nanos(n as u64 * 7), state);
        }
        for (n, state) in (1..).zip(all) {
            assert_eq!(ids.state(id(n), t, expiry), Some(state));
            assert!(ids.refuses(id(n), t, expiry));
        }
        let mut listed: Vec<_> = ids.states(t, expiry).collect();
        listed.sort();
        assert_eq!(
            listed,
            (1..).zip(all).map(|(n, s)| (id(n), s)).collect::<Vec<_>>()
        );
        assert_eq!(ids.state(id(9), t, expiry), None);
        // Expired: no state, not listed (id 4 is the earliest, 28 ns before t).
        let due = t - Duration::from_nanos(28) + expiry;
        assert_eq!(ids.state(id(4), due, expiry), None);
        assert_eq!(
            ids.state(id(3), due, expiry),
            Some(OperationState::Cancelled)
        );
        assert_eq!(ids.states(due, expiry).count(), 3);
        // A later record of the same id replaces its state.
        ids.insert(id(1), t, OperationState::Failed);
        assert_eq!(ids.state(id(1), t, expiry), Some(OperationState::Failed));
    }

    #[test]
    fn a_zero_bound_remembers_nothing() {
        let t = Instant::now();
        let mut ids = InactiveIds::new(0);
        ids.insert(id(1), t, S);
        assert_eq!(ids.len(), 0);
        assert!(!ids.refuses(id(1), t, Duration::MAX));
        let mut one = InactiveIds::new(1);
        one.insert(id(1), t, S);
        one.insert(id(2), t + Duration::from_secs(1), S);
        assert_eq!(one.len(), 1);
        assert!(one.refuses(id(2), t, Duration::MAX));
    }
}
