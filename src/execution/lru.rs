//! A small bounded map with least-recently-used eviction, for tombstones (rx §5.4, §5.6).

use std::collections::VecDeque;
use std::hash::Hash;

use super::keys::{FastMap, fast_map};

/// The access queue is compacted when it holds this many times the map's entries: each
/// compaction costs one lookup per queued entry, so a factor of 4 spends about 4/3 lookups
/// per operation on it (2 at a factor of 2), for a queue of at most 4× the map.
const COMPACT_AT: usize = 4;

/// A bounded map evicting the least recently inserted-or-read entry beyond `capacity`.
/// Amortised O(1): reads append to an access queue that is compacted when it grows to
/// [`COMPACT_AT`] times the map. Every operation is one lookup in the map (plus, amortised, the
/// compaction's).
#[derive(Debug)]
pub(crate) struct Lru<K, V> {
    map: FastMap<K, (u64, V)>,
    order: VecDeque<(K, u64)>,
    capacity: usize,
    tick: u64,
}

/// Drops the queue entries that no longer name the map's current tick of their key, once
/// the queue is more than [`COMPACT_AT`] times the map.
fn compact<K: Hash + Eq, V>(order: &mut VecDeque<(K, u64)>, map: &FastMap<K, (u64, V)>) {
    if order.len() > COMPACT_AT * map.len() + 32 {
        order.retain(|(k, t)| map.get(k).is_some_and(|e| e.0 == *t));
    }
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            map: fast_map(),
            order: VecDeque::new(),
            capacity,
            tick: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn insert(&mut self, key: K, value: V) {
        if self.capacity == 0 {
            return;
        }
        self.tick += 1;
        self.order.push_back((key.clone(), self.tick));
        self.map.insert(key, (self.tick, value));
        while self.map.len() > self.capacity {
            let Some((k, t)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&k).is_some_and(|e| e.0 == t) {
                self.map.remove(&k);
            }
        }
        compact(&mut self.order, &self.map);
    }

    /// Reads (and refreshes) an entry.
    pub(crate) fn get<Q>(&mut self, key: &Q) -> Option<&V>
    where
        Q: Hash + hashbrown::Equivalent<K> + ?Sized,
    {
        // Nothing to hash against (the tombstone caches are usually empty).
        if self.map.is_empty() {
            return None;
        }
        compact(&mut self.order, &self.map);
        let (k, e) = self.map.get_key_value_mut(key)?;
        self.tick += 1;
        e.0 = self.tick;
        self.order.push_back((k.clone(), self.tick));
        Some(&e.1)
    }

    pub(crate) fn contains<Q>(&mut self, key: &Q) -> bool
    where
        Q: Hash + hashbrown::Equivalent<K> + ?Sized,
    {
        self.get(key).is_some()
    }

    pub(crate) fn peek(&self, key: &K) -> Option<&V> {
        self.map.get(key).map(|e| &e.1)
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut l = Lru::new(2);
        l.insert(1, ());
        l.insert(2, ());
        assert!(l.contains(&1));
        l.insert(3, ());
        assert!(l.contains(&1));
        assert!(!l.contains(&2));
        assert!(l.contains(&3));
        assert_eq!(l.len(), 2);
        for _ in 0..1000 {
            l.contains(&1);
        }
        assert!(l.order.len() <= COMPACT_AT * 2 + 33);
        l.insert(4, ());
        assert!(!l.contains(&3));
        assert!(l.contains(&4));
        let mut z: Lru<u8, ()> = Lru::new(0);
        z.insert(1, ());
        assert_eq!(z.len(), 0);
    }
}
