//! The errors a session's clients were sent with an `errorId`, kept so that FetchErrorDetails
//! can answer for them (connect §8.1; Spark's `SessionHolder.errorIdToError`). Sans-IO: the
//! time is passed in.
//!
//! One store per session, freed with it. Bounded: at most `capacity` errors, the oldest
//! evicted first (Spark's cache holds 20 with Guava's approximate eviction; this one is
//! exact), each forgotten `expiry` after it was stored (Spark: 60 s) and once fetched (Spark
//! invalidates an error when it is fetched).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::error::ConnectError;

/// One stored error: its id, when it was stored, the operation whose stream delivered it
/// (for the re-delivery of an execution's error, connect §8.1), and the error.
#[derive(Debug)]
struct Stored {
    id: Uuid,
    at: Instant,
    operation: Option<Uuid>,
    error: ConnectError,
}

/// A session's stored errors, oldest first (connect §8.1).
#[derive(Debug, Default)]
pub(crate) struct ErrorStore {
    entries: VecDeque<Stored>,
}

impl ErrorStore {
    /// Stores `error`, sent at `now` (by the stream of `operation`, if any), and returns the
    /// id to send with it; `None` when `capacity` is 0 (no id is sent then).
    ///
    /// An operation's stream that delivers the same error again (an execution's terminal
    /// error re-delivered after a reattach, rx §4.2) gets the id it was given the first
    /// time while that one is still stored, as Spark sends the same `errorId` again. Errors
    /// stored `expiry` ago or earlier are dropped first; then the oldest are evicted down to
    /// `capacity - 1` before the new one is added.
    pub(crate) fn record(
        &mut self,
        error: &ConnectError,
        operation: Option<Uuid>,
        now: Instant,
        capacity: usize,
        expiry: Duration,
    ) -> Option<Uuid> {
        if capacity == 0 {
            return None;
        }
        self.expire(now, expiry);
        if let Some(op) = operation
            && let Some(same) = self
                .entries
                .iter()
                .find(|s| s.operation == Some(op) && s.error == *error)
        {
            return Some(same.id);
        }
        while self.entries.len() >= capacity {
            self.entries.pop_front();
        }
        let id = Uuid::new_v4();
        self.entries.push_back(Stored {
            id,
            at: now,
            operation,
            error: error.clone(),
        });
        Some(id)
    }

    /// Removes and returns the error stored under `id` (the `errorId` as the client sent
    /// it), if it is still stored and not expired at `now`: each error is answered once, as
    /// Spark answers it (connect §8.1). Only the exact string sent names the error (Spark
    /// looks it up by string): another spelling of the same UUID (upper case) names nothing.
    pub(crate) fn take(
        &mut self,
        id: &str,
        now: Instant,
        expiry: Duration,
    ) -> Option<ConnectError> {
        self.expire(now, expiry);
        let id = Uuid::try_parse(id)
            .ok()
            .filter(|u| u.hyphenated().to_string() == id)?;
        let at = self.entries.iter().position(|s| s.id == id)?;
        self.entries.remove(at).map(|s| s.error)
    }

    /// How many errors are stored.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Drops the errors stored `expiry` ago or earlier (they are in the order stored).
    fn expire(&mut self, now: Instant, expiry: Duration) {
        while self
            .entries
            .front()
            .is_some_and(|s| now.saturating_duration_since(s.at) >= expiry)
        {
            self.entries.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn error(n: u64) -> ConnectError {
        ConnectError::PositionNotAvailable {
            response_id: "r".into(),
            index: n,
        }
    }

    #[test]
    fn the_oldest_is_evicted_beyond_the_capacity() {
        let now = Instant::now();
        let mut store = ErrorStore::default();
        let ids: Vec<Uuid> = (0..4)
            .map(|n| store.record(&error(n), None, now, 3, MINUTE).unwrap())
            .collect();
        assert_eq!(store.len(), 3);
        assert_eq!(
            store.take(&ids[0].to_string(), now, MINUTE),
            None,
            "evicted"
        );
        for (n, id) in ids.iter().enumerate().skip(1) {
            assert_eq!(
                store.take(&id.to_string(), now, MINUTE),
                Some(error(n as u64))
            );
        }
        assert_eq!(store.len(), 0);
    }

    #[test]
    fn an_error_is_answered_once_and_unknown_ids_name_nothing() {
        let now = Instant::now();
        let mut store = ErrorStore::default();
        let id = store.record(&error(1), None, now, 20, MINUTE).unwrap();
        assert_eq!(store.take(&Uuid::new_v4().to_string(), now, MINUTE), None);
        assert_eq!(store.take("not-a-uuid", now, MINUTE), None);
        assert_eq!(store.take("", now, MINUTE), None);
        // Spark looks the id up as a string: another spelling names nothing.
        let upper = id.to_string().to_uppercase();
        assert_eq!(store.take(&upper, now, MINUTE), None);
        assert_eq!(store.take(&id.to_string(), now, MINUTE), Some(error(1)));
        assert_eq!(
            store.take(&id.to_string(), now, MINUTE),
            None,
            "fetched once"
        );
    }

    #[test]
    fn errors_expire() {
        let start = Instant::now();
        let mut store = ErrorStore::default();
        let old = store.record(&error(1), None, start, 20, MINUTE).unwrap();
        let young = store
            .record(&error(2), None, start + Duration::from_secs(30), 20, MINUTE)
            .unwrap();
        let at = start + MINUTE;
        assert_eq!(store.take(&old.to_string(), at, MINUTE), None, "expired");
        assert_eq!(store.len(), 1);
        assert_eq!(store.take(&young.to_string(), at, MINUTE), Some(error(2)));
    }

    #[test]
    fn a_redelivered_execution_error_keeps_its_id_while_stored() {
        let now = Instant::now();
        let mut store = ErrorStore::default();
        let op = Some(Uuid::new_v4());
        let first = store.record(&error(1), op, now, 20, MINUTE).unwrap();
        assert_eq!(store.record(&error(1), op, now, 20, MINUTE), Some(first));
        assert_eq!(store.len(), 1);
        // Another error of the same stream, or the same error of another operation or of
        // an RPC: a new id.
        assert_ne!(store.record(&error(2), op, now, 20, MINUTE), Some(first));
        assert_ne!(store.record(&error(1), None, now, 20, MINUTE), Some(first));
        assert_ne!(
            store.record(&error(1), Some(Uuid::new_v4()), now, 20, MINUTE),
            Some(first)
        );
        // Once fetched, a re-delivery is stored again under a new id.
        assert!(store.take(&first.to_string(), now, MINUTE).is_some());
        let again = store.record(&error(1), op, now, 20, MINUTE).unwrap();
        assert_ne!(again, first);
    }

    #[test]
    fn capacity_zero_stores_nothing() {
        let mut store = ErrorStore::default();
        assert_eq!(
            store.record(&error(1), None, Instant::now(), 0, MINUTE),
            None
        );
        assert_eq!(store.len(), 0);
    }
}
