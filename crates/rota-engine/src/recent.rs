//! A small map that forgets: entries expire after a TTL and the oldest go first when full.
//! Used for probe throttling and session stickiness, both of which must stay bounded.

use super::Millis;
use std::collections::HashMap;
use std::hash::Hash;

#[derive(Clone, Debug)]
pub struct Recent<K, V> {
    ttl: Millis,
    cap: usize,
    map: HashMap<K, (V, Millis)>,
}

impl<K: Eq + Hash + Clone, V> Recent<K, V> {
    pub fn new(ttl: Millis, cap: usize) -> Self {
        Recent { ttl, cap: cap.max(1), map: HashMap::new() }
    }

    /// The value stored for `key`, if it was touched within the TTL.
    pub fn get(&self, key: &K, now: Millis) -> Option<(&V, Millis)> {
        self.map.get(key).filter(|(_, at)| now - at < self.ttl).map(|(v, at)| (v, *at))
    }

    pub fn insert(&mut self, key: K, value: V, now: Millis) {
        if !self.map.contains_key(&key) && self.map.len() >= self.cap {
            self.map.retain(|_, (_, at)| now - *at < self.ttl);
            if self.map.len() >= self.cap {
                let oldest = self.map.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.map.remove(&k);
                }
            }
        }
        self.map.insert(key, (value, now));
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_after_the_ttl() {
        let mut r = Recent::new(100, 10);
        r.insert("a", 1, 0);
        assert_eq!(r.get(&"a", 99), Some((&1, 0)));
        assert_eq!(r.get(&"a", 100), None);
    }

    #[test]
    fn the_oldest_entry_is_evicted_when_full() {
        let mut r = Recent::new(1_000, 2);
        r.insert("a", 1, 0);
        r.insert("b", 2, 5);
        r.insert("c", 3, 6);
        assert_eq!((r.get(&"a", 7), r.len()), (None, 2));
        assert!(r.get(&"b", 7).is_some() && r.get(&"c", 7).is_some());
    }

    #[test]
    fn expired_entries_are_dropped_before_evicting_live_ones() {
        let mut r = Recent::new(10, 2);
        r.insert("old", 1, 0);
        r.insert("live", 2, 15);
        r.insert("new", 3, 16);
        assert!(r.get(&"live", 16).is_some());
        assert_eq!(r.len(), 2);
    }
}
