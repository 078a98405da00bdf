//! A small bounded map with least-recently-used eviction, for tombstones (rx §5.4, §5.6).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// A bounded map evicting the least recently inserted-or-read entry beyond `capacity`.
/// Amortised O(1): reads append to an access queue that is compacted when it grows to
/// twice the map.
#[derive(Debug)]
pub(crate) struct Lru<K, V> {
    map: HashMap<K, (u64, V)>,
    order: VecDeque<(K, u64)>,
    capacity: usize,
    tick: u64,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            capacity,
            tick: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    fn touch(&mut self, key: &K) {
        self.tick += 1;
        if let Some(e) = self.map.get_mut(key) {
            e.0 = self.tick;
            self.order.push_back((key.clone(), self.tick));
        }
        self.compact();
    }

    fn compact(&mut self) {
        if self.order.len() > 2 * self.map.len() + 32 {
            let map = &self.map;
            self.order
                .retain(|(k, t)| map.get(k).is_some_and(|e| e.0 == *t));
        }
    }

    pub(crate) fn insert(&mut self, key: K, value: V) {
        if self.capacity == 0 {
            return;
        }
        self.tick += 1;
        self.map.insert(key.clone(), (self.tick, value));
        self.order.push_back((key, self.tick));
        while self.map.len() > self.capacity {
            let Some((k, t)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&k).is_some_and(|e| e.0 == t) {
                self.map.remove(&k);
            }
        }
        self.compact();
    }

    /// Reads (and refreshes) an entry.
    pub(crate) fn get(&mut self, key: &K) -> Option<&V> {
        if self.map.contains_key(key) {
            self.touch(key);
        }
        self.map.get(key).map(|e| &e.1)
    }

    pub(crate) fn contains(&mut self, key: &K) -> bool {
        self.get(key).is_some()
    }

    pub(crate) fn peek(&self, key: &K) -> Option<&V> {
        self.map.get(key).map(|e| &e.1)
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        self.map.remove(key).map(|e| e.1)
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        self.map.retain(|k, e| keep(k, &e.1));
        self.compact();
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
        assert!(l.order.len() <= 2 * 2 + 33);
        l.insert(4, ());
        assert!(!l.contains(&3));
        assert_eq!(l.remove(&4), Some(()));
        let mut z: Lru<u8, ()> = Lru::new(0);
        z.insert(1, ());
        assert_eq!(z.len(), 0);
    }
}
