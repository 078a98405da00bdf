//! Session timeouts, buffer bounds and the timer they run on (spec §7).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A source of time for session deadlines. The `tokio` feature provides [`TokioTimer`]
/// (which honours `tokio::time::pause`, so tests never sleep for real).
pub trait Timer: Send + Sync + fmt::Debug + 'static {
    /// The current instant on this timer's clock.
    fn now(&self) -> Instant;
    /// A future that completes at `deadline` (at once if it has passed).
    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// [`Timer`] on tokio's clock (`tokio::time`), available with the `tokio` feature.
///
/// Outside a tokio runtime (a session driven by another executor) its sleeps never complete,
/// so timeouts are disabled there; a warning is logged. Supply your own [`Timer`] for other
/// executors.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTimer;

#[cfg(feature = "tokio")]
impl Timer for TokioTimer {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::warn!(
                "TokioTimer used outside a tokio runtime: session timeouts are disabled"
            );
            return Box::pin(std::future::pending());
        }
        Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
            deadline,
        )))
    }
}

/// Timeouts and bounds of an engine-side worker session. Defaults are Spark's (spec §7).
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Total wait for `InitResponse` after `Init` (spec `initResponseTimeoutMs`, 30 s).
    /// Expiry sends Cancel and settles `TransportFailed(Timeout)`.
    pub init_timeout: Duration,
    /// Per-poll wait for the next worker event while streaming, and total wait for the
    /// terminator in `close`/after an init error (spec `terminalTimeoutMs`, 30 s). Expiry
    /// settles `TransportFailed(Timeout)`.
    pub terminal_timeout: Duration,
    /// How long drop cleanup (the Rust form of an interrupt) waits for the Cancel
    /// acknowledgement before settling `Interrupted` (spec `interruptCancelTimeoutMs`, 2 s).
    pub interrupt_cancel_timeout: Duration,
    /// Most received `DataResponse`s buffered before the session stops reading from the
    /// connection (backpressure to the worker); default 64 batches.
    pub output_buffer: usize,
    /// The clock deadlines run on. `None` disables every timeout (the default without the
    /// `tokio` feature unless one is supplied).
    pub timer: Option<Arc<dyn Timer>>,
}

impl SessionConfig {
    /// Spark's defaults: 30 s init, 30 s terminal, 2 s interrupt-cancel, 64-batch output
    /// buffer, [`TokioTimer`] when the `tokio` feature is on.
    pub fn new() -> Self {
        SessionConfig {
            init_timeout: Duration::from_secs(30),
            terminal_timeout: Duration::from_secs(30),
            interrupt_cancel_timeout: Duration::from_secs(2),
            output_buffer: 64,
            timer: default_timer(),
        }
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
fn default_timer() -> Option<Arc<dyn Timer>> {
    Some(Arc::new(TokioTimer))
}

#[cfg(not(feature = "tokio"))]
fn default_timer() -> Option<Arc<dyn Timer>> {
    None
}

/// A restartable deadline over a [`Timer`]: `extend` moves it without re-arming the sleep
/// (the sleep re-arms lazily when it fires early), so per-message restarts cost nothing.
pub(crate) struct Deadline {
    timer: Option<Arc<dyn Timer>>,
    duration: Duration,
    at: Option<Instant>,
    sleep: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Deadline {
    pub(crate) fn new(timer: Option<Arc<dyn Timer>>, duration: Duration) -> Self {
        let at = timer.as_ref().map(|t| t.now() + duration);
        Deadline {
            timer,
            duration,
            at,
            sleep: None,
        }
    }

    pub(crate) fn duration(&self) -> Duration {
        self.duration
    }

    /// Restarts the full duration from now.
    pub(crate) fn extend(&mut self) {
        if let Some(t) = &self.timer {
            self.at = Some(t.now() + self.duration);
        }
    }

    /// Polls for expiry; registers the waker when not expired.
    pub(crate) fn poll_expired(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let (Some(timer), Some(at)) = (&self.timer, self.at) else {
            return false;
        };
        loop {
            let sleep = self.sleep.get_or_insert_with(|| timer.sleep_until(at));
            if sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            self.sleep = None;
            if timer.now() >= at {
                return true;
            }
        }
    }
}
