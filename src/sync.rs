//! The crate's synchronization primitives, behind one facade: the standard library's in
//! every normal build, loom's model-checked ones when the crate is built with
//! `RUSTFLAGS="--cfg tether_loom"` (`scripts/loom.sh`, `tests/loom.rs`).
//!
//! Only the shared state that real threads race on goes through here: the finalize path
//! of a worker session (its `TerminationWatch` and `CountingHandle`, udf §5.1) and the lock
//! and waker shell of the execution manager (its registry lock, each execution's lock and
//! the registry's event queue, rx §5.1), the manager's memory budget, and the queues of the
//! in-memory connection pair (`connection::pair`). Under loom every lock and atomic access below is a
//! point where the model checker may switch threads, so the loom tests explore every
//! interleaving of, say, a ReattachExecute and an Interrupt on one execution.
//!
//! - [`Mutex`] recovers from poisoning (every lock in the crate did so by hand), so the two
//!   backends have one signature, and it is `Debug` and `Default` in both (loom's is
//!   neither).
//! - `Arc` and `Weak` stay the standard library's: the registry's event queue holds
//!   executions weakly and worker handles are `Arc<dyn WorkerHandle>`, and loom's `Arc` has
//!   neither `Weak` nor unsized coercion. It adds only a leak check; the loom tests check
//!   the release count of the handle instead.
//! - Nothing here models tokio's primitives (`Notify`, channels, timers): code that uses
//!   them is not a loom target (the spawned drop-cleanup task, the dispatcher). The loom
//!   tests drive the targets without a runtime, through `loom::future::block_on`, whose
//!   waker reports a lost wake-up as a deadlock.

use std::fmt;

#[cfg(not(tether_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

#[cfg(tether_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

#[cfg(not(tether_loom))]
use std::sync as backend;

#[cfg(tether_loom)]
use loom::sync as backend;

/// A held [`Mutex`] (the standard library's or loom's guard).
pub(crate) type MutexGuard<'a, T> = backend::MutexGuard<'a, T>;

/// A mutual-exclusion lock whose [`lock`](Self::lock) never fails: a lock poisoned by a
/// panicking holder is taken over as it is (the state every lock guards stays consistent
/// between steps, as the sans-IO cores of udf §4 and rx §2 are mutated only inside one
/// call).
pub(crate) struct Mutex<T: ?Sized>(backend::Mutex<T>);

impl<T> Mutex<T> {
    /// A lock around `value`.
    pub(crate) fn new(value: T) -> Self {
        Self(backend::Mutex::new(value))
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Locks, waiting for the holder; recovers a poisoned lock.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never blocks: a `Debug` of a value whose lock is held (by this thread, too) shows
        // that instead of deadlocking.
        match self.0.try_lock() {
            Ok(guard) => f.debug_tuple("Mutex").field(&&*guard).finish(),
            Err(_) => f.write_str("Mutex(<locked>)"),
        }
    }
}
