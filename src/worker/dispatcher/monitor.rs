//! [`Monitor`]: a value behind a mutex that threads can wait on (condition variable) and
//! tasks can await (tokio `Notify`), so the same state serves blocking helpers (process
//! reapers, the closer thread) and async callers.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// A mutex-protected value with change notification for both threads and tasks.
#[derive(Debug, Default)]
pub(crate) struct Monitor<V> {
    value: Mutex<V>,
    changed: Condvar,
    notify: Notify,
}

impl<V> Monitor<V> {
    pub(crate) fn new(value: V) -> Self {
        Self {
            value: Mutex::new(value),
            changed: Condvar::new(),
            notify: Notify::new(),
        }
    }

    /// Locks the value for reading or a change that needs no wake-up.
    pub(crate) fn lock(&self) -> MutexGuard<'_, V> {
        self.value.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the value under the lock and wakes every waiter.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut V) -> R) -> R {
        let out = f(&mut self.lock());
        self.changed.notify_all();
        self.notify.notify_waiters();
        out
    }

    /// Blocks the calling thread until `f` yields a value (re-checked after every update).
    pub(crate) fn wait_blocking<R>(&self, mut f: impl FnMut(&mut V) -> Option<R>) -> R {
        let mut guard = self.lock();
        loop {
            if let Some(out) = f(&mut guard) {
                return out;
            }
            guard = self
                .changed
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits until `f` yields a value (re-checked after every update). Cancel-safe.
    pub(crate) async fn wait<R>(&self, mut f: impl FnMut(&mut V) -> Option<R>) -> R {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Register before checking, so an update between the check and the await is seen.
            notified.as_mut().enable();
            let out = {
                let mut guard = self.lock();
                f(&mut guard)
            };
            if let Some(out) = out {
                return out;
            }
            notified.await;
        }
    }
}
